//! Normalisation layers.

use std::cell::Cell;

use super::layers::generated_param;
use super::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::param::Param;
use crate::shape::check_shape;

/// An f32 parameter of `dims` filled with `value`; errors name `op`.
#[track_caller]
fn filled(device: &Device, op: &'static str, name: &str, dims: &[usize], value: f64) -> Result<Param> {
    generated_param(device, op, name, dims, DType::F32, || value)
}

/// Normalise over the trailing `normalized` dimensions, then scale and shift
/// (weight starts at 1, bias at 0; `without_bias` drops the shift, as
/// PyTorch's `LayerNorm(..., bias=False)`).
pub struct LayerNorm {
    pub weight: Param,
    pub bias: Option<Param>,
    normalized: Vec<usize>,
    eps: f64,
}

impl LayerNorm {
    #[track_caller]
    pub fn new(device: &Device, normalized: &[usize], eps: f64) -> Result<LayerNorm> {
        let n = check_shape("LayerNorm", normalized, DType::F32)?;
        if normalized.is_empty() || n == 0 || eps.is_nan() || eps <= 0.0 {
            return Err(Error::invalid(
                "LayerNorm",
                format!("needs a non-empty shape and eps > 0, got {normalized:?} and {eps}"),
            ));
        }
        let weight = filled(device, "LayerNorm", "weight", normalized, 1.0)?;
        let bias = Some(filled(device, "LayerNorm", "bias", normalized, 0.0)?);
        Ok(LayerNorm { weight, bias, normalized: normalized.to_vec(), eps })
    }

    /// The same layer with no bias (scale only).
    pub fn without_bias(mut self) -> LayerNorm {
        self.bias = None;
        self
    }
}

impl Module for LayerNorm {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let d = x.dims();
        let k = self.normalized.len();
        if d.len() < k || d[d.len() - k..] != self.normalized[..] {
            return Err(Error::shape(
                "LayerNorm",
                format!("input {:?} does not end in {:?}", d.as_slice(), self.normalized),
            ));
        }
        let graph = x.graph();
        // One LayerNorm primitive natively (see `Tensor::layer_norm`).
        let y = x.layer_norm(k, self.eps)?.mul(graph.param(&self.weight)?)?;
        match &self.bias {
            Some(b) => y.add(graph.param(b)?),
            None => Ok(y),
        }
    }
    fn parameters(&self) -> Vec<Param> {
        std::iter::once(self.weight.clone()).chain(self.bias.clone()).collect()
    }
}

/// Batch normalisation over (N, H, W) per channel of an NCHW input.
/// Training mode normalises with the batch's statistics and updates the
/// running statistics under no_grad (momentum, unbiased variance, as in
/// PyTorch); evaluation mode normalises with the running statistics.
pub struct BatchNorm2d {
    pub weight: Param,
    pub bias: Param,
    /// Running statistics: parameters that never require grad.
    pub running_mean: Param,
    pub running_var: Param,
    channels: usize,
    eps: f64,
    momentum: f64,
    training: Cell<bool>,
}

impl BatchNorm2d {
    #[track_caller]
    pub fn new(device: &Device, channels: usize, eps: f64, momentum: f64) -> Result<BatchNorm2d> {
        if channels == 0 || eps.is_nan() || eps <= 0.0 || !(0.0..=1.0).contains(&momentum) {
            return Err(Error::invalid(
                "BatchNorm2d",
                format!("channels {channels} > 0, eps {eps} > 0 and momentum {momentum} in [0, 1] required"),
            ));
        }
        const OP: &str = "BatchNorm2d";
        let running_mean = filled(device, OP, "running_mean", &[channels], 0.0)?;
        let running_var = filled(device, OP, "running_var", &[channels], 1.0)?;
        running_mean.set_requires_grad(false);
        running_var.set_requires_grad(false);
        Ok(BatchNorm2d {
            weight: filled(device, OP, "weight", &[channels], 1.0)?,
            bias: filled(device, OP, "bias", &[channels], 0.0)?,
            running_mean,
            running_var,
            channels,
            eps,
            momentum,
            training: Cell::new(true),
        })
    }

    pub fn is_training(&self) -> bool {
        self.training.get()
    }
}

impl Module for BatchNorm2d {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let d = x.dims();
        if d.len() != 4 || d[1] != self.channels {
            return Err(Error::shape(
                "BatchNorm2d",
                format!("expects [N, {}, H, W], got {:?}", self.channels, d.as_slice()),
            ));
        }
        let graph = x.graph();
        let per_channel = [1, self.channels, 1, 1];
        let (mean, var) = if self.training.get() {
            let count = d[0] * d[2] * d[3];
            if count < 2 {
                return Err(Error::shape("BatchNorm2d", "training needs more than one value per channel"));
            }
            let mean = x.mean(&[0, 2, 3], true)?;
            let var = x.var(&[0, 2, 3], true, 0)?;
            {
                let _no_grad = graph.no_grad();
                let m = self.momentum;
                let unbiased = var.detach()?.mul(count as f64 / (count - 1) as f64)?.reshape_to(&[self.channels])?;
                let batch_mean = mean.detach()?.reshape_to(&[self.channels])?;
                let new_mean = graph.param(&self.running_mean)?.mul(1.0 - m)?.add(batch_mean.mul(m)?)?;
                let new_var = graph.param(&self.running_var)?.mul(1.0 - m)?.add(unbiased.mul(m)?)?;
                // Compute both (and x, which the normalisation reuses) at once.
                graph.realize(&[new_mean, new_var, x])?;
                self.running_mean.assign(new_mean)?;
                self.running_var.assign(new_var)?;
            }
            (mean, var)
        } else {
            (
                graph.param(&self.running_mean)?.reshape_to(&per_channel)?,
                graph.param(&self.running_var)?.reshape_to(&per_channel)?,
            )
        };
        let normalized = x.sub(mean)?.div(var.add(self.eps)?.sqrt()?)?;
        let weight = graph.param(&self.weight)?.reshape_to(&per_channel)?;
        let bias = graph.param(&self.bias)?.reshape_to(&per_channel)?;
        normalized.mul(weight)?.add(bias)
    }
    fn parameters(&self) -> Vec<Param> {
        vec![self.weight.clone(), self.bias.clone()]
    }
    /// The running statistics ("running_mean", "running_var"). PyTorch also
    /// keeps "num_batches_tracked", which kiln does not track (its momentum
    /// is always a number, so the count never matters).
    fn buffers(&self) -> Vec<Param> {
        vec![self.running_mean.clone(), self.running_var.clone()]
    }
    fn set_training(&self, training: bool) {
        self.training.set(training);
    }
}

/// Root-mean-square normalisation over the trailing `normalized` dims:
/// x / √(mean(x²) + eps) · weight (PyTorch's `nn.RMSNorm`; weight starts at 1).
pub struct RMSNorm {
    pub weight: Param,
    normalized: Vec<usize>,
    eps: f64,
}

impl RMSNorm {
    #[track_caller]
    pub fn new(device: &Device, normalized: &[usize], eps: f64) -> Result<RMSNorm> {
        let n: usize = normalized.iter().product();
        if normalized.is_empty() || n == 0 || eps.is_nan() || eps <= 0.0 {
            return Err(Error::invalid(
                "RMSNorm",
                format!("needs a non-empty shape and eps > 0, got {normalized:?} and {eps}"),
            ));
        }
        let weight = filled(device, "RMSNorm", "weight", normalized, 1.0)?;
        Ok(RMSNorm { weight, normalized: normalized.to_vec(), eps })
    }
}

impl Module for RMSNorm {
    #[track_caller]
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let d = x.dims();
        let k = self.normalized.len();
        if d.len() < k || d[d.len() - k..] != self.normalized[..] {
            return Err(Error::shape(
                "RMSNorm",
                format!("input {:?} does not end in {:?}", d.as_slice(), self.normalized),
            ));
        }
        x.rms_norm(k, self.eps)?.mul(x.graph().param(&self.weight)?)
    }
    fn parameters(&self) -> Vec<Param> {
        vec![self.weight.clone()]
    }
}

/// Group normalisation (PyTorch's `nn.GroupNorm`): the C channels of an
/// [N, C, *] input are split into `groups` groups, each normalised over its
/// channels and all spatial positions, then scaled and shifted per channel.
pub struct GroupNorm {
    pub weight: Param,
    pub bias: Param,
    groups: usize,
    channels: usize,
    eps: f64,
}

impl GroupNorm {
    #[track_caller]
    pub fn new(device: &Device, groups: usize, channels: usize, eps: f64) -> Result<GroupNorm> {
        if groups == 0 || channels == 0 || channels % groups != 0 || eps.is_nan() || eps <= 0.0 {
            return Err(Error::invalid(
                "GroupNorm",
                format!("needs groups > 0 dividing channels > 0 and eps > 0, got {groups}, {channels}, {eps}"),
            ));
        }
        Ok(GroupNorm {
            weight: filled(device, "GroupNorm", "weight", &[channels], 1.0)?,
            bias: filled(device, "GroupNorm", "bias", &[channels], 0.0)?,
            groups,
            channels,
            eps,
        })
    }
}

impl Module for GroupNorm {
    #[track_caller]
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let d = x.dims();
        if d.len() < 2 || d[1] != self.channels {
            return Err(Error::shape(
                "GroupNorm",
                format!("expects [N, {}, ...], got {:?}", self.channels, d.as_slice()),
            ));
        }
        let normalized = x.group_norm(self.groups, self.eps)?;
        let mut per_channel = vec![1usize; d.len()];
        per_channel[1] = self.channels;
        let graph = x.graph();
        let weight = graph.param(&self.weight)?.reshape_to(&per_channel)?;
        let bias = graph.param(&self.bias)?.reshape_to(&per_channel)?;
        normalized.mul(weight)?.add(bias)
    }
    fn parameters(&self) -> Vec<Param> {
        vec![self.weight.clone(), self.bias.clone()]
    }
}

/// Batch normalisation of [N, C] or [N, C, L] inputs per channel (PyTorch's
/// `nn.BatchNorm1d`), with the same training/evaluation behaviour and
/// running statistics as `BatchNorm2d`.
pub struct BatchNorm1d {
    inner: BatchNorm2d,
}

impl BatchNorm1d {
    #[track_caller]
    pub fn new(device: &Device, channels: usize, eps: f64, momentum: f64) -> Result<BatchNorm1d> {
        match BatchNorm2d::new(device, channels, eps, momentum) {
            Ok(inner) => Ok(BatchNorm1d { inner }),
            Err(e) => Err(Error::invalid("BatchNorm1d", e.message().to_string())),
        }
    }
    pub fn weight(&self) -> &Param {
        &self.inner.weight
    }
    pub fn bias(&self) -> &Param {
        &self.inner.bias
    }
    pub fn running_mean(&self) -> &Param {
        &self.inner.running_mean
    }
    pub fn running_var(&self) -> &Param {
        &self.inner.running_var
    }
}

impl Module for BatchNorm1d {
    /// [N, C] and [N, C, L] are viewed as [N, C, 1, L] and normalised by
    /// the 2-D layer, whose statistics run over (N, H, W) = (N, L).
    #[track_caller]
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let d = x.dims();
        let c = self.inner.channels;
        let as4 = match d.as_slice() {
            [n, ch] if *ch == c => [*n, c, 1, 1],
            [n, ch, l] if *ch == c => [*n, c, 1, *l],
            _ => {
                return Err(Error::shape(
                    "BatchNorm1d",
                    format!("expects [N, {c}] or [N, {c}, L], got {:?}", d.as_slice()),
                ))
            }
        };
        self.inner.forward(x.reshape_to(&as4)?)?.reshape_to(&d)
    }
    fn parameters(&self) -> Vec<Param> {
        self.inner.parameters()
    }
    fn buffers(&self) -> Vec<Param> {
        self.inner.buffers()
    }
    fn set_training(&self, training: bool) {
        self.inner.set_training(training);
    }
}
