//! Element types and host-side data.

use crate::error::{Error, Result};

/// The element type of a tensor.
///
/// f32 is the compute type on every backend; f64 exists on the CPU so that
/// gradcheck can take finite differences without drowning in rounding; i32
/// carries indices and labels; bool carries masks (comparison results).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    I32,
    Bool,
}

impl DType {
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }
    /// Size of one element in bytes, as stored by backends (bool is one byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 => 8,
            DType::Bool => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Tensor data on the host, tagged with its element type.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
}

impl HostData {
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::I32(_) => DType::I32,
            HostData::Bool(_) => DType::Bool,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            HostData::F32(v) => v.len(),
            HostData::F64(v) => v.len(),
            HostData::I32(v) => v.len(),
            HostData::Bool(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Every element converted to f64 (bool as 0/1): for tests and reports.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            HostData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::F64(v) => v.clone(),
            HostData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
        }
    }
    /// Truncate to the first `len` elements (backends hand back whole pooled
    /// buffers, which may be longer than the tensor).
    pub fn truncate(&mut self, len: usize) {
        match self {
            HostData::F32(v) => v.truncate(len),
            HostData::F64(v) => v.truncate(len),
            HostData::I32(v) => v.truncate(len),
            HostData::Bool(v) => v.truncate(len),
        }
    }
}

/// A Rust type that can be a tensor element.
pub trait Element: Copy + Send + Sync + 'static + std::fmt::Debug {
    const DTYPE: DType;
    fn into_host(data: Vec<Self>) -> HostData;
    fn from_host(data: HostData) -> Result<Vec<Self>>;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn into_host(data: Vec<Self>) -> HostData {
                HostData::$variant(data)
            }
            fn from_host(data: HostData) -> Result<Vec<Self>> {
                match data {
                    HostData::$variant(v) => Ok(v),
                    other => Err(Error::dtype(
                        "read",
                        format!("tensor holds {} but {} was requested", other.dtype(), DType::$variant),
                    )),
                }
            }
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(i32, I32);
element!(bool, Bool);
