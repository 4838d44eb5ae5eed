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
/// Leaves a `leaf_groups` thread folds (GROUP_LEAVES in reduce.wgsl).
const GROUP_LEAVES: usize = 8;
/// Most partials per output `serial_parts` combines (its counter's stack
/// holds SERIAL_DEPTH = 8 partials: 128).
const SERIAL_PARTS: usize = 128;

pub(crate) fn reduce(
    be: &WgpuBackend,
    op: ReduceOp,
    axes: AxisSet,
    [x]: &[TensorRef<'_>; 1],
    out: &TensorRef<'_>,
) -> Result<()> {
    schedule(be, op, axes, (x.dims, x.dtype), out, Elements::Input(x))
}

/// Where the dispatches that read the reduced value's elements (entry
/// points `serial`, `serial_leaves`, `leaves_to_*`) get them.
pub(crate) enum Elements<'a, 'b> {
    /// From this tensor, binding 1 of reduce.wgsl.
    Input(&'a TensorRef<'b>),
    /// Computed by a fused prologue (fused/tail.rs), which records each
    /// such dispatch: given the entry point, the binding it writes (`out`
    /// or partials), the parameters and the grid.
    #[cfg(not(target_arch = "wasm32"))]
    Prologue(&'a mut dyn FnMut(&'static str, (u32, Arg), &Reduce, [u32; 3]) -> Result<()>),
}

impl Elements<'_, '_> {
    /// Record a dispatch of `entry` that reads the elements.
    fn launch(
        &mut self,
        be: &WgpuBackend,
        (name, kernel): (&'static str, Kernel),
        entry: &'static str,
        sink: (u32, Arg),
        params: &Reduce,
        grid: [u32; 3],
    ) -> Result<()> {
        match self {
            Elements::Input(x) => be.launch(name, kernel, entry, &[(1, Arg::input(x)), sink], words(params), grid),
            #[cfg(not(target_arch = "wasm32"))]
            Elements::Prologue(record) => record(entry, sink, params, grid),
        }
    }
}

/// Check a reduction of a value of `dims` and `dtype` into `out` and record
/// its dispatches, those reading the value's elements as `elements` says.
pub(crate) fn schedule(
    be: &WgpuBackend,
    op: ReduceOp,
    axes: AxisSet,
    (dims, dtype): (&[usize], DType),
    out: &TensorRef<'_>,
    mut elements: Elements<'_, '_>,
) -> Result<()> {
    let name = op.name();
    let kernel = Kernel::Reduce(op, ty(dtype));
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
    // Blocks of one leaf or a few: one thread per output.
    let leaves = block.div_ceil(LEAF);
    if leaves <= SERIAL_LEAVES {
        let entry = if block <= LEAF { "serial" } else { "serial_leaves" };
        return elements.launch(be, (name, kernel), entry, (2, Arg::output(out)), &params, be.grid_for(name, outputs)?);
    }
    passes(be, (name, kernel), out, outputs, leaves, params, elements)
}

/// The first pass over the leaves, then passes over partials until one per
/// output remains; partials live in scratch buffers freed once recorded (the
/// recorded dispatches keep them alive until they have run).
fn passes(
    be: &WgpuBackend,
    (name, kernel): (&'static str, Kernel),
    out: &TensorRef<'_>,
    outputs: usize,
    leaves: usize,
    mut params: Reduce,
    mut elements: Elements<'_, '_>,
) -> Result<()> {
    let mut items = leaves;
    let mut input: Option<BufferId> = None;
    let result = (|| {
        if be.eight_per_thread {
            // Software adapters: no workgroup barriers (reduce.wgsl's
            // `leaf_groups` and `serial_parts`).
            let groups = items.div_ceil(GROUP_LEAVES);
            params.groups = word(name, groups)?;
            params.parts = word(name, items)?;
            let total = outputs.checked_mul(groups).ok_or_else(|| too_many(name, outputs, groups))?;
            let parts = be.scratch(PART_DTYPE, 2 * total)?;
            input = Some(parts);
            let sink = (3, Arg::Buffer { id: parts, dtype: PART_DTYPE, len: 2 * total, write: true });
            elements.launch(be, (name, kernel), "leaf_groups", sink, &params, be.grid_for(name, total)?)?;
            items = groups;
            if items <= SERIAL_PARTS {
                params.parts = word(name, items)?;
                let source = (4, Arg::Buffer { id: parts, dtype: PART_DTYPE, len: 2 * total, write: false });
                let args = [source, (2, Arg::output(out))];
                return be.launch(name, kernel, "serial_parts", &args, words(&params), be.grid_for(name, outputs)?);
            }
        }
        workgroup_passes(be, (name, kernel), out, outputs, (&mut items, &mut input), &mut params, &mut elements)
    })();
    if let Some(id) = input {
        be.free_scratch(id);
    }
    result
}

/// The workgroup passes of `passes`: over the leaves when `input` is None,
/// else over the `items` partials per output in `input`, until one remains.
fn workgroup_passes(
    be: &WgpuBackend,
    (name, kernel): (&'static str, Kernel),
    out: &TensorRef<'_>,
    outputs: usize,
    (items, input): (&mut usize, &mut Option<BufferId>),
    params: &mut Reduce,
    elements: &mut Elements<'_, '_>,
) -> Result<()> {
    loop {
        let groups = items.div_ceil(FAN_IN);
        params.groups = word(name, groups)?;
        params.parts = word(name, *items)?;
        let total = outputs.checked_mul(groups).ok_or_else(|| too_many(name, outputs, groups))?;
        let grid = be.ctx().grid(name, total as u64)?;
        // The last pass writes the outputs, the others partials.
        let last = groups == 1;
        let parts = if last { None } else { Some(be.scratch(PART_DTYPE, 2 * total)?) };
        let sink = match parts {
            None => (2, Arg::output(out)),
            Some(id) => (3, Arg::Buffer { id, dtype: PART_DTYPE, len: 2 * total, write: true }),
        };
        let launched = match *input {
            None => {
                let entry = if last { "leaves_to_out" } else { "leaves_to_parts" };
                elements.launch(be, (name, kernel), entry, sink, params, grid)
            }
            Some(id) => {
                let source = (4, Arg::Buffer { id, dtype: PART_DTYPE, len: 2 * outputs * *items, write: false });
                let entry = if last { "parts_to_out" } else { "parts_to_parts" };
                be.launch(name, kernel, entry, &[source, sink], words(params), grid)
            }
        };
        let Some(parts) = parts else { return launched };
        if let Some(old) = input.replace(parts) {
            be.free_scratch(old);
        }
        launched?;
        *items = groups;
    }
}

/// Partials travel as pairs of u32 words (value bits, element index); the
/// buffers are allocated as i32, which has the same word size.
const PART_DTYPE: DType = DType::I32;

fn too_many(name: &'static str, outputs: usize, groups: usize) -> kiln_core::Error {
    kiln_core::Error::unsupported(name, format!("{outputs} outputs x {groups} workgroups overflow"))
}
