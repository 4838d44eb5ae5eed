//! kiln-web: kiln for JavaScript and TypeScript, through wasm-bindgen.
//!
//! ```js
//! import { init, Kiln, crossEntropy, Adam, loadDigits } from 'kiln-web';
//! await init();
//! const kiln = await Kiln.create();            // WebGPU when available, else CPU
//! const model = kiln.mlp([64, 64, 10]);
//! const opt = new Adam(model, 1e-2);
//! const g = kiln.graph();
//! g.reset();                                   // one graph per step
//! const loss = crossEntropy(model.forward(g.tensor(x, [n, 64])), g.tensor(y, [n]));
//! opt.zeroGrad(); loss.backward(); opt.step();
//! console.log(await loss.item());
//! ```
//!
//! Layout: `session` (device choice, factories), `graph` (per-step graphs
//! and stale-handle detection), `tensor_api` (the operators), `nn`
//! (parameters, modules, losses, optimizers), `data` (embedded digits),
//! `promise` (reads as Promises), `error` (errors as JS exceptions).

pub mod checkpoint;
pub mod custom;
pub mod data;
pub mod error;
pub mod graph;
pub mod layers;
pub mod nn;
pub mod optim;
pub mod promise;
pub mod session;
pub mod tensor_api;
pub mod tensor_nn;

pub use data::Dataset;
pub use error::{KilnError, Res};
pub use graph::{Graph, Tensor};
pub use nn::{Adam, Linear, Param, Sequential, Sgd};
pub use session::Kiln;

use wasm_bindgen::prelude::*;

/// The kiln-web version.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// The names of kiln's primitive ops (kiln-core's op table, `Op::kinds()`),
/// as `Tensor.op`, `Graph.countOps` and error messages spell them.
#[wasm_bindgen(js_name = opKinds)]
pub fn op_kinds() -> Vec<String> {
    kiln_core::Op::kind_names().into_iter().map(String::from).collect()
}

/// `Tensor` handles alive in wasm memory. Each holds a few bytes until it
/// is freed: `graph.reset()` and `graph.free()` free the handles of the
/// step they end (the package's entry points do this), `free()` frees one,
/// and the garbage collector frees any other that becomes unreachable.
#[wasm_bindgen(js_name = liveTensorHandles)]
pub fn live_tensor_handles() -> u32 {
    graph::live_handles()
}

/// The size of the module's linear memory in bytes (it grows, never
/// shrinks); 0 outside WebAssembly.
#[wasm_bindgen(js_name = wasmMemoryBytes)]
pub fn wasm_memory_bytes() -> f64 {
    #[cfg(target_arch = "wasm32")]
    return (core::arch::wasm32::memory_size(0) * 65536) as f64;
    #[cfg(not(target_arch = "wasm32"))]
    return 0.0;
}

/// Runs when the module loads: in builds with std's usual panics
/// (`KILN_WEB_NIGHTLY=0`), has a Rust panic (a kiln bug, never bad input)
/// printed to the console before the wasm trap. (gemm is no longer told to
/// use its SIMD kernels: simd128 builds multiply f32 by kiln-core's own,
/// `backend/cpu/simd_gemm.rs`.)
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen(start)]
pub fn start() {
    // Built with panic=immediate-abort (scripts/build.mjs) a panic traps at
    // once and no hook runs: none is linked.
    #[cfg(not(panic = "immediate-abort"))]
    std::panic::set_hook(Box::new(|info| {
        web_sys::console::error_1(&format!("kiln-web panicked (this is a bug in kiln): {info}").into());
    }));
}

/// The multi-threaded build (wasm32 with shared memory, `pkg/web-threads/`):
/// what index.js and the thread Workers (npm/thread-worker.js) call to start
/// the CPU backend's GEMM threads. Names starting with `__` are not part of
/// the package's API (build.mjs leaves them out of the entry points).
#[cfg(all(target_arch = "wasm32", target_feature = "atomics", target_feature = "simd128"))]
mod threads {
    use wasm_bindgen::prelude::*;

    /// The compiled module and its shared memory, posted to each Worker.
    #[wasm_bindgen(js_name = __kilnThreadModule)]
    pub fn module() -> js_sys::Array {
        js_sys::Array::of2(&wasm_bindgen::module(), &wasm_bindgen::memory())
    }

    /// In a Worker, once its instance is up: count it as a thread.
    #[wasm_bindgen(js_name = __kilnThreadRegister)]
    pub fn register() {
        kiln_core::backend::cpu::threads::register_worker();
    }

    /// GEMM parts the Workers (not the calling thread) have run: the
    /// tests check that the Workers take part.
    #[wasm_bindgen(js_name = __kilnThreadParts)]
    pub fn parts() -> u32 {
        kiln_core::backend::cpu::threads::worker_parts()
    }

    /// In a Worker: run GEMM parts for good (never returns).
    #[wasm_bindgen(js_name = __kilnThreadRun)]
    pub fn run() {
        kiln_core::backend::cpu::threads::worker_loop()
    }
}

#[cfg(test)]
mod tests;
