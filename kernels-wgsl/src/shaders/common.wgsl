// common.wgsl — prepended by the host to every kernel below; not a kernel.
//
// Binding 0 of group 0 is always the dispatch's parameter block: u32 words
// (f32 values travel as their bits) that the host appends to the current
// execution's parameter arena and binds at this dispatch's own offset, so no
// two dispatches of one command encoder share (or overwrite) parameters.
//
// One-dimensional launches of WG-thread workgroups are folded into a 2-D grid
// (x <= the adapter's per-dimension limit, usually 65,535; y as needed):
// `flat_id` turns (workgroup, lane) back into one linear index, and every
// kernel returns early for indices past its element count.

@group(0) @binding(0) var<storage, read> p: array<u32>;

const WG: u32 = 256u;
const MAX_DIMS: u32 = 8u;

fn flat_group(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

fn flat_id(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return flat_group(wid, nwg) * WG + lid;
}

// Parameter word i read as an f32.
fn pf(i: u32) -> f32 {
    return bitcast<f32>(p[i]);
}

// By bits, so that no compiler may assume NaNs away.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// The strided-geometry block shared by element-wise and copy kernels:
//   p[0] element count, p[1] rank r <= MAX_DIMS, p[2 .. 2 + r] dims,
//   operand k (0..3): p[10 + 9k] base offset, p[11 + 9k .. 11 + 9k + r] strides
//   (in elements; 0 along broadcast axes). Unused operands are all zeros.
// Unravels the row-major index i over the dims once and returns the offsets
// of the four operands.
fn offsets(i: u32) -> vec4<u32> {
    var rem = i;
    var off = vec4<u32>(p[10u], p[19u], p[28u], p[37u]);
    let rank = p[1];
    for (var d = rank; d > 0u; d = d - 1u) {
        let n = p[1u + d];
        let k = rem % n;
        rem = rem / n;
        off += k * vec4<u32>(p[10u + d], p[19u + d], p[28u + d], p[37u + d]);
    }
    return off;
}

// The window geometry block of window.wgsl and pool.wgsl: p[1] h, p[2] w
// (image), p[3] oh, p[4] ow (window positions), p[5] kh, p[6] kw (kernel),
// p[7] sh, p[8] sw (stride), p[9] dh, p[10] dw (dilation), p[11] ph, p[12] pw
// (padding before the image). Axis a is 0 for rows, 1 for columns; NONE
// marks "no such pixel / position" (the host keeps real ones below it).
const NONE: u32 = 0xffffffffu;

// The image coordinate along axis a of kernel tap k of window position o,
// or NONE when it falls in the padding.
fn window_pixel(a: u32, o: u32, k: u32) -> u32 {
    let padded = o * p[7u + a] + k * p[9u + a];
    if (padded < p[11u + a] || padded - p[11u + a] >= p[1u + a]) {
        return NONE;
    }
    return padded - p[11u + a];
}

// The window position along axis a whose kernel tap k lands on padded
// coordinate `padded`, or NONE when no window position does.
fn window_position(a: u32, padded: u32, k: u32) -> u32 {
    let d = k * p[9u + a];
    if (d > padded || (padded - d) % p[7u + a] != 0u) {
        return NONE;
    }
    let o = (padded - d) / p[7u + a];
    if (o >= p[3u + a]) {
        return NONE;
    }
    return o;
}

// Conversions with the CPU backend's `Cast` semantics (Rust `as`): float to
// i32 truncates and saturates, NaN gives 0; anything to bool is `!= 0`.
fn f32_to_i32(x: f32) -> i32 {
    if (is_nan(x)) {
        return 0;
    }
    if (x >= 2147483648.0) {
        return 2147483647;
    }
    if (x <= -2147483648.0) {
        return -2147483647 - 1;
    }
    return i32(x);
}

// By bits: GPUs that flush subnormals to zero would otherwise call 1e-40
// false (seen on NVIDIA's Vulkan driver), and NaN must be true.
fn f32_to_bool(x: f32) -> u32 {
    return select(0u, 1u, (bitcast<u32>(x) & 0x7fffffffu) != 0u);
}

fn i32_to_bool(x: i32) -> u32 {
    return select(0u, 1u, x != 0);
}

// ln(1 + f) + k·ln 2 for f in [sqrt(2)/2 - 1, sqrt(2) - 1] (musl's logf
// kernel, < 1 ulp): ln_f32's core, and log1p's for small arguments.
fn ln_kernel(f: f32, dk: f32) -> f32 {
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * (0.40000972151756287 + w * 0.24279078841209412);
    let t2 = z * (0.66666662693023682 + w * 0.28498786687850952);
    let r = t2 + t1;
    let hfsq = 0.5 * f * f;
    // ln 2 split in a head with few bits (dk · head is exact) and a tail.
    return s * (hfsq + r) + dk * 9.0580006144591607e-6 - hfsq + f + dk * 0.69313812255859375;
}

// Natural logarithm of a positive normal f32 (musl's logf, < 1 ulp). The
// builtin `log` is not enough where it matters: Vulkan allows 2^-21
// absolute error near 1.
fn ln_f32(v: f32) -> f32 {
    var ix = bitcast<u32>(v);
    // Reduce to x in [sqrt(2)/2, sqrt(2)) times 2^k.
    ix += 0x3f800000u - 0x3f3504f3u;
    let k = i32(ix >> 23u) - 0x7f;
    ix = (ix & 0x007fffffu) + 0x3f3504f3u;
    return ln_kernel(bitcast<f32>(ix) - 1.0, f32(k));
}
