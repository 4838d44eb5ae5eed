//! The native half of the browser/native parity test: a seeded small
//! training run on the CPU, written with kiln-core exactly as a Rust user
//! would, printing its losses as JSON. web/tests/parity.mjs runs the same
//! run through the JavaScript API; web/tests/parity.test.mjs compares them.
//!
//! cargo run --release -p kiln-web --example parity > losses.json

use kiln_core::data::load_embedded_digits;
use kiln_core::nn::{cross_entropy, Activation, Module, Sequential};
use kiln_core::optim::{Adam, Optimizer};
use kiln_core::{Device, Graph};

fn main() -> kiln_core::Result<()> {
    let device = Device::cpu();
    let split = load_embedded_digits(0.2, 42)?;
    let model = Sequential::mlp(&device, &[64, 32, 10], Activation::Relu, 3)?;
    let mut adam = Adam::new(model.parameters(), 0.01)?;
    let mut graph = Graph::new(&device);
    let mut losses = Vec::new();
    for batch in split.train.batches(32, Some(5), 0)?.take(25) {
        graph.reset();
        let x = graph.tensor_from(&batch.images, &[batch.len, 64])?;
        let y = graph.tensor_from(&batch.labels, &[batch.len])?;
        let loss = cross_entropy(model.forward(x)?, y)?;
        adam.zero_grad();
        loss.backward()?;
        adam.step()?;
        losses.push(pollster::block_on(loss.item())?);
    }
    let list: Vec<String> = losses.iter().map(|l| format!("{l:.9}")).collect();
    println!(
        "{{\"run\":\"digits mlp 64-32-10 seed 3, adam 0.01, batch 32, shuffle seed 5, 25 steps\",\"losses\":[{}]}}",
        list.join(",")
    );
    Ok(())
}
