//! Fused element-wise groups (`Backend::run_fused`, grouped by the
//! executor exactly as for the CPU): the group's ops become ONE generated
//! WGSL kernel per segment, each thread evaluating the chain for one element
//! in registers and writing only the values the executor keeps.
//!
//! - **Same bits as unfused.** Each op is printed from the op table with
//!   scalar.wgsl's functions, exactly as its own kernel (unary.wgsl,
//!   binary.wgsl, where.wgsl) prints it, and constants get the bits
//!   fill.wgsl would write.
//! - **Structure, not values, in the source.** Scalar constants are read from
//!   the parameters and shapes/strides are parameters too, so the generated
//!   text depends only on the ops, dtypes and which inputs are full-size,
//!   one-element or broadcast. The text is the cache key: a repeated step
//!   (and a group of the same structure at another shape) reuses the
//!   compiled pipeline, and two different programs can never share one.
//!   Calls with the executor's `plan_id` also skip generating the text.
//! - **Segments.** A group is cut into consecutive segments so that a kernel
//!   binds at most the device's storage buffers per stage and holds at most
//!   `max_fused_ops` ops (compile time grows with a kernel's length). A value
//!   a later segment reads is written by its segment (into its output buffer
//!   when kept, else into a scratch buffer); constants are re-read by every
//!   segment that uses them.
//!
//! Native only: the browser build leaves fusion out for its size budget
//! (as kiln-core's CPU fusion).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::rc::Rc;

use kiln_core::backend::checks::broadcast_to;
use kiln_core::backend::{BufferId, FusedArg, FusedCall, FusedOp, TensorRef};
use kiln_core::op::Op;
use kiln_core::{DType, Error, Result};

use super::{ty, unsupported_dtype};

mod head;
mod tail;
use crate::geometry::{collapse, word};
use crate::pipelines::Pipeline;
use crate::shaders::{self, Kernel, Ty, MAX_DIMS};
use crate::{Arg, WgpuBackend};

const OP: &str = "fused";
/// Ops per generated kernel unless `WgpuOptions::max_fused_ops` says
/// otherwise (see `docs/performance.md` for the compile times behind it).
pub const MAX_OPS: usize = 256;
/// Plans kept by `plan_id` (cleared when full, like the CPU's).
const PLANS_KEPT: usize = 1024;

/// Where a segment reads a value from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// Input k of the call.
    Input(u16),
    /// The value of op k, written by an earlier segment.
    Op(u16),
}

/// How a read input is indexed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Read {
    Contiguous,
    Scalar,
    Broadcast,
}

struct Segment {
    /// Bindings 1..: the values read, then the ops written.
    reads: Vec<(Source, Read)>,
    writes: Vec<usize>,
    /// Constants (op indices) in parameter order.
    consts: Vec<usize>,
    pipeline: Rc<Pipeline>,
    /// How many ops it computes (for the profile's label).
    ops: u32,
}

/// The structure of a call as the backend runs it.
pub(crate) struct Plan {
    segments: Vec<Segment>,
    /// Ops whose value crosses segments but is not kept: a scratch buffer
    /// each, for the call.
    scratch: Vec<usize>,
}

/// Generated pipelines by source, and plans by the executor's plan id.
#[derive(Default)]
pub(crate) struct FusedCache {
    pipelines: HashMap<String, Rc<Pipeline>>,
    plans: HashMap<u64, Rc<Plan>>,
    /// Scratch buffers of earlier calls (dtype, elements), reused so that a
    /// repeated step allocates none. Reuse across calls is safe: dispatches
    /// run in recording order and wgpu orders those sharing a written buffer.
    spare: Vec<(DType, usize, BufferId)>,
    /// Multi-tensor optimizer kernels (`update::update_many`) by the kind
    /// of each tensor's update, which fixes their text.
    updates: HashMap<Vec<u8>, Rc<Pipeline>>,
    /// Groups headed by a product (`head`) and groups ending in a reduction
    /// (`tail`): their epilogues and prologues by plan id, and the kernels
    /// generated from a module's text by (module, entry point, generated
    /// text).
    head_plans: HashMap<u64, Rc<head::Epilogue>>,
    tail_plans: HashMap<u64, Rc<tail::Prologue>>,
    rewritten: HashMap<(Kernel, &'static str, String), Rc<Pipeline>>,
}

/// Scratch kept for reuse at most: buffers, and their bytes.
const SPARE_KEPT: usize = 64;
const SPARE_BYTES: usize = 64 << 20;

fn bad(message: impl Into<String>) -> Error {
    Error::backend(OP, message)
}

pub(crate) fn run(be: &WgpuBackend, call: &FusedCall<'_>) -> Result<()> {
    if call.head.is_some() {
        return head::run(be, call);
    }
    if call.tail().is_some() {
        return tail::run(be, call);
    }
    let value = call.value_dtype().ok_or_else(|| bad("a group without a value of a numeric dtype"))?;
    if value == DType::F64 {
        return Err(crate::buffers::f64_refused(OP));
    }
    let cached = call.plan_id.and_then(|id| be.fused.borrow().plans.get(&id).cloned());
    let plan = match cached {
        Some(p) => p,
        None => {
            let p = Rc::new(plan(be, call, ty(value))?);
            if let Some(id) = call.plan_id {
                let mut cache = be.fused.borrow_mut();
                if cache.plans.len() >= PLANS_KEPT {
                    cache.plans.clear();
                }
                cache.plans.insert(id, p.clone());
            }
            p
        }
    };
    let n: usize = call.dims.iter().product();
    let output_of = |k: usize| call.outputs.iter().find(|(o, _)| *o as usize == k).map(|(_, t)| *t);
    if n == 0 {
        // No thread runs; a kept one-element constant is still written.
        for &(k, out) in call.outputs {
            if let Op::Full(v) = call.ops[k as usize].op {
                super::elementwise::full(be, v, &out)?;
            }
        }
        return Ok(());
    }
    let mut scratch: Vec<(usize, BufferId)> = Vec::with_capacity(plan.scratch.len());
    let result = (|| {
        for &k in &plan.scratch {
            let dtype = call.ops[k].dtype;
            let spare = {
                let mut cache = be.fused.borrow_mut();
                let at = cache.spare.iter().position(|&(d, len, _)| d == dtype && len == n);
                at.map(|i| cache.spare.swap_remove(i).2)
            };
            let buffer = match spare {
                Some(b) => b,
                None => be.scratch(dtype, n)?,
            };
            scratch.push((k, buffer));
        }
        let buffer_of = |k: usize| -> Result<TensorRef<'_>> {
            if let Some(t) = output_of(k) {
                return Ok(t);
            }
            let &(_, buffer) =
                scratch.iter().find(|(s, _)| *s == k).ok_or_else(|| bad(format!("op {k} has no buffer")))?;
            Ok(TensorRef { buffer, dims: call.dims, dtype: call.ops[k].dtype })
        };
        for seg in &plan.segments {
            let mut args: Vec<(u32, Arg)> = Vec::with_capacity(seg.reads.len() + seg.writes.len());
            let mut strides: Vec<Vec<usize>> = Vec::new();
            for (b, &(source, read)) in seg.reads.iter().enumerate() {
                let t = match source {
                    Source::Input(k) => call.inputs[k as usize],
                    Source::Op(k) => buffer_of(k as usize)?,
                };
                if read == Read::Broadcast {
                    strides.push(broadcast_to(OP, t.dims, call.dims)?.to_vec());
                }
                args.push((b as u32 + 1, Arg::input(&t)));
            }
            for (w, &k) in seg.writes.iter().enumerate() {
                let t = buffer_of(k)?;
                args.push(((seg.reads.len() + w) as u32 + 1, Arg::output(&t)));
            }
            let params = params(call, &seg.consts, &strides, n)?;
            be.launch_pipeline(
                OP,
                Kernel::Fused { ops: seg.ops },
                seg.pipeline.clone(),
                &args,
                &params,
                be.grid_for(OP, n)?,
            )?;
        }
        Ok(())
    })();
    let mut cache = be.fused.borrow_mut();
    for (k, buffer) in scratch {
        let held: usize = cache.spare.iter().map(|&(_, len, _)| len * 4).sum();
        if cache.spare.len() < SPARE_KEPT && held + n * 4 <= SPARE_BYTES {
            cache.spare.push((call.ops[k].dtype, n, buffer));
        } else {
            be.free_scratch(buffer);
        }
    }
    result
}

/// The parameter words of a segment (layout: `Params` in `source`).
fn params(call: &FusedCall<'_>, consts: &[usize], strides: &[Vec<usize>], n: usize) -> Result<Vec<u32>> {
    let refs: Vec<&[usize]> = strides.iter().map(Vec::as_slice).collect();
    let (dims, cs) = collapse(call.dims, &refs);
    if dims.len() > MAX_DIMS {
        return Err(Error::unsupported(
            OP,
            format!("the broadcast operands' axes do not merge into {MAX_DIMS}; use the CPU device, or reshape"),
        ));
    }
    let mut words = vec![0u32; 2 + MAX_DIMS * (1 + strides.len())];
    words[0] = word(OP, n)?;
    words[1] = dims.len() as u32;
    for (d, &v) in dims.iter().enumerate() {
        words[2 + d] = word(OP, v)?;
    }
    for (j, s) in cs.iter().enumerate() {
        for (d, &v) in s.iter().enumerate() {
            words[2 + MAX_DIMS * (1 + j) + d] = word(OP, v)?;
        }
    }
    for &k in consts {
        let op = &call.ops[k];
        let Op::Full(v) = op.op else { return Err(bad(format!("op {k} is not a constant"))) };
        // The bits fill.wgsl writes (`elementwise::full`).
        words.push(match op.dtype {
            DType::F32 => (v as f32).to_bits(),
            DType::I32 => (v as i32) as u32,
            _ => u32::from(v != 0.0),
        });
    }
    Ok(words)
}

/// How input `t` is read in a group of `n` elements.
fn read_of(t: &TensorRef<'_>, n: usize) -> Read {
    match t.numel() {
        m if m == n => Read::Contiguous,
        1 => Read::Scalar,
        _ => Read::Broadcast,
    }
}

/// Check the call, cut it into segments and get each one's pipeline.
/// Check a group's inputs (broadcastable, of the group's type or bool) and
/// outputs (each fits its op, none twice); which ops are kept.
fn check_io(call: &FusedCall<'_>, t: Ty) -> Result<Vec<bool>> {
    let ops = call.ops;
    let n: usize = call.dims.iter().product();
    for (i, input) in call.inputs.iter().enumerate() {
        broadcast_to(OP, input.dims, call.dims)?;
        if input.dtype != DType::Bool && Ty::of(input.dtype) != Some(t) {
            return Err(bad(format!("input {i} is {} in a group of {}", input.dtype, t.wgsl())));
        }
    }
    let mut kept = vec![false; ops.len()];
    for &(k, out) in call.outputs {
        let op = ops.get(k as usize).ok_or_else(|| bad(format!("output of op {k}, which does not exist")))?;
        let fits = out.dtype == op.dtype
            && (out.numel() == n || (out.numel() == 1 && matches!(op.op, Op::Full(_))))
            && !kept[k as usize];
        if !fits {
            return Err(bad(format!("an output does not fit op {k}")));
        }
        kept[k as usize] = true;
    }
    Ok(kept)
}

fn plan(be: &WgpuBackend, call: &FusedCall<'_>, t: Ty) -> Result<Plan> {
    let ops = call.ops;
    let n: usize = call.dims.iter().product();
    let kept = check_io(call, t)?;
    // Check every op and find each value's last reader.
    let mut last_use: Vec<usize> = (0..ops.len()).collect();
    for (i, op) in ops.iter().enumerate() {
        check_op(call, i, op, t)?;
        for a in op.args() {
            if let FusedArg::Op(k) = *a {
                last_use[k as usize] = i;
            }
        }
    }
    let is_const = |k: usize| matches!(ops[k].op, Op::Full(_));
    let limits = &be.ctx().limits;
    // Binding 0 holds the parameters. (A segment holds one op whatever
    // this says: an op that needs more bindings than the device has fails
    // there as its own kernel would.)
    let max_bindings = (limits.max_storage_buffers_per_shader_stage.min(limits.max_bindings_per_bind_group) as usize)
        .saturating_sub(1);
    let max_ops = be.max_fused_ops().max(1);

    // Greedy cut: extend a segment while its bindings (distinct values read
    // from outside it + its values kept or read after its end) fit.
    let mut bounds: Vec<(usize, usize)> = Vec::new();
    let mut start = 0;
    while start < ops.len() {
        let mut reads: Vec<Source> = Vec::new();
        let mut live = 0usize;
        let mut end = start;
        while end < ops.len() && end - start < max_ops {
            let op = &ops[end];
            let mut new_reads = 0;
            let mut freed = 0;
            for (j, a) in op.args().iter().enumerate() {
                let first = !op.args()[..j].contains(a);
                match *a {
                    FusedArg::Input(k) if first && !reads.contains(&Source::Input(k)) => new_reads += 1,
                    FusedArg::Op(k) if (k as usize) < start && !is_const(k as usize) => {
                        if first && !reads.contains(&Source::Op(k)) {
                            new_reads += 1;
                        }
                    }
                    FusedArg::Op(k) if first && last_use[k as usize] == end && !kept[k as usize] => {
                        if (k as usize) >= start && !is_const(k as usize) {
                            freed += 1;
                        }
                    }
                    _ => {}
                }
            }
            // Kept constants are written by the segment holding them.
            let own = usize::from(kept[end] || (!is_const(end) && last_use[end] > end));
            let total = reads.len() + new_reads + live + own - freed;
            if total > max_bindings && end > start {
                break;
            }
            for (j, a) in op.args().iter().enumerate() {
                if op.args()[..j].contains(a) {
                    continue;
                }
                match *a {
                    FusedArg::Input(k) if !reads.contains(&Source::Input(k)) => reads.push(Source::Input(k)),
                    FusedArg::Op(k) if (k as usize) < start && !is_const(k as usize) => {
                        if !reads.contains(&Source::Op(k)) {
                            reads.push(Source::Op(k));
                        }
                    }
                    _ => {}
                }
            }
            live = live + own - freed;
            end += 1;
        }
        bounds.push((start, end));
        start = end;
    }
    // Values read past their segment's end, not kept: scratch.
    let segment_of = |k: usize| bounds.partition_point(|&(_, e)| e <= k);
    let scratch: Vec<usize> =
        (0..ops.len()).filter(|&k| !kept[k] && !is_const(k) && segment_of(last_use[k]) > segment_of(k)).collect();
    let mut segments = Vec::with_capacity(bounds.len());
    for (s, e) in bounds {
        let writes: Vec<usize> =
            (s..e).filter(|&k| kept[k] || (!is_const(k) && last_use[k] >= e && last_use[k] > k)).collect();
        let (source, reads, consts) = generate(call, t, s, e, &writes, n);
        let pipeline = pipeline(be, source)?;
        segments.push(Segment { reads, writes, consts, pipeline, ops: (e - s) as u32 });
    }
    Ok(Plan { segments, scratch })
}

/// The op's operands are of the kinds it reads and the table has a kernel.
fn check_op(call: &FusedCall<'_>, i: usize, op: &FusedOp, t: Ty) -> Result<()> {
    let dtype_of = |a: &FusedArg| match *a {
        FusedArg::Input(k) => call.inputs.get(k as usize).map(|x| x.dtype),
        FusedArg::Op(k) if (k as usize) < i => Some(call.ops[k as usize].dtype),
        FusedArg::Op(_) => None,
    };
    let mut kinds = Vec::with_capacity(3);
    for a in op.args() {
        kinds.push(dtype_of(a).ok_or_else(|| bad(format!("op {i} reads {a:?}, which is not before it")))?);
    }
    let value = match t {
        Ty::F32 => DType::F32,
        Ty::I32 => DType::I32,
        Ty::U32 => DType::Bool,
    };
    let (want, out): (&[DType], DType) = match op.op {
        Op::Full(_) => (&[], op.dtype),
        Op::Unary(_) => (&[value], value),
        Op::Binary(_) => (&[value, value], value),
        Op::Compare(_) => (&[value, value], DType::Bool),
        Op::Where => (&[DType::Bool, value, value], value),
        other => return Err(bad(format!("{} is not an element-wise op", other.name()))),
    };
    let constant_ok = !matches!(op.op, Op::Full(_)) || op.dtype == value || op.dtype == DType::Bool;
    if kinds != want || op.dtype != out || !constant_ok {
        return Err(bad(format!("op {i} ({}) has operands or a result of the wrong kind", op.op.name())));
    }
    match op.op {
        Op::Unary(_) | Op::Binary(_) if shaders::op_expr(op.op, t, &["a", "b"]).is_none() => {
            Err(unsupported_dtype(op.op.name(), value))
        }
        _ => Ok(()),
    }
}

/// A segment's WGSL as it is generated (see `generate`).
struct Gen<'c, 'a> {
    call: &'c FusedCall<'a>,
    t: Ty,
    n: usize,
    reads: Vec<(Source, Read)>,
    consts: Vec<usize>,
    /// Local name of each op's value computed, read or constant here.
    names: HashMap<usize, String>,
    read_lines: String,
    body: String,
    broadcast: usize,
    /// The prefix of the read bindings' names.
    binding: &'static str,
    /// Values computed so far (`v0`, `v1`, ...).
    values: usize,
}

impl<'c, 'a> Gen<'c, 'a> {
    /// A generator over `call`'s ops in type `t`, `n` elements, reading
    /// bindings named `binding0`, `binding1`, ...
    fn new(call: &'c FusedCall<'a>, t: Ty, n: usize, binding: &'static str) -> Self {
        Gen {
            call,
            t,
            n,
            reads: Vec::new(),
            consts: Vec::new(),
            names: HashMap::new(),
            read_lines: String::new(),
            body: String::new(),
            broadcast: 0,
            binding,
            values: 0,
        }
    }

    /// Print ops `range` (checked by `check_op`) as `let vN = ...;`, each
    /// with scalar.wgsl's function as its own kernel prints it; constants
    /// are printed where they are read.
    fn compute(&mut self, range: std::ops::Range<usize>) {
        let ops = self.call.ops;
        for k in range {
            let op = &ops[k];
            if let Op::Full(_) = op.op {
                continue;
            }
            let args: Vec<String> = op.args().iter().map(|a| self.name(a)).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let expr = match op.op {
                Op::Unary(_) | Op::Binary(_) => shaders::op_expr(op.op, self.t, &args).expect("checked by check_op"),
                Op::Compare(c) => shaders::compare_expr_of(c, self.t, &args),
                _ => format!("select({}, {}, {} != 0u)", args[2], args[1], args[0]),
            };
            let name = format!("v{}", self.values);
            self.values += 1;
            let _ = writeln!(self.body, "    let {name} = {expr};");
            self.names.insert(k, name);
        }
    }

    /// The offsets `o0`, `o1`, ... of the broadcast reads at flat index
    /// `i`, from the parameter fields `{p}rank`, `{p}dims`, `{p}strides`
    /// (empty when nothing is broadcast).
    fn offsets(&self, p: &str) -> String {
        let mut f = String::new();
        if self.broadcast == 0 {
            return f;
        }
        for j in 0..self.broadcast {
            let _ = writeln!(f, "    var o{j} = 0u;");
        }
        let _ = write!(
            f,
            "    var rem = i;\n    for (var d = params.{p}rank; d > 0u; d = d - 1u) {{\n        \
             let m = params.{p}dims[d - 1u];\n        let k = rem % m;\n        rem = rem / m;\n"
        );
        for j in 0..self.broadcast {
            let _ = writeln!(f, "        o{j} += k * params.{p}strides[{j}][d - 1u];");
        }
        f.push_str("    }\n");
        f
    }

    /// The parameter fields the generated code reads: `{p}rank`, `{p}dims`,
    /// `{p}strides` (one row per broadcast read) and `consts` (in the
    /// order of `params`' words after `n`).
    fn fields(&self, p: &str) -> String {
        let mut f = format!("    {p}rank: u32,\n    {p}dims: array<u32, MAX_DIMS>,\n");
        if self.broadcast > 0 {
            let _ = writeln!(f, "    {p}strides: array<array<u32, MAX_DIMS>, {}>,", self.broadcast);
        }
        if !self.consts.is_empty() {
            let _ = writeln!(f, "    consts: array<u32, {}>,", self.consts.len());
        }
        f
    }

    /// The bindings from number `first`: the reads (`{r}0`, ...), then the
    /// values `writes` (`{w}0`, ...); bools are u32 words.
    fn bindings(&self, writes: &[usize], first: usize, (r, w): (&str, &str)) -> String {
        let ops = self.call.ops;
        let word = |dtype: DType| if dtype == DType::Bool { "u32" } else { self.t.wgsl() };
        let mut f = String::new();
        for (j, &(source, _)) in self.reads.iter().enumerate() {
            let dtype = match source {
                Source::Input(k) => self.call.inputs[k as usize].dtype,
                Source::Op(k) => ops[k as usize].dtype,
            };
            let _ = writeln!(f, "@group(0) @binding({}) var<storage, read> {r}{j}: array<{}>;", first + j, word(dtype));
        }
        for (j, &k) in writes.iter().enumerate() {
            let at = first + self.reads.len() + j;
            let _ =
                writeln!(f, "@group(0) @binding({at}) var<storage, read_write> {w}{j}: array<{}>;", word(ops[k].dtype));
        }
        f
    }

    /// The stores of the values `writes` at flat index `i` into bindings
    /// `{w}0`, `{w}1`, ...; a kept scalar constant is written once.
    fn stores(&self, writes: &[usize], w: &str) -> String {
        let mut f = String::new();
        for (j, &k) in writes.iter().enumerate() {
            let one = self.call.outputs.iter().any(|&(o, t)| o as usize == k && t.numel() == 1) && self.n != 1;
            let value = &self.names[&k];
            if one {
                let _ = writeln!(f, "    if (i == 0u) {{\n        {w}{j}[0] = {value};\n    }}");
            } else {
                let _ = writeln!(f, "    {w}{j}[i] = {value};");
            }
        }
        f
    }

    /// The local name of an operand, binding or printing it at first use.
    fn name(&mut self, a: &FusedArg) -> String {
        let ops = self.call.ops;
        let (source, read) = match *a {
            FusedArg::Input(k) => (Source::Input(k), read_of(&self.call.inputs[k as usize], self.n)),
            FusedArg::Op(k) => {
                let k = k as usize;
                if let Some(name) = self.names.get(&k) {
                    return name.clone();
                }
                if let Op::Full(_) = ops[k].op {
                    let c = self.consts.len();
                    self.consts.push(k);
                    let name = format!("c{c}");
                    let value = match ops[k].dtype {
                        DType::Bool => format!("params.consts[{c}]"),
                        _ => format!("bitcast<{}>(params.consts[{c}])", self.t.wgsl()),
                    };
                    let _ = writeln!(self.body, "    let {name} = {value};");
                    self.names.insert(k, name.clone());
                    return name;
                }
                (Source::Op(k as u16), Read::Contiguous)
            }
        };
        if let Some(r) = self.reads.iter().position(|&(x, _)| x == source) {
            return format!("r{r}");
        }
        let r = self.reads.len();
        self.reads.push((source, read));
        let index = match read {
            Read::Contiguous => "i".to_string(),
            Read::Scalar => "0u".to_string(),
            Read::Broadcast => {
                self.broadcast += 1;
                format!("o{}", self.broadcast - 1)
            }
        };
        let _ = writeln!(self.read_lines, "    let r{r} = {}{r}[{index}];", self.binding);
        format!("r{r}")
    }
}

/// The WGSL of ops `s..e` writing `writes`: returns it with the bindings it
/// reads (in binding order) and the constants of its parameters. Names are
/// local to the segment (`r` reads, `c` constants, `v` values, numbered in
/// order of appearance), so equal structures print equal text.
fn generate(
    call: &FusedCall<'_>,
    t: Ty,
    s: usize,
    e: usize,
    writes: &[usize],
    n: usize,
) -> (String, Vec<(Source, Read)>, Vec<usize>) {
    let mut g = Gen::new(call, t, n, "b");
    g.compute(s..e);
    for &k in writes {
        g.name(&FusedArg::Op(k as u16));
    }
    // The bindings, the offsets of broadcast reads, the reads, the ops, the writes.
    let mut src = String::new();
    let _ = writeln!(src, "{}\n{}\n{}", shaders::COMMON, shaders::TRIG, shaders::SCALAR);
    src.push_str("struct Params {\n    n: u32,\n");
    src.push_str(&g.fields(""));
    src.push_str("}\n@group(0) @binding(0) var<storage, read> params: Params;\n");
    src.push_str(&g.bindings(writes, 1, ("b", "w")));
    src.push_str(
        "@compute @workgroup_size(WG)\nfn main(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {\n    \
         let i = flat_id(wg, lid);\n    if (i >= params.n) {\n        return;\n    }\n",
    );
    src.push_str(&g.offsets(""));
    src.push_str(&g.read_lines);
    src.push_str(&g.body);
    src.push_str(&g.stores(writes, "w"));
    src.push_str("}\n");
    (src, g.reads, g.consts)
}

/// A generated pipeline cached in the map of `FusedCache` that `map`
/// picks, under `key`, which must fix the text that `generate` returns
/// (so a cached step builds no text at all).
pub(crate) fn cached_in<K: std::hash::Hash + Eq>(
    be: &WgpuBackend,
    map: fn(&mut FusedCache) -> &mut HashMap<K, Rc<Pipeline>>,
    key: K,
    op: &'static str,
    label: &str,
    generate: impl FnOnce(&K) -> Result<String>,
) -> Result<Rc<Pipeline>> {
    let hit = map(&mut be.fused.borrow_mut()).get(&key).cloned();
    if let Some(p) = hit {
        be.count_pipeline_hit();
        return Ok(p);
    }
    let p = be.compile(op, label, &generate(&key)?)?;
    map(&mut be.fused.borrow_mut()).insert(key, p.clone());
    Ok(p)
}

/// A multi-tensor update's pipeline (`update::update_many`) by the kind of
/// each tensor's update (`key`), which fixes the text `generate` returns.
pub(crate) fn cached_pipeline(
    be: &WgpuBackend,
    op: &'static str,
    label: &str,
    key: Vec<u8>,
    generate: impl FnOnce() -> String,
) -> Result<Rc<Pipeline>> {
    cached_in(be, |c| &mut c.updates, key, op, label, |_| Ok(generate()))
}

/// The pipeline compiled from `source`, from the cache when it has been.
fn pipeline(be: &WgpuBackend, source: String) -> Result<Rc<Pipeline>> {
    cached_in(be, |c| &mut c.pipelines, source, OP, "Fused", |s| Ok(s.clone()))
}

#[cfg(test)]
mod tests {
    use kiln_core::backend::{BufferId, FusedArg, FusedCall, FusedOp, TensorRef};
    use kiln_core::op::{BinaryOp, CompareOp, Op, UnaryOp};
    use kiln_core::DType;

    use super::{generate, Ty};

    fn op(op: Op, args: &[FusedArg], dtype: DType) -> FusedOp {
        let mut a = [FusedArg::Input(0); 3];
        a[..args.len()].copy_from_slice(args);
        FusedOp { op, args: a, arity: args.len() as u8, dtype }
    }

    fn validate(src: &str) {
        crate::shaders::validate_wgsl("generated fused kernel", src);
    }

    /// Every kind of op and read, in f32 and i32, makes valid WGSL (naga,
    /// as wgpu checks it before creating the pipeline); the text names no
    /// constant's value, so other values give the same text (the cache key).
    #[test]
    fn generated_kernels_validate_and_hold_no_values() {
        use FusedArg::{Input, Op as V};
        let dims = [4usize, 6];
        let (full, row, one, cond) = (&[4usize, 6][..], &[6usize][..], &[][..], &[4usize, 1][..]);
        for (t, dtype) in [(Ty::F32, DType::F32), (Ty::I32, DType::I32)] {
            for c in [0.25, 3.0] {
                let inputs = [
                    TensorRef { buffer: BufferId(0), dims: full, dtype },
                    TensorRef { buffer: BufferId(1), dims: row, dtype },
                    TensorRef { buffer: BufferId(2), dims: one, dtype },
                    TensorRef { buffer: BufferId(3), dims: cond, dtype: DType::Bool },
                ];
                let unary = if t == Ty::F32 { UnaryOp::Tanh } else { UnaryOp::Neg };
                let ops = [
                    op(Op::Full(c), &[], dtype),
                    op(Op::Binary(BinaryOp::Mul), &[Input(0), V(0)], dtype),
                    op(Op::Binary(BinaryOp::Add), &[V(1), Input(1)], dtype),
                    op(Op::Unary(unary), &[V(2)], dtype),
                    op(Op::Compare(CompareOp::Greater), &[V(3), Input(2)], DType::Bool),
                    op(Op::Where, &[V(4), V(3), Input(1)], dtype),
                    op(Op::Where, &[Input(3), V(5), V(0)], dtype),
                    op(Op::Full(1.0), &[], DType::Bool),
                ];
                let out = TensorRef { buffer: BufferId(9), dims: full, dtype };
                let flag = TensorRef { buffer: BufferId(10), dims: one, dtype: DType::Bool };
                let outputs = [(4u16, TensorRef { dtype: DType::Bool, ..out }), (6, out), (7, flag)];
                let call =
                    FusedCall { dims: &dims, ops: &ops, inputs: &inputs, outputs: &outputs, plan_id: None, head: None };
                let (src, reads, consts) = generate(&call, t, 0, ops.len(), &[4, 6, 7], 24);
                validate(&src);
                assert_eq!(reads.len(), 4, "every input bound once");
                assert_eq!(consts, vec![0, 7]);
                assert!(!src.contains("0.25") && !src.contains("3.0)"), "{src}");
                // A cut: ops 3.. read op 2's value from a binding.
                let (src, reads, _) = generate(&call, t, 3, ops.len(), &[4, 6, 7], 24);
                validate(&src);
                assert_eq!(reads[0].0, super::Source::Op(2));
            }
        }
    }
}
