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
    /// Computed in u64, so no image size or window overflows it.
    pub fn output_size(&self, image: [usize; 2]) -> Option<[usize; 2]> {
        let mut out = [0; 2];
        for a in 0..2 {
            let span = u64::from(self.dilation[a]) * u64::from(self.kernel[a]).checked_sub(1)? + 1;
            let padded =
                (image[a] as u64).checked_add(u64::from(self.pad_begin[a]))?.checked_add(u64::from(self.pad_end[a]))?;
            if padded < span || self.stride[a] == 0 {
                return None;
            }
            out[a] = usize::try_from((padded - span) / u64::from(self.stride[a]) + 1).ok()?;
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

impl Op {
    /// Every primitive, one representative per kind, in OPS.md's order.
    /// `kind_names` and the coverage report are generated from this list;
    /// the exhaustive match in `kind_of` makes adding a variant without
    /// listing it a compile error.
    pub fn kinds() -> Vec<Op> {
        let window = Window2d { kernel: [1, 1], stride: [1, 1], dilation: [1, 1], pad_begin: [0, 0], pad_end: [0, 0] };
        let attrs = AttrRange { start: 0, len: 0 };
        let mut kinds = vec![
            Op::Input,
            Op::Param(0),
            Op::Full(0.0),
            Op::Arange { start: 0.0, step: 1.0 },
            Op::RandUniform { seed: 0 },
            Op::RandNormal { seed: 0 },
        ];
        kinds.extend(UnaryOp::ALL.iter().map(|&u| Op::Unary(u)));
        kinds.push(Op::Cast(DType::F32));
        kinds.extend(BinaryOp::ALL.iter().map(|&b| Op::Binary(b)));
        kinds.extend(CompareOp::ALL.iter().map(|&c| Op::Compare(c)));
        kinds.push(Op::Where);
        kinds.extend(ReduceOp::ALL.iter().map(|&op| Op::Reduce { op, axes: AxisSet(1), keepdim: false }));
        kinds.extend([
            Op::MatMul { transpose_a: false, transpose_b: false },
            Op::Reshape,
            Op::Permute(attrs),
            Op::Expand,
            Op::Slice(attrs),
            Op::SliceBackward(attrs),
            Op::Concat { axis: 0 },
            Op::IndexSelect { axis: 0 },
            Op::ScatterAdd { axis: 0 },
            Op::Im2Col(window),
            Op::Col2Im { window, image: [1, 1] },
            Op::MaxPool2d(window),
            Op::MaxPool2dBackward(window),
        ]);
        debug_assert!(kinds.iter().all(|k| k.kind_of() < Op::KIND_GROUPS));
        kinds
    }

    const KIND_GROUPS: usize = 25;

    /// Which group of `kinds()` an op belongs to (exhaustive on purpose).
    fn kind_of(&self) -> usize {
        match self {
            Op::Input => 0,
            Op::Param(_) => 1,
            Op::Full(_) => 2,
            Op::Arange { .. } => 3,
            Op::RandUniform { .. } => 4,
            Op::RandNormal { .. } => 5,
            Op::Unary(_) => 6,
            Op::Cast(_) => 7,
            Op::Binary(_) => 8,
            Op::Compare(_) => 9,
            Op::Where => 10,
            Op::Reduce { .. } => 11,
            Op::MatMul { .. } => 12,
            Op::Reshape => 13,
            Op::Permute(_) => 14,
            Op::Expand => 15,
            Op::Slice(_) => 16,
            Op::SliceBackward(_) => 17,
            Op::Concat { .. } => 18,
            Op::IndexSelect { .. } => 19,
            Op::ScatterAdd { .. } => 20,
            Op::Im2Col(_) => 21,
            Op::Col2Im { .. } => 22,
            Op::MaxPool2d(_) => 23,
            Op::MaxPool2dBackward(_) => 24,
        }
    }

    /// The names of every primitive op.
    pub fn kind_names() -> Vec<&'static str> {
        Op::kinds().iter().map(|k| k.name()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Op;

    #[test]
    fn kinds_list_every_variant_group_once_per_name() {
        let kinds = Op::kinds();
        let mut groups: Vec<usize> = kinds.iter().map(|k| k.kind_of()).collect();
        groups.dedup();
        assert_eq!(groups, (0..Op::KIND_GROUPS).collect::<Vec<_>>());
        let mut names = Op::kind_names();
        let total = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), total, "every primitive has its own name");
    }
}
