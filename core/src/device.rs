//! A device: one backend plus the size-bucketed buffer pool in front of it.

use std::cell::RefCell;
use std::rc::Rc;

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, BufferId};
use crate::dtype::{DType, HostData};
use crate::error::Result;

/// A handle to a compute device. Cloning is cheap and shares the device.
///
/// kiln graphs are single-threaded by design (like a JAX trace): a device and
/// everything made on it stay on the thread that made them, which keeps node
/// creation and scheduling at the microsecond scale and fits the browser.
#[derive(Clone)]
pub struct Device(Rc<DeviceShared>);

struct DeviceShared {
    /// Distinguishes devices with the same backend in messages.
    id: u64,
    backend: Box<dyn Backend>,
    pool: RefCell<BufferPool>,
    /// Whether the executor may run independent small nodes at once.
    parallel_branches: std::cell::Cell<bool>,
    /// Whether the executor fuses element-wise chains (see `set_fusion`).
    fusion: std::cell::Cell<bool>,
    /// Plans of the executions seen (see `set_plan_cache`); None: off.
    plans: RefCell<Option<crate::exec::plan::PlanCache>>,
    exec: std::cell::Cell<ExecStats>,
    /// Per-kernel wall time (see `set_op_profile`); None: off.
    #[cfg(not(target_arch = "wasm32"))]
    op_profile: RefCell<Option<crate::op_profile::OpProfile>>,
}

/// What the executor ran on a device (see `Device::exec_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecStats {
    /// Kernels run (nodes computed).
    pub kernels: usize,
    /// Groups of independent kernels given to the backend at once.
    pub concurrent_batches: usize,
    /// Kernels run as part of such a group.
    pub concurrent_kernels: usize,
    /// Executions that replayed a cached plan.
    pub plans_reused: usize,
    /// Executions that planned (and recorded their plan).
    pub plans_built: usize,
    /// Fused element-wise groups run (each counts as one kernel).
    pub fused_groups: usize,
    /// Nodes computed inside those groups.
    pub fused_nodes: usize,
    /// Of those groups, the ones headed by a matrix product: its epilogue
    /// (bias, activation...) fused into it.
    pub fused_products: usize,
    /// Of those groups, the ones ending in a reduction (Sum, Max...): the
    /// group is the reduction's prologue, e.g. `sum(exp(x - m))`.
    pub fused_reductions: usize,
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use crate::op_profile::Stopwatch as OpWatch;
/// No clock in the browser build: `op_watch` is always None there.
#[cfg(target_arch = "wasm32")]
pub(crate) enum OpWatch {}

/// Counters of the pool: the executor tests read these to prove that buffers
/// are returned at their last use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers handed out and not yet returned (graph values, parameters,
    /// gradients, optimizer state).
    pub live_buffers: usize,
    /// The most buffers live at once since the last `reset_peak`.
    pub peak_live_buffers: usize,
    /// Buffers resting in the pool, ready for reuse.
    pub pooled_buffers: usize,
    /// Buffers the backend was asked to create (pool misses).
    pub backend_allocations: usize,
    /// Bytes of all those buffers together, ever (not lowered by
    /// `trim_pool`): its growth over a training step is what the step
    /// allocated on the device, which is 0 once the pool has warmed up.
    pub backend_allocated_bytes: usize,
    /// Bytes of the buffers handed out and not yet returned (their pool
    /// capacity, which rounds the request up by at most a quarter).
    pub live_bytes: usize,
    /// The most `live_bytes` at once since the last `reset_peak`: the
    /// device memory a workload needed at its peak.
    pub peak_live_bytes: usize,
    /// Bytes the backend holds for the pool (live plus resting buffers),
    /// what the device actually has allocated; `trim_pool` lowers it.
    pub allocated_bytes: usize,
}

const DTYPES: usize = 4;
const BUCKETS: usize = 1 + 58 * 4;

struct BufferPool {
    free: Vec<Vec<BufferId>>,
    stats: PoolStats,
}

/// Pool bucket of a request for `len` elements: (bucket index, capacity).
/// Capacities step by a quarter of a power of two, so a pooled buffer wastes
/// at most 25% and requests of similar sizes share buffers.
fn bucket(len: usize) -> (usize, usize) {
    if len <= 64 {
        return (0, 64);
    }
    let e = (usize::BITS - 1 - (len - 1).leading_zeros()) as usize;
    let step = 1usize << (e - 2);
    let cap = len.div_ceil(step) * step;
    let quarter = cap / step - 5;
    (1 + (e - 6) * 4 + quarter, cap)
}

/// The capacity of bucket `b` (the inverse of `bucket`).
fn bucket_capacity(b: usize) -> usize {
    if b == 0 {
        return 64;
    }
    let e = (b - 1) / 4 + 6;
    let quarter = (b - 1) % 4;
    (1usize << (e - 2)) * (quarter + 5)
}

fn dtype_index(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 0,
        DType::F64 => 1,
        DType::I32 => 2,
        DType::Bool => 3,
    }
}

impl Device {
    /// The CPU device (rayon-parallel where the `rayon` feature is on),
    /// with the numerics the environment variable `KILN_CPU_NUMERICS` asks
    /// for (`native`, the default, or `portable`: see `CpuNumerics`).
    pub fn cpu() -> Device {
        Device::from_backend(CpuBackend::new())
    }

    /// The CPU device with the given numerics: `CpuNumerics::Portable`
    /// computes the browser (wasm) build's bits, so that training moves
    /// between native and browser without changing a bit
    /// (docs/portable-numerics.md).
    pub fn cpu_with(numerics: crate::CpuNumerics) -> Device {
        Device::from_backend(CpuBackend::with_numerics(numerics))
    }

    pub fn from_backend(backend: impl Backend + 'static) -> Device {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Device(Rc::new(DeviceShared {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            backend: Box::new(backend),
            pool: RefCell::new(BufferPool { free: vec![Vec::new(); DTYPES * BUCKETS], stats: PoolStats::default() }),
            parallel_branches: std::cell::Cell::new(true),
            fusion: std::cell::Cell::new(switch_default("KILN_FUSION")),
            // Off in wasm for now: the browser build was not measured with it.
            plans: RefCell::new(
                (!cfg!(target_arch = "wasm32") && switch_default("KILN_PLAN_CACHE")).then(Default::default),
            ),
            exec: std::cell::Cell::new(ExecStats::default()),
            #[cfg(not(target_arch = "wasm32"))]
            op_profile: RefCell::new(
                std::env::var("KILN_OP_PROFILE").is_ok_and(|v| !matches!(v.trim(), "" | "0")).then(Default::default),
            ),
        }))
    }

    pub fn backend(&self) -> &dyn Backend {
        self.0.backend.as_ref()
    }

    pub fn name(&self) -> String {
        self.0.backend.name()
    }

    /// Let the executor run independent small nodes at the same time when
    /// the backend can (on by default; the CPU with rayon can). Results are
    /// bit-identical either way: this is a speed switch, and tests compare
    /// the two.
    pub fn set_parallel_branches(&self, on: bool) {
        self.0.parallel_branches.set(on);
    }

    pub fn parallel_branches(&self) -> bool {
        self.0.parallel_branches.get()
    }

    /// Let the executor run chains of element-wise ops as one fused kernel
    /// when the backend can (the CPU can). Results are bit-identical either
    /// way. The default is on, unless the environment variable
    /// `KILN_FUSION` is `0` when the device is made.
    pub fn set_fusion(&self, on: bool) {
        self.0.fusion.set(on);
    }

    pub fn fusion(&self) -> bool {
        self.0.fusion.get()
    }

    /// Let the executor replay the plan of an execution whose graph
    /// structure it has seen (see `exec::plan`) instead of deciding again.
    /// Results are the same either way. The default is on, unless the
    /// environment variable `KILN_PLAN_CACHE` is `0` when the device is made
    /// (in wasm the default is off).
    pub fn set_plan_cache(&self, on: bool) {
        let mut plans = self.0.plans.borrow_mut();
        match (on, plans.is_some()) {
            (true, false) => *plans = Some(Default::default()),
            (false, true) => *plans = None,
            _ => {}
        }
    }

    pub fn plan_cache_enabled(&self) -> bool {
        self.0.plans.borrow().is_some()
    }

    /// `f` on the plan cache, while it is on.
    pub(crate) fn with_plan_cache<R>(&self, f: impl FnOnce(&mut crate::exec::plan::PlanCache) -> R) -> Option<R> {
        self.0.plans.borrow_mut().as_mut().map(f)
    }

    pub(crate) fn count_plan(&self, reused: bool) {
        let mut s = self.0.exec.get();
        if reused {
            s.plans_reused += 1;
        } else {
            s.plans_built += 1;
        }
        self.0.exec.set(s);
    }

    /// Count one fused group of `nodes` nodes (one kernel).
    pub(crate) fn count_fused(&self, nodes: usize, product: bool, reduction: bool) {
        let mut s = self.0.exec.get();
        s.kernels += 1;
        s.fused_groups += 1;
        s.fused_nodes += nodes;
        s.fused_products += product as usize;
        s.fused_reductions += reduction as usize;
        self.0.exec.set(s);
    }

    /// Counts of what the executor ran on this device since it was made.
    pub fn exec_stats(&self) -> ExecStats {
        self.0.exec.get()
    }

    /// Count `kernels` run together (one: alone).
    pub(crate) fn count_kernels(&self, kernels: usize) {
        let mut s = self.0.exec.get();
        s.kernels += kernels;
        if kernels > 1 {
            s.concurrent_batches += 1;
            s.concurrent_kernels += kernels;
        }
        self.0.exec.set(s);
    }

    /// Record the wall time of every kernel the executor runs (and of the
    /// optimizer's update), by op and shape, until switched off; `op_profile`
    /// reads it. Off by default, unless the environment variable
    /// `KILN_OP_PROFILE` is set (not to `0`) when the device is made.
    /// Switching it on again starts a fresh profile. On wgpu the times are
    /// those of recording the dispatches, not of the GPU running them.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn set_op_profile(&self, on: bool) {
        *self.0.op_profile.borrow_mut() = on.then(Default::default);
    }

    /// Whether the op profile is on.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn op_profile_on(&self) -> bool {
        self.0.op_profile.borrow().is_some()
    }

    /// The profile recorded since `set_op_profile(true)` (empty when off),
    /// the most time first; `kiln::op_profile::format_table` prints it.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn op_profile(&self) -> Vec<crate::op_profile::OpTime> {
        self.0.op_profile.borrow().as_ref().map_or_else(Vec::new, |p| p.report())
    }

    /// A started clock when the op profile is on.
    #[inline]
    pub(crate) fn op_watch(&self) -> Option<OpWatch> {
        #[cfg(not(target_arch = "wasm32"))]
        if self.0.op_profile.borrow().is_some() {
            return Some(crate::op_profile::Stopwatch::start());
        }
        None
    }

    /// Add the time since `watch` started to the kernel `label` names (the
    /// label is only built when profiling).
    #[inline]
    pub(crate) fn record_op(&self, watch: Option<OpWatch>, label: impl FnOnce() -> String) {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(w) = watch {
            let elapsed = w.elapsed();
            if let Some(p) = self.0.op_profile.borrow_mut().as_mut() {
                p.add(label(), elapsed);
            }
        }
        #[cfg(target_arch = "wasm32")]
        let _ = (watch, label);
    }

    /// A number unique to this device in this process.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Whether two handles refer to the same device.
    pub fn same(&self, other: &Device) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }

    /// A buffer for `len` elements, from the pool when one of the right
    /// bucket is resting there.
    pub(crate) fn take_buffer(&self, dtype: DType, len: usize) -> Result<BufferId> {
        let (b, cap) = bucket(len);
        let bytes = cap * dtype.size_bytes();
        let mut pool = self.0.pool.borrow_mut();
        let slot = dtype_index(dtype) * BUCKETS + b;
        let id = match pool.free[slot].pop() {
            Some(id) => {
                pool.stats.pooled_buffers -= 1;
                id
            }
            None => {
                let id = self.0.backend.alloc(dtype, cap)?;
                pool.stats.backend_allocations += 1;
                pool.stats.backend_allocated_bytes += bytes;
                pool.stats.allocated_bytes += bytes;
                id
            }
        };
        let stats = &mut pool.stats;
        stats.live_buffers += 1;
        stats.peak_live_buffers = stats.peak_live_buffers.max(stats.live_buffers);
        stats.live_bytes += bytes;
        stats.peak_live_bytes = stats.peak_live_bytes.max(stats.live_bytes);
        Ok(id)
    }

    /// Return a buffer taken with `take_buffer(dtype, len)` to the pool.
    pub(crate) fn give_back(&self, buffer: BufferId, dtype: DType, len: usize) {
        let (b, cap) = bucket(len);
        let mut pool = self.0.pool.borrow_mut();
        pool.free[dtype_index(dtype) * BUCKETS + b].push(buffer);
        pool.stats.live_buffers -= 1;
        pool.stats.pooled_buffers += 1;
        pool.stats.live_bytes -= cap * dtype.size_bytes();
    }

    /// A pooled buffer holding `data`.
    pub(crate) fn upload(&self, data: &HostData) -> Result<BufferId> {
        let id = self.take_buffer(data.dtype(), data.len())?;
        if let Err(e) = self.0.backend.upload(id, data) {
            self.give_back(id, data.dtype(), data.len());
            return Err(e);
        }
        Ok(id)
    }

    pub fn stats(&self) -> PoolStats {
        self.0.pool.borrow().stats
    }

    /// Start counting `peak_live_buffers` and `peak_live_bytes` from the
    /// current level.
    pub fn reset_peak(&self) {
        let mut pool = self.0.pool.borrow_mut();
        pool.stats.peak_live_buffers = pool.stats.live_buffers;
        pool.stats.peak_live_bytes = pool.stats.live_bytes;
    }

    /// Release every resting buffer back to the backend.
    pub fn trim_pool(&self) {
        let mut guard = self.0.pool.borrow_mut();
        let pool = &mut *guard;
        for (slot, list) in pool.free.iter_mut().enumerate() {
            let dtype = [DType::F32, DType::F64, DType::I32, DType::Bool][slot / BUCKETS];
            for id in list.drain(..) {
                self.0.backend.free(id);
                pool.stats.allocated_bytes -= bucket_capacity(slot % BUCKETS) * dtype.size_bytes();
            }
        }
        pool.stats.pooled_buffers = 0;
    }
}

/// A speed switch that is on unless the environment variable is `0` (no
/// environment in the browser: on).
fn switch_default(variable: &str) -> bool {
    std::env::var(variable).map_or(true, |v| v.trim() != "0")
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        for list in self.pool.get_mut().free.drain(..) {
            for id in list {
                self.backend.free(id);
            }
        }
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::bucket;

    #[test]
    fn buckets_round_up_by_at_most_a_quarter() {
        assert_eq!(bucket(1), (0, 64));
        assert_eq!(bucket(64), (0, 64));
        assert_eq!(bucket(65), (1, 80));
        assert_eq!(bucket(128), (4, 128));
        assert_eq!(bucket(129).1, 160);
        for len in [1usize, 64, 65, 100, 128, 129, 1000, 4096, 100_000, 1 << 30] {
            let (b, cap) = bucket(len);
            assert_eq!(super::bucket_capacity(b), cap, "bucket {b} of len {len}");
            assert!(cap >= len && (cap as f64) <= len as f64 * 1.25 + 64.0);
        }
    }
}
