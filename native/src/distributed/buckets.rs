//! How gradients are packed into messages, and the fixed order in which
//! the processes' contributions are summed. Pure arithmetic, no MPI: the
//! exchange itself lives in `collective.rs`.
//!
//! **Buckets.** Parameters are taken in *reverse* module order (the order
//! backward completes their gradients: last layer first) and packed whole
//! into flat buffers of at most `bucket_elems` values (a parameter larger
//! than that gets a bucket of its own). Each bucket travels as one message,
//! so a model with hundreds of small tensors still makes a few large
//! messages, and a bucket can leave as soon as its last gradient is ready.
//!
//! **Reduction order.** A bucket of `len` values is padded to `size · c`
//! (`c = ⌈len / size⌉`) and cut into `size` chunks; rank `r` owns chunk `r`.
//! Each rank receives chunk `r` of every rank's bucket (an all-to-all; MPI
//! only moves bytes), sums the `size` contributions with [`tree_sum`] — a
//! pairwise tree over rank indices, `((g0 + g1) + (g2 + g3)) + …`, whose
//! shape depends on nothing but `size` — and sends its summed chunk to
//! everyone (an all-gather). Every element is therefore summed in the same
//! order on every run, whatever the timing or MPI's choice of algorithm,
//! and every rank ends with the same bits. The traffic per rank is
//! `2 (size − 1) / size · bytes`, the same as a ring all-reduce.

use std::ops::{AddAssign, Range};

/// Where one parameter's gradient sits in its bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Index into the parameter list the plan was made for.
    pub param: usize,
    /// Range of the parameter's values inside the bucket.
    pub range: Range<usize>,
}

/// One flat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub slots: Vec<Slot>,
    /// Values carried: the parameters' plus any extras (last bucket only).
    pub len: usize,
    /// `len` rounded up to a multiple of the number of processes.
    pub padded: usize,
}

impl Bucket {
    /// Values per rank's chunk.
    pub fn chunk(&self, size: usize) -> usize {
        self.padded / size
    }
}

/// The buckets of a parameter list, and where the extras go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketPlan {
    pub buckets: Vec<Bucket>,
    /// (bucket, first value) of the `extras` values appended after the
    /// parameters: loss and per-parameter "had a gradient" flags.
    pub extras_at: (usize, usize),
}

impl BucketPlan {
    /// Pack parameters of `numels` values (module order) into buckets of at
    /// most `bucket_elems` values for `size` processes, with `extras` more
    /// values at the end of the last bucket.
    pub fn new(numels: &[usize], bucket_elems: usize, size: usize, extras: usize) -> BucketPlan {
        let bucket_elems = bucket_elems.max(1);
        let size = size.max(1);
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut current = Bucket { slots: Vec::new(), len: 0, padded: 0 };
        for param in (0..numels.len()).rev() {
            let n = numels[param];
            if !current.slots.is_empty() && current.len + n > bucket_elems {
                buckets.push(std::mem::replace(&mut current, Bucket { slots: Vec::new(), len: 0, padded: 0 }));
            }
            current.slots.push(Slot { param, range: current.len..current.len + n });
            current.len += n;
        }
        let extras_at = (buckets.len(), current.len);
        current.len += extras;
        buckets.push(current);
        for b in &mut buckets {
            b.padded = b.len.div_ceil(size).max(1) * size;
        }
        BucketPlan { buckets, extras_at }
    }

    /// Bucket and slot of parameter `param`.
    pub fn find(&self, param: usize) -> Option<(usize, &Slot)> {
        self.buckets
            .iter()
            .enumerate()
            .find_map(|(b, bucket)| bucket.slots.iter().find(|s| s.param == param).map(|s| (b, s)))
    }
}

/// Sum `parts.len() / chunk` consecutive chunks of `chunk` values into the
/// first one, pairwise over chunk (= rank) index: stride 1 adds chunk 1 into
/// 0, 3 into 2, …; stride 2 adds 2 into 0, 6 into 4, …; and so on. For four
/// ranks that is `(g0 + g1) + (g2 + g3)`, for three `(g0 + g1) + g2`. The
/// tree depends only on the number of chunks. Returns the first chunk.
pub fn tree_sum<T: Copy + AddAssign>(parts: &mut [T], chunk: usize) -> &[T] {
    if chunk == 0 {
        return &parts[..0];
    }
    let n = parts.len() / chunk;
    let mut stride = 1;
    while stride < n {
        let mut i = 0;
        while i + stride < n {
            let (left, right) = parts.split_at_mut((i + stride) * chunk);
            let into = &mut left[i * chunk..(i + 1) * chunk];
            for (a, &b) in into.iter_mut().zip(&right[..chunk]) {
                *a += b;
            }
            i += 2 * stride;
        }
        stride *= 2;
    }
    &parts[..chunk]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_take_parameters_last_first_whole_and_padded() {
        let plan = BucketPlan::new(&[10, 3, 6, 2], 8, 4, 3);
        let params: Vec<Vec<usize>> = plan.buckets.iter().map(|b| b.slots.iter().map(|s| s.param).collect()).collect();
        // 2 + 6 fit in 8; 3 starts a new bucket; 10 is larger than a bucket: alone.
        assert_eq!(params, vec![vec![3, 2], vec![1], vec![0]]);
        assert_eq!(plan.buckets[0].slots[1].range, 2..8);
        assert_eq!(plan.extras_at, (2, 10));
        assert_eq!(plan.buckets[2].len, 13);
        assert_eq!(plan.buckets.iter().map(|b| b.padded).collect::<Vec<_>>(), vec![8, 4, 16]);
        assert_eq!(plan.find(2).unwrap().0, 0);
        assert!(plan.find(7).is_none());
    }

    #[test]
    fn an_empty_parameter_list_still_carries_the_extras() {
        let plan = BucketPlan::new(&[], 100, 3, 2);
        assert_eq!(plan.buckets.len(), 1);
        assert_eq!((plan.buckets[0].len, plan.buckets[0].padded), (2, 3));
    }

    #[test]
    fn tree_sum_is_pairwise_by_rank() {
        // Values chosen so that the order of f32 additions shows: 1e8 + 1 - 1e8.
        let mut four = vec![1e8f32, 1.0, -1e8, 1.0];
        // (1e8 + 1) + (-1e8 + 1) = 1e8 + (-1e8 + 1) in f32 = 0 (1e8 + 1 rounds to 1e8).
        assert_eq!(tree_sum(&mut four, 1), &[0.0]);
        let mut three = vec![1.0f32, 2.0, 4.0, 8.0, 16.0, 32.0];
        assert_eq!(tree_sum(&mut three, 2), &[21.0, 42.0]);
        let mut five: Vec<f64> = (1..=5).map(f64::from).collect();
        assert_eq!(tree_sum(&mut five, 1), &[15.0]);
        let mut one = vec![3.0f32, 4.0];
        assert_eq!(tree_sum(&mut one, 2), &[3.0, 4.0]);
    }
}
