//! Shapes, strides and broadcasting.

use smallvec::SmallVec;

/// Dimensions of a tensor, outermost first. Row-major (C order) throughout.
pub type Dims = SmallVec<[usize; 6]>;

/// Largest rank kiln accepts; axis sets are 32-bit masks.
pub const MAX_RANK: usize = 16;

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
    fn axis_sets() {
        assert_eq!(AxisSet::all(3).iter(3).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(reduced_dims(&[2, 3, 4], AxisSet(0b101), true).as_slice(), &[1, 3, 1]);
        assert_eq!(reduced_dims(&[2, 3, 4], AxisSet(0b101), false).as_slice(), &[3]);
    }
}
