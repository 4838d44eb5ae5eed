//! Strided iteration shared by the kernels: N operands read with arbitrary
//! (broadcast, permuted, sliced) strides into a contiguous output, row by row
//! of the innermost (collapsed) dimension, plus the size threshold and the
//! chunking that decide when rayon is used.

use crate::small::SmallVec;

use crate::shape::Dims;

/// Below this much work a kernel runs on the calling thread. Work is counted
/// in units of one cheap elementwise operation (an add, a copy): waking
/// rayon's threads costs several microseconds, about what a single thread
/// needs for this many adds, so memory-bound kernels on less stay serial.
/// Kernels with dearer elements (exp, erf, reductions) pass a weight.
#[cfg_attr(not(feature = "rayon"), allow(dead_code))]
pub(crate) const PAR_THRESHOLD: usize = 1 << 18;

/// Elements per parallel task (a chunk count that balances load without
/// drowning small kernels in task overhead).
#[cfg(feature = "rayon")]
pub(crate) fn chunk_len(total: usize) -> usize {
    let tasks = rayon::current_num_threads() * 4;
    total.div_ceil(tasks).max(PAR_THRESHOLD / 8)
}

/// Run `f(start, chunk)` over `out` split into chunks of whole multiples of
/// `unit` elements, in parallel when the output is large enough.
#[inline]
pub(crate) fn for_chunks<O: Send>(out: &mut [O], unit: usize, f: impl Fn(usize, &mut [O]) + Sync + Send) {
    for_chunks_weighted(out, unit, 1, f)
}

/// `for_chunks` for kernels that do `weight` units of work per output
/// element (reductions): the work, not the output size, decides.
#[inline]
pub(crate) fn for_chunks_weighted<O: Send>(
    out: &mut [O],
    unit: usize,
    weight: usize,
    f: impl Fn(usize, &mut [O]) + Sync + Send,
) {
    #[cfg(feature = "rayon")]
    {
        let work = out.len().saturating_mul(weight.max(1));
        if work >= PAR_THRESHOLD && unit > 0 && out.len() / unit > 1 {
            use rayon::prelude::*;
            let per = chunk_len(work).div_ceil(weight.max(1));
            let chunk = per.div_ceil(unit).max(1) * unit;
            out.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i * chunk, c));
            return;
        }
    }
    let _ = (unit, weight);
    f(0, out)
}

pub(crate) use crate::backend::checks::broadcast_to;

/// N operands read with arbitrary strides; the output is contiguous with the
/// iteration dims. Dims of size 1 are dropped and dims that are contiguous in
/// every operand merged, so most kernels see one long row.
pub(crate) struct Strided<const N: usize> {
    /// Length of a row (the collapsed innermost dimension).
    pub inner: usize,
    /// Each operand's stride along a row.
    pub inner_strides: [usize; N],
    /// Outer dims, outermost first, and each operand's strides along them.
    outer_dims: Dims,
    outer_strides: [Dims; N],
    base: [usize; N],
    rows: usize,
}

impl Strided<1> {
    /// The collapsed dims, outermost first (the row last), and the
    /// operand's strides along them.
    #[cfg_attr(not(feature = "fusion"), allow(dead_code))]
    pub fn dims_and_strides(&self) -> (Dims, Dims) {
        let (mut dims, mut strides) = (self.outer_dims.clone(), self.outer_strides[0].clone());
        dims.push(self.inner);
        strides.push(self.inner_strides[0]);
        (dims, strides)
    }
}

impl<const N: usize> Strided<N> {
    pub fn new(dims: &[usize], strides: [&[usize]; N], base: [usize; N]) -> Self {
        debug_assert!(strides.iter().all(|s| s.len() == dims.len()));
        if dims.contains(&0) {
            return Strided {
                inner: 0,
                inner_strides: [0; N],
                outer_dims: Dims::new(),
                outer_strides: std::array::from_fn(|_| Dims::new()),
                base,
                rows: 0,
            };
        }
        // Collapsed dims and strides, innermost first.
        let mut cd: Dims = Dims::new();
        let mut cs: [Dims; N] = std::array::from_fn(|_| Dims::new());
        for d in (0..dims.len()).rev() {
            let n = dims[d];
            if n == 1 {
                continue;
            }
            if let Some(&last) = cd.last() {
                if (0..N).all(|k| strides[k][d] == cs[k][cd.len() - 1] * last) {
                    *cd.last_mut().unwrap() *= n;
                    continue;
                }
            }
            cd.push(n);
            for k in 0..N {
                cs[k].push(strides[k][d]);
            }
        }
        let inner = cd.first().copied().unwrap_or(1);
        let inner_strides = std::array::from_fn(|k| cs[k].first().copied().unwrap_or(0));
        let outer_dims: Dims = cd.iter().skip(1).rev().copied().collect();
        let outer_strides = std::array::from_fn(|k| cs[k].iter().skip(1).rev().copied().collect());
        let rows = outer_dims.iter().product();
        Strided { inner, inner_strides, outer_dims, outer_strides, base, rows }
    }

    /// Number of rows (product of the outer dims).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Each operand's offset at the start of row `row`.
    fn row_offsets(&self, mut row: usize) -> [usize; N] {
        let mut offs = self.base;
        for j in (0..self.outer_dims.len()).rev() {
            let n = self.outer_dims[j];
            let i = row % n;
            row /= n;
            for (k, o) in offs.iter_mut().enumerate() {
                *o += i * self.outer_strides[k][j];
            }
        }
        offs
    }

    /// Call `f(row_index, offsets)` for rows `start..start + count` in order.
    #[inline]
    pub fn for_rows(&self, start: usize, count: usize, mut f: impl FnMut(usize, [usize; N])) {
        if count == 0 {
            return;
        }
        let nd = self.outer_dims.len();
        let mut offs = self.row_offsets(start);
        if nd == 0 {
            f(start, offs);
            return;
        }
        let mut idx: SmallVec<[usize; 8]> = SmallVec::from_elem(0, nd);
        let mut r = start;
        for j in (0..nd).rev() {
            idx[j] = r % self.outer_dims[j];
            r /= self.outer_dims[j];
        }
        for row in start..start + count {
            f(row, offs);
            // Odometer step.
            let mut j = nd;
            while j > 0 {
                j -= 1;
                idx[j] += 1;
                for (k, o) in offs.iter_mut().enumerate() {
                    *o += self.outer_strides[k][j];
                }
                if idx[j] < self.outer_dims[j] {
                    break;
                }
                for (k, o) in offs.iter_mut().enumerate() {
                    *o -= self.outer_strides[k][j] * self.outer_dims[j];
                }
                idx[j] = 0;
            }
        }
    }

    /// Fill the contiguous `out` (rows * inner elements) row by row:
    /// `f(out_row, offsets)`; parallel over rows when large.
    #[inline]
    pub fn fill<O: Send>(&self, out: &mut [O], f: impl Fn(&mut [O], [usize; N]) + Sync + Send) {
        self.fill_weighted(out, 1, f)
    }

    /// `fill` for kernels doing `weight` units of work per output element.
    #[inline]
    pub fn fill_weighted<O: Send>(&self, out: &mut [O], weight: usize, f: impl Fn(&mut [O], [usize; N]) + Sync + Send) {
        debug_assert_eq!(out.len(), self.rows * self.inner);
        let inner = self.inner;
        if inner == 0 {
            return;
        }
        for_chunks_weighted(out, inner, weight, |start, chunk| {
            let count = chunk.len() / inner;
            let mut rows = chunk.chunks_exact_mut(inner);
            self.for_rows(start / inner, count, |_, offs| {
                if let Some(row) = rows.next() {
                    f(row, offs)
                }
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapses_contiguous_and_unit_dims() {
        let s = Strided::<1>::new(&[2, 3, 4], [&[12, 4, 1]], [0]);
        assert_eq!((s.inner, s.rows()), (24, 1));
        let s = Strided::<2>::new(&[2, 1, 3], [&[3, 3, 1], &[0, 0, 1]], [0, 0]);
        assert_eq!((s.inner, s.rows()), (3, 2));
        let mut seen = vec![];
        s.for_rows(0, 2, |r, o| seen.push((r, o)));
        assert_eq!(seen, vec![(0, [0, 0]), (1, [3, 0])]);
    }

    #[test]
    fn rows_start_anywhere() {
        // A transposed [3, 4] read: rows of 3 with stride 4.
        let s = Strided::<1>::new(&[4, 3], [&[1, 4]], [5]);
        let mut seen = vec![];
        s.for_rows(1, 3, |r, o| seen.push((r, o[0])));
        assert_eq!(seen, vec![(1, 6), (2, 7), (3, 8)]);
        assert_eq!(s.inner_strides, [4]);
    }
}
