//! Launches a custom op's own WGSL kernel (see `kiln_core::op::custom::wgsl`
//! for the contract): inputs at bindings 1..=arity, the output after them,
//! element counts in the parameter block, one invocation per output element.

use kiln_core::backend::TensorRef;
use kiln_core::op::CustomOp;
use kiln_core::{Error, Result};

use crate::geometry::word;
use crate::shaders::Kernel;
use crate::{Arg, WgpuBackend};

pub(crate) fn custom(be: &WgpuBackend, op: CustomOp, ins: &[TensorRef<'_>], out: &TensorRef<'_>) -> Result<()> {
    let name = op.name();
    let Some(kernel) = op.wgsl() else {
        return Err(Error::unsupported(
            name,
            "this custom op has no WGSL kernel; register one with .wgsl(..) or run it on the CPU device",
        ));
    };
    if ins.len() + 1 != kernel.bindings.len() {
        return Err(Error::backend(name, format!("expected {} inputs, got {}", kernel.bindings.len() - 1, ins.len())));
    }
    for (k, (t, &want)) in ins.iter().chain(std::iter::once(out)).zip(&kernel.bindings).enumerate() {
        if t.dtype != want {
            let what = if k == ins.len() { "the output".to_string() } else { format!("input {k}") };
            return Err(Error::unsupported(
                name,
                format!("the WGSL kernel binds {what} as {want} data but the tensor is {}", t.dtype),
            ));
        }
    }
    let n = out.numel();
    let mut params = vec![word(name, n)?];
    for t in ins {
        params.push(word(name, t.numel())?);
    }
    let mut args: Vec<(u32, Arg)> = ins.iter().enumerate().map(|(k, t)| (k as u32 + 1, Arg::input(t))).collect();
    args.push((ins.len() as u32 + 1, Arg::output(out)));
    be.launch(name, Kernel::Custom(op), "main", &args, &params, be.grid_for(name, n)?)
}
