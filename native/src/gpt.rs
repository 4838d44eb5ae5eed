//! A character-level GPT: the model, the text data, the training loop
//! behind `kiln train --model gpt` and the sampler behind `kiln sample`.
//!
//! The model is nanoGPT's (token + position embeddings, pre-norm causal
//! transformer blocks, a final layer norm, an output layer tied to the
//! token embedding), trained with AdamW (weight decay on matrices only),
//! linear warm-up then cosine decay, and global gradient-norm clipping.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use kiln_core::host_rng::SplitMix64;
use kiln_core::nn::{cross_entropy, init, Embedding, KvCache, LayerNorm, Linear, Module, TransformerBlock};
use kiln_core::optim::{Adam, LrScheduler, Optimizer, ParamGroup, Schedule};
use kiln_core::{DType, Device, Error, Graph, Result, Tensor};

use crate::distributed::{Replicas, SingleProcess};
use crate::Blocking;

/// The model's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptConfig {
    pub vocab: usize,
    pub context: usize,
    pub layers: usize,
    pub heads: usize,
    pub width: usize,
    pub dropout: f64,
    /// Biases in the blocks' linear layers and in every layer norm. nanoGPT
    /// trains without them (its `bias = False`, "a bit better and faster");
    /// the output layer, tied to the token embedding, never has one.
    pub bias: bool,
}

impl GptConfig {
    /// As checkpoint metadata.
    pub fn to_metadata(&self) -> HashMap<String, String> {
        let mut m = HashMap::new();
        for (k, v) in [
            ("gpt.vocab", self.vocab),
            ("gpt.context", self.context),
            ("gpt.layers", self.layers),
            ("gpt.heads", self.heads),
            ("gpt.width", self.width),
        ] {
            m.insert(k.to_string(), v.to_string());
        }
        m.insert("gpt.dropout".to_string(), self.dropout.to_string());
        m.insert("gpt.bias".to_string(), self.bias.to_string());
        m
    }

    #[track_caller]
    pub fn from_metadata(m: &HashMap<String, String>) -> Result<GptConfig> {
        let location = std::panic::Location::caller();
        let get = |k: &str| -> Result<usize> {
            m.get(k).and_then(|v| v.parse().ok()).ok_or_else(|| {
                Error::invalid(
                    "gpt",
                    format!("the checkpoint has no usable '{k}'; was it written by kiln train --model gpt?"),
                )
                .at(location)
            })
        };
        Ok(GptConfig {
            vocab: get("gpt.vocab")?,
            context: get("gpt.context")?,
            layers: get("gpt.layers")?,
            heads: get("gpt.heads")?,
            width: get("gpt.width")?,
            dropout: m.get("gpt.dropout").and_then(|v| v.parse().ok()).unwrap_or(0.0),
            // Checkpoints from before the option had biases.
            bias: m.get("gpt.bias").map_or(true, |v| v == "true"),
        })
    }
}

/// The model. Parameter keys follow the fields: "tok_emb.weight",
/// "pos_emb.weight", "blocks.0.self_attn.in_proj_weight", …, "ln_f.weight";
/// "head.weight" is the same `Param` as "tok_emb.weight" (tied) and is
/// listed once.
#[derive(kiln_core::nn::Module)]
pub struct Gpt {
    tok_emb: Embedding,
    pos_emb: Embedding,
    blocks: Vec<TransformerBlock>,
    ln_f: LayerNorm,
    head: Linear,
    #[module(skip)]
    config: GptConfig,
}

impl Gpt {
    /// nanoGPT's initialisation: every weight matrix and embedding
    /// N(0, 0.02), the residual output projections N(0, 0.02/√(2·layers)),
    /// biases (if `config.bias`) 0, layer norms 1/0.
    #[track_caller]
    pub fn new(device: &Device, config: GptConfig, seed: u64) -> Result<Gpt> {
        let c = config;
        if c.vocab == 0 || c.context == 0 || c.layers == 0 || c.width == 0 || c.heads == 0 || c.width % c.heads != 0 {
            return Err(Error::invalid("Gpt", format!("invalid configuration {c:?}")));
        }
        let mut seeds = SplitMix64::new(seed);
        let mut next = || seeds.next_u64();
        let mut tok_emb = Embedding::new(device, c.vocab, c.width, next())?;
        tok_emb.weight = init::normal(device, "weight", &[c.vocab, c.width], 0.0, 0.02, next())?;
        let mut pos_emb = Embedding::new(device, c.context, c.width, next())?;
        pos_emb.weight = init::normal(device, "weight", &[c.context, c.width], 0.0, 0.02, next())?;
        let proj_std = 0.02 / (2.0 * c.layers as f64).sqrt();
        let mut blocks = Vec::with_capacity(c.layers);
        for _ in 0..c.layers {
            let mut b = TransformerBlock::new(device, c.width, c.heads, 4 * c.width, c.dropout, next())?;
            let w = c.width;
            b.self_attn.in_proj_weight = init::normal(device, "in_proj_weight", &[3 * w, w], 0.0, 0.02, next())?;
            b.self_attn.out_proj.weight = init::normal(device, "weight", &[w, w], 0.0, proj_std, next())?;
            b.linear1.weight = init::normal(device, "weight", &[4 * w, w], 0.0, 0.02, next())?;
            b.linear1.bias = Some(init::zeros(device, "bias", &[4 * w])?);
            b.linear2.weight = init::normal(device, "weight", &[w, 4 * w], 0.0, proj_std, next())?;
            b.linear2.bias = Some(init::zeros(device, "bias", &[w])?);
            if !c.bias {
                b.self_attn.in_proj_bias = None;
                b.self_attn.out_proj.bias = None;
                b.linear1.bias = None;
                b.linear2.bias = None;
                b.norm1 = LayerNorm::new(device, &[w], 1e-5)?.without_bias();
                b.norm2 = LayerNorm::new(device, &[w], 1e-5)?.without_bias();
            }
            blocks.push(b);
        }
        let head = Linear::tied(tok_emb.weight.clone(), None)?;
        let mut ln_f = LayerNorm::new(device, &[c.width], 1e-5)?;
        if !c.bias {
            ln_f = ln_f.without_bias();
        }
        Ok(Gpt { tok_emb, pos_emb, blocks, ln_f, head, config })
    }

    pub fn config(&self) -> GptConfig {
        self.config
    }

    /// Activation checkpointing of every transformer block (see
    /// `TransformerBlock::set_checkpointing`): backward recomputes each
    /// block from its input instead of keeping its activations.
    pub fn set_checkpointing(&self, on: bool) {
        for block in &self.blocks {
            block.set_checkpointing(on);
        }
    }

    /// Logits [B, T, vocab] for i32 token ids [B, T] (T <= context).
    #[track_caller]
    pub fn forward<'g>(&self, idx: Tensor<'g>) -> Result<Tensor<'g>> {
        let t = self.check_tokens(&idx, 0)?;
        let graph = idx.graph();
        let positions = graph.arange(0.0, 1.0, t, DType::I32)?;
        let mut x = self.tok_emb.forward(idx)?.add(self.pos_emb.forward(positions)?)?;
        for block in &self.blocks {
            x = block.forward(x)?;
        }
        self.head.forward(self.ln_f.forward(x)?)
    }

    /// Logits for new tokens [B, T] that follow the `cache.len()` tokens
    /// already in `cache` (incremental decoding); advances the cache.
    #[track_caller]
    pub fn forward_cached<'g>(&self, idx: Tensor<'g>, cache: &KvCache) -> Result<Tensor<'g>> {
        let start = cache.len();
        let t = self.check_tokens(&idx, start)?;
        let graph = idx.graph();
        let positions = graph.arange(start as f64, 1.0, t, DType::I32)?;
        let mut x = self.tok_emb.forward(idx)?.add(self.pos_emb.forward(positions)?)?;
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward_cached(x, cache.layer(i)?)?;
        }
        cache.advance(t)?;
        self.head.forward(self.ln_f.forward(x)?)
    }

    /// A key/value cache for this model: `batch` sequences, `context` positions.
    #[track_caller]
    pub fn new_cache(&self, device: &Device, batch: usize) -> Result<KvCache> {
        let c = self.config;
        KvCache::new(device, c.layers, batch, c.heads, c.width / c.heads, c.context)
    }

    #[track_caller]
    fn check_tokens(&self, idx: &Tensor<'_>, start: usize) -> Result<usize> {
        let d = idx.dims();
        if d.len() != 2 || idx.dtype() != DType::I32 || d[1] == 0 || start + d[1] > self.config.context {
            return Err(Error::shape(
                "Gpt",
                format!(
                    "expects i32 token ids [B, T] with {start} + T <= context {}, got {:?} {}",
                    self.config.context,
                    d.as_slice(),
                    idx.dtype()
                ),
            ));
        }
        Ok(d[1])
    }
}

/// Characters ↔ token ids: the sorted distinct characters of a text.
#[derive(Clone, Debug, PartialEq)]
pub struct CharVocab {
    chars: Vec<char>,
}

impl CharVocab {
    pub fn from_text(text: &str) -> CharVocab {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        CharVocab { chars }
    }
    /// From the string `as_string` wrote.
    pub fn from_string(s: &str) -> CharVocab {
        CharVocab { chars: s.chars().collect() }
    }
    pub fn as_string(&self) -> String {
        self.chars.iter().collect()
    }
    pub fn len(&self) -> usize {
        self.chars.len()
    }
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }
    /// Token ids; a character outside the vocabulary is an error naming it.
    #[track_caller]
    pub fn encode(&self, text: &str) -> Result<Vec<i32>> {
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match self.chars.binary_search(&c) {
                Ok(i) => out.push(i as i32),
                Err(_) => {
                    return Err(Error::invalid(
                        "CharVocab::encode",
                        format!("the character {c:?} is not in the vocabulary"),
                    ))
                }
            }
        }
        Ok(out)
    }
    pub fn decode(&self, ids: &[i32]) -> String {
        ids.iter().filter_map(|&i| self.chars.get(i as usize)).collect()
    }
}

/// A text file, plain or gzip-compressed (detected from its first bytes).
#[track_caller]
pub fn load_text(path: &Path) -> Result<String> {
    let location = std::panic::Location::caller();
    let fail = |e: String| Error::io("load_text", format!("{}: {e}", path.display())).at(location);
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&bytes[..])
            .read_to_end(&mut out)
            .map_err(|e| fail(format!("bad gzip data: {e}")))?;
        out
    } else {
        bytes
    };
    let text = String::from_utf8(raw).map_err(|e| fail(format!("not UTF-8 text: {e}")))?;
    if text.chars().count() < 2 {
        return Err(fail("the text is empty".to_string()));
    }
    Ok(text)
}

/// Token ids split into training (first 90%) and validation (last 10%).
pub struct TextData {
    pub vocab: CharVocab,
    pub train: Vec<i32>,
    pub val: Vec<i32>,
}

impl TextData {
    #[track_caller]
    pub fn new(text: &str, context: usize) -> Result<TextData> {
        let vocab = CharVocab::from_text(text);
        let ids = vocab.encode(text)?;
        let split = ids.len() * 9 / 10;
        let (train, val) = (ids[..split].to_vec(), ids[split..].to_vec());
        if train.len() <= context + 1 || val.len() <= context + 1 {
            return Err(Error::invalid(
                "TextData",
                format!(
                    "{} characters are too few for a context of {context} (need more than {} in each split)",
                    ids.len(),
                    context + 1
                ),
            ));
        }
        Ok(TextData { vocab, train, val })
    }
}

/// `batch` random windows of `context` tokens from `ids`, and the same
/// shifted by one (the targets), drawn from `rng`.
pub fn random_batch(ids: &[i32], batch: usize, context: usize, rng: &mut SplitMix64) -> (Vec<i32>, Vec<i32>) {
    let mut x = Vec::with_capacity(batch * context);
    let mut y = Vec::with_capacity(batch * context);
    let span = (ids.len() - context - 1) as u64;
    for _ in 0..batch {
        let start = (rng.next_u64() % span) as usize;
        x.extend_from_slice(&ids[start..start + context]);
        y.extend_from_slice(&ids[start + 1..start + context + 1]);
    }
    (x, y)
}

/// Mean cross-entropy of next-token predictions, [B, T] ids and targets.
#[track_caller]
pub fn lm_loss<'g>(model: &Gpt, x: Tensor<'g>, y: Tensor<'g>) -> Result<Tensor<'g>> {
    let logits = model.forward(x)?;
    let d = logits.dims();
    let rows = d[0] * d[1];
    cross_entropy(logits.reshape_to(&[rows, d[2]])?, y.reshape_to(&[rows])?)
}

/// The training hyper-parameters (nanoGPT's Shakespeare-char defaults).
#[derive(Clone, Debug)]
pub struct GptTrainConfig {
    pub steps: u64,
    pub batch: usize,
    pub lr: f64,
    pub min_lr: f64,
    pub warmup: u64,
    pub weight_decay: f64,
    pub grad_clip: f64,
    pub eval_interval: u64,
    pub eval_batches: usize,
    pub seed: u64,
}

impl Default for GptTrainConfig {
    fn default() -> Self {
        GptTrainConfig {
            steps: 2000,
            batch: 12,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup: 100,
            weight_decay: 0.1,
            grad_clip: 1.0,
            eval_interval: 250,
            eval_batches: 20,
            seed: 1337,
        }
    }
}

/// AdamW with decay on matrices and embeddings only, betas (0.9, 0.99),
/// and nanoGPT's schedule: step i < warmup has lr·(i+1)/(warmup+1), then a
/// cosine from lr at step `warmup` to `min_lr` at step `steps`.
#[track_caller]
pub fn optimizer_for(model: &Gpt, config: &GptTrainConfig) -> Result<(Adam, LrScheduler)> {
    let groups = ParamGroup::decay_split(model.parameters(), config.weight_decay);
    let mut adam = Adam::with_groups(groups, config.lr, (0.9, 0.99), 1e-8, 0.0, true)?;
    let min_factor = config.min_lr / config.lr;
    let cosine = Schedule::Cosine { steps: config.steps.saturating_sub(config.warmup), min_factor };
    let schedule = if config.warmup == 0 {
        cosine
    } else {
        // Linear from 1/(warmup+1): PyTorch's LinearLR with that start gives
        // (i+1)/(warmup+1) at step i, nanoGPT's warm-up.
        let start_factor = 1.0 / (config.warmup + 1) as f64;
        Schedule::LinearWarmup { steps: config.warmup, start_factor }.then(config.warmup, cosine)
    };
    let scheduler = LrScheduler::new(&mut adam, schedule)?;
    Ok((adam, scheduler))
}

/// One optimizer step on one batch; returns the loss.
#[track_caller]
pub fn train_step(
    graph: &mut Graph,
    model: &Gpt,
    adam: &mut Adam,
    scheduler: &mut LrScheduler,
    batch: (&[i32], &[i32]),
    shape: [usize; 2],
    grad_clip: f64,
) -> Result<f64> {
    train_step_with(&mut SingleProcess, graph, model, adam, scheduler, batch, shape, 1.0, grad_clip)
}

/// One optimizer step of (possibly data-parallel) training: `batch` is this
/// process's rows of the global batch (`shape` [rows, context]; rows may be
/// 0), `weight` = rows / global rows. `replicas` leaves the global batch's
/// gradient in every process's parameters, so the clipping and the step
/// below are the same everywhere. Returns the global batch's mean loss.
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn train_step_with(
    replicas: &mut dyn Replicas,
    graph: &mut Graph,
    model: &Gpt,
    adam: &mut Adam,
    scheduler: &mut LrScheduler,
    batch: (&[i32], &[i32]),
    shape: [usize; 2],
    weight: f64,
    grad_clip: f64,
) -> Result<f64> {
    graph.reset();
    let loss = if shape[0] == 0 {
        None
    } else {
        let x = graph.tensor_from(batch.0, &shape)?;
        let y = graph.tensor_from(batch.1, &shape)?;
        Some(lm_loss(model, x, y)?)
    };
    adam.zero_grad();
    let loss = replicas.backward(loss, weight)?;
    if grad_clip > 0.0 {
        // The norm is read back only to report it; clipping ran on the device.
        crate::clip_grad_norm(&model.parameters(), grad_clip, 2.0)?;
    }
    adam.step()?;
    scheduler.step(adam);
    Ok(loss)
}

/// Mean loss over `batches` random batches of `ids` (evaluation mode, no
/// gradient structure), drawn from a generator seeded with `seed`.
#[track_caller]
pub fn estimate_loss(
    device: &Device,
    model: &Gpt,
    ids: &[i32],
    batch: usize,
    batches: usize,
    seed: u64,
) -> Result<f64> {
    estimate_loss_with(&mut SingleProcess, device, model, ids, batch, batches, seed)
}

/// `estimate_loss` shared among processes: every process draws the same
/// batches, evaluates every `size`-th one from its rank on, and the sums
/// are added up — the single-process value up to summation order.
/// Collective.
#[track_caller]
pub fn estimate_loss_with(
    replicas: &mut dyn Replicas,
    device: &Device,
    model: &Gpt,
    ids: &[i32],
    batch: usize,
    batches: usize,
    seed: u64,
) -> Result<f64> {
    let context = model.config().context;
    let mut rng = SplitMix64::new(seed);
    // Drawn on every process (the helper asks for every batch), so that each
    // one's batches are the ones a single process would draw.
    let sum = summed_losses(replicas, device, model, batches, |_| {
        let (x, y) = random_batch(ids, batch, context, &mut rng);
        (Cow::Owned(x), Cow::Owned(y), batch, 1.0)
    })?;
    Ok(sum / batches.max(1) as f64)
}

/// Evaluation-mode loss summed over `count` batches: `batch_of(i)` gives
/// batch i's inputs and targets (`rows` × context) and its weight in the
/// sum. It is called for every i on every process, in order; each process
/// evaluates every `size`-th batch from its rank on and the sums are added
/// up. Collective.
fn summed_losses<'a>(
    replicas: &mut dyn Replicas,
    device: &Device,
    model: &Gpt,
    count: usize,
    mut batch_of: impl FnMut(usize) -> (Cow<'a, [i32]>, Cow<'a, [i32]>, usize, f64),
) -> Result<f64> {
    let context = model.config().context;
    let (rank, size) = (replicas.rank(), replicas.size());
    let mut graph = Graph::new(device);
    model.set_training(false);
    let mut total = 0.0;
    let mut result = Ok(());
    for i in 0..count {
        let (x, y, rows, weight) = batch_of(i);
        if i % size != rank {
            continue;
        }
        graph.reset();
        let _no_grad = graph.no_grad();
        let step = (|| {
            let x = graph.tensor_from(&x, &[rows, context])?;
            let y = graph.tensor_from(&y, &[rows, context])?;
            lm_loss(model, x, y)?.item_blocking()
        })();
        match step {
            Ok(l) => total += l * weight,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    model.set_training(true);
    result?;
    let mut sum = [total];
    replicas.sum(&mut sum)?;
    Ok(sum[0])
}

/// Mean loss over all of `ids` (evaluation mode, no gradient structure):
/// consecutive, non-overlapping windows of `context` tokens (targets one
/// further on), `batch` windows at a time, every window counted once. This
/// is the exact figure that `estimate_loss` samples at random; returns it
/// and the number of windows.
#[track_caller]
pub fn split_loss(device: &Device, model: &Gpt, ids: &[i32], batch: usize) -> Result<(f64, usize)> {
    split_loss_with(&mut SingleProcess, device, model, ids, batch)
}

/// `split_loss` shared among processes: each evaluates every `size`-th
/// batch from its rank on, and the sums are added up. Collective.
#[track_caller]
pub fn split_loss_with(
    replicas: &mut dyn Replicas,
    device: &Device,
    model: &Gpt,
    ids: &[i32],
    batch: usize,
) -> Result<(f64, usize)> {
    let context = model.config().context;
    let windows = ids.len().saturating_sub(1) / context;
    if windows == 0 || batch == 0 {
        return Err(Error::invalid(
            "split_loss",
            format!("{} tokens hold no window of {context} (batch {batch})", ids.len()),
        ));
    }
    let sum = summed_losses(replicas, device, model, windows.div_ceil(batch), |i| {
        let first = i * batch;
        let rows = batch.min(windows - first);
        let (start, end) = (first * context, (first + rows) * context);
        // Each batch's mean, weighted by its windows (all of one length).
        (Cow::Borrowed(&ids[start..end]), Cow::Borrowed(&ids[start + 1..end + 1]), rows, rows as f64)
    })?;
    Ok((sum / windows as f64, windows))
}

/// Generate `tokens` characters after `prompt` with the key/value cache:
/// each step samples from softmax(logits / temperature) (top-k filtered if
/// asked) on the device, seeded by (seed, step), so a run replays exactly.
/// When the context fills up, the cache restarts from the last half of it.
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn generate(
    device: &Device,
    model: &Gpt,
    vocab: &CharVocab,
    prompt: &str,
    tokens: usize,
    temperature: f64,
    top_k: Option<usize>,
    seed: u64,
    mut on_char: impl FnMut(char),
) -> Result<String> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(Error::invalid("generate", format!("temperature {temperature} must be positive")));
    }
    let context = model.config().context;
    let mut ids = vocab.encode(if prompt.is_empty() { "\n" } else { prompt })?;
    model.set_training(false);
    let cache = model.new_cache(device, 1)?;
    let mut graph = Graph::new(device);
    let mut pending: Vec<i32> = ids[ids.len().saturating_sub(context)..].to_vec();
    let mut out = String::new();
    for step in 0..tokens {
        if cache.len() + pending.len() > context {
            cache.reset()?;
            let keep = (context / 2).max(1);
            pending = ids[ids.len().saturating_sub(keep)..].to_vec();
        }
        graph.reset();
        let _no_grad = graph.no_grad();
        let x = graph.tensor_from(&pending, &[1, pending.len()])?;
        let logits = model.forward_cached(x, &cache)?;
        let v = vocab.len();
        let last = logits.slice_axis(1, pending.len() - 1, pending.len(), 1)?.reshape_to(&[1, v])?.div(temperature)?;
        let last = match top_k {
            Some(k) => last.top_k_filter(k)?,
            None => last,
        };
        let next = last.softmax(-1)?.multinomial(seed.wrapping_mul(0x9E37_79B9).wrapping_add(step as u64))?;
        let id = next.to_vec_blocking::<i32>()?[0];
        ids.push(id);
        pending = vec![id];
        let c = vocab.decode(&[id]);
        for ch in c.chars() {
            on_char(ch);
        }
        out.push_str(&c);
    }
    model.set_training(true);
    Ok(out)
}
