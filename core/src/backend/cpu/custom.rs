//! Custom ops on the CPU: the registered forward over host slices.

use super::{CpuStorage, In, Out};
use crate::error::{Error, Result};
use crate::op::custom::{CustomOp, HostSlice, HostSliceMut, HostView, HostViewMut};

/// The tensor's elements (the storage may be longer: pooled buffers).
fn view<'a>(op: &'static str, x: &In<'a>) -> Result<HostView<'a>> {
    let n = x.numel();
    let short = || Error::backend(op, format!("input buffer holds fewer than {n} elements"));
    let data = match x.data {
        CpuStorage::F32(v) => HostSlice::F32(v.get(..n).ok_or_else(short)?),
        CpuStorage::F64(v) => HostSlice::F64(v.get(..n).ok_or_else(short)?),
        CpuStorage::I32(v) => HostSlice::I32(v.get(..n).ok_or_else(short)?),
        CpuStorage::Bool(v) => HostSlice::Bool(v.get(..n).ok_or_else(short)?),
    };
    Ok(HostView { data, dims: x.dims })
}

pub(crate) fn custom(op: CustomOp, ins: &[In<'_>], out: &mut Out<'_>) -> Result<()> {
    let name = op.name();
    let views = ins.iter().map(|x| view(name, x)).collect::<Result<Vec<_>>>()?;
    let n = out.numel();
    let short = || Error::backend(name, format!("output buffer holds fewer than {n} elements"));
    let data = match &mut *out.data {
        CpuStorage::F32(v) => HostSliceMut::F32(v.get_mut(..n).ok_or_else(short)?),
        CpuStorage::F64(v) => HostSliceMut::F64(v.get_mut(..n).ok_or_else(short)?),
        CpuStorage::I32(v) => HostSliceMut::I32(v.get_mut(..n).ok_or_else(short)?),
        CpuStorage::Bool(v) => HostSliceMut::Bool(v.get_mut(..n).ok_or_else(short)?),
    };
    op.run_cpu(&views, HostViewMut { data, dims: out.dims })
}
