//! Bad input gives clear errors (DESIGN.md, "What a user sees"): the right
//! `ErrorKind`, a message naming the op and the shapes, the caller's source
//! location — and afterwards the graph and parameters still work.

mod common;

use common::{assert_close, param_grad, values};
use kiln::nn::{cross_entropy_probs, nll_loss};
use kiln::prelude::*;
use kiln::{Error, ErrorKind};

/// The error is of `kind`, names `op`, mentions every `needle`, and points
/// at this file (the caller), not at kiln's sources.
#[track_caller]
fn check(err: Error, kind: ErrorKind, op: &str, needles: &[&str]) {
    assert_eq!(err.kind(), kind, "{err}");
    assert_eq!(err.op(), op, "{err}");
    let text = err.to_string();
    assert!(text.contains(op), "the message names the op: {text}");
    for needle in needles {
        assert!(err.message().contains(needle), "the message should mention {needle:?}: {text}");
    }
    assert_eq!(err.location().file(), file!(), "the error points at the caller: {text}");
}

/// After an error: the same graph still builds and runs correct things,
/// and the parameter still trains.
#[track_caller]
fn still_usable(graph: &Graph, p: &Param) {
    let w = graph.param(p).unwrap();
    let x = graph.tensor_from(&[1.0f32, 2.0], &[2]).unwrap();
    let y = w.mul(x).unwrap().add(1.0).unwrap();
    assert_eq!(y.to_vec_blocking::<f32>().unwrap(), vec![4.0, 9.0]);
    p.zero_grad();
    let loss = graph.param(p).unwrap().mul(x).unwrap().sum_all().unwrap();
    let fresh = Graph::new(graph.device());
    let fresh_loss = fresh.param(p).unwrap().mul(fresh.tensor_from(&[1.0f32, 2.0], &[2]).unwrap()).unwrap();
    fresh_loss.sum_all().unwrap().backward().unwrap();
    assert_eq!(param_grad(p), vec![1.0, 2.0]);
    assert_eq!(loss.item_blocking().unwrap(), 3.0 + 8.0);
}

fn setup() -> (Device, Param) {
    let device = Device::cpu();
    let p = Param::new(&device, "p", &[3.0f32, 4.0], &[2]).unwrap();
    (device, p)
}

#[test]
fn mismatched_shapes_in_add() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let a = graph.zeros(&[2, 3], DType::F32).unwrap();
    let b = graph.zeros(&[3, 2], DType::F32).unwrap();
    let nodes = graph.len();
    check(a.add(b).unwrap_err(), ErrorKind::Shape, "Add", &["[2, 3]", "[3, 2]"]);
    assert_eq!(graph.len(), nodes, "a refused op records nothing");
    still_usable(&graph, &p);
}

#[test]
fn mismatched_shapes_in_matmul() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let a = graph.zeros(&[2, 3], DType::F32).unwrap();
    let b = graph.zeros(&[2, 3], DType::F32).unwrap();
    check(a.matmul(b).unwrap_err(), ErrorKind::Shape, "MatMul", &["[2, 3]", "3 vs 2"]);
    let batched = graph.zeros(&[2, 3, 4], DType::F32).unwrap();
    let other = graph.zeros(&[3, 4, 5], DType::F32).unwrap();
    check(batched.matmul(other).unwrap_err(), ErrorKind::Shape, "MatMul", &["[2, 3, 4]", "[3, 4, 5]"]);
    let vector = graph.zeros(&[3], DType::F32).unwrap();
    check(a.matmul(vector).unwrap_err(), ErrorKind::Shape, "MatMul", &["[3]"]);
    // The transposed form that does fit works.
    let c = a.matmul_t(b, false, true).unwrap();
    assert_eq!(c.dims().as_slice(), &[2, 2]);
    still_usable(&graph, &p);
}

#[test]
fn bad_axes() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    check(x.sum(&[5], false).unwrap_err(), ErrorKind::OutOfRange, "Sum", &["5", "rank 2"]);
    check(x.sum(&[-3], false).unwrap_err(), ErrorKind::OutOfRange, "Sum", &["-3"]);
    check(x.max(&[0, 0], false).unwrap_err(), ErrorKind::InvalidArgument, "Max", &["twice"]);
    // -1 and 1 are the same axis of a rank-2 tensor.
    check(x.sum(&[1, -1], true).unwrap_err(), ErrorKind::InvalidArgument, "Sum", &["twice"]);
    check(x.mean(&[2], false).unwrap_err(), ErrorKind::OutOfRange, "mean", &["2"]);
    check(x.softmax(2).unwrap_err(), ErrorKind::OutOfRange, "Max", &["2"]);
    check(x.transpose(0, 2).unwrap_err(), ErrorKind::OutOfRange, "Permute", &["2"]);
    let idx = graph.tensor_from(&[0i32], &[1]).unwrap();
    check(x.index_select(2, idx).unwrap_err(), ErrorKind::OutOfRange, "IndexSelect", &["2"]);
    check(Tensor::concat(&[x, x], 3).unwrap_err(), ErrorKind::OutOfRange, "Concat", &["3"]);
    // Negative axes in range are fine.
    assert_eq!(values(&x.sum(&[-1], false).unwrap()), vec![6.0, 15.0]);
    still_usable(&graph, &p);
}

#[test]
fn out_of_range_indices_surface_on_read() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
    let index = graph.tensor_from(&[0i32, 3], &[2]).unwrap();
    // Building succeeds: the check needs the index values.
    let picked = x.index_select(0, index).unwrap();
    check(picked.to_vec_blocking::<f32>().unwrap_err(), ErrorKind::OutOfRange, "IndexSelect", &[]);
    let negative = graph.tensor_from(&[-1i32], &[1]).unwrap();
    let picked = x.index_select(1, negative).unwrap();
    check(picked.to_vec_blocking::<f32>().unwrap_err(), ErrorKind::OutOfRange, "IndexSelect", &[]);

    let dest = graph.zeros(&[3, 2], DType::F32).unwrap();
    let source = graph.ones(&[2, 2], DType::F32).unwrap();
    let index = graph.tensor_from(&[1i32, 5], &[2]).unwrap();
    let scattered = dest.scatter_add(0, index, source).unwrap();
    check(scattered.to_vec_blocking::<f32>().unwrap_err(), ErrorKind::OutOfRange, "ScatterAdd", &[]);

    // Good indices in the same graph still work.
    let index = graph.tensor_from(&[2i32, 0, 2], &[3]).unwrap();
    assert_eq!(x.index_select(0, index).unwrap().to_vec_blocking::<f32>().unwrap(), vec![5.0, 6.0, 1.0, 2.0, 5.0, 6.0]);
    still_usable(&graph, &p);
}

#[test]
fn bad_index_tensors_are_refused_at_build_time() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let x = graph.zeros(&[3, 2], DType::F32).unwrap();
    let float_index = graph.tensor_from(&[0.0f32], &[1]).unwrap();
    check(x.index_select(0, float_index).unwrap_err(), ErrorKind::DType, "IndexSelect", &["f32"]);
    let matrix_index = graph.tensor_from(&[0i32, 1], &[1, 2]).unwrap();
    check(x.index_select(0, matrix_index).unwrap_err(), ErrorKind::Shape, "IndexSelect", &["[1, 2]"]);
    let index = graph.tensor_from(&[0i32, 1], &[2]).unwrap();
    let wrong_source = graph.ones(&[3, 2], DType::F32).unwrap();
    check(x.scatter_add(0, index, wrong_source).unwrap_err(), ErrorKind::Shape, "ScatterAdd", &["[3, 2]", "[2, 2]"]);
    still_usable(&graph, &p);
}

#[test]
fn wrong_dtypes() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let i = graph.tensor_from(&[1i32, 2], &[2]).unwrap();
    let f = graph.tensor_from(&[1.0f32, 2.0], &[2]).unwrap();
    check(i.add(f).unwrap_err(), ErrorKind::DType, "Add", &["i32", "f32"]);
    let im = graph.tensor_from(&[1i32, 2, 3, 4], &[2, 2]).unwrap();
    check(im.matmul(im).unwrap_err(), ErrorKind::DType, "MatMul", &["i32"]);
    let fm = graph.tensor_from(&[1.0f64; 4], &[2, 2]).unwrap();
    check(fm.matmul(im.cast(DType::F32).unwrap()).unwrap_err(), ErrorKind::DType, "MatMul", &["f64", "f32"]);
    let mask = f.gt(1.5).unwrap();
    check(mask.sum_all().unwrap_err(), ErrorKind::DType, "Sum", &["bool"]);
    check(i.exp().unwrap_err(), ErrorKind::DType, "Exp", &["i32"]);
    check(i.div(i).unwrap_err(), ErrorKind::DType, "Div", &["i32"]);
    check(f.where_(f, f).unwrap_err(), ErrorKind::DType, "Where", &["f32"]);
    // Integer ops that are allowed do work, and i32 + a number stays i32.
    assert_eq!(i.add(i).unwrap().add(1).unwrap().to_vec_blocking::<i32>().unwrap(), vec![3, 5]);
    assert_eq!(mask.cast(DType::I32).unwrap().sum_all().unwrap().to_vec_blocking::<i32>().unwrap(), vec![1]);
    // Reading with the wrong element type is a dtype error, not garbage.
    assert_eq!(f.to_vec_blocking::<f64>().unwrap_err().kind(), ErrorKind::DType);
    // Only float data can require grad.
    assert_eq!(graph.variable(&[1i32], &[1]).unwrap_err().kind(), ErrorKind::DType);
    assert_eq!(Param::new(&device, "q", &[1i32], &[1]).unwrap_err().kind(), ErrorKind::DType);
    still_usable(&graph, &p);
}

#[test]
fn empty_and_zero_size_tensors() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let empty = graph.tensor_from::<f32>(&[], &[0, 3]).unwrap();
    assert_eq!(empty.numel(), 0);
    assert_eq!(empty.to_vec_blocking::<f32>().unwrap(), Vec::<f32>::new());
    // Summing over the empty axis gives zeros of the remaining shape.
    let s = empty.sum(&[0], false).unwrap();
    assert_eq!(s.dims().as_slice(), &[3]);
    assert_eq!(s.to_vec_blocking::<f32>().unwrap(), vec![0.0; 3]);
    assert_eq!(empty.sum_all().unwrap().item_blocking().unwrap(), 0.0);
    // The empty product is 1.
    assert_eq!(empty.prod(&[0], true).unwrap().to_vec_blocking::<f32>().unwrap(), vec![1.0; 3]);
    // Reducing the non-empty axis leaves an empty result.
    let m = empty.max(&[1], false).unwrap();
    assert_eq!(m.dims().as_slice(), &[0]);
    assert!(m.to_vec_blocking::<f32>().unwrap().is_empty());
    // Element-wise ops on empty tensors are fine.
    assert!(empty.exp().unwrap().add(1.0).unwrap().to_vec_blocking::<f32>().unwrap().is_empty());
    // Max over an empty axis has no value: an error at build time.
    check(empty.max(&[0], false).unwrap_err(), ErrorKind::Shape, "Max", &["[0, 3]"]);
    check(empty.min_all().unwrap_err(), ErrorKind::Shape, "Min", &["[0, 3]"]);
    check(empty.argmax(&[0], false).unwrap_err(), ErrorKind::Shape, "ArgMax", &["[0, 3]"]);
    // The mean of zero elements is undefined.
    check(empty.mean(&[0], false).unwrap_err(), ErrorKind::Shape, "mean", &["zero elements"]);
    check(empty.mean_all().unwrap_err(), ErrorKind::Shape, "mean", &["zero elements"]);
    // A zero-size parameter-free matmul: [2,0] x [0,3] is all zeros.
    let a = graph.tensor_from::<f32>(&[], &[2, 0]).unwrap();
    let b = graph.tensor_from::<f32>(&[], &[0, 3]).unwrap();
    assert_eq!(a.matmul(b).unwrap().to_vec_blocking::<f32>().unwrap(), vec![0.0; 6]);
    still_usable(&graph, &p);
}

#[test]
fn nan_inputs_propagate_and_are_readable() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f32, f32::NAN, 3.0], &[3]).unwrap();
    let y = x.exp().unwrap().add(1.0).unwrap().tanh().unwrap().mul(x).unwrap();
    let v = y.to_vec_blocking::<f32>().unwrap();
    assert!(v[1].is_nan());
    assert_close(&[v[0] as f64, v[2] as f64], &[(1f64.exp() + 1.0).tanh(), 3.0 * (3f64.exp() + 1.0).tanh()], 1e-6);
    assert!(y.sum_all().unwrap().item_blocking().unwrap().is_nan());
    // Backward through NaN gives NaN where it belongs, no panic.
    let loss = x.mul(x).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    let g = x.grad().unwrap().to_vec_blocking::<f32>().unwrap();
    assert_eq!(g[0], 2.0);
    assert!(g[1].is_nan());
    assert_eq!(g[2], 6.0);
    // Comparisons with NaN are false; NaN survives matmul.
    assert_eq!(x.gt(0.0).unwrap().to_vec_blocking::<bool>().unwrap(), vec![true, false, true]);
    let m = graph.tensor_from(&[1.0f32, f32::NAN, 0.0, 1.0], &[2, 2]).unwrap();
    let r = m.matmul(graph.tensor_from(&[1.0f32, 1.0], &[2, 1]).unwrap()).unwrap();
    let r = r.to_vec_blocking::<f32>().unwrap();
    assert!(r[0].is_nan());
    assert_eq!(r[1], 1.0);
    // A NaN parameter is storable and readable.
    let q = Param::new(&device, "q", &[f32::NAN], &[1]).unwrap();
    assert!(graph.param(&q).unwrap().item_blocking().unwrap().is_nan());
    still_usable(&graph, &p);
}

#[test]
fn reshape_to_a_wrong_element_count() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let x = graph.zeros(&[2, 3], DType::F32).unwrap();
    check(x.reshape(&[4, 2]).unwrap_err(), ErrorKind::Shape, "Reshape", &["[2, 3]", "6", "8"]);
    check(x.reshape(&[4, -1]).unwrap_err(), ErrorKind::Shape, "Reshape", &["[2, 3]"]);
    check(x.reshape(&[-1, -1]).unwrap_err(), ErrorKind::Shape, "Reshape", &["-1"]);
    check(x.reshape_to(&[7]).unwrap_err(), ErrorKind::Shape, "Reshape", &["6", "7"]);
    check(x.expand(&[4, 3]).unwrap_err(), ErrorKind::Shape, "Expand", &["[2, 3]", "[4, 3]"]);
    assert_eq!(x.reshape(&[3, -1]).unwrap().dims().as_slice(), &[3, 2]);
    still_usable(&graph, &p);
}

#[test]
fn bad_permutation() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let x = graph.zeros(&[2, 3], DType::F32).unwrap();
    check(x.permute(&[0, 0]).unwrap_err(), ErrorKind::InvalidArgument, "Permute", &["[0, 0]", "[2, 3]"]);
    check(x.permute(&[0, 1, 2]).unwrap_err(), ErrorKind::InvalidArgument, "Permute", &["[0, 1, 2]"]);
    check(x.permute(&[1, 2]).unwrap_err(), ErrorKind::InvalidArgument, "Permute", &["[1, 2]"]);
    check(x.permute(&[0]).unwrap_err(), ErrorKind::InvalidArgument, "Permute", &["[0]"]);
    assert_eq!(x.permute(&[1, 0]).unwrap().dims().as_slice(), &[3, 2]);
    still_usable(&graph, &p);
}

#[test]
fn tensor_from_with_wrong_data_length() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let nodes = graph.len();
    let live = device.stats().live_buffers;
    check(graph.tensor_from(&[1.0f32; 5], &[2, 3]).unwrap_err(), ErrorKind::Shape, "Input", &["5", "[2, 3]", "6"]);
    check(graph.variable(&[1.0f64; 7], &[2, 3]).unwrap_err(), ErrorKind::Shape, "Input", &["7"]);
    assert_eq!(graph.len(), nodes);
    assert_eq!(device.stats().live_buffers, live, "nothing was uploaded");
    assert_eq!(Param::new(&device, "q", &[1.0f32; 3], &[2]).unwrap_err().kind(), ErrorKind::Shape);
    still_usable(&graph, &p);
}

#[test]
fn slices_and_concat() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let x = graph.zeros(&[2, 3], DType::F32).unwrap();
    check(x.slice_axis(1, 0, 3, 0).unwrap_err(), ErrorKind::InvalidArgument, "Slice", &["step"]);
    check(
        x.slice(&[SliceSpec::all(), SliceSpec::all(), SliceSpec::all()]).unwrap_err(),
        ErrorKind::Shape,
        "Slice",
        &["[2, 3]"],
    );
    let y = graph.zeros(&[3, 3], DType::F32).unwrap();
    check(Tensor::concat(&[x, y], 1).unwrap_err(), ErrorKind::Shape, "Concat", &["[3, 3]", "[2, 3]"]);
    check(Tensor::concat(&[], 0).unwrap_err(), ErrorKind::InvalidArgument, "Concat", &[]);
    assert_eq!(Tensor::concat(&[x, y], 0).unwrap().dims().as_slice(), &[5, 3]);
    still_usable(&graph, &p);
}

#[test]
fn losses_check_their_operands() {
    let (device, p) = setup();
    let graph = Graph::new(&device);
    let logits = graph.zeros(&[2, 3], DType::F32).unwrap();
    let labels = graph.tensor_from(&[0i32, 1, 2], &[3]).unwrap();
    check(cross_entropy(logits, labels).unwrap_err(), ErrorKind::Shape, "cross_entropy", &["[2]", "[3]"]);
    let float_labels = graph.zeros(&[2], DType::F32).unwrap();
    check(cross_entropy(logits, float_labels).unwrap_err(), ErrorKind::DType, "cross_entropy", &["f32"]);
    check(nll_loss(logits, labels).unwrap_err(), ErrorKind::Shape, "nll_loss", &["[2]"]);
    let other = graph.zeros(&[3, 2], DType::F32).unwrap();
    check(mse_loss(logits, other).unwrap_err(), ErrorKind::Shape, "mse_loss", &["[2, 3]", "[3, 2]"]);
    check(cross_entropy_probs(logits, other).unwrap_err(), ErrorKind::Shape, "cross_entropy_probs", &["[3, 2]"]);
    // An error from an op inside a composed loss still points at the caller.
    let vector = graph.zeros(&[3], DType::F32).unwrap();
    check(vector.softmax(1).unwrap_err(), ErrorKind::OutOfRange, "Max", &["1"]);
    still_usable(&graph, &p);
}

#[test]
fn graphs_do_not_mix() {
    let (device, p) = setup();
    let g1 = Graph::new(&device);
    let g2 = Graph::new(&device);
    let a = g1.zeros(&[2], DType::F32).unwrap();
    let b = g2.zeros(&[2], DType::F32).unwrap();
    check(a.add(b).unwrap_err(), ErrorKind::InvalidArgument, "Add", &["different graphs"]);
    let other_device = Device::cpu();
    let g3 = Graph::new(&other_device);
    check(g3.param(&p).unwrap_err(), ErrorKind::InvalidArgument, "Param", &["'p'"]);
    still_usable(&g1, &p);
}
