//! Element-wise fusion on wgpu (lavapipe on CI; `CI=1` requires a Vulkan
//! adapter): the executor's groups run as generated WGSL kernels. Random
//! chains of unary, binary, comparison and where nodes with broadcast
//! operands, scalar constants, values read midway and gradients give the
//! same bits as the unfused wgpu kernels and agree with the CPU; groups cut
//! into several kernels (few bindings, few ops per kernel) give the same
//! bits again; the dispatch count drops; and a repeated step, or the same
//! structure at another shape or with other constants, compiles nothing.
//! Small shapes: the driver is slow and each new structure compiles.
//! "Same bits" holds where the adapter rounds every operation on its own
//! (lavapipe on CI); a GPU driver may contract a multiply and an add that
//! fusion put in one kernel into an FMA, so there the tests compare within
//! `CONTRACTED_TOL` and require the same bits run after run
//! (`common::rounds_every_op`).

mod common;

use common::chains::{random_chain, Outcome};
use kiln::{Blocking, Device, Graph, WgpuOptions};

fn with_fusion(device: Device, fusion: bool) -> Device {
    device.set_fusion(fusion);
    device
}

/// Fused vs unfused where the driver may contract `a * b + c` into an FMA,
/// relative to max(1, |value|): an ulp per contracted node, accumulated over
/// a chain (100 links in the W3 test), is well inside it; a wrong fused
/// kernel is not. The wgpu-vs-CPU comparisons use 1e-4.
const CONTRACTED_TOL: f32 = 1e-5;

/// `a` and `b` (outcomes of the same chain with fusion arranged
/// differently) have the same bits where the adapter rounds every op on its
/// own, else agree within `CONTRACTED_TOL`.
fn assert_same_bits_or_contracted(device: &Device, a: &Outcome, b: &Outcome, what: &str) {
    if common::rounds_every_op(device) {
        assert_eq!(a.bits(), b.bits(), "{what}");
    } else {
        a.assert_close(b, CONTRACTED_TOL, what);
    }
}

const CASES: [(u64, &[usize]); 5] = [(1, &[3, 5]), (2, &[17]), (3, &[4, 33]), (4, &[2, 3]), (5, &[300])];

#[test]
fn fused_chains_match_unfused_wgpu_and_the_cpu() {
    let Some(fused) = common::vulkan_device("wgpu fusion") else { return };
    let unfused = with_fusion(common::vulkan_device("wgpu fusion").unwrap(), false);
    let cpu = Device::cpu();
    for (seed, dims) in CASES {
        let on = random_chain(&fused, seed, dims, 24);
        let off = random_chain(&unfused, seed, dims, 24);
        let reference = random_chain(&cpu, seed, dims, 24);
        assert_same_bits_or_contracted(
            &fused,
            &on,
            &off,
            &format!("seed {seed}, dims {dims:?}: fused vs unfused wgpu"),
        );
        let again = random_chain(&fused, seed, dims, 24);
        assert_eq!(on.bits(), again.bits(), "seed {seed}, dims {dims:?}: fused run after run");
        on.assert_close(&reference, 1e-4, &format!("seed {seed}, dims {dims:?}: wgpu vs cpu"));
    }
    let stats = fused.exec_stats();
    assert!(stats.fused_groups >= CASES.len(), "{stats:?}");
    assert_eq!(unfused.exec_stats().fused_groups, 0);
}

/// Groups cut into many kernels: WebGPU's guaranteed 8 storage buffers per
/// kernel lowered to 5, and at most 3 ops per kernel; values crossing the
/// cuts go through scratch buffers. Same bits as one kernel per group.
#[test]
fn groups_cut_into_several_kernels_give_the_same_bits() {
    let Some(whole) = common::vulkan_device("wgpu fusion") else { return };
    let cut = common::vulkan_device_with(
        WgpuOptions { max_storage_buffers_per_shader_stage: Some(5), max_fused_ops: Some(3), ..Default::default() },
        "wgpu fusion",
    )
    .unwrap();
    for (seed, dims) in CASES.iter().take(3) {
        let a = random_chain(&whole, *seed, dims, 24);
        let b = random_chain(&cut, *seed, dims, 24);
        assert_same_bits_or_contracted(&whole, &a, &b, &format!("seed {seed}, dims {dims:?}"));
        assert_eq!(
            b.bits(),
            random_chain(&cut, *seed, dims, 24).bits(),
            "seed {seed}, dims {dims:?}: cut, run after run"
        );
    }
    let (w, c) = (whole.backend().counters().dispatches, cut.backend().counters().dispatches);
    assert!(c > w, "cut groups run more kernels: {c} vs {w}");
}

/// Integer groups with comparisons, where and broadcasting, and a bool
/// condition read from outside the group.
#[test]
fn integer_groups_are_exact() {
    let Some(fused) = common::vulkan_device("wgpu fusion") else { return };
    let run = |device: &Device| {
        let graph = Graph::new(device);
        let a = graph.tensor_from(&(0..40).map(|i| i * 7 - 100).collect::<Vec<i32>>(), &[4, 10]).unwrap();
        let b = graph.tensor_from(&(0..10).map(|i| i - 5).collect::<Vec<i32>>(), &[10]).unwrap();
        let c = graph.tensor_from(&[1i32, 0, 3, 0], &[4, 1]).unwrap().gt(0).unwrap();
        let m = a.mul(b).unwrap().add(3).unwrap().neg().unwrap();
        let r = m.lt(b).unwrap().where_(m, a.abs().unwrap()).unwrap().maximum(b).unwrap();
        let r = c.where_(r, r.sub(7).unwrap()).unwrap().mul(2).unwrap();
        r.to_vec_blocking::<i32>().unwrap()
    };
    let cpu = Device::cpu();
    assert_eq!(run(&fused), run(&cpu));
    assert!(fused.exec_stats().fused_groups >= 1);
}

/// W3's chain (shortened): tanh(y * 1.0001 + 0.001), forward and backward.
fn chain(device: &Device, x0: &[f32], dims: &[usize], scale: f32, links: usize) -> (Vec<f32>, Vec<f32>) {
    let graph = Graph::new(device);
    let x = graph.variable(x0, dims).unwrap();
    let mut y = x;
    for _ in 0..links {
        y = y.mul(scale).unwrap().add(0.001).unwrap().tanh().unwrap();
    }
    y.sum_all().unwrap().backward().unwrap();
    (y.to_vec_blocking::<f32>().unwrap(), x.grad().unwrap().to_vec_blocking::<f32>().unwrap())
}

#[test]
fn fusion_cuts_dispatches_and_reuses_pipelines_by_structure() {
    let Some(fused) = common::vulkan_device("wgpu fusion") else { return };
    let unfused = with_fusion(common::vulkan_device("wgpu fusion").unwrap(), false);
    let x0: Vec<f32> = (0..16).map(|i| i as f32 / 8.0 - 1.0).collect();
    let dispatches = |d: &Device| d.backend().counters().dispatches;
    // Generic pipelines only: the repeated step's shape-specialised ones
    // (kernels-wgsl/src/specialize.rs) are made on purpose.
    let compiled = |d: &Device| {
        let c = d.backend().counters();
        c.pipelines_compiled - c.specialized_pipelines
    };
    let off = chain(&unfused, &x0, &[16], 1.0001, 100);
    let off_dispatches = dispatches(&unfused);
    let on = chain(&fused, &x0, &[16], 1.0001, 100);
    let on_dispatches = dispatches(&fused);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let near = |a: &[f32], b: &[f32], tol: f32| a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * y.abs().max(1.0));
    if common::rounds_every_op(&fused) {
        assert_eq!(bits(&on.0), bits(&off.0));
        assert_eq!(bits(&on.1), bits(&off.1));
    } else {
        assert!(near(&on.0, &off.0, CONTRACTED_TOL) && near(&on.1, &off.1, CONTRACTED_TOL), "{on:?} vs {off:?}");
    }
    // 100 links: 500 forward and ~600 backward kernels unfused.
    assert!(off_dispatches >= 1000, "{off_dispatches}");
    assert!(on_dispatches * 20 < off_dispatches, "fused {on_dispatches} vs unfused {off_dispatches}");
    // The same step again, the same structure at another shape, and other
    // constants: no generated kernel compiled again.
    let before = compiled(&fused);
    chain(&fused, &x0, &[16], 1.0001, 100);
    let x1: Vec<f32> = (0..60).map(|i| i as f32 / 30.0 - 1.0).collect();
    let other_shape = chain(&fused, &x1, &[6, 10], 1.0001, 100);
    let other_constant = chain(&fused, &x0, &[16], 0.5, 100);
    assert_eq!(compiled(&fused), before, "a repeated structure compiled again");
    let reference = chain(&Device::cpu(), &x1, &[6, 10], 1.0001, 100);
    assert!(near(&other_shape.0, &reference.0, 1e-4) && near(&other_shape.1, &reference.1, 1e-4));
    let half = chain(&Device::cpu(), &x0, &[16], 0.5, 100);
    assert!(near(&other_constant.0, &half.0, 1e-4) && near(&other_constant.1, &half.1, 1e-4));
}
