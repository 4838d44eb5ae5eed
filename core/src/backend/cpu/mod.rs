//! The CPU backend: buffers in a slab of typed vectors, kernels in plain Rust
//! (rayon-parallel above a size threshold when the `rayon` feature is on), GEMM
//! from the `gemm` crate.
//!
//! This module owns the storage slab, the `Backend` impl and the dispatch from
//! an `Op` to its kernel family. The kernels live in one module per family:
//! `elementwise`, `reduce`, `matmul`, `movement`, `index`, `update`,
//! `window`, `rowwise` (CausalSoftmax), `norm` (LayerNorm), `scan` (CumSum), `select` (TopK), `random`; `scalar` holds the element
//! traits they are generic over and `layout` the strided iteration they share.

#[cfg(feature = "rayon")]
mod concurrent;
mod copy;
mod custom;
mod elementwise;
#[cfg(feature = "fusion")]
mod fused;
mod index;
mod layout;
mod matmul;
mod movement;
#[cfg(not(target_arch = "wasm32"))]
mod norm;
#[cfg(not(target_arch = "wasm32"))]
mod portable_gemm;
mod random;
mod reduce;
mod rowwise;
mod scalar;
mod scan;
mod select;
mod simd;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd_gemm;
/// The multi-threaded browser build's Web Worker threads (wasm32 with
/// shared memory): kiln-web starts them; the f32 GEMM uses them.
#[cfg(all(target_arch = "wasm32", target_feature = "atomics", target_feature = "simd128"))]
pub mod threads;
mod update;
mod window;

use std::cell::RefCell;

use crate::small::SmallVec;

#[cfg(feature = "rayon")]
use crate::backend::Concurrency;
#[cfg(feature = "fusion")]
use crate::backend::FusedCall;
use crate::backend::{checks, Backend, BufferId, KernelCall, ParamUpdate, ParamUpdateCall, ReadFuture, TensorRef};
use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::memory::try_vec;
use crate::op::Op;

pub(crate) use scalar::Scalar;

/// The browser build's kernels trade loop copies for download bytes: one
/// loop per dtype instead of one per op and dtype where the dtype is rarely
/// hot (f64, i32, bool), and no multi-threaded fast paths that repeat a
/// loop. Results are bit-identical to the full set (the same per-element
/// functions in the same order); each kernel's tests run both.
pub(crate) const COMPACT: bool = cfg!(target_arch = "wasm32");

/// Whether element type `T` gets a loop of its own per op: always in the
/// full build; in the compact one only f32, while f64 and i32 run one loop
/// per dtype that matches on the op per element. The bits are the same
/// either way (the same per-element function runs; only where the `match`
/// on the op sits differs).
#[inline(always)]
pub(crate) fn own_loops<T: Scalar, const COMPACT: bool>() -> bool {
    !COMPACT || matches!(T::DTYPE, DType::F32)
}

/// One buffer's contents. Bool is stored as 0/1 bytes.
#[derive(Clone, Debug)]
pub enum CpuStorage {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    Bool(Vec<u8>),
}

impl CpuStorage {
    /// `len` zeros, or an out-of-memory error (never an abort).
    fn zeroed(dtype: DType, len: usize) -> Result<CpuStorage> {
        const OP: &str = "alloc";
        Ok(match dtype {
            DType::F32 => CpuStorage::F32(try_vec(OP, len, 0.0)?),
            DType::F64 => CpuStorage::F64(try_vec(OP, len, 0.0)?),
            DType::I32 => CpuStorage::I32(try_vec(OP, len, 0)?),
            DType::Bool => CpuStorage::Bool(try_vec(OP, len, 0)?),
        })
    }
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::I32(_) => DType::I32,
            CpuStorage::Bool(_) => DType::Bool,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::F64(v) => v.len(),
            CpuStorage::I32(v) => v.len(),
            CpuStorage::Bool(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An input of a kernel: its storage (possibly longer than the tensor) and
/// its dims. `slice` hands out exactly the tensor's elements.
#[derive(Clone, Copy)]
pub(crate) struct In<'a> {
    pub data: &'a CpuStorage,
    pub dims: &'a [usize],
    pub dtype: DType,
}

impl<'a> In<'a> {
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
    /// The first numel elements, typed. The dtype was checked by `run`.
    pub fn slice<T: Scalar>(&self, op: &'static str) -> Result<&'a [T]> {
        let n = self.numel();
        T::of(self.data)
            .and_then(|s| s.get(..n))
            .ok_or_else(|| Error::backend(op, format!("input buffer is not {} x {}", n, T::DTYPE)))
    }
}

/// The output of a kernel: its storage (taken out of the slab) and dims.
pub(crate) struct Out<'a> {
    pub data: &'a mut CpuStorage,
    pub dims: &'a [usize],
    pub dtype: DType,
}

impl Out<'_> {
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
    pub fn slice<T: Scalar>(&mut self, op: &'static str) -> Result<&mut [T]> {
        let n = self.numel();
        T::of_mut(self.data)
            .and_then(|s| s.get_mut(..n))
            .ok_or_else(|| Error::backend(op, format!("output buffer is not {} x {}", n, T::DTYPE)))
    }
}

/// Run `$body` with `$T` bound to the Rust type of a float dtype.
macro_rules! with_float {
    ($dtype:expr, $op:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                type $T = f64;
                $body
            }
            d => Err($crate::backend::cpu::unsupported_dtype($op, d)),
        }
    };
}
/// Run `$body` with `$T` bound to the Rust type of a numeric dtype.
macro_rules! with_num {
    ($dtype:expr, $op:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::dtype::DType::I32 => {
                type $T = i32;
                $body
            }
            d => Err($crate::backend::cpu::unsupported_dtype($op, d)),
        }
    };
}
/// Run `$body` with `$T` bound to the storage type of any dtype (u8 for bool).
macro_rules! with_any {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::dtype::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::dtype::DType::Bool => {
                type $T = u8;
                $body
            }
        }
    };
}
pub(crate) use {with_any, with_float, with_num};

pub(crate) fn unsupported_dtype(op: &'static str, dtype: DType) -> Error {
    Error::unsupported(op, format!("the cpu backend has no {op} kernel for {dtype}"))
}

/// How the CPU backend's kernels round (see docs/portable-numerics.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CpuNumerics {
    /// The fastest kernels this machine has: the `gemm` crate's matrix
    /// products (fused multiply-add, its own blocking order), the platform's
    /// math library (std: glibc's logf, ...), fused element-wise chains.
    /// Deterministic run after run and at any thread count, but not the same
    /// bits as the browser build. The native default.
    #[default]
    Native,
    /// The browser (wasm) build's arithmetic, bit for bit: matrix products
    /// sum each output over k in order, multiply then add (no fused
    /// multiply-add); transcendental functions come from the `libm` crate;
    /// element-wise chains run node by node; the MatMul weight gradient is
    /// the batched rule. A checkpoint trained natively in this mode and one
    /// trained in the browser on the CPU continue with the same bits.
    /// Slower: see docs/portable-numerics.md. Always the mode of the
    /// browser build.
    Portable,
}

impl CpuNumerics {
    /// The environment variable `CpuBackend::new` (and `Device::cpu`) reads:
    /// `portable` or `native` (unset: native).
    pub const ENV: &'static str = "KILN_CPU_NUMERICS";

    /// `native` or `portable` (case-insensitive).
    pub fn parse(name: &str) -> Result<CpuNumerics> {
        match name.trim().to_ascii_lowercase().as_str() {
            "native" => Ok(CpuNumerics::Native),
            "portable" => Ok(CpuNumerics::Portable),
            _ => {
                Err(Error::invalid("CpuNumerics", format!("unknown CPU numerics '{name}'; use 'native' or 'portable'")))
            }
        }
    }

    /// The mode `KILN_CPU_NUMERICS` asks for (native when unset); an
    /// unknown value is an error naming it.
    pub fn from_env() -> Result<CpuNumerics> {
        match std::env::var(Self::ENV) {
            Ok(v) if !v.trim().is_empty() => Self::parse(&v)
                .map_err(|e| Error::invalid("CpuNumerics", format!("{}={v}: {}", Self::ENV, e.message()))),
            _ => Ok(CpuNumerics::Native),
        }
    }
}

/// The CPU device's buffers and kernels.
pub struct CpuBackend {
    slab: RefCell<Vec<Option<CpuStorage>>>,
    free_ids: RefCell<Vec<u32>>,
    /// Portable numerics (always in the browser build).
    portable: bool,
    /// Fused kernels' plans by `FusedCall::plan_id`.
    #[cfg(feature = "fusion")]
    fused_plans: fused::PlanCache,
    /// Buffers given back by `scratch_free`, for `scratch_alloc` to reuse,
    /// and the bytes of those it had to create.
    #[cfg(not(target_arch = "wasm32"))]
    scratch: RefCell<ScratchPool>,
}

/// Scratch buffers kept for reuse: (dtype, elements, buffer).
#[cfg(not(target_arch = "wasm32"))]
#[derive(Default)]
struct ScratchPool {
    spare: Vec<(DType, usize, BufferId)>,
    created_bytes: u64,
}

/// At most this many scratch buffers, of at most this many bytes in all,
/// are kept for reuse; others are freed when given back.
#[cfg(not(target_arch = "wasm32"))]
const SCRATCH_KEPT: usize = 64;
#[cfg(not(target_arch = "wasm32"))]
const SCRATCH_BYTES: usize = 256 << 20;

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// The CPU backend with the numerics `KILN_CPU_NUMERICS` asks for
    /// (`CpuNumerics::from_env`; native when unset). An unknown value is
    /// reported on stderr and native numerics are used (`with_numerics`
    /// after `CpuNumerics::from_env` gives the error instead). In the
    /// browser build always portable.
    pub fn new() -> CpuBackend {
        let numerics = if cfg!(target_arch = "wasm32") {
            CpuNumerics::Portable
        } else {
            CpuNumerics::from_env().unwrap_or_else(|e| {
                eprintln!("kiln: {} (using native numerics)", e.message());
                CpuNumerics::Native
            })
        };
        Self::with_numerics(numerics)
    }

    /// The CPU backend with the given numerics (the browser build is
    /// always portable, whatever is asked).
    pub fn with_numerics(numerics: CpuNumerics) -> CpuBackend {
        CpuBackend {
            slab: RefCell::new(Vec::new()),
            free_ids: RefCell::new(Vec::new()),
            portable: cfg!(target_arch = "wasm32") || numerics == CpuNumerics::Portable,
            #[cfg(feature = "fusion")]
            fused_plans: fused::PlanCache::default(),
            #[cfg(not(target_arch = "wasm32"))]
            scratch: RefCell::default(),
        }
    }

    /// The numerics this backend computes with.
    pub fn numerics(&self) -> CpuNumerics {
        if self.portable {
            CpuNumerics::Portable
        } else {
            CpuNumerics::Native
        }
    }

    fn missing(op: &'static str, id: BufferId) -> Error {
        Error::backend(
            op,
            format!("buffer {} does not exist on the cpu backend (freed, or in use as the output)", id.0),
        )
    }

    /// Checks `call`'s buffers and runs its kernel into `out_storage`, which
    /// the caller has taken out of `slab` so that the inputs can be borrowed
    /// from the slab while the output is written (serially or concurrently).
    fn run_taken(
        slab: &[Option<CpuStorage>],
        call: &KernelCall<'_>,
        out_storage: &mut CpuStorage,
        portable: bool,
    ) -> Result<()> {
        let name = call.op.name();
        Self::check(name, &call.output, out_storage)?;
        let mut ins: SmallVec<[In<'_>; 4]> = SmallVec::with_capacity(call.inputs.len());
        for t in call.inputs {
            let s =
                slab.get(t.buffer.0 as usize).and_then(Option::as_ref).ok_or_else(|| Self::missing(name, t.buffer))?;
            Self::check(name, t, s)?;
            ins.push(In { data: s, dims: t.dims, dtype: t.dtype });
        }
        let mut out = Out { data: out_storage, dims: call.output.dims, dtype: call.output.dtype };
        dispatch(call, &ins, &mut out, portable)
    }

    /// Check a tensor's dtype and length against the storage that holds it.
    fn check(op: &'static str, t: &TensorRef<'_>, s: &CpuStorage) -> Result<()> {
        if s.dtype() != t.dtype {
            return Err(Error::backend(
                op,
                format!("buffer {} holds {} but the kernel was given {}", t.buffer.0, s.dtype(), t.dtype),
            ));
        }
        // Dims of graph nodes were checked when the nodes were built; a
        // call made directly on the backend may carry anything, and every
        // kernel trusts that the product of the dims fits the buffer.
        let numel = crate::shape::checked_numel(op, t.dims)?;
        if s.len() < numel {
            return Err(Error::backend(
                op,
                format!("buffer {} has {} elements, the tensor needs {numel}", t.buffer.0, s.len()),
            ));
        }
        Ok(())
    }
}

/// Runs `call`'s kernel. `portable`: `CpuNumerics::Portable` (natively;
/// the browser build's kernels are portable already, so it changes nothing
/// there and its branches are left out of the wasm).
fn dispatch(call: &KernelCall<'_>, ins: &[In<'_>], out: &mut Out<'_>, portable: bool) -> Result<()> {
    let name = call.op.name();
    #[cfg(target_arch = "wasm32")]
    let _ = portable;
    match call.op {
        #[cfg(not(target_arch = "wasm32"))]
        Op::Unary(u) if portable => elementwise::unary_portable(u, arity::<1>(name, ins)?, out),
        #[cfg(not(target_arch = "wasm32"))]
        Op::Binary(b) if portable => elementwise::binary_portable(b, arity::<2>(name, ins)?, out),
        #[cfg(not(target_arch = "wasm32"))]
        Op::RandNormal { seed } if portable => random::rand_normal(seed, out, true),
        #[cfg(not(target_arch = "wasm32"))]
        Op::MatMul { transpose_a, transpose_b } if portable => {
            matmul::matmul(transpose_a, transpose_b, arity::<2>(name, ins)?, out, true)
        }
        Op::Input | Op::Param(_) => Err(Error::backend(name, "leaf nodes hold their value; there is no kernel to run")),
        Op::Full(v) => elementwise::full(v, out),
        Op::Arange { start, step } => elementwise::arange(start, step, out),
        Op::Unary(u) => elementwise::unary(u, arity::<1>(name, ins)?, out),
        Op::Binary(b) => elementwise::binary(b, arity::<2>(name, ins)?, out),
        Op::Compare(c) => elementwise::compare(c, arity::<2>(name, ins)?, out),
        Op::Where => elementwise::where_(arity::<3>(name, ins)?, out),
        Op::Cast(_) => elementwise::cast(arity::<1>(name, ins)?, out),
        Op::Reduce { op, axes, keepdim: _ } => reduce::reduce(op, axes, arity::<1>(name, ins)?, out),
        Op::MatMul { transpose_a, transpose_b } => {
            matmul::matmul(transpose_a, transpose_b, arity::<2>(name, ins)?, out, false)
        }
        Op::Reshape => movement::reshape(arity::<1>(name, ins)?, out),
        Op::Permute(perm) => movement::permute(&perm, arity::<1>(name, ins)?, out),
        Op::Expand => movement::expand(arity::<1>(name, ins)?, out),
        Op::Slice(attr) => movement::slice(&attr, arity::<1>(name, ins)?, out),
        Op::SliceBackward(attr) => movement::slice_backward(&attr, arity::<1>(name, ins)?, out),
        Op::Concat { axis } => movement::concat(axis as usize, ins, out),
        Op::IndexSelect { axis } => index::index_select(axis as usize, arity::<2>(name, ins)?, out),
        Op::ScatterAdd { axis } => index::scatter_add(axis as usize, arity::<3>(name, ins)?, out),
        Op::Im2Col(w) => window::im2col(&w, arity::<1>(name, ins)?, out),
        Op::Col2Im { window: w, image } => window::col2im(&w, image, arity::<1>(name, ins)?, out),
        Op::MaxPool2d(w) => window::max_pool2d(&w, arity::<1>(name, ins)?, out),
        Op::MaxPool2dBackward(w) => window::max_pool2d_backward(&w, arity::<2>(name, ins)?, out),
        Op::RandUniform { seed } => random::rand_uniform(seed, out),
        Op::RandNormal { seed } => random::rand_normal(seed, out, false),
        #[cfg(not(target_arch = "wasm32"))]
        Op::CausalSoftmax { diagonal } => rowwise::causal_softmax(diagonal, arity::<1>(name, ins)?, out, portable),
        #[cfg(target_arch = "wasm32")]
        Op::CausalSoftmax { diagonal } => rowwise::causal_softmax(diagonal, arity::<1>(name, ins)?, out),
        #[cfg(not(target_arch = "wasm32"))]
        Op::LayerNorm { eps } => norm::layer_norm(eps, arity::<1>(name, ins)?, out),
        #[cfg(not(target_arch = "wasm32"))]
        Op::LayerNormBackward { eps } => norm::layer_norm_backward(eps, arity::<2>(name, ins)?, out),
        #[cfg(target_arch = "wasm32")]
        Op::LayerNorm { .. } | Op::LayerNormBackward { .. } => {
            Err(Error::unsupported(name, "the browser build has no layer-norm kernels (layer_norm composes it)"))
        }
        Op::CumSum { axis, exclusive, reverse } => {
            scan::cumsum(axis as usize, exclusive, reverse, arity::<1>(name, ins)?, out)
        }
        Op::TopK { k, largest } => select::top_k(k as usize, largest, arity::<1>(name, ins)?, out),
        Op::Custom(c) => custom::custom(c, ins, out),
    }
}

fn arity<'a, 'b, const N: usize>(op: &'static str, ins: &'b [In<'a>]) -> Result<&'b [In<'a>; N]> {
    ins.try_into().map_err(|_| Error::backend(op, format!("expected {N} inputs, got {}", ins.len())))
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        #[cfg(feature = "rayon")]
        {
            let numerics = if self.portable { ", portable numerics" } else { "" };
            format!("cpu (rayon, {} threads{numerics})", rayon::current_num_threads())
        }
        // The browser build: one thread, 128-bit SIMD when built with it.
        #[cfg(all(not(feature = "rayon"), target_feature = "simd128"))]
        {
            // The multi-threaded browser build, with its Workers started.
            #[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
            if threads::count() > 1 {
                return format!("cpu ({} threads, simd128)", threads::count());
            }
            "cpu (single-threaded, simd128)".to_string()
        }
        #[cfg(all(not(feature = "rayon"), not(target_feature = "simd128")))]
        {
            if self.portable && cfg!(not(target_arch = "wasm32")) {
                "cpu (single-threaded, portable numerics)".to_string()
            } else {
                "cpu (single-threaded)".to_string()
            }
        }
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<BufferId> {
        let storage = CpuStorage::zeroed(dtype, len)?;
        let mut slab = self.slab.borrow_mut();
        if let Some(id) = self.free_ids.borrow_mut().pop() {
            slab[id as usize] = Some(storage);
            return Ok(BufferId(id));
        }
        let id = u32::try_from(slab.len())
            .map_err(|_| Error::backend("alloc", "more than 2^32 buffers on the cpu backend"))?;
        slab.push(Some(storage));
        Ok(BufferId(id))
    }

    fn free(&self, buffer: BufferId) {
        let mut slab = self.slab.borrow_mut();
        if let Some(slot) = slab.get_mut(buffer.0 as usize) {
            if slot.take().is_some() {
                self.free_ids.borrow_mut().push(buffer.0);
            }
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn scratch_alloc(&self, dtype: DType, len: usize) -> Result<BufferId> {
        let spare = {
            let mut pool = self.scratch.borrow_mut();
            let at = pool.spare.iter().position(|&(d, n, _)| d == dtype && n == len);
            at.map(|i| pool.spare.swap_remove(i).2)
        };
        if let Some(id) = spare {
            return Ok(id);
        }
        let id = self.alloc(dtype, len)?;
        self.scratch.borrow_mut().created_bytes += (len * dtype.size_bytes()) as u64;
        Ok(id)
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn scratch_free(&self, buffer: BufferId) {
        let len_of =
            |b: BufferId| self.slab.borrow().get(b.0 as usize).and_then(Option::as_ref).map(|s| (s.dtype(), s.len()));
        let Some((dtype, len)) = len_of(buffer) else { return };
        let mut pool = self.scratch.borrow_mut();
        let held: usize = pool.spare.iter().map(|&(d, n, _)| n * d.size_bytes()).sum();
        if pool.spare.len() < SCRATCH_KEPT && held + len * dtype.size_bytes() <= SCRATCH_BYTES {
            pool.spare.push((dtype, len, buffer));
        } else {
            drop(pool);
            self.free(buffer);
        }
    }

    /// Scratch buffers created (the CPU compiles nothing and counts its
    /// kernels in the executor's `ExecStats`).
    #[cfg(not(target_arch = "wasm32"))]
    fn counters(&self) -> crate::backend::BackendCounters {
        let scratch_bytes_allocated = self.scratch.borrow().created_bytes;
        crate::backend::BackendCounters { scratch_bytes_allocated, ..Default::default() }
    }

    fn upload(&self, buffer: BufferId, data: &HostData) -> Result<()> {
        let mut slab = self.slab.borrow_mut();
        let s =
            slab.get_mut(buffer.0 as usize).and_then(Option::as_mut).ok_or_else(|| Self::missing("upload", buffer))?;
        if s.len() < data.len() || s.dtype() != data.dtype() {
            return Err(Error::backend(
                "upload",
                format!(
                    "cannot upload {} x {} into buffer {} ({} x {})",
                    data.len(),
                    data.dtype(),
                    buffer.0,
                    s.len(),
                    s.dtype()
                ),
            ));
        }
        match (s, data) {
            (CpuStorage::F32(d), HostData::F32(v)) => d[..v.len()].copy_from_slice(v),
            (CpuStorage::F64(d), HostData::F64(v)) => d[..v.len()].copy_from_slice(v),
            (CpuStorage::I32(d), HostData::I32(v)) => d[..v.len()].copy_from_slice(v),
            (CpuStorage::Bool(d), HostData::Bool(v)) => d.iter_mut().zip(v).for_each(|(d, &b)| *d = b as u8),
            _ => unreachable!("dtypes checked above"),
        }
        Ok(())
    }

    fn copy(&self, src: BufferId, dst: BufferId, dtype: DType, len: usize) -> Result<()> {
        if src == dst {
            return Ok(());
        }
        let mut slab = self.slab.borrow_mut();
        let mut d = slab.get_mut(dst.0 as usize).and_then(Option::take).ok_or_else(|| Self::missing("copy", dst))?;
        let result = (|| {
            let s = slab.get(src.0 as usize).and_then(Option::as_ref).ok_or_else(|| Self::missing("copy", src))?;
            if s.dtype() != dtype || d.dtype() != dtype || s.len() < len || d.len() < len {
                return Err(Error::backend(
                    "copy",
                    format!(
                        "cannot copy {len} x {dtype} from buffer {} ({} x {}) to buffer {} ({} x {})",
                        src.0,
                        s.len(),
                        s.dtype(),
                        dst.0,
                        d.len(),
                        d.dtype()
                    ),
                ));
            }
            match (s, &mut d) {
                (CpuStorage::F32(s), CpuStorage::F32(d)) => copy::copy(&mut d[..len], &s[..len]),
                (CpuStorage::F64(s), CpuStorage::F64(d)) => copy::copy(&mut d[..len], &s[..len]),
                (CpuStorage::I32(s), CpuStorage::I32(d)) => copy::copy(&mut d[..len], &s[..len]),
                (CpuStorage::Bool(s), CpuStorage::Bool(d)) => copy::copy(&mut d[..len], &s[..len]),
                _ => unreachable!("dtypes checked above"),
            }
            Ok(())
        })();
        slab[dst.0 as usize] = Some(d);
        result
    }

    fn run(&self, call: &KernelCall<'_>) -> Result<()> {
        let name = call.op.name();
        let out_id = call.output.buffer;
        let mut slab = self.slab.borrow_mut();
        // Take the output out of the slab so that the inputs can be borrowed
        // from it while the output is written; it goes back below, whatever
        // the kernel returned.
        let mut out_storage =
            slab.get_mut(out_id.0 as usize).and_then(Option::take).ok_or_else(|| Self::missing(name, out_id))?;
        let result = Self::run_taken(&slab, call, &mut out_storage, self.portable);
        slab[out_id.0 as usize] = Some(out_storage);
        result
    }

    #[cfg(feature = "rayon")]
    fn concurrency(&self) -> Option<Concurrency> {
        concurrent::concurrency()
    }

    #[cfg(feature = "rayon")]
    fn kernel_work(&self, op: &Op, inputs: &[&[usize]], output: &[usize]) -> Option<usize> {
        concurrent::kernel_work(op, inputs, output)
    }

    #[cfg(feature = "rayon")]
    fn run_many(&self, calls: &[KernelCall<'_>]) -> Vec<Result<()>> {
        concurrent::run_many(self, calls)
    }

    /// Not in portable numerics: the browser build runs every node alone.
    #[cfg(feature = "fusion")]
    fn fuses(&self) -> bool {
        !self.portable
    }

    fn portable_numerics(&self) -> bool {
        self.portable
    }

    #[cfg(feature = "fusion")]
    fn run_fused(&self, call: &FusedCall<'_>) -> Result<()> {
        fused::run(self, call)
    }

    /// Products with their epilogue (`fused::head`), where groups fuse.
    #[cfg(feature = "fusion")]
    fn fuses_matmul(&self, dtype: DType) -> bool {
        !self.portable && matches!(dtype, DType::F32 | DType::F64)
    }

    /// Reductions with their element-wise prologue (`fused::tail`).
    #[cfg(feature = "fusion")]
    fn fuses_reduce(&self, dtype: DType) -> bool {
        !self.portable && matches!(dtype, DType::F32 | DType::F64 | DType::I32)
    }

    fn update_param(
        &self,
        upd: &ParamUpdate,
        param: BufferId,
        grad: BufferId,
        state: &[BufferId],
        dtype: DType,
        len: usize,
    ) -> Result<()> {
        self.update_params(&[ParamUpdateCall { update: *upd, source: None, param, grad, state, dtype, len }])
    }

    fn update_param_from(
        &self,
        upd: &ParamUpdate,
        source: BufferId,
        param: BufferId,
        grad: BufferId,
        state: &[BufferId],
        dtype: DType,
        len: usize,
    ) -> Result<()> {
        self.update_params(&[ParamUpdateCall { update: *upd, source: Some(source), param, grad, state, dtype, len }])
    }

    /// Every buffer an update writes (parameters, state) is taken out of
    /// the slab first, so a buffer named twice is found missing, never
    /// aliased; gradients and sources are borrowed; then all updates run
    /// as one pass (`update::update_many`).
    fn update_params(&self, calls: &[ParamUpdateCall<'_>]) -> Result<()> {
        const OP: &str = "update_param";
        let mut slab = self.slab.borrow_mut();
        let mut taken: Vec<(BufferId, CpuStorage)> = Vec::with_capacity(calls.len() * 3);
        let mut counts: SmallVec<[usize; 16]> = SmallVec::new();
        let mut result = Ok(());
        'calls: for c in calls {
            let needed = match checks::update_state_count(&c.update, c.state.len()) {
                Ok(n) => n,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            for &id in std::iter::once(&c.param).chain(&c.state[..needed]) {
                match slab.get_mut(id.0 as usize).and_then(Option::take) {
                    Some(s) => taken.push((id, s)),
                    None => {
                        result = Err(Self::missing(OP, id));
                        break 'calls;
                    }
                }
            }
            counts.push(1 + needed);
        }
        if result.is_ok() {
            let slab = &*slab;
            let get =
                |id: BufferId| slab.get(id.0 as usize).and_then(Option::as_ref).ok_or_else(|| Self::missing(OP, id));
            result = (|| {
                let mut jobs = Vec::with_capacity(calls.len());
                let mut rest: &mut [(BufferId, CpuStorage)] = &mut taken;
                for (c, &count) in calls.iter().zip(&counts) {
                    let (mine, tail) = std::mem::take(&mut rest).split_at_mut(count);
                    rest = tail;
                    let (first, states) = mine.split_first_mut().expect("the parameter is always taken");
                    jobs.push(update::Job {
                        upd: c.update,
                        param: &mut first.1,
                        source: c.source.map(get).transpose()?,
                        grad: get(c.grad)?,
                        state: states.iter_mut().map(|(_, s)| s).collect(),
                        dtype: c.dtype,
                        len: c.len,
                    });
                }
                update::update_many(jobs)
            })();
        }
        for (id, s) in taken {
            slab[id.0 as usize] = Some(s);
        }
        result
    }

    fn read(&self, buffer: BufferId, dtype: DType, len: usize) -> ReadFuture {
        let slab = self.slab.borrow();
        let result = match slab.get(buffer.0 as usize).and_then(Option::as_ref) {
            None => Err(Self::missing("read", buffer)),
            Some(s) if s.dtype() != dtype || s.len() < len => Err(Error::backend(
                "read",
                format!("cannot read {len} x {dtype} from buffer {} ({} x {})", buffer.0, s.len(), s.dtype()),
            )),
            Some(s) => Ok(match s {
                CpuStorage::F32(v) => HostData::F32(v[..len].to_vec()),
                CpuStorage::F64(v) => HostData::F64(v[..len].to_vec()),
                CpuStorage::I32(v) => HostData::I32(v[..len].to_vec()),
                CpuStorage::Bool(v) => HostData::Bool(v[..len].iter().map(|&b| b != 0).collect()),
            }),
        };
        Box::pin(std::future::ready(result))
    }

    fn supports(&self, op: &Op, dtype: DType) -> bool {
        checks::has_kernel(op, dtype, &[DType::F32, DType::F64, DType::I32, DType::Bool])
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    //! Run one kernel on host data: the kernel tests' harness.
    use super::*;

    pub fn run_op(op: Op, inputs: &[(HostData, &[usize])], out_dims: &[usize], out_dtype: DType) -> Result<HostData> {
        let be = CpuBackend::new();
        let mut refs = Vec::new();
        for (data, dims) in inputs {
            // Pooled buffers are longer than the tensor: mimic that.
            let id = be.alloc(data.dtype(), data.len() + 7)?;
            be.upload(id, data)?;
            refs.push(TensorRef { buffer: id, dims, dtype: data.dtype() });
        }
        let n: usize = out_dims.iter().product();
        let out = be.alloc(out_dtype, n + 5)?;
        be.run(&KernelCall { op, inputs: &refs, output: TensorRef { buffer: out, dims: out_dims, dtype: out_dtype } })?;
        pollster::block_on(be.read(out, out_dtype, n))
    }

    pub fn f32s(v: &[f32]) -> HostData {
        HostData::F32(v.to_vec())
    }
    pub fn f64s(v: &[f64]) -> HostData {
        HostData::F64(v.to_vec())
    }
    pub fn i32s(v: &[i32]) -> HostData {
        HostData::I32(v.to_vec())
    }
    pub fn bools(v: &[bool]) -> HostData {
        HostData::Bool(v.to_vec())
    }
    /// Deterministic pseudo-random floats in [-1, 1).
    pub fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;
    use crate::op::{BinaryOp, UnaryOp};

    #[test]
    fn storage_slab_reuses_ids_and_refuses_unknown_buffers() {
        let be = CpuBackend::new();
        let a = be.alloc(DType::F32, 4).unwrap();
        let b = be.alloc(DType::F32, 4).unwrap();
        assert_ne!(a, b);
        be.free(a);
        be.free(a); // double free is harmless
        let c = be.alloc(DType::I32, 2).unwrap();
        assert_eq!(c, a);
        let d = be.alloc(DType::I32, 2).unwrap();
        assert_ne!(d, a);
        be.free(b);
        assert!(pollster::block_on(be.read(b, DType::F32, 4)).is_err());
        assert!(be.upload(b, &f32s(&[1.0])).is_err());
        assert!(be.upload(c, &f32s(&[1.0])).is_err(), "dtype mismatch");
        assert!(be.upload(c, &i32s(&[1, 2, 3])).is_err(), "too long");
        assert!(be.copy(c, BufferId(99), DType::I32, 1).is_err());
        assert!(pollster::block_on(be.read(BufferId(1234), DType::F32, 1)).is_err());
    }

    #[test]
    fn upload_read_copy_roundtrip() {
        let be = CpuBackend::new();
        let a = be.alloc(DType::Bool, 64).unwrap();
        be.upload(a, &bools(&[true, false, true])).unwrap();
        assert_eq!(pollster::block_on(be.read(a, DType::Bool, 3)).unwrap(), bools(&[true, false, true]));
        let x = be.alloc(DType::F64, 10).unwrap();
        let y = be.alloc(DType::F64, 10).unwrap();
        be.upload(x, &f64s(&[1.5, 2.5, 3.5])).unwrap();
        be.copy(x, y, DType::F64, 2).unwrap();
        assert_eq!(pollster::block_on(be.read(y, DType::F64, 3)).unwrap(), f64s(&[1.5, 2.5, 0.0]));
    }

    #[test]
    fn run_refuses_aliasing_and_missing_inputs_without_panicking() {
        let be = CpuBackend::new();
        let a = be.alloc(DType::F32, 4).unwrap();
        let dims = [4usize];
        let t = TensorRef { buffer: a, dims: &dims, dtype: DType::F32 };
        let call = KernelCall { op: Op::Unary(UnaryOp::Neg), inputs: &[t], output: t };
        assert!(be.run(&call).is_err());
        // The output was put back.
        assert!(pollster::block_on(be.read(a, DType::F32, 4)).is_ok());
        let wrong = TensorRef { buffer: a, dims: &dims, dtype: DType::I32 };
        let b = be.alloc(DType::F32, 4).unwrap();
        let o = TensorRef { buffer: b, dims: &dims, dtype: DType::F32 };
        let call = KernelCall { op: Op::Binary(BinaryOp::Add), inputs: &[wrong, wrong], output: o };
        assert!(be.run(&call).is_err());
    }

    /// The CPU runs exactly the element-wise kernels the op table promises
    /// (`supports` reads the table; this runs them).
    #[test]
    fn the_table_kernel_set_is_the_one_that_runs() {
        let dims: &[usize] = &[3];
        let data = |dtype| match dtype {
            DType::F32 => f32s(&[0.5, 1.5, 2.0]),
            DType::F64 => f64s(&[0.5, 1.5, 2.0]),
            DType::I32 => i32s(&[1, -2, 3]),
            DType::Bool => bools(&[true, false, true]),
        };
        let be = CpuBackend::new();
        let ops = UnaryOp::ALL.map(Op::Unary).into_iter().chain(BinaryOp::ALL.map(Op::Binary));
        let mut ran = 0;
        for op in ops {
            for dtype in [DType::F32, DType::F64, DType::I32, DType::Bool] {
                let inputs: Vec<(HostData, &[usize])> =
                    (0..op.info().arity_exact()).map(|_| (data(dtype), dims)).collect();
                let result = run_op(op, &inputs, dims, dtype);
                let promised = be.supports(&op, dtype);
                assert_eq!(result.is_ok(), promised, "{} on {dtype}: {result:?}", op.name());
                ran += usize::from(promised);
            }
        }
        assert!(ran > 40);
    }

    /// Portable numerics take the batched MatMul weight-gradient rule (the
    /// browser build's): for a shared weight b, ∂Σ(a·b)/∂b is the Sum over
    /// the batch of the per-batch products aᵀ·g, bit for bit (the flattened
    /// rule sums the batch and rows in one product, in another order).
    #[test]
    fn portable_numerics_use_the_batched_weight_gradient_rule() {
        use crate::{CpuNumerics, Device, Graph, Param};
        let device = Device::cpu_with(CpuNumerics::Portable);
        let graph = Graph::new(&device);
        let (batch, m, k, n) = (3, 40, 70, 50);
        let a = graph.tensor_from(&rand_f32(batch * m * k, 1), &[batch, m, k]).unwrap();
        let b = Param::new(&device, "b", &rand_f32(k * n, 2), &[k, n]).unwrap();
        let bt = graph.param(&b).unwrap();
        let seed = graph.tensor_from(&rand_f32(batch * m * n, 3), &[batch, m, n]).unwrap();
        let y = a.matmul(bt).unwrap();
        let got = graph.grad(y, &[bt], Some(seed)).unwrap()[0];
        let want = a.matmul_t(seed, true, false).unwrap().sum(&[0], false).unwrap();
        let (got, want) =
            (pollster::block_on(got.to_vec::<f32>()).unwrap(), pollster::block_on(want.to_vec::<f32>()).unwrap());
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    /// Portable numerics give one set of bits whatever the thread count and
    /// the executor's switches (fusion, which portable numerics leave off
    /// anyway, concurrent branches, plan replay): a few Adam steps of a tanh
    /// MLP (libm's tanhf and logf, threaded GEMMs), losses and weights.
    #[cfg(feature = "rayon")]
    #[test]
    fn portable_training_is_the_same_on_any_thread_count() {
        use crate::nn::{cross_entropy, Activation, Module, Sequential};
        use crate::optim::{Adam, Optimizer};
        use crate::{CpuNumerics, Device, Graph};
        let (rows, width) = (130, 64);
        let x = rand_f32(rows * width, 11);
        let labels: Vec<i32> = (0..rows as i32).map(|i| i * 7 % 10).collect();
        let run = |threads: usize, switches: bool| -> Vec<u32> {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let device = Device::cpu_with(CpuNumerics::Portable);
                assert!(device.name().contains("portable numerics"));
                device.set_fusion(switches);
                device.set_parallel_branches(switches);
                device.set_plan_cache(switches);
                let model = Sequential::mlp(&device, &[width, 96, 10], Activation::Tanh, 3).unwrap();
                let mut adam = Adam::new(model.parameters(), 0.01).unwrap();
                let mut graph = Graph::new(&device);
                let mut bits = Vec::new();
                for _ in 0..3 {
                    graph.reset();
                    let xt = graph.tensor_from(&x, &[rows, width]).unwrap();
                    let y = graph.tensor_from(&labels, &[rows]).unwrap();
                    let loss = cross_entropy(model.forward(xt).unwrap(), y).unwrap();
                    adam.zero_grad();
                    loss.backward().unwrap();
                    adam.step().unwrap();
                    bits.push((pollster::block_on(loss.item()).unwrap() as f32).to_bits());
                }
                for p in model.parameters() {
                    let v = pollster::block_on(p.value()).unwrap().to_f64_vec();
                    bits.extend(v.iter().map(|&v| (v as f32).to_bits()));
                }
                bits
            })
        };
        let one = run(1, false);
        assert_eq!(one, run(2, true));
        assert_eq!(one, run(3, true));
        assert_eq!(one, run(2, false));
    }

    #[test]
    fn supports_matches_the_kernel_set() {
        let be = CpuBackend::new();
        assert!(be.supports(&Op::Unary(UnaryOp::Exp), DType::F64));
        assert!(!be.supports(&Op::Unary(UnaryOp::Exp), DType::I32));
        assert!(be.supports(&Op::Unary(UnaryOp::Abs), DType::I32));
        assert!(!be.supports(&Op::Binary(BinaryOp::Div), DType::I32));
        assert!(!be.supports(&Op::MatMul { transpose_a: false, transpose_b: false }, DType::I32));
        assert!(be.name().starts_with("cpu ("));
    }
}
