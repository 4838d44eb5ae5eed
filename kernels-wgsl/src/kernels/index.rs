//! Launches index.wgsl: IndexSelect and ScatterAdd, each preceded by the
//! range check of its index vector (a status slot read back after the
//! execution, so a bad index is an OutOfRange error naming the op, as on the
//! CPU — reported when the execution is flushed rather than at the kernel).

use kiln_core::backend::checks::{self, split_at_axis as split, with_axis};
use kiln_core::backend::{BufferId, TensorRef};
use kiln_core::shape::fmt_dims;
use kiln_core::{DType, Error, Result};

use super::{ty, unsupported_dtype};
use crate::batch::CheckMeta;
use crate::geometry::word;
use crate::params::{words, Index};
use crate::shaders::{Kernel, Ty};
use crate::{Arg, WgpuBackend};

/// Source values one invocation folds (the summation rule's leaf; the CPU's
/// `LEAF`, `LEAF` in index.wgsl).
const LEAF: usize = 128;

/// Check the index vector's type and record its range check.
fn check(be: &WgpuBackend, op: &'static str, idx: &TensorRef<'_>, axis: usize, size: usize) -> Result<usize> {
    checks::index_vector(op, idx.dtype, idx.dims)?;
    let count = idx.numel();
    if count > 0 {
        let slot = be.push_check(CheckMeta { op, axis, size });
        let params = Index { count: word(op, count)?, size: word(op, size)?, slot, ..Index::default() };
        let args = [(2, Arg::input(idx)), (5, Arg::Status)];
        // One invocation per index marks the first bad position, then one
        // writes the slot the host reads (see index.wgsl).
        be.launch(op, Kernel::Index(Ty::U32), "check", &args, words(&params), be.grid_for(op, count)?)?;
        be.launch(op, Kernel::Index(Ty::U32), "check_value", &args, words(&params), [1, 1, 1])?;
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
    // Sort (index, position) pairs, find each index's run, then every output
    // adds its own run in position order (see index.wgsl).
    let sorted_len = count.max(1).checked_next_power_of_two().ok_or_else(|| too_many(count))?;
    let keys = be.scratch(DType::I32, 2 * sorted_len)?;
    let buckets = match be.scratch(DType::I32, 2 * size) {
        Ok(id) => id,
        Err(e) => {
            be.free_scratch(keys);
            return Err(e);
        }
    };
    let partials = match be.scratch(out.dtype, src.numel().max(1)) {
        Ok(id) => id,
        Err(e) => {
            be.free_scratch(keys);
            be.free_scratch(buckets);
            return Err(e);
        }
    };
    let scratch = [keys, buckets, partials];
    let result = sorted_scatter(be, scratch, sorted_len, [n, size, count, inner], [src, idx, dest, out], t);
    scratch.into_iter().for_each(|id| be.free_scratch(id));
    result
}

fn too_many(count: usize) -> Error {
    Error::shape("ScatterAdd", format!("{count} indices are too many to sort"))
}

/// The launches of a ScatterAdd once its scratch exists: `keys` holds
/// `sorted_len` (a power of two) (index, position) pairs, `buckets` one
/// (first, end) pair per index value, `partials` one value per source
/// element (the leaf and tree sums of each index's duplicates).
fn sorted_scatter(
    be: &WgpuBackend,
    [keys, buckets, partials]: [BufferId; 3],
    sorted_len: usize,
    [n, size, count, inner]: [usize; 4],
    [src, idx, dest, out]: [&TensorRef<'_>; 4],
    t: Ty,
) -> Result<()> {
    const OP: &str = "ScatterAdd";
    let keys_arg = (6, Arg::Buffer { id: keys, dtype: DType::I32, len: 2 * sorted_len, write: true });
    let buckets_arg = (7, Arg::Buffer { id: buckets, dtype: DType::I32, len: 2 * size, write: true });
    let (sorted, size) = (word(OP, sorted_len)?, word(OP, size)?);
    let base = Index { n: sorted, size, count: word(OP, count)?, ..Index::default() };
    let sort_grid = be.grid_for(OP, sorted_len)?;
    let sorter = Kernel::Index(Ty::U32);
    let init = [(2, Arg::input(idx)), keys_arg];
    be.launch(OP, sorter, "sort_init", &init, words(&base), sort_grid)?;
    // Bitonic sort: merges of length k = 2, 4, .., n, each in steps of
    // partner distance j = k/2, .., 1.
    let mut k = 2;
    while k <= sorted_len {
        let mut j = k / 2;
        while j > 0 {
            let params = Index { j: word(OP, j)?, k: word(OP, k)?, ..base };
            be.launch(OP, sorter, "sort_step", &[keys_arg], words(&params), sort_grid)?;
            j /= 2;
        }
        k *= 2;
    }
    be.launch(OP, sorter, "buckets_clear", &[buckets_arg], words(&base), be.grid_for(OP, size as usize)?)?;
    be.launch(OP, sorter, "buckets_find", &[keys_arg, buckets_arg], words(&base), sort_grid)?;
    // Each index's duplicates summed by the summation rule: leaves of LEAF
    // source values, then the power-of-two tree, one level per launch.
    let m = src.numel();
    let partials_arg = (8, Arg::Buffer { id: partials, dtype: out.dtype, len: m.max(1), write: true });
    let per_source = Index { n: word(OP, m)?, inner: word(OP, inner)?, ..base };
    let grid = be.grid_for(OP, m)?;
    let args = [(1, Arg::input(src)), keys_arg, buckets_arg, partials_arg];
    be.launch(OP, Kernel::Index(t), "leaves", &args, words(&per_source), grid)?;
    let mut j = 1;
    while LEAF * j < count {
        let params = Index { j: word(OP, j)?, ..per_source };
        be.launch(OP, Kernel::Index(t), "tree_level", &[keys_arg, buckets_arg, partials_arg], words(&params), grid)?;
        j *= 2;
    }
    let params = gather_params(OP, n, size as usize, count, inner)?;
    let args = [(3, Arg::input(dest)), (4, Arg::output(out)), buckets_arg, partials_arg];
    be.launch(OP, Kernel::Index(t), "scatter", &args, words(&params), be.grid_for(OP, n)?)
}

/// The parameters of `gather` and `scatter`.
fn gather_params(op: &'static str, n: usize, size: usize, count: usize, inner: usize) -> Result<Index> {
    Ok(Index {
        n: word(op, n)?,
        size: word(op, size)?,
        count: word(op, count)?,
        inner: word(op, inner)?,
        ..Index::default()
    })
}
