//! Reductions: Sum, Prod, Max, Min, ArgMax, ArgMin over any set of axes.
//!
//! Every output reduces its sub-block by the summation rule of
//! docs/reductions.md: leaves of `LEAF` elements folded left to right,
//! combined by a fixed power-of-two tree, in the tensor's own dtype. The
//! order depends only on the block length, so results are bit-identical run
//! after run and whatever the thread count, and a sum's error grows like
//! log n. Three layouts get their own loops with that one order: reduced
//! axes innermost (softmax rows: contiguous blocks), reduced axes outermost
//! (bias gradients: whole rows added into a vector of columns) and any other
//! set (a list of offsets). Few long blocks are split across threads in
//! aligned power-of-two runs of leaves, which are subtrees of the rule.

use crate::small::SmallVec;

#[cfg(feature = "rayon")]
use super::layout::PAR_THRESHOLD;
use super::layout::{for_chunks, for_chunks_weighted, Strided};
use super::scalar::{Num, Scalar};
use super::{own_loops, with_any, with_num, In, Out, COMPACT};
use crate::backend::checks;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::shape::{contiguous_strides, AxisSet, Dims};

/// Work weight of one reduced element (see `PAR_THRESHOLD`).
pub(super) const COST: usize = 2;
/// Rows folded together in the reduced-axes-innermost loop.
pub(super) const LANES: usize = 8;

/// Where the reduced elements of each output lie in the input.
struct Geometry {
    /// Kept dims (outermost first) and their input strides.
    kept_dims: Dims,
    kept_strides: Dims,
    /// Reduced dims and strides.
    red_dims: Dims,
    red_strides: Dims,
    /// Elements per reduced sub-block.
    block: usize,
    /// Non-unit reduced axes all come after the non-unit kept axes: each
    /// block is contiguous, block i at i * block.
    suffix: bool,
    /// Non-unit reduced axes all come before the non-unit kept axes: the
    /// input is [block, outputs] and each output a column.
    prefix: bool,
    /// Otherwise, when each block is made of contiguous runs of at least
    /// `MIN_RUN` elements: where they start. Native only (`block_runs`):
    /// in the browser build even the field's drop glue cost download size.
    #[cfg(not(target_arch = "wasm32"))]
    runs: Option<Runs>,
}

/// A block as runs of `len` contiguous elements, run r at `starts[r]` from
/// the block's first element, in the order of the reduced sequence.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
struct Runs {
    len: usize,
    starts: Vec<usize>,
}

/// Runs shorter than this are gathered element by element (the offset
/// table), as copying them would gain nothing.
#[cfg(not(target_arch = "wasm32"))]
const MIN_RUN: usize = 16;

impl Geometry {
    fn new(dims: &[usize], axes: AxisSet) -> Geometry {
        let strides = contiguous_strides(dims);
        let mut g = Geometry {
            kept_dims: Dims::new(),
            kept_strides: Dims::new(),
            red_dims: Dims::new(),
            red_strides: Dims::new(),
            block: 1,
            suffix: true,
            prefix: true,
            #[cfg(not(target_arch = "wasm32"))]
            runs: None,
        };
        let (mut seen_kept, mut seen_red) = (false, false);
        for (d, (&n, &s)) in dims.iter().zip(&strides).enumerate() {
            if axes.contains(d) {
                g.red_dims.push(n);
                g.red_strides.push(s);
                g.block *= n;
                if n != 1 {
                    seen_red = true;
                    g.prefix &= !seen_kept;
                }
            } else {
                g.kept_dims.push(n);
                g.kept_strides.push(s);
                if n != 1 {
                    seen_kept = true;
                    g.suffix &= !seen_red;
                }
            }
        }
        g
    }

    #[cfg(not(target_arch = "wasm32"))]
    /// `runs` for a block whose innermost non-unit reduced axes are
    /// contiguous in memory for at least `MIN_RUN` elements (and more than
    /// one run: a single run is the `suffix` case).
    fn find_runs(&mut self) {
        // The reduced axes collapsed: the row is a run when contiguous.
        let st = Strided::<1>::new(&self.red_dims, [&self.red_strides], [0]);
        let len = st.inner;
        if st.inner_strides[0] != 1 || len < MIN_RUN || st.rows() < 2 {
            return;
        }
        let mut starts = Vec::with_capacity(st.rows());
        st.for_rows(0, st.rows(), |_, [o]| starts.push(o));
        self.runs = Some(Runs { len, starts });
    }

    /// `runs`, known to be None at compile time in the browser build, so
    /// that `fold_runs` is not in its download.
    #[cfg(not(target_arch = "wasm32"))]
    fn block_runs(&self) -> Option<&Runs> {
        self.runs.as_ref()
    }
    #[cfg(target_arch = "wasm32")]
    fn block_runs(&self) -> Option<&Runs> {
        None
    }

    /// Offsets of a block's elements from its first, in increasing order.
    fn block_offsets(&self) -> Vec<usize> {
        let mut offs = Vec::with_capacity(self.block);
        offs.push(0);
        for (&n, &s) in self.red_dims.iter().zip(&self.red_strides) {
            let prev = std::mem::take(&mut offs);
            offs.reserve(prev.len() * n);
            for o in prev {
                offs.extend((0..n).map(|i| o + i * s));
            }
        }
        offs
    }
}

pub(super) fn reduce(op: ReduceOp, axes: AxisSet, [x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    reduce_with::<COMPACT>(op, axes, x, out, true)
}

/// `fast`: allow the suffix/prefix loops (tests compare them to the generic).
/// `COMPACT` as in `super::COMPACT`: f64 and i32 get one set of loops for
/// the four folds, choosing the op per element (tests compare the bits).
fn reduce_with<const COMPACT: bool>(
    op: ReduceOp,
    axes: AxisSet,
    x: &In<'_>,
    out: &mut Out<'_>,
    fast: bool,
) -> Result<()> {
    let name = op.name();
    let rank = x.dims.len();
    let axes = AxisSet(axes.0 & AxisSet::all(rank).0);
    let mut g = Geometry::new(x.dims, axes);
    g.suffix &= fast;
    g.prefix &= fast;
    // Native only: the browser build keeps the offset table (size budget;
    // the bits are the same either way; see `block_runs`).
    #[cfg(not(target_arch = "wasm32"))]
    if fast && !g.suffix && !g.prefix {
        g.find_runs();
    }
    let outputs: usize = g.kept_dims.iter().product();
    checks::reduction(op, axes, (x.dims, x.dtype), (outputs, g.block), (out.numel(), out.dtype))?;
    if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
        let o = out.slice::<i32>(name)?;
        let max = op == ReduceOp::ArgMax;
        return with_any!(x.dtype, T => {
            arg_reduce::<T>(x.slice::<T>(name)?, &g, o, max);
            Ok(())
        });
    }
    with_num!(x.dtype, name, T => {
        let (xs, o) = (x.slice::<T>(name)?, out.slice::<T>(name)?);
        if !own_loops::<T, COMPACT>() {
            let init = match op {
                ReduceOp::Sum => Some(T::ZERO),
                ReduceOp::Prod => Some(T::ONE),
                _ => None,
            };
            let f = move |a: T, b: T| match op {
                ReduceOp::Sum => Num::add(a, b),
                ReduceOp::Prod => Num::mul(a, b),
                ReduceOp::Max => Num::max(a, b),
                _ => Num::min(a, b),
            };
            fold::<T>(xs, &g, o, init, f);
            return Ok(());
        }
        match op {
            ReduceOp::Sum => fold::<T>(xs, &g, o, Some(T::ZERO), Num::add),
            ReduceOp::Prod => fold::<T>(xs, &g, o, Some(T::ONE), Num::mul),
            ReduceOp::Max => fold::<T>(xs, &g, o, None, Num::max),
            ReduceOp::Min => fold::<T>(xs, &g, o, None, Num::min),
            ReduceOp::ArgMax | ReduceOp::ArgMin => unreachable!("handled above"),
        }
        Ok(())
    })
}

/// Fold each block by the summation rule of docs/reductions.md: leaves of
/// `LEAF` elements folded left to right from `init` (or from the leaf's first
/// element when `init` is None; blocks are then non-empty, checked by the
/// caller), leaves combined by the power-of-two split. The order depends on
/// the block length only, so every layout below, serial or parallel, gives
/// the same bits.
fn fold<T: Num>(x: &[T], g: &Geometry, out: &mut [T], init: Option<T>, f: impl Fn(T, T) -> T + Sync + Send + Copy) {
    let block = g.block;
    if out.is_empty() {
        return;
    }
    if block == 1 {
        // Nothing to fold (no reduced axes, or only unit ones): a copy,
        // through f so that Sum of -0.0 matches the generic order.
        for_chunks(out, 1, |s, c| {
            let n = c.len();
            for (o, &v) in c.iter_mut().zip(&x[s..s + n]) {
                *o = match init {
                    Some(i) => f(i, v),
                    None => v,
                };
            }
        });
        return;
    }
    let leaf = Leaf { init, f };
    if g.suffix {
        // Contiguous blocks. Few large blocks: parallel inside each block;
        // otherwise parallel over the outputs.
        if block > LEAF && out.len() < PAR_BLOCKS_BELOW {
            for (i, o) in out.iter_mut().enumerate() {
                *o = fold_contiguous(&x[i * block..(i + 1) * block], leaf, true);
            }
            return;
        }
        for_chunks_weighted(out, 1, block * COST, |s, c| {
            if block > LEAF {
                for (i, o) in c.iter_mut().enumerate() {
                    let b = (s + i) * block;
                    *o = fold_contiguous(&x[b..b + block], leaf, false);
                }
            } else {
                short_rows(x, block, s, c, leaf);
            }
        });
    } else if g.prefix {
        // The input is [block, cols]: each output a column, each leaf a run
        // of LEAF rows added into a vector of columns.
        let cols = out.len();
        if out.len() < PAR_BLOCKS_BELOW && block > LEAF {
            let v = columns_parallel_rows(x, cols, 0..cols, block, leaf);
            out.copy_from_slice(&v);
            return;
        }
        for_chunks_weighted(out, 1, block * COST, |s, c| {
            let v = columns(x, cols, s..s + c.len(), 0..block, leaf);
            c.copy_from_slice(&v);
        });
    } else if let Some(runs) = g.block_runs() {
        // Blocks made of contiguous runs (a conv bias gradient: [N, C, HW]
        // summed over N and HW): copied a chunk at a time into a buffer and
        // folded there by the contiguous loop. A branch of its own, not a
        // choice inside the one below: merged, the browser build (where
        // `block_runs` is None) grew by ~600 B gzipped.
        let st = Strided::<1>::new(&g.kept_dims, [&g.kept_strides], [0]);
        let [is] = st.inner_strides;
        let par_inside = out.len() < PAR_BLOCKS_BELOW && block > LEAF;
        st.fill_weighted(out, block * COST, |row, [base]| {
            for (j, o) in row.iter_mut().enumerate() {
                *o = fold_runs(x, base + j * is, runs, block, leaf, par_inside);
            }
        });
    } else {
        let offs = g.block_offsets();
        let st = Strided::<1>::new(&g.kept_dims, [&g.kept_strides], [0]);
        let [is] = st.inner_strides;
        let par_inside = out.len() < PAR_BLOCKS_BELOW && block > LEAF;
        st.fill_weighted(out, block * COST, |row, [base]| {
            for (j, o) in row.iter_mut().enumerate() {
                let b = base + j * is;
                let value = |q: usize| leaf.fold(offs[q * LEAF..((q + 1) * LEAF).min(block)].iter().map(|&k| x[b + k]));
                *o = tree_of_leaves(block.div_ceil(LEAF), value, leaf, par_inside);
            }
        });
    }
}

/// Leaf length of the summation rule (docs/reductions.md).
pub(crate) const LEAF: usize = 128;
/// Fewer outputs than this with long blocks: split each block across threads
/// instead of handing whole outputs to threads.
pub(super) const PAR_BLOCKS_BELOW: usize = 16;

/// How one leaf is folded, and the combining function of the tree.
#[derive(Clone, Copy)]
pub(super) struct Leaf<T, F> {
    pub(super) init: Option<T>,
    pub(super) f: F,
}

impl<T: Num, F: Fn(T, T) -> T + Copy> Leaf<T, F> {
    /// Fold a leaf's values left to right (at least one value when `init`
    /// is None).
    #[inline]
    pub(super) fn fold(&self, mut vals: impl Iterator<Item = T>) -> T {
        let mut acc = match self.init {
            Some(i) => i,
            None => vals.next().expect("blocks of Max/Min are non-empty"),
        };
        for v in vals {
            acc = (self.f)(acc, v);
        }
        acc
    }
}

/// The streaming form of the power-of-two split: push leaf (or aligned
/// chunk) values in order, merging the top two after the k-th push
/// `trailing_zeros(k)` times; `finish` folds what is left from the top.
pub(super) struct Tree<V> {
    stack: SmallVec<[V; 16]>,
    pushed: u64,
}

impl<V> Tree<V> {
    pub(super) fn new() -> Tree<V> {
        Tree { stack: SmallVec::new(), pushed: 0 }
    }

    #[inline]
    pub(super) fn push(&mut self, v: V, merge: &impl Fn(V, V) -> V) {
        self.stack.push(v);
        self.pushed += 1;
        for _ in 0..self.pushed.trailing_zeros() {
            let b = self.stack.pop().expect("two entries per merge");
            let a = self.stack.pop().expect("two entries per merge");
            self.stack.push(merge(a, b));
        }
    }

    pub(super) fn finish(self, merge: &impl Fn(V, V) -> V) -> Option<V> {
        let mut entries = self.stack.into_iter().rev();
        let mut acc = entries.next()?;
        for below in entries {
            acc = merge(below, acc);
        }
        Some(acc)
    }
}

/// Leaves per parallel task: a power of two (so tasks are complete subtrees
/// and the bits do not depend on it) giving a few tasks per thread.
#[cfg(feature = "rayon")]
pub(super) fn leaves_per_task(leaves: usize) -> usize {
    let tasks = rayon::current_num_threads() * 4;
    leaves.div_ceil(tasks).next_power_of_two().max(PAR_THRESHOLD / (LEAF * COST * 4)).max(1)
}

/// Whether `elements` are worth splitting across threads.
#[cfg(feature = "rayon")]
pub(super) fn parallel_worth(elements: usize) -> bool {
    elements.saturating_mul(COST) >= PAR_THRESHOLD
}

/// The rule's value of `leaves` leaves, leaf q's value given by `value(q)`;
/// split across threads into aligned power-of-two chunks when `parallel`.
fn tree_of_leaves<T: Num, F: Fn(T, T) -> T + Copy + Sync + Send>(
    leaves: usize,
    value: impl Fn(usize) -> T + Sync,
    leaf: Leaf<T, F>,
    parallel: bool,
) -> T {
    let serial = |range: std::ops::Range<usize>| {
        let mut tree = Tree::new();
        for q in range {
            tree.push(value(q), &leaf.f);
        }
        tree.finish(&leaf.f)
    };
    #[cfg(feature = "rayon")]
    if parallel && parallel_worth(leaves * LEAF) {
        use rayon::prelude::*;
        let per = leaves_per_task(leaves);
        let parts: Vec<Option<T>> =
            (0..leaves.div_ceil(per)).into_par_iter().map(|t| serial(t * per..((t + 1) * per).min(leaves))).collect();
        let mut tree = Tree::new();
        for p in parts.into_iter().flatten() {
            tree.push(p, &leaf.f);
        }
        return tree.finish(&leaf.f).unwrap_or_else(|| leaf.init.expect("empty blocks have an identity"));
    }
    let _ = parallel;
    serial(0..leaves).unwrap_or_else(|| leaf.init.expect("empty blocks have an identity"))
}

/// One contiguous block by the rule: LANES leaves at a time folded in
/// lockstep (each still left to right) to hide the adds' latency.
pub(super) fn fold_contiguous<T: Num, F: Fn(T, T) -> T + Copy + Sync + Send>(
    x: &[T],
    leaf: Leaf<T, F>,
    parallel: bool,
) -> T {
    if x.len() <= LEAF {
        return leaf.fold(x.iter().copied());
    }
    let leaves = x.len().div_ceil(LEAF);
    // Aligned groups of LANES leaves are complete subtrees of the rule when
    // LANES is a power of two: fold each group in lockstep, then treat it
    // as one entry.
    const _: () = assert!(LANES.is_power_of_two());
    let group = |q: usize| -> T {
        let start = q * LANES * LEAF;
        let end = (start + LANES * LEAF).min(x.len());
        let chunk = &x[start..end];
        if chunk.len() < LANES * LEAF {
            let mut tree = Tree::new();
            for l in chunk.chunks(LEAF) {
                tree.push(leaf.fold(l.iter().copied()), &leaf.f);
            }
            return tree.finish(&leaf.f).expect("non-empty chunk");
        }
        let (mut acc, first) = match leaf.init {
            Some(i) => ([i; LANES], 0),
            None => (std::array::from_fn(|r| chunk[r * LEAF]), 1),
        };
        for j in first..LEAF {
            for r in 0..LANES {
                acc[r] = (leaf.f)(acc[r], chunk[r * LEAF + j]);
            }
        }
        let mut tree = Tree::new();
        for a in acc {
            tree.push(a, &leaf.f);
        }
        tree.finish(&leaf.f).expect("LANES entries")
    };
    let groups = leaves.div_ceil(LANES);
    tree_of_leaves(groups, group, leaf, parallel)
}

/// Leaves per chunk of `fold_runs`: a power of two, so each chunk is a
/// complete subtree of the rule (docs/reductions.md, "Chunks").
const RUN_CHUNK_LEAVES: usize = 64;

#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
/// The rule's value of one block laid out as `runs` (from `base`): chunks of
/// `RUN_CHUNK_LEAVES` leaves copied into a buffer and folded by
/// `fold_contiguous`, the chunk values combined by the tree. The same bits
/// as folding the block's elements in sequence.
fn fold_runs<T: Num, F: Fn(T, T) -> T + Copy + Sync + Send>(
    x: &[T],
    base: usize,
    runs: &Runs,
    block: usize,
    leaf: Leaf<T, F>,
    parallel: bool,
) -> T {
    const CHUNK: usize = RUN_CHUNK_LEAVES * LEAF;
    let chunk = |c: usize| -> T {
        let (start, end) = (c * CHUNK, ((c + 1) * CHUNK).min(block));
        let mut buf = Vec::with_capacity(end - start);
        let mut e = start;
        while e < end {
            let (r, within) = (e / runs.len, e % runs.len);
            let take = (runs.len - within).min(end - e);
            let from = base + runs.starts[r] + within;
            buf.extend_from_slice(&x[from..from + take]);
            e += take;
        }
        fold_contiguous(&buf, leaf, false)
    };
    tree_of_leaves(block.div_ceil(CHUNK), chunk, leaf, parallel)
}

// The LANES-rows loop indexes LANES slices in lockstep; an iterator is
// not clearer there.
#[allow(clippy::needless_range_loop)]
/// Rows of at most LEAF elements (one leaf each: a plain left-to-right
/// fold), LANES rows at a time so their dependency chains interleave.
fn short_rows<T: Num, F: Fn(T, T) -> T + Copy>(x: &[T], block: usize, s: usize, c: &mut [T], leaf: Leaf<T, F>) {
    let mut groups = c.chunks_exact_mut(LANES);
    let mut row = s;
    for group in &mut groups {
        let base = row * block;
        let rows: [&[T]; LANES] = std::array::from_fn(|r| &x[base + r * block..base + (r + 1) * block]);
        let (mut acc, first) = match leaf.init {
            Some(i) => ([i; LANES], 0),
            None => (std::array::from_fn(|r| rows[r][0]), 1),
        };
        for j in first..block {
            for r in 0..LANES {
                acc[r] = (leaf.f)(acc[r], rows[r][j]);
            }
        }
        group.copy_from_slice(&acc);
        row += LANES;
    }
    for (i, o) in groups.into_remainder().iter_mut().enumerate() {
        let b = (row + i) * block;
        *o = leaf.fold(x[b..b + block].iter().copied());
    }
}

/// Columns `cols` of the [rows, width] input `x`, reduced over `rows` (an
/// aligned run of whole leaves, or the tail) by the rule.
fn columns<T: Num, F: Fn(T, T) -> T + Copy>(
    x: &[T],
    width: usize,
    cols: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    leaf: Leaf<T, F>,
) -> Vec<T> {
    let merge = |mut a: Vec<T>, b: Vec<T>| {
        for (a, b) in a.iter_mut().zip(b) {
            *a = (leaf.f)(*a, b);
        }
        a
    };
    let mut tree = Tree::new();
    let mut start = rows.start;
    while start < rows.end {
        let end = (start + LEAF).min(rows.end);
        let mut r = start;
        let mut acc = match leaf.init {
            Some(i) => vec![i; cols.len()],
            None => {
                r += 1;
                x[start * width + cols.start..start * width + cols.end].to_vec()
            }
        };
        for r in r..end {
            for (a, &v) in acc.iter_mut().zip(&x[r * width + cols.start..r * width + cols.end]) {
                *a = (leaf.f)(*a, v);
            }
        }
        tree.push(acc, &merge);
        start = end;
    }
    tree.finish(&merge).unwrap_or_else(|| vec![leaf.init.expect("empty blocks have an identity"); cols.len()])
}

/// `columns` over all `block` rows, the rows split across threads in
/// aligned power-of-two runs of leaves (few columns, many rows).
fn columns_parallel_rows<T: Num, F: Fn(T, T) -> T + Copy + Sync + Send>(
    x: &[T],
    width: usize,
    cols: std::ops::Range<usize>,
    block: usize,
    leaf: Leaf<T, F>,
) -> Vec<T> {
    #[cfg(feature = "rayon")]
    if parallel_worth(block * cols.len()) {
        use rayon::prelude::*;
        let leaves = block.div_ceil(LEAF);
        let per = leaves_per_task(leaves) * LEAF;
        let parts: Vec<Vec<T>> = (0..block.div_ceil(per))
            .into_par_iter()
            .map(|t| columns(x, width, cols.clone(), t * per..((t + 1) * per).min(block), leaf))
            .collect();
        let merge = |mut a: Vec<T>, b: Vec<T>| {
            for (a, b) in a.iter_mut().zip(b) {
                *a = (leaf.f)(*a, b);
            }
            a
        };
        let mut tree = Tree::new();
        for p in parts {
            tree.push(p, &merge);
        }
        return tree.finish(&merge).expect("at least one part");
    }
    columns(x, width, cols, 0..block, leaf)
}

/// Position of the first extreme element of a block (the first NaN if any).
#[inline]
fn arg_of<T: Scalar>(mut vals: impl Iterator<Item = T>, max: bool) -> i32 {
    let Some(mut best) = vals.next() else { return 0 };
    if best.is_nan() {
        return 0;
    }
    let mut at = 0;
    for (j, v) in vals.enumerate() {
        if v.is_nan() {
            return (j + 1) as i32;
        }
        if (max && v > best) || (!max && v < best) {
            best = v;
            at = j + 1;
        }
    }
    at as i32
}

fn arg_reduce<T: Scalar>(x: &[T], g: &Geometry, out: &mut [i32], max: bool) {
    let block = g.block;
    if g.suffix {
        for_chunks_weighted(out, 1, block * COST, |s, c| {
            for (i, o) in c.iter_mut().enumerate() {
                let b = (s + i) * block;
                *o = arg_of(x[b..b + block].iter().copied(), max);
            }
        });
        return;
    }
    let offs = g.block_offsets();
    let st = Strided::<1>::new(&g.kept_dims, [&g.kept_strides], [0]);
    let [is] = st.inner_strides;
    st.fill_weighted(out, block * COST, |row, [base]| {
        for (j, o) in row.iter_mut().enumerate() {
            let b = base + j * is;
            *o = arg_of(offs.iter().map(|&k| x[b + k]), max);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{CpuStorage, In, Out};
    use super::*;
    use crate::dtype::{DType, HostData};
    use crate::op::Op;
    use crate::shape::reduced_dims;

    fn red(op: ReduceOp, axes: u32, keepdim: bool, x: HostData, dims: &[usize]) -> Result<HostData> {
        let od = reduced_dims(dims, AxisSet(axes), keepdim);
        let dt = if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) { DType::I32 } else { x.dtype() };
        run_op(Op::Reduce { op, axes: AxisSet(axes), keepdim }, &[(x, dims)], &od, dt)
    }

    #[test]
    fn sums_over_axes() {
        // x[i,j,k] = 100 i + 10 j + k, dims [2,3,4]
        let x: Vec<f64> = (0..24).map(|n| (100 * (n / 12) + 10 * ((n / 4) % 3) + n % 4) as f64).collect();
        let x = f64s(&x);
        let d = [2, 3, 4];
        assert_eq!(
            red(ReduceOp::Sum, 0b100, false, x.clone(), &d).unwrap().to_f64_vec(),
            vec![6., 46., 86., 406., 446., 486.]
        );
        assert_eq!(
            red(ReduceOp::Sum, 0b001, true, x.clone(), &d).unwrap().to_f64_vec(),
            vec![100., 102., 104., 106., 120., 122., 124., 126., 140., 142., 144., 146.]
        );
        assert_eq!(red(ReduceOp::Sum, 0b101, false, x.clone(), &d).unwrap().to_f64_vec(), vec![412., 492., 572.]);
        assert_eq!(
            red(ReduceOp::Sum, 0b010, false, x.clone(), &d).unwrap().to_f64_vec(),
            vec![30., 33., 36., 39., 330., 333., 336., 339.]
        );
        // 12 * 100 + 2 * 4 * (0 + 10 + 20) + 2 * 3 * (0 + 1 + 2 + 3)
        assert_eq!(red(ReduceOp::Sum, 0b111, false, x.clone(), &d).unwrap().to_f64_vec(), vec![1476.]);
        // zero axes: a copy
        assert_eq!(red(ReduceOp::Sum, 0, false, x.clone(), &d).unwrap(), x);
        assert_eq!(red(ReduceOp::Max, 0b011, false, x.clone(), &d).unwrap().to_f64_vec(), vec![120., 121., 122., 123.]);
        assert_eq!(red(ReduceOp::Min, 0b110, true, x, &d).unwrap().to_f64_vec(), vec![0., 100.]);
        let p = red(ReduceOp::Prod, 0b1, false, i32s(&[1, 2, 3, 4, 5, 6]), &[2, 3]).unwrap();
        assert_eq!(p, i32s(&[4, 10, 18]));
        let s = red(ReduceOp::Sum, 0b1, false, i32s(&[i32::MAX, 1]), &[2]).unwrap();
        assert_eq!(s, i32s(&[i32::MIN]));
    }

    #[test]
    fn empty_blocks() {
        assert_eq!(red(ReduceOp::Sum, 0b10, false, f32s(&[]), &[2, 0]).unwrap(), f32s(&[0., 0.]));
        assert_eq!(red(ReduceOp::Prod, 0b10, false, f32s(&[]), &[2, 0]).unwrap(), f32s(&[1., 1.]));
        assert!(red(ReduceOp::Max, 0b10, false, f32s(&[]), &[2, 0]).is_err());
        assert!(red(ReduceOp::ArgMin, 0b10, false, f32s(&[]), &[2, 0]).is_err());
    }

    #[test]
    fn nan_and_arg_ties() {
        let x = f32s(&[1., f32::NAN, 3., 5., 5., 5., 0., 5.]);
        let m = red(ReduceOp::Max, 0b10, false, x.clone(), &[2, 4]).unwrap().to_f64_vec();
        assert!(m[0].is_nan() && m[1] == 5.0);
        let a = red(ReduceOp::ArgMax, 0b10, false, x.clone(), &[2, 4]).unwrap();
        assert_eq!(a, i32s(&[1, 0]));
        let a = red(ReduceOp::ArgMin, 0b10, true, x.clone(), &[2, 4]).unwrap();
        assert_eq!(a, i32s(&[1, 2]));
        // Along axis 0 (strided blocks): ties take the first.
        let a = red(ReduceOp::ArgMax, 0b01, false, x.clone(), &[2, 4]).unwrap();
        assert_eq!(a, i32s(&[1, 0, 0, 0]));
        let a = red(ReduceOp::ArgMax, 0b11, false, i32s(&[2, 7, 7, 1]), &[2, 2]).unwrap();
        assert_eq!(a, i32s(&[1]));
        let a = red(ReduceOp::ArgMin, 0b01, false, i32s(&[2, 7, 7, 1, 2, 1]), &[3, 2]).unwrap();
        assert_eq!(a, i32s(&[0, 1]));
    }

    /// Run the reduction with and without the fast loops; the bits must match.
    fn both(op: ReduceOp, axes: u32, x: &[f32], dims: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let xs = CpuStorage::F32(x.to_vec());
        let od = reduced_dims(dims, AxisSet(axes), false);
        let n: usize = od.iter().product();
        let inp = In { data: &xs, dims, dtype: DType::F32 };
        let mut res = vec![];
        for fast in [true, false] {
            let mut o = CpuStorage::F32(vec![7.0; n]);
            let mut out = Out { data: &mut o, dims: &od, dtype: DType::F32 };
            reduce_with::<false>(op, AxisSet(axes), &inp, &mut out, fast).unwrap();
            let CpuStorage::F32(v) = o else { unreachable!() };
            res.push(v);
        }
        (res.remove(0), res.remove(0))
    }

    /// The compact build's reductions (one set of loops for the four folds
    /// of f64 and i32) give the same bits as one loop per op.
    #[test]
    fn compact_folds_give_the_same_bits() {
        let dims = [40, 3, 300];
        let x = rand_f32(40 * 3 * 300, 5);
        let f64s: Vec<f64> = x.iter().map(|&v| v as f64 * 3.0).collect();
        let i32s: Vec<i32> = x.iter().map(|&v| (v * 1000.0) as i32).collect();
        for data in [CpuStorage::F64(f64s), CpuStorage::I32(i32s)] {
            let dtype = data.dtype();
            let inp = In { data: &data, dims: &dims, dtype };
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                for axes in [0b001, 0b010, 0b100, 0b101, 0b111, 0b000] {
                    let od = reduced_dims(&dims, AxisSet(axes), false);
                    let n: usize = od.iter().product();
                    let mut res = vec![];
                    for compact in [false, true] {
                        let mut o = CpuStorage::zeroed(dtype, n).unwrap();
                        let mut out = Out { data: &mut o, dims: &od, dtype };
                        if compact {
                            reduce_with::<true>(op, AxisSet(axes), &inp, &mut out, true).unwrap();
                        } else {
                            reduce_with::<false>(op, AxisSet(axes), &inp, &mut out, true).unwrap();
                        }
                        res.push(match o {
                            CpuStorage::F64(v) => v.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            CpuStorage::I32(v) => v.iter().map(|&v| v as u64).collect(),
                            _ => unreachable!(),
                        });
                    }
                    assert_eq!(res[0], res[1], "{op:?} {dtype} axes {axes:b}");
                }
            }
        }
    }

    #[test]
    fn fast_paths_match_generic_bits() {
        let dims = [600, 513];
        let x = rand_f32(600 * 513, 11);
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Prod] {
            for axes in [0b01, 0b10, 0b11] {
                let (a, b) = both(op, axes, &x, &dims);
                assert_eq!(
                    a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{op:?} {axes:b}"
                );
            }
        }
        // Prefix of two axes, with a unit axis in between.
        let (a, b) = both(ReduceOp::Sum, 0b011, &x, &[60, 10, 513]);
        assert_eq!(a, b);
        let (a, b) = both(ReduceOp::Sum, 0b0101, &x, &[60, 1, 10, 513]);
        assert_eq!(a, b);
        // And the sum of column 0 is the rule's: 600 rows are 5 leaves.
        let (a, _) = both(ReduceOp::Sum, 0b01, &x, &dims);
        let column: Vec<f32> = (0..600).map(|r| x[r * 513]).collect();
        assert_eq!(a[0].to_bits(), reference_sum(&column).to_bits());
    }

    /// Blocks of contiguous runs (`Runs`: a conv bias gradient's [N, C, H,
    /// W] over N, H and W) give the generic loop's bits and the rule's,
    /// with runs shorter and longer than a leaf and than `fold_runs`'s
    /// chunk, runs crossing chunk boundaries, and Max/Prod as well as Sum.
    #[test]
    fn runs_match_generic_bits() {
        let cases: [(&[usize], u32); 5] = [
            (&[5, 3, 7, 40], 0b1101),   // runs of 280: conv-like
            (&[3, 2, 100, 50], 0b1101), // runs of 5,000, 15,000 a block: 2 chunks
            (&[40, 2, 17], 0b101),      // runs of 17, just above MIN_RUN
            (&[4, 3, 2, 9000], 0b1011), // runs of 9,000 > a chunk, two kept axes apart
            (&[6, 4, 8], 0b101),        // runs of 8: below MIN_RUN, the offsets table
        ];
        for (dims, axes) in cases {
            let n: usize = dims.iter().product();
            let x = rand_f32(n, 23);
            let mut g = Geometry::new(dims, AxisSet(axes));
            g.find_runs();
            assert_eq!(g.runs.is_some(), dims[dims.len() - 1] >= MIN_RUN, "{dims:?}");
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Prod] {
                let (fast, generic) = both(op, axes, &x, dims);
                assert_eq!(bits(&fast), bits(&generic), "{op:?} {dims:?} {axes:b}");
            }
            // Output 0's sum against the rule's definition.
            let (fast, _) = both(ReduceOp::Sum, axes, &x, dims);
            let offs = g.block_offsets();
            let seq: Vec<f32> = offs.iter().map(|&o| x[o]).collect();
            assert_eq!(fast[0].to_bits(), reference_sum(&seq).to_bits(), "{dims:?}");
        }
    }

    /// docs/reductions.md's rule written as its definition: leaves of 128
    /// folded from 0, combined by the power-of-two split.
    fn reference_sum(x: &[f32]) -> f32 {
        fn split(v: &[f32]) -> f32 {
            if v.len() == 1 {
                return v[0];
            }
            let h = 1usize << (usize::BITS - 1 - (v.len() - 1).leading_zeros());
            split(&v[..h]) + split(&v[h..])
        }
        let leaves: Vec<f32> = x.chunks(LEAF).map(|c| c.iter().fold(0.0f32, |a, &v| a + v)).collect();
        if leaves.is_empty() {
            0.0
        } else {
            split(&leaves)
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }

    /// Sums of `n` values in the three layouts (contiguous blocks, columns,
    /// strided axes) and the generic loop, against the reference.
    fn check_rule(n: usize, seed: u64) {
        let x = rand_f32(n * 3, seed);
        // [3, n] over axis 1: contiguous blocks.
        let (fast, generic) = both(ReduceOp::Sum, 0b10, &x, &[3, n]);
        let want: Vec<f32> = (0..3).map(|r| reference_sum(&x[r * n..(r + 1) * n])).collect();
        assert_eq!(bits(&fast), bits(&want), "contiguous, n = {n}");
        assert_eq!(bits(&generic), bits(&want), "generic, n = {n}");
        // [n, 3] over axis 0: columns.
        let (fast, _) = both(ReduceOp::Sum, 0b01, &x, &[n, 3]);
        let want: Vec<f32> = (0..3).map(|c| reference_sum(&(0..n).map(|r| x[r * 3 + c]).collect::<Vec<_>>())).collect();
        assert_eq!(bits(&fast), bits(&want), "columns, n = {n}");
        // [n, 3, 1] over axes 0 and 2 with n split as [a, 3, b]: strided.
        if n % 2 == 0 && n > 0 {
            let (a, b) = (2, n / 2);
            let (got, _) = both(ReduceOp::Sum, 0b101, &x, &[a, 3, b]);
            let want: Vec<f32> = (0..3)
                .map(|c| {
                    let seq: Vec<f32> = (0..a)
                        .flat_map(|i| (0..b).map(move |k| (i, k)))
                        .map(|(i, k)| x[i * 3 * b + c * b + k])
                        .collect();
                    reference_sum(&seq)
                })
                .collect();
            assert_eq!(bits(&got), bits(&want), "strided, n = {n}");
        }
    }

    #[test]
    fn sums_follow_the_rule_bit_for_bit() {
        for n in (0..300).chain([383, 384, 385, 1023, 1024, 1025, 1026, 8 * 128 * 3 + 5, 5000, 70_001, 1 << 17]) {
            check_rule(n, n as u64);
        }
    }

    /// The same bits with 1, 2, 3 and 4 threads, in every layout and with
    /// few long blocks (split inside) as well as many short ones.
    #[cfg(feature = "rayon")]
    #[test]
    fn thread_count_does_not_change_the_bits() {
        let x = rand_f32(3 << 20, 9);
        let cases: [(&[usize], u32); 5] = [
            (&[3 << 20], 0b1),
            (&[3, 1 << 20], 0b10),
            (&[1 << 20, 3], 0b01),
            (&[4, 3, 1 << 18], 0b101),
            (&[3 << 12, 256], 0b10),
        ];
        for (dims, axes) in cases {
            let mut seen: Option<Vec<u32>> = None;
            for threads in [1, 2, 3, 4] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let (got, generic) = pool.install(|| both(ReduceOp::Sum, axes, &x, dims));
                assert_eq!(bits(&got), bits(&generic), "{dims:?} {axes:b} {threads} threads");
                match &seen {
                    None => seen = Some(bits(&got)),
                    Some(s) => assert_eq!(&bits(&got), s, "{dims:?} {axes:b} with {threads} threads"),
                }
            }
        }
    }

    #[test]
    fn error_grows_like_log_n() {
        // 2^22 ones: a serial f32 fold is exact here too, so use a value
        // whose partial sums round: 0.1 (serial: off by about 2 %).
        let n = 1 << 22;
        let x = vec![0.1f32; n];
        let got = red(ReduceOp::Sum, 0b1, false, f32s(&x), &[n]).unwrap().to_f64_vec()[0];
        let exact = f64::from(0.1f32) * n as f64;
        assert!(((got - exact) / exact).abs() < 1e-5, "{got} vs {exact}");
        let serial = x.iter().fold(0.0f32, |a, &v| a + v) as f64;
        assert!(((serial - exact) / exact).abs() > 1e-3, "the serial fold is visibly worse: {serial}");
    }

    #[test]
    fn determinism() {
        let x = rand_f32(1 << 18, 5);
        let d = [512, 512];
        let r1 = red(ReduceOp::Sum, 0b11, false, f32s(&x), &d).unwrap();
        let r2 = red(ReduceOp::Sum, 0b11, false, f32s(&x), &d).unwrap();
        assert_eq!(r1, r2);
        let r1 = red(ReduceOp::Sum, 0b01, false, f32s(&x), &d).unwrap();
        let r2 = red(ReduceOp::Sum, 0b01, false, f32s(&x), &d).unwrap();
        assert_eq!(r1, r2);
    }
}
