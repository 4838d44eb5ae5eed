//! Instance, adapter and device setup; the limits kiln enforces; the slot
//! wgpu's uncaptured errors land in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kiln_core::{Error, Result};

/// How to pick and limit the GPU.
#[derive(Clone, Debug)]
pub struct WgpuOptions {
    /// Which graphics APIs to look at: `wgpu::Backends::VULKAN`, `METAL`,
    /// `DX12`, `GL`, `BROWSER_WEBGPU`, `PRIMARY` (the default: every API
    /// except GL) or `all()`. [`parse_backends`] reads names like "vulkan".
    pub backends: wgpu::Backends,
    pub power_preference: wgpu::PowerPreference,
    /// Cap the adapter's largest storage binding (bytes): tensors larger than
    /// this are refused when a kernel would bind them. For tests and for
    /// reproducing a smaller device's behaviour.
    pub max_storage_buffer_binding_size: Option<u64>,
    /// Cap the adapter's largest buffer (bytes): larger allocations are
    /// refused.
    pub max_buffer_size: Option<u64>,
    /// Cap the scratch a matrix product with a long K holds at once for its
    /// chunk products (bytes; default 64 MiB, 256 MiB on a discrete GPU). Lower caps reduce the chunks
    /// in flight, not the result: the bits do not depend on it.
    pub max_matmul_scratch_bytes: Option<u64>,
    /// Run every matrix product whose grid fits it with this kernel instead
    /// of the one chosen per shape class (for tests and measurements; the
    /// results are the same bits either way).
    pub matmul_kernel: Option<crate::MatMulKernel>,
    /// Cap the storage buffers one kernel may bind (WebGPU guarantees 8):
    /// fused element-wise kernels are cut to fit. For tests and for
    /// reproducing a smaller device's behaviour.
    pub max_storage_buffers_per_shader_stage: Option<u32>,
    /// The most ops of a fused element-wise group one generated kernel
    /// computes (default `kernels::fused::MAX_OPS`); longer groups run as
    /// several kernels. Compile time grows with a kernel's length.
    pub max_fused_ops: Option<usize>,
    /// Whether an optimizer step updates several parameters per dispatch
    /// (multi-tensor apply, `Backend::update_params`) or one per dispatch.
    /// `None` (the default) groups them on hardware adapters and not on
    /// software ones: a software adapter runs every tensor's branch of the
    /// grouped kernel for every thread (measured on lavapipe: W1's Adam
    /// update 27.6 ms grouped against 6.3 ms as six kernels), while a GPU
    /// branches per workgroup and saves the launches. Both give the same
    /// bits where the adapter rounds every op. `KILN_GROUPED_UPDATE=1` or
    /// `=0` sets it from the environment when it is `None`.
    pub grouped_optimizer_update: Option<bool>,
    /// Whether a matrix product and the element-wise ops reading it (bias,
    /// activation) run as one generated kernel (`Backend::fuses_matmul`,
    /// native only) or as the product's kernel and a fused element-wise
    /// kernel. `None` (the default) fuses them. The same bits either way
    /// where the adapter rounds every op. `KILN_FUSE_MATMUL=1` or `=0`
    /// sets it from the environment when it is `None`.
    pub fuse_matmul_epilogue: Option<bool>,
    /// Whether a Sum, Prod, Max or Min and the element-wise group computing
    /// what it reduces (e.g. `sum(exp(x - m))`) run as one generated kernel
    /// (`Backend::fuses_reduce`, native only) or as a fused element-wise
    /// kernel and the reduction's. `None` (the default) fuses them. The
    /// same bits either way where the adapter rounds every op.
    /// `KILN_FUSE_REDUCE=1` or `=0` sets it from the environment when it is
    /// `None`.
    pub fuse_reduce_prologue: Option<bool>,
    /// Whether a dispatch whose parameter words (shapes, strides, window
    /// geometry) repeat runs a pipeline made for them, with them as WGSL
    /// constants (native only; made at the second sighting, so a training
    /// loop's steps after the first two compile nothing). `None` (the
    /// default) specialises. The same bits either way: the kernel's text is
    /// unchanged but for where its parameters come from.
    /// `KILN_WGPU_SPECIALIZE=1` or `=0` sets it from the environment when
    /// it is `None`.
    pub specialize_shapes: Option<bool>,
    /// Whether the strided element-wise kernels (binary ops, comparisons,
    /// Where, and the copies behind Permute, Expand, Slice and Concat), the
    /// folded Im2Col and the max-pool gradient take eight consecutive
    /// elements per thread (`main8` of strided.wgsl, `im2col8`,
    /// `backward8`) or one; and whether long reductions fold groups of
    /// leaves a thread without workgroup barriers (`leaf_groups`,
    /// `serial_parts`) or by workgroup trees. `None` (the default): eight
    /// and no barriers on software adapters, whose threads are SIMD lanes
    /// of a CPU (there unravelling an index costs more than the op, and a
    /// barrier far more: on SwiftShader, the browser's adapter in CI, W2's
    /// bias Add went 45 -> 21.5 ms and its step 930 -> 690-750 ms), one
    /// and workgroup trees on GPUs (neighbouring threads reading
    /// neighbouring elements). The same bits either way.
    pub eight_elements_per_thread: Option<bool>,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions {
            backends: wgpu::Backends::PRIMARY,
            power_preference: wgpu::PowerPreference::HighPerformance,
            max_storage_buffer_binding_size: None,
            max_buffer_size: None,
            max_matmul_scratch_bytes: None,
            matmul_kernel: None,
            max_storage_buffers_per_shader_stage: None,
            max_fused_ops: None,
            grouped_optimizer_update: None,
            fuse_matmul_epilogue: None,
            fuse_reduce_prologue: None,
            specialize_shapes: None,
            eight_elements_per_thread: None,
        }
    }
}

impl WgpuOptions {
    /// Options that look only at the given APIs.
    pub fn with_backends(backends: wgpu::Backends) -> WgpuOptions {
        WgpuOptions { backends, ..WgpuOptions::default() }
    }
}

/// A graphics API set from a name: "vulkan", "metal", "dx12", "gl",
/// "webgpu" (the browser's), "primary" or "all"; comma-separated names
/// combine. None for an unknown name.
pub fn parse_backends(names: &str) -> Option<wgpu::Backends> {
    let mut set = wgpu::Backends::empty();
    for name in names.split(',').map(|s| s.trim().to_ascii_lowercase()) {
        set |= match name.as_str() {
            "vulkan" | "vk" => wgpu::Backends::VULKAN,
            "metal" => wgpu::Backends::METAL,
            "dx12" | "d3d12" => wgpu::Backends::DX12,
            "gl" | "gles" | "opengl" => wgpu::Backends::GL,
            "webgpu" | "browser" => wgpu::Backends::BROWSER_WEBGPU,
            "primary" => wgpu::Backends::PRIMARY,
            "all" => wgpu::Backends::all(),
            _ => return None,
        };
    }
    Some(set)
}

/// Errors wgpu reports outside any call's return value (validation errors,
/// out-of-memory), kept until `flush` or `read` turns them into a
/// `kiln_core::Error`. wgpu's default handler would panic instead.
///
/// While a custom kernel's compilation is being checked (wasm32, see
/// `pipelines`), `check` leaves the slot alone: what the GPU reports then
/// may be the consequence of a kernel the browser refused, which the read
/// that settles the check reports with the compiler's message instead.
#[derive(Clone, Default)]
pub(crate) struct ErrorSlot {
    first: Arc<Mutex<Option<String>>>,
    held: Arc<AtomicUsize>,
}

impl ErrorSlot {
    fn record(&self, message: String) {
        let mut slot = self.first.lock().unwrap_or_else(|p| p.into_inner());
        // Keep the first: later errors are usually its consequences.
        slot.get_or_insert(message);
    }

    /// The recorded error, if any, as a backend error (and clear the slot).
    pub fn check(&self, op: &'static str) -> Result<()> {
        if self.held.load(Ordering::SeqCst) > 0 {
            return Ok(());
        }
        match self.take() {
            None => Ok(()),
            Some(message) => Err(Error::backend(op, format!("the GPU reported an error: {message}"))),
        }
    }

    /// Clear the slot, returning what it held.
    pub fn take(&self) -> Option<String> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Hold `check` back until the returned guard is dropped.
    #[cfg(target_arch = "wasm32")]
    pub fn hold(&self) -> HoldGuard {
        self.held.fetch_add(1, Ordering::SeqCst);
        HoldGuard(self.held.clone())
    }
}

/// See `ErrorSlot::hold`.
#[cfg(target_arch = "wasm32")]
pub(crate) struct HoldGuard(Arc<AtomicUsize>);

#[cfg(target_arch = "wasm32")]
impl Drop for HoldGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The device and what kiln knows about it.
pub(crate) struct Context {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    /// The limits kiln enforces: the adapter's, lowered by the options' caps.
    pub limits: wgpu::Limits,
    pub errors: ErrorSlot,
}

impl Context {
    pub async fn new(options: &WgpuOptions) -> Result<Context> {
        const OP: &str = "WgpuBackend::new";
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = options.backends;
        let instance = wgpu::Instance::new(desc);
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: options.power_preference,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::unsupported(OP, format!("no GPU adapter for backends {:?}: {e}", options.backends)))?;
        let mut limits = adapter.limits();
        if let Some(cap) = options.max_storage_buffer_binding_size {
            limits.max_storage_buffer_binding_size = limits.max_storage_buffer_binding_size.min(cap);
        }
        if let Some(cap) = options.max_buffer_size {
            limits.max_buffer_size = limits.max_buffer_size.min(cap);
        }
        if let Some(cap) = options.max_storage_buffers_per_shader_stage {
            limits.max_storage_buffers_per_shader_stage = limits.max_storage_buffers_per_shader_stage.min(cap);
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("kiln"),
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| Error::backend(OP, format!("the adapter refused to open a device: {e}")))?;
        let errors = ErrorSlot::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| sink.record(e.to_string())));
        Ok(Context { device, queue, info: adapter.get_info(), limits, errors })
    }

    /// Workgroup counts for a one-dimensional launch of `groups` workgroups,
    /// folded into x * y when x alone would pass the per-dimension limit.
    pub fn grid(&self, op: &'static str, groups: u64) -> Result<[u32; 3]> {
        let max = u64::from(self.limits.max_compute_workgroups_per_dimension.max(1));
        if groups <= max {
            return Ok([groups as u32, 1, 1]);
        }
        let y = groups.div_ceil(max);
        if y > max {
            return Err(Error::unsupported(
                op,
                format!("{groups} workgroups exceed this adapter's {max} x {max} grid"),
            ));
        }
        Ok([max as u32, y as u32, 1])
    }
}

/// One adapter as `kiln devices` lists it.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub name: String,
    /// "Vulkan", "Metal", "Dx12", "Gl", "BrowserWebGpu".
    pub backend: String,
    /// "DiscreteGpu", "IntegratedGpu", "VirtualGpu", "Cpu" (a software
    /// driver such as lavapipe), "Other".
    pub device_type: String,
    pub driver: String,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_storage_size: u32,
}

impl AdapterSummary {
    pub(crate) fn new(info: &wgpu::AdapterInfo, limits: &wgpu::Limits) -> AdapterSummary {
        AdapterSummary {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            max_buffer_size: limits.max_buffer_size,
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
            max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
        }
    }
}

/// Every adapter wgpu finds on this machine, on every API (native only: a
/// browser exposes one adapter, through `WgpuBackend::new`).
#[cfg(not(target_arch = "wasm32"))]
pub fn list_adapters() -> Vec<AdapterSummary> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::all();
    let instance = wgpu::Instance::new(desc);
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    adapters.iter().map(|a| AdapterSummary::new(&a.get_info(), &a.limits())).collect()
}
