//! The element traits the kernels are generic over: `Scalar` (every storage
//! type, bool as u8), `Num` (f32, f64, i32: arithmetic, wrapping for i32) and
//! `Float` (f32, f64).

use super::CpuStorage;
use crate::backend::checks::Mat;
use crate::dtype::DType;
use crate::op::{BinaryOp, Value};

pub(crate) trait Scalar: Copy + Send + Sync + PartialOrd + Default + std::fmt::Debug + 'static {
    const DTYPE: DType;
    fn of(s: &CpuStorage) -> Option<&[Self]>;
    fn of_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    /// Conversion as `Cast` defines it: float to i32 like Rust `as`
    /// (truncate, saturate, NaN to 0), to bool as `!= 0`.
    fn from_f64(v: f64) -> Self;
    /// Exact for every storage type (bool as 0/1).
    fn to_f64(self) -> f64;
    fn is_nan(self) -> bool {
        false
    }
    /// `if c != 0 { a } else { b }`, bit for bit, written with masks so
    /// that a loop over it reads both values and vectorises as a blend.
    /// As a branch or a plain select LLVM reads only the chosen value, which
    /// it vectorised as a gather per vector (measured: a fused Where over
    /// [128, 512] spent most of its time in `vgatherqps`).
    fn select(c: u8, a: Self, b: Self) -> Self;
}

/// `select` on the bits of a type: a mask of all ones where `c != 0`.
macro_rules! select_bits {
    ($bits:ty, $to:expr, $from:expr) => {
        #[inline(always)]
        fn select(c: u8, a: Self, b: Self) -> Self {
            let m = <$bits>::from(c != 0).wrapping_neg();
            $from(($to(a) & m) | ($to(b) & !m))
        }
    };
}

macro_rules! scalar {
    ($t:ty, $variant:ident, $dtype:ident) => {
        fn of(s: &CpuStorage) -> Option<&[Self]> {
            match s {
                CpuStorage::$variant(v) => Some(v),
                _ => None,
            }
        }
        fn of_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
            match s {
                CpuStorage::$variant(v) => Some(v),
                _ => None,
            }
        }
    };
}

impl Scalar for f32 {
    const DTYPE: DType = DType::F32;
    scalar!(f32, F32, F32);
    select_bits!(u32, f32::to_bits, f32::from_bits);
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}
impl Scalar for f64 {
    const DTYPE: DType = DType::F64;
    scalar!(f64, F64, F64);
    select_bits!(u64, f64::to_bits, f64::from_bits);
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}
impl Scalar for i32 {
    const DTYPE: DType = DType::I32;
    scalar!(i32, I32, I32);
    select_bits!(u32, |v: i32| v as u32, |v: u32| v as i32);
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as i32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
}
impl Scalar for u8 {
    const DTYPE: DType = DType::Bool;
    scalar!(u8, Bool, Bool);
    select_bits!(u8, |v: u8| v, |v: u8| v);
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        (v != 0.0) as u8
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        (self != 0) as u8 as f64
    }
}

/// Arithmetic the reductions, products and index kernels need: IEEE for
/// floats, wrapping for i32. `max`/`min` propagate NaN. (The element-wise
/// functions are `op::Value`, the op table's per-element definitions.)
pub(crate) trait Num: Scalar + Value {
    const ZERO: Self;
    const ONE: Self;
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Self::binary(BinaryOp::Add, self, o)
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        Self::binary(BinaryOp::Mul, self, o)
    }
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        Self::binary(BinaryOp::Maximum, self, o)
    }
    #[inline(always)]
    fn min(self, o: Self) -> Self {
        Self::binary(BinaryOp::Minimum, self, o)
    }
}

impl Num for i32 {
    const ZERO: Self = 0;
    const ONE: Self = 1;
}
impl Num for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}
impl Num for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}

/// f32 and f64: what the float-only kernels (matmul, pooling) need.
pub(crate) trait Float:
    Num
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    /// dst = a × b by a kernel of this build's own (the caller checked the
    /// shapes), or false where there is none and the caller multiplies.
    #[inline(always)]
    fn own_gemm(_a: &Mat, _b: &Mat, _lhs: &[Self], _rhs: &[Self], _dst: &mut [Self]) -> bool {
        false
    }
}
impl Float for f32 {
    /// The browser build's SIMD kernel (`simd_gemm`), in place of gemm's.
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    fn own_gemm(a: &Mat, b: &Mat, lhs: &[f32], rhs: &[f32], dst: &mut [f32]) -> bool {
        // The multi-threaded browser build shares the rows among its Web
        // Workers (`threads`); the same bits as one call.
        #[cfg(target_feature = "atomics")]
        super::threads::gemm_rows(a, b, lhs, rhs, dst, super::simd_gemm::gemm_f32);
        #[cfg(not(target_feature = "atomics"))]
        super::simd_gemm::gemm_f32(a, b, lhs, rhs, dst);
        true
    }
}
impl Float for f64 {}

#[cfg(test)]
mod tests {
    use super::Scalar;

    /// `select` keeps the chosen value's bits (NaN payloads, −0, extremes)
    /// for every storage type, and any nonzero condition means true.
    #[test]
    fn select_keeps_the_chosen_bits() {
        let nan = f32::from_bits(0x7fc0_1234);
        for (a, b) in [(nan, -0.0f32), (-0.0, f32::INFINITY), (f32::MIN_POSITIVE, -f32::MAX)] {
            for c in [0u8, 1, 2, 255] {
                let want = if c != 0 { a } else { b };
                assert_eq!(f32::select(c, a, b).to_bits(), want.to_bits(), "{c} {a} {b}");
            }
        }
        let nan = f64::from_bits(0xfff8_0000_dead_beef);
        assert_eq!(f64::select(1, nan, 0.0).to_bits(), nan.to_bits());
        assert_eq!(f64::select(0, nan, -0.0).to_bits(), (-0.0f64).to_bits());
        assert_eq!((i32::select(7, i32::MIN, -1), i32::select(0, i32::MIN, -1)), (i32::MIN, -1));
        assert_eq!((u8::select(1, 0, 1), u8::select(0, 0, 1)), (0, 1));
    }
}
