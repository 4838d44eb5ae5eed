//! Masks and pieces, composed from the primitives (OPS.md: "Composed, not
//! primitive"): `tril`/`triu`, `masked_fill`, a softmax that honours a mask
//! (fully masked rows give zeros, not NaN), `split`/`chunk`; and the one
//! fused primitive among them, `causal_softmax` (the mask as an attribute).

use std::panic::Location;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, Tensor};
use crate::op::Op;
use crate::shape::fmt_dims;

use super::reduce::normalize_axis;

impl Graph {
    /// A bool [rows, cols] mask that is true where `col - row <= diagonal`
    /// (the lower triangle, PyTorch's `tril` convention for `diagonal`).
    /// `causal_mask(n, n, 0)` is the usual "attend to the past" mask.
    #[track_caller]
    pub fn tril_mask(&self, rows: usize, cols: usize, diagonal: i64) -> Result<Tensor<'_>> {
        self.triangle_mask("tril_mask", rows, cols, diagonal, true)
    }

    /// A bool [rows, cols] mask that is true where `col - row >= diagonal`.
    #[track_caller]
    pub fn triu_mask(&self, rows: usize, cols: usize, diagonal: i64) -> Result<Tensor<'_>> {
        self.triangle_mask("triu_mask", rows, cols, diagonal, false)
    }

    #[track_caller]
    fn triangle_mask(
        &self,
        op: &'static str,
        rows: usize,
        cols: usize,
        diagonal: i64,
        lower: bool,
    ) -> Result<Tensor<'_>> {
        let limit = i32::MAX as usize;
        if rows > limit || cols > limit || diagonal.unsigned_abs() > limit as u64 {
            return Err(Error::invalid(
                op,
                format!("{rows}x{cols} with diagonal {diagonal} exceeds the i32 index range"),
            ));
        }
        // col - row as i32, compared with the diagonal: no float rounding.
        let r = self.arange(0.0, 1.0, rows, DType::I32)?.reshape_to(&[rows, 1])?;
        let c = self.arange(0.0, 1.0, cols, DType::I32)?.reshape_to(&[1, cols])?;
        let offset = c.sub(r)?;
        if lower {
            offset.le(diagonal as i32)
        } else {
            offset.ge(diagonal as i32)
        }
    }
}

impl<'g> Tensor<'g> {
    /// Keep the lower triangle of the last two axes (`col - row <=
    /// diagonal`), zeros elsewhere. Differentiable: the gradient is masked
    /// the same way.
    #[track_caller]
    pub fn tril(self, diagonal: i64) -> Result<Tensor<'g>> {
        let (rows, cols) = self.matrix_dims("tril")?;
        let mask = self.graph.tril_mask(rows, cols, diagonal)?;
        mask.where_(self, 0.0)
    }

    /// Keep the upper triangle of the last two axes (`col - row >=
    /// diagonal`), zeros elsewhere.
    #[track_caller]
    pub fn triu(self, diagonal: i64) -> Result<Tensor<'g>> {
        let (rows, cols) = self.matrix_dims("triu")?;
        let mask = self.graph.triu_mask(rows, cols, diagonal)?;
        mask.where_(self, 0.0)
    }

    #[track_caller]
    fn matrix_dims(&self, op: &'static str) -> Result<(usize, usize)> {
        let d = self.dims();
        if d.len() < 2 {
            return Err(Error::shape(op, format!("needs rank >= 2, got {}", fmt_dims(&d))));
        }
        Ok((d[d.len() - 2], d[d.len() - 1]))
    }

    /// `value` where `mask` is true, `self` elsewhere (PyTorch's
    /// `masked_fill`); `mask` is bool and broadcasts against `self`, whose
    /// shape the result keeps. No gradient flows to filled positions.
    #[track_caller]
    pub fn masked_fill(self, mask: Tensor<'g>, value: f64) -> Result<Tensor<'g>> {
        if mask.dtype() != DType::Bool {
            return Err(Error::dtype("masked_fill", format!("the mask must be bool, got {}", mask.dtype())));
        }
        let (d, m) = (self.dims(), mask.dims());
        match crate::shape::broadcast_shapes(&d, &m) {
            Some(out) if out == d => {}
            _ => {
                return Err(Error::shape(
                    "masked_fill",
                    format!("the mask {} does not broadcast to the tensor's shape {}", fmt_dims(&m), fmt_dims(&d)),
                ))
            }
        }
        if !self.dtype().is_float() && value.fract() != 0.0 {
            return Err(Error::invalid("masked_fill", format!("{value} does not fit a {} tensor", self.dtype())));
        }
        mask.where_(self.graph.scalar(value, self.dtype())?, self)
    }

    /// Softmax along `axis` over the positions where `keep` is true (bool,
    /// broadcasting to `self`); masked positions get probability 0 and no
    /// gradient. A row with no kept position is all zeros (not NaN).
    /// `keep = None` is the plain softmax.
    #[track_caller]
    pub fn masked_softmax(self, keep: Option<Tensor<'g>>, axis: isize) -> Result<Tensor<'g>> {
        let Some(keep) = keep else { return self.softmax(axis) };
        if !self.dtype().is_float() {
            return Err(Error::dtype("masked_softmax", format!("needs a float tensor, got {}", self.dtype())));
        }
        normalize_axis("masked_softmax", axis, self.rank())?;
        // -inf at masked positions: exp gives exact zeros there and the
        // gradient through the exp is 0 · g, never 0 · inf.
        let hidden = self.masked_fill(keep.logical_not()?, f64::NEG_INFINITY)?;
        let max = hidden.max(&[axis], true)?.detach()?;
        // A fully masked row has max -inf; shift it by 0 instead so that
        // -inf - max stays -inf rather than NaN.
        let shift = max.eq(f64::NEG_INFINITY)?.where_(0.0, max)?;
        let e = hidden.sub(shift)?.exp()?;
        let total = e.sum(&[axis], true)?;
        let safe = total.eq(0.0)?.where_(1.0, total)?;
        e.div(safe)
    }

    /// Softmax over the last axis of `self` [..., L, S] where row i keeps
    /// the keys j with `j - i <= diagonal` (0: PyTorch's `is_causal`;
    /// S - L: the triangle aligned to the lower right, as a key/value cache
    /// needs). One primitive (CausalSoftmax): the mask is an attribute, no
    /// mask tensor is made. Entries of -inf count as masked; a row with
    /// nothing kept is all zeros, not NaN. The composed
    /// `masked_softmax(Some(tril_mask(L, S, diagonal)), -1)` is its
    /// reference.
    #[track_caller]
    pub fn causal_softmax(self, diagonal: i64) -> Result<Tensor<'g>> {
        const OP: &str = "causal_softmax";
        let d = self.dims();
        if d.len() < 2 {
            return Err(Error::shape(OP, format!("needs rank >= 2 ([..., L, S]), got {}", fmt_dims(&d))));
        }
        if !self.dtype().is_float() {
            return Err(Error::dtype(OP, format!("needs a float tensor, got {}", self.dtype())));
        }
        // Any diagonal at or beyond S keeps everything, at or below -L
        // nothing: clamp into that range so it fits the i32 attribute.
        let (l, s) = (d[d.len() - 2] as i64, d[d.len() - 1] as i64);
        let diagonal = i32::try_from(diagonal.clamp(-l - 1, s)).map_err(|_| {
            Error::invalid(OP, format!("{} exceeds the i32 range of the diagonal attribute", fmt_dims(&d)))
        })?;
        self.graph.record(Op::CausalSoftmax { diagonal }, &[self.id], &d, self.dtype(), Location::caller())
    }

    /// Element-wise NOT of a bool tensor.
    #[track_caller]
    pub fn logical_not(self) -> Result<Tensor<'g>> {
        if self.dtype() != DType::Bool {
            return Err(Error::dtype("logical_not", format!("needs a bool tensor, got {}", self.dtype())));
        }
        let f = self.graph.scalar(0.0, DType::Bool)?;
        self.eq(f)
    }

    /// Pieces of the given sizes along `axis` (they must add up to the
    /// axis length), as PyTorch's `split` with a list of sizes.
    #[track_caller]
    pub fn split(self, sizes: &[usize], axis: isize) -> Result<Vec<Tensor<'g>>> {
        let axis = normalize_axis("split", axis, self.rank())?;
        let len = self.dims()[axis];
        let total: usize = sizes.iter().sum();
        if total != len || sizes.is_empty() {
            return Err(Error::shape(
                "split",
                format!(
                    "sizes {sizes:?} add up to {total}, but axis {axis} of {} has length {len}",
                    fmt_dims(&self.dims())
                ),
            ));
        }
        let mut pieces = Vec::with_capacity(sizes.len());
        let mut start = 0;
        for &size in sizes {
            pieces.push(self.slice_axis(axis as isize, start, start + size, 1)?);
            start += size;
        }
        Ok(pieces)
    }

    /// `chunks` pieces along `axis`, each of ceil(len / chunks) elements
    /// except possibly a shorter last one (PyTorch's `chunk`; like it, fewer
    /// pieces come back when the length does not allow `chunks` non-empty
    /// ones).
    #[track_caller]
    pub fn chunk(self, chunks: usize, axis: isize) -> Result<Vec<Tensor<'g>>> {
        let a = normalize_axis("chunk", axis, self.rank())?;
        if chunks == 0 {
            return Err(Error::invalid("chunk", "chunks must be at least 1"));
        }
        let len = self.dims()[a];
        if len == 0 {
            return Err(Error::shape("chunk", format!("axis {a} of {} is empty", fmt_dims(&self.dims()))));
        }
        let size = len.div_ceil(chunks);
        let mut sizes = vec![size; len / size];
        if len % size != 0 {
            sizes.push(len % size);
        }
        self.split(&sizes, a as isize)
    }
}

impl<'g> Tensor<'g> {
    /// One sample per row of non-negative weights `self` [N, V] (they need
    /// not sum to 1), as i32 [N]: category i with probability
    /// w_i / Σw. Seeded and replayable (the uniform draw comes from the
    /// counter-based generator), and computed on the device: the running
    /// sums are a matmul with a triangular matrix and the pick is a count
    /// of sums below the draw, so no host round trip is needed. O(V²)
    /// work per row, fine for vocabularies of a few thousand. The weights
    /// are not checked (that would need a host round trip): a row of zeros
    /// gives its last category, and a row with a negative or NaN weight
    /// gives some category in 0..V, never an out-of-range index.
    #[track_caller]
    pub fn multinomial(self, seed: u64) -> Result<Tensor<'g>> {
        let d = self.dims();
        if d.len() != 2 || d[1] == 0 || !self.dtype().is_float() {
            return Err(Error::shape(
                "multinomial",
                format!("expects float weights [N, V] with V > 0, got {} {}", fmt_dims(&d), self.dtype()),
            ));
        }
        let (n, v) = (d[0], d[1]);
        let graph = self.graph;
        let _no_grad = graph.no_grad();
        // upper[j, i] = 1 where j <= i, so (w · upper)_i = Σ_{j<=i} w_j.
        let upper = graph.triu_mask(v, v, 0)?.cast(self.dtype())?;
        let cdf = self.detach()?.matmul(upper)?;
        let total = cdf.slice_axis(1, v - 1, v, 1)?;
        let draw = graph.rand_uniform(&[n, 1], seed, self.dtype())?.mul(total)?;
        let below = cdf.le(draw)?.cast(DType::I32)?.sum(&[1], false)?;
        below.minimum((v - 1) as i32)
    }

    /// `self` with every entry below the row's k-th largest (along the last
    /// axis) replaced by −inf, ties with the k-th kept: top-k filtering of
    /// logits before sampling. O(V²) comparisons per row.
    #[track_caller]
    pub fn top_k_filter(self, k: usize) -> Result<Tensor<'g>> {
        let d = self.dims();
        if d.is_empty() || !self.dtype().is_float() || k == 0 {
            return Err(Error::invalid(
                "top_k_filter",
                format!(
                    "needs float logits of rank >= 1 and k >= 1, got {} {} with k = {k}",
                    fmt_dims(&d),
                    self.dtype()
                ),
            ));
        }
        let v = d[d.len() - 1];
        if k >= v {
            return Ok(self);
        }
        let graph = self.graph;
        let _no_grad = graph.no_grad();
        let x = self.detach()?;
        let r = d.len();
        let mut col = d.to_vec();
        col.push(1);
        let mut row = d.to_vec();
        row.insert(r - 1, 1);
        // greater[..., i, j] = x_j > x_i; rank_i = how many entries beat i.
        let greater = x.reshape_to(&row)?.gt(x.reshape_to(&col)?)?;
        let rank = greater.cast(DType::I32)?.sum(&[-1], false)?;
        rank.lt(k as i32)?.where_(x, f64::NEG_INFINITY)
    }
}
