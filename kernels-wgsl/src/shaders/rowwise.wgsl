// rowwise.wgsl — CausalSoftmax: softmax over the last axis of [..., L, S]
// keeping, in row i (position i along L), the keys j with j - i <= diagonal.
//
// Bindings: 0 params: Rowwise, 1 x: array<f32> (read), 2 out: array<f32>
// (read_write).
// Params: `rows` (all matrices together), `l` L, `s` S, `diagonal`.
//
// A row keeps its first `kept` = clamp(i + diagonal + 1, 0, S) entries; the
// rest are 0. Entries of -inf count as masked: a row whose kept entries are
// all -inf (or that keeps none) is all zeros, never NaN. Each row is shifted
// by its kept maximum before the exponential.
//
// Entry points:
// - `serial`: one thread per row: max, sum of exponentials and quotients in
//   index order (the CPU's order). Launch: ceil(rows / WG) workgroups
//   folded into a 2-D grid.
// - `tree`: one workgroup per row (long rows): thread t covers entries t,
//   t + WG, ...; a fixed binary tree in workgroup memory combines the
//   partial maxima, then the partial sums. No atomics: the same input gives
//   the same bits on every run. Launch: `rows` workgroups folded into 2-D.

struct Rowwise {
    rows: u32,
    l: u32,
    s: u32,
    diagonal: i32,
}

@group(0) @binding(0) var<storage, read> params: Rowwise;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// Entries the row keeps (the causal limit).
fn kept(row: u32) -> u32 {
    let i = i32(row % params.l);
    return u32(clamp(i + params.diagonal + 1, 0, i32(params.s)));
}

fn is_neg_inf(v: f32) -> bool {
    return bitcast<u32>(v) == 0xff800000u;
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
    let s = params.s;
    let base = r * s;
    let k = kept(r);
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
var<workgroup> seen: array<u32, WG>;

@compute @workgroup_size(WG)
fn tree(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    // One row per workgroup: `r` is uniform, so the early return and the
    // barriers below are uniform control flow.
    let r = flat_group(wg);
    if (r >= params.rows) {
        return;
    }
    let s = params.s;
    let base = r * s;
    let k = kept(r);
    // Partial maxima; `seen` marks lanes that hold at least one entry.
    var m = 0.0;
    var has = 0u;
    for (var j = lid; j < k; j = j + WG) {
        if (has == 0u) {
            m = x[base + j];
            has = 1u;
        } else {
            m = max_nan(m, x[base + j]);
        }
    }
    partial[lid] = m;
    seen[lid] = has;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h = h >> 1u) {
        if (lid < h && seen[lid + h] != 0u) {
            if (seen[lid] == 0u) {
                partial[lid] = partial[lid + h];
                seen[lid] = 1u;
            } else {
                partial[lid] = max_nan(partial[lid], partial[lid + h]);
            }
        }
        workgroupBarrier();
    }
    let row_max = partial[0];
    let empty = seen[0] == 0u || is_neg_inf(row_max);
    workgroupBarrier();
    var total = 0.0;
    if (!empty) {
        for (var j = lid; j < k; j = j + WG) {
            total += exp(x[base + j] - row_max);
        }
    }
    partial[lid] = total;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h = h >> 1u) {
        if (lid < h) {
            partial[lid] = partial[lid] + partial[lid + h];
        }
        workgroupBarrier();
    }
    let sum = partial[0];
    for (var j = lid; j < s; j = j + WG) {
        if (empty || j >= k) {
            out[base + j] = 0.0;
        } else {
            out[base + j] = exp(x[base + j] - row_max) / sum;
        }
    }
}
