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
        let mut first = self.first;
        let mut rest = self.chunk;
        // Rows of one leaf (attention's rows usually are): LOCKSTEP rows at
        // a time, so that their serial max and sum chains interleave.
        if cols <= LEAF {
            let mut groups = rest.chunks_exact_mut(LOCKSTEP * cols);
            for dst in &mut groups {
                softmax_rows::<T, PORTABLE, LOCKSTEP>(
                    &self.src[first * cols..][..LOCKSTEP * cols],
                    dst,
                    first,
                    self.rows,
                    self.diagonal,
                );
                first += LOCKSTEP;
            }
            rest = groups.into_remainder();
        }
        for (k, dst) in rest.chunks_exact_mut(cols).enumerate() {
            let r = first + k;
            let kept = checks::causal_kept(r % self.rows, cols, self.diagonal);
            softmax_row::<T, PORTABLE>(&self.src[r * cols..][..cols], kept, dst);
        }
    }
}

/// Rows handled together by `softmax_rows`.
#[cfg(not(target_arch = "wasm32"))]
const LOCKSTEP: usize = 8;

/// `softmax_row` for R rows `first..` of at most `LEAF` columns (x and dst
/// hold R whole rows), with the same operations in the same order per row.
/// A row's max is one serial chain and its sum (one leaf) another, each a
/// few cycles per element; the R rows' chains run side by side. Positions
/// past a row's kept count enter its max as -inf and its sum as the 0
/// written there, which change nothing: max(m, -inf) = m (NaN included),
/// and the sum, which starts at +0 and adds exponentials (≥ +0 or NaN), is
/// never -0, so adding +0 keeps its bits.
#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
fn softmax_rows<T: Num, const PORTABLE: bool, const R: usize>(
    x: &[T],
    dst: &mut [T],
    first: usize,
    rows: usize,
    diagonal: i32,
) {
    let cols = dst.len() / R;
    let kept: [usize; R] = std::array::from_fn(|k| checks::causal_kept((first + k) % rows, cols, diagonal));
    let (x, dst) = (&x[..R * cols], &mut dst[..R * cols]);
    let low = T::from_f64(f64::NEG_INFINITY);
    let mut max = [low; R];
    for j in 0..cols {
        for (r, m) in max.iter_mut().enumerate() {
            let v = if j < kept[r] { x[r * cols + j] } else { low };
            *m = m.max(v);
        }
    }
    for (r, (d, xs)) in dst.chunks_exact_mut(cols).zip(x.chunks_exact(cols)).enumerate() {
        let (head, tail) = d.split_at_mut(kept[r]);
        tail.fill(T::ZERO);
        if max[r].to_f64() == f64::NEG_INFINITY {
            head.fill(T::ZERO);
            continue;
        }
        for (d, &v) in head.iter_mut().zip(xs) {
            *d = exp_shifted::<T, PORTABLE>(v, max[r]);
        }
    }
    let mut total = [T::ZERO; R];
    for j in 0..cols {
        for (r, t) in total.iter_mut().enumerate() {
            *t = t.add(dst[r * cols + j]);
        }
    }
    for (r, d) in dst.chunks_exact_mut(cols).enumerate() {
        if max[r].to_f64() == f64::NEG_INFINITY {
            continue;
        }
        for d in &mut d[..kept[r]] {
            *d = T::binary(BinaryOp::Div, *d, total[r]);
        }
    }
}

/// e^(v − max), the one exponential both native row kernels compute
/// (portable numerics' exp when asked), so that they keep the same bits.
#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
fn exp_shifted<T: Num, const PORTABLE: bool>(v: T, max: T) -> T {
    let shifted = T::binary(BinaryOp::Sub, v, max);
    if PORTABLE {
        T::unary_portable(UnaryOp::Exp, shifted)
    } else {
        T::unary(UnaryOp::Exp, shifted)
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
            *d = exp_shifted::<T, PORTABLE>(v, max);
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

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuStorage;

    /// The kernel (rows in lockstep where they fit one leaf) against
    /// `softmax_row` row by row, bit for bit: row counts around the
    /// lockstep group, every kind of diagonal (empty rows, full rows),
    /// rows of -inf, a NaN, and a row longer than a leaf.
    #[test]
    fn rows_in_lockstep_give_the_bits_of_one_row_at_a_time() {
        for (batch, rows, cols, diagonal) in [
            (3usize, 8usize, 8usize, 0i32),
            (2, 13, 64, 0),
            (1, 9, 5, -3),
            (4, 7, 16, 2),
            (1, 17, 128, 0),
            (1, 10, 129, 0),
        ] {
            let n = batch * rows * cols;
            let mut x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.07).collect();
            // Row 2 all -inf, row 5 with a NaN and a -inf.
            x[2 * cols..3 * cols].fill(f32::NEG_INFINITY);
            x[5 * cols] = f32::NAN;
            x[5 * cols + cols - 1] = f32::NEG_INFINITY;
            let dims = [batch, rows, cols];
            let xs = CpuStorage::F32(x.clone());
            let mut y = CpuStorage::F32(vec![7.0; n]);
            let input = In { data: &xs, dims: &dims, dtype: crate::DType::F32 };
            let mut out = Out { data: &mut y, dims: &dims, dtype: crate::DType::F32 };
            causal_softmax(diagonal, &[input], &mut out, false).unwrap();
            let CpuStorage::F32(y) = y else { unreachable!() };
            let mut want = vec![7.0f32; n];
            for (r, d) in want.chunks_exact_mut(cols).enumerate() {
                let kept = checks::causal_kept(r % rows, cols, diagonal);
                softmax_row::<f32, false>(&x[r * cols..][..cols], kept, d);
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y), bits(&want), "{batch} x {rows} x {cols}, diagonal {diagonal}");
        }
    }
}
