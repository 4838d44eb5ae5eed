//! Native tests of the handle machinery and the training path (the same
//! Rust code the browser runs, minus the JS glue).

use kiln_core::HostData;

use crate::graph::Graph;
use crate::nn::{cross_entropy, mse_loss, Adam, Sgd};
use crate::session::Kiln;

fn f32s(h: HostData) -> Vec<f32> {
    match h {
        HostData::F32(v) => v,
        other => panic!("expected f32, got {:?}", other.dtype()),
    }
}

#[test]
fn ops_compute_and_read() {
    let kiln = Kiln::cpu();
    let g = kiln.graph();
    let a = g.from_host(HostData::F32(vec![1.0, 2.0, 3.0, 4.0]), &[2, 2]).unwrap();
    let b = a.mul_number(2.0).unwrap().add_tensor(&a).unwrap();
    assert_eq!(f32s(b.read_now().unwrap()), vec![3.0, 6.0, 9.0, 12.0]);
    let c = a.matmul(&a).unwrap();
    assert_eq!(f32s(c.read_now().unwrap()), vec![7.0, 10.0, 15.0, 22.0]);
}

#[test]
fn stale_handle_after_reset_is_a_clear_error() {
    let kiln = Kiln::cpu();
    let g = kiln.graph();
    let a = g.from_host(HostData::F32(vec![1.0, 2.0]), &[2]).unwrap();
    assert!(a.is_alive());
    g.reset();
    assert!(!a.is_alive());
    let err = a.exp().err().expect("stale handle must fail");
    assert_eq!(err.kind, "StaleTensor");
    assert!(err.message.contains("belongs to step 1"), "{}", err.message);
    assert!(err.message.contains("now at step 2"), "{}", err.message);
    // A new tensor at the same node id is a different generation: the old
    // handle still refuses and the new one works.
    let b = g.from_host(HostData::F32(vec![5.0, 6.0]), &[2]).unwrap();
    assert_eq!(b.id.node(), a.id.node());
    assert!(a.read_now().is_err());
    assert_eq!(f32s(b.read_now().unwrap()), vec![5.0, 6.0]);
    // Mixing steps is refused too.
    assert_eq!(b.add_tensor(&a).unwrap_err().kind, "StaleTensor");
}

#[test]
fn pending_read_keeps_its_step_alive_across_reset() {
    let kiln = Kiln::cpu();
    let g = kiln.graph();
    let a = g.from_host(HostData::F32(vec![1.0, 2.0]), &[2]).unwrap();
    let read = a.exp().unwrap().read().unwrap();
    g.reset();
    let b = g.from_host(HostData::F32(vec![7.0]), &[1]).unwrap();
    let values = f32s(pollster::block_on(read).unwrap());
    assert!((values[0] - 1f32.exp()).abs() < 1e-6 && (values[1] - 2f32.exp()).abs() < 1e-6);
    assert_eq!(f32s(b.read_now().unwrap()), vec![7.0]);
}

#[test]
fn reset_and_drop_release_device_buffers() {
    let kiln = Kiln::cpu();
    let before = kiln.core_device().stats().live_buffers;
    let g = kiln.graph();
    for _ in 0..3 {
        g.reset();
        let a = g.from_host(HostData::F32(vec![1.0; 100]), &[10, 10]).unwrap();
        let s = a.matmul(&a).unwrap().sum(None, None).unwrap();
        s.read_now().unwrap();
    }
    g.reset();
    assert_eq!(kiln.core_device().stats().live_buffers, before);
    let t = g.from_host(HostData::F32(vec![1.0; 4]), &[4]).unwrap();
    drop(g); // graph.free() in JS
    assert_eq!(kiln.core_device().stats().live_buffers, before);
    let err = t.exp().unwrap_err();
    assert!(err.message.contains("was freed"), "{}", err.message);
}

#[test]
fn errors_carry_kiln_core_messages() {
    let kiln = Kiln::cpu();
    let g = kiln.graph();
    let a = g.from_host(HostData::F32(vec![1.0, 2.0]), &[2]).unwrap();
    let b = g.from_host(HostData::F32(vec![1.0, 2.0, 3.0]), &[3]).unwrap();
    let err = a.add_tensor(&b).unwrap_err();
    assert_eq!(err.kind, "Shape");
    assert!(err.message.starts_with("Add: shapes [2] and [3] do not broadcast"), "{}", err.message);
    // Same text as kiln-core's own Display, without its Rust source location.
    let core = kiln_core::Graph::new(kiln.core_device());
    let x = core.tensor_from(&[1.0f32, 2.0], &[2]).unwrap();
    let y = core.tensor_from(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let native = x.add(y).unwrap_err().to_string();
    assert_eq!(err.message, native[..native.rfind(" (at ").unwrap()]);
    assert!(!err.message.contains(".rs:"), "{}", err.message);

    let other = kiln.graph();
    let c = other.from_host(HostData::F32(vec![1.0, 2.0]), &[2]).unwrap();
    let err = a.add_tensor(&c).unwrap_err();
    assert!(err.message.contains("different graphs"), "{}", err.message);
}

#[test]
fn backward_fills_param_grads_and_sgd_steps() {
    let kiln = Kiln::cpu();
    let model = kiln.mlp_native(&[3, 1], "relu", 0).unwrap();
    let params = model.core_parameters();
    let sgd = Sgd::create(params.clone(), 0.1, None, None, None).unwrap();
    let g = kiln.graph();
    let x = g.from_host(HostData::F32(vec![1.0, 2.0, 3.0]), &[1, 3]).unwrap();
    let y = g.from_host(HostData::F32(vec![0.5]), &[1, 1]).unwrap();
    let loss = mse_loss(&model.forward_native(&x).unwrap(), &y).unwrap();
    loss.backward(None, None).unwrap();
    assert!(params.iter().all(|p| p.has_grad()));
    let w0 = pollster::block_on(params[0].value()).unwrap();
    sgd.step().unwrap();
    let w1 = pollster::block_on(params[0].value()).unwrap();
    assert_ne!(w0, w1);
}

#[test]
fn mlp_learns_digits_on_cpu() {
    let kiln = Kiln::cpu();
    let (train, test) = crate::data::load_digits_native(Some(0.2), Some(42.0)).unwrap();
    let model = kiln.mlp_native(&[64, 32, 10], "relu", 1).unwrap();
    let adam = Adam::create(model.core_parameters(), 1e-2, None, None, None, None, None).unwrap();
    let g = kiln.graph();
    let (tr, te) = (train.core(), test.core());
    let mut first = None;
    let mut last = 0.0;
    for epoch in 0..5u64 {
        for batch in tr.batches(64, Some(7), epoch).unwrap() {
            g.reset();
            let x = g.from_host(HostData::F32(batch.images), &[batch.len as u32, 64]).unwrap();
            let y = g.from_host(HostData::I32(batch.labels), &[batch.len as u32]).unwrap();
            let loss = cross_entropy(&model.forward_native(&x).unwrap(), &y).unwrap();
            adam.zero_grad();
            loss.backward(None, None).unwrap();
            adam.step().unwrap();
            last = f32s(loss.read_now().unwrap())[0];
            first.get_or_insert(last);
        }
    }
    assert!(last < first.unwrap() * 0.3, "loss {first:?} -> {last}");
    g.reset();
    let x = g.from_host(HostData::F32(te.images.clone()), &[te.len as u32, 64]).unwrap();
    let pred = model.forward_native(&x).unwrap().argmax_axis(1).unwrap();
    let HostData::I32(p) = pred.read_now().unwrap() else { panic!("argmax gives i32") };
    let correct = p.iter().zip(&te.labels).filter(|(a, b)| a == b).count();
    let acc = correct as f64 / te.len as f64;
    assert!(acc > 0.9, "test accuracy {acc}");
}

#[test]
fn graph_ids_differ() {
    let kiln = Kiln::cpu();
    let (a, b): (Graph, Graph) = (kiln.graph(), kiln.graph());
    assert_ne!(a.id(), b.id());
}

#[test]
fn wrong_dtype_is_a_dtype_error_in_every_op() {
    let kiln = Kiln::cpu();
    let g = kiln.graph();
    let logits = g.from_host(HostData::F32(vec![0.0; 6]), &[2, 3]).unwrap();
    let float_labels = g.from_host(HostData::F32(vec![0.0, 1.0]), &[2]).unwrap();
    let errors = [
        cross_entropy(&logits, &float_labels).unwrap_err(),
        crate::nn::nll_loss(&logits, &float_labels).unwrap_err(),
        float_labels.map(|t| t.one_hot(3, kiln_core::DType::F32)).unwrap_err(),
        logits.index_select(0.0, &float_labels).unwrap_err(),
    ];
    for e in &errors {
        assert_eq!(e.kind, "DType", "{e:?}");
        assert!(!e.message.contains(".rs:"), "no Rust location: {}", e.message);
    }
}

#[test]
fn layers_keep_native_checkpoint_keys() {
    use kiln_core::nn::Module;
    let kiln = Kiln::cpu();
    let model = kiln.mlp_native(&[4, 8, 3], "relu", 5).unwrap();
    let keys: Vec<String> = model.inner.named_parameters().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["0.weight", "0.bias", "2.weight", "2.bias"]);
}

#[test]
fn checkpoints_are_native_bytes_both_ways() {
    use kiln_core::checkpoint::{load_optimizer_state, save_optimizer_state, save_state};
    use kiln_core::nn::{Activation, Module, Sequential};
    let kiln = Kiln::cpu();
    let native = Sequential::mlp(kiln.core_device(), &[4, 8, 3], Activation::Relu, 9).unwrap();
    let web = kiln.mlp_native(&[4, 8, 3], "relu", 1).unwrap();
    let bytes = pollster::block_on(save_state(&native)).unwrap();
    crate::checkpoint::load_module(web.inner.as_ref(), &bytes).unwrap();
    assert_eq!(pollster::block_on(save_state(web.inner.as_ref())).unwrap(), bytes, "same bytes back");
    // A wrong model is refused, naming the key, and nothing changes.
    let wrong = kiln.mlp_native(&[4, 5, 3], "relu", 1).unwrap();
    let before = pollster::block_on(save_state(wrong.inner.as_ref())).unwrap();
    let err = crate::checkpoint::load_module(wrong.inner.as_ref(), &bytes).unwrap_err();
    assert!(err.message.contains("0.weight"), "{}", err.message);
    assert_eq!(pollster::block_on(save_state(wrong.inner.as_ref())).unwrap(), before);
    // Optimizer state: native Adam's bytes load into a fresh native Adam
    // over the web model's parameters and save back identically.
    let mut adam = kiln_core::optim::Adam::new(native.parameters(), 0.01).unwrap();
    let g = kiln_core::Graph::new(kiln.core_device());
    let x = g.tensor_from(&[0.5f32; 8], &[2, 4]).unwrap();
    native.forward(x).unwrap().square().unwrap().mean_all().unwrap().backward().unwrap();
    kiln_core::optim::Optimizer::step(&mut adam).unwrap();
    let state = pollster::block_on(save_optimizer_state(&adam)).unwrap();
    let mut other = kiln_core::optim::Adam::new(web.core_parameters(), 0.5).unwrap();
    load_optimizer_state(&mut other, &state).unwrap();
    // The metadata is a HashMap (its order varies between saves): compare
    // it as a map, and the tensor data byte for byte.
    let again = pollster::block_on(save_optimizer_state(&other)).unwrap();
    let data = |b: &[u8]| b[8 + kiln_core::checkpoint::header_length("test", b).unwrap()..].to_vec();
    assert_eq!(data(&again), data(&state));
    let meta = |b: &[u8]| kiln_core::checkpoint::read_metadata(b).unwrap();
    assert_eq!(meta(&again), meta(&state));
}

#[test]
fn live_handles_count_every_tensor_handle_until_dropped() {
    // Tests run in parallel threads; the count is per thread, as in wasm.
    let kiln = Kiln::cpu();
    let g = kiln.graph();
    let before = crate::graph::live_handles();
    let a = g.from_host(HostData::F32(vec![1.0, 2.0]), &[2]).unwrap();
    let b = a.exp().unwrap();
    let c = b.clone();
    assert_eq!(crate::graph::live_handles(), before + 3);
    assert_eq!(a.graph_id(), g.id_number());
    g.reset();
    // A reset does not free handles (JS frees them: npm/handles.js).
    assert_eq!(crate::graph::live_handles(), before + 3);
    drop((a, b));
    assert_eq!(crate::graph::live_handles(), before + 1);
    drop(c);
    assert_eq!(crate::graph::live_handles(), before);
}
