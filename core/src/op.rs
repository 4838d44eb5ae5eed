//! The primitive operator set (see OPS.md). One variant per graph node kind.
//!
//! `Op` is plain `Copy` data: variable-length attributes (permutations, slice
//! specs) live in the graph's attribute slab and are referenced by `AttrRange`,
//! so nodes need no drop and a graph reset is a length reset.

use crate::dtype::DType;
use crate::shape::AxisSet;

/// A range into the graph's attribute slab (`usize` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrRange {
    pub start: u32,
    pub len: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Recip,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    Erf,
    Erfc,
    /// -1, 0 or 1. Not differentiable (see `autograd::rules`).
    Sign,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    Prod,
    ArgMax,
    ArgMin,
}

/// A sliding window over the two spatial axes of an NCHW tensor, shared by
/// Im2Col, Col2Im and the pooling ops. Index 0 is height, 1 is width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window2d {
    pub kernel: [u32; 2],
    pub stride: [u32; 2],
    pub dilation: [u32; 2],
    /// Padding before the image (top, left).
    pub pad_begin: [u32; 2],
    /// Padding after the image (bottom, right); larger than `pad_begin` for
    /// ceil-mode pooling.
    pub pad_end: [u32; 2],
}

impl Window2d {
    /// Number of window positions along each axis for an image of `image`
    /// (height, width); None when the window does not fit even once.
    pub fn output_size(&self, image: [usize; 2]) -> Option<[usize; 2]> {
        let mut out = [0; 2];
        for a in 0..2 {
            let span = self.dilation[a] as usize * (self.kernel[a] as usize - 1) + 1;
            let padded = image[a] + self.pad_begin[a] as usize + self.pad_end[a] as usize;
            if padded < span {
                return None;
            }
            out[a] = (padded - span) / self.stride[a] as usize + 1;
        }
        Some(out)
    }
    /// Elements in one window.
    pub fn kernel_elements(&self) -> usize {
        self.kernel[0] as usize * self.kernel[1] as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// Host data uploaded when the node was made (or a leaf variable).
    Input,
    /// A parameter's persistent buffer; the index is into the graph's list of
    /// parameters used.
    Param(u32),
    /// Every element equals the value.
    Full(f64),
    /// start, start + step, ... (length is the node's shape).
    Arange {
        start: f64,
        step: f64,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    /// where(cond, a, b), broadcasting all three.
    Where,
    Cast(DType),
    Reduce {
        op: ReduceOp,
        axes: AxisSet,
        keepdim: bool,
    },
    /// Batched matrix product over the last two axes, batch axes broadcast.
    /// The flags read an operand transposed (free with strided GEMM); gradient
    /// rules use them so that no transpose is ever materialised.
    MatMul {
        transpose_a: bool,
        transpose_b: bool,
    },
    /// Same elements, new shape (the node's shape).
    Reshape,
    /// Axes reordered: attrs hold the permutation.
    Permute(AttrRange),
    /// Broadcast to the node's shape.
    Expand,
    /// attrs hold (start, end, step) per axis.
    Slice(AttrRange),
    /// The adjoint of Slice: zeros of the node's shape with the input written
    /// at the sliced positions. attrs as for Slice.
    SliceBackward(AttrRange),
    Concat {
        axis: u8,
    },
    /// Gather slices along `axis` at the positions of an i32 index vector.
    IndexSelect {
        axis: u8,
    },
    /// scatter_add(dest, index, source): dest with source's slices added at
    /// the index positions along `axis` (the adjoint of IndexSelect).
    ScatterAdd {
        axis: u8,
    },
    /// [N, C, H, W] → [N, C·kh·kw, OH·OW]: every window position's pixels as
    /// a column (row index c·kh·kw + i·kw + j), zeros where the window
    /// covers padding.
    Im2Col(Window2d),
    /// The adjoint of Im2Col: [N, C·kh·kw, OH·OW] → [N, C, H, W], summing
    /// the contributions of overlapping windows. `image` is (H, W).
    Col2Im {
        window: Window2d,
        image: [u32; 2],
    },
    /// Maximum of each window (padding never wins; NaN does).
    MaxPool2d(Window2d),
    /// maxpool2d_backward(x, g): for each window of x, g's value added at the
    /// window's first maximum (row-major order within the window).
    MaxPool2dBackward(Window2d),
    /// Uniform in [0, 1): value i = f(seed, i), the same on every backend.
    RandUniform {
        seed: u64,
    },
    /// Standard normal from the same counter-based generator (Box–Muller).
    RandNormal {
        seed: u64,
    },
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 14] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Recip,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Erf,
        UnaryOp::Erfc,
        UnaryOp::Sign,
    ];
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "Neg",
            UnaryOp::Abs => "Abs",
            UnaryOp::Exp => "Exp",
            UnaryOp::Log => "Log",
            UnaryOp::Sqrt => "Sqrt",
            UnaryOp::Recip => "Recip",
            UnaryOp::Sin => "Sin",
            UnaryOp::Cos => "Cos",
            UnaryOp::Tanh => "Tanh",
            UnaryOp::Sigmoid => "Sigmoid",
            UnaryOp::Relu => "Relu",
            UnaryOp::Erf => "Erf",
            UnaryOp::Erfc => "Erfc",
            UnaryOp::Sign => "Sign",
        }
    }
    /// Neg, Abs, Relu and Sign also make sense on integers.
    pub fn accepts_integers(self) -> bool {
        matches!(self, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Sign)
    }
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
    ];
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "Add",
            BinaryOp::Sub => "Sub",
            BinaryOp::Mul => "Mul",
            BinaryOp::Div => "Div",
            BinaryOp::Pow => "Pow",
            BinaryOp::Maximum => "Maximum",
            BinaryOp::Minimum => "Minimum",
        }
    }
    /// Integer Div and Pow are refused rather than given C's truncation rules.
    pub fn accepts_integers(self) -> bool {
        !matches!(self, BinaryOp::Div | BinaryOp::Pow)
    }
}

impl CompareOp {
    pub const ALL: [CompareOp; 6] = [
        CompareOp::Equal,
        CompareOp::NotEqual,
        CompareOp::Less,
        CompareOp::LessEqual,
        CompareOp::Greater,
        CompareOp::GreaterEqual,
    ];
    pub fn name(self) -> &'static str {
        match self {
            CompareOp::Equal => "Equal",
            CompareOp::NotEqual => "NotEqual",
            CompareOp::Less => "Less",
            CompareOp::LessEqual => "LessEqual",
            CompareOp::Greater => "Greater",
            CompareOp::GreaterEqual => "GreaterEqual",
        }
    }
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 6] =
        [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod, ReduceOp::ArgMax, ReduceOp::ArgMin];
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "Sum",
            ReduceOp::Max => "Max",
            ReduceOp::Min => "Min",
            ReduceOp::Prod => "Prod",
            ReduceOp::ArgMax => "ArgMax",
            ReduceOp::ArgMin => "ArgMin",
        }
    }
}

impl Op {
    /// The operator's name as OPS.md spells it; errors and reports use it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "Input",
            Op::Param(_) => "Param",
            Op::Full(_) => "Full",
            Op::Arange { .. } => "Arange",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Compare(c) => c.name(),
            Op::Where => "Where",
            Op::Cast(_) => "Cast",
            Op::Reduce { op, .. } => op.name(),
            Op::MatMul { .. } => "MatMul",
            Op::Reshape => "Reshape",
            Op::Permute(_) => "Permute",
            Op::Expand => "Expand",
            Op::Slice(_) => "Slice",
            Op::SliceBackward(_) => "SliceBackward",
            Op::Concat { .. } => "Concat",
            Op::IndexSelect { .. } => "IndexSelect",
            Op::ScatterAdd { .. } => "ScatterAdd",
            Op::Im2Col(_) => "Im2Col",
            Op::Col2Im { .. } => "Col2Im",
            Op::MaxPool2d(_) => "MaxPool2d",
            Op::MaxPool2dBackward(_) => "MaxPool2dBackward",
            Op::RandUniform { .. } => "RandUniform",
            Op::RandNormal { .. } => "RandNormal",
        }
    }

    /// Leaves hold their value from creation; nothing runs for them.
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Input | Op::Param(_))
    }
}
