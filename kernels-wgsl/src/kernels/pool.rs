//! Launches pool.wgsl: MaxPool2d and MaxPool2dBackward (f32), with the CPU
//! backend's shape checks.

use kiln_core::backend::checks::{window_mismatch as mismatch, window_output as output_size};
use kiln_core::backend::TensorRef;
use kiln_core::op::Window2d;
use kiln_core::{DType, Result};

use super::unsupported_dtype;
use super::window::geometry;
use crate::geometry::word;
use crate::params::{words, Pool, Window};
use crate::shaders::Kernel;
use crate::{Arg, WgpuBackend};

pub(crate) fn max_pool2d(
    be: &WgpuBackend,
    window: &Window2d,
    [x]: &[TensorRef<'_>; 1],
    out: &TensorRef<'_>,
) -> Result<()> {
    const OP: &str = "MaxPool2d";
    let d = x.dims;
    if d.len() != 4 || x.dtype != out.dtype {
        return Err(mismatch(OP, d, out.dims));
    }
    if x.dtype != DType::F32 {
        return Err(unsupported_dtype(OP, x.dtype));
    }
    let [oh, ow] = output_size(OP, window, d[2], d[3])?;
    if out.dims != [d[0], d[1], oh, ow] {
        return Err(mismatch(OP, d, out.dims));
    }
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let window = geometry(OP, window, n, x.numel(), [d[2], d[3]], [oh, ow])?;
    let params = Pool { window };
    let args = [(1, Arg::input(x)), (3, Arg::output(out))];
    be.launch(OP, Kernel::Pool, "forward", &args, words(&params), be.grid_for(OP, n)?)
}

/// The largest window `backward8` takes: a thread then loops at most
/// 8 (kh + kh kw) <= 8,448 times, far below the 65,535 loop iterations after
/// which lavapipe silently stops a shader.
const EIGHT_WINDOW: usize = 1024;

/// `backward` or `backward8` as `WgpuBackend::per_thread` chooses, but
/// `backward` for windows over EIGHT_WINDOW; with the thread count for `n`
/// pixels.
fn backward_entry(be: &WgpuBackend, window: usize, n: usize) -> (&'static str, usize) {
    if window <= EIGHT_WINDOW {
        be.per_thread(["backward", "backward8"], n)
    } else {
        ("backward", n)
    }
}

pub(crate) fn max_pool2d_backward(
    be: &WgpuBackend,
    window: &Window2d,
    [x, grad]: &[TensorRef<'_>; 2],
    out: &TensorRef<'_>,
) -> Result<()> {
    const OP: &str = "MaxPool2dBackward";
    let d = x.dims;
    if d.len() != 4 || x.dtype != out.dtype || grad.dtype != out.dtype || out.dims != d {
        return Err(mismatch(OP, d, out.dims));
    }
    if x.dtype != DType::F32 {
        return Err(unsupported_dtype(OP, x.dtype));
    }
    let [oh, ow] = output_size(OP, window, d[2], d[3])?;
    if grad.dims != [d[0], d[1], oh, ow] {
        return Err(mismatch(OP, grad.dims, out.dims));
    }
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let windows = grad.numel();
    let taps = window.kernel_elements();
    let geometry = geometry(OP, window, n, n.max(windows), [d[2], d[3]], [oh, ow])?;
    // First each window's first maximum (one thread per window), then the
    // gather over the windows holding each pixel: each thread loops over one
    // window's elements, never over a window per window it belongs to.
    let params = Pool { window: geometry };
    let per_window = Pool { window: Window { n: word(OP, windows)?, ..geometry } };
    let firsts = be.scratch(FIRSTS_DTYPE, windows)?;
    let slots = |write| Arg::Buffer { id: firsts, dtype: FIRSTS_DTYPE, len: windows, write };
    let result = (|| {
        let args = [(1, Arg::input(x)), (4, slots(true))];
        be.launch(OP, Kernel::Pool, "first_maxima", &args, words(&per_window), be.grid_for(OP, windows)?)?;
        let args = [(5, slots(false)), (2, Arg::input(grad)), (3, Arg::output(out))];
        let (entry, threads) = backward_entry(be, taps, n);
        be.launch(OP, Kernel::Pool, entry, &args, words(&params), be.grid_for(OP, threads)?)
    })();
    be.free_scratch(firsts);
    result
}

/// Window positions (u32, NONE for a window holding no pixel) travel in a
/// buffer allocated as i32, which has the same word size.
const FIRSTS_DTYPE: DType = DType::I32;
