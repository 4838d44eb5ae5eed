//! TopK (OPS.md: values and indices along an axis, ties to the lower index):
//! positions and values against a sort in f64 along every axis, largest and
//! smallest, NaN above every number as in PyTorch; the values' gradient
//! (scattered back to the chosen positions) against finite differences;
//! and Vulkan against the CPU, position for position.

mod common;

use common::{grad_of, values};
use kiln::gradcheck::{gradcheck, gradcheck_on, CheckInput, GradcheckOptions};
use kiln::prelude::*;
use kiln::ErrorKind;

/// The expected positions of one line: sorted by value (NaN largest), ties
/// by position.
fn expected_line(xs: &[f64], k: usize, largest: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..xs.len()).collect();
    let key = |v: f64| if v.is_nan() { f64::INFINITY } else { v };
    order.sort_by(|&a, &b| {
        let (va, vb) = (key(xs[a]), key(xs[b]));
        // NaN above +inf: compare NaN-ness first.
        let by_nan = xs[b].is_nan().cmp(&xs[a].is_nan());
        let by_value = if largest { vb.partial_cmp(&va).unwrap() } else { va.partial_cmp(&vb).unwrap() };
        let ordered = if largest { by_nan.then(by_value) } else { by_nan.reverse().then(by_value) };
        ordered.then(a.cmp(&b))
    });
    order.truncate(k);
    order
}

const DIMS: [usize; 3] = [3, 6, 4];

fn data() -> Vec<f64> {
    // Few distinct values (many ties), one NaN and an infinity.
    let mut v: Vec<f64> = (0..72).map(|i| ((i * 7) % 5) as f64 - 2.0).collect();
    v[9] = f64::NAN;
    v[30] = f64::INFINITY;
    v
}

#[test]
fn positions_and_values_along_every_axis() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let xs = data();
    let x = graph.tensor_from(&xs, &DIMS).unwrap();
    for axis in 0..3 {
        for largest in [true, false] {
            for k in [0, 1, 3, DIMS[axis]] {
                let (v, i) = x.top_k(k, axis as isize, largest).unwrap();
                let mut out_dims = DIMS;
                out_dims[axis] = k;
                assert_eq!(i.dims().as_slice(), &out_dims);
                assert_eq!(i.dtype(), DType::I32);
                let (got_i, got_v) = (values(&i), values(&v));
                // Walk every line along `axis`.
                let outer: usize = DIMS[..axis].iter().product();
                let inner: usize = DIMS[axis + 1..].iter().product();
                for o in 0..outer {
                    for n in 0..inner {
                        let line: Vec<f64> = (0..DIMS[axis]).map(|t| xs[(o * DIMS[axis] + t) * inner + n]).collect();
                        let want = expected_line(&line, k, largest);
                        for (p, &w) in want.iter().enumerate() {
                            let at = (o * k + p) * inner + n;
                            assert_eq!(got_i[at], w as f64, "axis {axis} largest {largest} k {k} line ({o}, {n})");
                            let same = got_v[at] == line[w] || (got_v[at].is_nan() && line[w].is_nan());
                            assert!(same, "value at axis {axis} k {k}: {} vs {}", got_v[at], line[w]);
                        }
                    }
                }
            }
        }
    }
    // i32 works; bool, k past the axis and a bad axis are errors.
    let i = graph.tensor_from(&[5i32, -1, 5, 7], &[4]).unwrap();
    assert_eq!(values(&i.top_k(2, 0, true).unwrap().1), vec![3.0, 0.0]);
    let e = graph.tensor_from(&[true], &[1]).unwrap().top_k(1, 0, true).unwrap_err();
    assert_eq!((e.kind(), e.op()), (ErrorKind::DType, "TopK"));
    let e = x.top_k(7, 1, true).unwrap_err();
    assert_eq!((e.kind(), e.op()), (ErrorKind::OutOfRange, "TopK"));
    assert_eq!(e.location().file(), file!(), "{e}");
    assert_eq!(x.top_k(1, 3, true).unwrap_err().kind(), ErrorKind::OutOfRange);
}

fn top2_squared<'g>(_: &'g Graph, x: &[Tensor<'g>]) -> kiln::Result<Tensor<'g>> {
    x[0].top_k(2, 1, true)?.0.square()
}

#[test]
fn values_carry_gradient_to_the_chosen_positions() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f64, 5.0, 3.0, 5.0], &[4]).unwrap();
    let (v, i) = x.top_k(2, 0, true).unwrap();
    assert_eq!(values(&i), vec![1.0, 3.0]);
    v.mul(graph.tensor_from(&[10.0f64, 100.0], &[2]).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(grad_of(&x), vec![0.0, 10.0, 0.0, 100.0]);
    // Positions are not differentiable.
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f64, 2.0], &[2]).unwrap();
    let e = x.top_k(1, 0, true).unwrap().1.cast(DType::F64).unwrap().sum_all().unwrap().backward();
    assert!(e.is_err() || grad_of(&x) == vec![0.0, 0.0]);

    let inputs = [CheckInput::random(&[3, 5], -1.0, 1.0, 9)];
    let report = gradcheck(&device, top2_squared, &inputs, GradcheckOptions::default()).unwrap();
    assert!(report.passed(), "{report}");
}

#[test]
fn vulkan_picks_the_cpu_positions() {
    let Some(vk) = common::vulkan_device("top_k") else { return };
    let cpu = Device::cpu();
    // Rows of 300 with many ties, a NaN and infinities.
    let mut xs: Vec<f32> = (0..5 * 300).map(|i| ((i * 7919) % 37) as f32 - 18.0).collect();
    xs[17] = f32::NAN;
    xs[400] = f32::INFINITY;
    xs[401] = f32::NEG_INFINITY;
    let ints: Vec<i32> = (0..5 * 300).map(|i| (i * 7919) % 41 - 20).collect();
    for (axis, k, largest) in [(1isize, 7, true), (1, 300, false), (0, 2, true), (0, 5, false)] {
        let run = |device: &Device| {
            let graph = Graph::new(device);
            let x = graph.tensor_from(&xs, &[5, 300]).unwrap();
            let (v, i) = x.top_k(k, axis, largest).unwrap();
            let ii = graph.tensor_from(&ints, &[5, 300]).unwrap().top_k(k, axis, largest).unwrap().1;
            (i.to_vec_blocking::<i32>().unwrap(), common::bits(&v), ii.to_vec_blocking::<i32>().unwrap())
        };
        let (want, got) = (run(&cpu), run(&vk));
        let first = |a: &[i32], b: &[i32]| a.iter().zip(b).position(|(x, y)| x != y);
        assert!(
            want == got,
            "axis {axis} k {k} largest {largest}: Vulkan differs from the CPU (f32 positions from {:?}, i32 from {:?})",
            first(&want.0, &got.0),
            first(&want.2, &got.2)
        );
    }
    // A row longer than a dispatch's segment (4,096) and than the 65,535
    // iterations llvmpipe lets a loop run.
    let long: Vec<f32> = (0..70_000).map(|i| ((i * 7919) % 65_521) as f32).collect();
    for largest in [true, false] {
        let run = |device: &Device| {
            let graph = Graph::new(device);
            graph
                .tensor_from(&long, &[70_000])
                .unwrap()
                .top_k(3, 0, largest)
                .unwrap()
                .1
                .to_vec_blocking::<i32>()
                .unwrap()
        };
        assert_eq!(run(&cpu), run(&vk), "a long row, largest {largest}");
    }
    let options = GradcheckOptions { eps: 1e-6, atol: 1e-4, rtol: 1e-3, ..GradcheckOptions::default() };
    let inputs = [CheckInput::random(&[3, 5], -1.0, 1.0, 9)];
    let report = gradcheck_on(&cpu, &vk, DType::F32, top2_squared, &inputs, options).unwrap();
    assert!(report.passed(), "{report}");
}
