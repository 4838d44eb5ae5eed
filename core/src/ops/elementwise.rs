//! Element-wise operations: unary, binary with broadcasting, comparisons,
//! where, cast.

use std::panic::Location;

use super::same_graph;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::op::{BinaryOp, CompareOp, Op, UnaryOp};
use crate::shape::{broadcast_shapes, fmt_dims, Dims};

/// Something usable as the second operand of a binary op: a tensor, or a
/// number (made into a rank-0 constant of the other operand's dtype).
pub trait IntoOperand<'g>: Copy {
    fn into_operand(self, like: &Tensor<'g>) -> Result<Tensor<'g>>;
    /// The tensor, when this operand is one (not a bare number).
    fn as_tensor(self) -> Option<Tensor<'g>> {
        None
    }
}

impl<'g> IntoOperand<'g> for Tensor<'g> {
    fn into_operand(self, _like: &Tensor<'g>) -> Result<Tensor<'g>> {
        Ok(self)
    }
    fn as_tensor(self) -> Option<Tensor<'g>> {
        Some(self)
    }
}

macro_rules! scalar_operand {
    ($($t:ty),*) => {$(
        impl<'g> IntoOperand<'g> for $t {
            #[track_caller]
            fn into_operand(self, like: &Tensor<'g>) -> Result<Tensor<'g>> {
                like.graph.scalar(self as f64, like.dtype())
            }
        }
    )*};
}
scalar_operand!(f64, f32, i32);

#[track_caller]
fn broadcast(op: &'static str, a: &Tensor<'_>, b: &Tensor<'_>) -> Result<Dims> {
    same_graph(op, a, b)?;
    let (da, db) = (a.dims(), b.dims());
    // No closures here: a closure is not #[track_caller], so an error made
    // inside one would point at this file instead of the user's code.
    match broadcast_shapes(&da, &db) {
        Some(dims) => Ok(dims),
        None => Err(Error::shape(op, format!("shapes {} and {} do not broadcast", fmt_dims(&da), fmt_dims(&db)))),
    }
}

#[track_caller]
fn same_dtype(op: &'static str, a: &Tensor<'_>, b: &Tensor<'_>) -> Result<DType> {
    let (ta, tb) = (a.dtype(), b.dtype());
    if ta != tb {
        return Err(Error::dtype(op, format!("operands have dtypes {ta} and {tb}; cast one of them first")));
    }
    Ok(ta)
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl<'g> Tensor<'g> {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(self) -> Result<Tensor<'g>> {
                    self.unary(UnaryOp::$op)
                }
            )*
        }
    };
}

unary_methods! {
    neg => Neg,
    abs => Abs,
    exp => Exp,
    /// Natural logarithm.
    log => Log,
    sqrt => Sqrt,
    /// 1 / x.
    recip => Recip,
    sin => Sin,
    cos => Cos,
    tanh => Tanh,
    sigmoid => Sigmoid,
    relu => Relu,
    /// The error function.
    erf => Erf,
    /// 1 - erf(x), accurate where erf(x) is close to 1.
    erfc => Erfc,
    /// ln(1 + x), accurate for small x (where `add(1.0)?.log()` loses the
    /// digits of x).
    log1p => Log1p,
    /// exp(x) - 1, accurate for small x.
    expm1 => Expm1,
    /// x / (1 + |x|), a smooth sign in (-1, 1).
    softsign => Softsign,
    /// GELU's derivative Φ(x) + x·φ(x) (Φ, φ: the standard normal's
    /// distribution and density); GELU's gradient rule.
    gelu_derivative => GeluDerivative,
    /// -1, 0 or 1 (NaN stays NaN). Not differentiable: backward through it is
    /// an error; `detach()` the input if a zero gradient is what you want.
    sign => Sign,
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl<'g> Tensor<'g> {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(self, other: impl IntoOperand<'g>) -> Result<Tensor<'g>> {
                    let other = other.into_operand(&self)?;
                    self.binary(BinaryOp::$op, other)
                }
            )*
        }
    };
}

binary_methods! {
    add => Add,
    sub => Sub,
    mul => Mul,
    div => Div,
    /// self ^ other, element-wise.
    pow => Pow,
    /// Element-wise maximum; on ties the gradient goes to `self`.
    maximum => Maximum,
    /// Element-wise minimum; on ties the gradient goes to `self`.
    minimum => Minimum,
}

macro_rules! compare_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl<'g> Tensor<'g> {
            $(
                /// Element-wise comparison with broadcasting; a bool tensor.
                #[track_caller]
                pub fn $name(self, other: impl IntoOperand<'g>) -> Result<Tensor<'g>> {
                    let other = other.into_operand(&self)?;
                    self.compare(CompareOp::$op, other)
                }
            )*
        }
    };
}

compare_methods! { eq => Equal, ne => NotEqual, lt => Less, le => LessEqual, gt => Greater, ge => GreaterEqual }

impl<'g> Tensor<'g> {
    #[track_caller]
    pub fn unary(self, op: UnaryOp) -> Result<Tensor<'g>> {
        let dtype = self.dtype();
        if !Op::Unary(op).info().dtypes.contains(dtype) {
            return Err(Error::dtype(op.name(), format!("does not take {dtype} tensors")));
        }
        let dims = self.dims();
        self.graph.record(Op::Unary(op), &[self.id], &dims, dtype, Location::caller())
    }

    #[track_caller]
    pub fn binary(self, op: BinaryOp, other: Tensor<'g>) -> Result<Tensor<'g>> {
        let dims = broadcast(op.name(), &self, &other)?;
        let dtype = same_dtype(op.name(), &self, &other)?;
        if !Op::Binary(op).info().dtypes.contains(dtype) {
            return Err(Error::dtype(op.name(), format!("does not take {dtype} tensors")));
        }
        self.graph.record(Op::Binary(op), &[self.id, other.id], &dims, dtype, Location::caller())
    }

    #[track_caller]
    pub fn compare(self, op: CompareOp, other: Tensor<'g>) -> Result<Tensor<'g>> {
        let dims = broadcast(op.name(), &self, &other)?;
        same_dtype(op.name(), &self, &other)?;
        self.graph.record(Op::Compare(op), &[self.id, other.id], &dims, DType::Bool, Location::caller())
    }

    /// `where(self, on_true, on_false)` with `self` a bool condition; all
    /// three broadcast together.
    #[track_caller]
    pub fn where_(self, on_true: impl IntoOperand<'g>, on_false: impl IntoOperand<'g>) -> Result<Tensor<'g>> {
        if self.dtype() != DType::Bool {
            return Err(Error::dtype("Where", format!("condition must be bool, got {}", self.dtype())));
        }
        // A bare number takes the dtype of the other branch.
        let Some(like) = on_true.as_tensor().or(on_false.as_tensor()) else {
            return Err(Error::invalid(
                "Where",
                "at least one of the two branches must be a tensor (to fix the dtype)",
            ));
        };
        let a = on_true.into_operand(&like)?;
        let b = on_false.into_operand(&like)?;
        let dtype = same_dtype("Where", &a, &b)?;
        let ab = broadcast("Where", &a, &b)?;
        same_graph("Where", &self, &a)?;
        let cd = self.dims();
        let Some(dims) = broadcast_shapes(&cd, &ab) else {
            return Err(Error::shape(
                "Where",
                format!(
                    "condition {} does not broadcast with operands {} and {}",
                    fmt_dims(&cd),
                    fmt_dims(&a.dims()),
                    fmt_dims(&b.dims())
                ),
            ));
        };
        self.graph.record(Op::Where, &[self.id, a.id, b.id], &dims, dtype, Location::caller())
    }

    /// Convert to another dtype. Differentiable between float dtypes.
    #[track_caller]
    pub fn cast(self, dtype: DType) -> Result<Tensor<'g>> {
        let dims = self.dims();
        self.graph.record(Op::Cast(dtype), &[self.id], &dims, dtype, Location::caller())
    }

    /// The same values, cut off from gradient tracking.
    #[track_caller]
    pub fn detach(self) -> Result<Tensor<'g>> {
        let _guard = self.graph.no_grad();
        let dims = self.dims();
        self.graph.record(Op::Reshape, &[self.id], &dims, self.dtype(), Location::caller())
    }
}
