//! Cached execution plans: a training loop builds the same graph every
//! step, so the executor's decisions — which nodes run, in which batches
//! (parallel branches), which element-wise runs fuse and how each fused
//! kernel reads its operands, how many consumers each value has — are the
//! same every step. The first execution of a structure records them; an
//! execution whose structure is *identical* replays them without deciding
//! anything again.
//!
//! Identical means, for every node up to the last target: the op with its
//! attributes (constants compared bit for bit), the operand ids, dims,
//! dtype, flags (requires-grad, saved, requested...) and whether its value
//! is already computed; plus the targets and the executor's switches. The
//! key stores all of it and a lookup compares all of it, so a difference
//! anywhere is a miss, never a stale plan; a hash only picks the candidate.
//! Buffers are not part of a plan: every replay takes and frees them as the
//! first execution did.

use std::rc::Rc;

use super::fusion::Prepared;
use crate::backend::Concurrency;
use crate::dtype::DType;
use crate::graph::{GraphState, NodeId, SlabRange};
use crate::op::Op;

/// Plans kept per device (the executions of one training step: forward
/// reads, backward, metrics; a few steps' worth of variants).
const CAPACITY: usize = 16;

/// One step of a plan.
#[derive(Clone, Copy, Debug)]
pub(super) enum Step {
    /// `run_batch` on `nodes[start..start + len]` (one node, or parallel
    /// branches).
    Run { start: u32, len: u32 },
    /// Fused group `groups[i]`.
    Fused(u32),
}

/// What an execution decided, to replay.
pub(crate) struct Plan {
    key: Key,
    pub(super) steps: Vec<Step>,
    pub(super) nodes: Vec<NodeId>,
    pub(super) groups: Vec<Prepared>,
    /// The values step `k` freed (their last consumer ran in it), in the
    /// order freed: `frees[free_ends[k - 1]..free_ends[k]]`.
    free_ends: Vec<u32>,
    frees: Vec<NodeId>,
}

/// A plan's parts while its execution runs.
#[derive(Default)]
pub(super) struct Recorded {
    steps: Vec<Step>,
    pub nodes: Vec<NodeId>,
    pub groups: Vec<Prepared>,
    free_ends: Vec<u32>,
    frees: Vec<NodeId>,
}

impl Recorded {
    /// Append a step and the values it freed.
    pub(super) fn push_step(&mut self, step: Step, freed: &[NodeId]) {
        self.steps.push(step);
        self.frees.extend_from_slice(freed);
        self.free_ends.push(self.frees.len() as u32);
    }
}

/// The executor's switches that change its decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Switches {
    pub keep_saved: bool,
    pub fuse: bool,
    pub concurrency: Option<Concurrency>,
}

#[derive(Clone, Copy)]
struct KeyNode {
    op: Op,
    inputs: (u32, u32),
    dims: (u32, u32),
    dtype: DType,
    flags: u8,
    computed: bool,
}

/// Exactly equal ops: `==`, and float attributes bit for bit (0.0 and -0.0
/// are different constants; a NaN constant equals itself).
fn same_op(a: &Op, b: &Op) -> bool {
    match (a, b) {
        (Op::Full(x), Op::Full(y)) => x.to_bits() == y.to_bits(),
        (Op::Arange { start: s1, step: t1 }, Op::Arange { start: s2, step: t2 }) => {
            s1.to_bits() == s2.to_bits() && t1.to_bits() == t2.to_bits()
        }
        _ => a == b,
    }
}

struct Key {
    hash: u64,
    nodes: Vec<KeyNode>,
    input_slab: Vec<NodeId>,
    dims_slab: Vec<usize>,
    targets: Vec<NodeId>,
    switches: Switches,
}

/// Where the slabs' entries of nodes `0..end` end.
fn slab_ends(state: &GraphState, end: usize) -> (usize, usize) {
    match end.checked_sub(1).map(|last| state.nodes[last]) {
        Some(n) => ((n.inputs.start + n.inputs.len) as usize, (n.dims.start + n.dims.len) as usize),
        None => (0, 0),
    }
}

/// A cheap hash of what most often differs between a device's executions
/// (size, targets, the last nodes), to skip most candidates without the
/// full comparison.
fn quick_hash(state: &GraphState, targets: &[NodeId], end: usize, switches: Switches) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |v: u64| {
        h ^= v;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    mix(end as u64);
    mix(switches.keep_saved as u64 | (switches.fuse as u64) << 1 | (switches.concurrency.is_some() as u64) << 2);
    for &t in targets {
        mix(t as u64);
    }
    for n in &state.nodes[end.saturating_sub(4)..end] {
        mix(n.dtype as u64);
        mix(n.dims.len as u64 | (n.inputs.len as u64) << 8 | (n.flags as u64) << 16);
    }
    h
}

impl Key {
    fn of(state: &GraphState, targets: &[NodeId], end: usize, switches: Switches) -> Key {
        let (inputs_end, dims_end) = slab_ends(state, end);
        Key {
            hash: quick_hash(state, targets, end, switches),
            nodes: state.nodes[..end]
                .iter()
                .zip(&state.values)
                .map(|(n, v)| KeyNode {
                    op: n.op,
                    inputs: (n.inputs.start, n.inputs.len),
                    dims: (n.dims.start, n.dims.len),
                    dtype: n.dtype,
                    flags: n.flags,
                    computed: v.is_some(),
                })
                .collect(),
            input_slab: state.input_slab[..inputs_end].to_vec(),
            dims_slab: state.dims_slab[..dims_end].to_vec(),
            targets: targets.to_vec(),
            switches,
        }
    }

    fn matches(&self, state: &GraphState, targets: &[NodeId], end: usize, switches: Switches, hash: u64) -> bool {
        if self.hash != hash || self.nodes.len() != end || self.switches != switches || self.targets != targets {
            return false;
        }
        let (inputs_end, dims_end) = slab_ends(state, end);
        inputs_end == self.input_slab.len()
            && dims_end == self.dims_slab.len()
            && state.input_slab[..inputs_end] == self.input_slab[..]
            && state.dims_slab[..dims_end] == self.dims_slab[..]
            && self.nodes.iter().zip(&state.nodes[..end]).zip(&state.values).all(|((k, n), v)| {
                same_op(&k.op, &n.op)
                    && k.inputs == (n.inputs.start, n.inputs.len)
                    && k.dims == (n.dims.start, n.dims.len)
                    && k.dtype == n.dtype
                    && k.flags == n.flags
                    && k.computed == v.is_some()
            })
    }
}

impl Plan {
    /// Whether this plan was recorded for an execution of this size, these
    /// targets and switches, on a graph with slabs of the same lengths: the
    /// check for a plan held by the one user of a graph whose structure
    /// cannot change (`Graph::realize_ids_held`); the node-by-node
    /// comparison is `find`'s.
    pub(super) fn fits(&self, state: &GraphState, targets: &[NodeId], end: usize, switches: Switches) -> bool {
        let (inputs_end, dims_end) = slab_ends(state, end);
        self.key.nodes.len() == end
            && self.key.switches == switches
            && self.key.targets == targets
            && self.key.input_slab.len() == inputs_end
            && self.key.dims_slab.len() == dims_end
    }
}

/// A device's plans, most recently used last.
#[derive(Default)]
pub(crate) struct PlanCache {
    plans: Vec<Rc<Plan>>,
    next_group: u64,
}

/// A plan being recorded: its key is taken before anything runs.
pub(super) struct Recording {
    key: Key,
}

impl PlanCache {
    /// The plan recorded for exactly this structure, if any.
    pub(super) fn find(
        &mut self,
        state: &GraphState,
        targets: &[NodeId],
        end: usize,
        switches: Switches,
    ) -> Result<Rc<Plan>, Recording> {
        let hash = quick_hash(state, targets, end, switches);
        let found = self.plans.iter().rposition(|p| p.key.matches(state, targets, end, switches, hash));
        match found {
            Some(i) => {
                let plan = self.plans.remove(i);
                self.plans.push(plan.clone());
                Ok(plan)
            }
            None => Err(Recording { key: Key::of(state, targets, end, switches) }),
        }
    }

    /// A fresh id for a fused group of a plan being recorded.
    pub(super) fn group_id(&mut self) -> u64 {
        self.next_group += 1;
        self.next_group
    }

    pub(super) fn insert(&mut self, recording: Recording, recorded: Recorded) -> Rc<Plan> {
        if self.plans.len() >= CAPACITY {
            self.plans.remove(0);
        }
        let Recorded { steps, nodes, groups, free_ends, frees } = recorded;
        let plan = Rc::new(Plan { key: recording.key, steps, nodes, groups, free_ends, frees });
        self.plans.push(plan.clone());
        plan
    }
}

impl Plan {
    /// The values step `k` freed when it was recorded.
    pub(super) fn step_frees(&self, k: usize) -> &[NodeId] {
        let start = if k == 0 { 0 } else { self.free_ends[k - 1] as usize };
        &self.frees[start..self.free_ends[k] as usize]
    }
}

/// Ranges of `nodes` of one step, for replays.
pub(super) fn step_nodes(plan: &Plan, start: u32, len: u32) -> &[NodeId] {
    SlabRange::of(&plan.nodes, SlabRange { start, len })
}
