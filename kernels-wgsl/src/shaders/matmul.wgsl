// matmul.wgsl — batched matrix product out[b] = A[b] x B[b] over the last two
// axes, batch axes broadcast, either operand read transposed through strides.
//
// Bindings: 0 params: MatMul, 1 a: array<f32> (read), 2 b: array<f32>
// (read), 3 out: array<f32> (read_write, contiguous [batch..., M, N]).
// Params: m, n, k; the row and column strides of a and b (of the logical,
// possibly transposed, matrices); the batch axes (rank, dims, a's and b's
// strides, 0 where broadcast); `first_batch` the index of this dispatch's
// first batch, `chunk` the K chunk length, `first_chunk` the first K chunk
// of this dispatch, `chunks` K chunks per dispatch, `chunk_stride` the
// distance in `out` between the products of consecutive chunks.
//
// Entry point `main`: SIDE x SIDE (= WG) threads computing a 64 x 64 output
// tile, 4 x 4 outputs per thread, over one chunk of K (at most K_CHUNK =
// 1024 values, the host's constant): A and B advance through the chunk in
// 16-wide slabs staged in workgroup memory, each output summed in
// increasing k. Launch: (ceil(N / 64), ceil(M / 64), batches x chunks), z =
// batch b of this dispatch, chunk c as b `chunks` + c; the host splits more
// than the z limit into several dispatches (`first_batch`, `first_chunk`).
// With K in one chunk the product goes straight to `out`; otherwise chunk
// c's product lands at c `chunk_stride` + (its place in the output) of a
// scratch buffer, and chunks.wgsl combines the chunk products.
//
// No invocation loops over more than K_CHUNK values of k and nothing uses
// atomics: results repeat bit for bit, and do not depend on how the host
// split the chunks into dispatches.

struct MatMul {
    m: u32,
    n: u32,
    k: u32,
    a_row: u32,
    a_col: u32,
    b_row: u32,
    b_col: u32,
    batch_rank: u32,
    batch_dims: array<u32, MAX_DIMS>,
    a_batch: array<u32, MAX_DIMS>,
    b_batch: array<u32, MAX_DIMS>,
    first_batch: u32,
    chunk: u32,
    first_chunk: u32,
    chunks: u32,
    chunk_stride: u32,
}

@group(0) @binding(0) var<storage, read> params: MatMul;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const TILE: u32 = 64u;
const KT: u32 = 16u;
// The workgroup is SIDE x SIDE threads, WG in all, each computing 4 x 4
// outputs of the tile.
const SIDE: u32 = 16u;

var<workgroup> sa: array<array<f32, TILE>, KT>;
var<workgroup> sb: array<array<f32, TILE>, KT>;

@compute @workgroup_size(SIDE, SIDE)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = params.m;
    let n = params.n;
    let k = params.k;
    let batch = params.first_batch + wid.z / params.chunks;
    let slot = wid.z % params.chunks;
    let k_begin = (params.first_chunk + slot) * params.chunk;
    let k_end = min(k_begin + params.chunk, k);

    var rem = batch;
    var oa = 0u;
    var ob = 0u;
    for (var d = params.batch_rank; d > 0u; d = d - 1u) {
        let size = params.batch_dims[d - 1u];
        let j = rem % size;
        rem = rem / size;
        oa += j * params.a_batch[d - 1u];
        ob += j * params.b_batch[d - 1u];
    }

    let row0 = wid.y * TILE;
    let col0 = wid.x * TILE;
    let t = lid.y * SIDE + lid.x;
    let computes = row0 + lid.y * 4u < m && col0 + lid.x * 4u < n;
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i = i + 1u) {
        acc[i] = vec4<f32>(0.0);
    }

    for (var k0 = k_begin; k0 < k_end; k0 = k0 + KT) {
        for (var l = 0u; l < 4u; l = l + 1u) {
            let e = t + l * WG;
            // A slab: 64 rows x 16 k, consecutive threads along k.
            let r = e / KT;
            let ka = e % KT;
            var va = 0.0;
            if (row0 + r < m && k0 + ka < k_end) {
                va = a[oa + (row0 + r) * params.a_row + (k0 + ka) * params.a_col];
            }
            sa[ka][r] = va;
            // B slab: 16 k x 64 columns, consecutive threads along columns.
            let kb = e / TILE;
            let c = e % TILE;
            var vb = 0.0;
            if (k0 + kb < k_end && col0 + c < n) {
                vb = b[ob + (k0 + kb) * params.b_row + (col0 + c) * params.b_col];
            }
            sb[kb][c] = vb;
        }
        workgroupBarrier();
        // Threads whose 4 x 4 block lies wholly outside the output only help
        // load (skinny products: [1, K] x [K, 1] uses one thread of WG).
        if (computes) {
            for (var kk = 0u; kk < KT; kk = kk + 1u) {
                let bv = vec4<f32>(sb[kk][lid.x * 4u], sb[kk][lid.x * 4u + 1u], sb[kk][lid.x * 4u + 2u],
                                   sb[kk][lid.x * 4u + 3u]);
                for (var i = 0u; i < 4u; i = i + 1u) {
                    acc[i] += sa[kk][lid.y * 4u + i] * bv;
                }
            }
        }
        workgroupBarrier();
    }

    let ob_out = slot * params.chunk_stride + batch * m * n;
    for (var i = 0u; i < 4u; i = i + 1u) {
        let r = row0 + lid.y * 4u + i;
        if (r < m) {
            for (var j = 0u; j < 4u; j = j + 1u) {
                let c = col0 + lid.x * 4u + j;
                if (c < n) {
                    out[ob_out + r * n + c] = acc[i][j];
                }
            }
        }
    }
}
