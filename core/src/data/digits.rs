//! The UCI handwritten digits, embedded in the crate.
//!
//! 1,797 grey 8x8 images of the digits 0–9 (UCI "Optical Recognition of
//! Handwritten Digits", E. Alpaydin and C. Kaynak, CC BY 4.0), as shipped by
//! scikit-learn in `sklearn/datasets/data/digits.csv.gz`; see
//! `core/data/README.md`. Each CSV line holds 64 integer pixels in `0..=16`
//! then the label. At 57 KB gzipped it is small enough to build into the
//! library, so examples, tests and the wasm build train on real data with no
//! file access.

use super::{maybe_gunzip, Dataset, DatasetSplit};

/// The most bytes a gzipped digits CSV may inflate to (the UCI file is
/// about 0.5 MB): a decompression bomb is refused, not inflated.
const MAX_CSV_BYTES: u64 = 64 << 20;
use crate::error::{Error, Result};

/// The gzipped CSV, as shipped by scikit-learn.
pub const DIGITS_CSV_GZ: &[u8] = include_bytes!("../../data/digits.csv.gz");

/// Samples in the embedded set.
pub const DIGITS_LEN: usize = 1797;
/// Pixels per image (8x8).
pub const DIGITS_FEATURES: usize = 64;
/// Largest pixel value; pixels are scaled by 1/16 to `[0, 1]`.
pub const DIGITS_MAX_PIXEL: u32 = 16;

/// Parse digits CSV (gzipped or plain text: detected by the gzip magic
/// bytes): one sample per line, 64 integer pixels in `0..=16` then a label in
/// `0..=9`, comma-separated. Blank lines are ignored; `\r\n` endings are
/// accepted. Pixels are scaled by 1/16.
pub fn parse_digits_csv(bytes: &[u8]) -> Result<Dataset> {
    const OP: &str = "parse_digits_csv";
    const WHAT: &str = "digits CSV";
    let bytes = maybe_gunzip(bytes, OP, WHAT, MAX_CSV_BYTES)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| Error::io(OP, format!("{WHAT}: not UTF-8 text ({e})")))?;

    let mut images = Vec::with_capacity(DIGITS_LEN * DIGITS_FEATURES);
    let mut labels = Vec::with_capacity(DIGITS_LEN);
    for (lineno, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != DIGITS_FEATURES + 1 {
            return Err(Error::io(
                OP,
                format!(
                    "{WHAT} line {lineno}: expected {} comma-separated values (64 pixels and a label), found {}",
                    DIGITS_FEATURES + 1,
                    fields.len()
                ),
            ));
        }
        let number = |col: usize, max: u32| -> Result<u32> {
            let field = fields[col];
            let what = if col == DIGITS_FEATURES { "label" } else { "pixel" };
            let v: u32 = field.parse().map_err(|_| {
                Error::io(
                    OP,
                    format!("{WHAT} line {lineno}, column {}: {what} {field:?} is not a non-negative integer", col + 1),
                )
            })?;
            if v > max {
                return Err(Error::io(
                    OP,
                    format!("{WHAT} line {lineno}, column {}: {what} {v} is out of range 0..={max}", col + 1),
                ));
            }
            Ok(v)
        };
        for col in 0..DIGITS_FEATURES {
            images.push(number(col, DIGITS_MAX_PIXEL)? as f32 / DIGITS_MAX_PIXEL as f32);
        }
        labels.push(number(DIGITS_FEATURES, 9)? as i32);
    }
    if labels.is_empty() {
        return Err(Error::io(OP, format!("{WHAT}: no samples found")));
    }
    Dataset::new(images, labels, [1, 8, 8], 10)
}

/// All 1,797 embedded digits, in file order.
pub fn embedded_digits() -> Result<Dataset> {
    parse_digits_csv(DIGITS_CSV_GZ)
}

/// The embedded digits, shuffled with `seed` and split so that
/// `round(1797 * test_fraction)` samples form the test set (e.g. 0.2 gives
/// 1,438 train / 359 test). Same seed, same split.
pub fn load_embedded_digits(test_fraction: f32, seed: u64) -> Result<DatasetSplit> {
    embedded_digits()?.split_shuffled(test_fraction, seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_set_is_complete_and_scaled() {
        let d = embedded_digits().unwrap();
        assert_eq!(d.len, DIGITS_LEN);
        assert_eq!((d.features, d.image_dims, d.classes), (64, [1, 8, 8], 10));
        assert_eq!(d.images.len(), DIGITS_LEN * 64);
        assert!(d.labels.iter().all(|l| (0..10).contains(l)));
        let counts = d.class_counts();
        assert_eq!(counts.iter().sum::<usize>(), DIGITS_LEN);
        assert!(counts.iter().all(|&c| c >= 170), "{counts:?}");
        assert!(d.images.iter().all(|p| (0.0..=1.0).contains(p)));
        assert_eq!(d.images.iter().copied().fold(0.0f32, f32::max), 1.0);
        assert_eq!(d.images.iter().copied().fold(1.0f32, f32::min), 0.0);
        // The first line of the file: 0,0,5,13,9,1,0,0,... label 0.
        assert_eq!(&d.images[..4], &[0.0, 0.0, 5.0 / 16.0, 13.0 / 16.0]);
        assert_eq!(d.labels[0], 0);
        assert_eq!(d.labels[DIGITS_LEN - 1], 8);
    }

    #[test]
    fn split_is_seeded() {
        let a = load_embedded_digits(0.2, 42).unwrap();
        assert_eq!((a.train.len, a.test.len), (1438, 359));
        assert_eq!(a, load_embedded_digits(0.2, 42).unwrap());
        let b = load_embedded_digits(0.2, 43).unwrap();
        assert_ne!(a.test.labels, b.test.labels);
        assert_ne!(a.test.images, b.test.images);
        // Every class appears on both sides.
        assert!(a.train.class_counts().iter().all(|&c| c > 0));
        assert!(a.test.class_counts().iter().all(|&c| c > 0));
        // Train and test are disjoint and together make up the whole set.
        let mut all: Vec<&[f32]> = (0..a.train.len)
            .map(|i| a.train.image(i).unwrap())
            .chain((0..a.test.len).map(|i| a.test.image(i).unwrap()))
            .collect();
        let full = embedded_digits().unwrap();
        let mut expect: Vec<&[f32]> = (0..full.len).map(|i| full.image(i).unwrap()).collect();
        let cmp = |x: &&[f32], y: &&[f32]| x.partial_cmp(y).unwrap();
        all.sort_by(cmp);
        expect.sort_by(cmp);
        assert_eq!(all, expect);
    }

    fn line(pixel: &str, label: &str) -> String {
        let mut fields = vec!["0"; 64];
        fields[5] = pixel;
        fields.push(label);
        fields.join(",")
    }

    #[test]
    fn parse_accepts_plain_text_and_crlf() {
        let csv = format!("{}\r\n{}\r\n\r\n", line("16", "3"), line("8", "9"));
        let d = parse_digits_csv(csv.as_bytes()).unwrap();
        assert_eq!(d.len, 2);
        assert_eq!(d.labels, vec![3, 9]);
        assert_eq!((d.images[5], d.images[64 + 5]), (1.0, 0.5));
    }

    #[test]
    fn parse_errors_name_line_and_problem() {
        let err = |csv: String| parse_digits_csv(csv.as_bytes()).unwrap_err().message().to_string();
        let m = err(format!("{}\n{}\n", line("1", "1"), line("17", "1")));
        assert!(m.contains("line 2, column 6: pixel 17 is out of range 0..=16"), "{m}");
        let m = err(line("1", "10"));
        assert!(m.contains("line 1, column 65: label 10 is out of range 0..=9"), "{m}");
        let m = err(line("x", "1"));
        assert!(m.contains("pixel \"x\" is not a non-negative integer"), "{m}");
        let m = err(line("-1", "1"));
        assert!(m.contains("column 6"), "{m}");
        let m = err("1,2,3\n".to_string());
        assert!(m.contains("line 1: expected 65 comma-separated values") && m.contains("found 3"), "{m}");
        assert!(err(String::new()).contains("no samples"));
        let m = parse_digits_csv(&DIGITS_CSV_GZ[..1000]).unwrap_err().message().to_string();
        assert!(m.contains("gzip"), "{m}");
    }
}
