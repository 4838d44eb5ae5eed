//! IDX parsing (raw and gzipped) on arbitrary bytes or edits of a valid
//! file never panics, and never yields more elements than the input could
//! announce (a gzip stream inflates at most about 1032 : 1).
#![no_main]

mod seeded;

use std::io::Write;

use libfuzzer_sys::fuzz_target;

/// A valid IDX file of 2 images of 3 x 2 bytes, raw or gzipped.
fn seed(gzip: bool) -> Vec<u8> {
    let mut raw = vec![0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 2];
    raw.extend(0..12u8);
    if gzip {
        gz(&raw)
    } else {
        raw
    }
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

thread_local! {
    static SEEDS: [Vec<u8>; 2] = [seed(false), seed(true)];
}

fuzz_target!(|data: &[u8]| {
    let Some((&how, rest)) = data.split_first() else { return };
    let bytes = SEEDS.with(|seeds| match how % 3 {
        // Raw bytes or edits of the raw file.
        0 => seeded::input(&seeds[0], rest),
        // Edits of the gzipped file (the gzip layer's own errors).
        1 => seeded::input(&seeds[1], rest),
        // Valid gzip around the fuzzer's (or an edited) IDX body.
        _ => gz(&seeded::input(&seeds[0], rest)),
    });
    if let Ok(array) = kiln::data::idx::parse_idx(&bytes) {
        let n: usize = array.dims.iter().product();
        assert!(n <= bytes.len().max(64) * 1032, "{:?} from {} bytes", array.dims, bytes.len());
    }
});
