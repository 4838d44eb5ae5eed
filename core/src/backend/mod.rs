//! The contract between the executor and a device.
//!
//! A backend owns its buffers and hands out opaque `BufferId`s. The executor
//! (not the backend) decides what runs, in which order, and when a buffer is
//! no longer needed; the backend only runs one kernel at a time on buffers it
//! is given. A backend may record kernels and submit them later: `flush` marks
//! the end of one execution (the wgpu backend submits its command encoder
//! there). Reads are futures because in a browser nothing may block.

pub mod checks;
pub mod cpu;

use std::future::Future;
use std::pin::Pin;

use crate::dtype::{DType, HostData};
use crate::error::Result;
use crate::op::{Op, ReduceOp};
use crate::shape::AxisSet;

/// A backend's handle to one of its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferId(pub u32);

/// A buffer as a kernel sees it: which buffer, how to interpret it.
/// The buffer may be longer than the tensor (pooled buffers are rounded up).
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    pub buffer: BufferId,
    pub dims: &'a [usize],
    pub dtype: DType,
}

impl TensorRef<'_> {
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// One kernel launch: an op, its attributes, its inputs and its output.
#[derive(Clone, Copy, Debug)]
pub struct KernelCall<'a> {
    pub op: Op,
    pub inputs: &'a [TensorRef<'a>],
    pub output: TensorRef<'a>,
}

/// In-place optimizer updates on persistent parameter buffers. These are not
/// graph ops (they have no gradient): they run as fused kernels so an update
/// is one pass over memory, not a dozen small graph nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamUpdate {
    /// state: [velocity] when momentum != 0, else [].
    Sgd { lr: f64, momentum: f64, dampening: f64, weight_decay: f64, nesterov: bool },
    /// state: [first moment, second moment]. `step` counts from 1.
    /// `decoupled_weight_decay` selects AdamW.
    Adam { lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64, decoupled_weight_decay: bool, step: u64 },
}

/// Adam's per-step constants, in f64 (each rounded once to the element
/// type by the backend): the step size lr / (1 − β1ᵗ) and 1 / √(1 − β2ᵗ). The update is
/// then p − step_size · m / (√v · rsqrt_bc2 + ε), PyTorch's
/// `p.addcdiv_(m, √v / √(1 − β2ᵗ) + ε, value=−step_size)` with the division
/// by √(1 − β2ᵗ) taken as a product: one division and one square root per
/// element. (It was lr · (m / bc1) / (√(v / bc2) + ε), three divisions: the
/// divider bounded Adam's loop, 0.40 → 0.27–0.34 ms of a W1 step.) Every
/// backend and the browser build use this form.
pub fn adam_step_constants(lr: f64, beta1: f64, beta2: f64, steps: i32) -> (f64, f64) {
    (lr / (1.0 - beta1.powi(steps)), 1.0 / (1.0 - beta2.powi(steps)).sqrt())
}

/// One parameter's update in a multi-tensor `Backend::update_params` call.
#[derive(Clone, Copy, Debug)]
pub struct ParamUpdateCall<'a> {
    pub update: ParamUpdate,
    /// Where the current value is when it is not `param` (copy-on-write:
    /// `source` is read and left as it is, the new value goes to `param`).
    pub source: Option<BufferId>,
    pub param: BufferId,
    pub grad: BufferId,
    pub state: &'a [BufferId],
    pub dtype: DType,
    pub len: usize,
}

/// How a backend runs several kernels at once (see `Backend::concurrency`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Concurrency {
    /// The most kernels in one `run_many` call.
    pub max_batch: usize,
    /// The executor looks for independent nodes to run beside the next one
    /// only when that one has at least this much work (see
    /// `Backend::kernel_work`): a chain of tiny ops does not pay for it.
    pub min_node_work: usize,
    /// A batch of less total work runs on this thread, one node after the
    /// other, instead of at once.
    pub min_batch_work: usize,
}

pub type ReadFuture = Pin<Box<dyn Future<Output = Result<HostData>>>>;

/// Where a fused op reads an operand from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FusedArg {
    /// Input k of the group (a buffer, broadcast to the group's dims).
    Input(u16),
    /// The value of op k of the group (an earlier one).
    Op(u16),
}

/// One op of a fused group: an element-wise op (Unary, Binary, Compare,
/// Where) or a constant (`Full`, which stands for its value broadcast to the
/// group's dims). `dtype` is the op's output dtype. In a group with a head
/// (`FusedCall::head`), op 0 is the head's `MatMul` with no operands: its
/// value is the product, which the ops after it read like any op's value.
/// In a group with a tail (`FusedCall::tail`), the last op is a `Reduce`
/// (Sum, Prod, Max or Min) of an earlier op's value: its dims are the
/// reduction's, not the group's, and it is always an output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedOp {
    pub op: Op,
    pub args: [FusedArg; 3],
    pub arity: u8,
    pub dtype: DType,
}

impl FusedOp {
    pub fn args(&self) -> &[FusedArg] {
        &self.args[..self.arity as usize]
    }
}

/// A chain of element-wise ops run as one kernel (see `exec`'s fusion):
/// every op is evaluated per element in order, exactly as its own kernel
/// would, and only `outputs` are written to memory; the other values live
/// in small per-thread tiles.
#[derive(Clone, Copy, Debug)]
pub struct FusedCall<'a> {
    /// The dims every op's value has (constants are broadcast to them).
    pub dims: &'a [usize],
    pub ops: &'a [FusedOp],
    /// Buffers read; each broadcasts to `dims`.
    pub inputs: &'a [TensorRef<'a>],
    /// (op index, buffer) of the values kept; dims are `dims`, except a
    /// constant's, which are its own (one element or `dims`).
    pub outputs: &'a [(u16, TensorRef<'a>)],
    /// Some(id): every call with this id has the same structure (ops,
    /// dtypes, input and output dims; the executor's plan cache checked it),
    /// so the backend may reuse what it derived from the first one.
    pub plan_id: Option<u64>,
    /// A matrix product whose value is op 0, the element-wise ops after it
    /// its epilogue (bias, activation, scale): one kernel that applies them
    /// to each tile of the product while it is in registers or cache, so
    /// the raw product is written only when it is kept. Only sent to a
    /// backend whose `fuses_matmul` says yes.
    pub head: Option<FusedMatMul<'a>>,
}

/// The head of a fused group: `a x b` over the last two axes, batch axes
/// broadcast, exactly `Op::MatMul { transpose_a, transpose_b }` on these
/// operands (which are not broadcast to the group's dims); its dims are the
/// group's.
#[derive(Clone, Copy, Debug)]
pub struct FusedMatMul<'a> {
    pub transpose_a: bool,
    pub transpose_b: bool,
    pub a: TensorRef<'a>,
    pub b: TensorRef<'a>,
}

impl FusedMatMul<'_> {
    pub fn op(&self) -> Op {
        Op::MatMul { transpose_a: self.transpose_a, transpose_b: self.transpose_b }
    }
}

impl FusedCall<'_> {
    /// The numeric dtype the group computes in: the first dtype other than
    /// Bool among its ops' outputs and its inputs (comparisons give Bool
    /// values beside it). None for a group of Bool values only.
    pub fn value_dtype(&self) -> Option<DType> {
        self.ops.iter().map(|o| o.dtype).chain(self.inputs.iter().map(|t| t.dtype)).find(|&d| d != DType::Bool)
    }

    /// The group's tail, when its last op is a reduction: the reduction's
    /// prologue is the rest of the group (e.g. `sum(exp(x - m))`), whose
    /// reduced value need not be written to memory. Only sent to a backend
    /// whose `fuses_reduce` says yes.
    pub fn tail(&self) -> Option<FusedReduce> {
        let last = self.ops.len().checked_sub(1)?;
        match (self.ops[last].op, self.ops[last].args()) {
            (Op::Reduce { op, axes, .. }, &[FusedArg::Op(source)]) => {
                Some(FusedReduce { op, axes, source, index: last as u16 })
            }
            _ => None,
        }
    }
}

/// The reduction ending a fused group (`FusedCall::tail`): `op` over
/// `axes` of the group's dims, of op `source`'s value; it is op `index`
/// (the last) and its output is the call's output for that op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedReduce {
    pub op: ReduceOp,
    pub axes: AxisSet,
    pub source: u16,
    pub index: u16,
}

/// What a backend compiled and measured to run kernels, counted since it
/// was created (`kiln bench` reports them per step: a warmed-up step should
/// compile nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendCounters {
    /// Compute pipelines created (wgpu: a WGSL entry point compiled).
    pub pipelines_compiled: usize,
    /// Pipeline requests answered by the backend's cache.
    pub pipeline_cache_hits: usize,
    /// Timed kernel trials (wgpu: matmul kernels raced at the first product
    /// of each shape class).
    pub kernel_trials: usize,
    /// Kernels recorded for the device (wgpu: dispatches, a fused group's
    /// generated kernels included; the CPU counts none here, see the
    /// executor's kernel counts).
    pub dispatches: usize,
    /// Bytes of buffers the backend created for kernels' own intermediate
    /// values (wgpu: scratch buffers its pool could not supply), outside
    /// the device's memory pool.
    pub scratch_bytes_allocated: u64,
    /// Pipelines made for a repeated parameter set (wgpu: shape-specialised,
    /// with the dispatch's shapes as constants; also counted in
    /// `pipelines_compiled`).
    pub specialized_pipelines: usize,
}

pub trait Backend {
    /// Human-readable description, e.g. "cpu (rayon, 2 threads)".
    fn name(&self) -> String;

    /// A new buffer with room for `len` elements of `dtype`. Contents are
    /// unspecified: every kernel writes its whole output.
    fn alloc(&self, dtype: DType, len: usize) -> Result<BufferId>;
    fn free(&self, buffer: BufferId);
    /// A buffer for a value a backend's own code needs between two of its
    /// kernels (`run_head_split`'s product, `run_tail_split`'s reduced
    /// value, when not kept): from the backend's pool when it holds one of
    /// this dtype and length, so that a repeated step allocates none; a new
    /// one is counted in `BackendCounters::scratch_bytes_allocated`.
    /// Contents unspecified; give it back with `scratch_free`. This default
    /// allocates (and does not count). Native only: the browser build's
    /// backends run no fused groups.
    #[cfg(not(target_arch = "wasm32"))]
    fn scratch_alloc(&self, dtype: DType, len: usize) -> Result<BufferId> {
        self.alloc(dtype, len)
    }
    /// Give back a buffer of `scratch_alloc` (kernels recorded that use it
    /// may still be pending: the backend keeps it alive until they ran).
    #[cfg(not(target_arch = "wasm32"))]
    fn scratch_free(&self, buffer: BufferId) {
        self.free(buffer)
    }
    /// Copy host data into the start of a buffer.
    fn upload(&self, buffer: BufferId, data: &HostData) -> Result<()>;
    /// Copy `len` elements from one buffer to another of the same dtype.
    fn copy(&self, src: BufferId, dst: BufferId, dtype: DType, len: usize) -> Result<()>;

    /// Run (or record) one kernel. Shapes and dtypes have been validated when
    /// the node was built; data-dependent checks (index ranges) happen here.
    fn run(&self, call: &KernelCall<'_>) -> Result<()>;
    /// Whether this backend can run several independent kernels at once
    /// (`run_many`), and on what terms. None: one at a time.
    fn concurrency(&self) -> Option<Concurrency> {
        None
    }
    /// The work of a kernel (in units of about one add) when this backend
    /// would run it on one thread, so that running it beside others gains;
    /// None for kernels that use every thread themselves.
    fn kernel_work(&self, _op: &Op, _inputs: &[&[usize]], _output: &[usize]) -> Option<usize> {
        None
    }
    /// Run kernels none of which reads another's output, possibly at the
    /// same time; one result per call, in order. Each must compute exactly
    /// what `run` would.
    fn run_many(&self, calls: &[KernelCall<'_>]) -> Vec<Result<()>> {
        calls.iter().map(|c| self.run(c)).collect()
    }
    /// Whether this backend computes with portable numerics (the CPU's
    /// `CpuNumerics::Portable`: the browser build's bits on every target).
    /// Autograd then uses the rules the browser build uses.
    fn portable_numerics(&self) -> bool {
        false
    }
    /// Whether this backend runs fused element-wise groups (`run_fused`).
    fn fuses(&self) -> bool {
        false
    }
    /// Run a fused group (only called when `fuses` says yes). Each output
    /// must hold exactly what the op's own kernel would have computed.
    fn run_fused(&self, _call: &FusedCall<'_>) -> Result<()> {
        Err(crate::error::Error::unsupported("fused", format!("{} does not run fused kernels", self.name())))
    }
    /// Whether `run_fused` takes groups headed by a matrix product
    /// (`FusedCall::head`: matmul epilogue fusion) of `dtype`.
    fn fuses_matmul(&self, _dtype: DType) -> bool {
        false
    }
    /// Whether `run_fused` takes groups ending in a reduction of values of
    /// `dtype` (`FusedCall::tail`; `run_tail_split` is the fallback).
    fn fuses_reduce(&self, _dtype: DType) -> bool {
        false
    }
    /// Update a parameter in place from its gradient.
    fn update_param(
        &self,
        update: &ParamUpdate,
        param: BufferId,
        grad: BufferId,
        state: &[BufferId],
        dtype: DType,
        len: usize,
    ) -> Result<()>;
    /// Update a parameter whose current value is in `source` into `param`
    /// (a different buffer; `source` is left as it is): copy-on-write
    /// without a separate copy pass. The same values as copying `source`
    /// into `param` and updating in place, which is what this default does.
    #[allow(clippy::too_many_arguments)]
    fn update_param_from(
        &self,
        update: &ParamUpdate,
        source: BufferId,
        param: BufferId,
        grad: BufferId,
        state: &[BufferId],
        dtype: DType,
        len: usize,
    ) -> Result<()> {
        self.copy(source, param, dtype, len)?;
        self.update_param(update, param, grad, state, dtype, len)
    }
    /// Update several parameters at once (multi-tensor apply): the values
    /// of one `update_param` (or `update_param_from`, with a `source`) per
    /// call, but run together: one parallel pass over every parameter on
    /// the CPU, one dispatch per group of parameters on wgpu. A backend
    /// checks every call before it changes anything. This default runs the
    /// calls one after the other.
    fn update_params(&self, calls: &[ParamUpdateCall<'_>]) -> Result<()> {
        for c in calls {
            match c.source {
                None => self.update_param(&c.update, c.param, c.grad, c.state, c.dtype, c.len)?,
                Some(s) => self.update_param_from(&c.update, s, c.param, c.grad, c.state, c.dtype, c.len)?,
            }
        }
        Ok(())
    }
    /// End of one execution: submit whatever was recorded.
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    /// Read the first `len` elements of a buffer.
    fn read(&self, buffer: BufferId, dtype: DType, len: usize) -> ReadFuture;
    /// Whether this backend has a kernel for `op` on `dtype` (the coverage
    /// report and the parity tests ask this).
    fn supports(&self, op: &Op, dtype: DType) -> bool;
    /// Compilations and trials so far (zeros for a backend that has none:
    /// the CPU's kernels are compiled with kiln).
    fn counters(&self) -> BackendCounters {
        BackendCounters::default()
    }
}

/// `Backend::scratch_alloc`; `alloc` in the browser build, whose backends
/// keep no scratch pool (they run no fused groups).
fn scratch_alloc<B: Backend + ?Sized>(backend: &B, dtype: DType, len: usize) -> Result<BufferId> {
    #[cfg(not(target_arch = "wasm32"))]
    return backend.scratch_alloc(dtype, len);
    #[cfg(target_arch = "wasm32")]
    backend.alloc(dtype, len)
}

/// `Backend::scratch_free`; `free` in the browser build.
fn scratch_free<B: Backend + ?Sized>(backend: &B, buffer: BufferId) {
    #[cfg(not(target_arch = "wasm32"))]
    backend.scratch_free(buffer);
    #[cfg(target_arch = "wasm32")]
    backend.free(buffer)
}

/// Run a call with a tail (`FusedCall::tail`) as two kernels: the group
/// without its reduction, writing the reduced value (to its own output when
/// kept, else to a scratch buffer), then the reduction by `run`. The same
/// values as a fused kernel that follows the reduction's summation rule;
/// for the layouts a backend's fused kernel does not cover.
pub fn run_tail_split<B: Backend + ?Sized>(backend: &B, call: &FusedCall<'_>) -> Result<()> {
    use crate::error::Error;
    let Some(tail) = call.tail() else {
        return Err(Error::backend("fused", "run_tail_split needs a call whose last op is a reduction"));
    };
    let (source, index) = (tail.source as usize, tail.index as usize);
    let Some(src) = call.ops.get(source).filter(|_| source < index) else {
        return Err(Error::backend("fused", format!("the reduction reads op {source}, which is not before it")));
    };
    let Some(&(_, reduced)) = call.outputs.iter().find(|(k, _)| *k as usize == index) else {
        return Err(Error::backend("fused", "the reduction ending a group has no output"));
    };
    let numel: usize = call.dims.iter().product();
    let kept = call.outputs.iter().find(|(k, _)| *k as usize == source).map(|&(_, t)| t.buffer);
    let value = match kept {
        Some(b) => b,
        None => scratch_alloc(backend, src.dtype, numel)?,
    };
    let result = (|| {
        let value_ref = TensorRef { buffer: value, dims: call.dims, dtype: src.dtype };
        let mut outputs: Vec<(u16, TensorRef<'_>)> =
            call.outputs.iter().filter(|(k, _)| (*k as usize) < index).copied().collect();
        if kept.is_none() {
            outputs.push((tail.source, value_ref));
        }
        // No plan id: the group without its tail is not the call's structure.
        backend.run_fused(&FusedCall {
            dims: call.dims,
            ops: &call.ops[..index],
            inputs: call.inputs,
            outputs: &outputs,
            plan_id: None,
            head: call.head,
        })?;
        backend.run(&KernelCall { op: call.ops[index].op, inputs: &[value_ref], output: reduced })
    })();
    if kept.is_none() {
        scratch_free(backend, value);
    }
    result
}

/// Run a call with a head (`FusedCall::head`) as two kernels: the product
/// by `run`, into op 0's output or a scratch buffer, then the epilogue as a
/// fused group (without a head) reading it. The same values as the fused
/// kernel (each op computes what its own kernel would); for the shapes a
/// backend's fused kernel does not cover.
pub fn run_head_split<B: Backend + ?Sized>(backend: &B, call: &FusedCall<'_>) -> Result<()> {
    use crate::error::Error;
    let Some(head) = call.head else {
        return Err(Error::backend("fused", "run_head_split needs a call with a head"));
    };
    let Some(first) = call.ops.first().filter(|o| matches!(o.op, Op::MatMul { .. }) && o.arity == 0) else {
        return Err(Error::backend("fused", "op 0 of a group with a head must be its MatMul, without operands"));
    };
    let dtype = first.dtype;
    let numel: usize = call.dims.iter().product();
    let kept = call.outputs.iter().find(|(k, _)| *k == 0).map(|&(_, t)| t.buffer);
    let product = match kept {
        Some(b) => b,
        None => scratch_alloc(backend, dtype, numel)?,
    };
    let result = (|| {
        let out = TensorRef { buffer: product, dims: call.dims, dtype };
        backend.run(&KernelCall { op: head.op(), inputs: &[head.a, head.b], output: out })?;
        if call.ops.len() == 1 {
            return Ok(());
        }
        let at = u16::try_from(call.inputs.len()).map_err(|_| Error::backend("fused", "too many inputs"))?;
        let ops: Vec<FusedOp> = call.ops[1..]
            .iter()
            .map(|o| {
                let mut o = *o;
                for a in o.args.iter_mut().take(o.arity as usize) {
                    *a = match *a {
                        FusedArg::Op(0) => FusedArg::Input(at),
                        FusedArg::Op(k) => FusedArg::Op(k - 1),
                        input => input,
                    };
                }
                o
            })
            .collect();
        let mut inputs = call.inputs.to_vec();
        inputs.push(out);
        let outputs: Vec<(u16, TensorRef<'_>)> =
            call.outputs.iter().filter(|(k, _)| *k != 0).map(|&(k, t)| (k - 1, t)).collect();
        backend.run_fused(&FusedCall {
            dims: call.dims,
            ops: &ops,
            inputs: &inputs,
            outputs: &outputs,
            plan_id: call.plan_id,
            head: None,
        })
    })();
    if kept.is_none() {
        scratch_free(backend, product);
    }
    result
}
