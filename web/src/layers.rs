//! Every kiln layer besides Linear and Sequential, as one JavaScript class,
//! `Layer`, made by factories on `Kiln` (`kiln.conv2d(...)`,
//! `kiln.layerNorm(...)`, ...). A layer wraps kiln-core's module itself, so
//! its forward pass, parameter order and checkpoint keys are native kiln's.

use std::rc::Rc;

use js_sys::Reflect;
use kiln_core::nn::{self, ConvOptions, Module};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::error::{KilnError, Res};
use crate::graph::Tensor;
use crate::nn::{hand_off_module, Param};
use crate::session::Kiln;
use crate::tensor_api::{count, dims, seed_arg, uints, IntList};
use crate::tensor_nn::{pair, Pair};

#[wasm_bindgen]
extern "C" {
    /// Options of `conv2d` / `convTranspose2d`.
    #[wasm_bindgen(typescript_type = "{ stride?: number | [number, number]; padding?: number | [number, number]; \
        dilation?: number | [number, number]; groups?: number; bias?: boolean; \
        outputPadding?: number | [number, number]; seed?: number }")]
    pub type ConvOptionsArg;

    /// Options of `maxPool2d` / `avgPool2d` (stride defaults to the kernel).
    #[wasm_bindgen(typescript_type = "{ stride?: number | [number, number]; padding?: number | [number, number]; \
        dilation?: number | [number, number]; ceilMode?: boolean }")]
    pub type PoolOptionsArg;

    /// Options of `multiheadAttention`.
    #[wasm_bindgen(typescript_type = "{ bias?: boolean; causal?: boolean; dropout?: number; seed?: number }")]
    pub type AttentionOptionsArg;

    /// The initialisers of `initParam` (kiln-core's `nn::init`).
    #[wasm_bindgen(typescript_type = "'zeros' | 'ones' | 'constant' | 'uniform' | 'normal' | 'xavierUniform' | \
        'xavierNormal' | 'kaimingUniform' | 'kaimingNormal'")]
    pub type InitKind;
}

/// A field of an options object (undefined when the object or the field is
/// missing).
fn field(options: Option<&JsValue>, name: &str) -> JsValue {
    match options {
        Some(o) if o.is_object() => Reflect::get(o, &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED),
        _ => JsValue::UNDEFINED,
    }
}

fn field_pair(op: &'static str, options: Option<&JsValue>, name: &str, default: usize) -> Res<[usize; 2]> {
    let v = field(options, name);
    pair(op, name, Some(v.unchecked_ref::<Pair>()), default)
}

/// Like `field_pair`, with a default that is itself a pair.
fn field_pair_or(op: &'static str, options: Option<&JsValue>, name: &str, default: [usize; 2]) -> Res<[usize; 2]> {
    let v = field(options, name);
    if v.is_undefined() || v.is_null() {
        return Ok(default);
    }
    pair(op, name, Some(v.unchecked_ref::<Pair>()), 1)
}

fn field_number(op: &'static str, options: Option<&JsValue>, name: &str, default: f64) -> Res<f64> {
    let v = field(options, name);
    if v.is_undefined() || v.is_null() {
        return Ok(default);
    }
    v.as_f64().ok_or_else(|| KilnError::argument(op, format!("option '{name}' must be a number")))
}

fn field_bool(op: &'static str, options: Option<&JsValue>, name: &str, default: bool) -> Res<bool> {
    let v = field(options, name);
    if v.is_undefined() || v.is_null() {
        return Ok(default);
    }
    v.as_bool().ok_or_else(|| KilnError::argument(op, format!("option '{name}' must be true or false")))
}

fn seed(op: &'static str, value: Option<f64>) -> Res<u64> {
    seed_arg(op, value.unwrap_or(0.0))
}

/// A kiln layer (see the factories on `Kiln`). `kind` names it.
#[wasm_bindgen]
pub struct Layer {
    pub(crate) inner: Rc<dyn Module>,
    kind: &'static str,
    /// The same module, for the layers that decode incrementally.
    cached: Option<Rc<dyn CachedForward>>,
}

impl Layer {
    fn new(kind: &'static str, module: impl Module + 'static) -> Layer {
        Layer { inner: Rc::new(module), kind, cached: None }
    }

    fn with_cache(kind: &'static str, module: impl Module + CachedForward + 'static) -> Layer {
        let rc = Rc::new(module);
        Layer { inner: rc.clone(), kind, cached: Some(rc) }
    }
}

/// The layers with a `forward_cached` (self-attention, transformer blocks).
trait CachedForward {
    fn forward_cached<'g>(
        &self,
        x: kiln_core::Tensor<'g>,
        cache: &nn::LayerCache,
    ) -> kiln_core::Result<kiln_core::Tensor<'g>>;
}

impl CachedForward for nn::MultiheadAttention {
    fn forward_cached<'g>(
        &self,
        x: kiln_core::Tensor<'g>,
        cache: &nn::LayerCache,
    ) -> kiln_core::Result<kiln_core::Tensor<'g>> {
        nn::MultiheadAttention::forward_cached(self, x, cache)
    }
}

impl CachedForward for nn::TransformerBlock {
    fn forward_cached<'g>(
        &self,
        x: kiln_core::Tensor<'g>,
        cache: &nn::LayerCache,
    ) -> kiln_core::Result<kiln_core::Tensor<'g>> {
        nn::TransformerBlock::forward_cached(self, x, cache)
    }
}

/// Keys and values of earlier positions, per attention layer, kept on the
/// device (kiln-core's `KvCache`): with `layer.forwardCached(x, cache, i)`
/// a new token costs only its own projections. Made by `kiln.kvCache(...)`.
#[wasm_bindgen]
pub struct KvCache {
    inner: nn::KvCache,
}

#[wasm_bindgen]
impl KvCache {
    /// Positions cached so far.
    #[wasm_bindgen(getter)]
    pub fn length(&self) -> u32 {
        self.inner.len() as u32
    }

    #[wasm_bindgen(getter)]
    pub fn capacity(&self) -> u32 {
        self.inner.capacity() as u32
    }

    /// Count `positions` new positions as cached, once every layer has
    /// taken them in.
    pub fn advance(&self, positions: f64) -> Res<()> {
        Ok(self.inner.advance(count("advance", "positions", positions)?)?)
    }

    /// Forget every position.
    pub fn reset(&self) -> Res<()> {
        Ok(self.inner.reset()?)
    }
}

#[wasm_bindgen]
impl Layer {
    /// Lets kiln's functions accept a Layer as a plain JS value. Not for users.
    #[wasm_bindgen(js_name = "__kilnModule")]
    pub fn handoff(&self) {
        hand_off_module(self.inner.clone());
    }

    /// The layer's type: 'Conv2d', 'LayerNorm', 'Dropout', ...
    #[wasm_bindgen(getter)]
    pub fn kind(&self) -> String {
        self.kind.to_string()
    }

    /// Apply the layer to `x`.
    pub fn forward(&self, x: &Tensor) -> Res<Tensor> {
        x.map(|t| self.inner.forward(t))
    }

    /// Causal self-attention over the new positions `x` [N, L, E] that
    /// follow the `cache.length` positions in layer `layer` of `cache`
    /// (multiheadAttention and transformerBlock layers); call
    /// `cache.advance(L)` after the last layer.
    #[wasm_bindgen(js_name = forwardCached)]
    pub fn forward_cached(&self, x: &Tensor, cache: &KvCache, layer: f64) -> Res<Tensor> {
        let layer = count("forwardCached", "layer", layer)?;
        let Some(m) = &self.cached else {
            return Err(KilnError::new(
                "Unsupported",
                "forwardCached",
                format!(
                    "forwardCached: a {} layer has no cached forward (multiheadAttention and transformerBlock have)",
                    self.kind
                ),
            ));
        };
        let c = cache.inner.layer(layer)?;
        x.map(|t| m.forward_cached(t, c))
    }

    /// Trainable parameters, in kiln's order.
    pub fn parameters(&self) -> Vec<Param> {
        self.inner.parameters().into_iter().map(|inner| Param { inner }).collect()
    }

    /// Non-trainable state kept in checkpoints (batch-norm running statistics).
    pub fn buffers(&self) -> Vec<Param> {
        self.inner.buffers().into_iter().map(|inner| Param { inner }).collect()
    }

    #[wasm_bindgen(getter, js_name = numParameters)]
    pub fn num_parameters(&self) -> u32 {
        self.inner.num_parameters() as u32
    }

    #[wasm_bindgen(js_name = zeroGrad)]
    pub fn zero_grad(&self) {
        self.inner.zero_grad();
    }

    /// Parameters and buffers as safetensors bytes, keyed as native kiln.
    #[wasm_bindgen(js_name = stateDict)]
    pub fn state_dict(&self) -> crate::checkpoint::BytesPromise {
        crate::checkpoint::module_state(self.inner.clone())
    }

    /// Load `stateDict()` bytes (from JS or native kiln).
    #[wasm_bindgen(js_name = loadStateDict)]
    pub fn load_state_dict(&self, bytes: &[u8]) -> Res<()> {
        crate::checkpoint::load_module(self.inner.as_ref(), bytes)
    }

    /// Training (true: dropout active, batch statistics) or evaluation mode.
    #[wasm_bindgen(js_name = setTraining)]
    pub fn set_training(&self, training: bool) {
        self.inner.set_training(training);
    }
}

#[wasm_bindgen]
impl Kiln {
    /// 2-D convolution [N, in, H, W] → [N, out, OH, OW] (PyTorch's
    /// initialisation). Options: stride, padding, dilation (number or
    /// [h, w]), groups, bias (default true), seed.
    #[allow(non_snake_case)]
    pub fn conv2d(
        &self,
        inChannels: f64,
        outChannels: f64,
        kernel: &Pair,
        options: Option<ConvOptionsArg>,
    ) -> Res<Layer> {
        const OP: &str = "conv2d";
        let (cin, cout) = (count(OP, "inChannels", inChannels)?, count(OP, "outChannels", outChannels)?);
        let o = options.as_deref();
        let (k, c, s) = conv_options(OP, kernel, o)?;
        let layer = nn::Conv2d::new(self.core_device(), cin, cout, k, c, s)?;
        Ok(Layer::new("Conv2d", layer))
    }

    /// Transposed 2-D convolution; options as `conv2d` (groups must be 1)
    /// plus outputPadding.
    #[wasm_bindgen(js_name = convTranspose2d)]
    #[allow(non_snake_case)]
    pub fn conv_transpose2d(
        &self,
        inChannels: f64,
        outChannels: f64,
        kernel: &Pair,
        options: Option<ConvOptionsArg>,
    ) -> Res<Layer> {
        const OP: &str = "convTranspose2d";
        let (cin, cout) = (count(OP, "inChannels", inChannels)?, count(OP, "outChannels", outChannels)?);
        let o = options.as_deref();
        let (k, c, s) = conv_options(OP, kernel, o)?;
        let output_padding = field_pair(OP, o, "outputPadding", 0)?;
        let layer = nn::ConvTranspose2d::new(self.core_device(), cin, cout, k, c, output_padding, s)?;
        Ok(Layer::new("ConvTranspose2d", layer))
    }

    /// 2-D max pooling; options: stride (default: the kernel), padding,
    /// dilation, ceilMode.
    #[wasm_bindgen(js_name = maxPool2d)]
    pub fn max_pool2d(&self, kernel: &Pair, options: Option<PoolOptionsArg>) -> Res<Layer> {
        const OP: &str = "maxPool2d";
        let o = options.as_deref();
        let k = pair(OP, "kernel", Some(kernel), 1)?;
        let layer = nn::MaxPool2d {
            kernel: k,
            stride: field_pair_or(OP, o, "stride", k)?,
            padding: field_pair(OP, o, "padding", 0)?,
            dilation: field_pair(OP, o, "dilation", 1)?,
            ceil_mode: field_bool(OP, o, "ceilMode", false)?,
        };
        Ok(Layer::new("MaxPool2d", layer))
    }

    /// 2-D average pooling; options: stride (default: the kernel), padding.
    #[wasm_bindgen(js_name = avgPool2d)]
    pub fn avg_pool2d(&self, kernel: &Pair, options: Option<PoolOptionsArg>) -> Res<Layer> {
        const OP: &str = "avgPool2d";
        let o = options.as_deref();
        let k = pair(OP, "kernel", Some(kernel), 1)?;
        let layer = nn::AvgPool2d {
            kernel: k,
            stride: field_pair_or(OP, o, "stride", k)?,
            padding: field_pair(OP, o, "padding", 0)?,
        };
        Ok(Layer::new("AvgPool2d", layer))
    }

    /// Average pooling to a fixed output size [OH, OW].
    #[wasm_bindgen(js_name = adaptiveAvgPool2d)]
    pub fn adaptive_avg_pool2d(&self, output: &Pair) -> Res<Layer> {
        let output = pair("adaptiveAvgPool2d", "output", Some(output), 1)?;
        Ok(Layer::new("AdaptiveAvgPool2d", nn::AdaptiveAvgPool2d { output }))
    }

    /// [N, ...] → [N, product of the rest].
    pub fn flatten(&self) -> Layer {
        Layer::new("Flatten", nn::Flatten)
    }

    /// [N, features] → [N, ...shape].
    pub fn unflatten(&self, shape: &IntList) -> Res<Layer> {
        Ok(Layer::new("Unflatten", nn::Unflatten { dims: dims(&uints("unflatten", shape)?) }))
    }

    /// Layer normalisation over the trailing `shape`, with weight and bias;
    /// eps defaults to 1e-5.
    #[wasm_bindgen(js_name = layerNorm)]
    pub fn layer_norm(&self, shape: &IntList, eps: Option<f64>) -> Res<Layer> {
        let d = dims(&uints("layerNorm", shape)?);
        Ok(Layer::new("LayerNorm", nn::LayerNorm::new(self.core_device(), &d, eps.unwrap_or(1e-5))?))
    }

    /// RMS normalisation over the trailing `shape`, with a weight.
    #[wasm_bindgen(js_name = rmsNorm)]
    pub fn rms_norm(&self, shape: &IntList, eps: Option<f64>) -> Res<Layer> {
        let d = dims(&uints("rmsNorm", shape)?);
        Ok(Layer::new("RMSNorm", nn::RMSNorm::new(self.core_device(), &d, eps.unwrap_or(1e-5))?))
    }

    /// Group normalisation of `channels` in `groups`, with weight and bias.
    #[wasm_bindgen(js_name = groupNorm)]
    pub fn group_norm(&self, groups: f64, channels: f64, eps: Option<f64>) -> Res<Layer> {
        let (groups, channels) = (count("groupNorm", "groups", groups)?, count("groupNorm", "channels", channels)?);
        let layer = nn::GroupNorm::new(self.core_device(), groups, channels, eps.unwrap_or(1e-5))?;
        Ok(Layer::new("GroupNorm", layer))
    }

    /// Batch normalisation of [N, C] or [N, C, L] (eps 1e-5, momentum 0.1).
    #[wasm_bindgen(js_name = batchNorm1d)]
    pub fn batch_norm1d(&self, channels: f64, eps: Option<f64>, momentum: Option<f64>) -> Res<Layer> {
        let channels = count("batchNorm1d", "channels", channels)?;
        let layer = nn::BatchNorm1d::new(self.core_device(), channels, eps.unwrap_or(1e-5), momentum.unwrap_or(0.1))?;
        Ok(Layer::new("BatchNorm1d", layer))
    }

    /// Batch normalisation of [N, C, H, W] (eps 1e-5, momentum 0.1); running
    /// statistics are buffers, used in evaluation mode.
    #[wasm_bindgen(js_name = batchNorm2d)]
    pub fn batch_norm2d(&self, channels: f64, eps: Option<f64>, momentum: Option<f64>) -> Res<Layer> {
        let channels = count("batchNorm2d", "channels", channels)?;
        let layer = nn::BatchNorm2d::new(self.core_device(), channels, eps.unwrap_or(1e-5), momentum.unwrap_or(0.1))?;
        Ok(Layer::new("BatchNorm2d", layer))
    }

    /// A lookup table of `count` vectors of size `dim` (N(0, 1) start),
    /// indexed by int32 tensors.
    pub fn embedding(&self, count: f64, dim: f64, seed: Option<f64>) -> Res<Layer> {
        const OP: &str = "embedding";
        let (count, dim) = (self::count(OP, "count", count)?, self::count(OP, "dim", dim)?);
        let layer = nn::Embedding::new(self.core_device(), count, dim, self::seed(OP, seed)?)?;
        Ok(Layer::new("Embedding", layer))
    }

    /// Zeroes each element with probability `p` in training mode (scaling
    /// the rest by 1/(1-p)); the identity in evaluation mode.
    pub fn dropout(&self, p: f64, seed: Option<f64>) -> Res<Layer> {
        Ok(Layer::new("Dropout", nn::Dropout::new(p, self::seed("dropout", seed)?)?))
    }

    #[wasm_bindgen(js_name = leakyRelu)]
    pub fn leaky_relu(&self, slope: Option<f64>) -> Res<Layer> {
        Ok(Layer::new("LeakyReLU", nn::LeakyReLU::new(slope.unwrap_or(0.01))?))
    }

    pub fn elu(&self, alpha: Option<f64>) -> Res<Layer> {
        Ok(Layer::new("ELU", nn::ELU::new(alpha.unwrap_or(1.0))?))
    }

    pub fn softplus(&self, beta: Option<f64>) -> Res<Layer> {
        Ok(Layer::new("Softplus", nn::Softplus::new(beta.unwrap_or(1.0))?))
    }

    pub fn mish(&self) -> Layer {
        Layer::new("Mish", nn::Mish)
    }

    /// Multi-head self-attention over [N, L, embedDim]. Options: bias
    /// (default true), causal, dropout (on the attention probabilities), seed.
    #[wasm_bindgen(js_name = multiheadAttention)]
    #[allow(non_snake_case)]
    pub fn multihead_attention(&self, embedDim: f64, heads: f64, options: Option<AttentionOptionsArg>) -> Res<Layer> {
        const OP: &str = "multiheadAttention";
        let (embed, heads) = (count(OP, "embedDim", embedDim)?, count(OP, "heads", heads)?);
        let o = options.as_deref();
        let layer = nn::MultiheadAttention::new(
            self.core_device(),
            embed,
            heads,
            field_bool(OP, o, "bias", true)?,
            seed_arg(OP, field_number(OP, o, "seed", 0.0)?)?,
        )?
        .causal(field_bool(OP, o, "causal", false)?)
        .dropout(field_number(OP, o, "dropout", 0.0)?)?;
        Ok(Layer::with_cache("MultiheadAttention", layer))
    }

    /// A causal pre-norm transformer block (GPT's decoder block).
    #[wasm_bindgen(js_name = transformerBlock)]
    #[allow(non_snake_case)]
    pub fn transformer_block(
        &self,
        dModel: f64,
        heads: f64,
        dFF: f64,
        dropout: Option<f64>,
        seed: Option<f64>,
    ) -> Res<Layer> {
        const OP: &str = "transformerBlock";
        let layer = nn::TransformerBlock::new(
            self.core_device(),
            count(OP, "dModel", dModel)?,
            count(OP, "heads", heads)?,
            count(OP, "dFF", dFF)?,
            dropout.unwrap_or(0.0),
            self::seed(OP, seed)?,
        )?;
        Ok(Layer::with_cache("TransformerBlock", layer))
    }

    /// A parameter filled by one of kiln's initialisers (native kiln's
    /// `nn::init`: the same values for the same seed). `a`, `b`: 'constant'
    /// value; 'uniform' low (default 0), high (1); 'normal' mean (0), std
    /// (1); xavier* gain (1); kaiming* the negative slope a (0).
    #[wasm_bindgen(js_name = initParam)]
    pub fn init_param(
        &self,
        kind: &InitKind,
        name: &str,
        shape: &IntList,
        a: Option<f64>,
        b: Option<f64>,
        seed: Option<f64>,
    ) -> Res<Param> {
        use nn::init;
        let d = self.core_device();
        let dims = dims(&uints("initParam", shape)?);
        let seed = self::seed("initParam", seed)?;
        let inner = match kind.as_string().as_deref().unwrap_or("") {
            "zeros" => init::zeros(d, name, &dims),
            "ones" => init::ones(d, name, &dims),
            "constant" => init::constant(d, name, &dims, a.unwrap_or(0.0)),
            "uniform" => init::uniform(d, name, &dims, a.unwrap_or(0.0), b.unwrap_or(1.0), seed),
            "normal" => init::normal(d, name, &dims, a.unwrap_or(0.0), b.unwrap_or(1.0), seed),
            "xavierUniform" => init::xavier_uniform(d, name, &dims, a.unwrap_or(1.0), seed),
            "xavierNormal" => init::xavier_normal(d, name, &dims, a.unwrap_or(1.0), seed),
            "kaimingUniform" => init::kaiming_uniform(d, name, &dims, a.unwrap_or(0.0), seed),
            "kaimingNormal" => init::kaiming_normal(d, name, &dims, a.unwrap_or(0.0), seed),
            other => {
                return Err(KilnError::argument(
                    "initParam",
                    format!("unknown initialiser {other:?}: zeros, ones, constant, uniform, normal, xavierUniform, xavierNormal, kaimingUniform or kaimingNormal"),
                ))
            }
        }?;
        Ok(Param { inner })
    }

    /// A cache for incremental decoding: room for `capacity` positions of
    /// `batch` sequences in `layers` attention layers of `heads` heads of
    /// `headDim` values.
    #[wasm_bindgen(js_name = kvCache)]
    #[allow(non_snake_case)]
    pub fn kv_cache(&self, layers: f64, batch: f64, heads: f64, headDim: f64, capacity: f64) -> Res<KvCache> {
        const OP: &str = "kvCache";
        let d = self.core_device();
        let inner = nn::KvCache::new(
            d,
            count(OP, "layers", layers)?,
            count(OP, "batch", batch)?,
            count(OP, "heads", heads)?,
            count(OP, "headDim", headDim)?,
            count(OP, "capacity", capacity)?,
        )?;
        Ok(KvCache { inner })
    }
}

fn conv_options(op: &'static str, kernel: &Pair, o: Option<&JsValue>) -> Res<([usize; 2], ConvOptions, u64)> {
    let k = pair(op, "kernel", Some(kernel), 1)?;
    let groups = field_number(op, o, "groups", 1.0)?;
    if !(groups >= 1.0 && groups.fract() == 0.0) {
        return Err(KilnError::argument(op, format!("groups must be a positive integer, got {groups}")));
    }
    let options = ConvOptions {
        stride: field_pair(op, o, "stride", 1)?,
        padding: field_pair(op, o, "padding", 0)?,
        dilation: field_pair(op, o, "dilation", 1)?,
        groups: groups as usize,
        bias: field_bool(op, o, "bias", true)?,
    };
    Ok((k, options, seed_arg(op, field_number(op, o, "seed", 0.0)?)?))
}
