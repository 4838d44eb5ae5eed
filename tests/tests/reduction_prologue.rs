//! Reduction prologue fusion on the CPU: an element-wise group followed by
//! a Sum, Prod, Max or Min of one of its values runs as one kernel that
//! folds the value as it is computed (`ExecStats::fused_reductions`), with
//! the same bits as fusion off: rows short and long, columns few and many,
//! the layouts that run split, kept prologue values, gradients, f64, i32.

use kiln::{Blocking, DType, Device, ExecStats, Graph};

mod common;
use common::{bits, data};

/// Every reduction of `exp(x * 0.5 - 0.25)` (and of `x * x + x`, whose
/// products stay finite) over `axes` of a tensor of `dims`, and the
/// gradient of x through a sum: bits, and the executor's counts.
fn reductions(fusion: bool, dims: &[usize], axes: &[isize], keepdim: bool) -> (Vec<Vec<u32>>, ExecStats) {
    let device = Device::cpu();
    device.set_fusion(fusion);
    let g = Graph::new(&device);
    let n: usize = dims.iter().product();
    let x = g.variable(&data(n, 1), dims).unwrap();
    let e = || x.mul(0.5).unwrap().sub(0.25).unwrap().exp().unwrap();
    let q = || x.mul(x).unwrap().add(x).unwrap();
    let s = e().sum(axes, keepdim).unwrap();
    let mx = e().max(axes, keepdim).unwrap();
    let mn = q().min(axes, keepdim).unwrap();
    // A product of values near 1, so that long blocks stay finite.
    let p = x.mul(0.001).unwrap().add(1.0).unwrap().prod(axes, keepdim).unwrap();
    let loss = q().sum(axes, keepdim).unwrap().tanh().unwrap().sum_all().unwrap();
    let grad = g.grad(loss, &[x], None).unwrap();
    let all = vec![bits(&s), bits(&mx), bits(&mn), bits(&p), bits(&loss), bits(&grad[0])];
    (all, device.exec_stats())
}

fn same_bits(dims: &[usize], axes: &[isize], keepdim: bool) -> ExecStats {
    let (off, off_stats) = reductions(false, dims, axes, keepdim);
    let (on, on_stats) = reductions(true, dims, axes, keepdim);
    let names = ["sum", "max", "min", "prod", "loss", "grad"];
    for (k, (a, b)) in on.iter().zip(&off).enumerate() {
        assert!(a == b, "{dims:?} over {axes:?} (keepdim {keepdim}): {} differs with fusion", names[k]);
    }
    assert_eq!(off_stats.fused_reductions, 0);
    assert!(on_stats.kernels < off_stats.kernels, "{dims:?} over {axes:?}: {on_stats:?} vs {off_stats:?}");
    on_stats
}

/// Reduced axes innermost: rows of at most one leaf (softmax over ten
/// classes), of several leaves within one span, of several spans, and few
/// rows long enough to be split across threads.
#[test]
fn rows_of_every_length_fold_with_the_same_bits() {
    let cases: [(&[usize], &[isize]); 7] = [
        (&[128, 10], &[1]),     // W1's logits
        (&[33, 128], &[-1]),    // exactly one leaf
        (&[20, 700], &[1]),     // several leaves, one span
        (&[6, 5000], &[1]),     // several spans, few rows
        (&[40, 2100], &[1]),    // several spans, many rows
        (&[3, 4, 50], &[1, 2]), // two reduced axes
        (&[300_000], &[0]),     // one long row: split across threads
    ];
    for (dims, axes) in cases {
        for keepdim in [false, true] {
            let stats = same_bits(dims, axes, keepdim);
            assert!(stats.fused_reductions >= 4, "{dims:?} over {axes:?}: {stats:?}");
        }
    }
}

/// Reduced axes outermost: a bias gradient's columns (many), a few
/// columns over many rows (split across threads), a partial last leaf.
#[test]
fn columns_fold_with_the_same_bits() {
    let cases: [(&[usize], &[isize]); 5] = [
        (&[128, 512], &[0]),      // W1's first bias gradient
        (&[300, 10], &[0]),       // few columns, a partial leaf
        (&[70_000, 3], &[0]),     // few columns, many rows
        (&[2, 3, 4100], &[0, 1]), // two leading axes
        (&[1000, 1, 40], &[0]),   // a unit axis between
    ];
    for (dims, axes) in cases {
        let stats = same_bits(dims, axes, false);
        assert!(stats.fused_reductions >= 4, "{dims:?} over {axes:?}: {stats:?}");
    }
}

/// A middle axis (neither rows nor columns) and a reduction to a single
/// element per value (nothing to fold) run split, with the same bits.
#[test]
fn other_layouts_run_split_with_the_same_bits() {
    for (dims, axes) in [(&[5usize, 300, 7][..], &[1isize][..]), (&[4, 1, 6], &[1]), (&[9, 8, 7], &[0, 2])] {
        same_bits(dims, axes, true);
    }
}

/// A prologue value read again later (kept: written while the sum folds
/// it), a value only the reduction reads (never written), -0.0 sums and
/// NaN maxima, f64 and i32.
#[test]
fn kept_values_special_values_and_other_dtypes_give_the_same_bits() {
    let run = |fusion: bool| {
        let device = Device::cpu();
        device.set_fusion(fusion);
        let g = Graph::new(&device);
        let mut v = data(64 * 300, 3);
        v[5] = f32::NAN;
        v[700] = -0.0;
        let x = g.tensor_from(&v, &[64, 300]).unwrap();
        let e = x.mul(2.0).unwrap().exp().unwrap();
        let s = e.sum(&[1], true).unwrap();
        let softmax = e.div(s).unwrap(); // e is read again: kept
        let mx = x.neg().unwrap().max(&[1], false).unwrap();
        let zeros = x.mul(0.0).unwrap().neg().unwrap().sum(&[0], false).unwrap(); // -0.0 + ... in every column
        let x64 = x.cast(DType::F64).unwrap();
        let s64 = x64.mul(x64).unwrap().sum(&[0], false).unwrap();
        let s64: Vec<u64> = s64.to_vec_blocking::<f64>().unwrap().iter().map(|v| v.to_bits()).collect();
        let xi = g.tensor_from(&(0..4000).map(|i| i % 97 - 40).collect::<Vec<i32>>(), &[4, 1000]).unwrap();
        let si = xi.mul(xi).unwrap().sub(3).unwrap().sum(&[1], false).unwrap();
        let mi = xi.add(1).unwrap().max(&[0], false).unwrap();
        // One execution, so that e is kept (written by the prologue).
        g.realize(&[s, softmax, mx, zeros, si, mi]).unwrap();
        let (si, mi) = (si.to_vec_blocking::<i32>().unwrap(), mi.to_vec_blocking::<i32>().unwrap());
        let out = vec![bits(&s), bits(&softmax), bits(&mx), bits(&zeros)];
        (out, s64, si, mi, device.exec_stats())
    };
    let (off, s64_off, si_off, mi_off, _) = run(false);
    let (on, s64_on, si_on, mi_on, stats) = run(true);
    assert_eq!(on, off);
    assert_eq!(s64_on, s64_off, "f64");
    assert_eq!((si_on, mi_on), (si_off, mi_off), "i32");
    assert!(stats.fused_reductions >= 6, "{stats:?}");
}

/// A softmax cross-entropy training step, the pattern the MLP's loss
/// makes: values and gradients bit-identical, and fewer kernels.
#[test]
fn a_cross_entropy_step_fuses_its_sums_with_the_same_bits() {
    let run = |fusion: bool| {
        let device = Device::cpu();
        device.set_fusion(fusion);
        let g = Graph::new(&device);
        let x = g.tensor_from(&data(128 * 64, 4), &[128, 64]).unwrap();
        let w = g.variable(&data(64 * 10, 5), &[64, 10]).unwrap();
        let b = g.variable(&data(10, 6), &[10]).unwrap();
        let logits = x.matmul(w).unwrap().add(b).unwrap();
        let labels: Vec<i32> = (0..128).map(|i| i * 7 % 10).collect();
        let labels = g.tensor_from(&labels, &[128]).unwrap();
        let loss = kiln::nn::cross_entropy(logits, labels).unwrap();
        let grads = g.grad(loss, &[w, b], None).unwrap();
        (vec![bits(&loss), bits(&grads[0]), bits(&grads[1])], device.exec_stats())
    };
    let (off, off_stats) = run(false);
    let (on, on_stats) = run(true);
    assert_eq!(on, off);
    assert!(on_stats.fused_reductions >= 2, "{on_stats:?}");
    assert!(on_stats.kernels < off_stats.kernels, "{on_stats:?} vs {off_stats:?}");
}

/// One graph run with shapes that change the layout of its sum over axis
/// 1 (a middle axis: split; columns; rows; a unit axis; back again):
/// cached plans never replay a stale layout.
#[test]
fn a_new_shape_does_not_reuse_a_fused_reductions_plan() {
    let device = Device::cpu();
    let reference = Device::cpu();
    reference.set_fusion(false);
    for dims in
        [[8usize, 50, 30], [8, 50, 30], [1, 200, 30], [8, 300, 1], [40, 1, 30], [8, 50, 30], [5, 7, 3000], [8, 300, 1]]
    {
        let step = |d: &Device| {
            let g = Graph::new(d);
            let n: usize = dims.iter().product();
            let x = g.tensor_from(&data(n, 7), &dims).unwrap();
            let y = x.mul(1.5).unwrap().tanh().unwrap().sum(&[1], false).unwrap();
            bits(&y)
        };
        assert_eq!(step(&device), step(&reference), "{dims:?}");
    }
    assert!(device.exec_stats().plans_reused >= 1, "{:?}", device.exec_stats());
}
