//! Elementwise kernels: Full, Arange, Unary, Binary, Compare, Where, Cast.
//!
//! One generic kernel per family (`map`, `zip`, `zip3`), monomorphised per
//! operator by passing the operator as a closure chosen outside the loop, so
//! every inner loop is a tight, vectorisable loop over one operator. What
//! each operator computes per element is the op table's expression
//! (`Op::info().elementwise`), evaluated by `op::Value`.

use super::layout::{broadcast_to, for_chunks, for_chunks_weighted, Strided};
use super::scalar::Scalar;
use super::{own_loops, unsupported_dtype, with_any, with_num, In, Out, COMPACT};
use crate::dtype::DType;
use crate::error::Result;
use crate::op::expr::compare as compare_values;
// `with_unary!(op, K => body)` etc.: one arm per variant with K a constant,
// generated from the enums' declarations (see `op_enum!`), so each
// primitive gets its own loop and no list here names the ops.
use crate::op::{with_binary, with_compare, with_unary};
use crate::op::{BinaryOp, CompareOp, Elementwise, Expr, Op, UnaryOp, Value};

pub(super) fn full(v: f64, out: &mut Out<'_>) -> Result<()> {
    with_any!(out.dtype, T => {
        let x = T::from_f64(v);
        for_chunks(out.slice::<T>("Full")?, 1, |_, c| c.fill(x));
        Ok(())
    })
}

pub(super) fn arange(start: f64, step: f64, out: &mut Out<'_>) -> Result<()> {
    with_any!(out.dtype, T => {
        for_chunks(out.slice::<T>("Arange")?, 1, |s, c| {
            for (i, o) in c.iter_mut().enumerate() {
                *o = T::from_f64(start + (s + i) as f64 * step);
            }
        });
        Ok(())
    })
}

/// out[i] = f(x[i]) over contiguous data of equal length; `weight` is the
/// cost of one f relative to an add.
#[inline]
fn map<T: Scalar, O: Scalar>(x: &[T], out: &mut [O], weight: usize, f: impl Fn(T) -> O + Sync + Send) {
    debug_assert_eq!(x.len(), out.len());
    for_chunks_weighted(out, 1, weight, |s, c| {
        let n = c.len();
        super::simd::dispatch(super::simd::Map { x: &x[s..s + n], out: c, f: &f });
    });
}

/// The element-wise facts of `op` from the op table, after checking that a
/// kernel exists for `dtype`.
fn elementwise(op: Op, dtype: DType) -> Result<Elementwise> {
    let info = op.info();
    match info.elementwise {
        Some(e) if info.dtypes.contains(dtype) => Ok(e),
        _ => Err(unsupported_dtype(info.name, dtype)),
    }
}

/// Unary ops: one loop over `Value::unary`, which computes a primitive
/// with its own function and a composed op as the table's expression says
/// (written out for the dear ones, e.g. Gelu, so that the loop vectorises).
pub(super) fn unary(u: UnaryOp, x: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    unary_as::<COMPACT>(u, x, out)
}

/// `unary`, with `COMPACT` as in `super::COMPACT` (tests run both).
fn unary_as<const COMPACT: bool>(u: UnaryOp, [x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "Unary";
    if x.numel() != out.numel() || x.dtype != out.dtype {
        return Err(crate::error::Error::backend(u.name(), "input and output differ in size or dtype"));
    }
    let e = elementwise(Op::Unary(u), out.dtype)?;
    let weight = e.cost as usize;
    with_num!(out.dtype, u.name(), T => {
        let (x, o) = (x.slice::<T>(OP)?, out.slice::<T>(OP)?);
        if own_loops::<T, COMPACT>() {
            #[cfg(not(target_arch = "wasm32"))]
            with_unary!(u, F => for_chunks_weighted(o, 1, weight, |s, c| {
                super::simd::dispatch(UnaryMap::<T, { F as usize }> { x: &x[s..s + c.len()], out: c })
            }));
            // The browser has one instruction set, and the closure keeps
            // its download smaller.
            #[cfg(target_arch = "wasm32")]
            with_unary!(u, F => map(x, o, weight, |v| T::unary(F, v)));
        } else {
            map(x, o, weight, move |v| T::unary(u, v));
        }
        Ok(())
    })
}

/// out[i] = op(x[i]) for the unary op `UnaryOp::ALL[OP]`, as a kernel of
/// its own rather than a closure handed to `Map`: a closure whose body is
/// long (GeluDerivative, an erf and an exp) is not inlined into
/// `simd::dispatch`'s wide-vector copies but called per element, compiled
/// for the baseline instruction set (measured: GeluDerivative [768, 512]
/// 6.1 ms on one thread through the closure, GELU itself 0.5 ms).
#[cfg(not(target_arch = "wasm32"))]
struct UnaryMap<'a, T, const OP: usize> {
    x: &'a [T],
    out: &'a mut [T],
}

#[cfg(not(target_arch = "wasm32"))]
impl<T: Scalar + Value, const OP: usize> super::simd::Kernel for UnaryMap<'_, T, OP> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let op = const { UnaryOp::ALL[OP] };
        for (o, &v) in self.out.iter_mut().zip(self.x) {
            *o = T::unary(op, v);
        }
    }
}

/// `unary` in portable numerics (`CpuNumerics::Portable`): the ops whose
/// value a math library decides (log, sin, cos, tanh; exp and what uses it
/// in f64) evaluate with the portable functions (`Value::unary_portable`,
/// the op matched per element: these are dear anyway); the others are the
/// same bits either way and run the usual loops.
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn unary_portable(u: UnaryOp, x: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    use UnaryOp::*;
    let by_library = match out.dtype {
        DType::F32 => matches!(u, Log | Sin | Cos | Tanh),
        DType::F64 => matches!(u, Exp | Log | Sin | Cos | Tanh | Sigmoid | GeluDerivative),
        _ => false,
    };
    if !by_library {
        return unary(u, x, out);
    }
    if x[0].numel() != out.numel() || x[0].dtype != out.dtype {
        return Err(crate::error::Error::backend(u.name(), "input and output differ in size or dtype"));
    }
    let weight = elementwise(Op::Unary(u), out.dtype)?.cost as usize;
    super::with_float!(out.dtype, u.name(), T => {
        let (x, o) = (x[0].slice::<T>("Unary")?, out.slice::<T>("Unary")?);
        map(x, o, weight, move |v| T::unary_portable(u, v));
        Ok(())
    })
}

/// `binary` in portable numerics: Pow with the portable function, the
/// other ops as usual (no library decides their bits).
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn binary_portable(op: BinaryOp, ab: &[In<'_>; 2], out: &mut Out<'_>) -> Result<()> {
    let [a, b] = ab;
    if op != BinaryOp::Pow || !matches!(out.dtype, DType::F32 | DType::F64) {
        return binary(op, ab, out);
    }
    let name = op.name();
    if a.dtype != out.dtype || b.dtype != out.dtype {
        return Err(crate::error::Error::backend(name, "operand dtypes differ from the output's"));
    }
    let weight = elementwise(Op::Binary(op), out.dtype)?.cost as usize;
    let od = out.dims;
    super::with_float!(out.dtype, name, T => {
        let (x, y) = ((a.slice::<T>(name)?, a.dims), (b.slice::<T>(name)?, b.dims));
        zip::<false, _, _, _>(name, x, y, (out.slice::<T>(name)?, od), weight, |p: T, q: T| {
            T::binary_portable(BinaryOp::Pow, p, q)
        })
    })
}

/// out = f(a, b) with a and b broadcast to the output dims.
#[inline]
fn zip<const COMPACT: bool, A: Scalar, B: Scalar, O: Scalar>(
    op: &'static str,
    a: (&[A], &[usize]),
    b: (&[B], &[usize]),
    out: (&mut [O], &[usize]),
    weight: usize,
    f: impl Fn(A, B) -> O + Sync + Send + Copy,
) -> Result<()> {
    let ((a, ad), (b, bd), (out, od)) = (a, b, out);
    let sa = broadcast_to(op, ad, od)?;
    let sb = broadcast_to(op, bd, od)?;
    let n = out.len();
    // Fast paths: same shape, or a scalar operand. (They split the work
    // across threads; single-threaded, the rows below run the same loops,
    // so the compact build leaves them out.)
    if !COMPACT {
        if a.len() == n && b.len() == n {
            for_chunks_weighted(out, 1, weight, |s, c| {
                let e = s + c.len();
                super::simd::dispatch(super::simd::Zip { a: &a[s..e], b: &b[s..e], out: c, f: &f });
            });
            return Ok(());
        }
        if a.len() == n && b.len() == 1 {
            let y = b[0];
            map(a, out, weight, move |x| f(x, y));
            return Ok(());
        }
        if a.len() == 1 && b.len() == n {
            let x = a[0];
            map(b, out, weight, move |y| f(x, y));
            return Ok(());
        }
    }
    let st = Strided::<2>::new(od, [&sa, &sb], [0, 0]);
    let [ia, ib] = st.inner_strides;
    st.fill_weighted(out, weight, |row, [oa, ob]| {
        let m = row.len();
        match (ia, ib) {
            (1, 1) => {
                for ((o, &x), &y) in row.iter_mut().zip(&a[oa..oa + m]).zip(&b[ob..ob + m]) {
                    *o = f(x, y);
                }
            }
            (1, 0) => {
                let y = b[ob];
                for (o, &x) in row.iter_mut().zip(&a[oa..oa + m]) {
                    *o = f(x, y);
                }
            }
            (0, 1) => {
                let x = a[oa];
                for (o, &y) in row.iter_mut().zip(&b[ob..ob + m]) {
                    *o = f(x, y);
                }
            }
            _ => {
                for (j, o) in row.iter_mut().enumerate() {
                    *o = f(a[oa + j * ia], b[ob + j * ib]);
                }
            }
        }
    });
    Ok(())
}

/// Binary ops, broadcasting: `f(a, b)` with f the op's own primitive, or a
/// composition, as the op table says.
pub(super) fn binary(op: BinaryOp, ab: &[In<'_>; 2], out: &mut Out<'_>) -> Result<()> {
    binary_as::<COMPACT>(op, ab, out)
}

/// `binary`, with `COMPACT` as in `super::COMPACT` (tests run both).
fn binary_as<const COMPACT: bool>(op: BinaryOp, [a, b]: &[In<'_>; 2], out: &mut Out<'_>) -> Result<()> {
    let name = op.name();
    if a.dtype != out.dtype || b.dtype != out.dtype {
        return Err(crate::error::Error::backend(name, "operand dtypes differ from the output's"));
    }
    let e = elementwise(Op::Binary(op), out.dtype)?;
    let weight = e.cost as usize;
    let od = out.dims;
    with_num!(out.dtype, name, T => {
        let (x, y) = ((a.slice::<T>(name)?, a.dims), (b.slice::<T>(name)?, b.dims));
        let o = (out.slice::<T>(name)?, od);
        match e.expr {
            Expr::Binary(f, &Expr::Arg(0), &Expr::Arg(1)) if own_loops::<T, COMPACT>() => {
                with_binary!(f, F => zip::<COMPACT, _, _, _>(name, x, y, o, weight, |p: T, q: T| T::binary(F, p, q)))
            }
            Expr::Binary(f, &Expr::Arg(0), &Expr::Arg(1)) => {
                zip::<COMPACT, _, _, _>(name, x, y, o, weight, move |p: T, q: T| T::binary(f, p, q))
            }
            expr => zip::<COMPACT, _, _, _>(name, x, y, o, weight, move |p: T, q: T| expr.eval(&[p, q])),
        }
    })
}

/// Comparisons of any two operands of one dtype: a bool output.
pub(super) fn compare(op: CompareOp, ab: &[In<'_>; 2], out: &mut Out<'_>) -> Result<()> {
    compare_as::<COMPACT>(op, ab, out)
}

/// `compare`, with `COMPACT` as in `super::COMPACT` (tests run both).
fn compare_as<const COMPACT: bool>(op: CompareOp, [a, b]: &[In<'_>; 2], out: &mut Out<'_>) -> Result<()> {
    let name = op.name();
    if a.dtype != b.dtype || out.dtype != DType::Bool {
        return Err(crate::error::Error::backend(name, "compare needs operands of one dtype and a bool output"));
    }
    let od = out.dims;
    let o = out.slice::<u8>(name)?;
    with_any!(a.dtype, T => {
        let (x, y) = ((a.slice::<T>(name)?, a.dims), (b.slice::<T>(name)?, b.dims));
        if COMPACT {
            // One loop for all six: a > b is b < a, a >= b is b <= a, a != b
            // is !(a == b) (NaN included), and <, <=, == are
            // (a < b) & lt | (a == b) & eq with lt, eq chosen per op.
            let (swap, lt, eq, not) = match op {
                CompareOp::Equal => (false, 0, 1, 0),
                CompareOp::NotEqual => (false, 0, 1, 1),
                CompareOp::Less => (false, 1, 0, 0),
                CompareOp::LessEqual => (false, 1, 1, 0),
                CompareOp::Greater => (true, 1, 0, 0),
                CompareOp::GreaterEqual => (true, 1, 1, 0),
            };
            let f = move |p: T, q: T| (((p < q) as u8 & lt) | ((p == q) as u8 & eq)) ^ not;
            let (x, y) = if swap { (y, x) } else { (x, y) };
            return zip::<COMPACT, _, _, _>(name, x, y, (o, od), 1, f);
        }
        with_compare!(op, C => zip::<COMPACT, _, _, _>(name, x, y, (o, od), 1, |p: T, q: T| compare_values(C, p, q) as u8))
    })
}

pub(super) fn where_([c, a, b]: &[In<'_>; 3], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "Where";
    if c.dtype != DType::Bool || a.dtype != out.dtype || b.dtype != out.dtype {
        return Err(crate::error::Error::backend(OP, "where needs a bool condition and a, b of the output dtype"));
    }
    let od = out.dims;
    let cond = c.slice::<u8>(OP)?;
    with_any!(out.dtype, T => {
        let (x, y, o) = (a.slice::<T>(OP)?, b.slice::<T>(OP)?, out.slice::<T>(OP)?);
        zip3(OP, (cond, c.dims), (x, a.dims), (y, b.dims), (o, od))
    })
}

/// out = if c { a } else { b }, all three broadcast to the output dims.
fn zip3<T: Scalar>(
    op: &'static str,
    (c, cd): (&[u8], &[usize]),
    (a, ad): (&[T], &[usize]),
    (b, bd): (&[T], &[usize]),
    (out, od): (&mut [T], &[usize]),
) -> Result<()> {
    let sc = broadcast_to(op, cd, od)?;
    let sa = broadcast_to(op, ad, od)?;
    let sb = broadcast_to(op, bd, od)?;
    let n = out.len();
    if c.len() == n && a.len() == n && b.len() == n {
        for_chunks(out, 1, |s, o| {
            let e = s + o.len();
            for (((o, &k), &x), &y) in o.iter_mut().zip(&c[s..e]).zip(&a[s..e]).zip(&b[s..e]) {
                *o = T::select(k, x, y);
            }
        });
        return Ok(());
    }
    // A full condition with one full branch and one scalar (relu's and the
    // maximum/minimum gradients: where(mask, g, 0)): no stride arithmetic.
    // One loop per case, over zipped slices: the loops vectorise (an
    // indexed loop choosing the index per element did not, and was 13 % of
    // a W2 step in relu's backward).
    if c.len() == n && n > 1 && (a.len() == n || a.len() == 1) && (b.len() == n || b.len() == 1) {
        let (full_a, full_b) = (a.len() == n, b.len() == n);
        for_chunks(out, 1, |s, o| {
            let e = s + o.len();
            let c = &c[s..e];
            match (full_a, full_b) {
                (true, _) if !full_b => {
                    let y = b[0];
                    for ((o, &k), &x) in o.iter_mut().zip(c).zip(&a[s..e]) {
                        *o = T::select(k, x, y);
                    }
                }
                (false, true) => {
                    let x = a[0];
                    for ((o, &k), &y) in o.iter_mut().zip(c).zip(&b[s..e]) {
                        *o = T::select(k, x, y);
                    }
                }
                (false, false) => {
                    let (x, y) = (a[0], b[0]);
                    for (o, &k) in o.iter_mut().zip(c) {
                        *o = T::select(k, x, y);
                    }
                }
                _ => {
                    for (((o, &k), &x), &y) in o.iter_mut().zip(c).zip(&a[s..e]).zip(&b[s..e]) {
                        *o = T::select(k, x, y);
                    }
                }
            }
        });
        return Ok(());
    }
    let st = Strided::<3>::new(od, [&sc, &sa, &sb], [0, 0, 0]);
    let [ic, ia, ib] = st.inner_strides;
    st.fill(out, |row, [oc, oa, ob]| {
        for (j, o) in row.iter_mut().enumerate() {
            *o = if c[oc + j * ic] != 0 { a[oa + j * ia] } else { b[ob + j * ib] };
        }
    });
    Ok(())
}

pub(super) fn cast([x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "Cast";
    if x.numel() != out.numel() {
        return Err(crate::error::Error::backend(OP, "input and output differ in size"));
    }
    with_any!(x.dtype, I => {
        let src = x.slice::<I>(OP)?;
        with_any!(out.dtype, O => {
            let dst = out.slice::<O>(OP)?;
            // Every storage type converts to f64 exactly, so going through
            // f64 gives Rust `as` semantics (one rounding at most).
            map(src, dst, 1, |v| O::from_f64(v.to_f64()));
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::dtype::{DType, HostData};
    use crate::op::{BinaryOp, CompareOp, Op, UnaryOp};

    fn f(v: HostData) -> Vec<f64> {
        v.to_f64_vec()
    }

    #[test]
    fn full_and_arange() {
        assert_eq!(run_op(Op::Full(2.5), &[], &[2, 2], DType::F32).unwrap(), f32s(&[2.5; 4]));
        assert_eq!(run_op(Op::Full(2.0), &[], &[3], DType::Bool).unwrap(), bools(&[true; 3]));
        assert_eq!(run_op(Op::Full(-2.7), &[], &[1], DType::I32).unwrap(), i32s(&[-2]));
        let a = run_op(Op::Arange { start: 1.0, step: 0.5 }, &[], &[4], DType::F64).unwrap();
        assert_eq!(a, f64s(&[1.0, 1.5, 2.0, 2.5]));
        let a = run_op(Op::Arange { start: -1.0, step: -0.75 }, &[], &[4], DType::I32).unwrap();
        assert_eq!(a, i32s(&[-1, -1, -2, -3]), "rounds toward zero");
        // Large enough to go parallel.
        let n = 300_000;
        let a = run_op(Op::Arange { start: 0.0, step: 1.0 }, &[], &[n], DType::F32).unwrap();
        assert_eq!(f(a), (0..n).map(|i| i as f64).collect::<Vec<_>>());
    }

    #[test]
    fn unary_float_ops() {
        let x = [-2.0f64, -0.5, 0.0, 0.5, 3.0];
        type Case = (UnaryOp, fn(f64) -> f64);
        let cases: [Case; 11] = [
            (UnaryOp::Neg, |v| -v),
            (UnaryOp::Abs, f64::abs),
            (UnaryOp::Exp, f64::exp),
            (UnaryOp::Sin, f64::sin),
            (UnaryOp::Cos, f64::cos),
            (UnaryOp::Tanh, f64::tanh),
            (UnaryOp::Sigmoid, |v| 1.0 / (1.0 + (-v).exp())),
            (UnaryOp::Relu, |v| v.max(0.0)),
            (UnaryOp::Erf, libm::erf),
            (UnaryOp::Erfc, libm::erfc),
            (UnaryOp::Sign, |v| {
                if v > 0.0 {
                    1.0
                } else if v < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }),
        ];
        for (u, g) in cases {
            let got = run_op(Op::Unary(u), &[(f64s(&x), &[5])], &[5], DType::F64).unwrap();
            let want: Vec<f64> = x.iter().map(|&v| g(v)).collect();
            let got = f(got);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-12, "{u:?}: {got:?} vs {want:?}");
            }
        }
        let y = [0.25f32, 4.0];
        let r = |u| run_op(Op::Unary(u), &[(f32s(&y), &[2])], &[2], DType::F32).unwrap();
        assert_eq!(r(UnaryOp::Sqrt), f32s(&[0.5, 2.0]));
        assert_eq!(r(UnaryOp::Recip), f32s(&[4.0, 0.25]));
        assert_eq!(r(UnaryOp::Log), f32s(&[0.25f32.ln(), 4.0f32.ln()]));
        assert!((libm::erff(0.5) - 0.5204999).abs() < 1e-6);
    }

    #[test]
    fn unary_special_values() {
        let x = f32s(&[f32::NAN, -1000.0, 1000.0]);
        let s = run_op(Op::Unary(UnaryOp::Sigmoid), &[(x.clone(), &[3])], &[3], DType::F32).unwrap();
        let s = f(s);
        assert!(s[0].is_nan() && s[1] == 0.0 && s[2] == 1.0);
        let r = f(run_op(Op::Unary(UnaryOp::Relu), &[(x.clone(), &[3])], &[3], DType::F32).unwrap());
        assert!(r[0].is_nan() && r[1] == 0.0 && r[2] == 1000.0);
        let r = f(run_op(Op::Unary(UnaryOp::Sign), &[(x, &[3])], &[3], DType::F32).unwrap());
        assert!(r[0].is_nan() && r[1] == -1.0 && r[2] == 1.0);
    }

    #[test]
    fn unary_i32() {
        let x = i32s(&[i32::MIN, -3, 0, 5]);
        let r = |u| run_op(Op::Unary(u), &[(x.clone(), &[4])], &[4], DType::I32);
        assert_eq!(r(UnaryOp::Neg).unwrap(), i32s(&[i32::MIN, 3, 0, -5]));
        assert_eq!(r(UnaryOp::Abs).unwrap(), i32s(&[i32::MIN, 3, 0, 5]));
        assert_eq!(r(UnaryOp::Relu).unwrap(), i32s(&[0, 0, 0, 5]));
        assert_eq!(r(UnaryOp::Sign).unwrap(), i32s(&[-1, -1, 0, 1]));
        assert!(r(UnaryOp::Exp).is_err());
    }

    #[test]
    fn binary_broadcasting() {
        let add = Op::Binary(BinaryOp::Add);
        // [2,3] + [1,3]
        let a = f32s(&[1., 2., 3., 4., 5., 6.]);
        let b = f32s(&[10., 20., 30.]);
        let r = run_op(add, &[(a.clone(), &[2, 3]), (b.clone(), &[1, 3])], &[2, 3], DType::F32).unwrap();
        assert_eq!(r, f32s(&[11., 22., 33., 14., 25., 36.]));
        // [3] broadcast on the left.
        let r = run_op(Op::Binary(BinaryOp::Sub), &[(b, &[3]), (a.clone(), &[2, 3])], &[2, 3], DType::F32).unwrap();
        assert_eq!(r, f32s(&[9., 18., 27., 6., 15., 24.]));
        // scalar
        let r = run_op(Op::Binary(BinaryOp::Mul), &[(a.clone(), &[2, 3]), (f32s(&[2.]), &[])], &[2, 3], DType::F32)
            .unwrap();
        assert_eq!(r, f32s(&[2., 4., 6., 8., 10., 12.]));
        let r = run_op(Op::Binary(BinaryOp::Div), &[(f32s(&[12.]), &[1]), (a, &[2, 3])], &[2, 3], DType::F32).unwrap();
        assert_eq!(r, f32s(&[12., 6., 4., 3., 2.4, 2.]));
        // [4,3,5] with [3,1]
        let x: Vec<f64> = (0..60).map(|i| i as f64).collect();
        let y = [100.0, 200.0, 300.0];
        let r = run_op(add, &[(f64s(&x), &[4, 3, 5]), (f64s(&y), &[3, 1])], &[4, 3, 5], DType::F64).unwrap();
        let want: Vec<f64> = (0..60).map(|i| i as f64 + y[(i / 5) % 3]).collect();
        assert_eq!(r, f64s(&want));
        // Both broadcast: [3,1] + [1,4] -> [3,4]; and [4,1,5] with [3,1] -> [4,3,5]
        let r = run_op(add, &[(i32s(&[1, 2, 3]), &[3, 1]), (i32s(&[10, 20, 30, 40]), &[1, 4])], &[3, 4], DType::I32)
            .unwrap();
        assert_eq!(r, i32s(&[11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43]));
        let x: Vec<f32> = (0..20).map(|i| i as f32).collect();
        let r =
            run_op(add, &[(f32s(&x), &[4, 1, 5]), (f32s(&[0., 100., 200.]), &[3, 1])], &[4, 3, 5], DType::F32).unwrap();
        let want: Vec<f64> = (0..60).map(|i| ((i / 15) * 5 + i % 5) as f64 + 100.0 * ((i / 5) % 3) as f64).collect();
        assert_eq!(f(r), want);
        // Large broadcast goes parallel and matches.
        let x = rand_f32(1100 * 257, 1);
        let y = rand_f32(257, 2);
        let r = run_op(add, &[(f32s(&x), &[1100, 257]), (f32s(&y), &[257])], &[1100, 257], DType::F32).unwrap();
        let want: Vec<f32> = (0..x.len()).map(|i| x[i] + y[i % 257]).collect();
        assert_eq!(r, f32s(&want));
        // Shapes that do not broadcast are an error, not a panic.
        assert!(run_op(add, &[(f32s(&[1., 2.]), &[2]), (f32s(&[1., 2., 3.]), &[3])], &[3], DType::F32).is_err());
    }

    #[test]
    fn binary_ops_and_nan() {
        let a = f64s(&[1.0, f64::NAN, 3.0, -2.0]);
        let b = f64s(&[2.0, 1.0, f64::NAN, -2.0]);
        let r = |op| f(run_op(Op::Binary(op), &[(a.clone(), &[4]), (b.clone(), &[4])], &[4], DType::F64).unwrap());
        let mx = r(BinaryOp::Maximum);
        assert!(mx[0] == 2.0 && mx[1].is_nan() && mx[2].is_nan() && mx[3] == -2.0);
        let mn = r(BinaryOp::Minimum);
        assert!(mn[0] == 1.0 && mn[1].is_nan() && mn[2].is_nan() && mn[3] == -2.0);
        let p = r(BinaryOp::Pow);
        assert_eq!(p[0], 1.0);
        assert_eq!(p[3], 0.25);
        let ia = i32s(&[i32::MAX, 5, -7]);
        let ib = i32s(&[1, 9, 2]);
        let r = |op| run_op(Op::Binary(op), &[(ia.clone(), &[3]), (ib.clone(), &[3])], &[3], DType::I32);
        assert_eq!(r(BinaryOp::Add).unwrap(), i32s(&[i32::MIN, 14, -5]));
        assert_eq!(r(BinaryOp::Mul).unwrap(), i32s(&[i32::MAX, 45, -14]));
        assert_eq!(r(BinaryOp::Maximum).unwrap(), i32s(&[i32::MAX, 9, 2]));
        assert_eq!(r(BinaryOp::Minimum).unwrap(), i32s(&[1, 5, -7]));
        assert!(r(BinaryOp::Div).is_err());
    }

    /// The compact kernels (the browser build's: one loop per dtype for
    /// f64/i32/bool, one compare loop, no fast paths) give the same bits as
    /// the full set, for every op, dtype and broadcasting layout.
    #[test]
    fn compact_kernels_give_the_same_bits() {
        use super::super::{CpuStorage, In, Out};
        use super::{binary_as, compare_as, unary_as};
        let floats = [-2.5, -1.0, -0.0, 0.0, 0.3, 1.0, 7.25, f64::NAN, f64::INFINITY, -f64::INFINITY, 1e-30, -40.0];
        let values = |dtype: DType, n: usize, shift: usize| -> CpuStorage {
            let v = (0..n).map(|i| floats[(i * 5 + shift) % floats.len()]);
            match dtype {
                DType::F32 => CpuStorage::F32(v.map(|x| x as f32).collect()),
                DType::F64 => CpuStorage::F64(v.collect()),
                DType::I32 => CpuStorage::I32(
                    (0..n).map(|i| [i32::MIN, -3, 0, 1, 2, i32::MAX, -7][(i * 3 + shift) % 7]).collect(),
                ),
                DType::Bool => CpuStorage::Bool((0..n).map(|i| ((i + shift) % 3 == 0) as u8).collect()),
            }
        };
        let bits = |s: &CpuStorage| -> Vec<u64> {
            match s {
                CpuStorage::F32(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
                CpuStorage::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
                CpuStorage::I32(v) => v.iter().map(|&x| x as u32 as u64).collect(),
                CpuStorage::Bool(v) => v.iter().map(|&x| x as u64).collect(),
            }
        };
        // (a dims, b dims, out dims): same shape, scalars, rows, columns, both broadcast.
        let layouts: [(&[usize], &[usize], &[usize]); 6] = [
            (&[3, 5], &[3, 5], &[3, 5]),
            (&[3, 5], &[], &[3, 5]),
            (&[1], &[3, 5], &[3, 5]),
            (&[3, 5], &[5], &[3, 5]),
            (&[3, 1], &[3, 5], &[3, 5]),
            (&[3, 1], &[1, 5], &[3, 5]),
        ];
        let mut compared = 0;
        for dtype in [DType::F32, DType::F64, DType::I32, DType::Bool] {
            for (ad, bd, od) in layouts {
                let n: usize = od.iter().product();
                let a = values(dtype, ad.iter().product(), 0);
                let b = values(dtype, bd.iter().product(), 4);
                let (ia, ib) = (In { data: &a, dims: ad, dtype }, In { data: &b, dims: bd, dtype });
                let run = |out_dtype: DType, f: &dyn Fn(&mut Out<'_>, bool) -> crate::error::Result<()>| {
                    let mut full = CpuStorage::zeroed(out_dtype, n).unwrap();
                    let mut compact = CpuStorage::zeroed(out_dtype, n).unwrap();
                    let r1 = f(&mut Out { data: &mut full, dims: od, dtype: out_dtype }, false);
                    let r2 = f(&mut Out { data: &mut compact, dims: od, dtype: out_dtype }, true);
                    assert_eq!(r1.is_ok(), r2.is_ok());
                    (r1.is_ok(), bits(&full), bits(&compact))
                };
                for op in BinaryOp::ALL {
                    let (ok, full, compact) = run(dtype, &|o, c| {
                        if c {
                            binary_as::<true>(op, &[ia, ib], o)
                        } else {
                            binary_as::<false>(op, &[ia, ib], o)
                        }
                    });
                    assert_eq!(full, compact, "{op:?} {dtype} {ad:?} {bd:?}");
                    compared += usize::from(ok);
                }
                for op in CompareOp::ALL {
                    let (ok, full, compact) = run(DType::Bool, &|o, c| {
                        if c {
                            compare_as::<true>(op, &[ia, ib], o)
                        } else {
                            compare_as::<false>(op, &[ia, ib], o)
                        }
                    });
                    assert!(ok);
                    assert_eq!(full, compact, "{op:?} {dtype} {ad:?} {bd:?}");
                    compared += 1;
                }
                if ad == od {
                    for op in UnaryOp::ALL {
                        let (ok, full, compact) = run(dtype, &|o, c| {
                            if c {
                                unary_as::<true>(op, &[ia], o)
                            } else {
                                unary_as::<false>(op, &[ia], o)
                            }
                        });
                        assert_eq!(full, compact, "{op:?} {dtype}");
                        compared += usize::from(ok);
                    }
                }
            }
        }
        assert!(compared > 300, "{compared}");
    }

    #[test]
    fn where_with_a_full_condition_and_scalar_branches() {
        // The fast loops for a full condition with each branch full or a
        // scalar (relu's gradient is where(mask, g, 0)), against the rule.
        let n = 37;
        let cond: Vec<bool> = (0..n).map(|i| i % 3 != 1).collect();
        let a: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
        let b: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
        for (full_a, full_b) in [(true, false), (false, true), (false, false), (true, true)] {
            let pick = |v: &[f32], full: bool| if full { v.to_vec() } else { vec![v[3]] };
            let (av, bv) = (pick(&a, full_a), pick(&b, full_b));
            let dims = |full: bool| if full { vec![n] } else { vec![] };
            let (ad, bd) = (dims(full_a), dims(full_b));
            let r = run_op(Op::Where, &[(bools(&cond), &[n]), (f32s(&av), &ad), (f32s(&bv), &bd)], &[n], DType::F32)
                .unwrap();
            let want: Vec<f32> = (0..n)
                .map(|i| if cond[i] { av[if full_a { i } else { 0 }] } else { bv[if full_b { i } else { 0 }] })
                .collect();
            assert_eq!(r, f32s(&want), "a full {full_a}, b full {full_b}");
        }
    }

    #[test]
    fn compare_where_cast() {
        let a = f32s(&[1.0, 2.0, f32::NAN]);
        let b = f32s(&[2.0]);
        let r = |op| run_op(Op::Compare(op), &[(a.clone(), &[3]), (b.clone(), &[1])], &[3], DType::Bool).unwrap();
        assert_eq!(r(CompareOp::Less), bools(&[true, false, false]));
        assert_eq!(r(CompareOp::LessEqual), bools(&[true, true, false]));
        assert_eq!(r(CompareOp::Equal), bools(&[false, true, false]));
        assert_eq!(r(CompareOp::NotEqual), bools(&[true, false, true]));
        assert_eq!(r(CompareOp::Greater), bools(&[false, false, false]));
        assert_eq!(r(CompareOp::GreaterEqual), bools(&[false, true, false]));
        let r = run_op(
            Op::Compare(CompareOp::Equal),
            &[(bools(&[true, false]), &[2, 1]), (bools(&[true, false]), &[2])],
            &[2, 2],
            DType::Bool,
        )
        .unwrap();
        assert_eq!(r, bools(&[true, false, false, true]));

        // where: cond [2,1], a [2,3], b scalar
        let r = run_op(
            Op::Where,
            &[(bools(&[true, false]), &[2, 1]), (i32s(&[1, 2, 3, 4, 5, 6]), &[2, 3]), (i32s(&[0]), &[])],
            &[2, 3],
            DType::I32,
        )
        .unwrap();
        assert_eq!(r, i32s(&[1, 2, 3, 0, 0, 0]));
        let r = run_op(
            Op::Where,
            &[(bools(&[true, false, true]), &[3]), (f64s(&[1., 2., 3.]), &[3]), (f64s(&[7., 8., 9.]), &[3])],
            &[3],
            DType::F64,
        )
        .unwrap();
        assert_eq!(r, f64s(&[1., 8., 3.]));

        let x = f32s(&[-1.7, 2.9, f32::NAN, 1e20, -1e20, 0.0]);
        let r = run_op(Op::Cast(DType::I32), &[(x.clone(), &[6])], &[6], DType::I32).unwrap();
        assert_eq!(r, i32s(&[-1, 2, 0, i32::MAX, i32::MIN, 0]));
        let r = run_op(Op::Cast(DType::Bool), &[(x, &[6])], &[6], DType::Bool).unwrap();
        assert_eq!(r, bools(&[true, true, true, true, true, false]));
        let r = run_op(Op::Cast(DType::F64), &[(bools(&[true, false]), &[2])], &[2], DType::F64).unwrap();
        assert_eq!(r, f64s(&[1.0, 0.0]));
        let r = run_op(Op::Cast(DType::F32), &[(i32s(&[16777217, -3]), &[2])], &[2], DType::F32).unwrap();
        assert_eq!(r, f32s(&[16777217i32 as f32, -3.0]));
        let r = run_op(Op::Cast(DType::F32), &[(f64s(&[0.1]), &[1])], &[1], DType::F32).unwrap();
        assert_eq!(r, f32s(&[0.1f64 as f32]));
    }
}
