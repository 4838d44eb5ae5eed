//! The sliding-window ops (Im2Col, Col2Im, MaxPool2d, MaxPool2dBackward) and
//! the layer functions composed from them, first and second order, against
//! central finite differences in f64 (`kiln::gradcheck`).
//!
//! Table-driven like gradcheck_ops.rs: every case runs, failures are listed
//! together at the end. Inputs stay at <= 48 elements each. Max-pooling
//! inputs are distinct values spaced far wider than the finite-difference
//! step (no ties, so the arg-max never flips).
//!
//! The layers hold f32 parameters, so the checked functions re-state each
//! layer's forward pass with its parameters as f64 inputs; the
//! `*_layer_matches_the_checked_function` tests pin those re-statements to
//! the layers' own forward passes in f32.

mod common;

use common::cases::{case, distinct, run_all, Suite, WINDOW_CAP};
use common::{assert_close, values};
use kiln::gradcheck::CheckInput;
use kiln::nn::{
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm2d, Conv2d, ConvOptions, ConvTranspose2d, Embedding, LayerNorm, MaxPool2d,
    Module,
};
use kiln::{Device, Graph, HostData, Result, Tensor, Window2d};

fn rand(dims: &[usize], seed: u64) -> CheckInput {
    CheckInput::random(dims, -1.0, 1.0, seed)
}

/// The window the issue names: different kernel, stride, padding and
/// dilation per axis.
fn mixed() -> Window2d {
    Window2d::new([2, 3], [2, 1], [1, 0], [1, 2]).unwrap()
}

/// The window `max_pool2d(kernel 3, stride 2, padding 1, ceil_mode)` uses
/// on a 6x6 image: the extra bottom/right padding of ceil mode.
fn ceil_window_6x6() -> Window2d {
    Window2d { kernel: [3, 3], stride: [2, 2], dilation: [1, 1], pad_begin: [1, 1], pad_end: [2, 2] }
}

#[test]
fn the_ceil_window_is_what_max_pool2d_uses() {
    let graph = Graph::new(&Device::cpu());
    let x = graph.zeros(&[1, 1, 6, 6], kiln::DType::F64).unwrap();
    let y = x.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], true).unwrap();
    assert_eq!(y.op(), kiln::Op::MaxPool2d(ceil_window_6x6()));
    assert_eq!(y.dims().as_slice(), [1, 1, 4, 4]);
}

#[test]
fn im2col_and_col2im() {
    let w = mixed();
    // [1,2,3,6] under the mixed window: 2x2 outputs, 6 taps → cols [1,12,4].
    let cases = vec![
        case("Im2Col mixed window", vec![rand(&[1, 2, 3, 6], 1)], move |_, x| x[0].im2col(w)),
        case("Im2Col mixed window, squared", vec![rand(&[1, 2, 3, 6], 2)], move |_, x| x[0].im2col(w)?.square()),
        case("Im2Col 3x3 stride 1 padding 1 (overlapping), squared", vec![rand(&[2, 1, 3, 3], 3)], |_, x| {
            x[0].im2col(Window2d::new([3, 3], [1, 1], [1, 1], [1, 1])?)?.square()
        }),
        case("Im2Col asymmetric (ceil-mode) padding, squared", vec![rand(&[1, 1, 6, 6], 4)], |_, x| {
            x[0].im2col(ceil_window_6x6())?.square()
        }),
        case("Col2Im mixed window", vec![rand(&[1, 12, 4], 5)], move |_, c| c[0].col2im([3, 6], w)),
        case("Col2Im mixed window, squared", vec![rand(&[1, 12, 4], 6)], move |_, c| c[0].col2im([3, 6], w)?.square()),
        // 9 taps over a 3x3 image with padding 1: every pixel sums several
        // columns.
        case("Col2Im 3x3 stride 1 padding 1 (overlapping sums), squared", vec![rand(&[1, 9, 4], 7)], |_, c| {
            c[0].col2im([2, 2], Window2d::new([3, 3], [1, 1], [1, 1], [1, 1])?)?.square()
        }),
        case("Col2Im then Im2Col round trip, times input", vec![rand(&[1, 12, 4], 8)], move |_, c| {
            c[0].col2im([3, 6], w)?.im2col(w)?.mul(c[0])
        }),
    ];
    run_all(&Suite::cpu(WINDOW_CAP), cases);
}

#[test]
fn max_pool2d() {
    let cases = vec![
        case("MaxPool2d k2 s2", vec![distinct(&[1, 2, 4, 4], 10)], |_, x| {
            x[0].max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false)
        }),
        // Squared so the second derivative is not identically zero: it runs
        // MaxPool2dBackward's own rule (the gather) and MaxPool2d's again.
        case("MaxPool2d k2 s2, squared", vec![distinct(&[1, 2, 4, 4], 11)], |_, x| {
            x[0].max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false)?.square()
        }),
        case("MaxPool2d k[2,3] s[2,1] p[1,0] d[1,2], squared", vec![distinct(&[1, 2, 4, 6], 12)], |_, x| {
            x[0].max_pool2d([2, 3], [2, 1], [1, 0], [1, 2], false)?.square()
        }),
        // Ceil mode on 5 rows with k2 s2 p1: the 4th window would start in
        // the bottom padding and is dropped.
        case(
            "MaxPool2d k[2,3] s[2,1] p[1,0] d[1,2] ceil_mode (drops a window), squared",
            vec![distinct(&[1, 1, 5, 6], 13)],
            |_, x| x[0].max_pool2d([2, 3], [2, 1], [1, 0], [1, 2], true)?.square(),
        ),
        // 6x6 with k[3,2] s[2,3] p[1,1] d[1,2]: ceil mode adds a window on both axes (4x3, floor 3x2).
        case(
            "MaxPool2d k[3,2] s[2,3] p[1,1] d[1,2] ceil_mode (extra windows), squared",
            vec![distinct(&[1, 1, 6, 6], 17)],
            |_, x| {
                let y = x[0].max_pool2d([3, 2], [2, 3], [1, 1], [1, 2], true)?;
                assert_eq!(y.dims().as_slice(), [1, 1, 4, 3]);
                y.square()
            },
        ),
        case("MaxPool2d 6x6 k3 s2 p1 ceil_mode (extra window), squared", vec![distinct(&[1, 1, 6, 6], 14)], |_, x| {
            x[0].max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], true)?.square()
        }),
        case(
            "MaxPool2d k3 s1 p1 (one pixel wins several windows), times exp",
            vec![distinct(&[2, 1, 3, 4], 15)],
            |_, x| x[0].max_pool2d([3, 3], [1, 1], [1, 1], [1, 1], false)?.exp(),
        ),
        case("MaxPool2d layer k[3,2] s[2,1] p[1,0] d[1,2] ceil", vec![distinct(&[1, 2, 5, 4], 16)], |_, x| {
            MaxPool2d { kernel: [3, 2], stride: [2, 1], padding: [1, 0], dilation: [1, 2], ceil_mode: true }
                .forward(x[0])?
                .square()
        }),
    ];
    run_all(&Suite::cpu(WINDOW_CAP), cases);
}

/// A non-variable tensor holding `x`'s values.
fn constant<'g>(graph: &'g Graph, x: &CheckInput) -> Result<Tensor<'g>> {
    graph.tensor_from(&x.values, &x.dims)
}

/// MaxPool2dBackward differentiated in its gradient argument `g`, with the
/// pooled input x a constant (not a variable) inside the function.
#[test]
fn max_pool2d_backward_in_its_gradient_argument() {
    let x_mixed = distinct(&[1, 2, 4, 6], 20);
    let x_ceil = distinct(&[1, 1, 6, 6], 21);
    let x_overlap = distinct(&[1, 2, 3, 4], 22);
    let w = mixed();
    // Pooled shapes: mixed on 4x6 → 3x2; ceil on 6x6 → 4x4; 3x3 s1 p1 on 3x4 → 3x4.
    let (c1, c2, c3, c4, c5) = (x_mixed.clone(), x_mixed, x_ceil.clone(), x_ceil, x_overlap);
    let overlap = Window2d::new([3, 3], [1, 1], [1, 1], [1, 1]).unwrap();
    let cases = vec![
        case("MaxPool2dBackward mixed window, in g", vec![rand(&[1, 2, 3, 2], 23)], move |g, v| {
            constant(g, &c1)?.max_pool2d_backward(v[0], w)
        }),
        case("MaxPool2dBackward mixed window, in g, squared", vec![rand(&[1, 2, 3, 2], 24)], move |g, v| {
            constant(g, &c2)?.max_pool2d_backward(v[0], w)?.square()
        }),
        case("MaxPool2dBackward ceil window, in g", vec![rand(&[1, 1, 4, 4], 25)], move |g, v| {
            constant(g, &c3)?.max_pool2d_backward(v[0], ceil_window_6x6())
        }),
        case("MaxPool2dBackward ceil window, in g², squared", vec![rand(&[1, 1, 4, 4], 26)], move |g, v| {
            constant(g, &c4)?.max_pool2d_backward(v[0].square()?, ceil_window_6x6())?.square()
        }),
        // Overlapping windows: a pixel that is the maximum of several
        // windows accumulates all their gradients.
        case(
            "MaxPool2dBackward overlapping windows, in g, times exp(g)",
            vec![rand(&[1, 2, 3, 4], 27)],
            move |g, v| {
                let x = constant(g, &c5)?;
                let back = x.max_pool2d_backward(v[0], overlap)?;
                back.mul(x)?.sum(&[2, 3], false)?.mul(v[0].exp()?.sum(&[2, 3], false)?)
            },
        ),
    ];
    run_all(&Suite::cpu(WINDOW_CAP), cases);
}

/// Channels in / out, kernel and window of the grouped convolution.
const GROUPED: (usize, usize, usize) = (4, 2, 2); // in channels, out channels, groups

/// Conv2d's forward pass (Im2Col → batched MatMul over groups → reshape +
/// bias), with the weight and bias as tensors.
fn conv2d<'g>(
    x: Tensor<'g>,
    weight: Tensor<'g>,
    bias: Tensor<'g>,
    window: Window2d,
    groups: usize,
) -> Result<Tensor<'g>> {
    let d = x.dims();
    let (n, c, h, w) = (d[0], d[1], d[2], d[3]);
    let o = weight.dims()[0];
    let k = window.kernel_elements();
    let [oh, ow] = window.output_size([h, w]).unwrap();
    let cols = x.im2col(window)?.reshape_to(&[n, groups, c / groups * k, oh * ow])?;
    let y = weight.reshape_to(&[groups, o / groups, c / groups * k])?.matmul(cols)?;
    y.reshape_to(&[n, o, oh, ow])?.add(bias.reshape_to(&[1, o, 1, 1])?)
}

/// ConvTranspose2d's forward pass (MatMul → Col2Im + bias).
fn conv_transpose2d<'g>(
    x: Tensor<'g>,
    weight: Tensor<'g>,
    bias: Tensor<'g>,
    window: Window2d,
    output_padding: [usize; 2],
) -> Result<Tensor<'g>> {
    let d = x.dims();
    let (n, c, h, w) = (d[0], d[1], d[2], d[3]);
    let o = weight.dims()[1];
    let k = window.kernel_elements();
    let size = |a: usize, s: usize| {
        (s - 1) * window.stride[a] as usize
            + window.dilation[a] as usize * (window.kernel[a] as usize - 1)
            + 1
            + output_padding[a]
            - 2 * window.pad_begin[a] as usize
    };
    let cols = weight.reshape_to(&[c, o * k])?.matmul_t(x.reshape_to(&[n, c, h * w])?, true, false)?;
    cols.col2im([size(0, h), size(1, w)], window)?.add(bias.reshape_to(&[1, o, 1, 1])?)
}

/// LayerNorm over the trailing axes `axes`, weight/bias of the normalised
/// shape.
fn layer_norm<'g>(x: Tensor<'g>, weight: Tensor<'g>, bias: Tensor<'g>, axes: &[isize], eps: f64) -> Result<Tensor<'g>> {
    let mean = x.mean(axes, true)?;
    let var = x.var(axes, true, 0)?;
    x.sub(mean)?.div(var.add(eps)?.sqrt()?)?.mul(weight)?.add(bias)
}

/// BatchNorm2d in training mode: batch statistics over (N, H, W).
fn batch_norm_train<'g>(x: Tensor<'g>, weight: Tensor<'g>, bias: Tensor<'g>, eps: f64) -> Result<Tensor<'g>> {
    let c = x.dims()[1];
    let mean = x.mean(&[0, 2, 3], true)?;
    let var = x.var(&[0, 2, 3], true, 0)?;
    let per_channel = [1, c, 1, 1];
    x.sub(mean)?.div(var.add(eps)?.sqrt()?)?.mul(weight.reshape_to(&per_channel)?)?.add(bias.reshape_to(&per_channel)?)
}

const EMBED_INDICES: [i32; 6] = [3, 0, 3, 4, 1, 1];

#[test]
fn layer_functions() {
    let w = mixed();
    let (cin, cout, groups) = GROUPED;
    let cases = vec![
        // Conv2d groups 2: x [1,4,2,5] (mixed window → 2x1 output), weight
        // [2, 2, 2, 3], bias [2].
        case(
            "Conv2d groups 2, mixed window",
            vec![rand(&[1, cin, 2, 5], 30), rand(&[cout, cin / groups, 2, 3], 31), rand(&[cout], 32)],
            move |_, v| conv2d(v[0], v[1], v[2], w, groups),
        ),
        case(
            "Conv2d groups 2, mixed window, tanh",
            vec![rand(&[1, cin, 2, 5], 33), rand(&[cout, cin / groups, 2, 3], 34), rand(&[cout], 35)],
            move |_, v| conv2d(v[0], v[1], v[2], w, groups)?.tanh(),
        ),
        case(
            "ConvTranspose2d mixed window, output_padding [1,0], tanh",
            vec![rand(&[1, 2, 3, 3], 36), rand(&[2, 2, 2, 3], 37), rand(&[2], 38)],
            move |_, v| conv_transpose2d(v[0], v[1], v[2], w, [1, 0])?.tanh(),
        ),
        case("AvgPool2d k[3,2] s[2,1] p[1,1], squared", vec![rand(&[1, 2, 5, 4], 39)], |_, x| {
            AvgPool2d { kernel: [3, 2], stride: [2, 1], padding: [1, 1] }.forward(x[0])?.square()
        }),
        case("AdaptiveAvgPool2d 5x5 -> 3x3 (uneven), squared", vec![rand(&[1, 1, 5, 5], 40)], |_, x| {
            AdaptiveAvgPool2d { output: [3, 3] }.forward(x[0])?.square()
        }),
        case("AdaptiveAvgPool2d 6x4 -> 3x2 (even), squared", vec![rand(&[1, 2, 6, 4], 41)], |_, x| {
            AdaptiveAvgPool2d { output: [3, 2] }.forward(x[0])?.square()
        }),
        case("LayerNorm over [3,4]", vec![rand(&[2, 3, 4], 42), rand(&[3, 4], 43), rand(&[3, 4], 44)], |_, v| {
            layer_norm(v[0], v[1], v[2], &[1, 2], 1e-5)
        }),
        case("BatchNorm2d training mode", vec![rand(&[2, 2, 3, 3], 45), rand(&[2], 46), rand(&[2], 47)], |_, v| {
            batch_norm_train(v[0], v[1], v[2], 1e-5)
        }),
        case("Embedding (index_select, repeated indices), squared", vec![rand(&[5, 3], 48)], |g, v| {
            let idx = g.tensor_from(&EMBED_INDICES, &[6])?;
            v[0].index_select(0, idx)?.reshape_to(&[2, 3, 3])?.square()
        }),
    ];
    run_all(&Suite::cpu(WINDOW_CAP), cases);
}

// ----- the checked functions are the layers' forward passes ---------------

fn f32s(values: &[f64]) -> Vec<f32> {
    values.iter().map(|&v| v as f32).collect()
}

#[test]
fn conv_layers_match_the_checked_functions() {
    let device = Device::cpu();
    let w = mixed();
    let (cin, cout, groups) = GROUPED;
    let options = ConvOptions { stride: [2, 1], padding: [1, 0], dilation: [1, 2], groups, bias: true };
    let conv = Conv2d::new(&device, cin, cout, [2, 3], options, 7).unwrap();
    let x = rand(&[2, cin, 3, 6], 50);
    let graph = Graph::new(&device);
    let xt = graph.tensor_from(&f32s(&x.values), &x.dims).unwrap();
    let layer = values(&conv.forward(xt).unwrap());
    let weight = graph.param(&conv.weight).unwrap();
    let bias = graph.param(conv.bias.as_ref().unwrap()).unwrap();
    let composed = values(&conv2d(xt, weight, bias, w, groups).unwrap());
    assert_close(&layer, &composed, 1e-6);

    let options = ConvOptions { groups: 1, ..options };
    let convt = ConvTranspose2d::new(&device, 2, 3, [2, 3], options, [1, 0], 8).unwrap();
    let x = rand(&[1, 2, 3, 3], 51);
    let xt = graph.tensor_from(&f32s(&x.values), &x.dims).unwrap();
    let y = convt.forward(xt).unwrap();
    assert_eq!(y.dims().as_slice(), [1, 3, 5, 7]);
    let weight = graph.param(&convt.weight).unwrap();
    let bias = graph.param(convt.bias.as_ref().unwrap()).unwrap();
    assert_close(&values(&y), &values(&conv_transpose2d(xt, weight, bias, w, [1, 0]).unwrap()), 1e-6);
}

#[test]
fn norm_and_embedding_layers_match_the_checked_functions() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let ln = LayerNorm::new(&device, &[3, 4], 1e-5).unwrap();
    let lw = rand(&[3, 4], 60);
    let lb = rand(&[3, 4], 61);
    ln.weight.set_value(&HostData::F32(f32s(&lw.values))).unwrap();
    ln.bias.as_ref().unwrap().set_value(&HostData::F32(f32s(&lb.values))).unwrap();
    let x = rand(&[2, 3, 4], 62);
    let xt = graph.tensor_from(&f32s(&x.values), &x.dims).unwrap();
    let (wt, bt) = (graph.param(&ln.weight).unwrap(), graph.param(ln.bias.as_ref().unwrap()).unwrap());
    assert_close(&values(&ln.forward(xt).unwrap()), &values(&layer_norm(xt, wt, bt, &[1, 2], 1e-5).unwrap()), 1e-5);

    let bn = BatchNorm2d::new(&device, 2, 1e-5, 0.1).unwrap();
    bn.weight.set_value(&HostData::F32(vec![1.5, -0.5])).unwrap();
    bn.bias.set_value(&HostData::F32(vec![0.25, 2.0])).unwrap();
    let x = rand(&[2, 2, 3, 3], 63);
    let xt = graph.tensor_from(&f32s(&x.values), &x.dims).unwrap();
    let (wt, bt) = (graph.param(&bn.weight).unwrap(), graph.param(&bn.bias).unwrap());
    let expected = values(&batch_norm_train(xt, wt, bt, 1e-5).unwrap());
    assert_close(&values(&bn.forward(xt).unwrap()), &expected, 1e-5);

    let emb = Embedding::new(&device, 5, 3, 9).unwrap();
    let idx = graph.tensor_from(&EMBED_INDICES, &[2, 3]).unwrap();
    let y = emb.forward(idx).unwrap();
    assert_eq!(y.dims().as_slice(), [2, 3, 3]);
    let table = common::param_value(&emb.weight);
    let expected: Vec<f64> = EMBED_INDICES.iter().flat_map(|&i| table[i as usize * 3..][..3].to_vec()).collect();
    assert_eq!(values(&y), expected);
}
