//! Issue 11's optimizer stack: gradients that can be read, scaled and set;
//! global-norm and value clipping on the device; parameter groups;
//! learning-rate schedules with their state in checkpoints; gradient
//! accumulation; values readable after `optimizer.step()` (copy-on-write).

mod common;

use common::{assert_close, param_grad, param_value, values};
use kiln::checkpoint::{load_optimizer_state_with, save_optimizer_state_with};
use kiln::optim::clip_grad_value;
use kiln::prelude::*;
use kiln::ErrorKind;

fn device_and_params() -> (Device, Param, Param) {
    let device = Device::cpu();
    let a = Param::new(&device, "a", &[1.0f32, 2.0], &[2]).unwrap();
    let b = Param::new(&device, "b", &[3.0f32], &[1]).unwrap();
    (device, a, b)
}

/// loss = Σ a·ca + Σ b·cb, so the gradients are exactly ca and cb.
fn set_grads(device: &Device, a: &Param, b: &Param, ca: &[f32], cb: &[f32]) {
    let graph = Graph::new(device);
    let x = graph.tensor_from(ca, &[2]).unwrap();
    let y = graph.tensor_from(cb, &[1]).unwrap();
    let loss = graph.param(a).unwrap().mul(x).unwrap().sum_all().unwrap();
    let loss = loss.add(graph.param(b).unwrap().mul(y).unwrap().sum_all().unwrap()).unwrap();
    loss.backward().unwrap();
}

#[test]
fn clip_grad_norm_scales_all_gradients_together_and_returns_the_total() {
    let (device, a, b) = device_and_params();
    set_grads(&device, &a, &b, &[3.0, 0.0], &[4.0]);
    let total = clip_grad_norm(&[a.clone(), b.clone()], 1.0, 2.0).unwrap();
    assert!((total - 5.0).abs() < 1e-6, "{total}");
    let scale = 1.0 / (5.0 + 1e-6);
    assert_close(&param_grad(&a), &[3.0 * scale, 0.0], 1e-6);
    assert_close(&param_grad(&b), &[4.0 * scale], 1e-6);
    // Under the limit nothing changes (the factor is clamped to 1).
    let total = clip_grad_norm(&[a.clone(), b.clone()], 10.0, 2.0).unwrap();
    assert!((total - 1.0).abs() < 1e-5);
    assert_close(&param_grad(&b), &[4.0 * scale], 1e-6);
    // The infinity norm is the largest magnitude.
    a.zero_grad();
    b.zero_grad();
    set_grads(&device, &a, &b, &[-6.0, 1.0], &[2.0]);
    let total = clip_grad_norm(&[a.clone(), b.clone()], 3.0, f64::INFINITY).unwrap();
    assert!((total - 6.0).abs() < 1e-6);
    assert_close(&param_grad(&a), &[-3.0, 0.5], 1e-5);
    // Parameters without a gradient are skipped; none at all gives 0.
    a.zero_grad();
    b.zero_grad();
    assert_eq!(clip_grad_norm(&[a.clone(), b.clone()], 1.0, 2.0).unwrap(), 0.0);
    assert!(!a.has_grad());
}

#[test]
fn clip_grad_value_and_grad_read_scale_set() {
    let (device, a, b) = device_and_params();
    set_grads(&device, &a, &b, &[3.0, -0.2], &[-4.0]);
    clip_grad_value(&[a.clone(), b.clone()], 0.5).unwrap();
    assert_close(&param_grad(&a), &[0.5, -0.2], 1e-6);
    assert_close(&param_grad(&b), &[-0.5], 1e-6);
    a.scale_grad(4.0).unwrap();
    assert_close(&param_grad(&a), &[2.0, -0.8], 1e-6);
    // Read the gradient into a graph, change it, write it back.
    let graph = Graph::new(&device);
    let g = a.grad_tensor(&graph).unwrap().unwrap();
    a.set_grad_tensor(g.add(1.0).unwrap()).unwrap();
    assert_close(&param_grad(&a), &[3.0, 0.2], 1e-6);
    assert_close(&values(&g), &[2.0, -0.8], 1e-6); // the copy is independent
    b.set_grad_host(&HostData::F32(vec![7.0])).unwrap();
    assert_close(&param_grad(&b), &[7.0], 0.0);
    // A later backward accumulates onto the gradient that was set.
    set_grads(&device, &a, &b, &[1.0, 1.0], &[1.0]);
    assert_close(&param_grad(&b), &[8.0], 0.0);
    // Bad input: wrong shape, bad factor, bad limits — at this line.
    let e = a.set_grad_tensor(graph.zeros(&[3], DType::F32).unwrap()).unwrap_err();
    assert_eq!((e.kind(), e.location().file()), (ErrorKind::Shape, file!()), "{e}");
    let e = a.scale_grad(f64::NAN).unwrap_err();
    assert_eq!(e.location().file(), file!(), "{e}");
    let e = clip_grad_norm(&[a.clone()], -1.0, 2.0).unwrap_err();
    assert_eq!((e.kind(), e.location().file()), (ErrorKind::InvalidArgument, file!()), "{e}");
    let e = clip_grad_value(&[a.clone()], f64::INFINITY).unwrap_err();
    assert_eq!(e.location().file(), file!(), "{e}");
    let e = b.set_grad_host(&HostData::F32(vec![1.0, 2.0])).unwrap_err();
    assert_eq!(e.location().file(), file!(), "{e}");
}

#[test]
fn parameter_groups_have_their_own_learning_rate_and_weight_decay() {
    let device = Device::cpu();
    let w = Param::new(&device, "w", &[1.0f32, 1.0, 1.0, 1.0], &[2, 2]).unwrap();
    let bias = Param::new(&device, "bias", &[1.0f32, 1.0], &[2]).unwrap();
    let groups = ParamGroup::decay_split(vec![w.clone(), bias.clone()], 0.5);
    assert_eq!(groups[0].params.len(), 1);
    assert!(groups[0].params[0].same(&w) && groups[1].params[0].same(&bias));
    let mut sgd =
        Sgd::with_groups(vec![groups[0].clone().lr(0.1), groups[1].clone().lr(0.01)], 1.0, 0.0, 0.0, false).unwrap();
    assert_eq!(sgd.group_learning_rates(), vec![0.1, 0.01]);
    let graph = Graph::new(&device);
    let loss = graph.param(&w).unwrap().sum_all().unwrap().add(graph.param(&bias).unwrap().sum_all().unwrap()).unwrap();
    loss.backward().unwrap();
    sgd.step().unwrap();
    // w: 1 - 0.1·(1 + 0.5·1); bias: 1 - 0.01·1 (no decay).
    assert_close(&param_value(&w), &[0.85; 4], 1e-6);
    assert_close(&param_value(&bias), &[0.99; 2], 1e-6);
    // A parameter in two groups would be updated twice: refused, here.
    let e = Sgd::with_groups(
        vec![ParamGroup::new(vec![w.clone()]), ParamGroup::new(vec![w.clone()])],
        0.1,
        0.0,
        0.0,
        false,
    )
    .err()
    .unwrap();
    assert_eq!((e.kind(), e.location().file()), (ErrorKind::InvalidArgument, file!()), "{e}");
    let e = Adam::adamw_groups(vec![ParamGroup::new(vec![w.clone()]).lr(-1.0)], 0.1).err().unwrap();
    assert_eq!(e.location().file(), file!(), "{e}");
}

#[test]
fn schedulers_set_group_rates_and_resume_from_a_checkpoint() {
    let device = Device::cpu();
    let w = Param::new(&device, "w", &[1.0f32, -1.0], &[1, 2]).unwrap();
    let b = Param::new(&device, "b", &[0.5f32], &[1]).unwrap();
    let make = || {
        let groups = vec![ParamGroup::new(vec![w.clone()]), ParamGroup::new(vec![b.clone()]).lr(2e-3)];
        Adam::with_groups(groups, 1e-3, (0.9, 0.99), 1e-8, 0.1, true).unwrap()
    };
    let schedule = Schedule::warmup_cosine(2, 10, 0.1);
    let mut adam = make();
    let mut scheduler = LrScheduler::new(&mut adam, schedule.clone()).unwrap();
    assert_eq!(adam.group_learning_rates(), vec![0.5e-3, 1e-3]);
    let run = |adam: &mut Adam, scheduler: &mut LrScheduler, steps: usize| {
        for _ in 0..steps {
            let graph = Graph::new(&device);
            let loss = graph.param(&w).unwrap().square().unwrap().sum_all().unwrap();
            let loss = loss.add(graph.param(&b).unwrap().sum_all().unwrap()).unwrap();
            adam.zero_grad();
            loss.backward().unwrap();
            adam.step().unwrap();
            scheduler.step(adam);
        }
    };
    run(&mut adam, &mut scheduler, 4);
    let lrs = adam.group_learning_rates();
    assert!((lrs[1] / lrs[0] - 2.0).abs() < 1e-12, "groups keep their ratio: {lrs:?}");
    assert!((lrs[0] - 1e-3 * schedule.factor(4)).abs() < 1e-15);
    let bytes = pollster::block_on(save_optimizer_state_with(&adam, Some(&scheduler))).unwrap();
    let saved = (param_value(&w), param_value(&b));
    run(&mut adam, &mut scheduler, 3);
    let uninterrupted = (param_value(&w), param_value(&b), adam.group_learning_rates());
    // Resume: parameters back, a fresh optimizer and scheduler loaded.
    w.set_value(&HostData::F32(saved.0.iter().map(|&v| v as f32).collect())).unwrap();
    b.set_value(&HostData::F32(saved.1.iter().map(|&v| v as f32).collect())).unwrap();
    let mut adam2 = make();
    let mut scheduler2 = LrScheduler::new(&mut adam2, schedule).unwrap();
    load_optimizer_state_with(&mut adam2, Some(&mut scheduler2), &bytes).unwrap();
    assert_eq!(scheduler2.steps(), 4);
    run(&mut adam2, &mut scheduler2, 3);
    assert_eq!((param_value(&w), param_value(&b), adam2.group_learning_rates()), uninterrupted);
}

#[test]
fn gradient_accumulation_over_micro_batches_equals_the_full_batch() {
    // Gradients add up across backward calls until zero_grad: two
    // micro-batches with their losses scaled by 1/2 give the gradient of
    // the mean over the whole batch.
    let device = Device::cpu();
    let model = Sequential::mlp(&device, &[3, 4, 2], Activation::Tanh, 1).unwrap();
    let xs: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
    let ys = [0i32, 1, 1, 0];
    let full_graph = Graph::new(&device);
    let x = full_graph.tensor_from(&xs, &[4, 3]).unwrap();
    let y = full_graph.tensor_from(&ys, &[4]).unwrap();
    cross_entropy(model.forward(x).unwrap(), y).unwrap().backward().unwrap();
    let full: Vec<Vec<f64>> = model.parameters().iter().map(param_grad).collect();
    model.zero_grad();
    for half in 0..2 {
        let graph = Graph::new(&device);
        let x = graph.tensor_from(&xs[half * 6..half * 6 + 6], &[2, 3]).unwrap();
        let y = graph.tensor_from(&ys[half * 2..half * 2 + 2], &[2]).unwrap();
        cross_entropy(model.forward(x).unwrap(), y).unwrap().div(2.0).unwrap().backward().unwrap();
    }
    for (p, expected) in model.parameters().iter().zip(&full) {
        assert_close(&param_grad(p), expected, 1e-5);
    }
}

#[test]
fn values_stay_readable_after_the_step_and_nothing_is_copied_without_need() {
    let device = Device::cpu();
    let p = Param::new(&device, "w", &[1.0f32, 2.0], &[1, 2]).unwrap();
    let mut sgd = Sgd::new(vec![p.clone()], 0.1).unwrap();
    // A value never read before the step: backward freed it, so reading it
    // afterwards recomputes it — from the parameter values this graph saw.
    let mut graph = Graph::new(&device);
    {
        let x = graph.tensor_from(&[1.0f32, 1.0], &[1, 2]).unwrap();
        let hidden = x.mul(graph.param(&p).unwrap()).unwrap().exp().unwrap();
        hidden.sum_all().unwrap().backward().unwrap();
        sgd.step().unwrap();
        assert_eq!(p.copies_on_write(), 1, "the live graph still referenced the old value");
        assert_close(&values(&hidden), &[1f64.exp(), 2f64.exp()], 1e-6);
        assert_close(&param_value(&p), &[0.9 - 0.1 * (1f64.exp() - 1.0), 2.0 - 0.1 * 2f64.exp()], 1e-5);
        // Asking this graph for the parameter again would mix versions.
        let e = graph.param(&p).unwrap_err();
        assert!(e.message().contains("was updated"), "{e}");
    }
    // After reset nothing references the old value: the update is in place.
    let live = device.stats().live_buffers;
    graph.reset();
    let x = graph.tensor_from(&[1.0f32, 1.0], &[1, 2]).unwrap();
    let loss = x.mul(graph.param(&p).unwrap()).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    drop(graph);
    sgd.step().unwrap();
    assert_eq!(p.copies_on_write(), 1, "no copy when no graph holds the old value");
    assert!(device.stats().live_buffers < live, "the old version's buffer went back with the graph");
}
