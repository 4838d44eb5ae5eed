//! The scalar expression an element-wise op computes per element: a small
//! tree over the op's operands, constants and the element-wise primitives.
//!
//! It is data, so one description serves every backend: the CPU evaluates
//! it generically on f32, f64 or i32 (`Expr::eval`, and per-op kernels for
//! the primitives, see `Value`), and kiln-wgsl prints it as WGSL (each
//! primitive a function of `shaders/scalar.wgsl` named after the op and the
//! type, e.g. `log1p_f32`). Fused kernels are built by printing or
//! evaluating the expressions of a chain of nodes one after another.

use super::{BinaryOp, CompareOp, Op, UnaryOp};

/// One element-wise computation. Children are `'static`: the op table's
/// expressions are constants, so reading one never allocates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Expr {
    /// Operand `k` of the op (for Where: 0 the condition, 1 and 2 the
    /// branches).
    Arg(u8),
    /// A constant, converted to the element type.
    Const(f64),
    Unary(UnaryOp, &'static Expr),
    Binary(BinaryOp, &'static Expr, &'static Expr),
    /// A comparison: a bool.
    Compare(CompareOp, &'static Expr, &'static Expr),
    /// `cond ? a : b`, with `cond` a bool (a comparison, or a bool operand).
    Select(&'static Expr, &'static Expr, &'static Expr),
    /// The operand converted to the output's dtype (Rust `as` semantics;
    /// to bool as `!= 0`).
    Cast(&'static Expr),
}

/// Operand k, as a `'static` expression.
pub const fn arg(k: u8) -> &'static Expr {
    match k {
        0 => &Expr::Arg(0),
        1 => &Expr::Arg(1),
        _ => &Expr::Arg(2),
    }
}

impl Expr {
    /// The value of the expression for one element, all operands and the
    /// result of type `T` (bool operands as 0/1). The CPU's generic path and
    /// the reference for fused kernels.
    pub fn eval<T: Value>(&self, args: &[T]) -> T {
        match *self {
            Expr::Arg(k) => args[k as usize],
            Expr::Const(c) => T::constant(c),
            Expr::Unary(op, a) => T::unary(op, a.eval(args)),
            Expr::Binary(op, a, b) => T::binary(op, a.eval(args), b.eval(args)),
            Expr::Compare(op, a, b) => T::from_bool(T::compare(op, a.eval(args), b.eval(args))),
            Expr::Select(c, a, b) => {
                if c.eval(args).is_true() {
                    a.eval(args)
                } else {
                    b.eval(args)
                }
            }
            // One element type in and out: nothing to convert.
            Expr::Cast(a) => a.eval(args),
        }
    }

    /// How many operands the expression reads (the largest `Arg` + 1).
    pub fn arity(&self) -> usize {
        match *self {
            Expr::Arg(k) => k as usize + 1,
            Expr::Const(_) => 0,
            Expr::Unary(_, a) | Expr::Cast(a) => a.arity(),
            Expr::Binary(_, a, b) | Expr::Compare(_, a, b) => a.arity().max(b.arity()),
            Expr::Select(c, a, b) => c.arity().max(a.arity()).max(b.arity()),
        }
    }
}

/// An element type expressions evaluate on: f32, f64, i32. Each primitive
/// element-wise op's per-element function is defined here, once per type
/// class, and nowhere else on the CPU (its kernels call these with the op
/// fixed at compile time).
pub trait Value: Copy + PartialOrd + Send + Sync + 'static {
    fn constant(c: f64) -> Self;
    fn from_bool(b: bool) -> Self;
    fn is_true(self) -> bool;
    fn unary(op: UnaryOp, x: Self) -> Self;
    fn binary(op: BinaryOp, a: Self, b: Self) -> Self;
    /// IEEE comparisons: every ordered comparison with NaN is false and
    /// NotEqual is true for NaN.
    #[inline(always)]
    fn compare(op: CompareOp, a: Self, b: Self) -> bool {
        compare(op, a, b)
    }
}

/// A unary op that the op table defines as an expression of other
/// primitives (e.g. Softsign = x / (1 + |x|)): its value is that
/// expression's. `Value::unary` sends every op without a scalar function of
/// its own here, so a composed op needs no code in this file.
#[inline]
pub fn composed_unary<T: Value>(op: UnaryOp, x: T) -> T {
    match Op::Unary(op).info().elementwise {
        Some(e) if e.expr != Expr::Unary(op, arg(0)) => e.expr.eval(&[x]),
        // A primitive with neither a scalar function nor a composition: the
        // table test (`every_element_wise_op_evaluates`) catches it.
        _ => panic!("{} is a primitive with no scalar function in op::expr", op.name()),
    }
}

/// A comparison of two values of any ordered type (bools included).
#[inline(always)]
pub fn compare<T: PartialOrd>(op: CompareOp, a: T, b: T) -> bool {
    match op {
        CompareOp::Equal => a == b,
        CompareOp::NotEqual => a != b,
        CompareOp::Less => a < b,
        CompareOp::LessEqual => a <= b,
        CompareOp::Greater => a > b,
        CompareOp::GreaterEqual => a >= b,
    }
}

/// Maximum/Minimum: NaN propagates (the first NaN operand wins), ties keep
/// the first operand.
#[inline(always)]
fn pick<T: PartialOrd + Copy>(a: T, b: T, keep_a: impl Fn(T, T) -> bool) -> T {
    #[allow(clippy::eq_op)]
    let nan = |v: T| v != v;
    if nan(a) {
        a
    } else if nan(b) || !keep_a(a, b) {
        b
    } else {
        a
    }
}

macro_rules! float_value {
    ($t:ty, $exp:path, $erf:path, $erfc:path, $log1p:path, $expm1:path) => {
        impl Value for $t {
            #[inline(always)]
            fn constant(c: f64) -> Self {
                c as $t
            }
            #[inline(always)]
            fn from_bool(b: bool) -> Self {
                b as u8 as $t
            }
            #[inline(always)]
            fn is_true(self) -> bool {
                self != 0.0
            }
            #[inline(always)]
            fn unary(op: UnaryOp, x: Self) -> Self {
                match op {
                    UnaryOp::Neg => -x,
                    UnaryOp::Abs => x.abs(),
                    UnaryOp::Exp => $exp(x),
                    UnaryOp::Log => x.ln(),
                    UnaryOp::Sqrt => x.sqrt(),
                    UnaryOp::Recip => 1.0 / x,
                    UnaryOp::Sin => x.sin(),
                    UnaryOp::Cos => x.cos(),
                    UnaryOp::Tanh => x.tanh(),
                    // Two forms, so that neither overflows to inf/inf.
                    UnaryOp::Sigmoid => {
                        if x >= 0.0 {
                            1.0 / (1.0 + $exp(-x))
                        } else {
                            let e = $exp(x);
                            e / (1.0 + e)
                        }
                    }
                    // NaN < 0 is false, so NaN passes through.
                    UnaryOp::Relu => {
                        if x < 0.0 {
                            0.0
                        } else {
                            x
                        }
                    }
                    UnaryOp::Erf => $erf(x),
                    UnaryOp::Erfc => $erfc(x),
                    // 0, -0 and NaN stay.
                    UnaryOp::Sign => {
                        if x > 0.0 {
                            1.0
                        } else if x < 0.0 {
                            -1.0
                        } else {
                            x
                        }
                    }
                    UnaryOp::Log1p => $log1p(x),
                    UnaryOp::Expm1 => $expm1(x),
                    // GELU and its derivative: the op table's expressions
                    // (GELU, GELU_DERIVATIVE there), the same operations in
                    // the same order, written out so that the loops calling
                    // them vectorise instead of walking the expression tree
                    // per element (`every_element_wise_op_evaluates` checks
                    // that both agree bit for bit).
                    UnaryOp::Gelu => {
                        let two_phi = $erf(x * std::f64::consts::FRAC_1_SQRT_2 as $t) + 1.0;
                        (two_phi * x) * 0.5
                    }
                    UnaryOp::GeluDerivative => {
                        let two_phi = $erf(x * std::f64::consts::FRAC_1_SQRT_2 as $t) + 1.0;
                        let density = $exp((x * x) * -0.5) * super::FRAC_1_SQRT_2PI as $t;
                        two_phi * 0.5 + x * density
                    }
                    // Ops the table composes from the ones above.
                    #[allow(unreachable_patterns)]
                    _ => composed_unary(op, x),
                }
            }
            #[inline(always)]
            fn binary(op: BinaryOp, a: Self, b: Self) -> Self {
                match op {
                    BinaryOp::Add => a + b,
                    BinaryOp::Sub => a - b,
                    BinaryOp::Mul => a * b,
                    BinaryOp::Div => a / b,
                    BinaryOp::Pow => a.powf(b),
                    BinaryOp::Maximum => pick(a, b, |a, b| a >= b),
                    BinaryOp::Minimum => pick(a, b, |a, b| a <= b),
                }
            }
        }
    };
}
// f32 exp and erf: our branch-free versions (op/exp.rs, op/erf.rs), which
// vectorise.
float_value!(f32, super::exp::exp_f32, super::erf::erf_f32, libm::erfcf, libm::log1pf, libm::expm1f);
float_value!(f64, f64::exp, libm::erf, libm::erfc, libm::log1p, libm::expm1);

/// i32 arithmetic wraps. The ops the table refuses for i32 (Div, Pow and
/// the transcendental functions) are never run on i32 by a kernel; they are
/// defined here through f64 only so that evaluation is total.
impl Value for i32 {
    #[inline(always)]
    fn constant(c: f64) -> Self {
        c as i32
    }
    #[inline(always)]
    fn from_bool(b: bool) -> Self {
        b as i32
    }
    #[inline(always)]
    fn is_true(self) -> bool {
        self != 0
    }
    #[inline(always)]
    fn unary(op: UnaryOp, x: Self) -> Self {
        match op {
            UnaryOp::Neg => x.wrapping_neg(),
            UnaryOp::Abs => x.wrapping_abs(),
            UnaryOp::Relu => x.max(0),
            UnaryOp::Sign => x.signum(),
            _ => f64::unary(op, x as f64) as i32,
        }
    }
    #[inline(always)]
    fn binary(op: BinaryOp, a: Self, b: Self) -> Self {
        match op {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            BinaryOp::Maximum => a.max(b),
            BinaryOp::Minimum => a.min(b),
            BinaryOp::Div | BinaryOp::Pow => f64::binary(op, a as f64, b as f64) as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_evaluate_on_every_type() {
        // sigmoid(x0) * x1 + 1 and a select.
        const E: Expr = Expr::Binary(
            BinaryOp::Add,
            &Expr::Binary(BinaryOp::Mul, &Expr::Unary(UnaryOp::Sigmoid, arg(0)), arg(1)),
            &Expr::Const(1.0),
        );
        assert_eq!(E.arity(), 2);
        assert!((E.eval::<f64>(&[0.0, 4.0]) - 3.0).abs() < 1e-15);
        assert!((E.eval::<f32>(&[0.0, 4.0]) - 3.0).abs() < 1e-6);
        const S: Expr = Expr::Select(&Expr::Compare(CompareOp::Less, arg(0), &Expr::Const(0.0)), arg(1), arg(0));
        assert_eq!(S.eval::<i32>(&[-3, 7]), 7);
        assert_eq!(S.eval::<i32>(&[3, 7]), 3);
        assert_eq!(i32::unary(UnaryOp::Neg, i32::MIN), i32::MIN);
        assert!(f32::binary(BinaryOp::Maximum, f32::NAN, 1.0).is_nan());
        assert!(f32::binary(BinaryOp::Minimum, 1.0, f32::NAN).is_nan());
        assert_eq!(f64::unary(UnaryOp::Log1p, 1e-20), 1e-20);
        assert_eq!(f64::unary(UnaryOp::Expm1, 1e-20), 1e-20);
    }

    /// Every element-wise op of the table evaluates on every type its
    /// kernels exist for (a primitive without a scalar function would
    /// panic here), and composed ops agree with their expression.
    #[test]
    fn every_element_wise_op_evaluates() {
        use crate::dtype::DType;
        for op in UnaryOp::ALL {
            let info = Op::Unary(op).info();
            let e = info.elementwise.expect("unary ops are element-wise").expr;
            for x in [-1.5f64, -0.25, 0.0, 0.5, 2.0, -7.0, 1e-3, 4.5, f64::NAN] {
                let v = f64::unary(op, x);
                let direct = e.eval(&[x]);
                assert!(v == direct || (v.is_nan() && direct.is_nan()), "{} at {x}", op.name());
                // f32 too: a composed op written out in `Value::unary`
                // (Gelu) must do exactly its expression's operations.
                let (v, direct) = (f32::unary(op, x as f32), e.eval(&[x as f32]));
                assert!(
                    v.to_bits() == direct.to_bits() || (v.is_nan() && direct.is_nan()),
                    "{} at {x} (f32)",
                    op.name()
                );
            }
            if info.dtypes.contains(DType::I32) {
                let _ = i32::unary(op, -3);
            }
        }
    }
}
