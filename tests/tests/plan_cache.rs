//! Cached step plans (`Device::set_plan_cache`, `KILN_PLAN_CACHE`): a
//! training loop replays the plan of its first step (`ExecStats::
//! plans_reused`), with the same bits as without the cache; any change of
//! structure — a shape, an op, a constant, a dtype, which parameters train
//! — is a miss that plans again, never a stale plan.

use kiln::nn::{Activation, Module, Sequential};
use kiln::optim::{Adam, Optimizer};
use kiln::{Blocking, BlockingParam, DType, Device, ExecStats, Graph};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `steps` MLP training steps with Adam; each step's loss bits and the
/// final parameters' bits.
fn train(cache: bool, batches: &[usize]) -> (Vec<u32>, Vec<Vec<u64>>, ExecStats) {
    let device = Device::cpu();
    device.set_plan_cache(cache);
    let model = Sequential::mlp(&device, &[6, 16, 3], Activation::Tanh, 5).unwrap();
    let mut optimizer = Adam::new(model.parameters(), 1e-2).unwrap();
    let mut graph = Graph::new(&device);
    let mut losses = Vec::new();
    for (step, &batch) in batches.iter().enumerate() {
        graph.reset();
        let x: Vec<f32> = (0..batch * 6).map(|i| ((i * 7 + step) % 11) as f32 / 5.0 - 1.0).collect();
        let y: Vec<f32> = (0..batch * 3).map(|i| ((i * 3) % 5) as f32 / 4.0).collect();
        let x = graph.tensor_from(&x, &[batch, 6]).unwrap();
        let y = graph.tensor_from(&y, &[batch, 3]).unwrap();
        let loss = kiln::nn::mse_loss(model.forward(x).unwrap(), y).unwrap();
        optimizer.zero_grad();
        loss.backward().unwrap();
        optimizer.step().unwrap();
        losses.push((loss.item_blocking().unwrap() as f32).to_bits());
    }
    let params = model
        .parameters()
        .iter()
        .map(|p| p.value_blocking().unwrap().to_f64_vec().iter().map(|v| v.to_bits()).collect())
        .collect();
    (losses, params, device.exec_stats())
}

#[test]
fn a_steady_training_loop_replays_its_plans_with_the_same_bits() {
    let batches = [8; 6];
    let (l_off, p_off, off) = train(false, &batches);
    let (l_on, p_on, on) = train(true, &batches);
    assert_eq!(l_on, l_off);
    assert_eq!(p_on, p_off);
    assert_eq!(off.plans_built + off.plans_reused, 0, "{off:?}");
    // The first step plans each of its executions; every later step
    // replays all of them.
    assert!(on.plans_built >= 2, "{on:?}");
    assert!(on.plans_reused >= 5 * on.plans_built / 2, "{on:?}");
    let (_, _, two) = train(true, &batches[..2]);
    let (_, _, three) = train(true, &batches[..3]);
    assert_eq!(two.plans_built, three.plans_built, "step 3 plans nothing new: {two:?} {three:?}");
    assert!(three.plans_reused > two.plans_reused);
    assert_eq!(three.kernels - two.kernels, two.kernels - train(true, &batches[..1]).2.kernels);
}

#[test]
fn a_changed_shape_plans_again_and_the_old_plan_still_serves_its_shape() {
    let batches = [8, 8, 5, 8, 5, 9];
    let (l_off, p_off, _) = train(false, &batches);
    let (l_on, p_on, on) = train(true, &batches);
    assert_eq!(l_on, l_off);
    assert_eq!(p_on, p_off);
    let (_, _, first_two) = train(true, &batches[..2]);
    let (_, _, with_new) = train(true, &batches[..3]);
    assert!(with_new.plans_built > first_two.plans_built, "batch 5 is a miss: {first_two:?} {with_new:?}");
    let (_, _, back) = train(true, &batches[..5]);
    assert_eq!(back.plans_built, with_new.plans_built, "batches 8 and 5 again replay: {back:?}");
    assert!(on.plans_built > back.plans_built, "batch 9 is a miss: {on:?}");
}

/// One execution of `build` on a device that has first run `warm` (so a
/// plan of the same size and target is cached): the value's bits and the
/// counters' change.
fn after<F, G>(warm: F, build: G) -> (Vec<u32>, ExecStats)
where
    F: Fn(&Graph) -> Vec<u32>,
    G: Fn(&Graph) -> Vec<u32>,
{
    let device = Device::cpu();
    let mut graph = Graph::new(&device);
    warm(&graph);
    graph.reset();
    warm(&graph);
    graph.reset();
    let before = device.exec_stats();
    let value = build(&graph);
    let s = device.exec_stats();
    let delta = ExecStats {
        plans_built: s.plans_built - before.plans_built,
        plans_reused: s.plans_reused - before.plans_reused,
        ..s
    };
    (value, delta)
}

fn fresh(build: impl Fn(&Graph) -> Vec<u32>) -> Vec<u32> {
    let device = Device::cpu();
    device.set_plan_cache(false);
    build(&Graph::new(&device))
}

fn chain(g: &Graph, op: &str, constant: f32, dims: &[usize]) -> Vec<u32> {
    let n: usize = dims.iter().product();
    let x = g.tensor_from(&(0..n).map(|i| i as f32 * 0.3 - 1.0).collect::<Vec<_>>(), dims).unwrap();
    let y = x.mul(constant).unwrap();
    let y = match op {
        "tanh" => y.tanh(),
        "sigmoid" => y.sigmoid(),
        _ => y.exp(),
    }
    .unwrap();
    bits(&y.add(1.0).unwrap().to_vec_blocking::<f32>().unwrap())
}

#[test]
fn a_changed_op_constant_or_shape_is_never_served_a_stale_plan() {
    let warm = |g: &Graph| chain(g, "tanh", 2.0, &[4, 3]);
    // The same structure: replayed.
    let (v, s) = after(warm, |g| chain(g, "tanh", 2.0, &[4, 3]));
    assert_eq!((s.plans_built, s.plans_reused), (0, 1), "{s:?}");
    assert_eq!(v, fresh(|g| chain(g, "tanh", 2.0, &[4, 3])));
    let cases: [(&str, Box<dyn Fn(&Graph) -> Vec<u32>>); 5] = [
        ("op", Box::new(|g| chain(g, "sigmoid", 2.0, &[4, 3]))),
        ("constant", Box::new(|g| chain(g, "tanh", 3.0, &[4, 3]))),
        ("negative zero", Box::new(|g| chain(g, "tanh", -0.0, &[4, 3]))),
        ("shape", Box::new(|g| chain(g, "tanh", 2.0, &[3, 4]))),
        ("length", Box::new(|g| chain(g, "tanh", 2.0, &[13]))),
    ];
    for (what, build) in &cases {
        let (v, s) = after(warm, build);
        assert_eq!((s.plans_built, s.plans_reused), (1, 0), "changed {what}: {s:?}");
        assert_eq!(v, fresh(build), "changed {what}");
    }
    let zero = |g: &Graph| chain(g, "tanh", 0.0, &[4, 3]);
    let (_, s) = after(zero, |g| chain(g, "tanh", -0.0, &[4, 3]));
    assert_eq!(s.plans_built, 1, "0.0 and -0.0 are different constants");
}

#[test]
fn a_changed_dtype_or_parameter_set_plans_again() {
    let warm = |g: &Graph| {
        let x = g.tensor_from(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        bits(&x.exp().unwrap().add(1.0).unwrap().to_vec_blocking::<f32>().unwrap())
    };
    let (v, s) = after(warm, |g| {
        let x = g.tensor_from(&[1.0f64, 2.0, 3.0], &[3]).unwrap();
        let y = x.exp().unwrap().add(1.0).unwrap().cast(DType::F32).unwrap();
        bits(&y.to_vec_blocking::<f32>().unwrap())
    });
    assert_eq!(s.plans_built, 1, "{s:?}");
    assert_eq!(v.len(), 3);

    // The same model, once with every parameter trained and once with the
    // first layer frozen: different gradients are computed.
    let run = |frozen: bool, cache: bool| {
        let device = Device::cpu();
        device.set_plan_cache(cache);
        let model = Sequential::mlp(&device, &[4, 5, 2], Activation::Relu, 3).unwrap();
        let mut graph = Graph::new(&device);
        let mut grads = Vec::new();
        for step in 0..3 {
            graph.reset();
            model.parameters()[0].set_requires_grad(!(frozen && step == 2));
            model.parameters().iter().for_each(|p| p.zero_grad());
            let x = graph.tensor_from(&[0.5f32, -1.0, 2.0, 0.25, 1.0, 0.0, -0.5, 1.5], &[2, 4]).unwrap();
            let loss = model.forward(x).unwrap().mul(model.forward(x).unwrap()).unwrap().sum_all().unwrap();
            loss.backward().unwrap();
            grads.push(
                model
                    .parameters()
                    .iter()
                    .map(|p| p.grad_blocking().unwrap().map(|g| g.to_f64_vec().iter().map(|v| v.to_bits()).collect()))
                    .collect::<Vec<Option<Vec<u64>>>>(),
            );
        }
        (grads, device.exec_stats())
    };
    let (g_on, s_on) = run(true, true);
    let (g_off, _) = run(true, false);
    assert_eq!(g_on, g_off);
    assert!(g_on[2][0].is_none() && g_on[1][0].is_some(), "the frozen layer has no gradient in step 3");
    let (_, s_steady) = run(false, true);
    assert!(s_on.plans_built > s_steady.plans_built, "{s_on:?} vs {s_steady:?}");
}
