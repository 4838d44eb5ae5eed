//! LayerNorm and LayerNormBackward over the last axis (native builds only:
//! the browser build composes layer norm from ordinary ops, see
//! `Tensor::layer_norm`).
//!
//! Each row's sums follow the summation rule (docs/reductions.md: leaves
//! of `LEAF` folded in order from 0, combined by the power-of-two tree), in
//! the tensor's dtype, `LANES` rows in lockstep so their dependency chains
//! interleave. The forward pass is the composed form's arithmetic, operation
//! for operation — mean = Σx / n, c = x − mean, r = 1 / √(Σc² / n + eps),
//! y = c · r — so its values are bit for bit those of the ops it replaces.
//! The backward pass recomputes c and r the same way, then
//! dx = ((g − Σg / n) − x̂ · (Σg·x̂ / n)) · r with x̂ = c · r. Rows are
//! independent: the bits do not depend on the thread count.

use std::array::from_fn;

use super::layout::for_chunks_weighted;
use super::reduce::{Tree, LEAF};
use super::scalar::{Num, Scalar};
use super::simd::{dispatch, Kernel};
use super::{with_float, In, Out};
use crate::backend::checks;
use crate::error::Result;
use crate::op::{BinaryOp, UnaryOp};

/// Rows whose sums run in lockstep.
const LANES: usize = 8;
/// Work per element relative to an add (two sums and three element passes
/// forward; three sums and four passes backward).
const FORWARD_COST: usize = 6;
const BACKWARD_COST: usize = 10;

pub(super) fn layer_norm(eps: f64, [x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "LayerNorm";
    let n = checks::layer_norm(OP, &[(x.dims, x.dtype)], out.dims, out.dtype)?;
    if out.numel() == 0 {
        return Ok(());
    }
    with_float!(x.dtype, OP, T => {
        let src = x.slice::<T>(OP)?;
        let eps = T::from_f64(eps);
        for_chunks_weighted(out.slice::<T>(OP)?, n, FORWARD_COST, |start, chunk| {
            dispatch(Forward { x: &src[start..start + chunk.len()], y: chunk, n, eps });
        });
        Ok(())
    })
}

pub(super) fn layer_norm_backward(eps: f64, [x, g]: &[In<'_>; 2], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "LayerNormBackward";
    let n = checks::layer_norm(OP, &[(x.dims, x.dtype), (g.dims, g.dtype)], out.dims, out.dtype)?;
    if out.numel() == 0 {
        return Ok(());
    }
    with_float!(x.dtype, OP, T => {
        let (xs, gs) = (x.slice::<T>(OP)?, g.slice::<T>(OP)?);
        let eps = T::from_f64(eps);
        for_chunks_weighted(out.slice::<T>(OP)?, n, BACKWARD_COST, |start, chunk| {
            let end = start + chunk.len();
            dispatch(Backward { x: &xs[start..end], g: &gs[start..end], dx: chunk, n, eps });
        });
        Ok(())
    })
}

/// Rows of a LayerNorm (x and y hold whole rows of n), to run with the
/// widest vectors the CPU has.
struct Forward<'a, T> {
    x: &'a [T],
    y: &'a mut [T],
    n: usize,
    eps: T,
}

impl<T: Num> Kernel for Forward<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let Forward { x, y, n, eps } = self;
        let mut groups = y.chunks_exact_mut(LANES * n);
        let mut at = 0;
        for y in &mut groups {
            forward::<T, LANES>(&x[at..at + y.len()], y, n, eps);
            at += y.len();
        }
        for (x, y) in x[at..].chunks_exact(n).zip(groups.into_remainder().chunks_exact_mut(n)) {
            forward::<T, 1>(x, y, n, eps);
        }
    }
}

/// Rows of a LayerNormBackward, as `Forward`.
struct Backward<'a, T> {
    x: &'a [T],
    g: &'a [T],
    dx: &'a mut [T],
    n: usize,
    eps: T,
}

impl<T: Num> Kernel for Backward<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let Backward { x, g, dx, n, eps } = self;
        let mut groups = dx.chunks_exact_mut(LANES * n);
        let mut at = 0;
        for dx in &mut groups {
            let len = dx.len();
            backward::<T, LANES>(&x[at..at + len], &g[at..at + len], dx, n, eps);
            at += len;
        }
        let rest = groups.into_remainder();
        for ((x, g), dx) in x[at..].chunks_exact(n).zip(g[at..].chunks_exact(n)).zip(rest.chunks_exact_mut(n)) {
            backward::<T, 1>(x, g, dx, n, eps);
        }
    }
}

/// The summation rule's sums of `term(r, j)` over j in 0..n, for R rows at
/// once.
#[inline(always)]
fn sums<T: Num, const R: usize>(n: usize, term: impl Fn(usize, usize) -> T) -> [T; R] {
    let add = |a: T, b: T| a.add(b);
    // A function, not a closure: a closure this long is not inlined into
    // `dispatch`'s wide-vector copies but called, compiled for the
    // baseline instruction set (it was a fifth of a LayerNormBackward).
    #[inline(always)]
    fn leaf<T: Num, const R: usize>(term: &impl Fn(usize, usize) -> T, start: usize, end: usize) -> [T; R] {
        let mut acc = [T::ZERO; R];
        for j in start..end {
            for (r, a) in acc.iter_mut().enumerate() {
                *a = a.add(term(r, j));
            }
        }
        acc
    }
    if n <= LEAF {
        return leaf::<T, R>(&term, 0, n);
    }
    let mut trees: [Tree<T>; R] = from_fn(|_| Tree::new());
    for start in (0..n).step_by(LEAF) {
        let acc = leaf::<T, R>(&term, start, (start + LEAF).min(n));
        for (tree, a) in trees.iter_mut().zip(acc) {
            tree.push(a, &add);
        }
    }
    let mut total = [T::ZERO; R];
    for (t, tree) in total.iter_mut().zip(trees) {
        *t = tree.finish(&add).unwrap_or(T::ZERO);
    }
    total
}

/// Writes c = x − mean into `c` (R rows of n) and returns each row's
/// r = 1 / √(Σc² / n + eps).
#[inline(always)]
fn centre<T: Num, const R: usize>(x: &[T], c: &mut [T], n: usize, eps: T) -> [T; R] {
    let count = T::from_f64(n as f64);
    let s = sums::<T, R>(n, |r, j| x[r * n + j]);
    for (r, (xr, cr)) in x.chunks_exact(n).zip(c.chunks_exact_mut(n)).enumerate() {
        let mean = T::binary(BinaryOp::Div, s[r], count);
        for (ci, &xi) in cr.iter_mut().zip(xr) {
            *ci = T::binary(BinaryOp::Sub, xi, mean);
        }
    }
    let c = &*c;
    let sq = sums::<T, R>(n, |r, j| c[r * n + j].mul(c[r * n + j]));
    from_fn(|r| {
        let var = T::binary(BinaryOp::Div, sq[r], count);
        T::unary(UnaryOp::Recip, T::unary(UnaryOp::Sqrt, var.add(eps)))
    })
}

#[inline(always)]
fn forward<T: Num, const R: usize>(x: &[T], y: &mut [T], n: usize, eps: T) {
    let rstd = centre::<T, R>(x, y, n, eps);
    for (yr, &r) in y.chunks_exact_mut(n).zip(&rstd) {
        for v in yr {
            *v = v.mul(r);
        }
    }
}

#[inline(always)]
fn backward<T: Num, const R: usize>(x: &[T], g: &[T], dx: &mut [T], n: usize, eps: T) {
    let count = T::from_f64(n as f64);
    // x̂ = c · r, kept in dx until the end.
    let rstd = centre::<T, R>(x, dx, n, eps);
    for (xr, &r) in dx.chunks_exact_mut(n).zip(&rstd) {
        for v in xr {
            *v = v.mul(r);
        }
    }
    let xhat = &*dx;
    let sg = sums::<T, R>(n, |r, j| g[r * n + j]);
    let sgx = sums::<T, R>(n, |r, j| g[r * n + j].mul(xhat[r * n + j]));
    for (r, (dr, gr)) in dx.chunks_exact_mut(n).zip(g.chunks_exact(n)).enumerate() {
        let mg = T::binary(BinaryOp::Div, sg[r], count);
        let mgx = T::binary(BinaryOp::Div, sgx[r], count);
        for (d, &gi) in dr.iter_mut().zip(gr) {
            let centred = T::binary(BinaryOp::Sub, gi, mg);
            *d = T::binary(BinaryOp::Sub, centred, d.mul(mgx)).mul(rstd[r]);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The kernels against the arithmetic they promise, computed here
    //! directly, row by row (the summation rule applied to a single row).
    use super::*;
    use crate::backend::cpu::CpuStorage;

    fn rule_sum(v: &[f32]) -> f32 {
        let add = |a: f32, b: f32| a + b;
        let mut tree = Tree::new();
        for leaf in v.chunks(LEAF) {
            tree.push(leaf.iter().fold(0.0f32, |a, &b| a + b), &add);
        }
        tree.finish(&add).unwrap_or(0.0)
    }

    fn reference(x: &[f32], g: &[f32], n: usize, eps: f32) -> (Vec<f32>, Vec<f32>) {
        let (mut y, mut dx) = (Vec::new(), Vec::new());
        for (xr, gr) in x.chunks(n).zip(g.chunks(n)) {
            let mean = rule_sum(xr) / n as f32;
            let c: Vec<f32> = xr.iter().map(|v| v - mean).collect();
            let sq: Vec<f32> = c.iter().map(|v| v * v).collect();
            let r = 1.0 / (rule_sum(&sq) / n as f32 + eps).sqrt();
            let xhat: Vec<f32> = c.iter().map(|v| v * r).collect();
            let mg = rule_sum(gr) / n as f32;
            let gx: Vec<f32> = gr.iter().zip(&xhat).map(|(a, b)| a * b).collect();
            let mgx = rule_sum(&gx) / n as f32;
            dx.extend(gr.iter().zip(&xhat).map(|(gi, xi)| ((gi - mg) - xi * mgx) * r));
            y.extend(xhat);
        }
        (y, dx)
    }

    #[test]
    fn rows_of_every_length_match_the_arithmetic_bit_for_bit() {
        // 13 rows: one lockstep group and a remainder; lengths inside one
        // leaf, at it, and over several (a tree); 300 rows of 70 cross the
        // parallel threshold.
        for (rows, n) in [(13usize, 1usize), (13, 5), (13, 128), (3, 129), (9, 700), (300, 70)] {
            let x: Vec<f32> = (0..rows * n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.031 + (i / n) as f32).collect();
            let g: Vec<f32> = (0..rows * n).map(|i| ((i * 53 % 89) as f32 - 44.0) * 0.017).collect();
            let dims = [rows, n];
            let xs = CpuStorage::F32(x.clone());
            let gs = CpuStorage::F32(g.clone());
            let input = |s| In { data: s, dims: &dims, dtype: crate::DType::F32 };
            let mut y = CpuStorage::F32(vec![0.0; rows * n]);
            layer_norm(1e-5, &[input(&xs)], &mut Out { data: &mut y, dims: &dims, dtype: crate::DType::F32 }).unwrap();
            let mut dx = CpuStorage::F32(vec![0.0; rows * n]);
            let mut out = Out { data: &mut dx, dims: &dims, dtype: crate::DType::F32 };
            layer_norm_backward(1e-5, &[input(&xs), input(&gs)], &mut out).unwrap();
            let (want_y, want_dx) = reference(&x, &g, n, 1e-5);
            let (CpuStorage::F32(y), CpuStorage::F32(dx)) = (y, dx) else { unreachable!() };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y), bits(&want_y), "forward {rows} x {n}");
            assert_eq!(bits(&dx), bits(&want_dx), "backward {rows} x {n}");
        }
    }
}
