// window.wgsl — Im2Col (unfold NCHW images into columns) and Col2Im (its
// adjoint, folding columns back and summing overlaps).
//
// Bindings: 0 params: Window (common.wgsl; the window geometry, shared by
// both entry points), 1 src: array<T> (read), 2 out: array<T> (read_write).
// Specialisation (shaders.rs replaces this whole declaration): `T` the
// element type (f32 or i32). As written: f32.
// The host checks that the padded image and every index fit in u32. The
// window arithmetic (`window_pixel`, `window_position`) is common.wgsl's,
// shared with pool.wgsl.
// Launch: ceil(n / WG) workgroups folded into a 2-D grid, one output element
// per thread. `col2im` loops over one window (kh + kh kw iterations); the
// host refuses windows of more than MAX_WINDOW = 2^14 elements, so that
// stays far below the 65,535 loop iterations after which lavapipe silently
// stops a shader.
//
// Entry points:
// - `im2col` (1 = image [N, C, H, W], 2 = columns [N, C·kh·kw, oh·ow]):
//   column row c·kh·kw + i·kw + j, column oy·ow + ox holds pixel
//   (oy·sh + i·dh - ph, ox·sw + j·dw - pw) of plane c, or 0 in the padding.
// - `col2im` (1 = columns, 2 = image): a gather — each pixel sums the column
//   entries that map to it, over (i, j) ascending. For one pixel each (i, j)
//   names at most one window position, so this is the order in which the
//   CPU's (i, j, oy, ox) scatter adds them: the same bits, and no atomics.

alias T = f32;

@group(0) @binding(0) var<storage, read> params: Window;
@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;

@compute @workgroup_size(WG)
fn im2col(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let e = flat_id(wg, lid);
    let g = params;
    if (e >= g.n) {
        return;
    }
    let h = g.image[0];
    let w = g.image[1];
    let ow = g.positions[1];
    let kw = g.kernel[1];
    let l = g.positions[0] * ow;
    let k = g.kernel[0] * kw;
    let col = e % l;
    let row = e / l;
    let kk = row % k;
    let plane = row / k;
    let oy = col / ow;
    let ox = col % ow;
    let y = window_pixel(rows(g), oy, kk / kw);
    let x = window_pixel(cols(g), ox, kk % kw);
    var v = T(0);
    if (y != NONE && x != NONE) {
        v = src[(plane * h + y) * w + x];
    }
    out[e] = v;
}

@compute @workgroup_size(WG)
fn col2im(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let e = flat_id(wg, lid);
    let g = params;
    if (e >= g.n) {
        return;
    }
    let h = g.image[0];
    let w = g.image[1];
    let oh = g.positions[0];
    let ow = g.positions[1];
    let kh = g.kernel[0];
    let kw = g.kernel[1];
    let l = oh * ow;
    let x = e % w;
    let t = e / w;
    let y = t % h;
    let plane = t / h;
    let base = plane * kh * kw * l;
    // Padded coordinates of this pixel.
    let py = y + g.pad[0];
    let px = x + g.pad[1];
    var acc = T(0);
    let ry = rows(g);
    let rx = cols(g);
    for (var i = 0u; i < kh; i = i + 1u) {
        let oy = window_position(ry, py, i);
        if (oy == NONE) {
            continue;
        }
        for (var j = 0u; j < kw; j = j + 1u) {
            let ox = window_position(rx, px, j);
            if (ox == NONE) {
                continue;
            }
            acc += src[base + (i * kw + j) * l + oy * ow + ox];
        }
    }
    out[e] = acc;
}
