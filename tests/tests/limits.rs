//! Sizes at and past kiln's limits (issue 9's probes): shape arithmetic that
//! overflows or exceeds `shape::MAX_ELEMENTS` is a shape error at the call
//! that built the node, and allocations too large for the machine are an
//! out-of-memory error naming the op and the bytes, never an abort, a wrapped
//! product or a segfault. Debug builds behave the same (no overflow panics):
//! `cargo test -p kiln-tests --test limits` runs this file unoptimised.

use kiln::nn::{Conv2d, ConvOptions, Embedding, LayerNorm};
use kiln::prelude::*;
use kiln::shape::{MAX_ELEMENTS, MAX_RANK};
use kiln::{Error, ErrorKind};

/// The error is of `kind`, names `op`, mentions every `needle` and points at
/// this file.
#[track_caller]
fn check(err: Error, kind: ErrorKind, op: &str, needles: &[&str]) {
    assert_eq!(err.kind(), kind, "{err}");
    assert_eq!(err.op(), op, "{err}");
    for needle in needles {
        assert!(err.message().contains(needle), "the message should mention {needle:?}: {err}");
    }
    assert_eq!(err.location().file(), file!(), "the error points at the caller: {err}");
}

const HUGE: usize = 1 << 32;

#[test]
fn reshape_products_that_wrap_are_refused() {
    let graph = Graph::new(&Device::cpu());
    let x = graph.ones(&[64], DType::F32).unwrap();
    // (2^58 + 1) * 64 wraps to 64 in unchecked arithmetic.
    let e = x.reshape_to(&[(1 << 58) + 1, 64]).unwrap_err();
    check(e, ErrorKind::Shape, "Reshape", &["maximum"]);
    // usize::MAX is a length, not "infer".
    check(x.reshape_to(&[usize::MAX, 2]).unwrap_err(), ErrorKind::Shape, "Reshape", &[]);
    check(x.reshape(&[-1, isize::MAX, 4]).unwrap_err(), ErrorKind::Shape, "Reshape", &[]);
    check(x.reshape(&[-2, 32]).unwrap_err(), ErrorKind::Shape, "Reshape", &["-2"]);
    // With zero elements too: [0, 2^62, 2^62] would still overflow.
    let empty = graph.zeros(&[0], DType::F32).unwrap();
    check(empty.reshape_to(&[0, 1 << 62, 1 << 62]).unwrap_err(), ErrorKind::Shape, "Reshape", &[]);
    // The graph is unharmed.
    let y = x.reshape_to(&[8, 8]).unwrap();
    let z = y.matmul(y).unwrap();
    assert_eq!(z.sum_all().unwrap().item_blocking().unwrap(), 512.0);
}

#[test]
fn creation_ops_check_their_size() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    check(graph.ones(&[HUGE, HUGE], DType::F32).unwrap_err(), ErrorKind::Shape, "Full", &["[4294967296, 4294967296]"]);
    check(graph.zeros(&[1 << 41], DType::F32).unwrap_err(), ErrorKind::Shape, "Full", &["maximum"]);
    check(graph.arange(0.0, 1.0, MAX_ELEMENTS + 1, DType::F32).unwrap_err(), ErrorKind::Shape, "Arange", &[]);
    check(graph.rand_uniform(&[HUGE, HUGE], 0, DType::F32).unwrap_err(), ErrorKind::Shape, "RandUniform", &[]);
    check(graph.tensor_from::<f32>(&[], &[HUGE, HUGE]).unwrap_err(), ErrorKind::Shape, "Input", &[]);
    check(graph.tensor_from::<f32>(&[], &[0, HUGE, HUGE]).unwrap_err(), ErrorKind::Shape, "Input", &[]);
    check(Param::new::<f32>(&device, "w", &[], &[HUGE, HUGE]).unwrap_err(), ErrorKind::Shape, "Param", &[]);
    let deep = vec![1; MAX_RANK + 1];
    check(graph.ones(&deep, DType::F32).unwrap_err(), ErrorKind::Shape, "Full", &["rank"]);
    assert_eq!(graph.len(), 0, "nothing was recorded");
    // At the limit, a lazy node is fine (nothing is allocated until it runs).
    assert!(graph.zeros(&[MAX_ELEMENTS], DType::F32).is_ok());
}

#[test]
fn broadcasts_expands_and_products_that_overflow() {
    let graph = Graph::new(&Device::cpu());
    let one = graph.ones(&[1, 1], DType::F32).unwrap();
    check(one.expand(&[HUGE, HUGE]).unwrap_err(), ErrorKind::Shape, "Expand", &[]);
    let column = graph.ones(&[HUGE, 1], DType::F32).unwrap();
    let row = graph.ones(&[1, HUGE], DType::F32).unwrap();
    check(column.add(row).unwrap_err(), ErrorKind::Shape, "Add", &[]);
    check(column.lt(row).unwrap_err(), ErrorKind::Shape, "Less", &[]);
    check(column.gt(0.0).unwrap().where_(column, row).unwrap_err(), ErrorKind::Shape, "Where", &[]);
    check(column.matmul(row).unwrap_err(), ErrorKind::Shape, "MatMul", &[]);
    let labels = graph.tensor_from(&[0i32], &[1]).unwrap();
    check(labels.one_hot(MAX_ELEMENTS + 1, DType::F32).unwrap_err(), ErrorKind::Shape, "Arange", &[]);
    // Index selection multiplies a dim by the index length.
    let wide = graph.ones(&[1, 1 << 30], DType::F32).unwrap();
    let index = graph.zeros(&[1 << 11], DType::I32).unwrap();
    check(wide.index_select(0, index).unwrap_err(), ErrorKind::Shape, "IndexSelect", &[]);
}

#[test]
fn concat_lengths_that_overflow() {
    let graph = Graph::new(&Device::cpu());
    let a = graph.zeros(&[MAX_ELEMENTS], DType::F32).unwrap();
    check(Tensor::concat(&[a, a], 0).unwrap_err(), ErrorKind::Shape, "Concat", &["along axis 0"]);
    // [2^63] itself is refused before concat could wrap it to [0].
    check(graph.zeros(&[1 << 63], DType::F32).unwrap_err(), ErrorKind::Shape, "Full", &[]);
}

#[test]
fn window_arithmetic_is_checked() {
    let graph = Graph::new(&Device::cpu());
    let x = graph.zeros(&[1, 1 << 20, 4, 4], DType::F32).unwrap();
    // 2^20 channels x a 2^11 x 2^10 window: more than 2^40 rows.
    let window = kiln::Window2d::new([1 << 11, 1 << 10], [1, 1], [1 << 11, 1 << 10], [1, 1]).unwrap();
    check(x.im2col(window).unwrap_err(), ErrorKind::Shape, "Im2Col", &["channels"]);
    let huge_window = kiln::Window2d::new([u32::MAX as usize, 3], [1, 1], [0, 0], [u32::MAX as usize, 1]).unwrap();
    check(x.im2col(huge_window).unwrap_err(), ErrorKind::Shape, "Im2Col", &[]);
    let cols = graph.zeros(&[1, 9, 4], DType::F32).unwrap();
    let w3 = kiln::Window2d::new([3, 3], [1, 1], [0, 0], [1, 1]).unwrap();
    check(cols.col2im([usize::MAX, usize::MAX], w3).unwrap_err(), ErrorKind::Shape, "Col2Im", &[]);
    let image = graph.zeros(&[1, 1, 5, 5], DType::F32).unwrap();
    let pooled = image.max_pool2d([3, 3], [u32::MAX as usize, 2], [1, 1], [1, 1], true).unwrap();
    assert_eq!(pooled.dims().as_slice(), &[1, 1, 1, 3]);
    // Zeros and sizes past u32 are refused with the range that is allowed.
    let err = kiln::Window2d::new([u32::MAX as usize + 1, 3], [1, 1], [0, 0], [1, 1]).unwrap_err();
    check(err, ErrorKind::InvalidArgument, "Window2d", &["kernel", "from 1 to 4294967295"]);
    let err = kiln::Window2d::new([3, 3], [0, 1], [0, 0], [1, 1]).unwrap_err();
    check(err, ErrorKind::InvalidArgument, "Window2d", &["stride", "from 1 to 4294967295"]);
}

/// Out-of-memory errors: kind Backend, the op, and the bytes asked for.
#[track_caller]
fn check_oom(err: Error, op: &str, bytes: &str) {
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert_eq!(err.op(), op, "{err}");
    assert!(err.message().contains("out of memory") && err.message().contains(bytes), "{err}");
    assert_eq!(err.location().file(), file!(), "the error points at the caller: {err}");
}

#[test]
fn realizing_a_tensor_larger_than_memory_is_an_error() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    // 2^40 f32: 4 TiB, within the shape limit, beyond any memory here.
    let big = graph.ones(&[1 << 20, 1 << 20], DType::F32).unwrap();
    let total = big.sum_all().unwrap();
    check_oom(total.item_blocking().unwrap_err(), "Full", "4398046511104 bytes");
    // The device still works afterwards.
    let small = graph.ones(&[3], DType::F32).unwrap().sum_all().unwrap();
    assert_eq!(small.item_blocking().unwrap(), 3.0);
}

#[test]
fn layer_constructors_do_not_abort_on_huge_sizes() {
    let device = Device::cpu();
    check_oom(Linear::new(&device, 1 << 20, 1 << 20, true, 0).err().unwrap(), "Linear", "bytes");
    check(Linear::new(&device, usize::MAX, 2, true, 0).err().unwrap(), ErrorKind::Shape, "Linear", &[]);
    check(Linear::new(&device, 1 << 21, 1 << 21, true, 0).err().unwrap(), ErrorKind::Shape, "Linear", &[]);
    check_oom(Embedding::new(&device, 1 << 20, 1 << 20, 0).err().unwrap(), "Embedding", "bytes");
    check(Embedding::new(&device, usize::MAX, 3, 0).err().unwrap(), ErrorKind::Shape, "Embedding", &[]);
    let huge_conv = Conv2d::new(&device, 1 << 20, 1 << 16, [16, 16], ConvOptions::default(), 0);
    check(huge_conv.err().unwrap(), ErrorKind::Shape, "Conv2d", &[]);
    let big_conv = Conv2d::new(&device, 1 << 14, 1 << 14, [64, 64], ConvOptions::default(), 0);
    check_oom(big_conv.err().unwrap(), "Conv2d", "bytes");
    check(LayerNorm::new(&device, &[HUGE, HUGE], 1e-5).err().unwrap(), ErrorKind::Shape, "LayerNorm", &[]);
    // Sane sizes still work.
    assert!(Linear::new(&device, 3, 4, true, 0).is_ok());
}
