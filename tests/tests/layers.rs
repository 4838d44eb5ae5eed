//! Behaviour of the nn layers and the random ops: BatchNorm2d statistics,
//! Dropout masks, the counter-based generators, max-pooling ties, grouped
//! and transposed convolutions, and clear errors for bad arguments.

mod common;

use common::{assert_close, param_value, values};
use kiln::host_rng::SplitMix64;
use kiln::nn::{BatchNorm2d, Conv2d, ConvOptions, ConvTranspose2d, Dropout, Embedding, MaxPool2d, Module};
use kiln::{Blocking, DType, Device, Error, ErrorKind, Graph, HostData, Tensor, Window2d};

fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.uniform(-2.0, 2.0) as f32).collect()
}

// ----- BatchNorm2d ------------------------------------------------------------

/// Per-channel mean and unbiased variance of an NCHW host array, in f64.
fn channel_stats(x: &[f32], [n, c, h, w]: [usize; 4]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let count = (n * h * w) as f64;
    let mut mean = vec![0.0; c];
    let mut var = vec![0.0; c];
    for ch in 0..c {
        let vals: Vec<f64> = (0..n).flat_map(|b| (0..h * w).map(move |i| x[(b * c + ch) * h * w + i] as f64)).collect();
        mean[ch] = vals.iter().sum::<f64>() / count;
        var[ch] = vals.iter().map(|v| (v - mean[ch]).powi(2)).sum::<f64>() / count;
    }
    let unbiased = var.iter().map(|v| v * count / (count - 1.0)).collect();
    (mean, var, unbiased)
}

#[test]
fn batch_norm_running_statistics_follow_the_momentum_blend_of_batch_mean_and_unbiased_var() {
    let device = Device::cpu();
    let dims = [2, 3, 2, 3];
    let (momentum, eps) = (0.1, 1e-5);
    let bn = BatchNorm2d::new(&device, 3, eps, momentum).unwrap();
    let weight = [1.5f32, -0.5, 2.0];
    let bias = [0.25f32, 0.0, -1.0];
    bn.weight.set_value(&HostData::F32(weight.to_vec())).unwrap();
    bn.bias.set_value(&HostData::F32(bias.to_vec())).unwrap();
    assert!(bn.is_training(), "a new BatchNorm2d is in training mode");
    let x = random_f32(dims.iter().product(), 1);
    let (mean, var, unbiased) = channel_stats(&x, dims);

    // One training step: forward in training mode, backward.
    let graph = Graph::new(&device);
    let xt = graph.tensor_from(&x, &dims).unwrap();
    let train_out = bn.forward(xt).unwrap();
    train_out.square().unwrap().sum_all().unwrap().backward().unwrap();
    let expected_mean: Vec<f64> = mean.iter().map(|m| (1.0 - momentum) * 0.0 + momentum * m).collect();
    let expected_var: Vec<f64> = unbiased.iter().map(|v| (1.0 - momentum) * 1.0 + momentum * v).collect();
    assert_close(&param_value(&bn.running_mean), &expected_mean, 1e-5);
    assert_close(&param_value(&bn.running_var), &expected_var, 1e-5);
    // The training output used the batch statistics (population variance).
    let hw = dims[2] * dims[3];
    let expected_train: Vec<f64> = (0..x.len())
        .map(|i| {
            let ch = (i / hw) % dims[1];
            (x[i] as f64 - mean[ch]) / (var[ch] + eps).sqrt() * weight[ch] as f64 + bias[ch] as f64
        })
        .collect();
    let train_values = values(&train_out);
    assert_close(&train_values, &expected_train, 1e-4);
    // The running statistics never require grad; weight and bias got one.
    assert!(!bn.running_mean.requires_grad() && !bn.running_var.requires_grad());
    assert!(bn.weight.has_grad() && bn.bias.has_grad());
    assert!(!bn.running_mean.has_grad());

    // A second step blends again.
    let graph = Graph::new(&device);
    bn.forward(graph.tensor_from(&x, &dims).unwrap()).unwrap();
    let twice: Vec<f64> = expected_mean.iter().zip(&mean).map(|(r, m)| (1.0 - momentum) * r + momentum * m).collect();
    assert_close(&param_value(&bn.running_mean), &twice, 1e-5);
    let (rm, rv) = (param_value(&bn.running_mean), param_value(&bn.running_var));

    // Evaluation mode normalises with the running statistics and leaves
    // them alone.
    bn.set_training(false);
    assert!(!bn.is_training());
    let graph = Graph::new(&device);
    let eval_out = values(&bn.forward(graph.tensor_from(&x, &dims).unwrap()).unwrap());
    let expected_eval: Vec<f64> = (0..x.len())
        .map(|i| {
            let ch = (i / hw) % dims[1];
            (x[i] as f64 - rm[ch]) / (rv[ch] + eps).sqrt() * weight[ch] as f64 + bias[ch] as f64
        })
        .collect();
    assert_close(&eval_out, &expected_eval, 1e-4);
    let largest_difference = eval_out.iter().zip(&train_values).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(largest_difference > 0.1, "eval output should differ from training output ({largest_difference})");
    assert_eq!(param_value(&bn.running_mean), rm);
    assert_eq!(param_value(&bn.running_var), rv);
}

// ----- Dropout ------------------------------------------------------------------

fn dropout_output(dropout: &Dropout, x: &[f32]) -> Vec<f32> {
    let graph = Graph::new(&Device::cpu());
    dropout.forward(graph.tensor_from(x, &[x.len()]).unwrap()).unwrap().to_vec_blocking::<f32>().unwrap()
}

#[test]
fn dropout_masks_replay_for_a_seed_zero_about_p_and_scale_survivors() {
    let p = 0.3;
    let n = 10_000;
    let x: Vec<f32> = random_f32(n, 2).into_iter().map(|v| v.abs() + 0.5).collect(); // never zero
    let a = Dropout::new(p, 42).unwrap();
    let b = Dropout::new(p, 42).unwrap();
    let first = dropout_output(&a, &x);
    // The same seed replays the same mask (a fresh layer, first call).
    assert_eq!(first, dropout_output(&b, &x));
    // About p of the elements are zero; the rest are x / (1 - p).
    let zeros = first.iter().filter(|&&v| v == 0.0).count();
    let fraction = zeros as f64 / n as f64;
    assert!((fraction - p).abs() < 0.025, "{fraction} of the elements were dropped, p = {p}");
    for (y, x) in first.iter().zip(&x) {
        if *y != 0.0 {
            let expected = *x as f64 / (1.0 - p);
            assert!((*y as f64 - expected).abs() <= 1e-6 * expected, "survivor {y}, expected {expected}");
        }
    }
    // A second call draws a new mask; the replaying layer follows suit.
    let second = dropout_output(&a, &x);
    let mask = |v: &[f32]| v.iter().map(|&y| y == 0.0).collect::<Vec<_>>();
    assert_ne!(mask(&first), mask(&second), "two calls gave the same mask");
    assert_eq!(second, dropout_output(&b, &x));
    // A different seed is a different mask.
    assert_ne!(mask(&first), mask(&dropout_output(&Dropout::new(p, 43).unwrap(), &x)));
}

#[test]
fn dropout_gradient_is_the_mask_scaled_and_eval_mode_is_the_identity() {
    let device = Device::cpu();
    let p = 0.5;
    let dropout = Dropout::new(p, 7).unwrap();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f32; 64], &[8, 8]).unwrap();
    let y = dropout.forward(x).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let (out, grad) = (values(&y), common::grad_of(&x));
    for (o, g) in out.iter().zip(&grad) {
        assert_eq!(*g, *o, "gradient follows the mask: output {o}, gradient {g}");
        assert!(*o == 0.0 || *o == 2.0);
    }

    dropout.set_training(false);
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&random_f32(50, 3), &[5, 10]).unwrap();
    let y = dropout.forward(x).unwrap();
    assert_eq!(values(&y), values(&x));
    assert_eq!(y.id(), x.id(), "eval-mode dropout records nothing");
    // Back in training mode it drops again.
    dropout.set_training(true);
    let graph = Graph::new(&device);
    let y = dropout.forward(graph.tensor_from(&[1.0f32; 64], &[64]).unwrap()).unwrap();
    assert!(values(&y).contains(&0.0));
}

// ----- RandUniform / RandNormal --------------------------------------------------

#[test]
fn rand_uniform_replays_for_a_seed_lies_in_0_1_and_has_mean_one_half() {
    let graph = Graph::new(&Device::cpu());
    let n = 10_000;
    let a = graph.rand_uniform(&[100, 100], 11, DType::F32).unwrap().to_vec_blocking::<f32>().unwrap();
    let b = graph.rand_uniform(&[100, 100], 11, DType::F32).unwrap().to_vec_blocking::<f32>().unwrap();
    assert_eq!(a, b, "the same seed gives the same numbers");
    assert!(a.iter().all(|v| (0.0..1.0).contains(v)), "values in [0, 1)");
    let mean = a.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    let c = graph.rand_uniform(&[n], 12, DType::F32).unwrap().to_vec_blocking::<f32>().unwrap();
    assert_ne!(a, c, "another seed gives other numbers");
    // Element i depends on (seed, i) only: not on the shape, and the f64
    // values are the same 24-bit numbers.
    let flat = graph.rand_uniform(&[n], 11, DType::F32).unwrap().to_vec_blocking::<f32>().unwrap();
    assert_eq!(a, flat);
    let wide = graph.rand_uniform(&[n], 11, DType::F64).unwrap().to_vec_blocking::<f64>().unwrap();
    assert!(wide.iter().zip(&a).all(|(w, a)| *w == *a as f64));
    // In a fresh graph too.
    let fresh = Graph::new(&Device::cpu());
    assert_eq!(a, fresh.rand_uniform(&[100, 100], 11, DType::F32).unwrap().to_vec_blocking::<f32>().unwrap());
}

#[test]
fn rand_normal_has_mean_zero_and_variance_one() {
    let graph = Graph::new(&Device::cpu());
    let n = 10_000;
    for dtype in [DType::F32, DType::F64] {
        let t = graph.rand_normal(&[n], 5, dtype).unwrap();
        let v = values(&t);
        assert!(v.iter().all(|x| x.is_finite()));
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        assert!(mean.abs() < 0.04, "{dtype}: mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "{dtype}: variance {var}");
        // Replays exactly; another seed differs.
        assert_eq!(v, values(&graph.rand_normal(&[n], 5, dtype).unwrap()));
        assert_ne!(v, values(&graph.rand_normal(&[n], 6, dtype).unwrap()));
    }
    // f32 and f64 draw the same numbers up to f32 rounding.
    let a = values(&graph.rand_normal(&[1000], 9, DType::F32).unwrap());
    let b = values(&graph.rand_normal(&[1000], 9, DType::F64).unwrap());
    assert_close(&a, &b, 1e-5);
}

// ----- MaxPool2d ties --------------------------------------------------------------

#[test]
fn max_pool_ties_send_the_gradient_to_the_first_maximum_in_row_major_window_order() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    // Windows (k2 s2) of [[1,5,0,0,7,7],[5,5,2,2,7,7]]:
    //   taps 1,5,5,5 → first max at (0,1); 0,0,2,2 → (1,2); 7,7,7,7 → (0,4).
    let x = graph.variable(&[1.0f64, 5.0, 0.0, 0.0, 7.0, 7.0, 5.0, 5.0, 2.0, 2.0, 7.0, 7.0], &[1, 1, 2, 6]).unwrap();
    let y = x.max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false).unwrap();
    assert_eq!(values(&y), vec![5.0, 2.0, 7.0]);
    y.mul(graph.tensor_from(&[10.0f64, 20.0, 30.0], &[1, 1, 1, 3]).unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    #[rustfmt::skip]
    let expected = vec![
        0.0, 10.0, 0.0, 0.0, 30.0, 0.0,
        0.0, 0.0, 20.0, 0.0, 0.0, 0.0,
    ];
    assert_eq!(common::grad_of(&x), expected);

    // Overlapping windows (k3 s1 p1 over a constant image): each window's
    // gradient goes to its first in-image tap; padding never wins, even
    // against negative values.
    let graph = Graph::new(&device);
    let x = graph.variable(&[-3.0f64; 9], &[1, 1, 3, 3]).unwrap();
    let y = x.max_pool2d([3, 3], [1, 1], [1, 1], [1, 1], false).unwrap();
    assert_eq!(values(&y), vec![-3.0; 9]);
    y.sum_all().unwrap().backward().unwrap();
    // First in-image tap of window (oy, ox) is (max(oy-1,0), max(ox-1,0)).
    assert_eq!(common::grad_of(&x), vec![4.0, 2.0, 0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0]);

    // The second-order rule (the gather in MaxPool2dBackward's gradient
    // argument) picks the same first maximum.
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&[1.0f64, 5.0, 0.0, 0.0, 7.0, 7.0, 5.0, 5.0, 2.0, 2.0, 7.0, 7.0], &[1, 1, 2, 6]).unwrap();
    let g = graph.variable(&[1.0f64, 1.0, 1.0], &[1, 1, 1, 3]).unwrap();
    let window = Window2d::new([2, 2], [2, 2], [0, 0], [1, 1]).unwrap();
    let back = x.max_pool2d_backward(g, window).unwrap();
    assert_eq!(values(&back), vec![0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
    let r: Vec<f64> = (0..12).map(|i| i as f64).collect();
    back.mul(graph.tensor_from(&r, &[1, 1, 2, 6]).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(common::grad_of(&g), vec![1.0, 8.0, 4.0]);
}

// ----- Convolutions ------------------------------------------------------------

fn set(p: &kiln::Param, values: &[f32]) {
    p.set_value(&HostData::F32(values.to_vec())).unwrap();
}

#[test]
fn conv2d_with_two_groups_equals_two_convolutions_on_the_channel_halves() {
    let device = Device::cpu();
    let options = ConvOptions { stride: [2, 1], padding: [1, 0], dilation: [1, 2], groups: 2, bias: true };
    let grouped = Conv2d::new(&device, 4, 6, [2, 3], options, 1).unwrap();
    let half = ConvOptions { groups: 1, ..options };
    let first = Conv2d::new(&device, 2, 3, [2, 3], half, 2).unwrap();
    let second = Conv2d::new(&device, 2, 3, [2, 3], half, 3).unwrap();
    let w = param_value(&grouped.weight).into_iter().map(|v| v as f32).collect::<Vec<_>>();
    let b = param_value(grouped.bias.as_ref().unwrap()).into_iter().map(|v| v as f32).collect::<Vec<_>>();
    let per_half = w.len() / 2; // weight [6, 2, 2, 3]: output channels 0..3 then 3..6
    set(&first.weight, &w[..per_half]);
    set(&second.weight, &w[per_half..]);
    set(first.bias.as_ref().unwrap(), &b[..3]);
    set(second.bias.as_ref().unwrap(), &b[3..]);

    let graph = Graph::new(&device);
    let x = graph.tensor_from(&random_f32(2 * 4 * 5 * 7, 4), &[2, 4, 5, 7]).unwrap();
    let y = grouped.forward(x).unwrap();
    assert_eq!(y.dims().as_slice(), [2, 6, 3, 3]);
    let a = first.forward(x.slice_axis(1, 0, 2, 1).unwrap()).unwrap();
    let c = second.forward(x.slice_axis(1, 2, 4, 1).unwrap()).unwrap();
    let both = Tensor::concat(&[a, c], 1).unwrap();
    assert_close(&values(&y), &values(&both), 1e-5);
}

#[test]
fn conv_transpose2d_is_the_adjoint_of_conv2d_with_shared_weights() {
    let device = Device::cpu();
    // Kernel [2,3], stride [2,1], padding [1,0], dilation [1,2]: a 5x7 image
    // convolves to 3x3, and 3x3 transposes back to 5x7 with output padding [1,0].
    let options = ConvOptions { stride: [2, 1], padding: [1, 0], dilation: [1, 2], groups: 1, bias: false };
    let conv = Conv2d::new(&device, 2, 3, [2, 3], options, 5).unwrap();
    let convt = ConvTranspose2d::new(&device, 3, 2, [2, 3], options, [1, 0], 6).unwrap();
    // Conv2d's weight is [out 3, in 2, 2, 3]; ConvTranspose2d's [in 3, out 2, 2, 3]: the same array.
    assert_eq!(conv.weight.dims(), convt.weight.dims());
    let w: Vec<f32> = param_value(&conv.weight).into_iter().map(|v| v as f32).collect();
    set(&convt.weight, &w);

    let graph = Graph::new(&device);
    let xv = random_f32(2 * 2 * 5 * 7, 7);
    let yv = random_f32(2 * 3 * 3 * 3, 8);
    let x = graph.tensor_from(&xv, &[2, 2, 5, 7]).unwrap();
    let y = graph.tensor_from(&yv, &[2, 3, 3, 3]).unwrap();
    let cx = conv.forward(x).unwrap();
    let ty = convt.forward(y).unwrap();
    assert_eq!(cx.dims().as_slice(), [2, 3, 3, 3]);
    assert_eq!(ty.dims().as_slice(), [2, 2, 5, 7]);
    let dot = |a: &[f64], b: &[f32]| a.iter().zip(b).map(|(a, b)| a * *b as f64).sum::<f64>();
    let (left, right) = (dot(&values(&cx), &yv), dot(&values(&ty), &xv));
    assert!((left - right).abs() <= 1e-4 * left.abs().max(1.0), "<conv(x), y> = {left} but <x, convT(y)> = {right}");
    assert!(left.abs() > 0.1, "a trivial inner product proves nothing: {left}");
}

// ----- errors ---------------------------------------------------------------------

/// The error is of `kind`, names `op`, and its message mentions every needle.
#[track_caller]
fn check(err: Error, kind: ErrorKind, op: &str, needles: &[&str]) {
    assert_eq!(err.kind(), kind, "{err}");
    assert_eq!(err.op(), op, "{err}");
    let text = err.to_string();
    assert!(text.contains(op), "the message names the op: {text}");
    for needle in needles {
        assert!(text.contains(needle), "the message should mention {needle:?}: {text}");
    }
}

/// The graph still builds and runs after the errors.
#[track_caller]
fn still_usable(graph: &Graph, conv: &Conv2d) {
    let x = graph.tensor_from(&[1.0f32; 2 * 3 * 4 * 4], &[2, 3, 4, 4]).unwrap();
    let y = conv.forward(x).unwrap();
    assert_eq!(y.dims().as_slice(), [2, 4, 2, 2]);
    let pooled = y.max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false).unwrap();
    assert_eq!(values(&pooled).len(), 8);
    pooled.sum_all().unwrap().backward().unwrap();
    assert!(conv.weight.has_grad());
    conv.zero_grad();
}

#[test]
fn bad_arguments_give_clear_errors_and_leave_the_graph_usable() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let conv = Conv2d::new(&device, 3, 4, [3, 3], ConvOptions::default(), 0).unwrap();
    let image = graph.tensor_from(&[0.5f32; 3 * 5 * 5], &[3, 5, 5]).unwrap(); // rank 3
    let two_channels = graph.tensor_from(&[0.5f32; 2 * 5 * 5], &[1, 2, 5, 5]).unwrap();
    let tiny = graph.tensor_from(&[0.5f32; 3 * 2 * 2], &[1, 3, 2, 2]).unwrap();

    // Wrong rank.
    check(conv.forward(image).unwrap_err(), ErrorKind::Shape, "Conv2d", &["[3, 5, 5]"]);
    check(
        image.im2col(Window2d::new([2, 2], [1, 1], [0, 0], [1, 1]).unwrap()).unwrap_err(),
        ErrorKind::Shape,
        "Im2Col",
        &["rank 4", "[3, 5, 5]"],
    );
    check(
        image.max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false).unwrap_err(),
        ErrorKind::Shape,
        "MaxPool2d",
        &["rank 4"],
    );
    // Channels mismatch.
    check(conv.forward(two_channels).unwrap_err(), ErrorKind::Shape, "Conv2d", &["3", "[1, 2, 5, 5]"]);
    // Kernel larger than the (padded) image.
    check(conv.forward(tiny).unwrap_err(), ErrorKind::Shape, "Conv2d", &["[3, 3]", "2x2"]);
    check(
        tiny.max_pool2d([3, 3], [1, 1], [1, 0], [1, 1], false).unwrap_err(),
        ErrorKind::Shape,
        "MaxPool2d",
        &["does not fit", "2x2"],
    );
    check(
        tiny.im2col(Window2d::new([2, 2], [1, 1], [0, 0], [2, 2]).unwrap()).unwrap_err(),
        ErrorKind::Shape,
        "Im2Col",
        &["does not fit"],
    );
    // Padding more than half the kernel for max pooling.
    check(
        two_channels.max_pool2d([2, 2], [2, 2], [2, 0], [1, 1], false).unwrap_err(),
        ErrorKind::InvalidArgument,
        "MaxPool2d",
        &["padding", "half the kernel"],
    );
    let layer = MaxPool2d { kernel: [3, 3], stride: [1, 1], padding: [1, 2], dilation: [1, 1], ceil_mode: false };
    check(layer.forward(two_channels).unwrap_err(), ErrorKind::InvalidArgument, "MaxPool2d", &["padding"]);
    // Zero stride, kernel or dilation.
    check(
        Window2d::new([2, 2], [0, 1], [0, 0], [1, 1]).unwrap_err(),
        ErrorKind::InvalidArgument,
        "Window2d",
        &["stride"],
    );
    // Groups that do not divide the channels.
    let groups = |g| ConvOptions { groups: g, ..ConvOptions::default() };
    let err = Conv2d::new(&device, 3, 4, [3, 3], groups(2), 0).err().expect("3 channels in 2 groups");
    check(err, ErrorKind::InvalidArgument, "Conv2d", &["groups 2"]);
    let err = Conv2d::new(&device, 4, 6, [3, 3], groups(4), 0).err().expect("6 output channels in 4 groups");
    check(err, ErrorKind::InvalidArgument, "Conv2d", &["groups 4"]);
    assert!(Conv2d::new(&device, 4, 4, [3, 3], groups(0), 0).is_err());
    // Dropout p outside [0, 1).
    for p in [1.0, 1.5, -0.1, f64::NAN] {
        let err = Dropout::new(p, 0).err().unwrap_or_else(|| panic!("Dropout p = {p} accepted"));
        check(err, ErrorKind::InvalidArgument, "Dropout", &["[0, 1)"]);
    }
    assert!(Dropout::new(0.0, 0).is_ok());
    // Embedding wants integer indices.
    let emb = Embedding::new(&device, 4, 2, 0).unwrap();
    check(
        emb.forward(graph.tensor_from(&[1.0f32], &[1]).unwrap()).unwrap_err(),
        ErrorKind::DType,
        "Embedding",
        &["i32"],
    );
    // Random tensors must be float.
    check(graph.rand_uniform(&[3], 0, DType::I32).unwrap_err(), ErrorKind::DType, "RandUniform", &["i32"]);

    still_usable(&graph, &conv);
}
