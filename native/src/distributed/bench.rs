//! `kiln bench --distributed`: what the exchange costs on this machine.
//! Rank 0 prints JSON lines (BENCHMARKS.md's fields plus the process
//! count): the deterministic all-reduce that training uses, beside MPI's
//! own MPI_Allreduce, for messages of 4 KB to 64 MB; then BENCHMARKS.md's
//! W1 training step under data parallelism on 1, 2, 4, … processes.

use std::time::Instant;

use kiln_core::host_rng::SplitMix64;
use kiln_core::nn::{cross_entropy, Activation, Module, Sequential};
use kiln_core::optim::{Adam, Optimizer};
use kiln_core::{Device, Graph, Result};

use super::comm::{BucketBuffers, Comm, World};
use super::data_parallel::{DataParallel, DataParallelOptions};

/// Message sizes: 4 KiB to 64 MiB, by factors of 4.
pub const SIZES: [usize; 8] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];

/// Median of the per-iteration maximum over processes (an operation is
/// done when the slowest process is done), and the smallest such maximum.
fn slowest_process_median(comm: &Comm, times: &[f64]) -> (f64, f64) {
    let all = comm.all_gather(times);
    let mut per_iteration: Vec<f64> =
        (0..times.len()).map(|i| (0..comm.size()).map(|r| all[r * times.len() + i]).fold(0.0, f64::max)).collect();
    per_iteration.sort_by(|a, b| a.total_cmp(b));
    (per_iteration[per_iteration.len() / 2], per_iteration[0])
}

/// Time `reps` runs of `op` after `warmup` untimed ones, per process.
fn time(warmup: usize, reps: usize, mut op: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    for _ in 0..warmup {
        op()?;
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        op()?;
        times.push(start.elapsed().as_secs_f64());
    }
    Ok(times)
}

/// One JSON line per message size.
pub fn all_reduce_sweep(comm: &Comm) -> Result<Vec<String>> {
    let n = comm.size();
    let mut lines = Vec::new();
    for bytes in SIZES {
        let len = bytes / 4;
        let data: Vec<f32> = (0..len).map(|i| (i % 97) as f32 * 0.25 + comm.rank() as f32).collect();
        // Timed: the exchange of one bucket, as training runs it (the
        // values stay in `send`, the sum lands in `out`).
        let mut bucket = [BucketBuffers::new(len, n)?];
        bucket[0].send[..len].copy_from_slice(&data);
        let reps = (256 << 20) / bytes;
        let reps = reps.clamp(5, 200);
        comm.barrier();
        let ours = time(2, reps, || {
            comm.all_reduce_buckets(&mut bucket);
            Ok(())
        })?;
        let (median, min) = slowest_process_median(comm, &ours);
        let mut out = vec![0.0f32; len];
        comm.barrier();
        let theirs = time(2, reps, || {
            comm.mpi_all_reduce_sum(&data, &mut out);
            Ok(())
        })?;
        let (mpi_median, _) = slowest_process_median(comm, &theirs);
        let algbw = bytes as f64 / median / 1e9;
        let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
        lines.push(format!(
            "{{\"system\":\"kiln\",\"backend\":\"mpi\",\"workload\":\"allreduce\",\"ranks\":{n},\"bytes\":{bytes},\
             \"median_ms\":{:.4},\"min_ms\":{:.4},\"algbw_GBps\":{algbw:.3},\"busbw_GBps\":{busbw:.3},\
             \"mpi_allreduce_median_ms\":{:.4},\"reps\":{reps},\"notes\":\"kiln's fixed-order all-reduce \
             (all-to-all, pairwise sum by rank, all-gather); MPI_Allreduce for comparison\"}}",
            median * 1e3,
            min * 1e3,
            mpi_median * 1e3
        ));
    }
    Ok(lines)
}

/// W1 (MLP 784-512-512-10, Adam) on the processes of `comm`, with the
/// global batch of 128 split across them (`per_rank: false`, strong
/// scaling) or 128 samples on every process (`per_rank: true`, weak
/// scaling): per-step milliseconds (slowest process) and the exchange time
/// backward did not hide.
pub fn w1_step(
    comm: &Comm,
    device: &Device,
    backend: &str,
    options: DataParallelOptions,
    per_rank: bool,
) -> Result<String> {
    let n = comm.size();
    let global = if per_rank { 128 * n } else { 128 };
    let model = Sequential::mlp(device, &[784, 512, 512, 10], Activation::Relu, 1)?;
    let mut ddp = DataParallel::new(comm, &model, options)?;
    let mut optimizer = Adam::new(model.parameters(), 1e-3)?;
    let share = super::shard_range(global, comm.rank(), n);
    let local = share.len();
    let mut rng = SplitMix64::new(2);
    let images: Vec<f32> = (0..global * 784).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
    let mut rng = SplitMix64::new(3);
    let labels: Vec<i32> = (0..global).map(|_| rng.below(10) as i32).collect();
    let images = images[share.start * 784..share.end * 784].to_vec();
    let labels = labels[share.clone()].to_vec();
    let mut graph = Graph::new(device);
    let steps = 30;
    let times = time(5, steps, || {
        graph.reset();
        let x = graph.tensor_from(&images, &[local, 784])?;
        let y = graph.tensor_from(&labels, &[local])?;
        let loss = cross_entropy(model.forward(x)?, y)?;
        optimizer.zero_grad();
        ddp.backward(loss, local as f64 / global as f64)?;
        optimizer.step()
    })?;
    let (median, min) = slowest_process_median(comm, &times);
    let stats = ddp.stats();
    let exposed = stats.exposed_seconds / stats.steps.max(1) as f64;
    let mut exposed_all = [exposed];
    comm.all_sum_f64(&mut exposed_all);
    Ok(format!(
        "{{\"system\":\"kiln\",\"backend\":\"{backend}+mpi\",\"workload\":\"W1\",\"ranks\":{n},\"median_ms\":{:.4},\
         \"min_ms\":{:.4},\"threads\":{},\"exchange_ms\":{:.4},\"buckets\":{},\"bucket_bytes\":{},\
         \"overlap\":{},\"global_batch\":{global},\"notes\":\"{}; exchange_ms = mean time from the end \
         of backward to the averaged gradients being in place\"}}",
        median * 1e3,
        min * 1e3,
        rayon::current_num_threads(),
        exposed_all[0] / n as f64 * 1e3,
        ddp.buckets(),
        options.bucket_bytes,
        options.overlap,
        if per_rank { "128 samples per rank (weak scaling)" } else { "global batch 128 split across ranks" }
    ))
}

/// The whole `kiln bench --distributed`: `sweep` the all-reduce sizes,
/// `w1` the training step at each process count.
pub fn run(world: &World, device: &Device, backend: &str, sweep: bool, w1: bool) -> Result<()> {
    if world.is_root() {
        eprintln!("kiln bench --distributed: {} processes, {} each", world.size(), device.name());
    }
    if sweep {
        for line in all_reduce_sweep(world)? {
            if world.is_root() {
                println!("{line}");
            }
        }
    }
    if !w1 {
        return Ok(());
    }
    let mut counts: Vec<usize> =
        std::iter::successors(Some(1usize), |&n| Some(n * 2)).take_while(|&n| n < world.size()).collect();
    counts.push(world.size());
    for n in counts {
        // Ranks outside the first n wait at the next collective.
        if let Some(comm) = world.first(n) {
            // One message after backward, then 1 MiB buckets leaving during it.
            // Strong scaling: one message after backward, then 1 MiB
            // buckets leaving during it; weak scaling with the latter.
            let one_message = DataParallelOptions { bucket_bytes: 64 << 20, overlap: false };
            let buckets = DataParallelOptions { bucket_bytes: 1 << 20, overlap: true };
            for (options, per_rank) in [(one_message, false), (buckets, false), (buckets, true)] {
                let line = w1_step(&comm, device, backend, options, per_rank)?;
                if comm.is_root() {
                    println!("{line}");
                }
            }
        }
        world.barrier();
    }
    Ok(())
}
