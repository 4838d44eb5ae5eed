//! Launches random.wgsl: RandUniform and RandNormal (f32). The seed's two
//! 32-bit keys are computed here with kiln_core's own `seed_keys`, so the
//! kernel reproduces the CPU's bits.

use kiln_core::backend::TensorRef;
use kiln_core::tensor_rng::seed_keys;
use kiln_core::{DType, Result};

use super::unsupported_dtype;
use crate::geometry::word;
use crate::params::{words, Random};
use crate::shaders::Kernel;
use crate::{Arg, WgpuBackend};

/// `entry` is "uniform" or "normal".
pub(crate) fn random(
    be: &WgpuBackend,
    op: &'static str,
    entry: &'static str,
    seed: u64,
    out: &TensorRef<'_>,
) -> Result<()> {
    if out.dtype != DType::F32 {
        return Err(unsupported_dtype(op, out.dtype));
    }
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let params = Random { n: word(op, n)?, keys: seed_keys(seed) };
    be.launch(op, Kernel::Random, entry, &[(1, Arg::output(out))], words(&params), be.grid_for(op, n)?)
}
