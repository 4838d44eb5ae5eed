//! Layers and losses built from the primitive ops.

mod conv;
mod layers;
pub mod loss;
mod norm;

pub use conv::{AdaptiveAvgPool2d, AvgPool2d, Conv2d, ConvOptions, ConvTranspose2d, Flatten, MaxPool2d, Unflatten};
pub use layers::{Activation, Dropout, Embedding, Linear, Sequential};
pub use loss::{cross_entropy, cross_entropy_probs, mse_loss, nll_loss};
pub use norm::{BatchNorm2d, LayerNorm};

use crate::error::Result;
use crate::graph::Tensor;
use crate::param::Param;

/// A trainable piece of a model.
pub trait Module {
    /// Apply the module to `x`, recording nodes in `x`'s graph. Errors point
    /// at the caller's line (`#[track_caller]` here applies to every
    /// implementation, through `dyn Module` too; an implementation must not
    /// call its layers from inside a closure, which would cut the chain).
    #[track_caller]
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>>;

    /// Every parameter, in a stable order (optimizers and checkpoints rely
    /// on it).
    fn parameters(&self) -> Vec<Param>;

    /// Every parameter with its key in a checkpoint, PyTorch's `state_dict`
    /// naming: by default each parameter's own name ("weight", "bias");
    /// containers prefix their children's keys ("0.weight" in a
    /// `Sequential`). Same order as `parameters()`.
    fn named_parameters(&self) -> Vec<(String, Param)> {
        self.parameters().into_iter().map(|p| (p.name(), p)).collect()
    }

    /// Non-trainable state that a checkpoint keeps (PyTorch's buffers, such
    /// as batch-norm running statistics). Not in `parameters()`, so no
    /// optimizer touches it.
    fn buffers(&self) -> Vec<Param> {
        Vec::new()
    }

    /// `buffers()` with their checkpoint keys, named like `named_parameters`.
    fn named_buffers(&self) -> Vec<(String, Param)> {
        self.buffers().into_iter().map(|p| (p.name(), p)).collect()
    }

    /// Drop every parameter's accumulated gradient.
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }

    /// Switch between training (dropout active, batch statistics) and
    /// evaluation behaviour. Layers without such behaviour ignore it.
    fn set_training(&self, _training: bool) {}

    /// Total number of scalar parameters.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|p| p.numel()).sum()
    }
}
