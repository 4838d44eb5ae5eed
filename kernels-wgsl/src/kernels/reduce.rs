//! Launches reduce.wgsl: the input's axes split into kept and reduced
//! groups (each collapsed on the host), one output per kept index.

use kiln_core::backend::{checks, TensorRef};
use kiln_core::op::ReduceOp;
use kiln_core::shape::AxisSet;
use kiln_core::Result;

use super::elementwise::contiguous;
use super::{ty, unsupported_dtype};
use crate::geometry::{group, word};
use crate::shaders::{Kernel, Ty};
use crate::{Arg, WgpuBackend};

/// Blocks shorter than this are folded by one thread per output (`serial`,
/// the CPU's order and bits); longer ones by a workgroup per output (`tree`).
const TREE_FROM: usize = 128;

pub(crate) fn reduce(
    be: &WgpuBackend,
    op: ReduceOp,
    axes: AxisSet,
    [x]: &[TensorRef<'_>; 1],
    out: &TensorRef<'_>,
) -> Result<()> {
    let name = op.name();
    let rank = x.dims.len();
    let axes = AxisSet(axes.0 & AxisSet::all(rank).0);
    let strides = contiguous(x.dims);
    let (mut kd, mut ks, mut rd, mut rs) = (vec![], vec![], vec![], vec![]);
    for (d, (&n, &s)) in x.dims.iter().zip(&strides).enumerate() {
        let (dims, strides) = if axes.contains(d) { (&mut rd, &mut rs) } else { (&mut kd, &mut ks) };
        dims.push(n);
        strides.push(s);
    }
    let outputs: usize = kd.iter().product();
    let block: usize = rd.iter().product();
    checks::reduction(op, axes, (x.dims, x.dtype), (outputs, block), (out.numel(), out.dtype))?;
    let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
    if !arg && ty(x.dtype) == Ty::U32 {
        return Err(unsupported_dtype(name, x.dtype));
    }
    let (kr, kdims, kstrides) = group(name, &kd, &ks)?;
    let (rr, rdims, rstrides) = group(name, &rd, &rs)?;
    let mut params = vec![word(name, outputs)?, kr];
    params.extend(kdims);
    params.extend(kstrides);
    params.push(rr);
    params.extend(rdims);
    params.extend(rstrides);
    params.push(word(name, block)?);
    let (entry, groups) = if block < TREE_FROM {
        ("serial", be.grid_for(name, outputs)?)
    } else {
        ("tree", be.ctx().grid(name, outputs as u64)?)
    };
    let args = [(1, Arg::input(x)), (2, Arg::output(out))];
    be.launch(name, Kernel::Reduce(op, ty(x.dtype)), entry, &args, &params, groups)
}
