//! kiln-wgsl: kiln's wgpu backend — every op as a WGSL kernel, for native
//! GPUs (Vulkan, Metal, DX12, GL) and browsers (WebGPU).
//!
//! Layers, one module each:
//! - `context`: instance, adapter, device, the limits kiln enforces, and the
//!   slot wgpu's uncaptured errors land in (turned into `kiln_core::Error`s
//!   by `flush` and `read`; nothing here panics on a GPU error);
//! - `buffers`: a slab of `wgpu::Buffer`s by `BufferId` (bool as u32 words,
//!   no f64);
//! - `shaders`: the `.wgsl` files and their specialisations;
//! - `pipelines`: pipelines created on first use, cached;
//! - `batch`: one command encoder per execution, per-dispatch parameters in
//!   an arena, index-check status slots;
//! - `readback`: `read` as a snapshot copy + `map_async` into a flume channel;
//! - `kernels`: the Rust that launches each family's kernels (one file per
//!   `.wgsl` file, same name; `custom` launches custom ops' own kernels).
//!
//! ```no_run
//! # async fn demo() -> kiln_core::Result<()> {
//! use kiln_wgsl::{WgpuBackend, WgpuOptions};
//! let device = kiln_core::Device::from_backend(WgpuBackend::new(WgpuOptions::default()).await?);
//! # let _ = device; Ok(()) }
//! ```

mod batch;
mod buffers;
mod context;
mod geometry;
mod kernels;
pub mod params;
mod pipelines;
#[cfg(not(target_arch = "wasm32"))]
mod profile;
mod readback;
pub mod shaders;
#[cfg(not(target_arch = "wasm32"))]
mod specialize;

use std::cell::RefCell;
use std::rc::Rc;

#[cfg(not(target_arch = "wasm32"))]
use kiln_core::backend::FusedCall;
use kiln_core::backend::{checks, Backend, BackendCounters, BufferId, KernelCall, ParamUpdate, ReadFuture, TensorRef};
use kiln_core::op::Op;
use kiln_core::{DType, Error, HostData, Result};

/// Bytes of released scratch buffers the backend keeps for reuse
/// (`WgpuBackend::free_scratch`): a page's memory is scarcer.
#[cfg(not(target_arch = "wasm32"))]
const SCRATCH_KEEP_BYTES: u64 = 512 << 20;
#[cfg(target_arch = "wasm32")]
const SCRATCH_KEEP_BYTES: u64 = 64 << 20;

use batch::{Batch, Command, Dispatch, PendingCheck, Res};
use buffers::{bytes_of, Buffers};
use context::Context;
use pipelines::Pipelines;
use shaders::Kernel;

#[cfg(not(target_arch = "wasm32"))]
pub use context::list_adapters;
pub use context::{parse_backends, AdapterSummary, WgpuOptions};
pub use kernels::matmul_tune::MatMulKernel;
/// The wgpu version this crate is built against, for callers that build
/// `WgpuOptions` (backends, power preference).
pub use wgpu;

/// The most elements (kernel height x width) one window of Im2Col, Col2Im,
/// MaxPool2d or MaxPool2dBackward may hold on this backend: each invocation
/// loops over one window (at most twice), and a shader loop must stay far
/// below the 65,535 iterations after which Mesa's lavapipe silently stops
/// it. Larger windows are refused with an Unsupported error.
pub const MAX_WINDOW: usize = 1 << 14;

/// A kernel operand as `launch` binds it.
#[derive(Clone, Copy)]
pub(crate) enum Arg {
    Buffer {
        id: BufferId,
        dtype: DType,
        len: usize,
        write: bool,
    },
    /// This execution's index-check status buffer.
    Status,
}

impl Arg {
    pub fn input(t: &TensorRef<'_>) -> Arg {
        Arg::Buffer { id: t.buffer, dtype: t.dtype, len: t.numel(), write: false }
    }
    pub fn output(t: &TensorRef<'_>) -> Arg {
        Arg::Buffer { id: t.buffer, dtype: t.dtype, len: t.numel(), write: true }
    }
}

/// The wgpu backend. Wrap it with `kiln_core::Device::from_backend`.
pub struct WgpuBackend {
    ctx: Context,
    buffers: RefCell<Buffers>,
    pipelines: RefCell<Pipelines>,
    batch: RefCell<Batch>,
    /// Index checks of submitted executions whose status has not been read
    /// yet (only on wasm32: natively `flush` waits for them).
    pending: Rc<RefCell<Vec<PendingCheck>>>,
    /// MAP_READ staging buffers of finished reads, for the next reads
    /// (readback.rs).
    staging: readback::StagingPool,
    /// Scratch buffers kernels released, kept for the next kernel that needs
    /// one (`scratch`): (capacity in elements, dtype, buffer).
    scratch_free: RefCell<Vec<(usize, DType, BufferId)>>,
    /// Bytes of scratch buffers created (for `BackendCounters`).
    scratch_created: std::cell::Cell<u64>,
    /// Bytes of chunk products a long-K matrix product may hold at once.
    matmul_scratch_bytes: u64,
    /// The matmul kernel chosen per shape class.
    matmul_tuner: kernels::matmul_tune::Tuner,
    /// `WgpuOptions::eight_elements_per_thread` resolved: eight elements per
    /// thread (`per_thread`) and reductions without workgroup barriers.
    eight_per_thread: bool,
    /// Generated kernels of fused element-wise groups and their plans.
    #[cfg(not(target_arch = "wasm32"))]
    fused: RefCell<kernels::fused::FusedCache>,
    #[cfg(not(target_arch = "wasm32"))]
    max_fused_ops: usize,
    /// Optimizer updates grouped into one dispatch per several tensors
    /// (`WgpuOptions::grouped_optimizer_update`).
    #[cfg(not(target_arch = "wasm32"))]
    grouped_update: bool,
    /// Products fused with their element-wise consumers
    /// (`WgpuOptions::fuse_matmul_epilogue`).
    #[cfg(not(target_arch = "wasm32"))]
    fuse_matmul: bool,
    /// Reductions fused with the element-wise group they reduce
    /// (`WgpuOptions::fuse_reduce_prologue`).
    #[cfg(not(target_arch = "wasm32"))]
    fuse_reduce: bool,
    /// Repeated parameter sets get pipelines with them as constants
    /// (`WgpuOptions::specialize_shapes`).
    #[cfg(not(target_arch = "wasm32"))]
    specialize: bool,
}

/// An on/off switch from the environment, `NAME=1` or `=0`, for
/// measurements (the `WgpuOptions` field wins when set):
/// `KILN_GROUPED_UPDATE` (group optimizer updates, whatever the adapter)
/// `KILN_FUSE_MATMUL` (fuse matmul epilogues), `KILN_FUSE_REDUCE`
/// (fuse reduction prologues) and `KILN_WGPU_SPECIALIZE` (shape-specialised
/// pipelines).
#[cfg(not(target_arch = "wasm32"))]
fn switch_from_env(name: &str) -> Option<bool> {
    match std::env::var(name).as_deref() {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    }
}

impl WgpuBackend {
    /// Open a device. Async because a browser cannot block; natively, wrap it
    /// in `pollster::block_on`.
    pub async fn new(options: WgpuOptions) -> Result<WgpuBackend> {
        #[allow(unused_mut)]
        let mut batch = Batch::default();
        #[cfg(not(target_arch = "wasm32"))]
        {
            batch.profile = profile::Profile::from_env();
        }
        let ctx = Context::new(&options).await?;
        let hardware = ctx.info.device_type != wgpu::DeviceType::Cpu;
        let matmul_scratch = if ctx.info.device_type == wgpu::DeviceType::DiscreteGpu {
            kernels::matmul::SCRATCH_BYTES_DISCRETE
        } else {
            kernels::matmul::SCRATCH_BYTES
        };
        Ok(WgpuBackend {
            ctx,
            buffers: RefCell::default(),
            pipelines: RefCell::default(),
            batch: RefCell::new(batch),
            pending: Rc::default(),
            staging: Rc::default(),
            scratch_free: RefCell::default(),
            scratch_created: Default::default(),
            matmul_scratch_bytes: options.max_matmul_scratch_bytes.unwrap_or(matmul_scratch),
            matmul_tuner: kernels::matmul_tune::Tuner::new(options.matmul_kernel, hardware)?,
            eight_per_thread: options.eight_elements_per_thread.unwrap_or(!hardware),
            #[cfg(not(target_arch = "wasm32"))]
            fused: RefCell::default(),
            #[cfg(not(target_arch = "wasm32"))]
            max_fused_ops: options.max_fused_ops.unwrap_or(kernels::fused::MAX_OPS),
            #[cfg(not(target_arch = "wasm32"))]
            grouped_update: options
                .grouped_optimizer_update
                .or_else(|| switch_from_env("KILN_GROUPED_UPDATE"))
                .unwrap_or(hardware),
            #[cfg(not(target_arch = "wasm32"))]
            fuse_matmul: options.fuse_matmul_epilogue.or_else(|| switch_from_env("KILN_FUSE_MATMUL")).unwrap_or(true),
            #[cfg(not(target_arch = "wasm32"))]
            fuse_reduce: options.fuse_reduce_prologue.or_else(|| switch_from_env("KILN_FUSE_REDUCE")).unwrap_or(true),
            #[cfg(not(target_arch = "wasm32"))]
            specialize: options.specialize_shapes.or_else(|| switch_from_env("KILN_WGPU_SPECIALIZE")).unwrap_or(true),
        })
    }

    /// Name, API (`info.backend`), device type and driver of the adapter.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.ctx.info
    }

    /// The limits kiln enforces (the adapter's, lowered by the options' caps).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.ctx.limits
    }

    /// The adapter as `kiln devices` prints it.
    pub fn summary(&self) -> AdapterSummary {
        AdapterSummary::new(&self.ctx.info, &self.ctx.limits)
    }

    pub(crate) fn matmul_tuner(&self) -> &kernels::matmul_tune::Tuner {
        &self.matmul_tuner
    }

    /// The pipeline of `entry` of `kernel`, created at first use.
    pub(crate) fn pipeline(
        &self,
        op: &'static str,
        kernel: Kernel,
        entry: &'static str,
    ) -> Result<Rc<pipelines::Pipeline>> {
        self.pipelines.borrow_mut().get(&self.ctx, op, kernel, entry)
    }

    /// A pipeline of generated WGSL (fused kernels), compiled now.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn compile(&self, op: &'static str, label: &str, source: &str) -> Result<Rc<pipelines::Pipeline>> {
        self.pipelines.borrow_mut().compile(&self.ctx, op, label, source)
    }

    /// Count a request for a generated pipeline that its cache answered.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn count_pipeline_hit(&self) {
        self.pipelines.borrow_mut().hits += 1;
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn max_fused_ops(&self) -> usize {
        self.max_fused_ops
    }

    pub(crate) fn matmul_scratch_bytes(&self) -> u64 {
        self.matmul_scratch_bytes.max(4)
    }

    pub(crate) fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// Whether repeated parameter sets get shape-specialised pipelines
    /// (specialize.rs; the browser build has none).
    pub(crate) fn specializes(&self) -> bool {
        #[cfg(not(target_arch = "wasm32"))]
        return self.specialize;
        #[cfg(target_arch = "wasm32")]
        false
    }

    /// Launch strided.wgsl's entry point over `n` elements of `kernel` (a
    /// binary op, comparison, Where or copy): eight elements per thread
    /// (`main8`) or one (`main`), as `WgpuOptions::eight_elements_per_thread`
    /// chose.
    pub(crate) fn launch_strided(
        &self,
        op: &'static str,
        kernel: Kernel,
        args: &[(u32, Arg)],
        params: &[u32],
        n: usize,
    ) -> Result<()> {
        let (entry, threads) = self.per_thread(["main", "main8"], n);
        self.launch(op, kernel, entry, args, params, self.grid_for(op, threads)?)
    }

    /// The entry point of a kernel with two launches (`[one, eight]`
    /// elements per thread) that `WgpuOptions::eight_elements_per_thread`
    /// chose, and the thread count for `n` elements.
    pub(crate) fn per_thread(&self, [one, eight]: [&'static str; 2], n: usize) -> (&'static str, usize) {
        if self.eight_per_thread {
            (eight, n.div_ceil(8))
        } else {
            (one, n)
        }
    }

    /// Workgroups for a one-dimensional launch over `n` items, WG per group.
    pub(crate) fn grid_for(&self, op: &'static str, n: usize) -> Result<[u32; 3]> {
        self.ctx.grid(op, (n as u64).div_ceil(u64::from(shaders::WG)))
    }

    /// Record one dispatch of `entry` of `kernel`: binding 0 gets `params`,
    /// the others the given operands. Nothing runs until `flush`.
    pub(crate) fn launch(
        &self,
        op: &'static str,
        kernel: Kernel,
        entry: &'static str,
        args: &[(u32, Arg)],
        params: &[u32],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let pipeline = self.pipeline(op, kernel, entry)?;
        #[cfg(not(target_arch = "wasm32"))]
        let pipeline = self.specialized(op, kernel, entry, pipeline, false, params)?;
        self.record(op, kernel, entry, pipeline, args, params, groups)
    }

    /// The shape-specialised pipeline for a dispatch of `pipeline` (an entry
    /// point of `kernel`, or a generated pipeline) with `params`, once that
    /// parameter set repeats (specialize.rs); else `pipeline` itself.
    #[cfg(not(target_arch = "wasm32"))]
    fn specialized(
        &self,
        op: &'static str,
        kernel: Kernel,
        entry: &'static str,
        pipeline: Rc<pipelines::Pipeline>,
        generated: bool,
        params: &[u32],
    ) -> Result<Rc<pipelines::Pipeline>> {
        use specialize::{Found, Specializer};
        if !self.specialize || !Specializer::eligible(kernel, entry) {
            return Ok(pipeline);
        }
        let mut pipelines = self.pipelines.borrow_mut();
        let generic = generated.then_some(&pipeline);
        let source = || if generated { pipeline.source.clone() } else { kernel.source() };
        match pipelines.specializer.lookup(kernel, entry, generic, source, params) {
            Found::Ready(p) => Ok(p),
            Found::Generic => Ok(pipeline),
            Found::Make(pending) => {
                let made = if specialize::validates(&pending.source) {
                    let label = format!("{}::{entry} (specialised)", kernel.label());
                    pipelines.compile_specialized(&self.ctx, op, &label, &pending.source, entry).ok()
                } else {
                    None
                };
                pipelines.specializer.finish(pending, params, made.clone());
                Ok(made.unwrap_or(pipeline))
            }
        }
    }

    /// Record one dispatch of the entry point `main` of a pipeline made
    /// outside the cache of `launch` (a fused kernel).
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn launch_pipeline(
        &self,
        op: &'static str,
        kernel: Kernel,
        pipeline: Rc<pipelines::Pipeline>,
        args: &[(u32, Arg)],
        params: &[u32],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let pipeline = self.specialized(op, kernel, "main", pipeline, true, params)?;
        self.record(op, kernel, "main", pipeline, args, params, groups)
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        op: &'static str,
        kernel: Kernel,
        entry: &'static str,
        pipeline: Rc<pipelines::Pipeline>,
        args: &[(u32, Arg)],
        params: &[u32],
        groups: [u32; 3],
    ) -> Result<()> {
        let mut bindings = Vec::with_capacity(args.len());
        {
            let buffers = self.buffers.borrow();
            for (i, (binding, arg)) in args.iter().enumerate() {
                let res = match *arg {
                    Arg::Status => Res::Status,
                    Arg::Buffer { id, dtype, len, write } => {
                        let stored = self.bindable(&buffers, op, id, dtype, len)?;
                        // A buffer written by a kernel must not also be bound
                        // elsewhere in the same dispatch (wgpu refuses it).
                        let aliased = args.iter().enumerate().any(|(j, (_, other))| {
                            j != i && matches!(*other, Arg::Buffer { id: o, write: w, .. } if o == id && (w || write))
                        });
                        if aliased {
                            return Err(Error::backend(
                                op,
                                format!("buffer {} is both written and bound again by one kernel", id.0),
                            ));
                        }
                        Res::Buffer(stored.buffer.clone(), bytes_of(len))
                    }
                };
                bindings.push((*binding, res));
            }
        }
        let mut batch = self.batch.borrow_mut();
        let params = if pipeline.binds_params() { batch.push_params(&self.ctx, params) } else { (0, 0) };
        batch.push(Command::Dispatch(Dispatch { pipeline, op, kernel, entry, bindings, params, groups }));
        Ok(())
    }

    /// The stored buffer `id`, if a kernel may bind it as `len` x `dtype`:
    /// it exists, holds that many of that dtype, and `len` elements fit the
    /// device's largest storage binding.
    pub(crate) fn bindable<'b>(
        &self,
        buffers: &'b buffers::Buffers,
        op: &'static str,
        id: BufferId,
        dtype: DType,
        len: usize,
    ) -> Result<&'b buffers::Stored> {
        let stored = buffers.get(op, id)?;
        if stored.dtype != dtype || stored.len < len {
            return Err(Error::backend(
                op,
                format!(
                    "buffer {} holds {} x {} but the kernel was given {len} x {dtype}",
                    id.0, stored.len, stored.dtype
                ),
            ));
        }
        let (bytes, limit) = (bytes_of(len), self.ctx.limits.max_storage_buffer_binding_size);
        if bytes > limit {
            return Err(Error::unsupported(
                op,
                format!(
                    "a {dtype} tensor of {len} elements ({bytes} bytes) is larger than this device's \
                     max_storage_buffer_binding_size of {limit} bytes; use smaller tensors (e.g. smaller batches) \
                     or the CPU device"
                ),
            ));
        }
        Ok(stored)
    }

    /// Record a copy of the first `len` words of `src` into `dst`.
    pub(crate) fn record_copy(&self, op: &'static str, src: BufferId, dst: BufferId, len: usize) -> Result<()> {
        if len == 0 || src == dst {
            return Ok(());
        }
        let buffers = self.buffers.borrow();
        let (s, d) = (buffers.get(op, src)?, buffers.get(op, dst)?);
        if s.len < len || d.len < len || s.dtype != d.dtype {
            return Err(Error::backend(
                op,
                format!(
                    "cannot copy {len} elements from buffer {} ({} x {}) to buffer {} ({} x {})",
                    src.0, s.len, s.dtype, dst.0, d.len, d.dtype
                ),
            ));
        }
        let command = Command::Copy { src: s.buffer.clone(), dst: d.buffer.clone(), bytes: bytes_of(len) };
        self.batch.borrow_mut().push(command);
        Ok(())
    }

    /// A buffer for a kernel's intermediate values (reduction partials, K
    /// chunks of a matrix product), outside the device's memory pool: one a
    /// kernel released earlier when one of its dtype holds `len` without
    /// being more than twice as large, else a new one. Kernels write what
    /// they read of it (its old contents are not zeros). Reuse matters: a
    /// new wgpu buffer costs an allocation and a zero-fill of its whole size
    /// at first use, every step (measured on an NVIDIA H200: 4096³ products
    /// with 64 MiB of chunk products took 10.9 ms each with a new buffer per
    /// product, 7 ms of which were kernels).
    pub(crate) fn scratch(&self, dtype: DType, len: usize) -> Result<BufferId> {
        let mut free = self.scratch_free.borrow_mut();
        let mut best: Option<usize> = None;
        for (i, &(cap, d, _)) in free.iter().enumerate() {
            if d == dtype && cap >= len && cap <= 2 * len.max(1024) && best.is_none_or(|b| cap < free[b].0) {
                best = Some(i);
            }
        }
        if let Some(i) = best {
            return Ok(free.swap_remove(i).2);
        }
        drop(free);
        let id = self.buffers.borrow_mut().alloc(&self.ctx, dtype, len)?;
        self.scratch_created.set(self.scratch_created.get() + bytes_of(len));
        Ok(id)
    }

    /// Release a scratch buffer for reuse by a later `scratch`. Dispatches
    /// recorded with it keep their own handle and run before any later one
    /// (wgpu orders the writes), so reuse within one submission is safe.
    /// Kept buffers stay under `SCRATCH_KEEP_BYTES` together: one that
    /// would pass it is freed instead.
    pub(crate) fn free_scratch(&self, id: BufferId) {
        let mut buffers = self.buffers.borrow_mut();
        let Ok(stored) = buffers.get("free_scratch", id) else { return };
        let entry = (stored.len, stored.dtype, id);
        let mut free = self.scratch_free.borrow_mut();
        let kept: u64 = free.iter().map(|e| bytes_of(e.0)).sum();
        if kept + bytes_of(entry.0) <= SCRATCH_KEEP_BYTES {
            free.push(entry);
        } else {
            buffers.free(id);
        }
    }

    pub(crate) fn push_check(&self, meta: batch::CheckMeta) -> u32 {
        self.batch.borrow_mut().push_check(meta)
    }

    /// Submit what has been recorded. Natively, an execution with index
    /// checks waits for them here, so a bad index fails the execution that
    /// used it; on wasm32 the check is settled by the next `read`.
    fn submit(&self) -> Result<()> {
        // While a custom kernel's compilation is unchecked (wasm32), the
        // submission's validation errors go to a scope the next read awaits
        // with the check: the consequences of a kernel the browser refused
        // are dropped there, anything else is reported as usual.
        #[cfg(target_arch = "wasm32")]
        let scope =
            self.pipelines.borrow().checking().then(|| self.ctx.device.push_error_scope(wgpu::ErrorFilter::Validation));
        let submitted = self.batch.borrow_mut().submit(&self.ctx);
        #[cfg(target_arch = "wasm32")]
        if let Some(scope) = scope {
            self.pipelines.borrow_mut().add_submit_scope(Box::pin(scope.pop()));
        }
        let check = submitted?;
        if let Some(check) = check {
            #[cfg(not(target_arch = "wasm32"))]
            {
                self.ctx
                    .device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(|e| Error::backend("flush", format!("waiting for the GPU failed: {e}")))?;
                check.settle_now()?;
            }
            #[cfg(target_arch = "wasm32")]
            self.pending.borrow_mut().push(check);
        }
        self.ctx.errors.check("flush")
    }
}

/// Profile mode prints its table when the backend goes.
#[cfg(not(target_arch = "wasm32"))]
impl Drop for WgpuBackend {
    fn drop(&mut self) {
        if let Some(profile) = &self.batch.borrow().profile {
            eprint!("{}", profile.report());
            let p = self.pipelines.borrow();
            eprintln!(
                "pipelines created: {} in {:.3} s, of which generated fused kernels {} in {:.3} s",
                p.compiled,
                p.compile_time.as_secs_f64(),
                p.fused.0,
                p.fused.1.as_secs_f64()
            );
        }
    }
}

impl Backend for WgpuBackend {
    fn name(&self) -> String {
        let i = &self.ctx.info;
        format!("wgpu ({}, {:?}, {:?})", i.name, i.backend, i.device_type)
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<BufferId> {
        self.buffers.borrow_mut().alloc(&self.ctx, dtype, len)
    }

    fn free(&self, buffer: BufferId) {
        self.buffers.borrow_mut().free(buffer);
    }

    /// The backend's scratch pool (`scratch`), shared with its kernels'
    /// own intermediate buffers.
    #[cfg(not(target_arch = "wasm32"))]
    fn scratch_alloc(&self, dtype: DType, len: usize) -> Result<BufferId> {
        self.scratch(dtype, len)
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn scratch_free(&self, buffer: BufferId) {
        self.free_scratch(buffer)
    }

    fn upload(&self, buffer: BufferId, data: &HostData) -> Result<()> {
        const OP: &str = "upload";
        // queue.write_buffer lands before the next submission: recorded work
        // that reads this buffer's old contents must be submitted first.
        if !self.batch.borrow().is_empty() {
            self.submit()?;
        }
        let bytes = buffers::to_words(data)?;
        let buffers = self.buffers.borrow();
        let s = buffers.get(OP, buffer)?;
        if s.dtype != data.dtype() || s.len < data.len() {
            return Err(Error::backend(
                OP,
                format!(
                    "cannot upload {} x {} into buffer {} ({} x {})",
                    data.len(),
                    data.dtype(),
                    buffer.0,
                    s.len,
                    s.dtype
                ),
            ));
        }
        if !bytes.is_empty() {
            self.ctx.queue.write_buffer(&s.buffer, 0, &bytes);
        }
        self.ctx.errors.check(OP)
    }

    fn copy(&self, src: BufferId, dst: BufferId, dtype: DType, len: usize) -> Result<()> {
        if dtype == DType::F64 {
            return Err(buffers::f64_refused("copy"));
        }
        self.record_copy("copy", src, dst, len)
    }

    fn run(&self, call: &KernelCall<'_>) -> Result<()> {
        kernels::run(self, call)
    }

    /// Natively, element-wise groups run as generated kernels (the browser
    /// build leaves them out for its size budget).
    fn fuses(&self) -> bool {
        cfg!(not(target_arch = "wasm32"))
    }

    /// Natively, f32 products run with their element-wise consumers as one
    /// generated kernel (kernels/fused/head.rs) unless
    /// `WgpuOptions::fuse_matmul_epilogue` says no; not in the browser,
    /// which does not fuse (the trait's default).
    #[cfg(not(target_arch = "wasm32"))]
    fn fuses_matmul(&self, dtype: DType) -> bool {
        self.fuse_matmul && dtype == DType::F32
    }

    /// Natively, a Sum/Prod/Max/Min of an f32 or i32 group's value runs as
    /// one generated kernel with the group (kernels/fused/tail.rs) unless
    /// `WgpuOptions::fuse_reduce_prologue` says no; not in the browser.
    #[cfg(not(target_arch = "wasm32"))]
    fn fuses_reduce(&self, dtype: DType) -> bool {
        self.fuse_reduce && matches!(dtype, DType::F32 | DType::I32)
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn run_fused(&self, call: &FusedCall<'_>) -> Result<()> {
        kernels::fused::run(self, call)
    }

    fn update_param(
        &self,
        update: &ParamUpdate,
        param: BufferId,
        grad: BufferId,
        state: &[BufferId],
        dtype: DType,
        len: usize,
    ) -> Result<()> {
        kernels::update::update(self, update, param, grad, state, dtype, len)
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn update_params(&self, calls: &[kiln_core::backend::ParamUpdateCall<'_>]) -> Result<()> {
        kernels::update::update_many(self, calls, self.grouped_update)
    }

    fn flush(&self) -> Result<()> {
        self.submit()
    }

    fn read(&self, buffer: BufferId, dtype: DType, len: usize) -> ReadFuture {
        readback::read(self, buffer, dtype, len)
    }

    fn supports(&self, op: &Op, dtype: DType) -> bool {
        // A custom op runs here through its own WGSL kernel, whose output
        // binding fixes the dtype.
        if let Op::Custom(c) = op {
            return c.wgsl().is_some_and(|k| k.bindings.last() == Some(&dtype));
        }
        // The buffers store f32, i32 and bool (no f64); `shaders` has an
        // expression for exactly the unary and binary ops `has_kernel` lists
        // (a test below holds them together).
        checks::has_kernel(op, dtype, &[DType::F32, DType::I32, DType::Bool])
    }

    fn counters(&self) -> BackendCounters {
        let pipelines = self.pipelines.borrow();
        BackendCounters {
            pipelines_compiled: pipelines.compiled,
            pipeline_cache_hits: pipelines.hits,
            kernel_trials: self.matmul_tuner.trials(),
            dispatches: self.batch.borrow().dispatches,
            scratch_bytes_allocated: self.scratch_created.get(),
            #[cfg(not(target_arch = "wasm32"))]
            specialized_pipelines: pipelines.specializer.made,
            #[cfg(target_arch = "wasm32")]
            specialized_pipelines: 0,
        }
    }
}
