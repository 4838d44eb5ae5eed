//! A character-level GPT on any text, in about a hundred lines: the model
//! defined with `#[derive(Module)]`, AdamW with parameter groups, warm-up +
//! cosine schedule, gradient clipping, then sampling with a KV cache.
//! (`kiln train --model gpt` is the same with checkpoints and a plot.)
//!
//! cargo run --release -p kiln-examples --example gpt -- ../shared/data/shakespeare/shakespeare_plays.txt.gz [STEPS]

use kiln::gpt::{load_text, random_batch, TextData};
use kiln::host_rng::SplitMix64;
use kiln::prelude::*;

const CONTEXT: usize = 64;
const WIDTH: usize = 128;
const BATCH: usize = 12;

#[derive(Module)]
struct CharGpt {
    tok_emb: Embedding,
    pos_emb: Embedding,
    blocks: Vec<TransformerBlock>,
    ln_f: LayerNorm,
    head: Linear, // shares tok_emb's weight (tied)
}

impl CharGpt {
    fn new(device: &Device, vocab: usize, layers: usize, heads: usize) -> Result<CharGpt> {
        let mut tok_emb = Embedding::new(device, vocab, WIDTH, 1)?;
        tok_emb.weight = init::normal(device, "weight", &[vocab, WIDTH], 0.0, 0.02, 2)?;
        let head = Linear::tied(tok_emb.weight.clone(), None)?;
        let blocks = (0..layers as u64)
            .map(|i| TransformerBlock::new(device, WIDTH, heads, 4 * WIDTH, 0.0, 10 + i))
            .collect::<Result<_>>()?;
        Ok(CharGpt {
            tok_emb,
            pos_emb: Embedding::new(device, CONTEXT, WIDTH, 3)?,
            blocks,
            ln_f: LayerNorm::new(device, &[WIDTH], 1e-5)?,
            head,
        })
    }

    /// Token ids [B, T] → logits [B, T, vocab].
    fn forward<'g>(&self, idx: Tensor<'g>) -> Result<Tensor<'g>> {
        let t = idx.dims()[1];
        let positions = idx.graph().arange(0.0, 1.0, t, DType::I32)?;
        let mut x = self.tok_emb.forward(idx)?.add(self.pos_emb.forward(positions)?)?;
        for block in &self.blocks {
            x = block.forward(x)?;
        }
        self.head.forward(self.ln_f.forward(x)?)
    }
}

fn loss<'g>(model: &CharGpt, graph: &'g Graph, x: &[i32], y: &[i32]) -> Result<Tensor<'g>> {
    let logits = model.forward(graph.tensor_from(x, &[BATCH, CONTEXT])?)?;
    let v = logits.dims()[2];
    cross_entropy(logits.reshape_to(&[BATCH * CONTEXT, v])?, graph.tensor_from(y, &[BATCH * CONTEXT])?)
}

fn main() -> Result<()> {
    // On one of the CPU backend's threads: no extra thread competing for the cores.
    kiln::on_cpu_pool(train)
}

fn train() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or_else(|| Error::invalid("gpt", "usage: gpt TEXT_FILE[.gz] [STEPS]"))?;
    let steps: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let data = TextData::new(&load_text(std::path::Path::new(&path))?, CONTEXT)?;
    let device = Device::cpu();
    let model = CharGpt::new(&device, data.vocab.len(), 4, 4)?;
    println!(
        "{} parameters: {:?}...",
        model.num_parameters(),
        &model.named_parameters()[..3].iter().map(|p| &p.0).collect::<Vec<_>>()
    );

    // Weight decay on matrices only; 100 warm-up steps, cosine to lr/10.
    let mut adam =
        Adam::with_groups(ParamGroup::decay_split(model.parameters(), 0.1), 1e-3, (0.9, 0.99), 1e-8, 0.0, true)?;
    let mut schedule = LrScheduler::new(&mut adam, Schedule::warmup_cosine(100, steps, 0.1))?;
    let mut graph = Graph::new(&device);
    for step in 0..steps {
        let (x, y) = random_batch(&data.train, BATCH, CONTEXT, &mut SplitMix64::for_stream(1337, step));
        graph.reset();
        let l = loss(&model, &graph, &x, &y)?;
        adam.zero_grad();
        l.backward()?;
        let norm = clip_grad_norm(&model.parameters(), 1.0, 2.0)?;
        adam.step()?;
        schedule.step(&mut adam);
        if step % 100 == 0 || step + 1 == steps {
            println!(
                "step {step:>5}: loss {:.4}, grad norm {norm:.3}, lr {:.2e}",
                l.item_blocking()?,
                adam.learning_rate()
            );
        }
    }

    // Validation loss over 50 random batches, without gradient structure.
    let mut rng = SplitMix64::new(7);
    let mut total = 0.0;
    for _ in 0..50 {
        graph.reset();
        let _no_grad = graph.no_grad();
        let (x, y) = random_batch(&data.val, BATCH, CONTEXT, &mut rng);
        total += loss(&model, &graph, &x, &y)?.item_blocking()?;
    }
    println!("validation loss {:.4}", total / 50.0);

    // Sample 200 characters: softmax(logits / 0.8), multinomial on the device.
    let mut ids = data.vocab.encode("ROMEO:")?;
    for i in 0..200u64 {
        graph.reset();
        let _no_grad = graph.no_grad();
        let window = &ids[ids.len().saturating_sub(CONTEXT)..];
        let logits = model.forward(graph.tensor_from(window, &[1, window.len()])?)?;
        let last = logits.slice_axis(1, window.len() - 1, window.len(), 1)?.reshape_to(&[1, data.vocab.len()])?;
        ids.push(last.div(0.8)?.softmax(-1)?.multinomial(i)?.to_vec_blocking::<i32>()?[0]);
    }
    println!("{}", data.vocab.decode(&ids));
    Ok(())
}
