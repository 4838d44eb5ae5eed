//! Custom ops: registration (naga validates the WGSL), the op table entry,
//! forwards on the CPU and through the WGSL kernel on wgpu, gradients
//! through the user's backward (first and second order, CPU and wgpu),
//! `check_custom_op` catching a WGSL kernel that disagrees with the CPU,
//! and errors that name the op.

mod common;

use kiln::custom::{
    check_custom_op_with, CustomCheckOptions, CustomOp, CustomOpBuilder, HostSlice, HostSliceMut, HostView, HostViewMut,
};
use kiln::gradcheck::{gradcheck, gradcheck_on, gradgradcheck, gradgradcheck_on, CheckInput, GradcheckOptions};
use kiln::{Blocking, DType, Device, Error, ErrorKind, Family, Graph, Op, Result};

fn check_on(op: CustomOp, inputs: &[CheckInput], device: &Device) -> kiln::custom::CustomOpReport {
    check_custom_op_with(op, inputs, &[device.clone()], CustomCheckOptions::default()).unwrap()
}

/// swish(x) = x · sigmoid(x), in f32 and f64.
fn swish_cpu(ins: &[HostView<'_>], out: HostViewMut<'_>) -> Result<()> {
    match (&ins[0].data, out.data) {
        (HostSlice::F32(x), HostSliceMut::F32(y)) => {
            y.iter_mut().zip(*x).for_each(|(y, &x)| *y = x / (1.0 + (-x).exp()));
        }
        (HostSlice::F64(x), HostSliceMut::F64(y)) => {
            y.iter_mut().zip(*x).for_each(|(y, &x)| *y = x / (1.0 + (-x).exp()));
        }
        (x, _) => return Err(Error::unsupported("swish", format!("no {} forward", x.dtype()))),
    }
    Ok(())
}

const SWISH_WGSL: &str = "
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

/// d swish = g · (s + x·s·(1 − s)), s = sigmoid(x): kiln ops, so the
/// second order differentiates them.
#[track_caller]
fn swish(name: &str, wgsl: &str) -> Result<CustomOp> {
    CustomOpBuilder::new(name, 1)
        .cpu(swish_cpu)
        .wgsl(wgsl)
        .backward(|x, _y, g| {
            let s = x[0].sigmoid()?;
            let ds = s.mul(s.neg()?.add(1.0)?)?.mul(x[0])?.add(s)?;
            Ok(vec![Some(g.mul(ds)?)])
        })
        .saves(&[0], false)
        .sample(vec![CheckInput::random(&[2, 3], -2.0, 2.0, 11)])
        .register()
}

fn swish_op() -> CustomOp {
    static OP: std::sync::OnceLock<CustomOp> = std::sync::OnceLock::new();
    *OP.get_or_init(|| swish("TestSwish", SWISH_WGSL).expect("swish registers"))
}

/// Row sums of a matrix: [n, m] → [n], its own shape inference, a WGSL
/// loop over the row (the input length from the prelude).
fn row_sum_op() -> CustomOp {
    static OP: std::sync::OnceLock<CustomOp> = std::sync::OnceLock::new();
    *OP.get_or_init(|| {
        CustomOpBuilder::new("TestRowSum", 1)
            .infer(|ins| match ins[0].dims {
                [n, _] => Ok((vec![*n], ins[0].dtype)),
                d => Err(Error::shape("TestRowSum", format!("needs a matrix, got {d:?}"))),
            })
            .cpu(|ins, out| {
                let m = ins[0].dims[1];
                match (&ins[0].data, out.data) {
                    (HostSlice::F32(x), HostSliceMut::F32(y)) => {
                        y.iter_mut().zip(x.chunks(m.max(1))).for_each(|(y, row)| *y = row.iter().sum())
                    }
                    (HostSlice::F64(x), HostSliceMut::F64(y)) => {
                        y.iter_mut().zip(x.chunks(m.max(1))).for_each(|(y, row)| *y = row.iter().sum())
                    }
                    _ => return Err(Error::unsupported("TestRowSum", "float only")),
                }
                Ok(())
            })
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
    let m = kiln_input_len(0u) / kiln_len();
    var total = 0.0;
    for (var j = 0u; j < m; j = j + 1u) {
        total = total + x[i * m + j];
    }
    y[i] = total;
}
",
            )
            .backward(|x, _y, g| {
                let d = x[0].dims();
                Ok(vec![Some(g.reshape_to(&[d[0], 1])?.expand(&d)?)])
            })
            .saves(&[0], false)
            .register()
            .expect("row sum registers")
    })
}

/// A function through both ops, non-linear around them.
fn through_ops<'g>(_: &'g Graph, xs: &[kiln::Tensor<'g>]) -> Result<kiln::Tensor<'g>> {
    let h = swish_op().apply(&[xs[0].mul(xs[0])?])?;
    row_sum_op().apply(&[h])?.tanh()
}

#[test]
fn the_op_table_describes_a_custom_op() {
    let op = swish_op();
    let info = Op::Custom(op).info();
    assert_eq!(info.name, "TestSwish");
    assert_eq!(info.family, Family::Custom);
    assert!(info.no_rule.is_none());
    assert!(kiln::custom::registered().contains(&op));
    assert_eq!(kiln::custom::find("TestSwish"), Some(op));
    // The Custom kind is in the table's list, through the reference op.
    assert!(Op::kinds().iter().any(|k| matches!(k, Op::Custom(_))));
    // Its name shows in the coverage report, checked on its sample.
    let rows = pollster::block_on(kiln::coverage::coverage(&[Device::cpu()])).unwrap();
    let row = rows.iter().find(|r| r.name == "TestSwish").expect("a row for the custom op");
    assert!(kiln::coverage::row_is_complete(row), "{row:?}");
}

#[test]
fn forward_and_gradients_on_cpu_first_and_second_order() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[-1.0f32, 0.0, 2.0], &[3]).unwrap();
    let y = swish_op().apply(&[x]).unwrap();
    let expected: Vec<f64> = [-1.0f64, 0.0, 2.0].iter().map(|v| v / (1.0 + (-v).exp())).collect();
    common::assert_close(&common::values(&y), &expected, 1e-6);
    let options = GradcheckOptions::default();
    let inputs = vec![CheckInput::random(&[2, 3], -1.5, 1.5, 5)];
    let first = gradcheck(&device, through_ops, &inputs, options).unwrap();
    assert!(first.passed(), "{first}");
    let second = gradgradcheck(&device, through_ops, &inputs, options).unwrap();
    assert!(second.passed(), "{second}");
}

#[test]
fn bad_wgsl_is_an_error_at_registration() {
    let line = line!() + 1;
    let err = swish("BadSwish", &SWISH_WGSL.replace("exp(-v)", "exp(-v")).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(text.contains("BadSwish") && text.contains("does not parse"), "{text}");
    // naga's diagnostic points into the user's own source: line 13.
    assert!(text.contains("wgsl:13:30"), "{text}");
    assert!(text.contains(&format!("{}:{line}", file!())), "{text}");
    // Writing to a read-only output: naga's validator says where.
    let err = swish("BadSwish", &SWISH_WGSL.replace("read_write> y", "read> y")).unwrap_err();
    assert!(err.to_string().contains("does not validate") && err.to_string().contains("wgsl:13:5"), "{err}");
    // Valid WGSL that breaks kiln's contract: an input bound read_write.
    let err = swish("BadSwish", &SWISH_WGSL.replace("read> x", "read_write> x")).unwrap_err();
    assert!(err.to_string().contains("`x` (binding 1) must be read (it is an input)"), "{err}");
    let err = swish("BadSwish", &SWISH_WGSL.replace("@workgroup_size(256)", "@workgroup_size(64)")).unwrap_err();
    assert!(err.to_string().contains("@workgroup_size(256)"), "{err}");
    // Nothing was registered; the name is still free.
    assert!(kiln::custom::find("BadSwish").is_none());
    // Names are unique, built-in ones included.
    let _ = swish_op();
    assert!(swish("TestSwish", SWISH_WGSL).unwrap_err().to_string().contains("already exists"));
    assert!(swish("Exp", SWISH_WGSL).unwrap_err().to_string().contains("already exists"));
}

#[test]
fn errors_name_the_op_and_the_callers_line() {
    let graph = Graph::new(&Device::cpu());
    let v = graph.variable(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let line = line!() + 1;
    let err = row_sum_op().apply(&[v]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shape);
    assert!(err.to_string().starts_with("TestRowSum: needs a matrix"), "{err}");
    assert!(err.to_string().contains(&format!("{}:{line}", file!())), "{err}");
    let i = graph.tensor_from(&[1i32, 2], &[2]).unwrap();
    let err = swish_op().apply(&[i]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DType);
    assert!(err.to_string().contains("TestSwish"), "{err}");
    assert!(swish_op().apply(&[v, v]).unwrap_err().to_string().contains("takes 1 operands, got 2"));

    // A panic in the user's forward is an error naming the op.
    let panicky = CustomOpBuilder::new("TestPanicky", 1).cpu(|_, _| panic!("boom")).register().unwrap();
    let y = panicky.apply(&[v]).unwrap();
    let err = y.to_vec_blocking::<f32>().unwrap_err();
    assert!(err.to_string().contains("TestPanicky: the CPU forward panicked: boom"), "{err}");
    // Without a backward, differentiating through it says so.
    let err = y.sum_all().unwrap().backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Autograd);
    assert!(err.to_string().contains("cannot differentiate through TestPanicky"), "{err}");
}

/// Quantise to multiples of 1/4, straight-through gradient: the CPU rounds
/// half up; `wgsl_rounding` decides what the kernel does.
fn quantiser(name: &str, wgsl_rounding: &str) -> CustomOp {
    let source = format!(
        "
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let i = kiln_index(wid, nwg, lid);
    if (i >= kiln_len()) {{
        return;
    }}
    y[i] = {wgsl_rounding}(x[i] * 4.0 + 0.5) / 4.0;
}}
"
    );
    CustomOpBuilder::new(name, 1)
        .cpu(|ins, out| match (&ins[0].data, out.data) {
            (HostSlice::F32(x), HostSliceMut::F32(y)) => {
                y.iter_mut().zip(*x).for_each(|(y, &x)| *y = (x * 4.0 + 0.5).floor() / 4.0);
                Ok(())
            }
            _ => Err(Error::unsupported("quantise", "f32 only")),
        })
        .dtypes(&[DType::F32])
        .wgsl(&source)
        .backward(|_x, _y, g| Ok(vec![Some(g)]))
        .register()
        .unwrap()
}

#[test]
fn wgpu_runs_the_wgsl_kernels_and_check_custom_op_catches_a_mismatch() {
    let Some(wg) = common::vulkan_device("custom_ops") else { return };
    let cpu = Device::cpu();
    // check_custom_op: parity of both forwards, gradients on both devices.
    let sample = vec![CheckInput::random(&[3, 5], -2.0, 2.0, 7)];
    let report = check_on(swish_op(), &sample, &wg);
    assert!(report.passed(), "{report}");
    assert_eq!(report.parity.len(), 1);
    assert_eq!(report.device_gradients.len(), 1);
    let report = check_on(row_sum_op(), &sample, &wg);
    assert!(report.passed(), "{report}");
    // Gradient and second order through the WGSL forwards on wgpu.
    let options = GradcheckOptions { eps: 1e-6, atol: 1e-4, rtol: 1e-3, ..GradcheckOptions::default() };
    let inputs = vec![CheckInput::random(&[2, 3], -1.5, 1.5, 5)];
    let first = gradcheck_on(&cpu, &wg, DType::F32, through_ops, &inputs, options).unwrap();
    assert!(first.passed(), "{first}");
    let second = gradgradcheck_on(&cpu, &wg, DType::F32, through_ops, &inputs, options).unwrap();
    assert!(second.passed(), "{second}");

    // A kernel that computes something else (sigmoid(2x) for sigmoid(x)) is
    // caught by the parity check, and the report says where.
    let wrong = swish("TestWrongSwish", &SWISH_WGSL.replace("exp(-v)", "exp(-2.0 * v)")).unwrap();
    let report = check_on(wrong, &sample, &wg);
    assert!(!report.passed(), "{report}");
    assert!(!report.parity[0].passed());
    assert!(report.to_string().contains("MISMATCH"), "{report}");
    // So is a subtler one: ceil for floor moves values on the grid.
    let q = quantiser("TestQuantiser", "floor");
    let straight = CustomCheckOptions { gradients: false, ..Default::default() };
    let good = check_custom_op_with(q, &sample, &[wg.clone()], straight).unwrap();
    assert!(good.passed(), "{good}");
    let q_wrong = quantiser("TestQuantiserCeil", "ceil");
    let bad = check_custom_op_with(q_wrong, &sample, &[wg.clone()], straight).unwrap();
    assert!(!bad.passed(), "{bad}");

    // A custom op without a WGSL kernel refuses to run on wgpu, by name.
    let cpu_only = CustomOpBuilder::new("TestCpuOnly", 1).cpu(swish_cpu).register().unwrap();
    let graph = Graph::new(&wg);
    let x = graph.tensor_from(&[1.0f32, 2.0], &[2]).unwrap();
    let err = cpu_only.apply(&[x]).unwrap().to_vec_blocking::<f32>().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("TestCpuOnly") && err.to_string().contains("no WGSL kernel"), "{err}");
}

#[test]
fn straight_through_quantiser_gradient_on_cpu() {
    let q = quantiser("TestQuantiserCpu", "floor");
    let graph = Graph::new(&Device::cpu());
    let x = graph.variable(&[0.1f32, 0.3, -0.6, 1.13], &[4]).unwrap();
    let y = q.apply(&[x]).unwrap();
    assert_eq!(y.to_vec_blocking::<f32>().unwrap(), vec![0.0, 0.25, -0.5, 1.25]);
    let w = graph.tensor_from(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    y.mul(w).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec_blocking::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
}
