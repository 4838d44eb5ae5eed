//! matmul_vec4.wgsl's kernels: which products they can take
//! and the generated entry point of each operand layout.
//!
//! The entry point is generated rather than written because its speed on a
//! software adapter depends on the 32 accumulators and the operand vec4s
//! being separate variables: the same loops over WGSL arrays (`var acc:
//! array<vec4<f32>, 32>`) measured 6x slower on lavapipe, which keeps such
//! arrays in memory. The browser build has them too (+1.85 KB gzipped; in
//! Chromium's software WebGPU about 2x on W1, docs/performance.md).

use crate::params::MatMul;

/// Output rows per thread.
const ROWS: usize = 8;
/// Output rows per thread of the tall variant (`MatMulKernel::Vec4Tall`):
/// 64 accumulators, a 64 x 128 tile per workgroup, half the loads of B per
/// multiply-add. Measured on lavapipe (2 threads): 1024³ in 90-93 ms
/// against 108-109 ms with 8 rows, while W2's products ran 5-10 % slower
/// with it, so natively it is a candidate the tuner times, not the rule's
/// pick. The browser has no tuner: there the rule picks it on software
/// adapters (SwiftShader: 1024³ 0.70-0.82 s against 0.90-1.11 s, W1 about
/// 11 % faster).
const TALL_ROWS: usize = 16;
/// Output vec4 columns per thread (16 columns).
const COLS4: usize = 4;
/// Threads per workgroup along the columns and along the rows.
const WG_X: usize = 8;
const WG_Y: usize = 4;
/// The output tile of one workgroup.
pub(crate) const TILE_M: usize = ROWS * WG_Y;
pub(crate) const TALL_TILE_M: usize = TALL_ROWS * WG_Y;
pub(crate) const TILE_N: usize = COLS4 * 4 * WG_X;

/// Output rows per thread of the variant (`tall` or not).
fn rows(tall: bool) -> usize {
    if tall {
        TALL_ROWS
    } else {
        ROWS
    }
}

/// Whether every vec4 the kernel reads for `p` is whole and aligned: A read
/// along its rows (a_col = 1) with K and the row stride multiples of 4, or
/// transposed (a_row = 1) with M and the column stride multiples of 4; B
/// alike with N (along rows) or K (transposed); batch strides multiples of 4.
pub(crate) fn fits(p: &MatMul) -> bool {
    let four = |x: u32| x % 4 == 0;
    let a = if p.a_col == 1 { four(p.k) && four(p.a_row) } else { p.a_row == 1 && four(p.m) && four(p.a_col) };
    let b = if p.b_col == 1 { four(p.n) && four(p.b_row) } else { p.b_row == 1 && four(p.k) && four(p.b_col) };
    let rank = (p.batch_rank as usize).min(p.a_batch.len());
    let batches = p.a_batch[..rank].iter().chain(&p.b_batch[..rank]).all(|&s| four(s));
    a && b && batches && p.m > 0 && p.n > 0
}

/// The layout `fits` found for `p`: (A transposed, B transposed).
pub(crate) fn layout(p: &MatMul) -> (bool, bool) {
    (p.a_col != 1, p.b_col != 1)
}

/// The entry point `main` for A (`ta`: read transposed, contiguous along
/// M) and B (`tb`: transposed, contiguous along K), with 8 output rows per
/// thread (16 when `tall`). Per 4 k a thread loads its rows of A (one vec4
/// per row along k, or one per 4 rows per k along the rows) and its 16
/// columns of B (4 vec4s per k along the columns, or 16 along k), then adds
/// the products for each k in increasing order.
pub(crate) fn entry(ta: bool, tb: bool, tall: bool) -> String {
    const C: [&str; 4] = ["x", "y", "z", "w"];
    let row_count = rows(tall);
    let mut s = String::new();
    let mut line = |text: String| {
        s.push_str(&text);
        s.push('\n');
    };
    line(format!("@compute @workgroup_size({WG_X}, {WG_Y})"));
    line("fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {".into());
    line("    let job = job_of(wid.z);".into());
    line(format!("    let row0 = (wid.y * {WG_Y}u + lid.y) * {row_count}u;"));
    // A thread's vec4 columns are WG_X vec4s apart, so that neighbouring
    // threads (SIMD lanes) read neighbouring vec4s of B.
    line(format!("    let col0 = wid.x * {TILE_N}u + lid.x * 4u;"));
    for i in 0..row_count {
        for j in 0..COLS4 {
            line(format!("    var c{i}_{j} = vec4<f32>(0.0);"));
        }
    }
    // Word offsets of the first k of each row of A and column of B,
    // clamped to the last row or column (read, not stored).
    if ta {
        for g in 0..row_count / 4 {
            line(format!("    let pa{g} = job.oa + min(row0 + {}u, params.m - 4u);", 4 * g));
        }
    } else {
        for i in 0..row_count {
            line(format!("    let pa{i} = job.oa + min(row0 + {i}u, params.m - 1u) * params.a_row;"));
        }
    }
    for j in 0..COLS4 {
        if tb {
            for q in 0..4 {
                let col = 4 * WG_X * j + q;
                line(format!("    let pb{j}_{q} = job.ob + min(col0 + {col}u, params.n - 1u) * params.b_col;"));
            }
        } else {
            line(format!("    let pb{j} = job.ob + min(col0 + {}u, params.n - 4u);", 4 * WG_X * j));
        }
    }
    line("    for (var k0 = job.k_begin; k0 < job.k_end; k0 = k0 + 4u) {".into());
    if !ta {
        for i in 0..row_count {
            line(format!("        let a{i} = a[(pa{i} + k0) / 4u];"));
        }
    }
    if tb {
        for j in 0..COLS4 {
            for q in 0..4 {
                line(format!("        let bt{j}_{q} = b[(pb{j}_{q} + k0) / 4u];"));
            }
        }
    }
    for (kq, c) in C.iter().enumerate() {
        line("        {".into());
        let a_of: Vec<String> = if ta {
            line(format!("            let ka = (k0 + {kq}u) * params.a_col;"));
            for g in 0..row_count / 4 {
                line(format!("            let ag{g} = a[(pa{g} + ka) / 4u];"));
            }
            (0..row_count).map(|i| format!("ag{}.{}", i / 4, C[i % 4])).collect()
        } else {
            (0..row_count).map(|i| format!("a{i}.{c}")).collect()
        };
        if tb {
            for j in 0..COLS4 {
                line(format!("            let b{j} = vec4<f32>(bt{j}_0.{c}, bt{j}_1.{c}, bt{j}_2.{c}, bt{j}_3.{c});"));
            }
        } else {
            line(format!("            let kb = (k0 + {kq}u) * params.b_row;"));
            for j in 0..COLS4 {
                line(format!("            let b{j} = b[(pb{j} + kb) / 4u];"));
            }
        }
        for (i, a) in a_of.iter().enumerate() {
            for j in 0..COLS4 {
                line(format!("            c{i}_{j} += {a} * b{j};"));
            }
        }
        line("        }".into());
    }
    line("    }".into());
    for i in 0..row_count {
        for j in 0..COLS4 {
            line(format!("    store4(job, row0 + {i}u, col0 + {}u, c{i}_{j});", 4 * WG_X * j));
        }
    }
    line("}".into());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(m: u32, n: u32, k: u32, (a_row, a_col): (u32, u32), (b_row, b_col): (u32, u32)) -> MatMul {
        MatMul { m, n, k, a_row, a_col, b_row, b_col, ..MatMul::default() }
    }

    #[test]
    fn only_aligned_whole_vec4_reads_fit() {
        assert!(fits(&p(128, 512, 784, (784, 1), (512, 1))));
        assert!(fits(&p(512, 784, 128, (1, 512), (784, 1))));
        assert!(fits(&p(128, 512, 512, (512, 1), (1, 512))));
        assert!(fits(&p(36, 132, 20, (1, 36), (1, 20))));
        // K, N or M (transposed A) not a multiple of 4.
        assert!(!fits(&p(128, 512, 10, (10, 1), (512, 1))));
        assert!(!fits(&p(128, 10, 512, (512, 1), (10, 1))));
        assert!(!fits(&p(30, 8, 8, (1, 30), (8, 1))));
        // A batch stride that is not.
        let mut q = p(8, 8, 8, (8, 1), (8, 1));
        q.batch_rank = 1;
        q.batch_dims[0] = 3;
        q.a_batch[0] = 66;
        q.b_batch[0] = 64;
        assert!(!fits(&q));
        q.a_batch[0] = 0;
        assert!(fits(&q));
    }
}
