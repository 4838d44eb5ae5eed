// reduce.wgsl — Sum, Prod, Max, Min, ArgMax, ArgMin over any set of axes,
// in the summation rule's order (docs/reductions.md): leaves of 128
// elements folded in order, leaves combined by the power-of-two split.
//
// Bindings: 0 params: Reduce, 1 x: array<T> (read), 2 out: array<TO>
// (read_write, one element per output, in kept-index order), 3 parts_out and
// 4 parts_in: array<u32> (partials between passes, two words each: the
// value's bits and the index of the element it holds, output-major: partial
// v of output o at words 2 (o V + v) and 2 (o V + v) + 1).
// Params (the host splits the input's axes into kept and reduced ones and
// collapses each group): `outputs`, the `kept` and `reduced` axes (rank,
// dims, input strides), `block` (elements per output), `groups`
// (workgroups per output in this pass), `parts` (partials per output read
// by this pass, `parts_*` entries).
//
// Entry points (no invocation loops over more than LEAF elements, and the
// workgroup tree has 8 levels, whatever the reduction's length):
// - `serial`: blocks of at most one leaf: 256 threads per workgroup, one
//   output per thread, the block folded in increasing index order.
//   Launch: ceil(outputs / WG) workgroups folded into a 2-D grid.
// - `serial_leaves`: blocks of a few leaves (at most SERIAL_LEAVES, the
//   host's choice): one thread per output folds its leaves in order and
//   combines them by the same tree as the workgroups below, in its binary
//   counter form (after leaf number i, counting from 1, merge the two
//   newest partials trailing_zeros(i) times; at the end merge the rest,
//   newest first), without workgroup memory or barriers. A reduction over
//   the batch axis of a few hundred rows (a bias gradient) would otherwise
//   run a 256-thread workgroup with 8 barriers per output for a handful of
//   leaves, which is slow on lavapipe. Launch: ceil(outputs / WG)
//   workgroups folded into a 2-D grid.
// - `leaf_groups` then `serial_parts` (software adapters, whose workgroup
//   barriers cost far more than a fold: on SwiftShader about 40 us each for
//   256 invocations): a thread per aligned group of GROUP_LEAVES leaves
//   folds them by the counter into a partial (a complete subtree of the
//   tree), then one thread per output combines its partials by the counter
//   (at most 2^(SERIAL_DEPTH - 1); past that the workgroup passes below
//   combine them). Launch: ceil(outputs x groups / WG), ceil(outputs / WG)
//   workgroups folded into a 2-D grid.
// - `leaves_to_parts` / `leaves_to_out`: workgroup w of output o reduces
//   leaves 256 w .. 256 w + 255 of its block: thread t folds leaf 256 w + t,
//   then the workgroup combines its 256 leaf values by the balanced tree
//   that pairs neighbours (level s combines slots i and i + s for i a
//   multiple of 2 s; missing leaves are absent, not zeros), giving one
//   partial — written to parts_out, or to out when one workgroup covers the
//   whole block. Launch: outputs x `groups` workgroups folded into 2-D.
// - `parts_to_parts` / `parts_to_out`: the same tree over groups of 256
//   partials of the previous pass. The host runs passes until one partial
//   per output remains. Aligned groups of 256 are complete subtrees, so the
//   passes give the bits of the single power-of-two split, whatever their
//   number. No atomics: the same input gives the same bits on every run.
//
// Specialisation (shaders.rs replaces these whole declarations): `T` the
// input type, `TO` the output type, `init` the starting accumulator, `fold`
// (a = earlier partial, b = later one; both valid; f32 reductions test NaN
// with `is_nan`, others with `never_nan`) and `result`, the output value of
// the final accumulator. As written: the f32 Sum.
//
// Partials carry the index of the element they hold so that ArgMax/ArgMin
// pick the first occurrence (and the first NaN) whatever the tree's shape.

alias T = f32;
alias TO = f32;

// The accumulator of a partial: its value, the index of the element it holds
// and whether it holds any (0: an empty slot).
struct Acc {
    v: T,
    i: u32,
    ok: u32,
}

fn init() -> Acc {
    return Acc(T(0), 0u, 1u);
}

fn fold(a: Acc, b: Acc) -> Acc {
    return Acc(a.v + b.v, 0u, 1u);
}

fn result(acc: Acc) -> TO {
    return acc.v;
}

// One group of axes, collapsed on the host: `rank` dims (outermost first)
// and their strides in the input.
struct Axes {
    rank: u32,
    dims: array<u32, MAX_DIMS>,
    strides: array<u32, MAX_DIMS>,
}

struct Reduce {
    outputs: u32,
    kept: Axes,
    reduced: Axes,
    block: u32,
    groups: u32,
    parts: u32,
}

@group(0) @binding(0) var<storage, read> params: Reduce;
@group(0) @binding(1) var<storage, read> x: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<TO>;
@group(0) @binding(3) var<storage, read_write> parts_out: array<u32>;
@group(0) @binding(4) var<storage, read> parts_in: array<u32>;

const LEAF: u32 = 128u;

fn never_nan(v: T) -> bool {
    return false;
}

fn earlier(a: Acc, b: Acc) -> Acc {
    if (a.i <= b.i) {
        return a;
    }
    return b;
}

fn combine(a: Acc, b: Acc) -> Acc {
    if (b.ok == 0u) {
        return a;
    }
    if (a.ok == 0u) {
        return b;
    }
    return fold(a, b);
}

// The input offset of row-major index o over the kept axes, and of j over
// the reduced ones. Both read the bound parameters in place: an `Axes`
// passed by value is copied into every invocation at every call, which on
// lavapipe cost more than the reduction itself.
fn kept_offset(o: u32) -> u32 {
    var rem = o;
    var off = 0u;
    for (var d = params.kept.rank; d > 0u; d = d - 1u) {
        let n = params.kept.dims[d - 1u];
        off += (rem % n) * params.kept.strides[d - 1u];
        rem = rem / n;
    }
    return off;
}

fn reduced_offset(j: u32) -> u32 {
    var rem = j;
    var off = 0u;
    for (var d = params.reduced.rank; d > 0u; d = d - 1u) {
        let n = params.reduced.dims[d - 1u];
        off += (rem % n) * params.reduced.strides[d - 1u];
        rem = rem / n;
    }
    return off;
}

// Elements start .. end - 1 of the block at `base`, folded in order from
// the identity (the identity itself when there are none). Along the
// innermost reduced axis an element steps from the one before by that
// axis's stride; only the first element and each new innermost row unravel
// their index (on a software adapter the unravelling cost more than the
// fold: W2's conv1 bias gradient on SwiftShader, a Sum over
// [64, 32, 26, 26] keeping axis 1, took 51 ms in its first pass). Every
// element holds a value, so after the first the accumulator does too and
// `fold` needs no `combine` around it.
fn fold_range(base: u32, start: u32, end: u32) -> Acc {
    var len = 1u;
    var step = 0u;
    if (params.reduced.rank > 0u) {
        let d = params.reduced.rank - 1u;
        len = params.reduced.dims[d];
        step = params.reduced.strides[d];
    }
    if (start >= end) {
        return init();
    }
    var off = base + reduced_offset(start);
    var acc = combine(init(), element(off, start));
    // The end of the innermost row holding element j - 1.
    var row_end = min(end, start - start % len + len);
    var j = start + 1u;
    loop {
        for (; j < row_end; j = j + 1u) {
            off += step;
            acc = fold(acc, element(off, j));
        }
        if (j >= end) {
            break;
        }
        off = base + reduced_offset(j);
        acc = fold(acc, element(off, j));
        row_end = min(end, j + len);
        j = j + 1u;
    }
    return acc;
}

// Element j of a block, at input offset `off` (the fused reductions'
// prologue replaces this, the only reader of x).
fn element(off: u32, j: u32) -> Acc {
    return Acc(x[off], j, 1u);
}

@compute @workgroup_size(WG)
fn serial(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let o = flat_id(wg, lid);
    if (o >= params.outputs) {
        return;
    }
    out[o] = result(fold_range(kept_offset(o), 0u, params.block));
}

// Partials a counter thread holds at once: a binary counter over at most
// 2^(SERIAL_DEPTH - 1) leaves or partials.
const SERIAL_DEPTH: u32 = 8u;

// Leaves a `leaf_groups` thread folds (a power of two: an aligned group is a
// complete subtree of the rule's tree).
const GROUP_LEAVES: u32 = 8u;

// The binary counter's stack (see `serial_leaves` in the header).
struct Counter {
    stack: array<Acc, SERIAL_DEPTH>,
    top: u32,
    count: u32,
}

// Push the next item (leaf or partial) and merge as the counter says.
fn push(c: ptr<function, Counter>, a: Acc) {
    (*c).stack[(*c).top] = a;
    (*c).top += 1u;
    (*c).count += 1u;
    for (var k = (*c).count; (k & 1u) == 0u; k = k >> 1u) {
        (*c).stack[(*c).top - 2u] = combine((*c).stack[(*c).top - 2u], (*c).stack[(*c).top - 1u]);
        (*c).top -= 1u;
    }
}

// The root: the rest merged, newest first (at least one item was pushed).
fn root(c: ptr<function, Counter>) -> Acc {
    var acc = (*c).stack[(*c).top - 1u];
    for (var t = (*c).top - 1u; t > 0u; t = t - 1u) {
        acc = combine((*c).stack[t - 1u], acc);
    }
    return acc;
}

@compute @workgroup_size(WG)
fn serial_leaves(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let o = flat_id(wg, lid);
    if (o >= params.outputs) {
        return;
    }
    var c: Counter;
    let leaves = (params.block + LEAF - 1u) / LEAF;
    for (var l = 0u; l < leaves; l = l + 1u) {
        push(&c, leaf(o, l));
    }
    out[o] = result(root(&c));
}

// Thread t folds group t % groups (leaves GROUP_LEAVES g .. GROUP_LEAVES g +
// GROUP_LEAVES - 1, those in the block) of output t / groups into its
// partial; no workgroup memory, no barriers.
@compute @workgroup_size(WG)
fn leaf_groups(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let t = flat_id(wg, lid);
    if (t >= params.outputs * params.groups) {
        return;
    }
    let o = t / params.groups;
    let g = t % params.groups;
    let leaves = (params.block + LEAF - 1u) / LEAF;
    let first = g * GROUP_LEAVES;
    var c: Counter;
    for (var l = first; l < min(first + GROUP_LEAVES, leaves); l = l + 1u) {
        push(&c, leaf(o, l));
    }
    store_part(o, g, root(&c));
}

// One thread per output combines its `parts` partials (at most
// 2^(SERIAL_DEPTH - 1)) into the output.
@compute @workgroup_size(WG)
fn serial_parts(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let o = flat_id(wg, lid);
    if (o >= params.outputs) {
        return;
    }
    var c: Counter;
    for (var v = 0u; v < params.parts; v = v + 1u) {
        push(&c, load_part(o, v));
    }
    out[o] = result(root(&c));
}

var<workgroup> partial: array<Acc, WG>;

// An empty slot of the tree: `combine` passes the other side through.
fn absent() -> Acc {
    return Acc(T(0), 0u, 0u);
}

// The workgroup's output index and its workgroup number within the output.
fn position(wg: Workgroup) -> vec2<u32> {
    let g = flat_group(wg);
    return vec2<u32>(g / params.groups, g % params.groups);
}

// Leaf `l` of output `o`'s block, folded in order from the identity.
fn leaf(o: u32, l: u32) -> Acc {
    let base = kept_offset(o);
    let start = l * LEAF;
    if (start >= params.block) {
        return absent();
    }
    return fold_range(base, start, min(start + LEAF, params.block));
}

// Partial `v` of output `o` from the previous pass.
fn load_part(o: u32, v: u32) -> Acc {
    if (v >= params.parts) {
        return absent();
    }
    let at = 2u * (o * params.parts + v);
    return Acc(bitcast<T>(parts_in[at]), parts_in[at + 1u], 1u);
}

fn store_part(o: u32, w: u32, a: Acc) {
    let at = 2u * (o * params.groups + w);
    parts_out[at] = bitcast<u32>(a.v);
    parts_out[at + 1u] = a.i;
}

// The balanced neighbour-pairing tree over the workgroup's WG values; every
// thread calls it (uniform control flow) and gets the root.
fn workgroup_tree(lid: u32, mine: Acc) -> Acc {
    partial[lid] = mine;
    workgroupBarrier();
    for (var s = 1u; s < WG; s = s << 1u) {
        if (lid % (2u * s) == 0u) {
            partial[lid] = combine(partial[lid], partial[lid + s]);
        }
        workgroupBarrier();
    }
    return partial[0];
}

// Each entry point returns early only for a whole workgroup (`o` is
// uniform), so the barriers are in uniform control flow.
@compute @workgroup_size(WG)
fn leaves_to_parts(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let at = position(wg);
    if (at.x >= params.outputs) {
        return;
    }
    let root = workgroup_tree(lid, leaf(at.x, at.y * WG + lid));
    if (lid == 0u) {
        store_part(at.x, at.y, root);
    }
}

@compute @workgroup_size(WG)
fn leaves_to_out(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let at = position(wg);
    if (at.x >= params.outputs) {
        return;
    }
    let acc = workgroup_tree(lid, leaf(at.x, at.y * WG + lid));
    if (lid == 0u) {
        out[at.x] = result(acc);
    }
}

@compute @workgroup_size(WG)
fn parts_to_parts(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let at = position(wg);
    if (at.x >= params.outputs) {
        return;
    }
    let root = workgroup_tree(lid, load_part(at.x, at.y * WG + lid));
    if (lid == 0u) {
        store_part(at.x, at.y, root);
    }
}

@compute @workgroup_size(WG)
fn parts_to_out(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let at = position(wg);
    if (at.x >= params.outputs) {
        return;
    }
    let acc = workgroup_tree(lid, load_part(at.x, at.y * WG + lid));
    if (lid == 0u) {
        out[at.x] = result(acc);
    }
}
