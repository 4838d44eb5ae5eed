// reduce.wgsl — Sum, Prod, Max, Min, ArgMax, ArgMin over any set of axes,
// in the summation rule's order (docs/reductions.md): leaves of 128
// elements folded in order, leaves combined by the power-of-two split.
//
// Bindings: 0 params, 1 x: array<{T}> (read), 2 out: array<{TO}>
// (read_write, one element per output, in kept-index order), 3 parts_out and
// 4 parts_in: array<u32> (partials between passes, two words each: the
// value's bits and the index of the element it holds, output-major: partial
// v of output o at words 2 (o V + v) and 2 (o V + v) + 1).
// Params (the host splits the input's axes into kept and reduced ones and
// collapses each group): p[0] outputs, p[1] kept rank, p[2..10] kept dims,
// p[10..18] their input strides, p[18] reduced rank, p[19..27] reduced dims,
// p[27..35] their input strides, p[35] block (elements per output),
// p[36] workgroups per output in this pass, p[37] partials per output read
// by this pass (`parts_*` entries).
//
// Entry points (no invocation loops over more than LEAF elements, and the
// workgroup tree has 8 levels, whatever the reduction's length):
// - `serial`: blocks of at most one leaf: 256 threads per workgroup, one
//   output per thread, the block folded in increasing index order.
//   Launch: ceil(outputs / 256) workgroups folded into a 2-D grid.
// - `leaves_to_parts` / `leaves_to_out`: workgroup w of output o reduces
//   leaves 256 w .. 256 w + 255 of its block: thread t folds leaf 256 w + t,
//   then the workgroup combines its 256 leaf values by the balanced tree
//   that pairs neighbours (level s combines slots i and i + s for i a
//   multiple of 2 s; missing leaves are absent, not zeros), giving one
//   partial — written to parts_out, or to out when one workgroup covers the
//   whole block. Launch: outputs x p[36] workgroups folded into 2-D.
// - `parts_to_parts` / `parts_to_out`: the same tree over groups of 256
//   partials of the previous pass. The host runs passes until one partial
//   per output remains. Aligned groups of 256 are complete subtrees, so the
//   passes give the bits of the single power-of-two split, whatever their
//   number. No atomics: the same input gives the same bits on every run.
//
// Specialisation: {T} input type, {TO} output type, {NAN} `is_nan` for f32
// else `never_nan`, {INIT} the starting accumulator, {COMBINE} the body of
// `fold` (a = earlier partial, b = later one; both valid), {OUT} the output
// expression of the final accumulator `acc`.
//
// Partials carry the index of the element they hold so that ArgMax/ArgMin
// pick the first occurrence (and the first NaN) whatever the tree's shape.

@group(0) @binding(1) var<storage, read> x: array<{T}>;
@group(0) @binding(2) var<storage, read_write> out: array<{TO}>;
@group(0) @binding(3) var<storage, read_write> parts_out: array<u32>;
@group(0) @binding(4) var<storage, read> parts_in: array<u32>;

const LEAF: u32 = 128u;

struct Acc {
    v: {T},
    i: u32,
    ok: u32,
}

fn never_nan(v: {T}) -> bool {
    return false;
}

fn earlier(a: Acc, b: Acc) -> Acc {
    if (a.i <= b.i) {
        return a;
    }
    return b;
}

fn fold(a: Acc, b: Acc) -> Acc {
    {COMBINE}
}

fn combine(a: Acc, b: Acc) -> Acc {
    if (b.ok == 0u) {
        return a;
    }
    if (a.ok == 0u) {
        return b;
    }
    return fold(a, b);
}

fn kept_offset(o: u32) -> u32 {
    var rem = o;
    var off = 0u;
    for (var d = p[1]; d > 0u; d = d - 1u) {
        let n = p[1u + d];
        off += (rem % n) * p[9u + d];
        rem = rem / n;
    }
    return off;
}

fn reduced_offset(j: u32) -> u32 {
    var rem = j;
    var off = 0u;
    for (var d = p[18]; d > 0u; d = d - 1u) {
        let n = p[18u + d];
        off += (rem % n) * p[26u + d];
        rem = rem / n;
    }
    return off;
}

fn element(base: u32, j: u32) -> Acc {
    return Acc(x[base + reduced_offset(j)], j, 1u);
}

@compute @workgroup_size(256)
fn serial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let o = flat_id(wid, nwg, lid);
    if (o >= p[0]) {
        return;
    }
    let base = kept_offset(o);
    var acc = {INIT};
    for (var j = 0u; j < p[35]; j = j + 1u) {
        acc = combine(acc, element(base, j));
    }
    out[o] = {OUT};
}

var<workgroup> partial: array<Acc, 256>;

// An empty slot of the tree: `combine` passes the other side through.
fn absent() -> Acc {
    return Acc({T}(0), 0u, 0u);
}

// The workgroup's output index and its workgroup number within the output.
fn position(wid: vec3<u32>, nwg: vec3<u32>) -> vec2<u32> {
    let g = flat_group(wid, nwg);
    return vec2<u32>(g / p[36], g % p[36]);
}

// Leaf `l` of output `o`'s block, folded in order from the identity.
fn leaf(o: u32, l: u32) -> Acc {
    let base = kept_offset(o);
    let start = l * LEAF;
    if (start >= p[35]) {
        return absent();
    }
    let end = min(start + LEAF, p[35]);
    var acc = {INIT};
    for (var j = start; j < end; j = j + 1u) {
        acc = combine(acc, element(base, j));
    }
    return acc;
}

// Partial `v` of output `o` from the previous pass.
fn load_part(o: u32, v: u32) -> Acc {
    if (v >= p[37]) {
        return absent();
    }
    let at = 2u * (o * p[37] + v);
    return Acc(bitcast<{T}>(parts_in[at]), parts_in[at + 1u], 1u);
}

fn store_part(o: u32, w: u32, a: Acc) {
    let at = 2u * (o * p[36] + w);
    parts_out[at] = bitcast<u32>(a.v);
    parts_out[at + 1u] = a.i;
}

// The balanced neighbour-pairing tree over the workgroup's 256 values; every
// thread calls it (uniform control flow) and gets the root.
fn workgroup_tree(lid: u32, mine: Acc) -> Acc {
    partial[lid] = mine;
    workgroupBarrier();
    for (var s = 1u; s < WG; s = s << 1u) {
        if (lid % (2u * s) == 0u) {
            partial[lid] = combine(partial[lid], partial[lid + s]);
        }
        workgroupBarrier();
    }
    return partial[0];
}

// Each entry point returns early only for a whole workgroup (`o` is
// uniform), so the barriers are in uniform control flow.
@compute @workgroup_size(256)
fn leaves_to_parts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let at = position(wid, nwg);
    if (at.x >= p[0]) {
        return;
    }
    let root = workgroup_tree(lid, leaf(at.x, at.y * WG + lid));
    if (lid == 0u) {
        store_part(at.x, at.y, root);
    }
}

@compute @workgroup_size(256)
fn leaves_to_out(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let at = position(wid, nwg);
    if (at.x >= p[0]) {
        return;
    }
    let acc = workgroup_tree(lid, leaf(at.x, at.y * WG + lid));
    if (lid == 0u) {
        out[at.x] = {OUT};
    }
}

@compute @workgroup_size(256)
fn parts_to_parts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let at = position(wid, nwg);
    if (at.x >= p[0]) {
        return;
    }
    let root = workgroup_tree(lid, load_part(at.x, at.y * WG + lid));
    if (lid == 0u) {
        store_part(at.x, at.y, root);
    }
}

@compute @workgroup_size(256)
fn parts_to_out(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let at = position(wid, nwg);
    if (at.x >= p[0]) {
        return;
    }
    let acc = workgroup_tree(lid, load_part(at.x, at.y * WG + lid));
    if (lid == 0u) {
        out[at.x] = {OUT};
    }
}
