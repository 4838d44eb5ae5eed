// pool.wgsl — MaxPool2d and MaxPool2dBackward over NCHW f32 images.
//
// Bindings: 0 params, 1 x: array<f32> (read; the pooled input),
// 2 g: array<f32> (read; the gradient of the pooled output, `backward` only),
// 3 out: array<f32> (read_write).
// Params: the window geometry of window.wgsl — p[0] output elements, p[1] h,
//   p[2] w, p[3] oh, p[4] ow, p[5] kh, p[6] kw, p[7] sh, p[8] sw, p[9] dh,
//   p[10] dw, p[11] ph, p[12] pw — and p[13] the bits of -inf (the value of a
//   window holding no pixel; passed in because a non-finite constant is not
//   a valid WGSL expression). The window arithmetic (`window_pixel`,
//   `window_position`) is common.wgsl's, shared with window.wgsl.
// Workgroup: 256 threads, one output element each. Launch: ceil(p[0] / 256)
// workgroups folded into a 2-D grid.
//
// A window's maximum is its FIRST maximum in row-major (i, j) order: a later
// element replaces the best one only when strictly greater; a NaN replaces
// it (and then nothing replaces the NaN); padding is skipped, never a
// candidate. NaNs are recognised by their bits (common.wgsl's is_nan).
//
// Entry points:
// - `forward` (1, 3): out[n, c, oy, ox] = x at window (oy, ox)'s first max.
// - `backward` (1, 2, 3): a gather — each input pixel sums g over the windows
//   that contain it and whose first maximum it is, in row-major (oy, ox)
//   order, the order in which the CPU adds them: the same bits, no atomics.

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// Position y * w + x in the plane starting at `base` of window (oy, ox)'s
// first maximum, or NONE when the window holds no pixel.
fn first_max(base: u32, oy: u32, ox: u32) -> u32 {
    let w = p[2];
    var best = NONE;
    var bv = 0.0;
    var bnan = false;
    for (var i = 0u; i < p[5]; i = i + 1u) {
        let y = window_pixel(0u, oy, i);
        if (y == NONE) {
            continue;
        }
        for (var j = 0u; j < p[6]; j = j + 1u) {
            let c = window_pixel(1u, ox, j);
            if (c == NONE) {
                continue;
            }
            let pos = y * w + c;
            let v = x[base + pos];
            let vnan = is_nan(v);
            // Replace when there is no best yet, or (the best is not NaN and)
            // v is NaN or strictly greater.
            if (best == NONE || (!bnan && (vnan || v > bv))) {
                best = pos;
                bv = v;
                bnan = vnan;
            }
        }
    }
    return best;
}

@compute @workgroup_size(256)
fn forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let e = flat_id(wid, nwg, lid);
    if (e >= p[0]) {
        return;
    }
    let ow = p[4];
    let l = p[3] * ow;
    let q = e % l;
    let plane = e / l;
    let base = plane * p[1] * p[2];
    let pos = first_max(base, q / ow, q % ow);
    if (pos == NONE) {
        out[e] = bitcast<f32>(p[13]);
    } else {
        out[e] = x[base + pos];
    }
}

@compute @workgroup_size(256)
fn backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
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
    let pos = e % (h * w);
    let plane = e / (h * w);
    let base = plane * h * w;
    let gbase = plane * oh * ow;
    let py = pos / w + p[11];
    let px = pos % w + p[12];
    var acc = 0.0;
    // Kernel rows from the last to the first give window rows oy ascending
    // (oy = (py - i·dh) / sh), likewise columns: (oy, ox) in row-major order.
    for (var ii = 0u; ii < kh; ii = ii + 1u) {
        let oy = window_position(0u, py, kh - 1u - ii);
        if (oy == NONE) {
            continue;
        }
        for (var jj = 0u; jj < kw; jj = jj + 1u) {
            let ox = window_position(1u, px, kw - 1u - jj);
            if (ox == NONE) {
                continue;
            }
            if (first_max(base, oy, ox) == pos) {
                acc += g[gbase + oy * ow + ox];
            }
        }
    }
    out[e] = acc;
}
