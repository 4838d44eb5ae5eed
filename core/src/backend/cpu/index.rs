//! Gather and scatter along one axis: IndexSelect and ScatterAdd. Index
//! values are data, so their range is checked here and reported as errors.

use super::copy::copy;
use super::layout::for_chunks;
use super::reduce::{Tree, LEAF};
use super::scalar::{Num, Scalar};
use super::{with_any, with_num, In, Out};
use crate::backend::checks::{self, split_at_axis as split, with_axis};
use crate::error::{Error, Result};
use crate::shape::fmt_dims;

/// The index vector, checked against the axis size.
fn indices<'a>(op: &'static str, idx: &In<'a>, axis: usize, size: usize) -> Result<&'a [i32]> {
    checks::index_vector(op, idx.dtype, idx.dims)?;
    let v = idx.slice::<i32>(op)?;
    if let Some((pos, &bad)) = v.iter().enumerate().find(|(_, &i)| i < 0 || i as usize >= size) {
        return Err(Error::out_of_range(
            op,
            format!("index {bad} at position {pos} is out of range for axis {axis} of size {size}"),
        ));
    }
    Ok(v)
}

pub(super) fn index_select(axis: usize, [x, idx]: &[In<'_>; 2], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "IndexSelect";
    if axis >= x.dims.len() || x.dtype != out.dtype {
        return Err(Error::shape(OP, format!("axis {axis} of {} {}", x.dtype, fmt_dims(x.dims))));
    }
    let (_, size, inner) = split(x.dims, axis);
    let ix = indices(OP, idx, axis, size)?;
    if out.dims != with_axis(x.dims, axis, ix.len()).as_slice() {
        return Err(Error::shape(
            OP,
            format!(
                "selecting {} along axis {axis} of {} does not give {}",
                ix.len(),
                fmt_dims(x.dims),
                fmt_dims(out.dims)
            ),
        ));
    }
    let row = ix.len() * inner;
    if row == 0 || out.numel() == 0 {
        return Ok(());
    }
    with_any!(x.dtype, T => {
        let src = x.slice::<T>(OP)?;
        gather_rows::<T>(src, ix, size, inner, out.slice::<T>(OP)?);
        Ok(())
    })
}

fn gather_rows<T: Scalar>(src: &[T], ix: &[i32], size: usize, inner: usize, out: &mut [T]) {
    let row = ix.len() * inner;
    for_chunks(out, row, |s, c| {
        for (r, orow) in c.chunks_exact_mut(row).enumerate() {
            let base = (s / row + r) * size * inner;
            for (dst, &i) in orow.chunks_exact_mut(inner).zip(ix) {
                let at = base + i as usize * inner;
                copy(dst, &src[at..at + inner]);
            }
        }
    });
}

pub(super) fn scatter_add(axis: usize, [dest, idx, src]: &[In<'_>; 3], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "ScatterAdd";
    if axis >= dest.dims.len() || dest.dims != out.dims || dest.dtype != out.dtype || src.dtype != out.dtype {
        return Err(Error::shape(OP, format!("axis {axis} of {} {}", dest.dtype, fmt_dims(dest.dims))));
    }
    let (_, size, inner) = split(dest.dims, axis);
    let ix = indices(OP, idx, axis, size)?;
    if src.dims != with_axis(dest.dims, axis, ix.len()).as_slice() {
        return Err(Error::shape(
            OP,
            format!(
                "source {} does not fit {} with {} indices along axis {axis}",
                fmt_dims(src.dims),
                fmt_dims(dest.dims),
                ix.len()
            ),
        ));
    }
    with_num!(out.dtype, OP, T => {
        let (d, s) = (dest.slice::<T>(OP)?, src.slice::<T>(OP)?);
        scatter_rows::<T>(d, ix, s, size, inner, out.slice::<T>(OP)?);
        Ok(())
    })
}

/// out = dest, plus, per outer row and index value k, the sum of the source
/// slices at k's positions (increasing position) by the summation rule
/// (docs/reductions.md: leaves of `LEAF` folded from zero, combined by the
/// power-of-two split). A hot index's many duplicates then sum accurately,
/// and the wgpu kernel, which bounds each invocation's loop to one leaf,
/// gives the same bits. Outputs of unused indices keep dest's bits. Rows are
/// independent: threads split them, never a row.
fn scatter_rows<T: Num>(dest: &[T], ix: &[i32], src: &[T], size: usize, inner: usize, out: &mut [T]) {
    let row = size * inner;
    if row == 0 {
        return;
    }
    // The positions grouped by index value, increasing within a group (a
    // counting sort): index k's positions are order[starts[k]..starts[k + 1]].
    let mut starts = vec![0usize; size + 1];
    for &k in ix {
        starts[k as usize + 1] += 1;
    }
    for k in 0..size {
        starts[k + 1] += starts[k];
    }
    let mut next = starts.clone();
    let mut order = vec![0usize; ix.len()];
    for (i, &k) in ix.iter().enumerate() {
        order[next[k as usize]] = i;
        next[k as usize] += 1;
    }
    let srow = ix.len() * inner;
    let add = |mut a: Vec<T>, b: Vec<T>| {
        a.iter_mut().zip(b).for_each(|(x, y)| *x = x.add(y));
        a
    };
    for_chunks(out, row, |s, c| {
        copy(c, &dest[s..s + c.len()]);
        for (r, orow) in c.chunks_exact_mut(row).enumerate() {
            let base = (s / row + r) * srow;
            for k in 0..size {
                let run = &order[starts[k]..starts[k + 1]];
                if run.is_empty() {
                    continue;
                }
                let mut tree = Tree::new();
                for leaf in run.chunks(LEAF) {
                    let mut acc = vec![T::ZERO; inner];
                    for &i in leaf {
                        let from = &src[base + i * inner..base + (i + 1) * inner];
                        acc.iter_mut().zip(from).for_each(|(a, &v)| *a = a.add(v));
                    }
                    tree.push(acc, &add);
                }
                let sum = tree.finish(&add).expect("a non-empty run has a leaf");
                orow[k * inner..(k + 1) * inner].iter_mut().zip(sum).for_each(|(o, v)| *o = o.add(v));
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::dtype::DType;
    use crate::error::ErrorKind;
    use crate::op::Op;

    #[test]
    fn index_select_both_axes() {
        let x = f32s(&[1., 2., 3., 4., 5., 6.]); // [3, 2]
        let r = run_op(
            Op::IndexSelect { axis: 0 },
            &[(x.clone(), &[3, 2]), (i32s(&[2, 0, 2, 1]), &[4])],
            &[4, 2],
            DType::F32,
        )
        .unwrap();
        assert_eq!(r, f32s(&[5., 6., 1., 2., 5., 6., 3., 4.]));
        let r =
            run_op(Op::IndexSelect { axis: 1 }, &[(x.clone(), &[3, 2]), (i32s(&[1, 1, 0]), &[3])], &[3, 3], DType::F32)
                .unwrap();
        assert_eq!(r, f32s(&[2., 2., 1., 4., 4., 3., 6., 6., 5.]));
        let e =
            run_op(Op::IndexSelect { axis: 0 }, &[(x.clone(), &[3, 2]), (i32s(&[0, 3]), &[2])], &[2, 2], DType::F32)
                .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfRange);
        assert_eq!(e.op(), "IndexSelect");
        assert!(e.message().contains("index 3 at position 1") && e.message().contains("axis 0 of size 3"), "{e}");
        let e =
            run_op(Op::IndexSelect { axis: 1 }, &[(x, &[3, 2]), (i32s(&[-1]), &[1])], &[3, 1], DType::F32).unwrap_err();
        assert!(e.message().contains("index -1 at position 0"), "{e}");
    }

    #[test]
    fn scatter_add_accumulates_duplicates() {
        let dest = f32s(&[1.; 6]); // [3, 2]
        let src = f32s(&[10., 20., 30., 40., 50., 60., 70., 80.]); // [4, 2]
        let r = run_op(
            Op::ScatterAdd { axis: 0 },
            &[(dest.clone(), &[3, 2]), (i32s(&[2, 0, 2, 2]), &[4]), (src, &[4, 2])],
            &[3, 2],
            DType::F32,
        )
        .unwrap();
        assert_eq!(r, f32s(&[31., 41., 1., 1., 1. + 10. + 50. + 70., 1. + 20. + 60. + 80.]));
        // axis 1, i32
        let r = run_op(
            Op::ScatterAdd { axis: 1 },
            &[(i32s(&[0; 6]), &[2, 3]), (i32s(&[1, 1]), &[2]), (i32s(&[1, 2, 3, 4]), &[2, 2])],
            &[2, 3],
            DType::I32,
        )
        .unwrap();
        assert_eq!(r, i32s(&[0, 3, 0, 0, 7, 0]));
        let e = run_op(
            Op::ScatterAdd { axis: 0 },
            &[(dest, &[3, 2]), (i32s(&[0, 5]), &[2]), (f32s(&[0.; 4]), &[2, 2])],
            &[3, 2],
            DType::F32,
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfRange);
        assert!(e.message().contains("index 5 at position 1") && e.message().contains("size 3"), "{e}");
    }

    /// 2^24 + 300 ones scattered to one output: a serial f32 fold stops at
    /// 2^24; the rule is exact. Also the rule's tree shape: 3 leaves of one
    /// index are (l0 + l1) + l2, added to dest.
    #[test]
    fn scatter_add_sums_duplicates_by_the_rule() {
        use super::LEAF;
        let n = (1usize << 24) + 300;
        let r = run_op(
            Op::ScatterAdd { axis: 0 },
            &[(f32s(&[0., 0.5]), &[2]), (i32s(&vec![0; n]), &[n]), (f32s(&vec![1.; n]), &[n])],
            &[2],
            DType::F32,
        )
        .unwrap();
        assert_eq!(r, f32s(&[n as f32, 0.5]));
        let g = rand_f32(3 * LEAF, 4);
        let r = run_op(
            Op::ScatterAdd { axis: 0 },
            &[(f32s(&[0.25]), &[1]), (i32s(&vec![0; 3 * LEAF]), &[3 * LEAF]), (f32s(&g), &[3 * LEAF])],
            &[1],
            DType::F32,
        )
        .unwrap();
        let leaf = |q: usize| g[q * LEAF..(q + 1) * LEAF].iter().fold(0f32, |a, &v| a + v);
        assert_eq!(r, f32s(&[0.25 + ((leaf(0) + leaf(1)) + leaf(2))]));
    }

    #[test]
    fn scatter_add_is_the_adjoint_of_index_select_at_scale() {
        // Embedding-style: [1000, 64] gathered by 5000 indices, gradients back.
        let idx: Vec<i32> = (0..5000).map(|i| i * 7 % 1000).collect();
        let g = rand_f32(5000 * 64, 9);
        let r = run_op(
            Op::ScatterAdd { axis: 0 },
            &[(f32s(&vec![0.; 1000 * 64]), &[1000, 64]), (i32s(&idx), &[5000]), (f32s(&g), &[5000, 64])],
            &[1000, 64],
            DType::F32,
        )
        .unwrap()
        .to_f64_vec();
        let mut want = vec![0f32; 1000 * 64];
        for (i, &k) in idx.iter().enumerate() {
            for j in 0..64 {
                want[k as usize * 64 + j] += g[i * 64 + j];
            }
        }
        assert_eq!(r, want.iter().map(|&v| v as f64).collect::<Vec<_>>());
    }
}
