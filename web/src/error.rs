//! Errors as JavaScript sees them.
//!
//! Every failure reaches JS as a thrown `Error` (name `"KilnError"`,
//! `instanceof KilnError` in the package's entry points) whose `message` is
//! kiln_core::Error's "op: what was wrong", with the broad `kind` ("Shape",
//! "DType", ..., "StaleTensor") and the refusing `op` as extra properties.
//! The Rust source location that kiln-core's `Display` appends is left out:
//! for a JS caller it names kiln's own code (or Rust's standard library,
//! when the call went through a closure), never the user's line; the JS
//! stack trace (`error.stack`) points at the user's call.

use wasm_bindgen::JsValue;

/// An error on its way to JavaScript. Plain Rust data, so native tests can
/// inspect it (`error.message`, `.kind`, `.op` through `Deref`); it becomes
/// a JS `Error` only at the wasm-bindgen boundary. Boxed, as kiln-core's
/// `Error` is: a `Res<T>` is `T` and one pointer, which keeps every `?` of
/// the bindings small (web/README.md, Size).
#[derive(Clone, Debug, PartialEq)]
pub struct KilnError(Box<KilnErrorData>);

/// What a `KilnError` says.
#[derive(Clone, Debug, PartialEq)]
pub struct KilnErrorData {
    pub message: String,
    pub kind: &'static str,
    pub op: &'static str,
}

impl std::ops::Deref for KilnError {
    type Target = KilnErrorData;
    fn deref(&self) -> &KilnErrorData {
        &self.0
    }
}

pub type Res<T> = Result<T, KilnError>;

impl KilnError {
    pub fn new(kind: &'static str, op: &'static str, message: impl Into<String>) -> KilnError {
        KilnError::boxed(kind, op, message.into())
    }

    /// The one non-generic body behind `new`.
    #[inline(never)]
    fn boxed(kind: &'static str, op: &'static str, message: String) -> KilnError {
        KilnError(Box::new(KilnErrorData { message, kind, op }))
    }

    /// An argument JavaScript passed does not have the expected type.
    pub fn argument(op: &'static str, message: impl Into<String>) -> KilnError {
        KilnError::new("InvalidArgument", op, format!("{op}: {}", message.into()))
    }
}

impl std::fmt::Display for KilnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<kiln_core::Error> for KilnError {
    fn from(e: kiln_core::Error) -> KilnError {
        KilnError::boxed(kind_name(e.kind()), e.op(), format!("{}: {}", e.op(), e.message()))
    }
}

fn kind_name(kind: kiln_core::ErrorKind) -> &'static str {
    use kiln_core::ErrorKind::*;
    match kind {
        Shape => "Shape",
        DType => "DType",
        OutOfRange => "OutOfRange",
        InvalidArgument => "InvalidArgument",
        Autograd => "Autograd",
        Backend => "Backend",
        Unsupported => "Unsupported",
        Io => "Io",
    }
}

impl From<KilnError> for JsValue {
    fn from(e: KilnError) -> JsValue {
        let error = js_sys::Error::new(&e.message);
        error.set_name("KilnError");
        let _ = js_sys::Reflect::set(&error, &JsValue::from_str("kind"), &JsValue::from_str(e.kind));
        let _ = js_sys::Reflect::set(&error, &JsValue::from_str("op"), &JsValue::from_str(e.op));
        error.into()
    }
}
