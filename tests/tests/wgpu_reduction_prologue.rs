//! Reduction prologue fusion on wgpu (lavapipe on CI; `CI=1` requires a
//! Vulkan adapter): a Sum, Prod, Max or Min of an element-wise group's
//! value runs as ONE generated kernel per pass that computes the value as
//! it reduces it (`Backend::fuses_reduce`,
//! kernels-wgsl/src/kernels/fused/tail.rs). Against the same device with
//! `WgpuOptions::fuse_reduce_prologue` off (a fused element-wise kernel,
//! then the reduction's): the same bits where the adapter rounds every op
//! (`common::rounds_every_op`), within 1e-4 of the CPU, and fewer
//! dispatches; every entry point of reduce.wgsl (one thread per output,
//! a few leaves per thread, workgroups of leaves, passes over partials),
//! rows, columns and middle axes, kept prologue values, i32, a cross
//! entropy step, and the fallback for a device with few storage bindings.

mod common;

use common::{bits, data};
use kiln::{Blocking, DType, Device, ExecStats, Graph, Tensor, WgpuOptions};

/// Relative to max(1, |value|), where the driver may contract a multiply
/// and an add into an FMA (a GPU; see `common::rounds_every_op`).
const CONTRACTED_TOL: f64 = 1e-5;

fn wgpu_with(fuse_reduce: bool, options: WgpuOptions) -> Option<Device> {
    let options = WgpuOptions { fuse_reduce_prologue: Some(fuse_reduce), ..options };
    common::vulkan_device_with(options, "wgpu reduction prologue")
}

fn wgpu(fuse_reduce: bool) -> Option<Device> {
    wgpu_with(fuse_reduce, WgpuOptions::default())
}

type Outcome = Vec<Vec<u32>>;

fn floats(o: &[u32]) -> Vec<f64> {
    o.iter().map(|&b| f64::from(f32::from_bits(b))).collect()
}

/// The bits, every NaN as the same NaN: a NaN's sign is not a defined
/// result of arithmetic, and lavapipe's compiler may fold a negation into
/// the reduction's next add (`acc + -v` as `acc - v`) once the prologue is
/// inlined into it, so `sum(-(NaN))` gives +NaN fused and -NaN unfused.
fn canonical(o: &Outcome) -> Outcome {
    let nan = f32::NAN.to_bits();
    o.iter().map(|v| v.iter().map(|&b| if f32::from_bits(b).is_nan() { nan } else { b }).collect()).collect()
}

#[track_caller]
fn assert_same(device: &Device, a: &Outcome, b: &Outcome, what: &str) {
    if common::rounds_every_op(device) {
        assert!(canonical(a) == canonical(b), "{what}: the bits differ with the prologue fused");
    } else {
        for (x, y) in a.iter().zip(b) {
            common::assert_close(&floats(x), &floats(y), CONTRACTED_TOL);
        }
    }
}

#[track_caller]
fn assert_near_cpu(a: &Outcome, cpu: &Outcome, what: &str) {
    assert_eq!(a.len(), cpu.len(), "{what}");
    for (x, y) in a.iter().zip(cpu) {
        common::assert_close(&floats(x), &floats(y), 1e-4);
    }
}

/// Sum, Max, Min and Prod of element-wise chains over `axes`, and the
/// gradient of x through a sum (its backward broadcasts, then multiplies).
fn reductions(device: &Device, dims: &[usize], axes: &[isize]) -> Outcome {
    let g = Graph::new(device);
    let n: usize = dims.iter().product();
    let x = g.variable(&data(n, 1), dims).unwrap();
    let e = || x.mul(0.5).unwrap().sub(0.25).unwrap().exp().unwrap();
    let q = || x.mul(x).unwrap().add(x).unwrap();
    let s = e().sum(axes, false).unwrap();
    let mx = e().max(axes, true).unwrap();
    let mn = q().min(axes, false).unwrap();
    let p = x.mul(0.001).unwrap().add(1.0).unwrap().prod(axes, false).unwrap();
    let loss = q().sum(axes, false).unwrap().tanh().unwrap().sum_all().unwrap();
    let grad = g.grad(loss, &[x], None).unwrap();
    vec![bits(&s), bits(&mx), bits(&mn), bits(&p), bits(&loss), bits(&grad[0])]
}

/// Run `f` twice on `device` (the first run compiles) and return the
/// second run's result, its dispatches and the executor's counts.
fn measured<T>(device: &Device, f: impl Fn(&Device) -> T) -> (T, usize, ExecStats) {
    f(device);
    let before = device.backend().counters().dispatches;
    let stats_before = device.exec_stats();
    let r = f(device);
    let mut stats = device.exec_stats();
    stats.fused_reductions -= stats_before.fused_reductions;
    (r, device.backend().counters().dispatches - before, stats)
}

/// Every entry point of reduce.wgsl through the fused kernel: blocks of one
/// leaf or less (`serial`: W1's softmax rows, a bias gradient's columns),
/// a few leaves (`serial_leaves`), one workgroup of leaves per output
/// (`leaves_to_out`), several (`leaves_to_parts`, then the partials'
/// pass), rows, columns, two reduced axes and a kept middle axis.
#[test]
fn every_entry_point_and_layout_gives_the_unfused_bits() {
    let Some(on) = wgpu(true) else { return };
    let off = wgpu(false).unwrap();
    let cpu = Device::cpu();
    let cases: [(&[usize], &[isize]); 9] = [
        (&[128, 10], &[1]),     // serial, rows
        (&[64, 128], &[0]),     // serial, columns
        (&[12, 700], &[1]),     // serial_leaves
        (&[4, 5000], &[-1]),    // leaves_to_out
        (&[2, 70_000], &[1]),   // leaves_to_parts, parts_to_out
        (&[300, 10], &[0]),     // few columns, a partial last leaf
        (&[3, 4, 50], &[1, 2]), // two reduced axes
        (&[5, 300, 7], &[1]),   // a middle axis
        (&[9, 8, 7], &[0, 2]),  // kept middle axis
    ];
    for (dims, axes) in cases {
        let what = format!("{dims:?} over {axes:?}");
        let (fused, fused_dispatches, stats) = measured(&on, |d| reductions(d, dims, axes));
        let (split, split_dispatches, split_stats) = measured(&off, |d| reductions(d, dims, axes));
        assert_same(&on, &fused, &split, &what);
        assert_near_cpu(&fused, &reductions(&cpu, dims, axes), &what);
        assert_eq!(split_stats.fused_reductions, 0, "{what}");
        assert!(stats.fused_reductions >= 4, "{what}: {stats:?}");
        assert!(fused_dispatches < split_dispatches, "{what}: {fused_dispatches} vs {split_dispatches} dispatches");
    }
}

/// A prologue value read again later (kept: written while the sum reduces
/// it), NaN and -0.0 among the elements, i32 sums and maxima.
#[test]
fn kept_values_special_values_and_i32() {
    let Some(on) = wgpu(true) else { return };
    let off = wgpu(false).unwrap();
    let run = |device: &Device| {
        let g = Graph::new(device);
        let mut v = data(64 * 300, 3);
        v[5] = f32::NAN;
        v[700] = -0.0;
        let x = g.tensor_from(&v, &[64, 300]).unwrap();
        let e = x.mul(2.0).unwrap().exp().unwrap();
        let s = e.sum(&[1], true).unwrap();
        let softmax = e.div(s).unwrap(); // e is read again: kept
        let mx = x.neg().unwrap().max(&[1], false).unwrap();
        let zeros = x.mul(0.0).unwrap().neg().unwrap().sum(&[0], false).unwrap();
        let xi = g.tensor_from(&(0..4000).map(|i| i % 97 - 40).collect::<Vec<i32>>(), &[4, 1000]).unwrap();
        let si = xi.mul(xi).unwrap().sub(3).unwrap().sum(&[1], false).unwrap();
        let mi = xi.add(1).unwrap().max(&[0], false).unwrap();
        // One execution, so that e is kept (written by the prologue).
        g.realize(&[s, softmax, mx, zeros, si, mi]).unwrap();
        let ints = |t: Tensor<'_>| t.to_vec_blocking::<i32>().unwrap().iter().map(|&v| v as u32).collect();
        vec![bits(&s), bits(&softmax), bits(&mx), bits(&zeros), ints(si), ints(mi)]
    };
    let (fused, _, stats) = measured(&on, run);
    let (split, _, _) = measured(&off, run);
    assert_same(&on, &fused[..4].to_vec(), &split[..4].to_vec(), "f32 values");
    assert_eq!(fused[4..], split[4..], "i32 values");
    assert!(stats.fused_reductions >= 5, "{stats:?}");
    // Every maximum row holds a NaN or none: row 0 has v[5].
    assert!(f32::from_bits(fused[2][0]).is_nan());
}

/// A softmax cross-entropy training step (the MLP's loss): values and
/// gradients as with the prologue unfused and near the CPU's, in fewer
/// dispatches.
#[test]
fn a_cross_entropy_step_fuses_its_reductions() {
    let Some(on) = wgpu(true) else { return };
    let off = wgpu(false).unwrap();
    let run = |device: &Device| {
        let g = Graph::new(device);
        let x = g.tensor_from(&data(128 * 64, 4), &[128, 64]).unwrap();
        let w = g.variable(&data(64 * 10, 5), &[64, 10]).unwrap();
        let b = g.variable(&data(10, 6), &[10]).unwrap();
        let logits = x.matmul(w).unwrap().add(b).unwrap();
        let labels: Vec<i32> = (0..128).map(|i| i * 7 % 10).collect();
        let labels = g.tensor_from(&labels, &[128]).unwrap();
        let loss = kiln::nn::cross_entropy(logits, labels).unwrap();
        let grads = g.grad(loss, &[w, b], None).unwrap();
        vec![bits(&loss), bits(&grads[0]), bits(&grads[1])]
    };
    let (fused, fused_dispatches, stats) = measured(&on, run);
    let (split, split_dispatches, _) = measured(&off, run);
    assert_same(&on, &fused, &split, "cross entropy");
    assert_near_cpu(&fused, &run(&Device::cpu()), "cross entropy");
    assert!(stats.fused_reductions >= 2, "{stats:?}");
    assert!(fused_dispatches < split_dispatches, "{fused_dispatches} vs {split_dispatches}");
}

/// A device with 4 storage buffers per kernel cannot bind a prologue with
/// three inputs and a kept value: the group and the reduction run as two
/// kernels, with the same bits. A new shape never replays a stale plan.
#[test]
fn fallback_and_changing_shapes() {
    let Some(on) = wgpu(true) else { return };
    let off = wgpu(false).unwrap();
    let narrow =
        wgpu_with(true, WgpuOptions { max_storage_buffers_per_shader_stage: Some(4), ..Default::default() }).unwrap();
    let wide = |device: &Device| {
        let g = Graph::new(device);
        let a = g.tensor_from(&data(40 * 30, 1), &[40, 30]).unwrap();
        let b = g.tensor_from(&data(40 * 30, 2), &[40, 30]).unwrap();
        let c = g.tensor_from(&data(30, 3), &[30]).unwrap();
        let t = a.mul(b).unwrap().add(c).unwrap().tanh().unwrap();
        let s = t.sum(&[1], false).unwrap();
        let again = t.mul(2.0).unwrap();
        g.realize(&[s, again]).unwrap(); // t kept
        vec![bits(&s), bits(&again)]
    };
    let (split, _, _) = measured(&off, wide);
    let (fused, _, stats) = measured(&on, wide);
    assert_same(&on, &fused, &split, "wide");
    assert!(stats.fused_reductions >= 1, "{stats:?}");
    let (narrowed, _, _) = measured(&narrow, wide);
    assert_same(&narrow, &narrowed, &split, "few bindings");
    for dims in [[8usize, 50, 30], [8, 50, 30], [1, 200, 30], [8, 300, 1], [40, 1, 30], [5, 7, 3000], [8, 50, 30]] {
        let step = |d: &Device| {
            let g = Graph::new(d);
            let n: usize = dims.iter().product();
            let x = g.tensor_from(&data(n, 7), &dims).unwrap();
            let y = x.mul(1.5).unwrap().tanh().unwrap().sum(&[1], false).unwrap();
            vec![bits(&y)]
        };
        assert_same(&on, &step(&on), &step(&off), &format!("{dims:?}"));
    }
    assert!(on.exec_stats().plans_reused >= 1, "{:?}", on.exec_stats());
    // f64 values are refused on wgpu with the prologue fused or not.
    let g = Graph::new(&on);
    let x = g.tensor_from(&data(6, 1), &[2, 3]).unwrap().cast(DType::F64);
    let r = x.and_then(|x| x.mul(2.0)?.sum(&[1], false)?.to_vec_blocking::<f64>());
    assert!(r.is_err());
}
