//! Datasets for JavaScript: the 8x8 handwritten digits, seeded epoch orders
//! and batch gathering. The digits are not built into the wasm (57 KB of
//! incompressible gzip that every page would download): the package ships
//! them as `web/digits.csv.gz`, and the entry points' `loadDigits` reads
//! (Node) or fetches (browser) that file and hands the bytes to
//! `digitsFromBytes`.

use kiln_core::data;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::error::{KilnError, Res};
use crate::tensor_api::{count, seed_arg};

/// A labelled image dataset in host memory (pixels scaled to [0, 1]).
#[wasm_bindgen]
pub struct Dataset {
    inner: data::Dataset,
}

/// A mini-batch: `images` (size × features values) and int32 `labels`.
#[wasm_bindgen(getter_with_clone)]
pub struct Batch {
    pub images: js_sys::Float32Array,
    pub labels: js_sys::Int32Array,
    pub size: u32,
}

impl Dataset {
    pub fn core(&self) -> &data::Dataset {
        &self.inner
    }
}

#[wasm_bindgen]
impl Dataset {
    /// Number of samples.
    #[wasm_bindgen(getter)]
    pub fn length(&self) -> u32 {
        self.inner.len as u32
    }

    /// Values per image (64 for the 8x8 digits).
    #[wasm_bindgen(getter)]
    pub fn features(&self) -> u32 {
        self.inner.features as u32
    }

    #[wasm_bindgen(getter)]
    pub fn classes(&self) -> u32 {
        self.inner.classes as u32
    }

    /// [channels, height, width] of one image.
    #[wasm_bindgen(getter, js_name = imageShape)]
    pub fn image_shape(&self) -> Vec<u32> {
        self.inner.image_dims.iter().map(|&d| d as u32).collect()
    }

    /// All pixels, image after image (a copy).
    #[wasm_bindgen(getter)]
    pub fn images(&self) -> js_sys::Float32Array {
        js_sys::Float32Array::from(&self.inner.images[..])
    }

    /// All labels (a copy).
    #[wasm_bindgen(getter)]
    pub fn labels(&self) -> js_sys::Int32Array {
        js_sys::Int32Array::from(&self.inner.labels[..])
    }

    /// The sample order of one epoch: dataset order without a seed, else a
    /// shuffle fixed by (seed, epoch) — the same order kiln's Rust
    /// `Dataset::batches` uses, on every platform.
    #[wasm_bindgen(js_name = epochOrder)]
    pub fn epoch_order(&self, seed: Option<f64>, epoch: Option<f64>) -> Res<Vec<u32>> {
        let seed = seed.map(|s| seed_arg("epochOrder", s)).transpose()?;
        let epoch = count("epochOrder", "epoch", epoch.unwrap_or(0.0))? as u64;
        let batches = self.inner.batches(1, seed, epoch)?;
        Ok(batches.order().iter().map(|&i| i as u32).collect())
    }

    /// The samples at `indices`, as one batch.
    pub fn gather(&self, indices: &[u32]) -> Res<Batch> {
        let idx: Vec<usize> = indices.iter().map(|&i| i as usize).collect();
        let subset = self.inner.select(&idx)?;
        Ok(Batch {
            images: js_sys::Float32Array::from(&subset.images[..]),
            labels: js_sys::Int32Array::from(&subset.labels[..]),
            size: subset.len as u32,
        })
    }
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(typescript_type = "{ train: Dataset; test: Dataset }")]
    pub type DigitsSplit;
}

/// The 1,797 UCI 8x8 handwritten digits (CC BY 4.0) from the bytes of
/// their CSV (plain text: the wasm has no inflater; the package ships
/// `web/digits.csv.gz`, which `loadDigits` loads and inflates for you, and
/// `loadDigits(testFraction, seed, bytes)` takes gzipped bytes too),
/// shuffled with `seed` (default 42) and split
/// so that round(1797 × testFraction) samples (default 0.2) form the test
/// set. Pixels are the dataset's 0–16 counts divided by 16.
#[wasm_bindgen(js_name = digitsFromBytes)]
#[allow(non_snake_case)]
pub fn digits_from_bytes(bytes: &[u8], testFraction: Option<f64>, seed: Option<f64>) -> Res<DigitsSplit> {
    let fraction = test_fraction_of(testFraction)?;
    let split =
        data::parse_digits_csv(bytes)?.split_shuffled(fraction, seed_arg("loadDigits", seed.unwrap_or(42.0))?)?;
    let out = js_sys::Object::new();
    let (train, test) = (Dataset { inner: split.train }, Dataset { inner: split.test });
    js_sys::Reflect::set(&out, &"train".into(), &JsValue::from(train)).map_err(js_err)?;
    js_sys::Reflect::set(&out, &"test".into(), &JsValue::from(test)).map_err(js_err)?;
    Ok(out.unchecked_into())
}

fn js_err(_: JsValue) -> KilnError {
    KilnError::argument("loadDigits", "could not build the result object")
}

fn test_fraction_of(test_fraction: Option<f64>) -> Res<f32> {
    let fraction = test_fraction.unwrap_or(0.2);
    if !(0.0..1.0).contains(&fraction) {
        return Err(KilnError::argument("loadDigits", format!("testFraction {fraction} must lie in [0, 1)")));
    }
    Ok(fraction as f32)
}

/// `loadDigits` for Rust callers (native tests and examples), from the
/// copy embedded in kiln-core.
pub fn load_digits_native(test_fraction: Option<f64>, seed: Option<f64>) -> Res<(Dataset, Dataset)> {
    let split =
        data::load_embedded_digits(test_fraction_of(test_fraction)?, seed_arg("loadDigits", seed.unwrap_or(42.0))?)?;
    Ok((Dataset { inner: split.train }, Dataset { inner: split.test }))
}

/// A random permutation of 0..n fixed by `seed` (kiln's SplitMix64 +
/// Fisher–Yates: the same on every platform).
#[wasm_bindgen]
pub fn permutation(n: f64, seed: f64) -> Res<Vec<u32>> {
    let n = count("permutation", "n", n)?;
    if n > kiln_core::shape::MAX_ELEMENTS {
        let max = kiln_core::shape::MAX_ELEMENTS;
        return Err(KilnError::argument("permutation", format!("n = {n} is more than kiln's {max} elements")));
    }
    Ok(data::permutation(n, seed_arg("permutation", seed)?).into_iter().map(|i| i as u32).collect())
}
