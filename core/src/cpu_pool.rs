//! Running a program on the CPU backend's own threads.
//!
//! The CPU backend splits kernels over rayon's pool. A program that calls
//! kiln from its own main thread has one thread more than the pool: while
//! the main thread builds the next graph or plans a step, the pool's
//! workers that just finished a kernel spin and yield for a while before
//! they sleep, and on a machine with as many cores as workers they take
//! turns with the main thread for the same cores. Running the whole loop on
//! one of the pool's workers instead leaves exactly as many busy threads as
//! cores: that worker does the serial work and takes part in every
//! parallel kernel it starts, as PyTorch's main thread is one of its
//! OpenMP threads. Measured on a 2-core machine, the char-level GPT's
//! training step: 4–10 % faster (docs/performance.md).

/// Runs `work` on a thread of the CPU backend's pool and returns its
/// result; the calling thread sleeps until it is done. Without the `rayon`
/// feature (the browser) it runs `work` in place.
///
/// ```
/// let sum = kiln_core::on_cpu_pool(|| (1..=4).sum::<u32>());
/// assert_eq!(sum, 10);
/// ```
pub fn on_cpu_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    #[cfg(feature = "rayon")]
    {
        // `scope` called from outside the pool runs its closure on a worker
        // (a call from inside the pool runs it in place).
        rayon::scope(|_| work())
    }
    #[cfg(not(feature = "rayon"))]
    {
        work()
    }
}

#[cfg(test)]
mod tests {
    use super::on_cpu_pool;

    #[test]
    fn work_runs_once_and_returns_its_value() {
        let mut runs = 0;
        let v = on_cpu_pool(|| {
            runs += 1;
            "done"
        });
        assert_eq!((v, runs), ("done", 1));
    }

    #[cfg(feature = "rayon")]
    #[test]
    fn work_runs_on_a_pool_thread_and_nested_calls_run_in_place() {
        assert!(rayon::current_thread_index().is_none(), "the test itself is not on the pool");
        let (outer, inner) = on_cpu_pool(|| {
            let outer = rayon::current_thread_index();
            (outer, on_cpu_pool(rayon::current_thread_index))
        });
        assert!(outer.is_some(), "the work ran on a pool thread");
        assert_eq!(inner, outer, "a nested call runs on the same thread");
    }
}
