//! Movement and indexing: reshape, permute, expand, slice, concat,
//! index_select, scatter_add.

use std::panic::Location;

use super::reduce::normalize_axis;
use super::same_graph;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{check_rank, Tensor};
use crate::op::{Op, Perm, SliceAttr};
use crate::shape::{broadcast_shapes, checked_numel, checked_sum, fmt_dims, numel, Dims};

/// The range taken along one axis: `start..end` every `step` elements.
/// `start` and `end` are clamped to the axis length, as in Python slicing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceSpec {
    pub start: usize,
    pub end: usize,
    pub step: usize,
}

impl SliceSpec {
    pub fn new(start: usize, end: usize, step: usize) -> SliceSpec {
        SliceSpec { start, end, step }
    }
    /// The whole axis.
    pub fn all() -> SliceSpec {
        SliceSpec { start: 0, end: usize::MAX, step: 1 }
    }
    fn len(&self) -> usize {
        if self.end > self.start {
            (self.end - self.start).div_ceil(self.step)
        } else {
            0
        }
    }
}

/// The per-axis start and step of `specs` over `dims`, clamped and
/// validated, and the sliced dims.
#[track_caller]
fn slice_attrs(op: &'static str, dims: &[usize], specs: &[SliceSpec]) -> Result<(SliceAttr, Dims)> {
    if specs.len() > dims.len() {
        return Err(Error::shape(
            op,
            format!("{} slice ranges given for a tensor of shape {}", specs.len(), fmt_dims(dims)),
        ));
    }
    let mut axes: Dims = Dims::new();
    let mut out = Dims::new();
    for (axis, &dim) in dims.iter().enumerate() {
        let spec = specs.get(axis).copied().unwrap_or_else(SliceSpec::all);
        if spec.step == 0 {
            return Err(Error::invalid(op, format!("step of axis {axis} is 0; steps must be >= 1")));
        }
        // A step past the end takes one element whatever its size: clamping
        // it keeps the attribute small without changing the result.
        let clamped = SliceSpec { start: spec.start.min(dim), end: spec.end.min(dim), step: spec.step.min(dim.max(1)) };
        axes.push(clamped.start);
        axes.push(clamped.step);
        out.push(clamped.len());
    }
    match SliceAttr::new(axes.chunks(2).map(|c| (c[0], c[1]))) {
        Some(attr) => Ok((attr, out)),
        None => Err(Error::unsupported(
            op,
            format!("slicing {} needs positions beyond 2^32 - 1, which kiln does not support", fmt_dims(dims)),
        )),
    }
}

impl<'g> Tensor<'g> {
    /// Same elements in a new shape; one dimension may be -1 (inferred).
    /// Other negative values are refused.
    #[track_caller]
    pub fn reshape(self, dims: &[isize]) -> Result<Tensor<'g>> {
        let mut out = Dims::new();
        let mut inferred = None;
        for (i, &d) in dims.iter().enumerate() {
            if d == -1 {
                if inferred.replace(i).is_some() {
                    return Err(Error::shape("Reshape", "only one dimension can be -1"));
                }
                out.push(1);
            } else if d < 0 {
                return Err(Error::shape("Reshape", format!("invalid dimension {d} in {dims:?}")));
            } else {
                out.push(d as usize);
            }
        }
        self.reshape_checked(out, inferred, &format!("{dims:?}"))
    }

    /// Reshape to explicit dims (no inference: every value, `usize::MAX`
    /// included, is a length).
    #[track_caller]
    pub fn reshape_to(self, dims: &[usize]) -> Result<Tensor<'g>> {
        self.reshape_checked(Dims::from_slice(dims), None, &fmt_dims(dims))
    }

    /// `out` with `out[inferred]` (1 so far) replaced by what the element
    /// count leaves; every product checked.
    #[track_caller]
    fn reshape_checked(self, mut out: Dims, inferred: Option<usize>, asked: &str) -> Result<Tensor<'g>> {
        let from = self.dims();
        let numel = numel(&from);
        check_rank("Reshape", &out)?;
        let known = checked_numel("Reshape", &out)?;
        if let Some(i) = inferred {
            if known == 0 || numel % known != 0 {
                return Err(Error::shape(
                    "Reshape",
                    format!("cannot reshape {} ({numel} elements) into {asked}", fmt_dims(&from)),
                ));
            }
            out[i] = numel / known;
        } else if known != numel {
            return Err(Error::shape(
                "Reshape",
                format!("cannot reshape {} ({numel} elements) into {asked} ({known} elements)", fmt_dims(&from)),
            ));
        }
        self.graph.record(Op::Reshape, &[self.id], &out, self.dtype(), Location::caller())
    }

    /// Reorder axes: output axis i is input axis `perm[i]`.
    #[track_caller]
    pub fn permute(self, perm: &[usize]) -> Result<Tensor<'g>> {
        let dims = self.dims();
        let checked = Perm::new(perm).filter(|p| p.rank() == dims.len());
        let Some(checked) = checked else {
            return Err(Error::invalid(
                "Permute",
                format!("{perm:?} is not a permutation of the {} axes of {}", dims.len(), fmt_dims(&dims)),
            ));
        };
        let out: Dims = perm.iter().map(|&p| dims[p]).collect();
        let perm = checked;
        self.graph.record(Op::Permute(perm), &[self.id], &out, self.dtype(), Location::caller())
    }

    /// Swap two axes.
    #[track_caller]
    pub fn transpose(self, a: isize, b: isize) -> Result<Tensor<'g>> {
        let rank = self.rank();
        let (a, b) = (normalize_axis("Permute", a, rank)?, normalize_axis("Permute", b, rank)?);
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Broadcast to `dims` (NumPy rules).
    #[track_caller]
    pub fn expand(self, dims: &[usize]) -> Result<Tensor<'g>> {
        let from = self.dims();
        match broadcast_shapes(&from, dims) {
            Some(out) if out.as_slice() == dims => {}
            _ => {
                return Err(Error::shape("Expand", format!("cannot expand {} to {}", fmt_dims(&from), fmt_dims(dims))))
            }
        }
        check_rank("Expand", dims)?;
        self.graph.record(Op::Expand, &[self.id], dims, self.dtype(), Location::caller())
    }

    /// Take `specs[i]` along axis i (missing trailing axes are taken whole).
    #[track_caller]
    pub fn slice(self, specs: &[SliceSpec]) -> Result<Tensor<'g>> {
        let (attr, out) = slice_attrs("Slice", &self.dims(), specs)?;
        self.graph.record(Op::Slice(attr), &[self.id], &out, self.dtype(), Location::caller())
    }

    /// Slice one axis.
    #[track_caller]
    pub fn slice_axis(self, axis: isize, start: usize, end: usize, step: usize) -> Result<Tensor<'g>> {
        let rank = self.rank();
        let axis = normalize_axis("Slice", axis, rank)?;
        let mut specs = vec![SliceSpec::all(); rank];
        specs[axis] = SliceSpec::new(start, end, step);
        self.slice(&specs)
    }

    /// The adjoint of `slice`: a zero tensor of shape `dims` with `self`
    /// written at the positions `specs` select from it.
    #[track_caller]
    pub fn slice_backward(self, dims: &[usize], specs: &[SliceSpec]) -> Result<Tensor<'g>> {
        let (attr, sliced) = slice_attrs("SliceBackward", dims, specs)?;
        if sliced != self.dims() {
            return Err(Error::shape(
                "SliceBackward",
                format!(
                    "gradient has shape {} but slicing {} gives {}",
                    fmt_dims(&self.dims()),
                    fmt_dims(dims),
                    fmt_dims(&sliced)
                ),
            ));
        }
        self.graph.record(Op::SliceBackward(attr), &[self.id], dims, self.dtype(), Location::caller())
    }

    /// Slice with a validated attribute taking `counts` elements per axis
    /// (the gradient rules' way back from SliceBackward).
    #[track_caller]
    pub(crate) fn slice_attr(self, attr: SliceAttr, counts: &[usize]) -> Result<Tensor<'g>> {
        crate::backend::checks::slice_view("Slice", &attr, &self.dims(), counts)?;
        self.graph.record(Op::Slice(attr), &[self.id], counts, self.dtype(), Location::caller())
    }

    /// SliceBackward into `dims` with a validated attribute (the gradient
    /// rule of Slice).
    #[track_caller]
    pub(crate) fn slice_backward_attr(self, dims: &[usize], attr: SliceAttr) -> Result<Tensor<'g>> {
        crate::backend::checks::slice_view("SliceBackward", &attr, dims, &self.dims())?;
        self.graph.record(Op::SliceBackward(attr), &[self.id], dims, self.dtype(), Location::caller())
    }

    /// Join tensors along `axis`; all other dimensions must agree.
    #[track_caller]
    pub fn concat(tensors: &[Tensor<'g>], axis: isize) -> Result<Tensor<'g>> {
        let Some(first) = tensors.first() else {
            return Err(Error::invalid("Concat", "needs at least one tensor"));
        };
        let dims = first.dims();
        let axis = normalize_axis("Concat", axis, dims.len())?;
        let mut out = dims.clone();
        let mut lengths = Vec::with_capacity(tensors.len());
        for t in tensors {
            same_graph("Concat", first, t)?;
            let d = t.dims();
            let fits = d.len() == dims.len() && (0..d.len()).all(|i| i == axis || d[i] == dims[i]);
            if !fits || t.dtype() != first.dtype() {
                return Err(Error::shape(
                    "Concat",
                    format!(
                        "{} {} does not fit {} {} along axis {axis}",
                        fmt_dims(&d),
                        t.dtype(),
                        fmt_dims(&dims),
                        first.dtype()
                    ),
                ));
            }
            lengths.push(d[axis]);
        }
        out[axis] =
            checked_sum("Concat", || format!("the lengths {lengths:?} along axis {axis}"), lengths.iter().copied())?;
        let ids: Vec<_> = tensors.iter().map(|t| t.id).collect();
        first.graph.record(Op::Concat { axis: axis as u8 }, &ids, &out, first.dtype(), Location::caller())
    }

    /// Gather slices along `axis` at the positions in `index` (1-D i32).
    /// Out-of-range positions are reported when the node runs.
    #[track_caller]
    pub fn index_select(self, axis: isize, index: Tensor<'g>) -> Result<Tensor<'g>> {
        same_graph("IndexSelect", &self, &index)?;
        let dims = self.dims();
        let axis = normalize_axis("IndexSelect", axis, dims.len())?;
        check_index("IndexSelect", &index)?;
        let mut out = dims.clone();
        out[axis] = index.numel();
        self.graph.record(
            Op::IndexSelect { axis: axis as u8 },
            &[self.id, index.id],
            &out,
            self.dtype(),
            Location::caller(),
        )
    }

    /// `self` with `source`'s slices added at the positions in `index` along
    /// `axis` (repeated positions accumulate).
    #[track_caller]
    pub fn scatter_add(self, axis: isize, index: Tensor<'g>, source: Tensor<'g>) -> Result<Tensor<'g>> {
        same_graph("ScatterAdd", &self, &index)?;
        same_graph("ScatterAdd", &self, &source)?;
        let dims = self.dims();
        let axis = normalize_axis("ScatterAdd", axis, dims.len())?;
        check_index("ScatterAdd", &index)?;
        let mut expected = dims.clone();
        expected[axis] = index.numel();
        if source.dims() != expected || source.dtype() != self.dtype() {
            return Err(Error::shape(
                "ScatterAdd",
                format!(
                    "source is {} {}, expected {} {} (destination {} with axis {axis} of length {})",
                    fmt_dims(&source.dims()),
                    source.dtype(),
                    fmt_dims(&expected),
                    self.dtype(),
                    fmt_dims(&dims),
                    index.numel()
                ),
            ));
        }
        self.graph.record(
            Op::ScatterAdd { axis: axis as u8 },
            &[self.id, index.id, source.id],
            &dims,
            self.dtype(),
            Location::caller(),
        )
    }
}

#[track_caller]
fn check_index(op: &'static str, index: &Tensor<'_>) -> Result<()> {
    if index.dtype() != DType::I32 {
        return Err(Error::dtype(op, format!("index must be an i32 tensor, got {}", index.dtype())));
    }
    if index.rank() != 1 {
        return Err(Error::shape(op, format!("index must be 1-D, got shape {}", fmt_dims(&index.dims()))));
    }
    Ok(())
}
