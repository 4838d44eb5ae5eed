//! The rest of the Tensor API for JavaScript: multi-axis slicing and its
//! adjoint, scatter, the window ops (im2col, col2im, max pooling and its
//! adjoint), random tensors, masks, split/chunk, sampling helpers and the
//! composed activations and norms. `tests/op-coverage.mjs` checks that
//! every primitive of kiln-core's op table is reachable from here or from
//! `tensor_api.rs`.

use js_sys::Array;
use kiln_core::{SliceSpec, Window2d};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::error::{KilnError, Res};
use crate::graph::{parse_dtype, Graph, Tensor};
use crate::tensor_api::{count, dims, seed_arg, signed, signed_or, tensor_from_js, uints, IntList, TensorArg};

#[wasm_bindgen]
extern "C" {
    /// One size for both spatial axes, or [height, width].
    #[wasm_bindgen(typescript_type = "number | [number, number]")]
    pub type Pair;

    /// Per-axis ranges: [start, end] or [start, end, step]; null (or a
    /// missing entry) takes the whole axis.
    #[wasm_bindgen(typescript_type = "Array<[number, number] | [number, number, number] | null>")]
    pub type SliceRanges;

    /// A list of tensors (split, chunk).
    #[wasm_bindgen(typescript_type = "Tensor[]")]
    pub type TensorList;
}

/// `[h, w]` from a number or a two-element list; `default` when omitted.
pub(crate) fn pair(op: &'static str, what: &str, value: Option<&Pair>, default: usize) -> Res<[usize; 2]> {
    let Some(value) = value else { return Ok([default, default]) };
    if value.is_undefined() || value.is_null() {
        return Ok([default, default]);
    }
    let v = uints(op, value)?;
    match v.as_slice() {
        [x] => Ok([*x as usize, *x as usize]),
        [h, w] => Ok([*h as usize, *w as usize]),
        _ => {
            Err(KilnError::argument(op, format!("{what} must be a number or [height, width], got {} numbers", v.len())))
        }
    }
}

/// A window from kernel, stride (default: `default_stride`), padding
/// (default 0) and dilation (default 1).
fn window(
    op: &'static str,
    kernel: &Pair,
    stride: Option<&Pair>,
    padding: Option<&Pair>,
    dilation: Option<&Pair>,
    default_stride: Option<[usize; 2]>,
) -> Res<([usize; 2], [usize; 2], [usize; 2], [usize; 2])> {
    let k = pair(op, "kernel", Some(kernel), 1)?;
    let s = match stride {
        Some(s) if !s.is_undefined() && !s.is_null() => pair(op, "stride", Some(s), 1)?,
        _ => default_stride.unwrap_or(k),
    };
    Ok((k, s, pair(op, "padding", padding, 0)?, pair(op, "dilation", dilation, 1)?))
}

fn window2d(
    op: &'static str,
    kernel: &Pair,
    stride: Option<&Pair>,
    padding: Option<&Pair>,
    dilation: Option<&Pair>,
) -> Res<Window2d> {
    let (k, s, p, d) = window(op, kernel, stride, padding, dilation, Some([1, 1]))?;
    Ok(Window2d::new(k, s, p, d)?)
}

/// Slice specs from JS ranges.
fn slice_specs(op: &'static str, ranges: &SliceRanges) -> Res<Vec<SliceSpec>> {
    let Some(list) = ranges.dyn_ref::<Array>() else {
        return Err(KilnError::argument(op, "expected an array of [start, end, step?] ranges (null for a whole axis)"));
    };
    list.iter()
        .map(|r| {
            if r.is_null() || r.is_undefined() {
                return Ok(SliceSpec::all());
            }
            let v = uints(op, &r)?;
            match v.as_slice() {
                [start, end] => Ok(SliceSpec::new(*start as usize, *end as usize, 1)),
                [start, end, step] => Ok(SliceSpec::new(*start as usize, *end as usize, *step as usize)),
                _ => Err(KilnError::argument(op, "each range is [start, end] or [start, end, step]")),
            }
        })
        .collect()
}

fn tensor_list(tensors: Vec<Tensor>) -> TensorList {
    let out = Array::new();
    for t in tensors {
        out.push(&JsValue::from(t));
    }
    out.unchecked_into()
}

#[wasm_bindgen]
impl Graph {
    /// Uniform values in [0, 1) from kiln's counter-based generator: the
    /// same numbers for the same `seed` on every backend and in native kiln.
    #[wasm_bindgen(js_name = randUniform)]
    pub fn rand_uniform(&self, shape: &IntList, seed: f64, dtype: Option<String>) -> Res<Tensor> {
        let dtype = parse_dtype("randUniform", dtype)?;
        let d = dims(&uints("randUniform", shape)?);
        let seed = seed_arg("randUniform", seed)?;
        self.make(|g| g.rand_uniform(&d, seed, dtype))
    }

    /// Standard normal values (same generator as `randUniform`).
    #[wasm_bindgen(js_name = randNormal)]
    pub fn rand_normal(&self, shape: &IntList, seed: f64, dtype: Option<String>) -> Res<Tensor> {
        let dtype = parse_dtype("randNormal", dtype)?;
        let d = dims(&uints("randNormal", shape)?);
        let seed = seed_arg("randNormal", seed)?;
        self.make(|g| g.rand_normal(&d, seed, dtype))
    }

    /// A bool [rows, cols] mask, true on and below diagonal `diagonal`.
    #[wasm_bindgen(js_name = trilMask)]
    pub fn tril_mask(&self, rows: f64, cols: f64, diagonal: Option<f64>) -> Res<Tensor> {
        const OP: &str = "trilMask";
        let (rows, cols) = (count(OP, "rows", rows)?, count(OP, "cols", cols)?);
        let diagonal = signed_or(OP, "diagonal", diagonal, 0)? as i64;
        self.make(|g| g.tril_mask(rows, cols, diagonal))
    }

    /// A bool [rows, cols] mask, true on and above diagonal `diagonal`.
    #[wasm_bindgen(js_name = triuMask)]
    pub fn triu_mask(&self, rows: f64, cols: f64, diagonal: Option<f64>) -> Res<Tensor> {
        const OP: &str = "triuMask";
        let (rows, cols) = (count(OP, "rows", rows)?, count(OP, "cols", cols)?);
        let diagonal = signed_or(OP, "diagonal", diagonal, 0)? as i64;
        self.make(|g| g.triu_mask(rows, cols, diagonal))
    }
}

#[wasm_bindgen]
impl Tensor {
    /// Slice several axes at once: `x.slice([[0, 2], null, [1, 8, 2]])`.
    /// Ends past the axis are clamped, as in Python.
    pub fn slice(&self, ranges: &SliceRanges) -> Res<Tensor> {
        let specs = slice_specs("slice", ranges)?;
        self.map(|t| t.slice(&specs))
    }

    /// The adjoint of `slice`: zeros of `shape` with this tensor written at
    /// the sliced positions.
    #[wasm_bindgen(js_name = sliceBackward)]
    pub fn slice_backward(&self, shape: &IntList, ranges: &SliceRanges) -> Res<Tensor> {
        let d = dims(&uints("sliceBackward", shape)?);
        let specs = slice_specs("sliceBackward", ranges)?;
        self.map(|t| t.slice_backward(&d, &specs))
    }

    /// This tensor with `source`'s slices added at int32 `index` positions
    /// along `axis` (the adjoint of `indexSelect`).
    #[wasm_bindgen(js_name = scatterAdd)]
    pub fn scatter_add(&self, axis: f64, index: &Tensor, source: &Tensor) -> Res<Tensor> {
        let axis = signed("scatterAdd", "axis", axis)?;
        self.map3(index, source, "scatterAdd", move |d, i, s| d.scatter_add(axis, i, s))
    }

    /// Split along `axis` into pieces of the given sizes.
    pub fn split(&self, sizes: &IntList, axis: Option<f64>) -> Res<TensorList> {
        let s = dims(&uints("split", sizes)?);
        let axis = signed_or("split", "axis", axis, 0)?;
        Ok(tensor_list(self.map_to_many(|t| t.split(&s, axis))?))
    }

    /// The `k` largest entries along `axis` (default -1; the smallest when
    /// `largest` is false) and their positions: `[values, indices]`, best
    /// first, ties to the lower position, NaN above every number.
    #[wasm_bindgen(js_name = topK)]
    pub fn top_k(&self, k: f64, axis: Option<f64>, largest: Option<bool>) -> Res<TensorList> {
        let k = count("topK", "k", k)?;
        let axis = signed_or("topK", "axis", axis, -1)?;
        let largest = largest.unwrap_or(true);
        Ok(tensor_list(self.map_to_many(|t| t.top_k(k, axis, largest).map(|(v, i)| vec![v, i]))?))
    }

    /// Split along `axis` into `chunks` nearly equal pieces.
    pub fn chunk(&self, chunks: f64, axis: Option<f64>) -> Res<TensorList> {
        let chunks = count("chunk", "chunks", chunks)?;
        let axis = signed_or("chunk", "axis", axis, 0)?;
        Ok(tensor_list(self.map_to_many(|t| t.chunk(chunks, axis))?))
    }

    /// [N, C, H, W] → [N, C·kh·kw, OH·OW]: each window position's pixels as
    /// a column. Stride, padding and dilation default to 1, 0, 1.
    pub fn im2col(
        &self,
        kernel: &Pair,
        stride: Option<Pair>,
        padding: Option<Pair>,
        dilation: Option<Pair>,
    ) -> Res<Tensor> {
        let w = window2d("im2col", kernel, stride.as_ref(), padding.as_ref(), dilation.as_ref())?;
        self.map(|t| t.im2col(w))
    }

    /// The adjoint of `im2col`: columns back to an image of `image` = [H, W],
    /// summing overlapping windows.
    pub fn col2im(
        &self,
        image: &Pair,
        kernel: &Pair,
        stride: Option<Pair>,
        padding: Option<Pair>,
        dilation: Option<Pair>,
    ) -> Res<Tensor> {
        let size = pair("col2im", "image", Some(image), 1)?;
        let w = window2d("col2im", kernel, stride.as_ref(), padding.as_ref(), dilation.as_ref())?;
        self.map(|t| t.col2im(size, w))
    }

    /// 2-D max pooling of an NCHW tensor; stride defaults to the kernel.
    #[wasm_bindgen(js_name = maxPool2d)]
    #[allow(non_snake_case)]
    pub fn max_pool2d(
        &self,
        kernel: &Pair,
        stride: Option<Pair>,
        padding: Option<Pair>,
        dilation: Option<Pair>,
        ceilMode: Option<bool>,
    ) -> Res<Tensor> {
        let (k, s, p, d) = window("maxPool2d", kernel, stride.as_ref(), padding.as_ref(), dilation.as_ref(), None)?;
        self.map(|t| t.max_pool2d(k, s, p, d, ceilMode.unwrap_or(false)))
    }

    /// The adjoint of `maxPool2d` (without ceil mode): `grad` (pooled
    /// shape) added at each window's first maximum of this input.
    #[wasm_bindgen(js_name = maxPool2dBackward)]
    pub fn max_pool2d_backward(
        &self,
        grad: &Tensor,
        kernel: &Pair,
        stride: Option<Pair>,
        padding: Option<Pair>,
        dilation: Option<Pair>,
    ) -> Res<Tensor> {
        let (k, s, p, d) =
            window("maxPool2dBackward", kernel, stride.as_ref(), padding.as_ref(), dilation.as_ref(), None)?;
        let w = Window2d::new(k, s, p, d)?;
        self.map2(grad, "maxPool2dBackward", move |x, g| x.max_pool2d_backward(g, w))
    }

    /// max(x, 0) + slope · min(x, 0); slope defaults to 0.01.
    #[wasm_bindgen(js_name = leakyRelu)]
    pub fn leaky_relu(&self, slope: Option<f64>) -> Res<Tensor> {
        self.map(|t| t.leaky_relu(slope.unwrap_or(0.01)))
    }

    /// x for x > 0, alpha · (exp(x) - 1) otherwise; alpha defaults to 1.
    pub fn elu(&self, alpha: Option<f64>) -> Res<Tensor> {
        self.map(|t| t.elu(alpha.unwrap_or(1.0)))
    }

    /// log(1 + exp(beta · x)) / beta; beta defaults to 1.
    pub fn softplus(&self, beta: Option<f64>) -> Res<Tensor> {
        self.map(|t| t.softplus(beta.unwrap_or(1.0)))
    }

    /// x · tanh(softplus(x)).
    pub fn mish(&self) -> Res<Tensor> {
        self.map(|t| t.mish())
    }

    /// RMS normalisation over the last `dims` axes (no weight); eps 1e-5.
    #[wasm_bindgen(js_name = rmsNorm)]
    pub fn rms_norm(&self, dims: f64, eps: Option<f64>) -> Res<Tensor> {
        let dims = count("rmsNorm", "dims", dims)?;
        self.map(|t| t.rms_norm(dims, eps.unwrap_or(1e-5)))
    }

    /// Group normalisation of [N, C, ...] over `groups` channel groups (no
    /// weight); eps 1e-5.
    #[wasm_bindgen(js_name = groupNorm)]
    pub fn group_norm(&self, groups: f64, eps: Option<f64>) -> Res<Tensor> {
        let groups = count("groupNorm", "groups", groups)?;
        self.map(|t| t.group_norm(groups, eps.unwrap_or(1e-5)))
    }

    /// Zero above diagonal `diagonal` of the last two axes.
    pub fn tril(&self, diagonal: Option<f64>) -> Res<Tensor> {
        let diagonal = signed_or("tril", "diagonal", diagonal, 0)? as i64;
        self.map(|t| t.tril(diagonal))
    }

    /// Zero below diagonal `diagonal` of the last two axes.
    pub fn triu(&self, diagonal: Option<f64>) -> Res<Tensor> {
        let diagonal = signed_or("triu", "diagonal", diagonal, 0)? as i64;
        self.map(|t| t.triu(diagonal))
    }

    /// `value` where the bool `mask` is true, this tensor elsewhere.
    #[wasm_bindgen(js_name = maskedFill)]
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Res<Tensor> {
        self.map2(mask, "maskedFill", move |t, m| t.masked_fill(m, value))
    }

    /// Softmax along `axis` (default -1) over the entries where the bool
    /// `keep` is true (all when omitted); rows with none kept give zeros.
    #[wasm_bindgen(js_name = maskedSoftmax)]
    pub fn masked_softmax(&self, keep: Option<TensorArg>, axis: Option<f64>) -> Res<Tensor> {
        let axis = signed_or("maskedSoftmax", "axis", axis, -1)?;
        match keep {
            None => self.map(|t| t.masked_softmax(None, axis)),
            Some(k) => {
                let k = tensor_from_js("maskedSoftmax", &k)?;
                self.map2(&k, "maskedSoftmax", move |t, k| t.masked_softmax(Some(k), axis))
            }
        }
    }

    /// Softmax over the last axis of [..., L, S] keeping, in row i, the keys
    /// j with j - i <= `diagonal` (default 0: causal attention); one
    /// primitive, no mask tensor. Rows with nothing kept give zeros.
    #[wasm_bindgen(js_name = causalSoftmax)]
    pub fn causal_softmax(&self, diagonal: Option<f64>) -> Res<Tensor> {
        let diagonal = signed_or("causalSoftmax", "diagonal", diagonal, 0)? as i64;
        self.map(|t| t.causal_softmax(diagonal))
    }

    /// Logical not of a bool tensor.
    #[wasm_bindgen(js_name = logicalNot)]
    pub fn logical_not(&self) -> Res<Tensor> {
        self.map(|t| t.logical_not())
    }

    /// One int32 sample per row of these probabilities [..., K], drawn with
    /// kiln's counter-based generator from `seed`.
    pub fn multinomial(&self, seed: f64) -> Res<Tensor> {
        let seed = seed_arg("multinomial", seed)?;
        self.map(|t| t.multinomial(seed))
    }

    /// Keep the `k` largest entries of each row, -inf elsewhere (top-k
    /// sampling's filter).
    #[wasm_bindgen(js_name = topKFilter)]
    pub fn top_k_filter(&self, k: f64) -> Res<Tensor> {
        let k = count("topKFilter", "k", k)?;
        self.map(|t| t.top_k_filter(k))
    }
}

/// Attention softmax(q·kᵀ·scale [+ mask]) · v over [..., L, E] queries and
/// [..., S, E] keys/values. `mask`: bool, true = keep. `causal` masks keys
/// after each query. `scale` defaults to 1/√E.
#[wasm_bindgen(js_name = scaledDotProductAttention)]
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<TensorArg>,
    causal: Option<bool>,
    scale: Option<f64>,
) -> Res<Tensor> {
    const OP: &str = "scaledDotProductAttention";
    let causal = causal.unwrap_or(false);
    let slot = q.slot()?;
    let (tq, tk, tv) = (slot.get(q.id)?, q.same(OP, &slot, k)?, q.same(OP, &slot, v)?);
    let tm = match mask {
        Some(m) => Some(q.same(OP, &slot, &tensor_from_js(OP, &m)?)?),
        None => None,
    };
    let out = kiln_core::nn::scaled_dot_product_attention(tq, tk, tv, tm, causal, None, scale)?;
    Ok(q.graph.register(&slot, out))
}
