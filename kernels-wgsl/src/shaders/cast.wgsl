// cast.wgsl — Cast between f32, i32 and bool: out[i] = convert(x[i]).
//
// Bindings: 0 params: Count, 1 x: array<TI> (read), 2 out: array<TO>
// (read_write).
// Launch: ceil(n / WG) workgroups folded into a 2-D grid, one element per
// thread.
// Specialisation (shaders.rs replaces these whole declarations): `TI`, `TO`
// the storage types (u32 = bool) and `convert`, which calls a conversion of
// common.wgsl (`f32_to_i32`, `i32_to_bool`...), a type constructor, or
// nothing for identity. As written: f32 to f32.

alias TI = f32;
alias TO = f32;

fn convert(v: TI) -> TO {
    return v;
}

@group(0) @binding(0) var<storage, read> params: Count;
@group(0) @binding(1) var<storage, read> x: array<TI>;
@group(0) @binding(2) var<storage, read_write> out: array<TO>;

@compute @workgroup_size(WG)
fn main(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    out[i] = convert(x[i]);
}
