//! The LayerNorm primitive (and its LayerNormBackward): first and second
//! order against finite differences, its values against the composed form
//! it replaces (forward bit for bit on the CPU), which graphs use it and
//! which compose, and bad input against clear errors. The wgpu kernels are
//! compared with the CPU in wgpu_parity.rs.

mod common;

use common::cases::{case, rand, run_all, Suite, CPU_CAP};
use common::{assert_close, values};
use kiln::nn::LayerNorm;
use kiln::prelude::*;
use kiln::{CpuNumerics, ErrorKind};

/// The composed form, as `nn::LayerNorm` built it before the primitive.
fn composed<'g>(x: Tensor<'g>, dims: usize, eps: f64) -> Result<Tensor<'g>> {
    let r = x.rank();
    let axes: Vec<isize> = (r - dims..r).map(|a| a as isize).collect();
    let centered = x.sub(x.mean(&axes, true)?)?;
    let inv_std = centered.square()?.mean(&axes, true)?.add(eps)?.sqrt()?.recip()?;
    centered.mul(inv_std)
}

/// d(sum(y)) / dx, as a node of the graph (differentiable again).
fn grad_of_sum<'g>(graph: &'g Graph, y: Tensor<'g>, x: Tensor<'g>) -> Tensor<'g> {
    graph.grad(y.sum_all().unwrap(), &[x], None).unwrap()[0]
}

#[test]
fn layer_norm_passes_first_and_second_order_checks() {
    run_all(
        &Suite::cpu(CPU_CAP),
        vec![
            case("layer_norm rows of 4", vec![rand(&[3, 4], -1.0, 1.0, 1)], |_, x| x[0].layer_norm(1, 1e-5)),
            // A row of one element is all zeros with a zero gradient.
            case("layer_norm rows of 1", vec![rand(&[4, 1], -1.0, 1.0, 2)], |_, x| x[0].layer_norm(1, 1e-5)),
            case("layer_norm over two axes", vec![rand(&[2, 2, 3], -1.0, 1.0, 3)], |_, x| {
                x[0].layer_norm(2, 1e-5)?.exp()
            }),
            // A large eps makes the variance's share of r visible.
            case("layer_norm eps 0.5", vec![rand(&[2, 5], -1.0, 1.0, 4)], |_, x| x[0].layer_norm(1, 0.5)?.square()),
            case(
                "nn::LayerNorm with weight and bias",
                vec![rand(&[2, 4], -1.0, 1.0, 5), rand(&[4], 0.5, 1.5, 6), rand(&[4], -0.5, 0.5, 7)],
                |_, x| x[0].layer_norm(1, 1e-5)?.mul(x[1])?.add(x[2])?.tanh(),
            ),
        ],
    );
}

/// The primitive's forward values are the composed form's bit for bit (the
/// same operations in the same order, the same summation rule) in f32 and
/// f64, for rows inside one leaf and over several; its gradients agree to
/// rounding, and so do second derivatives.
#[test]
fn the_primitive_matches_the_composed_form() {
    let device = Device::cpu();
    for dtype in [DType::F32, DType::F64] {
        for (dims, k) in [(vec![13usize, 128], 1usize), (vec![3, 5, 7], 2), (vec![9, 300], 1), (vec![2, 1000], 1)] {
            let graph = Graph::new(&device);
            let n: usize = dims.iter().product();
            let x = graph.variable(&rand(&dims, -3.0, 5.0, n as u64).values, &dims).unwrap().cast(dtype).unwrap();
            let fused = x.layer_norm(k, 1e-5).unwrap();
            assert!(graph.count_ops("LayerNorm") >= 1, "{dims:?}: the primitive was not used");
            let reference = composed(x, k, 1e-5).unwrap();
            let bits = |t: &Tensor<'_>| values(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fused), bits(&reference), "{dtype} {dims:?}: forward values");
            let w = graph.tensor_from(&rand(&dims, -1.0, 1.0, 9).values, &dims).unwrap().cast(dtype).unwrap();
            let (ga, gb) =
                (grad_of_sum(&graph, fused.mul(w).unwrap(), x), grad_of_sum(&graph, reference.mul(w).unwrap(), x));
            assert!(graph.count_ops("LayerNormBackward") >= 1);
            let tol = if dtype == DType::F32 { 2e-5 } else { 1e-12 };
            assert_close(&values(&ga), &values(&gb), tol);
            // Second order: the gradient of a function of the gradient.
            let (sa, sb) = (grad_of_sum(&graph, ga.square().unwrap(), x), grad_of_sum(&graph, gb.square().unwrap(), x));
            assert_close(&values(&sa), &values(&sb), tol * 10.0);
        }
    }
}

/// The module records one LayerNorm per call (the GPT's norms), and the
/// backward pass one LayerNormBackward; nothing of the composed form.
#[test]
fn nn_layer_norm_is_one_primitive_forward_and_backward() {
    let device = Device::cpu();
    let ln = LayerNorm::new(&device, &[8], 1e-5).unwrap();
    let graph = Graph::new(&device);
    let v: Vec<f32> = rand(&[4, 8], -1.0, 1.0, 3).values.iter().map(|&v| v as f32).collect();
    let x = graph.variable(&v, &[4, 8]).unwrap();
    let y = ln.forward(x).unwrap();
    assert_eq!(graph.count_ops("LayerNorm"), 1);
    for composed_op in ["Sum", "Sqrt", "Recip"] {
        assert_eq!(graph.count_ops(composed_op), 0, "the forward pass built {composed_op}");
    }
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(graph.count_ops("LayerNormBackward"), 1);
    assert!(ln.weight.has_grad() && common::grad_of(&x).iter().all(|g| g.is_finite()));
}

/// Portable numerics compute the browser build's bits, whose layer norm is
/// composed; rows longer than the primitive takes compose too. Either way
/// the values are the primitive's.
#[test]
fn portable_numerics_and_very_long_rows_compose() {
    let portable = Device::cpu_with(CpuNumerics::Portable);
    let graph = Graph::new(&portable);
    let x = graph.variable(&rand(&[2, 6], -1.0, 1.0, 4).values, &[2, 6]).unwrap();
    let y = x.layer_norm(1, 1e-5).unwrap();
    assert_eq!(graph.count_ops("LayerNorm"), 0, "portable numerics must compose");
    let native = Device::cpu_with(CpuNumerics::Native);
    let other = Graph::new(&native);
    let xn = other.variable(&rand(&[2, 6], -1.0, 1.0, 4).values, &[2, 6]).unwrap();
    assert_eq!(values(&y), values(&xn.layer_norm(1, 1e-5).unwrap()));
    assert_eq!(other.count_ops("LayerNorm"), 1);
    // 32,768 entries per row is the primitive's limit; one more composes.
    for (n, primitive) in [(32_768usize, 1usize), (32_769, 0)] {
        let graph = Graph::new(&native);
        let x = graph.tensor_from(&rand(&[1, n], -1.0, 1.0, 5).values, &[1, n]).unwrap();
        let y = x.layer_norm(1, 1e-5).unwrap();
        assert_eq!(graph.count_ops("LayerNorm"), primitive, "row of {n}");
        let v = values(&y);
        let mean = v.iter().sum::<f64>() / n as f64;
        assert!(mean.abs() < 1e-6 && v.iter().all(|v| v.is_finite()), "row of {n}: mean {mean}");
    }
}

#[test]
fn bad_input_gives_clear_errors() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    for (dims, eps, kind) in [
        (0usize, 1e-5, ErrorKind::InvalidArgument),
        (3, 1e-5, ErrorKind::InvalidArgument),
        (1, 0.0, ErrorKind::InvalidArgument),
        (1, -1.0, ErrorKind::InvalidArgument),
        (1, f64::NAN, ErrorKind::InvalidArgument),
        (1, f64::INFINITY, ErrorKind::InvalidArgument),
    ] {
        let e = x.layer_norm(dims, eps).unwrap_err();
        assert_eq!(e.kind(), kind, "dims {dims}, eps {eps}: {e}");
        assert!(e.to_string().contains("layer_norm"), "{e}");
        assert!(e.to_string().contains("layer_norm.rs"), "the error points at the caller: {e}");
    }
    let ints = graph.tensor_from(&[1i32, 2], &[2]).unwrap();
    assert_eq!(ints.layer_norm(1, 1e-5).unwrap_err().kind(), ErrorKind::DType);
    let empty = graph.zeros(&[3, 0], DType::F32).unwrap();
    assert_eq!(empty.layer_norm(1, 1e-5).unwrap_err().kind(), ErrorKind::Shape);
    // The module names the shape it expected.
    let ln = LayerNorm::new(&device, &[3], 1e-5).unwrap();
    let e = ln.forward(x).unwrap_err();
    assert!(e.kind() == ErrorKind::Shape && e.to_string().contains("[3]"), "{e}");
}
