// matmul.wgsl — batched matrix product out[b] = A[b] x B[b] over the last two
// axes, batch axes broadcast, either operand read transposed through strides.
//
// Bindings: 0 params, 1 a: array<f32> (read), 2 b: array<f32> (read),
// 3 out: array<f32> (read_write, contiguous [batch..., M, N]).
// Params: p[0] M, p[1] N, p[2] K, p[3] a row stride, p[4] a column stride,
// p[5] b row stride, p[6] b column stride (of the logical, possibly
// transposed, matrices), p[7] batch rank, p[8..16] batch dims,
// p[16..24] a's batch strides, p[24..32] b's batch strides (0 where
// broadcast), p[32] index of this dispatch's first batch.
//
// Workgroup: 16 x 16 threads computing a 64 x 64 output tile, 4 x 4 outputs
// per thread; A and B advance through K in 16-wide slabs staged in workgroup
// memory. Each output is summed in increasing k, so results repeat bit for
// bit. Launch: (ceil(N / 64), ceil(M / 64), batches) — the host splits more
// batches than the z limit into several dispatches (p[32]).

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
    let batch = p[32] + wid.z;

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
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i = i + 1u) {
        acc[i] = vec4<f32>(0.0);
    }

    for (var k0 = 0u; k0 < k; k0 = k0 + KT) {
        for (var l = 0u; l < 4u; l = l + 1u) {
            let e = t + l * 256u;
            // A slab: 64 rows x 16 k, consecutive threads along k.
            let r = e / KT;
            let ka = e % KT;
            var va = 0.0;
            if (row0 + r < m && k0 + ka < k) {
                va = a[oa + (row0 + r) * p[3] + (k0 + ka) * p[4]];
            }
            sa[ka][r] = va;
            // B slab: 16 k x 64 columns, consecutive threads along columns.
            let kb = e / TILE;
            let c = e % TILE;
            var vb = 0.0;
            if (k0 + kb < k && col0 + c < n) {
                vb = b[ob + (k0 + kb) * p[5] + (col0 + c) * p[6]];
            }
            sb[kb][c] = vb;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < KT; kk = kk + 1u) {
            let bv = vec4<f32>(sb[kk][lid.x * 4u], sb[kk][lid.x * 4u + 1u], sb[kk][lid.x * 4u + 2u],
                               sb[kk][lid.x * 4u + 3u]);
            for (var i = 0u; i < 4u; i = i + 1u) {
                acc[i] += sa[kk][lid.y * 4u + i] * bv;
            }
        }
        workgroupBarrier();
    }

    let ob_out = batch * m * n;
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
