//! Fused optimizer updates (SGD with momentum/Nesterov, Adam/AdamW), in place
//! on the parameter and its state buffers (or from the parameter's old buffer
//! into a new one), elementwise, PyTorch's formulas, in wide vectors where
//! the CPU has them (`simd`).

use crate::small::SmallVec;

use super::scalar::Scalar;
use super::{with_float, CpuStorage};
use crate::backend::ParamUpdate;
use crate::dtype::DType;
use crate::error::{Error, Result};

const OP: &str = "update_param";

/// One parameter's update, its buffers borrowed from the backend's slab.
pub(super) struct Job<'a> {
    pub upd: ParamUpdate,
    pub param: &'a mut CpuStorage,
    /// The current value when it is not in `param` (copy-on-write).
    pub source: Option<&'a CpuStorage>,
    pub grad: &'a CpuStorage,
    pub state: SmallVec<[&'a mut CpuStorage; 2]>,
    pub dtype: DType,
    pub len: usize,
}

/// A chunk of one parameter's update, ready to run on any thread.
#[cfg(feature = "rayon")]
type Task<'a> = Box<dyn FnOnce() + Send + 'a>;

/// Where `chunked` puts the chunks: tasks to share among rayon's threads;
/// without rayon, nothing (each chunk runs at once).
#[cfg(feature = "rayon")]
type Tasks<'a> = Vec<Task<'a>>;
#[cfg(not(feature = "rayon"))]
type Tasks<'a> = std::marker::PhantomData<&'a ()>;

/// Run several updates as one pass (multi-tensor apply): every job is
/// checked and cut into chunks first, nothing is written unless all are
/// valid, then the chunks of all parameters run together, on rayon's
/// threads when there is enough work (one fork and join for the whole
/// optimizer step, not one per large tensor). Each element gets the same
/// arithmetic as a job run alone.
pub(super) fn update_many(jobs: Vec<Job<'_>>) -> Result<()> {
    for job in &jobs {
        check(job)?;
    }
    let mut tasks = Tasks::default();
    let mut work = 0usize;
    for job in jobs {
        work = work.saturating_add(job.len.saturating_mul(4));
        plan(job, &mut tasks)?;
    }
    run(tasks, work);
    Ok(())
}

/// What `plan` would refuse, found before any job runs (without rayon,
/// `plan` runs each job at once).
fn check(job: &Job<'_>) -> Result<()> {
    let fits = |s: &CpuStorage| s.dtype() == job.dtype && s.len() >= job.len;
    if let ParamUpdate::Adam { step: 0, .. } = job.upd {
        return Err(Error::invalid(OP, "Adam's step counts from 1"));
    }
    let states = crate::backend::checks::update_state_count(&job.upd, job.state.len())?;
    let buffers_fit = fits(job.param)
        && fits(job.grad)
        && job.source.is_none_or(fits)
        && job.state.iter().take(states).all(|s| fits(s));
    if !(job.dtype == DType::F32 || job.dtype == DType::F64) || !buffers_fit {
        return Err(Error::backend(OP, format!("a buffer is not {} x {}", job.len, job.dtype)));
    }
    Ok(())
}

#[cfg(feature = "rayon")]
fn run(tasks: Vec<Task<'_>>, work: usize) {
    if tasks.len() > 1 && work >= super::layout::PAR_THRESHOLD {
        rayon::scope(|scope| {
            for task in tasks {
                scope.spawn(move |_| task());
            }
        });
    } else {
        tasks.into_iter().for_each(|task| task());
    }
}

#[cfg(not(feature = "rayon"))]
fn run(_tasks: Tasks<'_>, _work: usize) {}

/// Add one job's chunks to `tasks` (`check` has accepted it: the step,
/// the state count, every buffer's dtype and length).
fn plan<'a>(job: Job<'a>, tasks: &mut Tasks<'a>) -> Result<()> {
    let Job { upd, param, source, grad, mut state, dtype, len } = job;
    with_float!(dtype, OP, T => {
        let short = || Error::backend(OP, format!("a buffer is not {len} x {dtype}"));
        let p = T::of_mut(param).and_then(|s| s.get_mut(..len)).ok_or_else(short)?;
        let g = T::of(grad).and_then(|s| s.get(..len)).ok_or_else(short)?;
        // Copy-on-write: the current value is read from `source` and the
        // new one written to `p` in the same pass.
        let src = match source {
            Some(s) => Some(T::of(s).and_then(|s| s.get(..len)).ok_or_else(short)?),
            None => None,
        };
        let mut st: SmallVec<[&mut [T]; 2]> = SmallVec::new();
        for s in state.drain(..) {
            st.push(T::of_mut(s).and_then(|s| s.get_mut(..len)).ok_or_else(short)?);
        }
        match upd {
            ParamUpdate::Sgd { lr, momentum, dampening, weight_decay, nesterov } => {
                let c = |v: f64| T::from_f64(v);
                let k = SgdConsts { lr: c(lr), mom: c(momentum), damp: c(1.0 - dampening), wd: c(weight_decay) };
                let (use_wd, use_mom) = (weight_decay != 0.0, momentum != 0.0);
                st.truncate(usize::from(use_mom));
                chunked(p, src, g, st, tasks, move |p, src, g, s| {
                    let v = s.first_mut().map(|v| &mut **v);
                    super::simd::wide(
                        #[inline(always)]
                        || sgd_chunk(k, use_wd, nesterov, p, src, g, v),
                    )
                });
            }
            ParamUpdate::Adam { lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, step } => {
                st.truncate(2);
                let steps = i32::try_from(step).unwrap_or(i32::MAX);
                let c = |v: f64| T::from_f64(v);
                let (step_size, rsqrt_bc2) = crate::backend::adam_step_constants(lr, beta1, beta2, steps);
                let (step_size, rsqrt_bc2) = (c(step_size), c(rsqrt_bc2));
                let (b1, b2, nb1, nb2) = (c(beta1), c(beta2), c(1.0 - beta1), c(1.0 - beta2));
                let (eps, wd) = (c(eps), c(weight_decay));
                let decay = c(1.0 - lr * weight_decay);
                let k = AdamConsts { b1, b2, nb1, nb2, step_size, rsqrt_bc2, eps, wd, decay };
                chunked(p, src, g, st, tasks, move |p, src, g, s| {
                    let (ms, vs) = s.split_at_mut(1);
                    let (m, v) = (&mut ms[0][..], &mut vs[0][..]);
                    super::simd::wide(
                        #[inline(always)]
                        || T::adam(k, decoupled_weight_decay, p, src, g, m, v),
                    )
                });
            }
        }
        Ok(())
    })
}

/// The arithmetic the update loops need, for f32 and f64.
trait UpdateFloat:
    Copy
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    fn sqrt(self) -> Self;

    /// Adam on one chunk: `adam_chunk`, or a SIMD form of it.
    #[inline(always)]
    fn adam(
        k: AdamConsts<Self>,
        decoupled: bool,
        p: &mut [Self],
        src: Option<&[Self]>,
        g: &[Self],
        m: &mut [Self],
        v: &mut [Self],
    ) {
        adam_chunk(k, decoupled, p, src, g, m, v)
    }
}
impl UpdateFloat for f32 {
    #[inline(always)]
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }

    /// In the browser build four lanes at a time (`simd::adam_f32`): the
    /// size-first wasm build does not vectorise `adam_chunk`'s loops, which
    /// took ~23 % of a W1 step there (node --cpu-prof).
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    fn adam(
        k: AdamConsts<f32>,
        decoupled: bool,
        p: &mut [f32],
        src: Option<&[f32]>,
        g: &[f32],
        m: &mut [f32],
        v: &mut [f32],
    ) {
        // A copy-on-write update copies first, then updates in place.
        if let Some(s) = src {
            let n = p.len().min(s.len());
            p[..n].copy_from_slice(&s[..n]);
        }
        simd::adam_f32(k, decoupled, p, g, m, v)
    }
}
impl UpdateFloat for f64 {
    #[inline(always)]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
}

/// Each element of `p` becomes `f` of its current value, read from `src`
/// when given (a copy-on-write update: the old value stays where a graph
/// still reads it, the new one goes to a fresh buffer, in one pass with no
/// copy) or from `p` itself, and of the element's index. One loop per case,
/// so each vectorises.
#[inline(always)]
fn map_param<T: Copy>(p: &mut [T], src: Option<&[T]>, mut f: impl FnMut(usize, T) -> T) {
    match src {
        Some(s) => {
            for (i, (p, &s)) in p.iter_mut().zip(s).enumerate() {
                *p = f(i, s);
            }
        }
        None => {
            for (i, p) in p.iter_mut().enumerate() {
                *p = f(i, *p);
            }
        }
    }
}

/// SGD's per-step constants in the element type.
#[derive(Clone, Copy)]
struct SgdConsts<T> {
    lr: T,
    mom: T,
    damp: T,
    wd: T,
}

/// SGD (with momentum `v` when given) on one chunk, PyTorch's formulas. The
/// choices are made once outside the loops (see `adam_chunk`).
#[inline(always)]
fn sgd_chunk<T: UpdateFloat>(
    k: SgdConsts<T>,
    use_wd: bool,
    nesterov: bool,
    p: &mut [T],
    src: Option<&[T]>,
    g: &[T],
    v: Option<&mut [T]>,
) {
    let n = p.len().min(g.len()).min(src.map_or(usize::MAX, <[T]>::len));
    let (p, g, src) = (&mut p[..n], &g[..n], src.map(|s| &s[..n]));
    let SgdConsts { lr, mom, damp, wd } = k;
    match (v, use_wd) {
        (None, true) => map_param(p, src, |i, p| p - lr * (g[i] + wd * p)),
        (None, false) => map_param(p, src, |i, p| p - lr * g[i]),
        (Some(v), _) => {
            let v = &mut v[..n];
            let mut step = |i: usize, p: T| {
                let g = if use_wd { g[i] + wd * p } else { g[i] };
                v[i] = mom * v[i] + damp * g;
                let g = if nesterov { g + mom * v[i] } else { v[i] };
                p - lr * g
            };
            map_param(p, src, &mut step)
        }
    }
}

/// Adam's per-step constants in the element type.
#[derive(Clone, Copy)]
struct AdamConsts<T> {
    b1: T,
    b2: T,
    nb1: T,
    nb2: T,
    /// lr / (1 − β1ᵗ).
    step_size: T,
    /// 1 / √(1 − β2ᵗ).
    rsqrt_bc2: T,
    eps: T,
    wd: T,
    decay: T,
}

/// Adam on one chunk. The constants arrive by value and the weight-decay
/// choice is made once outside the loops: with them read through the
/// closure's captures inside one loop, the compiler could not prove the
/// writes to `p`, `m`, `v` left them alone and emitted a scalar loop
/// reloading them per element (29 % of a W1 step). Each element is
/// computed by the same operations in the same order either way, so the
/// vector loops give the same bits as the scalar one.
#[inline(always)]
fn adam_chunk<T: UpdateFloat>(
    k: AdamConsts<T>,
    decoupled: bool,
    p: &mut [T],
    src: Option<&[T]>,
    g: &[T],
    m: &mut [T],
    v: &mut [T],
) {
    let n = p.len().min(g.len()).min(m.len()).min(v.len()).min(src.map_or(usize::MAX, <[T]>::len));
    let (p, g, m, v, src) = (&mut p[..n], &g[..n], &mut m[..n], &mut v[..n], src.map(|s| &s[..n]));
    let AdamConsts { b1, b2, nb1, nb2, step_size, rsqrt_bc2, eps, wd, decay } = k;
    // `p` is the weight after any decoupled decay, `g` the gradient after
    // any L2 term. See `backend::adam_step_constants` for the update's form.
    let step = |m: &mut T, v: &mut T, p: T, g: T| {
        *m = b1 * *m + nb1 * g;
        *v = b2 * *v + nb2 * g * g;
        p - step_size * (*m / (v.sqrt() * rsqrt_bc2 + eps))
    };
    if decoupled {
        map_param(p, src, |i, p| step(&mut m[i], &mut v[i], p * decay, g[i]));
    } else {
        map_param(p, src, |i, p| step(&mut m[i], &mut v[i], p, g[i] + wd * p));
    }
}

/// Adam with wasm's 128-bit SIMD. Each lane does the same IEEE operations
/// in the same order as `adam_chunk` (no fused multiply-add), so the bits
/// equal the scalar loop's (the web suite checks them against an f32
/// reference computed in JS).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd {
    use core::arch::wasm32::*;

    use super::{adam_chunk, AdamConsts};

    pub(super) fn adam_f32(
        k: AdamConsts<f32>,
        decoupled: bool,
        p: &mut [f32],
        g: &[f32],
        m: &mut [f32],
        v: &mut [f32],
    ) {
        let n = p.len().min(g.len()).min(m.len()).min(v.len());
        let body = n - n % 4;
        let AdamConsts { b1, b2, nb1, nb2, step_size, rsqrt_bc2, eps, wd, decay } = k;
        let [b1, b2, nb1, nb2, step_size, rsqrt_bc2, eps, wd, decay] =
            [b1, b2, nb1, nb2, step_size, rsqrt_bc2, eps, wd, decay].map(|x| f32x4_splat(x));
        let (pp, gp, mp, vp) = (p.as_mut_ptr(), g.as_ptr(), m.as_mut_ptr(), v.as_mut_ptr());
        for i in (0..body).step_by(4) {
            // SAFETY: i + 4 <= body <= n, and each of the four slices holds
            // at least n elements, so every load and store stays inside its
            // slice; v128_load/v128_store need no alignment; p, m and v are
            // distinct &mut slices, so no store changes another's lanes.
            unsafe {
                let (pi, gi, mi, vi) =
                    (pp.add(i) as *mut v128, gp.add(i) as *const v128, mp.add(i) as *mut v128, vp.add(i) as *mut v128);
                let (mut pv, mut gv) = (v128_load(pi), v128_load(gi));
                if decoupled {
                    pv = f32x4_mul(pv, decay);
                } else {
                    gv = f32x4_add(gv, f32x4_mul(wd, pv));
                }
                let mv = f32x4_add(f32x4_mul(b1, v128_load(mi)), f32x4_mul(nb1, gv));
                let vv = f32x4_add(f32x4_mul(b2, v128_load(vi)), f32x4_mul(f32x4_mul(nb2, gv), gv));
                let denom = f32x4_add(f32x4_mul(f32x4_sqrt(vv), rsqrt_bc2), eps);
                let stepv = f32x4_mul(step_size, f32x4_div(mv, denom));
                v128_store(mi, mv);
                v128_store(vi, vv);
                v128_store(pi, f32x4_sub(pv, stepv));
            }
        }
        adam_chunk(k, decoupled, &mut p[body..n], None, &g[body..n], &mut m[body..n], &mut v[body..n]);
    }
}

/// Add `f` on aligned chunks of the parameter, its source (when given),
/// gradient and state slices to `tasks`: several chunks when the parameter
/// is large enough to share among rayon's threads, else one.
fn chunked<'a, T: Copy + Send + Sync + 'a>(
    p: &'a mut [T],
    src: Option<&'a [T]>,
    g: &'a [T],
    st: SmallVec<[&'a mut [T]; 2]>,
    tasks: &mut Tasks<'a>,
    f: impl Fn(&mut [T], Option<&[T]>, &[T], &mut [&mut [T]]) + Send + Copy + 'a,
) {
    #[cfg(not(feature = "rayon"))]
    {
        // One thread: run now (`update_many` checked every job first).
        let _ = tasks;
        let mut st = st;
        f(p, src, g, &mut st);
    }
    #[cfg(feature = "rayon")]
    {
        let whole = p.len();
        let chunk =
            if whole * 4 >= super::layout::PAR_THRESHOLD { super::layout::chunk_len(whole * 4) / 4 } else { whole };
        let (mut p, mut g, mut src, mut st) = (p, g, src, st);
        loop {
            let n = chunk.min(p.len());
            let (hp, tp) = std::mem::take(&mut p).split_at_mut(n);
            let (hg, tg) = g.split_at(n);
            let hsrc = src.map(|s| {
                let (h, t) = s.split_at(n);
                src = Some(t);
                h
            });
            let mut hs: SmallVec<[&mut [T]; 2]> = SmallVec::new();
            for s in st.iter_mut() {
                let (h, t) = std::mem::take(s).split_at_mut(n);
                hs.push(h);
                *s = t;
            }
            (p, g) = (tp, tg);
            tasks.push(Box::new(move || f(hp, hsrc, hg, &mut hs)));
            if p.is_empty() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::{Backend, BufferId};
    use crate::dtype::HostData;

    fn buf(be: &CpuBackend, v: &[f64]) -> BufferId {
        let id = be.alloc(DType::F64, v.len() + 3).unwrap();
        be.upload(id, &HostData::F64(v.to_vec())).unwrap();
        id
    }
    fn get(be: &CpuBackend, id: BufferId, n: usize) -> Vec<f64> {
        pollster::block_on(be.read(id, DType::F64, n)).unwrap().to_f64_vec()
    }
    fn close(a: &[f64], b: &[f64]) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-12, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn sgd_plain_and_momentum() {
        let be = CpuBackend::new();
        let (p, g) = (buf(&be, &[1.0, -2.0]), buf(&be, &[0.5, 0.25]));
        let sgd = ParamUpdate::Sgd { lr: 0.1, momentum: 0.0, dampening: 0.0, weight_decay: 0.01, nesterov: false };
        be.update_param(&sgd, p, g, &[], DType::F64, 2).unwrap();
        // g' = g + 0.01 p = [0.51, 0.23]; p -= 0.1 g'
        close(&get(&be, p, 2), &[1.0 - 0.051, -2.0 - 0.023]);

        let (p, g, v) = (buf(&be, &[1.0]), buf(&be, &[0.5]), buf(&be, &[0.2]));
        let sgd = ParamUpdate::Sgd { lr: 0.1, momentum: 0.9, dampening: 0.1, weight_decay: 0.0, nesterov: true };
        be.update_param(&sgd, p, g, &[v], DType::F64, 1).unwrap();
        // v = 0.9*0.2 + 0.9*0.5 = 0.63; g = 0.5 + 0.9*0.63 = 1.067; p = 1 - 0.1067
        close(&get(&be, v, 1), &[0.63]);
        close(&get(&be, p, 1), &[1.0 - 0.1067]);
        // Missing state is an error.
        assert!(be.update_param(&sgd, p, g, &[], DType::F64, 1).is_err());
        // Naming a buffer twice is an error, not aliasing.
        assert!(be.update_param(&sgd, p, g, &[p], DType::F64, 1).is_err());
        assert_eq!(get(&be, p, 1).len(), 1, "buffers are back in the slab");
    }

    /// Copy-on-write updates (`update_param_from`: read the value from one
    /// buffer, write the new one into another) give the bits of copying and
    /// updating in place, leave the source as it was, on the serial path
    /// and on the chunked parallel one; a buffer named twice is refused.
    #[test]
    fn update_from_a_source_equals_copy_then_update() {
        let be = CpuBackend::new();
        let updates = [
            ParamUpdate::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.1,
                decoupled_weight_decay: true,
                step: 3,
            },
            ParamUpdate::Sgd { lr: 0.1, momentum: 0.9, dampening: 0.0, weight_decay: 0.01, nesterov: true },
            ParamUpdate::Sgd { lr: 0.1, momentum: 0.0, dampening: 0.0, weight_decay: 0.0, nesterov: false },
        ];
        for upd in updates {
            for n in [5, 300_001] {
                let vals = |seed: u32| -> HostData {
                    HostData::F32(
                        (0..n)
                            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
                            .collect(),
                    )
                };
                let up = |v: &HostData| {
                    let id = be.alloc(DType::F32, n + 3).unwrap();
                    be.upload(id, v).unwrap();
                    id
                };
                let read = |id| pollster::block_on(be.read(id, DType::F32, n)).unwrap();
                let nonneg = |v: HostData| HostData::F32(v.to_f64_vec().iter().map(|&x| x.abs() as f32).collect());
                // Adam's second moment is never negative.
                let (p0, g0, s0, s1) = (vals(1), vals(2), vals(3), nonneg(vals(4)));
                let bits = |v: HostData| -> Vec<u64> { v.to_f64_vec().iter().map(|x| x.to_bits()).collect() };
                let states = checks_state_count(&upd);
                // In place on a copy.
                let (p, g) = (up(&p0), up(&g0));
                let st: Vec<BufferId> = [&s0, &s1][..states].iter().map(|v| up(v)).collect();
                be.update_param(&upd, p, g, &st, DType::F32, n).unwrap();
                // From the source into a fresh buffer.
                let (src, dst, g2) = (up(&p0), be.alloc(DType::F32, n + 3).unwrap(), up(&g0));
                let st2: Vec<BufferId> = [&s0, &s1][..states].iter().map(|v| up(v)).collect();
                be.update_param_from(&upd, src, dst, g2, &st2, DType::F32, n).unwrap();
                assert!(read(dst).to_f64_vec().iter().all(|x| x.is_finite()));
                assert_eq!(bits(read(dst)), bits(read(p)), "{upd:?} n={n}");
                for (a, b) in st.iter().zip(&st2) {
                    assert_eq!(bits(read(*a)), bits(read(*b)), "{upd:?} n={n} state");
                }
                assert_eq!(read(src), p0, "the source is left as it was");
                assert!(be.update_param_from(&upd, dst, dst, g2, &st2, DType::F32, n).is_err());
                assert_eq!(read(dst).len(), n, "buffers are back in the slab");
            }
        }
    }

    /// The loops run through `simd::wide` (AVX-512 or AVX2 where the CPU
    /// has them) give the bits of the same loops at the build's baseline
    /// width, in place and from a source, for every Adam and SGD variant.
    #[test]
    fn wide_loops_give_the_bits_of_baseline_loops() {
        let n = 1_037;
        let wave = |k: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * k).sin()).collect() };
        let (p0, g0, m0) = (wave(0.37), wave(0.11), wave(0.05));
        let v0: Vec<f32> = wave(0.07).iter().map(|x| x * x).collect();
        let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
        let adam = AdamConsts {
            b1: 0.9f32,
            b2: 0.999,
            nb1: 0.1,
            nb2: 0.001,
            step_size: 3e-3,
            rsqrt_bc2: 7.0,
            eps: 1e-8,
            wd: 0.01,
            decay: 0.99999,
        };
        let sgd = SgdConsts { lr: 0.1f32, mom: 0.9, damp: 0.8, wd: 0.01 };
        for from_src in [false, true] {
            let src = from_src.then_some(&p0[..]);
            // (p, m, v) after one update of each kind, baseline then wide.
            let run = |wide: bool, case: usize| {
                let (mut p, mut m, mut v) = (if from_src { vec![0.0; n] } else { p0.clone() }, m0.clone(), v0.clone());
                let mut go = || match case {
                    0 | 1 => adam_chunk(adam, case == 1, &mut p, src, &g0, &mut m, &mut v),
                    2 | 3 => sgd_chunk(sgd, case == 3, false, &mut p, src, &g0, None),
                    _ => sgd_chunk(sgd, true, case == 5, &mut p, src, &g0, Some(&mut v)),
                };
                if wide {
                    super::super::simd::wide(
                        #[inline(always)]
                        || go(),
                    )
                } else {
                    go()
                }
                [bits(&p), bits(&m), bits(&v)]
            };
            for case in 0..6 {
                assert_eq!(run(false, case), run(true, case), "case {case}, from a source: {from_src}");
            }
        }
    }

    fn checks_state_count(upd: &ParamUpdate) -> usize {
        match upd {
            ParamUpdate::Adam { .. } => 2,
            ParamUpdate::Sgd { momentum, .. } => usize::from(*momentum != 0.0),
        }
    }

    #[test]
    fn adam_and_adamw_one_step() {
        let be = CpuBackend::new();
        for decoupled in [false, true] {
            let (p, g) = (buf(&be, &[1.0, -0.5]), buf(&be, &[0.2, -0.4]));
            let (m, v) = (buf(&be, &[0.0, 0.0]), buf(&be, &[0.0, 0.0]));
            let adam = ParamUpdate::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.1,
                decoupled_weight_decay: decoupled,
                step: 1,
            };
            be.update_param(&adam, p, g, &[m, v], DType::F64, 2).unwrap();
            let (p0, g0) = ([1.0f64, -0.5], [0.2f64, -0.4]);
            let mut want_p = vec![];
            let mut want_m = vec![];
            let mut want_v = vec![];
            for i in 0..2 {
                let (mut pp, gg) =
                    if decoupled { (p0[i] * (1.0 - 0.01 * 0.1), g0[i]) } else { (p0[i], g0[i] + 0.1 * p0[i]) };
                let mm = 0.1 * gg;
                let vv = 0.001 * gg * gg;
                let mhat = mm / (1.0 - 0.9);
                let vhat = vv / (1.0 - 0.999);
                pp -= 0.01 * mhat / (vhat.sqrt() + 1e-8);
                want_p.push(pp);
                want_m.push(mm);
                want_v.push(vv);
            }
            close(&get(&be, p, 2), &want_p);
            close(&get(&be, m, 2), &want_m);
            close(&get(&be, v, 2), &want_v);
            // Step 1 of Adam moves each weight by about lr * sign(g').
            let moved: Vec<f64> = get(&be, p, 2).iter().zip(&p0).map(|(a, b)| (a - b).abs()).collect();
            assert!(moved.iter().all(|&d| (d - 0.01).abs() < 2e-3), "{moved:?}");
        }
    }

    #[test]
    fn large_updates_match_small_ones() {
        // The chunked parallel path gives the same bits as element by element.
        let be = CpuBackend::new();
        let n = 100_003;
        let p0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let g0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let mk = |v: &[f32]| {
            let id = be.alloc(DType::F32, v.len()).unwrap();
            be.upload(id, &HostData::F32(v.to_vec())).unwrap();
            id
        };
        let (p, g, m, v) = (mk(&p0), mk(&g0), mk(&vec![0.0; n]), mk(&vec![0.0; n]));
        let adam = ParamUpdate::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled_weight_decay: false,
            step: 3,
        };
        be.update_param(&adam, p, g, &[m, v], DType::F32, n).unwrap();
        let big = pollster::block_on(be.read(p, DType::F32, n)).unwrap();
        for i in [0, 1, 50_000, n - 1] {
            let (ps, gs, ms, vs) = (mk(&[p0[i]]), mk(&[g0[i]]), mk(&[0.0]), mk(&[0.0]));
            be.update_param(&adam, ps, gs, &[ms, vs], DType::F32, 1).unwrap();
            let one = pollster::block_on(be.read(ps, DType::F32, 1)).unwrap();
            let (HostData::F32(b), HostData::F32(o)) = (&big, &one) else { unreachable!() };
            assert_eq!(b[i].to_bits(), o[0].to_bits());
        }
    }

    #[test]
    fn vector_loops_give_the_bits_of_the_scalar_formula() {
        // The Adam loops vectorise; every element must still get exactly
        // what the formula computed one f32 at a time gives.
        let be = CpuBackend::new();
        let n = 1037;
        let wave = |k: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * k).sin()).collect() };
        let (p0, g0, m0) = (wave(0.37), wave(0.11), wave(0.05));
        let v0: Vec<f32> = wave(0.07).iter().map(|x| x * x).collect();
        let mk = |v: &[f32]| {
            let id = be.alloc(DType::F32, v.len()).unwrap();
            be.upload(id, &HostData::F32(v.to_vec())).unwrap();
            id
        };
        let read = |id| match pollster::block_on(be.read(id, DType::F32, n)).unwrap() {
            HostData::F32(v) => v,
            _ => unreachable!(),
        };
        for decoupled in [false, true] {
            let (p, g, m, v) = (mk(&p0), mk(&g0), mk(&m0), mk(&v0));
            let (lr, b1, b2, eps, wd, step) = (1e-3f64, 0.9f64, 0.999f64, 1e-8f64, 0.01f64, 7);
            let adam = ParamUpdate::Adam {
                lr,
                beta1: b1,
                beta2: b2,
                eps,
                weight_decay: wd,
                decoupled_weight_decay: decoupled,
                step,
            };
            be.update_param(&adam, p, g, &[m, v], DType::F32, n).unwrap();
            let (gp, gm, gv) = (read(p), read(m), read(v));
            let c = |x: f64| x as f32;
            // lr / (1 − β1ᵗ) and 1 / √(1 − β2ᵗ), in f64, rounded once.
            let bc1 = 1.0 - b1.powi(step as i32);
            let (step_size, rsqrt_bc2) = (c(lr / bc1), c(1.0 / (1.0 - b2.powi(step as i32)).sqrt()));
            for i in 0..n {
                let (mut pp, mut mm, mut vv) = (p0[i], m0[i], v0[i]);
                let gg = if decoupled {
                    pp *= c(1.0 - lr * wd);
                    g0[i]
                } else {
                    g0[i] + c(wd) * pp
                };
                mm = c(b1) * mm + c(1.0 - b1) * gg;
                vv = c(b2) * vv + c(1.0 - b2) * gg * gg;
                pp -= step_size * (mm / (vv.sqrt() * rsqrt_bc2 + c(eps)));
                let want = [pp.to_bits(), mm.to_bits(), vv.to_bits()];
                assert_eq!([gp[i].to_bits(), gm[i].to_bits(), gv[i].to_bits()], want, "element {i}");
            }
        }
    }
}
