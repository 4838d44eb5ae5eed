//! The staged vec4 matmul kernel (native only): for GPUs, the products
//! `matmul_vec4::fits` takes (operands readable as whole, aligned vec4s).
//!
//! 16 x 16 threads compute a 128 x 128 output tile, 8 x 8 outputs per
//! thread (two 4-row blocks 64 rows apart by two 4-column blocks 64 columns
//! apart, as matmul.wgsl's `tile128`). A and B go through workgroup memory
//! in slabs of 8 k, double-buffered (16 KiB, WebGPU's guaranteed workgroup
//! storage): each thread reads one vec4 of A and one of B per slab from
//! global memory into registers while the workgroup multiplies the slab
//! already staged, then stores them into the other buffer, so a slab costs
//! one barrier and its global reads overlap the arithmetic.
//!
//! `tile128` on an NVIDIA H200 (Vulkan) ran 4096³ at about 7 TFLOP/s, a
//! tenth of the FP32 peak: per slab of 16 k every thread issued 16 scalar,
//! bounds-checked global reads whose addresses it computed from parameters
//! re-read from a storage buffer, and the workgroup waited at two barriers.
//! Here the parameters are read once, global reads are whole vec4s, rows
//! and columns past the output's edge read the last one (in bounds, never
//! stored), and only the k range is tested (K is a multiple of 4, so a
//! vec4 is wholly in or out).
//!
//! Each output is still summed in increasing k from the chunk's start, one
//! product at a time, with zeros past the chunk's end, as every matmul
//! kernel does: the same bits as the others.

/// k values per staged slab.
const BK: u32 = 8;
/// The output tile edge of one workgroup.
pub(crate) const TILE: usize = 128;

/// The entry point `main` for A read transposed (`ta`: contiguous along M)
/// or not (contiguous along K), and B transposed (`tb`: contiguous along
/// K) or not (contiguous along N). Appended to matmul_common.wgsl and
/// matmul_vec4.wgsl (whose `a` and `b` are arrays of vec4).
pub(crate) fn entry(ta: bool, tb: bool) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "var<workgroup> sa: array<array<vec4<f32>, 32>, {slots}>;\n\
         var<workgroup> sb: array<array<vec4<f32>, 32>, {slots}>;\n",
        slots = 2 * BK
    ));
    s.push_str("@compute @workgroup_size(16, 16)\n");
    s.push_str("fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {\n");
    s.push_str(" let job = job_of(wid.z);\n");
    s.push_str(" let m = params.m;\n let n = params.n;\n");
    s.push_str(" let a_row = params.a_row;\n let a_col = params.a_col;\n");
    s.push_str(" let b_row = params.b_row;\n let b_col = params.b_col;\n");
    s.push_str(" let row0 = wid.y * 128u;\n let col0 = wid.x * 128u;\n");
    s.push_str(" let t = lid.y * 16u + lid.x;\n");
    // Which vec4 of the slab this thread reads, as a word offset at slab
    // k0 = 0 (pa, pb) plus k0 times the operand's k stride.
    if ta {
        // 8 k x 32 vec4s of 4 rows: thread t reads k = t / 32, rows 4 (t % 32).
        s.push_str(" let ka = t / 32u;\n let qa = t % 32u;\n");
        s.push_str(" let pa = job.oa + min(row0 + 4u * qa, m - 4u);\n");
    } else {
        // 128 rows x 2 vec4s of 4 k: thread t reads row t / 2, k 4 (t % 2).
        s.push_str(" let ra = t / 2u;\n let ka = 4u * (t % 2u);\n");
        s.push_str(" let pa = job.oa + min(row0 + ra, m - 1u) * a_row;\n");
    }
    if tb {
        s.push_str(" let cb = t / 2u;\n let kb = 4u * (t % 2u);\n");
        s.push_str(" let pb = job.ob + min(col0 + cb, n - 1u) * b_col;\n");
    } else {
        s.push_str(" let kb = t / 32u;\n let qb = t % 32u;\n");
        s.push_str(" let pb = job.ob + min(col0 + 4u * qb, n - 4u);\n");
    }
    for i in 0..8 {
        s.push_str(&format!(" var c{i}l = vec4<f32>(0.0);\n var c{i}r = vec4<f32>(0.0);\n"));
    }
    // Global reads of the slab at k0 into va, vb (zeros past the chunk).
    let read = |k0: &str| {
        let mut r = String::new();
        if ta {
            r.push_str(&format!(" if ({k0} + ka < job.k_end) {{ va = a[(pa + ({k0} + ka) * a_col) / 4u]; }} else {{ va = vec4<f32>(0.0); }}\n"));
        } else {
            r.push_str(&format!(
                " if ({k0} + ka < job.k_end) {{ va = a[(pa + {k0} + ka) / 4u]; }} else {{ va = vec4<f32>(0.0); }}\n"
            ));
        }
        if tb {
            r.push_str(&format!(
                " if ({k0} + kb < job.k_end) {{ vb = b[(pb + {k0} + kb) / 4u]; }} else {{ vb = vec4<f32>(0.0); }}\n"
            ));
        } else {
            r.push_str(&format!(" if ({k0} + kb < job.k_end) {{ vb = b[(pb + ({k0} + kb) * b_row) / 4u]; }} else {{ vb = vec4<f32>(0.0); }}\n"));
        }
        r
    };
    // Stores of va, vb into buffer `buf` (slots buf * BK ..).
    let store = |buf: &str| {
        let mut r = String::new();
        if ta {
            r.push_str(&format!(" sa[{buf} + ka][qa] = va;\n"));
        } else {
            // Four k of one row: one component of four slots.
            for i in 0..4 {
                r.push_str(&format!(" sa[{buf} + ka + {i}u][ra / 4u][ra % 4u] = va[{i}];\n"));
            }
        }
        if tb {
            for i in 0..4 {
                r.push_str(&format!(" sb[{buf} + kb + {i}u][cb / 4u][cb % 4u] = vb[{i}];\n"));
            }
        } else {
            r.push_str(&format!(" sb[{buf} + kb][qb] = vb;\n"));
        }
        r
    };
    s.push_str(" var va: vec4<f32>;\n var vb: vec4<f32>;\n");
    s.push_str(&read("job.k_begin"));
    s.push_str(&store("0u"));
    s.push_str(" workgroupBarrier();\n");
    s.push_str(" var buf = 0u;\n");
    s.push_str(&format!(" for (var k0 = job.k_begin; k0 < job.k_end; k0 = k0 + {BK}u) {{\n"));
    s.push_str(&format!(" let next = k0 + {BK}u;\n let more = next < job.k_end;\n"));
    s.push_str(" if (more) {\n");
    s.push_str(&read("next"));
    s.push_str(" }\n");
    s.push_str(&format!(" for (var kk = 0u; kk < {BK}u; kk = kk + 1u) {{\n"));
    s.push_str(" let a0 = sa[buf + kk][lid.y];\n let a1 = sa[buf + kk][lid.y + 16u];\n");
    s.push_str(" let b0 = sb[buf + kk][lid.x];\n let b1 = sb[buf + kk][lid.x + 16u];\n");
    for (i, (v, c)) in
        [("a0", "x"), ("a0", "y"), ("a0", "z"), ("a0", "w"), ("a1", "x"), ("a1", "y"), ("a1", "z"), ("a1", "w")]
            .iter()
            .enumerate()
    {
        s.push_str(&format!(" c{i}l += {v}.{c} * b0;\n c{i}r += {v}.{c} * b1;\n"));
    }
    s.push_str(" }\n");
    s.push_str(&format!(" let other = {BK}u - buf;\n"));
    s.push_str(" if (more) {\n");
    s.push_str(&store("other"));
    s.push_str(" }\n");
    s.push_str(" workgroupBarrier();\n");
    s.push_str(" buf = other;\n");
    s.push_str(" }\n");
    s.push_str(" let r0 = row0 + lid.y * 4u;\n let r1 = r0 + 64u;\n");
    s.push_str(" let cl = col0 + lid.x * 4u;\n let cr = cl + 64u;\n");
    for i in 0..8 {
        let row = if i < 4 { format!("r0 + {i}u") } else { format!("r1 + {}u", i - 4) };
        s.push_str(&format!(" store4(job, {row}, cl, c{i}l);\n store4(job, {row}, cr, c{i}r);\n"));
    }
    s.push_str("}\n");
    s
}
