//! Autograd semantics (DESIGN.md, "Autograd"): seeds, fan-out, broadcasting,
//! accumulation, one backward per graph, failure atomicity, no_grad/detach,
//! refusals, frozen parameters, higher order, tie rules.

mod common;

use common::{assert_close, grad_of, param_grad, param_value, values};
use kiln::nn::{Linear, Module};
use kiln::prelude::*;
use kiln::{BackwardOptions, BlockingParam, ErrorKind};

// ----- seeds ----------------------------------------------------------------

#[test]
fn one_element_root_gets_an_implicit_seed_of_one() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    // A [1, 1] root is one element even though it is not rank 0.
    let x = graph.variable(&[3.0f64], &[1, 1]).unwrap();
    x.mul(x).unwrap().backward().unwrap();
    assert_close(&grad_of(&x), &[6.0], 1e-12);
}

#[test]
fn implicit_seed_on_a_non_scalar_root_is_an_error() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f64, 2.0, 3.0], &[3]).unwrap();
    let y = x.mul(x).unwrap();
    let before = graph.len();
    let err = y.backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shape, "{err}");
    assert!(err.message().contains("[3]"), "the message names the root's shape: {err}");
    assert_eq!(graph.len(), before, "a refused backward adds no nodes");
    assert!(x.grad().is_none());
}

#[test]
fn backward_with_cotangent_for_non_scalar_roots() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f64, 2.0, 3.0], &[3]).unwrap();
    let y = x.mul(x).unwrap();
    let seed = graph.tensor_from(&[1.0f64, 0.5, 2.0], &[3]).unwrap();
    y.backward_with(seed).unwrap();
    // dy/dx = 2x, weighted by the cotangent.
    assert_close(&grad_of(&x), &[2.0, 2.0, 12.0], 1e-12);
}

#[test]
fn cotangent_of_the_wrong_shape_or_dtype_is_refused() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f64, 2.0, 3.0], &[3]).unwrap();
    let y = x.mul(2.0).unwrap();
    let wrong_shape = graph.tensor_from(&[1.0f64, 1.0], &[2]).unwrap();
    assert_eq!(y.backward_with(wrong_shape).unwrap_err().kind(), ErrorKind::Shape);
    let wrong_dtype = graph.tensor_from(&[1.0f32, 1.0, 1.0], &[3]).unwrap();
    assert_eq!(y.backward_with(wrong_dtype).unwrap_err().kind(), ErrorKind::Shape);
}

// ----- fan-out ----------------------------------------------------------------

#[test]
fn fan_out_sums_contributions_x2_plus_4x() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let xs = [-2.0f64, 0.5, 3.0];
    let x = graph.variable(&xs, &[3]).unwrap();
    // x is used three times.
    let y = x.mul(x).unwrap().add(x.mul(4.0).unwrap()).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let expected: Vec<f64> = xs.iter().map(|x| 2.0 * x + 4.0).collect();
    assert_close(&grad_of(&x), &expected, 1e-12);
}

#[test]
fn diamond_s_equals_x_plus_1_y_equals_s_squared() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[2.0f64], &[]).unwrap();
    let s = x.add(1.0).unwrap();
    let y = s.mul(s).unwrap();
    y.backward().unwrap();
    // dy/dx = 2s = 6 (a walk that visits s's gradient before both uses are
    // summed would give 9 or 3).
    assert_eq!(values(&x.grad().unwrap()), vec![6.0]);
}

#[test]
fn w_equals_xy_plus_x_at_3_4() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[3.0f64], &[]).unwrap();
    let y = graph.variable(&[4.0f64], &[]).unwrap();
    let w = x.mul(y).unwrap().add(x).unwrap();
    w.backward().unwrap();
    assert_eq!(grad_of(&x), vec![5.0]);
    assert_eq!(grad_of(&y), vec![3.0]);
}

// ----- broadcasting -------------------------------------------------------------

#[test]
fn broadcast_operand_gradient_is_summed_back_to_its_shape() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let a = graph.variable(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let b = graph.variable(&[10.0f64, 20.0, 30.0], &[1, 3]).unwrap();
    let y = a.add(b).unwrap();
    assert_eq!(y.dims().as_slice(), &[2, 3]);
    y.backward_with(graph.ones(&[2, 3], DType::F64).unwrap()).unwrap();
    let gb = b.grad().unwrap();
    assert_eq!(gb.dims().as_slice(), &[1, 3]);
    assert_eq!(values(&gb), vec![2.0, 2.0, 2.0]);
    let ga = a.grad().unwrap();
    assert_eq!(ga.dims().as_slice(), &[2, 3]);
    assert_eq!(values(&ga), vec![1.0; 6]);
}

#[test]
fn gradient_of_shape_4_3_5_is_reduced_to_3_1() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let c = graph.variable(&[1.0f64, 2.0, 3.0], &[3, 1]).unwrap();
    let d = graph.zeros(&[4, 3, 5], DType::F64).unwrap();
    let y = d.add(c).unwrap();
    assert_eq!(y.dims().as_slice(), &[4, 3, 5]);
    // A non-uniform cotangent: element (i, j, k) carries i*15 + j*5 + k.
    let seed: Vec<f64> = (0..60).map(|v| v as f64).collect();
    y.backward_with(graph.tensor_from(&seed, &[4, 3, 5]).unwrap()).unwrap();
    let g = c.grad().unwrap();
    assert_eq!(g.dims().as_slice(), &[3, 1]);
    let expected: Vec<f64> =
        (0..3).map(|j| (0..4).flat_map(|i| (0..5).map(move |k| (i * 15 + j * 5 + k) as f64)).sum()).collect();
    assert_eq!(values(&g), expected);
}

// ----- accumulation, zero_grad, retain_grad ---------------------------------------

#[test]
fn gradients_accumulate_over_two_graphs_then_zero_grad_clears() {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[2.0f64, 3.0], &[2]).unwrap();
    assert!(!p.has_grad());
    {
        let graph = Graph::new(&device);
        let w = graph.param(&p).unwrap();
        w.mul(w).unwrap().sum_all().unwrap().backward().unwrap();
    }
    assert_eq!(param_grad(&p), vec![4.0, 6.0]);
    {
        let graph = Graph::new(&device);
        let w = graph.param(&p).unwrap();
        w.mul(3.0).unwrap().sum_all().unwrap().backward().unwrap();
    }
    assert_eq!(param_grad(&p), vec![7.0, 9.0]);
    p.zero_grad();
    assert!(!p.has_grad());
    assert!(p.grad_blocking().unwrap().is_none());
    // And it starts from scratch afterwards.
    let graph = Graph::new(&device);
    let w = graph.param(&p).unwrap();
    w.sum_all().unwrap().backward().unwrap();
    assert_eq!(param_grad(&p), vec![1.0, 1.0]);
}

#[test]
fn intermediates_keep_no_gradient_unless_retained() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f64, 2.0], &[2]).unwrap();
    let h = x.mul(2.0).unwrap();
    let r = x.mul(3.0).unwrap().retain_grad();
    let loss = h.mul(r).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    assert!(h.grad().is_none(), "an intermediate keeps no gradient by default");
    assert!(loss.grad().is_none(), "not even the root");
    // d loss / d r = h = 2x.
    assert_eq!(grad_of(&r), vec![2.0, 4.0]);
    // loss = 6 x^2 summed: d/dx = 12x.
    assert_eq!(grad_of(&x), vec![12.0, 24.0]);
    // Parameters keep theirs in the Param, constants have none.
    let c = graph.tensor_from(&[1.0f64], &[1]).unwrap();
    assert!(c.grad().is_none());
}

// ----- one backward per graph -------------------------------------------------------

#[test]
fn second_backward_over_the_same_graph_is_an_error() {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[1.5f64, -2.0], &[2]).unwrap();
    let graph = Graph::new(&device);
    let w = graph.param(&p).unwrap();
    let loss = w.mul(w).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    assert_eq!(param_grad(&p), vec![3.0, -4.0]);
    let err = loss.backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Autograd, "{err}");
    assert!(err.message().contains("keep_graph"), "the message says how to allow it: {err}");
    // Nothing was accumulated by the refused call.
    assert_eq!(param_grad(&p), vec![3.0, -4.0]);
}

#[test]
fn keep_graph_allows_a_second_backward_which_accumulates() {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[1.5f64, -2.0], &[2]).unwrap();
    let graph = Graph::new(&device);
    let w = graph.param(&p).unwrap();
    let x = graph.variable(&[0.5f64, 2.0], &[2]).unwrap();
    // sin saves its input, exp its output: saved values must survive.
    let loss = w.mul(x).unwrap().sin().unwrap().exp().unwrap().sum_all().unwrap();
    loss.backward_with_options(BackwardOptions { seed: None, keep_graph: true }).unwrap();
    let first = param_grad(&p);
    let first_x = grad_of(&x);
    loss.backward().unwrap();
    let second = param_grad(&p);
    assert_close(&second, &first.iter().map(|g| 2.0 * g).collect::<Vec<_>>(), 1e-12);
    assert_close(&grad_of(&x), &first_x.iter().map(|g| 2.0 * g).collect::<Vec<_>>(), 1e-12);
    // Expected: d/dw exp(sin(wx)) = exp(sin(wx)) cos(wx) x.
    let expected: Vec<f64> =
        [(1.5f64, 0.5f64), (-2.0, 2.0)].iter().map(|&(w, x)| 2.0 * (w * x).sin().exp() * (w * x).cos() * x).collect();
    assert_close(&second, &expected, 1e-12);
    // The second one did not keep the graph: a third is refused.
    assert_eq!(loss.backward().unwrap_err().kind(), ErrorKind::Autograd);
}

// ----- failure atomicity ---------------------------------------------------------------

#[test]
fn failed_backward_with_wrong_cotangent_changes_nothing_then_succeeds() {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[1.0f64, 2.0, 3.0], &[3]).unwrap();
    // An earlier gradient, to see that it is neither lost nor added to.
    {
        let graph = Graph::new(&device);
        graph.param(&p).unwrap().sum_all().unwrap().backward().unwrap();
    }
    let graph = Graph::new(&device);
    let w = graph.param(&p).unwrap();
    let x = graph.tensor_from(&[4.0f64, 5.0, 6.0], &[3]).unwrap();
    let y = w.mul(x).unwrap();
    let bad = graph.tensor_from(&[1.0f64, 1.0], &[2]).unwrap();
    let nodes = graph.len();
    let err = y.backward_with(bad).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shape);
    assert_eq!(graph.len(), nodes, "no node was added");
    assert_eq!(param_grad(&p), vec![1.0, 1.0, 1.0], "the parameter's gradient is unchanged");
    let good = graph.tensor_from(&[1.0f64, 0.5, 2.0], &[3]).unwrap();
    y.backward_with(good).unwrap();
    assert_eq!(param_grad(&p), vec![1.0 + 4.0, 1.0 + 2.5, 1.0 + 12.0]);
}

#[test]
fn backward_failing_midway_in_the_rules_is_rolled_back() {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[1.0f64, -2.0], &[2]).unwrap();
    let q = Param::new(&device, "q", &[0.5f64, 3.0], &[2]).unwrap();
    let graph = Graph::new(&device);
    let (wp, wq) = (graph.param(&p).unwrap(), graph.param(&q).unwrap());
    let signs = wq.sign().unwrap().sum_all().unwrap();
    let good = wp.mul(wp).unwrap().sum_all().unwrap();
    // The gradient walk reaches p's branch first (higher ids), builds nodes
    // for it, then fails at Sign.
    let bad = good.add(signs).unwrap();
    let nodes = graph.len();
    let err = bad.backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Autograd);
    assert_eq!(graph.len(), nodes, "the partial gradient graph was rolled back");
    assert!(!p.has_grad() && !q.has_grad());
    // The graph was not consumed: another root in it still differentiates.
    good.backward().unwrap();
    assert_eq!(param_grad(&p), vec![2.0, -4.0]);
    assert!(!q.has_grad());
}

#[test]
fn backward_failing_during_execution_is_rolled_back() {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[1.0f64, 2.0, 3.0], &[3]).unwrap();
    let graph = Graph::new(&device);
    let w = graph.param(&p).unwrap();
    let good = w.mul(w).unwrap().sum_all().unwrap();
    // Index 7 is out of range: found only when the node runs.
    let index = graph.tensor_from(&[0i32, 7], &[2]).unwrap();
    let bad = w.index_select(0, index).unwrap().sum_all().unwrap().add(good).unwrap();
    let nodes = graph.len();
    assert!(bad.backward().is_err());
    assert_eq!(graph.len(), nodes);
    assert!(!p.has_grad());
    good.backward().unwrap();
    assert_eq!(param_grad(&p), vec![2.0, 4.0, 6.0]);
    assert_eq!(good.item_blocking().unwrap(), 14.0);
}

// ----- no_grad and detach -------------------------------------------------------------

#[test]
fn no_grad_scope_records_no_gradient_structure() {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[2.0f64], &[1]).unwrap();
    let graph = Graph::new(&device);
    let x = graph.variable(&[3.0f64], &[1]).unwrap();
    let y = {
        let _guard = graph.no_grad();
        assert!(!graph.is_grad_enabled());
        let w = graph.param(&p).unwrap();
        assert!(!w.requires_grad(), "a parameter used under no_grad is a constant");
        x.mul(w).unwrap()
    };
    assert!(graph.is_grad_enabled(), "the guard restores grad mode");
    assert!(!y.requires_grad());
    assert_eq!(y.item_blocking().unwrap(), 6.0);
    let err = y.backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Autograd, "{err}");
    // The closure form.
    let z = graph.with_no_grad(|| x.exp().unwrap());
    assert!(!z.requires_grad());
    // Outside the scope everything records again.
    let w = graph.param(&p).unwrap();
    let y2 = x.mul(w).unwrap();
    assert!(y2.requires_grad());
    y2.backward().unwrap();
    assert_eq!(param_grad(&p), vec![3.0]);
    assert_eq!(grad_of(&x), vec![2.0]);
}

#[test]
fn detach_cuts_one_tensor() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[3.0f64], &[]).unwrap();
    let d = x.detach().unwrap();
    assert!(!d.requires_grad());
    assert_eq!(d.item_blocking().unwrap(), 3.0);
    // y = detach(x) * x: dy/dx = detach(x) = 3, not 2x = 6.
    d.mul(x).unwrap().backward().unwrap();
    assert_eq!(grad_of(&x), vec![3.0]);
}

// ----- refusals --------------------------------------------------------------------------

#[test]
fn integer_root_is_a_dtype_error() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f64, 5.0, 2.0], &[3]).unwrap();
    let root = x.argmax_all().unwrap();
    assert_eq!(root.dtype(), DType::I32);
    let err = root.backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DType, "{err}");
    let err = root.cast(DType::I32).unwrap().backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DType);
    let ints = graph.tensor_from(&[1i32, 2], &[2]).unwrap().sum_all().unwrap();
    assert_eq!(ints.backward().unwrap_err().kind(), ErrorKind::DType);
}

#[test]
fn op_without_rule_is_an_error_naming_the_op() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[-1.0f64, 2.0], &[2]).unwrap();
    let y = x.sign().unwrap().mul(x).unwrap().sum_all().unwrap();
    let err = y.backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Autograd);
    assert_eq!(err.op(), "Sign");
    assert!(err.to_string().contains("Sign"), "{err}");
    assert!(x.grad().is_none(), "no silent zero gradient");
    // Detaching the input of sign is the documented way around it.
    let y = x.detach().unwrap().sign().unwrap().mul(x).unwrap().sum_all().unwrap();
    y.backward().unwrap();
    assert_eq!(grad_of(&x), vec![-1.0, 1.0]);
}

#[test]
fn frozen_parameters_and_constants_get_no_backward_nodes() {
    fn run(frozen_weight: bool) -> (usize, usize, bool, bool) {
        let device = Device::cpu();
        let layer = Linear::new(&device, 3, 2, true, 7).unwrap();
        layer.weight.set_requires_grad(!frozen_weight);
        let graph = Graph::new(&device);
        let x = graph.tensor_from(&[0.5f32; 12], &[4, 3]).unwrap();
        let loss = layer.forward(x).unwrap().sum_all().unwrap();
        loss.backward().unwrap();
        (graph.len(), graph.count_ops("MatMul"), layer.weight.has_grad(), layer.bias.as_ref().unwrap().has_grad())
    }
    let (trainable_len, trainable_matmuls, w_grad, b_grad) = run(false);
    // Forward x·Wᵀ plus one gradient matmul for W; none for the constant x.
    assert_eq!(trainable_matmuls, 2);
    assert!(w_grad && b_grad);
    let (frozen_len, frozen_matmuls, w_grad, b_grad) = run(true);
    assert_eq!(frozen_matmuls, 1, "only the forward matmul: a frozen weight gets no gradient matmul");
    assert!(!w_grad && b_grad);
    assert!(frozen_len < trainable_len, "{frozen_len} vs {trainable_len}");
}

#[test]
fn fully_frozen_model_cannot_be_differentiated_and_records_nothing() {
    let device = Device::cpu();
    let layer = Linear::new(&device, 3, 2, true, 7).unwrap();
    for p in layer.parameters() {
        p.set_requires_grad(false);
    }
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&[0.5f32; 6], &[2, 3]).unwrap();
    let loss = layer.forward(x).unwrap().sum_all().unwrap();
    assert!(!loss.requires_grad());
    let nodes = graph.len();
    assert_eq!(loss.backward().unwrap_err().kind(), ErrorKind::Autograd);
    assert_eq!(graph.len(), nodes);
    // Unfreezing applies to graphs built afterwards.
    layer.weight.set_requires_grad(true);
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&[0.5f32; 6], &[2, 3]).unwrap();
    layer.forward(x).unwrap().sum_all().unwrap().backward().unwrap();
    assert_close(&param_grad(&layer.weight), &[1.0; 6], 1e-6);
}

#[test]
fn the_same_parameter_twice_in_one_sum_gets_both_contributions() {
    // y = p + q where both gradients are the same node of the gradient
    // graph, and z = p + p (fan-out through one leaf).
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[1.0f64, 2.0], &[2]).unwrap();
    let q = Param::new(&device, "q", &[3.0f64, 4.0], &[2]).unwrap();
    let graph = Graph::new(&device);
    let (wp, wq) = (graph.param(&p).unwrap(), graph.param(&q).unwrap());
    wp.add(wq).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(param_grad(&p), vec![1.0, 1.0]);
    assert_eq!(param_grad(&q), vec![1.0, 1.0]);
    let graph = Graph::new(&device);
    let wp = graph.param(&p).unwrap();
    wp.add(wp).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(param_grad(&p), vec![3.0, 3.0]);
}

#[test]
fn scalar_parameters_sharing_the_seed_as_gradient() {
    // For one-element p and q, d(p + q) is the seed itself for both.
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[1.0f64], &[1]).unwrap();
    let q = Param::new(&device, "q", &[2.0f64], &[1]).unwrap();
    let graph = Graph::new(&device);
    let y = graph.param(&p).unwrap().add(graph.param(&q).unwrap()).unwrap();
    y.backward().unwrap();
    assert_eq!(param_grad(&p), vec![1.0]);
    assert_eq!(param_grad(&q), vec![1.0]);
    assert_eq!(y.item_blocking().unwrap(), 3.0);
}

#[test]
fn user_seed_is_not_consumed_by_the_parameter() {
    // The cotangent is the parameter's gradient node; the user's tensor must
    // stay readable after backward.
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[1.0f64, 2.0], &[2]).unwrap();
    let graph = Graph::new(&device);
    let y = graph.param(&p).unwrap().add(1.0).unwrap();
    let seed = graph.ones(&[2], DType::F64).unwrap().mul(3.0).unwrap();
    y.backward_with(seed).unwrap();
    assert_eq!(param_grad(&p), vec![3.0, 3.0]);
    assert_eq!(values(&seed), vec![3.0, 3.0]);
}

// ----- higher order ---------------------------------------------------------------------

#[test]
fn second_derivative_of_x_cubed_is_6x() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let xs = [-1.5f64, 0.5, 2.0];
    let x = graph.variable(&xs, &[3]).unwrap();
    let y = x.mul(x).unwrap().mul(x).unwrap().sum_all().unwrap();
    let dy = graph.grad(y, &[x], None).unwrap()[0];
    assert!(dy.requires_grad(), "the first derivative is differentiable");
    assert_close(&values(&dy), &xs.iter().map(|x| 3.0 * x * x).collect::<Vec<_>>(), 1e-12);
    let d2y = graph.grad(dy.sum_all().unwrap(), &[x], None).unwrap()[0];
    assert_close(&values(&d2y), &xs.iter().map(|x| 6.0 * x).collect::<Vec<_>>(), 1e-12);
    // Graph::grad accumulates nothing and does not consume the graph.
    assert!(x.grad().is_none());
    y.backward().unwrap();
    assert_close(&grad_of(&x), &xs.iter().map(|x| 3.0 * x * x).collect::<Vec<_>>(), 1e-12);
}

#[test]
fn grad_with_respect_to_an_unrelated_tensor_is_zeros() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f64, 2.0], &[2]).unwrap();
    let z = graph.variable(&[5.0f64, 6.0, 7.0], &[3]).unwrap();
    let g = graph.grad(x.sum_all().unwrap(), &[x, z], None).unwrap();
    assert_eq!(values(&g[0]), vec![1.0, 1.0]);
    assert_eq!(g[1].dims().as_slice(), &[3]);
    assert_eq!(values(&g[1]), vec![0.0; 3]);
}

/// A 3-4-1 tanh MLP in f64 and its mean squared error on a fixed batch.
struct SmallMlp {
    l1: Linear,
    l2: Linear,
}

impl SmallMlp {
    fn new(device: &Device) -> SmallMlp {
        SmallMlp {
            l1: Linear::with_dtype(device, 3, 4, true, 11, DType::F64).unwrap(),
            l2: Linear::with_dtype(device, 4, 1, true, 12, DType::F64).unwrap(),
        }
    }
    fn params(&self) -> Vec<Param> {
        let mut p = self.l1.parameters();
        p.extend(self.l2.parameters());
        p
    }
    fn loss<'g>(&self, graph: &'g Graph) -> Tensor<'g> {
        let x =
            graph.tensor_from(&[0.1f64, -0.4, 0.7, 1.0, 0.3, -0.2, -0.5, 0.9, 0.2, 0.6, -0.8, 0.4], &[4, 3]).unwrap();
        let t = graph.tensor_from(&[0.5f64, -0.3, 0.8, 0.1], &[4, 1]).unwrap();
        let h = self.l1.forward(x).unwrap().tanh().unwrap();
        mse_loss(self.l2.forward(h).unwrap(), t).unwrap()
    }
}

#[test]
fn hessian_vector_product_agrees_with_finite_differences_of_the_gradient() {
    let device = Device::cpu();
    let mlp = SmallMlp::new(&device);
    let params = mlp.params();
    // A fixed direction v, one block per parameter.
    let mut rng = kiln::host_rng::SplitMix64::new(99);
    let v: Vec<Vec<f64>> = params.iter().map(|p| (0..p.numel()).map(|_| rng.uniform(-1.0, 1.0)).collect()).collect();

    // Analytic: Hv = d/dθ <∇L(θ), v>, by differentiating the gradient graph.
    let hv: Vec<Vec<f64>> = {
        let graph = Graph::new(&device);
        let leaves: Vec<Tensor<'_>> = params.iter().map(|p| graph.param(p).unwrap()).collect();
        let loss = mlp.loss(&graph);
        let grads = graph.grad(loss, &leaves, None).unwrap();
        let mut gv: Option<Tensor<'_>> = None;
        for ((g, vi), p) in grads.iter().zip(&v).zip(&params) {
            let vt = graph.tensor_from(vi, &p.dims()).unwrap();
            let term = g.mul(vt).unwrap().sum_all().unwrap();
            gv = Some(match gv {
                None => term,
                Some(acc) => acc.add(term).unwrap(),
            });
        }
        graph.grad(gv.unwrap(), &leaves, None).unwrap().iter().map(values).collect()
    };

    // Numeric: (∇L(θ + εv) − ∇L(θ − εv)) / 2ε, gradients from ordinary backward.
    let theta: Vec<Vec<f64>> = params.iter().map(param_value).collect();
    let gradient_at = |sign: f64, eps: f64| -> Vec<Vec<f64>> {
        for ((p, t), vi) in params.iter().zip(&theta).zip(&v) {
            let shifted: Vec<f64> = t.iter().zip(vi).map(|(t, v)| t + sign * eps * v).collect();
            p.set_value(&HostData::F64(shifted)).unwrap();
            p.zero_grad();
        }
        let graph = Graph::new(&device);
        mlp.loss(&graph).backward().unwrap();
        params.iter().map(param_grad).collect()
    };
    let eps = 1e-5;
    let plus = gradient_at(1.0, eps);
    let minus = gradient_at(-1.0, eps);
    let mut worst = 0.0f64;
    for k in 0..params.len() {
        for j in 0..params[k].numel() {
            let numeric = (plus[k][j] - minus[k][j]) / (2.0 * eps);
            let err = (numeric - hv[k][j]).abs() / (1e-6 + 1e-4 * hv[k][j].abs());
            worst = worst.max(err);
            assert!(err <= 1.0, "param {k} element {j}: Hv {} vs finite differences {numeric}", hv[k][j]);
        }
    }
    // Non-trivial: the Hessian of a tanh MLP's loss is not zero along v.
    assert!(hv.iter().flatten().any(|h| h.abs() > 1e-3), "{hv:?}");
    assert!(worst.is_finite());
}

// ----- ties ------------------------------------------------------------------------------------

#[test]
fn max_and_min_reductions_share_gradient_equally_between_ties() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f64, 3.0, 3.0, 2.0], &[4]).unwrap();
    x.max_all().unwrap().backward().unwrap();
    assert_eq!(grad_of(&x), vec![0.0, 0.5, 0.5, 0.0]);

    let graph = Graph::new(&device);
    let x = graph.variable(&[2.0f64, 1.0, 1.0, 1.0], &[4]).unwrap();
    x.min_all().unwrap().backward().unwrap();
    let third = 1.0 / 3.0;
    assert_close(&grad_of(&x), &[0.0, third, third, third], 1e-15);

    // Per row over one axis, with keepdim.
    let graph = Graph::new(&device);
    let x = graph.variable(&[5.0f64, 5.0, 1.0, 0.0, 4.0, 4.0], &[2, 3]).unwrap();
    let m = x.max(&[1], true).unwrap();
    assert_eq!(m.dims().as_slice(), &[2, 1]);
    m.backward_with(graph.tensor_from(&[2.0f64, 6.0], &[2, 1]).unwrap()).unwrap();
    assert_eq!(grad_of(&x), vec![1.0, 1.0, 0.0, 0.0, 3.0, 3.0]);
}

#[test]
fn maximum_and_minimum_ties_send_the_whole_gradient_to_the_first_operand() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let a = graph.variable(&[1.0f64, 2.0, 3.0], &[3]).unwrap();
    let b = graph.variable(&[1.0f64, 5.0, 0.0], &[3]).unwrap();
    a.maximum(b).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(grad_of(&a), vec![1.0, 0.0, 1.0]);
    assert_eq!(grad_of(&b), vec![0.0, 1.0, 0.0]);

    let graph = Graph::new(&device);
    let a = graph.variable(&[1.0f64, 2.0, 3.0], &[3]).unwrap();
    let b = graph.variable(&[1.0f64, 5.0, 0.0], &[3]).unwrap();
    a.minimum(b).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(grad_of(&a), vec![1.0, 1.0, 0.0]);
    assert_eq!(grad_of(&b), vec![0.0, 0.0, 1.0]);

    // Swapping the operands moves the tie's gradient with the first one.
    let graph = Graph::new(&device);
    let a = graph.variable(&[1.0f64], &[1]).unwrap();
    let b = graph.variable(&[1.0f64], &[1]).unwrap();
    b.maximum(a).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(grad_of(&b), vec![1.0]);
    assert_eq!(grad_of(&a), vec![0.0]);
}

/// A pooling window whose real pixels are all -inf ties with its padding;
/// the kernels send the gradient to the first real pixel, and the adjoint
/// rule of MaxPool2dBackward must pick the same one.
#[test]
fn max_pool_gather_picks_the_first_real_pixel_when_everything_is_minus_infinity() {
    use kiln::Window2d;
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let window = Window2d::new([2, 2], [2, 2], [1, 1], [1, 1]).unwrap();
    let x = graph.tensor_from(&[f64::NEG_INFINITY; 4], &[1, 1, 2, 2]).unwrap();
    // The pooled shape is 2x2: one window per pixel, each holding one real pixel.
    let g = graph.variable(&[1.0f64, 1.0, 1.0, 1.0], &[1, 1, 2, 2]).unwrap();
    let routed = x.max_pool2d_backward(g, window).unwrap();
    let probe = graph.tensor_from(&[10.0f64, 20.0, 30.0, 40.0], &[1, 1, 2, 2]).unwrap();
    let dot = routed.mul(probe).unwrap().sum_all().unwrap();
    let grads = graph.grad(dot, &[g], None).unwrap();
    assert_eq!(grads[0].to_vec_blocking::<f64>().unwrap(), vec![10.0, 20.0, 30.0, 40.0]);
}
