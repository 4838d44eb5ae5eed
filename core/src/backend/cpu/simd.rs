//! Wider vectors for the CPU's own loops (element-wise, fused, softmax, the
//! optimizer updates) on x86-64, chosen at run time.
//!
//! The crate is built for the x86-64 baseline (SSE2, 4 f32 lanes) so that
//! one binary runs on every x86-64 machine; the `gemm` crate picks its own
//! AVX2/AVX-512 micro-kernels at run time, but kiln's loops stayed at SSE2
//! (a profile of the GPT showed GELU's loops in `xmm` registers, ~11 ns per
//! element). `dispatch` runs a kernel body compiled a second and third time
//! with AVX2+FMA and with AVX-512 enabled, picked once from what the CPU
//! reports.
//!
//! Results are bit-identical on every path: the same IEEE operations run in
//! the same order on wider registers (Rust does not contract a·b + c into an
//! FMA, and none of these loops reorders a reduction by lane), which the
//! tests below and every kernel test (run on whichever path this CPU takes)
//! check.

/// A kernel body to compile once per instruction set. `run` must be
/// `#[inline(always)]`: it is inlined into each `#[target_feature]`
/// trampoline below, which is what compiles it with the wider vectors (a
/// closure would be inlined only if LLVM's cost model agreed).
pub(crate) trait Kernel {
    type Output;
    fn run(self) -> Self::Output;
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::sync::atomic::{AtomicU8, Ordering};

    use super::Kernel;

    /// 0: not detected yet, 1: baseline, 2: AVX2+FMA, 3: AVX-512.
    static LEVEL: AtomicU8 = AtomicU8::new(0);
    /// A level forced by the tests (0: none).
    static FORCED: AtomicU8 = AtomicU8::new(0);

    pub(super) fn level() -> u8 {
        let forced = FORCED.load(Ordering::Relaxed);
        if forced != 0 {
            return forced.min(detected());
        }
        detected()
    }

    fn detected() -> u8 {
        let l = LEVEL.load(Ordering::Relaxed);
        if l != 0 {
            return l;
        }
        let v3 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let v4 = v3
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq");
        let l = if v4 {
            3
        } else if v3 {
            2
        } else {
            1
        };
        LEVEL.store(l, Ordering::Relaxed);
        l
    }

    #[cfg(test)]
    pub(super) fn force(level: u8) {
        FORCED.store(level, Ordering::Relaxed);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn v3<K: Kernel>(k: K) -> K::Output {
        k.run()
    }

    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
    pub(super) unsafe fn v4<K: Kernel>(k: K) -> K::Output {
        k.run()
    }
}

/// Whether this CPU runs kiln's loops, and the `gemm` crate its
/// micro-kernels (built with its `x86-v4` feature), with AVX-512.
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86::level() == 3;
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Run `k` with the widest vectors this CPU has.
#[inline(always)]
pub(crate) fn dispatch<K: Kernel>(k: K) -> K::Output {
    #[cfg(target_arch = "x86_64")]
    match x86::level() {
        // SAFETY: `level` is 3 only when the CPU reported AVX-512 F/VL/BW/DQ,
        // AVX2 and FMA, every feature `v4` is compiled with.
        3 => return unsafe { x86::v4(k) },
        // SAFETY: `level` is 2 or more only when the CPU reported AVX2 and
        // FMA, the features `v3` is compiled with.
        2 => return unsafe { x86::v3(k) },
        _ => {}
    }
    k.run()
}

/// Run `f`, compiled for the widest vector extension this CPU offers. `f`
/// should be a closure marked `#[inline(always)]` that calls
/// `#[inline(always)]` loops, so that its body is compiled inside the
/// wide-vector functions rather than called from them (a `Kernel` needs no
/// such care: its `run` is always inlined).
#[inline(always)]
pub(crate) fn wide<R>(f: impl FnOnce() -> R) -> R {
    dispatch(Wide(f))
}

/// A closure as a `Kernel` (see `wide`).
struct Wide<F>(F);

impl<R, F: FnOnce() -> R> Kernel for Wide<F> {
    type Output = R;
    #[inline(always)]
    fn run(self) -> R {
        (self.0)()
    }
}

/// out[i] = f(x[i]): the body of the element-wise `map`.
pub(crate) struct Map<'a, T, O, F> {
    pub x: &'a [T],
    pub out: &'a mut [O],
    pub f: &'a F,
}

impl<T: Copy, O, F: Fn(T) -> O> Kernel for Map<'_, T, O, F> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        for (o, &v) in self.out.iter_mut().zip(self.x) {
            *o = (self.f)(v);
        }
    }
}

/// out[i] = f(a[i], b[i]): the body of the element-wise `zip` over
/// operands of the output's length (a binary op without broadcasting).
pub(crate) struct Zip<'a, A, B, O, F> {
    pub a: &'a [A],
    pub b: &'a [B],
    pub out: &'a mut [O],
    pub f: &'a F,
}

impl<A: Copy, B: Copy, O, F: Fn(A, B) -> O> Kernel for Zip<'_, A, B, O, F> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        for ((o, &x), &y) in self.out.iter_mut().zip(self.a).zip(self.b) {
            *o = (self.f)(x, y);
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{dispatch, x86, Map, Zip};
    use crate::op::{BinaryOp, UnaryOp, Value};

    /// Every level this CPU has gives the baseline's bits, for the ops with
    /// the longest bodies (GELU, its derivative, exp, erf, sigmoid) over a
    /// spread of inputs, specials included.
    #[test]
    fn every_level_gives_the_baseline_bits() {
        let mut x: Vec<f32> = (0..20_000).map(|i| (i as f32 - 10_000.0) * 1.37e-3).collect();
        x.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, -1e-40, 88.9, -103.9, 3.92, -1.0]);
        let ops = [
            UnaryOp::Gelu,
            UnaryOp::GeluDerivative,
            UnaryOp::Exp,
            UnaryOp::Erf,
            UnaryOp::Sigmoid,
            UnaryOp::Tanh,
            UnaryOp::Softsign,
            UnaryOp::Log,
        ];
        for op in ops {
            let f = move |v: f32| <f32 as Value>::unary(op, v);
            let run = |level: u8| {
                x86::force(level);
                let mut out = vec![0.0f32; x.len()];
                dispatch(Map { x: &x, out: &mut out, f: &f });
                x86::force(0);
                out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            };
            let base = run(1);
            for level in [2, 3] {
                assert_eq!(run(level), base, "{op:?} at level {level}");
            }
            let direct: Vec<u32> = x.iter().map(|&v| f(v).to_bits()).collect();
            assert_eq!(base, direct, "{op:?}");
        }
    }

    /// The same for binary ops through `Zip`, with operands that pair
    /// specials with ordinary values.
    #[test]
    fn zip_gives_the_baseline_bits_at_every_level() {
        let mut a: Vec<f32> = (0..5_000).map(|i| (i as f32 - 2_500.0) * 3.1e-3).collect();
        a.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, 2.0, -3.0]);
        let b: Vec<f32> = a.iter().rev().map(|&v| v * 0.7 + 0.25).collect();
        let ops = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum, BinaryOp::Pow];
        for op in ops {
            let f = move |p: f32, q: f32| <f32 as Value>::binary(op, p, q);
            let run = |level: u8| {
                x86::force(level);
                let mut out = vec![0.0f32; a.len()];
                dispatch(Zip { a: &a, b: &b, out: &mut out, f: &f });
                x86::force(0);
                out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            };
            let base = run(1);
            for level in [2, 3] {
                assert_eq!(run(level), base, "{op:?} at level {level}");
            }
            let direct: Vec<u32> = a.iter().zip(&b).map(|(&p, &q)| f(p, q).to_bits()).collect();
            assert_eq!(base, direct, "{op:?}");
        }
    }
}
