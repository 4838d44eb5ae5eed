// fill.wgsl — Full and Arange: out[i] = value, or start + i * step.
//
// Bindings: 0 params (see common.wgsl), 1 out: array<{T}> (read_write).
// Params: p[0] n, p[1] 0 = Full / 1 = Arange,
//   Full:   p[2] the value already converted to {T} on the host, as bits;
//   Arange: p[2] start, p[3] step (f32 bits), p[4] 1 when start and step are
//           integers and the output is not f32 (then computed exactly in i32
//           from p[5] start, p[6] step), else 0.
// Workgroup: 256 threads, one element each. Launch: ceil(n / 256) workgroups
// folded into a 2-D grid.
// Specialisation: {T} storage type (f32, i32, u32 = bool); {FROM_F32} and
// {FROM_I32} name the conversions of a computed value to {T}.

@group(0) @binding(1) var<storage, read_write> out: array<{T}>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    if (p[1] == 0u) {
        out[i] = bitcast<{T}>(p[2]);
    } else if (p[4] == 1u) {
        out[i] = {FROM_I32}(bitcast<i32>(p[5]) + i32(i) * bitcast<i32>(p[6]));
    } else {
        // One rounding of the exact i * step + start, as the CPU's f64 path
        // gives whenever start and step are f32 values.
        out[i] = {FROM_F32}(fma(f32(i), pf(3u), pf(2u)));
    }
}
