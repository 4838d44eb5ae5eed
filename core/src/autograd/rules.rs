//! The gradient table: one arm per primitive op, each building the input
//! gradients out of ordinary forward ops (so every rule is differentiable
//! again). Read it next to OPS.md. `g` is the incoming gradient, `y` the
//! op's output, `x[i]` its inputs.

use smallvec::{smallvec, SmallVec};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::op::{BinaryOp, Op, ReduceOp, UnaryOp, Window2d};
use crate::ops::SliceSpec;
use crate::shape::{reduced_dims, AxisSet};

pub(crate) type InputGrads<'g> = SmallVec<[Option<Tensor<'g>>; 3]>;

/// Which values a node's rule reads, so the executor keeps them alive after
/// the forward pass (bit i = input i).
pub(crate) struct Saved {
    pub inputs: u8,
    pub output: bool,
}

pub(crate) fn saved_values(op: &Op) -> Saved {
    let (inputs, output) = match op {
        Op::Unary(u) => match u {
            UnaryOp::Exp | UnaryOp::Sqrt | UnaryOp::Recip | UnaryOp::Tanh | UnaryOp::Sigmoid => (0, true),
            UnaryOp::Neg | UnaryOp::Sign => (0, false),
            _ => (0b1, false),
        },
        Op::Binary(BinaryOp::Add | BinaryOp::Sub) => (0, false),
        Op::Binary(BinaryOp::Pow) => (0b11, true),
        Op::Binary(_) => (0b11, false),
        Op::Where => (0b1, false),
        Op::Reduce { op: ReduceOp::Max | ReduceOp::Min, .. } => (0b1, true),
        Op::Reduce { op: ReduceOp::Prod, .. } => (0b1, false),
        Op::MatMul { .. } => (0b11, false),
        Op::IndexSelect { .. } | Op::ScatterAdd { .. } => (0b10, false),
        Op::MaxPool2d(_) | Op::MaxPool2dBackward(_) => (0b1, false),
        _ => (0, false),
    };
    Saved { inputs, output }
}

/// Whether gradient flows from the output to input `i` at all (the
/// condition of Where and integer indices never receive one).
pub(crate) fn differentiable_input(op: &Op, i: usize) -> bool {
    match op {
        Op::Where => i != 0,
        Op::IndexSelect { .. } => i == 0,
        Op::ScatterAdd { .. } => i != 1,
        // The routing depends on x only through which element is largest:
        // piecewise constant in x.
        Op::MaxPool2dBackward(_) => i == 1,
        Op::Compare(_) | Op::Reduce { op: ReduceOp::ArgMax | ReduceOp::ArgMin, .. } => false,
        _ => true,
    }
}

/// Ops whose output depends on a differentiable input but which have no
/// gradient rule, with the reason; backward through them is an error.
pub fn not_differentiable_reason(op: &Op) -> Option<&'static str> {
    match op {
        Op::Unary(UnaryOp::Sign) => {
            Some("sign is piecewise constant (its derivative is zero almost everywhere); detach() its input if a zero gradient is intended")
        }
        Op::Compare(_) => Some("comparisons produce bool tensors"),
        Op::Reduce { op: ReduceOp::ArgMax | ReduceOp::ArgMin, .. } => Some("arg-reductions produce integer positions"),
        Op::Input | Op::Param(_) => Some("leaf: gradients stop here"),
        Op::Full(_) | Op::Arange { .. } | Op::RandUniform { .. } | Op::RandNormal { .. } => {
            Some("creation op: no inputs")
        }
        _ => None,
    }
}

/// Sum `t` back down to `dims` over the axes broadcasting stretched.
pub(crate) fn unbroadcast<'g>(t: Tensor<'g>, dims: &[usize]) -> Result<Tensor<'g>> {
    let from = t.dims();
    if from.as_slice() == dims {
        return Ok(t);
    }
    let extra = from.len() - dims.len();
    let axes: Vec<isize> =
        (0..from.len()).filter(|&i| i < extra || (dims[i - extra] == 1 && from[i] != 1)).map(|i| i as isize).collect();
    let summed = if axes.is_empty() { t } else { t.sum(&axes, true)? };
    summed.reshape_to(dims)
}

/// Build the gradient of each input that `needs` asks for.
fn per_input<'g>(needs: &[bool], mut rule: impl FnMut(usize) -> Result<Tensor<'g>>) -> Result<InputGrads<'g>> {
    needs.iter().enumerate().map(|(i, &need)| if need { rule(i).map(Some) } else { Ok(None) }).collect()
}

fn slice_specs(attrs: &[usize]) -> Vec<SliceSpec> {
    attrs.chunks(3).map(|c| SliceSpec::new(c[0], c[1], c[2])).collect()
}

/// The input gradients of one node, given its gradient `g`.
pub(crate) fn input_gradients<'g>(
    op: Op,
    attrs: &[usize],
    x: &[Tensor<'g>],
    y: Tensor<'g>,
    g: Tensor<'g>,
    needs: &[bool],
) -> Result<InputGrads<'g>> {
    let graph = g.graph();
    let one = |t: Result<Tensor<'g>>| -> Result<InputGrads<'g>> { Ok(smallvec![Some(t?)]) };
    let zero = || graph.scalar(0.0, g.dtype());
    let two_over_sqrt_pi = std::f64::consts::FRAC_2_SQRT_PI;
    match op {
        Op::Unary(u) => {
            let x = x[0];
            match u {
                UnaryOp::Neg => one(g.neg()),
                // sign(x) is a constant of the rule: its own derivative is 0 a.e.
                UnaryOp::Abs => one(g.mul(graph.with_no_grad(|| x.sign())?)),
                UnaryOp::Exp => one(g.mul(y)),
                UnaryOp::Log => one(g.div(x)),
                UnaryOp::Sqrt => one(g.div(y.mul(2.0)?)),
                UnaryOp::Recip => one(g.mul(y.square()?)?.neg()),
                UnaryOp::Sin => one(g.mul(x.cos()?)),
                UnaryOp::Cos => one(g.mul(x.sin()?)?.neg()),
                UnaryOp::Tanh => one(g.mul(y.square()?.neg()?.add(1.0)?)),
                UnaryOp::Sigmoid => one(g.mul(y)?.mul(y.neg()?.add(1.0)?)),
                UnaryOp::Relu => one(x.gt(0.0)?.where_(g, zero()?)),
                UnaryOp::Erf => one(g.mul(x.square()?.neg()?.exp()?.mul(two_over_sqrt_pi)?)),
                UnaryOp::Erfc => one(g.mul(x.square()?.neg()?.exp()?.mul(-two_over_sqrt_pi)?)),
                UnaryOp::Sign => Err(no_rule(&op)),
            }
        }
        Op::Cast(_) => one(g.cast(x[0].dtype())),
        Op::Binary(b) => {
            let (a, bb) = (x[0], x[1]);
            let (da, db) = (a.dims(), bb.dims());
            per_input(needs, |i| {
                let (full, dims) = match (b, i) {
                    (BinaryOp::Add, 0) => (g, &da),
                    (BinaryOp::Add, _) => (g, &db),
                    (BinaryOp::Sub, 0) => (g, &da),
                    (BinaryOp::Sub, _) => (g.neg()?, &db),
                    (BinaryOp::Mul, 0) => (g.mul(bb)?, &da),
                    (BinaryOp::Mul, _) => (g.mul(a)?, &db),
                    (BinaryOp::Div, 0) => (g.div(bb)?, &da),
                    (BinaryOp::Div, _) => (g.mul(a)?.div(bb.square()?)?.neg()?, &db),
                    (BinaryOp::Pow, 0) => (g.mul(bb)?.mul(a.pow(bb.sub(1.0)?)?)?, &da),
                    (BinaryOp::Pow, _) => (g.mul(y)?.mul(a.log()?)?, &db),
                    // Ties go to the first operand (stated in the docs, tested).
                    (BinaryOp::Maximum, 0) => (a.ge(bb)?.where_(g, zero()?)?, &da),
                    (BinaryOp::Maximum, _) => (a.lt(bb)?.where_(g, zero()?)?, &db),
                    (BinaryOp::Minimum, 0) => (a.le(bb)?.where_(g, zero()?)?, &da),
                    (BinaryOp::Minimum, _) => (a.gt(bb)?.where_(g, zero()?)?, &db),
                };
                unbroadcast(full, dims)
            })
        }
        Op::Where => {
            let c = x[0];
            per_input(needs, |i| match i {
                1 => unbroadcast(c.where_(g, zero()?)?, &x[1].dims()),
                _ => unbroadcast(c.where_(zero()?, g)?, &x[2].dims()),
            })
        }
        Op::Reduce { op: r, axes, keepdim } => {
            let x = x[0];
            let dims = x.dims();
            let kept = reduced_dims(&dims, axes, true);
            let gk = if keepdim { g } else { g.reshape_to(&kept)? };
            match r {
                ReduceOp::Sum => one(gk.expand(&dims)),
                ReduceOp::Max | ReduceOp::Min => {
                    // Ties share the gradient equally.
                    let yk = if keepdim { y } else { y.reshape_to(&kept)? };
                    let mask = x.eq(yk)?.cast(x.dtype())?;
                    let count = mask.sum(&axis_list(axes, dims.len()), true)?;
                    one(gk.div(count)?.mul(mask))
                }
                ReduceOp::Prod => one(prod_gradient(x, gk, axes)),
                ReduceOp::ArgMax | ReduceOp::ArgMin => Err(no_rule(&op)),
            }
        }
        Op::MatMul { transpose_a: ta, transpose_b: tb } => {
            let (a, b) = (x[0], x[1]);
            per_input(needs, |i| {
                let full = match (ta, tb, i) {
                    (false, false, 0) => g.matmul_t(b, false, true)?,
                    (false, false, _) => a.matmul_t(g, true, false)?,
                    (false, true, 0) => g.matmul_t(b, false, false)?,
                    (false, true, _) => g.matmul_t(a, true, false)?,
                    (true, false, 0) => b.matmul_t(g, false, true)?,
                    (true, false, _) => a.matmul_t(g, false, false)?,
                    (true, true, 0) => b.matmul_t(g, true, true)?,
                    (true, true, _) => g.matmul_t(a, true, true)?,
                };
                unbroadcast(full, &x[i].dims())
            })
        }
        Op::Reshape => one(g.reshape_to(&x[0].dims())),
        Op::Permute(_) => {
            let mut inverse = vec![0; attrs.len()];
            for (i, &p) in attrs.iter().enumerate() {
                inverse[p] = i;
            }
            one(g.permute(&inverse))
        }
        Op::Expand => one(unbroadcast(g, &x[0].dims())),
        Op::Slice(_) => one(g.slice_backward(&x[0].dims(), &slice_specs(attrs))),
        Op::SliceBackward(_) => one(g.slice(&slice_specs(attrs))),
        Op::Concat { axis } => {
            let mut offsets = Vec::with_capacity(x.len());
            let mut offset = 0;
            for t in x {
                offsets.push(offset);
                offset += t.dims()[axis as usize];
            }
            per_input(needs, |i| {
                let len = x[i].dims()[axis as usize];
                g.slice_axis(axis as isize, offsets[i], offsets[i] + len, 1)
            })
        }
        Op::IndexSelect { axis } => {
            let dest = graph.zeros(&x[0].dims(), g.dtype())?;
            Ok(smallvec![Some(dest.scatter_add(axis as isize, x[1], g)?), None])
        }
        Op::ScatterAdd { axis } => per_input(needs, |i| match i {
            0 => Ok(g),
            _ => g.index_select(axis as isize, x[1]),
        }),
        Op::Im2Col(window) => {
            let d = x[0].dims();
            one(g.col2im([d[2], d[3]], window))
        }
        Op::Col2Im { window, .. } => one(g.im2col(window)),
        Op::MaxPool2d(window) => one(x[0].max_pool2d_backward(g, window)),
        Op::MaxPool2dBackward(window) => Ok(smallvec![None, Some(max_pool_gather(x[0], g, window)?)]),
        Op::Input
        | Op::Param(_)
        | Op::Full(_)
        | Op::Arange { .. }
        | Op::RandUniform { .. }
        | Op::RandNormal { .. }
        | Op::Compare(_) => Err(no_rule(&op)),
    }
}

fn axis_list(axes: AxisSet, rank: usize) -> Vec<isize> {
    axes.iter(rank).map(|a| a as isize).collect()
}

/// d prod / d x_i = product of the other elements, exact when zeros occur:
/// with no zero it is prod/x_i; with one zero only that element gets the
/// product of the rest; with two or more every entry is 0. Computed without
/// ever dividing by zero.
fn prod_gradient<'g>(x: Tensor<'g>, gk: Tensor<'g>, axes: AxisSet) -> Result<Tensor<'g>> {
    let dtype = x.dtype();
    let axes = axis_list(axes, x.rank());
    let is_zero = x.eq(0.0)?;
    let nonzero = is_zero.where_(1.0, x)?;
    let prod_nonzero = nonzero.prod(&axes, true)?;
    let zeros = is_zero.cast(dtype)?.sum(&axes, true)?;
    let factor = zeros.eq(0.0)?.cast(dtype)?.add(zeros.eq(1.0)?.cast(dtype)?.mul(is_zero.cast(dtype)?)?)?;
    gk.mul(prod_nonzero.div(nonzero)?)?.mul(factor)
}

/// The adjoint of MaxPool2dBackward in its gradient argument: for each
/// window of x, the value of `g` (x-shaped) at the window's first maximum —
/// composed from Im2Col, ArgMax and a one-hot mask, so it is differentiable
/// again and picks exactly the element the pooling kernels pick.
fn max_pool_gather<'g>(x: Tensor<'g>, g: Tensor<'g>, window: Window2d) -> Result<Tensor<'g>> {
    let graph = g.graph();
    let d = x.dims();
    let (n, c, k) = (d[0], d[1], window.kernel_elements());
    let [oh, ow] = window
        .output_size([d[2], d[3]])
        .ok_or_else(|| Error::shape("MaxPool2dBackward", "window does not fit the image"))?;
    let columns = |t: Tensor<'g>| t.im2col(window)?.reshape_to(&[n, c, k, oh * ow]);
    // Padding must never be the maximum: mask it to -inf.
    let inside = columns(graph.ones(&d, x.dtype())?)?.gt(0.5)?;
    let candidates = inside.where_(columns(x)?, f64::NEG_INFINITY)?;
    // A window whose real pixels are all -inf ties with its padding: the
    // kernels then pick the first real pixel, so do the same here.
    let first_real = inside.cast(DType::I32)?.argmax(&[2], true)?;
    let all_minus_infinity = candidates.max(&[2], true)?.eq(f64::NEG_INFINITY)?;
    let first_max = all_minus_infinity.where_(first_real, candidates.argmax(&[2], true)?)?;
    let positions = graph.arange(0.0, 1.0, k, DType::I32)?.reshape_to(&[1, 1, k, 1])?;
    let pick = positions.eq(first_max)?.cast(g.dtype())?;
    columns(g)?.mul(pick)?.sum(&[2], false)?.reshape_to(&[n, c, oh, ow])
}

fn no_rule(op: &Op) -> Error {
    let why = not_differentiable_reason(op).unwrap_or("no gradient rule is defined");
    Error::autograd(op.name(), format!("cannot differentiate through {}: {why}", op.name()))
}
