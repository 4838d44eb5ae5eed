// window_folded.wgsl — Im2Col and Col2Im with the batch folded into the
// columns (native only: the layout `nn::Conv2d` records outside the browser
// build, so that a convolution is one matrix product for the whole batch).
//
// Bindings: 0 params: Folded (common.wgsl's Window plus the batch count),
// 1 src: array<T> (read), 2 out: array<T> (read_write).
// Specialisation (shaders.rs replaces this whole declaration): `T` the
// element type (f32 or i32). As written: f32.
// The host checks that every index fits in u32 and bounds the window as
// for window.wgsl (each col2im invocation loops over one window).
// Launch: ceil(n / WG) workgroups folded into a 2-D grid, one output element
// per thread (`im2col8`: ceil(n / 8 / WG), eight).
//
// Entry points (L = oh·ow window positions, N = `batch`):
// - `im2col`, `im2col8` (1 = image [N, C, H, W], 2 = columns [C·kh·kw, N·L]): row
//   c·kh·kw + i·kw + j, column n·L + oy·ow + ox holds pixel
//   (oy·sh + i·dh - ph, ox·sw + j·dw - pw) of plane (n, c), or 0 in the
//   padding — window.wgsl's value at [n, c·kh·kw + i·kw + j, oy·ow + ox].
// - `col2im` (1 = columns, 2 = image): window.wgsl's gather, reading each
//   tap's entry from the folded row: the same sums in the same order, so
//   the same bits as from the per-sample layout.

alias T = f32;

struct Folded {
    window: Window,
    batch: u32,
}

@group(0) @binding(0) var<storage, read> params: Folded;
@group(0) @binding(1) var<storage, read> src: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;

// Entries first .. first + count - 1 of the columns (those below n). Within
// a row the column steps through (sample, oy, ox) by counting, so only the
// first entry divides its index apart.
fn im2col_run(first: u32, count: u32) {
    let g = params.window;
    if (first >= g.n) {
        return;
    }
    let end = first + min(count, g.n - first);
    let h = g.image[0];
    let w = g.image[1];
    let oh = g.positions[0];
    let ow = g.positions[1];
    let kw = g.kernel[1];
    let l = oh * ow;
    let k = g.kernel[0] * kw;
    let columns = params.batch * l;
    let channels = g.n / (k * columns);
    let ry = rows(g);
    let rx = cols(g);
    let col = first % columns;
    var row = first / columns;
    var sample = col / l;
    var oy = (col % l) / ow;
    var ox = col % ow;
    for (var e = first; e < end; e = e + 1u) {
        let kk = row % k;
        let y = window_pixel(ry, oy, kk / kw);
        let x = window_pixel(rx, ox, kk % kw);
        var v = T(0);
        if (y != NONE && x != NONE) {
            v = src[((sample * channels + row / k) * h + y) * w + x];
        }
        out[e] = v;
        ox += 1u;
        if (ox == ow) {
            ox = 0u;
            oy += 1u;
            if (oy == oh) {
                oy = 0u;
                sample += 1u;
                if (sample == params.batch) {
                    sample = 0u;
                    row += 1u;
                }
            }
        }
    }
}

// One entry per thread (GPUs: neighbouring threads write neighbouring
// entries).
@compute @workgroup_size(WG)
fn im2col(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    im2col_run(flat_id(wg, lid), 1u);
}

// Eight consecutive entries per thread (software adapters, where the
// divisions that take an index apart cost more than the copy).
@compute @workgroup_size(WG)
fn im2col8(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    im2col_run(flat_id(wg, lid) * 8u, 8u);
}

@compute @workgroup_size(WG)
fn col2im(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let e = flat_id(wg, lid);
    let g = params.window;
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
    let channels = g.n / (params.batch * h * w);
    let sample = plane / channels;
    let c = plane % channels;
    // Row c·kh·kw + tap, column sample·L + position.
    let columns = params.batch * l;
    let base = c * kh * kw * columns + sample * l;
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
            acc += src[base + (i * kw + j) * columns + oy * ow + ox];
        }
    }
    out[e] = acc;
}
