// norm.wgsl — LayerNorm and LayerNormBackward over the last axis of
// [rows, n] (f32), with the CPU kernel's operations in its order
// (core/src/backend/cpu/norm.rs):
//   mean = Σx / n, c = x - mean, r = 1 / sqrt(Σc² / n + eps);
//   forward  y  = c · r;
//   backward dx = ((g - Σg / n) - x̂ · (Σ(g · x̂) / n)) · r, x̂ = c · r.
// Every Σ follows the summation rule (docs/reductions.md).
//
// Bindings: 0 params: Norm, 1 x: array<f32> (read), 2 g: array<f32> (read;
// backward only), 3 out: array<f32> (read_write). Params: `rows`, `n` the
// row length, `eps`.
//
// Entry points (no invocation loops over more than LEAF entries):
// - `forward_serial`, `backward_serial`: rows of at most LEAF entries, one
//   thread per row, each sum folded in index order (one leaf). Launch:
//   ceil(rows / WG) workgroups folded into a 2-D grid.
// - `forward_rows`, `backward_rows`: rows of up to WG · LEAF entries, one
//   workgroup per row: thread t folds leaf t of each sum, the workgroup
//   combines its WG leaf values by the neighbour-pairing tree with missing
//   leaves +0.0 (the padded form of the rule: the same bits as the
//   power-of-two split), and each thread writes its own leaf of the output.
//   Launch: rows workgroups folded into 2-D. Longer rows never reach the
//   kernel (`Tensor::layer_norm` composes them).
// No atomics: the same input gives the same bits on every run.

struct Norm {
    rows: u32,
    n: u32,
    eps: f32,
}

@group(0) @binding(0) var<storage, read> params: Norm;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// Entries of one leaf of the summation rule (the CPU's `reduce::LEAF`).
const LEAF: u32 = 128u;

// Σx over entries [start, end) of the row at `base`.
fn sum_x(base: u32, start: u32, end: u32) -> f32 {
    var acc = 0.0;
    for (var j = start; j < end; j = j + 1u) {
        acc += x[base + j];
    }
    return acc;
}

// Σ(x - mean)² over entries [start, end).
fn sum_squares(base: u32, start: u32, end: u32, mean: f32) -> f32 {
    var acc = 0.0;
    for (var j = start; j < end; j = j + 1u) {
        let c = x[base + j] - mean;
        acc += c * c;
    }
    return acc;
}

// (Σg, Σg·x̂) over entries [start, end).
fn sum_gradients(base: u32, start: u32, end: u32, mean: f32, r: f32) -> vec2<f32> {
    var acc = vec2<f32>(0.0, 0.0);
    for (var j = start; j < end; j = j + 1u) {
        let gj = g[base + j];
        acc.x += gj;
        acc.y += gj * ((x[base + j] - mean) * r);
    }
    return acc;
}

// r from the sum of squares.
fn rstd(squares: f32, count: f32) -> f32 {
    return 1.0 / sqrt(squares / count + params.eps);
}

// Writes y over entries [start, end).
fn write_forward(base: u32, start: u32, end: u32, mean: f32, r: f32) {
    for (var j = start; j < end; j = j + 1u) {
        out[base + j] = (x[base + j] - mean) * r;
    }
}

// Writes dx over entries [start, end) given Σg / n and Σg·x̂ / n.
fn write_backward(base: u32, start: u32, end: u32, mean: f32, r: f32, mg: f32, mgx: f32) {
    for (var j = start; j < end; j = j + 1u) {
        let xhat = (x[base + j] - mean) * r;
        out[base + j] = ((g[base + j] - mg) - xhat * mgx) * r;
    }
}

@compute @workgroup_size(WG)
fn forward_serial(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let row = flat_id(wg, lid);
    if (row >= params.rows) {
        return;
    }
    let n = params.n;
    let base = row * n;
    let count = f32(n);
    let mean = sum_x(base, 0u, n) / count;
    let r = rstd(sum_squares(base, 0u, n, mean), count);
    write_forward(base, 0u, n, mean, r);
}

@compute @workgroup_size(WG)
fn backward_serial(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let row = flat_id(wg, lid);
    if (row >= params.rows) {
        return;
    }
    let n = params.n;
    let base = row * n;
    let count = f32(n);
    let mean = sum_x(base, 0u, n) / count;
    let r = rstd(sum_squares(base, 0u, n, mean), count);
    let sums = sum_gradients(base, 0u, n, mean, r);
    write_backward(base, 0u, n, mean, r, sums.x / count, sums.y / count);
}

var<workgroup> partial: array<f32, WG>;

// The balanced neighbour-pairing tree over the workgroup's WG values
// (level h adds slots i and i + h for i a multiple of 2 h); every thread
// calls it (uniform control flow) and gets the root.
fn tree_sum(lid: u32, mine: f32) -> f32 {
    partial[lid] = mine;
    workgroupBarrier();
    for (var h = 1u; h < WG; h = h << 1u) {
        if (lid % (2u * h) == 0u) {
            partial[lid] = partial[lid] + partial[lid + h];
        }
        workgroupBarrier();
    }
    let root = partial[0];
    workgroupBarrier();
    return root;
}

// Thread lid's leaf [start, end) of a row (empty past the row's end).
fn leaf_of(lid: u32) -> vec2<u32> {
    let start = min(lid * LEAF, params.n);
    return vec2<u32>(start, min(start + LEAF, params.n));
}

// Each entry point returns early only for a whole workgroup (the row is
// uniform), so the barriers are in uniform control flow.
@compute @workgroup_size(WG)
fn forward_rows(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let row = flat_group(wg);
    if (row >= params.rows) {
        return;
    }
    let base = row * params.n;
    let leaf = leaf_of(lid);
    let count = f32(params.n);
    let mean = tree_sum(lid, sum_x(base, leaf.x, leaf.y)) / count;
    let r = rstd(tree_sum(lid, sum_squares(base, leaf.x, leaf.y, mean)), count);
    write_forward(base, leaf.x, leaf.y, mean, r);
}

@compute @workgroup_size(WG)
fn backward_rows(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let row = flat_group(wg);
    if (row >= params.rows) {
        return;
    }
    let base = row * params.n;
    let leaf = leaf_of(lid);
    let count = f32(params.n);
    let mean = tree_sum(lid, sum_x(base, leaf.x, leaf.y)) / count;
    let r = rstd(tree_sum(lid, sum_squares(base, leaf.x, leaf.y, mean)), count);
    let mine = sum_gradients(base, leaf.x, leaf.y, mean, r);
    let mg = tree_sum(lid, mine.x) / count;
    let mgx = tree_sum(lid, mine.y) / count;
    write_backward(base, leaf.x, leaf.y, mean, r, mg, mgx);
}
