//! Gradients computed THROUGH wgpu, in f32, against central finite
//! differences computed in f64 on the CPU (`kiln::gradcheck::gradcheck_on`),
//! for one representative of each op family, and second order
//! (`gradgradcheck_on`) for a few. `wgpu_parity.rs` compares wgpu with the
//! CPU's own gradient rules; this checks the numbers wgpu produces against
//! the derivative itself, so a rule that is wrong in the same way on both
//! backends, or a kernel only the backward graph uses, cannot hide.
//!
//! Needs a Vulkan adapter (Mesa's lavapipe on CI); see
//! `common::vulkan_device`: with `CI` set a missing adapter fails.
//!
//! Tolerances: an element passes when
//! |numeric − analytic| ≤ ATOL + RTOL·|analytic|, with
//! - EPS = 1e-6 for the numeric side. It runs entirely in f64 on the CPU, so
//!   its rounding error is ~1e-16·|s| / EPS ≈ 1e-10 and its truncation
//!   error ~EPS²·|f'''| ≈ 1e-12; a small step also keeps it from crossing
//!   the kinks of Max/Maximum between nearby values. A larger step would
//!   only add truncation error.
//! - RTOL = 1e-3, ATOL = 1e-4 for the analytic side, which is f32 on the
//!   GPU: the inputs are rounded to f32 (relative 6e-8), each op adds a few
//!   ulps (GPU exp/log/pow are not correctly rounded: up to ~2e-5 relative,
//!   see wgpu_parity.rs), and reductions and matmuls sum in a different
//!   order. A backward graph chains several of these, so its gradients
//!   carry ~1e-5 relative error; RTOL leaves a factor of ~100 on that. ATOL
//!   covers gradients that are near zero through cancellation (softmax and
//!   layer-norm gradients sum to zero along a row), where the f32 error is
//!   absolute, ~1e-6 × the magnitude of the terms. A wrong rule (a missing
//!   factor, a sign, a wrong broadcast axis) is off by O(1), far outside
//!   both; `the_harness_detects_a_wrong_gradient_on_wgpu` checks that these
//!   tolerances still fail one.
//!
//! Shapes are tiny (≤ 30 elements per case): lavapipe is slow and each
//! pipeline compiles on first use.

mod common;

use common::cases::{away_from_zero, case, given, rand, run_all, BoxedFn, Suite, WGPU_CAP};
use kiln::gradcheck::{gradcheck_on, gradgradcheck_on, GradcheckOptions};
use kiln::nn::cross_entropy;
use kiln::{DType, Device, Graph, HostData, Result, SliceSpec, Tensor};

const EPS: f64 = 1e-6;
const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-4;

fn options() -> GradcheckOptions {
    GradcheckOptions { eps: EPS, atol: ATOL, rtol: RTOL, ..GradcheckOptions::default() }
}

/// A float constant in `dtype`: the same function runs in f32 on wgpu
/// (analytic side) and in f64 on the CPU (numeric side).
fn constant<'g>(g: &'g Graph, values: &[f64], dims: &[usize], dtype: DType) -> Result<Tensor<'g>> {
    let data = match dtype {
        DType::F32 => HostData::F32(values.iter().map(|&v| v as f32).collect()),
        _ => HostData::F64(values.to_vec()),
    };
    g.from_host(data, dims)
}

#[test]
fn the_harness_detects_a_wrong_gradient_on_wgpu() {
    // detach(x)·x: analytic gradient x, true gradient 2x. Off by a factor
    // of two, like a typical broken rule; the f32 tolerances must catch it.
    let Some(wg) = common::vulkan_device("the wgpu gradcheck") else { return };
    let cpu = Device::cpu();
    let wrong: BoxedFn = Box::new(|_, x| x[0].detach()?.mul(x[0]));
    let inputs = [rand(&[3], 0.5, 2.0, 1)];
    let report = gradcheck_on(&cpu, &wg, DType::F32, &*wrong, &inputs, options()).unwrap();
    assert!(!report.passed(), "{report}");
    let report = gradgradcheck_on(&cpu, &wg, DType::F32, &*wrong, &inputs, options()).unwrap();
    assert!(!report.passed(), "{report}");
    let right: BoxedFn = Box::new(|_, x| x[0].mul(x[0]));
    let report = gradcheck_on(&cpu, &wg, DType::F32, &*right, &inputs, options()).unwrap();
    assert!(report.passed(), "{report}");
}

#[test]
fn unary_and_binary_with_broadcasting() {
    let Some(wg) = common::vulkan_device("the wgpu gradcheck") else { return };
    let d = [2, 3];
    let cond = [true, false, false, true, true, false];
    let cases = vec![
        case("tanh", vec![rand(&d, -2.0, 2.0, 1)], |_, x| x[0].tanh()),
        case("exp", vec![rand(&d, -2.0, 2.0, 2)], |_, x| x[0].exp()).first_order_only(),
        case("log", vec![rand(&d, 0.5, 2.0, 3)], |_, x| x[0].log()),
        case("sigmoid", vec![rand(&d, -3.0, 3.0, 4)], |_, x| x[0].sigmoid()).first_order_only(),
        case("erf", vec![rand(&d, -2.0, 2.0, 5)], |_, x| x[0].erf()).first_order_only(),
        case("mul [2,3]x[3]", vec![rand(&d, -2.0, 2.0, 6), rand(&[3], -2.0, 2.0, 7)], |_, x| x[0].mul(x[1])),
        case("div [2,3]/[2,1]", vec![rand(&d, -2.0, 2.0, 8), away_from_zero(&[2, 1], 0.5, 2.0, 9)], |_, x| {
            x[0].div(x[1])
        }),
        // Positive base; the exponent broadcasts along rows.
        case("pow [2,3]^[1,3]", vec![rand(&d, 0.5, 2.0, 10), rand(&[1, 3], -1.5, 1.5, 11)], |_, x| x[0].pow(x[1])),
        // Hand-picked: no pair that meets under broadcasting is within 0.1.
        case(
            "maximum [2,3] vs [3]",
            vec![given(&[0.1, 1.5, -0.7, 2.0, -1.2, 0.4], &d), given(&[0.9, -0.3, 0.2], &[3])],
            |_, x| x[0].maximum(x[1]),
        )
        .first_order_only(),
        // The condition is a constant; the false branch broadcasts.
        case("where cond[2,3] a[2,3] b[3]", vec![rand(&d, -2.0, 2.0, 12), rand(&[3], -2.0, 2.0, 13)], move |g, x| {
            g.tensor_from(&cond, &[2, 3])?.where_(x[0], x[1])?.mul(x[0])
        }),
    ];
    run_all(&Suite::on(&wg, options(), WGPU_CAP), cases);
}

#[test]
fn reductions_and_matmul() {
    let Some(wg) = common::vulkan_device("the wgpu gradcheck") else { return };
    let d = [2, 3, 4];
    let cases = vec![
        case("sum axes 0,2 keepdim", vec![rand(&d, -2.0, 2.0, 20)], |_, x| x[0].sum(&[0, 2], true)).first_order_only(),
        case("sum axes 0,2 keepdim, squared", vec![rand(&d, -2.0, 2.0, 21)], |_, x| x[0].sum(&[0, 2], true)?.square()),
        // Random values: no ties within a row.
        case("max axis 1", vec![rand(&d, -2.0, 2.0, 22)], |_, x| x[0].max(&[1], false)).first_order_only(),
        // Near 1, so products of four stay tame.
        case("prod axis -1", vec![rand(&d, 0.6, 1.4, 23)], |_, x| x[0].prod(&[-1], false)),
        case("matmul [2,3]x[3,4]", vec![rand(&[2, 3], -1.0, 1.0, 24), rand(&[3, 4], -1.0, 1.0, 25)], |_, x| {
            x[0].matmul(x[1])
        }),
        case("matmul both transposed", vec![rand(&[3, 2], -1.0, 1.0, 26), rand(&[4, 3], -1.0, 1.0, 27)], |_, x| {
            x[0].matmul_t(x[1], true, true)
        })
        .first_order_only(),
        case(
            "matmul batch broadcast [2,1,2,3]x[3,3,2]",
            vec![rand(&[2, 1, 2, 3], -1.0, 1.0, 28), rand(&[3, 3, 2], -1.0, 1.0, 29)],
            |_, x| x[0].matmul(x[1]),
        )
        .first_order_only(),
        case("matmul x·xᵀ", vec![rand(&[2, 3], -1.0, 1.0, 30)], |_, x| x[0].matmul_t(x[0], false, true)),
    ];
    run_all(&Suite::on(&wg, options(), WGPU_CAP), cases);
}

#[test]
fn movement_and_indexing() {
    let Some(wg) = common::vulkan_device("the wgpu gradcheck") else { return };
    let steps = [SliceSpec::new(0, 4, 2), SliceSpec::new(1, 5, 3)];
    let cases = vec![
        // Each feeds a non-linear op, so the second derivative is not zero.
        case("permute [2,0,1] then square", vec![rand(&[2, 3, 4], -1.0, 1.0, 40)], |_, x| {
            x[0].permute(&[2, 0, 1])?.square()
        }),
        case("slice with steps", vec![rand(&[4, 5], -1.0, 1.0, 41)], move |_, x| x[0].slice(&steps)?.exp())
            .first_order_only(),
        case("concat axis 1", vec![rand(&[2, 1], -1.0, 1.0, 42), rand(&[2, 3], -1.0, 1.0, 43)], |_, x| {
            Tensor::concat(&[x[0], x[1], x[0].mul(2.0)?], 1)?.tanh()
        })
        .first_order_only(),
        case("expand [3,1]->[2,3,4]", vec![rand(&[3, 1], -1.0, 1.0, 44)], |_, x| x[0].expand(&[2, 3, 4])?.sin())
            .first_order_only(),
        case("index_select axis 0, repeated indices", vec![rand(&[3, 4], -1.0, 1.0, 45)], |g, x| {
            x[0].index_select(0, g.tensor_from(&[2i32, 0, 2, 1], &[4])?)?.exp()
        }),
        case(
            "scatter_add axis 1, repeated indices",
            vec![rand(&[2, 3], -1.0, 1.0, 46), rand(&[2, 4], -1.0, 1.0, 47)],
            |g, x| x[0].scatter_add(1, g.tensor_from(&[2i32, 2, 0, 1], &[4])?, x[1])?.square(),
        ),
    ];
    run_all(&Suite::on(&wg, options(), WGPU_CAP), cases);
}

/// (x − mean) / sqrt(var + 1e-5) · w + b over the last axis.
fn layer_norm<'g>(x: Tensor<'g>, w: Tensor<'g>, b: Tensor<'g>) -> Result<Tensor<'g>> {
    let centered = x.sub(x.mean(&[-1], true)?)?;
    let std = x.var(&[-1], true, 0)?.add(1e-5)?.sqrt()?;
    centered.div(std)?.mul(w)?.add(b)
}

#[test]
fn composed_ops() {
    let Some(wg) = common::vulkan_device("the wgpu gradcheck") else { return };
    let labels = [0i32, 3, 1];
    let cases = vec![
        case("softmax -1", vec![rand(&[3, 4], -2.0, 2.0, 50)], |_, x| x[0].softmax(-1)),
        case("log_softmax -1", vec![rand(&[3, 4], -2.0, 2.0, 51)], |_, x| x[0].log_softmax(-1)),
        case("cross_entropy (integer labels)", vec![rand(&[3, 4], -2.0, 2.0, 52)], move |g, x| {
            cross_entropy(x[0], g.tensor_from(&labels, &[3])?)
        }),
        case("gelu", vec![rand(&[2, 3], -3.0, 3.0, 53)], |_, x| x[0].gelu()),
        case(
            "layer norm (mean/var over the last axis)",
            vec![rand(&[3, 4], -1.0, 1.0, 54), rand(&[4], 0.5, 1.5, 55), rand(&[4], -0.5, 0.5, 56)],
            |_, x| layer_norm(x[0], x[1], x[2]),
        ),
        case("mse against a constant target", vec![rand(&[2, 3], -1.0, 1.0, 57)], |g, x| {
            let target = constant(g, &[0.5, -0.25, 0.0, 1.0, -1.0, 0.75], &[2, 3], x[0].dtype())?;
            x[0].sub(target)?.square()?.mean_all()
        })
        .first_order_only(),
    ];
    run_all(&Suite::on(&wg, options(), WGPU_CAP), cases);
}
