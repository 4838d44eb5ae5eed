//! `check_custom_op`: what a user runs after defining a custom op. It
//! compares the op's forward on every given device (its WGSL kernel on
//! wgpu) with the CPU forward, and checks its backward against central
//! finite differences: first and second order in f64 on the CPU, and the
//! gradient computed on each device (f32) against the same differences.

use super::CustomOp;
use crate::device::Device;
use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::gradcheck::{gradcheck_on, gradgradcheck_on, CheckInput, GradcheckOptions, GradcheckReport};
use crate::graph::Graph;

/// Tolerances of `check_custom_op`.
#[derive(Clone, Copy, Debug)]
pub struct CustomCheckOptions {
    /// Forward parity: |device − cpu| ≤ atol + rtol·|cpu| per element (f32).
    pub parity_atol: f64,
    pub parity_rtol: f64,
    /// The f64 checks on the CPU.
    pub cpu: GradcheckOptions,
    /// The f32 gradients computed on the other devices.
    pub device: GradcheckOptions,
    /// Check the backward against finite differences. Off for a backward
    /// that is deliberately not the derivative (a straight-through
    /// estimator): then only the forwards are compared.
    pub gradients: bool,
}

impl Default for CustomCheckOptions {
    fn default() -> Self {
        CustomCheckOptions {
            parity_atol: 1e-5,
            parity_rtol: 1e-4,
            cpu: GradcheckOptions::default(),
            device: GradcheckOptions { atol: 1e-4, rtol: 1e-3, ..GradcheckOptions::default() },
            gradients: true,
        }
    }
}

/// One device's forward against the CPU's.
#[derive(Clone, Debug)]
pub struct Parity {
    pub device: String,
    pub max_abs_diff: f64,
    /// Worst |device − cpu| / (atol + rtol·|cpu|); ≤ 1 passes.
    pub worst_ratio: f64,
    /// Where, and the two values there.
    pub worst_index: usize,
    pub cpu: f64,
    pub value: f64,
}

impl Parity {
    pub fn passed(&self) -> bool {
        self.worst_ratio <= 1.0
    }
}

/// Everything `check_custom_op` found.
#[derive(Clone, Debug)]
pub struct CustomOpReport {
    pub op: &'static str,
    pub parity: Vec<Parity>,
    /// f64 on the CPU; None when the op has no backward.
    pub first_order: Option<GradcheckReport>,
    pub second_order: Option<GradcheckReport>,
    /// (device, first-order check of the gradient computed there in f32).
    pub device_gradients: Vec<(String, GradcheckReport)>,
}

impl CustomOpReport {
    pub fn passed(&self) -> bool {
        self.parity.iter().all(Parity::passed)
            && self.first_order.as_ref().is_none_or(GradcheckReport::passed)
            && self.second_order.as_ref().is_none_or(GradcheckReport::passed)
            && self.device_gradients.iter().all(|(_, r)| r.passed())
    }
}

impl std::fmt::Display for CustomOpReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "check_custom_op {}: {}", self.op, if self.passed() { "passed" } else { "FAILED" })?;
        for p in &self.parity {
            writeln!(
                f,
                "  forward on {} vs cpu: {} (max |diff| {:.3e}; worst at element {}: cpu {:.9e}, device {:.9e}, {:.3} of \
                 tolerance)",
                p.device,
                if p.passed() { "match" } else { "MISMATCH" },
                p.max_abs_diff,
                p.worst_index,
                p.cpu,
                p.value,
                p.worst_ratio
            )?;
        }
        match (&self.first_order, &self.second_order) {
            (Some(first), Some(second)) => {
                writeln!(f, "  cpu f64 first order: {first}")?;
                writeln!(f, "  cpu f64 second order: {second}")?;
            }
            _ => writeln!(f, "  gradients not checked (no backward, or turned off)")?,
        }
        for (device, report) in &self.device_gradients {
            writeln!(f, "  gradient on {device} (f32): {report}")?;
        }
        Ok(())
    }
}

/// The op's f32 forward on `device` at `inputs`, as f64 values.
async fn forward(op: CustomOp, device: &Device, inputs: &[CheckInput]) -> Result<Vec<f64>> {
    let graph = Graph::new(device);
    let xs = inputs
        .iter()
        .map(|x| graph.from_host(HostData::F32(x.values.iter().map(|&v| v as f32).collect()), &x.dims))
        .collect::<Result<Vec<_>>>()?;
    Ok(op.apply(&xs)?.to_host().await?.to_f64_vec())
}

/// Check a custom op at `inputs` (float operands): forward parity of every
/// device in `devices` with the CPU, and its gradient (when it has a
/// backward) against finite differences. Errors are for checks that could
/// not run (an op without an f64 CPU forward, a device without a kernel);
/// a check that ran and failed is in the report (`passed()`).
pub async fn check_custom_op(
    op: CustomOp,
    inputs: &[CheckInput],
    devices: &[Device],
    options: CustomCheckOptions,
) -> Result<CustomOpReport> {
    const OP: &str = "check_custom_op";
    let name = op.name();
    if inputs.len() != op.arity() {
        return Err(Error::invalid(OP, format!("{name} takes {} operands, {} were given", op.arity(), inputs.len())));
    }
    let cpu = Device::cpu();
    let reference = forward(op, &cpu, inputs).await?;
    let mut parity = Vec::new();
    for device in devices {
        if device.name().starts_with("cpu") {
            continue;
        }
        let values = forward(op, device, inputs).await?;
        let mut p = Parity {
            device: device.name(),
            max_abs_diff: 0.0,
            worst_ratio: 0.0,
            worst_index: 0,
            cpu: f64::NAN,
            value: f64::NAN,
        };
        for (i, (&c, &v)) in reference.iter().zip(&values).enumerate() {
            let diff = (v - c).abs();
            let ratio = if c.is_nan() && v.is_nan() {
                0.0
            } else if diff.is_nan() {
                f64::INFINITY
            } else {
                diff / (options.parity_atol + options.parity_rtol * c.abs())
            };
            p.max_abs_diff = p.max_abs_diff.max(if diff.is_nan() { f64::INFINITY } else { diff });
            if i == 0 || ratio > p.worst_ratio {
                (p.worst_ratio, p.worst_index, p.cpu, p.value) = (ratio, i, c, v);
            }
        }
        parity.push(p);
    }
    let mut report =
        CustomOpReport { op: name, parity, first_order: None, second_order: None, device_gradients: vec![] };
    if !op.has_backward() || !options.gradients {
        return Ok(report);
    }
    if !op.definition().dtypes.contains(DType::F64) {
        return Err(Error::unsupported(
            OP,
            format!("{name} has no f64 CPU forward; finite differences need one (declare .dtypes(&[F32, F64]))"),
        ));
    }
    // A closure with the higher-ranked signature the checks take.
    fn checked<F>(f: F) -> F
    where
        F: for<'g> Fn(&'g Graph, &[crate::graph::Tensor<'g>]) -> Result<crate::graph::Tensor<'g>> + Copy,
    {
        f
    }
    let f = checked(move |_, xs| op.apply(xs));
    report.first_order = Some(gradcheck_on(&cpu, &cpu, DType::F64, f, inputs, options.cpu).await?);
    report.second_order = Some(gradgradcheck_on(&cpu, &cpu, DType::F64, f, inputs, options.cpu).await?);
    for device in devices {
        if device.name().starts_with("cpu") {
            continue;
        }
        let r = gradcheck_on(&cpu, device, DType::F32, f, inputs, options.device).await?;
        report.device_gradients.push((device.name(), r));
    }
    Ok(report)
}
