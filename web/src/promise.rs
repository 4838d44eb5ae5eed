//! Reads as Promises that never block the page.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use wasm_bindgen::prelude::*;

use crate::error::Res;

#[wasm_bindgen]
extern "C" {
    /// Values read back from a tensor or parameter.
    #[wasm_bindgen(typescript_type = "Promise<Float32Array | Int32Array | Float64Array | Uint8Array>")]
    pub type ArrayPromise;
    #[wasm_bindgen(typescript_type = "Promise<number>")]
    pub type NumberPromise;
}

/// A Promise for `future`, which is polled once right away: work that can
/// happen synchronously (running the graph, starting the device copy)
/// happens before control returns to JavaScript, and a future that is
/// already done gives an already-settled Promise.
pub(crate) fn promise_now<T: 'static>(
    mut future: Pin<Box<dyn Future<Output = Res<T>>>>,
    map: fn(T) -> Res<JsValue>,
) -> js_sys::Promise {
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(result) => match result.and_then(map) {
            Ok(v) => js_sys::Promise::resolve(&v),
            Err(e) => js_sys::Promise::reject(&e.into()),
        },
        Poll::Pending => wasm_bindgen_futures::future_to_promise(async move {
            let value = future.await.map_err(JsValue::from)?;
            map(value).map_err(JsValue::from)
        }),
    }
}
