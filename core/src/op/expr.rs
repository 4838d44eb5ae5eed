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
    /// `unary` with the portable library functions (`math::portable`):
    /// the same bits on every target. Natively only the CPU backend's
    /// portable numerics call it; in the browser build `unary` is this.
    #[inline(always)]
    fn unary_portable(op: UnaryOp, x: Self) -> Self {
        Self::unary(op, x)
    }
    /// `binary` with the portable library functions (Pow).
    #[inline(always)]
    fn binary_portable(op: BinaryOp, a: Self, b: Self) -> Self {
        Self::binary(op, a, b)
    }
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
    // a when a is NaN, or when b is not and keep_a holds; else b. Written
    // with non-short-circuit `|`/`&` so that it compiles to a select, not
    // branches: in a running max (softmax, max reductions) the comparison
    // branch mispredicts often (measured: a CausalSoftmax spent a third of
    // its time in it).
    if nan(a) | (!nan(b) & keep_a(a, b)) {
        a
    } else {
        b
    }
}

/// The transcendental functions the per-element definitions call, by where
/// they come from. `portable`: the libm crate's source, the same Rust code
/// (plain IEEE arithmetic) on every target, so the same bits natively and in
/// the browser: natively the `libm` crate; in the browser build std's
/// functions, which there are compiler-builtins' copy of that same source
/// (libm 0.2.16 and the copy in the pinned nightly's compiler-builtins
/// differ only in cfgs for x86 without SSE2, checked by
/// web/scripts/check-libm.sh), so the wasm links one copy. `host`: std's,
/// natively the platform's C math library (glibc's, faster, whose last bit
/// may differ from libm's). kiln's own f32 exp and erf (op/exp.rs,
/// op/erf.rs) are plain arithmetic: both sets use them. Native `host` also
/// has kiln's own f32 tanh and ln (op/tanh.rs, op/log.rs), which vectorise. The CPU backend's
/// portable numerics (`CpuNumerics::Portable`) evaluate with `portable`
/// (`Value::unary_portable`).
pub(crate) mod math {
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) mod portable {
        pub(crate) mod single {
            pub(crate) use crate::op::erf::erf_f32 as erf;
            pub(crate) use crate::op::exp::exp_f32 as exp;
            pub(crate) use libm::{cosf as cos, erfcf as erfc, expm1f as expm1, log1pf as log1p, logf as ln};
            pub(crate) use libm::{powf as pow, sinf as sin, tanhf as tanh};
        }
        pub(crate) mod double {
            pub(crate) use libm::{cos, erf, erfc, exp, expm1, log as ln, log1p, pow, sin, tanh};
        }
    }
    #[cfg(target_arch = "wasm32")]
    pub(crate) use host as portable;
    pub(crate) mod host {
        pub(crate) mod single {
            pub(crate) use crate::op::erf::erf_f32 as erf;
            pub(crate) use crate::op::exp::exp_f32 as exp;
            pub(crate) use libm::{erfcf as erfc, expm1f as expm1, log1pf as log1p};
            // Natively kiln's own (vectorises); in the browser std's, which
            // is libm's there, as the portable numerics promise.
            #[cfg(not(target_arch = "wasm32"))]
            pub(crate) use crate::op::log::ln_f32 as ln;
            #[cfg(target_arch = "wasm32")]
            #[inline(always)]
            pub(crate) fn ln(x: f32) -> f32 {
                x.ln()
            }
            #[inline(always)]
            pub(crate) fn sin(x: f32) -> f32 {
                x.sin()
            }
            #[inline(always)]
            pub(crate) fn cos(x: f32) -> f32 {
                x.cos()
            }
            // Natively kiln's own (vectorises); in the browser std's, which
            // is libm's there, as the portable numerics promise.
            #[cfg(not(target_arch = "wasm32"))]
            pub(crate) use crate::op::tanh::tanh_f32 as tanh;
            #[cfg(target_arch = "wasm32")]
            #[inline(always)]
            pub(crate) fn tanh(x: f32) -> f32 {
                x.tanh()
            }
            #[inline(always)]
            pub(crate) fn pow(a: f32, b: f32) -> f32 {
                a.powf(b)
            }
        }
        pub(crate) mod double {
            pub(crate) use libm::{erf, erfc, expm1, log1p};
            #[inline(always)]
            pub(crate) fn exp(x: f64) -> f64 {
                x.exp()
            }
            #[inline(always)]
            pub(crate) fn ln(x: f64) -> f64 {
                x.ln()
            }
            #[inline(always)]
            pub(crate) fn sin(x: f64) -> f64 {
                x.sin()
            }
            #[inline(always)]
            pub(crate) fn cos(x: f64) -> f64 {
                x.cos()
            }
            #[inline(always)]
            pub(crate) fn tanh(x: f64) -> f64 {
                x.tanh()
            }
            #[inline(always)]
            pub(crate) fn pow(a: f64, b: f64) -> f64 {
                a.powf(b)
            }
        }
    }
}

/// A float unary op's value, with the library functions of module `$m`
/// (`math::host::single`, ...).
macro_rules! float_unary {
    ($t:ty, $op:expr, $x:expr, $($m:ident)::+) => {{
        let x: $t = $x;
        match $op {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => $($m)::+::exp(x),
            UnaryOp::Log => $($m)::+::ln(x),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Recip => 1.0 / x,
            UnaryOp::Sin => $($m)::+::sin(x),
            UnaryOp::Cos => $($m)::+::cos(x),
            UnaryOp::Tanh => $($m)::+::tanh(x),
            // Two forms, so that neither overflows to inf/inf.
            UnaryOp::Sigmoid => {
                if x >= 0.0 {
                    1.0 / (1.0 + $($m)::+::exp(-x))
                } else {
                    let e = $($m)::+::exp(x);
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
            UnaryOp::Erf => $($m)::+::erf(x),
            UnaryOp::Erfc => $($m)::+::erfc(x),
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
            UnaryOp::Log1p => $($m)::+::log1p(x),
            UnaryOp::Expm1 => $($m)::+::expm1(x),
            // GELU and its derivative: the op table's expressions
            // (GELU, GELU_DERIVATIVE there), the same operations in
            // the same order, written out so that the loops calling
            // them vectorise instead of walking the expression tree
            // per element (`every_element_wise_op_evaluates` checks
            // that both agree bit for bit).
            UnaryOp::Gelu => {
                let two_phi = $($m)::+::erf(x * std::f64::consts::FRAC_1_SQRT_2 as $t) + 1.0;
                (x * 0.5) * two_phi
            }
            UnaryOp::GeluDerivative => {
                let two_phi = $($m)::+::erf(x * std::f64::consts::FRAC_1_SQRT_2 as $t) + 1.0;
                let density = $($m)::+::exp((x * x) * -0.5) * super::FRAC_1_SQRT_2PI as $t;
                two_phi * 0.5 + x * density
            }
            // Softsign: the table's expression, written out (as GELU's).
            UnaryOp::Softsign => x / (1.0 + x.abs()),
            // Ops the table composes from the ones above (their
            // expressions use no library function: see the test
            // `composed_ops_use_no_library_function`).
            #[allow(unreachable_patterns)]
            op => composed_unary(op, x),
        }
    }};
}

/// A float binary op's value, with the library functions of module `$m`.
macro_rules! float_binary {
    ($op:expr, $a:expr, $b:expr, $($m:ident)::+) => {{
        let (a, b) = ($a, $b);
        match $op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Pow => $($m)::+::pow(a, b),
            BinaryOp::Maximum => pick(a, b, |a, b| a >= b),
            BinaryOp::Minimum => pick(a, b, |a, b| a <= b),
        }
    }};
}

macro_rules! float_value {
    ($t:ty, $width:ident) => {
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
                float_unary!($t, op, x, math::host::$width)
            }
            #[inline(always)]
            fn binary(op: BinaryOp, a: Self, b: Self) -> Self {
                float_binary!(op, a, b, math::host::$width)
            }
            #[inline(always)]
            fn unary_portable(op: UnaryOp, x: Self) -> Self {
                float_unary!($t, op, x, math::portable::$width)
            }
            #[inline(always)]
            fn binary_portable(op: BinaryOp, a: Self, b: Self) -> Self {
                float_binary!(op, a, b, math::portable::$width)
            }
        }
    };
}
float_value!(f32, single);
float_value!(f64, double);

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

    /// Composed unary ops are evaluated through `Expr::eval`, i.e. with the
    /// host library functions even in portable numerics: their expressions
    /// must use only operations whose bits no library decides (Gelu and its
    /// derivative are written out with the chosen library in `unary`).
    #[test]
    fn composed_ops_use_no_library_function() {
        fn exact(e: &Expr) -> bool {
            match *e {
                Expr::Arg(_) | Expr::Const(_) => true,
                Expr::Unary(op, a) => {
                    matches!(
                        op,
                        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Recip | UnaryOp::Relu | UnaryOp::Sign
                    ) && exact(a)
                }
                Expr::Binary(op, a, b) => op != BinaryOp::Pow && exact(a) && exact(b),
                Expr::Compare(_, a, b) => exact(a) && exact(b),
                Expr::Select(c, a, b) => exact(c) && exact(a) && exact(b),
                Expr::Cast(a) => exact(a),
            }
        }
        for op in UnaryOp::ALL {
            let e = Op::Unary(op).info().elementwise.expect("unary ops are element-wise").expr;
            let composed = e != Expr::Unary(op, arg(0));
            if composed && !matches!(op, UnaryOp::Gelu | UnaryOp::GeluDerivative) {
                assert!(exact(&e), "{} is composed with a library function", op.name());
            }
        }
        for op in BinaryOp::ALL {
            let e = Op::Binary(op).info().elementwise.expect("binary ops are element-wise").expr;
            assert_eq!(e, Expr::Binary(op, arg(0), arg(1)), "{} is composed", op.name());
        }
    }

    /// The portable functions are the libm crate's, natively too.
    #[test]
    fn portable_functions_are_libm() {
        for x in [0.3f32, 1.7, 12.5, -2.25] {
            assert_eq!(f32::unary_portable(UnaryOp::Log, x.abs()).to_bits(), libm::logf(x.abs()).to_bits());
            assert_eq!(f32::unary_portable(UnaryOp::Tanh, x).to_bits(), libm::tanhf(x).to_bits());
            assert_eq!(f32::unary_portable(UnaryOp::Sin, x).to_bits(), libm::sinf(x).to_bits());
            assert_eq!(f32::binary_portable(BinaryOp::Pow, x.abs(), 1.3).to_bits(), libm::powf(x.abs(), 1.3).to_bits());
            let y = f64::from(x);
            assert_eq!(f64::unary_portable(UnaryOp::Exp, y).to_bits(), libm::exp(y).to_bits());
            assert_eq!(f64::unary_portable(UnaryOp::Cos, y).to_bits(), libm::cos(y).to_bits());
            // Ops no library decides are the same either way.
            assert_eq!(f32::unary_portable(UnaryOp::Exp, x).to_bits(), f32::unary(UnaryOp::Exp, x).to_bits());
            assert_eq!(f32::unary_portable(UnaryOp::Gelu, x).to_bits(), f32::unary(UnaryOp::Gelu, x).to_bits());
        }
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
