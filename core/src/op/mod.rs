//! The primitive operator set (see OPS.md). One variant per graph node kind.
//!
//! `Op` is plain `Copy` data with typed attributes (a permutation, per-axis
//! slice positions, a window) held inline in fixed-size arrays bounded by
//! `MAX_RANK`, so nodes need no drop, a graph reset is a length reset, and a
//! kernel call carries everything it needs in the op itself.
//!
//! What each primitive *is* — name, arity, dtypes, gradient facts, family,
//! element-wise expression — is stated once, in `table.rs` (`Op::info`);
//! every other per-op list in kiln reads it.

mod attrs;
pub mod custom;
mod erf;
mod exp;
pub mod expr;
#[cfg(not(target_arch = "wasm32"))]
mod log;
mod table;
#[cfg(not(target_arch = "wasm32"))]
mod tanh;
#[cfg(test)]
mod ulp;
pub(crate) use table::FRAC_1_SQRT_2PI;

pub use attrs::{Perm, SliceAttr};
pub use custom::{CustomOp, CustomOpBuilder};
pub use expr::{Expr, Value};
pub use table::{Arity, DTypeRule, DTypeSet, Domain, Elementwise, Family, OpInfo, Saved};

use crate::dtype::DType;
use crate::shape::AxisSet;

/// Declares a fieldless op enum and its `ALL` array from one list of
/// variants, so that a new variant is one line and cannot be left out of
/// `ALL` (which `Op::kinds`, the coverage report and the tests walk).
///
/// With `dispatch $with`, it also defines the macro `$with!(op, K => body)`:
/// a `match` over every variant that runs `body` with `K` a *constant* equal
/// to `op`, so that a kernel written once is monomorphised per variant (the
/// CPU's element-wise loops use it: one tight loop per primitive, and a new
/// variant gets its loop without any list to extend). `$d` is `$`, passed
/// in because a macro cannot otherwise write `$` into the macro it defines.
macro_rules! op_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident,)* }) => {
        $(#[$meta])*
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }
        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$($name::$variant),*].len()] = [$($name::$variant),*];
        }
    };
    (dispatch $with:ident $d:tt $(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident,)* }) => {
        op_enum! { $(#[$meta])* pub enum $name { $($(#[$vmeta])* $variant,)* } }

        #[allow(unused_macros)]
        macro_rules! $with {
            ($d op:expr, $d k:ident => $d body:expr) => {
                match $d op {
                    $($crate::op::$name::$variant => {
                        const $d k: $crate::op::$name = $crate::op::$name::$variant;
                        $d body
                    })*
                }
            };
        }
        #[allow(unused_imports)]
        pub(crate) use $with;
    };
}

op_enum! { dispatch with_unary $
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
    /// ln(1 + x), accurate for small x.
    Log1p,
    /// exp(x) - 1, accurate for small x.
    Expm1,
    /// x / (1 + |x|): composed from Div, Add and Abs in the op table.
    Softsign,
    /// GELU, exact form: x/2 · (1 + erf(x/√2)), composed in the op table.
    /// One op (saving only x) instead of five nodes whose values backward
    /// would keep.
    Gelu,
    /// GELU's derivative Φ(x) + x·φ(x) (its gradient rule), composed in
    /// the op table.
    GeluDerivative,
}
}

op_enum! { dispatch with_binary $
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
}

op_enum! { dispatch with_compare $
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
}
}

op_enum! {
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    Prod,
    ArgMax,
    ArgMin,
}
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
    /// Axes reordered: output axis i is input axis `perm[i]`.
    Permute(Perm),
    /// Broadcast to the node's shape.
    Expand,
    /// Every `step`-th element from `start`, per axis; the count per axis is
    /// the node's dims.
    Slice(SliceAttr),
    /// The adjoint of Slice: zeros of the node's shape with the input written
    /// at the sliced positions (the count per axis is the input's dims).
    SliceBackward(SliceAttr),
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
    /// covers padding. With a rank-2 output [C·kh·kw, N·OH·OW] the batch is
    /// folded into the columns (sample n's positions are columns n·OH·OW..;
    /// natively only: recorded by `nn::Conv2d`).
    Im2Col(Window2d),
    /// The adjoint of Im2Col: [N, C·kh·kw, OH·OW] (or the folded
    /// [C·kh·kw, N·OH·OW]) → [N, C, H, W], summing the contributions of
    /// overlapping windows. `image` is (H, W).
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
    /// Softmax over the last axis of [..., L, S] keeping, in row i (the
    /// position along the second-to-last axis), the keys j with
    /// j - i <= diagonal: the causal mask as an attribute, so no mask tensor
    /// exists. Entries of -inf count as masked too; a row with nothing kept
    /// is all zeros (not NaN). Stable: each row is shifted by its kept max.
    CausalSoftmax {
        diagonal: i32,
    },
    /// Layer normalisation of each row of the last axis, without weight or
    /// bias: (x - mean) / sqrt(var + eps), the population variance. One
    /// row-wise kernel; the statistics are recomputed by the backward
    /// kernel from x, so nothing else is stored.
    LayerNorm {
        eps: f64,
    },
    /// layer_norm_backward(x, g): the gradient of LayerNorm at x given g,
    /// r · (g - mean(g) - x̂ · mean(g · x̂)) with x̂ = LayerNorm(x) and r the
    /// row's 1 / sqrt(var + eps). Differentiable again (its rule is made of
    /// LayerNorm, itself and ordinary ops).
    LayerNormBackward {
        eps: f64,
    },
    /// Running sums along `axis`: element i is the sum of the elements
    /// before it (`exclusive`) or up to it, counted from the end of the
    /// axis when `reverse`. Summed one after another in that order, in the
    /// element type (i32 wraps), the same on every backend.
    CumSum {
        axis: u8,
        exclusive: bool,
        reverse: bool,
    },
    /// Positions (i32) of the `k` largest elements of each row of the last
    /// axis, or the smallest when not `largest`, best first; ties go to the
    /// lower position and NaN ranks above every number (as PyTorch's
    /// topk). `Tensor::top_k` gathers the values with IndexSelect, whose
    /// rule carries their gradient.
    TopK {
        k: u32,
        largest: bool,
    },
    /// A user-defined op (see `custom`): what it is lives in the registry.
    Custom(CustomOp),
}

impl UnaryOp {
    /// The op's name (from the op table).
    pub fn name(self) -> &'static str {
        Op::Unary(self).info().name
    }
    /// Whether the op also exists on i32 tensors (from the op table).
    pub fn accepts_integers(self) -> bool {
        Op::Unary(self).info().dtypes.contains(DType::I32)
    }
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        Op::Binary(self).info().name
    }
    /// Integer Div and Pow are refused rather than given C's truncation rules.
    pub fn accepts_integers(self) -> bool {
        Op::Binary(self).info().dtypes.contains(DType::I32)
    }
}

impl CompareOp {
    pub fn name(self) -> &'static str {
        Op::Compare(self).info().name
    }
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        Op::Reduce { op: self, axes: AxisSet(0), keepdim: false }.info().name
    }
}

impl Op {
    /// The operator's name as OPS.md spells it; errors and reports use it.
    #[inline]
    pub fn name(&self) -> &'static str {
        self.info().name
    }

    /// Leaves hold their value from creation; nothing runs for them.
    #[inline]
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Input | Op::Param(_))
    }
}

impl Op {
    /// Every primitive, one representative per kind, in OPS.md's order.
    /// `kind_names`, the coverage report and the table's consistency test
    /// walk this list; the exhaustive match in `kind_of` makes adding a
    /// variant without listing it a compile error.
    pub fn kinds() -> Vec<Op> {
        let mut kinds = Op::builtin_kinds();
        kinds.push(Op::Custom(custom::reference()));
        debug_assert!(kinds.iter().all(|k| k.kind_of() < Op::KIND_GROUPS));
        kinds
    }

    /// `kinds()` without the custom op that stands for the Custom kind.
    fn builtin_kinds() -> Vec<Op> {
        let window = Window2d { kernel: [1, 1], stride: [1, 1], dilation: [1, 1], pad_begin: [0, 0], pad_end: [0, 0] };
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
            Op::Permute(Perm::identity(1)),
            Op::Expand,
            Op::Slice(SliceAttr::whole(1)),
            Op::SliceBackward(SliceAttr::whole(1)),
            Op::Concat { axis: 0 },
            Op::IndexSelect { axis: 0 },
            Op::ScatterAdd { axis: 0 },
            Op::Im2Col(window),
            Op::Col2Im { window, image: [1, 1] },
            Op::MaxPool2d(window),
            Op::MaxPool2dBackward(window),
            Op::CausalSoftmax { diagonal: 0 },
            Op::LayerNorm { eps: 1e-5 },
            Op::LayerNormBackward { eps: 1e-5 },
            Op::CumSum { axis: 0, exclusive: false, reverse: false },
            Op::TopK { k: 1, largest: true },
        ]);
        kinds
    }

    /// The names of the built-in primitives (custom ops may not take them).
    pub(crate) fn builtin_names() -> Vec<&'static str> {
        Op::builtin_kinds().iter().map(|k| k.name()).collect()
    }

    const KIND_GROUPS: usize = 31;

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
            Op::CausalSoftmax { .. } => 25,
            Op::LayerNorm { .. } => 26,
            Op::LayerNormBackward { .. } => 27,
            Op::CumSum { .. } => 28,
            Op::TopK { .. } => 29,
            Op::Custom(_) => 30,
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
