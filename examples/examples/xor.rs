//! The smallest useful training run: an MLP learns XOR.
//!
//! cargo run --release -p kiln-examples --example xor

use kiln::prelude::*;

fn main() -> kiln::Result<()> {
    let device = Device::cpu();
    let model = Sequential::mlp(&device, &[2, 8, 1], Activation::Tanh, 42)?;
    let mut optimizer = Adam::new(model.parameters(), 0.05)?;
    let inputs = [0.0f32, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0];
    let targets = [0.0f32, 1.0, 1.0, 0.0];

    let mut graph = Graph::new(&device);
    for step in 0..=500 {
        graph.reset();
        let x = graph.tensor_from(&inputs, &[4, 2])?;
        let y = graph.tensor_from(&targets, &[4, 1])?;
        let prediction = model.forward(x)?;
        let loss = mse_loss(prediction, y)?;
        optimizer.zero_grad();
        loss.backward()?;
        optimizer.step()?;
        if step % 100 == 0 {
            println!("step {step:>3}: loss {:.5}", loss.item_blocking()?);
        }
    }
    graph.reset();
    let x = graph.tensor_from(&inputs, &[4, 2])?;
    let prediction = model.forward(x)?.to_vec_blocking::<f32>()?;
    println!("predictions for (0,0) (0,1) (1,0) (1,1): {prediction:.3?}");
    Ok(())
}
