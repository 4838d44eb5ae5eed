// cast.wgsl — Cast between f32, i32 and bool: out[i] = convert(x[i]).
//
// Bindings: 0 params (p[0] = n), 1 x: array<{TI}> (read), 2 out: array<{TO}>
// (read_write).
// Workgroup: 256 threads, one element each. Launch: ceil(n / 256) workgroups
// folded into a 2-D grid.
// Specialisation: {TI}, {TO} storage types (u32 = bool) and {CONVERT}, the
// conversion function from common.wgsl (`f32_to_i32`, `i32_to_bool`...) or a
// type constructor (`f32`, `i32`) or nothing for identity.

@group(0) @binding(1) var<storage, read> x: array<{TI}>;
@group(0) @binding(2) var<storage, read_write> out: array<{TO}>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    out[i] = {CONVERT}(x[i]);
}
