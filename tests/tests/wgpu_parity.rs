//! The wgpu backend against the CPU reference: every op forward and through
//! its gradient, limits, determinism, and a small training run.
//!
//! Needs a Vulkan adapter (lavapipe, Mesa's software driver, on CI). With the
//! `CI` environment variable set a missing adapter FAILS the tests; without
//! it they print a note and pass vacuously.
//!
//! Tolerances, per family (|gpu - cpu| <= tol * max(1, |cpu|), NaN == NaN):
//! - exact (0): creation, movement, indexing, comparisons, Where, casts,
//!   integer arithmetic, Neg/Abs/Relu/Sign, Maximum/Minimum, Max/Min/ArgMax/
//!   ArgMin reductions, ScatterAdd (summed in the CPU's order) — these move
//!   or select values, or are exact in any order; Im2Col, MaxPool2d, and
//!   Col2Im and MaxPool2dBackward (gathers that add in the CPU's order);
//!   RandUniform (the same 32-bit hash, an exact 24-bit scaling);
//! - ARITH (1e-6, ~8 ulps): Add/Sub/Mul/Div/Recip/Sqrt — Vulkan allows
//!   division and sqrt a couple of ulps (2.5 ulp for 1/x);
//! - TRANSCENDENTAL (2e-5): Exp, Log, Tanh, Sigmoid, Erf, Erfc, Log1p, Expm1,
//!   Pow — GPU
//!   builtins (exp, log, pow) are not correctly rounded (Vulkan: exp within
//!   3 + 2|x| ulps, pow through exp2/log2), and erf/erfc/tanh/sigmoid build
//!   on exp; RandNormal (f32 Box–Muller with the kernel's own ln and cos,
//!   measured within 4 ulps / 3.3e-7 of the CPU on lavapipe);
//! - TRIG (5e-4 absolute): Sin, Cos — Vulkan only bounds their error by
//!   2^-11 absolute on [-pi, pi];
//! - SUMS (2e-5): Sum/Prod reductions and MatMul — the GPU sums in a
//!   different order (tree reductions, tiled products, fused multiply-add);
//! - GRADIENTS (1e-4): backward graphs chain several of the above.

mod common;

use kiln::host_rng::SplitMix64;
use kiln::prelude::*;
use kiln::{BinaryOp, CompareOp, ErrorKind, Op, ReduceOp, UnaryOp, Window2d};
use kiln_wgsl::WgpuOptions;

const EXACT: f64 = 0.0;
const ARITH: f64 = 1e-6;
const TRANSCENDENTAL: f64 = 2e-5;
const TRIG: f64 = 5e-4;
const SUMS: f64 = 2e-5;
const GRADIENTS: f64 = 1e-4;

fn wgpu_device_with(options: WgpuOptions) -> Option<Device> {
    common::vulkan_device_with(options, "the wgpu parity test")
}

fn wgpu_device() -> Option<Device> {
    common::vulkan_device("the wgpu parity test")
}

/// Deterministic values in [lo, hi).
fn rand(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| lo + (hi - lo) * r.next_f32()).collect()
}

fn read(t: &Tensor<'_>) -> HostData {
    pollster::block_on(t.to_host()).unwrap_or_else(|e| panic!("reading {t:?}: {e}"))
}

#[track_caller]
fn compare(what: &str, got: &HostData, want: &HostData, tol: f64) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    assert_eq!(g.len(), w.len(), "{what}: length");
    for (i, (a, e)) in g.iter().zip(&w).enumerate() {
        let ok = if a.is_nan() || e.is_nan() {
            a.is_nan() && e.is_nan()
        } else if tol == 0.0 || e.is_infinite() {
            a == e
        } else {
            (a - e).abs() <= tol * e.abs().max(1.0)
        };
        assert!(ok, "{what}: element {i}: wgpu {a}, cpu {e} (tol {tol})\n  wgpu {g:?}\n  cpu  {w:?}");
    }
}

/// Build the same graph on the CPU and on wgpu; compare every output.
fn forward<F>(wg: &Device, what: &str, tol: f64, build: F)
where
    F: for<'g> Fn(&'g Graph) -> kiln::Result<Vec<Tensor<'g>>>,
{
    let run = |device: &Device| {
        let g = Graph::new(device);
        let outs = build(&g).unwrap_or_else(|e| panic!("{what}: building: {e}"));
        outs.iter().map(read).collect::<Vec<_>>()
    };
    let (want, got) = (run(&Device::cpu()), run(wg));
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        compare(&format!("{what} output {k}"), g, w, tol);
    }
}

/// Build outputs from leaves on both devices, then differentiate
/// loss = sum_k sum(out_k * r_k) (fixed random r) with respect to the leaves
/// and compare the forward values (tolerance `tol`) and gradients.
fn backward<F>(wg: &Device, what: &str, tol: f64, build: F)
where
    F: for<'g> Fn(&'g Graph) -> kiln::Result<(Vec<Tensor<'g>>, Vec<Tensor<'g>>)>,
{
    let run = |device: &Device| -> kiln::Result<(Vec<HostData>, usize)> {
        let g = Graph::new(device);
        let (outs, leaves) = build(&g)?;
        let mut loss: Option<Tensor<'_>> = None;
        for (k, o) in outs.iter().enumerate() {
            let r = g.tensor_from(&rand(o.numel(), 900 + k as u64, -1.0, 1.0), &o.dims())?;
            let term = o.mul(r)?.sum_all()?;
            loss = Some(match loss {
                None => term,
                Some(l) => l.add(term)?,
            });
        }
        let grads = g.grad(loss.expect("an output"), &leaves, None)?;
        let mut values: Vec<HostData> = outs.iter().map(read).collect();
        values.extend(grads.iter().map(read));
        Ok((values, outs.len()))
    };
    let (want, n_out) = run(&Device::cpu()).unwrap_or_else(|e| panic!("{what} on cpu: {e}"));
    let (got, _) = run(wg).unwrap_or_else(|e| panic!("{what} on wgpu: {e}"));
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let (kind, tol) = if k < n_out { ("value", tol) } else { ("gradient", GRADIENTS.max(tol)) };
        compare(&format!("{what} {kind} {k}"), g, w, tol);
    }
}

#[test]
fn creation_ops() {
    let Some(wg) = wgpu_device() else { return };
    forward(&wg, "full/arange", EXACT, |g| {
        Ok(vec![
            g.full(&[2, 3], 2.5, DType::F32)?,
            g.full(&[4], -2.7, DType::I32)?,
            g.full(&[3], 2.0, DType::Bool)?,
            g.full(&[0], 1.0, DType::F32)?,
            g.arange(1.0, 0.5, 9, DType::F32)?,
            g.arange(-1.0, -0.75, 6, DType::I32)?,
            g.arange(-3.0, 2.0, 5, DType::I32)?,
        ])
    });
}

#[test]
fn unary_ops_forward_and_backward() {
    let Some(wg) = wgpu_device() else { return };
    for op in UnaryOp::ALL {
        let (lo, hi) = match op {
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Recip => (0.1, 4.0),
            UnaryOp::Log1p => (-0.9, 4.0),
            _ => (-3.0, 3.0),
        };
        let tol = match op {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Sign => EXACT,
            UnaryOp::Sqrt | UnaryOp::Recip => ARITH,
            UnaryOp::Sin | UnaryOp::Cos => TRIG,
            _ => TRANSCENDENTAL,
        };
        let x = rand(37, op as u64, lo, hi);
        forward(&wg, op.name(), tol, |g| Ok(vec![g.tensor_from(&x, &[37])?.unary(op)?]));
        if !matches!(op, UnaryOp::Sign) {
            backward(&wg, op.name(), tol, |g| {
                let v = g.variable(&x, &[37])?;
                Ok((vec![v.unary(op)?], vec![v]))
            });
        }
    }
    // Special values: NaN passes Relu/Sign/Sigmoid, huge inputs saturate.
    let specials = [f32::NAN, -1000.0, 1000.0, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1e-30, 5.5, -12.0];
    let specials_of = [UnaryOp::Relu, UnaryOp::Sign, UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::Erf, UnaryOp::Erfc];
    for op in specials_of.into_iter().chain([UnaryOp::Log1p, UnaryOp::Expm1]) {
        let tol = if matches!(op, UnaryOp::Relu | UnaryOp::Sign) { EXACT } else { TRANSCENDENTAL };
        forward(&wg, &format!("{} of specials", op.name()), tol, |g| {
            Ok(vec![g.tensor_from(&specials, &[specials.len()])?.unary(op)?])
        });
    }
    // Log1p and Expm1 exist for their accuracy near 0: scaled by 2^20
    // (exact on both sides), tiny results are compared relatively.
    let tiny = [1e-7f32, -1e-6, 3e-5, -2e-4, 1e-3, -4e-3, 0.05, -0.2, 0.3, -0.35, 0.45, 1e-30];
    for op in [UnaryOp::Log1p, UnaryOp::Expm1] {
        forward(&wg, &format!("{} near 0", op.name()), TRANSCENDENTAL, |g| {
            let x = g.tensor_from(&tiny, &[tiny.len()])?;
            Ok(vec![x.unary(op)?.div(x)?, x.unary(op)?.mul(1048576.0)?])
        });
    }
    let ints = [i32::MIN, -3, 0, 5, i32::MAX];
    for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Sign] {
        forward(&wg, &format!("{} i32", op.name()), EXACT, |g| Ok(vec![g.tensor_from(&ints, &[5])?.unary(op)?]));
    }
}

#[test]
fn binary_ops_broadcast_forward_and_backward() {
    let Some(wg) = wgpu_device() else { return };
    for op in BinaryOp::ALL {
        let tol = match op {
            BinaryOp::Maximum | BinaryOp::Minimum => EXACT,
            BinaryOp::Pow => TRANSCENDENTAL,
            _ => ARITH,
        };
        let (lo, hi) = if matches!(op, BinaryOp::Pow | BinaryOp::Div) { (0.2, 2.0) } else { (-2.0, 2.0) };
        let a = rand(12, 1, lo, hi);
        let b = rand(8, 2, lo, hi);
        forward(&wg, op.name(), tol, |g| {
            let x = g.tensor_from(&a, &[3, 1, 4])?;
            let y = g.tensor_from(&b, &[2, 4])?;
            let s = g.tensor_from(&[1.5f32], &[])?;
            Ok(vec![x.binary(op, y)?, y.binary(op, x)?, x.binary(op, s)?, y.binary(op, y)?])
        });
        backward(&wg, op.name(), tol, |g| {
            let x = g.variable(&a, &[3, 1, 4])?;
            let y = g.variable(&b, &[2, 4])?;
            Ok((vec![x.binary(op, y)?], vec![x, y]))
        });
    }
    // Ties and NaN in Maximum/Minimum, Pow's special cases.
    let a = [1.0f32, f32::NAN, 2.0, 0.0, -2.0, -2.0, 0.0, 4.0, -8.0];
    let b = [1.0f32, 3.0, f32::NAN, -0.0, 2.0, 3.0, -1.0, 0.5, 1.0 / 3.0];
    for op in BinaryOp::ALL {
        let tol = if matches!(op, BinaryOp::Pow) {
            TRANSCENDENTAL
        } else if matches!(op, BinaryOp::Maximum | BinaryOp::Minimum) {
            EXACT
        } else {
            ARITH
        };
        forward(&wg, &format!("{} specials", op.name()), tol, |g| {
            Ok(vec![g.tensor_from(&a, &[9])?.binary(op, g.tensor_from(&b, &[9])?)?])
        });
    }
    // i32 wraps.
    let a = [i32::MAX, i32::MIN, -7, 3, 0, 1 << 20];
    let b = [1, -1, 7, -3, 0, 1 << 12];
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Maximum, BinaryOp::Minimum] {
        forward(&wg, &format!("{} i32", op.name()), EXACT, |g| {
            Ok(vec![g.tensor_from(&a, &[6])?.binary(op, g.tensor_from(&b, &[1, 6])?)?])
        });
    }
}

#[test]
fn comparisons_where_and_casts() {
    let Some(wg) = wgpu_device() else { return };
    let a = [1.0f32, f32::NAN, 2.0, 0.0, -1.0, 3.0];
    let b = [1.0f32, 1.0, f32::NAN, -0.0, 2.0, -3.0];
    let ia = [1, 2, 3, i32::MIN, 0, 9];
    let ib = [1, 3, 2, i32::MAX, 0, -9];
    for op in CompareOp::ALL {
        forward(&wg, op.name(), EXACT, |g| {
            let (x, y) = (g.tensor_from(&a, &[2, 3])?, g.tensor_from(&b, &[2, 3])?);
            let (p, q) = (g.tensor_from(&ia, &[6])?, g.tensor_from(&ib, &[1, 6])?);
            let bools = p.compare(CompareOp::Less, q)?;
            Ok(vec![
                x.compare(op, y)?,
                x.compare(op, g.tensor_from(&[1.0f32], &[1])?)?,
                p.compare(op, q)?,
                bools.compare(op, p.compare(CompareOp::Greater, q)?)?,
            ])
        });
    }
    forward(&wg, "where", EXACT, |g| {
        let c = g.tensor_from(&[true, false], &[2, 1])?;
        let x = g.tensor_from(&rand(6, 3, -1.0, 1.0), &[2, 3])?;
        let i = g.tensor_from(&[1i32, 2, 3], &[3])?;
        let bc = g.tensor_from(&[true, false, true], &[3])?;
        Ok(vec![
            c.where_(x, 0.5)?,
            c.where_(i, g.tensor_from(&[-1i32], &[1])?)?,
            c.where_(bc, g.full(&[2, 3], 0.0, DType::Bool)?)?,
        ])
    });
    backward(&wg, "where", EXACT, |g| {
        let c = g.tensor_from(&[true, false, false, true], &[4, 1])?;
        let x = g.variable(&rand(12, 4, -1.0, 1.0), &[4, 3])?;
        let y = g.variable(&rand(3, 5, -1.0, 1.0), &[3])?;
        Ok((vec![c.where_(x, y)?], vec![x, y]))
    });
    let f = [0.0f32, -0.0, 2.5, -2.7, 3e9, -3e9, f32::NAN, f32::INFINITY, 1e-40, 16777217.0];
    let i = [0i32, 1, -1, i32::MAX, i32::MIN, 16777217];
    let bl = [true, false, true];
    for to in [DType::F32, DType::I32, DType::Bool] {
        forward(&wg, &format!("cast to {to}"), EXACT, |g| {
            Ok(vec![
                g.tensor_from(&f, &[10])?.cast(to)?,
                g.tensor_from(&i, &[6])?.cast(to)?,
                g.tensor_from(&bl, &[3])?.cast(to)?,
            ])
        });
    }
}

/// Sums and products over an empty axis give the identity per output, as on
/// the CPU (the fold of no elements: reduce.wgsl's `fold_range`).
#[test]
fn reductions_over_an_empty_axis() {
    let Some(wg) = wgpu_device() else { return };
    forward(&wg, "empty reductions", EXACT, |g| {
        let x = g.zeros(&[3, 0, 2], DType::F32)?;
        Ok(vec![x.sum(&[1], false)?, x.reduce(ReduceOp::Prod, &[1], true)?, x.sum(&[0, 1], false)?])
    });
}

#[test]
fn reductions_forward_and_backward() {
    let Some(wg) = wgpu_device() else { return };
    // [5, 6, 7]: short blocks (one thread per output); [3, 300] and
    // [150, 2, 3] over axes 0 and (0, 2): long blocks (a workgroup tree per
    // output).
    let small = rand(210, 7, -1.0, 1.0);
    let long = rand(900, 8, -1.0, 1.0);
    let near_one = rand(900, 9, 0.95, 1.05);
    let axes_small: [&[isize]; 5] = [&[0], &[1], &[2], &[0, 2], &[0, 1, 2]];
    for op in ReduceOp::ALL {
        let tol = if matches!(op, ReduceOp::Sum | ReduceOp::Prod) { SUMS } else { EXACT };
        let base = if op == ReduceOp::Prod { &near_one } else { &long };
        forward(&wg, op.name(), tol, |g| {
            let x = g.tensor_from(&small[..], &[5, 6, 7])?;
            let y = g.tensor_from(&base[..], &[3, 300])?;
            let z = g.tensor_from(&base[..], &[150, 2, 3])?;
            let mut outs = vec![];
            for (k, axes) in axes_small.iter().enumerate() {
                outs.push(x.reduce(op, axes, k % 2 == 0)?);
            }
            outs.push(y.reduce(op, &[1], false)?);
            outs.push(y.reduce(op, &[0, 1], false)?);
            outs.push(z.reduce(op, &[0], true)?);
            outs.push(z.reduce(op, &[0, 2], false)?);
            Ok(outs)
        });
        if !matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
            backward(&wg, op.name(), tol, |g| {
                let x = g.variable(&small[..], &[5, 6, 7])?;
                let y = g.variable(&base[..], &[3, 300])?;
                Ok((vec![x.reduce(op, &[0, 2], false)?, y.reduce(op, &[1], true)?], vec![x, y]))
            });
        }
    }
    // Blocks past one workgroup's 256 leaves (32,768 elements): a second
    // pass over partials, for every op (values near 1 keep Prod finite).
    let longer = rand(2 * 40_000, 10, 0.999, 1.001);
    for op in ReduceOp::ALL {
        let tol = if matches!(op, ReduceOp::Sum | ReduceOp::Prod) { SUMS } else { EXACT };
        forward(&wg, &format!("{} over two passes", op.name()), tol, |g| {
            let y = g.tensor_from(&longer[..], &[2, 40_000])?;
            Ok(vec![y.reduce(op, &[1], false)?, y.reduce(op, &[0, 1], false)?])
        });
    }
    // A few leaves per output (one thread folds them: 6 and 8 leaves) and
    // just past that (9 leaves: a workgroup per output) give the summation
    // rule's bits, the CPU's.
    let rows = rand(9 * 1025, 12, -1.0, 1.0);
    forward(&wg, "Sum over a few leaves", EXACT, |g| {
        let y = g.tensor_from(&rows[..700 * 5], &[700, 5])?;
        let z = g.tensor_from(&rows[..], &[9, 1025])?;
        Ok(vec![y.sum(&[0], false)?, z.slice_axis(1, 0, 1024, 1)?.sum(&[1], false)?, z.sum(&[1], false)?])
    });
    // NaN, ties and integers.
    let x = [1.0f32, f32::NAN, 3.0, 5.0, 5.0, 5.0, 0.0, 5.0];
    let ints: Vec<i32> = (0..600).map(|i| (i * 7919 % 1000) - 500).collect();
    for op in ReduceOp::ALL {
        forward(&wg, &format!("{} specials", op.name()), EXACT, |g| {
            let t = g.tensor_from(&x, &[2, 4])?;
            let i = g.tensor_from(&ints, &[2, 300])?;
            let mut outs = vec![t.reduce(op, &[1], false)?, t.reduce(op, &[0], false)?];
            if op != ReduceOp::Prod {
                outs.push(i.reduce(op, &[1], false)?);
                outs.push(i.reduce(op, &[0, 1], false)?);
            }
            Ok(outs)
        });
    }
    forward(&wg, "i32 sum wraps", EXACT, |g| Ok(vec![g.tensor_from(&[i32::MAX, 1], &[2])?.sum_all()?]));
}

#[test]
fn matmul_forward_and_backward() {
    let Some(wg) = wgpu_device() else { return };
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let sa = |m: usize, k: usize| if ta { [k, m] } else { [m, k] };
        let sb = |k: usize, n: usize| if tb { [n, k] } else { [k, n] };
        let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
            (sa(3, 4).to_vec(), sb(4, 5).to_vec()),
            (sa(70, 65).to_vec(), sb(65, 66).to_vec()),
            ([&[2usize][..], &sa(5, 3)].concat(), [&[2usize][..], &sb(3, 4)].concat()),
            ([&[4usize, 1][..], &sa(2, 3)].concat(), [&[3usize][..], &sb(3, 4)].concat()),
            ([&[5usize][..], &sa(2, 3)].concat(), sb(3, 4).to_vec()),
        ];
        for (k, (ad, bd)) in cases.iter().enumerate() {
            let what = format!("matmul {ta} {tb} case {k}");
            let na: usize = ad.iter().product();
            let nb: usize = bd.iter().product();
            let (a, b) = (rand(na, 20 + k as u64, -1.0, 1.0), rand(nb, 40 + k as u64, -1.0, 1.0));
            forward(&wg, &what, SUMS, |g| Ok(vec![g.tensor_from(&a, ad)?.matmul_t(g.tensor_from(&b, bd)?, ta, tb)?]));
            if k != 1 {
                backward(&wg, &what, SUMS, |g| {
                    let (x, y) = (g.variable(&a, ad)?, g.variable(&b, bd)?);
                    Ok((vec![x.matmul_t(y, ta, tb)?], vec![x, y]))
                });
            }
        }
    }
    forward(&wg, "matmul with k = 0", EXACT, |g| {
        Ok(vec![g.tensor_from::<f32>(&[], &[2, 0])?.matmul(g.tensor_from::<f32>(&[], &[0, 3])?)?])
    });
}

/// (values, dims, transposed) x (values, dims, transposed) in `g`.
fn product<'g>(
    g: &'g Graph,
    (a, ad, ta): (&[f32], &[usize], bool),
    (b, bd, tb): (&[f32], &[usize], bool),
) -> kiln::Result<Tensor<'g>> {
    g.tensor_from(a, ad)?.matmul_t(g.tensor_from(b, bd)?, ta, tb)
}

/// Each of matmul.wgsl's kernels, forced for every product, against the
/// CPU: ragged edges of both tiles (130 x 135), matrix-vector products
/// both ways, M below four and past a multiple of four, broadcast batches (a B shared by every batch folded into M),
/// transposed operands and a K split into chunks (1100 > K_CHUNK); natively
/// also matmul_vec4.wgsl's kernels, forced where they take the product
/// (sizes multiples of 4, in all four layouts). The kernels sum in one order, so they also agree
/// with each other exactly (== also equates the zeros the tiles' padding may
/// sign differently).
#[test]
fn every_matmul_kernel_matches_the_cpu_and_the_others() {
    let shapes: [(&[usize], &[usize], bool, bool); 21] = [
        (&[130, 20], &[20, 135], false, false),
        // Fewer than four rows, and four-row blocks past the last row (the
        // skinny kernel's 1 x 4 and 4 x 4 blocks).
        (&[3, 40], &[40, 7], false, false),
        (&[6, 13], &[5, 13], false, true),
        (&[20, 130], &[135, 20], true, true),
        (&[1, 300], &[300, 70], false, false),
        (&[70, 300], &[300, 1], false, false),
        (&[3, 1, 9, 17], &[2, 17, 66], false, false),
        (&[5, 1100], &[3, 1100], false, true),
        (&[66, 9], &[9, 129], false, false),
        // A shared B: the batch folds into M (also with a chunked K); a
        // transposed A does not fold.
        (&[2, 3, 20, 17], &[17, 30], false, false),
        (&[3, 5, 1100], &[7, 1100], false, true),
        (&[4, 17, 20], &[17, 30], true, false),
        // Aligned operands (the vec4 kernels' products) in all four layouts,
        // over the edges of their 32 x 128 tile (64 x 128 for the tall
        // variant: 36 rows fill part of one), batched with broadcast,
        // folded, and with a chunked K.
        (&[36, 20], &[20, 132], false, false),
        (&[20, 36], &[20, 132], true, false),
        (&[36, 20], &[132, 20], false, true),
        (&[20, 36], &[132, 20], true, true),
        (&[3, 1, 12, 16], &[2, 16, 68], false, false),
        (&[2, 3, 20, 16], &[16, 28], false, false),
        (&[8, 1100], &[12, 1100], false, true),
        // Past the staged kernel's 128 x 128 tile on both sides, with K a
        // multiple of 4 but not of its 8-deep slab (a half slab of zeros).
        (&[132, 20], &[20, 136], false, false),
        (&[20, 132], &[136, 20], true, true),
    ];
    let mut first: Vec<Vec<f32>> = Vec::new();
    for kernel in kiln_wgsl::MatMulKernel::ALL {
        let options = WgpuOptions { matmul_kernel: Some(kernel), ..WgpuOptions::default() };
        let Some(wg) = wgpu_device_with(options) else { return };
        for (i, &(ad, bd, ta, tb)) in shapes.iter().enumerate() {
            let (a, b) = (
                rand(ad.iter().product(), 60 + i as u64, -1.0, 1.0),
                rand(bd.iter().product(), 80 + i as u64, -1.0, 1.0),
            );
            let what = format!("{kernel:?} on {ad:?} x {bd:?} ({ta}, {tb})");
            forward(&wg, &what, SUMS, |g| Ok(vec![product(g, (&a, ad, ta), (&b, bd, tb))?]));
            let g = Graph::new(&wg);
            let got = product(&g, (&a, ad, ta), (&b, bd, tb))
                .and_then(|c| c.to_vec_blocking::<f32>())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            match first.get(i) {
                None => first.push(got),
                Some(want) => assert!(got == *want, "{what} differs from {:?}'s bits", kiln_wgsl::MatMulKernel::ALL[0]),
            }
        }
    }
}

#[test]
fn movement_forward_and_backward() {
    let Some(wg) = wgpu_device() else { return };
    let x = rand(60, 11, -1.0, 1.0);
    let ints: Vec<i32> = (0..60).collect();
    let bools: Vec<bool> = (0..60).map(|i| i % 3 == 0).collect();
    forward(&wg, "movement", EXACT, |g| {
        let mut outs = vec![];
        for t in [g.tensor_from(&x, &[3, 4, 5])?, g.tensor_from(&ints, &[3, 4, 5])?, g.tensor_from(&bools, &[3, 4, 5])?]
        {
            outs.push(t.reshape(&[5, -1])?);
            outs.push(t.permute(&[2, 0, 1])?);
            outs.push(t.permute(&[1, 2, 0])?);
            outs.push(t.slice(&[SliceSpec::new(1, 3, 1), SliceSpec::new(0, 4, 3), SliceSpec::new(1, 5, 2)])?);
            outs.push(t.slice_axis(2, 4, 5, 1)?);
            outs.push(t.slice_axis(0, 0, 3, 2)?.expand(&[2, 2, 4, 5])?);
            outs.push(t.slice_axis(1, 0, 1, 1)?.expand(&[3, 4, 5])?);
            let s = t.slice(&[SliceSpec::all(), SliceSpec::new(1, 4, 2), SliceSpec::new(0, 5, 2)])?;
            outs.push(
                s.slice_backward(&[3, 4, 5], &[SliceSpec::all(), SliceSpec::new(1, 4, 2), SliceSpec::new(0, 5, 2)])?,
            );
            outs.push(Tensor::concat(&[t, t.slice_axis(1, 0, 2, 1)?, t], 1)?);
            outs.push(Tensor::concat(&[t, t], 0)?);
        }
        Ok(outs)
    });
    backward(&wg, "movement", EXACT, |g| {
        let v = g.variable(&x, &[3, 4, 5])?;
        let w = g.variable(&x[..20], &[1, 4, 5])?;
        Ok((
            vec![
                v.permute(&[2, 0, 1])?,
                v.slice(&[SliceSpec::new(0, 3, 2), SliceSpec::all(), SliceSpec::new(1, 5, 3)])?,
                w.expand(&[3, 4, 5])?,
                Tensor::concat(&[v, w], 0)?,
                v.reshape(&[12, 5])?,
            ],
            vec![v, w],
        ))
    });
}

/// The kernels with two launches, one element per thread (GPUs) and eight
/// (software adapters), forced both ways on lavapipe. strided.wgsl's
/// `main`/`main8`: innermost rows shorter than, equal to and longer than
/// eight (a thread's elements cross rows), a single element, broadcasts of
/// every operand, transposes, stepped slices, expands, concatenations into
/// strided destinations, ints and bools. The folded Im2Col's
/// `im2col`/`im2col8` (a convolution's forward and gradients, strided and
/// padded) and the max-pool gradient's `backward`/`backward8` (every pooling
/// case, windows disjoint or not, rows of 9 crossing threads). Each against
/// the CPU, and the two launches against each other bit for bit.
#[test]
fn kernels_one_or_eight_elements_per_thread() {
    let mut results: Vec<Vec<HostData>> = Vec::new();
    for eight in [false, true] {
        let options = WgpuOptions { eight_elements_per_thread: Some(eight), ..WgpuOptions::default() };
        let Some(wg) = wgpu_device_with(options) else { return };
        forward(&wg, &format!("strided kernels, eight per thread: {eight}"), EXACT, strided_graph);
        forward(&wg, &format!("folded convolutions, eight per thread: {eight}"), SUMS, folded_conv_graph);
        let g = Graph::new(&wg);
        let mut outs = strided_graph(&g).unwrap();
        outs.extend(folded_conv_graph(&g).unwrap());
        results.push(outs.iter().map(read).collect());
    }
    for (k, (one, eight)) in results[0].iter().zip(&results[1]).enumerate() {
        let bits = |h: &HostData| h.to_f64_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(one), bits(eight), "output {k}: one and eight per thread differ");
    }
}

/// The exact part of `kernels_one_or_eight_elements_per_thread`.
fn strided_graph(g: &Graph) -> kiln::Result<Vec<Tensor<'_>>> {
    let x = rand(2 * 3 * 7 * 9, 21, -2.0, 2.0);
    let ints: Vec<i32> = (0..378).map(|i| (i * 37 % 101) - 50).collect();
    {
        let t = g.tensor_from(&x, &[2, 3, 7, 9])?;
        let col = g.tensor_from(&x[..7], &[7, 1])?;
        let row = g.tensor_from(&x[7..16], &[9])?;
        let i = g.tensor_from(&ints, &[6, 63])?;
        let one = g.tensor_from(&x[..1], &[1])?;
        let c = t.compare(CompareOp::Greater, row)?;
        let mut outs = vec![
            t.add(col)?,
            t.mul(row)?,
            t.reshape(&[6, 63])?.sub(t.reshape(&[6, 63])?.slice_axis(1, 0, 1, 1)?)?,
            one.add(one)?,
            i.add(i.slice_axis(0, 5, 6, 1)?)?,
            c.clone(),
            c.where_(t, col.expand(&[2, 3, 7, 9])?)?,
            t.permute(&[3, 0, 2, 1])?,
            t.permute(&[0, 2, 1, 3])?,
            t.slice_axis(3, 1, 9, 3)?,
            t.slice_axis(2, 0, 7, 2)?.expand(&[2, 2, 3, 4, 9])?,
            row.expand(&[5, 9])?,
            Tensor::concat(&[t, t.slice_axis(3, 0, 5, 1)?, t], 3)?,
            Tensor::concat(&[i, i.slice_axis(1, 0, 7, 1)?], 1)?,
            t.slice_backward(
                &[2, 3, 7, 18],
                &[SliceSpec::all(), SliceSpec::all(), SliceSpec::all(), SliceSpec::new(0, 18, 2)],
            )?,
        ];
        // 1,000 elements: a last thread with fewer than eight.
        let long = g.tensor_from(&rand(1000, 22, -1.0, 1.0), &[8, 125])?;
        outs.push(long.add(long.slice_axis(0, 0, 1, 1)?)?);
        outs.push(long.permute(&[1, 0])?);
        // Reductions past eight leaves: on software adapters a thread per
        // group of eight leaves and one per output for the partials (no
        // barriers), on GPUs workgroup trees; the same tree either way.
        // 94 leaves per output, 32 with axes kept on both sides, and 1,100
        // (more partials than one thread combines).
        let mut long = rand(140_800, 27, -1.0, 1.0);
        long[5000] = f32::NAN;
        let wide = g.tensor_from(&long[..12_000], &[2, 3, 2000])?;
        let all = g.tensor_from(&long, &[140_800])?;
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::ArgMax] {
            outs.push(wide.reduce(op, &[0, 2], false)?);
            outs.push(wide.reduce(op, &[0, 1, 2], false)?);
            outs.push(all.reduce(op, &[0], false)?);
        }
        // Max-pool gradients (with ties and NaNs).
        let ties = pool_input(x.len(), 23, &[0, 10, 200]);
        for (k, s, p, d, ceil) in pools() {
            let v = g.variable(&ties, &[2, 3, 7, 9])?;
            let y = v.max_pool2d(k, s, p, d, ceil)?;
            let r = g.tensor_from(&rand(y.numel(), 24, -1.0, 1.0), &y.dims())?;
            outs.extend(g.grad(y.mul(r)?.sum_all()?, &[v], None)?);
        }
        Ok(outs)
    }
}

/// The folded convolutions of `kernels_one_or_eight_elements_per_thread`
/// (batch 3, 5 x 7 images; products on both sides, so not exact).
fn folded_conv_graph(g: &Graph) -> kiln::Result<Vec<Tensor<'_>>> {
    let img = rand(3 * 6 * 5 * 7, 25, -1.0, 1.0);
    let mut outs = vec![];
    for (stride, padding) in [([1, 1], [1, 1]), ([2, 1], [0, 1])] {
        let options = ConvOptions { stride, padding, ..ConvOptions::default() };
        let conv = Conv2d::new(g.device(), 6, 5, [3, 3], options, 3)?;
        let v = g.variable(&img, &[3, 6, 5, 7])?;
        let permutes = g.count_ops("Permute");
        let y = conv.forward(v)?;
        // The folded path permutes its output.
        assert_eq!(g.count_ops("Permute"), permutes + 1, "the convolution did not fold");
        let r = g.tensor_from(&rand(y.numel(), 26, -1.0, 1.0), &y.dims())?;
        outs.push(y);
        outs.extend(g.grad(y.mul(r)?.sum_all()?, &[v, g.param(&conv.weight)?], None)?);
    }
    Ok(outs)
}

#[test]
fn index_select_and_scatter_add() {
    let Some(wg) = wgpu_device() else { return };
    let x = rand(30, 12, -1.0, 1.0);
    let idx = [2i32, 0, 2, 1, 4, 4, 4];
    forward(&wg, "index_select/scatter_add", EXACT, |g| {
        let t = g.tensor_from(&x, &[5, 6])?;
        let i = g.tensor_from(&idx, &[7])?;
        let src = g.tensor_from(&rand(42, 13, -1.0, 1.0), &[7, 6])?;
        let srct = g.tensor_from(&rand(35, 14, -1.0, 1.0), &[5, 7])?;
        let ints = g.tensor_from(&(0..30).collect::<Vec<i32>>(), &[5, 6])?;
        let bools = g.tensor_from(&(0..30).map(|k| k % 4 == 1).collect::<Vec<_>>(), &[5, 6])?;
        Ok(vec![
            t.index_select(0, i)?,
            t.index_select(1, i)?,
            ints.index_select(0, i)?,
            bools.index_select(1, i)?,
            t.scatter_add(0, i, src)?,
            t.scatter_add(1, i, srct)?,
            ints.scatter_add(0, i, ints.index_select(0, i)?)?,
        ])
    });
    backward(&wg, "index_select/scatter_add", EXACT, |g| {
        let t = g.variable(&x, &[5, 6])?;
        let s = g.variable(&rand(42, 15, -1.0, 1.0), &[7, 6])?;
        let i = g.tensor_from(&idx, &[7])?;
        Ok((vec![t.index_select(0, i)?, t.scatter_add(0, i, s)?], vec![t, s]))
    });
    // Out of range: an error naming the op, as on the CPU.
    for device in [Device::cpu(), wg.clone()] {
        let g = Graph::new(&device);
        let t = g.tensor_from(&[1.0f32, 2., 3., 4., 5., 6.], &[3, 2]).unwrap();
        let e =
            t.index_select(0, g.tensor_from(&[0i32, 3], &[2]).unwrap()).unwrap().to_vec_blocking::<f32>().unwrap_err();
        assert_eq!((e.kind(), e.op()), (ErrorKind::OutOfRange, "IndexSelect"), "{}: {e}", device.name());
        assert!(e.message().contains("index 3 at position 1") && e.message().contains("size 3"), "{e}");
        let s = g.tensor_from(&[0.0f32; 4], &[2, 2]).unwrap();
        let e = t
            .scatter_add(0, g.tensor_from(&[-1i32, 0], &[2]).unwrap(), s)
            .unwrap()
            .to_vec_blocking::<f32>()
            .unwrap_err();
        assert_eq!((e.kind(), e.op()), (ErrorKind::OutOfRange, "ScatterAdd"), "{}: {e}", device.name());
        assert!(e.message().contains("index -1 at position 0"), "{e}");
        // The device still works.
        assert_eq!(t.sum_all().unwrap().item_blocking().unwrap(), 21.0);
    }
}

#[test]
fn composed_ops_backward() {
    let Some(wg) = wgpu_device() else { return };
    let x = rand(24, 16, -2.0, 2.0);
    let w = rand(20, 17, -1.0, 1.0);
    backward(&wg, "softmax / log_softmax / layer-norm-like / gelu", 1e-5, |g| {
        let xv = g.variable(&x, &[6, 4])?;
        let wv = g.variable(&w, &[4, 5])?;
        let h = xv.matmul(wv)?;
        let mean = h.mean(&[1], true)?;
        let centred = h.sub(mean)?;
        Ok((vec![h.softmax(1)?, h.log_softmax(0)?, centred.square()?.mean_all()?, h.gelu()?, h.silu()?], vec![xv, wv]))
    });
}

/// The fused CausalSoftmax kernel (one thread per row up to 128 keys,
/// workgroups over several passes beyond; see also `causal_softmax_long_rows`) forward and through its
/// gradient, with fully masked rows (negative diagonals) and -inf scores;
/// then the causal attention that uses it.
#[test]
fn causal_softmax_forward_and_backward() {
    let Some(wg) = wgpu_device() else { return };
    for (dims, diagonal) in
        [([2usize, 3, 5], 0i64), ([1, 4, 3], -1), ([2, 3, 4], 2), ([1, 3, 130], 64), ([1, 2, 200], -5)]
    {
        let n: usize = dims.iter().product();
        let mut x = rand(n, 40 + n as u64, -3.0, 3.0);
        // Some -inf scores: a row of them (row 1 of the first matrix, its
        // kept part) gives zeros; scattered ones are simply masked.
        for v in x.iter_mut().skip(dims[2]).take(dims[2]) {
            *v = f32::NEG_INFINITY;
        }
        x[n - 1] = f32::NEG_INFINITY;
        let what = format!("causal_softmax {dims:?} diagonal {diagonal}");
        forward(&wg, &what, TRANSCENDENTAL, |g| Ok(vec![g.tensor_from(&x, &dims)?.causal_softmax(diagonal)?]));
        let finite: Vec<f32> = x.iter().map(|v| if v.is_finite() { *v } else { -1.5 }).collect();
        backward(&wg, &what, TRANSCENDENTAL, |g| {
            let xv = g.variable(&finite, &dims)?;
            Ok((vec![xv.causal_softmax(diagonal)?], vec![xv]))
        });
    }
    let q = rand(24, 60, -1.0, 1.0);
    let k = rand(24, 61, -1.0, 1.0);
    let v = rand(24, 62, -1.0, 1.0);
    backward(&wg, "causal attention", TRANSCENDENTAL, |g| {
        let (qv, kv, vv) = (g.variable(&q, &[2, 4, 3])?, g.variable(&k, &[2, 4, 3])?, g.variable(&v, &[2, 4, 3])?);
        let y = kiln::nn::scaled_dot_product_attention(qv, kv, vv, None, true, None, None)?;
        Ok((vec![y], vec![qv, kv, vv]))
    });
}

/// The LayerNorm kernels (one thread per row up to 128 entries, one
/// workgroup per row beyond, up to 32,768) forward, through LayerNormBackward,
/// and through the backward kernel's own gradient (second order: the
/// gradient of a function of the gradient), against the CPU's; each graph
/// records the primitives on both devices.
#[test]
fn layer_norm_forward_and_backward() {
    let Some(wg) = wgpu_device() else { return };
    for dims in [[3usize, 1], [4, 7], [6, 128], [3, 129], [2, 1000], [1, 32_768]] {
        let n: usize = dims.iter().product();
        // An offset per row: the mean matters.
        let x: Vec<f32> =
            rand(n, 80 + n as u64, -2.0, 2.0).iter().enumerate().map(|(i, v)| v + (i / dims[1]) as f32).collect();
        let what = format!("layer_norm {dims:?}");
        forward(&wg, &what, SUMS, |g| Ok(vec![g.tensor_from(&x, &dims)?.layer_norm(1, 1e-5)?]));
        backward(&wg, &what, SUMS, |g| {
            let xv = g.variable(&x, &dims)?;
            let y = xv.layer_norm(1, 1e-5)?;
            assert_eq!(g.count_ops("LayerNorm"), 1, "{what}: the primitive on {}", g.device().name());
            Ok((vec![y], vec![xv]))
        });
        if n <= 4096 {
            backward(&wg, &format!("{what} second order"), SUMS, |g| {
                let xv = g.variable(&x, &dims)?;
                let w = g.tensor_from(&rand(n, 7, -1.0, 1.0), &dims)?;
                let first = g.grad(xv.layer_norm(1, 1e-5)?.mul(w)?.sum_all()?, &[xv], None)?;
                assert_eq!(g.count_ops("LayerNormBackward"), 1);
                Ok((vec![first[0].mul(w)?], vec![xv]))
            });
        }
    }
}

/// `got` within `tol` of `want` relative to each element (plus `tol` x 1e-3
/// of the largest |want|, for values that cancel), NaN == NaN: softmax
/// values over long rows are far below 1, where `compare` is absolute.
#[track_caller]
fn compare_relative(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (a, e)) in got.iter().zip(want).enumerate() {
        let ok = if a.is_nan() || e.is_nan() {
            a.is_nan() && e.is_nan()
        } else {
            (a - e).abs() <= tol * (e.abs() + 1e-3 * scale)
        };
        assert!(ok, "{what}: element {i}: wgpu {a}, cpu {e} (relative tolerance {tol})");
    }
}

/// CausalSoftmax rows longer than one leaf (128) take the multi-pass path:
/// the row max and the rule's sum of exponentials by workgroups over one or
/// more passes, then one thread per element. Rows of 129 (two leaves) and
/// of 40,000 (313 leaves: two workgroups, then a pass over their partials),
/// causal limits inside the row, a row of -inf (zeros) and a NaN (NaN row);
/// the largest score sits at the row's end, so a kernel that skipped part
/// of a row would get every value wrong. Forward and backward.
#[test]
fn causal_softmax_long_rows() {
    let Some(wg) = wgpu_device() else { return };
    for (dims, diagonal) in [([2usize, 2, 129], 127i64), ([1, 3, 40_000], 39_997), ([1, 2, 300], 100)] {
        let (l, s) = (dims[1], dims[2]);
        let n: usize = dims.iter().product();
        let mut x = rand(n, 70 + n as u64, -3.0, 3.0);
        for r in 0..n / s {
            // The last kept entry of each row is its maximum.
            let kept = ((r % l) as i64 + diagonal + 1).clamp(0, s as i64) as usize;
            if kept > 0 {
                x[r * s + kept - 1] = 9.0;
            }
        }
        let what = format!("causal_softmax {dims:?} diagonal {diagonal}");
        let mut special = x.clone();
        if dims[0] * dims[1] >= 3 {
            special[s..2 * s].fill(f32::NEG_INFINITY);
            special[2 * s + 5] = f32::NAN;
        }
        let run = |device: &Device, values: &[f32]| -> (Vec<f64>, Vec<f64>) {
            let g = Graph::new(device);
            let xv = g.variable(values, &dims).unwrap();
            let y = xv.causal_softmax(diagonal).unwrap();
            let r = g.tensor_from(&rand(n, 901, -1.0, 1.0), &dims).unwrap();
            let grads = g.grad(y.mul(r).unwrap().sum_all().unwrap(), &[xv], None).unwrap();
            (read(&y).to_f64_vec(), read(&grads[0]).to_f64_vec())
        };
        let ((want, want_grad), (got, got_grad)) = (run(&Device::cpu(), &x), run(&wg, &x));
        compare_relative(&format!("{what}: value"), &got, &want, 1e-5);
        compare_relative(&format!("{what}: gradient"), &got_grad, &want_grad, GRADIENTS);
        for r in 0..n / s {
            let total: f64 = got[r * s..(r + 1) * s].iter().sum();
            assert!((total - 1.0).abs() < 1e-4, "{what}: row {r} sums to {total} on wgpu");
        }
        let values = |device: &Device| {
            let g = Graph::new(device);
            read(&g.tensor_from(&special, &dims).unwrap().causal_softmax(diagonal).unwrap()).to_f64_vec()
        };
        compare_relative(&format!("{what} with -inf and NaN"), &values(&wg), &values(&Device::cpu()), 1e-5);
    }
}

fn optimizer_values(device: &Device, which: usize) -> Vec<f64> {
    let p = Param::new(device, "w", &rand(50, 30, -1.0, 1.0), &[5, 10]).unwrap();
    let mut opt: Box<dyn Optimizer> = match which {
        0 => Box::new(Sgd::new(vec![p.clone()], 0.1).unwrap()),
        1 => Box::new(Sgd::with_options(vec![p.clone()], 0.1, 0.9, 0.01, false).unwrap()),
        2 => Box::new(Sgd::with_options(vec![p.clone()], 0.1, 0.9, 0.0, true).unwrap()),
        3 => Box::new(Adam::new(vec![p.clone()], 0.01).unwrap()),
        _ => Box::new(Adam::adamw(vec![p.clone()], 0.01, 0.1).unwrap()),
    };
    let mut graph = Graph::new(device);
    for step in 0..4 {
        graph.reset();
        let target = graph.tensor_from(&rand(50, 40 + step, -1.0, 1.0), &[5, 10]).unwrap();
        let loss = graph.param(&p).unwrap().sub(target).unwrap().square().unwrap().sum_all().unwrap();
        opt.zero_grad();
        loss.backward().unwrap();
        opt.step().unwrap();
    }
    kiln::BlockingParam::value_blocking(&p).unwrap().to_f64_vec()
}

#[test]
fn optimizer_updates_match() {
    let Some(wg) = wgpu_device() else { return };
    for which in 0..5 {
        let want = optimizer_values(&Device::cpu(), which);
        let got = optimizer_values(&wg, which);
        compare(&format!("optimizer {which}"), &HostData::F64(got), &HostData::F64(want), 1e-6);
    }
}

#[test]
fn determinism_of_reductions_and_matmul() {
    let Some(wg) = wgpu_device() else { return };
    let x = rand(300 * 257, 50, -1.0, 1.0);
    let run = || {
        let g = Graph::new(&wg);
        let t = g.tensor_from(&x, &[300, 257]).unwrap();
        let outs = [
            t.sum_all().unwrap(),
            t.sum(&[0], false).unwrap(),
            t.prod(&[1], false).unwrap(),
            t.matmul_t(t, false, true).unwrap(),
        ];
        outs.iter()
            .map(|o| o.to_vec_blocking::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}

#[test]
fn lowered_binding_limit_is_a_clear_error() {
    let options = WgpuOptions { max_storage_buffer_binding_size: Some(1 << 16), ..WgpuOptions::default() };
    let Some(wg) = wgpu_device_with(options) else { return };
    let g = Graph::new(&wg);
    let small = g.tensor_from(&[1.0f32; 1000], &[1000]).unwrap();
    let e = small.exp().unwrap().to_vec_blocking::<f32>().unwrap()[0];
    assert!((e - std::f32::consts::E).abs() < 1e-5, "{e}");
    let big = g.tensor_from(&vec![1.0f32; (1 << 14) + 1], &[(1 << 14) + 1]).unwrap();
    let e = big.exp().unwrap().to_vec_blocking::<f32>().unwrap_err();
    assert_eq!((e.kind(), e.op()), (ErrorKind::Unsupported, "Exp"), "{e}");
    assert!(e.message().contains("max_storage_buffer_binding_size"), "{e}");
}

#[test]
fn f64_tensors_are_refused_on_wgpu() {
    let Some(wg) = wgpu_device() else { return };
    let g = Graph::new(&wg);
    let e = g.tensor_from(&[1.0f64, 2.0], &[2]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.message().contains("f64"), "{e}");
}

/// A seeded 4-16-3 MLP trained with Adam on fixed data; the losses.
fn train(device: &Device, steps: usize) -> Vec<f64> {
    let model = Sequential::mlp(device, &[4, 16, 3], Activation::Tanh, 3).unwrap();
    let mut opt = Adam::new(model.parameters(), 0.02).unwrap();
    let x = rand(32 * 4, 60, -1.0, 1.0);
    let labels: Vec<i32> = (0..32).map(|i| (i * 5 % 3) as i32).collect();
    let mut graph = Graph::new(device);
    let mut losses = vec![];
    for _ in 0..steps {
        graph.reset();
        let xs = graph.tensor_from(&x, &[32, 4]).unwrap();
        let ys = graph.tensor_from(&labels, &[32]).unwrap();
        let loss = cross_entropy(model.forward(xs).unwrap(), ys).unwrap();
        opt.zero_grad();
        loss.backward().unwrap();
        opt.step().unwrap();
        losses.push(loss.item_blocking().unwrap());
    }
    losses
}

#[test]
fn mlp_training_on_wgpu_repeats_bit_for_bit() {
    let Some(wg) = wgpu_device() else { return };
    let a = train(&wg, 25);
    let b = train(&wg, 25);
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b), "two seeded runs on wgpu differ");
    assert!(a[24] < a[0] * 0.8, "the loss does not fall: {a:?}");
    let cpu = train(&Device::cpu(), 25);
    compare("losses vs cpu", &HostData::F64(a), &HostData::F64(cpu), 1e-3);
}

/// A window over (height, width) with symmetric padding per axis.
fn window(kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2], dilation: [usize; 2]) -> Window2d {
    Window2d::new(kernel, stride, padding, dilation).unwrap()
}

/// Windows exercising stride, padding and dilation (asymmetric kernels, a
/// stride past the kernel, padding larger than a dilated step).
fn windows() -> Vec<Window2d> {
    vec![
        window([2, 3], [2, 1], [1, 0], [1, 2]),
        window([3, 3], [1, 1], [1, 1], [1, 1]),
        window([1, 2], [3, 2], [2, 1], [1, 1]),
        window([3, 2], [2, 3], [2, 1], [2, 1]),
    ]
}

#[test]
fn im2col_and_col2im_forward_and_backward() {
    let Some(wg) = wgpu_device() else { return };
    let x = rand(2 * 3 * 5 * 7, 70, -1.0, 1.0);
    let ints: Vec<i32> = (0..2 * 3 * 5 * 7).map(|i| i * 7 % 23 - 11).collect();
    // Col2Im sums in the CPU's order (a gather over (i, j) ascending): exact.
    forward(&wg, "im2col/col2im", EXACT, |g| {
        let mut outs = vec![];
        for w in windows() {
            for t in [g.tensor_from(&x, &[2, 3, 5, 7])?, g.tensor_from(&ints, &[2, 3, 5, 7])?] {
                let cols = t.im2col(w)?;
                outs.push(cols);
                outs.push(cols.col2im([5, 7], w)?);
            }
            // Independent column values (no structure shared with an image).
            let [oh, ow] = w.output_size([5, 7]).unwrap();
            let k = w.kernel_elements();
            let cols = g.tensor_from(&rand(2 * 3 * k * oh * ow, 71, -1.0, 1.0), &[2, 3 * k, oh * ow])?;
            outs.push(cols.col2im([5, 7], w)?);
        }
        Ok(outs)
    });
    // Gradients: Im2Col's is Col2Im and vice versa (sums of r's: exact).
    forward(&wg, "im2col/col2im gradients", EXACT, |g| {
        let mut outs = vec![];
        for w in windows() {
            let v = g.variable(&x, &[2, 3, 5, 7])?;
            let cols = v.im2col(w)?;
            let r = g.tensor_from(&rand(cols.numel(), 72, -1.0, 1.0), &cols.dims())?;
            outs.extend(g.grad(cols.mul(r)?.sum_all()?, &[v], None)?);
            let c = g.variable(&rand(cols.numel(), 73, -1.0, 1.0), &cols.dims())?;
            let img = c.col2im([5, 7], w)?;
            let r = g.tensor_from(&rand(img.numel(), 74, -1.0, 1.0), &img.dims())?;
            outs.extend(g.grad(img.mul(r)?.sum_all()?, &[c], None)?);
        }
        Ok(outs)
    });
    backward(&wg, "im2col/col2im chained", ARITH, |g| {
        let w = windows()[0];
        let v = g.variable(&x, &[2, 3, 5, 7])?;
        let cols = v.im2col(w)?;
        Ok((vec![cols.square()?.col2im([5, 7], w)?, cols.sum(&[1], false)?], vec![v]))
    });
}

/// A convolution whose batch folds into one product (`nn::Conv2d` when each
/// sample has fewer window positions than rows: 49 < 6·9 here), natively:
/// the folded Im2Col and Col2Im kernels (window_folded.wgsl) on wgpu
/// against the CPU, forward and through the input and weight gradients,
/// strided and padded.
#[test]
fn folded_convolution_forward_and_backward() {
    let Some(wg) = wgpu_device() else { return };
    let x = rand(3 * 6 * 7 * 7, 76, -1.0, 1.0);
    for (stride, padding) in [([1, 1], [1, 1]), ([2, 1], [0, 1])] {
        backward(&wg, "folded conv2d", SUMS, |g| {
            let options = ConvOptions { stride, padding, ..ConvOptions::default() };
            let conv = Conv2d::new(g.device(), 6, 5, [3, 3], options, 3)?;
            let v = g.variable(&x, &[3, 6, 7, 7])?;
            let y = conv.forward(v)?;
            // The case must take the folded path (its output is permuted).
            assert_eq!(g.count_ops("Permute"), 1, "the convolution did not fold");
            Ok((vec![y], vec![v, g.param(&conv.weight)?]))
        });
    }
}

/// Values on a coarse grid (many ties within a window), with NaNs at
/// `nans` positions.
fn pool_input(n: usize, seed: u64, nans: &[usize]) -> Vec<f32> {
    let mut v: Vec<f32> = rand(n, seed, -2.0, 2.0).iter().map(|x| x.round()).collect();
    for &i in nans {
        v[i] = f32::NAN;
    }
    v
}

/// (kernel, stride, padding, dilation, ceil_mode) of the pooling cases.
type Pool = ([usize; 2], [usize; 2], [usize; 2], [usize; 2], bool);

fn pools() -> Vec<Pool> {
    vec![
        ([2, 2], [2, 2], [0, 0], [1, 1], false),
        ([2, 2], [2, 2], [0, 0], [1, 1], true),
        ([3, 2], [2, 2], [1, 1], [1, 1], true),
        ([3, 3], [2, 1], [1, 0], [1, 2], false),
        ([2, 3], [1, 2], [1, 1], [2, 1], true),
        ([3, 3], [3, 3], [1, 1], [1, 1], true),
        // Gaps between windows (stride > kernel: some pixels in no window),
        // and non-overlapping rows with overlapping columns.
        ([2, 2], [3, 3], [0, 1], [1, 1], false),
        ([2, 3], [3, 1], [1, 0], [1, 1], true),
    ]
}

/// Large overlapping windows: a 32 x 32 max pool at stride 1 puts a pixel
/// in up to 1,024 windows, and a gradient kernel that searched every such
/// window for its maximum looped over a million times per pixel, far past
/// the 65,535 loop iterations after which lavapipe silently stops a shader
/// (its gradients came out wrong). Exact against the CPU. A
/// window over the documented bound (`kiln_wgsl::MAX_WINDOW` elements) is
/// refused on wgpu with an error that names it, not computed wrongly.
#[test]
fn max_pool2d_large_windows() {
    let Some(wg) = wgpu_device() else { return };
    let dims = [1, 1, 64, 65];
    let n: usize = dims.iter().product();
    let x = rand(n, 88, -1.0, 1.0);
    forward(&wg, "max_pool2d 32 x 32, stride 1", EXACT, |g| {
        let v = g.variable(&x, &dims)?;
        let y = v.max_pool2d([32, 32], [1, 1], [0, 0], [1, 1], false)?;
        let r = g.tensor_from(&rand(y.numel(), 89, -1.0, 1.0), &y.dims())?;
        let mut outs = vec![y];
        outs.extend(g.grad(y.mul(r)?.sum_all()?, &[v], None)?);
        Ok(outs)
    });
    let long = kiln_wgsl::MAX_WINDOW + 1;
    let g = Graph::new(&wg);
    let y =
        g.zeros(&[1, 1, 1, long], DType::F32).unwrap().max_pool2d([1, long], [1, 1], [0, 0], [1, 1], false).unwrap();
    let err = pollster::block_on(y.to_host()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains(&format!("{long} elements")), "{err}");
}

#[test]
fn max_pool2d_forward_and_backward() {
    let Some(wg) = wgpu_device() else { return };
    let dims = [2, 2, 7, 6];
    let n = 2 * 2 * 7 * 6;
    let ties = pool_input(n, 80, &[]);
    let with_nan = pool_input(n, 81, &[0, 9, 13, 14, 100, 101, 130, n - 1]);
    let smooth = rand(n, 82, -1.0, 1.0);
    // Selection (the first maximum, padding never, NaN always): exact.
    forward(&wg, "max_pool2d", EXACT, |g| {
        let mut outs = vec![];
        for (k, s, p, d, ceil) in pools() {
            for x in [&ties, &with_nan, &smooth] {
                outs.push(g.tensor_from(x, &dims)?.max_pool2d(k, s, p, d, ceil)?);
            }
        }
        Ok(outs)
    });
    // An explicit window with end padding wider than the kernel: windows
    // holding no pixel give -inf, and their gradient goes nowhere.
    let wide = Window2d { pad_end: [3, 4], ..window([2, 2], [2, 2], [0, 0], [1, 1]) };
    forward(&wg, "max_pool2d_window, empty windows", EXACT, |g| {
        let v = g.variable(&smooth, &dims)?;
        let y = v.max_pool2d_window(wide)?;
        let r = g.tensor_from(&rand(y.numel(), 87, -1.0, 1.0), &y.dims())?;
        let mut outs = vec![y];
        outs.extend(g.grad(y.mul(r)?.sum_all()?, &[v], None)?);
        Ok(outs)
    });
    // MaxPool2dBackward directly (NaN inputs included) and as the gradient:
    // each pixel gathers its windows' g in the CPU's order, so exact.
    forward(&wg, "max_pool2d_backward", EXACT, |g| {
        let mut outs = vec![];
        for (k, s, p, d, ceil) in pools() {
            for x in [&ties, &with_nan, &smooth] {
                let v = g.variable(x, &dims)?;
                let y = v.max_pool2d(k, s, p, d, ceil)?;
                let r = g.tensor_from(&rand(y.numel(), 83, -1.0, 1.0), &y.dims())?;
                outs.extend(g.grad(y.mul(r)?.sum_all()?, &[v], None)?);
            }
        }
        Ok(outs)
    });
    // Through the gradient of MaxPool2dBackward in its g argument (composed
    // from Im2Col, ArgMax and a one-hot mask) and a true second derivative.
    backward(&wg, "max_pool2d_backward gradient", EXACT, |g| {
        let mut outs = vec![];
        let mut leaves = vec![];
        for (k, s, p, d, ceil) in pools() {
            let x = g.variable(&ties, &dims)?;
            let y = x.max_pool2d(k, s, p, d, ceil)?;
            let gy = g.variable(&rand(y.numel(), 84, -1.0, 1.0), &y.dims())?;
            // The window max_pool2d made (ceil mode widens its end padding).
            let Op::MaxPool2d(w) = y.op() else { unreachable!("{y:?}") };
            outs.push(x.max_pool2d_backward(gy, w)?);
            leaves.push(gy);
        }
        for (k, s, p, d, ceil) in pools() {
            // d/dx sum(maxpool(x)^2 * r): MaxPool2dBackward(x, 2 y r), whose
            // g depends on x again.
            let x = g.variable(&smooth, &dims)?;
            let y = x.max_pool2d(k, s, p, d, ceil)?;
            let r = g.tensor_from(&rand(y.numel(), 85, -1.0, 1.0), &y.dims())?;
            outs.extend(g.grad(y.square()?.mul(r)?.sum_all()?, &[x], None)?);
            leaves.push(x);
        }
        Ok((outs, leaves))
    });
}

#[test]
fn random_uniform_and_normal() {
    let Some(wg) = wgpu_device() else { return };
    // The same 32-bit hash on both sides, and an exact 24-bit scaling.
    forward(&wg, "rand_uniform", EXACT, |g| {
        Ok(vec![
            g.rand_uniform(&[3, 1000], 42, DType::F32)?,
            g.rand_uniform(&[7], 0, DType::F32)?,
            g.rand_uniform(&[2, 3, 4], (1 << 40) | 7, DType::F32)?,
            g.rand_uniform(&[0], 1, DType::F32)?,
        ])
    });
    // Box–Muller in f32 with the kernel's own ln and cos (within a few ulps
    // of the CPU's libm): TRANSCENDENTAL. 2^17 values reach u1 = 1 - 2^-24
    // territory (tiny radii) and radii up to ~5.
    forward(&wg, "rand_normal", TRANSCENDENTAL, |g| {
        Ok(vec![g.rand_normal(&[1 << 17], 7, DType::F32)?, g.rand_normal(&[5, 5], u64::MAX, DType::F32)?])
    });
    // Dropout-style use inside a differentiated graph.
    backward(&wg, "dropout mask", EXACT, |g| {
        let x = g.variable(&rand(40, 86, -1.0, 1.0), &[4, 10])?;
        let keep = g.rand_uniform(&[4, 10], 9, DType::F32)?.gt(0.3)?.cast(DType::F32)?;
        Ok((vec![x.mul(keep)?.mul(1.0 / 0.7)?], vec![x]))
    });
    // f64 is refused on wgpu; i32 is not a random dtype anywhere.
    let g = Graph::new(&wg);
    assert!(g.rand_uniform(&[2], 1, DType::F64).and_then(|t| t.to_vec_blocking::<f64>()).is_err());
}

#[test]
fn random_past_65535_workgroups() {
    let Some(wg) = wgpu_device() else { return };
    // One workgroup more than a single grid dimension holds on most adapters
    // (65,535 x 256 threads): the launch folds into a 2-D grid.
    let n = 65_535 * 256 + 1;
    let bits = |device: &Device| {
        let g = Graph::new(device);
        let v = g.rand_uniform(&[n], 5, DType::F32).unwrap().to_vec_blocking::<f32>().unwrap();
        v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    let (want, got) = (bits(&Device::cpu()), bits(&wg));
    assert_eq!(got.len(), n);
    if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
        panic!("rand_uniform element {i}: wgpu {:#x}, cpu {:#x}", got[i], want[i]);
    }
}

/// The strided kernels unravel indices with a loop over the rank, which a
/// specialised pipeline writes out as one block per axis up to MAX_DIMS = 8
/// (specialize.rs, `unroll_rank_loops`), so every rank is checked, generic
/// and specialised (every case runs twice; the second run's repeated
/// parameters get specialised pipelines): tensors of rank 1..=8 whose axes
/// cannot be merged (sizes 2, 3, 4, 2, ..., neighbours differing; broadcast
/// along alternate axes, or reversed), through a broadcast binary op, a
/// permuted copy, reductions over alternate, first and last axes and a
/// batched product, forward and backward, with fusion on (the generated
/// kernels' own unravelling) and off.
#[test]
fn strided_kernels_of_every_rank() {
    let Some(wg) = wgpu_device() else { return };
    let specialized = || wg.backend().counters().specialized_pipelines;
    let before = specialized();
    for (fusion, run) in [(true, 0), (true, 1), (false, 0), (false, 1)] {
        wg.set_fusion(fusion);
        for rank in 1..=8usize {
            let dims: Vec<usize> = (0..rank).map(|i| 2 + i % 3).collect();
            let n: usize = dims.iter().product();
            // a: unit along odd axes; b: unit along even axes.
            let a_dims: Vec<usize> = dims.iter().enumerate().map(|(i, &d)| if i % 2 == 1 { 1 } else { d }).collect();
            let b_dims: Vec<usize> = dims.iter().enumerate().map(|(i, &d)| if i % 2 == 0 { 1 } else { d }).collect();
            let (a, b) = (rand(a_dims.iter().product(), 31, -2.0, 2.0), rand(b_dims.iter().product(), 32, -2.0, 2.0));
            let x = rand(n, 33, -2.0, 2.0);
            let reversed: Vec<usize> = (0..rank).rev().collect();
            let alternate: Vec<isize> = (0..rank as isize).step_by(2).collect();
            let what = format!("rank {rank} (fusion {fusion}, run {run})");
            forward(&wg, &format!("{what} broadcast add, permute"), ARITH, |g| {
                let (ta, tb) = (g.tensor_from(&a, &a_dims)?, g.tensor_from(&b, &b_dims)?);
                let t = g.tensor_from(&x, &dims)?;
                let p = t.permute(&reversed)?;
                Ok(vec![ta.add(tb)?, ta.mul(tb)?.sub(t)?, p, p.exp()?.add(p)?])
            });
            forward(&wg, &format!("{what} sums"), SUMS, |g| {
                let p = g.tensor_from(&x, &dims)?.permute(&reversed)?;
                Ok(vec![
                    p.sum(&alternate, false)?,
                    p.sum(&[rank as isize - 1], true)?,
                    p.sum(&[0], false)?,
                    p.mul(p)?.sum_all()?,
                ])
            });
            backward(&wg, &format!("{what} gradients"), ARITH, |g| {
                let (ta, tb) = (g.variable(&a, &a_dims)?, g.variable(&b, &b_dims)?);
                let t = g.variable(&x, &dims)?;
                Ok((vec![ta.mul(tb)?.add(t.permute(&reversed)?.permute(&reversed)?)?], vec![ta, tb, t]))
            });
            if rank >= 3 {
                // Batch axes of rank - 2, broadcast along alternate ones.
                let (bd, ad) = (&dims[..rank - 2], &a_dims[..rank - 2]);
                let (l, r) = (
                    rand(ad.iter().product::<usize>() * 6, 34, -1.0, 1.0),
                    rand(bd.iter().product::<usize>() * 12, 35, -1.0, 1.0),
                );
                let (ld, rd) = ([ad, &[2, 3]].concat(), [bd, &[3, 4]].concat());
                forward(&wg, &format!("{what} batched matmul"), SUMS, |g| {
                    Ok(vec![g.tensor_from(&l, &ld)?.matmul(g.tensor_from(&r, &rd)?)?])
                });
            }
        }
    }
    wg.set_fusion(true);
    // Unless turned off (KILN_WGPU_SPECIALIZE=0), the second runs were
    // specialised.
    if std::env::var("KILN_WGPU_SPECIALIZE").as_deref() != Ok("0") {
        assert!(specialized() > before + 20, "few specialised pipelines: {}", specialized() - before);
    }
}
