// binary.wgsl — broadcasting binary ops and comparisons:
// out[i] = op(a[offset_a(i)], b[offset_b(i)]).
//
// Bindings: 0 params: Strided (strided.wgsl; operand 0 = a, operand 1 = b,
// broadcast axes have stride 0), 1 a: array<TI> (read), 2 b: array<TI>
// (read), 3 out: array<TO> (read_write, contiguous).
// Launch: ceil(n / WG) workgroups folded into a 2-D grid, one output element
// per thread.
// Specialisation (shaders.rs replaces these whole declarations): `TI` the
// operand type (f32, i32, u32 = bool for comparisons), `TO` the output type
// (TI, or u32 for comparisons) and `op`, the op table's expression printed
// with scalar.wgsl's functions, e.g. `return add_f32(a, b);` or
// `return select(0u, 1u, a < b);`. As written: f32 addition. Put after
// common.wgsl and scalar.wgsl.
//
// Comparisons are IEEE: every ordered comparison with NaN is false and
// NotEqual is printed `!(a == b)` so that it is true for NaN.

alias TI = f32;
alias TO = f32;

fn op(a: TI, b: TI) -> TO {
    return a + b;
}

@group(0) @binding(1) var<storage, read> in_a: array<TI>;
@group(0) @binding(2) var<storage, read> in_b: array<TI>;
@group(0) @binding(3) var<storage, read_write> out: array<TO>;

@compute @workgroup_size(WG)
fn main(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    let o = offsets(i);
    out[i] = op(in_a[o.x], in_b[o.y]);
}
