// pool.wgsl — MaxPool2d and MaxPool2dBackward over NCHW f32 images.
//
// Bindings: 0 params: Pool, 1 x: array<f32> (read; the pooled input),
// 2 grad: array<f32> (read; the gradient of the pooled output, `backward` only),
// 3 out: array<f32> (read_write), 4 firsts_out: array<u32> (read_write) and
// 5 firsts: array<u32> (read): each window's first maximum (its position in
// the plane, NONE for a window holding no pixel), one per window.
// Params: the window geometry (common.wgsl's Window, as window.wgsl). A
//   window holding no pixel gives -inf (`empty`, built at run time: a
//   non-finite constant expression is not valid WGSL). The window
//   arithmetic (`window_pixel`, `window_position`) is common.wgsl's, shared
//   with window.wgsl.
// Launch: ceil(n / WG) workgroups folded into a 2-D grid, one output element
// (`first_maxima`: one window) per thread; `backward8` ceil(n / 8 / WG),
// eight consecutive input pixels per thread (software adapters).
//
// Every invocation loops over at most one window (kh + kh kw iterations;
// the host refuses windows of more than MAX_WINDOW = 2^14 elements), far
// below the 65,535 loop iterations after which lavapipe silently stops a
// shader; `backward8` over eight, which the host launches only for windows
// of at most EIGHT_WINDOW = 1,024 elements. (A gradient that searched every
// window holding a pixel for its maximum looped kh kw times over a window.)
//
// A window's maximum is its FIRST maximum in row-major (i, j) order: a later
// element replaces the best one only when strictly greater; a NaN replaces
// it (and then nothing replaces the NaN); padding is skipped, never a
// candidate. NaNs are recognised by their bits (common.wgsl's is_nan).
//
// Entry points:
// - `forward` (1, 3): out[n, c, oy, ox] = x at window (oy, ox)'s first max.
// - `first_maxima` (1, 4): firsts_out[plane, oy, ox] = the position of window
//   (oy, ox)'s first max, `n` = the number of windows.
// - `backward`, `backward8` (5, 2, 3): a gather — each input pixel sums grad
//   over the windows that contain it and whose first maximum (from
//   `first_maxima`) it is, in row-major (oy, ox) order, the order in which
//   the CPU adds them: the same bits, no atomics.

struct Pool {
    window: Window,
}

// -inf (see Params above).
fn empty() -> f32 {
    let minus_infinity_bits = 0xff800000u;
    return bitcast<f32>(minus_infinity_bits);
}

@group(0) @binding(0) var<storage, read> params: Pool;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> firsts_out: array<u32>;
@group(0) @binding(5) var<storage, read> firsts: array<u32>;

// Whether `pos` (value v) replaces the best so far (value bv, NaN or not):
// the best is not NaN and v is NaN or strictly greater.
fn replaces(v: f32, bv: f32, bnan: bool) -> bool {
    return !bnan && (is_nan(v) || v > bv);
}

// first_max of a 2 x 2 window (no dilation) wholly inside the image whose
// top-left pixel is at `pos`: straight-line code, no loops over taps (on
// SwiftShader the loops' bounds checks and branches were most of the
// pooling's time; MaxPool2d(2) is the common case).
fn first_max_2x2(base: u32, pos: u32, w: u32) -> u32 {
    var best = pos;
    var bv = x[base + pos];
    var bnan = is_nan(bv);
    let v1 = x[base + pos + 1u];
    if (replaces(v1, bv, bnan)) {
        best = pos + 1u;
        bv = v1;
        bnan = is_nan(v1);
    }
    let v2 = x[base + pos + w];
    if (replaces(v2, bv, bnan)) {
        best = pos + w;
        bv = v2;
        bnan = is_nan(v2);
    }
    if (replaces(x[base + pos + w + 1u], bv, bnan)) {
        best = pos + w + 1u;
    }
    return best;
}

// Position y * w + x in the plane starting at `base` of window (oy, ox)'s
// first maximum, or NONE when the window holds no pixel.
fn first_max(g: Window, base: u32, oy: u32, ox: u32) -> u32 {
    let w = g.image[1];
    if (g.kernel[0] == 2u && g.kernel[1] == 2u && g.dilation[0] == 1u && g.dilation[1] == 1u) {
        let py = oy * g.stride[0];
        let px = ox * g.stride[1];
        if (py >= g.pad[0] && px >= g.pad[1] && py - g.pad[0] + 1u < g.image[0] && px - g.pad[1] + 1u < w) {
            return first_max_2x2(base, (py - g.pad[0]) * w + px - g.pad[1], w);
        }
    }
    var best = NONE;
    var bv = 0.0;
    var bnan = false;
    let ry = rows(g);
    let rx = cols(g);
    for (var i = 0u; i < g.kernel[0]; i = i + 1u) {
        let y = window_pixel(ry, oy, i);
        if (y == NONE) {
            continue;
        }
        for (var j = 0u; j < g.kernel[1]; j = j + 1u) {
            let c = window_pixel(rx, ox, j);
            if (c == NONE) {
                continue;
            }
            let pos = y * w + c;
            let v = x[base + pos];
            // Replace when there is no best yet, or as `replaces` says.
            if (best == NONE || replaces(v, bv, bnan)) {
                best = pos;
                bv = v;
                bnan = is_nan(v);
            }
        }
    }
    return best;
}

// Offset of the image plane that output element e pools over.
fn plane_base(g: Window, e: u32) -> u32 {
    return (e / (g.positions[0] * g.positions[1])) * g.image[0] * g.image[1];
}

// first_max for output element e (plane, oy, ox in row-major order).
fn output_first_max(g: Window, e: u32) -> u32 {
    let ow = g.positions[1];
    let q = e % (g.positions[0] * ow);
    return first_max(g, plane_base(g, e), q / ow, q % ow);
}

@compute @workgroup_size(WG)
fn forward(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let e = flat_id(wg, lid);
    let g = params.window;
    if (e >= g.n) {
        return;
    }
    let base = plane_base(g, e);
    let pos = output_first_max(g, e);
    if (pos == NONE) {
        out[e] = empty();
    } else {
        out[e] = x[base + pos];
    }
}

@compute @workgroup_size(WG)
fn first_maxima(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let e = flat_id(wg, lid);
    let g = params.window;
    if (e >= g.n) {
        return;
    }
    firsts_out[e] = output_first_max(g, e);
}

// The gradient of input pixel e (see `backward` in the header).
fn backward_at(g: Window, e: u32) -> f32 {
    let h = g.image[0];
    let w = g.image[1];
    let oh = g.positions[0];
    let ow = g.positions[1];
    let kh = g.kernel[0];
    let kw = g.kernel[1];
    let pos = e % (h * w);
    let gbase = (e / (h * w)) * oh * ow;
    let py = pos / w + g.pad[0];
    let px = pos % w + g.pad[1];
    var acc = 0.0;
    // Kernel rows from the last to the first give window rows oy ascending
    // (oy = (py - i·dh) / sh), likewise columns: (oy, ox) in row-major order.
    let ry = rows(g);
    let rx = cols(g);
    for (var ii = 0u; ii < kh; ii = ii + 1u) {
        let oy = window_position(ry, py, kh - 1u - ii);
        if (oy == NONE) {
            continue;
        }
        for (var jj = 0u; jj < kw; jj = jj + 1u) {
            let ox = window_position(rx, px, kw - 1u - jj);
            if (ox == NONE) {
                continue;
            }
            if (firsts[gbase + oy * ow + ox] == pos) {
                acc += grad[gbase + oy * ow + ox];
            }
        }
    }
    return acc;
}

// Whether windows do not overlap (no dilation, stride >= kernel:
// MaxPool2d(2) and the like). Then along each axis only window
// padded / stride can hold a pixel, so no loops over taps; whether it does
// need not be checked: a window's first maximum is one of its own pixels.
// The same window and the same sum as `backward_at`. (SwiftShader,
// unspecialised, W2's [64, 32, 26, 26] gradient: 86 ms with the loops, 51
// without.)
fn disjoint(g: Window) -> bool {
    return g.dilation[0] == 1u && g.dilation[1] == 1u && g.stride[0] >= g.kernel[0] && g.stride[1] >= g.kernel[1];
}

// Gradients of input pixels first .. first + count - 1 (those below n).
// For disjoint windows a pixel's window steps along the row by counting;
// only the first pixel of a run and each new row divide.
fn backward_run(first: u32, count: u32) {
    let g = params.window;
    if (first >= g.n) {
        return;
    }
    let end = first + min(count, g.n - first);
    if (!disjoint(g)) {
        for (var e = first; e < end; e = e + 1u) {
            out[e] = backward_at(g, e);
        }
        return;
    }
    let h = g.image[0];
    let w = g.image[1];
    let oh = g.positions[0];
    let ow = g.positions[1];
    let sy = g.stride[0];
    let sx = g.stride[1];
    let hw = h * w;
    var pos = first % hw;
    var gbase = (first / hw) * oh * ow;
    var y = pos / w;
    var x = pos % w;
    var oy = (y + g.pad[0]) / sy;
    var ox = (x + g.pad[1]) / sx;
    var cx = (x + g.pad[1]) % sx;
    for (var e = first; e < end; e = e + 1u) {
        var acc = 0.0;
        if (oy < oh && ox < ow && firsts[gbase + oy * ow + ox] == pos) {
            acc += grad[gbase + oy * ow + ox];
        }
        out[e] = acc;
        pos += 1u;
        x += 1u;
        cx += 1u;
        if (cx == sx) {
            cx = 0u;
            ox += 1u;
        }
        if (x == w) {
            x = 0u;
            y += 1u;
            if (y == h) {
                y = 0u;
                pos = 0u;
                gbase += oh * ow;
            }
            oy = (y + g.pad[0]) / sy;
            ox = g.pad[1] / sx;
            cx = g.pad[1] % sx;
        }
    }
}

// One input pixel per thread (GPUs).
@compute @workgroup_size(WG)
fn backward(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    backward_run(flat_id(wg, lid), 1u);
}

// Eight consecutive pixels per thread (software adapters, where the
// divisions that take an index apart cost more than the gradient).
@compute @workgroup_size(WG)
fn backward8(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    backward_run(flat_id(wg, lid) * 8u, 8u);
}
