//! Building nodes: every public operation validates its operands, infers the
//! result's shape and dtype, and records one node. Nothing runs here.
//!
//! - `elementwise`: unary, binary (broadcasting), comparisons, where, cast
//! - `reduce`: sum/max/min/prod/argmax/argmin over axis sets
//! - `linalg`: batched matmul
//! - `movement`: reshape, permute, expand, slice, concat, index ops
//! - `conv`: sliding windows (im2col/col2im, max pooling)
//! - `random`: random tensors (uniform, normal)
//! - `masking`: tril/triu, masked fill, masked softmax, split/chunk
//! - `composed`: mean, var, softmax, gelu... built from the primitives

mod composed;
mod conv;
mod elementwise;
mod linalg;
mod masking;
mod movement;
mod random;
mod reduce;

pub use elementwise::IntoOperand;
pub use movement::SliceSpec;

use std::panic::Location;

use crate::dtype::DType;
use crate::graph::{flags, Graph, NodeId, Tensor};
use crate::op::Op;

impl Graph {
    /// Record a node whose operands were validated (its shape is checked
    /// here, see `push_node`), deciding whether it requires grad and which
    /// of its inputs the backward pass will need to keep.
    pub(crate) fn record(
        &self,
        op: Op,
        inputs: &[NodeId],
        dims: &[usize],
        dtype: DType,
        location: &'static Location<'static>,
    ) -> crate::error::Result<Tensor<'_>> {
        let info = op.info();
        let mut requires = false;
        if self.is_grad_enabled() && dtype.is_float() {
            let state = self.state.borrow();
            requires = inputs.iter().enumerate().any(|(i, &input)| {
                state.nodes[input as usize].flags & flags::REQUIRES_GRAD != 0 && info.differentiable_input(i)
            });
        }
        let id = self.push_node(op, inputs, dims, dtype, if requires { flags::REQUIRES_GRAD } else { 0 }, location)?;
        if requires {
            let saved = info.saved;
            let mut state = self.state.borrow_mut();
            for (i, &input) in inputs.iter().enumerate() {
                if saved.inputs & (1 << i) != 0 {
                    state.nodes[input as usize].flags |= flags::SAVED;
                }
            }
            if saved.output {
                state.nodes[id as usize].flags |= flags::SAVED;
            }
        }
        Ok(self.tensor(id))
    }
}

/// Check that all operands belong to one graph.
#[track_caller]
pub(crate) fn same_graph(op: &'static str, a: &Tensor<'_>, b: &Tensor<'_>) -> crate::error::Result<()> {
    if std::ptr::eq(a.graph, b.graph) {
        Ok(())
    } else {
        Err(crate::error::Error::invalid(op, "operands belong to different graphs"))
    }
}
