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

impl<'g> Tensor<'g> {
    /// The `k` largest elements along `axis` (the smallest when not
    /// `largest`) and their positions as i32, best first (PyTorch's `topk`,
    /// sorted): ties go to the lower position and NaN ranks above every
    /// number. The values carry gradient (scattered back to the chosen
    /// positions); the positions do not.
    #[track_caller]
    pub fn top_k(self, k: usize, axis: isize, largest: bool) -> Result<(Tensor<'g>, Tensor<'g>)> {
        const OP: &str = "TopK";
        let dims = self.dims();
        let dtype = self.dtype();
        let axis = normalize_axis(OP, axis, dims.len())?;
        if !(Op::TopK { k: 0, largest }).info().dtypes.contains(dtype) {
            return Err(Error::dtype(OP, format!("does not take {dtype} tensors; cast to i32 or a float first")));
        }
        let len = dims[axis];
        if k > len {
            return Err(Error::out_of_range(OP, format!("k {k} is more than the {len} elements of axis {axis}")));
        }
        if self.numel() > i32::MAX as usize {
            return Err(Error::shape(OP, format!("{} has more elements than i32 positions reach", fmt_dims(&dims))));
        }
        // The kernel ranks rows of the last axis: move `axis` there.
        let last = dims.len() - 1;
        let perm: Vec<usize> = (0..dims.len()).filter(|&a| a != axis).chain([axis]).collect();
        let moved = if axis == last { self } else { self.permute(&perm)? };
        let mut out_dims = moved.dims();
        out_dims[last] = k;
        let op = Op::TopK { k: k as u32, largest };
        let positions = self.graph.record(op, &[moved.id], &out_dims, DType::I32, Location::caller())?;
        let values = if k == 0 {
            moved.slice_axis(last as isize, 0, 0, 1)?
        } else {
            // Gather from the flattened rows at row · len + position:
            // IndexSelect's rule scatters the values' gradient back.
            let rows = moved.numel() / len;
            let offsets = self.graph.arange(0.0, len as f64, rows, DType::I32)?.reshape_to(&[rows, 1])?;
            let flat = positions.reshape_to(&[rows, k])?.add(offsets)?.reshape_to(&[rows * k])?;
            moved.reshape_to(&[rows * len])?.index_select(0, flat)?.reshape_to(&out_dims)?
        };
        if axis == last {
            return Ok((values, positions));
        }
        let mut back = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            back[p] = i;
        }
        Ok((values.permute(&back)?, positions.permute(&back)?))
    }
}
