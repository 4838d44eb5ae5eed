// random.wgsl — RandUniform and RandNormal (f32): element i is a pure
// function of (seed, i), the generator of kiln_core::random ported bit for
// bit (32-bit integer operations only; u32 arithmetic wraps in WGSL as
// `wrapping_*` does in Rust).
//
// Bindings: 0 params: Random, 1 out: array<f32> (read_write).
// Params: n, `keys` (`seed_keys(seed)`, computed on the host since WGSL has
// no 64-bit integers).
// Launch: ceil(n / WG) workgroups folded into a 2-D grid, one element per
// thread.
//
// Entry points:
// - `uniform`: (bits(i) >> 8) · 2^-24 — exact, so bit-identical to the CPU.
// - `normal`: Box–Muller as the CPU's f32 path: u1 = 1 - uniform(2i),
//   u2 = uniform(2i + 1), sqrt(-2 ln u1) · cos(2π u2), all in f32. ln and cos
//   are computed here (musl's logf; a Cody–Waite reduction and Cephes'
//   sinf/cosf polynomials) rather than by the builtins, whose Vulkan bounds
//   are loose (log: 2^-21 absolute near 1, where -2 ln u1 could even come
//   out negative; cos: 2^-11 absolute, and only on [-π, π]): within a few
//   ulps of the CPU's libm on every driver.

struct Random {
    n: u32,
    keys: array<u32, 2>,
}

@group(0) @binding(0) var<storage, read> params: Random;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

// lowbias32 (kiln_core::random::hash32).
fn hash32(v: u32) -> u32 {
    var x = v;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

// kiln_core::tensor_rng::bits with the keys of the params.
fn bits(i: u32) -> u32 {
    return hash32((hash32(i ^ params.keys[0]) + params.keys[1]) ^ 0x2c1b3c6du);
}

fn uniform01(i: u32) -> f32 {
    // 24 bits, exact in f32; the factor is 2^-24.
    return f32(bits(i) >> 8u) * 5.9604644775390625e-8;
}

// cos of t in [0, 2π] (here 2π · u2): Cody–Waite reduction by π/2 (the
// quotient q <= 4, so q times each head is exact), then Cephes' sinf/cosf
// polynomials on [-π/4, π/4].
fn cos_f32(t: f32) -> f32 {
    let q = round(t * 0.63661977236758134);
    var r = t - q * 1.5703125;
    r = r - q * 4.837512969970703125e-4;
    r = r - q * 7.54978995489188216e-8;
    let z = r * r;
    let c = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
    let s = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
    switch (u32(q) & 3u) {
        case 0u: {
            return c;
        }
        case 1u: {
            return -s;
        }
        case 2u: {
            return -c;
        }
        default: {
            return s;
        }
    }
}

@compute @workgroup_size(WG)
fn uniform(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    out[i] = uniform01(i);
}

@compute @workgroup_size(WG)
fn normal(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    // u1 in (0, 1] (exact: 1 - k·2^-24), u2 in [0, 1).
    let u1 = 1.0 - uniform01(2u * i);
    let u2 = uniform01(2u * i + 1u);
    // 2π as the CPU's f32 TAU (0x40c90fdb).
    out[i] = sqrt(-2.0 * ln_f32(u1)) * cos_f32(6.2831854820251465 * u2);
}
