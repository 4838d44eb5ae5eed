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
// of the four operands. The loop over the axes is written out, one block
// per axis with constant indices: once a dispatch's parameters are compiled
// in as constants (specialize.rs), every block folds to constant arithmetic,
// while a loop over `params.rank` indexing `params.dims[d]` stays a loop
// with dynamic indexing in a software adapter's compiler. Measured natively
// with specialised parameters: a permute over [32, 64, 676] took 27 ns per
// element with the loop and 7 with the blocks on SwiftShader; a permute
// over [12, 64, 4, 32], 12 -> 3-5 ns on lavapipe. Unspecialised, both forms
// run alike.
fn offsets(i: u32) -> vec4<u32> {
    var rem = i;
    var off = vec4<u32>(params.operands[0].base, params.operands[1].base, params.operands[2].base,
                        params.operands[3].base);
    let rank = params.rank;
    if (rank > 7u) {
        let n = params.dims[7];
        let q = rem / n;
        off += (rem - q * n) * vec4<u32>(params.operands[0].strides[7], params.operands[1].strides[7],
                                         params.operands[2].strides[7], params.operands[3].strides[7]);
        rem = q;
    }
    if (rank > 6u) {
        let n = params.dims[6];
        let q = rem / n;
        off += (rem - q * n) * vec4<u32>(params.operands[0].strides[6], params.operands[1].strides[6],
                                         params.operands[2].strides[6], params.operands[3].strides[6]);
        rem = q;
    }
    if (rank > 5u) {
        let n = params.dims[5];
        let q = rem / n;
        off += (rem - q * n) * vec4<u32>(params.operands[0].strides[5], params.operands[1].strides[5],
                                         params.operands[2].strides[5], params.operands[3].strides[5]);
        rem = q;
    }
    if (rank > 4u) {
        let n = params.dims[4];
        let q = rem / n;
        off += (rem - q * n) * vec4<u32>(params.operands[0].strides[4], params.operands[1].strides[4],
                                         params.operands[2].strides[4], params.operands[3].strides[4]);
        rem = q;
    }
    if (rank > 3u) {
        let n = params.dims[3];
        let q = rem / n;
        off += (rem - q * n) * vec4<u32>(params.operands[0].strides[3], params.operands[1].strides[3],
                                         params.operands[2].strides[3], params.operands[3].strides[3]);
        rem = q;
    }
    if (rank > 2u) {
        let n = params.dims[2];
        let q = rem / n;
        off += (rem - q * n) * vec4<u32>(params.operands[0].strides[2], params.operands[1].strides[2],
                                         params.operands[2].strides[2], params.operands[3].strides[2]);
        rem = q;
    }
    if (rank > 1u) {
        let n = params.dims[1];
        let q = rem / n;
        off += (rem - q * n) * vec4<u32>(params.operands[0].strides[1], params.operands[1].strides[1],
                                         params.operands[2].strides[1], params.operands[3].strides[1]);
        rem = q;
    }
    if (rank > 0u) {
        let n = params.dims[0];
        let q = rem / n;
        off += (rem - q * n) * vec4<u32>(params.operands[0].strides[0], params.operands[1].strides[0],
                                         params.operands[2].strides[0], params.operands[3].strides[0]);
        rem = q;
    }
    return off;
}
