//! CumSum: running sums along one axis, one line (outer × inner position)
//! at a time, first to last or last to first. The additions run in that
//! order whatever the thread count, so the bits do not depend on it, and
//! the WGSL kernel (scan.wgsl) adds in the same order.

use super::layout::for_chunks;
use super::scalar::Num;
use super::{with_num, In, Out};
use crate::backend::checks;
use crate::error::Result;

pub(super) fn cumsum(axis: usize, exclusive: bool, reverse: bool, [x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "CumSum";
    let (_, len, inner) = checks::scan(axis, x.dims, x.dtype, out.dims, out.dtype)?;
    if out.numel() == 0 {
        return Ok(());
    }
    with_num!(x.dtype, OP, T => {
        let src = x.slice::<T>(OP)?;
        // Blocks of whole [len, inner] slabs: a line never crosses a chunk.
        let slab = len * inner;
        for_chunks(out.slice::<T>(OP)?, slab, |start, chunk| {
            let src = &src[start..start + chunk.len()];
            for (xs, ys) in src.chunks_exact(slab).zip(chunk.chunks_exact_mut(slab)) {
                scan_slab(xs, ys, len, inner, exclusive, reverse);
            }
        });
        Ok(())
    })
}

/// One [len, inner] slab: `inner` lines of `len` elements, stride `inner`.
/// Row by row, so that the inner positions are read contiguously.
fn scan_slab<T: Num>(xs: &[T], ys: &mut [T], len: usize, inner: usize, exclusive: bool, reverse: bool) {
    let mut acc = vec![T::ZERO; inner];
    for t in 0..len {
        let row = if reverse { len - 1 - t } else { t };
        let (x, y) = (&xs[row * inner..][..inner], &mut ys[row * inner..][..inner]);
        for ((a, &v), out) in acc.iter_mut().zip(x).zip(y) {
            if exclusive {
                *out = *a;
                *a = a.add(v);
            } else {
                *a = a.add(v);
                *out = *a;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::dtype::{DType, HostData};
    use crate::op::Op;

    fn run(axis: u8, exclusive: bool, reverse: bool, x: HostData, dims: &[usize]) -> HostData {
        let dtype = x.dtype();
        run_op(Op::CumSum { axis, exclusive, reverse }, &[(x, dims)], dims, dtype).unwrap()
    }

    #[test]
    fn running_sums_every_way() {
        let x = f32s(&[1., 2., 3., 4., 5., 6.]);
        assert_eq!(run(1, false, false, x.clone(), &[2, 3]), f32s(&[1., 3., 6., 4., 9., 15.]));
        assert_eq!(run(1, true, false, x.clone(), &[2, 3]), f32s(&[0., 1., 3., 0., 4., 9.]));
        assert_eq!(run(1, false, true, x.clone(), &[2, 3]), f32s(&[6., 5., 3., 15., 11., 6.]));
        assert_eq!(run(1, true, true, x.clone(), &[2, 3]), f32s(&[5., 3., 0., 11., 6., 0.]));
        // Along the leading axis: lines of stride 3.
        assert_eq!(run(0, false, false, x.clone(), &[2, 3]), f32s(&[1., 2., 3., 5., 7., 9.]));
        assert_eq!(run(0, true, true, x, &[2, 3]), f32s(&[4., 5., 6., 0., 0., 0.]));
    }

    #[test]
    fn integers_wrap_and_nan_spreads() {
        assert_eq!(run(0, false, false, i32s(&[i32::MAX, 1, 2]), &[3]), i32s(&[i32::MAX, i32::MIN, i32::MIN + 2]));
        let HostData::F64(v) = run(0, false, false, HostData::F64(vec![1.0, f64::NAN, 2.0]), &[3]) else { panic!() };
        assert!(v[0] == 1.0 && v[1].is_nan() && v[2].is_nan());
    }

    #[test]
    fn long_lines_split_across_threads_keep_their_bits() {
        // 40 slabs of [300, 7]: enough work to be cut into chunks.
        let n = 40 * 300 * 7;
        let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.37).collect();
        let HostData::F32(got) = run(1, false, false, f32s(&x), &[40, 300, 7]) else { panic!() };
        for s in 0..40 {
            for i in 0..7 {
                let mut acc = 0f32;
                for t in 0..300 {
                    let at = s * 2100 + t * 7 + i;
                    acc += x[at];
                    assert_eq!(got[at].to_bits(), acc.to_bits(), "slab {s}, line {i}, step {t}");
                }
            }
        }
    }

    #[test]
    fn bad_calls_are_errors() {
        let e = run_op(
            Op::CumSum { axis: 2, exclusive: false, reverse: false },
            &[(f32s(&[1., 2.]), &[2])],
            &[2],
            DType::F32,
        )
        .unwrap_err();
        assert_eq!(e.op(), "CumSum");
        let e = run_op(
            Op::CumSum { axis: 0, exclusive: false, reverse: false },
            &[(bools(&[true]), &[1])],
            &[1],
            DType::Bool,
        )
        .unwrap_err();
        assert_eq!(e.op(), "CumSum");
    }
}
