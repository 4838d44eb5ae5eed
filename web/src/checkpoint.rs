//! Checkpoints for JavaScript: a module's or an optimizer's state as
//! safetensors bytes (`Uint8Array`), written and read by kiln-core's
//! `checkpoint` module, so the bytes are exactly native kiln's (same keys,
//! same metadata) and move freely between Rust, Node and the browser. The
//! package's entry points add file helpers (`saveCheckpoint` /
//! `loadCheckpoint`: files in Node, download/upload in a page).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use kiln_core::nn::Module;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::error::Res;
use crate::promise::promise_now;

#[wasm_bindgen]
extern "C" {
    /// safetensors bytes, once the device has copied the values out.
    #[wasm_bindgen(typescript_type = "Promise<Uint8Array>")]
    pub type BytesPromise;
}

/// A Promise of the bytes `future` produces.
pub(crate) fn bytes_promise(future: Pin<Box<dyn Future<Output = Res<Vec<u8>>>>>) -> BytesPromise {
    promise_now(future, |bytes| Ok(js_sys::Uint8Array::from(&bytes[..]).into())).unchecked_into()
}

/// `module`'s parameters and buffers, keyed as native kiln keys them.
pub(crate) fn module_state(module: Rc<dyn Module>) -> BytesPromise {
    bytes_promise(Box::pin(async move { Ok(kiln_core::checkpoint::save_state(module.as_ref()).await?) }))
}

pub(crate) fn load_module(module: &dyn Module, bytes: &[u8]) -> Res<()> {
    Ok(kiln_core::checkpoint::load_state(module, bytes)?)
}
