//! The classifier training loop behind `kiln train`, usable from code.

use std::time::Instant;

use kiln_core::data::Dataset;
use kiln_core::nn::{cross_entropy, Module};
use kiln_core::optim::Optimizer;
use kiln_core::{DType, Device, Error, Graph, Result, Tensor};

use crate::Blocking;

#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub epochs: usize,
    pub batch_size: usize,
    pub seed: u64,
    /// Multiply the learning rate by this after every epoch.
    pub lr_decay: f64,
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
    if data.is_empty() {
        return Err(Error::invalid("evaluate", "the evaluation set is empty"));
    }
    model.set_training(false);
    let mut graph = Graph::new(device);
    let mut correct = 0.0;
    for batch in data.batches(batch_size, None, 0)? {
        graph.reset();
        let _no_grad = graph.no_grad();
        let x = graph.tensor_from(&batch.images, &[batch.len, data.features])?;
        let y = graph.tensor_from(&batch.labels, &[batch.len])?;
        let counted = count_correct(model.forward(x)?, y).and_then(|c| c.item_blocking());
        if counted.is_err() {
            model.set_training(true);
        }
        correct += counted?;
    }
    model.set_training(true);
    Ok(correct / data.len as f64)
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
    let steps_per_epoch = train.len.div_ceil(config.batch_size.max(1));
    let mut report = TrainReport::default();
    let mut graph = Graph::new(device);
    let start = Instant::now();
    let mut samples = 0usize;
    for epoch in 0..config.epochs {
        for (step, batch) in train.batches(config.batch_size, Some(config.seed), epoch as u64)?.enumerate() {
            graph.reset();
            let x = graph.tensor_from(&batch.images, &[batch.len, train.features])?;
            let y = graph.tensor_from(&batch.labels, &[batch.len])?;
            let loss = cross_entropy(model.forward(x)?, y)?;
            optimizer.zero_grad();
            loss.backward()?;
            optimizer.step()?;
            let loss = loss.item_blocking()?;
            if !loss.is_finite() {
                return Err(Error::invalid(
                    "train",
                    format!("loss became {loss} at epoch {epoch} step {step}; lower the learning rate"),
                ));
            }
            samples += batch.len;
            let rate = samples as f64 / start.elapsed().as_secs_f64().max(1e-9);
            report.losses.push((epoch as f64 + step as f64 / steps_per_epoch as f64, loss));
            on_step(epoch, step, steps_per_epoch, loss, rate);
        }
        report.test_accuracy.push(((epoch + 1) as f64, evaluate(device, model, test, 1000)?));
        let lr = optimizer.learning_rate();
        optimizer.set_learning_rate(lr * config.lr_decay);
    }
    report.seconds = start.elapsed().as_secs_f64();
    report.samples_per_second = samples as f64 / report.seconds.max(1e-9);
    Ok(report)
}
