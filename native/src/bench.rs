//! The workloads of BENCHMARKS.md, timed. `kiln bench` prints one JSON line
//! per workload. These are benchmarks, never tests: the machine's speed moves.

use std::time::Instant;

use kiln_core::nn::{cross_entropy, Activation, Module, Sequential};
use kiln_core::optim::{Adam, Optimizer};
use kiln_core::rng::SplitMix64;
use kiln_core::{Device, Graph, Param, Result};

use crate::Blocking;

#[derive(Clone, Debug)]
pub struct BenchResult {
    pub workload: &'static str,
    pub backend: String,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub threads: usize,
    pub notes: String,
}

impl BenchResult {
    /// The JSON line of BENCHMARKS.md.
    pub fn json(&self) -> String {
        format!(
            "{{\"system\":\"kiln\",\"backend\":\"{}\",\"workload\":\"{}\",\"median_ms\":{:.4},\"min_ms\":{:.4},\"max_ms\":{:.4},\"threads\":{},\"notes\":\"{}\"}}",
            self.backend,
            self.workload,
            self.median_ms,
            self.min_ms,
            self.max_ms,
            self.threads,
            self.notes.replace('"', "'")
        )
    }
}

/// Time `step` after `warmup` untimed runs; returns per-run milliseconds.
fn time_runs(warmup: usize, counted: usize, mut step: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    for _ in 0..warmup {
        step()?;
    }
    let mut times = Vec::with_capacity(counted);
    for _ in 0..counted {
        let start = Instant::now();
        step()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

fn summarize(workload: &'static str, backend: &str, mut times: Vec<f64>, notes: String) -> BenchResult {
    times.sort_by(|a, b| a.total_cmp(b));
    let median = if times.len() % 2 == 1 {
        times[times.len() / 2]
    } else {
        (times[times.len() / 2 - 1] + times[times.len() / 2]) / 2.0
    };
    BenchResult {
        workload,
        backend: backend.to_string(),
        median_ms: median,
        min_ms: times[0],
        max_ms: *times.last().unwrap_or(&0.0),
        threads: rayon::current_num_threads(),
        notes,
    }
}

fn random_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect()
}

/// Times of training steps of `model` (forward, cross-entropy, backward,
/// Adam at 1e-3, loss read back) on one fixed random batch of `batch`
/// 784-pixel images and labels below 10, drawn from `seed` and `seed + 1`.
fn training_steps(
    device: &Device,
    model: &Sequential,
    batch: usize,
    seed: u64,
    warmup: usize,
    counted: usize,
) -> Result<Vec<f64>> {
    let mut optimizer = Adam::new(model.parameters(), 1e-3)?;
    let images = random_vec(batch * 784, seed);
    let mut rng = SplitMix64::new(seed + 1);
    let labels: Vec<i32> = (0..batch).map(|_| rng.below(10) as i32).collect();
    let mut graph = Graph::new(device);
    time_runs(warmup, counted, || {
        graph.reset();
        let x = graph.tensor_from(&images, &[batch, 784])?;
        let y = graph.tensor_from(&labels, &[batch])?;
        let loss = cross_entropy(model.forward(x)?, y)?;
        optimizer.zero_grad();
        loss.backward()?;
        optimizer.step()?;
        loss.item_blocking()?;
        Ok(())
    })
}

/// W1: MLP 784-512-512-10 training step, Adam, batch 128.
pub fn w1_mlp_step(device: &Device, backend: &str, counted: usize) -> Result<BenchResult> {
    let model = Sequential::mlp(device, &[784, 512, 512, 10], Activation::Relu, 1)?;
    let times = training_steps(device, &model, 128, 2, 20, counted)?;
    Ok(summarize("W1", backend, times, String::new()))
}

/// W2: CNN training step (BENCHMARKS.md), Adam, batch 64 of 28x28x1.
pub fn w2_cnn_step(device: &Device, backend: &str, counted: usize) -> Result<BenchResult> {
    let model = crate::models::cnn(device, [1, 28, 28], 10, 1)?;
    let times = training_steps(device, &model, 64, 7, 5, counted)?;
    Ok(summarize("W2", backend, times, String::new()))
}

/// W3: 1000 × tanh(y·1.0001 + 0.001) on 16 floats, forward + backward.
pub fn w3_graph_overhead(device: &Device, backend: &str, counted: usize) -> Result<BenchResult> {
    let x0 = random_vec(16, 4);
    let mut graph = Graph::new(device);
    let times = time_runs(5, counted, || {
        graph.reset();
        let x = graph.variable(&x0, &[16])?;
        let mut y = x;
        for _ in 0..1000 {
            y = y.mul(1.0001)?.add(0.001)?.tanh()?;
        }
        let loss = y.sum_all()?;
        loss.backward()?;
        x.grad().expect("x is a variable").to_vec_blocking::<f32>()?;
        Ok(())
    })?;
    let median = {
        let mut t = times.clone();
        t.sort_by(|a, b| a.total_cmp(b));
        t[t.len() / 2]
    };
    let notes = format!("per-op {:.2} us ({} graph nodes per run)", median * 1e3 / 1000.0, graph.len());
    Ok(summarize("W3", backend, times, notes))
}

/// W4: 1024³ GEMM, forward only, result read back.
pub fn w4_gemm(device: &Device, backend: &str, counted: usize) -> Result<BenchResult> {
    let n = 1024;
    let a = Param::new(device, "a", &random_vec(n * n, 5), &[n, n])?;
    let b = Param::new(device, "b", &random_vec(n * n, 6), &[n, n])?;
    let mut graph = Graph::new(device);
    let times = time_runs(3, counted, || {
        graph.reset();
        let _no_grad = graph.no_grad();
        let c = graph.param(&a)?.matmul(graph.param(&b)?)?;
        c.to_vec_blocking::<f32>()?;
        Ok(())
    })?;
    let mut sorted = times.clone();
    sorted.sort_by(|x, y| x.total_cmp(y));
    let median = sorted[sorted.len() / 2];
    let gflops = 2.0 * (n as f64).powi(3) / (median * 1e-3) / 1e9;
    Ok(summarize("W4", backend, times, format!("{gflops:.1} GFLOP/s")))
}
