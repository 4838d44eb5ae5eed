//! Shape-specialised pipelines (kernels-wgsl/src/specialize.rs): a
//! repeated dispatch runs a pipeline with its parameters as WGSL constants.
//! The same training runs on a device with specialisation on and one with
//! it off must give the same bits (on software adapters, which round every
//! op; within a few ulp on GPUs, whose compilers may contract differently
//! once operands are constants), and the device with it on must actually
//! have run specialised pipelines.

mod common;

use kiln::gpt::{self, Gpt, GptConfig, GptTrainConfig, TextData};
use kiln::host_rng::SplitMix64;
use kiln::prelude::*;
use kiln::WgpuOptions;

fn device(specialize: bool) -> Option<Device> {
    let options = WgpuOptions { specialize_shapes: Some(specialize), ..WgpuOptions::default() };
    common::vulkan_device_with(options, "wgpu_specialize")
}

fn specialized(device: &Device) -> usize {
    device.backend().counters().specialized_pipelines
}

/// Equal bits on software adapters, within 4 ulp-ish relative error on GPUs.
fn assert_same(on: &[f32], off: &[f32], exact: bool, what: &str) {
    assert_eq!(on.len(), off.len(), "{what}");
    for (i, (a, b)) in on.iter().zip(off).enumerate() {
        if exact {
            assert_eq!(a.to_bits(), b.to_bits(), "{what}[{i}]: {a} specialised vs {b} generic");
        } else {
            assert!((a - b).abs() <= 5e-7 * b.abs().max(1.0), "{what}[{i}]: {a} specialised vs {b} generic");
        }
    }
}

/// Losses of 6 Adam steps of the digits CNN (Conv2d, MaxPool2d, the folded
/// convolution's permutes, fused element-wise groups and reductions) and
/// its parameters afterwards.
fn cnn_run(device: &Device) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (losses, params) = common::digits_cnn_steps(device, 16, 6);
    let values = params.iter().map(|p| common::param_value(p).iter().map(|&v| v as f32).collect()).collect();
    (losses.iter().map(|&l| l as f32).collect(), values)
}

#[test]
fn cnn_steps_give_the_generic_kernels_bits() {
    let (Some(on), Some(off)) = (device(true), device(false)) else { return };
    let exact = common::rounds_every_op(&on);
    let (losses_on, params_on) = cnn_run(&on);
    let (losses_off, params_off) = cnn_run(&off);
    assert!(specialized(&on) > 0, "the repeated steps ran specialised pipelines");
    assert_eq!(specialized(&off), 0, "the switch turns it off");
    assert_same(&losses_on, &losses_off, exact, "loss");
    for (k, (a, b)) in params_on.iter().zip(&params_off).enumerate() {
        assert_same(a, b, exact, &format!("parameter {k}"));
    }
    // A later run of other shapes (batch 16 -> the last partial batch is
    // not taken; use a new model) still agrees: specialisations are per
    // parameter set, never reused for another.
    let made = specialized(&on);
    let (again_on, _) = cnn_run(&on);
    assert_eq!(specialized(&on), made, "the same shapes reuse what was made");
    assert_same(&again_on, &losses_off, exact, "loss, second run");
}

/// A small GPT (embedding gather, attention's batched products and causal
/// softmax, layer norms, GELU, the tied head, scatter-add of the embedding
/// gradient) for 4 steps.
fn gpt_losses(device: &Device) -> Vec<f32> {
    let text: String = (0..30).map(|i| ["to be, or not to be\n", "that is the question\n"][i % 2]).collect();
    let data = TextData::new(&text, 8).unwrap();
    let config =
        GptConfig { vocab: data.vocab.len(), context: 8, layers: 1, heads: 2, width: 16, dropout: 0.0, bias: true };
    let model = Gpt::new(device, config, 3).unwrap();
    let train = GptTrainConfig { steps: 4, batch: 3, warmup: 1, ..GptTrainConfig::default() };
    let (mut adam, mut sched) = gpt::optimizer_for(&model, &train).unwrap();
    let mut graph = Graph::new(device);
    (0..4)
        .map(|step| {
            let (x, y) = gpt::random_batch(&data.train, 3, config.context, &mut SplitMix64::for_stream(5, step));
            let l = gpt::train_step(&mut graph, &model, &mut adam, &mut sched, (&x, &y), [3, config.context], 1.0);
            l.unwrap() as f32
        })
        .collect()
}

#[test]
fn gpt_steps_give_the_generic_kernels_bits() {
    let (Some(on), Some(off)) = (device(true), device(false)) else { return };
    let exact = common::rounds_every_op(&on);
    let l_on = gpt_losses(&on);
    let l_off = gpt_losses(&off);
    assert!(specialized(&on) > 0);
    assert_same(&l_on, &l_off, exact, "GPT loss");
}

#[test]
fn random_element_wise_chains_give_the_generic_kernels_bits() {
    let (Some(on), Some(off)) = (device(true), device(false)) else { return };
    let exact = common::rounds_every_op(&on);
    for seed in 0..4u64 {
        for dims in [&[5usize, 7][..], &[3, 4, 6][..]] {
            // Twice each: the second run's dispatches repeat the first's.
            for round in 0..2 {
                let a = common::chains::random_chain(&on, seed, dims, 14);
                let b = common::chains::random_chain(&off, seed, dims, 14);
                let what = format!("seed {seed}, dims {dims:?}, round {round}");
                if exact {
                    assert_eq!(a.bits(), b.bits(), "{what}");
                } else {
                    a.assert_close(&b, 5e-7, &what);
                }
            }
        }
    }
    assert!(specialized(&on) > 0);
}
