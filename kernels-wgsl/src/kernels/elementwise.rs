//! Launches fill.wgsl (Full, Arange), unary.wgsl, binary.wgsl (binary ops
//! and comparisons), where.wgsl and cast.wgsl.

use kiln_core::backend::checks::broadcast_to;
use kiln_core::backend::TensorRef;
use kiln_core::op::{BinaryOp, CompareOp, UnaryOp};
use kiln_core::shape::contiguous_strides;
use kiln_core::{DType, Error, Result};

use super::{ty, unsupported_dtype};
use crate::geometry::{strided, word};
use crate::params::{words, Count, Fill};
use crate::shaders::{self, Kernel};
use crate::{Arg, WgpuBackend};

/// Write `bits` (a value already in the output's storage type) everywhere.
pub(crate) fn fill(be: &WgpuBackend, op: &'static str, bits: u32, out: &TensorRef<'_>) -> Result<()> {
    let n = out.numel();
    let params = Fill { n: word(op, n)?, arange: 0, value: bits, ..Fill::default() };
    be.launch(op, Kernel::Fill(ty(out.dtype)), "main", &[(1, Arg::output(out))], words(&params), be.grid_for(op, n)?)
}

pub(crate) fn full(be: &WgpuBackend, v: f64, out: &TensorRef<'_>) -> Result<()> {
    // The CPU's conversion (`Scalar::from_f64`): Rust `as`, bool as != 0.
    let bits = match out.dtype {
        DType::F32 => (v as f32).to_bits(),
        DType::I32 => (v as i32) as u32,
        _ => u32::from(v != 0.0),
    };
    fill(be, "Full", bits, out)
}

pub(crate) fn arange(be: &WgpuBackend, start: f64, step: f64, out: &TensorRef<'_>) -> Result<()> {
    const OP: &str = "Arange";
    let n = out.numel();
    let last = start + n.saturating_sub(1) as f64 * step;
    let in_i32 = |v: f64| v.fract() == 0.0 && v >= i32::MIN as f64 && v <= i32::MAX as f64;
    // Integer outputs of integer sequences are computed exactly in i32.
    let exact = out.dtype != DType::F32 && in_i32(start) && in_i32(step) && in_i32(last);
    let params = Fill {
        n: word(OP, n)?,
        arange: 1,
        value: 0,
        start: start as f32,
        step: step as f32,
        exact: u32::from(exact),
        start_i: start as i32,
        step_i: step as i32,
    };
    be.launch(OP, Kernel::Fill(ty(out.dtype)), "main", &[(1, Arg::output(out))], words(&params), be.grid_for(OP, n)?)
}

pub(crate) fn unary(be: &WgpuBackend, u: UnaryOp, [x]: &[TensorRef<'_>; 1], out: &TensorRef<'_>) -> Result<()> {
    let name = u.name();
    if x.numel() != out.numel() || x.dtype != out.dtype {
        return Err(Error::backend(name, "input and output differ in size or dtype"));
    }
    let t = ty(out.dtype);
    if shaders::unary_expr(u, t).is_none() {
        return Err(unsupported_dtype(name, out.dtype));
    }
    let n = out.numel();
    let args = [(1, Arg::input(x)), (2, Arg::output(out))];
    let params = Count { n: word(name, n)? };
    be.launch(name, Kernel::Unary(u, t), "main", &args, words(&params), be.grid_for(name, n)?)
}

/// Launch binary.wgsl's variant `kernel` on a and b broadcast to out.
fn zip(
    be: &WgpuBackend,
    op: &'static str,
    kernel: Kernel,
    a: &TensorRef<'_>,
    b: &TensorRef<'_>,
    out: &TensorRef<'_>,
) -> Result<()> {
    let sa = broadcast_to(op, a.dims, out.dims)?;
    let sb = broadcast_to(op, b.dims, out.dims)?;
    let params = strided(op, out.dims, &[(0, &sa), (0, &sb)])?;
    let args = [(1, Arg::input(a)), (2, Arg::input(b)), (3, Arg::output(out))];
    be.launch_strided(op, kernel, &args, words(&params), out.numel())
}

pub(crate) fn binary(be: &WgpuBackend, op: BinaryOp, [a, b]: &[TensorRef<'_>; 2], out: &TensorRef<'_>) -> Result<()> {
    let name = op.name();
    if a.dtype != out.dtype || b.dtype != out.dtype {
        return Err(Error::backend(name, "operand dtypes differ from the output's"));
    }
    let t = ty(out.dtype);
    if shaders::binary_expr(op, t).is_none() {
        return Err(unsupported_dtype(name, out.dtype));
    }
    zip(be, name, Kernel::Binary(op, t), a, b, out)
}

pub(crate) fn compare(be: &WgpuBackend, op: CompareOp, [a, b]: &[TensorRef<'_>; 2], out: &TensorRef<'_>) -> Result<()> {
    let name = op.name();
    if a.dtype != b.dtype || out.dtype != DType::Bool {
        return Err(Error::backend(name, "compare needs operands of one dtype and a bool output"));
    }
    zip(be, name, Kernel::Compare(op, ty(a.dtype)), a, b, out)
}

pub(crate) fn where_(be: &WgpuBackend, [c, a, b]: &[TensorRef<'_>; 3], out: &TensorRef<'_>) -> Result<()> {
    const OP: &str = "Where";
    if c.dtype != DType::Bool || a.dtype != out.dtype || b.dtype != out.dtype {
        return Err(Error::backend(OP, "where needs a bool condition and a, b of the output dtype"));
    }
    let sc = broadcast_to(OP, c.dims, out.dims)?;
    let sa = broadcast_to(OP, a.dims, out.dims)?;
    let sb = broadcast_to(OP, b.dims, out.dims)?;
    let params = strided(OP, out.dims, &[(0, &sc), (0, &sa), (0, &sb)])?;
    let args = [(1, Arg::input(c)), (2, Arg::input(a)), (3, Arg::input(b)), (4, Arg::output(out))];
    be.launch_strided(OP, Kernel::Where(ty(out.dtype)), &args, words(&params), out.numel())
}

pub(crate) fn cast(be: &WgpuBackend, [x]: &[TensorRef<'_>; 1], out: &TensorRef<'_>) -> Result<()> {
    const OP: &str = "Cast";
    if x.numel() != out.numel() {
        return Err(Error::backend(OP, "input and output differ in size"));
    }
    let n = out.numel();
    let kernel = Kernel::Cast(ty(x.dtype), ty(out.dtype));
    let args = [(1, Arg::input(x)), (2, Arg::output(out))];
    let params = Count { n: word(OP, n)? };
    be.launch(OP, kernel, "main", &args, words(&params), be.grid_for(OP, n)?)
}

/// Contiguous strides as a Vec (the geometry helpers take slices).
pub(crate) fn contiguous(dims: &[usize]) -> Vec<usize> {
    contiguous_strides(dims).to_vec()
}
