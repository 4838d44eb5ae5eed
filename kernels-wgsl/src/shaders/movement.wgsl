// movement.wgsl — the strided copy behind Permute, Expand, Slice,
// SliceBackward and Concat: dst[offset_dst(i)] = src[offset_src(i)] for every
// index i of the iteration dims.
//
// Bindings: 0 params: Strided (strided.wgsl; operand 0 = src, operand 1 =
// dst), 1 src: array<u32> (read), 2 dst: array<u32> (read_write).
// Elements are moved as 32-bit words whatever their dtype (f32 and i32 bits,
// bools stored as 0/1 words), so one variant serves every dtype.
// Launch: strided.wgsl's entry points, ceil(n / WG) workgroups (`main`) or
// ceil(n / 8 WG) (`main8`) folded into a 2-D grid.
//
// Permute/Expand/Slice: dst contiguous, src read through permuted, zero
// (broadcast) or stepped strides plus a base offset. Concat: one dispatch per
// input, src contiguous, dst the output's strides at the input's base.
// SliceBackward: a zero Full, then the gradient written at the slice's
// strides. Reshape needs no kernel (a buffer copy).

@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

// Element i, at the operands' offsets o (strided.wgsl's entry points).
fn element(i: u32, o: vec4<u32>) {
    dst[o.y] = src[o.x];
}
