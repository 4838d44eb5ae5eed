// strided.wgsl — what the strided kernels (binary.wgsl, where.wgsl,
// movement.wgsl) share: their parameter struct, its binding and the index
// arithmetic. The host puts it after common.wgsl and before the kernel's
// file.
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
