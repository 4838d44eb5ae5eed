//! Linear, Sequential and activation layers.

use super::Module;
use crate::device::Device;
use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::host_rng::SplitMix64;
use crate::memory::try_from_fn;
use crate::param::Param;
use crate::shape::check_shape;

/// y = x · Wᵀ + b, with W stored [out, in] as in PyTorch (the transpose is
/// free: the matmul kernel reads W with strides).
pub struct Linear {
    pub weight: Param,
    pub bias: Option<Param>,
    in_features: usize,
    out_features: usize,
}

impl Linear {
    /// PyTorch's default initialisation: weight and bias uniform in
    /// ±1/√in_features, drawn from `seed`.
    #[track_caller]
    pub fn new(device: &Device, in_features: usize, out_features: usize, bias: bool, seed: u64) -> Result<Linear> {
        Linear::with_dtype(device, in_features, out_features, bias, seed, DType::F32)
    }

    #[track_caller]
    pub fn with_dtype(
        device: &Device,
        in_features: usize,
        out_features: usize,
        bias: bool,
        seed: u64,
        dtype: DType,
    ) -> Result<Linear> {
        if in_features == 0 || out_features == 0 {
            return Err(Error::invalid(
                "Linear",
                format!("features must be positive, got in={in_features} out={out_features}"),
            ));
        }
        let bound = 1.0 / (in_features as f64).sqrt();
        let mut rng = SplitMix64::new(seed);
        let weight = uniform_param(device, "Linear", "weight", &[out_features, in_features], bound, &mut rng, dtype)?;
        let bias = match bias {
            true => Some(uniform_param(device, "Linear", "bias", &[out_features], bound, &mut rng, dtype)?),
            false => None,
        };
        Ok(Linear { weight, bias, in_features, out_features })
    }

    /// A linear layer around an existing weight [out, in] (and bias):
    /// weight tying, e.g. a language model's output layer sharing the token
    /// embedding's table. The `Param` is shared, not copied.
    #[track_caller]
    pub fn tied(weight: Param, bias: Option<Param>) -> Result<Linear> {
        let dims = weight.dims();
        if dims.len() != 2 || dims[0] == 0 || dims[1] == 0 {
            return Err(Error::shape(
                "Linear::tied",
                format!("the weight must be [out, in], got {:?}", dims.as_slice()),
            ));
        }
        if let Some(b) = &bias {
            if b.dims().as_slice() != [dims[0]] {
                return Err(Error::shape(
                    "Linear::tied",
                    format!("the bias must be [{}], got {:?}", dims[0], b.dims().as_slice()),
                ));
            }
        }
        Ok(Linear { in_features: dims[1], out_features: dims[0], weight, bias })
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }
    pub fn out_features(&self) -> usize {
        self.out_features
    }
}

/// A parameter of `dims` drawn uniformly from ±`bound` (PyTorch's default
/// initialisation of linear and convolution layers uses 1/√fan_in). The
/// shape is checked and the host values allocated fallibly before any is
/// drawn: errors name the layer `op`.
#[track_caller]
pub(crate) fn uniform_param(
    device: &Device,
    op: &'static str,
    name: &str,
    dims: &[usize],
    bound: f64,
    rng: &mut SplitMix64,
    dtype: DType,
) -> Result<Param> {
    generated_param(device, op, name, dims, dtype, || rng.uniform(-bound, bound))
}

/// A parameter of `dims` and float `dtype` with values from `next` (drawn
/// in order), checked and allocated fallibly; errors name `op`.
#[track_caller]
pub(crate) fn generated_param(
    device: &Device,
    op: &'static str,
    name: &str,
    dims: &[usize],
    dtype: DType,
    mut next: impl FnMut() -> f64,
) -> Result<Param> {
    let n = check_shape(op, dims, dtype)?;
    let data = match dtype {
        DType::F32 => HostData::F32(try_from_fn(op, n, || next() as f32)?),
        DType::F64 => HostData::F64(try_from_fn(op, n, next)?),
        other => return Err(Error::dtype(op, format!("parameters must be f32 or f64, got {other}"))),
    };
    let location = std::panic::Location::caller();
    Param::from_host(device, name, data, dims).map_err(|e| e.for_op(op).at(location))
}

impl Module for Linear {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let dims = x.dims();
        if dims.last() != Some(&self.in_features) {
            return Err(Error::shape(
                "Linear",
                format!("input {:?} does not end in in_features = {}", dims.as_slice(), self.in_features),
            ));
        }
        let graph = x.graph();
        let y = x.matmul_t(graph.param(&self.weight)?, false, true)?;
        match &self.bias {
            Some(b) => y.add(graph.param(b)?),
            None => Ok(y),
        }
    }

    fn parameters(&self) -> Vec<Param> {
        let mut params = vec![self.weight.clone()];
        params.extend(self.bias.clone());
        params
    }
}

/// Parameter-free element-wise activations as layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Relu,
    Tanh,
    Sigmoid,
    Gelu,
    Silu,
}

impl Module for Activation {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
            Activation::Gelu => x.gelu(),
            Activation::Silu => x.silu(),
        }
    }
    fn parameters(&self) -> Vec<Param> {
        Vec::new()
    }
}

/// Layers applied in order.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Append a layer (builder style).
    pub fn add(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The layers, in order (bindings that keep their own container use it).
    pub fn into_layers(self) -> Vec<Box<dyn Module>> {
        self.layers
    }

    /// A multi-layer perceptron: Linear layers of the given widths with
    /// `activation` between them (not after the last).
    #[track_caller]
    pub fn mlp(device: &Device, widths: &[usize], activation: Activation, seed: u64) -> Result<Sequential> {
        if widths.len() < 2 {
            return Err(Error::invalid("mlp", "needs at least an input and an output width"));
        }
        let mut model = Sequential::new();
        for (i, pair) in widths.windows(2).enumerate() {
            let layer =
                Linear::new(device, pair[0], pair[1], true, seed.wrapping_add((i as u64).wrapping_mul(0x9E37)))?;
            model = model.add(layer);
            if i + 2 < widths.len() {
                model = model.add(activation);
            }
        }
        Ok(model)
    }
}

impl Module for Sequential {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        // A loop, not try_fold: a closure would cut the caller's location
        // off the layers' errors.
        let mut x = x;
        for layer in &self.layers {
            x = layer.forward(x)?;
        }
        Ok(x)
    }
    fn set_training(&self, training: bool) {
        self.layers.iter().for_each(|l| l.set_training(training));
    }
    fn parameters(&self) -> Vec<Param> {
        self.layers.iter().flat_map(|l| l.parameters()).collect()
    }
    /// "{index}.{key}" for each layer's keys, as torch.nn.Sequential.
    fn named_parameters(&self) -> Vec<(String, Param)> {
        prefixed(&self.layers, |l| l.named_parameters())
    }
    fn buffers(&self) -> Vec<Param> {
        self.layers.iter().flat_map(|l| l.buffers()).collect()
    }
    fn named_buffers(&self) -> Vec<(String, Param)> {
        prefixed(&self.layers, |l| l.named_buffers())
    }
    fn state_dict_entries(&self) -> Vec<(String, Param)> {
        prefixed(&self.layers, |l| l.state_dict_entries())
    }
}

/// Each layer's named entries with the layer's index in front.
fn prefixed(layers: &[Box<dyn Module>], entries: impl Fn(&dyn Module) -> Vec<(String, Param)>) -> Vec<(String, Param)> {
    let mut out = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        out.extend(entries(layer.as_ref()).into_iter().map(|(key, p)| (format!("{i}.{key}"), p)));
    }
    out
}

/// Zeroes each element with probability `p` in training mode and scales the
/// rest by 1/(1-p); the identity in evaluation mode. The mask comes from the
/// counter-based generator keyed by (seed, call number), so a run replays
/// exactly on every backend.
pub struct Dropout {
    p: f64,
    seed: u64,
    calls: std::cell::Cell<u64>,
    training: std::cell::Cell<bool>,
}

impl Dropout {
    #[track_caller]
    pub fn new(p: f64, seed: u64) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid("Dropout", format!("p = {p} must be in [0, 1)")));
        }
        Ok(Dropout { p, seed, calls: std::cell::Cell::new(0), training: std::cell::Cell::new(true) })
    }
}

impl Module for Dropout {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        if !self.training.get() || self.p == 0.0 {
            return Ok(x);
        }
        let call = self.calls.get();
        self.calls.set(call + 1);
        let seed = self.seed.wrapping_add(call.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let keep = x.graph().rand_uniform(&x.dims(), seed, x.dtype())?.ge(self.p)?;
        keep.where_(x.div(1.0 - self.p)?, 0.0)
    }
    fn parameters(&self) -> Vec<Param> {
        Vec::new()
    }
    fn set_training(&self, training: bool) {
        self.training.set(training);
    }
}

/// A lookup table: i32 indices of any shape → [..., dim] rows of the weight
/// (initialised from a standard normal, as in PyTorch).
pub struct Embedding {
    pub weight: Param,
    count: usize,
    dim: usize,
}

impl Embedding {
    #[track_caller]
    pub fn new(device: &Device, count: usize, dim: usize, seed: u64) -> Result<Embedding> {
        if count == 0 || dim == 0 {
            return Err(Error::invalid("Embedding", format!("needs count > 0 and dim > 0, got {count} and {dim}")));
        }
        let mut rng = SplitMix64::new(seed);
        let weight = generated_param(device, "Embedding", "weight", &[count, dim], DType::F32, || rng.normal())?;
        Ok(Embedding { weight, count, dim })
    }
    pub fn count(&self) -> usize {
        self.count
    }
}

impl Module for Embedding {
    fn forward<'g>(&self, indices: Tensor<'g>) -> Result<Tensor<'g>> {
        if indices.dtype() != DType::I32 {
            return Err(Error::dtype("Embedding", format!("indices must be i32, got {}", indices.dtype())));
        }
        let mut out_dims: Vec<usize> = indices.dims().to_vec();
        out_dims.push(self.dim);
        let flat = indices.reshape_to(&[indices.numel()])?;
        indices.graph().param(&self.weight)?.index_select(0, flat)?.reshape_to(&out_dims)
    }
    fn parameters(&self) -> Vec<Param> {
        vec![self.weight.clone()]
    }
}
