//! Training end to end: convergence on XOR and on the embedded digits,
//! optimizers against hand-computed updates, seeded reproducibility.

mod common;

use common::{assert_close, param_value};
use kiln::data::load_embedded_digits;
use kiln::nn::Module;
use kiln::optim::{Adam, Optimizer, Sgd};
use kiln::prelude::*;

const XOR_X: [f32; 8] = [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0];
const XOR_Y: [f32; 4] = [0.0, 1.0, 1.0, 0.0];

/// Train a 2-8-1 tanh MLP on XOR with Adam; the loss of every step.
fn train_xor(seed: u64, steps: usize) -> (Sequential, Vec<f64>) {
    let device = Device::cpu();
    let model = Sequential::mlp(&device, &[2, 8, 1], Activation::Tanh, seed).unwrap();
    let mut optimizer = Adam::new(model.parameters(), 0.05).unwrap();
    let mut graph = Graph::new(&device);
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        graph.reset();
        let x = graph.tensor_from(&XOR_X, &[4, 2]).unwrap();
        let y = graph.tensor_from(&XOR_Y, &[4, 1]).unwrap();
        let loss = mse_loss(model.forward(x).unwrap(), y).unwrap();
        optimizer.zero_grad();
        loss.backward().unwrap();
        optimizer.step().unwrap();
        losses.push(loss.item_blocking().unwrap());
    }
    (model, losses)
}

#[test]
fn mlp_learns_xor() {
    let (model, losses) = train_xor(0, 400);
    assert!(losses[0] > 0.1, "XOR is not solved at initialisation: {}", losses[0]);
    let last = *losses.last().unwrap();
    assert!(last < 0.01, "final loss {last}");
    // Every prediction on the right side of 0.5. (The model's parameters
    // live on its own device; build the graph there.)
    let params = model.parameters();
    let graph = Graph::new(params[0].device());
    let x = graph.tensor_from(&XOR_X, &[4, 2]).unwrap();
    let predictions = model.forward(x).unwrap().to_vec_blocking::<f32>().unwrap();
    for (p, t) in predictions.iter().zip(XOR_Y) {
        assert!((p - t).abs() < 0.25, "prediction {p} for target {t}: {predictions:?}");
    }
}

#[test]
fn identical_seeded_runs_give_bit_identical_losses() {
    let (_, a) = train_xor(5, 60);
    let (_, b) = train_xor(5, 60);
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b));
    // A different seed is a different run (so the comparison means something).
    let (_, c) = train_xor(6, 60);
    assert_ne!(bits(&a), bits(&c));
}

/// Fraction of correctly classified samples.
fn accuracy(model: &Sequential, device: &Device, images: &[f32], labels: &[i32], features: usize) -> f64 {
    let graph = Graph::new(device);
    let _no_grad = graph.no_grad();
    let n = labels.len();
    let x = graph.tensor_from(images, &[n, features]).unwrap();
    let predicted = model.forward(x).unwrap().argmax(&[1], false).unwrap().to_vec_blocking::<i32>().unwrap();
    predicted.iter().zip(labels).filter(|(p, l)| p == l).count() as f64 / n as f64
}

fn train_digits(seed: u64, epochs: u64) -> (f64, Vec<f64>) {
    let split = load_embedded_digits(0.2, 42).unwrap();
    let (train, test) = (&split.train, &split.test);
    let device = Device::cpu();
    let model = Sequential::mlp(&device, &[train.features, 64, train.classes], Activation::Relu, seed).unwrap();
    let mut optimizer = Adam::new(model.parameters(), 0.01).unwrap();
    let mut graph = Graph::new(&device);
    let mut losses = Vec::new();
    for epoch in 0..epochs {
        for batch in train.batches(64, Some(seed), epoch).unwrap() {
            losses.push(common::classifier_step(&mut graph, &model, &mut optimizer, &batch, train.features));
        }
    }
    (accuracy(&model, &device, &test.images, &test.labels, test.features), losses)
}

#[test]
fn mlp_learns_the_embedded_digits() {
    let start = std::time::Instant::now();
    let (accuracy, losses) = train_digits(1, 8);
    assert!(accuracy >= 0.90, "test accuracy {accuracy:.3} after {} steps", losses.len());
    let first = losses[..5].iter().sum::<f64>() / 5.0;
    let last = losses[losses.len() - 5..].iter().sum::<f64>() / 5.0;
    assert!(last < 0.5 * first, "loss went from {first} to {last}");
    // Chance is 10%; ln(10) ≈ 2.3 is the loss of an uninformed model.
    assert!(first > 1.5, "{first}");
    eprintln!("digits: {accuracy:.3} test accuracy in {:?}", start.elapsed());
}

// ----- optimizers against hand-computed values --------------------------------

/// One step of training on loss = Σ p² (gradient 2p) for a two-element f64
/// parameter, with the given optimizer; returns the values after each step.
fn quadratic_steps(make: impl Fn(Vec<Param>) -> Box<dyn Optimizer>, start: [f64; 2], steps: usize) -> Vec<Vec<f64>> {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &start, &[2]).unwrap();
    let mut optimizer = make(vec![p.clone()]);
    let mut out = Vec::new();
    for _ in 0..steps {
        let graph = Graph::new(&device);
        let w = graph.param(&p).unwrap();
        optimizer.zero_grad();
        w.mul(w).unwrap().sum_all().unwrap().backward().unwrap();
        optimizer.step().unwrap();
        out.push(param_value(&p));
    }
    out
}

#[test]
fn sgd_with_momentum_matches_hand_computed_steps() {
    // p = [1, 2], g = 2p, lr 0.1, momentum 0.9 (velocity starts at 0):
    // step 1: v = [2, 4],          p = [0.8, 1.6]
    // step 2: g = [1.6, 3.2], v = 0.9·[2, 4] + g = [3.4, 6.8], p = [0.46, 0.92]
    let steps = quadratic_steps(|p| Box::new(Sgd::with_options(p, 0.1, 0.9, 0.0, false).unwrap()), [1.0, 2.0], 2);
    assert_close(&steps[0], &[0.8, 1.6], 1e-12);
    assert_close(&steps[1], &[0.46, 0.92], 1e-12);

    // Plain SGD: p ← p − lr·2p = 0.8p per step.
    let steps = quadratic_steps(|p| Box::new(Sgd::new(p, 0.1).unwrap()), [1.0, 2.0], 2);
    assert_close(&steps[1], &[0.64, 1.28], 1e-12);

    // Nesterov: update = g + μ·v.
    // step 1: g = [2, 4], v = [2, 4], update = [3.8, 7.6], p = [0.62, 1.24]
    // step 2: g = [1.24, 2.48], v = [3.04, 6.08], update = [3.976, 7.952], p = [0.2224, 0.4448]
    let steps = quadratic_steps(|p| Box::new(Sgd::with_options(p, 0.1, 0.9, 0.0, true).unwrap()), [1.0, 2.0], 2);
    assert_close(&steps[0], &[0.62, 1.24], 1e-12);
    assert_close(&steps[1], &[0.2224, 0.4448], 1e-12);

    // Weight decay 0.5 adds 0.5·p to the gradient: g = 2.5p, p ← p − 0.25p.
    let steps = quadratic_steps(|p| Box::new(Sgd::with_options(p, 0.1, 0.0, 0.5, false).unwrap()), [1.0, 2.0], 1);
    assert_close(&steps[0], &[0.75, 1.5], 1e-12);
}

/// PyTorch's Adam/AdamW, written out for a reference.
fn adam_reference(start: [f64; 2], steps: usize, lr: f64, wd: f64, decoupled: bool) -> Vec<Vec<f64>> {
    let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8f64);
    let mut p = start.to_vec();
    let (mut m, mut v) = (vec![0.0; 2], vec![0.0; 2]);
    let mut out = Vec::new();
    for t in 1..=steps as i32 {
        for i in 0..2 {
            let mut g = 2.0 * p[i];
            if decoupled {
                p[i] *= 1.0 - lr * wd;
            } else {
                g += wd * p[i];
            }
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let m_hat = m[i] / (1.0 - b1.powi(t));
            let v_hat = v[i] / (1.0 - b2.powi(t));
            p[i] -= lr * m_hat / (v_hat.sqrt() + eps);
        }
        out.push(p.clone());
    }
    out
}

#[test]
fn adam_matches_hand_computed_steps() {
    // Step 1 of Adam moves every coordinate by lr·g/(|g| + eps) ≈ lr·sign(g).
    let steps = quadratic_steps(|p| Box::new(Adam::new(p, 0.1).unwrap()), [1.0, -2.0], 3);
    assert_close(&steps[0], &[0.9, -1.9], 1e-8);
    let reference = adam_reference([1.0, -2.0], 3, 0.1, 0.0, false);
    for (got, want) in steps.iter().zip(&reference) {
        assert_close(got, want, 1e-12);
    }
    // Step 2 by hand for the first coordinate: g1 = 2, g2 = 1.8;
    // m = 0.9·0.2 + 0.1·1.8 = 0.36, v = 0.999·0.004 + 0.001·3.24 = 0.007236;
    // m̂ = 0.36/0.19, v̂ = 0.007236/0.001999; p = 0.9 − 0.1·m̂/(√v̂ + 1e-8).
    let m_hat = 0.36 / 0.19;
    let v_hat: f64 = 0.007236 / (1.0 - 0.999f64 * 0.999);
    // (p after step 1 is 0.9 up to 5e-10, hence the tolerance.)
    assert_close(&[steps[1][0]], &[0.9 - 0.1 * m_hat / (v_hat.sqrt() + 1e-8)], 1e-8);

    // L2 weight decay (coupled) and AdamW (decoupled).
    let steps = quadratic_steps(
        |p| Box::new(Adam::with_options(p, 0.1, (0.9, 0.999), 1e-8, 0.5, false).unwrap()),
        [1.0, -2.0],
        2,
    );
    for (got, want) in steps.iter().zip(&adam_reference([1.0, -2.0], 2, 0.1, 0.5, false)) {
        assert_close(got, want, 1e-12);
    }
    let steps = quadratic_steps(|p| Box::new(Adam::adamw(p, 0.1, 0.5).unwrap()), [1.0, -2.0], 2);
    let reference = adam_reference([1.0, -2.0], 2, 0.1, 0.5, true);
    for (got, want) in steps.iter().zip(&reference) {
        assert_close(got, want, 1e-12);
    }
    // AdamW's first step: shrink by 1 − lr·wd = 0.95, then move by lr.
    assert_close(&steps[0], &[0.95 - 0.1, -1.9 + 0.1], 1e-8);
}

#[test]
fn optimizer_skips_parameters_without_gradient() {
    let device = Device::cpu();
    let used = Param::new(&device, "used", &[1.0f64], &[1]).unwrap();
    let unused = Param::new(&device, "unused", &[5.0f64], &[1]).unwrap();
    let mut optimizer = Sgd::new(vec![used.clone(), unused.clone()], 0.5).unwrap();
    let graph = Graph::new(&device);
    graph.param(&used).unwrap().mul(3.0).unwrap().sum_all().unwrap().backward().unwrap();
    optimizer.step().unwrap();
    assert_eq!(param_value(&used), vec![1.0 - 0.5 * 3.0]);
    assert_eq!(param_value(&unused), vec![5.0]);
    optimizer.zero_grad();
    assert!(!used.has_grad());
}

#[test]
fn bad_hyperparameters_are_refused() {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[1.0f32], &[1]).unwrap();
    assert!(Sgd::new(vec![p.clone()], -0.1).is_err());
    assert!(Sgd::new(vec![p.clone()], f64::NAN).is_err());
    assert!(Sgd::with_options(vec![p.clone()], 0.1, 0.0, 0.0, true).is_err());
    assert!(Adam::with_options(vec![p.clone()], 0.1, (1.0, 0.999), 1e-8, 0.0, false).is_err());
    assert!(Adam::with_options(vec![p], 0.1, (0.9, 0.999), -1.0, 0.0, false).is_err());
}
