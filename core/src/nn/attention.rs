//! Attention: `scaled_dot_product_attention`, `MultiheadAttention` (PyTorch's
//! parameter names and layout), the pre-norm `TransformerBlock`, and the
//! key/value cache for incremental decoding.
//!
//! Everything is composed from primitive ops (matmul, where, the masked
//! softmax; the causal case through the fused CausalSoftmax primitive), so
//! gradients and second derivatives come from their rules.

use std::cell::Cell;

use super::init;
use super::layers::Linear;
use super::norm::LayerNorm;
use super::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::param::Param;
use crate::shape::fmt_dims;
use crate::SliceSpec;

/// Dropout on the attention probabilities: each is zeroed with
/// probability `p` (the rest scaled by 1/(1-p)), from the counter-based
/// generator keyed by `seed`, so a replay is exact on every backend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionDropout {
    pub p: f64,
    pub seed: u64,
}

/// softmax(q·kᵀ·scale + mask)·v over the last two axes.
///
/// - `q` [..., L, E], `k` [..., S, E], `v` [..., S, Ev]; leading axes
///   broadcast as in `matmul`. The result is [..., L, Ev].
/// - `mask` (optional) broadcasts to [..., L, S]: a bool mask keeps the
///   positions where it is true (PyTorch's convention); a float mask is
///   added to the scores (−inf removes a position).
/// - `causal` keeps key j for query i when j <= i (the upper-left aligned
///   triangle, as PyTorch's `is_causal`); it combines with `mask`.
/// - A query row whose every key is masked gets zeros (PyTorch gives NaN).
/// - `scale` defaults to 1/√E.
#[track_caller]
pub fn scaled_dot_product_attention<'g>(
    q: Tensor<'g>,
    k: Tensor<'g>,
    v: Tensor<'g>,
    mask: Option<Tensor<'g>>,
    causal: bool,
    dropout: Option<AttentionDropout>,
    scale: Option<f64>,
) -> Result<Tensor<'g>> {
    attention(q, k, v, mask, if causal { Some(0) } else { None }, dropout, scale)
}

/// The attention behind every public entry point. `causal_diagonal`:
/// key j is kept for query i when j - i <= diagonal (0 = PyTorch's causal;
/// S - L aligns the triangle to the lower right, as incremental decoding
/// needs).
#[track_caller]
pub(crate) fn attention<'g>(
    q: Tensor<'g>,
    k: Tensor<'g>,
    v: Tensor<'g>,
    mask: Option<Tensor<'g>>,
    causal_diagonal: Option<i64>,
    dropout: Option<AttentionDropout>,
    scale: Option<f64>,
) -> Result<Tensor<'g>> {
    const OP: &str = "scaled_dot_product_attention";
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    let shapes = || format!("q {}, k {}, v {}", fmt_dims(&qd), fmt_dims(&kd), fmt_dims(&vd));
    if qd.len() < 2 || kd.len() < 2 || vd.len() < 2 {
        return Err(Error::shape(OP, format!("q, k and v need rank >= 2: {}", shapes())));
    }
    let (l, e) = (qd[qd.len() - 2], qd[qd.len() - 1]);
    let (s, ek) = (kd[kd.len() - 2], kd[kd.len() - 1]);
    if ek != e || vd[vd.len() - 2] != s {
        return Err(Error::shape(
            OP,
            format!("k must be [..., S, E] and v [..., S, Ev] for q [..., L, E]: {}", shapes()),
        ));
    }
    if !q.dtype().is_float() || q.dtype() != k.dtype() || q.dtype() != v.dtype() {
        return Err(Error::dtype(
            OP,
            format!("q, k and v must share one float dtype, got {}, {}, {}", q.dtype(), k.dtype(), v.dtype()),
        ));
    }
    if e == 0 && scale.is_none() {
        return Err(Error::shape(OP, "the embedding dimension E is 0: give an explicit scale"));
    }
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    if !scale.is_finite() {
        return Err(Error::invalid(OP, format!("scale {scale} must be finite")));
    }
    if let Some(d) = dropout {
        if !(0.0..1.0).contains(&d.p) {
            return Err(Error::invalid(OP, format!("dropout p = {} must be in [0, 1)", d.p)));
        }
    }
    let graph = q.graph();
    let mut scores = q.matmul_t(k, false, true)?.mul(scale)?;
    if let Some(m) = mask {
        let md = m.dims();
        let fits = md.len() >= 2
            && crate::shape::broadcast_shapes(&md, &[l, s]).is_some_and(|b| b.len() <= qd.len().max(kd.len()));
        if !fits || crate::shape::broadcast_shapes(&scores.dims(), &md).is_none_or(|b| b != scores.dims()) {
            return Err(Error::shape(
                OP,
                format!("the mask {} does not broadcast to the scores [..., {l}, {s}] ({})", fmt_dims(&md), shapes()),
            ));
        }
        if m.dtype() != DType::Bool && m.dtype() != scores.dtype() {
            return Err(Error::dtype(OP, format!("the mask must be bool or {} like q, got {}", q.dtype(), m.dtype())));
        }
    }
    // A float mask is added to the scores (its -inf entries remove keys).
    let float_mask = mask.filter(|m| m.dtype() != DType::Bool);
    if let Some(m) = float_mask {
        scores = scores.add(m)?;
    }
    let mut probs = match causal_diagonal {
        // The fused primitive: the triangle is its attribute, -inf entries
        // (a float mask's, or a bool mask's removed keys) count as masked.
        Some(diagonal) => {
            if let Some(m) = mask.filter(|m| m.dtype() == DType::Bool) {
                scores = m.where_(scores, f64::NEG_INFINITY)?;
            }
            scores.causal_softmax(diagonal)?
        }
        None => {
            let keep = match (mask, float_mask) {
                (_, Some(m)) => Some(m.gt(f64::NEG_INFINITY)?),
                (m, None) => m,
            };
            scores.masked_softmax(keep, -1)?
        }
    };
    if let Some(d) = dropout {
        if d.p > 0.0 {
            let kept = graph.rand_uniform(&probs.dims(), d.seed, probs.dtype())?.ge(d.p)?;
            probs = kept.where_(probs.div(1.0 - d.p)?, 0.0)?;
        }
    }
    probs.matmul(v)
}

/// Multi-head attention with PyTorch's parameters: `in_proj_weight`
/// [3E, E] (query, key and value projections stacked), `in_proj_bias` [3E],
/// `out_proj.weight` [E, E], `out_proj.bias` [E] — a checkpoint of this
/// module loads into `torch.nn.MultiheadAttention(E, heads,
/// batch_first=True)`. Inputs are batch-first: [N, L, E].
pub struct MultiheadAttention {
    pub in_proj_weight: Param,
    pub in_proj_bias: Option<Param>,
    pub out_proj: Linear,
    embed_dim: usize,
    heads: usize,
    causal: bool,
    dropout: f64,
    seed: u64,
    calls: Cell<u64>,
    training: Cell<bool>,
}

impl MultiheadAttention {
    /// PyTorch's initialisation: `in_proj_weight` Xavier-uniform, biases 0,
    /// `out_proj.weight` uniform ±1/√E. Self-attention through `forward` is
    /// not causal unless `causal(true)` is set.
    #[track_caller]
    pub fn new(device: &Device, embed_dim: usize, heads: usize, bias: bool, seed: u64) -> Result<MultiheadAttention> {
        if embed_dim == 0 || heads == 0 || embed_dim % heads != 0 {
            return Err(Error::invalid(
                "MultiheadAttention",
                format!("embed_dim {embed_dim} must be a positive multiple of heads {heads}"),
            ));
        }
        let e = embed_dim;
        let in_proj_weight = init::xavier_uniform(device, "in_proj_weight", &[3 * e, e], 1.0, seed)?;
        let in_proj_bias = if bias { Some(init::zeros(device, "in_proj_bias", &[3 * e])?) } else { None };
        let out_proj = Linear::new(device, e, e, bias, seed.wrapping_add(1))?;
        if let Some(b) = &out_proj.bias {
            b.set_value(&crate::dtype::HostData::F32(vec![0.0; e]))?;
        }
        Ok(MultiheadAttention {
            in_proj_weight,
            in_proj_bias,
            out_proj,
            embed_dim,
            heads,
            causal: false,
            dropout: 0.0,
            seed,
            calls: Cell::new(0),
            training: Cell::new(true),
        })
    }

    /// Make `forward` causal (each position attends to itself and earlier).
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Dropout on the attention probabilities in training mode.
    #[track_caller]
    pub fn dropout(mut self, p: f64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid("MultiheadAttention", format!("dropout p = {p} must be in [0, 1)")));
        }
        self.dropout = p;
        Ok(self)
    }

    pub fn embed_dim(&self) -> usize {
        self.embed_dim
    }
    pub fn heads(&self) -> usize {
        self.heads
    }
    pub fn is_causal(&self) -> bool {
        self.causal
    }

    fn next_dropout(&self) -> Option<AttentionDropout> {
        if !self.training.get() || self.dropout == 0.0 {
            return None;
        }
        let call = self.calls.get();
        self.calls.set(call + 1);
        Some(AttentionDropout {
            p: self.dropout,
            seed: self.seed.wrapping_add(call.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        })
    }

    #[track_caller]
    fn check_input(&self, what: &str, x: &Tensor<'_>) -> Result<(usize, usize)> {
        let d = x.dims();
        if d.len() != 3 || d[2] != self.embed_dim {
            return Err(Error::shape(
                "MultiheadAttention",
                format!("{what} must be [N, L, {}] (batch first), got {}", self.embed_dim, fmt_dims(&d)),
            ));
        }
        Ok((d[0], d[1]))
    }

    /// [N, L, E] → [N, heads, L, E / heads].
    #[track_caller]
    fn split_heads<'g>(&self, x: Tensor<'g>, n: usize, l: usize) -> Result<Tensor<'g>> {
        x.reshape_to(&[n, l, self.heads, self.embed_dim / self.heads])?.permute(&[0, 2, 1, 3])
    }

    /// [N, heads, L, D] → [N, L, E], then the output projection.
    #[track_caller]
    fn merge_heads<'g>(&self, x: Tensor<'g>, n: usize, l: usize) -> Result<Tensor<'g>> {
        self.out_proj.forward(x.permute(&[0, 2, 1, 3])?.reshape_to(&[n, l, self.embed_dim])?)
    }

    /// Projections of a self-attention input: (q, k, v), each [N, H, L, D],
    /// from one matmul against the stacked weight.
    #[track_caller]
    fn self_qkv<'g>(&self, x: Tensor<'g>) -> Result<(Tensor<'g>, Tensor<'g>, Tensor<'g>)> {
        let (n, l) = self.check_input("the input", &x)?;
        let graph = x.graph();
        let e = self.embed_dim;
        let mut qkv = x.matmul_t(graph.param(&self.in_proj_weight)?, false, true)?;
        if let Some(b) = &self.in_proj_bias {
            qkv = qkv.add(graph.param(b)?)?;
        }
        // [N, L, 3, H, D] → [3, N, H, L, D]: one copy, then three slices.
        let d = e / self.heads;
        let stacked = qkv.reshape_to(&[n, l, 3, self.heads, d])?.permute(&[2, 0, 3, 1, 4])?;
        let piece =
            |i: usize| -> Result<Tensor<'g>> { stacked.slice_axis(0, i, i + 1, 1)?.reshape_to(&[n, self.heads, l, d]) };
        Ok((piece(0)?, piece(1)?, piece(2)?))
    }

    /// General attention: `query` [N, L, E] attends to `key`/`value`
    /// [N, S, E]. `mask` as in `scaled_dot_product_attention` (broadcast
    /// to [N, heads, L, S]); `causal` adds the upper-left causal triangle.
    #[track_caller]
    pub fn attend<'g>(
        &self,
        query: Tensor<'g>,
        key: Tensor<'g>,
        value: Tensor<'g>,
        mask: Option<Tensor<'g>>,
        causal: bool,
    ) -> Result<Tensor<'g>> {
        let (n, l) = self.check_input("the query", &query)?;
        let (nk, s) = self.check_input("the key", &key)?;
        let (nv, sv) = self.check_input("the value", &value)?;
        if nk != n || nv != n || sv != s {
            return Err(Error::shape(
                "MultiheadAttention",
                format!(
                    "query {}, key {} and value {} disagree on N or S",
                    fmt_dims(&query.dims()),
                    fmt_dims(&key.dims()),
                    fmt_dims(&value.dims())
                ),
            ));
        }
        let graph = query.graph();
        let e = self.embed_dim;
        let weight = graph.param(&self.in_proj_weight)?;
        let bias = match &self.in_proj_bias {
            Some(b) => Some(graph.param(b)?),
            None => None,
        };
        let project = |x: Tensor<'g>, i: usize, len: usize| -> Result<Tensor<'g>> {
            let w = weight.slice_axis(0, i * e, (i + 1) * e, 1)?;
            let mut y = x.matmul_t(w, false, true)?;
            if let Some(b) = bias {
                y = y.add(b.slice_axis(0, i * e, (i + 1) * e, 1)?)?;
            }
            self.split_heads(y, n, len)
        };
        let (q, k, v) = (project(query, 0, l)?, project(key, 1, s)?, project(value, 2, s)?);
        let y = attention(q, k, v, mask, if causal { Some(0) } else { None }, self.next_dropout(), None)?;
        self.merge_heads(y, n, l)
    }

    /// Self-attention over new positions `x` [N, L, E] that follow the
    /// `cache.len()` positions already in `cache` (keys and values of
    /// earlier calls are not recomputed). Causal. The cache takes in this
    /// call's keys and values; call `KvCache::advance` once per model step.
    #[track_caller]
    pub fn forward_cached<'g>(&self, x: Tensor<'g>, cache: &LayerCache) -> Result<Tensor<'g>> {
        let (n, l) = self.check_input("the input", &x)?;
        let start = cache.len.get();
        cache.check(n, self.heads, self.embed_dim / self.heads, start + l)?;
        let (q, k, v) = self.self_qkv(x)?;
        let graph = x.graph();
        let full = cache.k.dims().to_vec();
        let mut specs = vec![SliceSpec::all(); 4];
        specs[2] = SliceSpec::new(start, start + l, 1);
        let mut take = vec![SliceSpec::all(); 4];
        take[2] = SliceSpec::new(0, start + l, 1);
        // Positions >= start are zero in the cache, so adding the new keys
        // written at their place fills them in.
        let new_k = graph.param(&cache.k)?.add(k.slice_backward(&full, &specs)?)?;
        let new_v = graph.param(&cache.v)?.add(v.slice_backward(&full, &specs)?)?;
        graph.realize(&[new_k, new_v])?;
        cache.k.assign(new_k)?;
        cache.v.assign(new_v)?;
        let (k, v) = (new_k.slice(&take)?, new_v.slice(&take)?);
        let y = attention(q, k, v, None, Some(start as i64), None, None)?;
        self.merge_heads(y, n, l)
    }
}

impl Module for MultiheadAttention {
    /// Self-attention (causal if the module was built so).
    #[track_caller]
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let (n, l) = self.check_input("the input", &x)?;
        let (q, k, v) = self.self_qkv(x)?;
        let y = attention(q, k, v, None, if self.causal { Some(0) } else { None }, self.next_dropout(), None)?;
        self.merge_heads(y, n, l)
    }
    fn parameters(&self) -> Vec<Param> {
        self.named_parameters().into_iter().map(|(_, p)| p).collect()
    }
    fn named_parameters(&self) -> Vec<(String, Param)> {
        let mut out = vec![("in_proj_weight".to_string(), self.in_proj_weight.clone())];
        if let Some(b) = &self.in_proj_bias {
            out.push(("in_proj_bias".to_string(), b.clone()));
        }
        out.extend(self.out_proj.named_parameters().into_iter().map(|(k, p)| (format!("out_proj.{k}"), p)));
        out
    }
    fn set_training(&self, training: bool) {
        self.training.set(training);
    }
}

/// One layer's cached keys and values: [N, heads, capacity, D] each,
/// filled up to `len` positions. Made by `KvCache`.
pub struct LayerCache {
    k: Param,
    v: Param,
    len: std::rc::Rc<Cell<usize>>,
}

impl LayerCache {
    #[track_caller]
    fn check(&self, n: usize, heads: usize, d: usize, end: usize) -> Result<()> {
        let dims = self.k.dims();
        if dims[0] != n || dims[1] != heads || dims[3] != d {
            return Err(Error::shape(
                "KvCache",
                format!(
                    "the cache holds [{}, {}, _, {}] but the layer gives [{n}, {heads}, _, {d}]",
                    dims[0], dims[1], dims[3]
                ),
            ));
        }
        if end > dims[2] {
            return Err(Error::out_of_range(
                "KvCache",
                format!("{end} positions exceed the cache's capacity of {}; reset it or make a larger one", dims[2]),
            ));
        }
        Ok(())
    }
}

/// Keys and values of earlier positions, per layer, kept on the device so
/// that generating a token computes only that token's projections.
pub struct KvCache {
    layers: Vec<LayerCache>,
    len: std::rc::Rc<Cell<usize>>,
    capacity: usize,
}

impl KvCache {
    /// Room for `capacity` positions of a batch of `n` sequences in each of
    /// `layers` attention layers with `heads` heads of `head_dim` values.
    #[track_caller]
    pub fn new(
        device: &Device,
        layers: usize,
        n: usize,
        heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<KvCache> {
        let len = std::rc::Rc::new(Cell::new(0));
        let dims = [n, heads, capacity, head_dim];
        let mut caches = Vec::with_capacity(layers);
        for _ in 0..layers {
            let k = init::zeros(device, "k_cache", &dims)?;
            let v = init::zeros(device, "v_cache", &dims)?;
            k.set_requires_grad(false);
            v.set_requires_grad(false);
            caches.push(LayerCache { k, v, len: len.clone() });
        }
        Ok(KvCache { layers: caches, len, capacity })
    }
    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.len.get()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// The cache of layer `i`.
    #[track_caller]
    pub fn layer(&self, i: usize) -> Result<&LayerCache> {
        match self.layers.get(i) {
            Some(c) => Ok(c),
            None => {
                Err(Error::out_of_range("KvCache", format!("layer {i} of a cache for {} layers", self.layers.len())))
            }
        }
    }
    /// Count `positions` new positions as cached (after every layer took
    /// them in).
    #[track_caller]
    pub fn advance(&self, positions: usize) -> Result<()> {
        let end = self.len() + positions;
        if end > self.capacity {
            return Err(Error::out_of_range(
                "KvCache",
                format!("{end} positions exceed the capacity {}", self.capacity),
            ));
        }
        self.len.set(end);
        Ok(())
    }
    /// Forget every position (the buffers are zeroed for the next use).
    #[track_caller]
    pub fn reset(&self) -> Result<()> {
        for c in &self.layers {
            for p in [&c.k, &c.v] {
                p.set_value(&crate::dtype::HostData::F32(vec![0.0; p.numel()]))?;
            }
        }
        self.len.set(0);
        Ok(())
    }
}

/// A pre-norm transformer block:
/// x + attn(norm1(x)), then + linear2(gelu(linear1(norm2(x)))).
/// Parameter names follow `torch.nn.TransformerEncoderLayer(d_model,
/// nhead, dim_feedforward, activation="gelu", batch_first=True,
/// norm_first=True)`: `self_attn.*`, `linear1.*`, `linear2.*`, `norm1.*`,
/// `norm2.*`.
pub struct TransformerBlock {
    pub self_attn: MultiheadAttention,
    pub linear1: Linear,
    pub linear2: Linear,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
    dropout: Option<super::layers::Dropout>,
    /// Run `forward` as an activation-checkpointed segment (see
    /// `set_checkpointing`).
    checkpointing: std::cell::Cell<bool>,
}

impl TransformerBlock {
    /// A causal block (the GPT decoder block) of width `d_model` with
    /// `heads` heads and a `d_ff`-wide feed-forward layer; `dropout` applies
    /// to the attention probabilities and both residual branches.
    #[track_caller]
    pub fn new(
        device: &Device,
        d_model: usize,
        heads: usize,
        d_ff: usize,
        dropout: f64,
        seed: u64,
    ) -> Result<TransformerBlock> {
        let self_attn = MultiheadAttention::new(device, d_model, heads, true, seed)?.causal(true).dropout(dropout)?;
        Ok(TransformerBlock {
            self_attn,
            linear1: Linear::new(device, d_model, d_ff, true, seed.wrapping_add(11))?,
            linear2: Linear::new(device, d_ff, d_model, true, seed.wrapping_add(12))?,
            norm1: LayerNorm::new(device, &[d_model], 1e-5)?,
            norm2: LayerNorm::new(device, &[d_model], 1e-5)?,
            dropout: if dropout > 0.0 {
                Some(super::layers::Dropout::new(dropout, seed.wrapping_add(13))?)
            } else {
                None
            },
            checkpointing: std::cell::Cell::new(false),
        })
    }

    /// Activation checkpointing for this block: when on, `forward` keeps
    /// only the block's input for the backward pass, which recomputes the
    /// block (same kernels, same dropout masks) and then differentiates it.
    /// Gradients are bit-identical either way; memory drops from every
    /// activation of the block to its input, for a second forward pass of
    /// the block during backward. See `kiln_core::checkpoint`.
    pub fn set_checkpointing(&self, on: bool) {
        self.checkpointing.set(on);
    }

    pub fn is_checkpointing(&self) -> bool {
        self.checkpointing.get()
    }

    #[track_caller]
    fn forward_uncheckpointed<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let a = self.self_attn.forward(self.norm1.forward(x)?)?;
        self.feed_forward(self.residual(x, a)?)
    }

    #[track_caller]
    fn residual<'g>(&self, x: Tensor<'g>, branch: Tensor<'g>) -> Result<Tensor<'g>> {
        match &self.dropout {
            Some(d) => x.add(d.forward(branch)?),
            None => x.add(branch),
        }
    }

    #[track_caller]
    fn feed_forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let h = self.linear2.forward(self.linear1.forward(self.norm2.forward(x)?)?.gelu()?)?;
        self.residual(x, h)
    }

    /// The block over new positions, with earlier ones in `cache`.
    #[track_caller]
    pub fn forward_cached<'g>(&self, x: Tensor<'g>, cache: &LayerCache) -> Result<Tensor<'g>> {
        let a = self.self_attn.forward_cached(self.norm1.forward(x)?, cache)?;
        self.feed_forward(self.residual(x, a)?)
    }
}

impl Module for TransformerBlock {
    #[track_caller]
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        if self.checkpointing.get() {
            crate::autograd::checkpoint(|x| self.forward_uncheckpointed(x), x)
        } else {
            self.forward_uncheckpointed(x)
        }
    }
    fn parameters(&self) -> Vec<Param> {
        self.named_parameters().into_iter().map(|(_, p)| p).collect()
    }
    fn named_parameters(&self) -> Vec<(String, Param)> {
        let parts: [(&str, &dyn Module); 5] = [
            ("self_attn", &self.self_attn),
            ("linear1", &self.linear1),
            ("linear2", &self.linear2),
            ("norm1", &self.norm1),
            ("norm2", &self.norm2),
        ];
        parts
            .iter()
            .flat_map(|(prefix, m)| m.named_parameters().into_iter().map(move |(k, p)| (format!("{prefix}.{k}"), p)))
            .collect()
    }
    fn set_training(&self, training: bool) {
        self.self_attn.set_training(training);
        if let Some(d) = &self.dropout {
            d.set_training(training);
        }
    }
}
