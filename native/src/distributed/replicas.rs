//! How a training step's gradients are combined across processes, as the
//! training loops see it.

use kiln_core::{Error, Result, Tensor};

use crate::Blocking;

/// How a training step's gradients are combined: one process
/// ([`SingleProcess`]) or many (`DataParallel`, feature `mpi`). A training
/// loop written against this trait (the `kiln train` loop, `gpt::train_step_with`)
/// is the same for both.
pub trait Replicas {
    /// This process's index, 0 for one process.
    fn rank(&self) -> usize;
    /// Number of processes training together.
    fn size(&self) -> usize;
    /// Differentiate this process's mean loss over its shard of the global
    /// batch (`weight` = shard / global batch) and leave the gradient of the
    /// global batch's mean loss in the parameters; returns that mean loss.
    /// `None` when this process's shard is empty (it still takes part).
    fn backward(&mut self, loss: Option<Tensor<'_>>, weight: f64) -> Result<f64>;
    /// Element-wise sum over processes (evaluation counts).
    fn sum(&mut self, values: &mut [f64]) -> Result<()>;
}

/// One process: plain `backward`.
pub struct SingleProcess;

impl Replicas for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn backward(&mut self, loss: Option<Tensor<'_>>, _weight: f64) -> Result<f64> {
        let loss = loss.ok_or_else(|| Error::invalid("train", "an empty batch"))?;
        loss.backward()?;
        loss.item_blocking()
    }
    fn sum(&mut self, _values: &mut [f64]) -> Result<()> {
        Ok(())
    }
}
