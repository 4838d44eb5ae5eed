// matmul.wgsl — batched matrix product out[b] = A[b] x B[b] over the last two
// axes, batch axes broadcast, either operand read transposed through strides.
//
// Bindings: 0 params, 1 a: array<f32> (read), 2 b: array<f32> (read),
// 3 out: array<f32> (read_write, contiguous [batch..., M, N]).
// Params: p[0] M, p[1] N, p[2] K, p[3] a row stride, p[4] a column stride,
// p[5] b row stride, p[6] b column stride (of the logical, possibly
// transposed, matrices), p[7] batch rank, p[8..16] batch dims,
// p[16..24] a's batch strides, p[24..32] b's batch strides (0 where
// broadcast), p[32] index of this dispatch's first batch, p[33] K chunk
// length, p[34] first K chunk of this dispatch, p[35] K chunks per dispatch,
// p[36] distance in `out` between the products of consecutive chunks.
//
// Entry points:
// - `main`: 16 x 16 threads computing a 64 x 64 output tile, 4 x 4 outputs
//   per thread, over one chunk of K (at most K_CHUNK = 1024 values, the
//   host's constant): A and B advance through the chunk in 16-wide slabs
//   staged in workgroup memory, each output summed in increasing k. Launch:
//   (ceil(N / 64), ceil(M / 64), batches x chunks), z = batch b of this
//   dispatch, chunk c as b p[35] + c; the host splits more than the z limit
//   into several dispatches (p[32], p[34]). With K in one chunk the product
//   goes straight to `out`; otherwise chunk c's product lands at
//   c p[36] + (its place in the output) of a scratch buffer.
// - `combine`: the chunk products of each output combined by the summation
//   rule's power-of-two tree (docs/reductions.md), FAN_IN at a time: thread
//   (g, o) reduces products g FAN_IN .. g FAN_IN + FAN_IN - 1 of output o by
//   the binary-counter form of the rule and writes out[g p[0] + o]. Binding 1
//   (`a`) holds the products, product v of output o at a[v p[0] + o].
//   Params: p[0] outputs, p[1] products per output. Launch: ceil(outputs x
//   groups / 256) workgroups, 2-D. The host runs passes until one remains.
// - `accumulate`: out[o] = out[o] + a[o] for o < p[0] (merging two equal
//   complete subtrees when the products do not all fit in scratch at once).
//
// No invocation loops over more than K_CHUNK values of k or FAN_IN
// products, and nothing uses atomics: results repeat bit for bit, and do
// not depend on how the host split the chunks into dispatches and passes.

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const TILE: u32 = 64u;
const KT: u32 = 16u;

var<workgroup> sa: array<array<f32, 64>, 16>;
var<workgroup> sb: array<array<f32, 64>, 16>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = p[0];
    let n = p[1];
    let k = p[2];
    let batch = p[32] + wid.z / p[35];
    let slot = wid.z % p[35];
    let k_begin = (p[34] + slot) * p[33];
    let k_end = min(k_begin + p[33], k);

    var rem = batch;
    var oa = 0u;
    var ob = 0u;
    for (var d = p[7]; d > 0u; d = d - 1u) {
        let size = p[7u + d];
        let j = rem % size;
        rem = rem / size;
        oa += j * p[15u + d];
        ob += j * p[23u + d];
    }

    let row0 = wid.y * TILE;
    let col0 = wid.x * TILE;
    let t = lid.y * 16u + lid.x;
    let computes = row0 + lid.y * 4u < m && col0 + lid.x * 4u < n;
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i = i + 1u) {
        acc[i] = vec4<f32>(0.0);
    }

    for (var k0 = k_begin; k0 < k_end; k0 = k0 + KT) {
        for (var l = 0u; l < 4u; l = l + 1u) {
            let e = t + l * 256u;
            // A slab: 64 rows x 16 k, consecutive threads along k.
            let r = e / KT;
            let ka = e % KT;
            var va = 0.0;
            if (row0 + r < m && k0 + ka < k_end) {
                va = a[oa + (row0 + r) * p[3] + (k0 + ka) * p[4]];
            }
            sa[ka][r] = va;
            // B slab: 16 k x 64 columns, consecutive threads along columns.
            let kb = e / TILE;
            let c = e % TILE;
            var vb = 0.0;
            if (k0 + kb < k_end && col0 + c < n) {
                vb = b[ob + (k0 + kb) * p[5] + (col0 + c) * p[6]];
            }
            sb[kb][c] = vb;
        }
        workgroupBarrier();
        // Threads whose 4 x 4 block lies wholly outside the output only help
        // load (skinny products: [1, K] x [K, 1] uses one thread of 256).
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

    let ob_out = slot * p[36] + batch * m * n;
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

const FAN_IN: u32 = 64u;

@compute @workgroup_size(256)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let outputs = p[0];
    let t = flat_id(wid, nwg, lid);
    let o = t % outputs;
    let g = t / outputs;
    let first = g * FAN_IN;
    if (first >= p[1]) {
        return;
    }
    let count = min(FAN_IN, p[1] - first);
    // Binary counter: after pushing product number i (from 1), merge the top
    // two entries trailing_zeros(i) times; at most log2(FAN_IN) + 1 entries.
    var stack: array<f32, 8>;
    var depth = 0u;
    for (var i = 0u; i < count; i = i + 1u) {
        stack[depth] = a[(first + i) * outputs + o];
        depth = depth + 1u;
        var merges = countTrailingZeros(i + 1u);
        for (; merges > 0u; merges = merges - 1u) {
            stack[depth - 2u] = stack[depth - 2u] + stack[depth - 1u];
            depth = depth - 1u;
        }
    }
    var acc = stack[depth - 1u];
    for (var d = depth - 1u; d > 0u; d = d - 1u) {
        acc = stack[d - 1u] + acc;
    }
    out[g * outputs + o] = acc;
}

@compute @workgroup_size(256)
fn accumulate(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let o = flat_id(wid, nwg, lid);
    if (o < p[0]) {
        out[o] = out[o] + a[o];
    }
}
