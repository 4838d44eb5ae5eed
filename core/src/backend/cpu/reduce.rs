//! Reductions: Sum, Prod, Max, Min, ArgMax, ArgMin over any set of axes.
//!
//! Every output folds its reduced sub-block in increasing input index order,
//! in the tensor's own dtype, so results are bit-identical run after run and
//! whatever the thread count (threads only split the outputs). Two layouts
//! get their own loops with the same order: reduced axes innermost (softmax
//! rows: contiguous blocks) and reduced axes outermost (bias gradients:
//! whole rows added into the output, vectorisable).

use super::layout::{for_chunks, for_chunks_weighted, Strided};
use super::scalar::{Num, Scalar};
use super::{with_any, with_num, In, Out};
use crate::backend::checks;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::shape::{contiguous_strides, AxisSet, Dims};

/// Work weight of one reduced element (see `PAR_THRESHOLD`).
const COST: usize = 2;
/// Rows folded together in the reduced-axes-innermost loop.
const LANES: usize = 8;

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
}

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
    reduce_with(op, axes, x, out, true)
}

/// `fast`: allow the suffix/prefix loops (tests compare them to the generic).
fn reduce_with(op: ReduceOp, axes: AxisSet, x: &In<'_>, out: &mut Out<'_>, fast: bool) -> Result<()> {
    let name = op.name();
    let rank = x.dims.len();
    let axes = AxisSet(axes.0 & AxisSet::all(rank).0);
    let mut g = Geometry::new(x.dims, axes);
    g.suffix &= fast;
    g.prefix &= fast;
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

// The LANES-rows loop indexes LANES slices in lockstep; an iterator is
// not clearer there.
#[allow(clippy::needless_range_loop)]
/// Fold each block in increasing index order: acc = f(acc, x), starting from
/// `init`, or from the block's first element when `init` is None (blocks are
/// then non-empty, checked by the caller).
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
    let fold_slice = move |vals: &[T]| -> T {
        let (mut acc, rest) = match init {
            Some(i) => (i, vals),
            None => (vals[0], &vals[1..]),
        };
        for &v in rest {
            acc = f(acc, v);
        }
        acc
    };
    if g.suffix {
        for_chunks_weighted(out, 1, block * COST, |s, c| {
            // LANES rows at a time: each row is still folded in order, but
            // the rows' dependency chains interleave, hiding FP latency.
            let mut groups = c.chunks_exact_mut(LANES);
            let mut row = s;
            for group in &mut groups {
                let base = row * block;
                let rows: [&[T]; LANES] = std::array::from_fn(|r| &x[base + r * block..base + (r + 1) * block]);
                let (mut acc, first) = match init {
                    Some(i) => ([i; LANES], 0),
                    None => (std::array::from_fn(|r| rows[r][0]), 1),
                };
                for j in first..block {
                    for r in 0..LANES {
                        acc[r] = f(acc[r], rows[r][j]);
                    }
                }
                group.copy_from_slice(&acc);
                row += LANES;
            }
            for (i, o) in groups.into_remainder().iter_mut().enumerate() {
                let b = (row + i) * block;
                *o = fold_slice(&x[b..b + block]);
            }
        });
    } else if g.prefix {
        let cols = out.len();
        for_chunks_weighted(out, 1, block * COST, |s, c| {
            let e = s + c.len();
            let rows = 0..block;
            let mut rows = rows.map(|r| &x[r * cols + s..r * cols + e]);
            match init {
                Some(i) => c.fill(i),
                None => c.copy_from_slice(rows.next().expect("block is non-empty")),
            }
            for row in rows {
                for (o, &v) in c.iter_mut().zip(row) {
                    *o = f(*o, v);
                }
            }
        });
    } else {
        let offs = g.block_offsets();
        let st = Strided::<1>::new(&g.kept_dims, [&g.kept_strides], [0]);
        let [is] = st.inner_strides;
        st.fill_weighted(out, block * COST, |row, [base]| {
            for (j, o) in row.iter_mut().enumerate() {
                let b = base + j * is;
                let mut it = offs.iter().map(|&k| x[b + k]);
                let mut acc = match init {
                    Some(i) => i,
                    None => it.next().expect("block is non-empty"),
                };
                for v in it {
                    acc = f(acc, v);
                }
                *o = acc;
            }
        });
    }
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
            reduce_with(op, AxisSet(axes), &inp, &mut out, fast).unwrap();
            let CpuStorage::F32(v) = o else { unreachable!() };
            res.push(v);
        }
        (res.remove(0), res.remove(0))
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
        // And the sum of column 0 is the sequential sum.
        let (a, _) = both(ReduceOp::Sum, 0b01, &x, &dims);
        let mut acc = 0.0f32;
        for r in 0..600 {
            acc += x[r * 513];
        }
        assert_eq!(a[0].to_bits(), acc.to_bits());
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
