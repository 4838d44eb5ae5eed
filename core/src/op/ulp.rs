//! Test helper shared by the accuracy tests of the hand-written f32 math
//! (`erf.rs`, `exp.rs`).

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
