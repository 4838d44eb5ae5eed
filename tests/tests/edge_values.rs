//! Values and gradients at the edges of the f32 range, on the CPU and on
//! Vulkan: where a naive composition loses everything (log(1 + tiny) = 0,
//! exp(x) − 1 = 0 for tiny x, b² overflowing, 0 · log 0 = NaN) kiln gives
//! the exact value, and its gradients are finite where PyTorch's are. Found
//! by a sweep of every element-wise op against PyTorch 2.15 at edge values;
//! the expected numbers here are the exact values (computed in f64).

mod common;

use common::{grad_of, values};
use kiln::prelude::*;

/// Relative error within `tol`, or both the same infinity, or both zero.
fn assert_rel(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_infinite() || w == 0.0 { g == w } else { ((g - w) / w).abs() <= tol };
        assert!(ok, "{what}[{i}]: got {g:e}, want {w:e} (all: {got:?})");
    }
}

/// softplus(x) = log(1 + e^x), exactly enough in f64.
fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

fn f32s(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

const BIG: f64 = f32::MAX as f64;

/// Softplus: log1p, not log(1 + ·), for the small values; no overflow of
/// beta·x for the largest ones. Mish inherits it.
fn softplus_and_mish(device: &Device, tol: f64) {
    let graph = Graph::new(device);
    let xs = [-20.0, -30.0, -87.0, 0.0, 20.0, BIG];
    let x = graph.tensor_from(&f32s(&xs), &[6]).unwrap();
    let want: Vec<f64> = xs.iter().map(|&v| softplus(v)).collect();
    assert_rel("softplus", &values(&x.softplus(1.0).unwrap()), &want, tol);
    let x2 = graph.tensor_from(&f32s(&[-10.0, BIG]), &[2]).unwrap();
    assert_rel("softplus beta 2", &values(&x2.softplus(2.0).unwrap()), &[softplus(-20.0) / 2.0, BIG], tol);
    // x · tanh(softplus(x)) at −20 is ≈ −20 · 2.06e-9 (tanh of a tiny value).
    let m = graph.tensor_from(&[-20.0f32], &[1]).unwrap().mish().unwrap();
    assert_rel("mish", &values(&m), &[-20.0 * softplus(-20.0).tanh()], tol);
}

/// ELU: expm1, not exp − 1; and its gradient e^x stays exact far out.
fn elu(device: &Device, tol: f64) {
    let graph = Graph::new(device);
    let xs = [-1e-8, -1e-3, -20.0];
    let x = graph.variable(&f32s(&xs), &[3]).unwrap();
    let y = x.elu(1.0).unwrap();
    let want: Vec<f64> = xs.iter().map(|&v: &f64| (v as f32 as f64).exp_m1()).collect();
    assert_rel("elu", &values(&y), &want, tol);
    y.sum_all().unwrap().backward().unwrap();
    let want: Vec<f64> = xs.iter().map(|&v: &f64| (v as f32 as f64).exp()).collect();
    assert_rel("elu gradient", &grad_of(&x), &want, tol);
}

/// Expm1's gradient is e^x, not y + 1 (which is 0 at −20 in f32).
fn expm1_gradient(device: &Device, tol: f64) {
    let graph = Graph::new(device);
    let x = graph.variable(&[-20.0f32, -5.0, 3.0], &[3]).unwrap();
    x.expm1().unwrap().sum_all().unwrap().backward().unwrap();
    assert_rel("expm1 gradient", &grad_of(&x), &[(-20f64).exp(), (-5f64).exp(), 3f64.exp()], tol);
}

/// GELU of the largest float is itself, not inf; log near 1 and tanh of a
/// tiny value keep their digits.
fn gelu_and_tanh(device: &Device, tol: f64) {
    let graph = Graph::new(device);
    let y = graph.tensor_from(&f32s(&[BIG, -BIG, 1.0]), &[3]).unwrap().gelu().unwrap();
    assert_rel("gelu", &values(&y), &[BIG, 0.0, 0.841_344_746_068_543], tol);
    // Log near 1 (Vulkan lets the builtin be off by 2^-21 absolute there).
    let xs = [1.0 - 2f64.powi(-23), 1.0 + 2f64.powi(-22), 0.5, 3.0, 1e-30];
    let y = graph.tensor_from(&f32s(&xs), &[5]).unwrap().log().unwrap();
    let want: Vec<f64> = xs.iter().map(|&v: &f64| (v as f32 as f64).ln()).collect();
    assert_rel("log", &values(&y), &want, tol);
    let xs = [2e-9, -3e-6, 0.01, 0.3, -2.0];
    let y = graph.tensor_from(&f32s(&xs), &[5]).unwrap().tanh().unwrap();
    let want: Vec<f64> = xs.iter().map(|&v: &f64| (v as f32 as f64).tanh()).collect();
    assert_rel("tanh", &values(&y), &want, tol);
}

/// Div's gradient for the divisor: −g·(a/b)/b, finite where b² is not.
fn div_gradient(device: &Device, tol: f64) {
    let graph = Graph::new(device);
    let a = graph.variable(&f32s(&[1e30, 0.0, 6.0]), &[3]).unwrap();
    let b = graph.variable(&f32s(&[1e30, 1e-30, 3.0]), &[3]).unwrap();
    a.div(b).unwrap().sum_all().unwrap().backward().unwrap();
    assert_rel("div gradient of a", &grad_of(&a), &[1e-30, 1e30, 1.0 / 3.0], tol);
    assert_rel("div gradient of b", &grad_of(&b), &[-1e-30, 0.0, -6.0 / 9.0], tol);
}

/// Pow: zero exponents and zero bases give zero gradients where the
/// formula would be 0 · inf or 0 · log 0 (as PyTorch); 0^0.5 has the
/// infinite slope it really has.
fn pow_gradient(device: &Device, tol: f64) {
    let graph = Graph::new(device);
    let a = graph.variable(&[0.0f32, 0.0, 2.0, 0.0], &[4]).unwrap();
    let b = graph.variable(&[0.0f32, 2.0, 3.0, 0.5], &[4]).unwrap();
    a.pow(b).unwrap().sum_all().unwrap().backward().unwrap();
    assert_rel("pow gradient of the base", &grad_of(&a), &[0.0, 0.0, 12.0, f64::INFINITY], tol);
    assert_rel("pow gradient of the exponent", &grad_of(&b), &[0.0, 0.0, 8.0 * std::f64::consts::LN_2, 0.0], tol);
}

fn check(device: &Device, tol: f64) {
    softplus_and_mish(device, tol);
    elu(device, tol);
    expm1_gradient(device, tol);
    gelu_and_tanh(device, tol);
    div_gradient(device, tol);
    pow_gradient(device, tol);
}

#[test]
fn cpu_edge_values() {
    check(&Device::cpu(), 2e-6);
}

#[test]
fn vulkan_edge_values() {
    let Some(device) = common::vulkan_device("edge_values") else { return };
    check(&device, 2e-5);
}
