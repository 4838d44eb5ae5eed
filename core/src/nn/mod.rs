//! Layers and losses built from the primitive ops.

mod activation;
pub mod attention;
mod conv;
pub mod init;
mod layers;
pub mod loss;
mod norm;

pub use activation::{LeakyReLU, Mish, Softplus, ELU};
pub use attention::{
    scaled_dot_product_attention, AttentionDropout, KvCache, LayerCache, MultiheadAttention, TransformerBlock,
};
pub use conv::{AdaptiveAvgPool2d, AvgPool2d, Conv2d, ConvOptions, ConvTranspose2d, Flatten, MaxPool2d, Unflatten};
pub use layers::{Activation, Dropout, Embedding, Linear, Sequential};
pub use loss::{cross_entropy, cross_entropy_probs, mse_loss, nll_loss};
pub use norm::{BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm, RMSNorm};

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

    /// Every key that PyTorch's `state_dict` of this module would hold,
    /// with its `Param`: a tied `Param` under each of its names (for the GPT,
    /// "head.weight" as well as "tok_emb.weight"), which `named_parameters`
    /// lists once. Checkpoint loading accepts those later keys (the copies
    /// must agree). Default: `named_parameters` then `named_buffers`;
    /// `#[derive(Module)]` generates it from the fields.
    fn state_dict_entries(&self) -> Vec<(String, Param)> {
        let mut all = self.named_parameters();
        all.extend(self.named_buffers());
        all
    }

    /// Total number of scalar parameters.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|p| p.numel()).sum()
    }
}

/// The derive macro: `#[derive(Module)]` (see the `kiln-derive` crate).
pub use kiln_derive::Module;

/// What `#[derive(Module)]` asks of a field: its parameters and buffers
/// under the field's name, and the training switch. Implemented for
/// `Param`, every kiln layer, derived modules, and `Vec`/`Option`/`Box` of
/// those. A hand-written `Module` type becomes usable as a field with
/// `kiln::module_field!(MyType);`.
pub trait ModuleField {
    fn collect_parameters(&self, prefix: &str, out: &mut Vec<(String, Param)>);
    fn collect_buffers(&self, prefix: &str, out: &mut Vec<(String, Param)>);
    fn set_training_field(&self, training: bool);
    /// `Module::state_dict_entries` under the field's name: parameters and
    /// buffers, a tied `Param` under every name it has.
    fn collect_state_dict(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        self.collect_parameters(prefix, out);
        self.collect_buffers(prefix, out);
    }
}

/// Append `entries` to `out` with "{prefix}." in front of each key.
pub fn prefix_entries(prefix: &str, entries: Vec<(String, Param)>, out: &mut Vec<(String, Param)>) {
    out.extend(entries.into_iter().map(|(k, p)| (format!("{prefix}.{k}"), p)));
}

/// Keep the first entry of every parameter that appears more than once
/// (one `Param` used by two modules: weight tying), so an optimizer never
/// updates it twice.
pub fn dedup_params(entries: Vec<(String, Param)>) -> Vec<(String, Param)> {
    let mut out: Vec<(String, Param)> = Vec::with_capacity(entries.len());
    for (k, p) in entries {
        if !out.iter().any(|(_, q)| q.same(&p)) {
            out.push((k, p));
        }
    }
    out
}

impl ModuleField for Param {
    fn collect_parameters(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        out.push((prefix.to_string(), self.clone()));
    }
    fn collect_buffers(&self, _prefix: &str, _out: &mut Vec<(String, Param)>) {}
    fn set_training_field(&self, _training: bool) {}
}

impl<T: ModuleField> ModuleField for Vec<T> {
    fn collect_parameters(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        for (i, item) in self.iter().enumerate() {
            item.collect_parameters(&format!("{prefix}.{i}"), out);
        }
    }
    fn collect_buffers(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        for (i, item) in self.iter().enumerate() {
            item.collect_buffers(&format!("{prefix}.{i}"), out);
        }
    }
    fn collect_state_dict(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        for (i, item) in self.iter().enumerate() {
            item.collect_state_dict(&format!("{prefix}.{i}"), out);
        }
    }
    fn set_training_field(&self, training: bool) {
        self.iter().for_each(|item| item.set_training_field(training));
    }
}

impl<T: ModuleField> ModuleField for Option<T> {
    fn collect_parameters(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        if let Some(item) = self {
            item.collect_parameters(prefix, out);
        }
    }
    fn collect_buffers(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        if let Some(item) = self {
            item.collect_buffers(prefix, out);
        }
    }
    fn collect_state_dict(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        if let Some(item) = self {
            item.collect_state_dict(prefix, out);
        }
    }
    fn set_training_field(&self, training: bool) {
        if let Some(item) = self {
            item.set_training_field(training);
        }
    }
}

impl ModuleField for Box<dyn Module> {
    fn collect_parameters(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        prefix_entries(prefix, self.named_parameters(), out);
    }
    fn collect_buffers(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        prefix_entries(prefix, self.named_buffers(), out);
    }
    fn collect_state_dict(&self, prefix: &str, out: &mut Vec<(String, Param)>) {
        prefix_entries(prefix, self.state_dict_entries(), out);
    }
    fn set_training_field(&self, training: bool) {
        self.set_training(training);
    }
}

/// Make hand-written `Module` types usable as fields of derived modules.
#[macro_export]
macro_rules! module_field {
    ($($t:ty),* $(,)?) => {$(
        impl $crate::nn::ModuleField for $t {
            fn collect_parameters(&self, prefix: &str, out: &mut Vec<(String, $crate::Param)>) {
                $crate::nn::prefix_entries(prefix, $crate::nn::Module::named_parameters(self), out);
            }
            fn collect_buffers(&self, prefix: &str, out: &mut Vec<(String, $crate::Param)>) {
                $crate::nn::prefix_entries(prefix, $crate::nn::Module::named_buffers(self), out);
            }
            fn collect_state_dict(&self, prefix: &str, out: &mut Vec<(String, $crate::Param)>) {
                $crate::nn::prefix_entries(prefix, $crate::nn::Module::state_dict_entries(self), out);
            }
            fn set_training_field(&self, training: bool) {
                $crate::nn::Module::set_training(self, training);
            }
        }
    )*};
}

module_field!(
    Linear,
    Sequential,
    Activation,
    Dropout,
    Embedding,
    LayerNorm,
    RMSNorm,
    GroupNorm,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    ConvTranspose2d,
    MaxPool2d,
    AvgPool2d,
    AdaptiveAvgPool2d,
    Flatten,
    Unflatten,
    LeakyReLU,
    ELU,
    Softplus,
    Mish,
    MultiheadAttention,
    TransformerBlock,
);
