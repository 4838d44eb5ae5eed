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

#[derive(Clone, Debug)]
pub struct Error {
    kind: ErrorKind,
    op: &'static str,
    message: String,
    location: &'static Location<'static>,
}

impl Error {
    #[track_caller]
    pub fn new(kind: ErrorKind, op: &'static str, message: impl Into<String>) -> Error {
        Error { kind, op, message: message.into(), location: Location::caller() }
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
        self.location = location;
        self
    }

    /// The same error attributed to another op (the node whose buffer an
    /// allocation was for, rather than the allocator).
    pub fn for_op(mut self, op: &'static str) -> Error {
        self.op = op;
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn op(&self) -> &'static str {
        self.op
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    pub fn location(&self) -> &'static Location<'static> {
        self.location
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (at {}:{}:{})",
            self.op,
            self.message,
            self.location.file(),
            self.location.line(),
            self.location.column()
        )
    }
}

impl std::error::Error for Error {}
