// trig.wgsl — kiln_sin and kiln_cos: f32 sine and cosine over the whole
// finite range, within a few ulp of the CPU backend's (correctly rounded)
// f32::sin/cos; inf and NaN give NaN. Prepended to the Sin and Cos variants
// of unary.wgsl (self-contained: needs nothing from common.wgsl).
//
// WGSL's builtin sin/cos are only specified near [-π, π] (sin(1e30) gave -1.0
// on lavapipe where the answer is -0.7912), so the argument is reduced here:
// |x| = k·π/2 + r with |r| ≲ π/4, then sin/cos of r by polynomials, chosen
// by k mod 4.
//   - |x| < 2^-12: sin x = x (bits passed through), cos x = 1.
//   - |x| < 256: Cody–Waite, k·(C1 + C2 + C3) with C1 and C2 short enough
//     that k·C1 and k·C2 are exact for k < 256 and x - k·C1 exact
//     (Sterbenz); r is off by about one rounding of r.
//   - larger |x|: Payne–Hanek in u32 arithmetic (WGSL has no f64 or u64):
//     the 24-bit mantissa times a 128-bit window of the bits of 2/π gives
//     x·2/π mod 4 with 96 fraction bits; the fraction is rounded to the
//     nearest quadrant, normalised, multiplied by π/2 in 64-bit fixed point
//     and rounded to f32 as r plus a correction r_lo, all in integers.
// No step depends on floating-point cancellation that a driver could
// reassociate away (Mesa treats float ops as inexact).

// 2/π in binary, 32 bits per word, most significant first, after two zero
// words standing for the (zero) bits at and above 2^0, so that the window
// start below is never negative.
const KILN_TWO_OVER_PI = array<u32, 10>(
    0u, 0u, 0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u, 0x3c439041u, 0xfe5163abu,
    0xdebbc561u
);
// π/2 · 2^63 rounded, high and low words.
const KILN_PIO2_HI: u32 = 0xc90fdaa2u;
const KILN_PIO2_LO: u32 = 0x2168c235u;
// Cody–Waite pieces of π/2: 12, 16 and 24 significant bits.
const KILN_CW1: f32 = 1.57080078125;
const KILN_CW2: f32 = -4.454399459064007e-06;
const KILN_CW3: f32 = -5.564431554416771e-11;
// sin r ≈ r + r³·(S1 + r²·(S2 + r²·S3)), cos r ≈ 1 - r²/2 + r⁴·(C1 + r²·(C2 + r²·C3))
// on [-π/4, π/4]: the classic single-precision minimax coefficients (as in
// Cephes' sinf/cosf).
const KILN_S1: f32 = -1.6666654611e-1;
const KILN_S2: f32 = 8.3321608736e-3;
const KILN_S3: f32 = -1.9515295891e-4;
const KILN_C1: f32 = 4.166664568298827e-2;
const KILN_C2: f32 = -1.388731625493765e-3;
const KILN_C3: f32 = 2.443315711809948e-5;

// The 64-bit product a·b as (low word, high word).
fn kiln_mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let ll = a0 * b0;
    let lh = a0 * b1;
    let hl = a1 * b0;
    let hh = a1 * b1;
    let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    return vec2<u32>((ll & 0xffffu) | (mid << 16u), hh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u));
}

// 2^k as f32, exactly; 0 below the normal range (only corrections get there).
fn kiln_pow2(k: i32) -> f32 {
    if (k < -126) {
        return 0.0;
    }
    return bitcast<f32>(u32(k + 127) << 23u);
}

// The reduced argument: (r, r_lo, k mod 4 as f32) with |x| = k·π/2 + r + r_lo.
struct KilnReduced {
    r: f32,
    r_lo: f32,
    q: u32,
}

// Payne–Hanek for a = |x| >= 256 (finite).
fn kiln_reduce_large(a: f32) -> KilnReduced {
    let bits = bitcast<u32>(a);
    let m = (bits & 0x7fffffu) | 0x800000u;
    // a = m · 2^e with e = exponent - 23; shifted by 62 (the two zero words
    // minus the two bits of k kept): 47 <= e' <= 166.
    let e_shift = i32(bits >> 23u) - 127 - 23 + 62;
    let j = u32(e_shift) / 32u;
    let t = u32(e_shift) % 32u;
    // Words of 2/π before j only add multiples of 4 to x·2/π; after j + 3
    // they add less than 2^-103. P = m · window, little-endian words.
    var table = KILN_TWO_OVER_PI;
    var prod = array<u32, 6>(0u, 0u, 0u, 0u, 0u, 0u);
    var carry = 0u;
    for (var k = 0u; k < 4u; k++) {
        let w = kiln_mul_wide(m, table[j + 3u - k]);
        let s = w.x + carry;
        prod[k] = s;
        carry = w.y + select(0u, 1u, s < w.x);
    }
    prod[4] = carry;
    // x·2/π = P · 2^(t - 126): bits 126 - t and up are the integer part.
    let top = 126u - t;
    let q0 = kiln_bits_at(&prod, i32(top)) & 3u;
    var f2 = kiln_bits_at(&prod, i32(top) - 32);
    var f1 = kiln_bits_at(&prod, i32(top) - 64);
    var f0 = kiln_bits_at(&prod, i32(top) - 96);
    // Round to the nearest quadrant: a fraction >= 1/2 counts to the next k
    // and r becomes negative (negate the 96-bit fraction).
    let neg = f2 >= 0x80000000u;
    var q = q0;
    if (neg) {
        q = (q0 + 1u) & 3u;
        f0 = ~f0 + 1u;
        let c0 = select(0u, 1u, f0 == 0u);
        f1 = ~f1 + c0;
        let c1 = select(0u, 1u, c0 == 1u && f1 == 0u);
        f2 = ~f2 + c1;
    }
    // Normalise: total leading zeros of the fraction (x is never an exact
    // multiple of π/2, but the truncated fraction could be zero).
    var lz = 0u;
    for (var w = 0u; w < 2u; w++) {
        if (f2 == 0u) {
            f2 = f1;
            f1 = f0;
            f0 = 0u;
            lz += 32u;
        }
    }
    if (f2 == 0u) {
        return KilnReduced(0.0, 0.0, q);
    }
    let l = countLeadingZeros(f2);
    lz += l;
    if (l > 0u) {
        f2 = (f2 << l) | (f1 >> (32u - l));
        f1 = (f1 << l) | (f0 >> (32u - l));
    }
    // r = (f2:f1) · 2^-(64 + lz) · π/2; top 64 bits of (f2:f1) · (π/2 · 2^63).
    let ll = kiln_mul_wide(f1, KILN_PIO2_LO);
    let lh = kiln_mul_wide(f1, KILN_PIO2_HI);
    let hl = kiln_mul_wide(f2, KILN_PIO2_LO);
    let hh = kiln_mul_wide(f2, KILN_PIO2_HI);
    let w1a = ll.y + lh.x;
    let ca = select(0u, 1u, w1a < ll.y);
    let w1 = w1a + hl.x;
    let cb = select(0u, 1u, w1 < w1a);
    let w2a = hh.x + lh.y;
    let cc = select(0u, 1u, w2a < hh.x);
    let w2b = w2a + hl.y;
    let cd = select(0u, 1u, w2b < w2a);
    let w2 = w2b + ca + cb;
    let ce = select(0u, 1u, w2 < w2b);
    var h = hh.y + cc + cd + ce;
    var lw = w2;
    // The product is at least 2^126, so at most one leading zero.
    let l3 = countLeadingZeros(h);
    if (l3 > 0u) {
        h = (h << l3) | (lw >> (32u - l3));
        lw = lw << l3;
    }
    // r = (h:lw) · 2^s: r rounded to 24 bits (half up) and the signed rest.
    let s = -63 - i32(lz) - i32(l3);
    let rest = ((h & 0xffu) << 24u) | (lw >> 8u);
    let hi24 = (h >> 8u) + (rest >> 31u);
    var r = f32(hi24) * kiln_pow2(40 + s);
    var r_lo = f32(bitcast<i32>(rest)) * kiln_pow2(8 + s);
    if (neg) {
        r = -r;
        r_lo = -r_lo;
    }
    return KilnReduced(r, r_lo, q);
}

// 32 bits of the 6-word little-endian number *words starting at bit `start`
// (start >= -1; bits below 0 read as zero).
fn kiln_bits_at(words: ptr<function, array<u32, 6>>, start: i32) -> u32 {
    if (start < 0) {
        return (*words)[0] << u32(-start);
    }
    let w = u32(start) / 32u;
    let o = u32(start) % 32u;
    let lo = (*words)[w] >> o;
    if (o == 0u) {
        return lo;
    }
    return lo | ((*words)[w + 1u] << (32u - o));
}

// a = |x| >= 2^-12, finite.
fn kiln_reduce(a: f32) -> KilnReduced {
    if (a <= 0.78539816) {
        return KilnReduced(a, 0.0, 0u);
    }
    if (a < 256.0) {
        let k = floor(a * 0.63661977 + 0.5);
        let r = ((a - k * KILN_CW1) - k * KILN_CW2) - k * KILN_CW3;
        return KilnReduced(r, 0.0, u32(k) & 3u);
    }
    return kiln_reduce_large(a);
}

// sin(r + r_lo) for |r| ≲ π/4 (r_lo a correction below r's ulp).
fn kiln_sin_poly(r: f32, r_lo: f32) -> f32 {
    let z = r * r;
    return r + (r * z * (KILN_S1 + z * (KILN_S2 + z * KILN_S3)) + r_lo);
}

// cos(r + r_lo) for |r| ≲ π/4.
fn kiln_cos_poly(r: f32, r_lo: f32) -> f32 {
    let z = r * r;
    let hz = 0.5 * z;
    let w = 1.0 - hz;
    return w + (((1.0 - w) - hz) + (z * z * (KILN_C1 + z * (KILN_C2 + z * KILN_C3)) - r * r_lo));
}

// NaN for x = ±inf or NaN, made from x's bits at run time: a constant NaN
// is a shader compile error in Tint (Chrome), and x - x may be folded to 0.
fn kiln_trig_nan(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) | 0x7fc00000u);
}

fn kiln_sin(x: f32) -> f32 {
    let a = abs(x);
    if ((bitcast<u32>(x) & 0x7fffffffu) >= 0x7f800000u) {
        return kiln_trig_nan(x);
    }
    if (a < 0.000244140625) {
        return x;
    }
    let red = kiln_reduce(a);
    var y: f32;
    switch red.q {
        case 0u: { y = kiln_sin_poly(red.r, red.r_lo); }
        case 1u: { y = kiln_cos_poly(red.r, red.r_lo); }
        case 2u: { y = -kiln_sin_poly(red.r, red.r_lo); }
        default: { y = -kiln_cos_poly(red.r, red.r_lo); }
    }
    return select(y, -y, x < 0.0);
}

fn kiln_cos(x: f32) -> f32 {
    let a = abs(x);
    if ((bitcast<u32>(x) & 0x7fffffffu) >= 0x7f800000u) {
        return kiln_trig_nan(x);
    }
    if (a < 0.000244140625) {
        return 1.0;
    }
    let red = kiln_reduce(a);
    switch red.q {
        case 0u: { return kiln_cos_poly(red.r, red.r_lo); }
        case 1u: { return -kiln_sin_poly(red.r, red.r_lo); }
        case 2u: { return -kiln_cos_poly(red.r, red.r_lo); }
        default: { return kiln_sin_poly(red.r, red.r_lo); }
    }
}
