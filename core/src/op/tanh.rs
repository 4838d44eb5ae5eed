//! tanh for f32 without branches or library calls, so that the loops that
//! call it vectorise: the C library's `tanhf` is a call per element (Tanh
//! [768, 512] took 4.8 ms on one thread through it, GELU 0.5 ms). Native
//! builds use it for Tanh in the usual numerics; the portable numerics and
//! the browser keep libm's `tanhf`, whose bits they promise.
//!
//! Two pieces, both evaluated for every input and one selected:
//! - |x| < SPLIT: tanh(a) = a + a·(a²·P(a²)), P a near-minimax fit of
//!   (tanh(a) − a)/a³ (iteratively reweighted least squares in f64 by our
//!   script, relative error 1.6e-10 in tanh, rounded to f32).
//! - SPLIT ≤ |x|: tanh(a) = 1 − 2/(e^{2a} + 1) with exp.rs's e^x. Past
//!   SPLIT the result is ≥ 0.55, so the subtraction loses nothing that
//!   matters. |x| is clamped at CLAMP first (tanh rounds to 1 from 9.01 on),
//!   so e^{2a} stays finite.
//!
//! Within one ulp of the f64 tanh rounded to f32: a sweep of every 7th
//! non-negative bit pattern (run once) found 99.87 % equal and the rest one
//! ulp away; the tests below sweep every 97th pattern on every run.

use super::exp::{exp_f32, horner, odd};

/// (tanh(a) − a)/a³ = P(a²) on [0, SPLIT], highest degree first.
const SMALL: [f32; 6] = [2.142_935_3e-3, -8.177_367e-3, 2.170_069e-2, -5.394_676e-2, 0.133_332_06, -0.333_333_3];
const SPLIT: f32 = 0.625;
const CLAMP: f32 = 10.0;

/// The hyperbolic tangent, f32, branch-free. tanh(±0) = ±0, tanh(±∞) = ±1,
/// NaN stays NaN; odd exactly.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let u = a * a;
    let small = a + a * (u * horner(&SMALL, u));
    let c = if a < CLAMP { a } else { CLAMP };
    let large = 1.0 - 2.0 / (exp_f32(c + c) + 1.0);
    odd(x, if a < SPLIT { small } else { large })
}

#[cfg(test)]
mod tests {
    use super::tanh_f32;
    use crate::op::ulp::{around, sweep, ulps};

    fn check(x: f32) {
        let (y, rounded) = (tanh_f32(x), f64::from(x).tanh() as f32);
        assert!(ulps(y, rounded) <= 1, "tanh({x:e}) = {y:e}, f64 rounded {rounded:e}");
    }

    #[test]
    fn within_one_ulp_on_a_sweep_of_all_floats() {
        // Every 97th bit pattern of both signs: subnormals, the polynomial,
        // the exponential piece, the clamp, the saturated tails, ±inf, NaN.
        sweep(0..1 << 32, 97, check);
        // Densely around the split, where tanh reaches 1, and the clamp.
        for centre in [0.625f32, 9.01, 10.0] {
            around(centre, |x| {
                check(x);
                check(-x);
            });
        }
    }

    #[test]
    fn special_values() {
        assert_eq!(tanh_f32(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f32(f32::MAX), 1.0);
        assert_eq!(tanh_f32(-f32::MAX), -1.0);
        assert!(tanh_f32(f32::NAN).is_nan() && tanh_f32(-f32::NAN).is_nan());
        let tiny = f32::from_bits(1);
        assert_eq!(tanh_f32(tiny), tiny);
        for x in [1e-30f32, 0.3, 0.624_999_9, 0.625, 1.0, 5.0, 9.5, 10.0, 30.0] {
            assert_eq!(tanh_f32(-x), -tanh_f32(x));
        }
    }
}
