// index.wgsl — IndexSelect (gather along an axis), ScatterAdd (its adjoint)
// and the index range check both rely on.
//
// Bindings: 0 params: Index, 1 src: array<T> (read), 2 idx: array<i32>
// (read), 3 dest: array<T> (read), 4 out: array<T> (read_write),
// 5 status: array<atomic<u32>>, 6 keys and 7 buckets: array<vec2<u32>>,
// 8 partials: array<T> (read_write; 6, 7 and 8 are ScatterAdd's scratch).
// Each entry point uses a subset.
// Specialisation (shaders.rs replaces this whole declaration): `T` (u32 for
// gathers, which move words whatever the dtype; f32 or i32 for ScatterAdd,
// which adds). As written: f32.
//
// Entry points (no invocation loops more than LEAF = 128 times; the sort
// and the summation tree are passes the host repeats):
// - `check` (bindings 2, 5): one invocation per index; an index outside
//   [0, size) at position j does atomicMax(status[2 * slot], ~j), so the
//   word ends as ~(first bad position) — the status buffer starts zeroed
//   (wgpu zero-initialises buffers), and zero means "none". Params: `count`
//   indices, `size` the axis size, `slot`. Launch: ceil(count / WG)
//   workgroups, 2-D.
// - `check_value` (2, 5): thread 0 of one workgroup turns the slot into
//   what the host reads: status[2 * slot] = the first bad position
//   (0xffffffff if none), status[2 * slot + 1] = the index there. The host
//   reads the status words after the execution and turns a bad slot into an
//   OutOfRange error naming the op. Params as `check`. Launch: (1, 1, 1).
// - `gather` (1, 2, 4): out[o, k, r] = src[o, idx[k], r] (0 for a bad index,
//   which `check` reports). Params: `n` output elements, `size` the axis
//   size of src, `count` indices, `inner` the inner size. Launch:
//   ceil(n / WG) workgroups, 2-D.
// ScatterAdd is a sort of (index, position) pairs, then one pass over the
// outputs, so that no output scans the whole index list:
// - `sort_init` (2, 6): keys[j] = (idx[j], j) for j < count; bad indices and
//   the padding up to the power of two `n` get the key NO_KEY (sorted last,
//   never summed). Params: `n`, `size` the axis size, `count`. Launch:
//   ceil(n / WG) workgroups, 2-D.
// - `sort_step` (6): one compare-exchange step of a bitonic sort of keys by
//   (index, position); the host runs the log2(n)·(log2(n) + 1)/2 steps.
//   Positions are distinct, so the order is total and the result unique.
//   Params: `n`, `j` the partner distance, `k` the merged sequence length.
//   Launch: as `sort_init`.
// - `buckets_clear` (7): buckets[v] = (0, 0) (an empty run) for v < `size`.
//   Launch: ceil(size / WG) workgroups, 2-D.
// - `buckets_find` (6, 7): buckets[v] = (first, end) of index v's run in the
//   sorted keys (each end of a run is written by the one invocation that
//   sees it). Params: `n`, `size`. Launch: as `sort_init`.
// - `leaves` (1, 6, 7, 8): the duplicates of each index are summed by the
//   summation rule (docs/reductions.md), as on the CPU: an invocation per
//   (o, sorted position s, r) whose s starts a leaf of its index's run (s −
//   first a multiple of LEAF) folds that leaf, at most LEAF source values
//   in position order from zero: partials[o, s, r]. Params: `n` = outer ×
//   count × inner, `size`, `count`, `inner`. Launch: ceil(n / WG)
//   workgroups, 2-D.
// - `tree_level` (6, 7, 8): one level of the power-of-two split: the leaf
//   at run offset a multiple of 2·j leaves adds the partial j leaves after
//   it, when that one is inside the run. The host runs j = 1, 2, 4, ...
//   while j·LEAF < count. Params as `leaves`, with `j`.
// - `scatter` (3, 4, 7, 8): out[o, k, r] = dest[o, k, r] + partials[o, first,
//   r] of index k's run (dest's bits when k is unused). No float atomics:
//   deterministic, and the CPU's bits. Params: `n` elements of out, `size`
//   its axis size, `count` indices, `inner` the inner size. Launch:
//   ceil(n / WG) workgroups, 2-D.

alias T = f32;

struct Index {
    n: u32,
    size: u32,
    count: u32,
    inner: u32,
    slot: u32,
    j: u32,
    k: u32,
}

@group(0) @binding(0) var<storage, read> params: Index;
@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read> idx: array<i32>;
@group(0) @binding(3) var<storage, read> dest: array<T>;
@group(0) @binding(4) var<storage, read_write> out: array<T>;
@group(0) @binding(5) var<storage, read_write> status: array<atomic<u32>>;
@group(0) @binding(6) var<storage, read_write> keys: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read_write> buckets: array<vec2<u32>>;
@group(0) @binding(8) var<storage, read_write> partials: array<T>;

// The key of a bad index or of the padding: sorts after every real index.
const NO_KEY: u32 = 0xffffffffu;
// Elements of one leaf of the summation rule (the CPU's `LEAF`).
const LEAF: u32 = 128u;

@compute @workgroup_size(WG)
fn check(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let j = flat_id(wg, lid);
    if (j >= params.count) {
        return;
    }
    let v = idx[j];
    if (v < 0 || u32(v) >= params.size) {
        atomicMax(&status[2u * params.slot], ~j);
    }
}

@compute @workgroup_size(WG)
fn check_value(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    if (flat_id(wg, lid) != 0u) {
        return;
    }
    let slot = params.slot;
    let marked = atomicLoad(&status[2u * slot]);
    var first = 0xffffffffu;
    var value = 0u;
    if (marked != 0u) {
        first = ~marked;
        value = bitcast<u32>(idx[first]);
    }
    atomicStore(&status[2u * slot], first);
    atomicStore(&status[2u * slot + 1u], value);
}

@compute @workgroup_size(WG)
fn gather(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    let size = params.size;
    let count = params.count;
    let inner = params.inner;
    let r = i % inner;
    let t = i / inner;
    let k = t % count;
    let o = t / count;
    let v = idx[k];
    if (v < 0 || u32(v) >= size) {
        out[i] = T(0);
        return;
    }
    out[i] = src[(o * size + u32(v)) * inner + r];
}

@compute @workgroup_size(WG)
fn sort_init(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let j = flat_id(wg, lid);
    if (j >= params.n) {
        return;
    }
    var key = NO_KEY;
    if (j < params.count) {
        let v = idx[j];
        if (v >= 0 && u32(v) < params.size) {
            key = u32(v);
        }
    }
    keys[j] = vec2<u32>(key, j);
}

// (index, position) order.
fn key_less(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
}

@compute @workgroup_size(WG)
fn sort_step(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    let partner = i ^ params.j;
    if (i >= params.n || partner <= i) {
        return;
    }
    let a = keys[i];
    let b = keys[partner];
    // Ascending where bit k of i is clear, descending where it is set; at
    // the last merge (k = n) every i < n is ascending.
    let ascending = (i & params.k) == 0u;
    if (key_less(b, a) == ascending) {
        keys[i] = b;
        keys[partner] = a;
    }
}

@compute @workgroup_size(WG)
fn buckets_clear(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let v = flat_id(wg, lid);
    if (v < params.size) {
        buckets[v] = vec2<u32>(0u, 0u);
    }
}

@compute @workgroup_size(WG)
fn buckets_find(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let s = flat_id(wg, lid);
    let n = params.n;
    if (s >= n) {
        return;
    }
    let key = keys[s].x;
    if (key >= params.size) {
        return;
    }
    if (s == 0u || keys[s - 1u].x != key) {
        buckets[key].x = s;
    }
    if (s + 1u == n || keys[s + 1u].x != key) {
        buckets[key].y = s + 1u;
    }
}

// The (first, end) run in the sorted keys of the index at sorted position
// s; (0, 0) for a bad index or the padding.
fn run_of(s: u32) -> vec2<u32> {
    let key = keys[s].x;
    if (key >= params.size) {
        return vec2<u32>(0u, 0u);
    }
    return buckets[key];
}

@compute @workgroup_size(WG)
fn leaves(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    let count = params.count;
    let inner = params.inner;
    let r = i % inner;
    let t = i / inner;
    let s = t % count;
    let o = t / count;
    let run = run_of(s);
    if (s < run.x || s >= run.y || (s - run.x) % LEAF != 0u) {
        return;
    }
    let end = min(s + LEAF, run.y);
    var acc = T(0);
    for (var q = s; q < end; q = q + 1u) {
        acc += src[(o * count + keys[q].y) * inner + r];
    }
    partials[i] = acc;
}

@compute @workgroup_size(WG)
fn tree_level(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    let inner = params.inner;
    let s = (i / inner) % params.count;
    let run = run_of(s);
    let half = params.j * LEAF;
    if (s < run.x || s >= run.y || (s - run.x) % (2u * half) != 0u || s + half >= run.y) {
        return;
    }
    // Written only at multiples of 2·half; the partner is at an odd multiple
    // of half, which no invocation of this level writes.
    partials[i] = partials[i] + partials[i + half * inner];
}

@compute @workgroup_size(WG)
fn scatter(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    let size = params.size;
    let inner = params.inner;
    let r = i % inner;
    let t = i / inner;
    let k = t % size;
    let o = t / size;
    let run = buckets[k];
    var acc = dest[i];
    if (run.y > run.x) {
        acc += partials[(o * params.count + run.x) * inner + r];
    }
    out[i] = acc;
}
