//! Launches window.wgsl: Im2Col and Col2Im (f32, i32), with the CPU
//! backend's shape checks. The window geometry block is shared with
//! pool.wgsl (`geometry`).

use kiln_core::backend::checks::{window_mismatch as mismatch, window_output as output_size};
use kiln_core::backend::TensorRef;
use kiln_core::op::Window2d;
use kiln_core::Result;

use super::{ty, unsupported_dtype};
use crate::geometry::word;
use crate::params::{words, Folded, Window};
use crate::shaders::{Kernel, Ty};
use crate::{Arg, WgpuBackend};

/// The geometry block of window.wgsl and pool.wgsl (p[0] = `n`, then
/// p[1..13]); checks that the kernels' u32 index arithmetic cannot wrap:
/// every position in the padded image and every element index fits; and
/// that a window holds at most `MAX_WINDOW` elements, so that no
/// invocation's loop over one window grows past a fixed bound.
pub(crate) fn geometry(
    op: &'static str,
    window: &Window2d,
    n: usize,
    largest: usize,
    [h, w]: [usize; 2],
    [oh, ow]: [usize; 2],
) -> Result<Window> {
    for a in 0..2 {
        let image = [h, w][a];
        word(op, image + window.pad_begin[a] as usize + window.pad_end[a] as usize)?;
    }
    word(op, largest)?;
    let [kh, kw] = window.kernel.map(|k| k as usize);
    if kh.saturating_mul(kw) > crate::MAX_WINDOW {
        return Err(kiln_core::Error::unsupported(
            op,
            format!(
                "a {kh} x {kw} window ({} elements) is more than the wgpu backend's bound of {} elements per \
                 window (kiln_wgsl::MAX_WINDOW: one invocation loops over a window); use the CPU device",
                kh.saturating_mul(kw),
                crate::MAX_WINDOW
            ),
        ));
    }
    Ok(Window {
        n: word(op, n)?,
        image: [word(op, h)?, word(op, w)?],
        positions: [word(op, oh)?, word(op, ow)?],
        kernel: window.kernel,
        stride: window.stride,
        dilation: window.dilation,
        pad: window.pad_begin,
    })
}

/// The storage type of an Im2Col/Col2Im operand: f32 or i32 (the CPU's
/// numeric types less f64, which is refused before any kernel runs).
fn window_ty(op: &'static str, x: &TensorRef<'_>) -> Result<Ty> {
    match ty(x.dtype) {
        Ty::U32 => Err(unsupported_dtype(op, x.dtype)),
        t => Ok(t),
    }
}

pub(crate) fn im2col(be: &WgpuBackend, window: &Window2d, [x]: &[TensorRef<'_>; 1], out: &TensorRef<'_>) -> Result<()> {
    const OP: &str = "Im2Col";
    let d = x.dims;
    let folded = out.dims.len() == 2;
    if d.len() != 4 || (out.dims.len() != 3 && !folded) || x.dtype != out.dtype {
        return Err(mismatch(OP, d, out.dims));
    }
    let t = window_ty(OP, x)?;
    let [oh, ow] = output_size(OP, window, d[2], d[3])?;
    let (rows, l) = (d[1] * window.kernel_elements(), oh * ow);
    let want: &[usize] = if folded { &[rows, d[0] * l] } else { &[d[0], rows, l] };
    if out.dims != want {
        return Err(mismatch(OP, d, out.dims));
    }
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let params = geometry(OP, window, n, x.numel(), [d[2], d[3]], [oh, ow])?;
    let args = [(1, Arg::input(x)), (2, Arg::output(out))];
    if folded {
        let params = Folded { window: params, batch: word(OP, d[0])? };
        let (entry, threads) = be.per_thread(["im2col", "im2col8"], n);
        return be.launch(OP, Kernel::WindowFolded(t), entry, &args, words(&params), be.grid_for(OP, threads)?);
    }
    be.launch(OP, Kernel::Window(t), "im2col", &args, words(&params), be.grid_for(OP, n)?)
}

pub(crate) fn col2im(
    be: &WgpuBackend,
    window: &Window2d,
    image: [u32; 2],
    [cols]: &[TensorRef<'_>; 1],
    out: &TensorRef<'_>,
) -> Result<()> {
    const OP: &str = "Col2Im";
    let d = cols.dims;
    let (h, w) = (image[0] as usize, image[1] as usize);
    let [oh, ow] = output_size(OP, window, h, w)?;
    let (k, l) = (window.kernel_elements(), oh * ow);
    let folded = d.len() == 2;
    let o = out.dims;
    let fits = |o: &[usize]| {
        let columns: &[usize] = if folded { &[o[1] * k, o[0] * l] } else { &[o[0], o[1] * k, l] };
        o[2..] == [h, w] && d == columns
    };
    if o.len() != 4 || cols.dtype != out.dtype || !fits(o) {
        return Err(mismatch(OP, d, out.dims));
    }
    let t = window_ty(OP, cols)?;
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let params = geometry(OP, window, n, cols.numel(), [h, w], [oh, ow])?;
    let args = [(1, Arg::input(cols)), (2, Arg::output(out))];
    if folded {
        let params = Folded { window: params, batch: word(OP, o[0])? };
        return be.launch(OP, Kernel::WindowFolded(t), "col2im", &args, words(&params), be.grid_for(OP, n)?);
    }
    be.launch(OP, Kernel::Window(t), "col2im", &args, words(&params), be.grid_for(OP, n)?)
}
