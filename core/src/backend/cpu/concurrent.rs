//! Several small kernels at once (the executor's parallel branches): each
//! kernel is the one `run` would call, on its own rayon task, so its result
//! is bit-identical; only kernels too small to use every thread themselves
//! are offered (`kernel_work`), which is where running them side by side
//! gains.

use crate::small::SmallVec;

use super::layout::PAR_THRESHOLD;
use super::matmul::PAR_GEMM_WORK;
use super::{CpuBackend, CpuStorage};
use crate::backend::{Concurrency, KernelCall};
use crate::error::Result;
use crate::op::{Family, Op};

pub(super) fn concurrency() -> Option<Concurrency> {
    let threads = rayon::current_num_threads();
    // Handing work to another thread costs tens of microseconds on a busy
    // machine (measured: ~25 µs per rayon::join on the 2-core CI box), so
    // only batches of well over that are worth it; looking for branches
    // beside kernels under half a microsecond costs more than it finds.
    (threads > 1).then_some(Concurrency { max_batch: 32, min_node_work: 500, min_batch_work: 60_000 })
}

/// The kernel's time alone on one thread, in rough nanoseconds, when it
/// stays on one thread (below the sizes at which the kernels themselves go
/// parallel).
pub(super) fn kernel_work(op: &Op, inputs: &[&[usize]], output: &[usize]) -> Option<usize> {
    let numel = |d: &[usize]| d.iter().fold(1usize, |a, &n| a.saturating_mul(n));
    let out = numel(output);
    let moved = || inputs.iter().map(|d| numel(d)).sum::<usize>().saturating_add(out);
    let info = op.info();
    // (estimate, size at which the kernel parallelises itself)
    let (nanos, parallel_from) = match (*op, info.family) {
        (Op::MatMul { transpose_a, .. }, _) => {
            let a = inputs.first()?;
            let k = if transpose_a { a.len().checked_sub(2).map(|i| a[i]) } else { a.last().copied() }?;
            // GEMM micro-kernels: about 8 multiply-adds a nanosecond.
            let macs = out.saturating_mul(k);
            (macs / 8, (macs < PAR_GEMM_WORK).then_some(()))
        }
        (_, Family::Leaf) => return None,
        (_, Family::Elementwise) => {
            let cost = info.elementwise.map_or(1, |e| e.cost as usize);
            let work = out.saturating_mul(cost);
            (work / 4 + out / 2, (work < PAR_THRESHOLD).then_some(()))
        }
        (_, Family::Reduce) => {
            let n = numel(inputs.first()?);
            (n / 2, (n.saturating_mul(2) < PAR_THRESHOLD).then_some(()))
        }
        // User code: serial unless it brings its own threads.
        (_, Family::Custom) => (moved(), Some(())),
        _ => (moved() / 2, (moved() < PAR_THRESHOLD).then_some(())),
    };
    parallel_from.map(|()| nanos)
}

pub(super) fn run_many(be: &CpuBackend, calls: &[KernelCall<'_>]) -> Vec<Result<()>> {
    let mut slab = be.slab.borrow_mut();
    // Every output leaves the slab while the kernels run, as in `run` (a
    // buffer given twice, or also as an input, is then missing: refused,
    // never aliased).
    let mut outputs: Vec<Result<CpuStorage>> = calls
        .iter()
        .map(|c| {
            slab.get_mut(c.output.buffer.0 as usize)
                .and_then(Option::take)
                .ok_or_else(|| CpuBackend::missing(c.op.name(), c.output.buffer))
        })
        .collect();
    let portable = be.portable;
    let results: Vec<Result<()>> = {
        let slab = &*slab;
        let run = |call: &KernelCall<'_>, storage: &mut Result<CpuStorage>| -> Result<()> {
            let storage = storage.as_mut().map_err(|e| e.clone())?;
            CpuBackend::run_taken(slab, call, storage, portable)
        };
        // One group of calls per thread, balanced by estimated work (the
        // largest first, each to the lightest group); this thread runs the
        // first group itself, so a batch costs one hand-off per extra thread.
        let threads = rayon::current_num_threads().clamp(1, calls.len());
        let work: Vec<usize> = calls
            .iter()
            .map(|c| {
                let dims: SmallVec<[&[usize]; 4]> = c.inputs.iter().map(|t| t.dims).collect();
                kernel_work(&c.op, &dims, c.output.dims).unwrap_or(0)
            })
            .collect();
        let mut by_work: Vec<usize> = (0..calls.len()).collect();
        by_work.sort_by_key(|&i| std::cmp::Reverse(work[i]));
        let mut load = vec![0usize; threads];
        let mut group_of = vec![0usize; calls.len()];
        for i in by_work {
            let g = (0..threads).min_by_key(|&g| load[g]).unwrap_or(0);
            group_of[i] = g;
            load[g] += work[i];
        }
        let mut groups: Vec<Vec<(usize, &mut Result<CpuStorage>)>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, storage) in outputs.iter_mut().enumerate() {
            groups[group_of[i]].push((i, storage));
        }
        let mut results: Vec<Option<Result<()>>> = (0..calls.len()).map(|_| None).collect();
        let mut group_results: Vec<Vec<(usize, Result<()>)>> = (0..threads).map(|_| Vec::new()).collect();
        let (mine, others) = groups.split_first_mut().expect("at least one group");
        let (my_results, other_results) = group_results.split_first_mut().expect("at least one group");
        rayon::in_place_scope(|scope| {
            for (group, out) in others.iter_mut().zip(other_results.iter_mut()) {
                let run = &run;
                scope.spawn(move |_| {
                    for (i, storage) in group.iter_mut() {
                        out.push((*i, run(&calls[*i], storage)));
                    }
                });
            }
            for (i, storage) in mine.iter_mut() {
                my_results.push((*i, run(&calls[*i], storage)));
            }
        });
        for (i, r) in group_results.into_iter().flatten() {
            results[i] = Some(r);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(crate::error::Error::backend("run_many", "a kernel did not run"))))
            .collect()
    };
    for (call, storage) in calls.iter().zip(outputs) {
        if let Ok(s) = storage {
            slab[call.output.buffer.0 as usize] = Some(s);
        }
    }
    results
}
