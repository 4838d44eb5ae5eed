//! MNIST (or Fashion-MNIST) with an MLP, written out in full — the loop that
//! `kiln train --dataset mnist` runs, without the command-line tool.
//!
//! cargo run --release -p kiln-examples --example mnist_mlp -- /path/to/mnist

use kiln::data::load_mnist_dir;
use kiln::prelude::*;

fn main() -> kiln::Result<()> {
    // On one of the CPU backend's threads: no extra thread competing for the cores.
    kiln::on_cpu_pool(train)
}

fn train() -> kiln::Result<()> {
    let dir = std::env::args().nth(1).ok_or_else(|| {
        Error::invalid("mnist_mlp", "usage: mnist_mlp DIR (a folder with the four MNIST IDX files, gzipped or not)")
    })?;
    let data = load_mnist_dir(std::path::Path::new(&dir))?;
    let device = Device::cpu();
    let model = Sequential::mlp(&device, &[784, 512, 256, 10], Activation::Relu, 0)?;
    let mut optimizer = Adam::new(model.parameters(), 1e-3)?;

    let mut graph = Graph::new(&device);
    for epoch in 0..3 {
        let mut last_loss = 0.0;
        for batch in data.train.batches(128, Some(7), epoch)? {
            graph.reset();
            let x = graph.tensor_from(&batch.images, &[batch.len, 784])?;
            let y = graph.tensor_from(&batch.labels, &[batch.len])?;
            let loss = cross_entropy(model.forward(x)?, y)?;
            optimizer.zero_grad();
            loss.backward()?;
            optimizer.step()?;
            last_loss = loss.item_blocking()?;
        }
        let accuracy = kiln::evaluate(&device, &model, &data.test, 1000)?;
        println!("epoch {}: last loss {last_loss:.4}, test accuracy {:.2}%", epoch + 1, accuracy * 100.0);
    }
    Ok(())
}
