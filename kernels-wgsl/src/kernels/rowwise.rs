//! Launches rowwise.wgsl: CausalSoftmax (f32), with the CPU backend's
//! shape checks. Rows of at most one leaf go to one thread each; longer rows
//! are reduced by workgroups over several passes (the row maximum, then the
//! sum of exponentials by the summation rule), then normalised one thread per
//! element, so no invocation loops over more than `LEAF` entries.

use kiln_core::backend::{checks, BufferId, TensorRef};
use kiln_core::{DType, Result};

use super::unsupported_dtype;
use crate::geometry::word;
use crate::params::{words, Rowwise};
use crate::shaders::Kernel;
use crate::{Arg, WgpuBackend};

/// Entries of one leaf of the summation rule (LEAF in rowwise.wgsl; the
/// CPU's `reduce::LEAF`). Rows of at most one leaf use `serial`.
const LEAF: usize = 128;
/// Leaves (first pass) or partials (later passes) one workgroup combines.
const FAN_IN: usize = crate::shaders::WG as usize;

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
    let params = Rowwise { rows: word(OP, rows)?, l: l32, s: s32, diagonal, groups: 0, parts: 0 };
    if s <= LEAF {
        let args = [(1, Arg::input(x)), (2, Arg::output(out))];
        return be.launch(OP, Kernel::Rowwise, "serial", &args, words(&params), be.grid_for(OP, rows)?);
    }
    let row_max = stage(be, Stage::Max, x, None, rows, s.div_ceil(LEAF), params)?;
    let result = stage(be, Stage::Sum, x, Some(row_max), rows, s.div_ceil(LEAF), params).and_then(|row_sum| {
        let args = [
            (1, Arg::input(x)),
            (5, per_row(row_max, rows, false)),
            (6, per_row(row_sum, rows, false)),
            (2, Arg::output(out)),
        ];
        let launched = be.launch(OP, Kernel::Rowwise, "normalise", &args, words(&params), be.grid_for(OP, n)?);
        be.free_scratch(row_sum);
        launched
    });
    be.free_scratch(row_max);
    result
}

#[derive(Clone, Copy)]
enum Stage {
    Max,
    Sum,
}

/// `values` f32 per row in a scratch buffer.
fn per_row(id: BufferId, values: usize, write: bool) -> Arg {
    Arg::Buffer { id, dtype: DType::F32, len: values, write }
}

/// One reduction stage over `leaves` leaves per row: the leaf pass, then
/// passes over partials until one per row remains, returned in a scratch
/// buffer the caller frees. Partials of earlier passes are freed once
/// recorded (the recorded dispatches keep them alive until they have run).
fn stage(
    be: &WgpuBackend,
    stage: Stage,
    x: &TensorRef<'_>,
    row_max: Option<BufferId>,
    rows: usize,
    leaves: usize,
    mut params: Rowwise,
) -> Result<BufferId> {
    const OP: &str = "CausalSoftmax";
    let mut items = leaves;
    let mut input: Option<BufferId> = None;
    loop {
        let groups = items.div_ceil(FAN_IN);
        params.groups = word(OP, groups)?;
        params.parts = word(OP, items)?;
        let total = rows
            .checked_mul(groups)
            .filter(|&t| word(OP, t).is_ok())
            .ok_or_else(|| kiln_core::Error::unsupported(OP, format!("{rows} rows x {groups} workgroups overflow")));
        let recorded = total.and_then(|total| {
            let parts = be.scratch(DType::F32, total)?;
            let sink = (3, per_row(parts, total, true));
            let entry = match (stage, input) {
                (Stage::Max, None) => "max_leaves",
                (Stage::Max, Some(_)) => "max_parts",
                (Stage::Sum, None) => "sum_leaves",
                (Stage::Sum, Some(_)) => "sum_parts",
            };
            let mut args = vec![sink];
            match input {
                None => args.push((1, Arg::input(x))),
                Some(id) => args.push((4, per_row(id, rows * items, false))),
            }
            if let (Stage::Sum, None, Some(m)) = (stage, input, row_max) {
                args.push((5, per_row(m, rows, false)));
            }
            let grid = be.ctx().grid(OP, total as u64);
            match grid.and_then(|grid| be.launch(OP, Kernel::Rowwise, entry, &args, words(&params), grid)) {
                Ok(()) => Ok(parts),
                Err(e) => {
                    be.free_scratch(parts);
                    Err(e)
                }
            }
        });
        if let Some(old) = input.take() {
            be.free_scratch(old);
        }
        let parts = recorded?;
        if groups == 1 {
            return Ok(parts);
        }
        input = Some(parts);
        items = groups;
    }
}
