//! The native half of the checkpoint tests (web/tests/checkpoint.test.mjs):
//! the parity run of `parity.rs` (digits MLP 64-32-10, Adam 0.01, batch 32,
//! shuffle seed 5) for 20 steps, written with kiln-core as a Rust user
//! would. In `dir` it writes the model and optimizer checkpoints after step
//! 10 (`native10.model.safetensors`, `native10.optim.safetensors`) and after
//! step 20 (`native20.*`), and resumes its own step-10 checkpoint in a fresh
//! model and optimizer for steps 11–20 (`resumed`). When `dir` holds
//! `js10.*` (written by the JavaScript half after its own 10 steps), it also
//! loads those, writes them straight back (`fromjs10.*`, to show the
//! transfer is exact), resumes them for steps 11–20 and writes `fromjs20.*`.
//! Prints the losses as JSON (f32 values with 9 significant digits, enough
//! to round-trip exactly) and the device's name.
//!
//! The device is `Device::cpu()`: with `KILN_CPU_NUMERICS=portable` it
//! computes the browser build's bits (`CpuNumerics::Portable`), which is how
//! the tests get bit-identical resumes across native and wasm.
//!
//! KILN_CPU_NUMERICS=portable cargo run --release -p kiln-web --example resume -- DIR

use std::path::Path;

use kiln_core::checkpoint::{load_optimizer_state, load_state, save_optimizer_state, save_state};
use kiln_core::data::{load_embedded_digits, Batch};
use kiln_core::nn::{cross_entropy, Activation, Module, Sequential};
use kiln_core::optim::{Adam, Optimizer};
use kiln_core::{Device, Graph};

fn step(model: &Sequential, adam: &mut Adam, graph: &mut Graph, batch: &Batch) -> kiln_core::Result<f32> {
    graph.reset();
    let x = graph.tensor_from(&batch.images, &[batch.len, 64])?;
    let y = graph.tensor_from(&batch.labels, &[batch.len])?;
    let loss = cross_entropy(model.forward(x)?, y)?;
    adam.zero_grad();
    loss.backward()?;
    adam.step()?;
    Ok(pollster::block_on(loss.item())? as f32)
}

fn save(dir: &Path, name: &str, model: &Sequential, adam: &Adam) -> kiln_core::Result<()> {
    let write = |suffix: &str, bytes: Vec<u8>| {
        std::fs::write(dir.join(format!("{name}.{suffix}.safetensors")), bytes)
            .map_err(|e| kiln_core::Error::io("resume", e.to_string()))
    };
    write("model", pollster::block_on(save_state(model))?)?;
    write("optim", pollster::block_on(save_optimizer_state(adam))?)
}

fn fresh(device: &Device) -> kiln_core::Result<(Sequential, Adam)> {
    let model = Sequential::mlp(device, &[64, 32, 10], Activation::Relu, 3)?;
    let adam = Adam::new(model.parameters(), 0.01)?;
    Ok((model, adam))
}

fn list(losses: &[f32]) -> String {
    losses.iter().map(|l| format!("{l:.9e}")).collect::<Vec<_>>().join(",")
}

fn main() -> kiln_core::Result<()> {
    let dir = std::env::args().nth(1).expect("usage: resume DIR");
    let dir = Path::new(&dir);
    let device = Device::cpu();
    let split = load_embedded_digits(0.2, 42)?;
    let batches: Vec<Batch> = split.train.batches(32, Some(5), 0)?.take(20).collect();
    let mut graph = Graph::new(&device);

    let (model, mut adam) = fresh(&device)?;
    let mut losses = Vec::new();
    for (i, batch) in batches.iter().enumerate() {
        losses.push(step(&model, &mut adam, &mut graph, batch)?);
        if i == 9 {
            save(dir, "native10", &model, &adam)?;
        }
    }
    save(dir, "native20", &model, &adam)?;

    let read = |p: &Path| std::fs::read(p).map_err(|e| kiln_core::Error::io("resume", e.to_string()));
    let resume = |name: &str, graph: &mut Graph| -> kiln_core::Result<(Vec<f32>, Sequential, Adam)> {
        let (model, mut adam) = fresh(&device)?;
        load_state(&model, &read(&dir.join(format!("{name}.model.safetensors")))?)?;
        load_optimizer_state(&mut adam, &read(&dir.join(format!("{name}.optim.safetensors")))?)?;
        if name == "js10" {
            save(dir, "fromjs10", &model, &adam)?;
        }
        let mut out = Vec::new();
        for batch in &batches[10..] {
            out.push(step(&model, &mut adam, graph, batch)?);
        }
        Ok((out, model, adam))
    };
    let (resumed, _, _) = resume("native10", &mut graph)?;
    let mut from_js = Vec::new();
    if dir.join("js10.model.safetensors").exists() {
        let (losses, model, adam) = resume("js10", &mut graph)?;
        save(dir, "fromjs20", &model, &adam)?;
        from_js = losses;
    }
    println!(
        "{{\"device\":\"{}\",\"losses\":[{}],\"resumed\":[{}],\"fromJs\":[{}]}}",
        device.name(),
        list(&losses),
        list(&resumed),
        list(&from_js)
    );
    Ok(())
}
