//! Datasets as plain host data: loading, splitting and mini-batching.
//!
//! This module knows nothing about graphs or tensors. A [`Dataset`] is a flat
//! `Vec<f32>` of images (row-major, one image after another, pixels scaled to
//! `[0, 1]`) plus a `Vec<i32>` of class labels; turning a [`Batch`] into
//! tensors is the caller's business.
//!
//! Sources:
//! * [`idx`]: the IDX format of MNIST and Fashion-MNIST, gzipped or raw
//!   ([`load_mnist_dir`] loads a directory holding the four standard files).
//! * [`digits`]: the 1,797 8x8 UCI handwritten digits, embedded in the crate
//!   ([`load_embedded_digits`]), so examples and tests train on real data
//!   without any file or network access.
//!
//! [`batches`] holds a small seeded PRNG ([`SplitMix64`]), a Fisher–Yates
//! [`shuffle`] and the [`Batches`] iterator: the same seed and epoch give the
//! same order on every platform (wasm32 included), another epoch another
//! order.
//!
//! ```
//! # fn main() -> kiln_core::error::Result<()> {
//! let split = kiln_core::data::load_embedded_digits(0.2, 42)?;
//! assert_eq!((split.train.len, split.test.len, split.train.features), (1438, 359, 64));
//! for epoch in 0..2 {
//!     for batch in split.train.batches(64, Some(7), epoch)? {
//!         // batch.images: batch.len * 64 f32 values in [0, 1]
//!         // batch.labels: batch.len class indices in 0..10
//!         assert_eq!(batch.images.len(), batch.len * split.train.features);
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Every failure is an [`Error`] value (kind `Io` for unreadable or malformed
//! files, naming the file and what was wrong); nothing here panics on bad
//! input.

pub mod batches;
pub mod digits;
pub mod idx;

use std::borrow::Cow;
use std::ops::Range;

use crate::error::{Error, Result};

pub use batches::{permutation, shuffle, Batch, Batches, SplitMix64};
pub use digits::{load_embedded_digits, parse_digits_csv};
pub use idx::{load_mnist_dir, parse_idx, read_idx, IdxArray};

/// A labelled image classification dataset held in host memory.
///
/// Invariants (checked by [`Dataset::new`]): `images.len() == len *
/// features`, `labels.len() == len`, `features == channels * height *
/// width` of `image_dims`, and every label lies in `0..classes`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// `len * features` pixel values, image after image, each image stored
    /// channel-major then row-major (CHW); scaled to `[0, 1]`.
    pub images: Vec<f32>,
    /// One class index per image, in `0..classes`.
    pub labels: Vec<i32>,
    /// Number of samples.
    pub len: usize,
    /// Values per image (784 for MNIST, 64 for digits).
    pub features: usize,
    /// `[channels, height, width]` of one image.
    pub image_dims: [usize; 3],
    /// Number of classes (labels lie in `0..classes`).
    pub classes: usize,
}

/// A dataset cut into a training and a test part.
#[derive(Clone, Debug, PartialEq)]
pub struct DatasetSplit {
    pub train: Dataset,
    pub test: Dataset,
}

impl Dataset {
    /// Build a dataset, checking that the parts agree (see the type's
    /// invariants); `len` is taken from `labels`.
    pub fn new(images: Vec<f32>, labels: Vec<i32>, image_dims: [usize; 3], classes: usize) -> Result<Dataset> {
        const OP: &str = "Dataset::new";
        let features = image_dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| Error::invalid(OP, format!("image dims {image_dims:?} overflow")))?;
        if features == 0 {
            return Err(Error::invalid(OP, format!("image dims {image_dims:?} describe an empty image")));
        }
        let len = labels.len();
        if Some(images.len()) != len.checked_mul(features) {
            return Err(Error::invalid(
                OP,
                format!(
                    "{len} labels need {len} x {features} = {} pixel values, got {}",
                    len.saturating_mul(features),
                    images.len()
                ),
            ));
        }
        if let Some((i, &l)) = labels.iter().enumerate().find(|&(_, &l)| l < 0 || l as usize >= classes) {
            return Err(Error::out_of_range(OP, format!("label {l} of sample {i} is outside 0..{classes}")));
        }
        Ok(Dataset { images, labels, len, features, image_dims, classes })
    }

    /// An empty dataset with the same image shape and classes.
    fn empty_like(&self) -> Dataset {
        Dataset {
            images: Vec::new(),
            labels: Vec::new(),
            len: 0,
            features: self.features,
            image_dims: self.image_dims,
            classes: self.classes,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pixels of sample `i` (`features` values), or `None` past the end.
    pub fn image(&self, i: usize) -> Option<&[f32]> {
        (i < self.len).then(|| &self.images[i * self.features..(i + 1) * self.features])
    }

    /// A copy of the samples in `range` (in order).
    pub fn subset(&self, range: Range<usize>) -> Result<Dataset> {
        if range.start > range.end || range.end > self.len {
            return Err(Error::out_of_range(
                "Dataset::subset",
                format!("range {range:?} does not fit a dataset of {} samples", self.len),
            ));
        }
        Ok(Dataset {
            images: self.images[range.start * self.features..range.end * self.features].to_vec(),
            labels: self.labels[range.clone()].to_vec(),
            len: range.len(),
            ..self.empty_like()
        })
    }

    /// A copy of the samples at `indices`, in that order (repeats allowed).
    pub fn select(&self, indices: &[usize]) -> Result<Dataset> {
        if let Some(&bad) = indices.iter().find(|&&i| i >= self.len) {
            return Err(Error::out_of_range(
                "Dataset::select",
                format!("index {bad} is outside a dataset of {} samples", self.len),
            ));
        }
        let mut out = self.empty_like();
        out.images.reserve(indices.len() * self.features);
        out.labels.reserve(indices.len());
        for &i in indices {
            out.images.extend_from_slice(&self.images[i * self.features..(i + 1) * self.features]);
            out.labels.push(self.labels[i]);
        }
        out.len = indices.len();
        Ok(out)
    }

    /// Shuffle the samples with `seed` and cut off `round(len *
    /// test_fraction)` of them as the test part. Both parts keep the
    /// original sample order; the same seed always gives the same split.
    /// `test_fraction` must lie in `[0, 1)` and leave a non-empty train part.
    pub fn split_shuffled(&self, test_fraction: f32, seed: u64) -> Result<DatasetSplit> {
        const OP: &str = "Dataset::split_shuffled";
        if !(0.0..1.0).contains(&test_fraction) {
            return Err(Error::invalid(OP, format!("test_fraction must lie in [0, 1), got {test_fraction}")));
        }
        let n_test = ((self.len as f64) * f64::from(test_fraction)).round() as usize;
        if n_test >= self.len {
            return Err(Error::invalid(
                OP,
                format!("test_fraction {test_fraction} of {} samples leaves no training data", self.len),
            ));
        }
        let order = permutation(self.len, seed);
        let mut test_idx = order[..n_test].to_vec();
        let mut train_idx = order[n_test..].to_vec();
        test_idx.sort_unstable();
        train_idx.sort_unstable();
        Ok(DatasetSplit { train: self.select(&train_idx)?, test: self.select(&test_idx)? })
    }

    /// How many samples each class has (`classes` entries).
    pub fn class_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.classes];
        for &l in &self.labels {
            counts[l as usize] += 1;
        }
        counts
    }
}

/// The two magic bytes that open every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// `bytes` decompressed if they start with the gzip magic, else as they are.
/// At most `limit` decompressed bytes are accepted (a file that inflates to
/// more is refused once it passes the limit, not after inflating it all).
/// `what` names the source (a path) in error messages.
fn maybe_gunzip<'a>(bytes: &'a [u8], op: &'static str, what: &str, limit: u64) -> Result<Cow<'a, [u8]>> {
    if !bytes.starts_with(&GZIP_MAGIC) {
        return Ok(Cow::Borrowed(bytes));
    }
    gunzip(bytes, op, what, limit).map(Cow::Owned)
}

#[cfg(feature = "gzip")]
fn gunzip(bytes: &[u8], op: &'static str, what: &str, limit: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::io(op, format!("{what}: gzip data is corrupt or truncated ({e})")))?;
    if out.len() as u64 > limit {
        return Err(Error::io(op, format!("{what}: inflates to more than {limit} bytes")));
    }
    Ok(out)
}

/// Without the `gzip` feature (the browser package leaves flate2 out: its
/// inflater and CRC table were ~12 KB of the gzipped download).
#[cfg(not(feature = "gzip"))]
fn gunzip(_: &[u8], op: &'static str, what: &str, _: u64) -> Result<Vec<u8>> {
    Err(gzip_unsupported(op, what))
}

/// The error for gzipped input to a build without the `gzip` feature.
#[cfg(not(feature = "gzip"))]
fn gzip_unsupported(op: &'static str, what: &str) -> Error {
    Error::unsupported(
        op,
        format!("{what} is gzip-compressed and this build of kiln-core has no gzip support (feature `gzip`): decompress it first"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(n: usize) -> Dataset {
        let images = (0..n * 4).map(|v| v as f32).collect();
        let labels = (0..n as i32).map(|i| i % 3).collect();
        Dataset::new(images, labels, [1, 2, 2], 3).unwrap()
    }

    #[test]
    fn new_checks_invariants() {
        assert!(Dataset::new(vec![0.0; 7], vec![0, 1], [1, 2, 2], 2).is_err());
        let e = Dataset::new(vec![0.0; 8], vec![0, 2], [1, 2, 2], 2).unwrap_err();
        assert!(e.message().contains("label 2 of sample 1"), "{e}");
        assert!(Dataset::new(vec![0.0; 8], vec![0, -1], [1, 2, 2], 2).is_err());
        assert!(Dataset::new(vec![], vec![], [1, 0, 2], 2).is_err());
        let d = Dataset::new(vec![0.0; 8], vec![0, 1], [1, 2, 2], 2).unwrap();
        assert_eq!((d.len, d.features), (2, 4));
    }

    #[test]
    fn subset_and_select() {
        let d = tiny(5);
        let s = d.subset(1..3).unwrap();
        assert_eq!(s.len, 2);
        assert_eq!(s.labels, vec![1, 2]);
        assert_eq!(s.images, (4..12).map(|v| v as f32).collect::<Vec<_>>());
        assert_eq!(d.subset(5..5).unwrap().len, 0);
        assert!(d.subset(4..6).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 3..2;
        assert!(d.subset(backwards).is_err());
        let s = d.select(&[4, 0, 4]).unwrap();
        assert_eq!(s.labels, vec![1, 0, 1]);
        assert_eq!(s.image(1).unwrap(), &[0.0, 1.0, 2.0, 3.0]);
        assert!(s.image(3).is_none());
        assert!(d.select(&[5]).is_err());
    }

    #[test]
    fn split_shuffled_partitions_the_samples() {
        let d = tiny(10);
        let split = d.split_shuffled(0.3, 1).unwrap();
        assert_eq!((split.train.len, split.test.len), (7, 3));
        // Every sample (identified by its first pixel) lands in exactly one part.
        let mut firsts: Vec<f32> = (0..split.train.len)
            .map(|i| split.train.image(i).unwrap()[0])
            .chain((0..split.test.len).map(|i| split.test.image(i).unwrap()[0]))
            .collect();
        firsts.sort_by(f32::total_cmp);
        assert_eq!(firsts, (0..10).map(|i| (i * 4) as f32).collect::<Vec<_>>());
        assert_eq!(d.split_shuffled(0.0, 1).unwrap().test.len, 0);
        assert!(d.split_shuffled(1.0, 1).is_err());
        assert!(d.split_shuffled(f32::NAN, 1).is_err());
        assert!(d.split_shuffled(0.99, 1).is_err());
    }

    #[test]
    fn gunzip_detects_by_magic() {
        use std::io::Write;
        let raw = b"hello, not gzip";
        assert!(matches!(maybe_gunzip(raw, "t", "x", 100).unwrap(), Cow::Borrowed(_)));
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(raw).unwrap();
        let gz = enc.finish().unwrap();
        assert_eq!(&*maybe_gunzip(&gz, "t", "x", raw.len() as u64).unwrap(), raw);
        let e = maybe_gunzip(&gz, "t", "x", raw.len() as u64 - 1).unwrap_err();
        assert!(e.message().contains("more than"), "{e}");
        let e = maybe_gunzip(&gz[..gz.len() / 2], "t", "some/file.gz", 100).unwrap_err();
        assert!(e.message().contains("some/file.gz") && e.message().contains("gzip"), "{e}");
    }
}
