//! Launches norm.wgsl: LayerNorm and LayerNormBackward (f32), with the CPU
//! backend's shape checks. Rows of at most one leaf go to one thread each,
//! longer rows (up to `WG` leaves, the longest `Tensor::layer_norm` hands a
//! primitive) to one workgroup each. Native only: the browser build
//! composes layer norm from ordinary ops.

use kiln_core::backend::{checks, TensorRef};
use kiln_core::{DType, Error, Result};

use super::unsupported_dtype;
use crate::geometry::word;
use crate::params::{words, Norm};
use crate::shaders::{Kernel, WG};
use crate::{Arg, WgpuBackend};

/// Entries of one leaf of the summation rule (LEAF in norm.wgsl).
const LEAF: usize = 128;

pub(crate) fn layer_norm(be: &WgpuBackend, eps: f64, [x]: &[TensorRef<'_>; 1], out: &TensorRef<'_>) -> Result<()> {
    launch(be, "LayerNorm", eps, x, None, out)
}

pub(crate) fn layer_norm_backward(
    be: &WgpuBackend,
    eps: f64,
    [x, g]: &[TensorRef<'_>; 2],
    out: &TensorRef<'_>,
) -> Result<()> {
    launch(be, "LayerNormBackward", eps, x, Some(g), out)
}

fn launch(
    be: &WgpuBackend,
    op: &'static str,
    eps: f64,
    x: &TensorRef<'_>,
    g: Option<&TensorRef<'_>>,
    out: &TensorRef<'_>,
) -> Result<()> {
    let mut operands = vec![(x.dims, x.dtype)];
    operands.extend(g.map(|g| (g.dims, g.dtype)));
    let n = checks::layer_norm(op, &operands, out.dims, out.dtype)?;
    if out.dtype != DType::F32 {
        return Err(unsupported_dtype(op, out.dtype));
    }
    let total = out.numel();
    if total == 0 {
        return Ok(());
    }
    if n > WG as usize * LEAF {
        return Err(Error::unsupported(
            op,
            format!("rows of {n} entries exceed the kernel's {} (layer_norm composes longer rows)", WG as usize * LEAF),
        ));
    }
    word(op, total)?;
    let rows = total / n;
    let params = Norm { rows: word(op, rows)?, n: word(op, n)?, eps: eps as f32 };
    let mut args = vec![(1, Arg::input(x)), (3, Arg::output(out))];
    if let Some(g) = g {
        args.push((2, Arg::input(g)));
    }
    let (entry, grid) = match (n <= LEAF, g.is_some()) {
        (true, false) => ("forward_serial", be.grid_for(op, rows)?),
        (true, true) => ("backward_serial", be.grid_for(op, rows)?),
        (false, false) => ("forward_rows", be.ctx().grid(op, rows as u64)?),
        (false, true) => ("backward_rows", be.ctx().grid(op, rows as u64)?),
    };
    be.launch(op, Kernel::Norm, entry, &args, words(&params), grid)
}
