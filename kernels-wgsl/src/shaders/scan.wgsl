// scan.wgsl — CumSum: running sums along one axis of a contiguous tensor
// seen as [outer, len, inner]. One invocation per line (an outer × inner
// position), adding the elements of a segment of the line one after
// another, first to last (or last to first when reversed): the CPU's
// order, so for f32 both backends add the same numbers in the same order;
// i32 wraps, as there. The host launches one dispatch per segment of at
// most SEGMENT elements (kernels/scan.rs): no invocation loops longer
// than that (llvmpipe stops a loop after 65,535 iterations). A segment
// picks the running sum up from the element before it, which the
// previous dispatch wrote, with the same addition the CPU makes there.
//
// Bindings: 0 params: Scan, 1 x: array<T> (read), 2 out: array<T>
// (read_write).
// Params: `lines` = outer × inner, `len`, `inner`, `flags` (bit 0:
// exclusive, bit 1: reverse), the segment's `start` and `count` (steps
// along the line in the order of the additions).
// Specialisation: `T` (f32 or i32). As written: f32.
// Launch: ceil(lines / WG) workgroups folded into a 2-D grid, once per
// segment.

alias T = f32;

struct Scan {
    lines: u32,
    len: u32,
    inner: u32,
    flags: u32,
    start: u32,
    count: u32,
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
    if (params.start > 0u) {
        let before = base + select(params.start - 1u, len - params.start, reverse) * inner;
        acc = out[before];
        if (exclusive) {
            acc += x[before];
        }
    }
    for (var t = params.start; t < params.start + params.count; t++) {
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
