//! Seeded shuffling and mini-batches.
//!
//! [`shuffle`] is a Fisher–Yates shuffle driven by kiln's seeded
//! [`SplitMix64`], and [`Dataset::batches`] walks a dataset in mini-batches, in file
//! order or in an order shuffled per epoch.

use super::Dataset;
use crate::error::{Error, Result};
pub use crate::host_rng::SplitMix64;

/// Shuffle `items` in place (Fisher–Yates): every order is equally likely.
pub fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// A random permutation of `0..n` determined by `seed`.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    shuffle(&mut order, &mut SplitMix64::new(seed));
    order
}

/// One mini-batch: `len` images (`len * features` values) and their labels.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub images: Vec<f32>,
    pub labels: Vec<i32>,
    pub len: usize,
}

/// Iterator over the mini-batches of one epoch (see [`Dataset::batches`]).
#[derive(Clone, Debug)]
pub struct Batches<'a> {
    dataset: &'a Dataset,
    order: Vec<usize>,
    batch_size: usize,
    pos: usize,
    drop_last: bool,
}

impl Dataset {
    /// The mini-batches of one epoch, `batch_size` samples each; the last
    /// batch holds the remainder unless [`Batches::drop_last`] is set.
    ///
    /// With `shuffle_seed: None` samples come in dataset order. With
    /// `Some(seed)` they come in a random order fixed by `(seed, epoch)`:
    /// the same pair always gives the same order, another epoch another one.
    /// Either way each sample appears exactly once per epoch.
    pub fn batches(&self, batch_size: usize, shuffle_seed: Option<u64>, epoch: u64) -> Result<Batches<'_>> {
        if batch_size == 0 {
            return Err(Error::invalid("Dataset::batches", "batch_size must be at least 1"));
        }
        let mut order: Vec<usize> = (0..self.len).collect();
        if let Some(seed) = shuffle_seed {
            shuffle(&mut order, &mut SplitMix64::for_stream(seed, epoch));
        }
        Ok(Batches { dataset: self, order, batch_size, pos: 0, drop_last: false })
    }
}

impl Batches<'_> {
    /// Skip the last batch when it would be smaller than `batch_size`.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// The sample indices of this epoch, in visiting order.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Batches still to come.
    fn remaining(&self) -> usize {
        let left = self.order.len() - self.pos;
        if self.drop_last {
            left / self.batch_size
        } else {
            left.div_ceil(self.batch_size)
        }
    }
}

impl Iterator for Batches<'_> {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        if self.remaining() == 0 {
            return None;
        }
        let end = (self.pos + self.batch_size).min(self.order.len());
        let indices = &self.order[self.pos..end];
        self.pos = end;
        let d = self.dataset;
        let mut images = Vec::with_capacity(indices.len() * d.features);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            images.extend_from_slice(&d.images[i * d.features..(i + 1) * d.features]);
            labels.push(d.labels[i]);
        }
        Some(Batch { images, labels, len: indices.len() })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining();
        (n, Some(n))
    }
}

impl ExactSizeIterator for Batches<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sample `i` has pixels `[i, i + 0.5]` and label `i % 4`.
    fn numbered(n: usize) -> Dataset {
        let images = (0..n).flat_map(|i| [i as f32, i as f32 + 0.5]).collect();
        let labels = (0..n).map(|i| (i % 4) as i32).collect();
        Dataset::new(images, labels, [1, 1, 2], 4).unwrap()
    }

    /// The sample ids visited by an epoch, checking each batch's contents.
    fn visit(batches: Batches<'_>) -> (Vec<usize>, Vec<usize>) {
        let mut ids = Vec::new();
        let mut sizes = Vec::new();
        for b in batches {
            assert_eq!(b.images.len(), b.len * 2);
            assert_eq!(b.labels.len(), b.len);
            for k in 0..b.len {
                let id = b.images[2 * k] as usize;
                assert_eq!(b.images[2 * k + 1], id as f32 + 0.5);
                assert_eq!(b.labels[k], (id % 4) as i32);
                ids.push(id);
            }
            sizes.push(b.len);
        }
        (ids, sizes)
    }

    #[test]
    fn splitmix64_reference_values() {
        // Reference outputs of the published SplitMix64 for seed 1234567.
        let mut r = SplitMix64::new(1234567);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(got, [6457827717110365317, 3203168211198807973, 9817491932198370423]);
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn below_and_floats_stay_in_range() {
        let mut r = SplitMix64::new(9);
        let mut seen = [0usize; 7];
        for _ in 0..7000 {
            seen[r.below(7) as usize] += 1;
            assert!((0.0..1.0).contains(&r.next_f32()));
            assert!((0.0..1.0).contains(&r.next_f64()));
        }
        assert!(seen.iter().all(|&c| (850..1150).contains(&c)), "{seen:?}");
        assert_eq!(r.below(1), 0);
        assert_eq!(r.below(0), 0);
    }

    #[test]
    fn shuffle_is_a_reproducible_permutation() {
        let p = permutation(100, 5);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_ne!(p, sorted, "a 100-element shuffle left everything in place");
        assert_eq!(p, permutation(100, 5));
        assert_ne!(p, permutation(100, 6));
        assert!(permutation(0, 1).is_empty());
        assert_eq!(permutation(1, 1), vec![0]);
    }

    #[test]
    fn every_sample_once_per_epoch() {
        let d = numbered(103);
        for (seed, epoch) in [(None, 0), (Some(1), 0), (Some(1), 1), (Some(99), 7)] {
            let (mut ids, sizes) = visit(d.batches(10, seed, epoch).unwrap());
            assert_eq!(sizes.len(), 11);
            assert!(sizes[..10].iter().all(|&s| s == 10));
            assert_eq!(sizes[10], 3);
            if seed.is_none() {
                assert_eq!(ids, (0..103).collect::<Vec<_>>(), "unshuffled order");
            }
            ids.sort_unstable();
            assert_eq!(ids, (0..103).collect::<Vec<_>>());
        }
    }

    #[test]
    fn drop_last_and_exact_size() {
        let d = numbered(103);
        let b = d.batches(10, Some(3), 0).unwrap().drop_last(true);
        assert_eq!(b.len(), 10);
        let (ids, sizes) = visit(b);
        assert_eq!(sizes, vec![10; 10]);
        assert_eq!(ids.len(), 100);
        assert_eq!(d.batches(10, None, 0).unwrap().len(), 11);
        let mut it = d.batches(50, None, 0).unwrap();
        it.next();
        assert_eq!(it.size_hint(), (2, Some(2)));
        // Batch larger than the dataset: one partial batch, or none.
        assert_eq!(d.batches(500, None, 0).unwrap().count(), 1);
        assert_eq!(d.batches(500, None, 0).unwrap().drop_last(true).count(), 0);
        assert_eq!(d.subset(0..0).unwrap().batches(4, Some(1), 0).unwrap().count(), 0);
        assert!(d.batches(0, None, 0).is_err());
    }

    #[test]
    fn order_depends_on_seed_and_epoch_only() {
        let d = numbered(64);
        let order = |seed, epoch| visit(d.batches(8, Some(seed), epoch).unwrap()).0;
        assert_eq!(order(1, 0), order(1, 0));
        assert_eq!(order(1, 5), order(1, 5));
        assert_ne!(order(1, 0), order(1, 1));
        assert_ne!(order(1, 0), order(2, 0));
        assert_ne!(order(1, 0), (0..64).collect::<Vec<_>>());
        assert_eq!(d.batches(8, Some(1), 3).unwrap().order(), order(1, 3).as_slice());
        // Consecutive epochs are not shifted copies of one stream.
        let (a, b) = (order(4, 0), order(4, 1));
        assert_ne!(a[1..], b[..63]);
        assert_ne!(a[..63], b[1..]);
    }
}
