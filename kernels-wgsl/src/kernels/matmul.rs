//! Launches matmul.wgsl: operand geometry (transposes as strides, broadcast
//! batch axes) computed on the host, batches over the z limit split into
//! several dispatches.

use kiln_core::backend::checks::MatMulGeometry;
use kiln_core::backend::TensorRef;
use kiln_core::shape::fmt_dims;
use kiln_core::{DType, Error, Result};

use super::unsupported_dtype;
use crate::geometry::word;
use crate::shaders::{Kernel, MAX_DIMS};
use crate::{Arg, WgpuBackend};

const OP: &str = "MatMul";
/// Output tile edge of one workgroup (TILE in matmul.wgsl).
const TILE: usize = 64;

pub(crate) fn matmul(
    be: &WgpuBackend,
    ta: bool,
    tb: bool,
    [a, b]: &[TensorRef<'_>; 2],
    out: &TensorRef<'_>,
) -> Result<()> {
    if a.dtype != out.dtype || b.dtype != out.dtype {
        return Err(Error::backend(OP, "operand dtypes differ from the output's"));
    }
    if out.dtype != DType::F32 {
        return Err(unsupported_dtype(OP, out.dtype));
    }
    let g = MatMulGeometry::new(ta, tb, a.dims, b.dims, out.dims)?;
    let (m, k, n) = (g.m, g.k, g.n);
    let (ma, mb, bo, sa, sb) = (g.a, g.b, g.batch, &g.a_batch_strides, &g.b_batch_strides);
    // Batch axes that are broadcast in both operands need no unravelling
    // apart; merge what can be merged.
    let (cd, cs) = crate::geometry::collapse(bo, &[sa, sb]);
    if cd.len() > MAX_DIMS {
        return Err(Error::unsupported(
            OP,
            format!("more than {MAX_DIMS} unmergeable batch axes in {}", fmt_dims(out.dims)),
        ));
    }
    let batches = g.batches();
    if out.numel() == 0 {
        return Ok(());
    }
    let mut params = vec![0u32; 33];
    for (i, v) in [m, n, k, ma.rs, ma.cs, mb.rs, mb.cs].into_iter().enumerate() {
        params[i] = word(OP, v)?;
    }
    params[7] = cd.len() as u32;
    for d in 0..cd.len() {
        params[8 + d] = word(OP, cd[d])?;
        params[16 + d] = word(OP, cs[0][d])?;
        params[24 + d] = word(OP, cs[1][d])?;
    }
    let gx = word(OP, n.div_ceil(TILE))?;
    let gy = word(OP, m.div_ceil(TILE))?;
    let max_z = be.ctx().limits.max_compute_workgroups_per_dimension.max(1) as usize;
    if gx as usize > max_z || gy as usize > max_z {
        return Err(Error::unsupported(OP, format!("{m} x {n} outputs exceed this adapter's dispatch grid")));
    }
    let args = [(1, Arg::input(a)), (2, Arg::input(b)), (3, Arg::output(out))];
    let mut first = 0;
    while first < batches {
        let count = (batches - first).min(max_z);
        params[32] = word(OP, first)?;
        be.launch(OP, Kernel::MatMul, "main", &args, &params, [gx, gy, count as u32])?;
        first += count;
    }
    Ok(())
}
