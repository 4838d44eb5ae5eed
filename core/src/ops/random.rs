//! Random tensors: RandUniform and RandNormal, drawn from the counter-based
//! generator of `crate::tensor_rng` (element i depends on (seed, i) only).

use std::panic::Location;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{check_rank, Graph, Tensor};
use crate::op::Op;
use crate::shape::checked_numel;

impl Graph {
    /// Uniform values in [0, 1): element i is a function of (seed, i) only,
    /// so every backend draws the same numbers and a replay is exact.
    #[track_caller]
    pub fn rand_uniform(&self, dims: &[usize], seed: u64, dtype: DType) -> Result<Tensor<'_>> {
        self.random(Op::RandUniform { seed }, dims, dtype)
    }

    /// Standard normal values from the same counter-based generator.
    #[track_caller]
    pub fn rand_normal(&self, dims: &[usize], seed: u64, dtype: DType) -> Result<Tensor<'_>> {
        self.random(Op::RandNormal { seed }, dims, dtype)
    }

    #[track_caller]
    fn random(&self, op: Op, dims: &[usize], dtype: DType) -> Result<Tensor<'_>> {
        check_rank(op.name(), dims)?;
        if !dtype.is_float() {
            return Err(Error::dtype(op.name(), format!("random values are float, not {dtype}")));
        }
        let numel = checked_numel(op.name(), dims)?;
        if numel > u32::MAX as usize / 2 {
            return Err(Error::invalid(op.name(), "the generator's counter is 32-bit: at most 2^31 elements"));
        }
        self.record(op, &[], dims, dtype, Location::caller())
    }
}
