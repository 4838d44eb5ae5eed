//! `custom_vjp`: a function of kiln ops with a user-written gradient. The
//! straight-through estimator and gradient reversal give the gradients they
//! promise; a backward written with kiln ops passes first- and second-order
//! finite-difference checks (and a wrong one fails them); regions work
//! inside checkpointed segments, with `Graph::grad`, on wgpu; misuse is an
//! error with the caller's location.

mod common;

use kiln::gradcheck::{gradcheck, gradcheck_on, gradgradcheck, gradgradcheck_on, CheckInput, GradcheckOptions};
use kiln::{checkpoint, custom_vjp, custom_vjp_many, Blocking, DType, Device, ErrorKind, Graph, Param, Result, Tensor};

/// a · exp(b) (b broadcast over a's rows), with its gradient written by
/// hand from the output: d/da = g · exp(b), d/db = Σrows g · y.
fn scaled_exp<'g>(_: &'g Graph, xs: &[Tensor<'g>]) -> Result<Tensor<'g>> {
    let out = custom_vjp_many(
        |xs| Ok(vec![xs[0].mul(xs[1].exp()?)?]),
        xs,
        |xs, ys, gs| Ok(vec![Some(gs[0].mul(xs[1].exp()?)?), Some(gs[0].mul(ys[0])?.sum(&[0], false)?)]),
    )?;
    // Used downstream non-linearly, so the second order sees the rule's own rules.
    out[0].tanh()
}

/// softplus(x) = ln(1 + e^x) with the gradient sigmoid(x) · g.
fn softplus_vjp<'g>(_: &'g Graph, xs: &[Tensor<'g>]) -> Result<Tensor<'g>> {
    let y = custom_vjp(|x| x.exp()?.log1p(), xs[0], |x, _y, g| g.mul(x.sigmoid()?))?;
    y.mul(xs[0])
}

/// The same with a wrong gradient (twice the true one).
fn wrong_softplus<'g>(_: &'g Graph, xs: &[Tensor<'g>]) -> Result<Tensor<'g>> {
    let y = custom_vjp(|x| x.exp()?.log1p(), xs[0], |x, _y, g| g.mul(x.sigmoid()?)?.mul(2.0))?;
    y.mul(xs[0])
}

#[test]
fn straight_through_sign_and_gradient_reversal() {
    let graph = Graph::new(&Device::cpu());
    let x = graph.variable(&[0.4f32, -1.5, -0.2, 2.0], &[4]).unwrap();
    // Straight-through: forward sign(x) (which has no gradient rule), backward
    // the incoming gradient where |x| <= 1.
    let q = custom_vjp(|x| x.sign(), x, |x, _y, g| x.abs()?.le(1.0)?.where_(g, 0.0)).unwrap();
    assert_eq!(q.to_vec_blocking::<f32>().unwrap(), vec![1.0, -1.0, -1.0, 1.0]);
    // Gradient reversal: forward the identity (the input itself), backward -λ g.
    let r = custom_vjp(|x| Ok(x), x, |_x, _y, g| g.mul(-0.5)).unwrap();
    assert_ne!(r.id(), x.id(), "an input returned as it is gets a node of the region");
    assert_eq!(r.to_vec_blocking::<f32>().unwrap(), vec![0.4, -1.5, -0.2, 2.0]);
    let weights = graph.tensor_from(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    q.mul(weights).unwrap().add(r.mul(r).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
    // d/dx = [|x|<=1]·w  +  -0.5 · 2x
    let expected: Vec<f64> = [(0.4f64, 1.0f64), (-1.5, 2.0), (-0.2, 3.0), (2.0, 4.0)]
        .iter()
        .map(|&(x, w)| if x.abs() <= 1.0 { w } else { 0.0 } - x)
        .collect();
    common::assert_close(&common::grad_of(&x), &expected, 1e-6);
}

#[test]
fn unused_outputs_get_zero_gradients_and_nothing_inside_is_kept() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let a = graph.variable(&[1.0f64, 2.0], &[2]).unwrap();
    let b = graph.variable(&[3.0f64, 4.0], &[2]).unwrap();
    let outs = custom_vjp_many(
        |xs| Ok(vec![xs[0].mul(xs[1])?.exp()?.log()?, xs[1].neg()?]),
        &[a, b],
        |xs, _ys, gs| {
            // gs[1] is zeros: the second output is not used below.
            let unused = gs[1].sum_all()?;
            Ok(vec![Some(gs[0].mul(xs[1])?.add(unused)?), None])
        },
    )
    .unwrap();
    outs[0].sum_all().unwrap().backward().unwrap();
    common::assert_close(&common::grad_of(&a), &[3.0, 4.0], 0.0);
    assert!(b.grad().is_none(), "the backward gave b no gradient");
}

#[test]
fn first_and_second_order_checks_on_cpu() {
    let device = Device::cpu();
    let options = GradcheckOptions::default();
    let two = vec![CheckInput::random(&[2, 3], -1.0, 1.0, 1), CheckInput::random(&[3], -1.0, 1.0, 2)];
    let first = gradcheck(&device, scaled_exp, &two, options).unwrap();
    assert!(first.passed(), "{first}");
    let second = gradgradcheck(&device, scaled_exp, &two, options).unwrap();
    assert!(second.passed(), "{second}");
    let one = vec![CheckInput::random(&[5], -2.0, 2.0, 3)];
    assert!(gradcheck(&device, softplus_vjp, &one, options).unwrap().passed());
    let second = gradgradcheck(&device, softplus_vjp, &one, options).unwrap();
    assert!(second.passed(), "{second}");
    // The checks can fail: a wrong backward is caught.
    let wrong = gradcheck(&device, wrong_softplus, &one, options).unwrap();
    assert!(!wrong.passed(), "a doubled gradient passed: {wrong}");
}

#[test]
fn second_derivative_through_graph_grad() {
    // y = x³ with backward 3x²·g: d²/dx² Σy = 6x through the backward's ops.
    let graph = Graph::new(&Device::cpu());
    let x = graph.variable(&[0.5f64, -2.0, 3.0], &[3]).unwrap();
    let y = custom_vjp(|x| x.mul(x)?.mul(x), x, |x, _y, g| g.mul(x.square()?.mul(3.0)?)).unwrap();
    let g = graph.grad(y.sum_all().unwrap(), &[x], None).unwrap()[0];
    common::assert_close(&common::values(&g), &[0.75, 12.0, 27.0], 1e-12);
    let h = graph.grad(g.sum_all().unwrap(), &[x], None).unwrap()[0];
    common::assert_close(&common::values(&h), &[3.0, -12.0, 18.0], 1e-12);
}

fn step(checkpointed: bool) -> (Vec<u64>, Vec<u64>) {
    let graph = Graph::new(&Device::cpu());
    step_in(&graph, checkpointed)
}

fn step_in<'g>(graph: &'g Graph, checkpointed: bool) -> (Vec<u64>, Vec<u64>) {
    let a = graph.variable(&[0.3f64, -0.8, 1.2, 0.1, -0.5, 0.9], &[2, 3]).unwrap();
    let b = graph.variable(&[0.2f64, -0.4, 0.6], &[3]).unwrap();
    let body = |x: Tensor<'g>| -> Result<Tensor<'g>> {
        let h = x.sin()?;
        let q = custom_vjp_many(
            |xs| Ok(vec![xs[0].mul(xs[1])?.sign()?]),
            &[h, b],
            |xs, _, gs| Ok(vec![Some(gs[0].mul(xs[1])?), Some(gs[0].mul(xs[0])?.sum(&[0], false)?)]),
        )?;
        q[0].add(h)?.tanh()
    };
    let y = if checkpointed { checkpoint(body, a).unwrap() } else { body(a).unwrap() };
    y.mul(y).unwrap().sum_all().unwrap().backward().unwrap();
    let bits = |t: Tensor<'_>| common::grad_of(&t).iter().map(|v| v.to_bits()).collect();
    (bits(a), bits(b))
}

fn sign_exp(x: Tensor<'_>) -> Result<Tensor<'_>> {
    custom_vjp(|x| x.sign()?.mul(x.exp()?), x, |x, y, g| g.mul(y.add(x.sign()?)?))
}

#[test]
fn regions_inside_checkpointed_segments_give_the_same_gradients() {
    assert_eq!(step(true), step(false));
    // The region spanning exactly the segment's nodes.
    let run = |checkpointed: bool| {
        let graph = Graph::new(&Device::cpu());
        let x = graph.variable(&[0.4f64, -1.5, 0.7], &[3]).unwrap();
        let y = if checkpointed { checkpoint(sign_exp, x).unwrap() } else { sign_exp(x).unwrap() };
        y.sum_all().unwrap().backward().unwrap();
        common::grad_of(&x)
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn misuse_is_an_error_at_the_call() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0f32, 2.0], &[2]).unwrap();
    let w = graph.variable(&[3.0f32, 4.0], &[2]).unwrap();
    // A captured tensor that requires grad would silently get none.
    let line = line!() + 1;
    let err = custom_vjp(|x| x.mul(w), x, |_, _, g| Ok(g)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("custom_vjp") && err.to_string().contains("not one of its inputs"), "{err}");
    assert!(err.to_string().contains(&format!("{}:{line}", file!())), "{err}");
    // So would a trainable parameter first used inside.
    let p = Param::from_host(&device, "p", kiln::HostData::F32(vec![1.0, 1.0]), &[2]).unwrap();
    let err = custom_vjp(|x| x.mul(graph.param(&p)?), x, |_, _, g| Ok(g)).unwrap_err();
    assert!(err.to_string().contains("parameter 'p'"), "{err}");

    // A backward returning the wrong shape fails the backward pass, which
    // leaves the graph usable.
    let line = line!() + 1;
    let y = custom_vjp(|x| x.exp(), x, |_, _, g| g.sum_all()).unwrap();
    let err = y.sum_all().unwrap().backward().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shape);
    assert!(err.to_string().contains("gradient of input 0 is [] f32 but the input is [2] f32"), "{err}");
    assert!(err.to_string().contains(&format!("{}:{line}", file!())), "{err}");
    let wrong_count = custom_vjp_many(|xs| Ok(vec![xs[0].exp()?]), &[x], |_, _, gs| Ok(vec![Some(gs[0]), None]));
    let err = wrong_count.unwrap()[0].sum_all().unwrap().backward().unwrap_err();
    assert!(err.to_string().contains("returned 2 gradients for 1 inputs"), "{err}");

    // An intermediate used outside the function is a constant there (the
    // function recorded no gradient structure), like a detached tensor.
    let other = Graph::new(&device);
    let x2 = other.variable(&[1.0f32, 2.0], &[2]).unwrap();
    let mut leaked = None;
    let y = custom_vjp(
        |x| {
            let h = x.exp()?;
            leaked = Some(h);
            h.sin()
        },
        x2,
        |_, _, g| g.mul(10.0),
    )
    .unwrap();
    assert!(!leaked.unwrap().requires_grad());
    let v = other.variable(&[0.5f32], &[1]).unwrap();
    y.add(leaked.unwrap()).unwrap().mul(v).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(x2.grad().unwrap().to_vec_blocking::<f32>().unwrap(), vec![5.0, 5.0]);
    let mut leaked = None;

    // A variable made inside and used outside would get a gradient the
    // region cannot pass on: refused.
    let y = custom_vjp_many(
        |xs| {
            let inner = xs[0].graph().variable(&[1.0f32, 1.0], &[2])?;
            leaked = Some(inner);
            Ok(vec![xs[0].mul(inner)?])
        },
        &[w],
        |_, _, gs| Ok(vec![Some(gs[0])]),
    )
    .unwrap();
    let err = y[0].add(leaked.unwrap()).unwrap().sum_all().unwrap().backward().unwrap_err();
    assert!(err.to_string().contains("made inside the custom_vjp function and used outside"), "{err}");

    // Still usable.
    let z = custom_vjp(|x| x.mul(3.0), x, |_, _, g| g.mul(3.0)).unwrap();
    z.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec_blocking::<f32>().unwrap(), vec![3.0, 3.0]);
    let _ = DType::F32;
}

#[test]
fn no_grad_and_constants_run_the_function_plainly() {
    let graph = Graph::new(&Device::cpu());
    let c = graph.tensor_from(&[1.0f32, -2.0], &[2]).unwrap();
    let y = custom_vjp(|x| x.exp(), c, |_, _, g| Ok(g)).unwrap();
    assert!(!y.requires_grad());
    let x = graph.variable(&[1.0f32, -2.0], &[2]).unwrap();
    let y = graph.with_no_grad(|| custom_vjp(|x| x.exp(), x, |_, _, g| Ok(g))).unwrap();
    assert!(!y.requires_grad());
    assert_eq!(y.to_vec_blocking::<f32>().unwrap(), vec![1f32.exp(), (-2f32).exp()]);
}

#[test]
fn wgpu_first_and_second_order_against_the_cpu() {
    let Some(wg) = common::vulkan_device("custom_vjp") else { return };
    let cpu = Device::cpu();
    let options = GradcheckOptions { eps: 1e-6, atol: 1e-4, rtol: 1e-3, ..GradcheckOptions::default() };
    let inputs = vec![CheckInput::random(&[2, 3], -1.0, 1.0, 1), CheckInput::random(&[3], -1.0, 1.0, 2)];
    let first = gradcheck_on(&cpu, &wg, DType::F32, scaled_exp, &inputs, options).unwrap();
    assert!(first.passed(), "{first}");
    let second = gradgradcheck_on(&cpu, &wg, DType::F32, scaled_exp, &inputs, options).unwrap();
    assert!(second.passed(), "{second}");
}
