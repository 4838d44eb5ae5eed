//! Data movement: Reshape, Permute, Expand, Slice, SliceBackward, Concat.
//! Permute, Expand and Slice are one strided gather with different strides.

use super::copy::copy;
use super::layout::{broadcast_to, for_chunks, Strided};
use super::scalar::Scalar;
use super::{with_any, In, Out};
use crate::backend::checks;
use crate::error::{Error, Result};
use crate::op::{Perm, SliceAttr};
use crate::shape::fmt_dims;

pub(super) fn reshape([x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "Reshape";
    if x.numel() != out.numel() || x.dtype != out.dtype {
        return Err(Error::shape(OP, format!("cannot reshape {} to {}", fmt_dims(x.dims), fmt_dims(out.dims))));
    }
    with_any!(out.dtype, T => {
        let src = x.slice::<T>(OP)?;
        for_chunks(out.slice::<T>(OP)?, 1, |s, c| copy(c, &src[s..s + c.len()]));
        Ok(())
    })
}

/// out[idx] = x[base + sum idx_d * strides_d] (strides keep reads in bounds:
/// the callers check them).
fn gather<T: Scalar>(x: &[T], base: usize, strides: &[usize], od: &[usize], out: &mut [T]) {
    let st = Strided::<1>::new(od, [strides], [base]);
    let [is] = st.inner_strides;
    st.fill(out, |row, [o]| match is {
        1 => copy(row, &x[o..o + row.len()]),
        0 => row.fill(x[o]),
        _ => {
            for (j, v) in row.iter_mut().enumerate() {
                *v = x[o + j * is];
            }
        }
    });
}

fn run_gather(op: &'static str, x: &In<'_>, base: usize, strides: &[usize], out: &mut Out<'_>) -> Result<()> {
    if x.dtype != out.dtype {
        return Err(Error::backend(op, "input and output dtypes differ"));
    }
    let od = out.dims;
    with_any!(out.dtype, T => {
        gather::<T>(x.slice::<T>(op)?, base, strides, od, out.slice::<T>(op)?);
        Ok(())
    })
}

pub(super) fn permute(perm: &Perm, [x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "Permute";
    let strides = checks::permute_strides(perm, x.dims, out.dims)?;
    run_gather(OP, x, 0, &strides, out)
}

pub(super) fn expand([x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    let strides = broadcast_to("Expand", x.dims, out.dims)?;
    run_gather("Expand", x, 0, &strides, out)
}

pub(super) fn slice(spec: &SliceAttr, [x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "Slice";
    let (base, strides) = checks::slice_view(OP, spec, x.dims, out.dims)?;
    if out.numel() == 0 {
        return Ok(());
    }
    run_gather(OP, x, base, &strides, out)
}

pub(super) fn slice_backward(spec: &SliceAttr, [g]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "SliceBackward";
    let (base, strides) = checks::slice_view(OP, spec, out.dims, g.dims)?;
    if g.dtype != out.dtype {
        return Err(Error::backend(OP, "input and output dtypes differ"));
    }
    with_any!(out.dtype, T => {
        let (src, dst) = (g.slice::<T>(OP)?, out.slice::<T>(OP)?);
        for_chunks(dst, 1, |_, c| c.fill(T::default()));
        let st = Strided::<1>::new(g.dims, [&strides], [base]);
        let (inner, [is]) = (st.inner, st.inner_strides);
        // Sliced positions are distinct (step >= 1): plain writes in order.
        st.for_rows(0, st.rows(), |r, [o]| {
            let row = &src[r * inner..(r + 1) * inner];
            if is == 1 {
                copy(&mut dst[o..o + inner], row);
            } else {
                for (j, &v) in row.iter().enumerate() {
                    dst[o + j * is] = v;
                }
            }
        });
        Ok(())
    })
}

pub(super) fn concat(axis: usize, ins: &[In<'_>], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "Concat";
    let od = out.dims;
    checks::concat(axis, ins.iter().map(|x| (x.dims, x.dtype)), (od, out.dtype))?;
    // Each input contributes a chunk of dims[axis] * inner per outer row.
    let inner: usize = od[axis + 1..].iter().product();
    let row: usize = od[axis] * inner;
    if row == 0 {
        return Ok(());
    }
    with_any!(out.dtype, T => {
        let srcs = ins
            .iter()
            .map(|x| Ok((x.slice::<T>(OP)?, x.dims[axis] * inner)))
            .collect::<Result<crate::small::SmallVec<[(&[T], usize); 4]>>>()?;
        for_chunks(out.slice::<T>(OP)?, row, |s, c| {
            for (r, orow) in c.chunks_exact_mut(row).enumerate() {
                let outer = s / row + r;
                let mut at = 0;
                for &(src, len) in &srcs {
                    copy(&mut orow[at..at + len], &src[outer * len..(outer + 1) * len]);
                    at += len;
                }
            }
        });
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::dtype::DType;
    use crate::error::ErrorKind;
    use crate::op::{Op, Perm, SliceAttr};

    fn perm(p: &[usize]) -> Op {
        Op::Permute(Perm::new(p).unwrap())
    }
    /// (start, step) per axis.
    fn slice_attr(axes: &[(usize, usize)]) -> SliceAttr {
        SliceAttr::new(axes.iter().copied()).unwrap()
    }

    fn iota(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }

    #[test]
    fn reshape_and_expand() {
        let r = run_op(Op::Reshape, &[(i32s(&[1, 2, 3, 4, 5, 6]), &[2, 3])], &[3, 2], DType::I32).unwrap();
        assert_eq!(r, i32s(&[1, 2, 3, 4, 5, 6]));
        let r = run_op(Op::Expand, &[(f32s(&[1., 2.]), &[2, 1])], &[2, 2, 3], DType::F32).unwrap();
        assert_eq!(r, f32s(&[1., 1., 1., 2., 2., 2., 1., 1., 1., 2., 2., 2.]));
        let r = run_op(Op::Expand, &[(bools(&[true, false]), &[2])], &[2, 2], DType::Bool).unwrap();
        assert_eq!(r, bools(&[true, false, true, false]));
    }

    #[test]
    fn permute() {
        // [2,3,4] -> perm [2,0,1] -> [4,2,3]
        let x = iota(24);
        let r = run_op(perm(&[2, 0, 1]), &[(f32s(&x), &[2, 3, 4])], &[4, 2, 3], DType::F32).unwrap();
        let mut want = vec![];
        for k in 0..4 {
            for i in 0..2 {
                for j in 0..3 {
                    want.push((i * 12 + j * 4 + k) as f32);
                }
            }
        }
        assert_eq!(r, f32s(&want));
        // Large transpose (parallel path).
        let x = iota(600 * 500);
        let r = run_op(perm(&[1, 0]), &[(f32s(&x), &[600, 500])], &[500, 600], DType::F32).unwrap();
        let want: Vec<f32> = (0..500 * 600).map(|n| ((n % 600) * 500 + n / 600) as f32).collect();
        assert_eq!(r, f32s(&want));
        assert!(run_op(perm(&[1, 0]), &[(f32s(&x), &[600, 500])], &[600, 600], DType::F32).is_err());
    }

    #[test]
    fn slice_with_steps_and_backward() {
        // x [3, 5]; rows 0..3 step 2, cols 1..5 step 2 -> [2, 2]
        let x = iota(15);
        let spec = slice_attr(&[(0, 2), (1, 2)]);
        let r = run_op(Op::Slice(spec), &[(f32s(&x), &[3, 5])], &[2, 2], DType::F32).unwrap();
        assert_eq!(r, f32s(&[1., 3., 11., 13.]));
        let g = f32s(&[1., 2., 3., 4.]);
        let r = run_op(Op::SliceBackward(spec), &[(g, &[2, 2])], &[3, 5], DType::F32).unwrap();
        assert_eq!(r, f32s(&[0., 1., 0., 2., 0., 0., 0., 0., 0., 0., 0., 3., 0., 4., 0.]));
        // contiguous last-axis slice
        let spec = slice_attr(&[(1, 1), (0, 1)]);
        let r = run_op(Op::Slice(spec), &[(i32s(&(0..15).collect::<Vec<_>>()), &[3, 5])], &[2, 5], DType::I32).unwrap();
        assert_eq!(r, i32s(&(5..15).collect::<Vec<_>>()));
        let r = run_op(Op::SliceBackward(spec), &[(i32s(&[1; 10]), &[2, 5])], &[3, 5], DType::I32).unwrap();
        assert_eq!(r, i32s(&[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]));
        // Out-of-range slice spec: an error, not a panic.
        let e = run_op(Op::Slice(spec), &[(f32s(&x), &[3, 5])], &[4, 5], DType::F32).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfRange);
    }

    #[test]
    fn concat() {
        let a = f32s(&[1., 2., 3., 4.]); // [2,2]
        let b = f32s(&[5., 6.]); // [2,1]
        let r = run_op(Op::Concat { axis: 1 }, &[(a.clone(), &[2, 2]), (b, &[2, 1])], &[2, 3], DType::F32).unwrap();
        assert_eq!(r, f32s(&[1., 2., 5., 3., 4., 6.]));
        let c = f32s(&[7., 8.]); // [1,2]
        let r = run_op(Op::Concat { axis: 0 }, &[(a.clone(), &[2, 2]), (c, &[1, 2])], &[3, 2], DType::F32).unwrap();
        assert_eq!(r, f32s(&[1., 2., 3., 4., 7., 8.]));
        let r = run_op(Op::Concat { axis: 0 }, &[(a.clone(), &[2, 2])], &[3, 2], DType::F32);
        assert!(r.is_err());
        // Big, three inputs, middle axis.
        let (x, y, z) = (iota(1000 * 3 * 50), iota(1000 * 5 * 50), iota(1000 * 2 * 50));
        let r = run_op(
            Op::Concat { axis: 1 },
            &[(f32s(&x), &[1000, 3, 50]), (f32s(&y), &[1000, 5, 50]), (f32s(&z), &[1000, 2, 50])],
            &[1000, 10, 50],
            DType::F32,
        )
        .unwrap()
        .to_f64_vec();
        for o in 0..1000 {
            for j in 0..10 {
                for k in 0..50 {
                    let want = match j {
                        0..=2 => (o * 150 + j * 50 + k) as f64,
                        3..=7 => (o * 250 + (j - 3) * 50 + k) as f64,
                        _ => (o * 100 + (j - 8) * 50 + k) as f64,
                    };
                    assert_eq!(r[o * 500 + j * 50 + k], want);
                }
            }
        }
    }
}
