//! Parallel branches on the CPU: the executor runs independent small nodes
//! together on the rayon pool. Values and gradients are bit-identical to
//! serial execution (`Device::set_parallel_branches(false)`), the grouping
//! really happens (`Device::exec_stats`), and a failing branch gives the
//! error serial execution gives, leaving the graph usable.

use kiln::bench::{towers_model, towers_step};
use kiln::{Blocking, BlockingParam, Device, Graph};

fn bits(values: &[f64]) -> Vec<u64> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Loss bits and every parameter's gradient bits of one towers step.
fn run(parallel: bool, fusion: bool) -> (u32, Vec<Vec<u64>>, kiln::ExecStats) {
    let device = Device::cpu();
    device.set_parallel_branches(parallel);
    device.set_fusion(fusion);
    let model = towers_model(&device, 8, 64, 1).unwrap();
    let graph = Graph::new(&device);
    let loss = towers_step(&graph, &model, 32).unwrap();
    let grads = model
        .iter()
        .flat_map(|t| kiln::nn::Module::parameters(t))
        .map(|p| bits(&p.grad_blocking().unwrap().unwrap().to_f64_vec()))
        .collect();
    (loss, grads, device.exec_stats())
}

#[test]
fn towers_are_bit_identical_to_serial_and_run_concurrently() {
    // Fusion off: the very same kernels run, serially or in batches.
    let (serial_loss, serial_grads, serial_stats) = run(false, false);
    let (loss, grads, stats) = run(true, false);
    assert_eq!(loss, serial_loss, "loss");
    assert_eq!(grads, serial_grads, "gradients");
    // Fusion on: parallel batches take nodes a serial run fuses, so the
    // kernels differ, but not the bits.
    for parallel in [false, true] {
        let (fused_loss, fused_grads, _) = run(parallel, true);
        assert_eq!(fused_loss, serial_loss, "loss, fused, parallel {parallel}");
        assert_eq!(fused_grads, serial_grads, "gradients, fused, parallel {parallel}");
    }
    assert_eq!(serial_stats.concurrent_batches, 0, "serial means one kernel at a time");
    assert_eq!(stats.kernels, serial_stats.kernels, "the same kernels run");
    if rayon_threads() > 1 {
        // Forward: the first layers of the 8 towers; backward: their weight
        // gradients, at least.
        assert!(stats.concurrent_kernels >= 16, "{stats:?}");
    } else {
        eprintln!("note: one rayon thread; parallel branches are off");
    }
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(
        std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &usize| n > 0)
            .unwrap_or(usize::MAX),
    )
}

#[test]
fn a_failing_branch_fails_like_serial_and_the_graph_stays_usable() {
    let run = |parallel: bool| {
        let device = Device::cpu();
        device.set_parallel_branches(parallel);
        let graph = Graph::new(&device);
        let table = graph.tensor_from(&vec![0.5f32; 64 * 64], &[64, 64]).unwrap();
        let good = graph.tensor_from(&(0..64).collect::<Vec<i32>>(), &[64]).unwrap();
        let bad =
            graph.tensor_from(&(0..64).map(|i| if i == 7 { 99 } else { i }).collect::<Vec<i32>>(), &[64]).unwrap();
        // Four independent gathers and products; the third reads index 99.
        let branches: Vec<_> = [good, good, bad, good]
            .iter()
            .map(|&index| table.index_select(0, index).unwrap().matmul(table).unwrap())
            .collect();
        let total = branches.iter().skip(1).fold(branches[0], |acc, &b| acc.add(b).unwrap());
        let err = total.to_vec_blocking::<f32>().unwrap_err().to_string();
        // Usable afterwards: the good branches alone.
        let fine = branches[0].add(branches[3]).unwrap().sum_all().unwrap().item_blocking().unwrap();
        (err, fine.to_bits())
    };
    let (serial_err, serial_value) = run(false);
    let (err, value) = run(true);
    assert!(err.contains("IndexSelect") && err.contains("99"), "{err}");
    assert_eq!(err, serial_err);
    assert_eq!(value, serial_value);
}
