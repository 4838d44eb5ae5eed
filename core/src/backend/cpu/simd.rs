//! Wider vectors for hot element-wise loops, chosen at run time.
//!
//! kiln is built for the baseline of its target (x86-64: SSE2, 4 floats per
//! vector), so a portable binary runs everywhere. `wide` runs a loop compiled
//! again with AVX-512 or AVX2 when the CPU has them. Only the vector width
//! changes: each lane does the same IEEE operations (Rust never contracts a
//! multiply and an add into an FMA, and division and square root are
//! correctly rounded at every width), so the bits are those of the baseline
//! loop. Elsewhere (wasm, other architectures) `f` runs as it is.

/// Run `f`, compiled for the widest vector extension this CPU offers. `f`
/// should be a closure marked `#[inline(always)]` that calls
/// `#[inline(always)]` loops, so that its body is compiled inside the
/// wide-vector function below rather than called from it.
#[inline(always)]
pub(crate) fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above), the only
            // requirement of calling a function compiled with it.
            return unsafe { avx512(f) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: as above, for AVX2.
            return unsafe { avx2(f) };
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}
