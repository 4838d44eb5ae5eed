//! The IDX file format of MNIST and Fashion-MNIST.
//!
//! An IDX file is a 4-byte magic number — two zero bytes, a data-type code
//! and the number of dimensions — then one big-endian `u32` per dimension,
//! then the data, row-major. kiln reads unsigned-byte data (type `0x08`)
//! with 1 dimension (labels) or 3 (images: count, rows, columns). Files may
//! be gzipped; compression is detected by the gzip magic bytes `1f 8b`, not
//! by the file name.
//!
//! [`load_mnist_dir`] reads the standard four files of MNIST or
//! Fashion-MNIST (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
//! `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`, each with or without
//! `.gz`) into a [`DatasetSplit`] with pixels scaled to `[0, 1]`.

use std::path::{Path, PathBuf};

use std::io::{BufRead, Read};

use super::{Dataset, DatasetSplit, GZIP_MAGIC};
use crate::error::{Error, Result};

/// Data-type code of unsigned bytes, the only one kiln reads.
const UBYTE: u8 = 0x08;

/// The decoded contents of an IDX file: its dimensions and raw bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdxArray {
    /// Dimensions, outermost first (`[count]` or `[count, rows, cols]`).
    pub dims: Vec<usize>,
    /// `dims.iter().product()` bytes, row-major.
    pub data: Vec<u8>,
}

/// Read an IDX file (gzipped or raw). The header is read and checked
/// first; the data is then read only up to the length the header announces
/// (and one byte more, to see whether the file goes on), so a file whose
/// body is longer than its header says — a decompression bomb, `/dev/zero`
/// — costs no more memory than the header promised.
pub fn read_idx(path: &Path) -> Result<IdxArray> {
    let what = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| Error::io("read_idx", format!("cannot read {what}: {e}")))?;
    // A raw file shorter than its header announces is refused before its
    // body is read; gzipped ones are checked as they inflate.
    let size = file.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
    decode(std::io::BufReader::new(file), &what, size)
}

/// Decode an IDX file already in memory (gzipped or raw).
pub fn parse_idx(bytes: &[u8]) -> Result<IdxArray> {
    decode(bytes, "IDX buffer", Some(bytes.len() as u64))
}

fn type_name(code: u8) -> &'static str {
    match code {
        0x08 => "unsigned byte",
        0x09 => "signed byte",
        0x0B => "16-bit integer",
        0x0C => "32-bit integer",
        0x0D => "32-bit float",
        0x0E => "64-bit float",
        _ => "unknown type",
    }
}

const OP: &str = "read_idx";

/// `what` names the source (a path, or "IDX buffer") in error messages;
/// `size` is the stored size when known.
fn decode(mut reader: impl BufRead, what: &str, size: Option<u64>) -> Result<IdxArray> {
    let start = reader.fill_buf().map_err(|e| Error::io(OP, format!("cannot read {what}: {e}")))?;
    if start.starts_with(&GZIP_MAGIC) {
        #[cfg(feature = "gzip")]
        return decode_stream(flate2::bufread::MultiGzDecoder::new(reader), what, None);
        #[cfg(not(feature = "gzip"))]
        return Err(super::gzip_unsupported(OP, what));
    } else {
        decode_stream(reader, what, size)
    }
}

/// Fill `buf` as far as the stream goes; how many bytes were read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8], what: &str) -> Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_error(what, e)),
        }
    }
    Ok(filled)
}

fn read_error(what: &str, e: std::io::Error) -> Error {
    if matches!(
        e.kind(),
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
    ) {
        Error::io(OP, format!("{what}: gzip data is corrupt or truncated ({e})"))
    } else {
        Error::io(OP, format!("cannot read {what}: {e}"))
    }
}

/// The header, then exactly the data it announces. `size`: the raw
/// stream's total length, when known.
fn decode_stream(mut r: impl Read, what: &str, size: Option<u64>) -> Result<IdxArray> {
    let mut magic = [0u8; 4];
    let got = read_up_to(&mut r, &mut magic, what)?;
    if got < 4 {
        return Err(Error::io(
            OP,
            format!("{what}: truncated IDX file: {got} bytes, shorter than the 4-byte magic number"),
        ));
    }
    let (zeros, code, ndim) = ([magic[0], magic[1]], magic[2], magic[3] as usize);
    if zeros != [0, 0] || !matches!(code, 0x08 | 0x09 | 0x0B..=0x0E) {
        return Err(Error::io(
            OP,
            format!(
                "{what}: bad magic number {:02x} {:02x} {:02x} {:02x}: not an IDX file \
                 (expected 00 00, a type code 08/09/0b-0e and the dimension count)",
                magic[0], magic[1], magic[2], magic[3]
            ),
        ));
    }
    if code != UBYTE {
        return Err(Error::io(
            OP,
            format!(
                "{what}: IDX data type 0x{code:02x} ({}) is not supported; only unsigned bytes (0x08) are",
                type_name(code)
            ),
        ));
    }
    if ndim != 1 && ndim != 3 {
        return Err(Error::io(
            OP,
            format!("{what}: IDX file has {ndim} dimensions; only 1 (labels) or 3 (images) are supported"),
        ));
    }
    let header = 4 + 4 * ndim;
    let mut dim_bytes = [0u8; 12];
    let got = read_up_to(&mut r, &mut dim_bytes[..4 * ndim], what)?;
    if got < 4 * ndim {
        return Err(Error::io(
            OP,
            format!(
                "{what}: truncated IDX file: the header of {ndim} dimension(s) needs {header} bytes, the file has {}",
                4 + got
            ),
        ));
    }
    let dims: Vec<usize> =
        dim_bytes[..4 * ndim].chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::io(OP, format!("{what}: IDX dimensions {dims:?} overflow")))?;
    if let Some(size) = size {
        let found = size.saturating_sub(header as u64);
        if found < expected as u64 {
            return Err(truncated(what, &dims, expected, found));
        }
    }
    // Grow with the data actually read (never trust the header with an
    // allocation), and stop one byte past what it announced.
    let mut data = Vec::new();
    r.take(expected as u64 + 1).read_to_end(&mut data).map_err(|e| read_error(what, e))?;
    if data.len() < expected {
        return Err(truncated(what, &dims, expected, data.len() as u64));
    }
    if data.len() > expected {
        return Err(Error::io(
            OP,
            format!("{what}: IDX file has bytes after the data of dimensions {dims:?} ({expected} bytes)"),
        ));
    }
    Ok(IdxArray { dims, data })
}

fn truncated(what: &str, dims: &[usize], expected: usize, found: u64) -> Error {
    Error::io(OP, format!("{what}: truncated IDX file: dimensions {dims:?} need {expected} data bytes, found {found}"))
}

/// Pair an images array (`[n, rows, cols]`) with a labels array (`[n]`) into
/// a dataset with pixels scaled by 1/255. The names are used in errors.
pub fn dataset_from_idx(
    images: &IdxArray,
    labels: &IdxArray,
    classes: usize,
    images_name: &str,
    labels_name: &str,
) -> Result<Dataset> {
    const OP: &str = "dataset_from_idx";
    let &[n, rows, cols] = images.dims.as_slice() else {
        return Err(Error::io(
            OP,
            format!("{images_name}: expected 3 dimensions (count, rows, columns) for images, found {:?}", images.dims),
        ));
    };
    let &[n_labels] = labels.dims.as_slice() else {
        return Err(Error::io(OP, format!("{labels_name}: expected 1 dimension for labels, found {:?}", labels.dims)));
    };
    if n != n_labels {
        return Err(Error::io(
            OP,
            format!(
                "label/image count mismatch: {images_name} holds {n} images but {labels_name} holds {n_labels} labels"
            ),
        ));
    }
    if let Some((i, &l)) = labels.data.iter().enumerate().find(|&(_, &l)| l as usize >= classes) {
        return Err(Error::io(OP, format!("{labels_name}: label {l} of sample {i} is out of range 0..{classes}")));
    }
    let pixels = images.data.iter().map(|&p| f32::from(p) / 255.0).collect();
    let labels = labels.data.iter().map(|&l| i32::from(l)).collect();
    Dataset::new(pixels, labels, [1, rows, cols], classes)
        .map_err(|e| Error::io(OP, format!("{images_name}: {}", e.message())))
}

/// Find `stem` or `stem.gz` in `dir`.
fn find(dir: &Path, stem: &str) -> Result<PathBuf> {
    let candidates = [dir.join(stem), dir.join(format!("{stem}.gz"))];
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        Error::io(
            "load_mnist_dir",
            format!(
                "missing {stem} in {}: looked for {} and {}",
                dir.display(),
                candidates[0].display(),
                candidates[1].display()
            ),
        )
    })
}

/// Load MNIST or Fashion-MNIST (10 classes, 28x28) from a directory holding
/// the four standard IDX files, each gzipped or raw.
pub fn load_mnist_dir(dir: &Path) -> Result<DatasetSplit> {
    if !dir.is_dir() {
        return Err(Error::io(
            "load_mnist_dir",
            format!("{} is not a directory (expected one holding the MNIST IDX files)", dir.display()),
        ));
    }
    let load = |images: &str, labels: &str| -> Result<Dataset> {
        let (ip, lp) = (find(dir, images)?, find(dir, labels)?);
        let (ia, la) = (read_idx(&ip)?, read_idx(&lp)?);
        dataset_from_idx(&ia, &la, 10, &ip.display().to_string(), &lp.display().to_string())
    };
    let train = load("train-images-idx3-ubyte", "train-labels-idx1-ubyte")?;
    let test = load("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")?;
    if train.image_dims != test.image_dims {
        return Err(Error::io(
            "load_mnist_dir",
            format!(
                "{}: train images are {:?} but test images are {:?}",
                dir.display(),
                train.image_dims,
                test.image_dims
            ),
        ));
    }
    Ok(DatasetSplit { train, test })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn idx_bytes(code: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut b = vec![0, 0, code, dims.len() as u8];
        for d in dims {
            b.extend_from_slice(&d.to_be_bytes());
        }
        b.extend_from_slice(data);
        b
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    /// Two 2x3 images with pixels 0..12 (scaled so one is 255) and labels.
    fn images() -> Vec<u8> {
        let data: Vec<u8> = (0..12u8).map(|v| if v == 11 { 255 } else { v }).collect();
        idx_bytes(UBYTE, &[2, 2, 3], &data)
    }

    fn message(r: Result<IdxArray>) -> String {
        r.unwrap_err().message().to_string()
    }

    #[test]
    fn parses_raw_and_gzipped() {
        let raw = images();
        let a = parse_idx(&raw).unwrap();
        assert_eq!(a.dims, vec![2, 2, 3]);
        assert_eq!(a.data.len(), 12);
        assert_eq!(a.data[11], 255);
        let gz = gzip(&raw);
        assert_eq!(&gz[..2], &[0x1f, 0x8b]);
        assert_eq!(parse_idx(&gz).unwrap(), a);
        let labels = parse_idx(&gzip(&idx_bytes(UBYTE, &[3], &[7, 0, 9]))).unwrap();
        assert_eq!((labels.dims, labels.data), (vec![3], vec![7, 0, 9]));
    }

    #[test]
    fn malformed_buffers_are_errors() {
        let m = message(parse_idx(&[0, 0, 8]));
        assert!(m.contains("truncated"), "{m}");
        let m = message(parse_idx(b"PK\x03\x04 a zip file"));
        assert!(m.contains("bad magic number 50 4b 03 04"), "{m}");
        let m = message(parse_idx(&idx_bytes(0x42, &[1], &[0])));
        assert!(m.contains("bad magic"), "{m}");
        let m = message(parse_idx(&idx_bytes(0x0D, &[1], &[0, 0, 0, 0])));
        assert!(m.contains("0x0d (32-bit float) is not supported"), "{m}");
        let m = message(parse_idx(&idx_bytes(UBYTE, &[2, 2], &[0; 4])));
        assert!(m.contains("2 dimensions"), "{m}");
        // Header cut inside the dimensions.
        let m = message(parse_idx(&images()[..9]));
        assert!(m.contains("truncated") && m.contains("header"), "{m}");
        // Data cut short, raw and gzipped.
        let short = &images()[..images().len() - 1];
        let m = message(parse_idx(short));
        assert!(m.contains("truncated") && m.contains("need 12 data bytes, found 11"), "{m}");
        assert!(message(parse_idx(&gzip(short))).contains("found 11"));
        // Trailing garbage.
        let mut long = images();
        long.push(0);
        assert!(message(parse_idx(&long)).contains("bytes after the data"));
        // A gzip stream cut in the middle.
        let gz = gzip(&images());
        let m = message(parse_idx(&gz[..gz.len() - 6]));
        assert!(m.contains("gzip"), "{m}");
        // Huge declared dimensions with no data: an error, not an allocation.
        let m = message(parse_idx(&idx_bytes(UBYTE, &[u32::MAX, u32::MAX, u32::MAX], &[])));
        assert!(m.contains("truncated") || m.contains("overflow"), "{m}");
    }

    /// A valid one-image header followed by far more data than it
    /// announces, gzipped to a small file: refused after reading one byte
    /// past the image, not after inflating everything.
    #[test]
    fn bodies_longer_than_the_header_are_refused_without_reading_them() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(&idx_bytes(UBYTE, &[1, 28, 28], &[0; 784])).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            enc.write_all(&zeros).unwrap(); // 64 MiB of zeros after the image
        }
        let bomb = enc.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "the compressed file is small: {}", bomb.len());
        // Count what the decoder hands out: at most the header, the image and one byte.
        struct Counting<R>(R, std::rc::Rc<std::cell::Cell<usize>>);
        impl<R: Read> Read for Counting<R> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.read(buf)?;
                self.1.set(self.1.get() + n);
                Ok(n)
            }
        }
        let count = std::rc::Rc::new(std::cell::Cell::new(0));
        let stream = Counting(flate2::read::MultiGzDecoder::new(&bomb[..]), count.clone());
        let e = decode_stream(stream, "bomb", None).unwrap_err();
        assert!(e.message().contains("bytes after the data"), "{e}");
        assert!(count.get() <= 16 + 784 + 64 * 1024, "read {} bytes", count.get());
        assert!(message(parse_idx(&bomb)).contains("bytes after the data"));
        // An endless raw stream (as /dev/zero) is refused by its magic.
        let e = decode_stream(std::io::repeat(0), "zeros", None).unwrap_err();
        assert!(e.message().contains("bad magic"), "{e}");
        // A header announcing 4 GiB over a few bytes: truncated, not allocated.
        let e = parse_idx(&idx_bytes(UBYTE, &[1 << 16, 1 << 8, 1 << 8], &[1, 2, 3])).unwrap_err();
        assert!(e.message().contains("truncated") && e.message().contains("found 3"), "{e}");
    }

    #[test]
    fn read_idx_names_the_file() {
        let dir = scratch_dir("names");
        let p = dir.join("bad-idx1-ubyte");
        std::fs::write(&p, [1, 2, 3, 4, 5]).unwrap();
        let e = read_idx(&p).unwrap_err();
        assert!(e.to_string().contains("bad-idx1-ubyte"), "{e}");
        let e = read_idx(&dir.join("absent")).unwrap_err();
        assert!(e.message().contains("cannot read") && e.message().contains("absent"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dataset_from_idx_checks_pairing() {
        let imgs = parse_idx(&images()).unwrap();
        let labels = parse_idx(&idx_bytes(UBYTE, &[2], &[3, 9])).unwrap();
        let d = dataset_from_idx(&imgs, &labels, 10, "imgs", "lbls").unwrap();
        assert_eq!((d.len, d.features, d.image_dims, d.classes), (2, 6, [1, 2, 3], 10));
        assert_eq!(d.labels, vec![3, 9]);
        assert_eq!(d.images[1], 1.0 / 255.0);
        assert_eq!(d.images[11], 1.0);

        let three = parse_idx(&idx_bytes(UBYTE, &[3], &[0, 1, 2])).unwrap();
        let e = dataset_from_idx(&imgs, &three, 10, "imgs", "lbls").unwrap_err();
        assert!(
            e.message().contains("mismatch") && e.message().contains("2 images") && e.message().contains("3 labels"),
            "{e}"
        );
        let out = parse_idx(&idx_bytes(UBYTE, &[2], &[3, 10])).unwrap();
        let e = dataset_from_idx(&imgs, &out, 10, "imgs", "lbls").unwrap_err();
        assert!(e.message().contains("lbls: label 10 of sample 1 is out of range"), "{e}");
        let e = dataset_from_idx(&labels, &labels, 10, "imgs", "lbls").unwrap_err();
        assert!(e.message().contains("imgs: expected 3 dimensions"), "{e}");
        let e = dataset_from_idx(&imgs, &imgs, 10, "imgs", "lbls").unwrap_err();
        assert!(e.message().contains("lbls: expected 1 dimension"), "{e}");
    }

    fn scratch_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-idx-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn load_mnist_dir_mixes_gzipped_and_raw_files() {
        let dir = scratch_dir("mnistdir");
        let img = |n: u32| idx_bytes(UBYTE, &[n, 28, 28], &vec![128; n as usize * 784]);
        let lbl = |n: u32| idx_bytes(UBYTE, &[n], &(0..n as u8).collect::<Vec<_>>());
        std::fs::write(dir.join("train-images-idx3-ubyte.gz"), gzip(&img(3))).unwrap();
        std::fs::write(dir.join("train-labels-idx1-ubyte"), lbl(3)).unwrap();
        std::fs::write(dir.join("t10k-images-idx3-ubyte"), img(2)).unwrap();
        // Gzipped content under a name without .gz: detected by magic bytes.
        let misnamed = dir.join("t10k-labels-idx1-ubyte");
        std::fs::write(&misnamed, gzip(&lbl(2))).unwrap();
        let split = load_mnist_dir(&dir).unwrap();
        assert_eq!((split.train.len, split.test.len), (3, 2));
        assert_eq!(split.train.image_dims, [1, 28, 28]);
        assert_eq!(split.test.labels, vec![0, 1]);
        assert!((split.train.images[0] - 128.0 / 255.0).abs() < 1e-7);

        std::fs::remove_file(&misnamed).unwrap();
        let e = load_mnist_dir(&dir).unwrap_err();
        let m = e.message();
        assert!(
            m.contains("missing t10k-labels-idx1-ubyte")
                && m.contains("t10k-labels-idx1-ubyte.gz")
                && m.contains(&dir.display().to_string()),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(load_mnist_dir(&dir).unwrap_err().message().contains("not a directory"));
    }

    /// Real MNIST, only where the project's shared data folder is present
    /// (`KILN_MNIST_DIR` overrides where to look). Skipped otherwise: the
    /// project must not depend on it.
    #[test]
    fn real_mnist_if_present() {
        let candidates: Vec<PathBuf> = std::env::var_os("KILN_MNIST_DIR")
            .map(PathBuf::from)
            .into_iter()
            .chain([
                // shared/ beside the checkout, or inside it.
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/mnist"),
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/mnist"),
                PathBuf::from("/work/shared/data/mnist"),
            ])
            .collect();
        let Some(dir) = candidates.iter().find(|d| d.is_dir()) else {
            println!("skipping real_mnist_if_present: no MNIST directory at {candidates:?}");
            return;
        };
        let split = load_mnist_dir(dir).unwrap();
        assert_eq!((split.train.len, split.test.len), (60_000, 10_000));
        assert_eq!((split.train.features, split.train.classes), (784, 10));
        assert_eq!(split.train.images.len(), 60_000 * 784);
        assert!(split.train.class_counts().iter().all(|&c| c > 5_000));
        let max = split.test.images.iter().copied().fold(0.0f32, f32::max);
        assert_eq!(max, 1.0);
        assert!(split.test.images.iter().all(|&p| (0.0..=1.0).contains(&p)));
    }
}
