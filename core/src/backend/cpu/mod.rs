// TEMPORARY placeholder while the real CPU backend is written; replaced wholesale.
use super::*;
use crate::error::Error;
pub struct CpuBackend;
impl CpuBackend { pub fn new() -> Self { CpuBackend } }
impl Backend for CpuBackend {
    fn name(&self) -> String { "cpu".into() }
    fn alloc(&self, _: DType, _: usize) -> Result<BufferId> { Err(Error::unsupported("cpu", "placeholder")) }
    fn free(&self, _: BufferId) {}
    fn upload(&self, _: BufferId, _: &HostData) -> Result<()> { Err(Error::unsupported("cpu", "placeholder")) }
    fn copy(&self, _: BufferId, _: BufferId, _: DType, _: usize) -> Result<()> { Err(Error::unsupported("cpu", "placeholder")) }
    fn run(&self, _: &KernelCall<'_>) -> Result<()> { Err(Error::unsupported("cpu", "placeholder")) }
    fn update_param(&self, _: &ParamUpdate, _: BufferId, _: BufferId, _: &[BufferId], _: DType, _: usize) -> Result<()> { Err(Error::unsupported("cpu", "placeholder")) }
    fn read(&self, _: BufferId, _: DType, _: usize) -> ReadFuture { Box::pin(std::future::ready(Err(Error::unsupported("cpu", "placeholder")))) }
    fn supports(&self, _: &Op, _: DType) -> bool { false }
}
