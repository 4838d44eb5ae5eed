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

use smallvec::SmallVec;

use crate::backend::{BufferId, KernelCall, TensorRef};
use crate::dtype::HostData;
use crate::error::{Error, Result};
use crate::graph::{flags, Graph, NodeId, SlabRange, Tensor};

const NEEDED: u8 = 1;
const TARGET: u8 = 2;

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
        let Some(&max) = targets.iter().max() else { return Ok(()) };
        let device = self.device().clone();
        let backend = device.backend();
        let mut guard = self.state.borrow_mut();
        let state = &mut *guard;
        let end = max as usize + 1;

        // Mark what is needed, walking ids downwards: a node is needed if a
        // needed node without a value consumes it. Count the consumers.
        let mut marks = std::mem::take(&mut state.scratch_marks);
        let mut uses = std::mem::take(&mut state.scratch_uses);
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

        let keep_saved = !state.differentiated;
        let mut result = Ok(());
        for id in 0..end {
            if marks[id] & NEEDED == 0 || state.values[id].is_some() {
                continue;
            }
            let node = state.nodes[id];
            if node.op.is_leaf() {
                // A leaf without a value cannot happen: leaves get theirs at creation.
                result = Err(Error::backend(node.op.name(), "leaf has no value").at(node.location));
                break;
            }
            let input_ids = SlabRange::of(&state.input_slab, node.inputs);
            let dims = SlabRange::of(&state.dims_slab, node.dims);
            let len: usize = dims.iter().product();
            let output = match device.take_buffer(node.dtype, len) {
                Ok(b) => b,
                Err(e) => {
                    result = Err(e.for_op(node.op.name()).at(node.location));
                    break;
                }
            };
            let inputs: SmallVec<[TensorRef<'_>; 3]> = input_ids
                .iter()
                .map(|&i| {
                    let n = &state.nodes[i as usize];
                    TensorRef {
                        buffer: state.values[i as usize].expect("inputs run before their consumers"),
                        dims: SlabRange::of(&state.dims_slab, n.dims),
                        dtype: n.dtype,
                    }
                })
                .collect();
            let call = KernelCall {
                op: node.op,
                inputs: &inputs,
                output: TensorRef { buffer: output, dims, dtype: node.dtype },
            };
            if let Err(e) = backend.run(&call) {
                device.give_back(output, node.dtype, len);
                result = Err(e.at(node.location));
                break;
            }
            drop(inputs);
            state.values[id] = Some(output);
            state.owned.push(id as NodeId);
            if let Err(e) = computed(id as NodeId, output) {
                result = Err(e);
                break;
            }

            // Release inputs whose last consumer this was.
            for k in 0..node.inputs.len as usize {
                let input = state.input_slab[node.inputs.start as usize + k] as usize;
                uses[input] -= 1;
                if uses[input] > 0 || marks[input] & TARGET != 0 {
                    continue;
                }
                let n = state.nodes[input];
                let pinned = n.op.is_leaf()
                    || (keep_saved && n.flags & flags::SAVED != 0)
                    || n.flags & (flags::RETAIN_GRAD | flags::REQUESTED) != 0;
                if pinned {
                    continue;
                }
                if let Some(buffer) = state.values[input].take() {
                    let len = SlabRange::of(&state.dims_slab, n.dims).iter().product();
                    device.give_back(buffer, n.dtype, len);
                }
            }
        }
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
