// scalar.wgsl — the per-element function of every primitive element-wise
// op, one per op and element type, named `<op>_<type>` after the op table's
// name in lower case (`log1p_f32`, `maximum_i32`). The host puts it after
// common.wgsl and trig.wgsl in front of unary.wgsl and binary.wgsl, whose `op` it
// generates by printing the op table's expression (`Elementwise::expr`)
// with these names, so a composed op (an expression of primitives) needs
// no WGSL of its own. Not a kernel; validates after common.wgsl and
// trig.wgsl (sin_f32/cos_f32 call kiln_sin/kiln_cos).
//
// Semantics follow the CPU backend (`op::Value`): i32 arithmetic wraps
// (WGSL's integer semantics, like the CPU's wrapping ops); Relu and Sign pass
// NaN through; Maximum/Minimum propagate NaN and keep `a` on ties; Sigmoid
// and Tanh are written in forms that cannot overflow to inf/inf; erf/erfc
// are FreeBSD's single-precision algorithms (as in the `libm` crate the CPU
// uses) on top of the GPU's exp.

fn neg_f32(v: f32) -> f32 {
    return -v;
}

fn neg_i32(v: i32) -> i32 {
    return -v;
}

fn abs_f32(v: f32) -> f32 {
    return abs(v);
}

fn abs_i32(v: i32) -> i32 {
    return abs(v);
}

fn exp_f32(v: f32) -> f32 {
    return exp(v);
}

// Positive normal values through ln_f32 (< 1 ulp): the builtin may be off
// by 2^-21 absolute near 1 (log(1 - 2^-23) came out 13 % low on lavapipe).
// Zero, negative, subnormal, inf and NaN keep the builtin's answers.
fn log_f32(v: f32) -> f32 {
    if (v >= 1.17549435e-38 && bitcast<u32>(v) < 0x7f800000u) {
        return ln_f32(v);
    }
    return log(v);
}

fn sqrt_f32(v: f32) -> f32 {
    return sqrt(v);
}

fn recip_f32(v: f32) -> f32 {
    return 1.0 / v;
}

// Through trig.wgsl's argument reduction: the builtins are only specified
// near [-π, π].
fn sin_f32(v: f32) -> f32 {
    return kiln_sin(v);
}

fn cos_f32(v: f32) -> f32 {
    return kiln_cos(v);
}

fn sigmoid_f32(v: f32) -> f32 {
    if (v >= 0.0) {
        return 1.0 / (1.0 + exp(-v));
    }
    let e = exp(v);
    return e / (1.0 + e);
}

// (1 - e) / (1 + e) with e = exp(-2|v|), written with m = e - 1 from
// expm1: 1 - e cancelled for small |v| (tanh(2e-9) came out 3e-8).
fn tanh_f32(v: f32) -> f32 {
    if (is_nan(v)) {
        return v;
    }
    let m = expm1_f32(-2.0 * abs(v));
    let t = -m / (2.0 + m);
    return select(t, -t, v < 0.0);
}

fn relu_f32(v: f32) -> f32 {
    // NaN passes through. Checked by bits: without the SignedZeroInfNanPreserve
    // float mode a Vulkan compiler may lower the select to max(v, 0), which
    // returns 0 for NaN (seen on NVIDIA's driver).
    if (is_nan(v)) {
        return v;
    }
    return select(v, 0.0, v < 0.0);
}

fn sign_f32(v: f32) -> f32 {
    if (v > 0.0) {
        return 1.0;
    }
    if (v < 0.0) {
        return -1.0;
    }
    return v;
}

fn relu_i32(v: i32) -> i32 {
    return max(v, 0);
}

fn sign_i32(v: i32) -> i32 {
    return sign(v);
}

// erf and erfc: FreeBSD s_erff.c.
const ERX: f32 = 8.4506291151e-01;
const EFX8: f32 = 1.0270333290e+00;
const PP0: f32 = 1.2837916613e-01;
const PP1: f32 = -3.2504209876e-01;
const PP2: f32 = -2.8481749818e-02;
const PP3: f32 = -5.7702702470e-03;
const PP4: f32 = -2.3763017452e-05;
const QQ1: f32 = 3.9791721106e-01;
const QQ2: f32 = 6.5022252500e-02;
const QQ3: f32 = 5.0813062117e-03;
const QQ4: f32 = 1.3249473704e-04;
const QQ5: f32 = -3.9602282413e-06;
const PA0: f32 = -2.3621185683e-03;
const PA1: f32 = 4.1485610604e-01;
const PA2: f32 = -3.7220788002e-01;
const PA3: f32 = 3.1834661961e-01;
const PA4: f32 = -1.1089469492e-01;
const PA5: f32 = 3.5478305072e-02;
const PA6: f32 = -2.1663755178e-03;
const QA1: f32 = 1.0642088205e-01;
const QA2: f32 = 5.4039794207e-01;
const QA3: f32 = 7.1828655899e-02;
const QA4: f32 = 1.2617121637e-01;
const QA5: f32 = 1.3637083583e-02;
const QA6: f32 = 1.1984500103e-02;
const RA0: f32 = -9.8649440333e-03;
const RA1: f32 = -6.9385856390e-01;
const RA2: f32 = -1.0558626175e+01;
const RA3: f32 = -6.2375331879e+01;
const RA4: f32 = -1.6239666748e+02;
const RA5: f32 = -1.8460508728e+02;
const RA6: f32 = -8.1287437439e+01;
const RA7: f32 = -9.8143291473e+00;
const SA1: f32 = 1.9651271820e+01;
const SA2: f32 = 1.3765776062e+02;
const SA3: f32 = 4.3456588745e+02;
const SA4: f32 = 6.4538726807e+02;
const SA5: f32 = 4.2900814819e+02;
const SA6: f32 = 1.0863500214e+02;
const SA7: f32 = 6.5702495575e+00;
const SA8: f32 = -6.0424413532e-02;
const RB0: f32 = -9.8649431020e-03;
const RB1: f32 = -7.9928326607e-01;
const RB2: f32 = -1.7757955551e+01;
const RB3: f32 = -1.6063638306e+02;
const RB4: f32 = -6.3756646729e+02;
const RB5: f32 = -1.0250950928e+03;
const RB6: f32 = -4.8351919556e+02;
const SB1: f32 = 3.0338060379e+01;
const SB2: f32 = 3.2579251099e+02;
const SB3: f32 = 1.5367296143e+03;
const SB4: f32 = 3.1998581543e+03;
const SB5: f32 = 2.5530502930e+03;
const SB6: f32 = 4.7452853394e+02;
const SB7: f32 = -2.2440952301e+01;

// erfc(|x|) for 0.84375 <= |x| < 28 (ix = bits of |x|).
fn erfc_tail(ix: u32, v: f32) -> f32 {
    let a = abs(v);
    if (ix < 0x3fa00000u) {
        let s = a - 1.0;
        let pp = PA0 + s * (PA1 + s * (PA2 + s * (PA3 + s * (PA4 + s * (PA5 + s * PA6)))));
        let qq = 1.0 + s * (QA1 + s * (QA2 + s * (QA3 + s * (QA4 + s * (QA5 + s * QA6)))));
        return 1.0 - ERX - pp / qq;
    }
    let s = 1.0 / (a * a);
    var r: f32;
    var big_s: f32;
    if (ix < 0x4036db6du) {
        r = RA0 + s * (RA1 + s * (RA2 + s * (RA3 + s * (RA4 + s * (RA5 + s * (RA6 + s * RA7))))));
        big_s = 1.0 + s * (SA1 + s * (SA2 + s * (SA3 + s * (SA4 + s * (SA5 + s * (SA6 + s * (SA7 + s * SA8)))))));
    } else {
        r = RB0 + s * (RB1 + s * (RB2 + s * (RB3 + s * (RB4 + s * (RB5 + s * RB6)))));
        big_s = 1.0 + s * (SB1 + s * (SB2 + s * (SB3 + s * (SB4 + s * (SB5 + s * (SB6 + s * SB7))))));
    }
    let z = bitcast<f32>(bitcast<u32>(a) & 0xffffe000u);
    return exp(-z * z - 0.5625) * exp((z - a) * (z + a) + r / big_s) / a;
}

fn erf_small(v: f32) -> f32 {
    // v * (r / s), the |x| < 0.84375 rational part.
    let z = v * v;
    let r = PP0 + z * (PP1 + z * (PP2 + z * (PP3 + z * PP4)));
    let s = 1.0 + z * (QQ1 + z * (QQ2 + z * (QQ3 + z * (QQ4 + z * QQ5))));
    return v * (r / s);
}

fn erf_f32(v: f32) -> f32 {
    let bits = bitcast<u32>(v);
    let neg = (bits >> 31u) == 1u;
    let ix = bits & 0x7fffffffu;
    if (ix >= 0x7f800000u) {
        if (is_nan(v)) {
            return v;
        }
        return select(1.0, -1.0, neg);
    }
    if (ix < 0x3f580000u) {
        if (ix < 0x31800000u) {
            return 0.125 * (8.0 * v + EFX8 * v);
        }
        return v + erf_small(v);
    }
    var y = 1.0;
    if (ix < 0x40c00000u) {
        y = 1.0 - erfc_tail(ix, v);
    }
    return select(y, -y, neg);
}

fn erfc_f32(v: f32) -> f32 {
    let bits = bitcast<u32>(v);
    let neg = (bits >> 31u) == 1u;
    let ix = bits & 0x7fffffffu;
    if (ix >= 0x7f800000u) {
        if (is_nan(v)) {
            return v;
        }
        return select(0.0, 2.0, neg);
    }
    if (ix < 0x3f580000u) {
        if (ix < 0x23800000u) {
            return 1.0 - v;
        }
        if (neg || ix < 0x3e800000u) {
            return 1.0 - (v + erf_small(v));
        }
        return 0.5 - (v - 0.5 + erf_small(v));
    }
    if (ix < 0x41e00000u) {
        let t = erfc_tail(ix, v);
        return select(t, 2.0 - t, neg);
    }
    return select(0.0, 2.0, neg);
}

// ln(1 + v): near 0 the logf kernel applied to v itself (no rounding of
// 1 + v, no reliance on cancellation the driver might simplify away);
// elsewhere ln(1 + v), whose rounding is then harmless.
fn log1p_f32(v: f32) -> f32 {
    if (is_nan(v) || bitcast<u32>(v) == 0x7f800000u) {
        return v;
    }
    if (v <= -1.0) {
        // -inf at -1, NaN below; through runtime values (see pow_f32).
        let minus_infinity_bits = 0xff800000u;
        let nan_bits = 0x7fc00000u;
        return bitcast<f32>(select(nan_bits, minus_infinity_bits, v == -1.0));
    }
    if (v > -0.29289321 && v < 0.41421356) {
        return ln_kernel(v, 0.0);
    }
    return ln_f32(1.0 + v);
}

// exp(v) - 1: for |v| < 1/2 Kahan's (u - 1) · v / ln(u) with u = exp(v),
// whose value does not depend on the rounding of u to first order; beyond,
// exp(v) - 1 directly (no cancellation left). NaN takes the second path.
fn expm1_f32(v: f32) -> f32 {
    if (abs(v) < 0.5) {
        let u = exp(v);
        if (u == 1.0) {
            return v;
        }
        return (u - 1.0) * (v / ln_f32(u));
    }
    return exp(v) - 1.0;
}

fn add_f32(a: f32, b: f32) -> f32 {
    return a + b;
}

fn add_i32(a: i32, b: i32) -> i32 {
    return a + b;
}

fn sub_f32(a: f32, b: f32) -> f32 {
    return a - b;
}

fn sub_i32(a: i32, b: i32) -> i32 {
    return a - b;
}

fn mul_f32(a: f32, b: f32) -> f32 {
    return a * b;
}

fn mul_i32(a: i32, b: i32) -> i32 {
    return a * b;
}

fn div_f32(a: f32, b: f32) -> f32 {
    return a / b;
}

fn maximum_i32(a: i32, b: i32) -> i32 {
    return max(a, b);
}

fn minimum_i32(a: i32, b: i32) -> i32 {
    return min(a, b);
}

fn maximum_f32(a: f32, b: f32) -> f32 {
    if (is_nan(a)) {
        return a;
    }
    if (is_nan(b)) {
        return b;
    }
    return select(b, a, a >= b);
}

fn minimum_f32(a: f32, b: f32) -> f32 {
    if (is_nan(a)) {
        return a;
    }
    if (is_nan(b)) {
        return b;
    }
    return select(b, a, a <= b);
}

// powf with the C/Rust special cases that exp2(b * log2(a)) gets wrong:
// a negative base with an integer exponent, zero and one bases, zero exponents.
fn pow_f32(a: f32, b: f32) -> f32 {
    if (b == 0.0 || a == 1.0) {
        return 1.0;
    }
    if (is_nan(a) || is_nan(b)) {
        return a + b;
    }
    let r = pow(abs(a), b);
    if (a < 0.0) {
        if (floor(b) != b) {
            // Through a runtime value: browsers' WGSL compilers reject a
            // constant expression that evaluates to NaN or infinity.
            let nan_bits = 0x7fc00000u;
            return bitcast<f32>(nan_bits);
        }
        // Odd integer exponents keep the sign (|b| >= 2^24 is always even).
        let odd = abs(b) < 16777216.0 && (i32(b) & 1) == 1;
        return select(r, -r, odd);
    }
    if (a == 0.0) {
        if (b < 0.0) {
            let infinity_bits = 0x7f800000u;
            return bitcast<f32>(infinity_bits);
        }
        return 0.0;
    }
    return r;
}
