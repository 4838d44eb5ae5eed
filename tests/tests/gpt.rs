//! The char-level GPT end to end on small data: it learns, a checkpoint
//! resumes, sampling replays, the derive names its parameters; and the
//! acceptance configuration's losses on wgpu match the CPU's.

mod common;

use kiln::gpt::{self, CharVocab, Gpt, GptConfig, GptTrainConfig, TextData};
use kiln::host_rng::SplitMix64;
use kiln::prelude::*;

/// A small text generated here (no data files): a few repeated verses.
fn text() -> String {
    let verses = [
        "ROMEO: But soft, what light through yonder window breaks?\n",
        "JULIET: O Romeo, Romeo, wherefore art thou Romeo?\n",
        "MERCUTIO: A plague o' both your houses!\n",
    ];
    (0..40).map(|i| verses[(i * 7) % 3]).collect()
}

fn losses(device: &Device, config: GptConfig, batch: usize, steps: u64, data: &TextData) -> Vec<f64> {
    let model = Gpt::new(device, config, 3).unwrap();
    let train = GptTrainConfig { steps, batch, warmup: 2, ..GptTrainConfig::default() };
    let (mut adam, mut sched) = gpt::optimizer_for(&model, &train).unwrap();
    let mut graph = Graph::new(device);
    (0..steps)
        .map(|step| {
            let (x, y) = gpt::random_batch(&data.train, batch, config.context, &mut SplitMix64::for_stream(5, step));
            gpt::train_step(&mut graph, &model, &mut adam, &mut sched, (&x, &y), [batch, config.context], 1.0).unwrap()
        })
        .collect()
}

#[test]
fn a_small_gpt_learns_resumes_and_samples() {
    let device = Device::cpu();
    let data = TextData::new(&text(), 16).unwrap();
    let config =
        GptConfig { vocab: data.vocab.len(), context: 16, layers: 2, heads: 2, width: 32, dropout: 0.0, bias: false };
    let l = losses(&device, config, 8, 60, &data);
    assert!(l[59] < 0.85 * l[0], "the loss falls: {} -> {}", l[0], l[59]);
    let model = Gpt::new(&device, config, 1).unwrap();
    let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names[0], "tok_emb.weight");
    assert!(names.contains(&"blocks.1.self_attn.in_proj_weight".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("head.")), "the tied head is listed once, as tok_emb.weight");
    // Sampling is seeded: the same seed gives the same text.
    let a = gpt::generate(&device, &model, &data.vocab, "RO", 40, 0.8, Some(5), 9, |_| {}).unwrap();
    let b = gpt::generate(&device, &model, &data.vocab, "RO", 40, 0.8, Some(5), 9, |_| {}).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.chars().count(), 40);
    assert!(gpt::generate(&device, &model, &data.vocab, "RO", 1, 0.0, None, 0, |_| {}).is_err());
    let vocab = CharVocab::from_string(&data.vocab.as_string());
    assert_eq!(vocab.decode(&vocab.encode("ROMEO").unwrap()), "ROMEO");
    let e = vocab.encode("Z~").unwrap_err();
    assert_eq!(e.location().file(), file!(), "{e}");
}

/// The default recipe is nanoGPT's: no biases in the blocks and norms
/// (`bias: true` restores them), the choice kept in checkpoint metadata,
/// and the warm-up lr·(i+1)/(warmup+1) before the cosine.
#[test]
fn the_default_recipe_is_nanogpts() {
    let device = Device::cpu();
    let base = GptConfig { vocab: 9, context: 8, layers: 2, heads: 2, width: 8, dropout: 0.0, bias: false };
    let names = |c: GptConfig| -> Vec<String> {
        Gpt::new(&device, c, 1).unwrap().named_parameters().into_iter().map(|(n, _)| n).collect()
    };
    let plain = names(base);
    assert!(!plain.iter().any(|n| n.contains("bias")), "{plain:?}");
    assert!(plain.contains(&"blocks.1.norm2.weight".to_string()) && plain.contains(&"ln_f.weight".to_string()));
    let biased = names(GptConfig { bias: true, ..base });
    for key in
        ["blocks.0.self_attn.in_proj_bias", "blocks.0.self_attn.out_proj.bias", "blocks.1.linear2.bias", "ln_f.bias"]
    {
        assert!(biased.contains(&key.to_string()), "{key} in {biased:?}");
    }
    assert_eq!(GptConfig::from_metadata(&base.to_metadata()).unwrap(), base);
    let mut old = GptConfig { bias: true, ..base }.to_metadata();
    old.remove("gpt.bias");
    assert!(GptConfig::from_metadata(&old).unwrap().bias, "checkpoints from before the option had biases");

    let model = Gpt::new(&device, base, 1).unwrap();
    let train = GptTrainConfig { steps: 20, warmup: 4, lr: 1e-3, min_lr: 1e-4, ..GptTrainConfig::default() };
    let (mut adam, mut sched) = gpt::optimizer_for(&model, &train).unwrap();
    let mut lrs = Vec::new();
    for _ in 0..21 {
        lrs.push(adam.learning_rate());
        sched.step(&mut adam);
    }
    for (i, lr) in lrs.iter().enumerate().take(4) {
        assert!((lr - 1e-3 * (i + 1) as f64 / 5.0).abs() < 1e-12, "warm-up step {i}: {lr}");
    }
    assert!((lrs[4] - 1e-3).abs() < 1e-12 && (lrs[20] - 1e-4).abs() < 1e-12, "{lrs:?}");
    let mid = 1e-4 + 0.9e-3 * 0.5 * (1.0 + (std::f64::consts::PI * 6.0 / 16.0).cos());
    assert!((lrs[10] - mid).abs() < 1e-12, "cosine at step 10: {} vs {mid}", lrs[10]);
}

/// The whole-split loss counts every window once, whatever the batch: the
/// mean of the per-window losses.
#[test]
fn the_split_loss_is_the_mean_over_every_window() {
    let device = Device::cpu();
    let data = TextData::new(&text(), 16).unwrap();
    let config =
        GptConfig { vocab: data.vocab.len(), context: 16, layers: 1, heads: 2, width: 16, dropout: 0.0, bias: false };
    let model = Gpt::new(&device, config, 6).unwrap();
    let ids = &data.val;
    let windows = (ids.len() - 1) / 16;
    assert!(windows >= 5, "{windows} windows");
    let mut per_window = 0.0;
    for w in 0..windows {
        let graph = Graph::new(&device);
        let _no_grad = graph.no_grad();
        let x = graph.tensor_from(&ids[w * 16..(w + 1) * 16], &[1, 16]).unwrap();
        let y = graph.tensor_from(&ids[w * 16 + 1..(w + 1) * 16 + 1], &[1, 16]).unwrap();
        per_window += gpt::lm_loss(&model, x, y).unwrap().item_blocking().unwrap();
    }
    let expected = per_window / windows as f64;
    for batch in [1, 3, windows, windows + 4] {
        let (loss, n) = gpt::split_loss(&device, &model, ids, batch).unwrap();
        assert_eq!(n, windows);
        assert!((loss - expected).abs() < 1e-5, "batch {batch}: {loss} vs {expected}");
    }
    assert!(gpt::split_loss(&device, &model, &ids[..16], 4).is_err(), "16 tokens hold no window of 16 plus a target");
}

#[test]
fn the_kv_cache_decoder_matches_the_full_forward() {
    let device = Device::cpu();
    let data = TextData::new(&text(), 16).unwrap();
    let config =
        GptConfig { vocab: data.vocab.len(), context: 16, layers: 2, heads: 2, width: 16, dropout: 0.0, bias: false };
    let model = Gpt::new(&device, config, 4).unwrap();
    let ids = data.vocab.encode("ROMEO: But").unwrap();
    let graph = Graph::new(&device);
    let full = common::values(&model.forward(graph.tensor_from(&ids, &[1, ids.len()]).unwrap()).unwrap());
    let cache = model.new_cache(&device, 1).unwrap();
    let mut step = Vec::new();
    for chunk in [&ids[..4], &ids[4..5], &ids[5..]] {
        let graph = Graph::new(&device);
        step.extend(common::values(
            &model.forward_cached(graph.tensor_from(chunk, &[1, chunk.len()]).unwrap(), &cache).unwrap(),
        ));
    }
    common::assert_close(&step, &full, 1e-5);
}

/// 20 training steps of a GPT on wgpu give the CPU's losses within 1e-3.
fn wgpu_matches_cpu(config: GptConfig, batch: usize, corpus_copies: usize) {
    let Some(gpu) = common::vulkan_device("gpt wgpu parity") else { return };
    let corpus: String = (0..corpus_copies).map(|_| text()).collect();
    let data = TextData::new(&corpus, config.context).unwrap();
    let config = GptConfig { vocab: data.vocab.len(), ..config };
    let cpu = losses(&Device::cpu(), config, batch, 20, &data);
    let wgpu = losses(&gpu, config, batch, 20, &data);
    eprintln!("cpu  {cpu:?}\nwgpu {wgpu:?}");
    for (step, (c, g)) in cpu.iter().zip(&wgpu).enumerate() {
        assert!((c - g).abs() <= 1e-3, "step {step}: cpu {c} vs wgpu {g}");
    }
    assert!(cpu[19] < cpu[0]);
}

/// A small GPT (2 layers, width 32, context 16): quick enough for every CI run.
#[test]
fn a_small_gpt_trains_the_same_on_wgpu_as_on_the_cpu() {
    wgpu_matches_cpu(
        GptConfig { vocab: 0, context: 16, layers: 2, heads: 2, width: 32, dropout: 0.0, bias: false },
        4,
        2,
    );
}

/// Issue 11's acceptance configuration (4 layers, 4 heads, width 128,
/// context 64, batch 12, AdamW 1e-3 with warm-up and cosine, clipping).
/// Run with `cargo test --release -p kiln-tests --test gpt -- --ignored`.
/// Measured on lavapipe on the shared 2-core machine (2026-12-01, load
/// 15-24): 280 s for the 20 CPU and 20 wgpu steps (about 17 minutes before
/// the wgpu kernel fixes of that day), largest difference 2.4e-7. The small
/// configuration above covers the same path in every CI run.
#[test]
#[ignore]
fn the_acceptance_gpt_trains_the_same_on_wgpu_as_on_the_cpu() {
    wgpu_matches_cpu(
        GptConfig { vocab: 0, context: 64, layers: 4, heads: 4, width: 128, dropout: 0.0, bias: false },
        12,
        60,
    );
}
