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
use crate::op::Op;

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
/// group's dims). `dtype` is the op's output dtype.
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
}

impl FusedCall<'_> {
    /// The numeric dtype the group computes in: the first dtype other than
    /// Bool among its ops' outputs and its inputs (comparisons give Bool
    /// values beside it). None for a group of Bool values only.
    pub fn value_dtype(&self) -> Option<DType> {
        self.ops.iter().map(|o| o.dtype).chain(self.inputs.iter().map(|t| t.dtype)).find(|&d| d != DType::Bool)
    }
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
}

pub trait Backend {
    /// Human-readable description, e.g. "cpu (rayon, 2 threads)".
    fn name(&self) -> String;

    /// A new buffer with room for `len` elements of `dtype`. Contents are
    /// unspecified: every kernel writes its whole output.
    fn alloc(&self, dtype: DType, len: usize) -> Result<BufferId>;
    fn free(&self, buffer: BufferId);
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
