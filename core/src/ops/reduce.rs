//! Reductions over a set of axes, and running sums along one.

use std::panic::Location;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::op::{Op, ReduceOp};
use crate::shape::{fmt_dims, reduced_dims, AxisSet};

/// Normalise possibly-negative axes into a set, refusing duplicates and
/// out-of-range axes.
#[track_caller]
pub(crate) fn axis_set(op: &'static str, axes: &[isize], rank: usize) -> Result<AxisSet> {
    let mut set = AxisSet::default();
    for &axis in axes {
        let a = normalize_axis(op, axis, rank)?;
        if set.contains(a) {
            return Err(Error::invalid(op, format!("axis {axis} is listed twice")));
        }
        set.0 |= 1 << a;
    }
    Ok(set)
}

#[track_caller]
pub(crate) fn normalize_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let a = if axis < 0 { axis + rank as isize } else { axis };
    if a < 0 || a >= rank as isize {
        return Err(Error::out_of_range(op, format!("axis {axis} is out of range for a tensor of rank {rank}")));
    }
    Ok(a as usize)
}

macro_rules! reduce_methods {
    ($($(#[$doc:meta])* $name:ident, $all:ident => $op:ident),* $(,)?) => {
        impl<'g> Tensor<'g> {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(self, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
                    self.reduce(ReduceOp::$op, axes, keepdim)
                }
                /// Over every axis, to a rank-0 tensor.
                #[track_caller]
                pub fn $all(self) -> Result<Tensor<'g>> {
                    let axes: Vec<isize> = (0..self.rank() as isize).collect();
                    self.reduce(ReduceOp::$op, &axes, false)
                }
            )*
        }
    };
}

reduce_methods! {
    sum, sum_all => Sum,
    /// Largest element; ties share the gradient equally.
    max, max_all => Max,
    min, min_all => Min,
    prod, prod_all => Prod,
    /// Position of the first largest element within the reduced axes
    /// (row-major over them), as i32.
    argmax, argmax_all => ArgMax,
    argmin, argmin_all => ArgMin,
}

impl<'g> Tensor<'g> {
    #[track_caller]
    pub fn reduce(self, op: ReduceOp, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
        let dims = self.dims();
        let dtype = self.dtype();
        if dtype == DType::Bool {
            return Err(Error::dtype(op.name(), "does not take bool tensors; cast to i32 or f32 first"));
        }
        let axes = axis_set(op.name(), axes, dims.len())?;
        let needs_elements = !matches!(op, ReduceOp::Sum | ReduceOp::Prod);
        let block: usize = axes.iter(dims.len()).map(|a| dims[a]).product();
        if needs_elements && block == 0 {
            return Err(Error::shape(
                op.name(),
                format!("cannot reduce over empty axes of shape {}: the result would be undefined", fmt_dims(&dims)),
            ));
        }
        let out_dims = reduced_dims(&dims, axes, keepdim);
        let out_dtype = if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) { DType::I32 } else { dtype };
        self.graph.record(Op::Reduce { op, axes, keepdim }, &[self.id], &out_dims, out_dtype, Location::caller())
    }
}

impl<'g> Tensor<'g> {
    /// Running sums along `axis` (PyTorch's `cumsum`): element i is the sum
    /// of the elements up to it, or before it (`exclusive`, so the first
    /// is 0), counted from the end of the axis when `reverse`. Float or
    /// i32 (which wraps); summed one element after another in that order.
    #[track_caller]
    pub fn cumsum(self, axis: isize, exclusive: bool, reverse: bool) -> Result<Tensor<'g>> {
        let dims = self.dims();
        let dtype = self.dtype();
        let axis = normalize_axis("CumSum", axis, dims.len())?;
        let op = Op::CumSum { axis: axis as u8, exclusive, reverse };
        if !op.info().dtypes.contains(dtype) {
            return Err(Error::dtype("CumSum", format!("does not take {dtype} tensors; cast to i32 or a float first")));
        }
        self.graph.record(op, &[self.id], &dims, dtype, Location::caller())
    }
}
