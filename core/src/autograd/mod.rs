//! Reverse-mode differentiation by graph extension.
//!
//! `backward` appends the gradient computation to the same graph as ordinary
//! nodes (the rules in `rules.rs`), runs it with the same executor, and adds
//! the results into the parameters' gradients. `Graph::grad` returns the
//! gradient nodes instead, still differentiable, for higher-order
//! derivatives. The walk: node ids are a topological order, so visiting ids
//! from the root downwards sees every node after all of its consumers.

#[cfg(not(target_arch = "wasm32"))]
mod accumulate;
pub mod rules;
mod segment;
mod vjp;

pub use segment::{checkpoint, checkpoint_many};
pub(crate) use vjp::check_backward_gradients;
pub use vjp::{custom_vjp, custom_vjp_many, VjpBackward};

use crate::small::SmallVec;

use crate::backend::BufferId;
use crate::error::{Error, Result};
use crate::graph::{flags, Graph, NodeId, Tensor};
use crate::param::Param;

/// Options for `Tensor::backward_with_options`.
#[derive(Clone, Copy, Default)]
pub struct BackwardOptions<'g> {
    /// The cotangent of the root (its shape); None means 1 for a
    /// one-element root.
    pub seed: Option<Tensor<'g>>,
    /// Keep the values the gradient rules read, so that another backward
    /// over this graph is allowed.
    pub keep_graph: bool,
}

/// Refuse roots that cannot be differentiated, before anything is touched.
fn check_root(op: &'static str, root: &Tensor<'_>) -> Result<()> {
    if !root.dtype().is_float() {
        return Err(Error::dtype(
            op,
            format!("the root has dtype {}; only floating-point results can be differentiated", root.dtype()),
        ));
    }
    if !root.requires_grad() {
        return Err(Error::autograd(
            op,
            "the root does not require grad: it depends on no parameter or variable (or was built under no_grad)",
        ));
    }
    Ok(())
}

fn check_seed(op: &'static str, root: &Tensor<'_>, seed: Option<Tensor<'_>>) -> Result<()> {
    match seed {
        None if root.numel() != 1 => Err(Error::shape(
            op,
            format!(
                "an implicit seed of 1 needs a one-element root, this root has shape {:?}; pass a cotangent of that shape",
                root.dims().as_slice()
            ),
        )),
        None => Ok(()),
        Some(s) => {
            if !std::ptr::eq(s.graph, root.graph) {
                return Err(Error::invalid(op, "the seed belongs to another graph"));
            }
            if s.dims() != root.dims() || s.dtype() != root.dtype() {
                return Err(Error::shape(
                    op,
                    format!(
                        "the seed is {:?} {} but the root is {:?} {}",
                        s.dims().as_slice(),
                        s.dtype(),
                        root.dims().as_slice(),
                        root.dtype()
                    ),
                ));
            }
            Ok(())
        }
    }
}

/// Gradient node of every node up to the root that receives one (the
/// vector may be longer: checkpointed segments append recomputed copies).
fn build_gradients(graph: &Graph, root: NodeId, seed: NodeId) -> Result<Vec<Option<NodeId>>> {
    let mut grads: Vec<Option<NodeId>> = vec![None; root as usize + 1];
    grads[root as usize] = Some(seed);
    walk(graph, &mut grads, 0, root + 1)?;
    Ok(grads)
}

/// Propagate gradients through nodes `lo..hi`, from the last to the first.
/// A checkpointed segment is handled as one unit (see `segment`); its
/// copy is walked by a nested call, so the depth of that recursion is the
/// nesting depth of the user's `checkpoint` calls, never the graph's size.
/// A custom-gradient region is one unit too (see `vjp`).
fn walk(graph: &Graph, grads: &mut Vec<Option<NodeId>>, lo: NodeId, hi: NodeId) -> Result<()> {
    let units = graph.top_units(lo, hi);
    let mut next = units.iter().peekable();
    let mut id = hi;
    while id > lo {
        id -= 1;
        if let Some(&unit) = next.next_if(|u| id < u.end()) {
            match unit {
                segment::Unit::Segment(seg) => segment::replay_segment(graph, grads, seg, id + 1)?,
                segment::Unit::Vjp { index, .. } => vjp::apply_vjp(graph, grads, index, id + 1)?,
            }
            id = unit.start();
            continue;
        }
        differentiate_node(graph, grads, id)?;
    }
    Ok(())
}

/// Apply node `id`'s gradient rule, adding what it gives each input to
/// that input's gradient.
fn differentiate_node(graph: &Graph, grads: &mut [Option<NodeId>], id: NodeId) -> Result<()> {
    let Some(g) = grads[id as usize] else { return Ok(()) };
    let node = graph.node(id);
    if node.flags & flags::REQUIRES_GRAD == 0 || node.op.is_leaf() {
        return Ok(());
    }
    let info = node.op.info();
    let input_ids = graph.inputs_of(id);
    let inputs: SmallVec<[Tensor<'_>; 3]> = input_ids.iter().map(|&i| graph.tensor(i)).collect();
    let needs: SmallVec<[bool; 3]> =
        inputs.iter().enumerate().map(|(k, x)| x.requires_grad() && info.differentiable_input(k)).collect();
    let input_grads = rules::input_gradients(node.op, &inputs, graph.tensor(id), graph.tensor(g), &needs)?;
    for (k, contribution) in input_grads.into_iter().enumerate() {
        let Some(c) = contribution else { continue };
        if !needs[k] {
            continue;
        }
        // Rules give gradients in the shape the op computed in; a
        // broadcast operand gets its own shape back here, once for all
        // ops.
        let c = rules::unbroadcast(c, &inputs[k].dims())?;
        let slot = &mut grads[input_ids[k] as usize];
        *slot = Some(match *slot {
            None => c.id,
            // Fan-out: contributions add up (pieces of a split join).
            #[cfg(not(target_arch = "wasm32"))]
            Some(previous) => accumulate::accumulate(graph, previous, c)?,
            #[cfg(target_arch = "wasm32")]
            Some(previous) => graph.tensor(previous).add(c)?.id,
        });
    }
    Ok(())
}

impl<'g> Tensor<'g> {
    /// Differentiate a one-element root (implicit seed 1): gradients are
    /// added into every parameter's `grad` and kept for leaf variables and
    /// `retain_grad` tensors. The graph is consumed: another backward over it
    /// is an error (see `backward_with_options` to keep it).
    #[track_caller]
    pub fn backward(self) -> Result<()> {
        self.backward_with_options(BackwardOptions::default())
    }

    /// Backward from a non-scalar root with an explicit cotangent.
    #[track_caller]
    pub fn backward_with(self, seed: Tensor<'g>) -> Result<()> {
        self.backward_with_options(BackwardOptions { seed: Some(seed), keep_graph: false })
    }

    /// Backward with every option. Failure-atomic: on error, no parameter,
    /// gradient or graph node has changed.
    #[track_caller]
    pub fn backward_with_options(self, options: BackwardOptions<'g>) -> Result<()> {
        self.backward_observed(options, &mut |_, _| Ok(()))
    }

    /// `backward_with_options`, calling `grad_ready(param, buffer)` for
    /// every parameter as soon as the executor has computed the gradient
    /// this pass contributes to it (before it is added into `.grad`), while
    /// the rest of the backward pass is still to run: gradients of the last
    /// layers come first. This is what lets data-parallel training start
    /// exchanging early gradients during backward. `buffer` holds
    /// `param.numel()` values of `param.dtype()` on the parameter's device;
    /// on a backend that records kernels and submits them at the end (wgpu)
    /// its contents are not final until `backward` returns, so read it there
    /// only after. An error from `grad_ready` fails the backward pass
    /// (failure-atomic, as above).
    #[track_caller]
    pub fn backward_observed(
        self,
        options: BackwardOptions<'g>,
        grad_ready: &mut dyn FnMut(&Param, BufferId) -> Result<()>,
    ) -> Result<()> {
        let caller = std::panic::Location::caller();
        self.backward_unlocated(options, grad_ready).map_err(|e| e.or_at(caller))
    }

    fn backward_unlocated(
        self,
        options: BackwardOptions<'g>,
        grad_ready: &mut dyn FnMut(&Param, BufferId) -> Result<()>,
    ) -> Result<()> {
        let graph = self.graph;
        check_root("backward", &self)?;
        if graph.state.borrow().differentiated {
            return Err(Error::autograd(
                "backward",
                "this graph was already differentiated and its saved values released; pass \
                 keep_graph: true to the first backward to differentiate it again",
            ));
        }
        check_seed("backward", &self, options.seed)?;

        let mark = graph.mark();
        let first_new = graph.len() as NodeId;
        let plan = self.plan_backward(options, first_new, grad_ready);
        let plan = match plan {
            Ok(plan) => plan,
            Err(e) => {
                graph.rollback(mark);
                graph.state.borrow_mut().differentiated = false;
                return Err(e);
            }
        };
        graph.commit_backward(plan, options.keep_graph)
    }

    /// Build and run the gradient nodes; changes nothing outside the graph.
    fn plan_backward(
        self,
        options: BackwardOptions<'g>,
        first_new: NodeId,
        grad_ready: &mut dyn FnMut(&Param, BufferId) -> Result<()>,
    ) -> Result<BackwardPlan> {
        let graph = self.graph;
        let _no_grad = graph.set_grad_enabled(false);
        let seed = match options.seed {
            Some(s) => s,
            None => graph.full(&self.dims(), 1.0, self.dtype())?,
        };
        let grads = build_gradients(graph, self.id, seed.id)?;
        let mut plan = BackwardPlan { first_new, ..BackwardPlan::default() };
        {
            let state = graph.state.borrow();
            for (index, (_, leaf, _, _)) in state.params.iter().enumerate() {
                if let Some(Some(g)) = grads.get(*leaf as usize) {
                    plan.params.push((index, *g));
                }
            }
        }
        for id in 0..=self.id {
            let node = graph.node(id);
            if node.flags & (flags::VARIABLE | flags::RETAIN_GRAD) == 0 {
                continue;
            }
            let Some(g) = grads[id as usize] else { continue };
            let total = match graph.tensor(id).grad() {
                Some(previous) => previous.add(graph.tensor(g))?.id,
                None => g,
            };
            plan.kept.push((id, total));
        }
        let mut targets: Vec<NodeId> = plan.params.iter().map(|p| p.1).collect();
        targets.extend(plan.kept.iter().map(|k| k.1));
        // The root's value stays readable after the optimizer step.
        targets.push(self.id);
        // Without keep_graph, saved forward values are released at their
        // last use by the gradient nodes.
        graph.state.borrow_mut().differentiated = !options.keep_graph;
        // (gradient node, parameter, told yet), sorted by node so that the
        // observer finds a computed node's parameters by binary search.
        let mut watched: Vec<(NodeId, Param, bool)> = {
            let state = graph.state.borrow();
            plan.params.iter().map(|&(index, g)| (g, state.params[index].0.clone(), false)).collect()
        };
        watched.sort_by_key(|w| w.0);
        graph.realize_ids_observed(&targets, &mut |node, buffer| {
            let first = watched.partition_point(|w| w.0 < node);
            for (_, param, told) in watched[first..].iter_mut().take_while(|w| w.0 == node) {
                *told = true;
                grad_ready(param, buffer)?;
            }
            Ok(())
        })?;
        // A gradient node that already had a value (a leaf, such as the
        // seed when the root is a parameter) was never computed here.
        for (node, param, told) in &watched {
            if !told {
                let buffer = graph.state.borrow().values[*node as usize].expect("gradient was realized");
                grad_ready(param, buffer)?;
            }
        }
        Ok(plan)
    }
}

#[derive(Default)]
struct BackwardPlan {
    /// (index into the graph's parameter list, gradient node)
    params: Vec<(usize, NodeId)>,
    /// (kept node, its total gradient node)
    kept: Vec<(NodeId, NodeId)>,
    /// The first node this backward pass made: only those may have their
    /// buffer handed to a parameter (earlier ones are the user's tensors,
    /// e.g. a cotangent they passed in).
    first_new: NodeId,
}

impl Graph {
    fn commit_backward(&self, plan: BackwardPlan, keep_graph: bool) -> Result<()> {
        let kept_ids: Vec<NodeId> = plan.kept.iter().map(|k| k.1).collect();
        let param_grads: Vec<NodeId> = plan.params.iter().map(|p| p.1).collect();
        for &(index, g) in &plan.params {
            let (param, buffer, take) = {
                let mut state = self.state.borrow_mut();
                let param = state.params[index].0.clone();
                let node = state.nodes[g as usize];
                // Hand the gradient buffer to the parameter when nothing else
                // uses it; otherwise the parameter gets a copy. One gradient
                // node can serve several parameters (for y = p + q both get
                // the same node), and then every one of them copies.
                let shared = param_grads.iter().filter(|&&n| n == g).count() > 1;
                let buffer = state.values[g as usize].expect("gradient was realized");
                // A buffer another node also holds (a reshaped gradient whose
                // source is still alive) is copied, never handed over.
                let take = g >= plan.first_new
                    && !node.op.is_leaf()
                    && !shared
                    && !kept_ids.contains(&g)
                    && !state.is_shared(buffer);
                if take {
                    state.values[g as usize] = None;
                }
                (param, buffer, take)
            };
            param.accumulate_grad(buffer, take)?;
        }
        let mut state = self.state.borrow_mut();
        for (node, g) in plan.kept {
            match state.kept_grads.iter_mut().find(|(n, _)| *n == node) {
                Some(entry) => entry.1 = g,
                None => state.kept_grads.push((node, g)),
            }
        }
        state.differentiated = !keep_graph;
        Ok(())
    }

    /// Gradients of `root` with respect to each of `wrt`, as new nodes of
    /// this graph that are themselves differentiable (higher order: take the
    /// `grad` of a gradient). Nothing is accumulated anywhere and the graph
    /// is not consumed. A `wrt` tensor the root does not depend on gets zeros.
    #[track_caller]
    pub fn grad<'g>(
        &'g self,
        root: Tensor<'g>,
        wrt: &[Tensor<'g>],
        seed: Option<Tensor<'g>>,
    ) -> Result<Vec<Tensor<'g>>> {
        let caller = std::panic::Location::caller();
        self.grad_unlocated(root, wrt, seed).map_err(|e| e.or_at(caller))
    }

    fn grad_unlocated<'g>(
        &'g self,
        root: Tensor<'g>,
        wrt: &[Tensor<'g>],
        seed: Option<Tensor<'g>>,
    ) -> Result<Vec<Tensor<'g>>> {
        check_root("grad", &root)?;
        check_seed("grad", &root, seed)?;
        for w in wrt {
            if !std::ptr::eq(w.graph, self) {
                return Err(Error::invalid("grad", "a wrt tensor belongs to another graph"));
            }
        }
        let mark = self.mark();
        let result = (|| {
            let _grad_mode = self.set_grad_enabled(true);
            let seed = match seed {
                Some(s) => s,
                None => self.full(&root.dims(), 1.0, root.dtype())?,
            };
            let grads = build_gradients(self, root.id, seed.id)?;
            wrt.iter()
                .map(|w| match grads.get(w.id as usize).copied().flatten() {
                    Some(g) => Ok(self.tensor(g)),
                    None => self.zeros(&w.dims(), w.dtype()),
                })
                .collect::<Result<Vec<_>>>()
        })();
        if result.is_err() {
            self.rollback(mark);
        }
        result
    }
}
