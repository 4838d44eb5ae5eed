// index.wgsl — IndexSelect (gather along an axis), ScatterAdd (its adjoint)
// and the index range check both rely on.
//
// Bindings: 0 params, 1 src: array<{T}> (read), 2 idx: array<i32> (read),
// 3 dest: array<{T}> (read), 4 out: array<{T}> (read_write),
// 5 status: array<atomic<u32>>, 6 keys: array<vec2<u32>>, 7 buckets:
// array<vec2<u32>> (read_write; 6 and 7 are ScatterAdd's scratch). Each
// entry point uses a subset.
// Specialisation: {T} (u32 for gathers, which move words whatever the dtype;
// f32 or i32 for ScatterAdd, which adds).
//
// Entry points (every loop below is bounded by a constant, except that a
// ScatterAdd output adds its own duplicates one by one, in index order):
// - `check` (bindings 2, 5): one invocation per index; an index outside
//   [0, size) at position j does atomicMax(status[2 * slot], ~j), so the
//   word ends as ~(first bad position) — the status buffer starts zeroed,
//   and zero means "none". Params: p[0] indices, p[1] axis size, p[2] slot.
//   Launch: ceil(indices / 256) workgroups, 2-D.
// - `check_value` (2, 5): one invocation turns the slot into what the host
//   reads: status[2 * slot] = the first bad position (0xffffffff if none),
//   status[2 * slot + 1] = the index there. The host reads the status words
//   after the execution and turns a bad slot into an OutOfRange error naming
//   the op. Params as `check`. Launch: (1, 1, 1).
// - `gather` (1, 2, 4): out[o, k, r] = src[o, idx[k], r] (0 for a bad index,
//   which `check` reports). Params: p[0] output elements, p[1] axis size,
//   p[2] indices, p[3] inner size. Launch: ceil(n / 256) workgroups, 2-D.
// ScatterAdd is a stable sort of the index vector followed by one pass over
// the outputs, so that no output scans the whole index list:
// - `sort_init` (2, 6): keys[j] = (idx[j], j) for j < count, bad indices and
//   the padding up to the power of two n get the key 0xffffffff (sorted
//   last, never summed). Params: p[0] n, p[1] axis size, p[2] count.
//   Launch: ceil(n / 256) workgroups, 2-D.
// - `sort_step` (6): one compare-exchange step of a bitonic sort of keys by
//   (index, position); the host runs the log2(n)·(log2(n) + 1)/2 steps.
//   Positions are distinct, so the order is total and the result unique.
//   Params: p[0] n, p[1] j (partner distance), p[2] k (sequence length).
// - `buckets_clear` (7): buckets[k] = (0, 0) for k < size (an empty bucket).
//   Params: p[0] size. Launch: ceil(size / 256) workgroups, 2-D.
// - `buckets_find` (6, 7): buckets[k] = (first, end) of index k's run in the sorted
//   keys (each end of a run is written by the one invocation that sees it).
//   Params: p[0] n, p[1] axis size.
// - `scatter` (1, 3, 4, 6, 7): out[o, k, r] = dest[o, k, r] + src[o, i, r]
//   over the positions i of index k in the sorted keys — increasing i, the
//   CPU's order, and no float atomics, so the result is deterministic and
//   the same as the CPU's. Params: p[0] elements of out, p[1] its axis size,
//   p[2] indices, p[3] inner size. Launch: as `gather`.

@group(0) @binding(1) var<storage, read> src: array<{T}>;
@group(0) @binding(2) var<storage, read> idx: array<i32>;
@group(0) @binding(3) var<storage, read> dest: array<{T}>;
@group(0) @binding(4) var<storage, read_write> out: array<{T}>;
@group(0) @binding(5) var<storage, read_write> status: array<atomic<u32>>;
@group(0) @binding(6) var<storage, read_write> keys: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read_write> buckets: array<vec2<u32>>;

const NO_KEY: u32 = 0xffffffffu;

@compute @workgroup_size(256)
fn check(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let j = flat_id(wid, nwg, lid);
    if (j >= p[0]) {
        return;
    }
    let v = idx[j];
    if (v < 0 || u32(v) >= p[1]) {
        atomicMax(&status[2u * p[2]], ~j);
    }
}

@compute @workgroup_size(1)
fn check_value() {
    let slot = p[2];
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

@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    let size = p[1];
    let count = p[2];
    let inner = p[3];
    let r = i % inner;
    let t = i / inner;
    let k = t % count;
    let o = t / count;
    let v = idx[k];
    if (v < 0 || u32(v) >= size) {
        out[i] = {T}(0);
        return;
    }
    out[i] = src[(o * size + u32(v)) * inner + r];
}

@compute @workgroup_size(256)
fn sort_init(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let j = flat_id(wid, nwg, lid);
    if (j >= p[0]) {
        return;
    }
    var key = NO_KEY;
    if (j < p[2]) {
        let v = idx[j];
        if (v >= 0 && u32(v) < p[1]) {
            key = u32(v);
        }
    }
    keys[j] = vec2<u32>(key, j);
}

fn key_less(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
}

@compute @workgroup_size(256)
fn sort_step(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid);
    let partner = i ^ p[1];
    if (i >= p[0] || partner <= i) {
        return;
    }
    let a = keys[i];
    let b = keys[partner];
    // Ascending where bit k of i is clear, descending where it is set; at
    // the last merge (k = n) every i < n is ascending.
    let ascending = (i & p[2]) == 0u;
    if (key_less(b, a) == ascending) {
        keys[i] = b;
        keys[partner] = a;
    }
}

@compute @workgroup_size(256)
fn buckets_clear(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let k = flat_id(wid, nwg, lid);
    if (k < p[0]) {
        buckets[k] = vec2<u32>(0u, 0u);
    }
}

@compute @workgroup_size(256)
fn buckets_find(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let s = flat_id(wid, nwg, lid);
    let n = p[0];
    if (s >= n) {
        return;
    }
    let key = keys[s].x;
    if (key >= p[1]) {
        return;
    }
    if (s == 0u || keys[s - 1u].x != key) {
        buckets[key].x = s;
    }
    if (s + 1u == n || keys[s + 1u].x != key) {
        buckets[key].y = s + 1u;
    }
}

@compute @workgroup_size(256)
fn scatter(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    let size = p[1];
    let count = p[2];
    let inner = p[3];
    let r = i % inner;
    let t = i / inner;
    let k = t % size;
    let o = t / size;
    let bucket = buckets[k];
    var acc = dest[i];
    for (var s = bucket.x; s < bucket.y; s = s + 1u) {
        acc += src[(o * count + keys[s].y) * inner + r];
    }
    out[i] = acc;
}
