//! Element-wise fusion on the CPU (`Device::set_fusion`, `KILN_FUSION`):
//! random chains of unary, binary, comparison and where nodes, with
//! broadcast operands, scalar constants, values read midway and gradients,
//! give bit-identical results with fusion on and off; the fused groups
//! really run (`ExecStats::fused_groups`) and the kernel count drops.

mod common;

use common::chains::{self, Outcome};
use kiln::{Blocking, Device, ExecStats, Graph};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One random chain (`common::chains::random_chain`) on the CPU with fusion
/// on or off, and the executor's counts.
fn random_chain(fusion: bool, seed: u64, dims: &[usize], len: usize) -> (Outcome, ExecStats) {
    let device = Device::cpu();
    device.set_fusion(fusion);
    let outcome = chains::random_chain(&device, seed, dims, len);
    (outcome, device.exec_stats())
}

#[test]
fn random_chains_are_bit_identical_with_and_without_fusion() {
    let mut fused_groups = 0;
    for seed in 0..24u64 {
        let dims: &[usize] = match seed % 3 {
            0 => &[3, 5],
            1 => &[17],
            _ => &[4, 33],
        };
        let (off, off_stats) = random_chain(false, seed, dims, 40);
        let (on, on_stats) = random_chain(true, seed, dims, 40);
        assert_eq!(on.bits(), off.bits(), "seed {seed}, dims {dims:?}");
        assert_eq!(off_stats.fused_groups, 0);
        assert!(on_stats.kernels < off_stats.kernels, "seed {seed}: {on_stats:?} vs {off_stats:?}");
        fused_groups += on_stats.fused_groups;
    }
    assert!(fused_groups > 24, "{fused_groups}");
}

#[test]
fn large_groups_split_over_threads_give_the_same_bits() {
    // Big enough that the fused kernel (and the unfused ones) go parallel.
    for seed in [100u64, 101] {
        let (off, _) = random_chain(false, seed, &[300, 1031], 12);
        let (on, stats) = random_chain(true, seed, &[300, 1031], 12);
        assert_eq!(on.bits(), off.bits(), "seed {seed}");
        assert!(stats.fused_groups > 0);
    }
}

/// W3 of the benchmarks: 1000 × tanh(y · 1.0001 + 0.001), forward and backward.
fn w3(fusion: bool) -> (Vec<u32>, Vec<u32>, ExecStats) {
    let device = Device::cpu();
    device.set_fusion(fusion);
    let graph = Graph::new(&device);
    let x0: Vec<f32> = (0..16).map(|i| i as f32 / 8.0 - 1.0).collect();
    let x = graph.variable(&x0, &[16]).unwrap();
    let mut y = x;
    for _ in 0..1000 {
        y = y.mul(1.0001).unwrap().add(0.001).unwrap().tanh().unwrap();
    }
    let loss = y.sum_all().unwrap();
    loss.backward().unwrap();
    let value = bits(&y.to_vec_blocking::<f32>().unwrap());
    let grad = bits(&x.grad().unwrap().to_vec_blocking::<f32>().unwrap());
    (value, grad, device.exec_stats())
}

#[test]
fn the_w3_chain_fuses_and_runs_far_fewer_kernels() {
    let (v_off, g_off, off) = w3(false);
    let (v_on, g_on, on) = w3(true);
    assert_eq!(v_on, v_off);
    assert_eq!(g_on, g_off);
    assert!(on.fused_groups >= 1, "{on:?}");
    // Forward alone was 5000 kernels (two constants, mul, add, tanh per
    // iteration); fused, the forward chain is one group.
    assert!(on.kernels * 10 < off.kernels, "{on:?} vs {off:?}");
}

#[test]
fn a_value_fused_away_is_recomputed_when_read_later() {
    let run = |fusion: bool| {
        let device = Device::cpu();
        device.set_fusion(fusion);
        let graph = Graph::new(&device);
        let x = graph.tensor_from(&[0.5f32, -1.0, 2.0], &[3]).unwrap();
        let a = x.exp().unwrap();
        let b = a.mul(3.0).unwrap();
        let c = b.sub(1.0).unwrap().tanh().unwrap();
        let first = c.to_vec_blocking::<f32>().unwrap();
        // b lived only inside the group (when fused); reading it now
        // recomputes it.
        let b_now = b.to_vec_blocking::<f32>().unwrap();
        (bits(&first), b_now, device.exec_stats().fused_groups)
    };
    let (c_off, b_off, _) = run(false);
    let (c_on, b_on, groups) = run(true);
    assert_eq!(c_on, c_off);
    assert_eq!(bits(&b_on), bits(&b_off));
    assert_eq!(groups, 2, "the chain, then b's recomputation");
    for (b, x) in b_on.iter().zip([0.5f32, -1.0, 2.0]) {
        assert!((b - x.exp() * 3.0).abs() < 1e-5 * b.abs(), "{b_on:?}");
    }
}

#[test]
fn integer_and_bool_chains_fuse_exactly() {
    let run = |fusion: bool| {
        let device = Device::cpu();
        device.set_fusion(fusion);
        let graph = Graph::new(&device);
        let a = graph.tensor_from(&(0..40).map(|i| i * 7 - 100).collect::<Vec<i32>>(), &[4, 10]).unwrap();
        let b = graph.tensor_from(&(0..10).map(|i| i - 5).collect::<Vec<i32>>(), &[10]).unwrap();
        let m = a.mul(b).unwrap().add(3).unwrap().neg().unwrap();
        let r = m.lt(b).unwrap().where_(m, a.abs().unwrap()).unwrap().maximum(b).unwrap();
        let f = graph.tensor_from(&(0..40).map(|i| i as f64 * 0.1).collect::<Vec<f64>>(), &[4, 10]).unwrap();
        let g = f.sqrt().unwrap().mul(1.5).unwrap().sub(f).unwrap().exp().unwrap();
        (r.to_vec_blocking::<i32>().unwrap(), g.to_vec_blocking::<f64>().unwrap(), device.exec_stats())
    };
    let (r_off, g_off, _) = run(false);
    let (r_on, g_on, stats) = run(true);
    assert_eq!(r_on, r_off);
    assert_eq!(
        g_on.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        g_off.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert!(stats.fused_groups >= 2, "{stats:?}");
}
