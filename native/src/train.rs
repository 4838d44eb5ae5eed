//! The classifier training loop behind `kiln train`, usable from code.

use std::time::Instant;

use kiln_core::data::Dataset;
use kiln_core::nn::{cross_entropy, Module};
use kiln_core::optim::Optimizer;
use kiln_core::{DType, Device, Error, Graph, Result, Tensor};

pub use crate::distributed::{Replicas, SingleProcess};
use crate::Blocking;

#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub epochs: usize,
    pub batch_size: usize,
    pub seed: u64,
    /// Multiply the learning rate by this after every epoch.
    pub lr_decay: f64,
    /// Where to begin (a resumed run starts past 0).
    pub start: Position,
    /// Call the snapshot hook every this many steps within an epoch (0:
    /// only at the end of each epoch).
    pub snapshot_every: usize,
}

/// What happened during training: per-step losses, per-epoch accuracy.
#[derive(Clone, Debug, Default)]
pub struct TrainReport {
    /// (epoch progress, loss) per optimizer step.
    pub losses: Vec<(f64, f64)>,
    /// (epoch, test accuracy in [0, 1]) after each epoch.
    pub test_accuracy: Vec<(f64, f64)>,
    pub seconds: f64,
    pub samples_per_second: f64,
}

impl TrainReport {
    pub fn final_accuracy(&self) -> f64 {
        self.test_accuracy.last().map(|a| a.1).unwrap_or(0.0)
    }
}

/// Called after every step with (epoch, step within epoch, steps per epoch, loss, samples/s).
pub type StepCallback<'a> = &'a mut dyn FnMut(usize, usize, usize, f64, f64);

/// Number of correct predictions of `logits` [N, C] against `labels` [N].
pub fn count_correct<'g>(logits: Tensor<'g>, labels: Tensor<'g>) -> Result<Tensor<'g>> {
    logits.argmax(&[-1], false)?.eq(labels)?.cast(DType::I32)?.sum_all()
}

/// Test-set accuracy in [0, 1], evaluated in batches under no_grad.
pub fn evaluate(device: &Device, model: &dyn Module, data: &Dataset, batch_size: usize) -> Result<f64> {
    evaluate_with(&mut SingleProcess, device, model, data, batch_size)
}

/// Where a training run stands: the next global step to take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Position {
    pub epoch: usize,
    /// Global batch index within the epoch.
    pub step: usize,
}

/// Test-set accuracy in [0, 1] over all processes: each evaluates its
/// contiguous share of `data` and the correct counts are summed.
pub fn evaluate_with(
    replicas: &mut dyn Replicas,
    device: &Device,
    model: &dyn Module,
    data: &Dataset,
    batch_size: usize,
) -> Result<f64> {
    if data.is_empty() {
        return Err(Error::invalid("evaluate", "the evaluation set is empty"));
    }
    let share = crate::distributed::shard_range(data.len, replicas.rank(), replicas.size());
    let indices: Vec<usize> = share.collect();
    model.set_training(false);
    let counted = (|| {
        let mut graph = Graph::new(device);
        let mut correct = 0.0;
        for chunk in indices.chunks(batch_size.max(1)) {
            let batch = crate::distributed::gather(data, chunk)?;
            graph.reset();
            let _no_grad = graph.no_grad();
            let x = graph.tensor_from(&batch.images, &[batch.len, data.features])?;
            let y = graph.tensor_from(&batch.labels, &[batch.len])?;
            correct += count_correct(model.forward(x)?, y)?.item_blocking()?;
        }
        Ok(correct)
    })();
    model.set_training(true);
    let mut correct = [counted?];
    replicas.sum(&mut correct)?;
    Ok(correct[0] / data.len as f64)
}

/// Train `model` on `train` with `optimizer`, measuring accuracy on `test`
/// after every epoch.
pub fn train_classifier(
    device: &Device,
    model: &dyn Module,
    optimizer: &mut dyn Optimizer,
    train: &Dataset,
    test: &Dataset,
    config: &TrainConfig,
    on_step: StepCallback<'_>,
) -> Result<TrainReport> {
    run_classifier(&mut SingleProcess, device, model, optimizer, train, test, config, on_step, &mut |_, _| Ok(()))
}

/// `train_classifier` on one or many processes (`replicas`), from
/// `config.start`, calling `snapshot(position, optimizer)` on rank 0 every
/// `config.snapshot_every` steps (0: never) and after every epoch — where a
/// caller writes checkpoints (see `crate::snapshot`).
#[allow(clippy::too_many_arguments)]
pub fn run_classifier<O: Optimizer + ?Sized>(
    replicas: &mut dyn Replicas,
    device: &Device,
    model: &dyn Module,
    optimizer: &mut O,
    train: &Dataset,
    test: &Dataset,
    config: &TrainConfig,
    on_step: StepCallback<'_>,
    snapshot: &mut dyn FnMut(&Position, &O) -> Result<()>,
) -> Result<TrainReport> {
    if config.batch_size == 0 {
        return Err(Error::invalid("train", "the batch size must be at least 1"));
    }
    if train.is_empty() {
        return Err(Error::invalid("train", "the training set is empty: there is nothing to train on"));
    }
    let sampler = crate::distributed::DistributedSampler::new(
        train.len,
        config.batch_size,
        replicas.rank(),
        replicas.size(),
        Some(config.seed),
    )?;
    let steps_per_epoch = sampler.steps_per_epoch();
    let mut report = TrainReport::default();
    let mut graph = Graph::new(device);
    let start = Instant::now();
    let mut samples = 0usize;
    let root = replicas.rank() == 0;
    if config.epochs == 0 {
        // Nothing to train: report the model as it is (loaded, say).
        report.test_accuracy.push((0.0, evaluate_with(replicas, device, model, test, 1000)?));
    }
    for epoch in config.start.epoch..config.epochs {
        let first = if epoch == config.start.epoch { config.start.step } else { 0 };
        for shard in sampler.epoch(epoch as u64, first) {
            let step = shard.step;
            graph.reset();
            let loss = if shard.indices.is_empty() {
                None
            } else {
                let batch = crate::distributed::gather(train, &shard.indices)?;
                let x = graph.tensor_from(&batch.images, &[batch.len, train.features])?;
                let y = graph.tensor_from(&batch.labels, &[batch.len])?;
                Some(cross_entropy(model.forward(x)?, y)?)
            };
            optimizer.zero_grad();
            let loss = replicas.backward(loss, shard.weight())?;
            if !loss.is_finite() {
                return Err(Error::invalid(
                    "train",
                    format!("loss became {loss} at epoch {epoch} step {step}; lower the learning rate"),
                ));
            }
            optimizer.step()?;
            samples += shard.global_len;
            let rate = samples as f64 / start.elapsed().as_secs_f64().max(1e-9);
            report.losses.push((epoch as f64 + step as f64 / steps_per_epoch as f64, loss));
            on_step(epoch, step, steps_per_epoch, loss, rate);
            let next = Position { epoch, step: step + 1 };
            if root
                && config.snapshot_every > 0
                && (step + 1) % config.snapshot_every == 0
                && step + 1 < steps_per_epoch
            {
                snapshot(&next, optimizer)?;
            }
        }
        report.test_accuracy.push(((epoch + 1) as f64, evaluate_with(replicas, device, model, test, 1000)?));
        let lr = optimizer.learning_rate();
        optimizer.set_learning_rate(lr * config.lr_decay)?;
        if root {
            snapshot(&Position { epoch: epoch + 1, step: 0 }, optimizer)?;
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    report.samples_per_second = samples as f64 / report.seconds.max(1e-9);
    Ok(report)
}
