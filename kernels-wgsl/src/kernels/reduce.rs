//! Launches reduce.wgsl: the input's axes split into kept and reduced
//! groups (each collapsed on the host), one output per kept index, long
//! blocks reduced over several workgroups and passes in the summation rule's
//! order (docs/reductions.md).

use kiln_core::backend::BufferId;
use kiln_core::backend::{checks, TensorRef};
use kiln_core::op::ReduceOp;
use kiln_core::shape::AxisSet;
use kiln_core::{DType, Result};

use super::elementwise::contiguous;
use super::{ty, unsupported_dtype};
use crate::geometry::{group, word};
use crate::params::{words, Reduce};
use crate::shaders::{Kernel, Ty};
use crate::{Arg, WgpuBackend};

/// Elements of one leaf of the rule (LEAF in reduce.wgsl; the CPU's
/// `reduce::LEAF`). Blocks of at most one leaf are folded by one thread per
/// output (`serial`, the CPU's order and bits).
const LEAF: usize = 128;
/// Most leaves per output that `serial_leaves` folds in one thread (its
/// stack holds SERIAL_DEPTH = 8 partials, enough for 128 leaves); past
/// this a workgroup per output spreads the work.
const SERIAL_LEAVES: usize = 8;
/// Leaves (first pass) or partials (later passes) one workgroup combines.
const FAN_IN: usize = crate::shaders::WG as usize;

pub(crate) fn reduce(
    be: &WgpuBackend,
    op: ReduceOp,
    axes: AxisSet,
    [x]: &[TensorRef<'_>; 1],
    out: &TensorRef<'_>,
) -> Result<()> {
    let (name, kernel) = (op.name(), Kernel::Reduce(op, ty(x.dtype)));
    schedule(be, op, axes, (x.dims, x.dtype), out, |entry, sink, params, grid| {
        be.launch(name, kernel, entry, &[(1, Arg::input(x)), sink], words(params), grid)
    })
}

/// Check a reduction of a value of `dims` and `dtype` into `out` and record
/// its dispatches. `first` records each dispatch that reads the value's
/// elements (entry points `serial`, `serial_leaves`, `leaves_to_*`; binding
/// 1 in reduce.wgsl, or a fused prologue computing them: fused/tail.rs),
/// given the entry point, the binding it writes (`out` or partials), the
/// parameters and the grid; passes over partials are recorded here.
pub(crate) fn schedule(
    be: &WgpuBackend,
    op: ReduceOp,
    axes: AxisSet,
    (dims, dtype): (&[usize], DType),
    out: &TensorRef<'_>,
    mut first: impl FnMut(&'static str, (u32, Arg), &Reduce, [u32; 3]) -> Result<()>,
) -> Result<()> {
    let name = op.name();
    let rank = dims.len();
    let axes = AxisSet(axes.0 & AxisSet::all(rank).0);
    let strides = contiguous(dims);
    let (mut kd, mut ks, mut rd, mut rs) = (vec![], vec![], vec![], vec![]);
    for (d, (&n, &s)) in dims.iter().zip(&strides).enumerate() {
        let (dims, strides) = if axes.contains(d) { (&mut rd, &mut rs) } else { (&mut kd, &mut ks) };
        dims.push(n);
        strides.push(s);
    }
    let outputs: usize = kd.iter().product();
    let block: usize = rd.iter().product();
    checks::reduction(op, axes, (dims, dtype), (outputs, block), (out.numel(), out.dtype))?;
    let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
    if !arg && ty(dtype) == Ty::U32 {
        return Err(unsupported_dtype(name, dtype));
    }
    let params = Reduce {
        outputs: word(name, outputs)?,
        kept: group(name, &kd, &ks)?,
        reduced: group(name, &rd, &rs)?,
        block: word(name, block)?,
        // Set per pass.
        groups: 0,
        parts: 0,
    };
    if block <= LEAF {
        return first("serial", (2, Arg::output(out)), &params, be.grid_for(name, outputs)?);
    }
    let leaves = block.div_ceil(LEAF);
    if leaves <= SERIAL_LEAVES {
        return first("serial_leaves", (2, Arg::output(out)), &params, be.grid_for(name, outputs)?);
    }
    passes(be, (op, ty(dtype)), out, outputs, leaves, params, first)
}

/// The first pass over the leaves, then passes over partials until one per
/// output remains; partials live in scratch buffers freed once recorded (the
/// recorded dispatches keep them alive until they have run).
fn passes(
    be: &WgpuBackend,
    (op, t): (ReduceOp, Ty),
    out: &TensorRef<'_>,
    outputs: usize,
    leaves: usize,
    mut params: Reduce,
    mut first: impl FnMut(&'static str, (u32, Arg), &Reduce, [u32; 3]) -> Result<()>,
) -> Result<()> {
    let name = op.name();
    let kernel = Kernel::Reduce(op, t);
    let mut items = leaves;
    let mut input: Option<BufferId> = None;
    let result = (|| loop {
        let groups = items.div_ceil(FAN_IN);
        params.groups = word(name, groups)?;
        params.parts = word(name, items)?;
        let total = outputs.checked_mul(groups).ok_or_else(|| too_many(name, outputs, groups))?;
        let grid = be.ctx().grid(name, total as u64)?;
        let parts_in =
            input.map(|id| (4, Arg::Buffer { id, dtype: PART_DTYPE, len: 2 * outputs * items, write: false }));
        if groups == 1 {
            return match parts_in {
                None => first("leaves_to_out", (2, Arg::output(out)), &params, grid),
                Some(source) => {
                    be.launch(name, kernel, "parts_to_out", &[source, (2, Arg::output(out))], words(&params), grid)
                }
            };
        }
        let len = 2 * total;
        let parts = be.scratch(PART_DTYPE, len)?;
        let sink = (3, Arg::Buffer { id: parts, dtype: PART_DTYPE, len, write: true });
        let launched = match parts_in {
            None => first("leaves_to_parts", sink, &params, grid),
            Some(source) => be.launch(name, kernel, "parts_to_parts", &[source, sink], words(&params), grid),
        };
        if let Some(old) = input.replace(parts) {
            be.free_scratch(old);
        }
        launched?;
        items = groups;
    })();
    if let Some(id) = input {
        be.free_scratch(id);
    }
    result
}

/// Partials travel as pairs of u32 words (value bits, element index); the
/// buffers are allocated as i32, which has the same word size.
const PART_DTYPE: DType = DType::I32;

fn too_many(name: &'static str, outputs: usize, groups: usize) -> kiln_core::Error {
    kiln_core::Error::unsupported(name, format!("{outputs} outputs x {groups} workgroups overflow"))
}
