//! The matrix product of portable numerics (`CpuNumerics::Portable`),
//! natively: the browser build's bits (`simd_gemm`, and the plain loop of
//! `matmul::gemm_chunk`), faster than that plain loop.
//!
//! Every output element is `((0 + a0·b0) + a1·b1) + ...`: a sum over k in
//! order from +0.0, each product rounded before it is added (no fused
//! multiply-add: Rust never contracts `x + y * z`, and nothing here calls
//! `mul_add`). Only the order over k decides the bits, so the register
//! tiles (MR × NR, vectorised across the NR columns), the KC blocks (a
//! block starts from the previous block's partial sum, as `simd_gemm`
//! does), the row blocks spread over threads and the instruction set
//! (`simd::dispatch`: SSE2, AVX2, AVX-512, the same IEEE operations on
//! wider registers) change the speed only. The tests check the bits against
//! a scalar in-order loop.

use gemm::Parallelism;

use super::scalar::Float;
use super::simd::{dispatch, Kernel};
use crate::backend::checks::Mat;

/// Rows × columns of a register tile: 4 × 16 f32 accumulators are eight
/// AVX2 registers (four AVX-512 ones).
const MR: usize = 4;
const NR: usize = 16;
/// k per packed block: a KC × NR panel of b (16 KiB in f32) and a KC × MR
/// panel of a stay in L1.
const KC: usize = 256;
/// The most rows of the output one task computes.
const MC: usize = 64;

/// dst (row-major a.rows × b.cols, overwritten) = a × b, operands read
/// through their strides. The caller checked that the buffers span the
/// shapes. Rows are cut into blocks by the thread count when `par` asks for
/// threads: each output element is still one task's in-order sum, so the
/// bits do not depend on the cut.
pub(super) fn gemm<T: Float>(a: &Mat, b: &Mat, lhs: &[T], rhs: &[T], dst: &mut [T], par: Parallelism) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(b.rows == k && dst.len() == m * n && lhs.len() >= a.span() && rhs.len() >= b.span());
    if m == 0 || n == 0 {
        return;
    }
    let rows = |i0: usize, block: &mut [T]| dispatch(Rows { a, b, lhs, rhs, i0, dst: block });
    #[cfg(feature = "rayon")]
    if !matches!(par, Parallelism::None) {
        use rayon::prelude::*;
        let per = m.div_ceil(4 * rayon::current_num_threads()).next_multiple_of(MR).clamp(MR, MC);
        dst.par_chunks_mut(per * n).enumerate().for_each(|(c, block)| rows(c * per, block));
        return;
    }
    let _ = par;
    for (c, block) in dst.chunks_mut(MC * n).enumerate() {
        rows(c * MC, block);
    }
}

/// Rows i0.. of the product into `dst` (whole rows of width b.cols), with
/// the widest vectors the CPU has.
struct Rows<'a, T> {
    a: &'a Mat,
    b: &'a Mat,
    lhs: &'a [T],
    rhs: &'a [T],
    i0: usize,
    dst: &'a mut [T],
}

impl<T: Float> Kernel for Rows<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let Rows { a, b, lhs, rhs, i0, dst } = self;
        let (k, n) = (a.cols, b.cols);
        let mc = dst.len() / n;
        let mut pa = vec![T::ZERO; mc.next_multiple_of(MR) * KC.min(k)];
        let mut pb = vec![T::ZERO; NR * KC.min(k)];
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            pack_a(a, lhs, i0, mc, p0, kc, &mut pa);
            for j0 in (0..n).step_by(NR) {
                let cols = NR.min(n - j0);
                pack_b(b, rhs, p0, kc, j0, cols, &mut pb);
                for ir in (0..mc).step_by(MR) {
                    let tile = Tile { i: ir, j: j0, rows: MR.min(mc - ir), cols, n };
                    kernel(kc, &pa[ir * kc..][..kc * MR], &pb[..kc * NR], dst, tile, p0 > 0);
                }
            }
        }
    }
}

/// Rows i0..i0 + mc, columns p0..p0 + kc of a as MR-row panels, each
/// kc × MR along k (rows past mc zero).
#[inline(always)]
fn pack_a<T: Float>(a: &Mat, lhs: &[T], i0: usize, mc: usize, p0: usize, kc: usize, out: &mut [T]) {
    for ir in (0..mc).step_by(MR) {
        let panel = &mut out[ir * kc..][..kc * MR];
        for r in 0..MR {
            if ir + r < mc {
                let row = (i0 + ir + r) * a.rs + p0 * a.cs;
                for p in 0..kc {
                    panel[p * MR + r] = lhs[row + p * a.cs];
                }
            } else {
                for p in 0..kc {
                    panel[p * MR + r] = T::ZERO;
                }
            }
        }
    }
}

/// Rows p0..p0 + kc, columns j0..j0 + cols of b as one kc × NR panel
/// (columns past `cols` zero), read along b's contiguous direction.
#[inline(always)]
fn pack_b<T: Float>(b: &Mat, rhs: &[T], p0: usize, kc: usize, j0: usize, cols: usize, out: &mut [T]) {
    let base = p0 * b.rs + j0 * b.cs;
    if b.cs == 1 {
        for p in 0..kc {
            let row = &rhs[base + p * b.rs..][..cols];
            let o = &mut out[p * NR..][..NR];
            o[..cols].copy_from_slice(row);
            o[cols..].fill(T::ZERO);
        }
    } else {
        for c in 0..NR {
            for p in 0..kc {
                out[p * NR + c] = if c < cols { rhs[base + c * b.cs + p * b.rs] } else { T::ZERO };
            }
        }
    }
}

/// Where a register tile goes in dst: its first row (of the block) and
/// column, how many of its MR × NR elements are inside dst, dst's width.
#[derive(Clone, Copy)]
struct Tile {
    i: usize,
    j: usize,
    rows: usize,
    cols: usize,
    n: usize,
}

/// One MR × NR tile: (dst if `accumulate`, else +0.0) + Σ over the kc
/// steps, in order, of a's column × b's row, each product rounded first.
///
/// The four rows are four separate accumulator arrays, each updated by
/// `row_axpy`: written as one `[[T; NR]; MR]` with nested loops, LLVM's SLP
/// vectoriser packed the MR rows into one vector instead of the NR columns
/// and, with AVX-512, gathered and scattered the accumulators through
/// memory at every k (0.9 GFLOP/s on W4; the asm had `vgatherdps`). One
/// array per row leaves it only the column direction to vectorise.
#[inline(always)]
fn kernel<T: Float>(kc: usize, ap: &[T], bp: &[T], dst: &mut [T], t: Tile, accumulate: bool) {
    const { assert!(MR == 4, "kernel keeps one accumulator array per row") };
    let mut acc = [[T::ZERO; NR]; MR];
    if accumulate {
        for (r, acc) in acc.iter_mut().enumerate().take(t.rows) {
            acc[..t.cols].copy_from_slice(&dst[(t.i + r) * t.n + t.j..][..t.cols]);
        }
    }
    let [mut r0, mut r1, mut r2, mut r3] = acc;
    for (av, bv) in ap.chunks_exact(MR).zip(bp.chunks_exact(NR)).take(kc) {
        let bv: &[T; NR] = bv.try_into().expect("NR elements");
        row_axpy(&mut r0, av[0], bv);
        row_axpy(&mut r1, av[1], bv);
        row_axpy(&mut r2, av[2], bv);
        row_axpy(&mut r3, av[3], bv);
    }
    let acc = [r0, r1, r2, r3];
    for (r, acc) in acc.iter().enumerate().take(t.rows) {
        dst[(t.i + r) * t.n + t.j..][..t.cols].copy_from_slice(&acc[..t.cols]);
    }
}

/// row += x · b, element by element (a rounded product, then the sum).
#[inline(always)]
fn row_axpy<T: Float>(row: &mut [T; NR], x: T, b: &[T; NR]) {
    for (c, &y) in row.iter_mut().zip(b) {
        *c = *c + x * y;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::rand_f32;
    use super::*;

    /// The reference: each output summed over k in order from +0.0, one
    /// rounded product added at a time.
    fn in_order<T: Float>(a: &Mat, b: &Mat, lhs: &[T], rhs: &[T]) -> Vec<T> {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let mut out = vec![T::ZERO; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = T::ZERO;
                for p in 0..k {
                    s = s + lhs[i * a.rs + p * a.cs] * rhs[p * b.rs + j * b.cs];
                }
                out[i * n + j] = s;
            }
        }
        out
    }

    fn mats(m: usize, k: usize, n: usize, ta: bool, tb: bool) -> (Mat, Mat) {
        let a = if ta { Mat { rows: m, cols: k, rs: 1, cs: m } } else { Mat { rows: m, cols: k, rs: k, cs: 1 } };
        let b = if tb { Mat { rows: k, cols: n, rs: 1, cs: k } } else { Mat { rows: k, cols: n, rs: n, cs: 1 } };
        (a, b)
    }

    fn pars() -> Vec<Parallelism> {
        let mut p = vec![Parallelism::None];
        if cfg!(feature = "rayon") {
            p.push(Parallelism::Rayon(0));
        }
        p
    }

    /// Odd shapes (edges of every tile and block: m and n not multiples of
    /// MR, NR, MC; k across KC), every transpose, f32 and f64, serial and
    /// threaded: the same bits as the in-order loop.
    #[test]
    fn equals_the_in_order_sum_bit_for_bit() {
        let shapes = [(1, 1, 1), (3, 5, 7), (5, 17, 33), (13, 300, 19), (70, 257, 31), (65, 513, 129), (130, 40, 17)];
        for (m, k, n) in shapes {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let (a, b) = mats(m, k, n, ta, tb);
                // Values of mixed magnitude, so that any other order or an
                // unrounded product changes low bits.
                let lhs: Vec<f32> =
                    rand_f32(a.span(), 7).iter().enumerate().map(|(i, v)| v * (1 + i % 13) as f32).collect();
                let rhs: Vec<f32> =
                    rand_f32(b.span(), 8).iter().enumerate().map(|(i, v)| v / (1 + i % 7) as f32).collect();
                let want = in_order(&a, &b, &lhs, &rhs);
                let (l64, r64): (Vec<f64>, Vec<f64>) = (
                    lhs.iter().map(|&v| f64::from(v) / 3.0).collect(),
                    rhs.iter().map(|&v| f64::from(v) * 1.1).collect(),
                );
                let want64 = in_order(&a, &b, &l64, &r64);
                for par in pars() {
                    let mut dst = vec![f32::NAN; m * n];
                    gemm(&a, &b, &lhs, &rhs, &mut dst, par);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&dst), bits(&want), "f32 {m}x{k}x{n} ta {ta} tb {tb} {par:?}");
                    let mut dst = vec![f64::NAN; m * n];
                    gemm(&a, &b, &l64, &r64, &mut dst, par);
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&dst), bits(&want64), "f64 {m}x{k}x{n} ta {ta} tb {tb} {par:?}");
                }
            }
        }
    }

    /// Inputs built so that a fused multiply-add, or any order but k = 0,
    /// 1, 2, ..., gives another result, in every column of a wide product
    /// (every lane of every tile), across a KC block boundary. In order:
    /// 2²⁴ + 1 rounds to 2²⁴ (a tie, to even), − 2²⁴ gives 0 (any order
    /// that cancels the big terms first gives 1); then −(1 + 2⁻¹¹) plus
    /// e·e with e = 1 + 2⁻¹²: the product 1 + 2⁻¹¹ + 2⁻²⁴ rounds to
    /// 1 + 2⁻¹¹ (a tie, to even), so the sum is 0, where a fused
    /// multiply-add keeps 2⁻²⁴.
    #[test]
    fn a_fused_multiply_add_or_another_order_would_fail() {
        let e = 1.0 + 2f32.powi(-12);
        let big = 2f32.powi(24);
        let (m, n) = (9, 37);
        let k = KC + 5;
        let mut lhs = vec![1.0f32; m * k];
        let mut rhs = vec![0.0f32; k * n];
        for i in 0..m {
            lhs[i * k + KC + 2] = e;
        }
        for j in 0..n {
            rhs[(KC - 2) * n + j] = big;
            rhs[(KC - 1) * n + j] = 1.0;
            rhs[KC * n + j] = -big;
            rhs[(KC + 1) * n + j] = -(1.0 + 2f32.powi(-11));
            rhs[(KC + 2) * n + j] = e;
        }
        let (a, b) = mats(m, k, n, false, false);
        let want = in_order(&a, &b, &lhs, &rhs);
        // The reference itself differs from the two wrong evaluations.
        let fused: f32 = {
            let mut s = 0.0f32;
            for p in 0..k {
                s = lhs[p].mul_add(rhs[p * n], s);
            }
            s
        };
        let reversed: f32 = (0..k).rev().fold(0.0f32, |s, p| s + lhs[p] * rhs[p * n]);
        assert_ne!(fused.to_bits(), want[0].to_bits(), "the test must tell a fused multiply-add apart");
        assert_ne!(reversed.to_bits(), want[0].to_bits(), "the test must tell the order apart");
        for par in pars() {
            let mut dst = vec![f32::NAN; m * n];
            gemm(&a, &b, &lhs, &rhs, &mut dst, par);
            for (g, w) in dst.iter().zip(&want) {
                assert_eq!(g.to_bits(), w.to_bits(), "{par:?}: {g} vs {w}");
            }
        }
    }
}
