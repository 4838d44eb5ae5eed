//! The gradient rules: one arm per primitive op, each building the input
//! gradients out of ordinary forward ops (so every rule is differentiable
//! again). Read it next to OPS.md. `g` is the incoming gradient, `y` the
//! op's output, `x[i]` its inputs. Which of x and y a rule reads, which
//! inputs get a gradient at all, and why an op has no rule are stated in the
//! op table (`Op::info`); a test holds the two together.

use crate::small::{smallvec, SmallVec};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::op::{BinaryOp, Op, ReduceOp, UnaryOp, Window2d};
use crate::shape::{reduced_dims, AxisSet};

pub(crate) type InputGrads<'g> = SmallVec<[Option<Tensor<'g>>; 3]>;

/// Sum `t` back down to `dims` over the axes broadcasting stretched. The
/// backward walk applies it to every contribution whose shape differs from
/// its input's (rules return gradients of the broadcast shape).
pub(crate) fn unbroadcast<'g>(t: Tensor<'g>, dims: &[usize]) -> Result<Tensor<'g>> {
    let from = t.dims();
    if from.as_slice() == dims {
        return Ok(t);
    }
    if from.len() < dims.len() {
        return Err(Error::autograd(
            "backward",
            format!("a gradient of shape {:?} cannot be summed down to {:?}", from.as_slice(), dims),
        ));
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

/// The input gradients of one node, given its gradient `g`. A gradient may
/// have the broadcast shape the op computed in (Binary, Where, MatMul,
/// Expand): the walk sums it down to the input's shape.
pub(crate) fn input_gradients<'g>(
    op: Op,
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
                UnaryOp::Log1p => one(g.div(x.add(1.0)?)),
                UnaryOp::Expm1 => one(g.mul(x.exp()?)),
                UnaryOp::Softsign => one(g.div(x.abs()?.add(1.0)?.square()?)),
                UnaryOp::Gelu => one(g.mul(x.gelu_derivative()?)),
                // d/dx (Φ + xφ) = 2φ + xφ' = φ · (2 − x²).
                UnaryOp::GeluDerivative => {
                    let density = x.square()?.mul(-0.5)?.exp()?.mul(crate::op::FRAC_1_SQRT_2PI)?;
                    one(g.mul(density.mul(x.square()?.neg()?.add(2.0)?)?))
                }
                UnaryOp::Sign => Err(no_rule(&op)),
            }
        }
        Op::Cast(_) => one(g.cast(x[0].dtype())),
        Op::Binary(b) => {
            let (a, bb) = (x[0], x[1]);
            per_input(needs, |i| match (b, i) {
                (BinaryOp::Add, _) => Ok(g),
                (BinaryOp::Sub, 0) => Ok(g),
                (BinaryOp::Sub, _) => g.neg(),
                (BinaryOp::Mul, 0) => g.mul(bb),
                (BinaryOp::Mul, _) => g.mul(a),
                (BinaryOp::Div, 0) => g.div(bb),
                // −g · (a/b)/b, not −g·a/b²: b² overflows (b = 1e30 in f32)
                // or underflows to 0 (b = 1e-30, and 0/0 is NaN) where the
                // gradient itself is finite (PyTorch divides twice too).
                (BinaryOp::Div, _) => g.mul(a.div(bb)?.div(bb)?)?.neg(),
                // As PyTorch: a zero exponent has a zero gradient for a
                // (not 0 · 0^-1 = NaN at a = 0), and a zero base with a
                // non-negative exponent has a zero gradient for b (not
                // 0 · log 0 = NaN, or 1 · log 0 = −inf at 0^0): a zero in a
                // pow must not poison the whole backward pass.
                (BinaryOp::Pow, 0) => bb.eq(0.0)?.where_(zero()?, g.mul(bb)?.mul(a.pow(bb.sub(1.0)?)?)?),
                (BinaryOp::Pow, _) => {
                    let grad = g.mul(y)?.mul(a.log()?)?;
                    a.eq(0.0)?.where_(bb.ge(0.0)?.where_(zero()?, grad)?, grad)
                }
                // Ties go to the first operand (stated in the docs, tested).
                (BinaryOp::Maximum, 0) => a.ge(bb)?.where_(g, zero()?),
                (BinaryOp::Maximum, _) => a.lt(bb)?.where_(g, zero()?),
                (BinaryOp::Minimum, 0) => a.le(bb)?.where_(g, zero()?),
                (BinaryOp::Minimum, _) => a.gt(bb)?.where_(g, zero()?),
            })
        }
        Op::Where => {
            let c = x[0];
            per_input(needs, |i| match i {
                1 => c.where_(g, zero()?),
                _ => c.where_(zero()?, g),
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
            // A matrix b shared by every batch of a plain a (Linear's weight):
            // its gradient sums aᵀ·g over the batch, which is one product of
            // a and g read as [batch · M, K] and [batch · M, N] (one GEMM
            // with a long contraction, instead of a batched product of short
            // ones and a Sum over the batch). Not in the browser build, whose
            // download budget it would exceed (the batched form gives the
            // same values up to summation order), nor in portable numerics,
            // which must sum in the browser build's order.
            let (ad, bd) = (a.dims(), b.dims());
            if cfg!(not(target_arch = "wasm32"))
                && !ta
                && bd.len() == 2
                && ad.len() > 2
                && needs.get(1) == Some(&true)
                && !a.graph().device().backend().portable_numerics()
            {
                // Rows of a and g: the batch axes times M.
                let rows: usize = ad[..ad.len() - 1].iter().product();
                let flat = |t: Tensor<'g>| -> Result<Tensor<'g>> {
                    let d = t.dims();
                    t.reshape_to(&[rows, d[d.len() - 1]])
                };
                let gb = if tb {
                    flat(g)?.matmul_t(flat(a)?, true, false)?
                } else {
                    flat(a)?.matmul_t(flat(g)?, true, false)?
                };
                let ga = if needs[0] {
                    Some(if tb { g.matmul_t(b, false, false)? } else { g.matmul_t(b, false, true)? })
                } else {
                    None
                };
                return Ok(smallvec![ga, Some(gb)]);
            }
            per_input(needs, |i| match (ta, tb, i) {
                (false, false, 0) => g.matmul_t(b, false, true),
                (false, false, _) => a.matmul_t(g, true, false),
                (false, true, 0) => g.matmul_t(b, false, false),
                (false, true, _) => g.matmul_t(a, true, false),
                (true, false, 0) => b.matmul_t(g, false, true),
                (true, false, _) => a.matmul_t(g, false, false),
                (true, true, 0) => b.matmul_t(g, true, true),
                (true, true, _) => g.matmul_t(a, true, true),
            })
        }
        Op::Reshape => one(g.reshape_to(&x[0].dims())),
        Op::Permute(perm) => one(g.permute(&perm.inverse().to_dims())),
        // g has the expanded shape: the walk sums it down.
        Op::Expand => one(Ok(g)),
        Op::Slice(attr) => one(g.slice_backward_attr(&x[0].dims(), attr)),
        Op::SliceBackward(attr) => one(g.slice_attr(attr, &x[0].dims())),
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
        // The folded layout (rank 2) has a folded adjoint.
        Op::Im2Col(window) => {
            let d = x[0].dims();
            if g.rank() == 2 {
                return one(g.col2im_folded([d[2], d[3]], window));
            }
            one(g.col2im([d[2], d[3]], window))
        }
        Op::Col2Im { window, .. } => {
            if x[0].rank() == 2 {
                return one(g.im2col_folded(window));
            }
            one(g.im2col(window))
        }
        Op::MaxPool2d(window) => one(x[0].max_pool2d_backward(g, window)),
        Op::MaxPool2dBackward(window) => Ok(smallvec![None, Some(max_pool_gather(x[0], g, window)?)]),
        // dx = y · (g - Σ_j g_j y_j): masked entries have y = 0, so they get
        // exactly 0, and the rule is ordinary ops on y (second order works).
        Op::CausalSoftmax { .. } => one(y.mul(g.sub(g.mul(y)?.sum(&[-1], true)?)?)),
        // One row-wise kernel, which recomputes the row statistics from x.
        Op::LayerNorm { eps } => one(x[0].layer_norm_backward(g, eps)),
        Op::LayerNormBackward { eps } => layer_norm_backward_gradients(x[0], x[1], y, g, eps, needs),
        // y_i = Σ_{j ≤ i} x_j (or j < i) gives dx_j = Σ_{i ≥ j} g_i (or
        // i > j): the same running sum, counted from the other end.
        Op::CumSum { axis, exclusive, reverse } => one(g.cumsum(axis as isize, exclusive, !reverse)),
        // The user's backward, checked; only the inputs asked for.
        Op::Custom(c) => {
            let grads = c.gradients(x, y, g)?;
            Ok(grads.into_iter().zip(needs).map(|(g, &need)| if need { g } else { None }).collect())
        }
        Op::Input
        | Op::Param(_)
        | Op::Full(_)
        | Op::Arange { .. }
        | Op::RandUniform { .. }
        | Op::RandNormal { .. }
        | Op::TopK { .. }
        | Op::Compare(_) => Err(no_rule(&op)),
    }
}

/// The gradients of y = LayerNormBackward(x, gy) = r · P(gy), with
/// P(u) = u − mean(u) − x̂ · mean(x̂ · u), x̂ = LayerNorm(x) and
/// r = 1/√(var(x) + eps), given the incoming gradient h. P is symmetric, so
/// gy gets r · P(h) = LayerNormBackward(x, h). x gets
/// −r · (mean(h · y) · x̂ + mean(h · x̂) · y + mean(gy · x̂) · LayerNormBackward(x, h))
/// (differentiate r, x̂ and mean(gy · x̂) through x; docs/performance.md
/// has the derivation). Made of the two primitives and ordinary ops, so it
/// is differentiable again.
fn layer_norm_backward_gradients<'g>(
    x: Tensor<'g>,
    gy: Tensor<'g>,
    y: Tensor<'g>,
    h: Tensor<'g>,
    eps: f64,
    needs: &[bool],
) -> Result<InputGrads<'g>> {
    let ph = x.layer_norm_backward(h, eps)?;
    let dx = if needs[0] {
        let mean = |t: Tensor<'g>| t.mean(&[-1], true);
        let xhat = x.layer_norm_rows(eps)?;
        let centred = x.sub(mean(x)?)?;
        let r = mean(centred.square()?)?.add(eps)?.sqrt()?.recip()?;
        let terms = mean(h.mul(y)?)?.mul(xhat)?.add(mean(h.mul(xhat)?)?.mul(y)?)?.add(mean(gy.mul(xhat)?)?.mul(ph)?)?;
        Some(terms.mul(r)?.neg()?)
    } else {
        None
    };
    Ok(smallvec![dx, needs.get(1).copied().unwrap_or(false).then_some(ph)])
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

pub(crate) fn no_rule(op: &Op) -> Error {
    let why = op.info().no_rule.unwrap_or("no gradient rule is defined");
    Error::autograd(op.name(), format!("cannot differentiate through {}: {why}", op.name()))
}

#[cfg(test)]
mod tests {
    //! The op table against the rules: for every primitive, on its sample
    //! case, the rule exists exactly when the table says so, gives a
    //! gradient to exactly the inputs the table marks differentiable, and
    //! reads exactly the forward values the table marks saved.
    use super::*;
    use crate::coverage::op_case;
    use crate::device::Device;
    use crate::dtype::HostData;
    use crate::graph::Graph;

    #[test]
    fn every_table_entry_agrees_with_its_gradient_rule() {
        let device = Device::cpu();
        let mut checked = 0;
        for kind in Op::kinds() {
            let info = kind.info();
            if kind.is_leaf() {
                assert!(info.no_rule.is_some(), "{}: leaves have no rule", info.name);
                continue;
            }
            let case = op_case(info.name).unwrap_or_else(|| panic!("{} has no sample case", info.name));
            let graph = Graph::new(&device);
            let xs: Vec<Tensor<'_>> = case
                .inputs
                .iter()
                .map(|i| graph.variable_from_host(HostData::F64(i.values.clone()), &i.dims).unwrap())
                .collect();
            let out = (case.build)(&graph, &xs).unwrap();
            let node = (0..=out.id()).map(|id| graph.tensor(id)).find(|t| t.op().name() == info.name).unwrap();
            let op = node.op();
            assert_eq!(op.info(), info, "{}: attributes do not change what an op is", info.name);
            let input_ids = graph.inputs_of(node.id());
            assert!(
                info.arity.accepts(input_ids.len()),
                "{}: arity {:?} vs {} inputs",
                info.name,
                info.arity,
                input_ids.len()
            );
            if let Some(e) = info.elementwise {
                assert_eq!(info.family, crate::op::Family::Elementwise);
                assert!(
                    e.expr.arity() <= input_ids.len(),
                    "{}: the expression reads more operands than it has",
                    info.name
                );
            }
            let inputs: Vec<Tensor<'_>> = input_ids.iter().map(|&i| graph.tensor(i)).collect();
            let needs: Vec<bool> =
                inputs.iter().enumerate().map(|(k, x)| x.requires_grad() && info.differentiable_input(k)).collect();
            let g = graph.ones(&node.dims(), node.dtype()).unwrap();
            let mark = graph.len() as u32;
            let result = input_gradients(op, &inputs, node, g, &needs);
            match (info.no_rule, result) {
                (Some(_), Err(e)) => assert!(e.message().contains("cannot differentiate"), "{e}"),
                (Some(why), Ok(_)) => panic!("{}: the table says no rule ({why}) but the rule answered", info.name),
                (None, Err(e)) => panic!("{}: the rule failed: {e}", info.name),
                (None, Ok(grads)) => {
                    checked += 1;
                    for (k, grad) in grads.iter().enumerate() {
                        assert_eq!(grad.is_some(), needs[k], "{}: gradient of input {k}", info.name);
                    }
                    // Which forward values the new nodes read.
                    let mut read_inputs = 0u8;
                    let mut read_output = false;
                    for id in mark..graph.len() as u32 {
                        for used in graph.inputs_of(id) {
                            if used == node.id() {
                                read_output = true;
                            }
                            for (k, &input) in input_ids.iter().enumerate() {
                                if used == input {
                                    read_inputs |= 1 << k;
                                }
                            }
                        }
                    }
                    let saved = info.saved;
                    assert_eq!(
                        (read_inputs, read_output),
                        (saved.inputs, saved.output),
                        "{}: the rule reads (inputs {read_inputs:b}, output {read_output}) but the table saves \
                         (inputs {:b}, output {})",
                        info.name,
                        saved.inputs,
                        saved.output
                    );
                }
            };
        }
        assert!(checked >= 40, "only {checked} rules checked");
    }
}
