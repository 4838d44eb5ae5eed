//! Checkpoints: safetensors files keyed as PyTorch's state_dict, written
//! atomically, loaded only when every key matches, and optimizer state that
//! resumes training bit for bit.
//!
//! There is no PyTorch here (python3 has no torch), so PyTorch-readability
//! rests on the format (parsed below with the safetensors crate, which is
//! what `safetensors.torch.load_file` uses) and on the key naming, not on a
//! PyTorch run.

use std::path::PathBuf;

use kiln::checkpoint;
use kiln::nn::{BatchNorm2d, Conv2d, ConvOptions, Flatten, MaxPool2d, Module, Unflatten};
use kiln::optim::{Adam, Optimizer, OptimizerState, Sgd};
use kiln::prelude::*;
use kiln::{BlockingParam, ErrorKind};

/// A fresh, empty directory under the system temp directory.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-checkpoint-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn keys(entries: &[(String, Param)]) -> Vec<String> {
    entries.iter().map(|(k, _)| k.clone()).collect()
}

/// [N, 64] → [N, 1, 8, 8] → conv → batch norm → ReLU → pool → 10 classes.
fn cnn(device: &Device, seed: u64) -> Sequential {
    let options = ConvOptions { padding: [1, 1], ..ConvOptions::default() };
    Sequential::new()
        .add(Unflatten { dims: vec![1, 8, 8] })
        .add(Conv2d::new(device, 1, 4, [3, 3], options, seed).unwrap())
        .add(BatchNorm2d::new(device, 4, 1e-5, 0.1).unwrap())
        .add(Activation::Relu)
        .add(MaxPool2d::new(2))
        .add(Flatten)
        .add(Linear::new(device, 4 * 4 * 4, 10, true, seed.wrapping_add(1)).unwrap())
}

fn inputs(n: usize, width: usize, seed: u32) -> Vec<f32> {
    (0..n * width)
        .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn labels(n: usize, classes: i32) -> Vec<i32> {
    (0..n as i32).map(|i| (i * 7 + 3) % classes).collect()
}

fn output(model: &dyn Module, device: &Device, x: &[f32], dims: &[usize]) -> Vec<f32> {
    let graph = Graph::new(device);
    let _no_grad = graph.no_grad();
    model.forward(graph.tensor_from(x, dims).unwrap()).unwrap().to_vec_blocking::<f32>().unwrap()
}

fn values(model: &dyn Module) -> Vec<HostData> {
    checkpoint::named_state(model).iter().map(|(_, p)| p.value_blocking().unwrap()).collect()
}

/// `steps` cross-entropy training steps on fixed data; the losses.
fn train(model: &dyn Module, optimizer: &mut impl Optimizer, device: &Device, steps: usize, width: usize) -> Vec<f32> {
    let n = 16;
    let x = inputs(n, width, 5);
    let y = labels(n, 10);
    let mut graph = Graph::new(device);
    let mut losses = Vec::new();
    for _ in 0..steps {
        graph.reset();
        let xt = graph.tensor_from(&x, &[n, width]).unwrap();
        let yt = graph.tensor_from(&y, &[n]).unwrap();
        let loss = cross_entropy(model.forward(xt).unwrap(), yt).unwrap();
        losses.push(loss.to_vec_blocking::<f32>().unwrap()[0]);
        optimizer.zero_grad();
        loss.backward().unwrap();
        optimizer.step().unwrap();
    }
    losses
}

#[test]
fn sequential_keys_are_pytorchs_state_dict_keys() {
    let device = Device::cpu();
    let mlp = Sequential::mlp(&device, &[4, 8, 8, 3], Activation::Relu, 0).unwrap();
    // torch.nn.Sequential(Linear, ReLU, Linear, ReLU, Linear).state_dict().keys()
    assert_eq!(keys(&mlp.named_parameters()), ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]);
    assert!(mlp.named_buffers().is_empty());
    // Same parameters, same order as parameters().
    let named = mlp.named_parameters();
    assert!(named.iter().zip(mlp.parameters()).all(|((_, a), b)| a.same(&b)));

    let model = cnn(&device, 1);
    assert_eq!(keys(&model.named_parameters()), ["1.weight", "1.bias", "2.weight", "2.bias", "6.weight", "6.bias"]);
    assert_eq!(keys(&model.named_buffers()), ["2.running_mean", "2.running_var"]);
    assert_eq!(model.buffers().len(), 2);
    assert_eq!(model.parameters().len(), 6, "running statistics stay out of parameters()");
}

#[test]
fn a_saved_file_is_a_valid_safetensors_file() {
    let device = Device::cpu();
    let model = cnn(&device, 2);
    let dir = temp_dir("valid");
    let path = dir.join("model.safetensors");
    checkpoint::save(&path, &model).unwrap();

    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = file.names();
    names.sort();
    assert_eq!(
        names,
        ["1.bias", "1.weight", "2.bias", "2.running_mean", "2.running_var", "2.weight", "6.bias", "6.weight"]
    );
    for (key, param) in checkpoint::named_state(&model) {
        let view = file.tensor(&key).unwrap();
        assert_eq!(view.dtype(), safetensors::Dtype::F32, "{key}");
        assert_eq!(view.shape(), param.dims().as_slice(), "{key}");
        let stored: Vec<f32> = view.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(HostData::F32(stored), param.value_blocking().unwrap(), "{key}");
    }
    assert_eq!(file.tensor("1.weight").unwrap().shape(), [4, 1, 3, 3]);
    assert_eq!(file.tensor("6.weight").unwrap().shape(), [10, 64]);
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(header.metadata().as_ref().unwrap().get("format").map(String::as_str), Some("pt"));
    // Nothing but the checkpoint is left in the directory.
    let entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(entries, ["model.safetensors"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_mlp_round_trips_into_a_fresh_model() {
    let device = Device::cpu();
    let trained = Sequential::mlp(&device, &[6, 16, 10], Activation::Tanh, 1).unwrap();
    let mut optimizer = Adam::new(trained.parameters(), 0.05).unwrap();
    train(&trained, &mut optimizer, &device, 3, 6);
    let fresh = Sequential::mlp(&device, &[6, 16, 10], Activation::Tanh, 99).unwrap();
    let x = inputs(5, 6, 11);
    assert_ne!(output(&trained, &device, &x, &[5, 6]), output(&fresh, &device, &x, &[5, 6]));

    let dir = temp_dir("mlp");
    let path = dir.join("mlp.safetensors");
    checkpoint::save(&path, &trained).unwrap();
    checkpoint::load(&path, &fresh).unwrap();
    assert_eq!(output(&trained, &device, &x, &[5, 6]), output(&fresh, &device, &x, &[5, 6]));
    assert_eq!(values(&trained), values(&fresh));
    // Saving over an existing checkpoint replaces it.
    checkpoint::save(&path, &Sequential::mlp(&device, &[6, 16, 10], Activation::Tanh, 7).unwrap()).unwrap();
    checkpoint::load(&path, &fresh).unwrap();
    assert_ne!(values(&trained), values(&fresh));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cnn_with_batch_norm_round_trips_with_its_running_statistics() {
    let device = Device::cpu();
    let trained = cnn(&device, 3);
    let mut optimizer = Adam::new(trained.parameters(), 0.01).unwrap();
    train(&trained, &mut optimizer, &device, 3, 64);
    let fresh = cnn(&device, 42);
    let bytes = pollster::block_on(checkpoint::save_state(&trained)).unwrap();
    checkpoint::load_state(&fresh, &bytes).unwrap();
    assert_eq!(values(&trained), values(&fresh));
    // Evaluation mode reads the running statistics, so they were restored too.
    trained.set_training(false);
    fresh.set_training(false);
    let x = inputs(4, 64, 3);
    let expected = output(&trained, &device, &x, &[4, 64]);
    assert_eq!(expected, output(&fresh, &device, &x, &[4, 64]));
    // Not trivially so: a model with default statistics gives other outputs.
    let defaults = cnn(&device, 3);
    defaults.set_training(false);
    for ((key, p), (_, q)) in checkpoint::named_state(&trained).iter().zip(checkpoint::named_state(&defaults)) {
        if !key.contains("running") {
            q.set_value(&p.value_blocking().unwrap()).unwrap();
        }
    }
    assert_ne!(expected, output(&defaults, &device, &x, &[4, 64]));
}

#[test]
fn a_mismatched_checkpoint_is_refused_and_changes_nothing() {
    let device = Device::cpu();
    let small = Sequential::mlp(&device, &[4, 8, 3], Activation::Relu, 1).unwrap();
    let bytes = pollster::block_on(checkpoint::save_state(&small)).unwrap();

    // A shape mismatch in the first layer: nothing is loaded, not even the
    // last layer's bias, which matches.
    let wider = Sequential::mlp(&device, &[4, 9, 3], Activation::Relu, 2).unwrap();
    let before = values(&wider);
    let error = checkpoint::load_state(&wider, &bytes).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    let message = error.to_string();
    assert!(message.contains("nothing was loaded"), "{message}");
    assert!(message.contains("'0.weight': file has [8, 4] f32, module has [9, 4] f32"), "{message}");
    assert!(message.contains("'0.bias'") && message.contains("'2.weight'"), "{message}");
    assert!(!message.contains("'2.bias'"), "{message}");
    assert_eq!(before, values(&wider));

    // Missing keys (a deeper model) and unexpected keys (a shallower one).
    let deeper = Sequential::mlp(&device, &[4, 8, 3, 3], Activation::Relu, 3).unwrap();
    let before = values(&deeper);
    let message = checkpoint::load_state(&deeper, &bytes).unwrap_err().to_string();
    assert!(message.contains(r#"missing keys ["4.weight", "4.bias"]"#), "{message}");
    assert_eq!(before, values(&deeper));
    let deep_bytes = pollster::block_on(checkpoint::save_state(&deeper)).unwrap();
    let before = values(&small);
    let message = checkpoint::load_state(&small, &deep_bytes).unwrap_err().to_string();
    assert!(message.contains(r#"unexpected keys ["4.bias", "4.weight"]"#), "{message}");
    assert_eq!(before, values(&small));

    // An f64 model does not take f32 values.
    let mut f64_model = Sequential::new();
    f64_model = f64_model.add(Linear::with_dtype(&device, 4, 8, true, 1, DType::F64).unwrap());
    f64_model = f64_model.add(Activation::Relu);
    f64_model = f64_model.add(Linear::with_dtype(&device, 8, 3, true, 1, DType::F64).unwrap());
    let message = checkpoint::load_state(&f64_model, &bytes).unwrap_err().to_string();
    assert!(message.contains("file has [8, 4] f32, module has [8, 4] f64"), "{message}");

    // Not a safetensors file at all; a missing file.
    let error = checkpoint::load_state(&small, b"not a checkpoint").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Io);
    let error = checkpoint::load(temp_dir("missing").join("nope.safetensors"), &small).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Io);
    assert!(error.to_string().contains("nope.safetensors"), "{error}");
    assert_eq!(before, values(&small));
}

#[test]
fn pytorchs_num_batches_tracked_is_accepted() {
    // What `safetensors.torch.save_file(model.state_dict())` writes for a
    // BatchNorm2d: the running statistics plus an i64 0-d counter.
    let device = Device::cpu();
    let model = cnn(&device, 4);
    let bytes = pollster::block_on(checkpoint::save_state(&model)).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let count = 5i64.to_le_bytes();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = file.tensors().into_iter().collect();
    tensors.push((
        "2.num_batches_tracked".to_string(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![], &count).unwrap(),
    ));
    let torch_bytes = safetensors::serialize(tensors, None).unwrap();
    let fresh = cnn(&device, 5);
    checkpoint::load_state(&fresh, &torch_bytes).unwrap();
    assert_eq!(values(&model), values(&fresh));
}

/// An embedding and an output layer sharing one `Param` ("0.weight" and
/// "1.weight" in `named_parameters`).
fn tied_pair(device: &Device, seed: u64) -> (Sequential, Param) {
    let embedding = kiln::nn::Embedding::new(device, 6, 3, seed).unwrap();
    let table = embedding.weight.clone();
    let head = Linear::tied(table.clone(), None).unwrap();
    (Sequential::new().add(embedding).add(head), table)
}

#[test]
fn a_tied_parameter_is_saved_once_and_loads_back_tied() {
    let device = Device::cpu();
    let (model, _) = tied_pair(&device, 1);
    assert_eq!(keys(&model.named_parameters()), ["0.weight", "1.weight"]);
    let bytes = pollster::block_on(checkpoint::save_state(&model)).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(file.names(), ["0.weight"], "saved once, under the first key");
    assert_eq!(keys(&checkpoint::named_state(&model)), ["0.weight"]);
    let (fresh, table) = tied_pair(&device, 2);
    checkpoint::load_state(&fresh, &bytes).unwrap();
    assert_eq!(values(&model), values(&fresh));
    // Still one Param in two places: a change through either is seen by both.
    let named = fresh.named_parameters();
    assert!(named[0].1.same(&named[1].1) && named[0].1.same(&table));
    let ids = [0i32, 4, 5];
    let logits = |m: &Sequential| {
        let g = Graph::new(&device);
        m.forward(g.tensor_from(&ids, &[3]).unwrap()).unwrap().to_vec_blocking::<f32>().unwrap()
    };
    assert_eq!(logits(&model), logits(&fresh));
    table.set_value(&HostData::F32(vec![0.5; 18])).unwrap();
    assert!(logits(&fresh).iter().all(|&v| (v - 0.75).abs() < 1e-6), "the head reads the embedding's new table");

    // A PyTorch state_dict names the tied tensor under both keys: accepted
    // when the copies agree, refused (nothing loaded) when they differ; the
    // later key alone is enough.
    let view = file.tensor("0.weight").unwrap();
    let other: Vec<u8> = view.data().iter().map(|b| b ^ 1).collect();
    let with = |entries: Vec<(&str, &[u8])>| {
        let tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = entries
            .into_iter()
            .map(|(k, data)| {
                (
                    k.to_string(),
                    safetensors::tensor::TensorView::new(view.dtype(), view.shape().to_vec(), data).unwrap(),
                )
            })
            .collect();
        safetensors::serialize(tensors, None).unwrap()
    };
    let (fresh, _) = tied_pair(&device, 3);
    checkpoint::load_state(&fresh, &with(vec![("0.weight", view.data()), ("1.weight", view.data())])).unwrap();
    assert_eq!(values(&model), values(&fresh));
    let (fresh, _) = tied_pair(&device, 4);
    checkpoint::load_state(&fresh, &with(vec![("1.weight", view.data())])).unwrap();
    assert_eq!(values(&model), values(&fresh));
    let (fresh, _) = tied_pair(&device, 5);
    let before = values(&fresh);
    let e = checkpoint::load_state(&fresh, &with(vec![("0.weight", view.data()), ("1.weight", &other)])).unwrap_err();
    assert!(e.to_string().contains("'0.weight' and '1.weight' name one tied parameter"), "{e}");
    assert_eq!(values(&fresh), before);
}

/// The GPT's output layer is its token embedding: one tensor in the file,
/// and a model loaded from it computes the same logits.
#[test]
fn the_gpts_tied_head_round_trips() {
    use kiln::gpt::{Gpt, GptConfig};
    let device = Device::cpu();
    let config = GptConfig { vocab: 7, context: 4, layers: 1, heads: 1, width: 4, dropout: 0.0, bias: false };
    let model = Gpt::new(&device, config, 1).unwrap();
    let bytes = pollster::block_on(checkpoint::save_state(&model)).unwrap();
    let names = safetensors::SafeTensors::deserialize(&bytes).unwrap().names().len();
    assert_eq!(names, model.named_parameters().len());
    assert!(model.named_parameters().iter().all(|(k, _)| !k.starts_with("head.")));
    let fresh = Gpt::new(&device, config, 2).unwrap();
    checkpoint::load_state(&fresh, &bytes).unwrap();
    let logits = |m: &Gpt| {
        let g = Graph::new(&device);
        m.forward(g.tensor_from(&[1i32, 6, 0], &[1, 3]).unwrap()).unwrap().to_vec_blocking::<f32>().unwrap()
    };
    assert_eq!(logits(&model), logits(&fresh));
}

/// A PyTorch `state_dict` of the GPT holds the tied table twice, as
/// "tok_emb.weight" and "head.weight", and a file written from it (with the
/// tensors cloned, for instance) keeps both. `#[derive(Module)]` lists the
/// tied `Param` once, so the second key comes from `state_dict_entries`:
/// accepted when the copies agree (either key alone is enough too), refused
/// with both keys named, and nothing changed, when they differ.
#[test]
fn a_pytorch_style_gpt_file_with_both_tied_keys_loads() {
    use kiln::gpt::{Gpt, GptConfig};
    use safetensors::tensor::TensorView;
    let device = Device::cpu();
    let config = GptConfig { vocab: 7, context: 4, layers: 1, heads: 1, width: 4, dropout: 0.0, bias: true };
    let model = Gpt::new(&device, config, 1).unwrap();
    let entries = model.state_dict_entries();
    let table = entries.iter().find(|(k, _)| k == "tok_emb.weight").map(|(_, p)| p.clone()).unwrap();
    let head = entries.iter().find(|(k, _)| k == "head.weight").map(|(_, p)| p.clone());
    assert!(head.is_some_and(|h| h.same(&table)), "state_dict_entries lists the tied head: {:?}", keys(&entries));
    assert!(!keys(&model.named_parameters()).contains(&"head.weight".to_string()));

    let bytes = pollster::block_on(checkpoint::save_state(&model)).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tied = file.tensor("tok_emb.weight").unwrap();
    let changed: Vec<u8> = tied.data().iter().map(|b| b ^ 1).collect();
    // The file as PyTorch lays it out: every key of the model's state_dict,
    // "head.weight" last, with `head` as its bytes; `drop` leaves a key out.
    let pytorch_file = |head: Option<&[u8]>, drop: &str| {
        let mut tensors: Vec<(String, TensorView<'_>)> =
            file.names().into_iter().filter(|k| *k != drop).map(|k| (k.to_string(), file.tensor(k).unwrap())).collect();
        if let Some(data) = head {
            tensors
                .push(("head.weight".to_string(), TensorView::new(tied.dtype(), tied.shape().to_vec(), data).unwrap()));
        }
        let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize(tensors, Some(metadata)).unwrap()
    };
    let logits = |m: &Gpt| {
        let g = Graph::new(&device);
        m.forward(g.tensor_from(&[1i32, 6, 0], &[1, 3]).unwrap()).unwrap().to_vec_blocking::<f32>().unwrap()
    };

    let both = pytorch_file(Some(tied.data()), "");
    assert_eq!(safetensors::SafeTensors::deserialize(&both).unwrap().names().len(), file.names().len() + 1);
    let fresh = Gpt::new(&device, config, 2).unwrap();
    assert_ne!(values(&model), values(&fresh));
    checkpoint::load_state(&fresh, &both).unwrap();
    assert_eq!(values(&model), values(&fresh));
    assert_eq!(logits(&model), logits(&fresh));

    // The later key alone.
    let fresh = Gpt::new(&device, config, 3).unwrap();
    checkpoint::load_state(&fresh, &pytorch_file(Some(tied.data()), "tok_emb.weight")).unwrap();
    assert_eq!(values(&model), values(&fresh));

    // Copies that differ (by one bit per byte): refused, nothing loaded.
    let fresh = Gpt::new(&device, config, 4).unwrap();
    let before = values(&fresh);
    let e = checkpoint::load_state(&fresh, &pytorch_file(Some(&changed), "")).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("'tok_emb.weight' and 'head.weight' name one tied parameter but hold different values"),
        "{msg}"
    );
    assert_eq!(values(&fresh), before, "a refused file changes nothing");
    // The model is still usable: the agreeing file loads afterwards.
    checkpoint::load_state(&fresh, &both).unwrap();
    assert_eq!(values(&model), values(&fresh));

    // An untied key under another name is still unexpected.
    let mut extra: Vec<(String, TensorView<'_>)> =
        file.names().into_iter().map(|k| (k.to_string(), file.tensor(k).unwrap())).collect();
    extra.push(("head.bias".to_string(), tied.clone()));
    let e = checkpoint::load_state(&fresh, &safetensors::serialize(extra, None).unwrap()).unwrap_err();
    assert!(e.to_string().contains("unexpected keys [\"head.bias\"]"), "{e}");
}

#[test]
fn a_module_without_distinct_keys_cannot_be_saved() {
    // Two linears under one module that does not prefix their keys.
    struct Pair(Linear, Linear);
    impl Module for Pair {
        fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
            self.1.forward(self.0.forward(x)?)
        }
        fn parameters(&self) -> Vec<Param> {
            let mut p = self.0.parameters();
            p.extend(self.1.parameters());
            p
        }
    }
    let device = Device::cpu();
    let pair = Pair(Linear::new(&device, 2, 2, true, 0).unwrap(), Linear::new(&device, 2, 2, true, 1).unwrap());
    let error = pollster::block_on(checkpoint::save_state(&pair)).unwrap_err();
    assert!(error.to_string().contains("two entries share the key 'weight'"), "{error}");
}

#[test]
fn saving_into_a_missing_directory_fails_and_leaves_no_file() {
    let device = Device::cpu();
    let model = Sequential::mlp(&device, &[2, 3, 1], Activation::Relu, 0).unwrap();
    let dir = temp_dir("atomic");
    let target_dir = dir.join("does-not-exist");
    let error = checkpoint::save(target_dir.join("model.safetensors"), &model).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Io);
    assert!(error.to_string().contains("does-not-exist"), "{error}");
    assert!(!target_dir.exists());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no partial or temporary file");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn adam_resumes_bit_for_bit_from_a_checkpoint() {
    let device = Device::cpu();
    let straight_model = cnn(&device, 6);
    let mut straight_opt = Adam::new(straight_model.parameters(), 0.01).unwrap();
    let straight = train(&straight_model, &mut straight_opt, &device, 5, 64);

    let first_model = cnn(&device, 6);
    let mut first_opt = Adam::new(first_model.parameters(), 0.01).unwrap();
    let mut resumed = train(&first_model, &mut first_opt, &device, 3, 64);
    let dir = temp_dir("adam");
    checkpoint::save(dir.join("model.safetensors"), &first_model).unwrap();
    checkpoint::save_optimizer(dir.join("optimizer.safetensors"), &first_opt).unwrap();
    drop((first_model, first_opt));

    // Other initial weights and hyper-parameter lr: all restored.
    let model = cnn(&device, 77);
    let mut optimizer = Adam::new(model.parameters(), 0.5).unwrap();
    checkpoint::load(dir.join("model.safetensors"), &model).unwrap();
    checkpoint::load_optimizer(dir.join("optimizer.safetensors"), &mut optimizer).unwrap();
    assert_eq!(optimizer.steps(), 3);
    assert_eq!(optimizer.learning_rate(), 0.01);
    resumed.extend(train(&model, &mut optimizer, &device, 2, 64));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&resumed), bits(&straight), "resumed {resumed:?} vs straight {straight:?}");
    assert_eq!(values(&model), values(&straight_model));

    // The optimizer file: per-parameter moments and the step in metadata.
    let bytes = std::fs::read(dir.join("optimizer.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(file.len(), 12);
    assert_eq!(file.tensor("optimizer.0.exp_avg").unwrap().shape(), [4, 1, 3, 3]);
    assert_eq!(file.tensor("optimizer.5.exp_avg_sq").unwrap().shape(), [10]);
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let metadata = header.metadata().as_ref().unwrap();
    assert_eq!(metadata["optimizer"], "Adam");
    assert_eq!(metadata["step"], "3");
    assert_eq!(metadata["beta2"], "0.999");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sgd_momentum_resumes_bit_for_bit() {
    let device = Device::cpu();
    let mlp = |seed| Sequential::mlp(&device, &[6, 12, 10], Activation::Relu, seed).unwrap();
    let straight_model = mlp(1);
    let mut opt = Sgd::with_options(straight_model.parameters(), 0.1, 0.9, 1e-4, true).unwrap();
    let straight = train(&straight_model, &mut opt, &device, 4, 6);

    let first = mlp(1);
    let mut first_opt = Sgd::with_options(first.parameters(), 0.1, 0.9, 1e-4, true).unwrap();
    let mut resumed = train(&first, &mut first_opt, &device, 2, 6);
    let model_bytes = pollster::block_on(checkpoint::save_state(&first)).unwrap();
    let opt_bytes = pollster::block_on(checkpoint::save_optimizer_state(&first_opt)).unwrap();
    let model = mlp(2);
    let mut optimizer = Sgd::with_options(model.parameters(), 0.1, 0.9, 1e-4, true).unwrap();
    checkpoint::load_state(&model, &model_bytes).unwrap();
    checkpoint::load_optimizer_state(&mut optimizer, &opt_bytes).unwrap();
    resumed.extend(train(&model, &mut optimizer, &device, 2, 6));
    assert_eq!(resumed, straight);

    // Optimizer state only loads into the same kind over the same shapes.
    let mut adam = Adam::new(model.parameters(), 0.1).unwrap();
    let message = checkpoint::load_optimizer_state(&mut adam, &opt_bytes).unwrap_err().to_string();
    assert!(message.contains("holds Sgd state, the optimizer is Adam"), "{message}");
    let other = mlp(3);
    let mut fewer = Sgd::with_options(other.parameters()[..2].to_vec(), 0.1, 0.9, 0.0, false).unwrap();
    let message = checkpoint::load_optimizer_state(&mut fewer, &opt_bytes).unwrap_err().to_string();
    assert!(message.contains(r#"unexpected keys ["optimizer.2.momentum_buffer", "optimizer.3.momentum_buffer"]"#));
    assert_eq!(fewer.step_count(), 0);
}
