//! Issue 11's composed ops and layers: masks, masked softmax, split/chunk,
//! the new activations and norms, scaled-dot-product attention,
//! MultiheadAttention, the transformer block and the KV cache — first and
//! second order against finite differences, values against host
//! references, bad input against clear errors at the caller's line.

mod common;

use common::cases::{case, rand, run_all, Suite, CPU_CAP};
use common::{assert_close, values};
use kiln::gradcheck::CheckInput;
use kiln::nn::{
    scaled_dot_product_attention, AttentionDropout, BatchNorm1d, GroupNorm, KvCache, LeakyReLU, Mish,
    MultiheadAttention, RMSNorm, Softplus, TransformerBlock, ELU,
};
use kiln::prelude::*;
use kiln::{Error, ErrorKind};

#[test]
fn composed_ops_pass_first_and_second_order_checks() {
    // Inputs avoid the kinks at 0 of leaky_relu/elu.
    let away_from_zero = CheckInput::new(vec![-1.3, -0.4, 0.3, 0.9, 1.7, -2.1], &[2, 3]);
    run_all(
        &Suite::cpu(CPU_CAP),
        vec![
            case("tril", vec![rand(&[3, 4], -1.0, 1.0, 1)], |_, x| x[0].tril(0)),
            case("tril(-1) batched", vec![rand(&[2, 3, 3], -1.0, 1.0, 2)], |_, x| x[0].tril(-1)?.exp()),
            case("triu(1)", vec![rand(&[3, 4], -1.0, 1.0, 3)], |_, x| x[0].triu(1)?.square()),
            case("masked_fill", vec![rand(&[2, 3], -1.0, 1.0, 4)], |g, x| {
                let m = g.tensor_from(&[true, false, true], &[3])?;
                x[0].masked_fill(m, -5.0)?.exp()
            }),
            case("masked_softmax with a fully masked row", vec![rand(&[3, 4], -2.0, 2.0, 5)], |g, x| {
                let keep = g.tensor_from(
                    &[true, false, true, true, false, false, false, false, true, true, true, true],
                    &[3, 4],
                )?;
                x[0].masked_softmax(Some(keep), -1)
            }),
            case("softmax (no mask)", vec![rand(&[2, 3], -2.0, 2.0, 6)], |_, x| x[0].masked_softmax(None, -1)),
            case("causal_softmax", vec![rand(&[2, 3, 4], -2.0, 2.0, 12)], |_, x| x[0].causal_softmax(0)),
            case("causal_softmax diagonal -2 (empty rows), squared", vec![rand(&[4, 3], -2.0, 2.0, 13)], |_, x| {
                x[0].causal_softmax(-2)?.square()
            }),
            case("causal_softmax diagonal 1, times x", vec![rand(&[3, 4], -2.0, 2.0, 14)], |_, x| {
                x[0].causal_softmax(1)?.mul(x[0])
            }),
            case("split/chunk", vec![rand(&[2, 5], -1.0, 1.0, 7)], |_, x| {
                let parts = x[0].split(&[2, 3], 1)?;
                let chunks = x[0].chunk(2, 1)?;
                parts[0].sum_all()?.mul(parts[1].square()?.sum_all()?)?.add(chunks[1].exp()?.sum_all()?)
            }),
            case("leaky_relu", vec![away_from_zero.clone()], |_, x| x[0].leaky_relu(0.1)?.square()),
            case("elu", vec![away_from_zero.clone()], |_, x| x[0].elu(1.3)),
            case("softplus", vec![rand(&[2, 3], -3.0, 3.0, 8)], |_, x| x[0].softplus(1.0)),
            case("softplus beta 2 at 0", vec![CheckInput::new(vec![0.0, -0.5, 0.7], &[3])], |_, x| x[0].softplus(2.0)),
            case("mish", vec![rand(&[2, 3], -3.0, 3.0, 9)], |_, x| x[0].mish()),
            case("rms_norm", vec![rand(&[2, 4], -1.0, 1.0, 10)], |_, x| x[0].rms_norm(1, 1e-5)),
            case("group_norm", vec![rand(&[2, 4, 3], -1.0, 1.0, 11)], |_, x| x[0].group_norm(2, 1e-5)),
        ],
    );
}

#[test]
fn attention_passes_first_and_second_order_checks() {
    let qkv =
        || vec![rand(&[1, 3, 2], -1.0, 1.0, 20), rand(&[1, 4, 2], -1.0, 1.0, 21), rand(&[1, 4, 2], -1.0, 1.0, 22)];
    run_all(
        &Suite::cpu(CPU_CAP),
        vec![
            case("sdpa", qkv(), |_, x| scaled_dot_product_attention(x[0], x[1], x[2], None, false, None, None)),
            case("sdpa causal", qkv(), |_, x| {
                scaled_dot_product_attention(x[0], x[1], x[2], None, true, None, Some(0.7))
            }),
            case("sdpa bool mask with a fully masked row", qkv(), |g, x| {
                let keep: Vec<bool> =
                    vec![true, true, false, true, false, false, false, false, true, false, true, true];
                let mask = g.tensor_from(&keep, &[3, 4])?;
                scaled_dot_product_attention(x[0], x[1], x[2], Some(mask), false, None, None)
            }),
            case("sdpa float mask + causal", qkv(), |g, x| {
                let add: Vec<f64> = vec![0.0, -1.0, 0.5, f64::NEG_INFINITY, 0.0, 0.0, 0.2, 0.0, 1.0, 0.0, 0.0, 0.0];
                let mask = g.tensor_from(&add, &[3, 4])?;
                scaled_dot_product_attention(x[0], x[1], x[2], Some(mask), true, None, None)
            }),
            case("sdpa bool mask + causal", qkv(), |g, x| {
                let keep: Vec<bool> = vec![true, false, true, true, false, false, true, true, true, true, false, true];
                let mask = g.tensor_from(&keep, &[3, 4])?;
                scaled_dot_product_attention(x[0], x[1], x[2], Some(mask), true, None, None)
            }),
            case("sdpa dropout (fixed seed)", qkv(), |_, x| {
                let d = AttentionDropout { p: 0.3, seed: 9 };
                scaled_dot_product_attention(x[0], x[1], x[2], None, false, Some(d), None)
            }),
        ],
    );
}

/// softmax(q kᵀ / √d) v on the host, one batch, with a keep mask.
fn reference_attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    l: usize,
    s: usize,
    d: usize,
    keep: &dyn Fn(usize, usize) -> bool,
) -> Vec<f64> {
    let mut out = vec![0.0; l * d];
    for i in 0..l {
        let scores: Vec<f64> = (0..s)
            .map(|j| {
                let dot: f64 = (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum();
                if keep(i, j) {
                    dot / (d as f64).sqrt()
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
        let total: f64 = e.iter().sum();
        for j in 0..s {
            for c in 0..d {
                out[i * d + c] += e[j] / total * v[j * d + c];
            }
        }
    }
    out
}

#[test]
fn attention_matches_a_host_reference_and_masked_rows_are_zero_not_nan() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let (l, s, d) = (3, 4, 2);
    let q = rand(&[l, d], -1.0, 1.0, 1).values;
    let k = rand(&[s, d], -1.0, 1.0, 2).values;
    let v = rand(&[s, d], -1.0, 1.0, 3).values;
    let qt = graph.variable(&q, &[l, d]).unwrap();
    let kt = graph.variable(&k, &[s, d]).unwrap();
    let vt = graph.variable(&v, &[s, d]).unwrap();
    let causal = scaled_dot_product_attention(qt, kt, vt, None, true, None, None).unwrap();
    assert_close(&values(&causal), &reference_attention(&q, &k, &v, l, s, d, &|i, j| j <= i), 1e-12);
    // Row 1 sees nothing: zeros, and a finite gradient.
    let keep = [true, false, true, false, false, false, false, false, true, true, true, true];
    let mask = graph.tensor_from(&keep, &[l, s]).unwrap();
    let masked = scaled_dot_product_attention(qt, kt, vt, Some(mask), false, None, None).unwrap();
    let out = values(&masked);
    assert_close(&out, &reference_attention(&q, &k, &v, l, s, d, &|i, j| keep[i * s + j]), 1e-12);
    assert_eq!(&out[2..4], &[0.0, 0.0]);
    masked.sum_all().unwrap().backward().unwrap();
    assert!(common::grad_of(&qt).iter().chain(common::grad_of(&kt).iter()).all(|g| g.is_finite()));
}

/// The fused CausalSoftmax primitive against its composed reference
/// (`masked_softmax` with a `tril_mask`), f32 and f64, for diagonals that
/// keep nothing, part and everything, with -inf scores; fully masked rows
/// are zeros with a zero (not NaN) gradient; the causal attention records
/// the primitive and no mask tensor.
#[test]
fn causal_softmax_matches_the_composed_reference() {
    let device = Device::cpu();
    for dtype in [DType::F32, DType::F64] {
        for (dims, diagonal) in
            [([2usize, 3, 4], 0i64), ([1, 5, 3], -2), ([2, 2, 6], 3), ([1, 3, 3], 7), ([1, 2, 3], -9)]
        {
            let graph = Graph::new(&device);
            let n: usize = dims.iter().product();
            let mut x = rand(&dims, -4.0, 4.0, 30 + n as u64).values;
            x[1] = f64::NEG_INFINITY;
            let xv = graph.variable(&x, &dims).unwrap().cast(dtype).unwrap();
            let fused = xv.causal_softmax(diagonal).unwrap();
            let keep = graph.tril_mask(dims[1], dims[2], diagonal).unwrap();
            let composed = xv.masked_softmax(Some(keep), -1).unwrap();
            let (a, b) = (values(&fused), values(&composed));
            let tol = if dtype == DType::F32 { 1e-6 } else { 1e-14 };
            assert_close(&a, &b, tol);
            assert!(a.iter().all(|v| v.is_finite()), "{dims:?} {diagonal}: {a:?}");
            // Rows that keep nothing are exactly zero.
            for (r, row) in a.chunks(dims[2]).enumerate() {
                let kept = (r % dims[1]) as i64 + diagonal + 1;
                if kept <= 0 {
                    assert!(row.iter().all(|&v| v == 0.0), "row {r}: {row:?}");
                }
            }
            let w = graph.tensor_from(&rand(&dims, -1.0, 1.0, 99).values, &dims).unwrap().cast(dtype).unwrap();
            let grads = graph.grad(fused.mul(w).unwrap().sum_all().unwrap(), &[xv], None).unwrap();
            let reference = graph.grad(composed.mul(w).unwrap().sum_all().unwrap(), &[xv], None).unwrap();
            let (ga, gb) = (values(&grads[0]), values(&reference[0]));
            assert!(ga.iter().all(|v| v.is_finite()), "{ga:?}");
            assert_close(&ga, &gb, tol * 10.0);
        }
    }
    // A row whose kept scores are all -inf is zeros, not NaN.
    let graph = Graph::new(&device);
    let inf = f64::NEG_INFINITY;
    let x = graph.variable(&[inf, inf, 1.0, 0.5, inf, 2.0], &[2, 3]).unwrap();
    assert_eq!(values(&x.causal_softmax(1).unwrap())[..3], [0.0, 0.0, 0.0]);
    // The causal attention path is the fused primitive: no mask tensor.
    let graph = Graph::new(&device);
    let q = graph.variable(&rand(&[1, 3, 2], -1.0, 1.0, 5).values, &[1, 3, 2]).unwrap();
    scaled_dot_product_attention(q, q, q, None, true, None, None).unwrap();
    assert_eq!(graph.count_ops("CausalSoftmax"), 1);
    for mask_op in ["Arange", "LessEqual", "Where"] {
        assert_eq!(graph.count_ops(mask_op), 0, "the causal path built a mask ({mask_op})");
    }
    // Bad input: a clear error.
    let e = graph.variable(&[1.0, 2.0], &[2]).unwrap().causal_softmax(0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Shape, "{e}");
}

#[test]
fn multihead_attention_has_pytorch_names_and_matches_single_head_math() {
    let device = Device::cpu();
    let mha = MultiheadAttention::new(&device, 4, 2, true, 7).unwrap().causal(true);
    let names: Vec<(String, Vec<usize>)> =
        mha.named_parameters().into_iter().map(|(n, p)| (n, p.dims().to_vec())).collect();
    assert_eq!(
        names,
        vec![
            ("in_proj_weight".to_string(), vec![12, 4]),
            ("in_proj_bias".to_string(), vec![12]),
            ("out_proj.weight".to_string(), vec![4, 4]),
            ("out_proj.bias".to_string(), vec![4]),
        ]
    );
    // Self-attention through `forward` equals `attend(x, x, x, causal)` and
    // a head-by-head host computation.
    let graph = Graph::new(&device);
    let xs = rand(&[1, 3, 4], -1.0, 1.0, 4).values;
    let x32: Vec<f32> = xs.iter().map(|&v| v as f32).collect();
    let x = graph.tensor_from(&x32, &[1, 3, 4]).unwrap();
    let y = values(&mha.forward(x).unwrap());
    let y2 = values(&mha.attend(x, x, x, None, true).unwrap());
    assert_close(&y, &y2, 1e-6);
    let w = common::param_value(&mha.in_proj_weight);
    let b = common::param_value(mha.in_proj_bias.as_ref().unwrap());
    let wo = common::param_value(&mha.out_proj.weight);
    let bo = common::param_value(mha.out_proj.bias.as_ref().unwrap());
    let project = |row0: usize| -> Vec<f64> {
        // [3, 4] positions × features → rows row0..row0+4 of W.
        (0..3)
            .flat_map(|t| (0..4).map(move |o| (t, o)))
            .map(|(t, o)| b[row0 + o] + (0..4).map(|i| w[(row0 + o) * 4 + i] * xs[t * 4 + i]).sum::<f64>())
            .collect()
    };
    let (q, k, v) = (project(0), project(4), project(8));
    let mut merged = vec![0.0; 12];
    for h in 0..2 {
        let pick = |m: &Vec<f64>| -> Vec<f64> {
            (0..3).flat_map(|t| (0..2).map(move |c| (t, c))).map(|(t, c)| m[t * 4 + h * 2 + c]).collect()
        };
        let o = reference_attention(&pick(&q), &pick(&k), &pick(&v), 3, 3, 2, &|i, j| j <= i);
        for t in 0..3 {
            for c in 0..2 {
                merged[t * 4 + h * 2 + c] = o[t * 2 + c];
            }
        }
    }
    let expected: Vec<f64> = (0..3)
        .flat_map(|t| (0..4).map(move |o| (t, o)))
        .map(|(t, o)| bo[o] + (0..4).map(|i| wo[o * 4 + i] * merged[t * 4 + i]).sum::<f64>())
        .collect();
    assert_close(&y, &expected, 1e-5);
}

#[test]
fn the_kv_cache_gives_the_same_outputs_as_the_full_causal_forward() {
    let device = Device::cpu();
    let block = TransformerBlock::new(&device, 8, 2, 16, 0.0, 3).unwrap();
    let xs: Vec<f32> = rand(&[1, 5, 8], -1.0, 1.0, 5).values.iter().map(|&v| v as f32).collect();
    let graph = Graph::new(&device);
    let full = values(&block.forward(graph.tensor_from(&xs, &[1, 5, 8]).unwrap()).unwrap());
    let cache = KvCache::new(&device, 1, 1, 2, 4, 8).unwrap();
    let mut incremental = Vec::new();
    // Two positions at once, then one at a time.
    for (start, end) in [(0, 2), (2, 3), (3, 4), (4, 5)] {
        let mut graph = Graph::new(&device);
        graph.reset();
        let x = graph.tensor_from(&xs[start * 8..end * 8], &[1, end - start, 8]).unwrap();
        incremental.extend(values(&block.forward_cached(x, cache.layer(0).unwrap()).unwrap()));
        cache.advance(end - start).unwrap();
    }
    assert_close(&incremental, &full, 1e-5);
    assert_eq!(cache.len(), 5);
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&xs[..32], &[1, 4, 8]).unwrap();
    let err = block.forward_cached(x, cache.layer(0).unwrap()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfRange, "{err}");
    cache.reset().unwrap();
    assert!(cache.is_empty());
}

#[test]
fn new_layers_run_and_keep_pytorch_names() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&[-1.0f32, 0.5, 2.0, -0.25, 0.0, 1.0], &[2, 3]).unwrap();
    assert_close(&values(&LeakyReLU::new(0.1).unwrap().forward(x).unwrap()), &[-0.1, 0.5, 2.0, -0.025, 0.0, 1.0], 1e-6);
    let elu = values(&ELU::new(1.0).unwrap().forward(x).unwrap());
    assert_close(&elu, &[(-1f64).exp_m1(), 0.5, 2.0, (-0.25f64).exp_m1(), 0.0, 1.0], 1e-6);
    let sp = values(&Softplus::new(1.0).unwrap().forward(x).unwrap());
    let expected: Vec<f64> = [-1.0f64, 0.5, 2.0, -0.25, 0.0, 1.0].iter().map(|v| v.exp().ln_1p()).collect();
    assert_close(&sp, &expected, 1e-6);
    let mish = values(&Mish.forward(x).unwrap());
    let expected: Vec<f64> = [-1.0f64, 0.5, 2.0, -0.25, 0.0, 1.0].iter().map(|v| v * v.exp().ln_1p().tanh()).collect();
    assert_close(&mish, &expected, 1e-6);
    // Large inputs neither overflow nor lose the gradient.
    let big = graph.variable(&[100.0f32, -100.0], &[2]).unwrap();
    assert_close(&values(&big.softplus(1.0).unwrap()), &[100.0, 0.0], 1e-6);
    big.softplus(1.0).unwrap().sum_all().unwrap().backward().unwrap();
    assert_close(&common::grad_of(&big), &[1.0, 0.0], 1e-6);

    let rms = RMSNorm::new(&device, &[3], 1e-6).unwrap();
    let r = values(&rms.forward(x).unwrap());
    let row = [-1.0f64, 0.5, 2.0];
    let scale = (row.iter().map(|v| v * v).sum::<f64>() / 3.0 + 1e-6).sqrt();
    assert_close(&r[..3], &row.iter().map(|v| v / scale).collect::<Vec<_>>(), 1e-5);
    assert_eq!(rms.named_parameters()[0].0, "weight");

    let gn = GroupNorm::new(&device, 1, 3, 1e-5).unwrap();
    let g = values(&gn.forward(x.reshape_to(&[2, 3, 1]).unwrap()).unwrap());
    assert!(g[..3].iter().sum::<f64>().abs() < 1e-5, "{g:?}");
    assert_eq!(gn.parameters().len(), 2);

    let bn = BatchNorm1d::new(&device, 3, 1e-5, 0.1).unwrap();
    let b = values(&bn.forward(x).unwrap());
    for c in 0..3 {
        assert!((b[c] + b[3 + c]).abs() < 1e-5, "each channel is centred over the batch: {b:?}");
    }
    assert_eq!(bn.named_buffers().iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["running_mean", "running_var"]);
    let x3 = graph.tensor_from(&[1.0f32; 12], &[2, 3, 2]).unwrap();
    assert_eq!(bn.forward(x3).unwrap().dims().as_slice(), &[2, 3, 2]);

    let block = TransformerBlock::new(&device, 8, 2, 32, 0.1, 1).unwrap();
    let names: Vec<String> = block.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names[..4],
        ["self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias"]
    );
    assert!(names.contains(&"linear1.weight".to_string()) && names.contains(&"norm2.bias".to_string()));
}

/// The error is of `kind` and points at this file.
#[track_caller]
fn at_caller<T>(result: Result<T>, kind: ErrorKind) -> Error {
    let err = match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), kind, "{err}");
    assert_eq!(err.location().file(), file!(), "the error points at the caller: {err}");
    err
}

#[test]
fn bad_input_gives_clear_errors_at_the_callers_line() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.zeros(&[2, 3], DType::F32).unwrap();
    let v = graph.zeros(&[3], DType::F32).unwrap();
    at_caller(v.tril(0), ErrorKind::Shape);
    at_caller(x.masked_fill(x, 1.0), ErrorKind::DType);
    let wrong = graph.tensor_from(&[true, false], &[2]).unwrap();
    at_caller(x.masked_fill(wrong, 1.0), ErrorKind::Shape);
    let e = at_caller(x.split(&[1, 1], 1), ErrorKind::Shape);
    assert!(e.message().contains("add up to 2"), "{e}");
    at_caller(x.chunk(0, 0), ErrorKind::InvalidArgument);
    at_caller(x.softplus(-1.0), ErrorKind::InvalidArgument);
    at_caller(x.rms_norm(3, 1e-5), ErrorKind::InvalidArgument);
    at_caller(x.group_norm(2, 1e-5), ErrorKind::InvalidArgument);
    let q = graph.zeros(&[2, 4], DType::F32).unwrap();
    let k = graph.zeros(&[3, 5], DType::F32).unwrap();
    let e = at_caller(scaled_dot_product_attention(q, k, k, None, true, None, None), ErrorKind::Shape);
    assert!(e.message().contains("[2, 4]") && e.message().contains("[3, 5]"), "{e}");
    let k = graph.zeros(&[3, 4], DType::F32).unwrap();
    let bad_mask = graph.tensor_from(&[true; 5], &[5]).unwrap();
    at_caller(scaled_dot_product_attention(q, k, k, Some(bad_mask), false, None, None), ErrorKind::Shape);
    let bad_p = Some(AttentionDropout { p: 1.5, seed: 0 });
    at_caller(scaled_dot_product_attention(q, k, k, None, false, bad_p, None), ErrorKind::InvalidArgument);
    at_caller(MultiheadAttention::new(&device, 6, 4, true, 0), ErrorKind::InvalidArgument);
    let mha = MultiheadAttention::new(&device, 4, 2, true, 0).unwrap();
    let e = at_caller(mha.forward(q), ErrorKind::Shape);
    assert!(e.message().contains("[N, L, 4]"), "{e}");
    at_caller(RMSNorm::new(&device, &[], 1e-5), ErrorKind::InvalidArgument);
    at_caller(GroupNorm::new(&device, 4, 6, 1e-5), ErrorKind::InvalidArgument);
    let bn = BatchNorm1d::new(&device, 4, 1e-5, 0.1).unwrap();
    at_caller(bn.forward(x), ErrorKind::Shape);
    at_caller(LeakyReLU::new(f64::NAN), ErrorKind::InvalidArgument);
    at_caller(KvCache::new(&device, 1, 1, 2, 2, 4).unwrap().layer(3), ErrorKind::OutOfRange);
}
