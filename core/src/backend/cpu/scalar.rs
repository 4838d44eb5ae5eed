//! The element traits the kernels are generic over: `Scalar` (every storage
//! type, bool as u8), `Num` (f32, f64, i32: arithmetic, wrapping for i32) and
//! `Float` (f32, f64: the transcendental functions).

use super::CpuStorage;
use crate::dtype::DType;

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
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        (v != 0.0) as u8
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        (self != 0) as u8 as f64
    }
}

/// Arithmetic: IEEE for floats, wrapping for i32. `max`/`min` propagate NaN.
pub(crate) trait Num: Scalar {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn sign(self) -> Self;
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        if self.is_nan() || o.is_nan() {
            if self.is_nan() {
                self
            } else {
                o
            }
        } else if self >= o {
            self
        } else {
            o
        }
    }
    #[inline(always)]
    fn min(self, o: Self) -> Self {
        if self.is_nan() || o.is_nan() {
            if self.is_nan() {
                self
            } else {
                o
            }
        } else if self <= o {
            self
        } else {
            o
        }
    }
    #[inline(always)]
    fn relu(self) -> Self {
        // NaN < 0 is false, so NaN passes through.
        if self < Self::ZERO {
            Self::ZERO
        } else {
            self
        }
    }
}

impl Num for i32 {
    const ZERO: Self = 0;
    const ONE: Self = 1;
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self.wrapping_sub(o)
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
    #[inline(always)]
    fn neg(self) -> Self {
        self.wrapping_neg()
    }
    #[inline(always)]
    fn abs(self) -> Self {
        self.wrapping_abs()
    }
    #[inline(always)]
    fn sign(self) -> Self {
        self.signum()
    }
}

/// Floating-point functions (erf/erfc from libm).
pub(crate) trait Float:
    Num
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn recip(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tanh(self) -> Self;
    fn erf(self) -> Self;
    fn erfc(self) -> Self;
    fn powf(self, e: Self) -> Self;
    #[inline(always)]
    fn sigmoid(self) -> Self {
        if self >= Self::ZERO {
            Self::ONE / (Self::ONE + self.neg().exp())
        } else {
            let e = self.exp();
            e / (Self::ONE + e)
        }
    }
}

macro_rules! float {
    ($t:ty, $erf:path, $erfc:path) => {
        impl Num for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn neg(self) -> Self {
                -self
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn sign(self) -> Self {
                if self > 0.0 {
                    1.0
                } else if self < 0.0 {
                    -1.0
                } else {
                    self // 0, -0 and NaN stay
                }
            }
        }
        impl Float for $t {
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn recip(self) -> Self {
                1.0 / self
            }
            #[inline(always)]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn erfc(self) -> Self {
                $erfc(self)
            }
            #[inline(always)]
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
        }
    };
}
float!(f32, libm::erff, libm::erfcf);
float!(f64, libm::erf, libm::erfc);
