// select.wgsl — TopK: the positions (i32) of the k best elements of each
// row of the last axis, best first, in the CPU's order: by value
// (descending when `largest`, ascending otherwise), NaN above every
// number, ties to the lower position. Position p of a row is the best
// element after the one at p − 1 (a total order, so exactly the ones not
// yet picked). The host launches one dispatch per (p, segment of the row)
// (kernels/select.rs): an invocation scans one segment of its row and
// keeps the best so far in out[row, p], so no loop runs longer than a
// segment (llvmpipe stops a loop after 65,535 iterations). No scratch
// memory.
//
// Bindings: 0 params: Select, 1 x: array<T> (read), 2 out: array<i32>
// (read_write).
// Params: `rows`, `len` (the row length), `k`, `largest` (0 or 1), the
// position `p` being chosen and the segment `start`, `count`.
// Specialisation: `T` (f32 or i32) and, for i32, `nan`. As written: f32.
// Launch: ceil(rows / WG) workgroups folded into a 2-D grid, once per
// (p, segment).

alias T = f32;

struct Select {
    rows: u32,
    len: u32,
    k: u32,
    largest: u32,
    p: u32,
    start: u32,
    count: u32,
}

@group(0) @binding(0) var<storage, read> params: Select;
@group(0) @binding(1) var<storage, read> x: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;

// common.wgsl's test by bits (a compiler may fold `v != v` to false).
// Specialised to `false` for i32.
fn nan(v: T) -> bool {
    return is_nan(v);
}

// Whether (a at position ia) comes before (b at ib).
fn before(a: T, ia: u32, b: T, ib: u32) -> bool {
    let an = nan(a);
    let bn = nan(b);
    if (an != bn) {
        return an == (params.largest != 0u);
    }
    if (!an && a != b) {
        return (a > b) == (params.largest != 0u);
    }
    return ia < ib;
}

@compute @workgroup_size(WG)
fn main(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let row = flat_id(wg, lid);
    if (row >= params.rows) {
        return;
    }
    let base = row * params.len;
    let slot = row * params.k + params.p;
    // The best of the earlier segments (len: none yet).
    var best = params.len;
    if (params.start > 0u) {
        best = u32(out[slot]);
    }
    var prev = 0u;
    if (params.p > 0u) {
        prev = u32(out[slot - 1u]);
    }
    for (var j = params.start; j < params.start + params.count; j++) {
        let after_prev = params.p == 0u || before(x[base + prev], prev, x[base + j], j);
        if (after_prev && (best == params.len || before(x[base + j], j, x[base + best], best))) {
            best = j;
        }
    }
    out[slot] = i32(best);
}
