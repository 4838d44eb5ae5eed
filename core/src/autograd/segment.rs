//! Activation checkpointing: trade compute for memory.
//!
//! `checkpoint(f, x)` records `f(x)` as usual (the forward pass needs its
//! value) and then *seals* the nodes `f` made as a segment: none of their
//! values is kept for backward, only the values the segment reads from
//! outside (its inputs, captured tensors; parameters are kept anyway). So
//! after the forward pass the segment's activations are gone.
//!
//! The backward walk meets a segment as one unit. It records a copy of the
//! segment's nodes — same ops, same attributes (a dropout mask's seed
//! included), inputs remapped to the copies — and differentiates the copies
//! with the ordinary gradient rules. The copies are new nodes placed right
//! before the gradient nodes that read them, so the executor recomputes one
//! segment, uses it and frees it before the next segment's recomputation:
//! peak memory holds the segment inputs plus one segment's activations.
//!
//! Because the copies are the same expressions on the same values, and the
//! walk adds fan-out contributions in the same order as without the segment
//! (everything outside first, then the segment's own consumers from the
//! last to the first), the gradients are bit-identical to the run without
//! checkpointing. Second order works because the copies are ordinary,
//! differentiable nodes; nesting works because a segment inside a segment
//! is sealed again inside the copy, and recomputed again when the walk over
//! the copy meets it.

use std::panic::Location;

use crate::small::SmallVec;

use crate::error::{Error, Result};
use crate::graph::{flags, Graph, NodeId, Segment, SlabRange, Tensor, VjpRegion};

/// Run `f(x)` as an activation-checkpointed segment: its intermediate
/// values are not kept for the backward pass, which recomputes them from
/// `x` (and whatever else `f` read from outside) and then differentiates
/// them. Gradients are bit-identical to calling `f(x)` directly.
///
/// ```
/// # use kiln_core::{Device, Graph, autograd::checkpoint};
/// # fn main() -> kiln_core::Result<()> {
/// let graph = Graph::new(&Device::cpu());
/// let x = graph.variable(&[0.5f32, -1.0], &[2])?;
/// let y = checkpoint(|x| x.tanh()?.mul(x)?.exp(), x)?;
/// y.sum_all()?.backward()?;
/// # Ok(())
/// # }
/// ```
#[track_caller]
pub fn checkpoint<'g, F>(f: F, x: Tensor<'g>) -> Result<Tensor<'g>>
where
    F: FnOnce(Tensor<'g>) -> Result<Tensor<'g>>,
{
    let location = Location::caller();
    let outputs = checkpoint_at(|xs| Ok(vec![f(xs[0])?]), &[x], location)?;
    Ok(outputs[0])
}

/// `checkpoint` for a segment of several inputs and outputs.
#[track_caller]
pub fn checkpoint_many<'g, F>(f: F, inputs: &[Tensor<'g>]) -> Result<Vec<Tensor<'g>>>
where
    F: FnOnce(&[Tensor<'g>]) -> Result<Vec<Tensor<'g>>>,
{
    checkpoint_at(f, inputs, Location::caller())
}

fn checkpoint_at<'g, F>(f: F, inputs: &[Tensor<'g>], location: &'static Location<'static>) -> Result<Vec<Tensor<'g>>>
where
    F: FnOnce(&[Tensor<'g>]) -> Result<Vec<Tensor<'g>>>,
{
    const OP: &str = "checkpoint";
    let Some(first) = inputs.first() else {
        return Err(Error::invalid(OP, "a checkpointed segment needs at least one input tensor").at(location));
    };
    let graph = first.graph;
    if inputs.iter().any(|t| !std::ptr::eq(t.graph, graph)) {
        return Err(Error::invalid(OP, "the inputs belong to different graphs").at(location));
    }
    let start = graph.len() as NodeId;
    // An error inside `f` already names its op and location; the nodes made
    // before it stay (ordinary nodes, harmless), since handles to them may
    // exist.
    let outputs = f(inputs)?;
    if outputs.iter().any(|t| !std::ptr::eq(t.graph, graph)) {
        return Err(Error::invalid(OP, "the segment returned a tensor of another graph").at(location));
    }
    if graph.is_grad_enabled() {
        graph.seal_segment(start, graph.len() as NodeId);
    }
    Ok(outputs)
}

impl Graph {
    /// Make nodes `start..end` a checkpointed segment: their values are no
    /// longer kept for backward, the values they read from before `start`
    /// are. Nothing happens for a segment without gradient structure.
    pub(crate) fn seal_segment(&self, start: NodeId, end: NodeId) {
        let mut guard = self.state.borrow_mut();
        let state = &mut *guard;
        let range = start as usize..end as usize;
        let differentiable =
            state.nodes[range.clone()].iter().any(|n| n.flags & flags::REQUIRES_GRAD != 0 && !n.op.is_leaf());
        if !differentiable || state.segments.iter().any(|s| s.start == start && s.end == end) {
            return;
        }
        for id in range {
            let node = state.nodes[id];
            if node.op.is_leaf() {
                continue;
            }
            state.nodes[id].flags &= !flags::SAVED;
            for &input in SlabRange::of(&state.input_slab, node.inputs) {
                let n = &mut state.nodes[input as usize];
                if input < start && !n.op.is_leaf() {
                    n.flags |= flags::SAVED;
                }
            }
        }
        state.segments.push(Segment { start, end });
    }

    /// The outermost units (checkpointed segments and custom-gradient
    /// regions) starting in `lo..hi`, by start, last first.
    pub(crate) fn top_units(&self, lo: NodeId, hi: NodeId) -> SmallVec<[Unit; 8]> {
        let state = self.state.borrow();
        let segments = state.segments.iter().filter(|s| s.start >= lo && s.start < hi).map(|&s| Unit::Segment(s));
        let vjps = state
            .vjps
            .iter()
            .enumerate()
            .filter(|(_, r)| r.start >= lo && r.start < hi)
            .map(|(index, r)| Unit::Vjp { index, start: r.start, end: r.end });
        let mut inside: SmallVec<[Unit; 8]> = segments.chain(vjps).collect();
        // A segment and a region over the same nodes can only come from
        // checkpoint(|x| custom_vjp(..)): the segment is the outer one.
        inside.sort_by_key(|u| (u.start(), std::cmp::Reverse(u.end()), matches!(u, Unit::Vjp { .. })));
        let mut tops: SmallVec<[Unit; 8]> = SmallVec::new();
        for u in inside {
            // Units nest (each one spans the nodes one closure made), so
            // one starting inside the last kept one is inside it.
            if tops.last().is_some_and(|last| u.start() < last.end()) {
                continue;
            }
            tops.push(u);
        }
        tops.reverse();
        tops
    }

    /// A copy of node `id` reading `inputs`: same op, attributes, shape,
    /// dtype, location and gradient requirement. With gradients being
    /// recorded (higher order), the copy keeps what its own rule will read.
    fn record_copy(&self, id: NodeId, inputs: &[NodeId]) -> Result<NodeId> {
        let node = self.node(id);
        let dims = self.dims_of(id);
        let requires = node.flags & flags::REQUIRES_GRAD;
        let copy = self.push_node(node.op, inputs, &dims, node.dtype, requires, node.location)?;
        if requires != 0 && self.is_grad_enabled() {
            let saved = node.op.info().saved;
            for (i, &input) in inputs.iter().enumerate() {
                if saved.inputs & (1 << i) != 0 {
                    self.set_flag(input, flags::SAVED);
                }
            }
            if saved.output {
                self.set_flag(copy, flags::SAVED);
            }
        }
        Ok(copy)
    }
}

/// A part of the graph the backward walk handles as one unit.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Unit {
    Segment(Segment),
    /// Region `index` of the graph's custom-gradient regions.
    Vjp {
        index: usize,
        start: NodeId,
        end: NodeId,
    },
}

impl Unit {
    pub fn start(&self) -> NodeId {
        match *self {
            Unit::Segment(s) => s.start,
            Unit::Vjp { start, .. } => start,
        }
    }
    pub fn end(&self) -> NodeId {
        match *self {
            Unit::Segment(s) => s.end,
            Unit::Vjp { end, .. } => end,
        }
    }
}

/// Differentiate segment `segment`'s nodes below `top` (the walk has
/// reached it from above): every node in it that has received a gradient
/// from outside is a seed. Records the copies, walks them, and leaves in
/// `grads` the contributions to everything outside plus each internal
/// node's total gradient (for `retain_grad` and `Graph::grad`).
pub(super) fn replay_segment(
    graph: &Graph,
    grads: &mut Vec<Option<NodeId>>,
    segment: Segment,
    top: NodeId,
) -> Result<()> {
    let start = segment.start;
    let end = top.min(segment.end);
    let local = |id: NodeId| (id - start) as usize;
    let count = (end - start) as usize;

    // What the seeds need, walking down (inputs have smaller ids).
    let mut needed = vec![false; count];
    let mut any = false;
    for id in start..end {
        if grads[id as usize].is_some() {
            needed[local(id)] = true;
            any = true;
        }
    }
    if !any {
        return Ok(());
    }
    // Custom-gradient regions inside: their backward reads every input and
    // output, so a region with one needed output needs all of them and its
    // inputs (repeat until nothing changes: a region's inputs may feed
    // another region's outputs).
    let regions: SmallVec<[(usize, VjpRegion); 4]> = graph
        .state
        .borrow()
        .vjps
        .iter()
        .enumerate()
        .filter(|(_, r)| r.start >= start && r.end <= segment.end && r.start < end)
        .map(|(i, r)| (i, r.clone()))
        .collect();
    loop {
        for id in (start..end).rev() {
            if !needed[local(id)] || graph.node(id).op.is_leaf() {
                continue;
            }
            for input in graph.inputs_of(id) {
                if input >= start {
                    needed[local(input)] = true;
                }
            }
        }
        let mut changed = false;
        for (_, r) in &regions {
            if !r.outputs.iter().any(|&o| o < end && needed[local(o)]) {
                continue;
            }
            for &n in r.outputs.iter().chain(&r.inputs) {
                if n >= start && n < end && !needed[local(n)] {
                    needed[local(n)] = true;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }

    // Record the copies in id order. Leaves inside the segment (constants,
    // parameters first used there) hold their values: they stand for
    // themselves.
    const NONE: NodeId = NodeId::MAX;
    let first_copy = graph.len() as NodeId;
    let mut copy_of = vec![NONE; count];
    for id in start..end {
        if !needed[local(id)] {
            continue;
        }
        if graph.node(id).op.is_leaf() {
            copy_of[local(id)] = id;
            continue;
        }
        let inputs: SmallVec<[NodeId; 3]> =
            graph.inputs_of(id).iter().map(|&i| if i >= start { copy_of[local(i)] } else { i }).collect();
        debug_assert!(!inputs.contains(&NONE), "inputs of a needed node are needed");
        copy_of[local(id)] = graph.record_copy(id, &inputs)?;
    }
    let end_copy = graph.len() as NodeId;

    // Segments nested in this one become segments of the copy, so the walk
    // below recomputes them again instead of keeping them.
    let nested: SmallVec<[Segment; 8]> = graph
        .state
        .borrow()
        .segments
        .iter()
        .filter(|s| s.start >= start && s.end <= segment.end && **s != segment && s.start < end)
        .copied()
        .collect();
    for inner in nested {
        let copies =
            (inner.start..inner.end.min(end)).map(|id| copy_of[local(id)]).filter(|&c| c != NONE && c >= first_copy);
        let (lo, hi) = copies.fold((NONE, 0), |(lo, hi), c| (lo.min(c), hi.max(c)));
        if lo != NONE {
            graph.seal_segment(lo, hi + 1);
        }
    }

    // Regions inside become regions of the copy, reading the copies.
    for (_, r) in regions {
        let map = |id: NodeId| if id >= start && id < end { copy_of[local(id)] } else { id };
        let copies = (r.start..r.end.min(end)).map(|id| copy_of[local(id)]).filter(|&c| c != NONE && c >= first_copy);
        let (lo, hi) = copies.fold((NONE, 0), |(lo, hi), c| (lo.min(c), hi.max(c)));
        let outputs: SmallVec<[NodeId; 4]> = r.outputs.iter().map(|&o| map(o)).collect();
        if lo == NONE || outputs.contains(&NONE) {
            continue;
        }
        let inputs = r.inputs.iter().map(|&i| map(i)).collect();
        graph.state.borrow_mut().vjps.push(VjpRegion { start: lo, end: hi + 1, inputs, outputs, ..r });
    }

    // The copies start from the gradients gathered outside, then the walk
    // adds the segment's own contributions on top, as it would have.
    grads.resize(graph.len(), None);
    for id in start..end {
        let copy = copy_of[local(id)];
        if copy != NONE && copy != id {
            grads[copy as usize] = grads[id as usize];
        }
    }
    super::walk(graph, grads, first_copy, end_copy)?;
    for id in start..end {
        let copy = copy_of[local(id)];
        if copy != NONE && copy != id {
            grads[id as usize] = grads[copy as usize];
        }
    }
    Ok(())
}
