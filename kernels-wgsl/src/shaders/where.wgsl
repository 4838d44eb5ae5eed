// where.wgsl — Where: out[i] = cond[offset_c(i)] != 0 ? a[offset_a(i)] : b[offset_b(i)],
// all three broadcast to the output.
//
// Bindings: 0 params: Strided (strided.wgsl; operand 0 = cond, 1 = a,
// 2 = b), 1 cond: array<u32> (bools as 0/1 words, read), 2 a: array<T>
// (read), 3 b: array<T> (read), 4 out: array<T> (read_write).
// Launch: ceil(n / WG) workgroups folded into a 2-D grid, one element per
// thread.
// Specialisation (shaders.rs replaces this whole declaration): `T` (f32,
// i32, u32 = bool). As written: f32.

alias T = f32;

@group(0) @binding(1) var<storage, read> cond: array<u32>;
@group(0) @binding(2) var<storage, read> in_a: array<T>;
@group(0) @binding(3) var<storage, read> in_b: array<T>;
@group(0) @binding(4) var<storage, read_write> out: array<T>;

@compute @workgroup_size(WG)
fn main(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    let o = offsets(i);
    out[i] = select(in_b[o.z], in_a[o.y], cond[o.x] != 0u);
}
