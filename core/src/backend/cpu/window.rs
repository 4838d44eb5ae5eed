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

pub(super) fn im2col(window: &Window2d, [x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "Im2Col";
    let d = x.dims;
    check(OP, d.len() == 4 && out.dims.len() == 3 && x.dtype == out.dtype, d, out.dims)?;
    let g = Geometry::new(OP, window, d[2], d[3])?;
    let k = g.kh * g.kw;
    check(OP, out.dims == [d[0], d[1] * k, g.oh * g.ow], d, out.dims)?;
    let plane_out = k * g.oh * g.ow;
    if plane_out == 0 || out.numel() == 0 {
        return Ok(());
    }
    with_num!(x.dtype, OP, T => {
        let src = x.slice::<T>(OP)?;
        for_chunks(out.slice::<T>(OP)?, plane_out, |start, chunk| {
            for (p, dst) in chunk.chunks_exact_mut(plane_out).enumerate() {
                let plane = &src[(start / plane_out + p) * g.h * g.w..][..g.h * g.w];
                im2col_plane(&g, plane, dst);
            }
        });
        Ok(())
    })
}

fn im2col_plane<T: Scalar>(g: &Geometry, plane: &[T], dst: &mut [T]) {
    let l = g.oh * g.ow;
    for i in 0..g.kh {
        for j in 0..g.kw {
            let row = &mut dst[(i * g.kw + j) * l..][..l];
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
    }
}

pub(super) fn col2im(window: &Window2d, image: [u32; 2], [cols]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "Col2Im";
    let d = cols.dims;
    let (h, w) = (image[0] as usize, image[1] as usize);
    let g = Geometry::new(OP, window, h, w)?;
    let k = g.kh * g.kw;
    let ok = d.len() == 3 && d[1] % k == 0 && d[2] == g.oh * g.ow && cols.dtype == out.dtype;
    check(OP, ok && out.dims == [d[0], d[1] / k, h, w], d, out.dims)?;
    let plane = h * w;
    if plane == 0 || out.numel() == 0 {
        return Ok(());
    }
    let per_plane = k * g.oh * g.ow;
    with_num!(cols.dtype, OP, T => {
        let src = cols.slice::<T>(OP)?;
        for_chunks(out.slice::<T>(OP)?, plane, |start, chunk| {
            for (p, dst) in chunk.chunks_exact_mut(plane).enumerate() {
                let columns = &src[(start / plane + p) * per_plane..][..per_plane];
                col2im_plane(&g, columns, dst);
            }
        });
        Ok(())
    })
}

/// Accumulate in the fixed order (i, j, oy, ox): deterministic.
fn col2im_plane<T: super::scalar::Num>(g: &Geometry, columns: &[T], dst: &mut [T]) {
    dst.fill(T::from_f64(0.0));
    let l = g.oh * g.ow;
    for i in 0..g.kh {
        for j in 0..g.kw {
            let row = &columns[(i * g.kw + j) * l..][..l];
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
        for_chunks(out.slice::<T>(OP)?, plane_out, |start, chunk| {
            for (p, dst) in chunk.chunks_exact_mut(plane_out).enumerate() {
                let plane = &src[(start / plane_out + p) * g.h * g.w..][..g.h * g.w];
                for oy in 0..g.oh {
                    for ox in 0..g.ow {
                        // Windows always hold a pixel (padding <= kernel/2).
                        dst[oy * g.ow + ox] = match window_argmax(&g, plane, oy, ox) {
                            Some(pos) => plane[pos],
                            None => T::from_f64(f64::NEG_INFINITY),
                        };
                    }
                }
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
        for_chunks(out.slice::<T>(OP)?, plane, |start, chunk| {
            for (p, dst) in chunk.chunks_exact_mut(plane).enumerate() {
                let index = start / plane + p;
                let xs = &src[index * plane..][..plane];
                let gp = &gs[index * plane_out..][..plane_out];
                dst.fill(T::from_f64(0.0));
                // Windows in row-major order: the accumulation order is fixed.
                for oy in 0..g.oh {
                    for ox in 0..g.ow {
                        if let Some(pos) = window_argmax(&g, xs, oy, ox) {
                            dst[pos] = dst[pos] + gp[oy * g.ow + ox];
                        }
                    }
                }
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
