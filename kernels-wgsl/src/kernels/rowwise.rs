//! Launches rowwise.wgsl: CausalSoftmax (f32), with the CPU backend's
//! shape checks.

use kiln_core::backend::{checks, TensorRef};
use kiln_core::{DType, Result};

use super::unsupported_dtype;
use crate::geometry::word;
use crate::params::{words, Rowwise};
use crate::shaders::Kernel;
use crate::{Arg, WgpuBackend};

/// Rows shorter than this are done by one thread each (`serial`, the CPU's
/// order); longer ones by a workgroup each (`tree`).
const TREE_FROM: usize = 128;

pub(crate) fn causal_softmax(
    be: &WgpuBackend,
    diagonal: i32,
    [x]: &[TensorRef<'_>; 1],
    out: &TensorRef<'_>,
) -> Result<()> {
    const OP: &str = "CausalSoftmax";
    let (l, s) = checks::causal_softmax(OP, x.dims, x.dtype, out.dims, out.dtype)?;
    if x.dtype != DType::F32 {
        return Err(unsupported_dtype(OP, x.dtype));
    }
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    // The kernel computes i + diagonal + 1 and clamps to S in i32.
    let (l32, s32) = (word(OP, l)?, word(OP, s)?);
    if l32 > i32::MAX as u32 / 2 || s32 > i32::MAX as u32 || diagonal.unsigned_abs() > i32::MAX as u32 / 2 {
        return Err(kiln_core::Error::unsupported(OP, "rows or diagonal exceed the kernel's i32 arithmetic"));
    }
    word(OP, n)?;
    let rows = n / s;
    let params = Rowwise { rows: word(OP, rows)?, l: l32, s: s32, diagonal };
    let (entry, groups) =
        if s < TREE_FROM { ("serial", be.grid_for(OP, rows)?) } else { ("tree", be.ctx().grid(OP, rows as u64)?) };
    let args = [(1, Arg::input(x)), (2, Arg::output(out))];
    be.launch(OP, Kernel::Rowwise, entry, &args, words(&params), groups)
}
