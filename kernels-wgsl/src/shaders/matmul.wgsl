// matmul.wgsl — batched matrix product out[b] = A[b] x B[b] over the last two
// axes, batch axes broadcast, either operand read transposed through strides.
//
// After matmul_common.wgsl (the parameters, the output, jobs, store4).
// Bindings: 0 params: MatMul, 1 a: array<f32> (read), 2 b: array<f32>
// (read), 3 out: array<f32> (read_write, contiguous [batch..., M, N]).
// Params: m, n, k; the row and column strides of a and b (of the logical,
// possibly transposed, matrices); the batch axes (rank, dims, a's and b's
// strides, 0 where broadcast); `first_batch` the index of this dispatch's
// first batch, `chunk` the K chunk length, `first_chunk` the first K chunk
// of this dispatch, `chunks` K chunks per dispatch, `chunk_stride` the
// distance in `out` between the products of consecutive chunks.
//
// Entry points, one per shape class (the host picks one per product; see
// kernels/matmul.rs):
// - `tile128`: 16 x 16 threads compute a 128 x 128 output tile, 8 x 8
//   outputs per thread (two 4-row by two 4-column blocks, so that a thread
//   reads its operands as four vec4s per k), A and B staged through
//   workgroup memory in slabs of KT = 16 k.
// - `tile64`: the same with a 64 x 64 tile, 4 x 4 outputs per thread (two
//   vec4 reads per k): more workgroups for middle-sized products.
// - `skinny`: a 4 x 4 block of outputs per thread (1 x 4 when M < 4), no
//   workgroup memory: products with a tiny M or N (matrix-vector), where a
//   tile would leave most threads idle. Blocks rather than one output: a
//   thread's set-up (its job, row and column, the strides) is paid once per
//   block, and each value of A and B read once for four outputs (W2's conv1
//   on SwiftShader, K = 9: the set-up and the loads cost more than the
//   nine multiply-adds; one output a thread 108 ms a step, 1 x 4 41 ms).
// Register blocks: on a software adapter (lavapipe runs each invocation as
// one SIMD lane and loads per lane), a thread's loads per multiply-add set
// the speed; on a GPU the same blocking saves workgroup-memory bandwidth.
//
// Launch: tile kernels (ceil(N / T), ceil(M / T), batches x chunks) with T
// the tile edge; `skinny` (ceil(ceil(M / R) ceil(N / 4) / WG), 1, batches x
// chunks) with R its rows per block (`skinny_rows`). z = batch
// b of this dispatch, chunk c as b `chunks` + c; the host splits more than
// the z limit into several dispatches (`first_batch`, `first_chunk`). With
// K in one chunk the product goes straight to `out`; otherwise chunk c's
// product lands at c `chunk_stride` + (its place in the output) of a
// scratch buffer, and chunks.wgsl combines the chunk products.
//
// Every entry point sums each output in increasing k from 0, one product
// at a time (`acc += a * b`), over at most K_CHUNK = 1024 values of k (the
// host's constant; lavapipe stops loops after 65,535 iterations), and
// nothing uses atomics: results repeat bit for bit, do not depend on how
// the host split the chunks into dispatches, and the entry points agree
// with each other (the tiles add zeros for k past the chunk's end, which
// leaves a sum unchanged except for the sign of an all-zero sum).

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;

// k values per slab staged in workgroup memory.
const KT: u32 = 16u;
// vec4 slots along the 128-wide edge of a `tile128` slab; `tile64` uses
// the first 16.
const SLOTS: u32 = 32u;

// The staged slabs: slab_a[k][q] holds rows 4q .. 4q + 3 of the tile at
// k, slab_b[k][q] columns 4q .. 4q + 3 (16 KiB together, WebGPU's
// guaranteed workgroup storage).
var<workgroup> slab_a: array<array<vec4<f32>, SLOTS>, KT>;
var<workgroup> slab_b: array<array<vec4<f32>, SLOTS>, KT>;

// A[row][kk] of this job, 0 outside the matrix or the chunk.
fn a_at(job: Job, row: u32, kk: u32) -> f32 {
    if (row < params.m && kk < job.k_end) {
        return a[job.oa + row * params.a_row + kk * params.a_col];
    }
    return 0.0;
}

// B[kk][col] of this job, 0 outside the matrix or the chunk.
fn b_at(job: Job, kk: u32, col: u32) -> f32 {
    if (kk < job.k_end && col < params.n) {
        return b[job.ob + kk * params.b_row + col * params.b_col];
    }
    return 0.0;
}

// Rows row .. row + 3 of A at kk, as one slab slot.
fn a_rows(job: Job, row: u32, kk: u32) -> vec4<f32> {
    return vec4<f32>(a_at(job, row, kk), a_at(job, row + 1u, kk), a_at(job, row + 2u, kk), a_at(job, row + 3u, kk));
}

// Columns col .. col + 3 of B at kk, as one slab slot.
fn b_cols(job: Job, kk: u32, col: u32) -> vec4<f32> {
    return vec4<f32>(b_at(job, kk, col), b_at(job, kk, col + 1u), b_at(job, kk, col + 2u), b_at(job, kk, col + 3u));
}

@compute @workgroup_size(16, 16)
fn tile128(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let job = job_of(wid.z);
    let row0 = wid.y * 128u;
    let col0 = wid.x * 128u;
    let t = lid.y * 16u + lid.x;
    // Row blocks lid.y and lid.y + 16 of four rows, column blocks lid.x and
    // lid.x + 16 of four columns: c<row><block>.
    var c0l = vec4<f32>(0.0);
    var c0r = vec4<f32>(0.0);
    var c1l = vec4<f32>(0.0);
    var c1r = vec4<f32>(0.0);
    var c2l = vec4<f32>(0.0);
    var c2r = vec4<f32>(0.0);
    var c3l = vec4<f32>(0.0);
    var c3r = vec4<f32>(0.0);
    var c4l = vec4<f32>(0.0);
    var c4r = vec4<f32>(0.0);
    var c5l = vec4<f32>(0.0);
    var c5r = vec4<f32>(0.0);
    var c6l = vec4<f32>(0.0);
    var c6r = vec4<f32>(0.0);
    var c7l = vec4<f32>(0.0);
    var c7r = vec4<f32>(0.0);
    for (var k0 = job.k_begin; k0 < job.k_end; k0 = k0 + KT) {
        // 512 slots of A and of B, two of each per thread; consecutive
        // threads read consecutive k of A and consecutive columns of B.
        for (var l = 0u; l < 2u; l = l + 1u) {
            let s = t + l * WG;
            slab_a[s % KT][s / KT] = a_rows(job, row0 + (s / KT) * 4u, k0 + s % KT);
            slab_b[s / SLOTS][s % SLOTS] = b_cols(job, k0 + s / SLOTS, col0 + (s % SLOTS) * 4u);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < KT; kk = kk + 1u) {
            let a0 = slab_a[kk][lid.y];
            let a1 = slab_a[kk][lid.y + 16u];
            let b0 = slab_b[kk][lid.x];
            let b1 = slab_b[kk][lid.x + 16u];
            c0l += a0.x * b0;
            c0r += a0.x * b1;
            c1l += a0.y * b0;
            c1r += a0.y * b1;
            c2l += a0.z * b0;
            c2r += a0.z * b1;
            c3l += a0.w * b0;
            c3r += a0.w * b1;
            c4l += a1.x * b0;
            c4r += a1.x * b1;
            c5l += a1.y * b0;
            c5r += a1.y * b1;
            c6l += a1.z * b0;
            c6r += a1.z * b1;
            c7l += a1.w * b0;
            c7r += a1.w * b1;
        }
        workgroupBarrier();
    }
    let r0 = row0 + lid.y * 4u;
    let r1 = r0 + 64u;
    let cl = col0 + lid.x * 4u;
    let cr = cl + 64u;
    store4(job, r0, cl, c0l);
    store4(job, r0, cr, c0r);
    store4(job, r0 + 1u, cl, c1l);
    store4(job, r0 + 1u, cr, c1r);
    store4(job, r0 + 2u, cl, c2l);
    store4(job, r0 + 2u, cr, c2r);
    store4(job, r0 + 3u, cl, c3l);
    store4(job, r0 + 3u, cr, c3r);
    store4(job, r1, cl, c4l);
    store4(job, r1, cr, c4r);
    store4(job, r1 + 1u, cl, c5l);
    store4(job, r1 + 1u, cr, c5r);
    store4(job, r1 + 2u, cl, c6l);
    store4(job, r1 + 2u, cr, c6r);
    store4(job, r1 + 3u, cl, c7l);
    store4(job, r1 + 3u, cr, c7r);
}

@compute @workgroup_size(16, 16)
fn tile64(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let job = job_of(wid.z);
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let t = lid.y * 16u + lid.x;
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    for (var k0 = job.k_begin; k0 < job.k_end; k0 = k0 + KT) {
        // 256 slots of A and of B, one of each per thread.
        slab_a[t % KT][t / KT] = a_rows(job, row0 + (t / KT) * 4u, k0 + t % KT);
        slab_b[t / 16u][t % 16u] = b_cols(job, k0 + t / 16u, col0 + (t % 16u) * 4u);
        workgroupBarrier();
        for (var kk = 0u; kk < KT; kk = kk + 1u) {
            let a0 = slab_a[kk][lid.y];
            let b0 = slab_b[kk][lid.x];
            c0 += a0.x * b0;
            c1 += a0.y * b0;
            c2 += a0.z * b0;
            c3 += a0.w * b0;
        }
        workgroupBarrier();
    }
    let r = row0 + lid.y * 4u;
    let c = col0 + lid.x * 4u;
    store4(job, r, c, c0);
    store4(job, r + 1u, c, c1);
    store4(job, r + 2u, c, c2);
    store4(job, r + 3u, c, c3);
}

@compute @workgroup_size(256)
fn skinny(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let job = job_of(wid.z);
    let m = params.m;
    let n = params.n;
    let quads = (n + 3u) / 4u;
    let rows = skinny_rows(m);
    let i = wid.x * WG + lid;
    if (i >= ((m + rows - 1u) / rows) * quads) {
        return;
    }
    let row = (i / quads) * rows;
    let col = (i % quads) * 4u;
    let a_col = params.a_col;
    let b_row = params.b_row;
    // Columns (rows) past the end read the last one again and are not stored.
    let last = n - 1u;
    let pb = job.ob + min(vec4<u32>(col, col + 1u, col + 2u, col + 3u), vec4<u32>(last)) * params.b_col;
    if (rows == 1u) {
        let pa = job.oa + row * params.a_row;
        var acc = vec4<f32>(0.0);
        for (var kk = job.k_begin; kk < job.k_end; kk = kk + 1u) {
            let o = kk * b_row;
            acc += a[pa + kk * a_col] * vec4<f32>(b[pb.x + o], b[pb.y + o], b[pb.z + o], b[pb.w + o]);
        }
        store4(job, row, col, acc);
        return;
    }
    let pa = job.oa + min(vec4<u32>(row, row + 1u, row + 2u, row + 3u), vec4<u32>(m - 1u)) * params.a_row;
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    for (var kk = job.k_begin; kk < job.k_end; kk = kk + 1u) {
        let o = kk * b_row;
        let bk = vec4<f32>(b[pb.x + o], b[pb.y + o], b[pb.z + o], b[pb.w + o]);
        let ak = kk * a_col;
        c0 += a[pa.x + ak] * bk;
        c1 += a[pa.y + ak] * bk;
        c2 += a[pa.z + ak] * bk;
        c3 += a[pa.w + ak] * bk;
    }
    store4(job, row, col, c0);
    store4(job, row + 1u, col, c1);
    store4(job, row + 2u, col, c2);
    store4(job, row + 3u, col, c3);
}

// Rows of a `skinny` thread's block: four when M has four (each value of B
// then read once for four rows), else one.
fn skinny_rows(m: u32) -> u32 {
    return select(1u, 4u, m >= 4u);
}
