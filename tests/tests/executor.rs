//! The executor (DESIGN.md, "The graph" and "Autograd"): buffers are freed at
//! their last use, saved-tensor pruning, iterative walks over huge graphs,
//! laziness, stale parameters, run-to-run determinism.

mod common;

use common::{assert_close, grad_of, param_grad, values};
use kiln::nn::{Activation, Module, Sequential};
use kiln::optim::{Optimizer, Sgd};
use kiln::prelude::*;
use kiln::{BlockingParam, ErrorKind};

/// Peak number of extra live buffers while realizing a `depth`-layer chain
/// `y = tanh(y * c + 0.5)`, built by `make_input`.
fn chain_peak(depth: usize, mode: &str) -> usize {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let data: Vec<f32> = (0..16).map(|i| i as f32 / 16.0).collect();
    let _guard = (mode == "no_grad").then(|| graph.no_grad());
    let mut y = match mode {
        "constant" => graph.tensor_from(&data, &[4, 4]).unwrap(),
        _ => graph.variable(&data, &[4, 4]).unwrap(),
    };
    let c = graph.tensor_from(&[0.9f32], &[1]).unwrap();
    for _ in 0..depth {
        y = y.mul(c).unwrap().add(0.5).unwrap().tanh().unwrap();
    }
    assert_eq!(y.requires_grad(), mode == "grad");
    let before = device.stats();
    device.reset_peak();
    graph.realize(&[y]).unwrap();
    let after = device.stats();
    // The result is correct (so the chain really ran).
    let mut expected: Vec<f64> = data.iter().map(|&v| v as f64).collect();
    for _ in 0..depth {
        for v in expected.iter_mut() {
            *v = (*v * 0.9f32 as f64 + 0.5).tanh();
        }
    }
    assert_close(&values(&y), &expected, 1e-5);
    after.peak_live_buffers - before.live_buffers
}

#[test]
fn forward_peak_live_buffers_is_small_and_independent_of_depth() {
    for mode in ["no_grad", "constant"] {
        let shallow = chain_peak(10, mode);
        let deep = chain_peak(100, mode);
        assert_eq!(shallow, deep, "{mode}: peak grows with depth ({shallow} at 10 layers, {deep} at 100)");
        // The output, the value being consumed, and a scalar constant.
        assert!(deep <= 4, "{mode}: {deep} buffers live at once for a chain");
    }
}

#[test]
fn with_grad_the_saved_values_do_stay_alive() {
    // The contrast that shows the measurement above can fail: tanh saves
    // its output and mul its inputs for the backward pass.
    let shallow = chain_peak(10, "grad");
    let deep = chain_peak(100, "grad");
    assert!(deep >= shallow + 90, "saved values should accumulate: {shallow} vs {deep}");
}

#[test]
fn add_node_inputs_are_not_kept_for_backward() {
    // y = a + b with a = x·2, b = x·3: Add's rule reads neither operand, so
    // a and b are freed as soon as y is computed. The constants are leaves
    // (made before the measurement) so that only the intermediates count.
    fn extra_live(combine: for<'g> fn(Tensor<'g>, Tensor<'g>) -> Tensor<'g>) -> (usize, f64) {
        let device = Device::cpu();
        let graph = Graph::new(&device);
        let x = graph.variable(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let two = graph.tensor_from(&[2.0f32], &[1]).unwrap();
        let three = graph.tensor_from(&[3.0f32], &[1]).unwrap();
        let a = x.mul(two).unwrap();
        let b = x.mul(three).unwrap();
        let y = combine(a, b);
        let before = device.stats().live_buffers;
        graph.realize(&[y]).unwrap();
        let extra = device.stats().live_buffers - before;
        y.sum_all().unwrap().backward().unwrap();
        (extra, grad_of(&x).iter().sum())
    }
    let (extra, grad_sum) = extra_live(|a, b| a.add(b).unwrap());
    assert_eq!(extra, 1, "only y stays live; a and b were freed");
    assert_eq!(grad_sum, 15.0, "d(2x + 3x)/dx = 5 per element");
    // Control: Mul's rule reads both operands, so they stay.
    let (extra, grad_sum) = extra_live(|a, b| a.mul(b).unwrap());
    assert_eq!(extra, 3, "y plus the saved a and b");
    // d(6x²)/dx = 12x at 1, 2, 3.
    assert_eq!(grad_sum, 72.0);
}

#[test]
fn saved_values_are_released_by_the_backward_pass() {
    let device = Device::cpu();
    let base = device.stats().live_buffers;
    let graph = Graph::new(&device);
    let x = graph.variable(&[0.5f32; 8], &[8]).unwrap();
    let mut y = x;
    for _ in 0..50 {
        y = y.tanh().unwrap();
    }
    let loss = y.sum_all().unwrap();
    loss.backward().unwrap();
    // Live: x, its gradient, the loss (and at most a couple of constants),
    // not the 50 saved tanh outputs.
    let live = device.stats().live_buffers - base;
    assert!(live <= 5, "{live} buffers still live after backward");
    drop(graph);
    assert_eq!(device.stats().live_buffers, base, "dropping the graph returns every buffer");
}

#[test]
fn chain_of_100_000_nodes_builds_runs_and_differentiates() {
    // Run on a thread with a deliberately small stack: any recursive walk
    // over the graph would overflow it.
    let handle = std::thread::Builder::new()
        .stack_size(1024 * 1024)
        .spawn(|| {
            let device = Device::cpu();
            let graph = Graph::new(&device);
            let x = graph.variable(&[1.0f64], &[1]).unwrap();
            let c = graph.tensor_from(&[0.99999f64], &[1]).unwrap();
            let d = graph.tensor_from(&[0.001f64], &[1]).unwrap();
            let mut y = x;
            for _ in 0..50_000 {
                y = y.mul(c).unwrap().add(d).unwrap();
            }
            assert!(graph.len() >= 100_000);
            let value = y.item_blocking().unwrap();
            y.backward().unwrap();
            let grad = grad_of(&x)[0];
            let (mut expected, mut dydx) = (1.0f64, 1.0f64);
            for _ in 0..50_000 {
                expected = expected * 0.99999 + 0.001;
                dydx *= 0.99999;
            }
            assert_close(&[value], &[expected], 1e-9);
            assert_close(&[grad], &[dydx], 1e-9);
            // Second order over the whole chain works too (all iterative).
            let graph2 = Graph::new(&device);
            let x = graph2.variable(&[0.3f64], &[1]).unwrap();
            let mut y = x;
            for _ in 0..50_000 {
                y = y.mul(1.0).unwrap();
            }
            let y = y.mul(x).unwrap();
            let g = graph2.grad(y, &[x], None).unwrap()[0];
            let g2 = graph2.grad(g, &[x], None).unwrap()[0];
            assert_close(&values(&g2), &[2.0], 1e-12);
        })
        .unwrap();
    handle.join().expect("the 100,000-node chain must not overflow the stack");
}

#[test]
fn lazy_evaluation_runs_only_what_the_read_needs() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    // A branch that would fail if it ran (index 9 is out of range) ...
    let bad = x.index_select(0, graph.tensor_from(&[9i32], &[1]).unwrap()).unwrap();
    // ... and one that would need a big buffer.
    let big = graph.full(&[1 << 20], 1.0, DType::F32).unwrap().exp().unwrap();
    let wanted = x.add(1.0).unwrap();
    let before = device.stats();
    device.reset_peak();
    assert_eq!(wanted.to_vec_blocking::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
    let after = device.stats();
    // The result and the constant 1.0, nothing else.
    assert!(after.peak_live_buffers - before.live_buffers <= 2, "{before:?} -> {after:?}");
    assert!(after.backend_allocations - before.backend_allocations <= 2, "{before:?} -> {after:?}");
    // Nothing runs at build time either: the failing branch fails on its read.
    assert!(bad.to_vec_blocking::<f32>().is_err());
    assert_eq!(big.dims().as_slice(), &[1 << 20]);
}

#[test]
fn building_nodes_runs_nothing() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&[1.0f32; 4], &[4]).unwrap();
    let before = device.stats();
    let mut y = x;
    for _ in 0..20 {
        y = y.exp().unwrap().log().unwrap();
    }
    assert_eq!(device.stats(), before, "no buffer is taken until something is read");
    assert_close(&values(&y), &[1.0; 4], 1e-5);
}

#[test]
fn a_value_read_after_an_optimizer_step_comes_from_the_parameters_the_graph_saw() {
    let device = Device::cpu();
    let p = Param::new(&device, "w", &[1.0f32, 2.0], &[2]).unwrap();
    let mut sgd = Sgd::new(vec![p.clone()], 0.1).unwrap();
    let graph = Graph::new(&device);
    let w = graph.param(&p).unwrap();
    let h = w.mul(w).unwrap();
    let loss = h.sin().unwrap().sum_all().unwrap();
    let unread = w.mul(10.0).unwrap();
    loss.backward().unwrap();
    sgd.step().unwrap();
    // The loss was realized by backward: still readable.
    let expected = (1.0f64).sin() + (4.0f64).sin();
    assert_close(&[loss.item_blocking().unwrap()], &[expected], 1e-6);
    // `unread` is computed after the step from the values the graph saw
    // (copy-on-write kept them), as in PyTorch where it would exist already.
    assert_close(&values(&unread), &[10.0, 20.0], 1e-6);
    // Using the updated parameter in this graph would mix versions: refused.
    let err = graph.param(&p).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("was updated"), "{err}");
    assert!(err.message().contains("'w'"), "the message names the parameter: {err}");
    // A new graph sees the new value.
    let graph = Graph::new(&device);
    let w = graph.param(&p).unwrap();
    let g: Vec<f64> = [1.0f64, 2.0].iter().map(|w| 2.0 * w * (w * w).cos()).collect();
    let updated: Vec<f64> = [1.0f64, 2.0].iter().zip(&g).map(|(w, g)| w - 0.1 * g).collect();
    assert_close(&values(&w.mul(10.0).unwrap()), &updated.iter().map(|v| v * 10.0).collect::<Vec<_>>(), 1e-5);
    assert_close(&p.value_blocking().unwrap().to_f64_vec(), &updated, 1e-6);
}

#[test]
fn a_value_read_before_backward_stays_readable_after_the_optimizer_step() {
    // The stale-value error says "read the values you need before the
    // optimizer step": doing exactly that must work, even though backward
    // consumed the value (it used to free it, and the later read tried to
    // recompute it from the updated parameter).
    let device = Device::cpu();
    let p = Param::new(&device, "w", &[1.0f32, 2.0], &[1, 2]).unwrap();
    let mut sgd = Sgd::new(vec![p.clone()], 0.1).unwrap();
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&[1.0f32, 1.0], &[1, 2]).unwrap();
    let logits = x.mul(graph.param(&p).unwrap()).unwrap();
    let hidden = logits.exp().unwrap();
    assert_eq!(logits.to_vec_blocking::<f32>().unwrap(), vec![1.0, 2.0]);
    graph.realize(&[hidden]).unwrap();
    let loss = hidden.sum_all().unwrap();
    loss.backward().unwrap();
    sgd.step().unwrap();
    assert_eq!(logits.to_vec_blocking::<f32>().unwrap(), vec![1.0, 2.0]);
    assert_close(&values(&hidden), &[1f64.exp(), 2f64.exp()], 1e-6);
    // Values never asked for are freed by backward; read after the step,
    // they are recomputed from the parameter values this graph saw (the
    // step copied the parameter on write), never from the updated ones.
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&[1.0f32, 1.0], &[1, 2]).unwrap();
    let before = p.value_blocking().unwrap().to_f64_vec();
    let logits = x.mul(graph.param(&p).unwrap()).unwrap();
    logits.exp().unwrap().sum_all().unwrap().backward().unwrap();
    sgd.step().unwrap();
    assert_close(&values(&logits), &before, 1e-6);
    // Asking this graph for the updated parameter would mix versions.
    let err = graph.param(&p).unwrap_err();
    assert!(err.message().contains("was updated"), "{err}");
}

/// Forward and backward of a seeded MLP on fixed data: the loss and every
/// gradient, as raw bits.
fn mlp_run(device: &Device) -> (u32, Vec<Vec<u32>>) {
    let model = Sequential::mlp(device, &[16, 64, 64, 4], Activation::Gelu, 3).unwrap();
    let graph = Graph::new(device);
    let mut rng = kiln::host_rng::SplitMix64::new(5);
    let xs: Vec<f32> = (0..32 * 16).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
    let labels: Vec<i32> = (0..32).map(|i| i % 4).collect();
    let x = graph.tensor_from(&xs, &[32, 16]).unwrap();
    let y = graph.tensor_from(&labels, &[32]).unwrap();
    let loss = cross_entropy(model.forward(x).unwrap(), y).unwrap();
    loss.backward().unwrap();
    let loss_bits = (loss.item_blocking().unwrap() as f32).to_bits();
    let grads = model
        .parameters()
        .iter()
        .map(|p| match p.grad_blocking().unwrap().unwrap() {
            HostData::F32(v) => v.iter().map(|g| g.to_bits()).collect(),
            other => panic!("f32 model, got {:?}", other.dtype()),
        })
        .collect();
    (loss_bits, grads)
}

#[test]
fn results_are_bit_identical_run_after_run() {
    let device = Device::cpu();
    let first = mlp_run(&device);
    let second = mlp_run(&device);
    // And on a fresh device (a different pool state).
    let third = mlp_run(&Device::cpu());
    assert_eq!(first, second);
    assert_eq!(first, third);
    assert!(first.1.iter().flatten().any(|&b| f32::from_bits(b) != 0.0));
}

#[test]
fn graph_reset_returns_every_intermediate_buffer() {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[1.0f32; 6], &[2, 3]).unwrap();
    let base = device.stats().live_buffers;
    let mut graph = Graph::new(&device);
    for step in 0..3 {
        graph.reset();
        let w = graph.param(&p).unwrap();
        let x = graph.tensor_from(&[0.5f32; 6], &[2, 3]).unwrap();
        let loss = w.mul(x).unwrap().exp().unwrap().sum_all().unwrap();
        loss.backward().unwrap();
        assert!(device.stats().live_buffers > base);
        assert_close(&param_grad(&p), &vec![0.5 * 0.5f64.exp() * (step + 1) as f64; 6], 1e-5);
    }
    graph.reset();
    // Only the accumulated gradient remains beyond the parameter itself.
    assert_eq!(device.stats().live_buffers, base + 1);
    p.zero_grad();
    assert_eq!(device.stats().live_buffers, base);
}

/// A Reshape (and a Permute that moves only axes of size 1) of a computed
/// value runs no kernel: it holds its input's buffer. The buffer goes back
/// to the pool only when every node holding it is done: here `a`'s last
/// consumer runs before the reshape's, and a buffer freed too early would
/// be handed to that consumer's output (the CPU refuses a kernel whose
/// output is also its input, and values would be wrong). Real permutes
/// still copy; reshapes of leaves copy (the graph does not own those
/// buffers); nothing leaks.
#[test]
fn a_reshape_shares_its_input_buffer_until_every_holder_is_done() {
    let device = Device::cpu();
    let live = device.stats().live_buffers;
    let data: Vec<f32> = (0..6).map(|i| i as f32 * 0.25).collect();
    for plan_cache in [false, true] {
        device.set_plan_cache(plan_cache);
        // Twice: the second time replays the recorded plan when it is on.
        for _ in 0..2 {
            let graph = Graph::new(&device);
            let x = graph.tensor_from(&data, &[2, 3]).unwrap();
            let a = x.exp().unwrap();
            let b = a.reshape_to(&[3, 2]).unwrap();
            let c = a.add(1.0).unwrap();
            let d = b.mul(2.0).unwrap();
            let unit = b.reshape_to(&[3, 1, 2]).unwrap().permute(&[1, 0, 2]).unwrap().mul(3.0).unwrap();
            let transposed = b.permute(&[1, 0]).unwrap();
            let of_leaf = x.reshape_to(&[6]).unwrap();
            let kernels = device.exec_stats().kernels;
            graph.realize(&[c, d, unit, transposed, of_leaf]).unwrap();
            let ran = device.exec_stats().kernels - kernels;
            let e: Vec<f64> = data.iter().map(|&v| (v as f64).exp()).collect();
            assert_close(&values(&c), &e.iter().map(|v| v + 1.0).collect::<Vec<_>>(), 1e-6);
            assert_close(&values(&d), &e.iter().map(|v| v * 2.0).collect::<Vec<_>>(), 1e-6);
            assert_close(&values(&unit), &e.iter().map(|v| v * 3.0).collect::<Vec<_>>(), 1e-6);
            let t: Vec<f64> = [0, 2, 4, 1, 3, 5].iter().map(|&i| e[i]).collect();
            assert_close(&values(&transposed), &t, 1e-6);
            assert_eq!(values(&of_leaf), data.iter().map(|&v| v as f64).collect::<Vec<_>>());
            // exp, add, mul, mul, the transpose and the leaf's reshape; the
            // three views of `a`'s buffer run nothing (fused element-wise
            // groups count as one kernel, so at most this many).
            assert!(ran <= 6, "{ran} kernels ran");
            drop(graph);
            assert_eq!(device.stats().live_buffers, live, "a buffer leaked");
        }
    }
    device.set_plan_cache(true);
}

/// A gradient that ends in a Reshape (a broadcast bias's: a sum kept 2-D,
/// reshaped to the bias's shape) shares the sum's buffer; the parameter
/// gets the right gradient, step after step, and every buffer comes back.
#[test]
fn a_reshaped_gradient_reaches_its_parameter() {
    let device = Device::cpu();
    let bias = Param::new(&device, "bias", &[0.5f32, -1.0, 2.0], &[3]).unwrap();
    let weight = Param::new(&device, "weight", &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let live = device.stats().live_buffers;
    for step in 0..3 {
        bias.zero_grad();
        weight.zero_grad();
        let graph = Graph::new(&device);
        let x = graph.tensor_from(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], &[4, 2]).unwrap();
        let y = x.matmul(graph.param(&weight).unwrap()).unwrap().add(graph.param(&bias).unwrap()).unwrap();
        let loss = y.reshape_to(&[2, 2, 3]).unwrap().square().unwrap().sum_all().unwrap();
        loss.backward().unwrap();
        // d/dbias sum((xW + b)²) = 2 · Σ_rows (xW + b).
        let xs = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]];
        let w = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]];
        let b = [0.5, -1.0, 2.0];
        let expected: Vec<f64> =
            (0..3).map(|j| xs.iter().map(|r| 2.0 * (r[0] * w[0][j] + r[1] * w[1][j] + b[j])).sum()).collect();
        assert_close(&param_grad(&bias), &expected, 1e-5);
        drop(graph);
        assert_eq!(device.stats().live_buffers, live + 2, "step {step}: the two gradients and nothing else");
    }
}
