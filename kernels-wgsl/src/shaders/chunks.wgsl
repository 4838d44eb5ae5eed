// chunks.wgsl — the chunk products of a long matrix product (matmul.wgsl
// with K over K_CHUNK) summed by the summation rule's power-of-two tree
// (docs/reductions.md).
//
// Bindings: 0 params: Chunks, 1 a: array<f32> (read: the products, product
// v of output o at a[v outputs + o]), 3 out: array<f32> (read_write).
// Launch: ceil(threads / WG) workgroups folded into a 2-D grid.
//
// Entry points:
// - `combine`: FAN_IN products at a time: thread (g, o) reduces products
//   g FAN_IN .. g FAN_IN + FAN_IN - 1 of output o by the binary-counter form
//   of the rule and writes out[g outputs + o]. The host runs passes until one
//   remains.
// - `accumulate`: out[o] = out[o] + a[o] for o < outputs (merging two equal
//   complete subtrees when the products do not all fit in scratch at once).
//
// No invocation loops over more than FAN_IN products, and nothing uses
// atomics: results repeat bit for bit, and do not depend on how the host
// split the chunks into passes.

struct Chunks {
    outputs: u32,
    products: u32,
}

@group(0) @binding(0) var<storage, read> params: Chunks;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const FAN_IN: u32 = 64u;

@compute @workgroup_size(WG)
fn combine(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let outputs = params.outputs;
    let t = flat_id(wg, lid);
    let o = t % outputs;
    let g = t / outputs;
    let first = g * FAN_IN;
    if (first >= params.products) {
        return;
    }
    let count = min(FAN_IN, params.products - first);
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

@compute @workgroup_size(WG)
fn accumulate(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let o = flat_id(wg, lid);
    if (o < params.outputs) {
        out[o] = out[o] + a[o];
    }
}
