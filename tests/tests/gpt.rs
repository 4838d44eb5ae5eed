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
    let config = GptConfig { vocab: data.vocab.len(), context: 16, layers: 2, heads: 2, width: 32, dropout: 0.0 };
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

#[test]
fn the_kv_cache_decoder_matches_the_full_forward() {
    let device = Device::cpu();
    let data = TextData::new(&text(), 16).unwrap();
    let config = GptConfig { vocab: data.vocab.len(), context: 16, layers: 2, heads: 2, width: 16, dropout: 0.0 };
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
    wgpu_matches_cpu(GptConfig { vocab: 0, context: 16, layers: 2, heads: 2, width: 32, dropout: 0.0 }, 4, 2);
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
    wgpu_matches_cpu(GptConfig { vocab: 0, context: 64, layers: 4, heads: 4, width: 128, dropout: 0.0 }, 12, 60);
}
