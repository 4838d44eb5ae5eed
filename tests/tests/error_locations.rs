//! Every public entry point reports errors at the caller's line: the
//! location an error carries is this file, not kiln's sources and not Rust's
//! standard library (issue 9, item 6). One test per entry point.

mod common;

use std::panic::Location;

use kiln::checkpoint;
use kiln::nn::nll_loss;
use kiln::prelude::*;
use kiln::Error;

/// The error points at this file, at the line of the call that failed.
#[track_caller]
fn here<T>(result: Result<T, Error>, line: u32) {
    let Err(err) = result else { panic!("the call at line {line} should fail") };
    let at = err.location();
    assert_eq!(at.file(), file!(), "{err} should point at the caller, not at {}:{}", at.file(), at.line());
    assert_eq!(at.line(), line, "{err}");
}

/// The line just above the caller's (where the failing call was written).
#[track_caller]
fn above() -> u32 {
    Location::caller().line() - 1
}

fn cpu_model() -> (Device, Sequential) {
    let device = Device::cpu();
    let model = Sequential::mlp(&device, &[3, 4, 2], Activation::Tanh, 0).unwrap();
    (device, model)
}

#[test]
fn layer_constructors() {
    let device = Device::cpu();
    let r = Linear::new(&device, 1 << 40, 1 << 40, true, 0);
    here(r, above());
    let r = Embedding::new(&device, 1 << 40, 1 << 40, 0);
    here(r, above());
    let r = Conv2d::new(&device, 3, 4, [3, 3], ConvOptions { groups: 2, ..ConvOptions::default() }, 0);
    here(r, above());
    let r = LayerNorm::new(&device, &[usize::MAX, 2], 1e-5);
    here(r, above());
    let r = Sequential::mlp(&device, &[3, 0, 2], Activation::Relu, 0);
    here(r, above());
    let r = Dropout::new(1.5, 0);
    here(r, above());
}

#[test]
fn layer_forward() {
    let (device, model) = cpu_model();
    let graph = Graph::new(&device);
    let x = graph.zeros(&[2, 5], DType::F32).unwrap();
    let r = model.forward(x);
    here(r, above());
    let linear = Linear::new(&device, 3, 2, true, 0).unwrap();
    let r = linear.forward(x);
    here(r, above());
    let embedding = Embedding::new(&device, 10, 4, 0).unwrap();
    let r = embedding.forward(x);
    here(r, above());
    let norm = LayerNorm::new(&device, &[3], 1e-5).unwrap();
    let r = norm.forward(x);
    here(r, above());
    let conv = Conv2d::new(&device, 3, 4, [3, 3], ConvOptions::default(), 0).unwrap();
    let r = conv.forward(x);
    here(r, above());
}

#[test]
fn losses() {
    let graph = Graph::new(&Device::cpu());
    let logits = graph.zeros(&[2, 3], DType::F32).unwrap();
    let float_labels = graph.zeros(&[2], DType::F32).unwrap();
    let r = cross_entropy(logits, float_labels);
    here(r, above());
    let r = nll_loss(logits, float_labels);
    here(r, above());
    let r = mse_loss(logits, float_labels);
    here(r, above());
    // Found when the node runs: the read fails, pointing at the line that
    // built the loss (where the bad label went in).
    let labels = graph.tensor_from(&[0i32, 7], &[2]).unwrap();
    let loss = cross_entropy(logits, labels).unwrap();
    let line = above();
    here(loss.item_blocking(), line);
}

#[test]
fn backward_and_grad() {
    let graph = Graph::new(&Device::cpu());
    let x = graph.variable(&[1.0f32, 2.0], &[2]).unwrap();
    let y = x.mul(x).unwrap();
    let r = y.backward(); // not a scalar
    here(r, above());
    let constant = graph.ones(&[], DType::F32).unwrap();
    let r = constant.backward(); // nothing requires grad
    here(r, above());
    let r = graph.grad(constant, &[x], None);
    here(r, above());
    let loss = y.sum_all().unwrap();
    loss.backward().unwrap();
    let r = loss.backward(); // the graph was consumed
    here(r, above());
}

#[test]
fn reads() {
    let graph = Graph::new(&Device::cpu());
    let x = graph.zeros(&[2], DType::F32).unwrap();
    let r = x.item_blocking();
    here(r, above());
    let r = x.to_vec_blocking::<i32>();
    here(r, above());
    let r = pollster::block_on(x.item());
    here(r, above());
    let r = pollster::block_on(x.to_vec::<i32>());
    here(r, above());
    let p = Param::new(graph.device(), "p", &[1.0f32, 2.0], &[2]).unwrap();
    let r = p.set_value(&HostData::F32(vec![1.0]));
    here(r, above());
    let r = p.set_grad_host(&HostData::F32(vec![1.0; 3]));
    here(r, above());
}

#[test]
fn optimizers() {
    let (_, model) = cpu_model();
    let r = Adam::new(model.parameters(), f64::NAN);
    here(r, above());
    let r = Sgd::new(model.parameters(), -1.0);
    here(r, above());
    let mut adam = Adam::new(model.parameters(), 0.01).unwrap();
    let r = adam.set_learning_rate(f64::INFINITY);
    here(r, above());
    let r = adam.set_group_learning_rates(&[0.1, 0.2, 0.3]);
    here(r, above());
    let r = checkpoint::load_optimizer_state(&mut adam, b"not a checkpoint");
    here(r, above());
    let r = clip_grad_norm(&model.parameters(), -1.0, 2.0);
    here(r, above());
}

#[test]
fn checkpoint_io() {
    let (_, model) = cpu_model();
    let dir = std::env::temp_dir().join(format!("kiln-error-locations-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let r = checkpoint::load(dir.join("missing.safetensors"), &model);
    here(r, above());
    let garbage = dir.join("garbage.safetensors");
    std::fs::write(&garbage, [0xffu8; 64]).unwrap();
    let r = checkpoint::load(&garbage, &model);
    here(r, above());
    let r = checkpoint::save(dir.join("no/such/dir/m.safetensors"), &model);
    here(r, above());
    let mut sgd = Sgd::new(model.parameters(), 0.1).unwrap();
    let r = checkpoint::load_optimizer(&garbage, &mut sgd);
    here(r, above());
    let r = checkpoint::save_optimizer(dir.join("no/such/dir/o.safetensors"), &sgd);
    here(r, above());
    let r = checkpoint::load_state(&model, b"\x08\0\0\0\0\0\0\0{}");
    here(r, above());
    let r = checkpoint::read_metadata(b"short");
    here(r, above());
    // A well-formed file whose keys do not match.
    let other = Sequential::mlp(&Device::cpu(), &[3, 5, 2], Activation::Tanh, 0).unwrap();
    let file = dir.join("other.safetensors");
    checkpoint::save(&file, &other).unwrap();
    let r = checkpoint::load(&file, &model);
    here(r, above());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn wgpu_index_checks() {
    let Some(device) = common::vulkan_device("error_locations") else { return };
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let index = graph.tensor_from(&[0i32, 9], &[2]).unwrap();
    // The check runs on the GPU after the node: the error points at the
    // read that surfaced it (the CPU points at the node's line).
    let picked = x.index_select(0, index).unwrap();
    here(picked.to_vec_blocking::<f32>(), above() + 1);
    // The same graph still reads good values afterwards.
    assert_eq!(x.sum_all().unwrap().item_blocking().unwrap(), 10.0);
    let labels = graph.tensor_from(&[0i32, 5], &[2]).unwrap();
    let loss = cross_entropy(x, labels).unwrap();
    here(loss.item_blocking(), above() + 1);
}
