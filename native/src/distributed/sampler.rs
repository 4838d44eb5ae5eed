//! Which samples each process trains on.
//!
//! Every process computes the same epoch permutation (the shuffle of
//! [`Dataset::batches`], keyed by seed and epoch), cuts it into *global*
//! batches of the configured size, and takes its own contiguous shard of
//! each global batch: the first `len % size` ranks get one sample more than
//! the rest. Shards are disjoint and together cover the epoch exactly once.
//!
//! Splitting each global batch, rather than the epoch, is what makes N
//! processes compute the same step as one process on the whole batch: the
//! gradient of the global batch is the weighted sum of the shards' gradients
//! (weights `shard / batch`, see `DataParallel`). It also makes a checkpoint
//! position (epoch, global step) mean the same thing for any number of
//! processes, so training resumes on a different N where it stopped.

use std::ops::Range;

use kiln_core::data::{shuffle, Batch, Dataset, SplitMix64};
use kiln_core::{Error, Result};

/// This process's view of one epoch: shards of global batches.
#[derive(Clone, Debug)]
pub struct DistributedSampler {
    len: usize,
    global_batch: usize,
    rank: usize,
    size: usize,
    shuffle_seed: Option<u64>,
}

/// One step's work for this process.
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    /// Index of the global batch within the epoch.
    pub step: usize,
    /// This process's sample indices (may be empty when a final, short
    /// global batch has fewer samples than there are processes).
    pub indices: Vec<usize>,
    /// Samples in the global batch, over all processes.
    pub global_len: usize,
}

impl Shard {
    /// This shard's share of the global batch: its gradient's weight.
    pub fn weight(&self) -> f64 {
        self.indices.len() as f64 / self.global_len as f64
    }
}

/// The part of `0..len` that rank `rank` of `size` takes: contiguous, the
/// first `len % size` ranks one longer.
pub fn shard_range(len: usize, rank: usize, size: usize) -> Range<usize> {
    let base = len / size;
    let extra = len % size;
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

impl DistributedSampler {
    /// `len` samples, global batches of `global_batch`, this process being
    /// `rank` of `size`; `shuffle_seed: None` keeps dataset order.
    pub fn new(
        len: usize,
        global_batch: usize,
        rank: usize,
        size: usize,
        shuffle_seed: Option<u64>,
    ) -> Result<DistributedSampler> {
        if global_batch == 0 {
            return Err(Error::invalid("DistributedSampler", "the global batch size must be at least 1"));
        }
        if size == 0 || rank >= size {
            return Err(Error::invalid("DistributedSampler", format!("rank {rank} is not one of {size} processes")));
        }
        Ok(DistributedSampler { len, global_batch, rank, size, shuffle_seed })
    }

    /// Global batches per epoch (the last one may be short).
    pub fn steps_per_epoch(&self) -> usize {
        self.len.div_ceil(self.global_batch)
    }

    /// The epoch's permutation, identical on every process and identical to
    /// the order of `Dataset::batches(_, shuffle_seed, epoch)`.
    pub fn permutation(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if let Some(seed) = self.shuffle_seed {
            shuffle(&mut order, &mut SplitMix64::for_stream(seed, epoch));
        }
        order
    }

    /// This process's shards of `epoch`, from global step `first_step` on.
    pub fn epoch(&self, epoch: u64, first_step: usize) -> Vec<Shard> {
        let order = self.permutation(epoch);
        order
            .chunks(self.global_batch)
            .enumerate()
            .skip(first_step)
            .map(|(step, batch)| Shard {
                step,
                indices: batch[shard_range(batch.len(), self.rank, self.size)].to_vec(),
                global_len: batch.len(),
            })
            .collect()
    }
}

/// The images and labels of `indices`, in that order.
pub fn gather(dataset: &Dataset, indices: &[usize]) -> Result<Batch> {
    let f = dataset.features;
    let mut images = Vec::with_capacity(indices.len() * f);
    let mut labels = Vec::with_capacity(indices.len());
    for &i in indices {
        if i >= dataset.len {
            return Err(Error::invalid("gather", format!("sample {i} of a dataset of {}", dataset.len)));
        }
        images.extend_from_slice(&dataset.images[i * f..(i + 1) * f]);
        labels.push(dataset.labels[i]);
    }
    Ok(Batch { images, labels, len: indices.len() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_ranges_tile_the_batch_and_differ_by_at_most_one() {
        for len in 0..40 {
            for size in 1..9 {
                let ranges: Vec<_> = (0..size).map(|r| shard_range(len, r, size)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[size - 1].end, len);
                for pair in ranges.windows(2) {
                    assert_eq!(pair[0].end, pair[1].start);
                    assert!(pair[0].len() == pair[1].len() || pair[0].len() == pair[1].len() + 1);
                }
            }
        }
    }

    #[test]
    fn shards_are_disjoint_cover_the_epoch_and_follow_the_single_process_order() {
        let (len, batch) = (103, 16);
        for size in [1, 2, 3, 4, 7] {
            let samplers: Vec<_> =
                (0..size).map(|r| DistributedSampler::new(len, batch, r, size, Some(9)).unwrap()).collect();
            for epoch in 0..3 {
                let shards: Vec<Vec<Shard>> = samplers.iter().map(|s| s.epoch(epoch, 0)).collect();
                let mut seen = vec![0u32; len];
                let order = samplers[0].permutation(epoch);
                for step in 0..samplers[0].steps_per_epoch() {
                    // Rank by rank, the shards of one step are the global batch in order.
                    let joined: Vec<usize> = shards.iter().flat_map(|s| s[step].indices.clone()).collect();
                    let end = ((step + 1) * batch).min(len);
                    assert_eq!(joined, order[step * batch..end], "size {size} epoch {epoch} step {step}");
                    let weights: f64 = shards.iter().map(|s| s[step].weight()).sum();
                    assert!((weights - 1.0).abs() < 1e-12);
                    for &i in &joined {
                        seen[i] += 1;
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "every sample once per epoch");
            }
        }
    }

    #[test]
    fn the_permutation_is_the_one_single_process_training_uses() {
        let data =
            Dataset::new((0..50).map(|i| i as f32 / 50.0).collect(), (0..50).map(|i| i % 3).collect(), [1, 1, 1], 3)
                .unwrap();
        let sampler = DistributedSampler::new(50, 8, 0, 1, Some(4)).unwrap();
        for epoch in 0..2 {
            let plain: Vec<Batch> = data.batches(8, Some(4), epoch).unwrap().collect();
            let sharded: Vec<Batch> =
                sampler.epoch(epoch, 0).iter().map(|s| gather(&data, &s.indices).unwrap()).collect();
            assert_eq!(plain, sharded);
        }
    }

    #[test]
    fn resuming_mid_epoch_skips_the_steps_done() {
        let s = DistributedSampler::new(100, 10, 1, 3, Some(2)).unwrap();
        assert_eq!(s.epoch(1, 4), s.epoch(1, 0)[4..].to_vec());
        assert!(s.epoch(1, 10).is_empty());
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(DistributedSampler::new(10, 0, 0, 1, None).is_err());
        assert!(DistributedSampler::new(10, 4, 2, 2, None).is_err());
        let data = Dataset::new(vec![0.0; 4], vec![0; 4], [1, 1, 1], 1).unwrap();
        assert!(gather(&data, &[0, 4]).is_err());
    }
}
