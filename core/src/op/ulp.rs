//! Test helper shared by the accuracy tests of the hand-written f32 math
//! (`erf.rs`, `exp.rs`).

/// `check` on every `step`th f32 bit pattern in `bits` (the accuracy
/// tests' sweeps).
pub(crate) fn sweep(bits: std::ops::Range<u64>, step: usize, mut check: impl FnMut(f32)) {
    for b in bits.step_by(step) {
        check(f32::from_bits(b as u32));
    }
}

/// `check` on the 40,000 bit patterns around `centre` (20,000 each side):
/// the tests' dense runs where a function's pieces meet.
pub(crate) fn around(centre: f32, mut check: impl FnMut(f32)) {
    let c = centre.to_bits();
    for b in c - 20_000..c + 20_000 {
        check(f32::from_bits(b));
    }
}

/// Distance in units in the last place, through the sign-magnitude ordering
/// of the bit patterns (−0 and +0 are 0 apart; two NaNs are equal, a NaN and
/// a number are as far apart as can be).
pub(crate) fn ulps(a: f32, b: f32) -> u64 {
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() { 0 } else { u64::MAX };
    }
    let key = |v: f32| {
        let i = v.to_bits() as i32 as i64;
        if i < 0 {
            i64::from(i32::MIN) - i
        } else {
            i
        }
    };
    key(a).abs_diff(key(b))
}
