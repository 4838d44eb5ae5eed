// unary.wgsl — element-wise unary ops on contiguous data: out[i] = op(x[i]).
//
// Bindings: 0 params: Count, 1 x: array<T> (read), 2 out: array<T>
// (read_write).
// Launch: ceil(n / WG) workgroups folded into a 2-D grid (common.wgsl), one
// element per thread.
// Specialisation (shaders.rs replaces these whole declarations): `T` (f32 or
// i32) and `op`, the op table's expression of the op printed with
// scalar.wgsl's functions, e.g. `return log1p_f32(v);`. As written: f32
// identity. Put after common.wgsl and scalar.wgsl.

alias T = f32;

fn op(v: T) -> T {
    return v;
}

@group(0) @binding(0) var<storage, read> params: Count;
@group(0) @binding(1) var<storage, read> x: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;

@compute @workgroup_size(WG)
fn main(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    out[i] = op(x[i]);
}
