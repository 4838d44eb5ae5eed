// matmul_common.wgsl — what matmul.wgsl and matmul_vec4.wgsl share: the
// parameters (see matmul.wgsl's header), the output binding, each
// workgroup's job (its batch's operand offsets, its output's offset, its K
// chunk) and the guarded vec4 store of four outputs of a row.

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
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// What a workgroup (or a skinny thread) works on: its batch's offsets into
// a and b, its output's offset, and its chunk's k range.
struct Job {
    oa: u32,
    ob: u32,
    out: u32,
    k_begin: u32,
    k_end: u32,
}

fn job_of(z: u32) -> Job {
    let batch = params.first_batch + z / params.chunks;
    let slot = z % params.chunks;
    let k_begin = (params.first_chunk + slot) * params.chunk;
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
    let out_at = slot * params.chunk_stride + batch * params.m * params.n;
    return Job(oa, ob, out_at, k_begin, min(k_begin + params.chunk, params.k));
}

// Output row `row`, columns col .. col + 3, where they exist.
fn store4(job: Job, row: u32, col: u32, v: vec4<f32>) {
    let n = params.n;
    if (row >= params.m) {
        return;
    }
    let at = job.out + row * n + col;
    if (col + 3u < n) {
        out[at] = v.x;
        out[at + 1u] = v.y;
        out[at + 2u] = v.z;
        out[at + 3u] = v.w;
        return;
    }
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (col + j < n) {
            out[at + j] = v[j];
        }
    }
}
