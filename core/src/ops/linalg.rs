//! Batched matrix multiplication.

use std::panic::Location;

use super::same_graph;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::op::Op;
use crate::shape::{broadcast_shapes, fmt_dims};

impl<'g> Tensor<'g> {
    /// Matrix product over the last two axes; leading (batch) axes broadcast.
    /// Both operands need rank >= 2.
    #[track_caller]
    pub fn matmul(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        self.matmul_t(other, false, false)
    }

    /// `op(self) · op(other)` where op transposes the last two axes when its
    /// flag is set. Transposition is free: the kernel reads with strides.
    #[track_caller]
    pub fn matmul_t(self, other: Tensor<'g>, transpose_a: bool, transpose_b: bool) -> Result<Tensor<'g>> {
        same_graph("MatMul", &self, &other)?;
        let (a, b) = (self.dims(), other.dims());
        if !self.dtype().is_float() || self.dtype() != other.dtype() {
            return Err(Error::dtype(
                "MatMul",
                format!("needs two float tensors of one dtype, got {} and {}", self.dtype(), other.dtype()),
            ));
        }
        if a.len() < 2 || b.len() < 2 {
            return Err(Error::shape(
                "MatMul",
                format!(
                    "operands need rank >= 2, got {} and {}; reshape vectors to [1, n] or [n, 1]",
                    fmt_dims(&a),
                    fmt_dims(&b)
                ),
            ));
        }
        let (ra, rb) = (a.len(), b.len());
        let (m, ka) = if transpose_a { (a[ra - 1], a[ra - 2]) } else { (a[ra - 2], a[ra - 1]) };
        let (kb, n) = if transpose_b { (b[rb - 1], b[rb - 2]) } else { (b[rb - 2], b[rb - 1]) };
        if ka != kb {
            return Err(Error::shape(
                "MatMul",
                format!(
                    "inner dimensions differ: {}{} x {}{} ({ka} vs {kb})",
                    fmt_dims(&a),
                    if transpose_a { "ᵀ" } else { "" },
                    fmt_dims(&b),
                    if transpose_b { "ᵀ" } else { "" }
                ),
            ));
        }
        let Some(mut dims) = broadcast_shapes(&a[..ra - 2], &b[..rb - 2]) else {
            return Err(Error::shape(
                "MatMul",
                format!("batch dimensions of {} and {} do not broadcast", fmt_dims(&a), fmt_dims(&b)),
            ));
        };
        dims.push(m);
        dims.push(n);
        self.graph.record(
            Op::MatMul { transpose_a, transpose_b },
            &[self.id, other.id],
            &dims,
            self.dtype(),
            Location::caller(),
        )
    }
}
