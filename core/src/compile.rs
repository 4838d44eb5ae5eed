//! Compiled functions: build a step's graph once per input signature and
//! run it again on new input data without building it again (what
//! `jax.jit` does for a Python function).
//!
//! `Compiled::new(&device, f)` wraps `f(graph, inputs) -> outputs`. The
//! first call with a given signature (each input's dims and dtype) *traces*
//! `f`: it runs it once on a fresh graph whose inputs are leaves holding
//! the call's data (float inputs are variables, so `Graph::grad` can
//! differentiate with respect to them), and keeps that graph. Every call
//! then writes its data into the input leaves, frees the values the
//! previous call computed, and executes the outputs, which replays the
//! executor's cached plan of that graph (see `exec::plan`): no node is
//! built, no gradient rule applied, nothing planned again.
//!
//! The contract is `jax.jit`'s: the graph `f` builds may depend on the
//! inputs' dims and dtypes, never on their values, and `f` runs once per
//! signature, so side effects in it happen once. `f` must build, not run:
//! reading a value, `realize` or `backward` inside it is refused (take
//! gradients with `Graph::grad`, which builds nodes and runs nothing), and
//! so are parameters (their values change between calls; a compiled
//! function reads only its inputs). Nothing is cached on values, so a call
//! with new data computes from that data; a new signature traces anew.
//! Only the outputs are kept: every other value is freed at its last use.

use std::panic::Location;

use crate::device::Device;
use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::graph::{Graph, NodeId, SlabRange, Tensor};
use crate::shape::{check_shape, fmt_dims, Dims};

/// Traces kept per compiled function, most recently used last.
const TRACES_KEPT: usize = 8;

/// One traced graph, for one input signature.
struct Trace {
    signature: Vec<(Dims, DType)>,
    graph: Graph,
    inputs: Vec<NodeId>,
    outputs: Vec<NodeId>,
    /// The executor's plan of this graph, once recorded.
    plan: Option<std::rc::Rc<crate::exec::plan::Plan>>,
}

/// A function traced once per input signature and replayed afterwards.
/// See the module docs.
pub struct Compiled<F> {
    device: Device,
    f: F,
    traces: Vec<Trace>,
    location: &'static Location<'static>,
}

impl<F> Compiled<F>
where
    F: for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Vec<Tensor<'g>>>,
{
    /// Wrap `f`; nothing runs until the first `call`.
    #[track_caller]
    pub fn new(device: &Device, f: F) -> Compiled<F> {
        Compiled { device: device.clone(), f, traces: Vec::new(), location: Location::caller() }
    }

    /// How many signatures have been traced and are kept.
    pub fn traces(&self) -> usize {
        self.traces.len()
    }

    /// Run the function on `inputs` (data and dims of each) and return the
    /// outputs' values, in the order `f` returned them.
    pub async fn call(&mut self, inputs: &[(&HostData, &[usize])]) -> Result<Vec<HostData>> {
        for (k, &(data, dims)) in inputs.iter().enumerate() {
            let expected = check_shape("compile", dims, data.dtype()).map_err(|e| e.at(self.location))?;
            if data.len() != expected {
                return Err(Error::shape(
                    "compile",
                    format!(
                        "input {k}: {} values given for shape {} ({expected} elements)",
                        data.len(),
                        fmt_dims(dims)
                    ),
                )
                .at(self.location));
            }
        }
        let signature: Vec<(Dims, DType)> =
            inputs.iter().map(|(d, dims)| (Dims::from_slice(dims), d.dtype())).collect();
        let index = match self.traces.iter().position(|t| t.signature == signature) {
            Some(i) => {
                let trace = &self.traces[i];
                let state = trace.graph.state.borrow();
                for (&id, (data, _)) in trace.inputs.iter().zip(inputs) {
                    let buffer = state.values[id as usize].expect("input leaves keep their values");
                    self.device.backend().upload(buffer, data)?;
                }
                drop(state);
                let trace = self.traces.remove(i);
                self.traces.push(trace);
                self.traces.len() - 1
            }
            None => {
                let trace = self.trace(inputs, signature)?;
                if self.traces.len() >= TRACES_KEPT {
                    self.traces.remove(0);
                }
                self.traces.push(trace);
                self.traces.len() - 1
            }
        };
        let trace = &mut self.traces[index];
        // Only the outputs are read: saved values may go at their last use.
        trace.graph.state.borrow_mut().differentiated = true;
        let result = trace.graph.realize_ids_held(&trace.outputs, &mut trace.plan);
        let (trace, graph) = (&*trace, &trace.graph);
        // Reads snapshot their buffer when made, so the values can go back
        // to the pool before the futures are awaited.
        let reads: Result<Vec<_>> = result.map(|()| {
            let state = graph.state.borrow();
            trace
                .outputs
                .iter()
                .map(|&id| {
                    let node = state.nodes[id as usize];
                    let len = SlabRange::of(&state.dims_slab, node.dims).iter().product();
                    let buffer = state.values[id as usize].expect("output was computed");
                    self.device.backend().read(buffer, node.dtype, len)
                })
                .collect()
        });
        release_computed(graph);
        let mut values = Vec::with_capacity(trace.outputs.len());
        for read in reads? {
            values.push(read.await?);
        }
        Ok(values)
    }

    /// Build the graph of `f` for this signature, checking that it only
    /// built nodes.
    fn trace(&self, inputs: &[(&HostData, &[usize])], signature: Vec<(Dims, DType)>) -> Result<Trace> {
        let graph = Graph::new(&self.device);
        let (ids, outputs) = {
            let mut tensors = Vec::with_capacity(inputs.len());
            for &(data, dims) in inputs {
                let t = if data.dtype().is_float() {
                    graph.variable_from_host(data.clone(), dims)
                } else {
                    graph.from_host(data.clone(), dims)
                };
                tensors.push(t.map_err(|e| e.or_at(self.location))?);
            }
            let outputs = (self.f)(&graph, &tensors)?;
            for o in &outputs {
                if !std::ptr::eq(o.graph, &graph) {
                    return Err(Error::invalid("compile", "an output belongs to another graph").at(self.location));
                }
            }
            (tensors.iter().map(|t| t.id).collect::<Vec<_>>(), outputs.iter().map(|t| t.id).collect::<Vec<_>>())
        };
        {
            let state = graph.state.borrow();
            if !state.params.is_empty() {
                return Err(Error::invalid(
                    "compile",
                    "the function used a parameter; a compiled function reads only its inputs (pass the \
                     parameter's value as an input)",
                )
                .at(self.location));
            }
            let ran = state.differentiated
                || (0..state.nodes.len()).any(|i| !state.nodes[i].op.is_leaf() && state.values[i].is_some());
            if ran {
                return Err(Error::invalid(
                    "compile",
                    "the function ran part of its graph (a read, realize or backward) while traced; a compiled \
                     function only builds nodes (take gradients with Graph::grad)",
                )
                .at(self.location));
            }
        }
        Ok(Trace { signature, graph, inputs: ids, outputs, plan: None })
    }
}

/// Give back the buffers of every computed value except the leaves'.
fn release_computed(graph: &Graph) {
    let device = graph.device().clone();
    let mut state = graph.state.borrow_mut();
    let state = &mut *state;
    let owned = std::mem::take(&mut state.owned);
    let mut kept = Vec::with_capacity(owned.len());
    for &id in &owned {
        if state.nodes[id as usize].op.is_leaf() {
            kept.push(id);
            continue;
        }
        state.release_value(&device, id);
    }
    state.owned = kept;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::{Activation, Module, Sequential};

    fn floats(data: &HostData) -> Vec<f32> {
        match data {
            HostData::F32(v) => v.clone(),
            other => panic!("expected f32, got {}", other.dtype()),
        }
    }

    /// W3's chain and its gradient, as built without compiling.
    fn chain<'g>(graph: &'g Graph, x: Tensor<'g>, steps: usize) -> Result<Vec<Tensor<'g>>> {
        let mut y = x;
        for _ in 0..steps {
            y = y.mul(1.0001)?.add(0.001)?.tanh()?;
        }
        let loss = y.sum_all()?;
        let dx = graph.grad(loss, &[x], None)?;
        Ok(vec![loss, dx[0]])
    }

    fn uncompiled(device: &Device, x: &[f32], steps: usize) -> Vec<Vec<f32>> {
        let graph = Graph::new(device);
        let v = graph.variable(x, &[x.len()]).unwrap();
        let outs = chain(&graph, v, steps).unwrap();
        outs.iter().map(|t| pollster::block_on(t.to_vec::<f32>()).unwrap()).collect()
    }

    #[test]
    fn calls_replay_one_trace_and_equal_the_uncompiled_graph_bit_for_bit() {
        let device = Device::cpu();
        device.set_plan_cache(true);
        let mut f = Compiled::new(&device, |g, xs| chain(g, xs[0], 50));
        for (round, x) in [[0.5f32, -1.0, 2.0, 0.0], [0.25, 3.0, -0.5, 1.5], [0.5, -1.0, 2.0, 0.0]].iter().enumerate() {
            let data = HostData::F32(x.to_vec());
            let before = device.exec_stats();
            let out = pollster::block_on(f.call(&[(&data, &[4])])).unwrap();
            let after = device.exec_stats();
            let expected = uncompiled(&device, x, 50);
            assert_eq!(out.iter().map(floats).collect::<Vec<_>>(), expected, "round {round}");
            if round > 0 {
                // Same structure: the executor replays its plan.
                assert_eq!(after.plans_built, before.plans_built, "round {round} planned anew");
                assert!(after.plans_reused > before.plans_reused);
            }
        }
        assert_eq!(f.traces(), 1);
        // Nothing but the leaves stays computed between calls.
        assert!(f.traces[0].graph.state.borrow().owned.iter().all(|&id| id < 1));
    }

    #[test]
    fn a_held_plan_is_not_replayed_after_the_executor_switches_change() {
        let device = Device::cpu();
        device.set_plan_cache(true);
        device.set_fusion(true);
        let mut f = Compiled::new(&device, |g, xs| chain(g, xs[0], 20));
        let data = HostData::F32(vec![0.5, -1.0, 2.0]);
        let fused = pollster::block_on(f.call(&[(&data, &[3])])).unwrap();
        let groups = device.exec_stats().fused_groups;
        assert!(groups > 0);
        device.set_fusion(false);
        let before = device.exec_stats();
        let unfused = pollster::block_on(f.call(&[(&data, &[3])])).unwrap();
        let after = device.exec_stats();
        assert_eq!(after.fused_groups, before.fused_groups, "a fused plan was replayed with fusion off");
        assert_eq!(after.plans_built, before.plans_built + 1);
        assert_eq!(fused, unfused);
        device.set_plan_cache(false);
        let before = device.exec_stats();
        let uncached = pollster::block_on(f.call(&[(&data, &[3])])).unwrap();
        assert_eq!(device.exec_stats().plans_reused, before.plans_reused);
        assert_eq!(uncached, fused);
    }

    #[test]
    fn a_new_signature_traces_again_and_computes_its_own_shape() {
        let device = Device::cpu();
        let mut f = Compiled::new(&device, |_, xs| Ok(vec![xs[0].mul(xs[0])?.sum_all()?]));
        let a = HostData::F32(vec![1.0, 2.0, 3.0]);
        let b = HostData::F32(vec![1.0, 2.0, 3.0, 4.0]);
        let c = HostData::F64(vec![1.0, 2.0, 3.0]);
        let run = |f: &mut Compiled<_>, d: &HostData, dims: &[usize]| {
            pollster::block_on(f.call(&[(d, dims)])).unwrap()[0].to_f64_vec()[0]
        };
        assert_eq!(run(&mut f, &a, &[3]), 14.0);
        assert_eq!(run(&mut f, &b, &[4]), 30.0);
        assert_eq!(run(&mut f, &b, &[2, 2]), 30.0);
        assert_eq!(run(&mut f, &c, &[3]), 14.0);
        assert_eq!(f.traces(), 4);
        assert_eq!(run(&mut f, &HostData::F32(vec![2.0, 0.0, 1.0]), &[3]), 5.0);
        assert_eq!(f.traces(), 4);
    }

    #[test]
    fn a_function_that_runs_reads_or_uses_parameters_is_refused() {
        let device = Device::cpu();
        let data = HostData::F32(vec![1.0, 2.0]);
        let mut reads = Compiled::new(&device, |_, xs| {
            let y = xs[0].exp()?;
            pollster::block_on(y.to_vec::<f32>())?;
            Ok(vec![y])
        });
        let e = pollster::block_on(reads.call(&[(&data, &[2])])).unwrap_err();
        assert!(e.to_string().contains("ran part of its graph"), "{e}");
        let mut backward = Compiled::new(&device, |_, xs| {
            let y = xs[0].sum_all()?;
            y.backward()?;
            Ok(vec![y])
        });
        assert!(pollster::block_on(backward.call(&[(&data, &[2])])).is_err());
        let model = Sequential::mlp(&device, &[2, 1], Activation::Relu, 1).unwrap();
        let mut params = Compiled::new(&device, move |_, xs| Ok(vec![model.forward(xs[0])?]));
        let e = pollster::block_on(params.call(&[(&data, &[1, 2])])).unwrap_err();
        assert!(e.to_string().contains("parameter"), "{e}");
        // Data that does not fill its dims.
        let mut f = Compiled::new(&device, |_, xs| Ok(vec![xs[0].exp()?]));
        let e = pollster::block_on(f.call(&[(&data, &[3])])).unwrap_err();
        assert!(e.to_string().contains("2 values given for shape"), "{e}");
        assert_eq!(f.traces(), 0);
    }
}
