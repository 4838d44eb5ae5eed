//! MNIST or Fashion-MNIST with a small CNN (conv-relu-pool ×2, then two
//! linear layers), BatchNorm after each convolution, a step learning-rate
//! schedule, written out in full.
//!
//! cargo run --release -p kiln-examples --example mnist_cnn -- ../shared/data/mnist [EPOCHS]
//! cargo run --release -p kiln-examples --example mnist_cnn -- ../shared/data/fashion-mnist

use kiln::data::load_mnist_dir;
use kiln::prelude::*;

fn main() -> Result<()> {
    // On one of the CPU backend's threads: no extra thread competing for the cores.
    kiln::on_cpu_pool(train)
}

fn train() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or_else(|| Error::invalid("mnist_cnn", "usage: mnist_cnn DIR [EPOCHS]"))?;
    let epochs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    let data = load_mnist_dir(std::path::Path::new(&dir))?;
    let device = Device::cpu();
    let conv = ConvOptions::default();
    let model = Sequential::new()
        .add(Unflatten { dims: vec![1, 28, 28] })
        .add(Conv2d::new(&device, 1, 32, [3, 3], conv, 1)?)
        .add(BatchNorm2d::new(&device, 32, 1e-5, 0.1)?)
        .add(Activation::Relu)
        .add(MaxPool2d::new(2))
        .add(Conv2d::new(&device, 32, 64, [3, 3], conv, 2)?)
        .add(BatchNorm2d::new(&device, 64, 1e-5, 0.1)?)
        .add(Activation::Relu)
        .add(MaxPool2d::new(2))
        .add(Flatten)
        .add(Linear::new(&device, 64 * 5 * 5, 128, true, 3)?)
        .add(Activation::Relu)
        .add(Linear::new(&device, 128, 10, true, 4)?);
    let mut adam = Adam::new(model.parameters(), 1e-3)?;
    let steps_per_epoch = data.train.len.div_ceil(64) as u64;
    let mut schedule = LrScheduler::new(&mut adam, Schedule::Step { step_size: steps_per_epoch, gamma: 0.5 })?;
    let mut graph = Graph::new(&device);
    for epoch in 0..epochs {
        let mut last = 0.0;
        for batch in data.train.batches(64, Some(7), epoch)? {
            graph.reset();
            let x = graph.tensor_from(&batch.images, &[batch.len, 784])?;
            let y = graph.tensor_from(&batch.labels, &[batch.len])?;
            let loss = cross_entropy(model.forward(x)?, y)?;
            adam.zero_grad();
            loss.backward()?;
            adam.step()?;
            schedule.step(&mut adam);
            last = loss.item_blocking()?;
        }
        let accuracy = kiln::evaluate(&device, &model, &data.test, 1000)?;
        println!("epoch {}: last loss {last:.4}, test accuracy {:.2}%", epoch + 1, accuracy * 100.0);
    }
    Ok(())
}
