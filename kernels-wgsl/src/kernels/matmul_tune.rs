//! Which of matmul.wgsl's entry points a product runs: products fall into
//! shape classes (M, N and K rounded up to powers of two, batched or not,
//! which operand is read along its rows), and natively the first product of
//! each class times the candidate kernels on a product of its shape (capped
//! at 512 x 512 x K_CHUNK, 2048 x 2048 on hardware adapters) in buffers of its own, keeps the fastest for the
//! backend's life and counts the trial. In a browser nothing may wait for
//! the GPU inside a launch, so the class's fixed rule decides there, as it
//! does natively with `KILN_MATMUL_TUNE=0`.
//!
//! The vec4 kernels (matmul_vec4.wgsl) are a candidate for products whose
//! operands they can read as aligned vec4s (a class of their own), and
//! natively on hardware adapters (not software ones such as lavapipe) so is
//! the staged kernel (matmul_staged.rs), which the fixed rule prefers there
//! for such products when both sides fill most of its 128 x 128 tile.
//!
//! Every kernel sums each output in the same order (matmul.wgsl), so the
//! choice changes the speed, not the bits.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
#[cfg(not(target_arch = "wasm32"))]
use std::time::Instant;

use kiln_core::{Error, Result};

#[cfg(not(target_arch = "wasm32"))]
use super::matmul_staged;
use super::matmul_vec4;
use crate::params::MatMul;
use crate::shaders::Kernel;
use crate::shaders::WG;
use crate::WgpuBackend;

/// matmul.wgsl's entry points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatMulKernel {
    /// 128 x 128 output tiles, 8 x 8 outputs per thread.
    Tile128,
    /// 64 x 64 output tiles, 4 x 4 outputs per thread.
    Tile64,
    /// One output per thread, no workgroup memory (tiny M or N).
    Skinny,
    /// 8 x 16 outputs per thread read straight from aligned vec4 operands
    /// (matmul_vec4.wgsl, for products it `takes`).
    Vec4,
    /// `Vec4` with 16 x 16 outputs per thread: natively a candidate the
    /// tuner times for products of at least 256 rows, in the browser the
    /// rule's pick on software adapters for any product `Vec4` takes.
    Vec4Tall,
    /// 128 x 128 tiles staged through double-buffered workgroup memory,
    /// read as aligned vec4s (matmul_staged.rs; native only, for the
    /// products `Vec4` takes; a candidate on hardware adapters).
    #[cfg(not(target_arch = "wasm32"))]
    Staged,
}

impl MatMulKernel {
    #[cfg(target_arch = "wasm32")]
    pub const ALL: [MatMulKernel; 5] =
        [MatMulKernel::Tile128, MatMulKernel::Tile64, MatMulKernel::Skinny, MatMulKernel::Vec4, MatMulKernel::Vec4Tall];
    #[cfg(not(target_arch = "wasm32"))]
    pub const ALL: [MatMulKernel; 6] = [
        MatMulKernel::Tile128,
        MatMulKernel::Tile64,
        MatMulKernel::Skinny,
        MatMulKernel::Vec4,
        MatMulKernel::Vec4Tall,
        MatMulKernel::Staged,
    ];

    pub fn entry(self) -> &'static str {
        match self {
            MatMulKernel::Tile128 => "tile128",
            MatMulKernel::Tile64 => "tile64",
            MatMulKernel::Skinny => "skinny",
            MatMulKernel::Vec4 | MatMulKernel::Vec4Tall => "main",
            #[cfg(not(target_arch = "wasm32"))]
            MatMulKernel::Staged => "main",
        }
    }

    /// The kernel named `name` (its entry point's name, or `vec4` /
    /// `staged`; any case), for `KILN_MATMUL_KERNEL`.
    pub fn from_name(name: &str) -> Option<MatMulKernel> {
        MatMulKernel::ALL.into_iter().find(|k| format!("{k:?}").eq_ignore_ascii_case(name))
    }

    /// The shader module holding this kernel for a product with parameters `p`.
    pub(crate) fn shader(self, p: &MatMul) -> Kernel {
        match self {
            MatMulKernel::Vec4 => {
                let (ta, tb) = matmul_vec4::layout(p);
                Kernel::MatMulVec4 { ta, tb, tall: false }
            }
            MatMulKernel::Vec4Tall => {
                let (ta, tb) = matmul_vec4::layout(p);
                Kernel::MatMulVec4 { ta, tb, tall: true }
            }
            #[cfg(not(target_arch = "wasm32"))]
            MatMulKernel::Staged => {
                let (ta, tb) = matmul_vec4::layout(p);
                Kernel::MatMulStaged { ta, tb }
            }
            _ => Kernel::MatMul,
        }
    }

    /// Whether this kernel can run the product with parameters `p` (the
    /// vec4 kernels need aligned operands; the others take any).
    fn takes(self, p: &MatMul) -> bool {
        match self {
            MatMulKernel::Vec4 | MatMulKernel::Vec4Tall => matmul_vec4::fits(p),
            #[cfg(not(target_arch = "wasm32"))]
            MatMulKernel::Staged => matmul_vec4::fits(p),
            _ => true,
        }
    }

    /// Workgroups along x and y for an m x n product.
    pub(crate) fn grid(self, m: usize, n: usize) -> (usize, usize) {
        match self {
            MatMulKernel::Tile128 => (n.div_ceil(128), m.div_ceil(128)),
            #[cfg(not(target_arch = "wasm32"))]
            MatMulKernel::Staged => (n.div_ceil(matmul_staged::TILE), m.div_ceil(matmul_staged::TILE)),
            MatMulKernel::Tile64 => (n.div_ceil(64), m.div_ceil(64)),
            MatMulKernel::Skinny => ((m.div_ceil(skinny_rows(m)) * n.div_ceil(4)).div_ceil(WG as usize), 1),
            MatMulKernel::Vec4 => (n.div_ceil(matmul_vec4::TILE_N), m.div_ceil(matmul_vec4::TILE_M)),
            MatMulKernel::Vec4Tall => (n.div_ceil(matmul_vec4::TILE_N), m.div_ceil(matmul_vec4::TALL_TILE_M)),
        }
    }

    /// Whether an m x n product fits this kernel's grid on an adapter whose
    /// grid dimensions stop at `max`.
    fn fits(self, m: usize, n: usize, max: usize) -> bool {
        let (x, y) = self.grid(m, n);
        x <= max && y <= max
    }
}

/// Products that should run alike: M, N and K as ceil(log2), capped at
/// 2^13; whether there is more than one batch; whether A is read along its
/// rows (a_col = 1) and B along its rows (b_col = 1); whether the vec4
/// kernels take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ShapeClass {
    m: u8,
    n: u8,
    k: u8,
    batched: bool,
    a_rows: bool,
    b_rows: bool,
    vec4: bool,
}

fn log2_class(x: usize) -> u8 {
    (x.max(1).next_power_of_two().trailing_zeros() as u8).min(13)
}

impl ShapeClass {
    fn of(p: &MatMul, batches: usize) -> ShapeClass {
        ShapeClass {
            m: log2_class(p.m as usize),
            n: log2_class(p.n as usize),
            k: log2_class(p.k as usize),
            batched: batches > 1,
            a_rows: p.a_col == 1,
            b_rows: p.b_col == 1,
            vec4: vec4_takes(p),
        }
    }
}

/// The backend's choices, made once per shape class.
pub(crate) struct Tuner {
    /// Time candidates (native, unless `KILN_MATMUL_TUNE=0`).
    measure: bool,
    /// `WgpuOptions::matmul_kernel`: every product that fits it uses it.
    forced: Option<MatMulKernel>,
    chosen: RefCell<HashMap<ShapeClass, MatMulKernel>>,
    /// Timed trials run (one per candidate per class).
    trials: Cell<usize>,
    /// A hardware adapter (not a software one such as lavapipe): the staged
    /// kernel is a candidate, and the rule's pick for large aligned products.
    hardware: bool,
}

impl Tuner {
    /// `forced` (`WgpuOptions::matmul_kernel`), else natively the kernel
    /// `KILN_MATMUL_KERNEL` names (an unknown name is an error), runs every
    /// product it can take.
    pub fn new(forced: Option<MatMulKernel>, hardware: bool) -> Result<Tuner> {
        let measure = cfg!(not(target_arch = "wasm32")) && std::env::var("KILN_MATMUL_TUNE").as_deref() != Ok("0");
        #[cfg(not(target_arch = "wasm32"))]
        let forced = match (forced, std::env::var("KILN_MATMUL_KERNEL")) {
            (None, Ok(name)) if !name.is_empty() => Some(MatMulKernel::from_name(&name).ok_or_else(|| {
                let names: Vec<String> = MatMulKernel::ALL.iter().map(|k| format!("{k:?}").to_lowercase()).collect();
                Error::invalid("wgpu", format!("KILN_MATMUL_KERNEL={name}: no such kernel; use {}", names.join(", ")))
            })?),
            _ => forced,
        };
        Ok(Tuner { measure, forced, chosen: RefCell::default(), trials: Cell::new(0), hardware })
    }

    /// Timed kernel trials so far.
    pub fn trials(&self) -> usize {
        self.trials.get()
    }

    /// The kernel for a product with parameters `p` (m, n, k, strides) over
    /// `batches` batches.
    pub fn choose(&self, be: &WgpuBackend, p: &MatMul, batches: usize) -> Result<MatMulKernel> {
        let (m, n) = (p.m as usize, p.n as usize);
        let max = be.ctx().limits.max_compute_workgroups_per_dimension.max(1) as usize;
        if let Some(k) = self.forced.filter(|k| k.fits(m, n, max) && k.takes(p)) {
            return Ok(k);
        }
        let class = ShapeClass::of(p, batches);
        if let Some(&k) = self.chosen.borrow().get(&class) {
            if k.fits(m, n, max) {
                return Ok(k);
            }
        }
        let candidates: Vec<MatMulKernel> = candidates(m, n, p.k as usize, class.vec4, self.hardware)
            .into_iter()
            .filter(|k| k.fits(m, n, max) && k.fits(m.min(512), n.min(512), max))
            .collect();
        let pick = match candidates.as_slice() {
            [] => {
                return Err(Error::unsupported(
                    "MatMul",
                    format!("{m} x {n} outputs exceed this adapter's dispatch grid"),
                ))
            }
            [only] => *only,
            _ if !self.measure => rule(m, n, p.k as usize, &candidates, self.hardware),
            // On a software adapter, a product the rule gives to the skinny
            // kernel for its short K (at most 16) keeps it: once its shapes
            // repeat it runs specialised (specialize.rs), its K loop a short
            // constant one, which a trial of the generic pipelines cannot
            // show. Measured on lavapipe, W2's conv1 forward (32 x 676 x 9
            // in 64 batches): generic skinny 50 ms, tile64 37 ms (the
            // trial's pick), specialised skinny 20 ms.
            _ if be.specializes()
                && !self.hardware
                && p.k <= 16
                && rule(m, n, p.k as usize, &candidates, self.hardware) == MatMulKernel::Skinny =>
            {
                MatMulKernel::Skinny
            }
            _ => self.fastest(be, p, batches, &candidates)?,
        };
        #[cfg(not(target_arch = "wasm32"))]
        if std::env::var_os("KILN_MATMUL_TUNE_LOG").is_some() {
            eprintln!(
                "kiln matmul: {m} x {n} x {} ({batches} batches, A rows {}, B rows {}): {candidates:?} -> {pick:?}",
                p.k, class.a_rows, class.b_rows
            );
        }
        self.chosen.borrow_mut().insert(class, pick);
        Ok(pick)
    }

    #[cfg(target_arch = "wasm32")]
    fn fastest(&self, _: &WgpuBackend, p: &MatMul, _: usize, candidates: &[MatMulKernel]) -> Result<MatMulKernel> {
        Ok(rule(p.m as usize, p.n as usize, p.k as usize, candidates, self.hardware))
    }

    /// The candidate that ran a product of `p`'s class fastest: three
    /// interleaved rounds (the first also pays first-use costs), each
    /// candidate's best time; the fixed rule's pick unless another beat it
    /// by more than 10 % (timings of tiny products are mostly noise, and a
    /// stable pick is a reproducible one).
    #[cfg(not(target_arch = "wasm32"))]
    fn fastest(
        &self,
        be: &WgpuBackend,
        p: &MatMul,
        batches: usize,
        candidates: &[MatMulKernel],
    ) -> Result<MatMulKernel> {
        // A hardware adapter runs a 512 x 512 product in tens of
        // microseconds, about what submitting and waiting cost, and with a
        // few dozen workgroups it leaves most of a large GPU idle, which
        // favours small tiles that lose on the real product (seen on an
        // NVIDIA H200: 64 tiles picked for 4096³, where they ran at 0.75x
        // the 128 tiles). There a trial's product is up to 2048 x 2048 and
        // runs 16 times in one pass.
        let trial = Trial::new(be, p, batches, if self.hardware { 2048 } else { 512 });
        let reps = if self.hardware { 16 } else { 1 };
        let mut best = vec![f64::INFINITY; candidates.len()];
        for _round in 0..3 {
            for (i, &k) in candidates.iter().enumerate() {
                best[i] = best[i].min(trial.run(be, k, reps)?);
                self.trials.set(self.trials.get() + 1);
            }
        }
        let ruled = rule(p.m as usize, p.n as usize, p.k as usize, candidates, self.hardware);
        let ruled_time = best[candidates.iter().position(|&k| k == ruled).expect("the rule picks a candidate")];
        let (i, fastest) = best.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).expect("candidates");
        Ok(if *fastest < ruled_time / 1.1 { candidates[i] } else { ruled })
    }
}

/// Rows of a skinny thread's block of outputs (4 x 4, or 1 x 4 when M < 4):
/// matmul.wgsl's `skinny_rows`.
fn skinny_rows(m: usize) -> usize {
    if m >= 4 {
        4
    } else {
        1
    }
}

/// Whether the vec4 kernels take the product with parameters `p`.
fn vec4_takes(p: &MatMul) -> bool {
    matmul_vec4::fits(p)
}

/// The kernels worth trying for an m x n x k product: the skinny kernel only
/// when M or N is small or K is (its 4 x 4 blocks need no 16-deep slab),
/// the 128 tile only when it would not be mostly padding, the vec4 kernel when it takes the product (`vec4`), and then
/// its tall variant (natively from 256 rows, its 64-row tile mostly full) and,
/// natively on a hardware adapter, the staged kernel when the 128 tile is a
/// candidate.
fn candidates(m: usize, n: usize, k: usize, vec4: bool, hardware: bool) -> Vec<MatMulKernel> {
    let mut v = Vec::new();
    if m.max(n) > 64 {
        v.push(MatMulKernel::Tile128);
    }
    v.push(MatMulKernel::Tile64);
    if m.min(n) <= 32 || k <= 16 {
        v.push(MatMulKernel::Skinny);
    }
    if vec4 {
        v.push(MatMulKernel::Vec4);
        // Natively a trial decides, worth it from 256 rows; in the browser
        // the rule takes it for any product on a software adapter.
        if m >= 256 || cfg!(target_arch = "wasm32") {
            v.push(MatMulKernel::Vec4Tall);
        }
        #[cfg(not(target_arch = "wasm32"))]
        if hardware && m.max(n) > 64 {
            v.push(MatMulKernel::Staged);
        }
    }
    let _ = hardware;
    v
}

/// Without timing (in the browser, and natively with `KILN_MATMUL_TUNE=0`),
/// and the pick a measured candidate must beat by 10 %: the skinny kernel
/// when M or N is at most 16, or when K is at most 16 (a 16-deep slab of the
/// tiled kernels would be mostly padding: W1's 128 x 512 x 10 product took
/// 10.7 ms by the 128 tile on SwiftShader, 1.4 ms by skinny 4 x 4 blocks);
/// the 128 tile when both sides fill most of it; the 64 tile otherwise. Fitted to the tuner's measured picks
/// on lavapipe for all 20 product classes of W1, W2 and W4 (2026-12-01):
/// the earlier rule (128 tiles only from 256 x 256, a thread per output only
/// up to 8) disagreed on 9 of them and made W2 2.2x slower there.
fn rule(m: usize, n: usize, k: usize, candidates: &[MatMulKernel], hardware: bool) -> MatMulKernel {
    let skinny = (m.min(n) <= 16 || k <= 16) && candidates.contains(&MatMulKernel::Skinny);
    // On a hardware adapter, the staged kernel where it takes the product
    // and both sides fill most of its tile (measured on an NVIDIA H200).
    #[cfg(not(target_arch = "wasm32"))]
    if !skinny && hardware && m.min(n) >= 96 && candidates.contains(&MatMulKernel::Staged) {
        return MatMulKernel::Staged;
    }
    // In the browser (no tuner) on a software adapter, the tall vec4
    // kernel: measured on Chromium's SwiftShader (natively, unspecialised,
    // unfused, forced on every product it takes; three interleaved pairs)
    // 1024³ 0.70-0.82 s against 0.90-1.11 s, W1 121-133 ms against
    // 137-145 ms, W2 within 3 %. Natively the tuner decides (on lavapipe it
    // is 16 % faster on 1024³ but slower on W2's products).
    #[cfg(target_arch = "wasm32")]
    if !skinny && !hardware && candidates.contains(&MatMulKernel::Vec4Tall) {
        return MatMulKernel::Vec4Tall;
    }
    // The vec4 kernel where it takes the product (measured on lavapipe:
    // 1.5-2.3x the 128 tile at 128 x 784 x 512 and 1024^3, in all four
    // operand layouts).
    if !skinny && candidates.contains(&MatMulKernel::Vec4) {
        return MatMulKernel::Vec4;
    }
    let _ = hardware;
    let want = if skinny {
        MatMulKernel::Skinny
    } else if m.min(n) >= 96 && m.max(n) >= 128 {
        MatMulKernel::Tile128
    } else {
        MatMulKernel::Tile64
    };
    if candidates.contains(&want) {
        want
    } else {
        candidates[0]
    }
}

#[cfg(not(target_arch = "wasm32"))]
/// A product of a class's shape, at most edge x edge x K_CHUNK (and about
/// edge² outputs over its batches; edge is 512 on software adapters, 2048
/// on hardware ones), in buffers of its own: the trial runs
/// apart from the execution being recorded, whose buffers may still hold
/// values its earlier dispatches read.
struct Trial {
    params: MatMul,
    batches: usize,
    a: wgpu::Buffer,
    b: wgpu::Buffer,
    out: wgpu::Buffer,
    params_buffer: wgpu::Buffer,
}

#[cfg(not(target_arch = "wasm32"))]
impl Trial {
    fn new(be: &WgpuBackend, p: &MatMul, batches: usize, edge: usize) -> Trial {
        let m = (p.m as usize).min(edge);
        let n = (p.n as usize).min(edge);
        let k = (p.k as usize).clamp(1, super::matmul::K_CHUNK);
        let batches = batches.clamp(1, ((edge * edge) / (m * n).max(1)).max(1));
        let (a_row, a_col) = if p.a_col == 1 { (k, 1) } else { (1, m) };
        let (b_row, b_col) = if p.b_col == 1 { (n, 1) } else { (1, k) };
        let mut params = MatMul {
            m: m as u32,
            n: n as u32,
            k: k as u32,
            a_row: a_row as u32,
            a_col: a_col as u32,
            b_row: b_row as u32,
            b_col: b_col as u32,
            chunk: k as u32,
            chunks: 1,
            ..MatMul::default()
        };
        if batches > 1 {
            params.batch_rank = 1;
            params.batch_dims[0] = batches as u32;
            params.a_batch[0] = (m * k) as u32;
            params.b_batch[0] = (k * n) as u32;
        }
        let device = &be.ctx().device;
        let buffer = |label: &str, words: usize, usage: wgpu::BufferUsages| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: (words.max(1) * 4) as u64,
                usage,
                mapped_at_creation: false,
            })
        };
        let storage = wgpu::BufferUsages::STORAGE;
        let params_words = crate::params::words(&params);
        let params_buffer =
            buffer("kiln matmul trial params", params_words.len(), storage | wgpu::BufferUsages::COPY_DST);
        be.ctx().queue.write_buffer(&params_buffer, 0, bytemuck::cast_slice(params_words));
        Trial {
            params,
            batches,
            a: buffer("kiln matmul trial a", batches * m * k, storage),
            b: buffer("kiln matmul trial b", batches * k * n, storage),
            out: buffer("kiln matmul trial out", batches * m * n, storage),
            params_buffer,
        }
    }

    /// Seconds from submitting `reps` runs of `kernel` (one pass) to their
    /// completion.
    fn run(&self, be: &WgpuBackend, kernel: MatMulKernel, reps: usize) -> Result<f64> {
        const OP: &str = "MatMul";
        let pipeline = be.pipeline(OP, kernel.shader(&self.params), kernel.entry())?;
        let ctx = be.ctx();
        fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
            wgpu::BindGroupEntry { binding, resource: buffer.as_entire_binding() }
        }
        let group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("kiln matmul trial"),
            layout: &pipeline.layout,
            entries: &[entry(0, &self.params_buffer), entry(1, &self.a), entry(2, &self.b), entry(3, &self.out)],
        });
        let (x, y) = kernel.grid(self.params.m as usize, self.params.n as usize);
        let mut encoder = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kiln") });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(&pipeline.pipeline);
            pass.set_bind_group(0, &group, &[]);
            for _ in 0..reps {
                pass.dispatch_workgroups(x as u32, y as u32, self.batches as u32);
            }
        }
        let start = Instant::now();
        ctx.queue.submit([encoder.finish()]);
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::backend(OP, format!("waiting for a matmul kernel trial failed: {e}")))?;
        let secs = start.elapsed().as_secs_f64();
        ctx.errors.check(OP)?;
        Ok(secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_to_powers_of_two() {
        let p = |m, n, k, a_col, b_col| MatMul { m, n, k, a_col, b_col, ..MatMul::default() };
        assert_eq!(ShapeClass::of(&p(1000, 1024, 516, 1, 1), 1), ShapeClass::of(&p(516, 700, 1024, 1, 1), 1));
        // Operands the vec4 kernels cannot read (K = 513) are a class apart.
        assert_ne!(ShapeClass::of(&p(1000, 1024, 513, 1, 1), 1), ShapeClass::of(&p(1000, 1024, 516, 1, 1), 1));
        assert_ne!(ShapeClass::of(&p(1024, 1024, 1024, 1, 1), 1), ShapeClass::of(&p(1025, 1024, 1024, 1, 1), 1));
        assert_ne!(ShapeClass::of(&p(64, 64, 64, 1, 1), 1), ShapeClass::of(&p(64, 64, 64, 64, 1), 1));
        assert_ne!(ShapeClass::of(&p(64, 64, 64, 1, 1), 1), ShapeClass::of(&p(64, 64, 64, 1, 1), 2));
        assert_eq!(log2_class(0), 0);
        assert_eq!(log2_class(1 << 20), 13);
    }

    #[test]
    fn the_rule_prefers_threads_per_output_for_vectors_and_big_tiles_for_big_products() {
        let pick = |m, n, k| rule(m, n, k, &candidates(m, n, k, false, false), false);
        use MatMulKernel::*;
        assert_eq!(pick(1, 4096, 64), Skinny);
        assert_eq!(pick(4096, 1, 64), Skinny);
        assert_eq!(pick(1024, 1024, 1024), Tile128);
        assert_eq!(pick(32, 32, 32), Tile64);
        assert!(!candidates(64, 64, 64, false, false).contains(&Tile128));
        assert!(!candidates(64, 64, 64, false, false).contains(&Skinny));
        // The tuner's picks on lavapipe for the products of W1, W2 and W4
        // (the K = 10 ones re-measured 2026-12-07 with the skinny kernel's
        // 4 x 4 blocks among the candidates: skinny, where tiles were picked
        // before).
        for (m, n, k, want) in [
            (10, 128, 64, Skinny),
            (128, 1600, 64, Tile128),
            (288, 121, 64, Tile128),
            (32, 676, 9, Skinny),
            (32, 9, 676, Skinny),
            (64, 10, 128, Skinny),
            (64, 121, 288, Tile64),
            (64, 128, 10, Skinny),
            (64, 128, 1600, Tile64),
            (64, 1600, 128, Tile64),
            (64, 288, 121, Tile64),
            (10, 512, 128, Skinny),
            (128, 10, 512, Skinny),
            (128, 512, 10, Skinny),
            (128, 512, 512, Tile128),
            (128, 512, 784, Tile128),
            (512, 512, 128, Tile128),
            (512, 784, 128, Tile128),
        ] {
            assert_eq!(pick(m, n, k), want, "{m} x {n} x {k}");
        }
    }

    /// The staged kernel is a candidate only on hardware adapters, only for
    /// products the vec4 kernels take, and the rule's pick there when both
    /// sides fill most of its tile; software adapters keep their picks.
    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn the_staged_kernel_is_for_hardware_adapters() {
        use MatMulKernel::*;
        let pick = |m, n, k, vec4, hardware| rule(m, n, k, &candidates(m, n, k, vec4, hardware), hardware);
        assert!(!candidates(4096, 4096, 4096, true, false).contains(&Staged));
        assert!(!candidates(4096, 4096, 4096, false, true).contains(&Staged));
        assert!(candidates(4096, 4096, 4096, true, true).contains(&Staged));
        assert_eq!(pick(4096, 4096, 4096, true, true), Staged);
        assert_eq!(pick(128, 512, 784, true, true), Staged);
        assert_eq!(pick(4096, 4096, 4096, true, false), Vec4);
        assert_eq!(pick(64, 128, 1600, true, true), Vec4);
        assert_eq!(pick(10, 512, 128, true, true), Skinny);
        assert_eq!(pick(4096, 4096, 4096, false, true), Tile128);
    }
}
