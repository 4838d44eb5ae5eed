//! Linear, Sequential and activation layers.

use super::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::param::Param;
use crate::rng::SplitMix64;

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
    pub fn new(device: &Device, in_features: usize, out_features: usize, bias: bool, seed: u64) -> Result<Linear> {
        Linear::with_dtype(device, in_features, out_features, bias, seed, DType::F32)
    }

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
        let mut draw = |n: usize| -> Vec<f64> { (0..n).map(|_| rng.uniform(-bound, bound)).collect() };
        let weight = Param::from_host(
            device,
            "weight",
            to_dtype(draw(in_features * out_features), dtype)?,
            &[out_features, in_features],
        )?;
        let bias = if bias {
            Some(Param::from_host(device, "bias", to_dtype(draw(out_features), dtype)?, &[out_features])?)
        } else {
            None
        };
        Ok(Linear { weight, bias, in_features, out_features })
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }
    pub fn out_features(&self) -> usize {
        self.out_features
    }
}

fn to_dtype(values: Vec<f64>, dtype: DType) -> Result<crate::dtype::HostData> {
    use crate::dtype::HostData;
    match dtype {
        DType::F32 => Ok(HostData::F32(values.into_iter().map(|v| v as f32).collect())),
        DType::F64 => Ok(HostData::F64(values)),
        other => Err(Error::dtype("Linear", format!("parameters must be f32 or f64, got {other}"))),
    }
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

    /// A multi-layer perceptron: Linear layers of the given widths with
    /// `activation` between them (not after the last).
    pub fn mlp(device: &Device, widths: &[usize], activation: Activation, seed: u64) -> Result<Sequential> {
        if widths.len() < 2 {
            return Err(Error::invalid("mlp", "needs at least an input and an output width"));
        }
        let mut model = Sequential::new();
        for (i, pair) in widths.windows(2).enumerate() {
            let layer = Linear::new(device, pair[0], pair[1], true, seed.wrapping_add(i as u64 * 0x9E37))?;
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
        self.layers.iter().try_fold(x, |x, layer| layer.forward(x))
    }
    fn parameters(&self) -> Vec<Param> {
        self.layers.iter().flat_map(|l| l.parameters()).collect()
    }
}
