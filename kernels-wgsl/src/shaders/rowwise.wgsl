// rowwise.wgsl — CausalSoftmax: softmax over the last axis of [..., L, S]
// keeping, in row i (position i along L), the keys j with j - i <= diagonal.
//
// Bindings: 0 params: Rowwise, 1 x: array<f32> (read), 2 out: array<f32>
// (read_write), 3 parts_out: array<f32> (read_write) and 4 parts_in:
// array<f32> (read) — per-row partials between passes, partial v of row r
// at r * V + v —, 5 row_max and 6 row_sum: array<f32> (read, one per row).
// Params: `rows` (all matrices together), `l` L, `s` S, `diagonal`,
// `groups` (workgroups per row in this pass, partials it writes per row),
// `parts` (leaves or partials per row this pass reads).
//
// A row keeps its first `kept` = clamp(i + diagonal + 1, 0, S) entries; the
// rest are 0. Entries of -inf count as masked: a row whose kept entries are
// all -inf (or that keeps none) is all zeros, never NaN. Each row is shifted
// by its kept maximum before the exponential; the exponentials are summed by
// the summation rule (docs/reductions.md): leaves of LEAF entries folded in
// order, leaf values combined by the power-of-two split. The CPU backend
// sums in the same order.
//
// Entry points (no invocation loops over more than LEAF entries, and the
// workgroup tree has 8 levels, whatever S is):
// - `serial`: rows of at most LEAF entries: one thread per row, max, sum of
//   exponentials and quotients in index order (one leaf: the CPU's order).
//   Launch: ceil(rows / WG) workgroups folded into a 2-D grid.
// - Longer rows, three stages, each over `rows` x `groups` workgroups
//   (folded into 2-D):
//   - `max_leaves`, then `max_parts` until one partial per row remains:
//     thread t of workgroup w of row r takes the maximum of leaf
//     w WG + t (a NaN wins), the workgroup combines its WG values by the
//     tree below; an empty leaf is -inf. The host keeps the last pass's
//     output as `row_max`.
//   - `sum_leaves`, then `sum_parts`: the same over exp(x - row_max), with
//     +0.0 for missing leaves (the padded form of the rule: the same bits as
//     the power-of-two split). Aligned groups of WG leaves or partials are
//     complete subtrees, so the passes give the rule's bits whatever their
//     number. The host keeps the last output as `row_sum`.
//   - `normalise`: one thread per element: exp(x - row_max) / row_sum for
//     kept entries of non-empty rows, 0 elsewhere. Launch: ceil(rows S / WG)
//     workgroups folded into 2-D.
// No atomics: the same input gives the same bits on every run.

struct Rowwise {
    rows: u32,
    l: u32,
    s: u32,
    diagonal: i32,
    groups: u32,
    parts: u32,
}

@group(0) @binding(0) var<storage, read> params: Rowwise;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> parts_out: array<f32>;
@group(0) @binding(4) var<storage, read> parts_in: array<f32>;
@group(0) @binding(5) var<storage, read> row_max: array<f32>;
@group(0) @binding(6) var<storage, read> row_sum: array<f32>;

// Entries of one leaf of the summation rule (the CPU's `reduce::LEAF`).
const LEAF: u32 = 128u;

// Entries the row keeps (the causal limit).
fn kept(row: u32) -> u32 {
    let i = i32(row % params.l);
    return u32(clamp(i + params.diagonal + 1, 0, i32(params.s)));
}

fn is_neg_inf(v: f32) -> bool {
    return bitcast<u32>(v) == 0xff800000u;
}

// -inf, built at run time (a non-finite constant expression is not valid
// WGSL).
fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u + params.rows * 0u);
}

// The larger of a (the running max) and v; NaN wins and stays.
fn max_nan(a: f32, v: f32) -> f32 {
    if (is_nan(a)) {
        return a;
    }
    if (is_nan(v) || v > a) {
        return v;
    }
    return a;
}

@compute @workgroup_size(WG)
fn serial(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let r = flat_id(wg, lid);
    if (r >= params.rows) {
        return;
    }
    let s = min(params.s, LEAF);
    let base = r * params.s;
    let k = min(kept(r), s);
    var m = 0.0;
    for (var j = 0u; j < k; j = j + 1u) {
        if (j == 0u) {
            m = x[base];
        } else {
            m = max_nan(m, x[base + j]);
        }
    }
    if (k == 0u || is_neg_inf(m)) {
        for (var j = 0u; j < s; j = j + 1u) {
            out[base + j] = 0.0;
        }
        return;
    }
    var total = 0.0;
    for (var j = 0u; j < k; j = j + 1u) {
        let e = exp(x[base + j] - m);
        out[base + j] = e;
        total += e;
    }
    for (var j = 0u; j < k; j = j + 1u) {
        out[base + j] = out[base + j] / total;
    }
    for (var j = k; j < s; j = j + 1u) {
        out[base + j] = 0.0;
    }
}

var<workgroup> partial: array<f32, WG>;

// The row and the workgroup number within the row.
fn position(wg: Workgroup) -> vec2<u32> {
    let g = flat_group(wg);
    return vec2<u32>(g / params.groups, g % params.groups);
}

// The balanced neighbour-pairing tree over the workgroup's WG values (level
// h combines slots i and i + h for i a multiple of 2 h); every thread calls
// it (uniform control flow) and gets the root. `sum` selects + over max_nan.
fn workgroup_tree(lid: u32, mine: f32, sum: bool) -> f32 {
    partial[lid] = mine;
    workgroupBarrier();
    for (var h = 1u; h < WG; h = h << 1u) {
        if (lid % (2u * h) == 0u) {
            if (sum) {
                partial[lid] = partial[lid] + partial[lid + h];
            } else {
                partial[lid] = max_nan(partial[lid], partial[lid + h]);
            }
        }
        workgroupBarrier();
    }
    let root = partial[0];
    workgroupBarrier();
    return root;
}

// The kept entries [start, end) of leaf `q` of row `r`.
fn leaf_range(r: u32, q: u32) -> vec2<u32> {
    let k = kept(r);
    let start = min(q * LEAF, k);
    return vec2<u32>(start, min(start + LEAF, k));
}

// Partial v of row r from the previous pass, or `missing` past the end.
fn load_part(r: u32, v: u32, missing: f32) -> f32 {
    if (v >= params.parts) {
        return missing;
    }
    return parts_in[r * params.parts + v];
}

// Each entry point returns early only for a whole workgroup (the row is
// uniform), so the barriers are in uniform control flow.
@compute @workgroup_size(WG)
fn max_leaves(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let at = position(wg);
    if (at.x >= params.rows) {
        return;
    }
    let range = leaf_range(at.x, at.y * WG + lid);
    let base = at.x * params.s;
    var m = neg_inf();
    for (var j = range.x; j < range.y; j = j + 1u) {
        m = max_nan(m, x[base + j]);
    }
    let root = workgroup_tree(lid, m, false);
    if (lid == 0u) {
        parts_out[at.x * params.groups + at.y] = root;
    }
}

@compute @workgroup_size(WG)
fn max_parts(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let at = position(wg);
    if (at.x >= params.rows) {
        return;
    }
    let root = workgroup_tree(lid, load_part(at.x, at.y * WG + lid, neg_inf()), false);
    if (lid == 0u) {
        parts_out[at.x * params.groups + at.y] = root;
    }
}

@compute @workgroup_size(WG)
fn sum_leaves(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let at = position(wg);
    if (at.x >= params.rows) {
        return;
    }
    let range = leaf_range(at.x, at.y * WG + lid);
    let base = at.x * params.s;
    let m = row_max[at.x];
    // An empty row's sum is never used (`normalise` writes zeros); skip it
    // rather than compute exp(-inf - -inf).
    var acc = 0.0;
    if (!is_neg_inf(m)) {
        for (var j = range.x; j < range.y; j = j + 1u) {
            acc += exp(x[base + j] - m);
        }
    }
    let root = workgroup_tree(lid, acc, true);
    if (lid == 0u) {
        parts_out[at.x * params.groups + at.y] = root;
    }
}

@compute @workgroup_size(WG)
fn sum_parts(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let at = position(wg);
    if (at.x >= params.rows) {
        return;
    }
    let root = workgroup_tree(lid, load_part(at.x, at.y * WG + lid, 0.0), true);
    if (lid == 0u) {
        parts_out[at.x * params.groups + at.y] = root;
    }
}

@compute @workgroup_size(WG)
fn normalise(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let e = flat_id(wg, lid);
    let s = params.s;
    if (e >= params.rows * s) {
        return;
    }
    let r = e / s;
    let j = e % s;
    let m = row_max[r];
    if (j >= kept(r) || is_neg_inf(m)) {
        out[e] = 0.0;
    } else {
        out[e] = exp(x[e] - m) / row_sum[r];
    }
}
