//! Element-wise fusion: the executor hands a run of consecutive element-wise
//! nodes to the backend as one kernel (`Backend::run_fused`).
//!
//! A group is a maximal run of the nodes to execute, in execution order,
//! that are element-wise by the op table (Unary, Binary, Compare, Where)
//! with the same output dims, plus the scalar constants (`Full`) they read.
//! Operands from outside the group broadcast as usual. Only values that
//! outlive the group are written to memory: targets, values a gradient rule
//! or the user keeps (the same `pinned` rule as freeing), and values a node
//! after the group reads. The others are never materialised, exactly as if
//! they had been computed and freed at their last use; one requested later
//! is recomputed like any freed value.
//!
//! Two extensions, each only for a backend that asks for it: a matrix
//! product may head a group (its epilogue: `Backend::fuses_matmul`), and a
//! Sum/Prod/Max/Min of a member right after the group may end it (its
//! prologue: `Backend::fuses_reduce`); docs/performance.md explains both.
//!
//! The backend evaluates each op per element with the function its own
//! kernel uses, so results are bit-identical with fusion off
//! (`Device::set_fusion(false)` or `KILN_FUSION=0`).

use crate::small::SmallVec;

use super::{pinned, RAN, TARGET};
use crate::backend::{Backend, BufferId, FusedArg, FusedCall, FusedMatMul, FusedOp, TensorRef};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{GraphState, NodeId, SlabRange};
use crate::op::{Family, Op, ReduceOp};
use crate::shape::Dims;

/// Marks a node of the group being formed (cleared before returning).
const IN_GROUP: u8 = 8;
/// The most nodes in one group (bounds planning work per group).
const MAX_GROUP: usize = 1 << 14;

pub(super) struct Group {
    pub dims: Dims,
    /// The nodes, in execution (= id) order.
    pub members: Vec<NodeId>,
    /// Per member: whether its value is written to a buffer.
    pub kept: Vec<bool>,
}

/// What a node can be in a group whose values have dtype `value`.
enum Role {
    Constant,
    Compute,
    No,
}

fn role(state: &GraphState, id: NodeId, value: &mut Option<DType>) -> Role {
    let node = &state.nodes[id as usize];
    let info = node.op.info();
    let input_dtype = |k: usize| {
        let i = state.input_slab[(node.inputs.start as usize) + k];
        state.nodes[i as usize].dtype
    };
    // The dtype of the group's values this node implies.
    let implied = match node.op {
        Op::Full(_) => return Role::Constant,
        Op::Unary(_) | Op::Binary(_) | Op::Where => node.dtype,
        Op::Compare(_) => input_dtype(0),
        _ => return Role::No,
    };
    if info.family != Family::Elementwise || implied == DType::Bool {
        return Role::No;
    }
    let ok_dtype = match node.op {
        Op::Unary(_) | Op::Binary(_) => info.elementwise.is_some() && info.dtypes.contains(implied),
        Op::Compare(_) => input_dtype(1) == implied,
        _ => input_dtype(0) == DType::Bool && input_dtype(1) == implied && input_dtype(2) == implied,
    };
    match *value {
        _ if !ok_dtype => Role::No,
        Some(v) if v != implied => Role::No,
        _ => {
            *value = Some(implied);
            Role::Compute
        }
    }
}

fn numel(state: &GraphState, id: NodeId) -> usize {
    SlabRange::of(&state.dims_slab, state.nodes[id as usize].dims).iter().product()
}

fn dims_of(state: &GraphState, id: NodeId) -> &[usize] {
    SlabRange::of(&state.dims_slab, state.nodes[id as usize].dims)
}

/// Whether `id` can head a group: a matrix product of a dtype whose
/// epilogue the backend fuses (`Backend::fuses_matmul`), operands computed.
fn head_of(state: &GraphState, id: NodeId, backend: &dyn Backend) -> bool {
    let node = &state.nodes[id as usize];
    matches!(node.op, Op::MatMul { .. })
        && backend.fuses_matmul(node.dtype)
        && SlabRange::of(&state.input_slab, node.inputs).iter().all(|&i| state.values[i as usize].is_some())
}

/// Whether `id` can end a group of `members` (values of dtype `value`) as
/// its tail: a Sum, Prod, Max or Min the backend fuses, of a member that
/// is not a constant (so its dims are the group's).
fn tail_of(
    state: &GraphState,
    id: NodeId,
    value: DType,
    members: &[NodeId],
    marks: &[u8],
    backend: &dyn Backend,
) -> bool {
    let node = &state.nodes[id as usize];
    let Op::Reduce { op, .. } = node.op else { return false };
    let &[source] = SlabRange::of(&state.input_slab, node.inputs) else { return false };
    marks[id as usize] & RAN == 0
        && matches!(op, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min)
        && node.dtype == value
        && backend.fuses_reduce(value)
        && members.binary_search(&source).is_ok()
        && !matches!(state.nodes[source as usize].op, Op::Full(_))
}

/// The group starting at `rest[0]`, if one of at least two nodes forms
/// there. `marks` is the executor's; `uses` counts each value's consumers
/// still to run. A matrix product at `rest[0]` heads a group when the
/// backend fuses its epilogue and an element-wise op of the group reads it.
pub(super) fn plan_group(
    state: &GraphState,
    rest: &[NodeId],
    marks: &mut [u8],
    uses: &[u32],
    keep_saved: bool,
    backend: &dyn Backend,
) -> Option<Group> {
    let mut value: Option<DType> = None;
    let mut dims: Option<Dims> = None;
    let mut members: Vec<NodeId> = Vec::new();
    // No backend of the browser build fuses products: leave the code out.
    let head = rest
        .first()
        .copied()
        .filter(|&id| !cfg!(target_arch = "wasm32") && marks[id as usize] & RAN == 0 && head_of(state, id, backend));
    if let Some(id) = head {
        value = Some(state.nodes[id as usize].dtype);
        dims = Some(Dims::from_slice(dims_of(state, id)));
        members.push(id);
        marks[id as usize] |= IN_GROUP;
    }
    let rest = if head.is_some() { &rest[1..] } else { rest };
    for &id in rest.iter().take(MAX_GROUP) {
        if marks[id as usize] & RAN != 0 {
            break;
        }
        match role(state, id, &mut value) {
            Role::No => break,
            Role::Constant => {
                // A scalar, or a constant of the group's dims; its dtype (the
                // group's, or bool for a condition) is checked at the end.
                let fits = numel(state, id) == 1 || dims.as_ref().is_some_and(|g| g.as_slice() == dims_of(state, id));
                if !fits {
                    break;
                }
                members.push(id);
            }
            Role::Compute => {
                let d = dims_of(state, id);
                match &dims {
                    Some(g) if g.as_slice() != d => break,
                    Some(_) => {}
                    None => dims = Some(Dims::from_slice(d)),
                }
                // Every operand is a member or already computed.
                let node = &state.nodes[id as usize];
                let ready = SlabRange::of(&state.input_slab, node.inputs)
                    .iter()
                    .all(|&i| marks[i as usize] & IN_GROUP != 0 || state.values[i as usize].is_some());
                if !ready {
                    break;
                }
                members.push(id);
            }
        }
        marks[id as usize] |= IN_GROUP;
    }
    for &m in &members {
        marks[m as usize] &= !IN_GROUP;
    }
    // Constants after the last computing node read nothing of the group.
    while members.last().is_some_and(|&m| matches!(state.nodes[m as usize].op, Op::Full(_))) {
        members.pop();
    }
    let (dims, value) = (dims?, value?);
    let constants_fit = members.iter().all(|&m| {
        let n = &state.nodes[m as usize];
        !matches!(n.op, Op::Full(_))
            || ((n.dtype == value || n.dtype == DType::Bool)
                && (numel(state, m) == 1 || dims_of(state, m) == dims.as_slice()))
    });
    // A reduction right after the group, of one of its values, ends it
    // (the tail: the group is its prologue). Not in the browser build,
    // whose backends do not fuse reductions.
    if !cfg!(target_arch = "wasm32") && head.is_none() && constants_fit {
        let next = rest.get(members.len()).copied();
        if let Some(t) = next.filter(|&t| tail_of(state, t, value, &members, marks, backend)) {
            members.push(t);
        }
    }
    if members.len() < 2 || !constants_fit {
        return None;
    }
    // A head is worth its kernel only with an epilogue that reads it.
    if let Some(h) = head {
        let read = members[1..].iter().any(|&m| {
            let node = &state.nodes[m as usize];
            SlabRange::of(&state.input_slab, node.inputs).contains(&h)
        });
        if !read {
            return None;
        }
    }
    // Consumers inside the group, per member (members are sorted by id).
    let mut internal = vec![0u32; members.len()];
    for &m in &members {
        let node = &state.nodes[m as usize];
        for &i in SlabRange::of(&state.input_slab, node.inputs) {
            if let Ok(k) = members.binary_search(&i) {
                internal[k] += 1;
            }
        }
    }
    let kept = members
        .iter()
        .zip(&internal)
        .map(|(&m, &inside)| {
            let n = &state.nodes[m as usize];
            marks[m as usize] & TARGET != 0 || pinned(n.flags, keep_saved) || uses[m as usize] > inside
        })
        .collect();
    Some(Group { dims, members, kept })
}

/// A group with its kernel description: the fused ops (operands as
/// member or input positions) and the nodes read from outside, in the order
/// `FusedCall::inputs` lists them. Structure only: no buffers, so a cached
/// plan can replay it.
pub(super) struct Prepared {
    pub group: Group,
    pub ops: Vec<FusedOp>,
    pub input_nodes: Vec<NodeId>,
    /// The operands of the group's head (member 0), when it has one.
    pub head: Option<[NodeId; 2]>,
    /// Set when the plan is cached: the backend may keep its own plan of
    /// this group's kernel under this id (see `FusedCall::plan_id`).
    pub plan_id: Option<u64>,
}

pub(super) fn prepare(state: &GraphState, group: Group) -> Prepared {
    let mut input_nodes: Vec<NodeId> = Vec::new();
    let mut input_index: std::collections::HashMap<NodeId, u16> = std::collections::HashMap::new();
    let mut ops: Vec<FusedOp> = Vec::with_capacity(group.members.len());
    let mut head = None;
    for &m in &group.members {
        let node = &state.nodes[m as usize];
        if let Op::MatMul { .. } = node.op {
            // Only a head (member 0) is a product; its operands are its own.
            let operands = SlabRange::of(&state.input_slab, node.inputs);
            head = Some([operands[0], operands[1]]);
            ops.push(FusedOp { op: node.op, args: [FusedArg::Input(0); 3], arity: 0, dtype: node.dtype });
            continue;
        }
        let mut args = [FusedArg::Input(0); 3];
        let operands = SlabRange::of(&state.input_slab, node.inputs);
        for (slot, &i) in args.iter_mut().zip(operands) {
            *slot = match group.members.binary_search(&i) {
                Ok(k) => FusedArg::Op(k as u16),
                Err(_) => FusedArg::Input(*input_index.entry(i).or_insert_with(|| {
                    input_nodes.push(i);
                    (input_nodes.len() - 1) as u16
                })),
            };
        }
        ops.push(FusedOp { op: node.op, args, arity: operands.len() as u8, dtype: node.dtype });
    }
    Prepared { group, ops, input_nodes, head, plan_id: None }
}

/// Run a prepared group as one fused kernel, record the kept values and
/// tell `computed` about them in order.
pub(super) fn run_group(
    device: &Device,
    state: &mut GraphState,
    prepared: &Prepared,
    computed: &mut dyn FnMut(NodeId, BufferId) -> Result<()>,
) -> Result<()> {
    let group = &prepared.group;
    let backend = device.backend();
    // Buffers of the kept values.
    let mut buffers: SmallVec<[(u16, NodeId, BufferId); 8]> = SmallVec::new();
    let mut failure = None;
    for (k, (&m, &kept)) in group.members.iter().zip(&group.kept).enumerate() {
        if !kept {
            continue;
        }
        let node = state.nodes[m as usize];
        match device.take_buffer(node.dtype, numel(state, m)) {
            Ok(b) => buffers.push((k as u16, m, b)),
            Err(e) => {
                failure = Some(e.for_op(node.op.name()).at(node.location));
                break;
            }
        }
    }
    if failure.is_none() {
        let result = (|| {
            let state = &*state;
            let tensor = |i: NodeId| -> Result<TensorRef<'_>> {
                let buffer = state.values[i as usize]
                    .ok_or_else(|| Error::backend("fused", format!("operand node {i} has no value")))?;
                Ok(TensorRef { buffer, dims: dims_of(state, i), dtype: state.nodes[i as usize].dtype })
            };
            // A plain loop rather than collect::<Result<Vec<_>>>(): the adapter costs ~200 B of the browser's wasm.
            let mut inputs: Vec<TensorRef<'_>> = Vec::with_capacity(prepared.input_nodes.len());
            for &i in &prepared.input_nodes {
                inputs.push(tensor(i)?);
            }
            let head = match (prepared.head, state.nodes[group.members[0] as usize].op) {
                (Some([a, b]), Op::MatMul { transpose_a, transpose_b }) if !cfg!(target_arch = "wasm32") => {
                    Some(FusedMatMul { transpose_a, transpose_b, a: tensor(a)?, b: tensor(b)? })
                }
                _ => None,
            };
            let outputs: Vec<(u16, TensorRef<'_>)> = buffers
                .iter()
                .map(|&(k, m, buffer)| {
                    (k, TensorRef { buffer, dims: dims_of(state, m), dtype: state.nodes[m as usize].dtype })
                })
                .collect();
            let tail =
                !cfg!(target_arch = "wasm32") && prepared.ops.last().is_some_and(|o| matches!(o.op, Op::Reduce { .. }));
            device.count_fused(group.members.len(), prepared.head.is_some(), tail);
            let watch = device.op_watch();
            let call = FusedCall {
                dims: &group.dims,
                ops: &prepared.ops,
                inputs: &inputs,
                outputs: &outputs,
                plan_id: prepared.plan_id,
                head,
            };
            let result = backend.run_fused(&call);
            device.record_op(watch, || fused_label(&call));
            result
        })();
        if let Err(e) = result {
            let first = state.nodes[group.members[0] as usize];
            failure = Some(e.at(first.location));
        }
    }
    if let Some(e) = failure {
        for &(_, m, buffer) in &buffers {
            let node = state.nodes[m as usize];
            device.give_back(buffer, node.dtype, numel(state, m));
        }
        return Err(e);
    }
    let mut failure = None;
    for &(_, m, buffer) in &buffers {
        state.values[m as usize] = Some(buffer);
        state.owned.push(m);
        if failure.is_none() {
            failure = computed(m, buffer).err();
        }
    }
    failure.map_or(Ok(()), Err)
}

/// The op profile's name for a fused group: its ops in order and its shape
/// (a product's operands' shapes first).
#[cfg(not(target_arch = "wasm32"))]
fn fused_label(call: &FusedCall<'_>) -> String {
    use crate::op_profile::dims_label;
    let ops: Vec<String> = call.ops.iter().map(|o| crate::exec::op_label(&o.op)).collect();
    let head =
        call.head.as_ref().map_or(String::new(), |h| format!("{} {} -> ", dims_label(h.a.dims), dims_label(h.b.dims)));
    format!("fused[{}] {head}{}", ops.join(","), dims_label(call.dims))
}
#[cfg(target_arch = "wasm32")]
fn fused_label(_: &FusedCall<'_>) -> String {
    String::new()
}
