// window.wgsl — Im2Col (unfold NCHW images into columns) and Col2Im (its
// adjoint, folding columns back and summing overlaps).
//
// Bindings: 0 params, 1 src: array<{T}> (read), 2 out: array<{T}> (read_write).
// Specialisation: {T} element type (f32 or i32).
// Params (the window geometry, shared by both entry points):
//   p[0] output elements, p[1] h, p[2] w (image), p[3] oh, p[4] ow (window
//   positions), p[5] kh, p[6] kw (kernel), p[7] sh, p[8] sw (stride),
//   p[9] dh, p[10] dw (dilation), p[11] ph, p[12] pw (padding before the
//   image; padding after it only shows through oh, ow). The host checks that
//   h + padding and every index fit in u32. The window arithmetic
//   (`window_pixel`, `window_position`) is common.wgsl's, shared with pool.wgsl.
// Workgroup: 256 threads, one output element each. Launch: ceil(p[0] / 256)
// workgroups folded into a 2-D grid.
//
// Entry points:
// - `im2col` (1 = image [N, C, H, W], 2 = columns [N, C·kh·kw, oh·ow]):
//   column row c·kh·kw + i·kw + j, column oy·ow + ox holds pixel
//   (oy·sh + i·dh - ph, ox·sw + j·dw - pw) of plane c, or 0 in the padding.
// - `col2im` (1 = columns, 2 = image): a gather — each pixel sums the column
//   entries that map to it, over (i, j) ascending. For one pixel each (i, j)
//   names at most one window position, so this is the order in which the
//   CPU's (i, j, oy, ox) scatter adds them: the same bits, and no atomics.

@group(0) @binding(1) var<storage, read> src: array<{T}>;
@group(0) @binding(2) var<storage, read_write> out: array<{T}>;

@compute @workgroup_size(256)
fn im2col(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let e = flat_id(wid, nwg, lid);
    if (e >= p[0]) {
        return;
    }
    let h = p[1];
    let w = p[2];
    let ow = p[4];
    let kw = p[6];
    let l = p[3] * ow;
    let k = p[5] * kw;
    let col = e % l;
    let row = e / l;
    let kk = row % k;
    let plane = row / k;
    let oy = col / ow;
    let ox = col % ow;
    let y = window_pixel(0u, oy, kk / kw);
    let x = window_pixel(1u, ox, kk % kw);
    var v = {T}(0);
    if (y != NONE && x != NONE) {
        v = src[(plane * h + y) * w + x];
    }
    out[e] = v;
}

@compute @workgroup_size(256)
fn col2im(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let e = flat_id(wid, nwg, lid);
    if (e >= p[0]) {
        return;
    }
    let h = p[1];
    let w = p[2];
    let oh = p[3];
    let ow = p[4];
    let kh = p[5];
    let kw = p[6];
    let l = oh * ow;
    let x = e % w;
    let t = e / w;
    let y = t % h;
    let plane = t / h;
    let base = plane * kh * kw * l;
    // Padded coordinates of this pixel.
    let py = y + p[11];
    let px = x + p[12];
    var acc = {T}(0);
    for (var i = 0u; i < kh; i = i + 1u) {
        let oy = window_position(0u, py, i);
        if (oy == NONE) {
            continue;
        }
        for (var j = 0u; j < kw; j = j + 1u) {
            let ox = window_position(1u, px, j);
            if (ox == NONE) {
                continue;
            }
            acc += src[base + (i * kw + j) * l + oy * ow + ox];
        }
    }
    out[e] = acc;
}
