//! Sliding-window kernels over NCHW images: Im2Col, Col2Im, MaxPool2d and
//! MaxPool2dBackward. Every output element is written by one loop in a fixed
//! order (col2im and the pooling adjoint gather or accumulate per image
//! plane), so results are identical run after run and need no atomics.

use super::layout::for_chunks;
use super::scalar::{Float, Scalar};
use super::{with_float, with_num, In, Out};
use crate::backend::checks;
use crate::error::Result;
use crate::op::Window2d;

/// Geometry of one window op on an image of (h, w) giving (oh, ow).
#[derive(Clone, Copy)]
struct Geometry {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    ph: usize,
    pw: usize,
}

impl Geometry {
    fn new(op: &'static str, window: &Window2d, h: usize, w: usize) -> Result<Geometry> {
        let [oh, ow] = checks::window_output(op, window, h, w)?;
        let u = |v: u32| v as usize;
        Ok(Geometry {
            h,
            w,
            oh,
            ow,
            kh: u(window.kernel[0]),
            kw: u(window.kernel[1]),
            sh: u(window.stride[0]),
            sw: u(window.stride[1]),
            dh: u(window.dilation[0]),
            dw: u(window.dilation[1]),
            ph: u(window.pad_begin[0]),
            pw: u(window.pad_begin[1]),
        })
    }
    /// The image row of kernel row `i` at output row `oy`, if inside.
    #[inline]
    fn row(&self, oy: usize, i: usize) -> Option<usize> {
        (oy * self.sh + i * self.dh).checked_sub(self.ph).filter(|&y| y < self.h)
    }
    #[inline]
    fn col(&self, ox: usize, j: usize) -> Option<usize> {
        (ox * self.sw + j * self.dw).checked_sub(self.pw).filter(|&x| x < self.w)
    }
    /// With stride 1 along x: the output columns `ox0..ox1` whose kernel
    /// column `j` falls inside the image, and the image column of `ox0`
    /// (they are consecutive: x = ox + j·dw - pw).
    #[inline]
    fn unit_stride_cols(&self, j: usize) -> (usize, usize, usize) {
        let shift = j * self.dw;
        let ox0 = self.pw.saturating_sub(shift).min(self.ow);
        let ox1 = (self.w + self.pw).saturating_sub(shift).clamp(ox0, self.ow);
        // An empty range starts at image column 0 (its slice is empty).
        (ox0, ox1, if ox1 > ox0 { ox0 + shift - self.pw } else { 0 })
    }
}

fn check(op: &'static str, ok: bool, dims: &[usize], out: &[usize]) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(checks::window_mismatch(op, dims, out))
    }
}

/// Im2Col into [N, C·k, L] or, folded (rank-2 output, native only), into
/// [C·k, N·L]: the same rows of L window positions, laid out per sample or
/// side by side. Each row comes from `im2col_row` either way.
pub(super) fn im2col(window: &Window2d, [x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "Im2Col";
    let d = x.dims;
    let folded = out.dims.len() == 2 && cfg!(not(target_arch = "wasm32"));
    check(OP, d.len() == 4 && (out.dims.len() == 3 || folded) && x.dtype == out.dtype, d, out.dims)?;
    let g = Geometry::new(OP, window, d[2], d[3])?;
    let (n, c, k, l) = (d[0], d[1], g.kh * g.kw, g.oh * g.ow);
    let want: &[usize] = if folded { &[c * k, n * l] } else { &[n, c * k, l] };
    check(OP, out.dims == want, d, out.dims)?;
    if l == 0 || out.numel() == 0 {
        return Ok(());
    }
    let plane = g.h * g.w;
    with_num!(x.dtype, OP, T => {
        let src = x.slice::<T>(OP)?;
        if folded {
            // Row (ch, tap): the tap's positions in every sample.
            for_chunks(out.slice::<T>(OP)?, n * l, |start, chunk| {
                for (r, row) in chunk.chunks_exact_mut(n * l).enumerate() {
                    let (ch, tap) = ((start / (n * l) + r) / k, (start / (n * l) + r) % k);
                    for (b, part) in row.chunks_exact_mut(l).enumerate() {
                        im2col_row(&g, &src[(b * c + ch) * plane..][..plane], tap, part);
                    }
                }
            });
        } else {
            for_chunks(out.slice::<T>(OP)?, k * l, |start, chunk| {
                for (p, dst) in chunk.chunks_exact_mut(k * l).enumerate() {
                    let image = &src[(start / (k * l) + p) * plane..][..plane];
                    for (tap, row) in dst.chunks_exact_mut(l).enumerate() {
                        im2col_row(&g, image, tap, row);
                    }
                }
            });
        }
        Ok(())
    })
}

/// The pixels under kernel tap i·kw + j at every window position (zeros in
/// the padding): one row of L = oh·ow columns.
fn im2col_row<T: Scalar>(g: &Geometry, plane: &[T], tap: usize, row: &mut [T]) {
    let (i, j) = (tap / g.kw, tap % g.kw);
    for oy in 0..g.oh {
        let out_row = &mut row[oy * g.ow..][..g.ow];
        match g.row(oy, i) {
            None => out_row.fill(T::from_f64(0.0)),
            Some(y) if g.sw == 1 => {
                // Consecutive pixels: one copy, zeros either side.
                let (ox0, ox1, x0) = g.unit_stride_cols(j);
                out_row[..ox0].fill(T::from_f64(0.0));
                out_row[ox0..ox1].copy_from_slice(&plane[y * g.w + x0..][..ox1 - ox0]);
                out_row[ox1..].fill(T::from_f64(0.0));
            }
            Some(y) => {
                for (ox, v) in out_row.iter_mut().enumerate() {
                    *v = match g.col(ox, j) {
                        Some(x) => plane[y * g.w + x],
                        None => T::from_f64(0.0),
                    };
                }
            }
        }
    }
}

/// Col2Im from [N, C·k, L] or, folded (rank-2 input, native only), from
/// [C·k, N·L]: each image plane sums the same rows in the same order
/// (`col2im_plane`), so both layouts give the same bits.
pub(super) fn col2im(window: &Window2d, image: [u32; 2], [cols]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "Col2Im";
    let d = cols.dims;
    let (h, w) = (image[0] as usize, image[1] as usize);
    let g = Geometry::new(OP, window, h, w)?;
    let (k, l) = (g.kh * g.kw, g.oh * g.ow);
    let folded = d.len() == 2 && cfg!(not(target_arch = "wasm32"));
    let o = out.dims;
    let fits = |o: &[usize]| {
        let columns: &[usize] = if folded { &[o[1] * k, o[0] * l] } else { &[o[0], o[1] * k, l] };
        o[2..] == [h, w] && d == columns
    };
    check(OP, o.len() == 4 && cols.dtype == out.dtype && fits(o), d, out.dims)?;
    let plane = h * w;
    if plane == 0 || out.numel() == 0 {
        return Ok(());
    }
    let (n, c) = (o[0], o[1]);
    with_num!(cols.dtype, OP, T => {
        let src = cols.slice::<T>(OP)?;
        for_chunks(out.slice::<T>(OP)?, plane, |start, chunk| {
            for (p, dst) in chunk.chunks_exact_mut(plane).enumerate() {
                let index = start / plane + p;
                if folded {
                    let (b, ch) = (index / c, index % c);
                    col2im_plane(&g, |tap| &src[((ch * k + tap) * n + b) * l..][..l], dst);
                } else {
                    let columns = &src[index * k * l..][..k * l];
                    col2im_plane(&g, |tap| &columns[tap * l..][..l], dst);
                }
            }
        });
        Ok(())
    })
}

/// Accumulate in the fixed order (i, j, oy, ox): deterministic. `row(tap)`
/// is the plane's row of L columns for kernel tap i·kw + j.
fn col2im_plane<'a, T: super::scalar::Num>(g: &Geometry, row: impl Fn(usize) -> &'a [T], dst: &mut [T]) {
    dst.fill(T::from_f64(0.0));
    for i in 0..g.kh {
        for j in 0..g.kw {
            let row = row(i * g.kw + j);
            for oy in 0..g.oh {
                let Some(y) = g.row(oy, i) else { continue };
                if g.sw == 1 {
                    // Consecutive pixels; each gets one addition here, so
                    // the order per pixel is the loop's either way.
                    let (ox0, ox1, x0) = g.unit_stride_cols(j);
                    let src = &row[oy * g.ow + ox0..][..ox1 - ox0];
                    for (v, &c) in dst[y * g.w + x0..][..ox1 - ox0].iter_mut().zip(src) {
                        *v = v.add(c);
                    }
                    continue;
                }
                for ox in 0..g.ow {
                    if let Some(x) = g.col(ox, j) {
                        let v = &mut dst[y * g.w + x];
                        *v = v.add(row[oy * g.ow + ox]);
                    }
                }
            }
        }
    }
}

/// Position (y, x) of the first maximum of window (oy, ox), NaN winning.
#[inline]
fn window_argmax<T: Float>(g: &Geometry, plane: &[T], oy: usize, ox: usize) -> Option<usize> {
    // Interior windows (the common case) need no padding checks.
    let (top, left) = (oy * g.sh, ox * g.sw);
    if top >= g.ph && left >= g.pw && top - g.ph + (g.kh - 1) * g.dh < g.h && left - g.pw + (g.kw - 1) * g.dw < g.w {
        let origin = (top - g.ph) * g.w + (left - g.pw);
        let (mut best_at, mut best) = (origin, plane[origin]);
        for i in 0..g.kh {
            let row = origin + i * g.dh * g.w;
            for j in 0..g.kw {
                let at = row + j * g.dw;
                let v = plane[at];
                if v.is_nan() {
                    return Some(at);
                }
                if v > best {
                    (best_at, best) = (at, v);
                }
            }
        }
        return Some(best_at);
    }
    let mut best: Option<(usize, T)> = None;
    for i in 0..g.kh {
        let Some(y) = g.row(oy, i) else { continue };
        for j in 0..g.kw {
            let Some(x) = g.col(ox, j) else { continue };
            let v = plane[y * g.w + x];
            match best {
                Some((_, b)) if b.is_nan() || !(v > b || v.is_nan()) => {}
                _ => best = Some((y * g.w + x, v)),
            }
        }
    }
    best.map(|(p, _)| p)
}

/// Calls `visit(e, first_max)` for every window e = oy·ow + ox of a plane,
/// in row-major order (so the backward's sums keep their order), with the
/// position in the plane of the window's first maximum (None: a window
/// holding no pixel). Windows wholly inside the image are searched in
/// blocks (`block_maxima`); border windows one by one (`window_argmax`).
/// Both find the same element.
fn plane_maxima<T: Float>(
    g: &Geometry,
    inner: &InnerWindows,
    block: &mut Block<T>,
    plane: &[T],
    visit: &mut impl FnMut(usize, Option<usize>),
) {
    let mut oy = 0;
    while oy < g.oh {
        let columns = inner.columns(oy);
        if columns == (0..g.ow) {
            // A run of rows whose windows are all inner: blocks run on
            // across their ends.
            let mut end = oy + 1;
            while end < g.oh && inner.columns(end) == (0..g.ow) {
                end += 1;
            }
            block.search(g, plane, oy * g.ow..end * g.ow, visit);
            oy = end;
            continue;
        }
        for ox in 0..columns.start {
            visit(oy * g.ow + ox, window_argmax(g, plane, oy, ox));
        }
        block.search(g, plane, oy * g.ow + columns.start..oy * g.ow + columns.end, visit);
        for ox in columns.end..g.ow {
            visit(oy * g.ow + ox, window_argmax(g, plane, oy, ox));
        }
        oy += 1;
    }
}

/// The windows that lie wholly inside the image: rows × columns of window
/// positions. Empty in the browser build (size budget: it searches every
/// window alone, with the same result) and for planes of 2^32 pixels or
/// more (offsets travel as u32, as wide as f32 lanes).
struct InnerWindows {
    rows: std::ops::Range<usize>,
    columns: std::ops::Range<usize>,
}

impl InnerWindows {
    fn of(g: &Geometry) -> Self {
        if cfg!(target_arch = "wasm32") || u32::try_from(g.h * g.w).is_err() {
            return InnerWindows { rows: 0..0, columns: 0..0 };
        }
        // From the first window past the padding to the last whose far tap
        // is still inside.
        let along = |n: usize, out: usize, k: usize, s: usize, d: usize, p: usize| {
            let first = p.div_ceil(s).min(out);
            let end = (n + p).checked_sub((k - 1) * d + 1).map_or(0, |v| (v / s + 1).min(out));
            first..end.max(first)
        };
        InnerWindows {
            rows: along(g.h, g.oh, g.kh, g.sh, g.dh, g.ph),
            columns: along(g.w, g.ow, g.kw, g.sw, g.dw, g.pw),
        }
    }
    /// The inner windows of output row `oy` (empty when it has none).
    fn columns(&self, oy: usize) -> std::ops::Range<usize> {
        if self.rows.contains(&oy) && !self.columns.is_empty() {
            self.columns.clone()
        } else {
            0..0
        }
    }
}

/// Windows per block: their values, offsets and origins stay in L1.
const BLOCK: usize = 64;

/// Scratch for one block of inner windows (native only: the browser build
/// has no inner-window search, see `InnerWindows::of`).
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
struct Block<T> {
    /// Plane offset of each window's first pixel.
    origins: [usize; BLOCK],
    best: [T; BLOCK],
    /// Offset of the best pixel from the window's first pixel.
    taps: [u32; BLOCK],
    pixels: [T; BLOCK],
}

impl<T: Float> Block<T> {
    fn new() -> Self {
        Block { origins: [0; BLOCK], best: [T::ZERO; BLOCK], taps: [0; BLOCK], pixels: [T::ZERO; BLOCK] }
    }

    /// `visit` for the inner windows `windows` (row-major indices), in order.
    fn search(
        &mut self,
        g: &Geometry,
        plane: &[T],
        windows: std::ops::Range<usize>,
        visit: &mut impl FnMut(usize, Option<usize>),
    ) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let mut e0 = windows.start;
            while e0 < windows.end {
                let n = BLOCK.min(windows.end - e0);
                let (mut oy, mut ox) = (e0 / g.ow, e0 % g.ow);
                for origin in &mut self.origins[..n] {
                    *origin = (oy * g.sh - g.ph) * g.w + ox * g.sw - g.pw;
                    ox += 1;
                    if ox == g.ow {
                        (oy, ox) = (oy + 1, 0);
                    }
                }
                let (origins, best, taps, pixels) =
                    (&self.origins[..n], &mut self.best[..n], &mut self.taps[..n], &mut self.pixels[..n]);
                super::simd::wide(
                    #[inline(always)]
                    || block_maxima(g, plane, origins, best, taps, pixels),
                );
                for (o, (&origin, &tap)) in origins.iter().zip(taps.iter()).enumerate() {
                    visit(e0 + o, Some(origin + tap as usize));
                }
                e0 += n;
            }
        }
        #[cfg(target_arch = "wasm32")]
        let _ = (g, plane, windows, visit);
    }
}

/// The first maximum of each window of a block (given by the offsets of
/// their first pixels): tap by tap in row-major order, each tap's pixels
/// first gathered side by side, then compared over the whole block with
/// the rule of `window_argmax` — a pixel replaces the best only when
/// strictly greater, or when it is a NaN and the best is not — as selects
/// without branches (random data made the per-window search mispredict
/// about every other comparison), which vectorise.
#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
fn block_maxima<T: Float>(
    g: &Geometry,
    plane: &[T],
    origins: &[usize],
    best: &mut [T],
    taps: &mut [u32],
    pixels: &mut [T],
) {
    for (b, &origin) in best.iter_mut().zip(origins) {
        *b = plane[origin];
    }
    taps.fill(0);
    for i in 0..g.kh {
        for j in 0..g.kw {
            if i == 0 && j == 0 {
                continue;
            }
            let offset = i * g.dh * g.w + j * g.dw;
            for (p, &origin) in pixels.iter_mut().zip(origins) {
                *p = plane[origin + offset];
            }
            let tap = offset as u32;
            for ((b, t), &v) in best.iter_mut().zip(taps.iter_mut()).zip(pixels.iter()) {
                // Non-short-circuit operators: one mask, no branch.
                let replace = (v > *b) | (v.is_nan() & !b.is_nan());
                *b = if replace { v } else { *b };
                *t = if replace { tap } else { *t };
            }
        }
    }
}

/// Whether every window is a 2 × 2 block at (2·oy, 2·ox) inside the image:
/// kernel 2, stride 2, no padding before, no dilation (the usual max-pool).
/// Both directions have their own loops for them (`pool2x2_plane`,
/// `pool2x2_backward_plane`): a window's pixels are two adjacent pairs,
/// read without the block search's gathers. W2's first pooling,
/// [64, 32, 26, 26], a call: forward 1,388 → 260 µs, gradient 1.48–1.98 →
/// 0.56–0.66 ms. (A one-pass gradient loop stayed scalar under LLVM and
/// was slower than the block search; the gradient's two passes are not.)
/// Native only, as the block search is.
fn pool2x2(g: &Geometry) -> bool {
    !cfg!(target_arch = "wasm32")
        && (g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.ph, g.pw) == (2, 2, 2, 2, 1, 1, 0, 0)
        && 2 * g.oh <= g.h
        && 2 * g.ow <= g.w
}

/// `window_argmax`'s rule for one more pixel: `v` replaces the best when
/// strictly greater, or when it is a NaN and the best is not (so the first
/// maximum, or the first NaN, wins). Non-short-circuit operators: a select.
#[inline(always)]
fn beats<T: Float>(v: T, best: T) -> bool {
    (v > best) | (v.is_nan() & !best.is_nan())
}

/// The first maximum of a 2 × 2 window (top pair `a`, bottom pair `c`),
/// taps in row-major order as `window_argmax` takes them, and which tap it
/// is (0–3, as a value of T: selects of one type vectorise).
#[inline(always)]
fn first_max_2x2<T: Float>(a: &[T], c: &[T]) -> (T, T) {
    let (one, two, three) = (T::from_f64(1.0), T::from_f64(2.0), T::from_f64(3.0));
    let (mut best, mut tap) = (a[0], T::ZERO);
    for (k, v) in [(one, a[1]), (two, c[0]), (three, c[1])] {
        let replace = beats(v, best);
        best = if replace { v } else { best };
        tap = if replace { k } else { tap };
    }
    (best, tap)
}

/// A plane's 2 × 2 maxima (`pool2x2`).
#[inline(always)]
fn pool2x2_plane<T: Float>(g: &Geometry, plane: &[T], dst: &mut [T]) {
    for (oy, o) in dst.chunks_exact_mut(g.ow).enumerate() {
        let r0 = &plane[2 * oy * g.w..][..2 * g.ow];
        let r1 = &plane[(2 * oy + 1) * g.w..][..2 * g.ow];
        for ((o, a), c) in o.iter_mut().zip(r0.chunks_exact(2)).zip(r1.chunks_exact(2)) {
            *o = first_max_2x2(a, c).0;
        }
    }
}

/// The gradient of one plane's 2 × 2 maxima (`pool2x2`): each window's
/// gradient to its first maximum as `0 + g` (the bits of the general loop,
/// which adds into a zeroed plane), 0 elsewhere. Two passes per row of
/// windows: which tap wins (`first_max_2x2`), then the four pixels of each
/// window.
/// `taps` is scratch of at least `g.ow` elements.
#[inline(always)]
fn pool2x2_backward_plane<T: Float>(g: &Geometry, xs: &[T], gp: &[T], taps: &mut [T], dst: &mut [T]) {
    let zero = T::ZERO;
    let (one, two, three) = (T::from_f64(1.0), T::from_f64(2.0), T::from_f64(3.0));
    let ow = g.ow;
    let taps = &mut taps[..ow];
    for oy in 0..g.oh {
        let r0 = &xs[2 * oy * g.w..][..2 * ow];
        let r1 = &xs[(2 * oy + 1) * g.w..][..2 * ow];
        for ((t, a), c) in taps.iter_mut().zip(r0.chunks_exact(2)).zip(r1.chunks_exact(2)) {
            *t = first_max_2x2(a, c).1;
        }
        let (top, bottom) = dst[2 * oy * g.w..][..2 * g.w].split_at_mut(g.w);
        let grads = &gp[oy * ow..][..ow];
        for ox in 0..ow {
            let (tap, grad) = (taps[ox], zero + grads[ox]);
            top[2 * ox] = if tap == zero { grad } else { zero };
            top[2 * ox + 1] = if tap == one { grad } else { zero };
            bottom[2 * ox] = if tap == two { grad } else { zero };
            bottom[2 * ox + 1] = if tap == three { grad } else { zero };
        }
        // An odd width's last column belongs to no window.
        top[2 * ow..].fill(zero);
        bottom[2 * ow..].fill(zero);
    }
    // An odd height's last row likewise.
    dst[2 * g.oh * g.w..].fill(zero);
}

pub(super) fn max_pool2d(window: &Window2d, [x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "MaxPool2d";
    let d = x.dims;
    check(OP, d.len() == 4 && x.dtype == out.dtype, d, out.dims)?;
    let g = Geometry::new(OP, window, d[2], d[3])?;
    check(OP, out.dims == [d[0], d[1], g.oh, g.ow], d, out.dims)?;
    let plane_out = g.oh * g.ow;
    if plane_out == 0 || out.numel() == 0 {
        return Ok(());
    }
    with_float!(x.dtype, OP, T => {
        let src = x.slice::<T>(OP)?;
        if pool2x2(&g) {
            for_chunks(out.slice::<T>(OP)?, plane_out, |start, chunk| {
                let first = start / plane_out;
                super::simd::wide(
                    #[inline(always)]
                    || {
                        for (p, dst) in chunk.chunks_exact_mut(plane_out).enumerate() {
                            pool2x2_plane(&g, &src[(first + p) * g.h * g.w..][..g.h * g.w], dst);
                        }
                    },
                );
            });
            return Ok(());
        }
        let inner = InnerWindows::of(&g);
        for_chunks(out.slice::<T>(OP)?, plane_out, |start, chunk| {
            let mut block = Block::new();
            for (p, dst) in chunk.chunks_exact_mut(plane_out).enumerate() {
                let plane = &src[(start / plane_out + p) * g.h * g.w..][..g.h * g.w];
                // A window holding no pixel (explicit asymmetric padding) is -inf.
                plane_maxima(&g, &inner, &mut block, plane, &mut |e, pos| {
                    dst[e] = pos.map_or(T::from_f64(f64::NEG_INFINITY), |pos| plane[pos]);
                });
            }
        });
        Ok(())
    })
}

pub(super) fn max_pool2d_backward(window: &Window2d, [x, grad]: &[In<'_>; 2], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "MaxPool2dBackward";
    let d = x.dims;
    check(OP, d.len() == 4 && x.dtype == out.dtype && grad.dtype == out.dtype && out.dims == d, d, out.dims)?;
    let g = Geometry::new(OP, window, d[2], d[3])?;
    check(OP, grad.dims == [d[0], d[1], g.oh, g.ow], grad.dims, out.dims)?;
    let plane = g.h * g.w;
    if plane == 0 || out.numel() == 0 {
        return Ok(());
    }
    let plane_out = g.oh * g.ow;
    with_float!(x.dtype, OP, T => {
        let (src, gs) = (x.slice::<T>(OP)?, grad.slice::<T>(OP)?);
        if pool2x2(&g) {
            for_chunks(out.slice::<T>(OP)?, plane, |start, chunk| {
                let first = start / plane;
                let mut taps = vec![T::from_f64(0.0); g.ow];
                super::simd::wide(
                    #[inline(always)]
                    || {
                        for (p, dst) in chunk.chunks_exact_mut(plane).enumerate() {
                            let index = first + p;
                            let (xs, gp) = (&src[index * plane..][..plane], &gs[index * plane_out..][..plane_out]);
                            pool2x2_backward_plane(&g, xs, gp, &mut taps, dst);
                        }
                    },
                );
            });
            return Ok(());
        }
        let inner = InnerWindows::of(&g);
        for_chunks(out.slice::<T>(OP)?, plane, |start, chunk| {
            let mut block = Block::new();
            for (p, dst) in chunk.chunks_exact_mut(plane).enumerate() {
                let index = start / plane + p;
                let xs = &src[index * plane..][..plane];
                let gp = &gs[index * plane_out..][..plane_out];
                dst.fill(T::from_f64(0.0));
                // Windows in row-major order: the accumulation order is fixed.
                plane_maxima(&g, &inner, &mut block, xs, &mut |e, pos| {
                    if let Some(pos) = pos {
                        dst[pos] = dst[pos] + gp[e];
                    }
                });
            }
        });
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuStorage;
    use crate::dtype::DType;

    fn run_im2col(x: &[f32], dims: &[usize], w: &Window2d, out_dims: &[usize]) -> Vec<f32> {
        let xs = CpuStorage::F32(x.to_vec());
        let mut o = CpuStorage::F32(vec![0.0; out_dims.iter().product()]);
        let input = In { data: &xs, dims, dtype: DType::F32 };
        let mut out = Out { data: &mut o, dims: out_dims, dtype: DType::F32 };
        im2col(w, &[input], &mut out).unwrap();
        match o {
            CpuStorage::F32(v) => v,
            _ => unreachable!(),
        }
    }

    /// Im2Col, Col2Im and max pooling (and its adjoint) against direct
    /// definitions over many geometries, the stride-1 copies and the
    /// interior-window maximum included (NaNs and ties too). Small
    /// integers keep every sum exact.
    #[test]
    fn window_kernels_match_their_definitions() {
        let f = |v: Vec<f64>| CpuStorage::F64(v);
        let take = |s: CpuStorage| match s {
            CpuStorage::F64(v) => v,
            _ => unreachable!(),
        };
        for (h, w) in [(5, 7), (1, 4), (6, 3)] {
            for (kh, kw) in [(1, 1), (2, 2), (3, 2), (3, 5)] {
                for (sh, sw) in [(1, 1), (2, 1), (1, 2), (2, 3)] {
                    for (ph, pw) in [(0, 0), (1, 1), (2, 1), (0, 4)] {
                        for (dh, dw) in [(1, 1), (2, 2), (1, 3)] {
                            let Ok(window) = Window2d::new([kh, kw], [sh, sw], [ph, pw], [dh, dw]) else { continue };
                            let Ok(g) = Geometry::new("test", &window, h, w) else { continue };
                            let (n, c) = (2, 3);
                            let xd = [n, c, h, w];
                            // Ties and a NaN in the middle of the first plane.
                            let mut x: Vec<f64> = (0..n * c * h * w).map(|i| ((i * 7) % 5) as f64 - 2.0).collect();
                            x[(h * w) / 2] = f64::NAN;
                            let px = |b: usize, ch: usize, y: isize, xx: isize| -> Option<f64> {
                                (y >= 0 && xx >= 0 && (y as usize) < h && (xx as usize) < w)
                                    .then(|| x[((b * c + ch) * h + y as usize) * w + xx as usize])
                            };
                            let pos = |o: usize, s: usize, k: usize, d: usize, p: usize| {
                                (o * s + k * d) as isize - p as isize
                            };
                            // Im2Col.
                            let l = g.oh * g.ow;
                            let cd = [n, c * kh * kw, l];
                            let xs = f(x.clone());
                            let mut o = f(vec![9.0; n * c * kh * kw * l]);
                            im2col(
                                &window,
                                &[In { data: &xs, dims: &xd, dtype: DType::F64 }],
                                &mut Out { data: &mut o, dims: &cd, dtype: DType::F64 },
                            )
                            .unwrap();
                            let cols = take(o);
                            for b in 0..n {
                                for ch in 0..c {
                                    for i in 0..kh {
                                        for j in 0..kw {
                                            for oy in 0..g.oh {
                                                for ox in 0..g.ow {
                                                    let want =
                                                        px(b, ch, pos(oy, sh, i, dh, ph), pos(ox, sw, j, dw, pw))
                                                            .unwrap_or(0.0);
                                                    let r = (ch * kh + i) * kw + j;
                                                    let got = cols[(b * c * kh * kw + r) * l + oy * g.ow + ox];
                                                    assert!(
                                                        got == want || (got.is_nan() && want.is_nan()),
                                                        "im2col {window:?} {h}x{w}"
                                                    );
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                            // Col2Im: the adjoint, summed in f64 from integers.
                            let cv: Vec<f64> = (0..cols.len()).map(|i| ((i * 3) % 7) as f64).collect();
                            let cs = f(cv.clone());
                            let mut o = f(vec![9.0; n * c * h * w]);
                            col2im(
                                &window,
                                [h as u32, w as u32],
                                &[In { data: &cs, dims: &cd, dtype: DType::F64 }],
                                &mut Out { data: &mut o, dims: &xd, dtype: DType::F64 },
                            )
                            .unwrap();
                            let img = take(o);
                            let mut want = vec![0.0; n * c * h * w];
                            for b in 0..n {
                                for ch in 0..c {
                                    for i in 0..kh {
                                        for j in 0..kw {
                                            for oy in 0..g.oh {
                                                for ox in 0..g.ow {
                                                    let (y, xx) = (pos(oy, sh, i, dh, ph), pos(ox, sw, j, dw, pw));
                                                    if px(b, ch, y, xx).is_some() {
                                                        let r = (ch * kh + i) * kw + j;
                                                        want[((b * c + ch) * h + y as usize) * w + xx as usize] +=
                                                            cv[(b * c * kh * kw + r) * l + oy * g.ow + ox];
                                                    }
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                            assert_eq!(img, want, "col2im {window:?} {h}x{w}");
                            // Max pooling (padding at most half the kernel).
                            if ph > kh / 2 || pw > kw / 2 {
                                continue;
                            }
                            let pd = [n, c, g.oh, g.ow];
                            let mut o = f(vec![9.0; n * c * l]);
                            max_pool2d(
                                &window,
                                &[In { data: &xs, dims: &xd, dtype: DType::F64 }],
                                &mut Out { data: &mut o, dims: &pd, dtype: DType::F64 },
                            )
                            .unwrap();
                            let pooled = take(o);
                            let gv: Vec<f64> = (0..n * c * l).map(|i| (i % 4) as f64 + 1.0).collect();
                            let gs = f(gv.clone());
                            let mut o = f(vec![9.0; n * c * h * w]);
                            max_pool2d_backward(
                                &window,
                                &[
                                    In { data: &xs, dims: &xd, dtype: DType::F64 },
                                    In { data: &gs, dims: &pd, dtype: DType::F64 },
                                ],
                                &mut Out { data: &mut o, dims: &xd, dtype: DType::F64 },
                            )
                            .unwrap();
                            let back = take(o);
                            let mut want_back = vec![0.0; n * c * h * w];
                            for b in 0..n {
                                for ch in 0..c {
                                    for oy in 0..g.oh {
                                        for ox in 0..g.ow {
                                            // First maximum in row-major window order; a NaN wins.
                                            let mut best: Option<(usize, f64)> = None;
                                            for i in 0..kh {
                                                for j in 0..kw {
                                                    let (y, xx) = (pos(oy, sh, i, dh, ph), pos(ox, sw, j, dw, pw));
                                                    let Some(v) = px(b, ch, y, xx) else { continue };
                                                    let at = ((b * c + ch) * h + y as usize) * w + xx as usize;
                                                    best = match best {
                                                        Some((_, bv)) if bv.is_nan() || !(v > bv || v.is_nan()) => best,
                                                        _ => Some((at, v)),
                                                    };
                                                }
                                            }
                                            let o = (b * c + ch) * l + oy * g.ow + ox;
                                            let got = pooled[o];
                                            // A dilated window may hold padding only: -inf, no gradient.
                                            let Some((at, v)) = best else {
                                                assert_eq!(got, f64::NEG_INFINITY, "maxpool {window:?}");
                                                continue;
                                            };
                                            assert!(got == v || (got.is_nan() && v.is_nan()), "maxpool {window:?}");
                                            want_back[at] += gv[o];
                                        }
                                    }
                                }
                            }
                            assert_eq!(back, want_back, "maxpool backward {window:?} {h}x{w}");
                        }
                    }
                }
            }
        }
    }

    /// The folded layout ([C·k, N·L], rank 2) against the per-sample one
    /// ([N, C·k, L]) moved sample by sample: Im2Col gives the same values
    /// and Col2Im the same bits (random f32 sums, so any change of order
    /// would show), over padded, strided and dilated windows, and on 1 and
    /// 3 threads. Malformed folded shapes are refused.
    #[cfg(feature = "rayon")]
    #[test]
    fn folded_columns_match_the_per_sample_layout() {
        let f32s = |v: &[f32]| CpuStorage::F32(v.to_vec());
        let take = |s: CpuStorage| match s {
            CpuStorage::F32(v) => v,
            _ => unreachable!(),
        };
        for (h, w) in [(7, 6), (11, 11), (3, 9)] {
            for (kernel, stride, pad, dil) in
                [([3, 3], [1, 1], [0, 0], [1, 1]), ([3, 2], [2, 1], [1, 1], [1, 1]), ([2, 2], [1, 2], [2, 0], [2, 1])]
            {
                let window = Window2d::new(kernel, stride, pad, dil).unwrap();
                let Ok(g) = Geometry::new("test", &window, h, w) else { continue };
                let (n, c, k, l) = (3, 2, g.kh * g.kw, g.oh * g.ow);
                let xd = [n, c, h, w];
                let x: Vec<f32> = (0..n * c * h * w).map(|i| ((i as f32) * 0.37).sin()).collect();
                let (per, folded) = ([n, c * k, l], [c * k, n * l]);
                let run = |threads: usize| {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                    pool.install(|| {
                        let xs = f32s(&x);
                        let input = [In { data: &xs, dims: &xd, dtype: DType::F32 }];
                        let mut o = f32s(&vec![9.0; n * c * k * l]);
                        im2col(&window, &input, &mut Out { data: &mut o, dims: &per, dtype: DType::F32 }).unwrap();
                        let cols = take(o);
                        let mut o = f32s(&vec![9.0; n * c * k * l]);
                        im2col(&window, &input, &mut Out { data: &mut o, dims: &folded, dtype: DType::F32 }).unwrap();
                        let cols_folded = take(o);
                        // Random columns for the adjoint, in both layouts.
                        let cv: Vec<f32> = (0..cols.len()).map(|i| ((i as f32) * 1.91).cos() * 3.0).collect();
                        let mut cv_folded = vec![0.0; cv.len()];
                        for b in 0..n {
                            for r in 0..c * k {
                                cv_folded[(r * n + b) * l..][..l].copy_from_slice(&cv[(b * c * k + r) * l..][..l]);
                                assert_eq!(
                                    cols_folded[(r * n + b) * l..][..l],
                                    cols[(b * c * k + r) * l..][..l],
                                    "im2col {window:?} {h}x{w}"
                                );
                            }
                        }
                        let fold = |cols: &[f32], dims: &[usize]| {
                            let cs = f32s(cols);
                            let mut o = f32s(&vec![9.0; n * c * h * w]);
                            let image = [h as u32, w as u32];
                            let input = [In { data: &cs, dims, dtype: DType::F32 }];
                            col2im(&window, image, &input, &mut Out { data: &mut o, dims: &xd, dtype: DType::F32 })
                                .unwrap();
                            take(o).iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                        };
                        let image = fold(&cv, &per);
                        assert_eq!(fold(&cv_folded, &folded), image, "col2im {window:?} {h}x{w}");
                        (cols_folded, image)
                    })
                };
                assert_eq!(run(1), run(3));
                // A folded shape that does not hold whole images.
                let xs = f32s(&x);
                let bad = [c * k, n * l - 1];
                let mut o = f32s(&vec![0.0; c * k * (n * l - 1)]);
                let input = [In { data: &xs, dims: &xd, dtype: DType::F32 }];
                assert!(im2col(&window, &input, &mut Out { data: &mut o, dims: &bad, dtype: DType::F32 }).is_err());
                let cs = f32s(&vec![0.0; c * k * (n * l - 1)]);
                let mut o = f32s(&vec![0.0; n * c * h * w]);
                let input = [In { data: &cs, dims: &bad, dtype: DType::F32 }];
                let out = &mut Out { data: &mut o, dims: &xd, dtype: DType::F32 };
                assert!(col2im(&window, [h as u32, w as u32], &input, out).is_err());
            }
        }
    }

    /// The blocked search of inner windows (`WindowBlocks`) against the
    /// window-by-window search it replaces, bit for bit: forward values
    /// (NaN payloads and signed zeros included) and backward sums, over
    /// tiling, overlapping, dilated, padded and ceil-mode windows, rows
    /// longer than a block, and data full of ties, ±0, -inf and NaNs with
    /// distinct payloads (the first NaN of a window must win).
    #[test]
    fn blocked_max_pooling_equals_the_window_by_window_search() {
        let nan = |payload: u64| f64::from_bits(0x7ff8_0000_0000_0000 | payload);
        for (h, w) in [(6, 150), (7, 9), (2, 2), (5, 131)] {
            for (kernel, stride, pad, dil) in [
                ([2, 2], [2, 2], [0, 0], [1, 1]),
                ([3, 3], [3, 3], [0, 0], [1, 1]),
                ([2, 3], [2, 3], [1, 1], [1, 1]),
                ([3, 3], [2, 2], [1, 1], [1, 1]),
                ([3, 2], [1, 1], [0, 0], [1, 1]),
                ([2, 2], [1, 3], [1, 0], [2, 2]),
                ([1, 1], [1, 1], [0, 0], [1, 1]),
            ] {
                let Ok(mut window) = Window2d::new(kernel, stride, pad, dil) else { continue };
                for pad_end in [0, 1] {
                    // Ceil mode's extra padding after the image.
                    window.pad_end = [window.pad_begin[0] + pad_end, window.pad_begin[1] + pad_end];
                    let Ok(g) = Geometry::new("test", &window, h, w) else { continue };
                    let (n, c) = (2, 2);
                    let xd = [n, c, h, w];
                    let mut x: Vec<f64> = (0..n * c * h * w).map(|i| ((i * 7) % 5) as f64 - 2.0).collect();
                    for (i, v) in x.iter_mut().enumerate() {
                        *v = match i % 23 {
                            3 => -0.0,
                            4 => 0.0,
                            9 => f64::NEG_INFINITY,
                            17 => nan(i as u64),
                            _ => *v,
                        };
                    }
                    x[5] = -nan(1);
                    let l = g.oh * g.ow;
                    let pd = [n, c, g.oh, g.ow];
                    let f = |v: &[f64]| CpuStorage::F64(v.to_vec());
                    let xs = f(&x);
                    let mut o = f(&vec![9.0; n * c * l]);
                    max_pool2d(
                        &window,
                        &[In { data: &xs, dims: &xd, dtype: DType::F64 }],
                        &mut Out { data: &mut o, dims: &pd, dtype: DType::F64 },
                    )
                    .unwrap();
                    let CpuStorage::F64(pooled) = o else { unreachable!() };
                    // Gradients with signed zeros: 0 + (-0) is +0 in both.
                    let gv: Vec<f64> = (0..n * c * l).map(|i| [1.5, -0.0, -2.0, 0.25][i % 4]).collect();
                    let gs = f(&gv);
                    let mut o = f(&vec![9.0; n * c * h * w]);
                    max_pool2d_backward(
                        &window,
                        &[
                            In { data: &xs, dims: &xd, dtype: DType::F64 },
                            In { data: &gs, dims: &pd, dtype: DType::F64 },
                        ],
                        &mut Out { data: &mut o, dims: &xd, dtype: DType::F64 },
                    )
                    .unwrap();
                    let CpuStorage::F64(back) = o else { unreachable!() };
                    let mut want_back = vec![0.0; n * c * h * w];
                    for p in 0..n * c {
                        let plane = &x[p * h * w..][..h * w];
                        for oy in 0..g.oh {
                            for ox in 0..g.ow {
                                let o = p * l + oy * g.ow + ox;
                                let at = window_argmax(&g, plane, oy, ox);
                                let want = at.map_or(f64::NEG_INFINITY, |a| plane[a]);
                                assert_eq!(pooled[o].to_bits(), want.to_bits(), "{window:?} {h}x{w} ({oy}, {ox})");
                                if let Some(a) = at {
                                    let v = &mut want_back[p * h * w + a];
                                    *v += gv[o];
                                }
                            }
                        }
                    }
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&back), bits(&want_back), "backward {window:?} {h}x{w}");
                }
            }
        }
        // Some geometries above must take the blocked path (runs of whole
        // rows longer than a block, and rows with border windows).
        let inner = |k, s, p, h, w| {
            let g = Geometry::new("test", &Window2d::new(k, s, p, [1, 1]).unwrap(), h, w).unwrap();
            let inner = InnerWindows::of(&g);
            (inner.rows.clone(), inner.columns(inner.rows.start))
        };
        assert_eq!(inner([2, 2], [2, 2], [0, 0], 6, 150), (0..3, 0..75));
        assert_eq!(inner([3, 3], [2, 2], [1, 1], 7, 9), (1..3, 1..4));
        // And the 2 × 2 windows above take their own loops, except where
        // ceil mode's extra padding puts a window past the image.
        let two = |h, w, pad_end: u32| {
            let mut window = Window2d::new([2, 2], [2, 2], [0, 0], [1, 1]).unwrap();
            window.pad_end = [pad_end, pad_end];
            pool2x2(&Geometry::new("test", &window, h, w).unwrap())
        };
        assert!(two(6, 150, 0) && two(7, 9, 0) && two(2, 2, 0) && two(5, 131, 0));
        assert!(!two(7, 9, 1) && two(6, 150, 1));
    }

    #[test]
    fn im2col_with_padding_and_stride_matches_hand_values() {
        // 1x1x3x3 image 1..9, 2x2 kernel, stride 2, padding 1 -> 2x2 positions.
        let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        let w = Window2d::new([2, 2], [2, 2], [1, 1], [1, 1]).unwrap();
        let cols = run_im2col(&x, &[1, 1, 3, 3], &w, &[1, 4, 4]);
        // kernel (0,0) reads (-1,-1) (-1,1) (1,-1) (1,1): 0 0 0 5
        assert_eq!(&cols[0..4], &[0.0, 0.0, 0.0, 5.0]);
        // kernel (1,1) reads (0,0) (0,2) (2,0) (2,2): 1 3 7 9
        assert_eq!(&cols[12..16], &[1.0, 3.0, 7.0, 9.0]);
    }
}
