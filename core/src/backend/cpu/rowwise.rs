//! Row-wise kernels over the last axis: CausalSoftmax. Each row is written
//! by one thread: the max, then the exponentials summed by the summation
//! rule (docs/reductions.md: leaves of `LEAF`, a power-of-two tree; the wgpu
//! kernel sums in the same order), then the quotients. Results are identical
//! run after run at any thread count.

#[cfg(not(target_arch = "wasm32"))]
use super::layout::for_chunks_weighted;
#[cfg(not(target_arch = "wasm32"))]
use super::reduce::{Tree, LEAF};
#[cfg(not(target_arch = "wasm32"))]
use super::scalar::Num;
#[cfg(not(target_arch = "wasm32"))]
use super::simd::{dispatch, Kernel};
#[cfg(not(target_arch = "wasm32"))]
use super::{with_float, In, Out};
#[cfg(not(target_arch = "wasm32"))]
use crate::backend::checks;
#[cfg(not(target_arch = "wasm32"))]
use crate::error::Result;
#[cfg(not(target_arch = "wasm32"))]
use crate::op::{BinaryOp, UnaryOp};

/// Work per element relative to an add (an exp and a divide).
#[cfg(not(target_arch = "wasm32"))]
const COST: usize = 16;

/// `portable`: exp from the portable functions (`CpuNumerics::Portable`;
/// it matters for f64 only: f32 exp is kiln's own either way).
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn causal_softmax(diagonal: i32, [x]: &[In<'_>; 1], out: &mut Out<'_>, portable: bool) -> Result<()> {
    const OP: &str = "CausalSoftmax";
    let (rows, cols) = checks::causal_softmax(OP, x.dims, x.dtype, out.dims, out.dtype)?;
    if out.numel() == 0 {
        return Ok(());
    }
    with_float!(x.dtype, OP, T => {
        let src = x.slice::<T>(OP)?;
        for_chunks_weighted(out.slice::<T>(OP)?, cols, COST, |start, chunk| {
            if portable {
                dispatch(Rows::<T, true> { src, chunk, first: start / cols, rows, cols, diagonal });
            } else {
                dispatch(Rows::<T, false> { src, chunk, first: start / cols, rows, cols, diagonal });
            }
        });
        Ok(())
    })
}

/// Rows `first..` of a CausalSoftmax into `chunk`, to run with the widest
/// vectors the CPU has.
#[cfg(not(target_arch = "wasm32"))]
struct Rows<'a, T, const PORTABLE: bool> {
    src: &'a [T],
    chunk: &'a mut [T],
    first: usize,
    rows: usize,
    cols: usize,
    diagonal: i32,
}

#[cfg(not(target_arch = "wasm32"))]
impl<T: Num, const PORTABLE: bool> Kernel for Rows<'_, T, PORTABLE> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let cols = self.cols;
        for (k, dst) in self.chunk.chunks_exact_mut(cols).enumerate() {
            let r = self.first + k;
            let kept = checks::causal_kept(r % self.rows, cols, self.diagonal);
            softmax_row::<T, PORTABLE>(&self.src[r * cols..][..cols], kept, dst);
        }
    }
}

/// Softmax of `x[..kept]` into `dst[..kept]`, zeros after. A row whose kept
/// entries are all -inf (or that keeps none) is all zeros; a NaN among them
/// makes the row NaN, as in the plain softmax.
#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
fn softmax_row<T: Num, const PORTABLE: bool>(x: &[T], kept: usize, dst: &mut [T]) {
    let (head, tail) = dst.split_at_mut(kept);
    tail.fill(T::ZERO);
    let max = x[..kept].iter().fold(T::from_f64(f64::NEG_INFINITY), |m, &v| m.max(v));
    if max.to_f64() == f64::NEG_INFINITY {
        head.fill(T::ZERO);
        return;
    }
    // A serial sum of exponentials stops growing at 2^24 terms in f32; the
    // rule's error grows like log n.
    let add = |a: T, b: T| a.add(b);
    let mut tree = Tree::new();
    for (leaf, xs) in head.chunks_mut(LEAF).zip(x.chunks(LEAF)) {
        // The exponentials first (a loop that vectorises), then their sum in
        // index order (a serial chain either way).
        for (d, &v) in leaf.iter_mut().zip(xs) {
            let shifted = T::binary(BinaryOp::Sub, v, max);
            *d = if PORTABLE { T::unary_portable(UnaryOp::Exp, shifted) } else { T::unary(UnaryOp::Exp, shifted) };
        }
        let acc = leaf.iter().fold(T::ZERO, |acc, &e| acc.add(e));
        tree.push(acc, &add);
    }
    let total = tree.finish(&add).unwrap_or(T::ZERO);
    for d in head.iter_mut() {
        *d = T::binary(BinaryOp::Div, *d, total);
    }
}

/// The browser build's kernel: the same rows in one loop each (fewer
/// download bytes than the kernel above; the same operations in the same
/// order, so the same bits).
#[cfg(target_arch = "wasm32")]
mod compact {
    use super::super::layout::for_chunks_weighted;
    use super::super::reduce::{Tree, LEAF};
    use super::super::scalar::Num;
    use super::super::{with_float, In, Out};
    use crate::backend::checks;
    use crate::error::Result;
    use crate::op::{BinaryOp, UnaryOp};

    /// Work per element relative to an add (an exp and a divide).
    const COST: usize = 16;

    pub(in crate::backend::cpu) fn causal_softmax(diagonal: i32, [x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
        const OP: &str = "CausalSoftmax";
        let (rows, cols) = checks::causal_softmax(OP, x.dims, x.dtype, out.dims, out.dtype)?;
        if out.numel() == 0 {
            return Ok(());
        }
        with_float!(x.dtype, OP, T => {
            let src = x.slice::<T>(OP)?;
            for_chunks_weighted(out.slice::<T>(OP)?, cols, COST, |start, chunk| {
                for (k, dst) in chunk.chunks_exact_mut(cols).enumerate() {
                    let r = start / cols + k;
                    let kept = checks::causal_kept(r % rows, cols, diagonal);
                    softmax_row(&src[r * cols..][..cols], kept, dst);
                }
            });
            Ok(())
        })
    }

    /// Softmax of `x[..kept]` into `dst[..kept]`, zeros after. A row whose kept
    /// entries are all -inf (or that keeps none) is all zeros; a NaN among them
    /// makes the row NaN, as in the plain softmax.
    fn softmax_row<T: Num>(x: &[T], kept: usize, dst: &mut [T]) {
        let (head, tail) = dst.split_at_mut(kept);
        tail.fill(T::ZERO);
        let max = x[..kept].iter().fold(T::from_f64(f64::NEG_INFINITY), |m, &v| m.max(v));
        if max.to_f64() == f64::NEG_INFINITY {
            head.fill(T::ZERO);
            return;
        }
        // A serial sum of exponentials stops growing at 2^24 terms in f32; the
        // rule's error grows like log n.
        let add = |a: T, b: T| a.add(b);
        let mut tree = Tree::new();
        for (leaf, xs) in head.chunks_mut(LEAF).zip(x.chunks(LEAF)) {
            let mut acc = T::ZERO;
            for (d, &v) in leaf.iter_mut().zip(xs) {
                let e = T::unary(UnaryOp::Exp, T::binary(BinaryOp::Sub, v, max));
                *d = e;
                acc = acc.add(e);
            }
            tree.push(acc, &add);
        }
        let total = tree.finish(&add).unwrap_or(T::ZERO);
        for d in head.iter_mut() {
            *d = T::binary(BinaryOp::Div, *d, total);
        }
    }
}
#[cfg(target_arch = "wasm32")]
pub(super) use compact::causal_softmax;
