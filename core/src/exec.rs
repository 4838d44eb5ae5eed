//! The executor: runs the nodes a request needs, in id (= dependency) order,
//! and returns every intermediate buffer to the pool right after its last
//! consumer has run.
//!
//! Which values survive an execution:
//! - leaves (uploaded inputs, parameters) always — they cannot be recomputed;
//! - the requested targets, and values the user asked for earlier
//!   (`realize`, reads: flag `REQUESTED`), so that a value read before an
//!   optimizer step stays readable after it;
//! - values a gradient rule will read (`SAVED`), until a backward pass has
//!   consumed the graph;
//! - values already computed that this execution does not consume.
//!
//! Everything else is freed at its last use. A value freed this way and
//! requested later is recomputed from the leaves.
//!
//! Parallel branches: on a backend that can run several kernels at once
//! (the CPU with rayon, see `Backend::concurrency`), the executor gives it
//! the next node together with other *ready* nodes found a bounded
//! distance ahead (all inputs computed) when each is small enough that the
//! backend would run it on one thread: the towers of a multi-tower model,
//! attention heads computed as separate ops, the gradients of separate
//! parameters. Every kernel computes exactly what it would alone, so the
//! values are bit-identical to serial execution; only which buffers are
//! reused, and the order in which the observer hears of nodes, can differ.
//! Off in wasm (no rayon) and with `Device::set_parallel_branches(false)`.

mod fusion;
pub(crate) mod plan;

use std::rc::Rc;

use smallvec::SmallVec;

use crate::backend::{Backend, BufferId, Concurrency, KernelCall, TensorRef};
use crate::device::Device;
use crate::dtype::HostData;
use crate::error::{Error, Result};
use crate::graph::{flags, Graph, GraphState, NodeId, SlabRange, Tensor};
use crate::op::Op;

pub(crate) const NEEDED: u8 = 1;
pub(crate) const TARGET: u8 = 2;
/// Run (or given to the backend) in this execution.
pub(crate) const RAN: u8 = 4;
/// The most nodes run at once; what a backend asks for is capped here.
const MAX_BATCH: usize = 32;
/// Kernel calls of a batch kept inline (no heap) while it is run. Most
/// batches hold one node; inline room for all `MAX_BATCH` made every node
/// build and move about 10 KB of call records (memcpy was ~18 % of W3).
/// A larger batch (parallel branches, each with real work) spills to the heap.
const INLINE_BATCH: usize = 2;
/// How far past the next node (in id order) the executor looks for ready
/// nodes to run beside it. Bounds the extra memory live at once: nodes
/// run early hold their outputs early.
const LOOKAHEAD: usize = 128;

impl Graph {
    /// Compute the values of `targets` (and only what they need).
    pub fn realize(&self, targets: &[Tensor<'_>]) -> Result<()> {
        let ids: SmallVec<[NodeId; 8]> = targets
            .iter()
            .map(|t| {
                if !std::ptr::eq(t.graph, self) {
                    return Err(Error::invalid("realize", "tensor belongs to another graph"));
                }
                Ok(t.id)
            })
            .collect::<Result<_>>()?;
        self.realize_ids(&ids)?;
        self.mark_requested(&ids);
        Ok(())
    }

    /// Keep values the user asked for alive through later executions.
    fn mark_requested(&self, ids: &[NodeId]) {
        let mut state = self.state.borrow_mut();
        for &id in ids {
            state.nodes[id as usize].flags |= flags::REQUESTED;
        }
    }

    pub(crate) fn realize_ids(&self, targets: &[NodeId]) -> Result<()> {
        self.realize_ids_observed(targets, &mut |_, _| Ok(()))
    }

    /// `realize_ids`, telling `computed(node, buffer)` about every node right
    /// after its kernel has run (been recorded, on a backend that batches),
    /// in execution order. The observer must not touch this graph; an error
    /// it returns stops the execution like a kernel error.
    pub(crate) fn realize_ids_observed(
        &self,
        targets: &[NodeId],
        computed: &mut dyn FnMut(NodeId, BufferId) -> Result<()>,
    ) -> Result<()> {
        self.realize_planned(targets, computed, None)
    }

    /// `realize_ids` for a graph whose structure cannot have changed since
    /// `held` was recorded for it (a `Compiled` trace: nothing outside it
    /// can reach its graph, and every call frees what the last computed):
    /// replays `held` without comparing the structure node by node (only
    /// its size, targets and switches), and keeps in `held` the plan this
    /// execution used or recorded.
    pub(crate) fn realize_ids_held(&self, targets: &[NodeId], held: &mut Option<Rc<plan::Plan>>) -> Result<()> {
        self.realize_planned(targets, &mut |_, _| Ok(()), Some(held))
    }

    fn realize_planned(
        &self,
        targets: &[NodeId],
        computed: &mut dyn FnMut(NodeId, BufferId) -> Result<()>,
        mut held: Option<&mut Option<Rc<plan::Plan>>>,
    ) -> Result<()> {
        let Some(&max) = targets.iter().max() else { return Ok(()) };
        let device = self.device().clone();
        let backend = device.backend();
        let mut guard = self.state.borrow_mut();
        let state = &mut *guard;
        let end = max as usize + 1;

        let mut marks = std::mem::take(&mut state.scratch_marks);
        let mut uses = std::mem::take(&mut state.scratch_uses);
        let keep_saved = !state.differentiated;
        let concurrency = if device.parallel_branches() { backend.concurrency() } else { None };
        let fuse = device.fusion() && backend.fuses();
        let switches = plan::Switches { keep_saved, fuse, concurrency };
        let reuse = held
            .as_deref()
            .and_then(|h| h.clone())
            .filter(|p| device.plan_cache_enabled() && p.fits(state, targets, end, switches));
        let cached = match reuse {
            Some(plan) => Some(Ok(plan)),
            None => device.with_plan_cache(|cache| cache.find(state, targets, end, switches)),
        };
        let mut order = std::mem::take(&mut state.scratch_order);
        let mut result = Ok(());
        match cached {
            Some(Ok(plan)) => {
                device.count_plan(true);
                if let Some(h) = held.as_deref_mut() {
                    *h = Some(plan.clone());
                }
                result = replay(&device, state, &plan, computed);
            }
            recording => {
                // Mark what is needed, walking ids downwards: a node is needed if a
                // needed node without a value consumes it. Count the consumers.
                marks.clear();
                marks.resize(end, 0);
                uses.clear();
                uses.resize(end, 0);
                for &t in targets {
                    marks[t as usize] |= NEEDED | TARGET;
                }
                for id in (0..end).rev() {
                    if marks[id] & NEEDED == 0 || state.values[id].is_some() {
                        continue;
                    }
                    let node = state.nodes[id];
                    for &input in SlabRange::of(&state.input_slab, node.inputs) {
                        marks[input as usize] |= NEEDED;
                        uses[input as usize] += 1;
                    }
                }
                let recording = recording.and_then(|r| r.err());
                let mut record = recording.map(|r| (r, plan::Recorded::default()));
                // Values freed by the current step, in the order freed.
                let mut freed: Vec<NodeId> = Vec::new();
                order.clear();
                order.extend(
                    (0..end).filter(|&id| marks[id] & NEEDED != 0 && state.values[id].is_none()).map(|id| id as NodeId),
                );
                let mut pos = 0;
                while pos < order.len() {
                    let id = order[pos];
                    pos += 1;
                    if marks[id as usize] & RAN != 0 {
                        continue;
                    }
                    if fuse {
                        if let Some(group) =
                            fusion::plan_group(state, &order[pos - 1..], &mut marks, &uses, keep_saved, backend)
                        {
                            for &m in &group.members {
                                marks[m as usize] |= RAN;
                            }
                            let mut prepared = fusion::prepare(state, group);
                            if record.is_some() {
                                prepared.plan_id = device.with_plan_cache(|c| c.group_id());
                            }
                            if let Err(e) = fusion::run_group(&device, state, &prepared, computed) {
                                result = Err(e);
                                break;
                            }
                            freed.clear();
                            for &m in &prepared.group.members {
                                release_inputs(&device, state, m, &mut uses, &marks, keep_saved, &mut freed);
                            }
                            if let Some((_, r)) = record.as_mut() {
                                r.push_step(plan::Step::Fused(r.groups.len() as u32), &freed);
                                r.groups.push(prepared);
                            }
                            continue;
                        }
                    }
                    let mut batch: SmallVec<[NodeId; MAX_BATCH]> = smallvec::smallvec![id];
                    let parallel = match concurrency {
                        Some(c) => gather_branches(state, backend, c, &order[pos..], &marks, &mut batch),
                        None => false,
                    };
                    for &b in &batch {
                        marks[b as usize] |= RAN;
                    }
                    let step = if parallel { batch.len() } else { 1 };
                    for group in batch.chunks(step) {
                        if let Err(e) = run_batch(&device, state, group, computed) {
                            result = Err(e);
                            break;
                        }
                        freed.clear();
                        for &b in group {
                            release_inputs(&device, state, b, &mut uses, &marks, keep_saved, &mut freed);
                        }
                        if let Some((_, r)) = record.as_mut() {
                            let step = plan::Step::Run { start: r.nodes.len() as u32, len: group.len() as u32 };
                            r.push_step(step, &freed);
                            r.nodes.extend_from_slice(group);
                        }
                    }
                    if result.is_err() {
                        break;
                    }
                }
                // Only a plan that ran to the end is worth replaying.
                if let (Some((recording, recorded)), Ok(())) = (record, &result) {
                    device.count_plan(false);
                    let plan = device.with_plan_cache(|cache| cache.insert(recording, recorded));
                    if let Some(h) = held.as_deref_mut() {
                        *h = plan;
                    }
                }
            }
        }
        state.scratch_order = order;
        state.scratch_marks = marks;
        state.scratch_uses = uses;
        drop(guard);
        let flushed = backend.flush();
        result.and(flushed)
    }

    /// Read a tensor's values to the host (computing them first).
    pub(crate) async fn read_node(&self, id: NodeId) -> Result<HostData> {
        self.realize_ids(&[id])?;
        self.mark_requested(&[id]);
        let (buffer, dtype, len) = {
            let state = self.state.borrow();
            let node = state.nodes[id as usize];
            let len = SlabRange::of(&state.dims_slab, node.dims).iter().product();
            (state.values[id as usize].expect("realized"), node.dtype, len)
        };
        // The backend snapshots the buffer when `read` is called, so later
        // executions may reuse it while the future is pending.
        self.device().backend().read(buffer, dtype, len).await
    }
}

/// Run a recorded plan: the same kernels, groups and frees, in the same
/// order, as the execution that recorded it. The frees are the recorded
/// ones: which values a step's last uses release follows from the
/// structure the plan was recorded for, so nothing is counted again.
fn replay(
    device: &Device,
    state: &mut GraphState,
    plan: &plan::Plan,
    computed: &mut dyn FnMut(NodeId, BufferId) -> Result<()>,
) -> Result<()> {
    for (k, &step) in plan.steps.iter().enumerate() {
        match step {
            plan::Step::Run { start, len } => {
                run_batch(device, state, plan::step_nodes(plan, start, len), computed)?;
            }
            plan::Step::Fused(i) => {
                fusion::run_group(device, state, &plan.groups[i as usize], computed)?;
            }
        }
        for &node in plan.step_frees(k) {
            state.release_value(device, node);
        }
    }
    Ok(())
}

/// Add to `batch` (which holds the next node) the ready nodes among the
/// next `LOOKAHEAD` of `rest` that the backend would run on one thread, up
/// to its batch size. Returns whether the batch holds enough work to be
/// worth a parallel launch; a batch that is not still runs now, one node
/// after the other, which brings the next level of independent nodes
/// within reach (the towers' bias additions before their activations).
fn gather_branches(
    state: &GraphState,
    backend: &dyn Backend,
    c: Concurrency,
    rest: &[NodeId],
    marks: &[u8],
    batch: &mut SmallVec<[NodeId; MAX_BATCH]>,
) -> bool {
    // A node that shares its input's buffer runs no kernel: nothing to
    // run beside. Tiny nodes (a chain of scalar ops) do not pay for the
    // look ahead.
    if shares_input(state, batch[0]) {
        return false;
    }
    let Some(first) = node_work(state, backend, batch[0]).filter(|&w| w >= c.min_node_work) else { return false };
    let limit = c.max_batch.min(MAX_BATCH);
    let mut total = first;
    for &id in rest.iter().take(LOOKAHEAD) {
        if batch.len() >= limit {
            break;
        }
        let node = &state.nodes[id as usize];
        if marks[id as usize] & RAN != 0 || node.op.is_leaf() || shares_input(state, id) {
            continue;
        }
        let ready = SlabRange::of(&state.input_slab, node.inputs).iter().all(|&i| state.values[i as usize].is_some());
        if !ready {
            continue;
        }
        if let Some(work) = node_work(state, backend, id) {
            batch.push(id);
            total += work;
        }
    }
    total >= c.min_batch_work
}

/// Whether node `id` takes its input's buffer as its own value instead of
/// running a kernel: a Reshape, or a Permute that moves only axes of size 1
/// (the same elements in the same order), of a computed value. Not of a
/// leaf, whose buffer the graph does not own or may overwrite (a
/// parameter's, a compiled trace's inputs). The decision follows from the
/// graph's structure alone, so a replayed plan makes it the same way.
fn shares_input(state: &GraphState, id: NodeId) -> bool {
    let node = &state.nodes[id as usize];
    let same_order = match node.op {
        Op::Reshape => true,
        Op::Permute(perm) => {
            let dims = SlabRange::of(&state.dims_slab, node.dims);
            let mut moved = (0..dims.len()).filter(|&i| dims[i] != 1).map(|i| perm.get(i));
            let mut last = moved.next();
            moved.all(|axis| {
                let ordered = last.is_none_or(|l| axis > l);
                last = Some(axis);
                ordered
            })
        }
        _ => false,
    };
    same_order && node.inputs.len == 1 && {
        let input = state.input_slab[node.inputs.start as usize];
        let n = &state.nodes[input as usize];
        !n.op.is_leaf() && n.dtype == node.dtype
    }
}

/// The backend's estimate of a node's kernel (None: not one to run beside others).
fn node_work(state: &GraphState, backend: &dyn Backend, id: NodeId) -> Option<usize> {
    let node = &state.nodes[id as usize];
    let inputs: SmallVec<[&[usize]; 4]> = SlabRange::of(&state.input_slab, node.inputs)
        .iter()
        .map(|&i| SlabRange::of(&state.dims_slab, state.nodes[i as usize].dims))
        .collect();
    backend.kernel_work(&node.op, &inputs, SlabRange::of(&state.dims_slab, node.dims))
}

/// Run the nodes of `batch` (independent of each other; one at a time when
/// it holds one) and record their values, in id order. On an error, the
/// nodes before the failing one keep their values; the rest give their
/// output buffers back.
fn run_batch(
    device: &Device,
    state: &mut GraphState,
    batch: &[NodeId],
    computed: &mut dyn FnMut(NodeId, BufferId) -> Result<()>,
) -> Result<()> {
    let backend = device.backend();
    let len_of = |state: &GraphState, id: NodeId| -> usize {
        SlabRange::of(&state.dims_slab, state.nodes[id as usize].dims).iter().product()
    };
    // Views of their input's buffer first: no kernel, no new buffer.
    let mut kernels: SmallVec<[NodeId; INLINE_BATCH]> = SmallVec::new();
    for &id in batch {
        if !shares_input(state, id) {
            kernels.push(id);
            continue;
        }
        let node = state.nodes[id as usize];
        let input = state.input_slab[node.inputs.start as usize];
        let Some(buffer) = state.share_value(id, input) else {
            return Err(Error::backend(node.op.name(), "the input has no value").at(node.location));
        };
        computed(id, buffer)?;
    }
    if kernels.is_empty() {
        return Ok(());
    }
    let batch = &kernels[..];
    let mut outputs: SmallVec<[BufferId; INLINE_BATCH]> = SmallVec::new();
    let mut failure = None;
    for &id in batch {
        let node = state.nodes[id as usize];
        if node.op.is_leaf() {
            // A leaf without a value cannot happen: leaves get theirs at creation.
            failure = Some(Error::backend(node.op.name(), "leaf has no value").at(node.location));
            break;
        }
        match device.take_buffer(node.dtype, len_of(state, id)) {
            Ok(b) => outputs.push(b),
            Err(e) => {
                failure = Some(e.for_op(node.op.name()).at(node.location));
                break;
            }
        }
    }
    if let Some(e) = failure {
        for (&id, &buffer) in batch.iter().zip(&outputs) {
            device.give_back(buffer, state.nodes[id as usize].dtype, len_of(state, id));
        }
        return Err(e);
    }
    let results: SmallVec<[Result<()>; INLINE_BATCH]> = {
        let state = &*state;
        let inputs: SmallVec<[SmallVec<[TensorRef<'_>; 3]>; INLINE_BATCH]> = batch
            .iter()
            .map(|&id| {
                SlabRange::of(&state.input_slab, state.nodes[id as usize].inputs)
                    .iter()
                    .map(|&i| {
                        let n = &state.nodes[i as usize];
                        TensorRef {
                            buffer: state.values[i as usize].expect("inputs run before their consumers"),
                            dims: SlabRange::of(&state.dims_slab, n.dims),
                            dtype: n.dtype,
                        }
                    })
                    .collect()
            })
            .collect();
        let calls: SmallVec<[KernelCall<'_>; INLINE_BATCH]> = batch
            .iter()
            .zip(&outputs)
            .zip(&inputs)
            .map(|((&id, &output), inputs)| {
                let node = &state.nodes[id as usize];
                KernelCall {
                    op: node.op,
                    inputs,
                    output: TensorRef {
                        buffer: output,
                        dims: SlabRange::of(&state.dims_slab, node.dims),
                        dtype: node.dtype,
                    },
                }
            })
            .collect();
        device.count_kernels(calls.len());
        let watch = device.op_watch();
        let results = if let [call] = calls.as_slice() {
            smallvec::smallvec![backend.run(call)]
        } else {
            let mut results: SmallVec<[Result<()>; INLINE_BATCH]> = backend.run_many(&calls).into_iter().collect();
            results.resize_with(calls.len(), || {
                Err(Error::backend("run_many", "the backend ran fewer kernels than asked"))
            });
            results
        };
        device.record_op(watch, || kernels_label(&calls));
        results
    };
    for ((&id, &buffer), result) in batch.iter().zip(&outputs).zip(results) {
        let node = state.nodes[id as usize];
        if failure.is_some() {
            device.give_back(buffer, node.dtype, len_of(state, id));
            continue;
        }
        match result {
            Err(e) => {
                device.give_back(buffer, node.dtype, len_of(state, id));
                failure = Some(e.at(node.location));
            }
            Ok(()) => {
                state.values[id as usize] = Some(buffer);
                state.owned.push(id);
                if let Err(e) = computed(id, buffer) {
                    failure = Some(e);
                }
            }
        }
    }
    failure.map_or(Ok(()), Err)
}

/// The op profile's name for a kernel (op and shapes), or for kernels run
/// together (each one's, joined).
#[cfg(not(target_arch = "wasm32"))]
fn kernels_label(calls: &[KernelCall<'_>]) -> String {
    use crate::op_profile::dims_label;
    let one = |c: &KernelCall<'_>| {
        let ins: Vec<String> = c.inputs.iter().map(|t| dims_label(t.dims)).collect();
        format!("{} {} -> {}", op_label(&c.op), ins.join(" "), dims_label(c.output.dims))
    };
    match calls {
        [c] => one(c),
        _ => format!("together: {}", calls.iter().map(one).collect::<Vec<_>>().join(" | ")),
    }
}
#[cfg(target_arch = "wasm32")]
fn kernels_label(_: &[KernelCall<'_>]) -> String {
    String::new()
}

/// An op's name, and a product's transposes.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn op_label(op: &Op) -> String {
    match *op {
        Op::MatMul { transpose_a, transpose_b } => {
            format!("MatMul{}{}", if transpose_a { " Aᵀ" } else { "" }, if transpose_b { " Bᵀ" } else { "" })
        }
        other => other.name().to_string(),
    }
}

/// Whether a value must survive its last consumer in this execution.
pub(crate) fn pinned(flags_of_node: u8, keep_saved: bool) -> bool {
    (keep_saved && flags_of_node & flags::SAVED != 0) || flags_of_node & (flags::RETAIN_GRAD | flags::REQUESTED) != 0
}

/// Release the inputs of `id` whose last consumer it was, appending each
/// value freed to `freed`.
fn release_inputs(
    device: &Device,
    state: &mut GraphState,
    id: NodeId,
    uses: &mut [u32],
    marks: &[u8],
    keep_saved: bool,
    freed: &mut Vec<NodeId>,
) {
    let node = state.nodes[id as usize];
    for k in 0..node.inputs.len as usize {
        let input = state.input_slab[node.inputs.start as usize + k] as usize;
        uses[input] -= 1;
        if uses[input] > 0 || marks[input] & TARGET != 0 {
            continue;
        }
        let n = state.nodes[input];
        if n.op.is_leaf() || pinned(n.flags, keep_saved) {
            continue;
        }
        if state.release_value(device, input as NodeId) {
            freed.push(input as NodeId);
        }
    }
}

impl<'g> Tensor<'g> {
    /// The tensor's values as tagged host data. Errors (including those of
    /// nodes that fail when they run) point at a line of the caller's code.
    #[track_caller]
    pub fn to_host(&self) -> impl std::future::Future<Output = Result<HostData>> + 'g {
        let caller = std::panic::Location::caller();
        let (graph, id) = (self.graph, self.id);
        async move { graph.read_node(id).await.map_err(|e| e.or_at(caller)) }
    }

    /// The tensor's values as a `Vec<T>`; `T` must match the dtype.
    #[track_caller]
    pub fn to_vec<T: crate::dtype::Element>(&self) -> impl std::future::Future<Output = Result<Vec<T>>> + 'g {
        let caller = std::panic::Location::caller();
        let host = self.to_host();
        async move { T::from_host(host.await?).map_err(|e| e.or_at(caller)) }
    }

    /// The single value of a one-element tensor, as f64.
    #[track_caller]
    pub fn item(&self) -> impl std::future::Future<Output = Result<f64>> + 'g {
        let checked = match self.numel() {
            1 => Ok(()),
            _ => Err(Error::shape(
                "item",
                format!("item() needs a one-element tensor, this one has shape {:?}", self.dims().as_slice()),
            )),
        };
        let host = self.to_host();
        async move {
            checked?;
            Ok(host.await?.to_f64_vec()[0])
        }
    }
}
