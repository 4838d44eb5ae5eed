//! Launches movement.wgsl (the strided word copy) for Permute, Expand,
//! Slice, SliceBackward and Concat; Reshape is a buffer copy.

use kiln_core::backend::{checks, TensorRef};
use kiln_core::op::{Perm, SliceAttr};
use kiln_core::shape::fmt_dims;
use kiln_core::{Error, Result};

use super::elementwise::{contiguous, fill};
use crate::geometry::strided;
use crate::params::words;
use crate::shaders::Kernel;
use crate::{Arg, WgpuBackend};

/// dst[dst_base + i . dst_strides] = src[src_base + i . src_strides] over `dims`.
fn copy(
    be: &WgpuBackend,
    op: &'static str,
    dims: &[usize],
    (src, src_base, src_strides): (&TensorRef<'_>, usize, &[usize]),
    (dst, dst_base, dst_strides): (&TensorRef<'_>, usize, &[usize]),
) -> Result<()> {
    if src.dtype != dst.dtype {
        return Err(Error::backend(op, "input and output dtypes differ"));
    }
    let params = strided(op, dims, &[(src_base, src_strides), (dst_base, dst_strides)])?;
    let args = [(1, Arg::input(src)), (2, Arg::output(dst))];
    be.launch_strided(op, Kernel::Copy, &args, words(&params), dims.iter().product())
}

/// Read `x` through (base, strides) into the contiguous output.
fn gather(
    be: &WgpuBackend,
    op: &'static str,
    x: &TensorRef<'_>,
    base: usize,
    strides: &[usize],
    out: &TensorRef<'_>,
) -> Result<()> {
    copy(be, op, out.dims, (x, base, strides), (out, 0, &contiguous(out.dims)))
}

pub(crate) fn reshape(be: &WgpuBackend, [x]: &[TensorRef<'_>; 1], out: &TensorRef<'_>) -> Result<()> {
    const OP: &str = "Reshape";
    if x.numel() != out.numel() || x.dtype != out.dtype {
        return Err(Error::shape(OP, format!("cannot reshape {} to {}", fmt_dims(x.dims), fmt_dims(out.dims))));
    }
    be.record_copy(OP, x.buffer, out.buffer, out.numel())
}

pub(crate) fn permute(be: &WgpuBackend, perm: &Perm, [x]: &[TensorRef<'_>; 1], out: &TensorRef<'_>) -> Result<()> {
    const OP: &str = "Permute";
    let strides = checks::permute_strides(perm, x.dims, out.dims)?;
    gather(be, OP, x, 0, &strides, out)
}

pub(crate) fn expand(be: &WgpuBackend, [x]: &[TensorRef<'_>; 1], out: &TensorRef<'_>) -> Result<()> {
    let strides = checks::broadcast_to("Expand", x.dims, out.dims)?;
    gather(be, "Expand", x, 0, &strides, out)
}

pub(crate) fn slice(be: &WgpuBackend, spec: &SliceAttr, [x]: &[TensorRef<'_>; 1], out: &TensorRef<'_>) -> Result<()> {
    const OP: &str = "Slice";
    let (base, strides) = checks::slice_view(OP, spec, x.dims, out.dims)?;
    if out.numel() == 0 {
        return Ok(());
    }
    gather(be, OP, x, base, &strides, out)
}

pub(crate) fn slice_backward(
    be: &WgpuBackend,
    spec: &SliceAttr,
    [g]: &[TensorRef<'_>; 1],
    out: &TensorRef<'_>,
) -> Result<()> {
    const OP: &str = "SliceBackward";
    let (base, strides) = checks::slice_view(OP, spec, out.dims, g.dims)?;
    if g.dtype != out.dtype {
        return Err(Error::backend(OP, "input and output dtypes differ"));
    }
    // Zeros, then the gradient at the sliced positions (distinct, since
    // step >= 1); the two dispatches run in order.
    fill(be, OP, 0, out)?;
    copy(be, OP, g.dims, (g, 0, &contiguous(g.dims)), (out, base, &strides))
}

pub(crate) fn concat(be: &WgpuBackend, axis: usize, ins: &[TensorRef<'_>], out: &TensorRef<'_>) -> Result<()> {
    const OP: &str = "Concat";
    let od = out.dims;
    checks::concat(axis, ins.iter().map(|x| (x.dims, x.dtype)), (od, out.dtype))?;
    let os = contiguous(od);
    let mut at = 0;
    for x in ins {
        copy(be, OP, x.dims, (x, 0, &contiguous(x.dims)), (out, at * os[axis], &os))?;
        at += x.dims[axis];
    }
    Ok(())
}
