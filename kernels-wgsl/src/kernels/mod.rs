//! The Rust that launches each kernel family: one module per `.wgsl` file,
//! with the same name. Each checks its operands with the CPU backend's
//! checks (`kiln_core::backend::checks`), computes the kernel's parameters on
//! the host and records the dispatch.

pub(crate) mod custom;
pub(crate) mod elementwise;
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod fused;
pub(crate) mod index;
pub(crate) mod matmul;
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod matmul_staged;
pub(crate) mod matmul_tune;
pub(crate) mod matmul_vec4;
pub(crate) mod movement;
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod random;
pub(crate) mod reduce;
pub(crate) mod rowwise;
pub(crate) mod scan;
pub(crate) mod select;
pub(crate) mod update;
pub(crate) mod window;

use kiln_core::backend::{KernelCall, TensorRef};
use kiln_core::op::Op;
use kiln_core::{DType, Error, Result};

use crate::shaders::Ty;
use crate::WgpuBackend;

pub(crate) fn run(be: &WgpuBackend, call: &KernelCall<'_>) -> Result<()> {
    let name = call.op.name();
    let ins = call.inputs;
    let out = &call.output;
    if out.dtype == DType::F64 || ins.iter().any(|t| t.dtype == DType::F64) {
        return Err(crate::buffers::f64_refused(name));
    }
    match call.op {
        Op::Input | Op::Param(_) => Err(Error::backend(name, "leaf nodes hold their value; there is no kernel to run")),
        Op::Full(v) => elementwise::full(be, v, out),
        Op::Arange { start, step } => elementwise::arange(be, start, step, out),
        Op::Unary(u) => elementwise::unary(be, u, arity::<1>(name, ins)?, out),
        Op::Binary(b) => elementwise::binary(be, b, arity::<2>(name, ins)?, out),
        Op::Compare(c) => elementwise::compare(be, c, arity::<2>(name, ins)?, out),
        Op::Where => elementwise::where_(be, arity::<3>(name, ins)?, out),
        Op::Cast(_) => elementwise::cast(be, arity::<1>(name, ins)?, out),
        Op::Reduce { op, axes, keepdim: _ } => reduce::reduce(be, op, axes, arity::<1>(name, ins)?, out),
        Op::MatMul { transpose_a, transpose_b } => {
            matmul::matmul(be, transpose_a, transpose_b, arity::<2>(name, ins)?, out)
        }
        Op::Reshape => movement::reshape(be, arity::<1>(name, ins)?, out),
        Op::Permute(perm) => movement::permute(be, &perm, arity::<1>(name, ins)?, out),
        Op::Expand => movement::expand(be, arity::<1>(name, ins)?, out),
        Op::Slice(attr) => movement::slice(be, &attr, arity::<1>(name, ins)?, out),
        Op::SliceBackward(attr) => movement::slice_backward(be, &attr, arity::<1>(name, ins)?, out),
        Op::Concat { axis } => movement::concat(be, axis as usize, ins, out),
        Op::IndexSelect { axis } => index::index_select(be, axis as usize, arity::<2>(name, ins)?, out),
        Op::ScatterAdd { axis } => index::scatter_add(be, axis as usize, arity::<3>(name, ins)?, out),
        Op::Im2Col(w) => window::im2col(be, &w, arity::<1>(name, ins)?, out),
        Op::Col2Im { window: w, image } => window::col2im(be, &w, image, arity::<1>(name, ins)?, out),
        Op::MaxPool2d(w) => pool::max_pool2d(be, &w, arity::<1>(name, ins)?, out),
        Op::MaxPool2dBackward(w) => pool::max_pool2d_backward(be, &w, arity::<2>(name, ins)?, out),
        Op::RandUniform { seed } => random::random(be, name, "uniform", seed, out),
        Op::RandNormal { seed } => random::random(be, name, "normal", seed, out),
        Op::CausalSoftmax { diagonal } => rowwise::causal_softmax(be, diagonal, arity::<1>(name, ins)?, out),
        #[cfg(not(target_arch = "wasm32"))]
        Op::LayerNorm { eps } => norm::layer_norm(be, eps, arity::<1>(name, ins)?, out),
        #[cfg(not(target_arch = "wasm32"))]
        Op::LayerNormBackward { eps } => norm::layer_norm_backward(be, eps, arity::<2>(name, ins)?, out),
        #[cfg(target_arch = "wasm32")]
        Op::LayerNorm { .. } | Op::LayerNormBackward { .. } => {
            Err(Error::unsupported(name, "the browser build has no layer-norm kernels (layer_norm composes it)"))
        }
        Op::CumSum { axis, exclusive, reverse } => {
            scan::cumsum(be, axis as usize, exclusive, reverse, arity::<1>(name, ins)?, out)
        }
        Op::TopK { k, largest } => select::top_k(be, k as usize, largest, arity::<1>(name, ins)?, out),
        Op::Custom(c) => custom::custom(be, c, ins, out),
    }
}

/// The (start, count) segments of `len` elements that one dispatch of a
/// scanning kernel takes (scan.wgsl, select.wgsl): llvmpipe ends any loop
/// after 65,535 iterations, without an error, and a short loop keeps each
/// dispatch brief on every GPU.
pub(crate) fn segments(len: u32) -> impl Iterator<Item = (u32, u32)> {
    const SEGMENT: u32 = 4096;
    (0..len).step_by(SEGMENT as usize).map(move |start| (start, (len - start).min(SEGMENT)))
}

fn arity<'a, 'b, const N: usize>(op: &'static str, ins: &'b [TensorRef<'a>]) -> Result<&'b [TensorRef<'a>; N]> {
    ins.try_into().map_err(|_| Error::backend(op, format!("expected {N} inputs, got {}", ins.len())))
}

/// The storage type of a (non-f64) dtype.
pub(crate) fn ty(dtype: DType) -> Ty {
    Ty::of(dtype).expect("f64 is refused before any kernel runs")
}

pub(crate) fn unsupported_dtype(op: &'static str, dtype: DType) -> Error {
    Error::unsupported(op, format!("the wgpu backend has no {op} kernel for {dtype}"))
}
