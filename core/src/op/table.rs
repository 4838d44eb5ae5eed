//! The op table: what each primitive is, stated once.
//!
//! `Op::info` is one `match` over every primitive. Everything else that
//! needs a per-op fact reads it: node construction (dtype checks, which
//! inputs carry gradient, which values backward keeps), the autograd walk
//! (no-rule errors), the kernel set of every backend (`has_kernel`), the CPU
//! element-wise kernels and the WGSL generator (`Elementwise::expr`), the
//! coverage report and the sample cases of the tests. A test walks
//! `Op::kinds()` and checks each entry against the gradient rules and the
//! backends (see `autograd::rules` and kiln-wgsl's shader tests).
//!
//! The gradient rules themselves stay code (`autograd/rules.rs`): each is a
//! few forward ops.

use super::expr::{arg, Expr};
use super::{BinaryOp, CompareOp, Op, ReduceOp, UnaryOp};
use crate::dtype::DType;

/// What kind of kernel an op needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Holds data; nothing runs (Input, Param).
    Leaf,
    /// Writes a value computed from the position alone (Full, Arange).
    Creation,
    /// Counter-based random numbers (RandUniform, RandNormal).
    Random,
    /// One output element from the same position of each (broadcast)
    /// operand: `Elementwise::expr` says how.
    Elementwise,
    Reduce,
    MatMul,
    /// Rearranges elements without arithmetic.
    Movement,
    /// Gathers or scatters along an axis at positions given by a tensor.
    Index,
    /// Sliding windows over NCHW images (Im2Col, Col2Im, pooling).
    Window,
    /// A normalisation of each row of the last axis (CausalSoftmax,
    /// LayerNorm and its backward).
    Rowwise,
    /// Running sums along an axis (CumSum).
    Scan,
    /// Positions chosen by comparing elements (TopK).
    Selection,
    /// A user-defined op (`op::custom`): its own CPU function and WGSL.
    Custom,
}

/// How many operands an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Exactly(u8),
    AtLeast(u8),
}

impl Arity {
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exactly(k) => n == k as usize,
            Arity::AtLeast(k) => n >= k as usize,
        }
    }
}

/// A set of dtypes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DTypeSet(u8);

impl DTypeSet {
    pub const NONE: DTypeSet = DTypeSet(0);
    pub const FLOAT: DTypeSet = DTypeSet(1 | 2);
    /// f32, f64 and i32.
    pub const NUMERIC: DTypeSet = DTypeSet(1 | 2 | 4);
    pub const ANY: DTypeSet = DTypeSet(1 | 2 | 4 | 8);
    pub const I32: DTypeSet = DTypeSet(4);
    pub const BOOL: DTypeSet = DTypeSet(8);

    const fn bit(dtype: DType) -> u8 {
        match dtype {
            DType::F32 => 1,
            DType::F64 => 2,
            DType::I32 => 4,
            DType::Bool => 8,
        }
    }
    #[inline]
    pub const fn contains(self, dtype: DType) -> bool {
        self.0 & Self::bit(dtype) != 0
    }
    pub const fn of(dtypes: &[DType]) -> DTypeSet {
        let mut bits = 0;
        let mut i = 0;
        while i < dtypes.len() {
            bits |= Self::bit(dtypes[i]);
            i += 1;
        }
        DTypeSet(bits)
    }
    pub const fn union(self, other: DTypeSet) -> DTypeSet {
        DTypeSet(self.0 | other.0)
    }
    pub const fn intersect(self, other: DTypeSet) -> DTypeSet {
        DTypeSet(self.0 & other.0)
    }
}

/// How the output's dtype follows from the operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeRule {
    /// Chosen by the caller (leaves, creation, random, Cast's target).
    Given,
    /// The dtype of operand k (all same-typed operands are checked equal).
    SameAs(u8),
    Bool,
    I32,
}

/// Which values the gradient rule reads, so the executor keeps them after
/// the forward pass (bit i = input i).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Saved {
    pub inputs: u8,
    pub output: bool,
}

/// Where an operand of an element-wise op is smooth and well conditioned:
/// sample cases (coverage, gradient checks, parity tests) draw from here.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Domain {
    /// Uniform in [low, high).
    Interval(f64, f64),
    /// Magnitudes in [low, high) with either sign (kinks at 0).
    AwayFromZero(f64, f64),
}

/// What an element-wise op computes per element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Elementwise {
    pub expr: Expr,
    /// Work per element relative to an add (CPU parallel threshold; fusion
    /// cost estimates).
    pub cost: u8,
    /// Sample domains of operands 0 and 1.
    pub domains: [Domain; 2],
}

/// Everything kiln states about one primitive. Plain constant data: reading
/// it never allocates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpInfo {
    /// As OPS.md spells it; errors and reports use it.
    pub name: &'static str,
    pub family: Family,
    pub arity: Arity,
    /// Output dtypes a kernel exists for. For the element-wise arithmetic
    /// ops, also the operand dtypes their constructors accept.
    pub dtypes: DTypeSet,
    pub output: DTypeRule,
    /// Bit i set: the output depends differentiably on input i, so the node
    /// requires grad when that input does (0xff: every input).
    pub grad_inputs: u8,
    pub saved: Saved,
    /// Set when backward through the op is an error, and why (the op may
    /// still carry grad: Sign does, so that backward through it fails
    /// loudly instead of giving silent zeros).
    pub no_rule: Option<&'static str>,
    pub elementwise: Option<Elementwise>,
}

impl OpInfo {
    /// The operand count of a fixed-arity op (the minimum of a variadic one).
    pub fn arity_exact(&self) -> usize {
        match self.arity {
            Arity::Exactly(n) | Arity::AtLeast(n) => n as usize,
        }
    }

    /// Whether the gradient flows from the output to input `i`.
    #[inline]
    pub fn differentiable_input(&self, i: usize) -> bool {
        i < 8 && self.grad_inputs & (1 << i) != 0
    }
}

const EVERY: u8 = 0xff;
const CHEAP: u8 = 1;
/// Work weight of a transcendental function.
const DEAR: u8 = 16;
const ANYWHERE: Domain = Domain::Interval(-2.0, 2.0);
const POSITIVE: Domain = Domain::Interval(0.5, 2.0);
/// ANYWHERE shifted: samples of the two never tie.
const OFFSET: Domain = Domain::Interval(-1.9, 2.1);

/// x / (1 + |x|).
const SOFTSIGN: Expr = Expr::Binary(
    BinaryOp::Div,
    arg(0),
    &Expr::Binary(BinaryOp::Add, &Expr::Const(1.0), &Expr::Unary(UnaryOp::Abs, arg(0))),
);

/// erf(x/√2) + 1, GELU's 2·Φ(x).
const TWO_PHI: Expr = Expr::Binary(
    BinaryOp::Add,
    &Expr::Unary(UnaryOp::Erf, &Expr::Binary(BinaryOp::Mul, arg(0), &Expr::Const(std::f64::consts::FRAC_1_SQRT_2))),
    &Expr::Const(1.0),
);

/// (x · 0.5) · (erf(x/√2) + 1). Halving first keeps GELU(x) = x for the
/// largest floats, where (erf + 1) · x overflowed to inf; halving is exact
/// in the normal range, so other values keep their bits.
const GELU: Expr = Expr::Binary(BinaryOp::Mul, &Expr::Binary(BinaryOp::Mul, arg(0), &Expr::Const(0.5)), &TWO_PHI);

/// 1/√(2π), the standard normal density at 0.
pub(crate) const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// Φ(x) + x·φ(x) = (erf(x/√2) + 1) · 0.5 + x · (exp(x·x · −0.5) · 1/√(2π)).
const GELU_DERIVATIVE: Expr = Expr::Binary(
    BinaryOp::Add,
    &Expr::Binary(BinaryOp::Mul, &TWO_PHI, &Expr::Const(0.5)),
    &Expr::Binary(
        BinaryOp::Mul,
        arg(0),
        &Expr::Binary(
            BinaryOp::Mul,
            &Expr::Unary(
                UnaryOp::Exp,
                &Expr::Binary(BinaryOp::Mul, &Expr::Binary(BinaryOp::Mul, arg(0), arg(0)), &Expr::Const(-0.5)),
            ),
            &Expr::Const(FRAC_1_SQRT_2PI),
        ),
    ),
);

const fn saved(inputs: u8, output: bool) -> Saved {
    Saved { inputs, output }
}

/// An op that is not element-wise.
const fn op(
    name: &'static str,
    family: Family,
    arity: Arity,
    dtypes: DTypeSet,
    output: DTypeRule,
    grad_inputs: u8,
    saved: Saved,
) -> OpInfo {
    OpInfo { name, family, arity, dtypes, output, grad_inputs, saved, no_rule: None, elementwise: None }
}

const fn no_rule(info: OpInfo, why: &'static str) -> OpInfo {
    OpInfo { no_rule: Some(why), ..info }
}

const LEAF: &str = "leaf: gradients stop here";
const CREATION: &str = "creation op: no inputs";

/// A unary element-wise op computing `f(x)` with f the op's own primitive.
const fn unary(name: &'static str, me: UnaryOp, dtypes: DTypeSet, saved: Saved, cost: u8, domain: Domain) -> OpInfo {
    composed(name, Expr::Unary(me, arg(0)), dtypes, saved, cost, domain)
}

/// A unary element-wise op whose value is `expr`, an expression of other
/// primitives: backends evaluate (CPU) or print (WGSL) it, so the op needs
/// no kernel code of its own.
const fn composed(name: &'static str, expr: Expr, dtypes: DTypeSet, saved: Saved, cost: u8, domain: Domain) -> OpInfo {
    OpInfo {
        name,
        family: Family::Elementwise,
        arity: Arity::Exactly(1),
        dtypes,
        output: DTypeRule::SameAs(0),
        grad_inputs: 1,
        saved,
        no_rule: None,
        elementwise: Some(Elementwise { expr, cost, domains: [domain, ANYWHERE] }),
    }
}

/// A broadcasting binary op computing `f(a, b)` with f its own primitive.
const fn binary(name: &'static str, me: BinaryOp, dtypes: DTypeSet, saved: Saved, domains: [Domain; 2]) -> OpInfo {
    let cost = if matches!(me, BinaryOp::Pow) { DEAR } else { CHEAP };
    let expr = Expr::Binary(me, arg(0), arg(1));
    OpInfo {
        name,
        family: Family::Elementwise,
        arity: Arity::Exactly(2),
        dtypes,
        output: DTypeRule::SameAs(0),
        grad_inputs: 0b11,
        saved,
        no_rule: None,
        elementwise: Some(Elementwise { expr, cost, domains }),
    }
}

const fn compare(name: &'static str, me: CompareOp) -> OpInfo {
    let expr = Expr::Compare(me, arg(0), arg(1));
    OpInfo {
        name,
        family: Family::Elementwise,
        arity: Arity::Exactly(2),
        dtypes: DTypeSet::BOOL,
        output: DTypeRule::Bool,
        grad_inputs: 0,
        saved: saved(0, false),
        no_rule: Some("comparisons produce bool tensors"),
        elementwise: Some(Elementwise { expr, cost: CHEAP, domains: [ANYWHERE, ANYWHERE] }),
    }
}

const fn reduce(name: &'static str, dtypes: DTypeSet, output: DTypeRule, grad: u8, saved: Saved) -> OpInfo {
    op(name, Family::Reduce, Arity::Exactly(1), dtypes, output, grad, saved)
}

const fn movement(name: &'static str, arity: Arity) -> OpInfo {
    op(name, Family::Movement, arity, DTypeSet::ANY, DTypeRule::SameAs(0), EVERY, saved(0, false))
}

const fn window(name: &'static str, arity: u8, dtypes: DTypeSet, grad: u8, saved: Saved) -> OpInfo {
    op(name, Family::Window, Arity::Exactly(arity), dtypes, DTypeRule::SameAs(0), grad, saved)
}

impl Op {
    /// The op table: every fact about this primitive. One arm per op.
    // Inlined natively (callers that know the op fold it to a constant); in
    // the size-first browser build one copy, called (inlined, it appeared
    // three times: ~7 KB of wasm).
    #[cfg_attr(not(target_arch = "wasm32"), inline)]
    #[cfg_attr(target_arch = "wasm32", inline(never))]
    pub fn info(&self) -> OpInfo {
        use DTypeSet as D;
        use Family as F;
        let x = saved(0b1, false);
        let y = saved(0, true);
        let nothing = saved(0, false);
        let float_or_int = D::NUMERIC;
        match *self {
            Op::Input => no_rule(op("Input", F::Leaf, Arity::Exactly(0), D::NONE, DTypeRule::Given, 0, nothing), LEAF),
            Op::Param(_) => {
                no_rule(op("Param", F::Leaf, Arity::Exactly(0), D::NONE, DTypeRule::Given, 0, nothing), LEAF)
            }
            Op::Full(_) => {
                no_rule(op("Full", F::Creation, Arity::Exactly(0), D::ANY, DTypeRule::Given, 0, nothing), CREATION)
            }
            Op::Arange { .. } => {
                no_rule(op("Arange", F::Creation, Arity::Exactly(0), D::ANY, DTypeRule::Given, 0, nothing), CREATION)
            }
            Op::RandUniform { .. } => no_rule(
                op("RandUniform", F::Random, Arity::Exactly(0), D::FLOAT, DTypeRule::Given, 0, nothing),
                CREATION,
            ),
            Op::RandNormal { .. } => no_rule(
                op("RandNormal", F::Random, Arity::Exactly(0), D::FLOAT, DTypeRule::Given, 0, nothing),
                CREATION,
            ),
            Op::Unary(u) => match u {
                UnaryOp::Neg => unary("Neg", u, float_or_int, nothing, CHEAP, ANYWHERE),
                UnaryOp::Abs => unary("Abs", u, float_or_int, x, CHEAP, Domain::AwayFromZero(0.3, 2.0)),
                UnaryOp::Exp => unary("Exp", u, D::FLOAT, y, DEAR, ANYWHERE),
                UnaryOp::Log => unary("Log", u, D::FLOAT, x, DEAR, POSITIVE),
                UnaryOp::Sqrt => unary("Sqrt", u, D::FLOAT, y, CHEAP, POSITIVE),
                UnaryOp::Recip => unary("Recip", u, D::FLOAT, y, CHEAP, Domain::AwayFromZero(0.5, 2.0)),
                UnaryOp::Sin => unary("Sin", u, D::FLOAT, x, DEAR, Domain::Interval(-3.0, 3.0)),
                UnaryOp::Cos => unary("Cos", u, D::FLOAT, x, DEAR, Domain::Interval(-3.0, 3.0)),
                UnaryOp::Tanh => unary("Tanh", u, D::FLOAT, y, DEAR, ANYWHERE),
                UnaryOp::Sigmoid => unary("Sigmoid", u, D::FLOAT, y, DEAR, Domain::Interval(-3.0, 3.0)),
                UnaryOp::Relu => unary("Relu", u, float_or_int, x, CHEAP, Domain::AwayFromZero(0.2, 2.0)),
                UnaryOp::Erf => unary("Erf", u, D::FLOAT, x, DEAR, ANYWHERE),
                UnaryOp::Erfc => unary("Erfc", u, D::FLOAT, x, DEAR, ANYWHERE),
                UnaryOp::Sign => no_rule(
                    unary("Sign", u, float_or_int, nothing, CHEAP, ANYWHERE),
                    "sign is piecewise constant (its derivative is zero almost everywhere); detach() its \
                     input if a zero gradient is intended",
                ),
                UnaryOp::Log1p => unary("Log1p", u, D::FLOAT, x, DEAR, Domain::Interval(-0.5, 2.0)),
                UnaryOp::Expm1 => unary("Expm1", u, D::FLOAT, x, DEAR, ANYWHERE),
                UnaryOp::Softsign => composed("Softsign", SOFTSIGN, D::FLOAT, x, CHEAP, Domain::AwayFromZero(0.2, 2.0)),
                UnaryOp::Gelu => composed("Gelu", GELU, D::FLOAT, x, DEAR, ANYWHERE),
                UnaryOp::GeluDerivative => composed("GeluDerivative", GELU_DERIVATIVE, D::FLOAT, x, DEAR, ANYWHERE),
            },
            Op::Cast(_) => OpInfo {
                name: "Cast",
                family: F::Elementwise,
                arity: Arity::Exactly(1),
                dtypes: D::ANY,
                output: DTypeRule::Given,
                grad_inputs: 1,
                saved: nothing,
                no_rule: None,
                elementwise: Some(Elementwise { expr: Expr::Cast(arg(0)), cost: CHEAP, domains: [ANYWHERE, ANYWHERE] }),
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => binary("Add", b, float_or_int, nothing, [ANYWHERE, ANYWHERE]),
                BinaryOp::Sub => binary("Sub", b, float_or_int, nothing, [ANYWHERE, ANYWHERE]),
                BinaryOp::Mul => binary("Mul", b, float_or_int, saved(0b11, false), [ANYWHERE, ANYWHERE]),
                BinaryOp::Div => {
                    binary("Div", b, D::FLOAT, saved(0b11, false), [ANYWHERE, Domain::AwayFromZero(0.5, 2.0)])
                }
                BinaryOp::Pow => binary("Pow", b, D::FLOAT, saved(0b11, true), [POSITIVE, Domain::Interval(-1.5, 1.5)]),
                // Ties go to the first operand: samples must avoid them.
                BinaryOp::Maximum => binary("Maximum", b, float_or_int, saved(0b11, false), [ANYWHERE, OFFSET]),
                BinaryOp::Minimum => binary("Minimum", b, float_or_int, saved(0b11, false), [ANYWHERE, OFFSET]),
            },
            Op::Compare(c) => match c {
                CompareOp::Equal => compare("Equal", c),
                CompareOp::NotEqual => compare("NotEqual", c),
                CompareOp::Less => compare("Less", c),
                CompareOp::LessEqual => compare("LessEqual", c),
                CompareOp::Greater => compare("Greater", c),
                CompareOp::GreaterEqual => compare("GreaterEqual", c),
            },
            Op::Where => OpInfo {
                name: "Where",
                family: F::Elementwise,
                arity: Arity::Exactly(3),
                dtypes: D::ANY,
                output: DTypeRule::SameAs(1),
                // The condition is a bool: no gradient.
                grad_inputs: 0b110,
                saved: x,
                no_rule: None,
                elementwise: Some(Elementwise {
                    expr: Expr::Select(arg(0), arg(1), arg(2)),
                    cost: CHEAP,
                    domains: [ANYWHERE, ANYWHERE],
                }),
            },
            Op::Reduce { op: r, .. } => {
                let same = DTypeRule::SameAs(0);
                match r {
                    ReduceOp::Sum => reduce("Sum", D::NUMERIC, same, 1, nothing),
                    // Ties share the gradient: the rule compares x with y.
                    ReduceOp::Max => reduce("Max", D::NUMERIC, same, 1, saved(0b1, true)),
                    ReduceOp::Min => reduce("Min", D::NUMERIC, same, 1, saved(0b1, true)),
                    ReduceOp::Prod => reduce("Prod", D::NUMERIC, same, 1, x),
                    ReduceOp::ArgMax => no_rule(
                        reduce("ArgMax", D::I32, DTypeRule::I32, 0, nothing),
                        "arg-reductions produce integer positions",
                    ),
                    ReduceOp::ArgMin => no_rule(
                        reduce("ArgMin", D::I32, DTypeRule::I32, 0, nothing),
                        "arg-reductions produce integer positions",
                    ),
                }
            }
            Op::MatMul { .. } => {
                op("MatMul", F::MatMul, Arity::Exactly(2), D::FLOAT, DTypeRule::SameAs(0), 0b11, saved(0b11, false))
            }
            Op::Reshape => movement("Reshape", Arity::Exactly(1)),
            Op::Permute(_) => movement("Permute", Arity::Exactly(1)),
            Op::Expand => movement("Expand", Arity::Exactly(1)),
            Op::Slice(_) => movement("Slice", Arity::Exactly(1)),
            Op::SliceBackward(_) => movement("SliceBackward", Arity::Exactly(1)),
            Op::Concat { .. } => movement("Concat", Arity::AtLeast(1)),
            // The index (input 1) is an i32 vector: no gradient.
            Op::IndexSelect { .. } => {
                op("IndexSelect", F::Index, Arity::Exactly(2), D::ANY, DTypeRule::SameAs(0), 0b1, saved(0b10, false))
            }
            Op::ScatterAdd { .. } => op(
                "ScatterAdd",
                F::Index,
                Arity::Exactly(3),
                D::NUMERIC,
                DTypeRule::SameAs(0),
                0b101,
                saved(0b10, false),
            ),
            Op::Im2Col(_) => window("Im2Col", 1, D::NUMERIC, 1, nothing),
            Op::Col2Im { .. } => window("Col2Im", 1, D::NUMERIC, 1, nothing),
            Op::MaxPool2d(_) => window("MaxPool2d", 1, D::FLOAT, 1, x),
            // The routing depends on x only through which element is
            // largest: piecewise constant in x, so only g carries gradient.
            Op::MaxPool2dBackward(_) => window("MaxPool2dBackward", 2, D::FLOAT, 0b10, x),
            // dx = y · (g - Σ g·y): the rule reads the output only.
            Op::CausalSoftmax { .. } => {
                op("CausalSoftmax", F::Rowwise, Arity::Exactly(1), D::FLOAT, DTypeRule::SameAs(0), 1, y)
            }
            // The rule is LayerNormBackward(x, g): it recomputes the row
            // statistics from x.
            Op::LayerNorm { .. } => {
                op("LayerNorm", F::Rowwise, Arity::Exactly(1), D::FLOAT, DTypeRule::SameAs(0), 1, x)
            }
            // The rule reads x, g and the output (see autograd::rules).
            Op::LayerNormBackward { .. } => op(
                "LayerNormBackward",
                F::Rowwise,
                Arity::Exactly(2),
                D::FLOAT,
                DTypeRule::SameAs(0),
                0b11,
                saved(0b11, true),
            ),
            // The rule is a CumSum of g the other way round: nothing saved.
            Op::CumSum { .. } => op("CumSum", F::Scan, Arity::Exactly(1), D::NUMERIC, DTypeRule::SameAs(0), 1, nothing),
            Op::TopK { .. } => no_rule(
                op("TopK", F::Selection, Arity::Exactly(1), D::NUMERIC, DTypeRule::I32, 0, nothing),
                "it gives integer positions; gradients reach the values through the IndexSelect that gathers them",
            ),
            // What a custom op is was stated when it was registered.
            Op::Custom(c) => {
                let d = c.definition();
                let info = op(
                    d.name,
                    F::Custom,
                    Arity::Exactly(d.arity as u8),
                    d.dtypes,
                    DTypeRule::Given,
                    d.grad_inputs,
                    d.saved,
                );
                if c.has_backward() {
                    info
                } else {
                    no_rule(info, "the custom op was registered without a backward")
                }
            }
        }
    }
}
