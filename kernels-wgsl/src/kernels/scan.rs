//! Launches scan.wgsl: CumSum (f32, i32), with the CPU backend's shape
//! check. One invocation per line, adding in the CPU's order, one
//! dispatch per segment of the lines.

use kiln_core::backend::{checks, TensorRef};
use kiln_core::Result;

use super::{segments, ty, unsupported_dtype};
use crate::geometry::word;
use crate::params::{words, Scan};
use crate::shaders::{Kernel, Ty};
use crate::{Arg, WgpuBackend};

pub(crate) fn cumsum(
    be: &WgpuBackend,
    axis: usize,
    exclusive: bool,
    reverse: bool,
    [x]: &[TensorRef<'_>; 1],
    out: &TensorRef<'_>,
) -> Result<()> {
    const OP: &str = "CumSum";
    let (outer, len, inner) = checks::scan(axis, x.dims, x.dtype, out.dims, out.dtype)?;
    let t = ty(out.dtype);
    if t == Ty::U32 {
        return Err(unsupported_dtype(OP, out.dtype));
    }
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    word(OP, n)?;
    let lines = outer * inner;
    let flags = u32::from(exclusive) | u32::from(reverse) << 1;
    let (lines, len, inner) = (word(OP, lines)?, word(OP, len)?, word(OP, inner)?);
    let args = [(1, Arg::input(x)), (2, Arg::output(out))];
    let grid = be.grid_for(OP, lines as usize)?;
    for (start, count) in segments(len) {
        let params = Scan { lines, len, inner, flags, start, count };
        be.launch(OP, Kernel::Scan(t), "main", &args, words(&params), grid)?;
    }
    Ok(())
}
