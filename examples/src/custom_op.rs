//! Two user-defined gradients: a fused swish written as a custom op (a CPU
//! forward, a WGSL kernel for wgpu and the browser, a backward in kiln ops),
//! checked with `check_custom_op`; and a straight-through quantiser built
//! with `custom_vjp` around a rounding custom op that has no gradient of
//! its own. Each has a `wrong` variant whose backward is deliberately
//! incorrect, which the checks must catch.

use kiln::custom::{
    check_custom_op_with, find, CustomCheckOptions, CustomOp, CustomOpBuilder, CustomOpReport, HostSlice, HostSliceMut,
    HostView, HostViewMut,
};
use kiln::gradcheck::CheckInput;
use kiln::prelude::*;

/// swish(x) = x · sigmoid(x) in one kernel: one thread per element.
pub const SWISH_WGSL: &str = "
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = kiln_index(wid, nwg, lid);
    if (i >= kiln_len()) {
        return;
    }
    let v = x[i];
    y[i] = v / (1.0 + exp(-v));
}
";

fn swish_cpu(ins: &[HostView<'_>], out: HostViewMut<'_>) -> Result<()> {
    match (&ins[0].data, out.data) {
        (HostSlice::F32(x), HostSliceMut::F32(y)) => {
            y.iter_mut().zip(*x).for_each(|(y, &x)| *y = x / (1.0 + (-x).exp()))
        }
        (HostSlice::F64(x), HostSliceMut::F64(y)) => {
            y.iter_mut().zip(*x).for_each(|(y, &x)| *y = x / (1.0 + (-x).exp()))
        }
        (x, _) => return Err(Error::unsupported("Swish", format!("no {} forward", x.dtype()))),
    }
    Ok(())
}

/// The swish op (registered once per process). d swish/dx = s + x·s·(1 − s)
/// with s = sigmoid(x), written with kiln ops so that the second derivative
/// exists too. `wrong` registers "SwishWrong" whose backward forgets the
/// x·s·(1 − s) term.
pub fn swish_op(wrong: bool) -> Result<CustomOp> {
    let name = if wrong { "SwishWrong" } else { "Swish" };
    if let Some(op) = find(name) {
        return Ok(op);
    }
    let builder = CustomOpBuilder::new(name, 1).cpu(swish_cpu).wgsl(SWISH_WGSL).saves(&[0], false);
    let builder = if wrong {
        builder.backward(|x, _y, g| Ok(vec![Some(g.mul(x[0].sigmoid()?)?)]))
    } else {
        builder.backward(|x, _y, g| {
            let s = x[0].sigmoid()?;
            let ds = s.mul(s.neg()?.add(1.0)?)?.mul(x[0])?.add(s)?;
            Ok(vec![Some(g.mul(ds)?)])
        })
    };
    builder.register()
}

/// Swish's forward on the CPU and on each of `devices` compared, and its
/// gradient and second derivative against finite differences.
pub fn check_swish(wrong: bool, devices: &[Device]) -> Result<CustomOpReport> {
    let inputs = [CheckInput::random(&[4, 6], -3.0, 3.0, 11)];
    check_custom_op_with(swish_op(wrong)?, &inputs, devices, CustomCheckOptions::default())
}

/// Steps of the quantiser's grid.
pub const LEVELS: f32 = 4.0;

/// Rounding to the nearest multiple of 1/LEVELS (halves up), on the CPU
/// and in WGSL. No backward: rounding has no useful derivative, the
/// straight-through estimator around it supplies one.
pub fn round_op() -> Result<CustomOp> {
    if let Some(op) = find("RoundQuarter") {
        return Ok(op);
    }
    CustomOpBuilder::new("RoundQuarter", 1)
        .cpu(|ins, out| match (&ins[0].data, out.data) {
            (HostSlice::F32(x), HostSliceMut::F32(y)) => {
                y.iter_mut().zip(*x).for_each(|(y, &x)| *y = (x * LEVELS + 0.5).floor() / LEVELS);
                Ok(())
            }
            (x, _) => Err(Error::unsupported("RoundQuarter", format!("no {} forward", x.dtype()))),
        })
        .dtypes(&[DType::F32])
        .wgsl(
            "
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = kiln_index(wid, nwg, lid);
    if (i >= kiln_len()) {
        return;
    }
    y[i] = floor(x[i] * 4.0 + 0.5) / 4.0;
}
",
        )
        .register()
}

/// The straight-through quantiser: forward round(clamp(x, −1, 1)) on the
/// 1/4 grid, backward the incoming gradient where |x| ≤ 1 and 0 outside
/// (the clamp saturates there). `wrong` passes the gradient everywhere.
pub fn quantise<'g>(x: Tensor<'g>, wrong: bool) -> Result<Tensor<'g>> {
    let round = round_op()?;
    let forward = move |x: Tensor<'g>| round.apply(&[x.clamp(-1.0, 1.0)?]);
    if wrong {
        kiln::custom_vjp(forward, x, |_x, _y, dy| Ok(dy))
    } else {
        kiln::custom_vjp(forward, x, |x, _y, dy| x.abs()?.le(1.0)?.where_(dy, 0.0))
    }
}

/// What the quantiser check found.
#[derive(Clone, Debug)]
pub struct QuantiserReport {
    pub device: String,
    /// Forward values that differ from the host's rounding (exact compare).
    pub forward_mismatches: usize,
    /// Gradient elements that differ from the straight-through rule.
    pub gradient_mismatches: usize,
    pub elements: usize,
}

impl QuantiserReport {
    pub fn passed(&self) -> bool {
        self.forward_mismatches == 0 && self.gradient_mismatches == 0
    }
}

impl std::fmt::Display for QuantiserReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "straight-through quantiser on {}: {} ({} elements; forward mismatches {}, gradient mismatches {})",
            self.device,
            if self.passed() { "passed" } else { "FAILED" },
            self.elements,
            self.forward_mismatches,
            self.gradient_mismatches
        )
    }
}

/// Quantise values spread over [−1.6, 1.6] on `device`, back-propagate a
/// weighted sum, and compare with the expected values exactly: forward
/// round(clamp(x)) on the grid, gradient = weight where |x| ≤ 1, else 0.
pub fn check_quantiser(device: &Device, wrong: bool) -> Result<QuantiserReport> {
    let n = 40;
    let xs: Vec<f32> = (0..n).map(|i| -1.6 + 3.2 * i as f32 / (n - 1) as f32).collect();
    let weights: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
    let graph = Graph::new(device);
    let x = graph.variable(&xs, &[n])?;
    let y = quantise(x, wrong)?;
    y.mul(graph.tensor_from(&weights, &[n])?)?.sum_all()?.backward()?;
    let values = y.to_vec_blocking::<f32>()?;
    let grad = x.grad().ok_or_else(|| Error::autograd("quantise", "x got no gradient"))?.to_vec_blocking::<f32>()?;
    let expected = |x: f32| (x.clamp(-1.0, 1.0) * LEVELS + 0.5).floor() / LEVELS;
    let forward_mismatches = xs.iter().zip(&values).filter(|(&x, &v)| expected(x) != v).count();
    let gradient_mismatches =
        xs.iter().zip(&weights).zip(&grad).filter(|((&x, &w), &g)| g != if x.abs() <= 1.0 { w } else { 0.0 }).count();
    Ok(QuantiserReport { device: device.name(), forward_mismatches, gradient_mismatches, elements: n })
}

/// The rounding op's forward on each of `devices` against the CPU's
/// (gradients off: it has none).
pub fn check_round_parity(devices: &[Device]) -> Result<CustomOpReport> {
    let inputs = [CheckInput::random(&[5, 8], -1.5, 1.5, 3)];
    let options = CustomCheckOptions { gradients: false, ..CustomCheckOptions::default() };
    check_custom_op_with(round_op()?, &inputs, devices, options)
}
