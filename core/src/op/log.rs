//! The natural logarithm for f32 without branches or library calls, so
//! that the loops that call it vectorise (the C library's `logf` is a call
//! per element: Log [768, 512] took 1.4 ms on one thread through it, Exp
//! 0.24 ms). Native builds use it for Log in the usual numerics; the
//! portable numerics and the browser keep libm's `logf`.
//!
//! x = 2ᵉ·m with m in [√½, √2) (subnormals scaled by 2²⁴ first), f = m − 1,
//! and ln(1 + f) = 2·atanh(s) with s = f/(2 + f), written as
//! f − f²/2 + s·(f²/2 + R(s²)), R(z) = 2z/3 + 2z²/5 + … (its Taylor
//! series, six terms: |s| ≤ 0.1716, so the first term left out is below
//! 1e-11 relative). e·ln 2 is added in two parts, the first exact.
//! Within one ulp of the f64 logarithm rounded to f32 on a sweep of the
//! positive floats (the tests).

use super::exp::nan_or;

/// e·LN2_HI is exact for |e| < 2⁹ (LN2_HI has 15 significant bits).
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;

/// ln(x), f32, branch-free. ln(±0) = −inf, ln(+inf) = +inf, negative x
/// gives NaN, NaN stays NaN.
#[inline(always)]
pub(crate) fn ln_f32(x: f32) -> f32 {
    // Subnormals: scaled into the normal range, their exponent corrected.
    let tiny = x < f32::MIN_POSITIVE;
    let scaled = if tiny { x * 16_777_216.0 } else { x };
    let bits = scaled.to_bits();
    // m = 1.mantissa in [1, 2); moved to [√½, √2) by taking one off the
    // exponent when m ≥ √2 (mantissa bits ≥ those of √2 = 1.6a09e6…).
    let high = (bits & 0x007f_ffff) >= 0x0035_04f3;
    let m = f32::from_bits((bits & 0x007f_ffff) | if high { 0x3f00_0000 } else { 0x3f80_0000 });
    let e = ((bits >> 23) as i32) - 127 + high as i32 - if tiny { 24 } else { 0 };
    let e = e as f32;
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let r =
        z * (0.666_666_7 + z * (0.4 + z * (0.285_714_3 + z * (0.222_222_22 + z * (0.181_818_18 + z * 0.153_846_15)))));
    let half_sq = 0.5 * f * f;
    let y = e * LN2_HI + ((f - half_sq) + (s * (half_sq + r) + e * LN2_LO));
    // Specials: NaN stays, negatives give NaN, ±0 gives −inf, +inf stays.
    let y = if x < 0.0 {
        f32::NAN
    } else if x == 0.0 {
        f32::NEG_INFINITY
    } else if x == f32::INFINITY {
        x
    } else {
        y
    };
    nan_or(x, y)
}

#[cfg(test)]
mod tests {
    use super::ln_f32;
    use crate::op::ulp::{around, sweep, ulps};

    fn check(x: f32) {
        let (y, rounded) = (ln_f32(x), f64::from(x).ln() as f32);
        assert!(ulps(y, rounded) <= 1, "ln({x:e}) = {y:e}, f64 rounded {rounded:e}");
    }

    #[test]
    fn within_one_ulp_on_a_sweep_of_the_positive_floats() {
        // Every 97th positive bit pattern: subnormals, both halves of the
        // mantissa range, the largest floats, +inf.
        sweep(1..0x7f80_0001, 97, check);
        // Densely around 1 (ln near 0), √2 (the mantissa switch) and the
        // smallest normal.
        for centre in [1.0f32, std::f32::consts::SQRT_2, f32::MIN_POSITIVE, 0.5] {
            around(centre, check);
        }
    }

    #[test]
    fn special_values() {
        assert_eq!(ln_f32(1.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(ln_f32(0.0), f32::NEG_INFINITY);
        assert_eq!(ln_f32(-0.0), f32::NEG_INFINITY);
        assert_eq!(ln_f32(f32::INFINITY), f32::INFINITY);
        assert!(ln_f32(-1.0).is_nan() && ln_f32(f32::NEG_INFINITY).is_nan() && ln_f32(-1e-40).is_nan());
        assert!(ln_f32(f32::NAN).is_nan());
        assert_eq!(ln_f32(std::f32::consts::E), 1.0);
        assert_eq!(ln_f32(f32::from_bits(1)), (f64::from(f32::from_bits(1)).ln()) as f32);
        assert_eq!(ln_f32(f32::MAX), (f64::from(f32::MAX).ln()) as f32);
    }
}
