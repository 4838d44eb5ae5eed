//! Batched matrix product through the `gemm` crate. Transposed operands are
//! read through their strides (no copy); batch axes broadcast.

use gemm::Parallelism;

use super::scalar::Float;
use super::{with_float, In, Out, COMPACT};
use crate::backend::checks::{Mat, MatMulGeometry};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// m * n * k up to which a plain loop is used instead of gemm.
const SMALL_GEMM_WORK: usize = 8 * 8 * 8;

/// m * n * k from which one GEMM uses every thread.
#[cfg(feature = "rayon")]
pub(super) const PAR_GEMM_WORK: usize = 64 * 64 * 64;

/// `portable`: `CpuNumerics::Portable`'s in-order sums (`portable_gemm`)
/// instead of the gemm crate's (natively; false in the browser build, whose
/// kernels are those sums already).
pub(super) fn matmul(ta: bool, tb: bool, [a, b]: &[In<'_>; 2], out: &mut Out<'_>, portable: bool) -> Result<()> {
    const OP: &str = "MatMul";
    if a.dtype != out.dtype || b.dtype != out.dtype {
        return Err(Error::backend(OP, "operand dtypes differ from the output's"));
    }
    let od = out.dims;
    with_float!(out.dtype, OP, T => {
        let (x, y) = (a.slice::<T>(OP)?, b.slice::<T>(OP)?);
        batched::<T>(ta, tb, (x, a.dims), (y, b.dims), (out.slice::<T>(OP)?, od), portable)
    })
}

fn batched<T: Float>(
    ta: bool,
    tb: bool,
    (a, ad): (&[T], &[usize]),
    (b, bd): (&[T], &[usize]),
    (out, od): (&mut [T], &[usize]),
    portable: bool,
) -> Result<()> {
    let g = MatMulGeometry::new(ta, tb, ad, bd, od)?;
    let (ma, mb, m, k, n) = (g.a, g.b, g.m, g.k, g.n);
    let (bo, sa, sb) = (g.batch, &g.a_batch_strides, &g.b_batch_strides);
    let batches = g.batches();
    if out.is_empty() {
        return Ok(());
    }
    if k == 0 {
        out.fill(T::ZERO);
        return Ok(());
    }
    // A shared right operand and a plain left one: the batch folds into m,
    // one large GEMM instead of many small ones.
    if !ta && batches > 1 && sb.iter().all(|&s| s == 0) && a.len() == batches * m * k {
        let folded = Mat { rows: batches * m, ..ma };
        return gemm_one(&folded, &mb, a, b, out, parallelism(work(&[batches, m, n, k])), portable);
    }
    let mn = m * n;
    let offsets = |i: usize| {
        let (mut oa, mut ob, mut r) = (0, 0, i);
        for d in (0..bo.len()).rev() {
            let j = r % bo[d];
            r /= bo[d];
            oa += j * sa[d];
            ob += j * sb[d];
        }
        (oa, ob)
    };
    // Several products that gemm would not split well (the per-sample GEMMs
    // of a convolution, 64 of 64×288×121 in W2): one single-threaded call
    // each, spread over the threads (measured 1.2–8× faster than one
    // multi-threaded call after another, which waits for every thread at
    // each of them).
    #[cfg(feature = "rayon")]
    if batches > 1 && work(&[mn, k]) < BLOCKS_BELOW && work(&[batches, mn, k]) >= PAR_GEMM_WORK {
        use rayon::prelude::*;
        return out.par_chunks_mut(mn).enumerate().try_for_each(|(i, o)| {
            let (oa, ob) = offsets(i);
            gemm_one(&ma, &mb, &a[oa..], &b[ob..], o, Parallelism::None, portable)
        });
    }
    let par = parallelism(work(&[mn, k]));
    for (i, o) in out.chunks_exact_mut(mn).enumerate() {
        let (oa, ob) = offsets(i);
        gemm_one(&ma, &mb, &a[oa..], &b[ob..], o, par, portable)?;
    }
    Ok(())
}

/// A product of sizes as a work estimate: saturating, since m·n·k of valid
/// operands may exceed usize on 32-bit targets.
fn work(factors: &[usize]) -> usize {
    factors.iter().fold(1usize, |acc, &f| acc.saturating_mul(f))
}

fn parallelism(work: usize) -> Parallelism {
    #[cfg(feature = "rayon")]
    if work >= PAR_GEMM_WORK {
        return Parallelism::Rayon(0);
    }
    let _ = work;
    Parallelism::None
}

/// K above this is split: chunks of K_CHUNK (a multiple of the rule's leaf,
/// docs/reductions.md) multiplied separately and their products added by
/// the rule's tree, so the K loop's error grows like log K, not K.
const K_CHUNK: usize = 8 * super::reduce::LEAF;

/// dst = a x b with K split into chunks combined by the summation rule.
fn gemm_one<T: Float>(
    a: &Mat,
    b: &Mat,
    lhs: &[T],
    rhs: &[T],
    dst: &mut [T],
    par: Parallelism,
    portable: bool,
) -> Result<()> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if k <= K_CHUNK || m == 0 || n == 0 {
        return gemm_chunk::<COMPACT, T>(a, b, lhs, rhs, dst, par, portable);
    }
    if b.rows != k || dst.len() != m * n || lhs.len() < a.span() || rhs.len() < b.span() {
        return Err(Error::backend("MatMul", "operand buffers are smaller than their shapes"));
    }
    let add = |mut x: Vec<T>, y: Vec<T>| {
        for (x, y) in x.iter_mut().zip(y) {
            *x = *x + y;
        }
        x
    };
    let mut tree = super::reduce::Tree::new();
    for k0 in (0..k).step_by(K_CHUNK) {
        let kc = K_CHUNK.min(k - k0);
        let mut part = crate::memory::try_vec("MatMul", m * n, T::ZERO)?;
        // Columns k0.. of a and rows k0.. of b: offsets by their strides.
        let (ac, bc) = (Mat { cols: kc, ..*a }, Mat { rows: kc, ..*b });
        gemm_chunk::<COMPACT, T>(&ac, &bc, &lhs[k0 * a.cs..], &rhs[k0 * b.rs..], &mut part, par, portable)?;
        tree.push(part, &add);
    }
    dst.copy_from_slice(&tree.finish(&add).expect("k > 0"));
    Ok(())
}

/// dst (row-major a.rows x b.cols) = a x b, overwriting dst. In the
/// browser build and in portable numerics each element is a sum over k in
/// order from +0.0 without fused multiply-adds (the plain loop,
/// `simd_gemm`, `portable_gemm`: the same bits).
fn gemm_chunk<const COMPACT: bool, T: Float>(
    a: &Mat,
    b: &Mat,
    lhs: &[T],
    rhs: &[T],
    dst: &mut [T],
    par: Parallelism,
    portable: bool,
) -> Result<()> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || dst.len() != m * n || lhs.len() < a.span() || rhs.len() < b.span() {
        return Err(Error::backend("MatMul", "operand buffers are smaller than their shapes"));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    // Tiny products: a plain loop beats gemm's dispatch and packing. The
    // compact (browser) build uses it for every f64 product too, leaving
    // gemm's f64 kernels out of the download: f64 is for gradient checks
    // there, not speed.
    if work(&[m, n, k]) <= SMALL_GEMM_WORK || (COMPACT && matches!(T::DTYPE, DType::F64)) {
        for (i, row) in dst.chunks_exact_mut(n).enumerate() {
            row.fill(T::ZERO);
            for p in 0..k {
                let x = lhs[i * a.rs + p * a.cs];
                for (j, o) in row.iter_mut().enumerate() {
                    *o = *o + x * rhs[p * b.rs + j * b.cs];
                }
            }
        }
        return Ok(());
    }
    if T::own_gemm(a, b, lhs, rhs, dst) {
        return Ok(());
    }
    #[cfg(not(target_arch = "wasm32"))]
    if portable {
        super::portable_gemm::gemm(a, b, lhs, rhs, dst, par);
        return Ok(());
    }
    let _ = portable;
    let blocks = column_blocks(m, n, k);
    let width = n.div_ceil(blocks).next_multiple_of(16).min(n);
    gemm_blocks(a, b, lhs, rhs, dst, width, par);
    Ok(())
}

/// m·n·k from which a product is computed as column blocks
/// (`column_blocks`), and up to which.
const BLOCKS_FROM: usize = 64 * 64 * 64;
const BLOCKS_BELOW: usize = 1 << 27;

/// Into how many column blocks of the output a product is cut, from its
/// shape alone (never the thread count, so the bits never depend on it).
/// Mid-size products (the MLP's 128×784×512 and its gradients) run faster
/// as independent single-threaded gemm calls over column blocks, spread
/// over the threads by rayon's work stealing, than as one call split by
/// gemm itself: gemm splits the job so that every thread packs the whole of
/// the operand the output's columns index (measured 1.0–1.9× the time of
/// the blocked form on W1's products), and each of its calls waits for all
/// threads, so one descheduled thread stalls it. Blocks cost no more on one
/// thread than the whole product (measured within 3 % on W1's shapes).
/// Large products stay one call: gemm's own split scales to more threads.
fn column_blocks(m: usize, n: usize, k: usize) -> usize {
    let w = work(&[m, n, k]);
    if w < BLOCKS_FROM || w >= BLOCKS_BELOW || n < 256 {
        return 1;
    }
    2 * (n / 512).clamp(1, 4)
}

/// A pointer that may cross threads: each block writes its own columns of
/// the output (disjoint elements) and only reads the operands.
#[derive(Clone, Copy)]
struct Shared<T>(*mut T);
// SAFETY: used only by `gemm_blocks`, whose tasks write disjoint elements of
// dst and read lhs/rhs, all of which outlive the scope the tasks run in.
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// Through a method, so closures capture the whole (Send) wrapper.
    fn ptr(self) -> *mut T {
        self.0
    }
}

/// dst = a x b as column blocks of `width` (the last may be narrower), each
/// a single-threaded gemm call, on rayon's threads unless `par` is None.
/// The blocks are the same whatever the parallelism, so the bits are too.
fn gemm_blocks<T: Float>(a: &Mat, b: &Mat, lhs: &[T], rhs: &[T], dst: &mut [T], width: usize, par: Parallelism) {
    if width >= b.cols {
        // SAFETY: see `gemm_columns`; the one block is the whole product.
        unsafe { gemm_columns(a, b, lhs.as_ptr(), rhs, dst.as_mut_ptr(), b.cols, 0, b.cols, par) };
        return;
    }
    gemm_blocks_then(a, b, lhs, rhs, dst, width, par, &|_| {});
}

/// Columns `j0..j0 + cols` of a product just computed by the task that
/// holds this: a matmul epilogue reads them while they are in cache (only
/// fused groups read it; without the `fusion` feature it is never read).
#[cfg_attr(not(feature = "fusion"), allow(dead_code))]
pub(super) struct Block<'a, T> {
    ptr: Shared<T>,
    n: usize,
    rows: usize,
    pub j0: usize,
    pub cols: usize,
    _product: std::marker::PhantomData<&'a [T]>,
}

#[cfg_attr(not(feature = "fusion"), allow(dead_code))]
impl<T> Block<'_, T> {
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Row `i` of the block: elements `i * n + j0 ..` of the product.
    pub fn row(&self, i: usize) -> &[T] {
        assert!(i < self.rows, "row {i} of a block of {} rows", self.rows);
        // SAFETY: the product has rows * n elements and j0 + cols <= n, so
        // the range is inside it; this task's gemm call wrote these elements
        // before the block was made (same thread), and no task writes them
        // again while the scope lasts (blocks own disjoint columns). The
        // borrow cannot outlive the block, which lives inside the scope.
        unsafe { std::slice::from_raw_parts(self.ptr.0.add(i * self.n + self.j0), self.cols) }
    }
}

/// `gemm_blocks` calling `then` with each block right after computing it,
/// on the same thread (so a fused epilogue reads the block from cache).
#[allow(clippy::too_many_arguments)]
fn gemm_blocks_then<T: Float>(
    a: &Mat,
    b: &Mat,
    lhs: &[T],
    rhs: &[T],
    dst: &mut [T],
    width: usize,
    par: Parallelism,
    then: &(dyn Fn(Block<'_, T>) + Sync),
) {
    let (m, n) = (a.rows, b.cols);
    assert!(dst.len() == m * n && width > 0, "gemm_blocks: {} outputs for {m} x {n}", dst.len());
    let (l, d) = (Shared(lhs.as_ptr() as *mut T), Shared(dst.as_mut_ptr()));
    let block = move |j0: usize| {
        let cols = width.min(n - j0);
        // SAFETY: see `gemm_columns`: columns j0..j0 + cols of b and dst,
        // j0 + cols <= n; blocks of different j0 write disjoint columns.
        unsafe { gemm_columns(a, b, l.ptr(), rhs, d.ptr(), n, j0, cols, Parallelism::None) };
        then(Block { ptr: d, n, rows: m, j0, cols, _product: std::marker::PhantomData });
    };
    #[cfg(feature = "rayon")]
    if !matches!(par, Parallelism::None) {
        rayon::scope(|scope| {
            for j0 in (0..n).step_by(width) {
                scope.spawn(move |_| block(j0));
            }
        });
        return;
    }
    let _ = par;
    (0..n).step_by(width).for_each(block);
}

/// A product that runs as column blocks, with its epilogue applied to each
/// block as it is computed (`run_blocks`): one 2-D GEMM (no batch, or a
/// batch folded into the rows), K in one chunk, in the blocked size range,
/// native numerics. Exactly the blocks, gemm calls and bits of the plain
/// product (`batched` → `gemm_chunk` → `gemm_blocks`).
#[cfg(feature = "fusion")]
pub(super) struct Blocked {
    a: Mat,
    b: Mat,
    width: usize,
}

#[cfg(feature = "fusion")]
impl Blocked {
    pub(super) fn of(
        ta: bool,
        tb: bool,
        ad: &[usize],
        bd: &[usize],
        od: &[usize],
        portable: bool,
    ) -> Result<Option<Blocked>> {
        let g = MatMulGeometry::new(ta, tb, ad, bd, od)?;
        let (m, k, n) = (g.m, g.k, g.n);
        let batches = g.batches();
        let a = if batches == 1 {
            g.a
        } else if !ta && g.b_batch_strides.iter().all(|&s| s == 0) && work(ad) == batches * m * k {
            Mat { rows: batches * m, ..g.a }
        } else {
            return Ok(None);
        };
        let rows = a.rows;
        if portable || k == 0 || k > K_CHUNK || work(&[rows, n, k]) <= SMALL_GEMM_WORK || cfg!(target_arch = "wasm32") {
            return Ok(None);
        }
        let blocks = column_blocks(rows, n, k);
        let width = n.div_ceil(blocks).next_multiple_of(16).min(n);
        if blocks <= 1 || width >= n {
            return Ok(None);
        }
        Ok(Some(Blocked { a, b: g.b, width }))
    }

    /// dst = the product, each column block handed to `then` on the thread
    /// that computed it, once computed.
    pub(super) fn run_blocks<T: Float>(
        &self,
        lhs: &[T],
        rhs: &[T],
        dst: &mut [T],
        then: &(dyn Fn(Block<'_, T>) + Sync),
    ) -> Result<()> {
        let (a, b) = (&self.a, &self.b);
        if dst.len() != a.rows * b.cols || lhs.len() < a.span() || rhs.len() < b.span() {
            return Err(Error::backend("MatMul", "operand buffers are smaller than their shapes"));
        }
        let par = parallelism(work(&[a.rows, b.cols, a.cols]));
        gemm_blocks_then(a, b, lhs, rhs, dst, self.width, par, then);
        Ok(())
    }
}

/// Whether b is stored column by column (a transposed weight, x·Wᵀ) with a
/// column stride of a multiple of 1 KiB: gemm packs b by reading across
/// columns, and with such a stride every read of a panel falls into the
/// same few L1 sets.
fn aliasing_columns<T>(b: &Mat) -> bool {
    b.rs == 1 && b.cols > 1 && (b.cs * std::mem::size_of::<T>()) % 1024 == 0
}

/// Whether aliasing columns are copied row-major before gemm reads them
/// (`gemm_columns`). Only where gemm's micro-kernels are AVX-512's, whose
/// wider panels read more columns at once: on a Zen 4 (AVX-512), 128×512×512
/// with W [512, 512] transposed ran at 0.55× the speed of the same product
/// from a row-major copy, and the copy won. On a Zen 3 (AVX2, 2026-12-07,
/// 2 threads, best of 300, four interleaved rounds) reading the columns in
/// place was the faster: 411–512 µs against 510–648 µs with the copy,
/// level with the same product from W stored row-major (398–517 µs); the
/// GPT's 768×128×512 (W [128, 512] transposed) 582–757 against 635–811 µs.
/// Either way the same packed values, so the same bits.
fn copies_aliasing_columns() -> bool {
    #[cfg(test)]
    match COPY_ALIASING.load(std::sync::atomic::Ordering::Relaxed) {
        1 => return false,
        2 => return true,
        _ => {}
    }
    super::simd::has_avx512()
}

/// Tests force `copies_aliasing_columns` (0: by the CPU, 1: never, 2:
/// always) to check that both ways give the same bits on any machine.
#[cfg(test)]
static COPY_ALIASING: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Columns j0..j0 + cols of b as a row-major [b.rows, cols] copy, read a
/// few columns at a time (each cache line of b used while it is in L1).
fn columns_row_major<T: Float>(b: &Mat, rhs: &[T], j0: usize, cols: usize) -> Vec<T> {
    const STRIP: usize = 8;
    let k = b.rows;
    let mut out = vec![T::ZERO; k * cols];
    for s0 in (0..cols).step_by(STRIP) {
        let s1 = (s0 + STRIP).min(cols);
        for p in 0..k {
            let row = &mut out[p * cols..][s0..s1];
            for (j, o) in (s0..s1).zip(row) {
                *o = rhs[p * b.rs + (j0 + j) * b.cs];
            }
        }
    }
    out
}

/// `gemm_block`, reading a row-major copy of b's columns when they alias
/// and the CPU gains by the copy (`aliasing_columns`,
/// `copies_aliasing_columns`: same values, so the same packed panels and
/// bits). Used by every column block and by a product of one block (the
/// GPT's x·Wᵀ with W [128, 512]: 0.65 -> 0.51 ms for 768x512x128 on 2
/// threads of a Zen 4).
///
/// # Safety
/// As `gemm_block`, with rhs spanning b.span() elements.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_columns<T: Float>(
    a: &Mat,
    b: &Mat,
    lhs: *const T,
    rhs: &[T],
    dst: *mut T,
    n: usize,
    j0: usize,
    cols: usize,
    par: Parallelism,
) {
    if aliasing_columns::<T>(b) && copies_aliasing_columns() {
        let copy = columns_row_major(b, rhs, j0, cols);
        let bc = Mat { rows: b.rows, cols, rs: cols, cs: 1 };
        // SAFETY: copy spans bc.span() = k·cols; the destination is columns
        // j0..j0 + cols of dst, as the caller guarantees.
        unsafe { gemm_block(a, &bc, lhs, copy.as_ptr(), dst.add(j0), n, 0, cols, par) };
    } else {
        // SAFETY: the caller's guarantees are `gemm_block`'s.
        unsafe { gemm_block(a, b, lhs, rhs.as_ptr(), dst, n, j0, cols, par) };
    }
}

/// Columns j0..j0 + cols of dst (row stride `n`) = a x (those columns of b).
///
/// # Safety
/// The caller checked (`gemm_chunk`) that lhs spans a.span() elements, rhs
/// b.span() and dst a.rows * n with n == b.cols; j0 + cols <= n. gemm then
/// reads lhs at i * a.rs + p * a.cs (i < m, p < k) < a.span(), rhs at
/// p * b.rs + (j0 + j) * b.cs (j < cols) < b.span(), and writes dst at
/// i * n + j0 + j < m * n; no other thread writes those dst elements while
/// this runs, and dst does not overlap lhs or rhs (a unique borrow in the
/// caller). read_dst = false with beta = 1 makes them lhs x rhs, overwriting
/// what was there. T is f32 or f64 (`Float`), both of which gemm supports.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_block<T: Float>(
    a: &Mat,
    b: &Mat,
    lhs: *const T,
    rhs: *const T,
    dst: *mut T,
    n: usize,
    j0: usize,
    cols: usize,
    par: Parallelism,
) {
    gemm::gemm(
        a.rows,
        cols,
        a.cols,
        dst.add(j0),
        1,
        n as isize,
        false,
        lhs,
        a.cs as isize,
        a.rs as isize,
        rhs.add(j0 * b.cs),
        b.cs as isize,
        b.rs as isize,
        T::ZERO,
        T::ONE,
        false,
        false,
        false,
        par,
    );
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::dtype::DType;
    use crate::op::Op;
    use crate::shape::broadcast_shapes;

    /// Naive reference: logical a [.., m, k], b [.., k, n] from stored data.
    fn naive(ta: bool, tb: bool, a: &[f64], ad: &[usize], b: &[f64], bd: &[usize]) -> (Vec<f64>, Vec<usize>) {
        let (ra, rb) = (ad.len(), bd.len());
        let (m, k) = if ta { (ad[ra - 1], ad[ra - 2]) } else { (ad[ra - 2], ad[ra - 1]) };
        let n = if tb { bd[rb - 2] } else { bd[rb - 1] };
        let bo = broadcast_shapes(&ad[..ra - 2], &bd[..rb - 2]).unwrap();
        let batches: usize = bo.iter().product();
        let mut out = vec![0.0; batches * m * n];
        for bi in 0..batches {
            // Unravel bi into bo, then map to each operand's own batch index.
            let mut idx = vec![0; bo.len()];
            let mut r = bi;
            for d in (0..bo.len()).rev() {
                idx[d] = r % bo[d];
                r /= bo[d];
            }
            let own = |dims: &[usize]| {
                let bd = &dims[..dims.len() - 2];
                let off = bo.len() - bd.len();
                bd.iter().enumerate().fold(0, |acc, (d, &n)| acc * n + if n == 1 { 0 } else { idx[off + d] })
            };
            let (ba, bb) = (own(ad), own(bd));
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0.0;
                    for p in 0..k {
                        let x = if ta { a[ba * m * k + p * m + i] } else { a[ba * m * k + i * k + p] };
                        let y = if tb { b[bb * k * n + j * k + p] } else { b[bb * k * n + p * n + j] };
                        s += x * y;
                    }
                    out[bi * m * n + i * n + j] = s;
                }
            }
        }
        let mut od = bo.to_vec();
        od.extend([m, n]);
        (out, od)
    }

    fn check(ta: bool, tb: bool, ad: &[usize], bd: &[usize]) {
        let na: usize = ad.iter().product();
        let nb: usize = bd.iter().product();
        let a: Vec<f64> = rand_f32(na, 3).into_iter().map(f64::from).collect();
        let b: Vec<f64> = rand_f32(nb, 4).into_iter().map(f64::from).collect();
        let (want, od) = naive(ta, tb, &a, ad, &b, bd);
        let op = Op::MatMul { transpose_a: ta, transpose_b: tb };
        let got = run_op(op, &[(f64s(&a), ad), (f64s(&b), bd)], &od, DType::F64).unwrap().to_f64_vec();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-9, "{ta} {tb} {ad:?} {bd:?}");
        }
        // f32 too, with a looser tolerance.
        let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
        let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
        let got = run_op(op, &[(f32s(&a32), ad), (f32s(&b32), bd)], &od, DType::F32).unwrap().to_f64_vec();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-3 * (1.0 + w.abs()), "{ta} {tb} {ad:?} {bd:?}: {g} vs {w}");
        }
    }

    #[test]
    fn all_transposes_and_batches() {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let sa = |m: usize, k: usize| if ta { [k, m] } else { [m, k] };
            let sb = |k: usize, n: usize| if tb { [n, k] } else { [k, n] };
            check(ta, tb, &sa(3, 4), &sb(4, 5));
            check(ta, tb, &sa(1, 7), &sb(7, 1));
            check(ta, tb, &sa(70, 65), &sb(65, 66)); // parallel GEMM
            let (a2, b2) = (sa(2, 3), sb(3, 4));
            check(ta, tb, &[2, a2[0], a2[1]], &[2, b2[0], b2[1]]);
            check(ta, tb, &[4, 1, a2[0], a2[1]], &[3, b2[0], b2[1]]); // broadcast both
            check(ta, tb, &[5, a2[0], a2[1]], &b2); // shared b (folds when !ta)
            check(ta, tb, &a2, &[2, 2, b2[0], b2[1]]); // shared a
            let (a3, b3) = (sa(20, 20), sb(20, 20));
            check(ta, tb, &[40, a3[0], a3[1]], &[40, b3[0], b3[1]]); // parallel over batches
        }
    }

    /// x·Wᵀ with W's rows a multiple of 1 KiB long (`aliasing_columns`):
    /// gemm reads the columns in place or from a row-major copy, in one
    /// block (n < 256) and in column blocks. Right values (f64 against the
    /// naive product) and, in f32, the bits of the same product from Wᵀ
    /// stored row-major.
    #[test]
    fn transposed_weights_with_aliasing_rows() {
        // Copied and read in place (`copies_aliasing_columns`), whichever
        // this CPU would pick: both must give these bits.
        for copy in [1, 2] {
            super::COPY_ALIASING.store(copy, std::sync::atomic::Ordering::Relaxed);
            transposed_weights_give_the_bits_of_a_row_major_copy();
        }
        super::COPY_ALIASING.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    fn transposed_weights_give_the_bits_of_a_row_major_copy() {
        for (m, k, n) in [(96, 256, 128), (64, 512, 512)] {
            check(false, true, &[m, k], &[n, k]);
            let x = rand_f32(m * k, 5);
            let w = rand_f32(n * k, 6);
            let wt: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect();
            let nt = Op::MatMul { transpose_a: false, transpose_b: true };
            let nn = Op::MatMul { transpose_a: false, transpose_b: false };
            let got = run_op(nt, &[(f32s(&x), &[m, k]), (f32s(&w), &[n, k])], &[m, n], DType::F32).unwrap();
            let want = run_op(nn, &[(f32s(&x), &[m, k]), (f32s(&wt), &[k, n])], &[m, n], DType::F32).unwrap();
            let bits = |v: Vec<f64>| v.into_iter().map(|x| (x as f32).to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got.to_f64_vec()), bits(want.to_f64_vec()), "{m}x{k}x{n}");
        }
    }

    #[test]
    fn empty_inner_dimension_gives_zeros() {
        let op = Op::MatMul { transpose_a: false, transpose_b: false };
        let r = run_op(op, &[(f32s(&[]), &[2, 0]), (f32s(&[]), &[0, 3])], &[2, 3], DType::F32).unwrap();
        assert_eq!(r, f32s(&[0.0; 6]));
        assert!(run_op(op, &[(f32s(&[1.0; 6]), &[2, 3]), (f32s(&[1.0; 6]), &[2, 3])], &[2, 3], DType::F32).is_err());
    }

    /// The one `unsafe` block (the call into gemm) on its own, small enough
    /// for Miri: `cargo +nightly miri test -p kiln-core --lib miri_`.
    /// Shapes above SMALL_GEMM_WORK so gemm runs, transposed operands read
    /// through strides, exact operand lengths (one element more would hide
    /// an over-read), and the too-short-buffer refusal.
    #[test]
    fn miri_gemm_call_stays_in_bounds() {
        use super::{gemm_chunk, Mat, Parallelism};
        for (m, k, n) in [(9, 9, 9), (3, 70, 5), (17, 2, 16)] {
            for (ta, tb) in [(false, false), (true, true), (false, true)] {
                let a =
                    if ta { Mat { rows: m, cols: k, rs: 1, cs: m } } else { Mat { rows: m, cols: k, rs: k, cs: 1 } };
                let b =
                    if tb { Mat { rows: k, cols: n, rs: 1, cs: k } } else { Mat { rows: k, cols: n, rs: n, cs: 1 } };
                let lhs: Vec<f64> = (0..a.span()).map(|i| (i % 7) as f64 - 3.0).collect();
                let rhs: Vec<f64> = (0..b.span()).map(|i| (i % 5) as f64 * 0.5).collect();
                // gemm, and the compact build's plain f64 loop (exact here too:
                // small integers and halves).
                for compact in [false, true] {
                    let mut dst = vec![f64::NAN; m * n];
                    let run = |dst: &mut [f64], rhs: &[f64]| {
                        if compact {
                            gemm_chunk::<true, f64>(&a, &b, &lhs, rhs, dst, Parallelism::None, false)
                        } else {
                            gemm_chunk::<false, f64>(&a, &b, &lhs, rhs, dst, Parallelism::None, false)
                        }
                    };
                    run(&mut dst, &rhs).unwrap();
                    for i in 0..m {
                        for j in 0..n {
                            let want: f64 = (0..k).map(|p| lhs[i * a.rs + p * a.cs] * rhs[p * b.rs + j * b.cs]).sum();
                            assert_eq!(dst[i * n + j], want, "{m}x{k}x{n} {ta} {tb} compact {compact} at ({i}, {j})");
                        }
                    }
                    let short = &rhs[..rhs.len() - 1];
                    assert!(run(&mut dst, short).is_err());
                }
            }
        }
    }

    /// Column blocks (`gemm_blocks`, the form of mid-size products) on
    /// their own, small enough for Miri: every width, serial and on rayon's
    /// threads, transposed operands; small integers and halves keep every
    /// sum exact, so each block must equal the plain sum.
    #[test]
    fn miri_column_blocks_stay_in_bounds_and_compute_the_product() {
        use super::{gemm_blocks, Mat, Parallelism};
        let (m, k, n) = (5, 7, 37);
        for (ta, tb) in [(false, false), (true, true), (false, true), (true, false)] {
            let a = if ta { Mat { rows: m, cols: k, rs: 1, cs: m } } else { Mat { rows: m, cols: k, rs: k, cs: 1 } };
            let b = if tb { Mat { rows: k, cols: n, rs: 1, cs: k } } else { Mat { rows: k, cols: n, rs: n, cs: 1 } };
            let lhs: Vec<f64> = (0..a.span()).map(|i| (i % 7) as f64 - 3.0).collect();
            let rhs: Vec<f64> = (0..b.span()).map(|i| (i % 5) as f64 * 0.5).collect();
            let pars: &[Parallelism] = if cfg!(feature = "rayon") {
                &[Parallelism::None, Parallelism::Rayon(0)]
            } else {
                &[Parallelism::None]
            };
            for width in [1, 16, 20, 36, 37, 64] {
                for &par in pars {
                    let mut dst = vec![f64::NAN; m * n];
                    gemm_blocks(&a, &b, &lhs, &rhs, &mut dst, width, par);
                    for i in 0..m {
                        for j in 0..n {
                            let want: f64 = (0..k).map(|p| lhs[i * a.rs + p * a.cs] * rhs[p * b.rs + j * b.cs]).sum();
                            assert_eq!(dst[i * n + j], want, "{ta} {tb} width {width} at ({i}, {j})");
                        }
                    }
                }
            }
        }
    }

    /// The MLP's products are cut into column blocks by shape alone: the
    /// same bits on 1, 2 and 3 threads (docs/reductions.md's promise), and
    /// within f32 rounding of the f64 product.
    #[cfg(feature = "rayon")]
    #[test]
    fn blocked_products_give_the_same_bits_on_any_thread_count() {
        for (ta, tb, ad, bd, od) in [
            (false, true, [128, 784], [512, 784], [128, 512]),
            (true, false, [128, 512], [128, 784], [512, 784]),
            (false, false, [128, 512], [512, 512], [128, 512]),
            // W [512, 512] transposed: its 2 KiB column stride takes the
            // row-major copy on AVX-512 CPUs (`copies_aliasing_columns`).
            (false, true, [128, 512], [512, 512], [128, 512]),
        ] {
            assert!(super::column_blocks(od[0], od[1], if ta { ad[0] } else { ad[1] }) > 1);
            let a = rand_f32(ad.iter().product(), 5);
            let b = rand_f32(bd.iter().product(), 6);
            let op = Op::MatMul { transpose_a: ta, transpose_b: tb };
            let on = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| run_op(op, &[(f32s(&a), &ad), (f32s(&b), &bd)], &od, DType::F32).unwrap())
            };
            let one = on(1);
            assert_eq!(one, on(2), "{ad:?} x {bd:?}");
            assert_eq!(one, on(3), "{ad:?} x {bd:?}");
            let (want, _) = naive(
                ta,
                tb,
                &a.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                &ad,
                &b.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                &bd,
            );
            for (g, w) in one.to_f64_vec().iter().zip(&want) {
                assert!((g - w).abs() < 1e-4 * (1.0 + w.abs()), "{ad:?} x {bd:?}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn deterministic() {
        let a = rand_f32(128 * 96, 1);
        let b = rand_f32(96 * 80, 2);
        let op = Op::MatMul { transpose_a: false, transpose_b: false };
        let r1 = run_op(op, &[(f32s(&a), &[128, 96]), (f32s(&b), &[96, 80])], &[128, 80], DType::F32).unwrap();
        let r2 = run_op(op, &[(f32s(&a), &[128, 96]), (f32s(&b), &[96, 80])], &[128, 80], DType::F32).unwrap();
        assert_eq!(r1, r2);
    }
}
