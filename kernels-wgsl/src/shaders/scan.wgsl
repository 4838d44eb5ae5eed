// scan.wgsl — CumSum: running sums along one axis of a contiguous tensor
// seen as [outer, len, inner]. One invocation per line (an outer × inner
// position), adding its `len` elements one after another, first to last
// (or last to first when reversed): the CPU's order, so for f32 both
// backends add the same numbers in the same order; i32 wraps, as there.
//
// Bindings: 0 params: Scan, 1 x: array<T> (read), 2 out: array<T>
// (read_write).
// Params: `lines` = outer × inner, `len`, `inner`, `flags` (bit 0:
// exclusive, bit 1: reverse).
// Specialisation: `T` (f32 or i32). As written: f32.
// Launch: ceil(lines / WG) workgroups folded into a 2-D grid.

alias T = f32;

struct Scan {
    lines: u32,
    len: u32,
    inner: u32,
    flags: u32,
}

@group(0) @binding(0) var<storage, read> params: Scan;
@group(0) @binding(1) var<storage, read> x: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;

@compute @workgroup_size(WG)
fn main(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let line = flat_id(wg, lid);
    if (line >= params.lines) {
        return;
    }
    let inner = params.inner;
    let len = params.len;
    let base = (line / inner) * len * inner + line % inner;
    let exclusive = (params.flags & 1u) != 0u;
    let reverse = (params.flags & 2u) != 0u;
    var acc = T(0);
    for (var t = 0u; t < len; t++) {
        let at = base + select(t, len - 1u - t, reverse) * inner;
        let v = x[at];
        if (exclusive) {
            out[at] = acc;
            acc += v;
        } else {
            acc += v;
            out[at] = acc;
        }
    }
}
