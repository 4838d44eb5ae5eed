//! Shapes, strides and broadcasting.

use smallvec::SmallVec;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Dimensions of a tensor, outermost first. Row-major (C order) throughout.
pub type Dims = SmallVec<[usize; 6]>;

/// Largest rank kiln accepts; axis sets are 32-bit masks.
pub const MAX_RANK: usize = 16;

/// The most elements one tensor may have: 2^40 on 64-bit targets (4 TiB of
/// f32), 2^28 on 32-bit ones (wasm32). Every node's shape is checked against
/// it when the node is built, so kernels may multiply any dims of a tensor,
/// and matmul's m·n·k of two valid operands, without overflow.
pub const MAX_ELEMENTS: usize = if usize::BITS >= 64 { 1 << 40 } else { 1 << 28 };

/// The most bytes one tensor may occupy: what a Rust allocation can hold.
pub const MAX_BYTES: usize = isize::MAX as usize;

/// Product of `factors` in checked arithmetic: the one helper every shape
/// computation uses. `what` describes the product in the error ("elements
/// of [2, 3]", "channels x kernel"), which is a shape error naming `op` at
/// the caller when the product of the non-zero factors overflows or
/// exceeds [`MAX_ELEMENTS`].
#[track_caller]
pub fn checked_product(op: &'static str, what: impl FnOnce() -> String, factors: &[usize]) -> Result<usize> {
    // The product of the non-zero factors must fit too: a zero dim makes the
    // element count 0, but strides are products of the other dims, and
    // [0, 2^32, 2^32] would overflow them.
    let mut extent: usize = 1;
    let mut zero = false;
    for &f in factors {
        zero |= f == 0;
        match extent.checked_mul(f.max(1)) {
            Some(v) if v <= MAX_ELEMENTS => extent = v,
            _ => {
                return Err(Error::shape(
                    op,
                    format!("{} exceed kiln's maximum of {MAX_ELEMENTS} elements per tensor", what()),
                ))
            }
        }
    }
    Ok(if zero { 0 } else { extent })
}

/// Sum of `terms` (concatenated lengths), checked like [`checked_product`].
#[track_caller]
pub fn checked_sum(
    op: &'static str,
    what: impl FnOnce() -> String,
    terms: impl IntoIterator<Item = usize>,
) -> Result<usize> {
    let mut acc: usize = 0;
    for t in terms {
        match acc.checked_add(t) {
            Some(v) if v <= MAX_ELEMENTS => acc = v,
            _ => {
                return Err(Error::shape(
                    op,
                    format!("{} exceed kiln's maximum of {MAX_ELEMENTS} elements per tensor", what()),
                ))
            }
        }
    }
    Ok(acc)
}

/// Element count of `dims`, checked (see [`checked_product`]).
#[track_caller]
pub fn checked_numel(op: &'static str, dims: &[usize]) -> Result<usize> {
    checked_product(op, || format!("the elements of shape {}", fmt_dims(dims)), dims)
}

/// Everything a node's shape must satisfy: rank at most [`MAX_RANK`],
/// elements at most [`MAX_ELEMENTS`], bytes at most [`MAX_BYTES`]. Returns
/// the element count.
#[track_caller]
pub fn check_shape(op: &'static str, dims: &[usize], dtype: DType) -> Result<usize> {
    if dims.len() > MAX_RANK {
        return Err(Error::shape(op, format!("rank {} exceeds kiln's maximum of {MAX_RANK}", dims.len())));
    }
    let numel = checked_numel(op, dims)?;
    match numel.checked_mul(dtype.size_bytes()) {
        Some(bytes) if bytes <= MAX_BYTES => Ok(numel),
        _ => Err(Error::shape(
            op,
            format!(
                "shape {} of {dtype} needs more than {MAX_BYTES} bytes, the most one allocation can hold",
                fmt_dims(dims)
            ),
        )),
    }
}

/// Element count of dims already checked (a node's or a kernel call's).
pub fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Row-major strides of a contiguous tensor.
pub fn contiguous_strides(dims: &[usize]) -> Dims {
    let mut strides: Dims = smallvec::smallvec![0; dims.len()];
    let mut acc = 1;
    for i in (0..dims.len()).rev() {
        strides[i] = acc;
        acc *= dims[i];
    }
    strides
}

/// The shape two operands broadcast to (NumPy rules: align right, a dimension
/// of 1 stretches), or None if they do not broadcast.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Dims> {
    let rank = a.len().max(b.len());
    let mut out: Dims = smallvec::smallvec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        out[i] = if da == db {
            da
        } else if da == 1 {
            db
        } else if db == 1 {
            da
        } else {
            return None;
        };
    }
    Some(out)
}

/// Strides for reading a tensor of shape `input` as if it had the (broadcast)
/// shape `output`: stretched and missing leading dimensions get stride 0.
pub fn broadcast_strides(input: &[usize], output: &[usize]) -> Dims {
    let own = contiguous_strides(input);
    let offset = output.len() - input.len();
    let mut strides: Dims = smallvec::smallvec![0; output.len()];
    for i in 0..input.len() {
        strides[offset + i] = if input[i] == 1 && output[offset + i] != 1 { 0 } else { own[i] };
    }
    strides
}

/// A set of axes (bit i = axis i).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AxisSet(pub u32);

impl AxisSet {
    pub fn contains(self, axis: usize) -> bool {
        self.0 & (1 << axis) != 0
    }
    pub fn all(rank: usize) -> AxisSet {
        AxisSet(if rank == 0 { 0 } else { (u32::MAX) >> (32 - rank) })
    }
    pub fn iter(self, rank: usize) -> impl Iterator<Item = usize> {
        (0..rank).filter(move |&a| self.contains(a))
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Output dims of a reduction over `axes`.
pub fn reduced_dims(dims: &[usize], axes: AxisSet, keepdim: bool) -> Dims {
    let mut out = Dims::new();
    for (i, &d) in dims.iter().enumerate() {
        if axes.contains(i) {
            if keepdim {
                out.push(1);
            }
        } else {
            out.push(d);
        }
    }
    out
}

/// Format dims as `[2, 3]` for error messages.
pub fn fmt_dims(dims: &[usize]) -> String {
    format!("{dims:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy_rules() {
        assert_eq!(broadcast_shapes(&[2, 3], &[1, 3]).unwrap().as_slice(), &[2, 3]);
        assert_eq!(broadcast_shapes(&[4, 3, 5], &[3, 1]).unwrap().as_slice(), &[4, 3, 5]);
        assert_eq!(broadcast_shapes(&[], &[2]).unwrap().as_slice(), &[2]);
        assert!(broadcast_shapes(&[2, 3], &[3, 2]).is_none());
        assert_eq!(broadcast_strides(&[3, 1], &[4, 3, 5]).as_slice(), &[0, 1, 0]);
    }

    #[test]
    fn checked_products_refuse_overflow_and_the_maximum() {
        assert_eq!(checked_numel("t", &[2, 3, 4]).unwrap(), 24);
        assert_eq!(checked_numel("t", &[]).unwrap(), 1);
        assert_eq!(checked_numel("t", &[0, 5]).unwrap(), 0);
        assert_eq!(checked_numel("t", &[MAX_ELEMENTS]).unwrap(), MAX_ELEMENTS);
        assert!(checked_numel("t", &[MAX_ELEMENTS + 1]).is_err());
        assert!(checked_numel("t", &[(1 << 58) + 1, 64]).is_err(), "wraps to 64 unchecked");
        assert!(checked_numel("t", &[0, 1 << 32, 1 << 32]).is_err(), "strides would overflow");
        assert!(checked_numel("t", &[usize::MAX, 0]).is_err());
        assert_eq!(checked_sum("t", String::new, [3, 4]).unwrap(), 7);
        assert!(checked_sum("t", String::new, [MAX_ELEMENTS, 1]).is_err());
        assert!(checked_sum("t", String::new, [usize::MAX, 1]).is_err());
        #[cfg(target_pointer_width = "64")]
        assert!(check_shape("Full", &[1 << 20, 1 << 20], DType::F64).is_ok(), "8 TiB: within the byte limit");
        let e = check_shape("Full", &[1; MAX_RANK + 1], DType::F32).unwrap_err();
        assert!(e.message().contains("rank"), "{e}");
    }

    #[test]
    fn axis_sets() {
        assert_eq!(AxisSet::all(3).iter(3).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(reduced_dims(&[2, 3, 4], AxisSet(0b101), true).as_slice(), &[1, 3, 1]);
        assert_eq!(reduced_dims(&[2, 3, 4], AxisSet(0b101), false).as_slice(), &[3]);
    }
}
