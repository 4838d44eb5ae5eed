// index.wgsl — IndexSelect (gather along an axis), ScatterAdd (its adjoint)
// and the index range check both rely on.
//
// Bindings: 0 params: Index, 1 src: array<T> (read), 2 idx: array<i32>
// (read), 3 dest: array<T> (read), 4 out: array<T> (read_write),
// 5 status: array<u32> (read_write). Each entry point uses a subset.
// Specialisation (shaders.rs replaces this whole declaration): `T` (u32 for
// gathers, which move words whatever the dtype; f32 or i32 for ScatterAdd,
// which adds). As written: f32.
//
// Entry points:
// - `check` (bindings 2, 5): ONE workgroup of WG threads scans the index
//   vector; status[2 * slot] = the first position holding an index outside
//   [0, size) (0xffffffff if none), status[2 * slot + 1] = that index. The
//   host reads the status words after the execution and turns a bad slot
//   into an OutOfRange error naming the op. Params: `count` indices, `size`
//   the axis size, `slot`. Launch: (1, 1, 1).
// - `gather` (1, 2, 4): out[o, k, r] = src[o, idx[k], r] (0 for a bad index,
//   which `check` reports). Params: `n` output elements, `size` the axis
//   size of src, `count` indices, `inner` the inner size. Launch:
//   ceil(n / WG) workgroups, 2-D.
// - `scatter` (1..4): out[o, k, r] = dest[o, k, r] + the sum, in increasing
//   i, of src[o, i, r] over every i with idx[i] == k — the CPU's order, and no
//   atomics, so the result is deterministic. The index vector is staged
//   through workgroup memory WG entries at a time. Params as `gather`, with
//   `n` the elements of out and `size` its axis size. Launch: as `gather`.

alias T = f32;

struct Index {
    n: u32,
    size: u32,
    count: u32,
    inner: u32,
    slot: u32,
}

@group(0) @binding(0) var<storage, read> params: Index;
@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read> idx: array<i32>;
@group(0) @binding(3) var<storage, read> dest: array<T>;
@group(0) @binding(4) var<storage, read_write> out: array<T>;
@group(0) @binding(5) var<storage, read_write> status: array<u32>;

var<workgroup> first_bad: atomic<u32>;
var<workgroup> tile: array<i32, WG>;

@compute @workgroup_size(WG)
fn check(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    if (lid == 0u) {
        atomicStore(&first_bad, 0xffffffffu);
    }
    workgroupBarrier();
    let size = params.size;
    for (var j = lid; j < params.count; j = j + WG) {
        let v = idx[j];
        if (v < 0 || u32(v) >= size) {
            atomicMin(&first_bad, j);
        }
    }
    workgroupBarrier();
    if (lid == 0u) {
        let f = atomicLoad(&first_bad);
        let slot = params.slot;
        status[2u * slot] = f;
        var value = 0u;
        if (f != 0xffffffffu) {
            value = bitcast<u32>(idx[f]);
        }
        status[2u * slot + 1u] = value;
    }
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
fn scatter(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    // No early return: every thread takes part in staging the index tiles.
    let i = flat_id(wg, lid);
    let live = i < params.n;
    let size = params.size;
    let count = params.count;
    let inner = max(params.inner, 1u);
    let r = i % inner;
    let t = i / inner;
    let k = i32(t % max(size, 1u));
    let o = t / max(size, 1u);
    var acc = T(0);
    if (live) {
        acc = dest[i];
    }
    for (var t0 = 0u; t0 < count; t0 = t0 + WG) {
        let j = t0 + lid;
        var v = -1;
        if (j < count) {
            v = idx[j];
        }
        tile[lid] = v;
        workgroupBarrier();
        if (live) {
            let n = min(WG, count - t0);
            for (var q = 0u; q < n; q = q + 1u) {
                if (tile[q] == k) {
                    acc += src[(o * count + t0 + q) * inner + r];
                }
            }
        }
        workgroupBarrier();
    }
    if (live) {
        out[i] = acc;
    }
}
