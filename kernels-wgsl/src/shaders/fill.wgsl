// fill.wgsl — Full and Arange: out[i] = value, or start + i * step.
//
// Bindings: 0 params: Fill, 1 out: array<T> (read_write).
// Params: `arange` 0 = Full, 1 = Arange.
//   Full:   `value` the value already converted to T on the host, as bits.
//   Arange: `start`, `step` as f32; `exact` 1 when start and step are
//           integers and the output is not f32 (then computed exactly in i32
//           from `start_i`, `step_i`), else 0.
// Launch: ceil(n / WG) workgroups folded into a 2-D grid, one element per
// thread.
// Specialisation (shaders.rs replaces these whole declarations): `T` the
// storage type (f32, i32, u32 = bool), `from_f32` and `from_i32` the
// conversions of a computed value to T. As written: f32.

alias T = f32;

fn from_f32(v: f32) -> T {
    return v;
}

fn from_i32(v: i32) -> T {
    return f32(v);
}

struct Fill {
    n: u32,
    arange: u32,
    value: u32,
    start: f32,
    step: f32,
    exact: u32,
    start_i: i32,
    step_i: i32,
}

@group(0) @binding(0) var<storage, read> params: Fill;
@group(0) @binding(1) var<storage, read_write> out: array<T>;

@compute @workgroup_size(WG)
fn main(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    if (params.arange == 0u) {
        out[i] = bitcast<T>(params.value);
    } else if (params.exact == 1u) {
        out[i] = from_i32(params.start_i + i32(i) * params.step_i);
    } else {
        // One rounding of the exact i * step + start, as the CPU's f64 path
        // gives whenever start and step are f32 values.
        out[i] = from_f32(fma(f32(i), params.step, params.start));
    }
}
