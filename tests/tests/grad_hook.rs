//! The gradient-ready observer (`Tensor::backward_observed`) that lets
//! data-parallel training start exchanging gradients during backward, and
//! `Param::set_grad_host`, through which the exchanged gradients come back.

use kiln::nn::Module;
use kiln::prelude::*;
use kiln::{BackwardOptions, BlockingParam, BufferId, ErrorKind, HostData};

fn mlp_loss<'g>(graph: &'g Graph, model: &Sequential) -> Result<Tensor<'g>> {
    let x = graph.tensor_from(&[0.5f32, -1.0, 0.25, 2.0, 1.5, -0.5], &[2, 3])?;
    let y = graph.tensor_from(&[1i32, 0], &[2])?;
    cross_entropy(model.forward(x)?, y)
}

fn read(param: &Param, buffer: BufferId) -> Vec<f32> {
    let data = pollster::block_on(param.device().backend().read(buffer, param.dtype(), param.numel())).unwrap();
    match data {
        HostData::F32(v) => v,
        other => panic!("expected f32, got {}", other.dtype()),
    }
}

#[test]
fn every_parameter_is_reported_once_last_layer_first_with_its_gradient() {
    let device = Device::cpu();
    let model = Sequential::mlp(&device, &[3, 4, 4, 2], Activation::Relu, 7).unwrap();
    let params = model.parameters();
    let graph = Graph::new(&device);
    let loss = mlp_loss(&graph, &model).unwrap();
    let mut seen: Vec<(usize, Vec<f32>)> = Vec::new();
    loss.backward_observed(BackwardOptions::default(), &mut |param, buffer| {
        let index = params.iter().position(|p| p.same(param)).expect("one of the model's parameters");
        seen.push((index, read(param, buffer)));
        Ok(())
    })
    .unwrap();
    let order: Vec<usize> = seen.iter().map(|s| s.0).collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..params.len()).collect::<Vec<_>>(), "each parameter once: {order:?}");
    // Backward reaches the output layer's weight before the first layer's.
    let position = |i: usize| order.iter().position(|&o| o == i).unwrap();
    assert!(position(params.len() - 2) < position(0), "last layer first: {order:?}");
    for (index, values) in seen {
        let grad = params[index].grad_blocking().unwrap().unwrap();
        assert_eq!(grad, HostData::F32(values), "parameter {index}: the reported values are its gradient");
    }
}

#[test]
fn an_observer_error_fails_the_backward_and_changes_nothing() {
    let device = Device::cpu();
    let model = Sequential::mlp(&device, &[3, 4, 2], Activation::Tanh, 3).unwrap();
    let graph = Graph::new(&device);
    let loss = mlp_loss(&graph, &model).unwrap();
    let err = loss
        .backward_observed(BackwardOptions::default(), &mut |_, _| Err(Error::invalid("test observer", "refused")))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("refused"), "{err}");
    assert!(model.parameters().iter().all(|p| !p.has_grad()), "no gradient was accumulated");
    // The graph is usable again: a plain backward succeeds.
    loss.backward().unwrap();
    assert!(model.parameters().iter().all(|p| p.has_grad()));
}

#[test]
fn a_parameter_whose_gradient_is_the_seed_is_reported_too() {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[2.0f32], &[]).unwrap();
    let graph = Graph::new(&device);
    let root = graph.param(&p).unwrap();
    let mut reported = Vec::new();
    root.backward_observed(BackwardOptions::default(), &mut |param, buffer| {
        reported.push(read(param, buffer));
        Ok(())
    })
    .unwrap();
    assert_eq!(reported, vec![vec![1.0f32]]);
}

#[test]
fn set_grad_replaces_the_gradient_and_checks_its_size() {
    let device = Device::cpu();
    let p = Param::new(&device, "w", &[1.0f32, 2.0, 3.0], &[3]).unwrap();
    p.set_grad_host(&HostData::F32(vec![0.5, 0.25, 0.125])).unwrap();
    assert_eq!(p.grad_blocking().unwrap(), Some(HostData::F32(vec![0.5, 0.25, 0.125])));
    p.set_grad_host(&HostData::F32(vec![1.0, 1.0, 1.0])).unwrap();
    assert_eq!(p.grad_blocking().unwrap(), Some(HostData::F32(vec![1.0, 1.0, 1.0])));
    let err = p.set_grad_host(&HostData::F32(vec![1.0, 2.0])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shape, "{err}");
    assert!(err.to_string().contains("'w'"), "names the parameter: {err}");
    let err = p.set_grad_host(&HostData::F64(vec![1.0, 2.0, 3.0])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shape, "{err}");
    assert_eq!(p.grad_blocking().unwrap(), Some(HostData::F32(vec![1.0, 1.0, 1.0])), "unchanged after an error");
    // An optimizer step uses the gradient that was set.
    let mut sgd = Sgd::new(vec![p.clone()], 1.0).unwrap();
    sgd.step().unwrap();
    assert_eq!(p.value_blocking().unwrap(), HostData::F32(vec![0.0, 1.0, 2.0]));
}
