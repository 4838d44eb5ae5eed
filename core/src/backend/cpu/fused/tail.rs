//! Groups that end in a reduction (`FusedCall::tail`): the reduction's
//! element-wise prologue (`sum(exp(x - m))`, the masked gradient a bias
//! gradient sums, a loss's squared error) is evaluated a span at a time
//! into a scratch buffer that stays in cache and folded from there, so the
//! reduced value is never written to memory unless it is kept.
//!
//! The folds follow the summation rule of docs/reductions.md exactly as
//! `reduce` applies it (leaves of `LEAF` elements left to right, combined
//! by the power-of-two tree; spans are aligned groups of `LANES` leaves,
//! complete subtrees), and every element is computed by the functions the
//! unfused kernels call: the bits are those of the group and the reduction
//! run apart. Two layouts are fused, the two `reduce` has its own loops
//! for: reduced axes innermost (rows: softmax's sums, a sum of everything)
//! and outermost (columns: bias gradients). Others run split
//! (`run_tail_split`).

use crate::small::SmallVec;

use super::super::reduce::{fold_contiguous, Leaf, Tree, COST, LANES, LEAF, PAR_BLOCKS_BELOW};
use super::super::scalar::Num;
use super::super::CpuStorage;
use super::{
    bad, eval_range, fill_constants, typed_inputs, typed_outputs, write_constants, InSlice, OutSlice, Plan, Shared,
    Tiles, TILE,
};
use crate::backend::{FusedCall, TensorRef};
use crate::error::Result;
use crate::op::ReduceOp;
use crate::shape::AxisSet;

/// Elements evaluated at once along a row: one aligned group of `LANES`
/// leaves, the unit `reduce::fold_contiguous` folds in lockstep.
const SPAN: usize = LANES * LEAF;

/// Where each output's elements lie in the group's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// Output i reduces the contiguous elements i*block..(i+1)*block.
    Rows { block: usize },
    /// The value is [block, cols]: output j reduces column j.
    Columns { block: usize, cols: usize },
}

impl Layout {
    /// The layout of reducing `axes` of `dims`, when fused: the non-unit
    /// reduced axes all after (rows) or all before (columns) the non-unit
    /// kept ones, at least two elements per output, at least one output.
    pub(super) fn of(dims: &[usize], axes: AxisSet) -> Option<Layout> {
        let (mut block, mut outputs) = (1usize, 1usize);
        let (mut rows, mut columns, mut seen_kept, mut seen_reduced) = (true, true, false, false);
        for (d, &n) in dims.iter().enumerate() {
            if axes.contains(d) {
                block *= n;
                if n != 1 {
                    seen_reduced = true;
                    columns &= !seen_kept;
                }
            } else {
                outputs *= n;
                if n != 1 {
                    seen_kept = true;
                    rows &= !seen_reduced;
                }
            }
        }
        match () {
            _ if block < 2 || outputs == 0 => None,
            _ if rows => Some(Layout::Rows { block }),
            _ if columns => Some(Layout::Columns { block, cols: outputs }),
            _ => None,
        }
    }
}

pub(super) fn eval<T: Num>(
    call: &FusedCall<'_>,
    plan: &Plan,
    layout: Layout,
    ins: &[&CpuStorage],
    outs: &mut [(TensorRef<'_>, CpuStorage)],
) -> Result<()> {
    let tail = plan.tail.ok_or_else(|| bad("a group without a tail run as one"))?;
    let inputs = typed_inputs::<T>(call, ins)?;
    let mut reduced: Option<&mut [T]> = None;
    let mut shared: SmallVec<[Shared<T>; 8]> = SmallVec::new();
    for (o, slice) in write_constants(plan, typed_outputs(outs)?).into_iter().enumerate() {
        shared.push(match slice {
            Some(OutSlice::T(v)) if o == tail.output => {
                reduced = Some(v);
                Shared::None
            }
            None => Shared::None,
            Some(OutSlice::T(v)) => Shared::T(v.as_mut_ptr(), v.len()),
            Some(OutSlice::B(v)) => Shared::B(v.as_mut_ptr(), v.len()),
        });
    }
    let out = reduced.ok_or_else(|| bad("the reduction's output is not of the group's dtype"))?;
    let ctx = Ctx { plan, inputs: &inputs, shared: &shared, src: tail.src };
    // One instance per fold, as `reduce` has: its function inlined.
    match tail.op {
        ReduceOp::Sum => run(&ctx, layout, out, Leaf { init: Some(T::ZERO), f: <T as Num>::add }),
        ReduceOp::Prod => run(&ctx, layout, out, Leaf { init: Some(T::ONE), f: <T as Num>::mul }),
        ReduceOp::Max => run(&ctx, layout, out, Leaf { init: None, f: <T as Num>::max }),
        ReduceOp::Min => run(&ctx, layout, out, Leaf { init: None, f: <T as Num>::min }),
        ReduceOp::ArgMax | ReduceOp::ArgMin => return Err(bad("ArgMax and ArgMin cannot end a fused group")),
    }
    Ok(())
}

/// What every span of the group needs.
struct Ctx<'a, 'i, T> {
    plan: &'a Plan,
    inputs: &'a [InSlice<'i, T>],
    shared: &'a [Shared<T>],
    /// Where the reduced value is: a T-tile, or its kept output.
    src: super::Loc,
}

/// A task's tiles and the scratch its spans' reduced values go to.
struct Work<T> {
    t: Tiles<T>,
    b: Tiles<u8>,
    scratch: Vec<T>,
}

impl<T: Num> Ctx<'_, '_, T> {
    /// Room for spans of up to `len` elements.
    fn work(&self, len: usize) -> Work<T> {
        let tile = TILE.min(len).max(1);
        let mut t = Tiles::new(self.plan.t_tiles, tile);
        let mut b = Tiles::new(self.plan.b_tiles, tile);
        fill_constants(self.plan, self.inputs, &mut t, &mut b);
        Work { t, b, scratch: vec![T::ZERO; len] }
    }

    /// Evaluate elements `start..end` of the group (at most the work's
    /// room): the kept values to their outputs, the reduced value returned.
    fn span<'w>(&self, w: &'w mut Work<T>, start: usize, end: usize) -> &'w [T] {
        let len = end - start;
        // SAFETY: the layouts cut the group's elements into disjoint spans,
        // each evaluated once, so no two live slices of an output overlap;
        // these die before this returns.
        let mut outs: SmallVec<[Option<OutSlice<'_, T>>; 8]> =
            self.shared.iter().map(|s| unsafe { s.segment(start, len) }).collect();
        super::super::simd::dispatch(Span { ctx: self, w: &mut *w, outs: &mut outs, start, end });
        &w.scratch[..len]
    }
}

/// `Ctx::span`'s evaluation, to run with the widest vectors the CPU has.
struct Span<'a, 'c, 'i, 'o, T> {
    ctx: &'a Ctx<'c, 'i, T>,
    w: &'a mut Work<T>,
    outs: &'a mut [Option<OutSlice<'o, T>>],
    start: usize,
    end: usize,
}

impl<T: Num> super::super::simd::Kernel for Span<'_, '_, '_, '_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let Span { ctx, w, outs, start, end } = self;
        let capture = Some((ctx.src, &mut w.scratch[..end - start]));
        eval_range(ctx.plan, &mut w.t, &mut w.b, ctx.inputs, outs, start, end, capture);
    }
}

fn run<T: Num, F: Fn(T, T) -> T + Copy + Sync + Send>(
    ctx: &Ctx<'_, '_, T>,
    layout: Layout,
    out: &mut [T],
    leaf: Leaf<T, F>,
) {
    // Work per output: the fold's and the prologue's.
    let weight = |block: usize| block.saturating_mul(COST + ctx.plan.weight);
    match layout {
        Layout::Rows { block } if block > SPAN && out.len() < PAR_BLOCKS_BELOW => {
            // Few long rows: each split across threads.
            for (r, o) in out.iter_mut().enumerate() {
                *o = long_row(ctx, r * block, block, leaf);
            }
        }
        Layout::Rows { block } => super::super::layout::for_chunks_weighted(out, 1, weight(block), |s, c| {
            if block <= SPAN {
                // Whole rows a span at a time, each folded as `reduce` does.
                let per = SPAN / block;
                let mut w = ctx.work(per.min(c.len()) * block);
                for (k, part) in c.chunks_mut(per).enumerate() {
                    let r = s + k * per;
                    let values = ctx.span(&mut w, r * block, (r + part.len()) * block);
                    for (o, row) in part.iter_mut().zip(values.chunks(block)) {
                        *o = fold_contiguous(row, leaf, false);
                    }
                }
            } else {
                let mut w = ctx.work(SPAN);
                for (i, o) in c.iter_mut().enumerate() {
                    let groups = block.div_ceil(SPAN);
                    *o = row_groups(ctx, &mut w, (s + i) * block, block, 0..groups, leaf).expect("a non-empty row");
                }
            }
        }),
        Layout::Columns { block, cols } if out.len() < PAR_BLOCKS_BELOW && block > LEAF => {
            // Few columns, many rows: the rows split across threads.
            let v = long_columns(ctx, cols, block, leaf);
            out.copy_from_slice(&v);
        }
        Layout::Columns { block, cols } => super::super::layout::for_chunks_weighted(out, 1, weight(block), |s, c| {
            let mut w = ctx.work(column_span(cols, c.len()));
            let v = columns(ctx, &mut w, cols, s..s + c.len(), 0..block, leaf);
            c.copy_from_slice(&v);
        }),
    }
}

/// The rule's tree over the aligned groups `groups` of the row of `block`
/// elements at `base` (None for no groups).
fn row_groups<T: Num, F: Fn(T, T) -> T + Copy + Sync + Send>(
    ctx: &Ctx<'_, '_, T>,
    w: &mut Work<T>,
    base: usize,
    block: usize,
    groups: std::ops::Range<usize>,
    leaf: Leaf<T, F>,
) -> Option<T> {
    let mut tree = Tree::new();
    for q in groups {
        let values = ctx.span(w, base + q * SPAN, base + ((q + 1) * SPAN).min(block));
        tree.push(fold_contiguous(values, leaf, false), &leaf.f);
    }
    tree.finish(&leaf.f)
}

/// One long row, its groups split across threads in aligned power-of-two
/// runs (complete subtrees: the bits do not depend on the split).
fn long_row<T: Num, F: Fn(T, T) -> T + Copy + Sync + Send>(
    ctx: &Ctx<'_, '_, T>,
    base: usize,
    block: usize,
    leaf: Leaf<T, F>,
) -> T {
    let groups = block.div_ceil(SPAN);
    #[cfg(feature = "rayon")]
    if super::super::reduce::parallel_worth(block) {
        use rayon::prelude::*;
        let per = super::super::reduce::leaves_per_task(groups);
        let parts: Vec<Option<T>> = (0..groups.div_ceil(per))
            .into_par_iter()
            .map(|t| {
                let mut w = ctx.work(SPAN);
                row_groups(ctx, &mut w, base, block, t * per..((t + 1) * per).min(groups), leaf)
            })
            .collect();
        let mut tree = Tree::new();
        for p in parts.into_iter().flatten() {
            tree.push(p, &leaf.f);
        }
        return tree.finish(&leaf.f).expect("a non-empty row");
    }
    let mut w = ctx.work(SPAN.min(block));
    row_groups(ctx, &mut w, base, block, 0..groups, leaf).expect("a non-empty row")
}

/// Elements a span holds when folding `width` of `cols` columns: whole
/// rows, several at once, when the columns are all of them; else one
/// row's segment.
fn column_span(cols: usize, width: usize) -> usize {
    if width == cols {
        (SPAN / cols).max(1) * cols
    } else {
        width
    }
}

/// Columns `cs` of the [block, cols] value over `rows` (an aligned run of
/// whole leaves, or the tail) by the rule, as `reduce::columns` folds them.
fn columns<T: Num, F: Fn(T, T) -> T + Copy + Sync + Send>(
    ctx: &Ctx<'_, '_, T>,
    w: &mut Work<T>,
    cols: usize,
    cs: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    leaf: Leaf<T, F>,
) -> Vec<T> {
    let width = cs.len();
    let merge = |a, b| merge_columns(leaf, a, b);
    let per = if width == cols { column_span(cols, width) / cols } else { 1 };
    let mut tree = Tree::new();
    let mut acc: Vec<T> = Vec::new();
    let mut r = rows.start;
    while r < rows.end {
        let r1 = (r + per).min(rows.end);
        let values = ctx.span(w, r * cols + cs.start, (r1 - 1) * cols + cs.end);
        for (k, row) in values.chunks(cols).enumerate() {
            let row = &row[..width];
            if (r + k - rows.start) % LEAF == 0 {
                // A leaf starts: from the identity, or from its first row.
                if r + k > rows.start {
                    tree.push(std::mem::take(&mut acc), &merge);
                }
                acc = match leaf.init {
                    Some(i) => row.iter().map(|&v| (leaf.f)(i, v)).collect(),
                    None => row.to_vec(),
                };
            } else {
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a = (leaf.f)(*a, v);
                }
            }
        }
        r = r1;
    }
    if rows.start < rows.end {
        tree.push(acc, &merge);
    }
    tree.finish(&merge).unwrap_or_else(|| vec![leaf.init.expect("empty blocks have an identity"); width])
}

/// All columns over all `block` rows, the rows split across threads in
/// aligned power-of-two runs of leaves (few columns, many rows).
fn long_columns<T: Num, F: Fn(T, T) -> T + Copy + Sync + Send>(
    ctx: &Ctx<'_, '_, T>,
    cols: usize,
    block: usize,
    leaf: Leaf<T, F>,
) -> Vec<T> {
    #[cfg(feature = "rayon")]
    if super::super::reduce::parallel_worth(block * cols) {
        use rayon::prelude::*;
        let leaves = block.div_ceil(LEAF);
        let per = super::super::reduce::leaves_per_task(leaves) * LEAF;
        let parts: Vec<Vec<T>> = (0..block.div_ceil(per))
            .into_par_iter()
            .map(|t| {
                let mut w = ctx.work(column_span(cols, cols));
                columns(ctx, &mut w, cols, 0..cols, t * per..((t + 1) * per).min(block), leaf)
            })
            .collect();
        let merge = |a, b| merge_columns(leaf, a, b);
        let mut tree = Tree::new();
        for p in parts {
            tree.push(p, &merge);
        }
        return tree.finish(&merge).expect("at least one part");
    }
    let mut w = ctx.work(column_span(cols, cols));
    columns(ctx, &mut w, cols, 0..cols, 0..block, leaf)
}

/// Two leaves' (or parts') column values combined, column by column.
fn merge_columns<T: Num, F: Fn(T, T) -> T + Copy>(leaf: Leaf<T, F>, mut a: Vec<T>, b: Vec<T>) -> Vec<T> {
    for (a, b) in a.iter_mut().zip(b) {
        *a = (leaf.f)(*a, b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::Layout;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::{run_tail_split, Backend, BufferId, FusedArg, FusedCall, FusedOp, TensorRef};
    use crate::dtype::{DType, HostData};
    use crate::op::{Op, ReduceOp, UnaryOp};
    use crate::shape::AxisSet;

    fn buffer(be: &CpuBackend, data: &[f32]) -> BufferId {
        let id = be.alloc(DType::F32, data.len()).unwrap();
        be.upload(id, &HostData::F32(data.to_vec())).unwrap();
        id
    }

    fn read(be: &CpuBackend, id: BufferId, n: usize) -> Vec<f32> {
        match pollster::block_on(be.read(id, DType::F32, n)).unwrap() {
            HostData::F32(v) => v,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn layouts_are_rows_columns_or_none() {
        assert_eq!(Layout::of(&[4, 5], AxisSet(0b10)), Some(Layout::Rows { block: 5 }));
        assert_eq!(Layout::of(&[4, 5], AxisSet(0b11)), Some(Layout::Rows { block: 20 }));
        assert_eq!(Layout::of(&[4, 1, 5], AxisSet(0b001)), Some(Layout::Columns { block: 4, cols: 5 }));
        assert_eq!(Layout::of(&[1, 4, 5], AxisSet(0b011)), Some(Layout::Columns { block: 4, cols: 5 }));
        assert_eq!(Layout::of(&[3, 4, 5], AxisSet(0b010)), None, "a middle axis");
        assert_eq!(Layout::of(&[3, 1, 5], AxisSet(0b010)), None, "one element per output");
        assert_eq!(Layout::of(&[3, 0, 5], AxisSet(0b100)), None, "no outputs");
    }

    /// Malformed tail calls are errors that say what is wrong and leave the
    /// backend usable: a good call afterwards computes sum(exp(x)) over
    /// rows, the same bits as the split form.
    #[test]
    fn malformed_tail_calls_are_errors_and_leave_the_backend_usable() {
        let be = CpuBackend::new();
        let (rows, cols) = (6, 300);
        let xv: Vec<f32> = (0..rows * cols).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let (x, out, split) =
            (buffer(&be, &xv), be.alloc(DType::F32, rows).unwrap(), be.alloc(DType::F32, rows).unwrap());
        let (dims, out_dims, wrong_dims) = ([rows, cols], [rows], [rows + 1]);
        let input = [TensorRef { buffer: x, dims: &dims, dtype: DType::F32 }];
        let exp = FusedOp { op: Op::Unary(UnaryOp::Exp), args: [FusedArg::Input(0); 3], arity: 1, dtype: DType::F32 };
        let reduce = |op: ReduceOp, of: u16| FusedOp {
            op: Op::Reduce { op, axes: AxisSet(0b10), keepdim: false },
            args: [FusedArg::Op(of), FusedArg::Input(0), FusedArg::Input(0)],
            arity: 1,
            dtype: DType::F32,
        };
        let sum = reduce(ReduceOp::Sum, 0);
        let output =
            |k: u16, buffer: BufferId, dims: &'static [usize]| [(k, TensorRef { buffer, dims, dtype: DType::F32 })];
        let run = |ops: &[FusedOp], outputs: &[(u16, TensorRef<'_>)]| {
            let call = FusedCall { dims: &dims, ops, inputs: &input, outputs, plan_id: None, head: None };
            be.run_fused(&call).map_err(|e| e.to_string())
        };
        let out_dims: &'static [usize] = Box::leak(Box::new(out_dims));
        let wrong_dims: &'static [usize] = Box::leak(Box::new(wrong_dims));
        // A reduction that is not the last op.
        let full = be.alloc(DType::F32, rows * cols).unwrap();
        let full_dims: &'static [usize] = Box::leak(Box::new(dims));
        let err = run(&[exp, sum, exp], &output(2, full, full_dims)).unwrap_err();
        assert!(err.contains("op 1 is a reduction that does not end the group"), "{err}");
        // A reduction of a constant.
        let constant = FusedOp { op: Op::Full(2.0), arity: 0, ..exp };
        let err = run(&[constant, sum], &output(1, out, out_dims)).unwrap_err();
        assert!(err.contains("does not end the group, of a value it computes"), "{err}");
        // ArgMax cannot fold into a value of the group's dtype.
        let err = run(&[exp, reduce(ReduceOp::ArgMax, 0)], &output(1, out, out_dims)).unwrap_err();
        assert!(err.contains("ArgMax cannot end a fused group"), "{err}");
        // An output of the wrong size, and none at all.
        let err = run(&[exp, sum], &output(1, out, wrong_dims)).unwrap_err();
        assert!(err.contains("output 0 does not fit op 1"), "{err}");
        let err = run(&[exp, sum], &[]).unwrap_err();
        assert!(err.contains("no output"), "{err}");
        // The reduced buffer is also the input: missing, never aliased.
        assert!(run(&[exp, sum], &output(1, x, out_dims)).is_err());
        let no_tail = FusedCall { dims: &dims, ops: &[exp], inputs: &input, outputs: &[], plan_id: None, head: None };
        assert!(run_tail_split(&be, &no_tail).unwrap_err().to_string().contains("needs a call whose last op"));

        run(&[exp, sum], &output(1, out, out_dims)).unwrap();
        let outputs = output(1, split, out_dims);
        let call =
            FusedCall { dims: &dims, ops: &[exp, sum], inputs: &input, outputs: &outputs, plan_id: None, head: None };
        run_tail_split(&be, &call).unwrap();
        let (fused, apart) = (read(&be, out, rows), read(&be, split, rows));
        assert_eq!(
            fused.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            apart.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let want: Vec<f32> = xv.chunks(cols).map(|r| r.iter().map(|v| v.exp()).sum::<f32>()).collect();
        for (g, w) in fused.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-4 * w.abs(), "{g} vs {w}");
        }
        assert_eq!(read(&be, x, rows * cols), xv, "the input is intact");
    }
}
