// binary.wgsl — broadcasting binary ops and comparisons:
// out[i] = op(a[offset_a(i)], b[offset_b(i)]).
//
// Bindings: 0 params: Strided (strided.wgsl; operand 0 = a, operand 1 = b,
// broadcast axes have stride 0), 1 a: array<TI> (read), 2 b: array<TI>
// (read), 3 out: array<TO> (read_write, contiguous).
// Launch: strided.wgsl's entry points, ceil(n / WG) workgroups (`main`) or
// ceil(n / 8 WG) (`main8`) folded into a 2-D grid.
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

// Element i, at the operands' offsets o (strided.wgsl's entry points).
fn element(i: u32, o: vec4<u32>) {
    out[i] = op(in_a[o.x], in_b[o.y]);
}
