//! Launches index.wgsl: IndexSelect and ScatterAdd, each preceded by the
//! range check of its index vector (a status slot read back after the
//! execution, so a bad index is an OutOfRange error naming the op, as on the
//! CPU — reported when the execution is flushed rather than at the kernel).

use kiln_core::backend::checks::{self, split_at_axis as split, with_axis};
use kiln_core::backend::TensorRef;
use kiln_core::shape::fmt_dims;
use kiln_core::{Error, Result};

use super::{ty, unsupported_dtype};
use crate::batch::CheckMeta;
use crate::geometry::word;
use crate::params::{words, Index};
use crate::shaders::{Kernel, Ty};
use crate::{Arg, WgpuBackend};

/// Check the index vector's type and record its range check.
fn check(be: &WgpuBackend, op: &'static str, idx: &TensorRef<'_>, axis: usize, size: usize) -> Result<usize> {
    checks::index_vector(op, idx.dtype, idx.dims)?;
    let count = idx.numel();
    if count > 0 {
        let slot = be.push_check(CheckMeta { op, axis, size });
        let params = Index { count: word(op, count)?, size: word(op, size)?, slot, ..Index::default() };
        let args = [(2, Arg::input(idx)), (5, Arg::Status)];
        be.launch(op, Kernel::Index(Ty::U32), "check", &args, words(&params), [1, 1, 1])?;
    }
    Ok(count)
}

pub(crate) fn index_select(
    be: &WgpuBackend,
    axis: usize,
    [x, idx]: &[TensorRef<'_>; 2],
    out: &TensorRef<'_>,
) -> Result<()> {
    const OP: &str = "IndexSelect";
    if axis >= x.dims.len() || x.dtype != out.dtype {
        return Err(Error::shape(OP, format!("axis {axis} of {} {}", x.dtype, fmt_dims(x.dims))));
    }
    let (_, size, inner) = split(x.dims, axis);
    let count = check(be, OP, idx, axis, size)?;
    if out.dims != with_axis(x.dims, axis, count).as_slice() {
        return Err(Error::shape(
            OP,
            format!("selecting {count} along axis {axis} of {} does not give {}", fmt_dims(x.dims), fmt_dims(out.dims)),
        ));
    }
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let params = gather_params(OP, n, size, count, inner)?;
    // Words are moved as u32 whatever the dtype: bind the operands as such.
    let args = [(1, Arg::input(x)), (2, Arg::input(idx)), (4, Arg::output(out))];
    be.launch(OP, Kernel::Index(Ty::U32), "gather", &args, words(&params), be.grid_for(OP, n)?)
}

pub(crate) fn scatter_add(
    be: &WgpuBackend,
    axis: usize,
    [dest, idx, src]: &[TensorRef<'_>; 3],
    out: &TensorRef<'_>,
) -> Result<()> {
    const OP: &str = "ScatterAdd";
    if axis >= dest.dims.len() || dest.dtype != out.dtype || src.dtype != out.dtype || dest.dims != out.dims {
        return Err(Error::shape(
            OP,
            format!("axis {axis} of {} {} into {}", dest.dtype, fmt_dims(dest.dims), fmt_dims(out.dims)),
        ));
    }
    let t = ty(out.dtype);
    if t == Ty::U32 {
        return Err(unsupported_dtype(OP, out.dtype));
    }
    let (_, size, inner) = split(dest.dims, axis);
    let count = check(be, OP, idx, axis, size)?;
    if src.dims != with_axis(dest.dims, axis, count).as_slice() {
        return Err(Error::shape(
            OP,
            format!(
                "source {} does not fit {} with {count} indices along axis {axis}",
                fmt_dims(src.dims),
                fmt_dims(dest.dims)
            ),
        ));
    }
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let params = gather_params(OP, n, size, count, inner)?;
    let args = [(1, Arg::input(src)), (2, Arg::input(idx)), (3, Arg::input(dest)), (4, Arg::output(out))];
    be.launch(OP, Kernel::Index(t), "scatter", &args, words(&params), be.grid_for(OP, n)?)
}

/// The parameters of `gather` and `scatter`.
fn gather_params(op: &'static str, n: usize, size: usize, count: usize, inner: usize) -> Result<Index> {
    Ok(Index { n: word(op, n)?, size: word(op, size)?, count: word(op, count)?, inner: word(op, inner)?, slot: 0 })
}
