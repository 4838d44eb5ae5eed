// strided.wgsl — what the strided kernels (binary.wgsl, where.wgsl,
// movement.wgsl) share: their parameter struct, its binding, the index
// arithmetic and the entry points, which call the kernel's
// `element(i, offsets)` for each element they take. The host puts it after
// common.wgsl and before the kernel's file, and launches `main` (one
// element per thread) on GPUs, `main8` (eight) on software adapters.
//
// `offsets` reads the parameters where they are bound. Passing the struct
// to a function by value instead copies all its 46 words into every
// invocation: on lavapipe (Mesa's software Vulkan) an Add over [12, 64, 128]
// took 325 ns per element that way, 16-55 ns reading in place.

// One operand of a strided iteration: its base offset and its strides (in
// elements; 0 along broadcast axes) over the iteration dims.
struct Operand {
    base: u32,
    strides: array<u32, MAX_DIMS>,
}

// The strided-geometry parameters of binary.wgsl, where.wgsl and
// movement.wgsl: n elements over `rank` <= MAX_DIMS dims, up to four
// operands (unused ones all zeros).
struct Strided {
    n: u32,
    rank: u32,
    dims: array<u32, MAX_DIMS>,
    operands: array<Operand, 4>,
}

@group(0) @binding(0) var<storage, read> params: Strided;

// Unravels the row-major index i over the dims once and returns the offsets
// of the four operands.
fn offsets(i: u32) -> vec4<u32> {
    var rem = i;
    var off = vec4<u32>(params.operands[0].base, params.operands[1].base, params.operands[2].base,
                        params.operands[3].base);
    for (var d = params.rank; d > 0u; d = d - 1u) {
        let n = params.dims[d - 1u];
        let k = rem % n;
        rem = rem / n;
        let s = vec4<u32>(params.operands[0].strides[d - 1u], params.operands[1].strides[d - 1u],
                          params.operands[2].strides[d - 1u], params.operands[3].strides[d - 1u]);
        off += k * s;
    }
    return off;
}

// Elements first .. first + count - 1 of the iteration (those below n),
// each handed to the kernel's `element` with its operands' offsets. After
// the first, an element in the same innermost row steps from the one
// before by that axis's strides instead of unravelling its index again.
fn elements(first: u32, count: u32) {
    if (first >= params.n) {
        return;
    }
    let end = first + min(count, params.n - first);
    var len = 1u;
    var step = vec4<u32>(0u);
    if (params.rank > 0u) {
        let d = params.rank - 1u;
        len = params.dims[d];
        step = vec4<u32>(params.operands[0].strides[d], params.operands[1].strides[d], params.operands[2].strides[d],
                         params.operands[3].strides[d]);
    }
    var o = offsets(first);
    element(first, o);
    // The column in the innermost row, counted rather than divided for.
    var col = first % len;
    for (var i = first + 1u; i < end; i = i + 1u) {
        col += 1u;
        if (col == len) {
            col = 0u;
            o = offsets(i);
        } else {
            o += step;
        }
        element(i, o);
    }
}

// One element per thread (on GPUs: neighbouring threads read neighbouring
// elements).
@compute @workgroup_size(WG)
fn main(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    elements(flat_id(wg, lid), 1u);
}

// Eight consecutive elements per thread (on software adapters, which run
// invocations as SIMD lanes of a CPU: there unravelling an index, which
// reads every dim and stride from the parameters, cost more than the op.
// On SwiftShader, the browser's adapter in CI, W2's bias Add over
// [64, 32, 26, 26] took 45 ms one element per thread, 27 ms four, 21.5 ms
// eight).
@compute @workgroup_size(WG)
fn main8(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    elements(flat_id(wg, lid) * 8u, 8u);
}
