//! Typed, fixed-size attributes of the movement ops. They live inside `Op`
//! (no graph slab, no allocation), bounded by `MAX_RANK`.

use crate::shape::{Dims, MAX_RANK};

/// A permutation of at most `MAX_RANK` axes: output axis i is input axis
/// `self[i]`. Built only from a validated permutation.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Perm {
    rank: u8,
    axes: [u8; MAX_RANK],
}

impl Perm {
    /// The permutation `perm`, or None when it is not a permutation of
    /// `0..perm.len()` or is longer than `MAX_RANK`.
    pub fn new(perm: &[usize]) -> Option<Perm> {
        if perm.len() > MAX_RANK {
            return None;
        }
        let mut axes = [0u8; MAX_RANK];
        let mut seen = 0u32;
        for (i, &p) in perm.iter().enumerate() {
            if p >= perm.len() || seen & (1 << p) != 0 {
                return None;
            }
            seen |= 1 << p;
            axes[i] = p as u8;
        }
        Some(Perm { rank: perm.len() as u8, axes })
    }

    /// 0, 1, ..., rank - 1.
    pub fn identity(rank: usize) -> Perm {
        let rank = rank.min(MAX_RANK);
        let mut axes = [0u8; MAX_RANK];
        for (i, a) in axes.iter_mut().enumerate().take(rank) {
            *a = i as u8;
        }
        Perm { rank: rank as u8, axes }
    }

    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// Output axis i is input axis `get(i)`.
    pub fn get(&self, i: usize) -> usize {
        self.axes[i] as usize
    }

    /// The axes as a list.
    pub fn to_dims(&self) -> Dims {
        self.axes[..self.rank()].iter().map(|&a| a as usize).collect()
    }

    /// The permutation that undoes this one.
    pub fn inverse(&self) -> Perm {
        let mut axes = [0u8; MAX_RANK];
        for i in 0..self.rank() {
            axes[self.axes[i] as usize] = i as u8;
        }
        Perm { rank: self.rank, axes }
    }
}

impl std::fmt::Debug for Perm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Perm{:?}", &self.axes[..self.rank()])
    }
}

/// Where a slice starts and how it steps, per axis, for at most `MAX_RANK`
/// axes. How many elements it takes per axis is not stored: it is the dims
/// of the sliced tensor (the output of Slice, the input of SliceBackward).
/// Positions are 32-bit: an axis longer than 2^32 - 1 elements cannot be
/// sliced (the constructor says so).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SliceAttr {
    rank: u8,
    start: [u32; MAX_RANK],
    step: [u32; MAX_RANK],
}

impl SliceAttr {
    /// From per-axis (start, step) pairs; None when a value does not fit in
    /// 32 bits, a step is 0, or there are more than `MAX_RANK` axes.
    pub fn new(axes: impl ExactSizeIterator<Item = (usize, usize)>) -> Option<SliceAttr> {
        if axes.len() > MAX_RANK {
            return None;
        }
        let mut attr = SliceAttr { rank: axes.len() as u8, start: [0; MAX_RANK], step: [1; MAX_RANK] };
        for (d, (start, step)) in axes.enumerate() {
            if step == 0 {
                return None;
            }
            attr.start[d] = u32::try_from(start).ok()?;
            attr.step[d] = u32::try_from(step).ok()?;
        }
        Some(attr)
    }

    /// Every element of `rank` axes.
    pub fn whole(rank: usize) -> SliceAttr {
        SliceAttr { rank: rank.min(MAX_RANK) as u8, start: [0; MAX_RANK], step: [1; MAX_RANK] }
    }

    pub fn rank(&self) -> usize {
        self.rank as usize
    }
    pub fn start(&self, axis: usize) -> usize {
        self.start[axis] as usize
    }
    pub fn step(&self, axis: usize) -> usize {
        self.step[axis] as usize
    }
}

impl std::fmt::Debug for SliceAttr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let axes: Vec<String> = (0..self.rank()).map(|d| format!("{}::{}", self.start[d], self.step[d])).collect();
        write!(f, "Slice[{}]", axes.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_validated_and_invert() {
        assert!(Perm::new(&[0, 0]).is_none());
        assert!(Perm::new(&[2, 0]).is_none());
        assert!(Perm::new(&[0; MAX_RANK + 1]).is_none());
        let p = Perm::new(&[2, 0, 1]).unwrap();
        assert_eq!(p.to_dims().as_slice(), &[2, 0, 1]);
        assert_eq!(p.inverse().to_dims().as_slice(), &[1, 2, 0]);
        assert_eq!(Perm::identity(3).to_dims().as_slice(), &[0, 1, 2]);
    }

    #[test]
    fn slice_positions_must_fit_32_bits() {
        assert!(SliceAttr::new([(0usize, 0usize)].into_iter()).is_none());
        assert!(SliceAttr::new([(1usize << 33, 1usize)].into_iter()).is_none());
        let s = SliceAttr::new([(1usize, 2usize), (0, 3)].into_iter()).unwrap();
        assert_eq!((s.rank(), s.start(0), s.step(0), s.start(1), s.step(1)), (2, 1, 2, 0, 3));
    }
}
