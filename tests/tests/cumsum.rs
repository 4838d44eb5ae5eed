//! CumSum (OPS.md's running sum along an axis, inclusive or exclusive,
//! forwards or reversed): values against a plain loop in f64, the gradient
//! against finite differences (first and second order), and Vulkan against
//! the CPU bit for bit (both add one element after another in the same
//! order), forward and backward.

mod common;

use common::{grad_of, values};
use kiln::gradcheck::{gradcheck, gradcheck_on, gradgradcheck, CheckInput, GradcheckOptions};
use kiln::prelude::*;
use kiln::ErrorKind;

/// The running sum of one line in f64, as the op defines it.
fn expected_line(xs: &[f64], exclusive: bool, reverse: bool) -> Vec<f64> {
    let n = xs.len();
    let mut out = vec![0.0; n];
    let mut acc = 0.0;
    for t in 0..n {
        let i = if reverse { n - 1 - t } else { t };
        if exclusive {
            out[i] = acc;
            acc += xs[i];
        } else {
            acc += xs[i];
            out[i] = acc;
        }
    }
    out
}

/// Every line along `axis` of a contiguous [d0, d1, d2] tensor.
fn expected(xs: &[f64], dims: [usize; 3], axis: usize, exclusive: bool, reverse: bool) -> Vec<f64> {
    let outer: usize = dims[..axis].iter().product();
    let (len, inner): (usize, usize) = (dims[axis], dims[axis + 1..].iter().product());
    let mut out = vec![0.0; xs.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |t: usize| (o * len + t) * inner + i;
            let line: Vec<f64> = (0..len).map(|t| xs[at(t)]).collect();
            for (t, v) in expected_line(&line, exclusive, reverse).into_iter().enumerate() {
                out[at(t)] = v;
            }
        }
    }
    out
}

const DIMS: [usize; 3] = [2, 5, 3];

/// x · cumsum(x) along `axis`: a function gradcheck can differentiate twice.
fn scan_times_x(
    axis: isize,
    exclusive: bool,
    reverse: bool,
) -> impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> kiln::Result<Tensor<'g>> {
    move |_, x| x[0].cumsum(axis, exclusive, reverse)?.mul(x[0])
}

fn data() -> Vec<f64> {
    (0..30).map(|i| ((i * 17) % 11) as f64 * 0.25 - 1.0).collect()
}

#[test]
fn values_along_every_axis_and_direction() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let xs = data();
    let x = graph.tensor_from(&xs, &DIMS).unwrap();
    for axis in 0..3 {
        for (exclusive, reverse) in [(false, false), (true, false), (false, true), (true, true)] {
            // Negative axes count from the end.
            let a = if axis == 2 { -1 } else { axis as isize };
            let got = values(&x.cumsum(a, exclusive, reverse).unwrap());
            // Quarter-steps in f64: exact, so equality holds.
            assert_eq!(got, expected(&xs, DIMS, axis, exclusive, reverse), "axis {axis} {exclusive} {reverse}");
        }
    }
    // i32 wraps; bool is refused with a DType error naming the op.
    let i = graph.tensor_from(&[i32::MAX, 1, 5], &[3]).unwrap();
    assert_eq!(
        values(&i.cumsum(0, false, false).unwrap()),
        vec![i32::MAX as f64, i32::MIN as f64, (i32::MIN + 5) as f64]
    );
    let e = graph.tensor_from(&[true, false], &[2]).unwrap().cumsum(0, false, false).unwrap_err();
    assert_eq!((e.kind(), e.op()), (ErrorKind::DType, "CumSum"));
    let e = x.cumsum(3, false, false).unwrap_err();
    assert_eq!((e.kind(), e.op()), (ErrorKind::OutOfRange, "CumSum"));
    assert_eq!(e.location().file(), file!(), "{e}");
}

#[test]
fn gradient_is_the_running_sum_the_other_way() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f64, 2.0, 3.0, 4.0], &[4]).unwrap();
    // d/dx_j Σ_i w_i y_i with y inclusive-forward: Σ_{i ≥ j} w_i.
    let w = graph.tensor_from(&[1.0f64, 10.0, 100.0, 1000.0], &[4]).unwrap();
    x.cumsum(0, false, false).unwrap().mul(w).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(grad_of(&x), vec![1111.0, 1110.0, 1100.0, 1000.0]);

    let options = GradcheckOptions::default();
    for (exclusive, reverse) in [(false, false), (true, false), (false, true), (true, true)] {
        let inputs = [CheckInput::random(&DIMS, -1.0, 1.0, 3)];
        let report = gradcheck(&device, scan_times_x(1, exclusive, reverse), &inputs, options).unwrap();
        assert!(report.passed(), "{exclusive} {reverse}: {report}");
        let report = gradgradcheck(&device, scan_times_x(1, exclusive, reverse), &inputs, options).unwrap();
        assert!(report.passed(), "second order, {exclusive} {reverse}: {report}");
    }
}

#[test]
fn vulkan_gives_the_cpu_bits() {
    let Some(vk) = common::vulkan_device("cumsum") else { return };
    let cpu = Device::cpu();
    // Lines of 700 along the middle axis (stride 3), and along the last.
    let dims = [4, 700, 3];
    let xs: Vec<f32> = (0..4 * 700 * 3).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.37).collect();
    let ints: Vec<i32> = (0..4 * 700 * 3).map(|i| (i * 7919 % 1000) * 3_000_000 - 1_000_000_000).collect();
    for axis in [1isize, -1] {
        for (exclusive, reverse) in [(false, false), (true, true)] {
            let run = |device: &Device| {
                let graph = Graph::new(device);
                let x = graph.variable(&xs, &dims).unwrap();
                let y = x.cumsum(axis, exclusive, reverse).unwrap();
                let w = graph.tensor_from(&xs, &dims).unwrap();
                y.mul(w).unwrap().sum_all().unwrap().backward().unwrap();
                let i = graph.tensor_from(&ints, &dims).unwrap().cumsum(axis, exclusive, reverse).unwrap();
                (common::bits(&y), common::bits(&x.grad().unwrap()), i.to_vec_blocking::<i32>().unwrap())
            };
            let (want, got) = (run(&cpu), run(&vk));
            assert!(want.0 == got.0, "forward bits differ (axis {axis}, {exclusive}, {reverse})");
            assert!(want.1 == got.1, "gradient bits differ (axis {axis}, {exclusive}, {reverse})");
            assert!(want.2 == got.2, "i32 values differ (axis {axis}, {exclusive}, {reverse})");
        }
    }
    // Lines longer than one dispatch's segment (4,096) and than the 65,535
    // iterations llvmpipe lets a loop run: still the CPU's bits.
    let long: Vec<f32> = (0..2 * 70_000).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.37).collect();
    for (dims, axis) in [([2, 70_000], 1isize), ([70_000, 2], 0)] {
        for (exclusive, reverse) in [(false, false), (true, true)] {
            let run = |device: &Device| {
                let graph = Graph::new(device);
                common::bits(&graph.tensor_from(&long, &dims).unwrap().cumsum(axis, exclusive, reverse).unwrap())
            };
            assert!(run(&cpu) == run(&vk), "long lines {dims:?} axis {axis}: Vulkan differs from the CPU");
        }
    }
    // And the f32 gradient on Vulkan against f64 finite differences.
    let options = GradcheckOptions { eps: 1e-6, atol: 1e-4, rtol: 1e-3, ..GradcheckOptions::default() };
    let inputs = [CheckInput::random(&[6, 2], -1.0, 1.0, 5)];
    let report = gradcheck_on(&cpu, &vk, DType::F32, scan_times_x(0, true, false), &inputs, options).unwrap();
    assert!(report.passed(), "{report}");
}
