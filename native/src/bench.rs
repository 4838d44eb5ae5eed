//! The workloads of BENCHMARKS.md, timed. `kiln bench` prints one JSON line
//! per workload. These are benchmarks, never tests: the machine's speed moves.

use std::time::Instant;

use kiln_core::host_rng::SplitMix64;
use kiln_core::nn::{cross_entropy, Activation, Module, Sequential};
use kiln_core::optim::{Adam, Optimizer};
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

pub mod host_heap;

/// What a workload's steps did besides taking time (BENCHMARKS.md's
/// counters), per step after warm-up.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCounters {
    /// Kernel calls (CPU) or dispatches (wgpu) the executor issued per step.
    pub kernels_per_step: f64,
    /// Of those, run together with others as parallel branches.
    pub concurrent_kernels_per_step: f64,
    /// Of those, fused element-wise groups, and the nodes they computed.
    pub fused_groups_per_step: f64,
    pub fused_nodes_per_step: f64,
    pub fused_products_per_step: f64,
    pub fused_reductions_per_step: f64,
    /// Executions that replayed a cached plan, and that planned anew.
    pub plans_reused_per_step: f64,
    pub plans_built_per_step: f64,
    /// Bytes the device's pool asked the backend for per step (pool
    /// misses), and the buffers the backend created for kernels' own
    /// intermediate values (wgpu scratch); 0 means every buffer was reused.
    pub device_bytes_allocated_per_step: f64,
    /// The most device bytes live during the counted steps (parameters,
    /// gradients and optimizer state included).
    pub peak_device_bytes: usize,
    /// Pipelines compiled (wgpu; 0 on the CPU) and pipeline-cache hits per
    /// step, and timed kernel trials (the wgpu matmul's choice per shape
    /// class) per step: after warm-up, compilations and trials should be 0.
    pub pipelines_compiled_per_step: f64,
    pub pipeline_cache_hits_per_step: f64,
    pub kernel_trials_per_step: f64,
    /// Kernels the backend recorded per step (wgpu dispatches, each
    /// generated kernel of a fused group counted; 0 on the CPU).
    pub dispatches_per_step: f64,
    /// Shape-specialised pipelines the backend holds after the counted
    /// steps (wgpu; made at a parameter set's second sighting, so during
    /// warm-up).
    pub specialized_pipelines: usize,
    /// Host heap allocations and bytes per step (graph nodes, call records,
    /// kernel scratch); None without the counting allocator.
    pub host_allocations_per_step: Option<f64>,
    pub host_bytes_per_step: Option<f64>,
}

impl StepCounters {
    /// The counters as `key=value` words for a result's notes.
    pub fn notes(&self) -> String {
        let host = match (self.host_allocations_per_step, self.host_bytes_per_step) {
            (Some(n), Some(b)) => format!("host_allocs_per_step={n:.1} host_bytes_per_step={b:.0}"),
            _ => "host_allocs_per_step=n/a".to_string(),
        };
        format!(
            "kernels_per_step={:.1} concurrent_kernels_per_step={:.1} fused_groups_per_step={:.1} \
             fused_nodes_per_step={:.1} fused_products_per_step={:.1} fused_reductions_per_step={:.1} plans_reused_per_step={:.1} plans_built_per_step={:.1} \
             device_bytes_allocated_per_step={:.0} peak_device_mib={:.2} pipelines_compiled_per_step={:.1} \
             pipeline_cache_hits_per_step={:.1} kernel_trials_per_step={:.1} dispatches_per_step={:.1} \
             specialized_pipelines={} {host}",
            self.kernels_per_step,
            self.concurrent_kernels_per_step,
            self.fused_groups_per_step,
            self.fused_nodes_per_step,
            self.fused_products_per_step,
            self.fused_reductions_per_step,
            self.plans_reused_per_step,
            self.plans_built_per_step,
            self.device_bytes_allocated_per_step,
            self.peak_device_bytes as f64 / (1024.0 * 1024.0),
            self.pipelines_compiled_per_step,
            self.pipeline_cache_hits_per_step,
            self.kernel_trials_per_step,
            self.dispatches_per_step,
            self.specialized_pipelines,
        )
    }
}

/// Run `warmup` untimed steps, then `counted` steps, and return the
/// counters of the counted ones. No timing: the counts do not depend on
/// the machine's speed, so tests can assert them.
pub fn step_counters(
    device: &Device,
    warmup: usize,
    counted: usize,
    mut step: impl FnMut() -> Result<()>,
) -> Result<StepCounters> {
    for _ in 0..warmup {
        step()?;
    }
    let (exec, pool, backend) = (device.exec_stats(), device.stats(), device.backend().counters());
    let host = host_heap::counts();
    device.reset_peak();
    for _ in 0..counted {
        step()?;
    }
    let (exec2, pool2, backend2) = (device.exec_stats(), device.stats(), device.backend().counters());
    let host2 = host_heap::counts();
    let per = |a: usize, b: usize| (b - a) as f64 / counted.max(1) as f64;
    let host_per = |f: fn((u64, u64)) -> u64| match (host, host2) {
        (Some(a), Some(b)) => Some((f(b) - f(a)) as f64 / counted.max(1) as f64),
        _ => None,
    };
    Ok(StepCounters {
        kernels_per_step: per(exec.kernels, exec2.kernels),
        concurrent_kernels_per_step: per(exec.concurrent_kernels, exec2.concurrent_kernels),
        fused_groups_per_step: per(exec.fused_groups, exec2.fused_groups),
        fused_nodes_per_step: per(exec.fused_nodes, exec2.fused_nodes),
        fused_products_per_step: per(exec.fused_products, exec2.fused_products),
        fused_reductions_per_step: per(exec.fused_reductions, exec2.fused_reductions),
        plans_reused_per_step: per(exec.plans_reused, exec2.plans_reused),
        plans_built_per_step: per(exec.plans_built, exec2.plans_built),
        device_bytes_allocated_per_step: per(pool.backend_allocated_bytes, pool2.backend_allocated_bytes)
            + per(backend.scratch_bytes_allocated as usize, backend2.scratch_bytes_allocated as usize),
        pipelines_compiled_per_step: per(backend.pipelines_compiled, backend2.pipelines_compiled),
        pipeline_cache_hits_per_step: per(backend.pipeline_cache_hits, backend2.pipeline_cache_hits),
        kernel_trials_per_step: per(backend.kernel_trials, backend2.kernel_trials),
        dispatches_per_step: per(backend.dispatches, backend2.dispatches),
        specialized_pipelines: backend2.specialized_pipelines,
        peak_device_bytes: pool2.peak_live_bytes,
        host_allocations_per_step: host_per(|c| c.0),
        host_bytes_per_step: host_per(|c| c.1),
    })
}

thread_local! {
    /// The first warm-up step's time of the workload being measured (its
    /// pipeline compilations, matmul trials and planning included), for
    /// `summarize`'s notes.
    static FIRST_STEP_MS: std::cell::Cell<Option<f64>> = const { std::cell::Cell::new(None) };
}

/// Time `step` after `warmup` untimed runs; returns per-run milliseconds.
fn time_runs(warmup: usize, counted: usize, mut step: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    for i in 0..warmup {
        let start = Instant::now();
        step()?;
        if i == 0 {
            FIRST_STEP_MS.with(|f| f.set(Some(start.elapsed().as_secs_f64() * 1e3)));
        }
    }
    let mut times = Vec::with_capacity(counted);
    for _ in 0..counted {
        let start = Instant::now();
        step()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

/// The median of `times` (the mean of the middle two for an even count):
/// the one figure both the JSON line's `median_ms` and the per-op and
/// GFLOP/s notes derive from, so they always agree.
fn median(times: &[f64]) -> f64 {
    let mut t = times.to_vec();
    t.sort_by(|a, b| a.total_cmp(b));
    match t.len() {
        0 => 0.0,
        n if n % 2 == 1 => t[n / 2],
        n => (t[n / 2 - 1] + t[n / 2]) / 2.0,
    }
}

fn summarize(workload: &'static str, backend: &str, mut times: Vec<f64>, mut notes: String) -> BenchResult {
    if let Some(first) = FIRST_STEP_MS.with(|f| f.take()) {
        notes.push_str(&format!(" first_step_ms={first:.1}"));
    }
    let median = median(&times);
    times.sort_by(|a, b| a.total_cmp(b));
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
/// 784-pixel images and labels below 10, drawn from `seed` and `seed + 1`,
/// and the counters of a few more steps after them.
fn training_steps(
    device: &Device,
    model: &Sequential,
    batch: usize,
    seed: u64,
    warmup: usize,
    counted: usize,
) -> Result<(Vec<f64>, StepCounters)> {
    let mut step = training_step(device, model, batch, seed)?;
    let times = time_runs(warmup, counted, &mut step)?;
    let counters = step_counters(device, 0, 5, &mut step)?;
    Ok((times, counters))
}

/// One training step of `model` per call (forward, cross-entropy, backward,
/// Adam at 1e-3, loss read back, a fresh graph each time as a training loop
/// builds it) on one fixed random batch of `batch` 784-pixel images and
/// labels below 10, drawn from `seed` and `seed + 1`.
pub fn training_step<'a>(
    device: &'a Device,
    model: &'a Sequential,
    batch: usize,
    seed: u64,
) -> Result<impl FnMut() -> Result<()> + 'a> {
    let mut optimizer = Adam::new(model.parameters(), 1e-3)?;
    let images = random_vec(batch * 784, seed);
    let mut rng = SplitMix64::new(seed + 1);
    let labels: Vec<i32> = (0..batch).map(|_| rng.below(10) as i32).collect();
    let mut graph = Graph::new(device);
    Ok(move || {
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
    let (times, counters) = training_steps(device, &model, 128, 2, 20, counted)?;
    Ok(summarize("W1", backend, times, counters.notes()))
}

/// W2: CNN training step (BENCHMARKS.md), Adam, batch 64 of 28x28x1.
pub fn w2_cnn_step(device: &Device, backend: &str, counted: usize) -> Result<BenchResult> {
    let model = crate::models::cnn(device, [1, 28, 28], 10, 1)?;
    let (times, counters) = training_steps(device, &model, 64, 7, 5, counted)?;
    Ok(summarize("W2", backend, times, counters.notes()))
}

/// W3: 1000 × tanh(y·1.0001 + 0.001) on 16 floats, forward + backward.
pub fn w3_graph_overhead(device: &Device, backend: &str, counted: usize) -> Result<BenchResult> {
    let x0 = random_vec(16, 4);
    let mut graph = Graph::new(device);
    let mut step = || {
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
    };
    let times = time_runs(5, counted, &mut step)?;
    let counters = step_counters(device, 0, 3, &mut step)?;
    let median = median(&times);
    let notes =
        format!("per-op {:.2} us ({} graph nodes per run) {}", median * 1e3 / 1000.0, graph.len(), counters.notes());
    Ok(summarize("W3", backend, times, notes))
}

/// W3 through `Compiled` (the `jax.jit` counterpart): the chain and its
/// gradient (`Graph::grad`) are built once, then every step writes x into
/// the traced graph, replays the executor's plan and reads the loss and
/// the gradient back.
pub fn w3_compiled(device: &Device, backend: &str, counted: usize) -> Result<BenchResult> {
    let x0 = kiln_core::HostData::F32(random_vec(16, 4));
    let mut f = kiln_core::Compiled::new(device, |graph, xs| {
        let x = xs[0];
        let mut y = x;
        for _ in 0..1000 {
            y = y.mul(1.0001)?.add(0.001)?.tanh()?;
        }
        let loss = y.sum_all()?;
        let dx = graph.grad(loss, &[x], None)?;
        Ok(vec![loss, dx[0]])
    });
    let mut step = || {
        pollster::block_on(f.call(&[(&x0, &[16])]))?;
        Ok(())
    };
    let times = time_runs(5, counted, &mut step)?;
    let counters = step_counters(device, 0, 3, &mut step)?;
    let median = median(&times);
    let notes =
        format!("per-op {:.2} us, kiln_core::Compiled (traced once) {}", median * 1e3 / 1000.0, counters.notes());
    Ok(summarize("W3", &format!("{backend}-compiled"), times, notes))
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
    let median = median(&times);
    let gflops = 2.0 * (n as f64).powi(3) / (median * 1e-3) / 1e9;
    Ok(summarize("W4", backend, times, format!("{gflops:.1} GFLOP/s")))
}

/// GEMMn: an n³ product (n = 4096 for the real-GPU check of issue 10),
/// forward only. C's sum is read back rather than C itself: the 64 MiB of a
/// 4096² result would make the step a host-transfer benchmark, while the sum
/// still forces the whole product to be computed. `repeat` products are
/// queued per step (each summed), so a fast device's submission latency is
/// amortised; GFLOP/s counts all of them.
pub fn gemm_large(device: &Device, backend: &str, n: usize, repeat: usize, counted: usize) -> Result<BenchResult> {
    let a = Param::new(device, "a", &random_vec(n * n, 5), &[n, n])?;
    let b = Param::new(device, "b", &random_vec(n * n, 6), &[n, n])?;
    let mut graph = Graph::new(device);
    let times = time_runs(2, counted, || {
        graph.reset();
        let _no_grad = graph.no_grad();
        let (x, y) = (graph.param(&a)?, graph.param(&b)?);
        let mut total = x.matmul(y)?.sum_all()?;
        for _ in 1..repeat {
            total = total.add(x.matmul(y)?.sum_all()?)?;
        }
        total.to_vec_blocking::<f32>()?;
        Ok(())
    })?;
    let median = median(&times);
    let flops = 2.0 * (n as f64).powi(3) * repeat as f64;
    let notes = format!(
        "gemm_{n}x{n}x{n} x{repeat} per step, sum read back: {:.1} GFLOP/s (best {:.1})",
        flops / (median * 1e-3) / 1e9,
        flops / (times.iter().cloned().fold(f64::INFINITY, f64::min) * 1e-3) / 1e9
    );
    Ok(summarize("GEMM_LARGE", backend, times, notes))
}

/// The GEMMs of W1 and W2 (as the layers and their gradient rules issue
/// them: Linear is x·Wᵀ, Conv2d is W·cols per sample), each timed alone:
/// (label, transpose_a, transpose_b, a's dims, b's dims).
pub const GEMM_SHAPES: &[(&str, bool, bool, &[usize], &[usize])] = &[
    ("w1_fc1_fwd_128x784x512", false, true, &[128, 784], &[512, 784]),
    ("w1_fc1_dw_512x128x784", true, false, &[128, 512], &[128, 784]),
    ("w1_fc2_fwd_128x512x512", false, true, &[128, 512], &[512, 512]),
    ("w1_fc2_dx_128x512x512", false, false, &[128, 512], &[512, 512]),
    ("w1_fc2_dw_512x128x512", true, false, &[128, 512], &[128, 512]),
    ("w2_conv1_fwd_64x(32x9x676)", false, false, &[32, 9], &[64, 9, 676]),
    ("w2_conv2_fwd_64x(64x288x121)", false, false, &[64, 288], &[64, 288, 121]),
    ("w2_conv2_dcols_64x(288x64x121)", true, false, &[64, 288], &[64, 64, 121]),
    ("w2_conv2_dw_64x(64x121x288)", false, true, &[64, 64, 121], &[64, 288, 121]),
    ("gemm_1024x1024x1024", false, false, &[1024, 1024], &[1024, 1024]),
];

/// GEMM: GFLOP/s of each of `GEMM_SHAPES` (forward only, result read
/// back, as W4), to compare the workloads' shapes with the 1024³ case.
pub fn gemm_shapes(device: &Device, backend: &str, counted: usize) -> Result<Vec<BenchResult>> {
    let mut results = Vec::new();
    for (i, &(label, ta, tb, ad, bd)) in GEMM_SHAPES.iter().enumerate() {
        let seed = 10 + 2 * i as u64;
        let a = Param::new(device, "a", &random_vec(ad.iter().product(), seed), ad)?;
        let b = Param::new(device, "b", &random_vec(bd.iter().product(), seed + 1), bd)?;
        let mut graph = Graph::new(device);
        let mut flops = 0.0;
        let reps = if label.starts_with("gemm_1024") { counted.min(10) } else { counted };
        let times = time_runs(3, reps, || {
            graph.reset();
            let _no_grad = graph.no_grad();
            let (x, y) = (graph.param(&a)?, graph.param(&b)?);
            let c = x.matmul_t(y, ta, tb)?;
            let k = if ta { ad[ad.len() - 2] } else { ad[ad.len() - 1] };
            flops = 2.0 * c.numel() as f64 * k as f64;
            c.to_vec_blocking::<f32>()?;
            Ok(())
        })?;
        let median = median(&times);
        let notes = format!("{label}: {:.1} GFLOP/s ({:.1} MFLOP)", flops / (median * 1e-3) / 1e9, flops / 1e6);
        results.push(summarize("GEMM", backend, times, notes));
    }
    Ok(results)
}

/// What one activation-checkpointing configuration measured.
#[derive(Clone, Debug)]
pub struct CheckpointRun {
    pub checkpointing: bool,
    /// Milliseconds per training step (all counted steps).
    pub times: Vec<f64>,
    /// Most bytes live on the device during a step (parameters, gradients
    /// and optimizer state included).
    pub peak_bytes: usize,
    /// Bytes live before the step's forward pass: parameters, gradients,
    /// optimizer state. `peak_bytes - resident_bytes` is what the step's
    /// activations and temporaries needed.
    pub resident_bytes: usize,
    /// The loss of every step (warm-up included) as f32 bits: the same
    /// model and data with and without checkpointing must give the same.
    pub loss_bits: Vec<u32>,
}

/// Training steps of the char-level GPT (AdamW, clipping, as `kiln train
/// --model gpt`) on seeded random tokens, with every block checkpointed or
/// not. The model is rebuilt from `seed` for each run, so runs compare.
pub fn gpt_checkpoint_run(
    device: &Device,
    config: crate::gpt::GptConfig,
    batch: usize,
    checkpointing: bool,
    warmup: usize,
    counted: usize,
) -> Result<CheckpointRun> {
    use crate::gpt::{optimizer_for, train_step, Gpt, GptTrainConfig};
    let model = Gpt::new(device, config, 42)?;
    model.set_checkpointing(checkpointing);
    let train = GptTrainConfig { batch, ..GptTrainConfig::default() };
    let (mut adam, mut scheduler) = optimizer_for(&model, &train)?;
    let mut rng = SplitMix64::new(5);
    let tokens = |rng: &mut SplitMix64| -> Vec<i32> {
        (0..batch * config.context).map(|_| rng.below(config.vocab as u64) as i32).collect()
    };
    let mut graph = Graph::new(device);
    let mut run =
        CheckpointRun { checkpointing, times: Vec::new(), peak_bytes: 0, resident_bytes: 0, loss_bits: Vec::new() };
    for step in 0..warmup + counted {
        let (x, y) = (tokens(&mut rng), tokens(&mut rng));
        // The previous step's graph goes first, so the peak is this step's.
        graph.reset();
        let resident = device.stats().live_bytes;
        device.reset_peak();
        let start = Instant::now();
        let loss = train_step(
            &mut graph,
            &model,
            &mut adam,
            &mut scheduler,
            (&x, &y),
            [batch, config.context],
            train.grad_clip,
        )?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        run.loss_bits.push((loss as f32).to_bits());
        if step >= warmup {
            run.times.push(ms);
            run.peak_bytes = run.peak_bytes.max(device.stats().peak_live_bytes);
            run.resident_bytes = run.resident_bytes.max(resident);
        }
    }
    Ok(run)
}

/// CKPT: activation checkpointing on the char-level GPT (context 256,
/// width 128, 4 heads, batch `batch`) for each layer count: one line with
/// and one without, peak device memory and step time in the notes, and
/// whether the losses of the two runs are bit-identical.
pub fn ckpt_gpt(
    device: &Device,
    backend: &str,
    layers: &[usize],
    batch: usize,
    warmup: usize,
    counted: usize,
) -> Result<Vec<BenchResult>> {
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let mut results = Vec::new();
    for &l in layers {
        let config = crate::gpt::GptConfig {
            vocab: 65,
            context: 256,
            layers: l,
            heads: 4,
            width: 128,
            dropout: 0.1,
            bias: true,
        };
        let off = gpt_checkpoint_run(device, config, batch, false, warmup, counted)?;
        let on = gpt_checkpoint_run(device, config, batch, true, warmup, counted)?;
        let identical = off.loss_bits == on.loss_bits;
        for run in [&off, &on] {
            let notes = format!(
                "gpt layers={l} context=256 width=128 batch={batch} dropout=0.1 checkpointing={} \
                 peak_mib={:.1} activations_mib={:.1} losses_bit_identical={identical}",
                if run.checkpointing { "on" } else { "off" },
                mib(run.peak_bytes),
                mib(run.peak_bytes.saturating_sub(run.resident_bytes)),
            );
            results.push(summarize("CKPT", backend, run.times.clone(), notes));
        }
        if !identical {
            return Err(kiln_core::Error::backend(
                "bench",
                format!("CKPT: losses differ with checkpointing: {:?} vs {:?}", off.loss_bits, on.loss_bits),
            ));
        }
    }
    Ok(results)
}

/// The towers model of the BRANCH workload: `towers` independent MLPs
/// (32 → width → width → 8, tanh) reading the same input, their outputs
/// summed. Every matmul is small (batch · width · width < one GEMM's
/// parallel threshold), so it is where parallel branches matter.
pub fn towers_model(device: &Device, towers: usize, width: usize, seed: u64) -> Result<Vec<Sequential>> {
    (0..towers).map(|t| Sequential::mlp(device, &[32, width, width, 8], Activation::Tanh, seed + t as u64)).collect()
}

/// One training step of the towers model (MSE to a fixed target, SGD-free:
/// gradients only), returning the loss bits.
pub fn towers_step(graph: &Graph, towers: &[Sequential], batch: usize) -> Result<u32> {
    let x = graph.tensor_from(&random_vec(batch * 32, 3), &[batch, 32])?;
    let target = graph.tensor_from(&random_vec(batch * 8, 4), &[batch, 8])?;
    let mut sum = None;
    for t in towers {
        let y = t.forward(x)?;
        sum = Some(match sum {
            None => y,
            Some(s) => y.add(s)?,
        });
    }
    let sum = sum.ok_or_else(|| kiln_core::Error::invalid("bench", "no towers"))?;
    let loss = sum.sub(target)?.square()?.mean_all()?;
    for t in towers {
        for p in t.parameters() {
            p.zero_grad();
        }
    }
    loss.backward()?;
    Ok((loss.item_blocking()? as f32).to_bits())
}

/// BRANCH: step time of the towers model with the executor's parallel
/// branches off (serial) and on, same model and data; the losses must be
/// bit-identical.
pub fn branches(
    device: &Device,
    backend: &str,
    towers: usize,
    width: usize,
    batch: usize,
    counted: usize,
) -> Result<Vec<BenchResult>> {
    let model = towers_model(device, towers, width, 1)?;
    let mut results = Vec::new();
    let mut medians = Vec::new();
    let mut losses = Vec::new();
    let before = device.exec_stats();
    for on in [false, true] {
        device.set_parallel_branches(on);
        let mut graph = Graph::new(device);
        let mut loss = 0;
        let times = time_runs(3, counted, || {
            graph.reset();
            loss = towers_step(&graph, &model, batch)?;
            Ok(())
        });
        device.set_parallel_branches(true);
        let r = summarize("BRANCH", backend, times?, String::new());
        medians.push(r.median_ms);
        losses.push(loss);
        results.push((on, r));
    }
    let stats = device.exec_stats();
    let grouped = stats.concurrent_kernels - before.concurrent_kernels;
    let identical = losses[0] == losses[1];
    let speedup = medians[0] / medians[1];
    for (on, r) in &mut results {
        r.notes = format!(
            "towers={towers} width={width} batch={batch} parallel_branches={} speedup={speedup:.2} \
             kernels_run_concurrently={grouped} losses_bit_identical={identical}",
            if *on { "on" } else { "off" }
        );
    }
    if !identical {
        return Err(kiln_core::Error::backend("bench", format!("BRANCH: losses differ: {losses:?}")));
    }
    Ok(results.into_iter().map(|(_, r)| r).collect())
}

/// Memory at one point of a soak run.
#[derive(Clone, Copy, Debug)]
pub struct MemorySample {
    pub step: usize,
    /// Resident set size of this process (/proc/self/statm), bytes.
    pub rss_bytes: u64,
    /// The device pool's bytes handed out (`PoolStats::live_bytes`).
    pub device_live_bytes: usize,
    /// The device pool's bytes held from the backend, live or resting
    /// (`PoolStats::allocated_bytes`).
    pub device_allocated_bytes: usize,
}

/// What `kiln bench --soak N` measured.
#[derive(Clone, Debug)]
pub struct SoakReport {
    pub backend: String,
    pub steps: usize,
    /// After the warm-up steps (pools and caches filled), and at the end.
    pub start: MemorySample,
    pub end: MemorySample,
    /// Every tenth of the run, for the trend.
    pub samples: Vec<MemorySample>,
    pub seconds: f64,
}

fn growth_percent(start: f64, end: f64) -> f64 {
    if start == 0.0 {
        if end == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (end - start) / start * 100.0
    }
}

impl SoakReport {
    pub fn rss_growth_percent(&self) -> f64 {
        growth_percent(self.start.rss_bytes as f64, self.end.rss_bytes as f64)
    }
    pub fn device_growth_percent(&self) -> f64 {
        growth_percent(self.start.device_allocated_bytes as f64, self.end.device_allocated_bytes as f64)
    }

    /// The report as people read it.
    pub fn text(&self) -> String {
        let mib = |b: f64| b / (1024.0 * 1024.0);
        let line = |what: &str, s: &MemorySample| {
            format!(
                "{what} (step {}): RSS {:.1} MiB, device {:.1} MiB live / {:.1} MiB allocated",
                s.step,
                mib(s.rss_bytes as f64),
                mib(s.device_live_bytes as f64),
                mib(s.device_allocated_bytes as f64)
            )
        };
        format!(
            "soak: {} W1 training steps on {} in {:.1} s\n{}\n{}\ngrowth: RSS {:+.2} %, device allocated {:+.2} %, device live {:+.2} %",
            self.steps,
            self.backend,
            self.seconds,
            line("start", &self.start),
            line("end  ", &self.end),
            self.rss_growth_percent(),
            self.device_growth_percent(),
            growth_percent(self.start.device_live_bytes as f64, self.end.device_live_bytes as f64),
        )
    }

    /// One JSON line, like the workloads'.
    pub fn json(&self) -> String {
        format!(
            "{{\"system\":\"kiln\",\"backend\":\"{}\",\"workload\":\"SOAK\",\"steps\":{},\"seconds\":{:.1},\
             \"rss_start\":{},\"rss_end\":{},\"rss_growth_pct\":{:.3},\"device_allocated_start\":{},\
             \"device_allocated_end\":{},\"device_allocated_growth_pct\":{:.3},\"device_live_start\":{},\
             \"device_live_end\":{}}}",
            self.backend,
            self.steps,
            self.seconds,
            self.start.rss_bytes,
            self.end.rss_bytes,
            self.rss_growth_percent(),
            self.start.device_allocated_bytes,
            self.end.device_allocated_bytes,
            self.device_growth_percent(),
            self.start.device_live_bytes,
            self.end.device_live_bytes,
        )
    }
}

/// This process's resident set size: /proc/self/statm's second field
/// (pages) times the page size (0 where /proc does not exist).
pub fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .unwrap_or(0);
    pages * page_size()
}

/// The kernel's page size, from the first mapping in /proc/self/smaps
/// (4096 if that cannot be read).
fn page_size() -> u64 {
    std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("KernelPageSize:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(4096, |kb| kb * 1024)
}

fn sample(device: &Device, step: usize) -> MemorySample {
    let stats = device.stats();
    MemorySample {
        step,
        rss_bytes: resident_bytes(),
        device_live_bytes: stats.live_bytes,
        device_allocated_bytes: stats.allocated_bytes,
    }
}

/// `steps` W1 training steps (the MLP 784-512-512-10, Adam, batch 128, a
/// fresh graph each step as a training loop builds it), with memory sampled
/// after `warmup` steps (start), every tenth of the run and at the end.
/// Flat memory means nothing accumulates per step: not graph nodes, pooled
/// buffers, pipelines nor host allocations.
pub fn soak(device: &Device, backend: &str, steps: usize, warmup: usize) -> Result<SoakReport> {
    let model = Sequential::mlp(device, &[784, 512, 512, 10], Activation::Relu, 1)?;
    let mut step = training_step(device, &model, 128, 2)?;
    for _ in 0..warmup {
        step()?;
    }
    let started = Instant::now();
    let start = sample(device, 0);
    let every = (steps / 10).max(1);
    let mut samples = vec![start];
    for i in 1..=steps {
        step()?;
        if i % every == 0 || i == steps {
            let s = sample(device, i);
            eprintln!(
                "soak step {i}: RSS {} KiB, device {} / {} bytes",
                s.rss_bytes / 1024,
                s.device_live_bytes,
                s.device_allocated_bytes
            );
            samples.push(s);
        }
    }
    let end = *samples.last().expect("the start sample");
    Ok(SoakReport {
        backend: backend.to_string(),
        steps,
        start,
        end,
        samples,
        seconds: started.elapsed().as_secs_f64(),
    })
}
