//! A small CNN (Conv2d → ReLU → MaxPool2d → Flatten → Linear) learns the
//! embedded 8x8 digits on the CPU: the convolution and pooling ops and
//! their gradients train a real model end to end.

mod common;

use kiln::data::load_embedded_digits;
use kiln::nn::{Conv2d, ConvOptions, Flatten, MaxPool2d, Module, Unflatten};
use kiln::optim::Adam;
use kiln::prelude::*;

fn cnn(device: &Device, seed: u64) -> Sequential {
    // [N, 64] → [N, 1, 8, 8] → conv 3x3 pad 1 → [N, 8, 8, 8] → pool 2 → [N, 8, 4, 4] → 128 → 10.
    let options = ConvOptions { padding: [1, 1], ..ConvOptions::default() };
    Sequential::new()
        .add(Unflatten { dims: vec![1, 8, 8] })
        .add(Conv2d::new(device, 1, 8, [3, 3], options, seed).unwrap())
        .add(Activation::Relu)
        .add(MaxPool2d::new(2))
        .add(Flatten)
        .add(Linear::new(device, 8 * 4 * 4, 10, true, seed.wrapping_add(1)).unwrap())
}

fn accuracy(model: &Sequential, device: &Device, images: &[f32], labels: &[i32]) -> f64 {
    model.set_training(false);
    let graph = Graph::new(device);
    let _no_grad = graph.no_grad();
    let n = labels.len();
    let x = graph.tensor_from(images, &[n, 64]).unwrap();
    let predicted = model.forward(x).unwrap().argmax(&[1], false).unwrap().to_vec_blocking::<i32>().unwrap();
    model.set_training(true);
    predicted.iter().zip(labels).filter(|(p, l)| p == l).count() as f64 / n as f64
}

#[test]
fn a_small_cnn_learns_the_embedded_digits() {
    let start = std::time::Instant::now();
    let seed = 3;
    let split = load_embedded_digits(0.2, seed).unwrap();
    let (train, test) = (&split.train, &split.test);
    assert_eq!(train.image_dims, [1, 8, 8]);
    let device = Device::cpu();
    let model = cnn(&device, seed);
    let mut optimizer = Adam::new(model.parameters(), 0.01).unwrap();
    let mut graph = Graph::new(&device);
    let mut losses = Vec::new();
    let before = accuracy(&model, &device, &test.images, &test.labels);
    for epoch in 0..6 {
        for batch in train.batches(64, Some(seed), epoch).unwrap() {
            losses.push(common::classifier_step(&mut graph, &model, &mut optimizer, &batch, train.features));
        }
    }
    let after = accuracy(&model, &device, &test.images, &test.labels);
    let elapsed = start.elapsed();
    eprintln!(
        "cnn digits: test accuracy {before:.3} -> {after:.3} after {} steps in {elapsed:?} ({} parameters)",
        losses.len(),
        model.num_parameters()
    );
    assert!(before < 0.5, "an untrained model should not already classify: {before}");
    assert!(after >= 0.90, "test accuracy {after:.3} after {} steps", losses.len());
    let first = losses[..5].iter().sum::<f64>() / 5.0;
    let last = losses[losses.len() - 5..].iter().sum::<f64>() / 5.0;
    assert!(first > 1.5 && last < 0.3 * first, "loss went from {first} to {last}");
    // "A few seconds" on an unloaded machine; the bound is loose because
    // the test suite runs in parallel on small CI machines.
    assert!(elapsed.as_secs_f64() < 60.0, "training took {elapsed:?}");
}
