//! Threads for the browser's multi-threaded build (wasm32 with `atomics`:
//! one shared linear memory, one instance of the module per Web Worker): a
//! fixed set of workers, started from JavaScript, that share the parts of
//! one job at a time with the thread that called kiln. Only the f32 GEMM
//! uses them (`gemm_rows`): it is ~3/4 of a training step's time in the
//! browser; the other kernels stay single-threaded.
//!
//! Why not rayon (wasm-bindgen-rayon): kiln is called from a page's main
//! thread, and browsers do not let the main thread block
//! (`memory.atomic.wait` traps there). rayon's caller blocks on a latch
//! (Mutex + Condvar) until the pool has run its job, and its sleeping
//! workers are woken under a Mutex the caller may find held; so rayon works
//! only when all of kiln runs inside a dedicated Worker (wasm-bindgen-rayon's
//! README says so). Here the caller never waits: it takes parts itself and
//! then spins until the parts the workers took are done; only the workers
//! sleep, in `memory.atomic.wait32`, which Workers may use. Nothing here
//! decides a sum: each part is a whole set of output rows computed as one
//! thread would compute them, so results do not depend on the thread count.

use core::arch::wasm32::{memory_atomic_notify, memory_atomic_wait32};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::backend::checks::Mat;

/// Workers registered (`register_worker`) and running `worker_loop`.
static WORKERS: AtomicU32 = AtomicU32::new(0);
/// Bumped for each job; idle workers sleep on it.
static WAKE: AtomicI32 = AtomicI32::new(0);
/// The job being shared: generation << 32 | next unclaimed part << 16 |
/// parts. One word, so a part is claimed (compare-exchange) only in the
/// generation it belongs to: a worker that wakes late cannot claim a part
/// of the next job with the previous job's count.
static STATE: AtomicU64 = AtomicU64::new(0);
/// Parts finished in the current job.
static DONE: AtomicU32 = AtomicU32::new(0);
/// The job's function: the address of a `&(dyn Fn(usize) + Sync)` on the
/// caller's stack (in the shared memory), valid until the caller returns,
/// which it does only when every part is done.
static JOB: AtomicUsize = AtomicUsize::new(0);
/// Parts the Workers have run (not the caller): the tests read it to see
/// that the Workers took part.
static WORKER_PARTS: AtomicU32 = AtomicU32::new(0);
/// A job is being shared: a second caller (a part calling back in) runs its
/// parts alone.
static BUSY: AtomicBool = AtomicBool::new(false);

/// Spins of an idle worker before it sleeps: a training step's GEMMs come
/// a few hundred microseconds apart, and waking a sleeping Worker costs
/// tens of microseconds.
const IDLE_SPINS: u32 = 20_000;

/// Threads that run kiln's GEMM: the caller and the registered workers.
pub fn count() -> usize {
    WORKERS.load(Ordering::Acquire) as usize + 1
}

/// Called once by each Worker after it instantiated the module on the
/// shared memory, before `worker_loop`; counted at once, so that a
/// `Kiln` created after the workers reported ready sees them.
pub fn register_worker() {
    WORKERS.fetch_add(1, Ordering::AcqRel);
}

/// A Worker's life: run parts of jobs; sleep when there are none. Never
/// returns (the Worker is ended by terminating it).
pub fn worker_loop() -> ! {
    loop {
        let wake = WAKE.load(Ordering::Acquire);
        let ran = run_parts();
        if ran > 0 {
            WORKER_PARTS.fetch_add(ran, Ordering::Relaxed);
        }
        let mut spins = 0;
        while WAKE.load(Ordering::Acquire) == wake && spins < IDLE_SPINS {
            std::hint::spin_loop();
            spins += 1;
        }
        // SAFETY: WAKE is a live static i32 in the shared memory; the wait
        // returns at once if it no longer holds `wake` (a job came since),
        // else when `share` notifies. Only Workers get here; a Worker may
        // block.
        unsafe { memory_atomic_wait32(WAKE.as_ptr(), wake, -1) };
    }
}

/// Parts of jobs the Workers have run since the module started.
pub fn worker_parts() -> u32 {
    WORKER_PARTS.load(Ordering::Relaxed)
}

/// Claim and run parts of the current job until none is left; how many
/// this thread ran.
fn run_parts() -> u32 {
    let mut ran = 0;
    loop {
        let state = STATE.load(Ordering::Acquire);
        let (next, parts) = ((state >> 16) & 0xffff, state & 0xffff);
        if next >= parts {
            return ran;
        }
        if STATE.compare_exchange_weak(state, state + (1 << 16), Ordering::AcqRel, Ordering::Acquire).is_err() {
            continue;
        }
        // SAFETY: the claim succeeded in the generation `state` names, so
        // that job's caller is still waiting for this part (DONE counts it
        // below) and the `&dyn Fn` JOB points to, published before STATE
        // (Release, read here with Acquire), is alive.
        let f = unsafe { *(JOB.load(Ordering::Acquire) as *const &(dyn Fn(usize) + Sync)) };
        f(next as usize);
        DONE.fetch_add(1, Ordering::AcqRel);
        ran += 1;
    }
}

/// f(0), …, f(parts − 1), shared with the workers; returns when all are
/// done. The calling thread never blocks (it may be a page's main thread).
pub(super) fn share(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    if parts <= 1 || parts > 0xffff || WORKERS.load(Ordering::Acquire) == 0 || BUSY.swap(true, Ordering::Acquire) {
        (0..parts).for_each(f);
        return;
    }
    JOB.store(&f as *const &(dyn Fn(usize) + Sync) as usize, Ordering::Relaxed);
    DONE.store(0, Ordering::Relaxed);
    let generation = (STATE.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xffff_ffff;
    STATE.store(generation << 32 | parts as u64, Ordering::Release);
    WAKE.fetch_add(1, Ordering::AcqRel);
    // SAFETY: WAKE is a live static in the shared memory; notify wakes the
    // Workers sleeping on it (any thread may notify).
    unsafe { memory_atomic_notify(WAKE.as_ptr() as *mut i32, u32::MAX) };
    run_parts();
    while DONE.load(Ordering::Acquire) < parts as u32 {
        std::hint::spin_loop();
    }
    BUSY.store(false, Ordering::Release);
}

/// m·n·k from which a product is shared (about 0.1–0.2 ms on one thread):
/// below it, waking the workers costs more than it saves.
const SHARE_FROM: usize = 1 << 20;
/// Rows per part at least (a multiple of the kernel's 4-row tiles).
const MIN_ROWS: usize = 16;

/// The output pointer, shared by the parts: each writes its own rows.
#[derive(Clone, Copy)]
struct Rows(*mut f32);
// SAFETY: `gemm_rows`' parts write disjoint row ranges of dst, which
// outlives `share`.
unsafe impl Send for Rows {}
unsafe impl Sync for Rows {}

impl Rows {
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// dst (row-major a.rows × b.cols) = a × b by `gemm`, the rows of the output
/// cut into parts run on the threads. Each part is `gemm` on its rows, and
/// `gemm` computes an element the same way whatever rows it is given
/// (simd_gemm.rs: a sum over k in order, not tied to the tiling of m), so
/// the bits are those of one call.
pub(super) fn gemm_rows(
    a: &Mat,
    b: &Mat,
    lhs: &[f32],
    rhs: &[f32],
    dst: &mut [f32],
    gemm: fn(&Mat, &Mat, &[f32], &[f32], &mut [f32]),
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let threads = count();
    let work = m.saturating_mul(n).saturating_mul(k);
    if threads < 2 || work < SHARE_FROM || m < 2 * MIN_ROWS || dst.len() < m * n {
        return gemm(a, b, lhs, rhs, dst);
    }
    // Two parts per thread, so a thread the machine delays leaves less
    // behind; whole 4-row tiles.
    let rows = m.div_ceil(2 * threads).max(MIN_ROWS).next_multiple_of(4);
    let parts = m.div_ceil(rows);
    let out = Rows(dst.as_mut_ptr());
    share(parts, &|p| {
        let i0 = p * rows;
        let r = rows.min(m - i0);
        // SAFETY: part p writes rows i0..i0 + r of dst, elements
        // i0·n .. (i0 + r)·n, inside dst (len >= m·n, checked above) and
        // disjoint from every other part's; dst is borrowed mutably for
        // the whole of `share`, which returns after the last part.
        let d = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(i0 * n), r * n) };
        gemm(&Mat { rows: r, ..*a }, b, &lhs[i0 * a.rs..], rhs, d);
    });
}
