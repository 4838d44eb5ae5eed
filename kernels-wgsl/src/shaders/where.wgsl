// where.wgsl — Where: out[i] = cond[offset_c(i)] != 0 ? a[offset_a(i)] : b[offset_b(i)],
// all three broadcast to the output.
//
// Bindings: 0 params: Strided (strided.wgsl; operand 0 = cond, 1 = a,
// 2 = b), 1 cond: array<u32> (bools as 0/1 words, read), 2 a: array<T>
// (read), 3 b: array<T> (read), 4 out: array<T> (read_write).
// Launch: strided.wgsl's entry points, ceil(n / WG) workgroups (`main`) or
// ceil(n / 8 WG) (`main8`) folded into a 2-D grid.
// Specialisation (shaders.rs replaces this whole declaration): `T` (f32,
// i32, u32 = bool). As written: f32.

alias T = f32;

@group(0) @binding(1) var<storage, read> cond: array<u32>;
@group(0) @binding(2) var<storage, read> in_a: array<T>;
@group(0) @binding(3) var<storage, read> in_b: array<T>;
@group(0) @binding(4) var<storage, read_write> out: array<T>;

// Element i, at the operands' offsets o (strided.wgsl's entry points).
fn element(i: u32, o: vec4<u32>) {
    out[i] = select(in_b[o.z], in_a[o.y], cond[o.x] != 0u);
}
