//! Launches select.wgsl: TopK (f32, i32 input; i32 positions), with the
//! CPU backend's shape check. One invocation per row, in the CPU's order;
//! one dispatch per (position, segment of the rows), so k · ⌈len / 4096⌉
//! dispatches: fine for the k of sampling and of accuracy@k, slow for a
//! full sort of long rows.

use kiln_core::backend::{checks, TensorRef};
use kiln_core::Result;

use super::{segments, unsupported_dtype};
use crate::geometry::word;
use crate::params::{words, Select};
use crate::shaders::{Kernel, Ty};
use crate::{Arg, WgpuBackend};

pub(crate) fn top_k(
    be: &WgpuBackend,
    k: usize,
    largest: bool,
    [x]: &[TensorRef<'_>; 1],
    out: &TensorRef<'_>,
) -> Result<()> {
    const OP: &str = "TopK";
    let (rows, len) = checks::top_k(k, x.dims, x.dtype, out.dims, out.dtype)?;
    let Some(t) = Ty::of(x.dtype).filter(|&t| t != Ty::U32) else {
        return Err(unsupported_dtype(OP, x.dtype));
    };
    if out.numel() == 0 {
        return Ok(());
    }
    word(OP, x.numel())?;
    let (rows32, len, k) = (word(OP, rows)?, word(OP, len)?, word(OP, k)?);
    let args = [(1, Arg::input(x)), (2, Arg::output(out))];
    let grid = be.grid_for(OP, rows)?;
    for p in 0..k {
        for (start, count) in segments(len) {
            let params = Select { rows: rows32, len, k, largest: u32::from(largest), p, start, count };
            be.launch(OP, Kernel::Select(t), "main", &args, words(&params), grid)?;
        }
    }
    Ok(())
}
