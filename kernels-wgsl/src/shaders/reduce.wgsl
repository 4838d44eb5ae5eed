// reduce.wgsl — Sum, Prod, Max, Min, ArgMax, ArgMin over any set of axes.
//
// Bindings: 0 params, 1 x: array<{T}> (read), 2 out: array<{TO}>
// (read_write, one element per output, in kept-index order).
// Params (the host splits the input's axes into kept and reduced ones and
// collapses each group): p[0] outputs, p[1] kept rank, p[2..10] kept dims,
// p[10..18] their input strides, p[18] reduced rank, p[19..27] reduced dims,
// p[27..35] their input strides, p[35] block (elements per output).
//
// Entry points:
// - `serial`: 256 threads per workgroup, one output per thread, the block
//   folded in increasing index order — the CPU's order, so the bits match it.
//   Launch: ceil(outputs / 256) workgroups folded into a 2-D grid.
// - `tree`: one workgroup (256 threads) per output; thread t folds the block
//   elements t, t + 256, ... in order, then a fixed binary tree in workgroup
//   memory combines the 256 partials. No atomics: the same input gives the
//   same bits on every run. Launch: `outputs` workgroups folded into 2-D.
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

@compute @workgroup_size(256)
fn tree(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    // One output per workgroup: `o` is uniform, so the early return and the
    // barriers below are uniform control flow.
    let o = flat_group(wid, nwg);
    if (o >= p[0]) {
        return;
    }
    let base = kept_offset(o);
    var mine = {INIT};
    for (var j = lid; j < p[35]; j = j + WG) {
        mine = combine(mine, element(base, j));
    }
    partial[lid] = mine;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            partial[lid] = combine(partial[lid], partial[lid + s]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        let acc = partial[0];
        out[o] = {OUT};
    }
}
