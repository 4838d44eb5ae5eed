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

fn f32_to_bool(x: f32) -> u32 {
    return select(1u, 0u, x == 0.0);
}

fn i32_to_bool(x: i32) -> u32 {
    return select(0u, 1u, x != 0);
}
