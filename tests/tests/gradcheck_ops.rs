//! Every differentiable op, first and second order, against central finite
//! differences in f64 (`kiln::gradcheck`).
//!
//! Table-driven: each test builds a list of named cases and runs them all,
//! collecting every failure, so one broken rule does not hide another. Adding
//! an op is one `case(...)` line (the harness: `common/cases.rs`). Inputs stay at <= 24 elements and away from
//! kinks and domain edges (Abs/Relu away from 0, Log/Sqrt on [0.5, 2], no ties
//! for Max/Min/Maximum/Minimum).

mod common;

use common::cases::{away_from_zero, boxed, case, given, rand, run_all, Suite, CPU_CAP};
use kiln::gradcheck::{gradcheck, gradgradcheck, CheckInput, GradcheckOptions};
use kiln::nn::{cross_entropy, cross_entropy_probs, mse_loss, nll_loss};
use kiln::{BinaryOp, DType, Device, ReduceOp, SliceSpec, Tensor, UnaryOp};

#[test]
fn the_harness_detects_a_wrong_gradient() {
    // f(x) = detach(x)·x has analytic gradient x but numeric gradient 2x:
    // gradcheck must say so, or every passing case below means nothing.
    let device = Device::cpu();
    let f = boxed(|_, x| x[0].detach()?.mul(x[0]));
    let report = gradcheck(&device, &*f, &[rand(&[3], 0.5, 2.0, 1)], GradcheckOptions::default()).unwrap();
    assert!(!report.passed(), "{report}");
    let report = gradgradcheck(&device, &*f, &[rand(&[3], 0.5, 2.0, 1)], GradcheckOptions::default()).unwrap();
    assert!(!report.passed(), "{report}");
    let ok = boxed(|_, x| x[0].mul(x[0]));
    assert!(gradcheck(&device, &*ok, &[rand(&[3], 0.5, 2.0, 1)], GradcheckOptions::default()).unwrap().passed());
}

#[test]
fn gradgradcheck_of_a_linear_function_checks_a_zero_second_derivative() {
    // The first derivative of a linear function is constant: it does not
    // depend on the inputs at all, and its (zero) gradient must still be
    // checked rather than refused as "root does not require grad".
    let device = Device::cpu();
    for f in [boxed(|_, x| x[0].neg()), boxed(|_, x| x[0].sum(&[1], false)), boxed(|_, x| x[0].mul(3.0)?.add(x[1]))] {
        let inputs = [rand(&[2, 3], -1.0, 1.0, 2), rand(&[2, 3], -1.0, 1.0, 3)];
        let report = gradgradcheck(&device, &*f, &inputs, GradcheckOptions::default()).unwrap();
        assert!(report.passed(), "{report}");
        assert_eq!(report.checked, 12);
        assert_eq!(report.worst.as_ref().unwrap().analytic, 0.0);
    }
}

#[test]
fn unary_ops() {
    let d = [2, 3];
    let unary = |op: UnaryOp, input: CheckInput| case(op.name(), vec![input], move |_, x| x[0].unary(op));
    let mut cases = vec![
        unary(UnaryOp::Neg, rand(&d, -2.0, 2.0, 1)),
        unary(UnaryOp::Abs, away_from_zero(&d, 0.3, 2.0, 2)),
        unary(UnaryOp::Exp, rand(&d, -2.0, 2.0, 3)),
        unary(UnaryOp::Log, rand(&d, 0.5, 2.0, 4)),
        unary(UnaryOp::Sqrt, rand(&d, 0.5, 2.0, 5)),
        unary(UnaryOp::Recip, away_from_zero(&d, 0.5, 2.0, 6)),
        unary(UnaryOp::Sin, rand(&d, -3.0, 3.0, 7)),
        unary(UnaryOp::Cos, rand(&d, -3.0, 3.0, 8)),
        unary(UnaryOp::Tanh, rand(&d, -2.0, 2.0, 9)),
        unary(UnaryOp::Sigmoid, rand(&d, -3.0, 3.0, 10)),
        unary(UnaryOp::Relu, away_from_zero(&d, 0.2, 2.0, 11)),
        unary(UnaryOp::Erf, rand(&d, -2.0, 2.0, 12)),
        unary(UnaryOp::Erfc, rand(&d, -2.0, 2.0, 13)),
        unary(UnaryOp::Log1p, rand(&d, -0.5, 2.0, 16)),
        unary(UnaryOp::Expm1, rand(&d, -2.0, 2.0, 17)),
        unary(UnaryOp::Softsign, away_from_zero(&d, 0.2, 2.0, 18)),
        unary(UnaryOp::Gelu, rand(&d, -3.0, 3.0, 19)),
        unary(UnaryOp::GeluDerivative, rand(&d, -3.0, 3.0, 20)),
    ];
    // Every differentiable unary op is in the table.
    for op in UnaryOp::ALL {
        if op != UnaryOp::Sign {
            assert!(cases.iter().any(|c| c.name == op.name()), "{} has no case", op.name());
        }
    }
    // Cast f64 -> f32 -> f64. The values pass through f32, whose rounding
    // (relative 6e-8) swamps a 1e-6 finite-difference step, so the step is
    // 1e-3 and the tolerance 1e-3: the rounding error of a central
    // difference is then about 2·6e-8·|x| / 2e-3 ≈ 6e-5 relative, while a
    // wrong rule (a missing or doubled factor) is off by O(1). The squares
    // make the functions non-linear; their truncation error is exactly zero.
    let loose = GradcheckOptions { eps: 1e-3, atol: 1e-3, rtol: 1e-3, ..GradcheckOptions::default() };
    cases.push(
        case("Cast f64->f32->f64", vec![rand(&d, -2.0, 2.0, 14)], |_, x| x[0].cast(DType::F32)?.cast(DType::F64))
            .options(loose),
    );
    cases.push(
        case("Cast f64->f32, square in f32, ->f64", vec![rand(&d, -2.0, 2.0, 15)], |_, x| {
            x[0].cast(DType::F32)?.square()?.cast(DType::F64)
        })
        .options(loose),
    );
    cases.push(case("Cast f64->f64", vec![rand(&d, -2.0, 2.0, 16)], |_, x| x[0].cast(DType::F64)?.square()));
    run_all(&Suite::cpu(CPU_CAP), cases);
}

#[test]
fn binary_ops_with_broadcasting() {
    // (name, a, b) for the two broadcasting patterns.
    let shapes: [(&str, [usize; 2], &[usize]); 2] = [("[2,3]x[3]", [2, 3], &[3]), ("[2,1]x[1,3]", [2, 1], &[1, 3])];
    let mut cases = Vec::new();
    for (k, (label, da, db)) in shapes.iter().enumerate() {
        let seed = 100 * k as u64;
        for op in BinaryOp::ALL {
            let (a, b) = match op {
                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul => {
                    (rand(da, -2.0, 2.0, seed + 1), rand(db, -2.0, 2.0, seed + 2))
                }
                BinaryOp::Div => (rand(da, -2.0, 2.0, seed + 3), away_from_zero(db, 0.5, 2.0, seed + 4)),
                // Positive base; the exponent may be anything.
                BinaryOp::Pow => (rand(da, 0.5, 2.0, seed + 5), rand(db, -1.5, 1.5, seed + 6)),
                // Hand-picked values: no pair that meets under broadcasting is tied.
                BinaryOp::Maximum | BinaryOp::Minimum => {
                    if k == 0 {
                        (given(&[0.1, 1.5, -0.7, 2.0, -1.2, 0.4], da), given(&[0.9, -0.3, 0.2], db))
                    } else {
                        (given(&[0.35, -0.6], da), given(&[1.1, -0.2, 0.5], db))
                    }
                }
            };
            cases.push(case(format!("{} {label}", op.name()), vec![a.clone(), b.clone()], move |_, x| {
                x[0].binary(op, x[1])
            }));
            // The other operand order broadcasts the other way round.
            cases.push(case(format!("{} {label} swapped", op.name()), vec![b, a], move |_, x| x[1].binary(op, x[0])));
        }
    }
    // Where: the condition is a constant; both branches broadcast.
    let cond = [true, false, false, true, true, false];
    cases.push(case(
        "Where cond[2,3] a[2,3] b[3]",
        vec![rand(&[2, 3], -2.0, 2.0, 7), rand(&[3], -2.0, 2.0, 8)],
        move |g, x| g.tensor_from(&cond, &[2, 3])?.where_(x[0], x[1]),
    ));
    cases.push(case(
        "Where cond[3] a[2,1] b[1,3]",
        vec![rand(&[2, 1], -2.0, 2.0, 9), rand(&[1, 3], -2.0, 2.0, 10)],
        |g, x| g.tensor_from(&[false, true, true], &[3])?.where_(x[0], x[1]),
    ));
    cases.push(case("Where scalar branch", vec![rand(&[2, 3], -2.0, 2.0, 11)], move |g, x| {
        g.tensor_from(&cond, &[2, 3])?.where_(x[0], 0.5)?.mul(x[0])
    }));
    // Scalars as operands.
    cases.push(case("Pow x^3", vec![rand(&[2, 3], 0.5, 2.0, 12)], |_, x| x[0].pow(3.0)));
    cases.push(case("2^x (Pow of a constant base)", vec![rand(&[2, 3], -1.0, 1.0, 13)], |g, x| {
        g.full(&[2, 3], 2.0, DType::F64)?.pow(x[0])
    }));
    run_all(&Suite::cpu(CPU_CAP), cases);
}

#[test]
fn reductions() {
    let d = [2, 3, 4];
    // (label, axes, keepdim)
    let configs: Vec<(&str, Vec<isize>, bool)> = vec![
        ("axis 1", vec![1], false),
        ("axis 1 keepdim", vec![1], true),
        ("axis -1", vec![-1], false),
        ("axes 0,2", vec![0, 2], false),
        ("axes 0,2 keepdim", vec![0, 2], true),
        ("all axes", vec![0, 1, 2], false),
        ("all axes keepdim", vec![0, 1, 2], true),
    ];
    let mut cases = Vec::new();
    for (i, op) in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod].into_iter().enumerate() {
        for (label, axes, keepdim) in &configs {
            // Random values have no ties; Prod stays near 1 so products of 24 are tame.
            let input = if op == ReduceOp::Prod {
                rand(&d, 0.6, 1.4, 20 + i as u64)
            } else {
                rand(&d, -2.0, 2.0, 20 + i as u64)
            };
            let (axes, keepdim) = (axes.clone(), *keepdim);
            cases
                .push(case(format!("{} {label}", op.name()), vec![input], move |_, x| x[0].reduce(op, &axes, keepdim)));
        }
    }
    for (name, reduce_all) in [("sum_all", 0), ("max_all", 1), ("min_all", 2), ("prod_all", 3)] {
        cases.push(case(name, vec![rand(&[2, 3], 0.6, 1.4, 30)], move |_, x| match reduce_all {
            0 => x[0].sum_all(),
            1 => x[0].max_all(),
            2 => x[0].min_all(),
            _ => x[0].prod_all(),
        }));
    }
    // Prod through exact zeros, first order: one zero in a row (that element
    // gets the product of the others, the others 0) and two zeros (all 0).
    let mut one_zero = rand(&d, 0.6, 1.4, 40);
    one_zero.values[5] = 0.0;
    let mut two_zeros = rand(&d, 0.6, 1.4, 41);
    two_zeros.values[13] = 0.0;
    two_zeros.values[15] = 0.0;
    cases.push(case("Prod axis 1, one zero", vec![one_zero.clone()], |_, x| x[0].prod(&[1], false)).first_order_only());
    cases.push(
        case("Prod axes 0,2, one zero", vec![one_zero.clone()], |_, x| x[0].prod(&[0, 2], true)).first_order_only(),
    );
    cases.push(case("Prod all, one zero", vec![one_zero], |_, x| x[0].prod_all()).first_order_only());
    cases.push(case("Prod axis 2, two zeros", vec![two_zeros], |_, x| x[0].prod(&[2], false)).first_order_only());
    run_all(&Suite::cpu(CPU_CAP), cases);
}

#[test]
fn matmul_all_forms() {
    let mut cases = Vec::new();
    // (label, a dims, b dims, transpose_a, transpose_b)
    let forms: Vec<(&str, Vec<usize>, Vec<usize>, bool, bool)> = vec![
        ("2-D", vec![2, 3], vec![3, 4], false, false),
        ("a transposed", vec![3, 2], vec![3, 4], true, false),
        ("b transposed", vec![2, 3], vec![4, 3], false, true),
        ("both transposed", vec![3, 2], vec![4, 3], true, true),
        ("batched", vec![2, 2, 3], vec![2, 3, 2], false, false),
        ("batch broadcast [2,1,2,2]x[3,2,2]", vec![2, 1, 2, 2], vec![3, 2, 2], false, false),
        ("batched a by 2-D b", vec![2, 2, 3], vec![3, 2], false, false),
        // Linear's form: b's gradient is one product over the flattened batch.
        ("batched a by 2-D b transposed", vec![2, 2, 3], vec![4, 3], false, true),
        ("rank-4 a by 2-D b", vec![2, 2, 1, 3], vec![3, 2], false, false),
        ("2-D a by batched b, both transposed", vec![3, 2], vec![2, 2, 3], true, true),
        ("batched, a transposed", vec![2, 3, 2], vec![1, 3, 2], true, false),
    ];
    for (i, (label, da, db, ta, tb)) in forms.into_iter().enumerate() {
        let inputs = vec![rand(&da, -1.0, 1.0, 50 + 2 * i as u64), rand(&db, -1.0, 1.0, 51 + 2 * i as u64)];
        cases.push(case(format!("MatMul {label}"), inputs, move |_, x| x[0].matmul_t(x[1], ta, tb)));
    }
    // x·xᵀ: both operands are the same variable.
    cases.push(case("MatMul x·xᵀ", vec![rand(&[2, 3], -1.0, 1.0, 70)], |_, x| x[0].matmul_t(x[0], false, true)));
    run_all(&Suite::cpu(CPU_CAP), cases);
}

#[test]
fn movement_and_indexing() {
    let x234 = || rand(&[2, 3, 4], -1.0, 1.0, 60);
    let x45 = || rand(&[4, 5], -1.0, 1.0, 61);
    let steps = [SliceSpec::new(0, 4, 2), SliceSpec::new(1, 5, 3)];
    let cases = vec![
        case("Reshape", vec![x234()], |_, x| x[0].reshape(&[6, -1])),
        case("Reshape to rank 1", vec![x234()], |_, x| x[0].reshape(&[24])),
        case("Permute [2,0,1]", vec![x234()], |_, x| x[0].permute(&[2, 0, 1])),
        case("Permute via transpose", vec![x234()], |_, x| x[0].transpose(0, -1)),
        case("Expand [3,1]->[2,3,4]", vec![rand(&[3, 1], -1.0, 1.0, 62)], |_, x| x[0].expand(&[2, 3, 4])),
        case("Expand [1,4]->[3,4]", vec![rand(&[1, 4], -1.0, 1.0, 63)], |_, x| x[0].expand(&[3, 4])),
        case("Slice with steps", vec![x45()], move |_, x| x[0].slice(&steps)),
        case("Slice one axis, offset", vec![x45()], |_, x| x[0].slice_axis(1, 1, 4, 1)),
        case("Slice step 3 past the end", vec![x45()], |_, x| x[0].slice_axis(0, 1, 100, 3)),
        case("SliceBackward", vec![rand(&[2, 2], -1.0, 1.0, 64)], move |_, x| x[0].slice_backward(&[4, 5], &steps)),
        case(
            "Concat axis 1",
            vec![rand(&[2, 1], -1.0, 1.0, 65), rand(&[2, 3], -1.0, 1.0, 66), rand(&[2, 2], -1.0, 1.0, 67)],
            |_, x| Tensor::concat(x, 1),
        ),
        case("Concat axis 0, same tensor twice", vec![rand(&[2, 3], -1.0, 1.0, 68)], |_, x| {
            Tensor::concat(&[x[0], x[0].mul(2.0)?], 0)
        }),
        case("IndexSelect axis 0, repeated indices", vec![rand(&[3, 4], -1.0, 1.0, 69)], |g, x| {
            x[0].index_select(0, g.tensor_from(&[2i32, 0, 2, 1], &[4])?)
        }),
        case("IndexSelect axis 1, repeated indices", vec![rand(&[3, 4], -1.0, 1.0, 70)], |g, x| {
            x[0].index_select(1, g.tensor_from(&[3i32, 3, 0], &[3])?)
        }),
        case(
            "ScatterAdd axis 0, repeated indices",
            vec![rand(&[3, 2], -1.0, 1.0, 71), rand(&[4, 2], -1.0, 1.0, 72)],
            |g, x| x[0].scatter_add(0, g.tensor_from(&[0i32, 2, 0, 1], &[4])?, x[1]),
        ),
        case(
            "ScatterAdd axis 1, repeated indices",
            vec![rand(&[2, 3], -1.0, 1.0, 73), rand(&[2, 4], -1.0, 1.0, 74)],
            |g, x| x[0].scatter_add(1, g.tensor_from(&[2i32, 2, 0, 1], &[4])?, x[1]),
        ),
        // Movement ops feeding a non-linear op, so the second derivative is
        // not trivially zero.
        case("Permute then square", vec![x234()], |_, x| x[0].permute(&[1, 2, 0])?.square()),
        case("IndexSelect then exp", vec![rand(&[3, 2], -1.0, 1.0, 75)], |g, x| {
            x[0].index_select(0, g.tensor_from(&[1i32, 1, 2], &[3])?)?.exp()
        }),
    ];
    run_all(&Suite::cpu(CPU_CAP), cases);
}

#[test]
fn composed_ops() {
    let labels = [0i32, 3, 1];
    let cases = vec![
        case("mean axis 1", vec![rand(&[2, 3, 4], -1.0, 1.0, 80)], |_, x| x[0].mean(&[1], false)),
        case("mean all", vec![rand(&[2, 3], -1.0, 1.0, 81)], |_, x| x[0].mean_all()),
        case("var axis 1, unbiased", vec![rand(&[3, 4], -1.0, 1.0, 82)], |_, x| x[0].var(&[1], false, 1)),
        case("var all axes, population, keepdim", vec![rand(&[3, 4], -1.0, 1.0, 83)], |_, x| {
            x[0].var(&[0, 1], true, 0)
        }),
        case("softmax -1", vec![rand(&[3, 4], -2.0, 2.0, 84)], |_, x| x[0].softmax(-1)),
        case("softmax 0", vec![rand(&[3, 4], -2.0, 2.0, 85)], |_, x| x[0].softmax(0)),
        case("log_softmax -1", vec![rand(&[3, 4], -2.0, 2.0, 86)], |_, x| x[0].log_softmax(-1)),
        case("logsumexp axis 1", vec![rand(&[3, 4], -2.0, 2.0, 87)], |_, x| x[0].logsumexp(&[1], false)),
        case("logsumexp all, keepdim", vec![rand(&[3, 4], -2.0, 2.0, 88)], |_, x| x[0].logsumexp(&[0, 1], true)),
        case("cross_entropy (integer labels)", vec![rand(&[3, 4], -2.0, 2.0, 89)], move |g, x| {
            cross_entropy(x[0], g.tensor_from(&labels, &[3])?)
        }),
        case("cross_entropy_probs", vec![rand(&[2, 3], -2.0, 2.0, 90)], |g, x| {
            cross_entropy_probs(x[0], g.tensor_from(&[0.2f64, 0.5, 0.3, 1.0, 0.0, 0.0], &[2, 3])?)
        }),
        case("nll_loss of log_softmax", vec![rand(&[3, 4], -2.0, 2.0, 91)], move |g, x| {
            nll_loss(x[0].log_softmax(-1)?, g.tensor_from(&labels, &[3])?)
        }),
        case("nll_loss of raw scores", vec![rand(&[3, 4], -2.0, 2.0, 92)], move |g, x| {
            nll_loss(x[0], g.tensor_from(&labels, &[3])?)
        }),
        case("mse_loss", vec![rand(&[2, 3], -2.0, 2.0, 93), rand(&[2, 3], -2.0, 2.0, 94)], |_, x| mse_loss(x[0], x[1])),
        case("gelu", vec![rand(&[2, 3], -3.0, 3.0, 95)], |_, x| x[0].gelu()),
        case("silu", vec![rand(&[2, 3], -3.0, 3.0, 96)], |_, x| x[0].silu()),
        // Clamp bounds ±0.5; values at least 0.1 away from them.
        case("clamp", vec![given(&[-1.2, -0.3, 0.1, 0.35, 0.7, 1.5], &[2, 3])], |_, x| x[0].clamp(-0.5, 0.5)),
        case("square", vec![rand(&[2, 3], -2.0, 2.0, 97)], |_, x| x[0].square()),
    ];
    run_all(&Suite::cpu(CPU_CAP), cases);
}
