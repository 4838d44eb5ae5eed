//! f32 GEMM with wasm's 128-bit SIMD, for the browser build: 4×8 register
//! tiles (eight f32x4 accumulators, two vectors of b and one broadcast
//! element of a per step: 11 vector registers, well inside x64's 16),
//! operands packed into panels read front to back, whole panels packed by
//! vector copies or 4×4 transposes. It replaces the `gemm` crate's wasm
//! path (12×4 tiles): in Node (CPU time, load ~10) 1024³ 31.6–35.2 GFLOP/s
//! against gemm's 21–26, W1's products 28–31 against 21–23; and gemm's
//! code (its scalar fallback included) leaves the download: −11 KB gzipped.
//! (A 6×8 tile measured the same as 4×8 while the inner loop was unrolled
//! and spilled; not retried since.)
//!
//! Each output element is a sum over k in order, in blocks of `KC` started
//! from the previous block's partial sum; no fused multiply-add (simd128 has
//! none), so the bits do not depend on the tiling of m and n.

use core::arch::wasm32::*;

use crate::backend::checks::Mat;

/// Rows × columns of one register tile.
const MR: usize = 4;
const NR: usize = 8;
/// k per packed block: a KC×NR panel of b (16 KiB) and a KC×MR panel of
/// a (8 KiB) fit in L1 together (512 measured a little faster than 256 on
/// 1024³ and W1, within the noise of the shared machine).
const KC: usize = 512;
/// Rows of a per packed block (128 KiB with KC).
const MC: usize = 64;
/// Columns of b per packed block (1 MiB with KC).
const NC: usize = 512;

/// dst (row-major a.rows × b.cols, overwritten) = a × b; a and b are read
/// through their strides. The caller checked the buffers span the shapes.
pub(super) fn gemm_f32(a: &Mat, b: &Mat, lhs: &[f32], rhs: &[f32], dst: &mut [f32]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(dst.len() >= m * n && lhs.len() >= a.span() && rhs.len() >= b.span() && b.rows == k);
    if k == 0 {
        dst[..m * n].fill(0.0);
        return;
    }
    let mut pa = vec![0.0f32; MC.min(m).next_multiple_of(MR) * KC.min(k)];
    let mut pb = vec![0.0f32; NC.min(n).next_multiple_of(NR) * KC.min(k)];
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            pack_b(b, rhs, p0, kc, j0, nc, &mut pb);
            for i0 in (0..m).step_by(MC) {
                let mc = MC.min(m - i0);
                pack_a(a, lhs, i0, mc, p0, kc, &mut pa);
                for jr in (0..nc).step_by(NR) {
                    let bp = &pb[jr * kc..][..kc * NR];
                    for ir in (0..mc).step_by(MR) {
                        let ap = &pa[ir * kc..][..kc * MR];
                        let tile = Tile { i: i0 + ir, j: j0 + jr, rows: MR.min(mc - ir), cols: NR.min(nc - jr), n };
                        kernel(kc, ap, bp, dst, tile, p0 > 0);
                    }
                }
            }
        }
    }
}

/// Rows i0..i0 + mc, columns p0..p0 + kc of a as MR-row panels, each
/// kc × MR element by element along k (missing rows zero). Whole panels
/// of a row-major a go by 4×4 transposes, of a transposed a by copies.
fn pack_a(a: &Mat, lhs: &[f32], i0: usize, mc: usize, p0: usize, kc: usize, out: &mut [f32]) {
    for ir in (0..mc).step_by(MR) {
        let panel = &mut out[ir * kc..][..kc * MR];
        let base = (i0 + ir) * a.rs + p0 * a.cs;
        let mut done = 0;
        if ir + MR <= mc && a.rs == 1 {
            for p in 0..kc {
                copy4(&lhs[base + p * a.cs..], &mut panel[p * MR..]);
            }
            done = kc;
        } else if ir + MR <= mc && a.cs == 1 {
            while done + 4 <= kc {
                let at = base + done;
                transpose4(&lhs[at..], a.rs, &mut panel[done * MR..]);
                done += 4;
            }
        }
        for r in 0..MR {
            for p in done..kc {
                panel[p * MR + r] = if ir + r < mc { lhs[base + r * a.rs + p * a.cs] } else { 0.0 };
            }
        }
    }
}

/// Rows p0..p0 + kc, columns j0..j0 + nc of b as NR-column panels, each
/// kc × NR (missing columns zero). Whole panels of a row-major b go by
/// copies, of a transposed b by 4×4 transposes.
fn pack_b(b: &Mat, rhs: &[f32], p0: usize, kc: usize, j0: usize, nc: usize, out: &mut [f32]) {
    for jr in (0..nc).step_by(NR) {
        let panel = &mut out[jr * kc..][..kc * NR];
        let cols = NR.min(nc - jr);
        let base = p0 * b.rs + (j0 + jr) * b.cs;
        let mut done = 0;
        if cols == NR && b.cs == 1 {
            for p in 0..kc {
                let row = &rhs[base + p * b.rs..];
                copy4(row, &mut panel[p * NR..]);
                copy4(&row[4..], &mut panel[p * NR + 4..]);
            }
            done = kc;
        } else if cols == NR && b.rs == 1 {
            // Column c of the panel is contiguous along k: four columns
            // and four k at a time, transposed into four rows of 4.
            let mut rows = [0.0f32; 4 * NR];
            while done + 4 <= kc {
                let at = base + done;
                transpose4(&rhs[at..], b.cs, &mut rows[..16]);
                transpose4(&rhs[at + 4 * b.cs..], b.cs, &mut rows[16..]);
                for q in 0..4 {
                    copy4(&rows[q * 4..], &mut panel[(done + q) * NR..]);
                    copy4(&rows[16 + q * 4..], &mut panel[(done + q) * NR + 4..]);
                }
                done += 4;
            }
        }
        for p in done..kc {
            for c in 0..NR {
                panel[p * NR + c] = if c < cols { rhs[base + p * b.rs + c * b.cs] } else { 0.0 };
            }
        }
    }
}

/// dst[..4] = src[..4] as one vector load and store (a 16-byte
/// copy_from_slice may become a call to memory.copy, slow at this size).
#[inline(always)]
fn copy4(src: &[f32], dst: &mut [f32]) {
    let (src, dst) = (&src[..4], &mut dst[..4]);
    // SAFETY: both slices hold exactly 4 f32 (16 bytes), checked by the
    // slicing above; v128_load/v128_store need no alignment.
    unsafe { v128_store(dst.as_mut_ptr() as *mut v128, v128_load(src.as_ptr() as *const v128)) }
}

/// dst[4q + r] = src[r·stride + q] for q, r < 4: a 4×4 block transposed.
/// (Plain indexing: array `map`s and closures stay calls in the size-first
/// build, ~8 % of W1 measured.)
#[inline(always)]
fn transpose4(src: &[f32], stride: usize, dst: &mut [f32]) {
    let dst = &mut dst[..16];
    let (r0, r1, r2, r3) = (&src[..4], &src[stride..][..4], &src[2 * stride..][..4], &src[3 * stride..][..4]);
    // SAFETY: each row slice holds exactly 4 f32 and dst 16 (checked by
    // the slicing above); unaligned loads and stores are allowed.
    unsafe {
        let (x0, x1) = (v128_load(r0.as_ptr() as *const v128), v128_load(r1.as_ptr() as *const v128));
        let (x2, x3) = (v128_load(r2.as_ptr() as *const v128), v128_load(r3.as_ptr() as *const v128));
        // Interleave pairs of rows, then pairs of pairs.
        let t0 = i32x4_shuffle::<0, 4, 1, 5>(x0, x1);
        let t1 = i32x4_shuffle::<0, 4, 1, 5>(x2, x3);
        let t2 = i32x4_shuffle::<2, 6, 3, 7>(x0, x1);
        let t3 = i32x4_shuffle::<2, 6, 3, 7>(x2, x3);
        let o = dst.as_mut_ptr() as *mut v128;
        v128_store(o, i32x4_shuffle::<0, 1, 4, 5>(t0, t1));
        v128_store(o.add(1), i32x4_shuffle::<2, 3, 6, 7>(t0, t1));
        v128_store(o.add(2), i32x4_shuffle::<0, 1, 4, 5>(t2, t3));
        v128_store(o.add(3), i32x4_shuffle::<2, 3, 6, 7>(t2, t3));
    }
}

/// Where a register tile goes in dst: its first row and column, how many of
/// its MR × NR elements are inside dst, and dst's row stride.
#[derive(Clone, Copy)]
struct Tile {
    i: usize,
    j: usize,
    rows: usize,
    cols: usize,
    n: usize,
}

/// One MR × NR tile of dst: (dst if `accumulate`, else 0) + a panel × b panel.
#[inline(never)]
fn kernel(kc: usize, ap: &[f32], bp: &[f32], dst: &mut [f32], t: Tile, accumulate: bool) {
    assert!(ap.len() >= kc * MR && bp.len() >= kc * NR);
    assert!(t.rows <= MR && t.cols <= NR && (t.i + t.rows - 1) * t.n + t.j + t.cols <= dst.len());
    // The tile's current values (or zeros), through a local copy when the
    // tile sticks out of dst.
    let mut edge = [0.0f32; MR * NR];
    let full = t.rows == MR && t.cols == NR;
    if accumulate && !full {
        for r in 0..t.rows {
            edge[r * NR..][..t.cols].copy_from_slice(&dst[(t.i + r) * t.n + t.j..][..t.cols]);
        }
    }
    // Where the accumulators start from: a whole tile's rows in dst
    // (stride n), else `edge` (stride NR).
    let (e, es) = if accumulate && full { (dst[t.i * t.n + t.j..].as_ptr(), t.n) } else { (edge.as_ptr(), NR) };
    // SAFETY: every pointer below reads or writes inside a slice checked by
    // the asserts above: `edge` holds MR·NR floats (offsets < 32); a step
    // reads ap[p·MR .. p·MR + MR] and bp[p·NR .. p·NR + NR] for p < kc; the
    // full-tile loads and stores touch dst[(t.i + r)·n + t.j ..][..NR] for
    // r < MR, inside dst by the second assert with rows = MR, cols = NR.
    // v128_load/v128_store/v128_load32_splat need no alignment.
    unsafe {
        // Macros, not closures: nothing left for the size-first build to
        // keep as a call in the inner loop.
        macro_rules! ld {
            ($p:expr) => {
                v128_load($p as *const v128)
            };
        }
        let (mut c00, mut c01, mut c10, mut c11) = (ld!(e), ld!(e.add(4)), ld!(e.add(es)), ld!(e.add(es + 4)));
        let (mut c20, mut c21) = (ld!(e.add(2 * es)), ld!(e.add(2 * es + 4)));
        let (mut c30, mut c31) = (ld!(e.add(3 * es)), ld!(e.add(3 * es + 4)));
        let (mut a, mut b) = (ap.as_ptr(), bp.as_ptr());
        // Step q: a's MR elements and b's NR elements q steps ahead.
        macro_rules! step {
            ($q:expr) => {{
                let (a, b) = (a.add($q * MR), b.add($q * NR));
                let (b0, b1) = (ld!(b), ld!(b.add(4)));
                let x = v128_load32_splat(a as *const u32);
                c00 = f32x4_add(c00, f32x4_mul(x, b0));
                c01 = f32x4_add(c01, f32x4_mul(x, b1));
                let x = v128_load32_splat(a.add(1) as *const u32);
                c10 = f32x4_add(c10, f32x4_mul(x, b0));
                c11 = f32x4_add(c11, f32x4_mul(x, b1));
                let x = v128_load32_splat(a.add(2) as *const u32);
                c20 = f32x4_add(c20, f32x4_mul(x, b0));
                c21 = f32x4_add(c21, f32x4_mul(x, b1));
                let x = v128_load32_splat(a.add(3) as *const u32);
                c30 = f32x4_add(c30, f32x4_mul(x, b0));
                c31 = f32x4_add(c31, f32x4_mul(x, b1));
            }};
        }
        // One step per iteration: unrolled, LLVM hoisted every step's loads
        // of b to the top of the body, and V8 then spilled accumulators to
        // the stack inside the loop (seen with node --print-wasm-code).
        for _ in 0..kc {
            step!(0);
            a = a.add(MR);
            b = b.add(NR);
        }
        // Written out, not a loop over an array of vectors: the size-first
        // build keeps such a loop as iterator calls (~12 % of W1 measured).
        let (o, stride) = if full { (dst.as_mut_ptr().add(t.i * t.n + t.j), t.n) } else { (edge.as_mut_ptr(), NR) };
        macro_rules! st {
            ($r:expr, $c:expr, $x:expr) => {
                v128_store(o.add($r * stride + $c) as *mut v128, $x)
            };
        }
        st!(0, 0, c00);
        st!(0, 4, c01);
        st!(1, 0, c10);
        st!(1, 4, c11);
        st!(2, 0, c20);
        st!(2, 4, c21);
        st!(3, 0, c30);
        st!(3, 4, c31);
        if full {
            return;
        }
    }
    for r in 0..t.rows {
        dst[(t.i + r) * t.n + t.j..][..t.cols].copy_from_slice(&edge[r * NR..][..t.cols]);
    }
}
