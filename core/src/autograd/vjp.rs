//! `custom_vjp`: a function built from kiln ops with a gradient written by
//! the user (a straight-through estimator, gradient reversal, a clipped or
//! rescaled gradient, a numerically better formula).
//!
//! The function runs as usual but records no gradient structure of its own
//! (it runs under `no_grad`, so none of its intermediate values is kept for
//! backward); its outputs are marked as requiring grad and the nodes it made
//! become a *region*. The backward walk meets the region as one unit: once
//! every consumer outside has contributed to the outputs' gradients, it
//! calls the user's backward with the inputs, the outputs and those
//! gradients, and adds what it returns into the inputs' gradients. The
//! backward is written with kiln ops, so it is recorded like any gradient
//! rule: under `Graph::grad` it is differentiable again (second order), and
//! on every backend it runs the ordinary kernels.
//!
//! Tensors the function reads from outside its inputs would get no gradient
//! through the region: one that requires grad is refused with an error
//! (pass it as an input). An intermediate made inside and used outside is a
//! constant there, like a detached tensor (return it as an output to
//! differentiate through it).

use std::panic::Location;
use std::rc::Rc;

use crate::small::SmallVec;

use crate::error::{Error, Result};
use crate::graph::{flags, Graph, NodeId, Tensor, VjpRegion};
use crate::op::Op;

const OP: &str = "custom_vjp";

/// The user-written gradient of a `custom_vjp_many` region: given the
/// region's inputs, its outputs and the gradient of each output (zeros for
/// outputs nothing downstream used), the gradient of each input (None: no
/// gradient), each of the input's dims and dtype.
pub trait VjpBackward:
    for<'g> Fn(&[Tensor<'g>], &[Tensor<'g>], &[Tensor<'g>]) -> Result<Vec<Option<Tensor<'g>>>> + 'static
{
}

impl<F> VjpBackward for F where
    F: for<'g> Fn(&[Tensor<'g>], &[Tensor<'g>], &[Tensor<'g>]) -> Result<Vec<Option<Tensor<'g>>>> + 'static
{
}

/// `y = f(x)` with the gradient `backward(x, y, dy)` instead of the one
/// kiln would derive from `f`'s ops. `backward` returns dx (x's dims and
/// dtype); written with kiln ops, it is differentiable again.
///
/// ```
/// # use kiln_core::{Device, Graph, autograd::custom_vjp};
/// # fn main() -> kiln_core::Result<()> {
/// let graph = Graph::new(&Device::cpu());
/// let x = graph.variable(&[0.4f32, -1.5], &[2])?;
/// // Straight-through sign: forward sign(x), backward the gradient itself
/// // where |x| <= 1 (sign alone has no gradient).
/// let y = custom_vjp(|x| x.sign(), x, |x, _y, dy| x.abs()?.le(1.0)?.where_(dy, 0.0))?;
/// y.sum_all()?.backward()?;
/// let dx: Vec<f32> = pollster::block_on(x.grad().unwrap().to_vec())?;
/// assert_eq!(dx, vec![1.0, 0.0]);
/// # Ok(())
/// # }
/// ```
#[track_caller]
pub fn custom_vjp<'g, F, B>(f: F, x: Tensor<'g>, backward: B) -> Result<Tensor<'g>>
where
    F: FnOnce(Tensor<'g>) -> Result<Tensor<'g>>,
    B: for<'a> Fn(Tensor<'a>, Tensor<'a>, Tensor<'a>) -> Result<Tensor<'a>> + 'static,
{
    let location = Location::caller();
    let many = as_vjp(move |xs, ys, gs| Ok(vec![Some(backward(xs[0], ys[0], gs[0])?)]));
    let outputs = custom_vjp_at(|xs| Ok(vec![f(xs[0])?]), &[x], Rc::new(many), location)?;
    Ok(outputs[0])
}

/// `custom_vjp` for several inputs and outputs: `backward(inputs, outputs,
/// output_grads)` returns one entry per input.
#[track_caller]
pub fn custom_vjp_many<'g, F, B>(f: F, inputs: &[Tensor<'g>], backward: B) -> Result<Vec<Tensor<'g>>>
where
    F: FnOnce(&[Tensor<'g>]) -> Result<Vec<Tensor<'g>>>,
    B: for<'a> Fn(&[Tensor<'a>], &[Tensor<'a>], &[Tensor<'a>]) -> Result<Vec<Option<Tensor<'a>>>> + 'static,
{
    custom_vjp_at(f, inputs, Rc::new(backward), Location::caller())
}

/// Gives a closure the higher-ranked signature of a `VjpBackward`.
fn as_vjp<B>(backward: B) -> B
where
    B: for<'a> Fn(&[Tensor<'a>], &[Tensor<'a>], &[Tensor<'a>]) -> Result<Vec<Option<Tensor<'a>>>>,
{
    backward
}

fn custom_vjp_at<'g, F>(
    f: F,
    inputs: &[Tensor<'g>],
    backward: Rc<dyn VjpBackward>,
    location: &'static Location<'static>,
) -> Result<Vec<Tensor<'g>>>
where
    F: FnOnce(&[Tensor<'g>]) -> Result<Vec<Tensor<'g>>>,
{
    let Some(first) = inputs.first() else {
        return Err(Error::invalid(OP, "a custom_vjp function needs at least one input tensor").at(location));
    };
    let graph = first.graph;
    if inputs.iter().any(|t| !std::ptr::eq(t.graph, graph)) {
        return Err(Error::invalid(OP, "the inputs belong to different graphs").at(location));
    }
    let tracked = graph.is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
    let start = graph.len() as NodeId;
    // The function's own gradient structure is never used: record none.
    let outputs = {
        let _no_grad = graph.set_grad_enabled(false);
        f(inputs)?
    };
    if outputs.is_empty() {
        return Err(Error::invalid(OP, "the function returned no tensor").at(location));
    }
    if outputs.iter().any(|t| !std::ptr::eq(t.graph, graph)) {
        return Err(Error::invalid(OP, "the function returned a tensor of another graph").at(location));
    }
    if !tracked {
        return Ok(outputs);
    }
    let input_ids: SmallVec<[NodeId; 4]> = inputs.iter().map(|t| t.id).collect();
    check_captures(graph, start, &input_ids, location)?;
    // Every output is a node of the region, once: an input returned as it
    // is, or a tensor returned twice, gets a copy of its own.
    let mut output_ids: SmallVec<[NodeId; 4]> = SmallVec::new();
    for t in &outputs {
        let id = if t.id < start || output_ids.contains(&t.id) {
            let _no_grad = graph.set_grad_enabled(false);
            graph.record(Op::Reshape, &[t.id], &t.dims(), t.dtype(), location)?.id
        } else {
            t.id
        };
        output_ids.push(id);
    }
    let end = graph.len() as NodeId;
    {
        let mut state = graph.state.borrow_mut();
        // The backward reads inputs and outputs; nothing inside is kept for
        // a rule of its own (the function ran without recording any).
        for &id in &input_ids {
            state.nodes[id as usize].flags |= flags::SAVED;
        }
        for &id in &output_ids {
            let node = &mut state.nodes[id as usize];
            node.flags |= flags::SAVED;
            if node.dtype.is_float() {
                node.flags |= flags::REQUIRES_GRAD;
            }
        }
        state.vjps.push(VjpRegion { start, end, inputs: input_ids, outputs: output_ids.clone(), backward, location });
    }
    Ok(output_ids.iter().map(|&id| graph.tensor(id)).collect())
}

/// Refuse what would silently get no gradient: a tensor from outside that
/// requires grad but is not an input, and a trainable parameter first used
/// inside (its leaf was made without gradient).
fn check_captures(graph: &Graph, start: NodeId, inputs: &[NodeId], location: &'static Location<'static>) -> Result<()> {
    let state = graph.state.borrow();
    for id in start as usize..state.nodes.len() {
        let node = state.nodes[id];
        if let Op::Param(index) = node.op {
            let param = &state.params[index as usize].0;
            if param.requires_grad() {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "the function uses parameter '{}', which would get no gradient through a custom_vjp; \
                         use it outside and pass the tensor as an input",
                        param.name()
                    ),
                )
                .at(location));
            }
        }
        for &input in crate::graph::SlabRange::of(&state.input_slab, node.inputs) {
            let n = &state.nodes[input as usize];
            if input < start && n.flags & flags::REQUIRES_GRAD != 0 && !inputs.contains(&input) {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "the function reads tensor #{input} ({}), which requires grad but is not one of its \
                         inputs; pass it as an input so that the backward can give it a gradient",
                        n.op.name()
                    ),
                )
                .at(location));
            }
        }
    }
    Ok(())
}

/// Differentiate region `index` (the walk has reached it from `top`, the
/// id above the highest node it can have given a gradient): call the
/// user's backward with the outputs' gradients and add what it returns
/// into the inputs' gradients.
pub(super) fn apply_vjp(graph: &Graph, grads: &mut [Option<NodeId>], index: usize, top: NodeId) -> Result<()> {
    let region = graph.state.borrow().vjps[index].clone();
    let location = region.location;
    let end = top.min(region.end);
    for id in region.start..end {
        if grads[id as usize].is_some() && !region.outputs.contains(&id) {
            return Err(Error::invalid(
                OP,
                format!(
                    "tensor #{id} ({}) was made inside the custom_vjp function and used outside it; return it \
                     as an output of the function",
                    graph.node(id).op.name()
                ),
            )
            .at(location));
        }
    }
    if region.outputs.iter().all(|&o| grads.get(o as usize).copied().flatten().is_none()) {
        return Ok(());
    }
    let inputs: SmallVec<[Tensor<'_>; 4]> = region.inputs.iter().map(|&i| graph.tensor(i)).collect();
    let outputs: SmallVec<[Tensor<'_>; 4]> = region.outputs.iter().map(|&o| graph.tensor(o)).collect();
    let output_grads = outputs
        .iter()
        .map(|o| match grads.get(o.id as usize).copied().flatten() {
            Some(g) => Ok(graph.tensor(g)),
            None => graph.zeros(&o.dims(), o.dtype()),
        })
        .collect::<Result<SmallVec<[Tensor<'_>; 4]>>>()?;
    let returned = (region.backward)(&inputs, &outputs, &output_grads).map_err(|e| e.at(location))?;
    check_backward_gradients(OP, &inputs, &returned).map_err(|e| e.at(location))?;
    for (x, g) in inputs.iter().zip(returned) {
        let Some(g) = g else { continue };
        if !x.requires_grad() {
            continue;
        }
        let slot = &mut grads[x.id as usize];
        *slot = Some(match *slot {
            None => g.id,
            #[cfg(not(target_arch = "wasm32"))]
            Some(previous) => super::accumulate::accumulate(graph, previous, g)?,
            #[cfg(target_arch = "wasm32")]
            Some(previous) => graph.tensor(previous).add(g)?.id,
        });
    }
    Ok(())
}

/// What a user-written backward (a `custom_vjp` region's or a custom op's)
/// returned, checked against its inputs: one entry per input, each None or a
/// tensor of the same graph, dims and dtype as that input. Errors name `op`.
pub(crate) fn check_backward_gradients(
    op: &'static str,
    inputs: &[Tensor<'_>],
    grads: &[Option<Tensor<'_>>],
) -> Result<()> {
    if grads.len() != inputs.len() {
        return Err(Error::autograd(
            op,
            format!("the backward returned {} gradients for {} inputs", grads.len(), inputs.len()),
        ));
    }
    for (k, (g, x)) in grads.iter().zip(inputs).enumerate() {
        let Some(g) = g else { continue };
        if !std::ptr::eq(g.graph, x.graph) {
            return Err(Error::invalid(op, format!("the backward's gradient of input {k} belongs to another graph")));
        }
        if g.dims() != x.dims() || g.dtype() != x.dtype() {
            return Err(Error::shape(
                op,
                format!(
                    "the backward's gradient of input {k} is {:?} {} but the input is {:?} {}",
                    g.dims().as_slice(),
                    g.dtype(),
                    x.dims().as_slice(),
                    x.dtype()
                ),
            ));
        }
    }
    Ok(())
}
