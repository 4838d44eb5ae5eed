//! The `Kiln` object: which device this page trains on, and the factories
//! for everything that lives on it.
//!
//! Device choice happens once, at `Kiln.create()`:
//! 1. `navigator.gpu` exists and `requestAdapter()` gives an adapter, and
//!    this build has the `webgpu` feature → the wgpu backend (kiln-wgsl) on
//!    WebGPU;
//! 2. otherwise → the single-threaded CPU backend, with `fallbackReason`
//!    saying why (no `navigator.gpu`, no adapter, the adapter failed, or a
//!    build without the `webgpu` feature).
//!
//! Node.js has no WebGPU, so it always gets the CPU.

use kiln_core::Device;
use wasm_bindgen::prelude::*;

use crate::error::{KilnError, Res};
use crate::graph::Graph;
use crate::nn::{Linear, Param, Sequential};
use crate::tensor_api::{count, host_from_js, seed_arg, uints, HostArray, IntList};

/// kiln on one device. Create with `await Kiln.create()`.
#[wasm_bindgen]
pub struct Kiln {
    device: Device,
    kind: &'static str,
    info: String,
    fallback: Option<String>,
    adapter: Option<String>,
}

/// What the browser offers, found without using it.
#[derive(Clone, Debug, PartialEq)]
pub enum WebGpuProbe {
    /// No `navigator.gpu`: no WebGPU in this environment.
    Missing,
    /// `navigator.gpu` exists but `requestAdapter()` gave null.
    NoAdapter,
    /// An adapter exists (its description).
    Adapter(String),
    /// Asking failed (the error).
    Failed(String),
}

impl Kiln {
    /// The CPU device (native tests, and the fallback).
    pub fn cpu() -> Kiln {
        Kiln::on_cpu(Some("the CPU was requested".into()), None)
    }

    fn on_cpu(fallback: Option<String>, adapter: Option<String>) -> Kiln {
        let device = Device::cpu();
        let info = device.name();
        Kiln { device, kind: "cpu", info, fallback, adapter }
    }

    pub fn core_device(&self) -> &Device {
        &self.device
    }
}

#[wasm_bindgen]
impl Kiln {
    /// Start kiln. `device`: 'auto' (default: WebGPU when available, else
    /// CPU), 'cpu', or 'webgpu' (throws when WebGPU cannot be used).
    /// Read `device`, `deviceInfo` and `fallbackReason` to see what you got.
    pub async fn create(device: Option<String>) -> Res<Kiln> {
        let preference = device.unwrap_or_else(|| "auto".into());
        match preference.as_str() {
            "cpu" => Ok(Kiln::cpu()),
            "auto" | "webgpu" => {
                let probe = probe_webgpu().await;
                let adapter = match &probe {
                    WebGpuProbe::Adapter(a) => Some(a.clone()),
                    _ => None,
                };
                let reason = match probe {
                    WebGpuProbe::Missing => "navigator.gpu is missing: this environment has no WebGPU".to_string(),
                    WebGpuProbe::NoAdapter => "navigator.gpu.requestAdapter() returned no adapter".to_string(),
                    WebGpuProbe::Failed(e) => format!("asking for a WebGPU adapter failed: {e}"),
                    WebGpuProbe::Adapter(a) => match start_webgpu(a.clone()).await {
                        Ok(kiln) => return Ok(kiln),
                        Err(e) => format!("a WebGPU adapter exists ({a}) but {e}"),
                    },
                };
                if preference == "webgpu" {
                    return Err(KilnError::new(
                        "Backend",
                        "Kiln.create",
                        format!("Kiln.create: WebGPU was requested but {reason}"),
                    ));
                }
                Ok(Kiln::on_cpu(Some(reason), adapter))
            }
            other => Err(KilnError::argument(
                "Kiln.create",
                format!("unknown device '{other}'; use 'auto', 'webgpu' or 'cpu'"),
            )),
        }
    }

    /// 'webgpu' or 'cpu'.
    #[wasm_bindgen(getter)]
    pub fn device(&self) -> String {
        self.kind.to_string()
    }

    /// The backend's description: the WebGPU adapter, or the CPU path.
    #[wasm_bindgen(getter, js_name = deviceInfo)]
    pub fn device_info(&self) -> String {
        self.info.clone()
    }

    /// Why the CPU is used, when it is; undefined on WebGPU.
    #[wasm_bindgen(getter, js_name = fallbackReason)]
    pub fn fallback_reason(&self) -> Option<String> {
        self.fallback.clone()
    }

    /// The WebGPU adapter the browser offered, if it offered one (also when
    /// kiln fell back to the CPU).
    #[wasm_bindgen(getter, js_name = webgpuAdapter)]
    pub fn webgpu_adapter(&self) -> Option<String> {
        self.adapter.clone()
    }

    /// Whether this build can use WebGPU at all (the `webgpu` feature).
    #[wasm_bindgen(getter, js_name = webgpuBuild)]
    pub fn webgpu_build(&self) -> bool {
        cfg!(feature = "webgpu")
    }

    /// Device buffers in use (parameters, optimizer state, live graph values):
    /// watch it to check that `free()` and `reset()` release memory.
    #[wasm_bindgen(getter, js_name = liveBuffers)]
    pub fn live_buffers(&self) -> u32 {
        self.device.stats().live_buffers as u32
    }

    /// A new graph for per-step computation on this device.
    pub fn graph(&self) -> Graph {
        Graph::create(&self.device)
    }

    /// A trainable parameter holding `data` (float) with `shape`.
    pub fn param(&self, name: String, data: &HostArray, shape: &IntList) -> Res<Param> {
        let dims: Vec<usize> = uints("param", shape)?.into_iter().map(|d| d as usize).collect();
        let inner = kiln_core::Param::from_host(&self.device, &name, host_from_js("param", data)?, &dims)?;
        Ok(Param { inner })
    }

    /// A Linear layer (PyTorch's initialisation, drawn from `seed`).
    #[allow(non_snake_case)]
    pub fn linear(&self, inFeatures: f64, outFeatures: f64, bias: Option<bool>, seed: Option<f64>) -> Res<Linear> {
        const OP: &str = "linear";
        let layer = kiln_core::nn::Linear::new(
            &self.device,
            count(OP, "inFeatures", inFeatures)?,
            count(OP, "outFeatures", outFeatures)?,
            bias.unwrap_or(true),
            seed_arg(OP, seed.unwrap_or(0.0))?,
        )?;
        Ok(Linear { inner: std::rc::Rc::new(layer) })
    }

    /// A multi-layer perceptron: Linear layers of `widths` with `activation`
    /// (default 'relu') between them; the same model as kiln's Rust
    /// `Sequential::mlp(widths, activation, seed)`.
    pub fn mlp(&self, widths: &IntList, activation: Option<String>, seed: Option<f64>) -> Res<Sequential> {
        let widths: Vec<usize> = uints("mlp", widths)?.into_iter().map(|d| d as usize).collect();
        self.mlp_native(&widths, activation.as_deref().unwrap_or("relu"), seed_arg("mlp", seed.unwrap_or(0.0))?)
    }

    /// An empty Sequential; `add()` layers to it.
    pub fn sequential(&self) -> Sequential {
        Sequential::empty()
    }
}

impl Kiln {
    pub fn mlp_native(&self, widths: &[usize], activation: &str, seed: u64) -> Res<Sequential> {
        let act = crate::nn::parse_activation("mlp", activation)?;
        let model = kiln_core::nn::Sequential::mlp(&self.device, widths, act, seed)?;
        Ok(Sequential::from_core(model))
    }
}

/// What WebGPU this environment offers.
#[cfg(target_arch = "wasm32")]
async fn probe_webgpu() -> WebGpuProbe {
    use js_sys::{Function, Reflect};
    use wasm_bindgen::JsCast;
    let global = js_sys::global();
    let navigator = Reflect::get(&global, &"navigator".into()).unwrap_or(JsValue::UNDEFINED);
    if navigator.is_undefined() || navigator.is_null() {
        return WebGpuProbe::Missing;
    }
    let gpu = Reflect::get(&navigator, &"gpu".into()).unwrap_or(JsValue::UNDEFINED);
    if gpu.is_undefined() || gpu.is_null() {
        return WebGpuProbe::Missing;
    }
    let request = match Reflect::get(&gpu, &"requestAdapter".into()).map(|f| f.dyn_into::<Function>()) {
        Ok(Ok(f)) => f,
        _ => return WebGpuProbe::Failed("navigator.gpu.requestAdapter is not a function".into()),
    };
    let promise = match request.call0(&gpu) {
        Ok(p) => js_sys::Promise::from(p),
        Err(e) => return WebGpuProbe::Failed(format!("{e:?}")),
    };
    let adapter = match wasm_bindgen_futures::JsFuture::from(promise).await {
        Ok(a) => a,
        Err(e) => return WebGpuProbe::Failed(format!("{e:?}")),
    };
    if adapter.is_null() || adapter.is_undefined() {
        return WebGpuProbe::NoAdapter;
    }
    let info = Reflect::get(&adapter, &"info".into()).unwrap_or(JsValue::UNDEFINED);
    let field =
        |name: &str| Reflect::get(&info, &name.into()).ok().and_then(|v| v.as_string()).filter(|s| !s.is_empty());
    let parts: Vec<String> =
        ["vendor", "architecture", "device", "description"].iter().filter_map(|n| field(n)).collect();
    WebGpuProbe::Adapter(if parts.is_empty() { "unnamed adapter".into() } else { parts.join(", ") })
}

#[cfg(not(target_arch = "wasm32"))]
async fn probe_webgpu() -> WebGpuProbe {
    WebGpuProbe::Missing
}

/// One small training step (forward, cross-entropy, backward, Adam) on
/// `device` and on the CPU; the losses and updated weights must agree. A
/// GPU path that fails here would fail the user's model later: better to
/// start on the CPU and say why.
pub async fn self_test(device: &Device) -> Result<(), String> {
    async fn run(device: &Device) -> kiln_core::Result<Vec<f32>> {
        use kiln_core::nn::{cross_entropy, Activation, Module, Sequential};
        use kiln_core::optim::{Adam, Optimizer};
        let model = Sequential::mlp(device, &[4, 8, 3], Activation::Relu, 11)?;
        let mut adam = Adam::new(model.parameters(), 0.1)?;
        let mut graph = kiln_core::Graph::new(device);
        let x: Vec<f32> = (0..20).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let y = [0i32, 2, 1, 2, 0];
        let mut out = Vec::new();
        for _ in 0..2 {
            graph.reset();
            let xt = graph.tensor_from(&x, &[5, 4])?;
            let yt = graph.tensor_from(&y, &[5])?;
            let logits = model.forward(xt)?;
            let loss = cross_entropy(logits, yt)?.add(logits.softmax(-1)?.max_all()?.mul(0.0)?)?;
            adam.zero_grad();
            loss.backward()?;
            adam.step()?;
            out.push(loss.item().await? as f32);
        }
        for p in model.parameters() {
            out.extend(p.value().await?.to_f64_vec().into_iter().map(|v| v as f32));
        }
        Ok(out)
    }
    let got = run(device).await.map_err(|e| e.to_string())?;
    let want = run(&Device::cpu()).await.map_err(|e| format!("on the CPU: {e}"))?;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if !((g - w).abs() <= 1e-3 * (1.0 + w.abs())) {
            return Err(format!("value {i} is {g}, the CPU gives {w}"));
        }
    }
    Ok(())
}

/// The WebGPU device through kiln-wgsl.
#[cfg(all(feature = "webgpu", target_arch = "wasm32"))]
async fn start_webgpu(adapter: String) -> Result<Kiln, String> {
    let options = kiln_wgsl::WgpuOptions::with_backends(kiln_wgsl::wgpu::Backends::BROWSER_WEBGPU);
    let backend =
        kiln_wgsl::WgpuBackend::new(options).await.map_err(|e| format!("starting the wgpu backend failed: {e}"))?;
    let s = backend.summary();
    // wgpu's summary has no name on the browser's WebGPU; the adapter's
    // vendor, architecture and description come from the probe.
    let name = if s.name.trim().is_empty() { adapter } else { format!("{} [{adapter}]", s.name) };
    let info = format!(
        "webgpu: {} ({}, {}{})",
        name,
        s.backend,
        s.device_type,
        if s.driver.is_empty() { String::new() } else { format!(", {}", s.driver) }
    );
    let device = Device::from_backend(backend);
    self_test(&device).await.map_err(|e| format!("kiln's WebGPU self-test failed, so the CPU is used: {e}"))?;
    Ok(Kiln { device, kind: "webgpu", info: info.clone(), fallback: None, adapter: Some(info) })
}

#[cfg(not(all(feature = "webgpu", target_arch = "wasm32")))]
async fn start_webgpu(_adapter: String) -> Result<Kiln, String> {
    Err("this build of kiln-web has no WebGPU backend (cargo feature 'webgpu' off)".into())
}
