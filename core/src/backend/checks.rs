//! The checks and geometry every backend applies to a kernel call before it
//! touches memory: operand shapes, the strides that read a view, the matrix
//! and batch layout of a product, which kernels exist. Both the CPU backend
//! and kiln-wgsl call these, so a call is refused with the same error, for
//! the same reason, on every device.

use crate::backend::ParamUpdate;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{Op, Perm, ReduceOp, SliceAttr, Window2d};
use crate::shape::{broadcast_strides, contiguous_strides, fmt_dims, AxisSet, Dims};

/// Whether a backend that stores `dtypes` has a kernel for `op` producing
/// `dtype`: the op table's kernel dtypes (`OpInfo::dtypes`) that the backend
/// stores. Every backend answers `supports` with this, so the kernel set is
/// stated once, in the table; each backend's tests check that it really has
/// every kernel this promises.
pub fn has_kernel(op: &Op, dtype: DType, dtypes: &[DType]) -> bool {
    // The browser build has no layer-norm kernels (download size):
    // `Tensor::layer_norm` composes it there.
    if cfg!(target_arch = "wasm32") && matches!(op, Op::LayerNorm { .. } | Op::LayerNormBackward { .. }) {
        return false;
    }
    dtypes.contains(&dtype) && op.info().dtypes.contains(dtype)
}

/// The strides that read `dims` broadcast to `out` (the graph guarantees it
/// broadcasts; a backend must still not index out of bounds if it did not).
pub fn broadcast_to(op: &'static str, dims: &[usize], out: &[usize]) -> Result<Dims> {
    let ok = dims.len() <= out.len() && dims.iter().rev().zip(out.iter().rev()).all(|(&d, &o)| d == o || d == 1);
    if !ok {
        return Err(Error::shape(op, format!("{} does not broadcast to {}", fmt_dims(dims), fmt_dims(out))));
    }
    Ok(broadcast_strides(dims, out))
}

/// The strides that read `x` (contiguous) permuted by `perm` into `out`.
pub fn permute_strides(perm: &Perm, x: &[usize], out: &[usize]) -> Result<Dims> {
    let rank = x.len();
    let valid = perm.rank() == rank && out.len() == rank && (0..rank).all(|i| out[i] == x[perm.get(i)]);
    if !valid {
        return Err(Error::shape(
            "Permute",
            format!("permutation {perm:?} of {} does not give {}", fmt_dims(x), fmt_dims(out)),
        ));
    }
    let xs = contiguous_strides(x);
    Ok((0..rank).map(|i| xs[perm.get(i)]).collect())
}

/// The base offset and strides that read the slice `attr` (start and step
/// per axis) of a tensor of dims `full`, taking `sliced` elements per axis.
pub fn slice_view(op: &'static str, attr: &SliceAttr, full: &[usize], sliced: &[usize]) -> Result<(usize, Dims)> {
    let bad = || {
        Error::out_of_range(op, format!("slice {attr:?} of {} does not have dims {}", fmt_dims(full), fmt_dims(sliced)))
    };
    if attr.rank() != full.len() || sliced.len() != full.len() {
        return Err(bad());
    }
    let fs = contiguous_strides(full);
    let mut base = 0;
    let mut strides = Dims::new();
    for d in 0..full.len() {
        let (start, step, n) = (attr.start(d), attr.step(d), sliced[d]);
        // The last element taken must lie inside the axis (none taken: the
        // start may be the axis length).
        let fits = if n == 0 {
            start <= full[d]
        } else {
            (n - 1).checked_mul(step).and_then(|s| s.checked_add(start)).is_some_and(|last| last < full[d])
        };
        if step == 0 || !fits {
            return Err(bad());
        }
        base += start * fs[d];
        strides.push(fs[d] * step);
    }
    Ok((base, strides))
}

/// Inputs of (dims, dtype) that concatenate along `axis` into `out`.
pub fn concat<'a>(
    axis: usize,
    ins: impl Iterator<Item = (&'a [usize], DType)> + Clone,
    (od, out_dtype): (&[usize], DType),
) -> Result<()> {
    let fits = axis < od.len()
        && ins.clone().all(|(dims, dtype)| {
            dtype == out_dtype
                && dims.len() == od.len()
                && dims.iter().zip(od).enumerate().all(|(d, (a, b))| d == axis || a == b)
        })
        && ins.clone().map(|(dims, _)| dims[axis]).sum::<usize>() == od[axis];
    if !fits {
        let dims: Vec<String> = ins.map(|(dims, _)| fmt_dims(dims)).collect();
        return Err(Error::shape(
            "Concat",
            format!("cannot concatenate {} along axis {axis} into {}", dims.join(", "), fmt_dims(od)),
        ));
    }
    Ok(())
}

/// A reduction of `x` over `axes` (already masked to its rank) into
/// `outputs` kept positions of `block` elements each, written to `out`.
pub fn reduction(
    op: ReduceOp,
    axes: AxisSet,
    (x, x_dtype): (&[usize], DType),
    (outputs, block): (usize, usize),
    (out_numel, out_dtype): (usize, DType),
) -> Result<()> {
    let name = op.name();
    if out_numel != outputs {
        return Err(Error::shape(
            name,
            format!("reducing {} over {:?} gives {outputs} elements, the output has {out_numel}", fmt_dims(x), axes),
        ));
    }
    if block == 0 && outputs > 0 && !matches!(op, ReduceOp::Sum | ReduceOp::Prod) {
        return Err(Error::invalid(name, format!("{name} of an empty block (input {})", fmt_dims(x))));
    }
    if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
        if out_dtype != DType::I32 {
            return Err(Error::backend(name, "ArgMax/ArgMin write i32"));
        }
    } else if x_dtype != out_dtype {
        return Err(Error::backend(name, "the output dtype differs from the input's"));
    }
    Ok(())
}

/// One operand's matrix geometry: rows x cols of the logical matrix, and the
/// strides that read it from row-major storage (transposed or not).
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl Mat {
    fn new(dims: &[usize], transposed: bool) -> Mat {
        let (r, c) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        if transposed {
            Mat { rows: c, cols: r, rs: 1, cs: c }
        } else {
            Mat { rows: r, cols: c, rs: c, cs: 1 }
        }
    }
    /// Elements a matrix spans from its first (0 for an empty one).
    pub fn span(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.rows - 1) * self.rs + (self.cols - 1) * self.cs + 1
        }
    }
}

/// A batched product `out[.., m, n] = a[.., m, k] . b[.., k, n]`: the two
/// operands' matrices, and each operand's element stride along the output's
/// batch axes (0 where it broadcasts).
#[derive(Clone, Debug)]
pub struct MatMulGeometry<'a> {
    pub a: Mat,
    pub b: Mat,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// The output's batch dims.
    pub batch: &'a [usize],
    pub a_batch_strides: Dims,
    pub b_batch_strides: Dims,
}

impl<'a> MatMulGeometry<'a> {
    pub fn new(ta: bool, tb: bool, ad: &[usize], bd: &[usize], od: &'a [usize]) -> Result<MatMulGeometry<'a>> {
        const OP: &str = "MatMul";
        if ad.len() < 2 || bd.len() < 2 || od.len() < 2 {
            return Err(Error::shape(OP, "operands and output need rank >= 2"));
        }
        let (a, b) = (Mat::new(ad, ta), Mat::new(bd, tb));
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let ro = od.len();
        if b.rows != k || od[ro - 2] != m || od[ro - 1] != n {
            return Err(Error::shape(
                OP,
                format!("{} x {} (transposed: {ta}, {tb}) cannot give {}", fmt_dims(ad), fmt_dims(bd), fmt_dims(od)),
            ));
        }
        let batch = &od[..ro - 2];
        let a_batch_strides = broadcast_to(OP, &ad[..ad.len() - 2], batch)?.iter().map(|s| s * m * k).collect();
        let b_batch_strides = broadcast_to(OP, &bd[..bd.len() - 2], batch)?.iter().map(|s| s * k * n).collect();
        Ok(MatMulGeometry { a, b, m, k, n, batch, a_batch_strides, b_batch_strides })
    }

    pub fn batches(&self) -> usize {
        self.batch.iter().product()
    }
}

/// The state buffers `upd` reads and writes, checked against those given.
pub fn update_state_count(upd: &ParamUpdate, given: usize) -> Result<usize> {
    let needed = match *upd {
        ParamUpdate::Sgd { momentum, .. } => usize::from(momentum != 0.0),
        ParamUpdate::Adam { .. } => 2,
    };
    if given < needed {
        return Err(Error::backend("update_param", format!("{needed} state buffers needed, {given} given")));
    }
    Ok(needed)
}

/// (outer, size, inner) of `dims` around `axis`.
pub fn split_at_axis(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (dims[..axis].iter().product(), dims[axis], dims[axis + 1..].iter().product())
}

/// The (outer, length, inner) split of a CumSum along `axis` of `x` into
/// `out`: same dims and dtype, an axis inside the rank.
pub fn scan(
    axis: usize,
    x: &[usize],
    x_dtype: DType,
    out: &[usize],
    out_dtype: DType,
) -> Result<(usize, usize, usize)> {
    if axis >= x.len() || x != out || x_dtype != out_dtype {
        return Err(Error::shape(
            "CumSum",
            format!("axis {axis} of {x_dtype} {} does not give {out_dtype} {}", fmt_dims(x), fmt_dims(out)),
        ));
    }
    Ok(split_at_axis(x, axis))
}

/// The (rows, row length) of a TopK of `x` into `out`: rank >= 1, `out`
/// is `x` with its last axis k <= that length, i32, and x numeric.
pub fn top_k(k: usize, x: &[usize], x_dtype: DType, out: &[usize], out_dtype: DType) -> Result<(usize, usize)> {
    let len = x.last().copied().unwrap_or(0);
    if x.is_empty() || k > len || out != with_axis(x, x.len() - 1, k).as_slice() {
        return Err(Error::shape(
            "TopK",
            format!("{k} of the last axis of {} does not give {}", fmt_dims(x), fmt_dims(out)),
        ));
    }
    if x_dtype == DType::Bool || out_dtype != DType::I32 {
        return Err(Error::dtype("TopK", format!("takes f32, f64 or i32 and gives i32, not {x_dtype} -> {out_dtype}")));
    }
    let rows = if len == 0 { 0 } else { x.iter().product::<usize>() / len };
    Ok((rows, len))
}

/// `dims` with dims[axis] replaced by `len`.
pub fn with_axis(dims: &[usize], axis: usize, len: usize) -> Dims {
    let mut d: Dims = dims.into();
    d[axis] = len;
    d
}

/// An index operand of IndexSelect/ScatterAdd must be a 1-D i32 vector (its
/// values are checked against the axis by the backend, where they live).
pub fn index_vector(op: &'static str, dtype: DType, dims: &[usize]) -> Result<()> {
    if dtype != DType::I32 || dims.len() != 1 {
        return Err(Error::dtype(op, format!("the index must be a 1-D i32 vector, not {dtype} {}", fmt_dims(dims))));
    }
    Ok(())
}

/// Window positions (oh, ow) of `window` over an (h, w) image.
pub fn window_output(op: &'static str, window: &Window2d, h: usize, w: usize) -> Result<[usize; 2]> {
    window
        .output_size([h, w])
        .ok_or_else(|| Error::shape(op, format!("window {window:?} does not fit a {h}x{w} image")))
}

/// The error of a window op whose input dims do not give its output dims.
pub fn window_mismatch(op: &'static str, dims: &[usize], out: &[usize]) -> Error {
    Error::shape(op, format!("input {} does not give output {}", fmt_dims(dims), fmt_dims(out)))
}

/// The (rows per matrix, row length) of a CausalSoftmax of `x` into `out`:
/// rank >= 2, same dims, one float dtype.
pub fn causal_softmax(
    op: &'static str,
    x: &[usize],
    x_dtype: DType,
    out: &[usize],
    out_dtype: DType,
) -> Result<(usize, usize)> {
    if x.len() < 2 || x != out {
        return Err(Error::shape(op, format!("input {} does not give output {}", fmt_dims(x), fmt_dims(out))));
    }
    if !x_dtype.is_float() || x_dtype != out_dtype {
        return Err(Error::dtype(op, format!("needs one float dtype, got {x_dtype} into {out_dtype}")));
    }
    Ok((x[x.len() - 2], x[x.len() - 1]))
}

/// The row length of a LayerNorm (one input) or LayerNormBackward (x and
/// its gradient) into `out`: every operand of `out`'s dims, rank >= 1, one
/// float dtype; a row of 0 elements only in an empty tensor.
pub fn layer_norm(op: &'static str, inputs: &[(&[usize], DType)], out: &[usize], out_dtype: DType) -> Result<usize> {
    for &(dims, dtype) in inputs {
        if dims.is_empty() || dims != out {
            return Err(Error::shape(op, format!("input {} does not give output {}", fmt_dims(dims), fmt_dims(out))));
        }
        if !dtype.is_float() || dtype != out_dtype {
            return Err(Error::dtype(op, format!("needs one float dtype, got {dtype} into {out_dtype}")));
        }
    }
    Ok(out.last().copied().unwrap_or(0))
}

/// How many leading keys row `row` of a CausalSoftmax keeps: the j in
/// 0..cols with j - row <= diagonal.
#[inline]
pub fn causal_kept(row: usize, cols: usize, diagonal: i32) -> usize {
    (row as i64 + diagonal as i64 + 1).clamp(0, cols as i64) as usize
}
