//! Launches reduce.wgsl: the input's axes split into kept and reduced
//! groups (each collapsed on the host), one output per kept index.

use kiln_core::backend::TensorRef;
use kiln_core::op::ReduceOp;
use kiln_core::shape::{fmt_dims, AxisSet};
use kiln_core::{DType, Error, Result};

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
    if out.numel() != outputs {
        return Err(Error::shape(
            name,
            format!(
                "reducing {} over {:?} gives {outputs} elements, the output has {}",
                fmt_dims(x.dims),
                axes,
                out.numel()
            ),
        ));
    }
    let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
    if block == 0 && outputs > 0 && !matches!(op, ReduceOp::Sum | ReduceOp::Prod) {
        return Err(Error::invalid(name, format!("{name} of an empty block (input {})", fmt_dims(x.dims))));
    }
    if arg && out.dtype != DType::I32 {
        return Err(Error::backend(name, "ArgMax/ArgMin write i32"));
    }
    if !arg && x.dtype != out.dtype {
        return Err(Error::backend(name, "the output dtype differs from the input's"));
    }
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
