//! kiln's single error type.
//!
//! Every error names the operation that refused, says what was wrong in terms
//! of shapes and dtypes, and carries the source location of the caller's code
//! (public functions are `#[track_caller]`), so a failure deep inside a model
//! points at the line that built the bad node.

use std::fmt;
use std::panic::Location;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, broadly; `Error::kind` lets callers branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Operand shapes do not fit the operation.
    Shape,
    /// An operand has a dtype the operation does not take.
    DType,
    /// An axis, index or range lies outside the tensor.
    OutOfRange,
    /// An argument is invalid for a reason other than shape/dtype/range.
    InvalidArgument,
    /// Autograd was asked for something it cannot do (no gradient rule, a
    /// root that does not require grad, a graph already differentiated...).
    Autograd,
    /// The backend failed (device lost, allocation refused, kernel error).
    Backend,
    /// A feature that kiln does not implement (yet).
    Unsupported,
    /// Reading data from disk or parsing a dataset failed.
    Io,
}

/// Boxed: a `Result<T>` is then `T` and one pointer, so every `?` in kiln
/// moves a word rather than the whole error (-14.8 KB of the browser's wasm,
/// web/README.md, Size); errors are rare, the allocation is off the hot path.
#[derive(Clone)]
pub struct Error(Box<Inner>);

#[derive(Clone)]
struct Inner {
    kind: ErrorKind,
    op: &'static str,
    message: String,
    location: &'static Location<'static>,
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.0.kind)
            .field("op", &self.0.op)
            .field("message", &self.0.message)
            .field("location", &self.0.location)
            .finish()
    }
}

impl Error {
    #[track_caller]
    pub fn new(kind: ErrorKind, op: &'static str, message: impl Into<String>) -> Error {
        Error::boxed(kind, op, message.into(), Location::caller())
    }

    /// The one non-generic body behind `new` and its shorthands.
    #[inline(never)]
    fn boxed(kind: ErrorKind, op: &'static str, message: String, location: &'static Location<'static>) -> Error {
        Error(Box::new(Inner { kind, op, message, location }))
    }
    #[track_caller]
    pub fn shape(op: &'static str, message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Shape, op, message)
    }
    #[track_caller]
    pub fn dtype(op: &'static str, message: impl Into<String>) -> Error {
        Error::new(ErrorKind::DType, op, message)
    }
    #[track_caller]
    pub fn out_of_range(op: &'static str, message: impl Into<String>) -> Error {
        Error::new(ErrorKind::OutOfRange, op, message)
    }
    #[track_caller]
    pub fn invalid(op: &'static str, message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, op, message)
    }
    #[track_caller]
    pub fn autograd(op: &'static str, message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Autograd, op, message)
    }
    #[track_caller]
    pub fn backend(op: &'static str, message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Backend, op, message)
    }
    #[track_caller]
    pub fn unsupported(op: &'static str, message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Unsupported, op, message)
    }
    #[track_caller]
    pub fn io(op: &'static str, message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Io, op, message)
    }

    /// Re-point the error at another source location (the node's creation
    /// site, for errors found when the node runs).
    pub fn at(mut self, location: &'static Location<'static>) -> Error {
        self.0.location = location;
        self
    }

    /// Point the error at `caller` unless it already points at a line
    /// outside kiln (a user's line: the caller's own, or the site that
    /// built a node that failed when it ran). Public entry points capture
    /// `Location::caller()` and pass every error through this, so an error
    /// raised deep inside kiln — or by a `#[track_caller]` function called
    /// through a closure or a function pointer, which reports the standard
    /// library's line — still names the caller's line.
    pub fn or_at(self, caller: &'static Location<'static>) -> Error {
        if is_internal(self.0.location) {
            self.at(caller)
        } else {
            self
        }
    }

    /// The same error attributed to another op (the node whose buffer an
    /// allocation was for, rather than the allocator).
    pub fn for_op(mut self, op: &'static str) -> Error {
        self.0.op = op;
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }
    pub fn op(&self) -> &'static str {
        self.0.op
    }
    pub fn message(&self) -> &str {
        &self.0.message
    }
    pub fn location(&self) -> &'static Location<'static> {
        self.0.location
    }
}

/// Crates of this workspace, as directories of the workspace root (paths in
/// `Location`s are relative to it when kiln is built there) and as the
/// `kiln*` package directories of a registry checkout.
const KILN_DIRS: [&str; 4] = ["core/", "native/", "kernels-wgsl/", "web/"];

/// Whether `location` lies in kiln's sources or in Rust's standard library.
pub fn is_internal(location: &Location<'_>) -> bool {
    let file = location.file();
    if file.starts_with("/rustc/") || file.contains("/library/core/src/") || file.contains("/library/std/src/") {
        return true;
    }
    // This file is <root>/core/src/error.rs in the workspace, or
    // <registry>/kiln-core-<version>/src/error.rs as a dependency: the
    // directory above its crate holds kiln's other crates too.
    let here = file!();
    let crate_dir = here.strip_suffix("src/error.rs").unwrap_or(here);
    let parent = crate_dir.trim_end_matches('/').rsplit_once('/').map_or("", |(p, _)| p);
    let parent = if parent.is_empty() { String::new() } else { format!("{parent}/") };
    let Some(rest) = file.strip_prefix(parent.as_str()) else { return false };
    KILN_DIRS.iter().any(|d| rest.starts_with(d)) || (!parent.is_empty() && rest.starts_with("kiln"))
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (at {}:{}:{})",
            self.0.op,
            self.0.message,
            self.0.location.file(),
            self.0.location.line(),
            self.0.location.column()
        )
    }
}

impl std::error::Error for Error {}
