//! The graph arena and tensor handles.
//!
//! A `Graph` records one step's computation as plain-data nodes in a `Vec`,
//! with side slabs for inputs and dimensions (an op's attributes live in the
//! `Op` itself). Nodes are created in
//! dependency order, so a node's id is already a topological position: every
//! walk (scheduling, differentiation, freeing) is a loop over ids, never a
//! recursion. Building a node checks and infers its shape and dtype at once;
//! nothing runs until a value is read, `realize`d or differentiated.
//!
//! `Tensor<'g>` borrows the graph, so `Graph::reset(&mut self)` cannot run
//! while any handle is alive: a stale handle is a compile error.
//!
//! ```compile_fail
//! use kiln_core::{Device, Graph};
//! let mut graph = Graph::new(&Device::cpu());
//! let x = graph.tensor_from(&[1.0f32, 2.0], &[2]).unwrap();
//! graph.reset(); // error[E0502]: `graph` is still borrowed by `x`
//! let _ = x.exp();
//! ```

use std::cell::{Cell, RefCell};
use std::panic::Location;

use crate::backend::BufferId;
use crate::device::Device;
use crate::dtype::{DType, Element, HostData};
use crate::error::{Error, Result};
use crate::op::Op;
use crate::param::Param;
use crate::shape::{check_shape, fmt_dims, Dims, MAX_RANK};

pub type NodeId = u32;

/// A half-open range into one of the graph's slabs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlabRange {
    pub start: u32,
    pub len: u32,
}

impl SlabRange {
    pub(crate) fn of<T>(slab: &[T], range: SlabRange) -> &[T] {
        &slab[range.start as usize..(range.start + range.len) as usize]
    }
}

pub(crate) mod flags {
    /// The node's value depends on something that requires grad.
    pub const REQUIRES_GRAD: u8 = 1;
    /// A gradient rule of a consumer reads this value: keep it after the
    /// forward pass until the backward pass has used it.
    pub const SAVED: u8 = 2;
    /// Keep this intermediate's gradient after backward (`retain_grad`).
    pub const RETAIN_GRAD: u8 = 4;
    /// A leaf made with `Graph::variable`: its gradient is kept.
    pub const VARIABLE: u8 = 8;
    /// The user asked for this value (`realize`, `to_vec`, `item`): later
    /// executions that consume it do not free it, so a value read before an
    /// optimizer step stays readable after it.
    pub const REQUESTED: u8 = 16;
}

/// One node: what it computes and what it looks like. Plain `Copy` data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub op: Op,
    pub inputs: SlabRange,
    pub dims: SlabRange,
    pub dtype: DType,
    pub flags: u8,
    /// Where the user's code made this node; errors found when it runs point
    /// there.
    pub location: &'static Location<'static>,
}

/// Everything a graph holds. Borrowed mutably only inside graph methods,
/// never across a call into user code.
pub(crate) struct GraphState {
    pub nodes: Vec<Node>,
    pub input_slab: Vec<NodeId>,
    pub dims_slab: Vec<usize>,
    /// The buffer holding each node's value, if it has been computed.
    pub values: Vec<Option<BufferId>>,
    /// Nodes whose buffer the graph owns, in the order they were computed
    /// (entries whose value was freed since are skipped on reset).
    pub owned: Vec<NodeId>,
    /// Parameters used in this graph, with their leaf node, the parameter
    /// version seen when the leaf was made, and that version's buffer (held,
    /// so an optimizer step copies on write instead of changing it under
    /// the graph).
    pub params: Vec<(Param, NodeId, u64, std::rc::Rc<crate::param::ValueBuffer>)>,
    /// Gradients kept after backward: leaf variables and retained nodes.
    pub kept_grads: Vec<(NodeId, NodeId)>,
    /// A backward pass has consumed the saved values of this graph.
    pub differentiated: bool,
    /// Activation-checkpointed segments (see `autograd::segment`), in
    /// the order they were sealed.
    pub segments: Vec<Segment>,
    /// Regions with a user-written gradient (`autograd::custom_vjp`), in
    /// the order they were recorded.
    pub vjps: Vec<VjpRegion>,
    /// Buffers held by more than one node (a Reshape shares its input's
    /// buffer, see `exec`), with how many holders beyond the first: a
    /// buffer goes back to the pool when its last holder lets go. Few at a
    /// time (a list, not a map).
    pub shared: Vec<(BufferId, u32)>,
    /// Executor scratch, reused between executions.
    pub scratch_uses: Vec<u32>,
    pub scratch_marks: Vec<u8>,
    pub scratch_order: Vec<NodeId>,
}

/// A lazy computation graph for one step. See the module docs.
pub struct Graph {
    device: Device,
    pub(crate) state: RefCell<GraphState>,
    grad_enabled: Cell<bool>,
    /// Unique per graph in this process: a `TensorId` of another graph is
    /// refused.
    identity: u32,
    /// Incremented by every `reset`: a `TensorId` from an earlier step is
    /// refused.
    generation: Cell<u64>,
}

/// A tensor of a graph named without borrowing it: which graph, which step
/// (reset generation) and which node. `Graph::tensor_by_id` turns it back
/// into a `Tensor`, or refuses it with an error once the graph has been
/// reset (or for another graph), so a binding that holds tensors across
/// calls (JavaScript) never reads a node of a later step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorId {
    graph: u32,
    node: NodeId,
    generation: u64,
}

impl TensorId {
    /// The node's index in its graph.
    pub fn node(&self) -> NodeId {
        self.node
    }
    /// The reset generation of the graph when the id was made.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// Source of `Graph::identity`.
static NEXT_GRAPH: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A handle to one node of a graph. Cheap to copy; cannot outlive a reset.
#[derive(Clone, Copy)]
pub struct Tensor<'g> {
    pub(crate) graph: &'g Graph,
    pub(crate) id: NodeId,
}

/// Restores the previous grad mode when dropped (see `Graph::no_grad`).
pub struct NoGradGuard<'g> {
    graph: &'g Graph,
    previous: bool,
}

impl Drop for NoGradGuard<'_> {
    fn drop(&mut self) {
        self.graph.grad_enabled.set(self.previous);
    }
}

/// An activation-checkpointed segment: the nodes with ids in
/// `start..end`. Their values are not kept for backward; the backward walk
/// records copies of them from the segment's inputs and differentiates the
/// copies (see `autograd::segment`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub start: NodeId,
    pub end: NodeId,
}

/// A region with a user-written gradient: the nodes with ids in
/// `start..end` compute `outputs` from `inputs`; the backward walk does not
/// differentiate them but calls `backward` (see `autograd::vjp`).
#[derive(Clone)]
pub(crate) struct VjpRegion {
    pub start: NodeId,
    pub end: NodeId,
    pub inputs: crate::small::SmallVec<[NodeId; 4]>,
    pub outputs: crate::small::SmallVec<[NodeId; 4]>,
    pub backward: std::rc::Rc<dyn crate::autograd::VjpBackward>,
    /// The `custom_vjp` call, for errors found when the backward runs.
    pub location: &'static Location<'static>,
}

/// Lengths of every arena, so a failed multi-node construction (a backward
/// pass) can be rolled back exactly.
#[derive(Clone, Copy)]
pub(crate) struct GraphMark {
    nodes: usize,
    inputs: usize,
    dims: usize,
    params: usize,
    segments: usize,
    vjps: usize,
}

impl Graph {
    pub fn new(device: &Device) -> Graph {
        Graph {
            device: device.clone(),
            state: RefCell::new(GraphState {
                nodes: Vec::new(),
                input_slab: Vec::new(),
                dims_slab: Vec::new(),
                values: Vec::new(),
                owned: Vec::new(),
                params: Vec::new(),
                kept_grads: Vec::new(),
                differentiated: false,
                segments: Vec::new(),
                vjps: Vec::new(),
                scratch_uses: Vec::new(),
                scratch_marks: Vec::new(),
                scratch_order: Vec::new(),
                shared: Vec::new(),
            }),
            grad_enabled: Cell::new(true),
            identity: NEXT_GRAPH.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            generation: Cell::new(0),
        }
    }

    /// The tensor `id` names, if it belongs to this graph and was made since
    /// the last `reset`; otherwise an error saying which of the two failed.
    pub fn tensor_by_id(&self, id: TensorId) -> Result<Tensor<'_>> {
        if id.graph != self.identity {
            return Err(Error::invalid("tensor_by_id", "the tensor belongs to another graph"));
        }
        if id.generation != self.generation.get() {
            return Err(Error::invalid(
                "tensor_by_id",
                format!(
                    "the tensor is from step {} of this graph, which has been reset since (now at step {}); \
                     tensors do not survive a reset",
                    id.generation,
                    self.generation.get()
                ),
            ));
        }
        if id.node as usize >= self.len() {
            return Err(Error::invalid("tensor_by_id", format!("node {} does not exist in this graph", id.node)));
        }
        Ok(self.tensor(id.node))
    }

    /// How many times this graph has been reset.
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Number of nodes recorded so far.
    pub fn len(&self) -> usize {
        self.state.borrow().nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Start a fresh step: every intermediate buffer goes back to the pool
    /// and the arenas are emptied (their capacity is kept). Requires `&mut`,
    /// so no `Tensor` of this graph can be alive.
    pub fn reset(&mut self) {
        let device = self.device.clone();
        let state = self.state.get_mut();
        release_owned_from(&device, state, 0);
        debug_assert!(state.shared.is_empty(), "a shared buffer outlived every node holding it");
        state.shared.clear();
        state.nodes.clear();
        state.input_slab.clear();
        state.dims_slab.clear();
        state.values.clear();
        state.owned.clear();
        state.params.clear();
        state.kept_grads.clear();
        state.segments.clear();
        state.vjps.clear();
        state.differentiated = false;
        self.grad_enabled.set(true);
        self.generation.set(self.generation.get() + 1);
    }

    /// Whether new nodes record gradient structure.
    pub fn is_grad_enabled(&self) -> bool {
        self.grad_enabled.get()
    }

    /// Record no gradient structure until the guard is dropped:
    /// `let _guard = graph.no_grad();`.
    pub fn no_grad(&self) -> NoGradGuard<'_> {
        let previous = self.grad_enabled.replace(false);
        NoGradGuard { graph: self, previous }
    }

    pub(crate) fn set_grad_enabled(&self, enabled: bool) -> NoGradGuard<'_> {
        let previous = self.grad_enabled.replace(enabled);
        NoGradGuard { graph: self, previous }
    }

    /// Run `f` with gradient recording off.
    pub fn with_no_grad<R>(&self, f: impl FnOnce() -> R) -> R {
        let _guard = self.no_grad();
        f()
    }

    pub(crate) fn tensor(&self, id: NodeId) -> Tensor<'_> {
        Tensor { graph: self, id }
    }

    // ----- creation --------------------------------------------------------

    /// A constant tensor from host data (uploaded now).
    #[track_caller]
    pub fn tensor_from<T: Element>(&self, data: &[T], dims: &[usize]) -> Result<Tensor<'_>> {
        self.host_tensor(T::into_host(data.to_vec()), dims, false, Location::caller())
    }

    /// A constant tensor from tagged host data.
    #[track_caller]
    pub fn from_host(&self, data: HostData, dims: &[usize]) -> Result<Tensor<'_>> {
        self.host_tensor(data, dims, false, Location::caller())
    }

    /// A leaf that requires grad and keeps its gradient after `backward`
    /// (read it with `Tensor::grad`). Float data only.
    #[track_caller]
    pub fn variable<T: Element>(&self, data: &[T], dims: &[usize]) -> Result<Tensor<'_>> {
        self.variable_from_host(T::into_host(data.to_vec()), dims)
    }

    #[track_caller]
    pub fn variable_from_host(&self, data: HostData, dims: &[usize]) -> Result<Tensor<'_>> {
        if !data.dtype().is_float() {
            return Err(Error::dtype(
                "variable",
                format!("only floating-point tensors can require grad, got {}", data.dtype()),
            ));
        }
        self.host_tensor(data, dims, true, Location::caller())
    }

    fn host_tensor(
        &self,
        data: HostData,
        dims: &[usize],
        variable: bool,
        location: &'static Location<'static>,
    ) -> Result<Tensor<'_>> {
        let expected = check_shape("Input", dims, data.dtype()).map_err(|e| e.at(location))?;
        if data.len() != expected {
            return Err(Error::shape(
                "Input",
                format!("{} values given for shape {} ({} elements)", data.len(), fmt_dims(dims), expected),
            )
            .at(location));
        }
        let buffer = self.device.upload(&data).map_err(|e| e.at(location))?;
        let flags = if variable { flags::REQUIRES_GRAD | flags::VARIABLE } else { 0 };
        let id = self.push_node(Op::Input, &[], dims, data.dtype(), flags, location)?;
        let mut state = self.state.borrow_mut();
        state.values[id as usize] = Some(buffer);
        state.owned.push(id);
        Ok(self.tensor(id))
    }

    /// A constant leaf holding `buffer` (taken from the pool; the graph owns
    /// it from now on and gives it back on reset).
    pub(crate) fn owned_leaf(
        &self,
        buffer: BufferId,
        dims: &[usize],
        dtype: DType,
        location: &'static Location<'static>,
    ) -> Result<Tensor<'_>> {
        let id = self.push_node(Op::Input, &[], dims, dtype, 0, location)?;
        let mut state = self.state.borrow_mut();
        state.values[id as usize] = Some(buffer);
        state.owned.push(id);
        Ok(self.tensor(id))
    }

    /// A constant leaf reading `buffer` in place, which the graph does not
    /// own: the caller keeps the buffer alive and unchanged for as long as
    /// the graph lives (internal use with a graph local to one function).
    pub(crate) fn borrowed_leaf(
        &self,
        buffer: BufferId,
        dims: &[usize],
        dtype: DType,
        location: &'static Location<'static>,
    ) -> Result<Tensor<'_>> {
        let id = self.push_node(Op::Input, &[], dims, dtype, 0, location)?;
        self.state.borrow_mut().values[id as usize] = Some(buffer);
        Ok(self.tensor(id))
    }

    /// Take a computed value's buffer out of the graph (the caller owns it
    /// now; the node reads as not computed). None for leaves, whose buffers
    /// the graph does not own, and for values not computed.
    pub(crate) fn take_value(&self, id: NodeId) -> Option<BufferId> {
        let mut state = self.state.borrow_mut();
        let node = state.nodes[id as usize];
        if node.op.is_leaf() {
            return None;
        }
        let buffer = state.values[id as usize]?;
        if !state.is_shared(buffer) {
            return state.values[id as usize].take();
        }
        // Another node still reads the buffer: hand out a copy.
        let len: usize = SlabRange::of(&state.dims_slab, node.dims).iter().product();
        let copy = self.device.take_buffer(node.dtype, len).ok()?;
        if self.device.backend().copy(buffer, copy, node.dtype, len).is_err() {
            self.device.give_back(copy, node.dtype, len);
            return None;
        }
        state.release_value(&self.device, id);
        Some(copy)
    }

    /// A tensor of `dims` filled with `value`.
    #[track_caller]
    pub fn full(&self, dims: &[usize], value: f64, dtype: DType) -> Result<Tensor<'_>> {
        check_rank("Full", dims)?;
        Ok(self.tensor(self.push_node(Op::Full(value), &[], dims, dtype, 0, Location::caller())?))
    }

    #[track_caller]
    pub fn zeros(&self, dims: &[usize], dtype: DType) -> Result<Tensor<'_>> {
        self.full(dims, 0.0, dtype)
    }

    #[track_caller]
    pub fn ones(&self, dims: &[usize], dtype: DType) -> Result<Tensor<'_>> {
        self.full(dims, 1.0, dtype)
    }

    /// A rank-0 tensor.
    #[track_caller]
    pub fn scalar(&self, value: f64, dtype: DType) -> Result<Tensor<'_>> {
        self.full(&[], value, dtype)
    }

    /// `len` values start, start + step, ... as a 1-D tensor.
    #[track_caller]
    pub fn arange(&self, start: f64, step: f64, len: usize, dtype: DType) -> Result<Tensor<'_>> {
        if dtype == DType::Bool {
            return Err(Error::dtype("Arange", "bool is not a numeric dtype"));
        }
        if !start.is_finite() || !step.is_finite() {
            return Err(Error::invalid("Arange", format!("start {start} and step {step} must be finite")));
        }
        Ok(self.tensor(self.push_node(Op::Arange { start, step }, &[], &[len], dtype, 0, Location::caller())?))
    }

    /// Use a parameter in this graph: a leaf that refers to the parameter's
    /// persistent buffer (no copy). Using the same parameter twice returns
    /// the same leaf.
    #[track_caller]
    pub fn param(&self, param: &Param) -> Result<Tensor<'_>> {
        if !param.device().same(&self.device) {
            return Err(Error::invalid(
                "Param",
                format!(
                    "parameter '{}' lives on device #{} ({}) but this graph runs on device #{} ({}); \
                     build the graph with Graph::new(param.device())",
                    param.name(),
                    param.device().id(),
                    param.device().name(),
                    self.device.id(),
                    self.device.name()
                ),
            ));
        }
        let requires = param.requires_grad() && self.is_grad_enabled();
        {
            let state = self.state.borrow();
            let mut stale = false;
            for (p, id, seen, _) in &state.params {
                if p.same(param) && state.nodes[*id as usize].flags & flags::REQUIRES_GRAD == (requires as u8) {
                    if *seen == param.version() {
                        return Ok(self.tensor(*id));
                    }
                    stale = true;
                }
            }
            // The graph's leaf holds older values. A trained parameter would
            // mix two versions of the model in one gradient: refuse. State
            // that gets no gradient (running statistics, caches) simply gets
            // a leaf for its new version.
            if stale && requires {
                return Err(Error::invalid(
                    "Param",
                    format!(
                        "parameter '{}' was updated after this graph used it; build the next step in a new \
                         (or reset) graph",
                        param.name()
                    ),
                ));
            }
        }
        let index = self.state.borrow().params.len() as u32;
        let dims = param.dims();
        let flag = if requires { flags::REQUIRES_GRAD } else { 0 };
        let id = self.push_node(Op::Param(index), &[], &dims, param.dtype(), flag, Location::caller())?;
        let mut state = self.state.borrow_mut();
        let snapshot = param.value_snapshot();
        state.values[id as usize] = Some(snapshot.id);
        state.params.push((param.clone(), id, param.version(), snapshot));
        Ok(self.tensor(id))
    }

    // ----- node plumbing ---------------------------------------------------

    /// Append a node. Callers have validated the operands; this checks the
    /// result's shape (rank, element count and byte size within kiln's
    /// limits, see `shape::check_shape`), the one check every node passes.
    pub(crate) fn push_node(
        &self,
        op: Op,
        inputs: &[NodeId],
        dims: &[usize],
        dtype: DType,
        flags: u8,
        location: &'static Location<'static>,
    ) -> Result<NodeId> {
        check_shape(op.name(), dims, dtype).map_err(|e| e.at(location))?;
        let mut state = self.state.borrow_mut();
        let id = state.nodes.len() as NodeId;
        let inputs_range = SlabRange { start: state.input_slab.len() as u32, len: inputs.len() as u32 };
        state.input_slab.extend_from_slice(inputs);
        let dims_range = SlabRange { start: state.dims_slab.len() as u32, len: dims.len() as u32 };
        state.dims_slab.extend_from_slice(dims);
        state.nodes.push(Node { op, inputs: inputs_range, dims: dims_range, dtype, flags, location });
        state.values.push(None);
        Ok(id)
    }

    pub(crate) fn mark(&self) -> GraphMark {
        let state = self.state.borrow();
        GraphMark {
            nodes: state.nodes.len(),
            inputs: state.input_slab.len(),
            dims: state.dims_slab.len(),
            params: state.params.len(),
            segments: state.segments.len(),
            vjps: state.vjps.len(),
        }
    }

    /// Drop every node made after `mark`, returning their buffers.
    pub(crate) fn rollback(&self, mark: GraphMark) {
        let mut state = self.state.borrow_mut();
        let state = &mut *state;
        release_owned_from(&self.device, state, mark.nodes as NodeId);
        state.nodes.truncate(mark.nodes);
        state.values.truncate(mark.nodes);
        state.input_slab.truncate(mark.inputs);
        state.dims_slab.truncate(mark.dims);
        state.params.truncate(mark.params);
        state.segments.truncate(mark.segments);
        state.vjps.truncate(mark.vjps);
        state.kept_grads.retain(|&(a, b)| (a as usize) < mark.nodes && (b as usize) < mark.nodes);
    }

    pub(crate) fn node(&self, id: NodeId) -> Node {
        self.state.borrow().nodes[id as usize]
    }

    pub(crate) fn dims_of(&self, id: NodeId) -> Dims {
        let state = self.state.borrow();
        Dims::from_slice(SlabRange::of(&state.dims_slab, state.nodes[id as usize].dims))
    }

    pub(crate) fn inputs_of(&self, id: NodeId) -> crate::small::SmallVec<[NodeId; 3]> {
        let state = self.state.borrow();
        crate::small::SmallVec::from_slice(SlabRange::of(&state.input_slab, state.nodes[id as usize].inputs))
    }

    /// The buffer holding a node's value, if computed.
    pub(crate) fn value_buffer(&self, id: NodeId) -> Option<BufferId> {
        self.state.borrow().values.get(id as usize).copied().flatten()
    }

    pub(crate) fn set_flag(&self, id: NodeId, flag: u8) {
        self.state.borrow_mut().nodes[id as usize].flags |= flag;
    }

    /// How many nodes of this graph carry the given op name; tests use it to
    /// prove that frozen parameters get no backward nodes.
    pub fn count_ops(&self, name: &str) -> usize {
        self.state.borrow().nodes.iter().filter(|n| n.op.name() == name).count()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let device = self.device.clone();
        release_owned_from(&device, self.state.get_mut(), 0);
    }
}

/// Give back every owned buffer of nodes with id >= `from`.
fn release_owned_from(device: &Device, state: &mut GraphState, from: NodeId) {
    let owned = std::mem::take(&mut state.owned);
    let mut kept = Vec::new();
    for &id in &owned {
        if id < from {
            kept.push(id);
            continue;
        }
        state.release_value(device, id);
    }
    state.owned = kept;
}

impl GraphState {
    /// Whether more than one node holds `buffer`.
    pub(crate) fn is_shared(&self, buffer: BufferId) -> bool {
        self.shared.iter().any(|&(b, _)| b == buffer)
    }

    /// Let node `id` hold the value of node `source` (computed) as well:
    /// the buffer stays until both have let go. Returns the buffer.
    pub(crate) fn share_value(&mut self, id: NodeId, source: NodeId) -> Option<BufferId> {
        let buffer = self.values[source as usize]?;
        match self.shared.iter_mut().find(|(b, _)| *b == buffer) {
            Some((_, extra)) => *extra += 1,
            None => self.shared.push((buffer, 1)),
        }
        self.values[id as usize] = Some(buffer);
        self.owned.push(id);
        Some(buffer)
    }

    /// Node `id` lets go of its value: the buffer goes back to the pool
    /// unless another node still holds it. Returns whether it had a value.
    pub(crate) fn release_value(&mut self, device: &Device, id: NodeId) -> bool {
        let Some(buffer) = self.values[id as usize].take() else { return false };
        if let Some(i) = self.shared.iter().position(|&(b, _)| b == buffer) {
            self.shared[i].1 -= 1;
            if self.shared[i].1 == 0 {
                self.shared.swap_remove(i);
            }
            return true;
        }
        let node = self.nodes[id as usize];
        let len = SlabRange::of(&self.dims_slab, node.dims).iter().product();
        device.give_back(buffer, node.dtype, len);
        true
    }
}

#[track_caller]
pub(crate) fn check_rank(op: &'static str, dims: &[usize]) -> Result<()> {
    if dims.len() > MAX_RANK {
        return Err(Error::shape(op, format!("rank {} exceeds kiln's maximum of {MAX_RANK}", dims.len())));
    }
    Ok(())
}

impl<'g> Tensor<'g> {
    pub fn graph(&self) -> &'g Graph {
        self.graph
    }
    pub fn id(&self) -> NodeId {
        self.id
    }
    /// A checked handle to this tensor that does not borrow the graph (see
    /// `Graph::tensor_by_id`): for bindings that keep tensors across calls.
    pub fn tensor_id(&self) -> TensorId {
        TensorId { graph: self.graph.identity, generation: self.graph.generation.get(), node: self.id }
    }
    pub fn dims(&self) -> Dims {
        self.graph.dims_of(self.id)
    }
    pub fn rank(&self) -> usize {
        self.graph.state.borrow().nodes[self.id as usize].dims.len as usize
    }
    pub fn numel(&self) -> usize {
        self.dims().iter().product()
    }
    pub fn dtype(&self) -> DType {
        self.graph.state.borrow().nodes[self.id as usize].dtype
    }
    pub fn requires_grad(&self) -> bool {
        self.graph.state.borrow().nodes[self.id as usize].flags & flags::REQUIRES_GRAD != 0
    }
    /// The operator that made this tensor.
    pub fn op(&self) -> Op {
        self.graph.node(self.id).op
    }
    /// Keep this intermediate's gradient when `backward` runs; read it with
    /// `grad()` afterwards.
    pub fn retain_grad(self) -> Self {
        self.graph.set_flag(self.id, flags::RETAIN_GRAD);
        self
    }
    /// The gradient kept by the last backward pass: for leaf variables and
    /// tensors marked with `retain_grad`. Parameters keep theirs in the
    /// `Param` (see `Param::grad`).
    pub fn grad(&self) -> Option<Tensor<'g>> {
        let state = self.graph.state.borrow();
        state.kept_grads.iter().find(|(n, _)| *n == self.id).map(|&(_, g)| self.graph.tensor(g))
    }
}

impl std::fmt::Debug for Tensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let node = self.graph.node(self.id);
        write!(f, "Tensor(#{} {} {} {})", self.id, node.op.name(), fmt_dims(&self.dims()), node.dtype)
    }
}
