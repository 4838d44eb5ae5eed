//! Two interleaved spirals (a classic test of a non-linear classifier):
//! an MLP with Mish activations and a one-cycle learning-rate schedule.
//!
//! cargo run --release -p kiln-examples --example spirals

use kiln::host_rng::SplitMix64;
use kiln::prelude::*;

/// `n` points per class on two spirals, with a little noise.
fn spirals(n: usize, seed: u64) -> (Vec<f32>, Vec<i32>) {
    let mut rng = SplitMix64::new(seed);
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for class in 0..2 {
        for i in 0..n {
            let t = i as f64 / n as f64 * 3.0 * std::f64::consts::PI + 0.3;
            let sign = if class == 0 { 1.0 } else { -1.0 };
            xs.push((sign * t * t.cos() / 10.0 + 0.03 * rng.normal()) as f32);
            xs.push((sign * t * t.sin() / 10.0 + 0.03 * rng.normal()) as f32);
            ys.push(class);
        }
    }
    (xs, ys)
}

fn accuracy(model: &Sequential, device: &Device, xs: &[f32], ys: &[i32]) -> Result<f64> {
    let graph = Graph::new(device);
    let _no_grad = graph.no_grad();
    let n = ys.len();
    let logits = model.forward(graph.tensor_from(xs, &[n, 2])?)?;
    let correct = logits.argmax(&[-1], false)?.eq(graph.tensor_from(ys, &[n])?)?.cast(DType::I32)?.sum_all()?;
    Ok(correct.item_blocking()? / n as f64)
}

fn main() -> Result<()> {
    let device = Device::cpu();
    let (train_x, train_y) = spirals(500, 1);
    let (test_x, test_y) = spirals(500, 2);
    let model = Sequential::new()
        .add(Linear::new(&device, 2, 64, true, 1)?)
        .add(Mish)
        .add(Linear::new(&device, 64, 64, true, 2)?)
        .add(Mish)
        .add(Linear::new(&device, 64, 2, true, 3)?);
    let steps = 1500;
    let mut adam = Adam::adamw(model.parameters(), 1e-2, 1e-4)?;
    let cycle = Schedule::OneCycle { total: steps, pct_start: 0.3, div_factor: 25.0, final_div_factor: 1e3 };
    let mut schedule = LrScheduler::new(&mut adam, cycle)?;
    let mut graph = Graph::new(&device);
    let n = train_y.len();
    for step in 0..steps {
        graph.reset();
        let x = graph.tensor_from(&train_x, &[n, 2])?;
        let y = graph.tensor_from(&train_y, &[n])?;
        let loss = cross_entropy(model.forward(x)?, y)?;
        adam.zero_grad();
        loss.backward()?;
        adam.step()?;
        schedule.step(&mut adam);
        if step % 300 == 0 {
            println!("step {step:>4}: loss {:.4}", loss.item_blocking()?);
        }
    }
    println!("test accuracy {:.2}%", accuracy(&model, &device, &test_x, &test_y)? * 100.0);
    Ok(())
}
