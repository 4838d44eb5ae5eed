// index.wgsl — IndexSelect (gather along an axis), ScatterAdd (its adjoint)
// and the index range check both rely on.
//
// Bindings: 0 params: Index, 1 src: array<T> (read), 2 idx: array<i32>
// (read), 3 dest: array<T> (read), 4 out: array<T> (read_write),
// 5 status: array<atomic<u32>>, 6 keys and 7 buckets: array<vec2<u32>>
// (read_write; 6 and 7 are ScatterAdd's scratch). Each entry point uses a
// subset.
// Specialisation (shaders.rs replaces this whole declaration): `T` (u32 for
// gathers, which move words whatever the dtype; f32 or i32 for ScatterAdd,
// which adds). As written: f32.
//
// Entry points (every loop is bounded by a constant, except that a
// ScatterAdd output adds its own duplicates one by one, in position order —
// the CPU's serial order, which the result must match bit for bit):
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
// - `scatter` (1, 3, 4, 6, 7): out[o, k, r] = dest[o, k, r] + src[o, i, r]
//   over the positions i of index k's run in the sorted keys — increasing
//   i, the CPU's order, and no float atomics, so the result is
//   deterministic and the CPU's bits. Params: `n` elements of out, `size`
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

// The key of a bad index or of the padding: sorts after every real index.
const NO_KEY: u32 = 0xffffffffu;

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

@compute @workgroup_size(WG)
fn scatter(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    let size = params.size;
    let count = params.count;
    let inner = params.inner;
    let r = i % inner;
    let t = i / inner;
    let k = t % size;
    let o = t / size;
    let run = buckets[k];
    var acc = dest[i];
    for (var s = run.x; s < run.y; s = s + 1u) {
        acc += src[(o * count + keys[s].y) * inner + r];
    }
    out[i] = acc;
}
