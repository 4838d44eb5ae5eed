//! Launches matmul.wgsl: operand geometry (transposes as strides, broadcast
//! batch axes) computed on the host, the entry point chosen per shape class
//! (`matmul_tune`), batches over the z limit split into several dispatches,
//! K above `K_CHUNK` split into chunks whose products are combined by the
//! summation rule's tree (docs/reductions.md).

use kiln_core::backend::checks::MatMulGeometry;
use kiln_core::backend::{BufferId, TensorRef};
use kiln_core::shape::fmt_dims;
use kiln_core::{DType, Error, Result};

use super::unsupported_dtype;
use crate::geometry::word;
use crate::params::{words, Chunks, MatMul};
use crate::shaders::{Kernel, MAX_DIMS};
use crate::{Arg, WgpuBackend};

use super::matmul_tune::MatMulKernel;

const OP: &str = "MatMul";
/// Longest run of k one invocation sums (as the CPU's K_CHUNK: 8 leaves of
/// the rule). Longer K is split into chunks of this many.
pub(crate) const K_CHUNK: usize = 1024;
/// Chunk products one `combine` invocation reduces (FAN_IN in matmul.wgsl).
const FAN_IN: usize = 64;
/// Scratch for chunk products held at once, in bytes, unless
/// `WgpuOptions::max_matmul_scratch_bytes` sets it.
pub(crate) const SCRATCH_BYTES: u64 = 64 << 20;
/// The same on a discrete GPU: enough for a 4096 x 4096 product's four K
/// chunks at once, which then run as one dispatch and one combining pass
/// (with 64 MiB, one dispatch per chunk and three accumulating passes plus a
/// copy: 5.2 ms per 4096³ product on an NVIDIA H200, 0.9 ms of it outside
/// the product's kernels).
pub(crate) const SCRATCH_BYTES_DISCRETE: u64 = 256 << 20;

/// A product's launch as `matmul` prepares it: the parameters (single
/// chunk and first dispatch fields still to set), the tuner's kernel, its
/// grid along x and y, the batches (along z) and the K chunks.
pub(crate) struct Launch {
    pub params: MatMul,
    pub kernel: MatMulKernel,
    pub grid: (u32, u32),
    pub batches: usize,
    pub chunks: usize,
}

/// Check a product and prepare its launch; None when it has no outputs.
/// Shared by `matmul` and the fused epilogue kernel (kernels/fused/head.rs),
/// so that both run the same kernel on the same parameters.
pub(crate) fn prepare(
    be: &WgpuBackend,
    ta: bool,
    tb: bool,
    [a, b]: &[TensorRef<'_>; 2],
    out_dims: &[usize],
    out_dtype: DType,
) -> Result<Option<Launch>> {
    if a.dtype != out_dtype || b.dtype != out_dtype {
        return Err(Error::backend(OP, "operand dtypes differ from the output's"));
    }
    if out_dtype != DType::F32 {
        return Err(unsupported_dtype(OP, out_dtype));
    }
    let g = MatMulGeometry::new(ta, tb, a.dims, b.dims, out_dims)?;
    let (mut m, k, n) = (g.m, g.k, g.n);
    let (ma, mb, bo, sa, sb) = (g.a, g.b, g.batch, &g.a_batch_strides, &g.b_batch_strides);
    // Batch axes that are broadcast in both operands need no unravelling
    // apart; merge what can be merged.
    let (mut cd, mut cs) = crate::geometry::collapse(bo, &[sa, sb]);
    // A shared B (a Linear layer's weight over [batch, rows, features]) with
    // A's rows continuing from one batch to the next is one product with
    // more rows: larger tiles instead of a small product per batch. Each
    // output is summed over the same k in the same order, so the bits do not
    // change.
    if let Some(last) = cd.len().checked_sub(1) {
        if cs[1][last] == 0 && cs[0][last] == m * ma.rs {
            m *= cd[last];
            cd.pop();
            cs[0].pop();
            cs[1].pop();
        }
    }
    if cd.len() > MAX_DIMS {
        return Err(Error::unsupported(
            OP,
            format!("more than {MAX_DIMS} unmergeable batch axes in {}", fmt_dims(out_dims)),
        ));
    }
    let batches: usize = cd.iter().product();
    if out_dims.iter().product::<usize>() == 0 {
        return Ok(None);
    }
    let mut params = MatMul {
        m: word(OP, m)?,
        n: word(OP, n)?,
        k: word(OP, k)?,
        a_row: word(OP, ma.rs)?,
        a_col: word(OP, ma.cs)?,
        b_row: word(OP, mb.rs)?,
        b_col: word(OP, mb.cs)?,
        batch_rank: cd.len() as u32,
        ..MatMul::default()
    };
    for d in 0..cd.len() {
        params.batch_dims[d] = word(OP, cd[d])?;
        params.a_batch[d] = word(OP, cs[0][d])?;
        params.b_batch[d] = word(OP, cs[1][d])?;
    }
    let kernel = be.matmul_tuner().choose(be, &params, batches)?;
    let (gx, gy) = kernel.grid(m, n);
    let grid = (word(OP, gx)?, word(OP, gy)?);
    let chunks = k.div_ceil(K_CHUNK);
    params.chunk = word(OP, if chunks <= 1 { k.max(1) } else { K_CHUNK })?;
    Ok(Some(Launch { params, kernel, grid, batches, chunks }))
}

pub(crate) fn matmul(be: &WgpuBackend, ta: bool, tb: bool, ab: &[TensorRef<'_>; 2], out: &TensorRef<'_>) -> Result<()> {
    let Some(Launch { params, kernel, grid: (gx, gy), batches, chunks }) =
        prepare(be, ta, tb, ab, out.dims, out.dtype)?
    else {
        return Ok(());
    };
    let [a, b] = ab;
    let max_z = be.ctx().limits.max_compute_workgroups_per_dimension.max(1) as usize;
    let products = Products { be, params, kernel, grid: (gx, gy, max_z), batches, a, b };
    if chunks <= 1 {
        return products.launch_chunks(0, 1, Dest::Out(out), 0);
    }
    let outputs = out.numel();
    // Chunks whose products fit in scratch at once: a power of two, so that
    // each such group is a complete subtree of the rule's tree.
    let budget = be.matmul_scratch_bytes().min(be.ctx().limits.max_storage_buffer_binding_size) / 4;
    let fit = (budget / outputs as u64).clamp(1, max_z as u64);
    let group = (1usize << fit.ilog2()).min(chunks.next_power_of_two());
    if group >= chunks {
        return products.chunk_group(0, chunks, outputs, Dest::Out(out));
    }
    // Groups of chunks reduced one after another, their values merged by
    // the binary-counter form of the rule (docs/reductions.md): after group
    // number i (from 1), merge the top two trailing_zeros(i) times.
    let mut stack: Vec<BufferId> = Vec::new();
    let result = (|| {
        for (i, first) in (0..chunks).step_by(group).enumerate() {
            let id = be.scratch(DType::F32, outputs)?;
            stack.push(id);
            products.chunk_group(first, group.min(chunks - first), outputs, Dest::Scratch(id))?;
            for _ in 0..(i + 1).trailing_zeros() {
                let top = stack.pop().expect("two entries");
                let below = *stack.last().expect("two entries");
                let merged = accumulate(be, below, top, outputs);
                be.free_scratch(top);
                merged?;
            }
        }
        let mut acc = stack.pop().expect("at least one group");
        while let Some(below) = stack.pop() {
            let merged = accumulate(be, below, acc, outputs);
            be.free_scratch(acc);
            acc = below;
            if merged.is_err() {
                stack.push(acc);
                return merged;
            }
        }
        stack.push(acc);
        be.record_copy(OP, acc, out.buffer, outputs)
    })();
    for id in stack {
        be.free_scratch(id);
    }
    result
}

/// Where a run of chunk products (or their combined value) goes.
#[derive(Clone, Copy)]
enum Dest<'a, 'b> {
    Out(&'a TensorRef<'b>),
    Scratch(BufferId),
}

impl Dest<'_, '_> {
    fn arg(self, len: usize) -> Arg {
        match self {
            Dest::Out(t) => Arg::output(t),
            Dest::Scratch(id) => Arg::Buffer { id, dtype: DType::F32, len, write: true },
        }
    }
}

struct Products<'a, 'b> {
    be: &'a WgpuBackend,
    params: MatMul,
    kernel: MatMulKernel,
    /// Workgroups along x and y, and the adapter's z limit.
    grid: (u32, u32, usize),
    batches: usize,
    a: &'a TensorRef<'b>,
    b: &'a TensorRef<'b>,
}

impl Products<'_, '_> {
    /// Dispatch the chosen kernel for chunks first .. first + count of every batch,
    /// chunk c's products at c * stride of `dest`.
    fn launch_chunks(&self, first: usize, count: usize, dest: Dest<'_, '_>, stride: usize) -> Result<()> {
        let mut params = self.params;
        params.first_chunk = word(OP, first)?;
        params.chunks = word(OP, count)?;
        params.chunk_stride = word(OP, stride)?;
        let (gx, gy, max_z) = self.grid;
        let per_dispatch = (max_z / count).max(1);
        let len = stride * (count - 1) + self.batches * (params.m as usize) * (params.n as usize);
        let args = [(1, Arg::input(self.a)), (2, Arg::input(self.b)), (3, dest.arg(len))];
        let mut batch = 0;
        while batch < self.batches {
            let n = (self.batches - batch).min(per_dispatch);
            params.first_batch = word(OP, batch)?;
            let z = word(OP, n * count)?;
            self.be.launch(OP, self.kernel.shader(&params), self.kernel.entry(), &args, words(&params), [gx, gy, z])?;
            batch += n;
        }
        Ok(())
    }

    /// The products of chunks first .. first + count combined into `dest`
    /// (`count` at most the scratch group, a power of two unless it is the
    /// last group).
    fn chunk_group(&self, first: usize, count: usize, outputs: usize, dest: Dest<'_, '_>) -> Result<()> {
        let be = self.be;
        if count == 1 {
            return self.launch_chunks(first, 1, dest, 0);
        }
        let parts = be.scratch(DType::F32, count * outputs)?;
        let mut current = parts;
        let result = (|| {
            self.launch_chunks(first, count, Dest::Scratch(parts), outputs)?;
            let mut items = count;
            loop {
                let groups = items.div_ceil(FAN_IN);
                let input = Arg::Buffer { id: current, dtype: DType::F32, len: items * outputs, write: false };
                let params = Chunks { outputs: word(OP, outputs)?, products: word(OP, items)? };
                let params = words(&params);
                let grid = be.grid_for(OP, outputs * groups)?;
                if groups == 1 {
                    return be.launch(
                        OP,
                        Kernel::Chunks,
                        "combine",
                        &[(1, input), (3, dest.arg(outputs))],
                        params,
                        grid,
                    );
                }
                let next = be.scratch(DType::F32, groups * outputs)?;
                let output = Arg::Buffer { id: next, dtype: DType::F32, len: groups * outputs, write: true };
                let launched = be.launch(OP, Kernel::Chunks, "combine", &[(1, input), (3, output)], params, grid);
                be.free_scratch(current);
                current = next;
                launched?;
                items = groups;
            }
        })();
        be.free_scratch(current);
        result
    }
}

/// below += top, elementwise over `outputs` values.
fn accumulate(be: &WgpuBackend, below: BufferId, top: BufferId, outputs: usize) -> Result<()> {
    let args = [
        (1, Arg::Buffer { id: top, dtype: DType::F32, len: outputs, write: false }),
        (3, Arg::Buffer { id: below, dtype: DType::F32, len: outputs, write: true }),
    ];
    let params = Chunks { outputs: word(OP, outputs)?, products: 0 };
    be.launch(OP, Kernel::Chunks, "accumulate", &args, words(&params), be.grid_for(OP, outputs)?)
}
