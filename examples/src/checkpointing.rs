//! Activation checkpointing on a character-level GPT: the same training
//! gradients computed with every transformer block kept (checkpointing off)
//! and recomputed in backward (on). Measures the device pool's peak bytes
//! and the step time of both, and compares the loss and every parameter
//! gradient bit for bit.

use std::time::Instant;

use kiln::gpt::{lm_loss, random_batch, Gpt, GptConfig};
use kiln::host_rng::SplitMix64;
use kiln::prelude::*;

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub config: GptConfig,
    pub batch: usize,
    /// Steps per mode; the first one warms the pools and is not timed.
    pub steps: usize,
    /// Scale the checkpointed run's loss by (1 + 1e-6): its gradients are
    /// then not those of the plain run, and the comparison must say so
    /// (shows that the check can fail).
    pub perturb: bool,
}

impl Setup {
    /// The example's default: context 256, 4 layers, width 128, 4 heads,
    /// dropout 0.1 (so the replayed dropout masks are checked too), batch 4.
    pub fn example() -> Setup {
        Setup {
            config: GptConfig { vocab: 65, context: 256, layers: 4, heads: 4, width: 128, dropout: 0.1, bias: true },
            batch: 4,
            steps: 3,
            perturb: false,
        }
    }
}

/// One mode's figures.
#[derive(Clone, Debug)]
pub struct ModeFigures {
    pub checkpointing: bool,
    /// Highest bytes handed out by the device pool during a step.
    pub peak_bytes: usize,
    /// Bytes live before the step (parameters, kept gradients).
    pub resident_bytes: usize,
    /// Median time of one forward + backward, ms (steps after the first).
    pub median_ms: f64,
}

impl ModeFigures {
    /// Bytes a step adds on top of what lives between steps: activations
    /// and gradients in flight.
    pub fn step_bytes(&self) -> usize {
        self.peak_bytes.saturating_sub(self.resident_bytes)
    }
}

/// The comparison.
#[derive(Clone, Debug)]
pub struct Report {
    pub off: ModeFigures,
    pub on: ModeFigures,
    /// Values compared (losses and gradient elements over all steps) and
    /// how many of them differ in any bit.
    pub compared: usize,
    pub differing: usize,
    /// The first difference: (parameter name or "loss", step, element, off, on).
    pub first_difference: Option<(String, usize, usize, f32, f32)>,
}

impl Report {
    pub fn identical(&self) -> bool {
        self.differing == 0 && self.compared > 0
    }
}

/// Losses and gradients of one mode, step by step.
struct Trace {
    figures: ModeFigures,
    /// Per step: the loss, then each parameter's gradient (name, values).
    steps: Vec<Vec<(String, Vec<f32>)>>,
}

fn run_mode(device: &Device, setup: &Setup, tokens: &[i32], checkpointing: bool) -> Result<Trace> {
    let config = setup.config;
    let model = Gpt::new(device, config, 42)?;
    model.set_checkpointing(checkpointing);
    let params = model.named_parameters();
    let mut graph = Graph::new(device);
    let mut times = Vec::new();
    let mut figures = ModeFigures { checkpointing, peak_bytes: 0, resident_bytes: 0, median_ms: f64::NAN };
    let mut steps = Vec::new();
    for step in 0..setup.steps {
        let mut rng = SplitMix64::for_stream(7, step as u64);
        let (x, y) = random_batch(tokens, setup.batch, config.context, &mut rng);
        for (_, p) in &params {
            p.zero_grad();
        }
        // The previous step's graph goes first, so the peak is this step's.
        graph.reset();
        let resident = device.stats().live_bytes;
        device.reset_peak();
        let start = Instant::now();
        let shape = [setup.batch, config.context];
        let mut loss = lm_loss(&model, graph.tensor_from(&x, &shape)?, graph.tensor_from(&y, &shape)?)?;
        if checkpointing && setup.perturb {
            loss = loss.mul(1.0 + 1e-6)?;
        }
        loss.backward()?;
        let loss_value = loss.item_blocking()? as f32;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let mut values = vec![("loss".to_string(), vec![loss_value])];
        for (name, p) in &params {
            let grad = p.grad_blocking()?.map(|g| g.to_f64_vec()).unwrap_or_default();
            values.push((name.clone(), grad.into_iter().map(|v| v as f32).collect()));
        }
        if step > 0 || setup.steps == 1 {
            times.push(ms);
        }
        figures.peak_bytes = figures.peak_bytes.max(device.stats().peak_live_bytes);
        figures.resident_bytes = figures.resident_bytes.max(resident);
        steps.push(values);
    }
    times.sort_by(f64::total_cmp);
    figures.median_ms = times[times.len() / 2];
    Ok(Trace { figures, steps })
}

/// Train-step gradients of the GPT with checkpointing off, then on, on
/// `device`, from the same parameters and batches (random tokens from
/// `tokens`, which must hold more than `context + 1` ids).
pub fn compare(device: &Device, setup: &Setup, tokens: &[i32]) -> Result<Report> {
    if setup.steps == 0 || tokens.len() <= setup.config.context + 1 {
        return Err(Error::invalid(
            "checkpointing example",
            format!("need at least one step and more than {} tokens", setup.config.context + 1),
        ));
    }
    let off = run_mode(device, setup, tokens, false)?;
    let on = run_mode(device, setup, tokens, true)?;
    let mut compared = 0;
    let mut differing = 0;
    let mut first_difference = None;
    for (step, (a, b)) in off.steps.iter().zip(&on.steps).enumerate() {
        for ((name, va), (_, vb)) in a.iter().zip(b) {
            if va.len() != vb.len() {
                return Err(Error::shape(
                    "checkpointing example",
                    format!("gradient of {name} has {} elements off and {} on", va.len(), vb.len()),
                ));
            }
            for (i, (x, y)) in va.iter().zip(vb).enumerate() {
                compared += 1;
                if x.to_bits() != y.to_bits() {
                    differing += 1;
                    first_difference.get_or_insert((name.clone(), step, i, *x, *y));
                }
            }
        }
    }
    Ok(Report { off: off.figures, on: on.figures, compared, differing, first_difference })
}

/// Deterministic stand-in text: `len` character ids below `vocab`.
pub fn synthetic_tokens(vocab: usize, len: usize, seed: u64) -> Vec<i32> {
    let mut rng = SplitMix64::new(seed);
    (0..len).map(|_| rng.below(vocab as u64) as i32).collect()
}
