//! Choosing a device: `Device::best()`, `KILN_DEVICE`, names on the command line.

use kiln_core::{Device, Error, Result};
use kiln_wgsl::{list_adapters, parse_backends, AdapterSummary, WgpuBackend, WgpuOptions};

/// The environment variable that overrides `Device::best()`.
pub const DEVICE_ENV: &str = "KILN_DEVICE";

/// Device names `from_name` accepts.
pub const DEVICE_NAMES: &str = "best, cpu, cpu-portable, wgpu, vulkan, metal, dx12, gl";

/// Device selection for native programs (`use kiln::prelude::*` brings it in).
pub trait DeviceSelection: Sized {
    /// `KILN_DEVICE` if set (exactly that device, or an error); otherwise a
    /// hardware GPU through wgpu if one works, else the CPU. A software
    /// rasterizer (e.g. Mesa's lavapipe) is not chosen automatically: kiln's
    /// own CPU backend is faster than a CPU pretending to be a GPU.
    fn best() -> Result<Self>;
    /// "cpu", "cpu-portable" (the CPU in portable numerics: the browser
    /// build's bits, see `CpuNumerics`), "wgpu" (any GPU API), "vulkan",
    /// "metal", "dx12", "gl", or "best".
    fn from_name(name: &str) -> Result<Self>;
    /// A wgpu device with explicit options.
    fn wgpu(options: WgpuOptions) -> Result<Self>;
}

impl DeviceSelection for Device {
    fn best() -> Result<Device> {
        if let Ok(name) = std::env::var(DEVICE_ENV) {
            return Device::from_name(&name)
                .map_err(|e| Error::invalid("Device::best", format!("{DEVICE_ENV}={name}: {}", e.message())));
        }
        let options = WgpuOptions::default();
        if let Ok(backend) = pollster::block_on(WgpuBackend::new(options)) {
            if backend.adapter_info().device_type != kiln_wgsl::wgpu::DeviceType::Cpu {
                return Ok(Device::from_backend(backend));
            }
        }
        Ok(Device::cpu())
    }

    fn from_name(name: &str) -> Result<Device> {
        match name.trim().to_ascii_lowercase().as_str() {
            "best" => Device::best(),
            "cpu" => Ok(Device::cpu()),
            "cpu-portable" => Ok(Device::cpu_with(kiln_core::CpuNumerics::Portable)),
            "wgpu" | "gpu" => Device::wgpu(WgpuOptions::with_backends(kiln_wgsl::wgpu::Backends::all())),
            api => match parse_backends(api) {
                Some(backends) => Device::wgpu(WgpuOptions::with_backends(backends)),
                None => Err(Error::invalid("Device", format!("unknown device '{name}'; use one of: {DEVICE_NAMES}"))),
            },
        }
    }

    fn wgpu(options: WgpuOptions) -> Result<Device> {
        Ok(Device::from_backend(pollster::block_on(WgpuBackend::new(options))?))
    }
}

/// Every wgpu adapter on this machine (for `kiln devices`).
pub fn adapters() -> Vec<AdapterSummary> {
    list_adapters()
}
