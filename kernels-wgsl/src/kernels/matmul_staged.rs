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

/// One operand's part of the kernel. A thread reads one vec4 of it per
/// slab: either 4 k of one row of A (column of B), when the operand is
/// contiguous along k, or 4 rows of A (columns of B) at one k. The emitted
/// names end in the operand's letter (`ka`, `pa`, `va`, `sa` ...).
struct Operand {
    /// `a` or `b`: the binding, and the suffix of the emitted names.
    x: char,
    k_contiguous: bool,
    /// The operand's batch offset in the job.
    origin: &'static str,
    /// The tile's first row (A) or column (B), and the matrix's edge.
    first: &'static str,
    bound: &'static str,
    /// Words between rows of A (columns of B), and between consecutive k.
    line_stride: &'static str,
    k_stride: &'static str,
}

impl Operand {
    /// The thread's vec4: its k offset in the slab (`k`), its row or column
    /// (`r`, contiguous along k) or vec4 slot (`q`), and its word offset at
    /// k = 0 (`p`), the edge clamped (read, never stored).
    fn setup(&self) -> String {
        let Operand { x, origin, first, bound, line_stride, .. } = self;
        if self.k_contiguous {
            // 128 lines x 2 vec4s of 4 k: thread t reads line t / 2, k 4 (t % 2).
            format!(
                " let r{x} = t / 2u;\n let k{x} = 4u * (t % 2u);\n \
                 let p{x} = {origin} + min({first} + r{x}, {bound} - 1u) * {line_stride};\n"
            )
        } else {
            // 8 k x 32 vec4s of 4 lines: thread t reads k = t / 32, lines 4 (t % 32).
            format!(
                " let k{x} = t / 32u;\n let q{x} = t % 32u;\n \
                 let p{x} = {origin} + min({first} + 4u * q{x}, {bound} - 4u);\n"
            )
        }
    }

    /// The global read of the slab at `k0` into `v` (zeros past the chunk).
    fn read(&self, k0: &str) -> String {
        let Operand { x, k_stride, .. } = self;
        let at = if self.k_contiguous {
            format!("p{x} + {k0} + k{x}")
        } else {
            format!("p{x} + ({k0} + k{x}) * {k_stride}")
        };
        format!(" if ({k0} + k{x} < job.k_end) {{ v{x} = {x}[({at}) / 4u]; }} else {{ v{x} = vec4<f32>(0.0); }}\n")
    }

    /// The store of `v` into the slab buffer at slot `buf`.
    fn store(&self, buf: &str) -> String {
        let x = self.x;
        if self.k_contiguous {
            // Four k of one line: one component of four slots.
            (0..4).map(|i| format!(" s{x}[{buf} + k{x} + {i}u][r{x} / 4u][r{x} % 4u] = v{x}[{i}];\n")).collect()
        } else {
            format!(" s{x}[{buf} + k{x}][q{x}] = v{x};\n")
        }
    }
}

/// The entry point `main` for A read transposed (`ta`: contiguous along M)
/// or not (contiguous along K), and B transposed (`tb`: contiguous along
/// K) or not (contiguous along N). Appended to matmul_common.wgsl and
/// matmul_vec4.wgsl (whose `a` and `b` are arrays of vec4).
pub(crate) fn entry(ta: bool, tb: bool) -> String {
    let a = Operand {
        x: 'a',
        k_contiguous: !ta,
        origin: "job.oa",
        first: "row0",
        bound: "m",
        line_stride: "a_row",
        k_stride: "a_col",
    };
    let b = Operand {
        x: 'b',
        k_contiguous: tb,
        origin: "job.ob",
        first: "col0",
        bound: "n",
        line_stride: "b_col",
        k_stride: "b_row",
    };
    let read = |k0: &str| a.read(k0) + &b.read(k0);
    let store = |buf: &str| a.store(buf) + &b.store(buf);
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
    s.push_str(&a.setup());
    s.push_str(&b.setup());
    for i in 0..8 {
        s.push_str(&format!(" var c{i}l = vec4<f32>(0.0);\n var c{i}r = vec4<f32>(0.0);\n"));
    }
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
