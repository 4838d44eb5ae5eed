//! Fused element-wise groups (see `exec`'s fusion and `FusedCall`): one
//! pass over memory for a chain of element-wise ops.
//!
//! The output range is cut into tiles of `TILE` elements; for each tile the
//! ops run in order, each one's loop over the tile calling exactly the
//! per-element function its own kernel calls (`Value::unary`, `binary`,
//! the comparison, the select, `Scalar::from_f64` for constants), so every
//! element gets the same f32/f64/i32 operations in the same order as
//! unfused: results are bit-identical. Values the executor does not keep
//! live only in a few tiles per thread (slots reused once their last reader
//! has run); the kept ones are computed straight into their outputs, a
//! tile's span at a time, and later ops read them back from there. Large
//! groups split the range over rayon's threads, each with its own tiles.
//!
//! Why not a tile and a copy for kept values too: these loops are bound by
//! stores, not arithmetic. W2's conv bias + ReLU keeping both values over
//! [64, 32, 26, 26] took 504–765 µs that way against 301–362 µs unfused
//! (Zen 3, two threads, best of 300); written directly, 367–397 µs.

use crate::small::SmallVec;

use super::copy::copy;
use super::layout::broadcast_to;
use super::scalar::Scalar;
use super::{with_float, with_num, CpuBackend, CpuStorage};
use crate::backend::{FusedArg, FusedCall, TensorRef};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::expr::compare as compare_values;
use crate::op::{with_binary, with_compare, with_unary};
use crate::op::{CompareOp, Expr, Op, ReduceOp, Value};
use crate::shape::{AxisSet, Dims};

mod head;
mod tail;

const NAME: &str = "fused";
/// Elements per tile: the tiles of a group's live values stay in L1 (4 KiB
/// each for f32; a group rarely has more than four live). Each tile pays
/// for its gathers, op dispatch and output copies once: 256 made that cost
/// dominate memory-bound groups (W2's conv bias + ReLU over
/// [64, 32, 26, 26]: 300 µs fused against 181 µs unfused; 200 µs at 1024).
const TILE: usize = 1024;

/// Where a value of one tile is: a contiguous input read in place, a tile
/// of the value type (`T`) or of bools, or the call's output `Out(o)`, which
/// a kept value is written to directly (and read back from by later steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loc {
    Input(usize),
    T(usize),
    B(usize),
    Out(usize),
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Const(f64),
    Unary(Expr),
    Binary(Expr),
    Compare(CompareOp),
    Where,
}

struct Step {
    kind: Kind,
    args: [Loc; 3],
    dst: Loc,
    /// Index into the call's outputs when this value is kept.
    output: Option<usize>,
    /// A constant that fills its tile (false: it shares an equal one's).
    fill: bool,
}

/// How an input is read per tile.
enum Read {
    /// numel = the group's: read in place.
    Contiguous,
    /// One element: a tile filled once per chunk.
    Splat(Loc),
    /// Broadcast along some axes: gathered into a tile, with these strides
    /// over these dims (the group's, with adjacent axes that this input
    /// reads as one merged: `collapse`).
    Gather(Loc, Dims, Dims),
}

/// Plans of calls with a `plan_id`: the executor guarantees that calls
/// with one id have one structure. Bounded: cleared when full (ids of
/// evicted executor plans are never seen again).
#[derive(Default)]
pub(super) struct PlanCache(std::cell::RefCell<std::collections::HashMap<u64, std::rc::Rc<Plan>>>);

const PLANS_KEPT: usize = 1024;

/// The checked, slot-assigned form of a call.
pub(super) struct Plan {
    steps: Vec<Step>,
    reads: Vec<Read>,
    t_tiles: usize,
    b_tiles: usize,
    /// Work per element (sum of the ops' costs).
    weight: usize,
    /// The reduction ending the group (`FusedCall::tail`).
    tail: Option<TailPlan>,
}

/// A group's tail: `op` of the value at `src` (over the call's axes), into
/// output `output`. `src` is a T-tile, or the value's own output when the
/// group also keeps it (`Loc::Out`).
#[derive(Clone, Copy, Debug)]
struct TailPlan {
    op: ReduceOp,
    src: Loc,
    output: usize,
}

fn bad(message: impl Into<String>) -> Error {
    Error::backend(NAME, message)
}

fn plan(call: &FusedCall<'_>, value: DType) -> Result<Plan> {
    let n: usize = call.dims.iter().product();
    let (mut t_tiles, mut b_tiles) = (0usize, 0usize);
    let mut reads = Vec::with_capacity(call.inputs.len());
    let mut input_locs = Vec::with_capacity(call.inputs.len());
    for t in call.inputs {
        if t.dtype != value && t.dtype != DType::Bool {
            return Err(bad(format!("input of {} in a group of {value}", t.dtype)));
        }
        let mut tile = || {
            if t.dtype == DType::Bool {
                b_tiles += 1;
                Loc::B(b_tiles - 1)
            } else {
                t_tiles += 1;
                Loc::T(t_tiles - 1)
            }
        };
        let strides = broadcast_to(NAME, t.dims, call.dims)?;
        let numel = t.numel();
        let (read, loc) = if numel == n {
            (Read::Contiguous, Loc::Input(reads.len()))
        } else if numel == 1 {
            let loc = tile();
            (Read::Splat(loc), loc)
        } else {
            let loc = tile();
            let (dims, strides) = collapse(call.dims, &strides);
            (Read::Gather(loc, dims, strides), loc)
        };
        reads.push(read);
        input_locs.push(loc);
    }
    // The head's product is one more contiguous input, `inputs.len()`.
    let head_loc = call.head.map(|_| {
        reads.push(Read::Contiguous);
        Loc::Input(call.inputs.len())
    });
    // Last reader of every op's value, to reuse its slot after it.
    let ops = call.ops;
    let mut last_use: Vec<usize> = (0..ops.len()).collect();
    for (i, op) in ops.iter().enumerate() {
        for a in op.args() {
            match *a {
                FusedArg::Op(k) if (k as usize) < i => last_use[k as usize] = i,
                FusedArg::Input(k) if (k as usize) < call.inputs.len() => {}
                _ => return Err(bad(format!("op {i} reads {a:?}, which is not before it"))),
            }
        }
    }
    // The tail's axes, within the group's rank (as `reduce` takes them),
    // and the number of values it makes.
    let tail = call.tail().map(|r| (r, AxisSet(r.axes.0 & AxisSet::all(call.dims.len()).0)));
    let reduced = tail.map(|(_, axes)| {
        call.dims.iter().enumerate().filter(|&(d, _)| !axes.contains(d)).map(|(_, &m)| m).product::<usize>()
    });
    let mut outputs: Vec<Option<usize>> = vec![None; ops.len()];
    for (o, &(k, t)) in call.outputs.iter().enumerate() {
        let Some(op) = ops.get(k as usize) else { return Err(bad(format!("output of op {k}, which does not exist"))) };
        let numel = t.numel();
        let fits = match tail {
            Some((r, _)) if r.index == k => Some(numel) == reduced,
            _ => numel == n || (numel == 1 && matches!(op.op, Op::Full(_))),
        };
        if t.dtype != op.dtype || !fits || outputs[k as usize].is_some() {
            return Err(bad(format!("output {o} does not fit op {k}")));
        }
        outputs[k as usize] = Some(o);
    }
    let (mut free_t, mut free_b): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let mut locs: Vec<Loc> = Vec::with_capacity(ops.len());
    let mut steps = Vec::with_capacity(ops.len());
    let mut weight = 0usize;
    let mut consts: Vec<(u64, bool, Loc)> = Vec::new();
    let mut tail_plan = None;
    for (i, op) in ops.iter().enumerate() {
        let is_bool = op.dtype == DType::Bool;
        if !is_bool && op.dtype != value {
            return Err(bad(format!("op {i} makes {} in a group of {value}", op.dtype)));
        }
        if let Op::Reduce { op: r, .. } = op.op {
            // Only the last op, of an earlier computed value (`FusedCall::tail`).
            let source = match (tail, op.args()) {
                (Some((t, _)), &[FusedArg::Op(k)]) if t.index as usize == i => Some(k as usize),
                _ => None,
            };
            let src = source.and_then(|k| match (ops[k].op, locs[k]) {
                (Op::Full(_), _) => None,
                (_, loc @ (Loc::T(_) | Loc::Out(_))) if ops[k].dtype == value => Some(loc),
                _ => None,
            });
            let (Some(src), Some(_), false) = (src, tail, is_bool) else {
                return Err(bad(format!("op {i} is a reduction that does not end the group, of a value it computes")));
            };
            if !matches!(r, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min) {
                return Err(bad(format!("{} cannot end a fused group", op.op.name())));
            }
            let Some(output) = outputs[i] else { return Err(bad("the reduction ending the group has no output")) };
            tail_plan = Some(TailPlan { op: r, src, output });
            locs.push(Loc::Input(usize::MAX));
            continue;
        }
        if let Op::MatMul { .. } = op.op {
            // Only op 0 of a group with a head, without operands.
            match head_loc {
                Some(loc) if i == 0 && op.args().is_empty() => {
                    locs.push(loc);
                    continue;
                }
                _ => return Err(bad(format!("op {i} is a MatMul that is not the group's head"))),
            }
        }
        if head_loc.is_some() && i == 0 {
            return Err(bad("op 0 of a group with a head must be its MatMul"));
        }
        let loc_of = |a: &FusedArg| match *a {
            FusedArg::Input(k) => input_locs[k as usize],
            FusedArg::Op(k) => locs[k as usize],
        };
        let mut args = [Loc::Input(usize::MAX); 3];
        for (slot, a) in args.iter_mut().zip(op.args()) {
            *slot = loc_of(a);
        }
        // Operand kinds: bool where the op reads a condition, T elsewhere.
        let is_bool_arg = |a: &FusedArg| match *a {
            FusedArg::Input(k) => call.inputs[k as usize].dtype == DType::Bool,
            FusedArg::Op(k) => ops[k as usize].dtype == DType::Bool,
        };
        let want_bool: &[bool] = match op.op {
            Op::Full(_) => &[],
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) => &[false, false],
            Op::Where => &[true, false, false],
            other => return Err(bad(format!("{} is not an element-wise op", other.name()))),
        };
        let arity = op.args().len();
        let expected_arity = match op.op {
            Op::Full(_) => 0,
            Op::Unary(_) => 1,
            Op::Binary(_) | Op::Compare(_) => 2,
            _ => 3,
        };
        if arity != expected_arity || op.args().iter().zip(want_bool).any(|(a, &b)| is_bool_arg(a) != b) {
            return Err(bad(format!("op {i} ({}) has operands of the wrong number or kind", op.op.name())));
        }
        let mut elementwise = |o: Op| -> Result<Expr> {
            let info = o.info();
            match info.elementwise {
                Some(e) if info.dtypes.contains(value) => {
                    weight += e.cost as usize;
                    Ok(e.expr)
                }
                _ => Err(super::unsupported_dtype(info.name, value)),
            }
        };
        let kind = match op.op {
            Op::Full(v) => Kind::Const(v),
            // Through `Value::unary`, like the unfused kernel: a composed op
            // written out there (Gelu) then runs as one vectorised loop.
            Op::Unary(u) => {
                elementwise(op.op)?;
                Kind::Unary(Expr::Unary(u, crate::op::expr::arg(0)))
            }
            Op::Binary(_) => Kind::Binary(elementwise(op.op)?),
            Op::Compare(c) => {
                weight += 1;
                Kind::Compare(c)
            }
            _ => {
                weight += 1;
                Kind::Where
            }
        };
        // Equal constants share one tile (a chain's repeated scalars).
        if let Kind::Const(v) = kind {
            if let Some(&(_, _, loc)) = consts.iter().find(|c| c.0 == v.to_bits() && c.1 == is_bool) {
                locs.push(loc);
                steps.push(Step { kind, args, dst: loc, output: outputs[i], fill: false });
                continue;
            }
        }
        // Free the slots whose last reader is this op *after* taking the
        // destination, so a destination never aliases an operand.
        // Constants are filled once per chunk, before any op runs: they get
        // tiles of their own, never one an earlier value used. A kept value
        // is computed straight into its output: a tile and a copy out cost
        // a store and a load per element more, and stores bound these
        // loops (a Zen 3 stores one 32-byte vector a cycle).
        let constant = matches!(kind, Kind::Const(_));
        let dst = if let (Some(o), false) = (outputs[i], constant) {
            Loc::Out(o)
        } else if is_bool {
            Loc::B((if constant { None } else { free_b.pop() }).unwrap_or_else(|| {
                b_tiles += 1;
                b_tiles - 1
            }))
        } else {
            Loc::T((if constant { None } else { free_t.pop() }).unwrap_or_else(|| {
                t_tiles += 1;
                t_tiles - 1
            }))
        };
        for a in op.args() {
            if let FusedArg::Op(k) = *a {
                let k = k as usize;
                if last_use[k] == i && !matches!(ops[k].op, Op::Full(_)) {
                    match locs[k] {
                        Loc::T(s) => free_t.push(s),
                        Loc::B(s) => free_b.push(s),
                        Loc::Input(_) | Loc::Out(_) => {}
                    }
                    // Several operands may name one value: free it once.
                    last_use[k] = usize::MAX;
                }
            }
        }
        // A value nothing in the group reads frees its slot at once
        // (constants keep theirs: they are filled once per chunk).
        if last_use[i] == i && !matches!(op.op, Op::Full(_)) {
            match dst {
                Loc::T(s) => free_t.push(s),
                Loc::B(s) => free_b.push(s),
                Loc::Input(_) | Loc::Out(_) => {}
            }
        }
        if let Kind::Const(v) = kind {
            consts.push((v.to_bits(), is_bool, dst));
        }
        locs.push(dst);
        steps.push(Step { kind, args, dst, output: outputs[i], fill: true });
    }
    Ok(Plan { steps, reads, t_tiles, b_tiles, weight: weight.max(1), tail: tail_plan })
}

/// A kept value's destination, typed.
enum OutSlice<'a, T> {
    T(&'a mut [T]),
    B(&'a mut [u8]),
}

/// A kept value's buffer, written by several tasks at once (a product's
/// column blocks, a tail's spans), each its own elements.
#[derive(Clone, Copy)]
enum Shared<T> {
    /// Not written by the tasks (a constant, written whole, a product
    /// or a reduction written apart).
    None,
    T(*mut T, usize),
    B(*mut u8, usize),
}

// SAFETY: the pointers come from unique borrows of the outputs that outlive
// the tasks' scope and are not otherwise used while it runs; the tasks
// write disjoint elements through them (`segment`).
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// Elements `start..start + len` as an output slice.
    ///
    /// # Safety
    /// No other live slice from this buffer overlaps the range: each task
    /// asks for its own elements only.
    unsafe fn segment<'a>(self, start: usize, len: usize) -> Option<OutSlice<'a, T>> {
        match self {
            Shared::None => None,
            Shared::T(p, n) => {
                assert!(start + len <= n, "segment {start}+{len} of {n}");
                Some(OutSlice::T(std::slice::from_raw_parts_mut(p.add(start), len)))
            }
            Shared::B(p, n) => {
                assert!(start + len <= n, "segment {start}+{len} of {n}");
                Some(OutSlice::B(std::slice::from_raw_parts_mut(p.add(start), len)))
            }
        }
    }
}

/// An input's data, typed.
#[derive(Clone, Copy)]
enum InSlice<'a, T> {
    T(&'a [T]),
    B(&'a [u8]),
    /// The elements from flat index `.1` on (a row of a product's block).
    Rel(&'a [T], usize),
}

pub(super) fn run(be: &CpuBackend, call: &FusedCall<'_>) -> Result<()> {
    let value = call.value_dtype().ok_or_else(|| bad("a group without a value of a numeric dtype"))?;
    // A product with its epilogue: fused when it runs as column blocks,
    // else the product and then the epilogue as a group of its own.
    let blocked = match &call.head {
        Some(h) if matches!(value, DType::F32 | DType::F64) => {
            let blocked =
                super::matmul::Blocked::of(h.transpose_a, h.transpose_b, h.a.dims, h.b.dims, call.dims, be.portable)
                    .map_err(|e| e.for_op("MatMul"))?;
            match blocked {
                Some(b) => Some((h, b)),
                None => return crate::backend::run_head_split(be, call),
            }
        }
        Some(_) => return Err(super::unsupported_dtype("MatMul", value)),
        None => None,
    };
    // A group ending in a reduction: fused in the two layouts `tail`
    // covers, else the group and then the reduction.
    let tail = match call.tail() {
        Some(r) => match tail::Layout::of(call.dims, AxisSet(r.axes.0 & AxisSet::all(call.dims.len()).0)) {
            Some(layout) if call.head.is_none() => Some(layout),
            _ => return crate::backend::run_tail_split(be, call),
        },
        None => None,
    };
    let plan = match call.plan_id {
        Some(id) => {
            let cached = be.fused_plans.0.borrow().get(&id).cloned();
            match cached {
                Some(p) => p,
                None => {
                    let p = std::rc::Rc::new(plan(call, value)?);
                    let mut plans = be.fused_plans.0.borrow_mut();
                    if plans.len() >= PLANS_KEPT {
                        plans.clear();
                    }
                    plans.insert(id, p.clone());
                    p
                }
            }
        }
        None => std::rc::Rc::new(plan(call, value)?),
    };
    let plan = &*plan;
    // A product the group does not keep is written to a pooled scratch
    // buffer, not to a fresh zero-filled allocation per call (1.5 MB for the
    // GPT's MLP gradient; fused[MatMul Bᵀ,Gelu] [768,128]x[512,128] run in a
    // loop on one thread: 2.3 -> 1.7 ms per call).
    let scratch = match &blocked {
        Some(_) if !call.outputs.iter().any(|&(k, _)| k == 0) => {
            Some(crate::backend::Backend::scratch_alloc(be, value, call.dims.iter().product())?)
        }
        _ => None,
    };
    let mut slab = be.slab.borrow_mut();
    let mut scratch_storage = scratch.and_then(|id| slab.get_mut(id.0 as usize).and_then(Option::take));
    // Outputs leave the slab while the group runs (as in `run`): a buffer
    // named twice, or also as an input, is then missing, never aliased.
    let mut taken: SmallVec<[(TensorRef<'_>, CpuStorage); 8]> = SmallVec::new();
    let mut result = Ok(());
    for &(_, t) in call.outputs {
        match slab.get_mut(t.buffer.0 as usize).and_then(Option::take) {
            Some(s) => taken.push((t, s)),
            None => {
                result = Err(CpuBackend::missing(NAME, t.buffer));
                break;
            }
        }
    }
    if result.is_ok() {
        result = (|| {
            let slab = &*slab;
            let stored = |t: &TensorRef<'_>, name: &'static str| -> Result<&CpuStorage> {
                let s = slab
                    .get(t.buffer.0 as usize)
                    .and_then(Option::as_ref)
                    .ok_or_else(|| CpuBackend::missing(name, t.buffer))?;
                CpuBackend::check(name, t, s)?;
                Ok(s)
            };
            let ins = call.inputs.iter().map(|t| stored(t, NAME)).collect::<Result<SmallVec<[&CpuStorage; 8]>>>()?;
            for (t, s) in &taken {
                CpuBackend::check(NAME, t, s)?;
            }
            if let Some(layout) = tail {
                return with_num!(value, NAME, T => tail::eval::<T>(call, plan, layout, &ins, &mut taken));
            }
            if let Some((h, blocked)) = &blocked {
                let operands = [stored(&h.a, "MatMul")?, stored(&h.b, "MatMul")?];
                let parts = head::Head { product: h, blocked, operands, scratch: scratch_storage.as_mut() };
                return with_float!(value, NAME, T => head::eval::<T>(call, parts, plan, &ins, &mut taken));
            }
            with_num!(value, NAME, T => eval::<T>(call, plan, &ins, &mut taken))
        })();
    }
    for (t, s) in taken {
        slab[t.buffer.0 as usize] = Some(s);
    }
    if let (Some(id), Some(s)) = (scratch, scratch_storage) {
        slab[id.0 as usize] = Some(s);
    }
    drop(slab);
    if let Some(id) = scratch {
        crate::backend::Backend::scratch_free(be, id);
    }
    result
}

fn eval<T: Scalar + Value>(
    call: &FusedCall<'_>,
    plan: &Plan,
    ins: &[&CpuStorage],
    outs: &mut [(TensorRef<'_>, CpuStorage)],
) -> Result<()> {
    if plan.tail.is_some() {
        return Err(bad("a group with a tail run without it"));
    }
    let n: usize = call.dims.iter().product();
    let inputs = typed_inputs::<T>(call, ins)?;
    let kept = write_constants(plan, typed_outputs(outs)?);
    if n == 0 {
        return Ok(());
    }
    // Split every kept output at the same chunk boundaries; each chunk runs
    // with its own tiles (on its own thread when the group is large).
    let chunk = chunk_len(n, plan.weight);
    let chunks = n.div_ceil(chunk);
    let mut per_chunk: Vec<Vec<Option<OutSlice<'_, T>>>> =
        (0..chunks).map(|_| Vec::with_capacity(kept.len())).collect();
    for slice in kept {
        match slice {
            None => per_chunk.iter_mut().for_each(|c| c.push(None)),
            Some(OutSlice::T(v)) => {
                for (c, piece) in per_chunk.iter_mut().zip(v.chunks_mut(chunk)) {
                    c.push(Some(OutSlice::T(piece)));
                }
            }
            Some(OutSlice::B(v)) => {
                for (c, piece) in per_chunk.iter_mut().zip(v.chunks_mut(chunk)) {
                    c.push(Some(OutSlice::B(piece)));
                }
            }
        }
    }
    let run_chunk = |index: usize, mut outs: Vec<Option<OutSlice<'_, T>>>| {
        let start = index * chunk;
        let end = (start + chunk).min(n);
        super::simd::dispatch(EvalChunk { plan, inputs: &inputs, outs: &mut outs, start, end });
    };
    #[cfg(feature = "rayon")]
    if chunks > 1 {
        use rayon::prelude::*;
        per_chunk.into_par_iter().enumerate().for_each(|(i, outs)| run_chunk(i, outs));
        return Ok(());
    }
    for (i, outs) in per_chunk.into_iter().enumerate() {
        run_chunk(i, outs);
    }
    Ok(())
}

/// The call's inputs as typed slices of their elements.
fn typed_inputs<'a, T: Scalar>(call: &FusedCall<'_>, ins: &[&'a CpuStorage]) -> Result<SmallVec<[InSlice<'a, T>; 8]>> {
    let mut inputs = SmallVec::new();
    for (t, s) in call.inputs.iter().zip(ins) {
        let numel = t.numel();
        inputs.push(if t.dtype == DType::Bool {
            InSlice::B(u8::of(s).and_then(|v| v.get(..numel)).ok_or_else(|| bad("input is not bool"))?)
        } else {
            InSlice::T(T::of(s).and_then(|v| v.get(..numel)).ok_or_else(|| bad("input of the wrong dtype"))?)
        });
    }
    Ok(inputs)
}

/// The kept values' buffers as typed slices of their elements.
fn typed_outputs<'a, T: Scalar>(outs: &'a mut [(TensorRef<'_>, CpuStorage)]) -> Result<Vec<OutSlice<'a, T>>> {
    let mut slices = Vec::with_capacity(outs.len());
    for (t, s) in outs.iter_mut() {
        let numel = t.numel();
        slices.push(if t.dtype == DType::Bool {
            OutSlice::B(u8::of_mut(s).and_then(|v| v.get_mut(..numel)).ok_or_else(|| bad("output is not bool"))?)
        } else {
            OutSlice::T(T::of_mut(s).and_then(|v| v.get_mut(..numel)).ok_or_else(|| bad("output of the wrong dtype"))?)
        });
    }
    Ok(slices)
}

/// Kept constants are written whole, here, once (a one-element one is a
/// scalar the group also reads); the other kept values are returned, in
/// the call's output order (None where a constant was), to be written
/// tile by tile.
fn write_constants<'a, T: Scalar>(plan: &Plan, slices: Vec<OutSlice<'a, T>>) -> Vec<Option<OutSlice<'a, T>>> {
    let mut const_of: Vec<Option<f64>> = vec![None; slices.len()];
    for step in &plan.steps {
        if let (Kind::Const(v), Some(o)) = (step.kind, step.output) {
            const_of[o] = Some(v);
        }
    }
    const_of
        .into_iter()
        .zip(slices)
        .map(|(constant, slice)| match (constant, slice) {
            (Some(v), OutSlice::T(d)) => {
                d.fill(T::from_f64(v));
                None
            }
            (Some(v), OutSlice::B(d)) => {
                d.fill(u8::from_f64(v));
                None
            }
            (None, slice) => Some(slice),
        })
        .collect()
}

/// Elements per chunk: all of them below the parallel threshold, else what
/// `for_chunks_weighted` would give the group's work, in whole tiles.
fn chunk_len(n: usize, weight: usize) -> usize {
    #[cfg(feature = "rayon")]
    {
        let work = n.saturating_mul(weight);
        if work >= super::layout::PAR_THRESHOLD && n > TILE {
            let per = super::layout::chunk_len(work).div_ceil(weight);
            return per.div_ceil(TILE).max(1) * TILE;
        }
    }
    let _ = weight;
    n.max(1)
}

/// `eval_chunk`'s arguments, to run it with the widest vectors the CPU has.
struct EvalChunk<'a, 'i, 'o, T> {
    plan: &'a Plan,
    inputs: &'a [InSlice<'i, T>],
    outs: &'a mut [Option<OutSlice<'o, T>>],
    start: usize,
    end: usize,
}

impl<T: Scalar + Value> super::simd::Kernel for EvalChunk<'_, '_, '_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        eval_chunk::<T>(self.plan, self.inputs, self.outs, self.start, self.end);
    }
}

// Inlined (with `run_step` and `gather`) into each of `simd::dispatch`'s
// instruction-set copies.
#[inline(always)]
fn eval_chunk<T: Scalar + Value>(
    plan: &Plan,
    inputs: &[InSlice<'_, T>],
    outs: &mut [Option<OutSlice<'_, T>>],
    start: usize,
    end: usize,
) {
    let tile = TILE.min(end - start);
    let mut t: Tiles<T> = Tiles::new(plan.t_tiles, tile);
    let mut b: Tiles<u8> = Tiles::new(plan.b_tiles, tile);
    fill_constants(plan, inputs, &mut t, &mut b);
    eval_range(plan, &mut t, &mut b, inputs, outs, start, end, None);
}

/// Once per chunk: one-element inputs and constants fill their tiles.
#[inline(always)]
fn fill_constants<T: Scalar + Value>(plan: &Plan, inputs: &[InSlice<'_, T>], t: &mut Tiles<T>, b: &mut Tiles<u8>) {
    for (read, input) in plan.reads.iter().zip(inputs) {
        if let Read::Splat(loc) = read {
            match (*loc, *input) {
                (Loc::T(i), InSlice::T(v)) => t.get_mut(i).fill(v[0]),
                (Loc::B(i), InSlice::B(v)) => b.get_mut(i).fill(v[0]),
                _ => unreachable!("plan matched tiles to input dtypes"),
            }
        }
    }
    for step in &plan.steps {
        if let (Kind::Const(v), true) = (step.kind, step.fill) {
            match step.dst {
                Loc::T(i) => t.get_mut(i).fill(T::from_f64(v)),
                Loc::B(i) => b.get_mut(i).fill(u8::from_f64(v)),
                Loc::Input(_) | Loc::Out(_) => unreachable!("constants get tiles"),
            }
        }
    }
}

/// Elements `start..end` of the group, a tile at a time; `outs` hold the
/// kept values' elements from `start` on. `capture`: (where, destination)
/// also copies that value out (a tail's reduced value), from `start`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn eval_range<T: Scalar + Value>(
    plan: &Plan,
    t: &mut Tiles<T>,
    b: &mut Tiles<u8>,
    inputs: &[InSlice<'_, T>],
    outs: &mut [Option<OutSlice<'_, T>>],
    start: usize,
    end: usize,
    mut capture: Option<(Loc, &mut [T])>,
) {
    let tile = t.tile.max(b.tile);
    let mut s = start;
    while s < end {
        let len = tile.min(end - s);
        for (read, input) in plan.reads.iter().zip(inputs) {
            if let Read::Gather(loc, gdims, strides) = read {
                match (*loc, *input) {
                    (Loc::T(i), InSlice::T(v)) => gather(v, strides, gdims, s, &mut t.get_mut(i)[..len]),
                    (Loc::B(i), InSlice::B(v)) => gather(v, strides, gdims, s, &mut b.get_mut(i)[..len]),
                    _ => unreachable!("plan matched tiles to input dtypes"),
                }
            }
        }
        let local = s - start;
        for step in &plan.steps {
            run_step(step, t, b, inputs, outs, Span { s, local, len });
        }
        if let Some((loc, dst)) = capture.as_mut() {
            let value = t_src(&t.view(), inputs, outs, *loc, Span { s, local, len });
            copy(&mut dst[local..local + len], value);
        }
        s += len;
    }
}

/// A chunk's tiles of one element type, in one allocation.
struct Tiles<V> {
    buf: Vec<V>,
    tile: usize,
}

/// Tiles to read, all but `hole` (the tile being written).
struct View<'a, V> {
    before: &'a [V],
    after: &'a [V],
    hole: usize,
    tile: usize,
}

impl<V: Copy + Default> Tiles<V> {
    fn new(count: usize, tile: usize) -> Self {
        Tiles { buf: vec![V::default(); count * tile], tile }
    }
    fn get_mut(&mut self, i: usize) -> &mut [V] {
        &mut self.buf[i * self.tile..(i + 1) * self.tile]
    }
    fn view(&self) -> View<'_, V> {
        View { before: &self.buf, after: &[], hole: usize::MAX, tile: self.tile }
    }
    /// Tile `i` to write and the others to read.
    fn split(&mut self, i: usize) -> (&mut [V], View<'_, V>) {
        let tile = self.tile;
        let (before, rest) = self.buf.split_at_mut(i * tile);
        let (dst, after) = rest.split_at_mut(tile);
        (dst, View { before, after, hole: i, tile })
    }
}

impl<'a, V> View<'a, V> {
    fn get(&self, i: usize) -> &'a [V] {
        let t = self.tile;
        match i.cmp(&self.hole) {
            std::cmp::Ordering::Less => &self.before[i * t..(i + 1) * t],
            std::cmp::Ordering::Greater => &self.after[(i - self.hole - 1) * t..(i - self.hole) * t],
            std::cmp::Ordering::Equal => unreachable!("a destination is never its own operand"),
        }
    }
}

/// `dims` read with `strides`, collapsed as `Strided` collapses them (unit
/// axes dropped, adjacent axes that the strides walk as one merged:
/// contiguous, or both broadcast). Flat indices are unchanged, so `gather`
/// reads the same elements; its runs along the innermost axis get longer (a
/// conv bias [1, C, 1, 1] over [N, C, H, W]: runs of H·W instead of W, one
/// fill per 676 elements in W2's first layer instead of one per 26).
fn collapse(dims: &[usize], strides: &[usize]) -> (Dims, Dims) {
    super::layout::Strided::<1>::new(dims, [strides], [0]).dims_and_strides()
}

/// out[j] = x[flat index s + j of the group read with `strides`], a run
/// along the innermost axis at a time: a fill (a broadcast row statistic,
/// stride 0), a copy (a bias, stride 1) or a strided loop. (Element by
/// element, the index arithmetic cost more than the ops reading the tile.)
#[inline(always)]
fn gather<V: Copy>(x: &[V], strides: &[usize], dims: &[usize], s: usize, out: &mut [V]) {
    let rank = dims.len();
    if rank == 0 {
        out.fill(x[0]);
        return;
    }
    // A fixed array, not a SmallVec: its fill and copy per call were a
    // store-forwarding stall that showed in profiles (ranks are at most
    // MAX_RANK, and `collapse` only lowers them).
    let mut idx = [0usize; crate::shape::MAX_RANK];
    let mut rest = s;
    let mut off = 0;
    for d in (0..rank).rev() {
        idx[d] = rest % dims[d];
        rest /= dims[d];
        off += idx[d] * strides[d];
    }
    let last = rank - 1;
    let (inner, step) = (dims[last], strides[last]);
    let mut done = 0;
    while done < out.len() {
        let run = (inner - idx[last]).min(out.len() - done);
        let dst = &mut out[done..done + run];
        match step {
            0 => dst.fill(x[off]),
            1 => copy(dst, &x[off..off + run]),
            _ => {
                for (j, o) in dst.iter_mut().enumerate() {
                    *o = x[off + j * step];
                }
            }
        }
        done += run;
        // Odometer step by `run` along the innermost axis, carrying outwards.
        idx[last] += run;
        off += run * step;
        let mut d = last;
        while idx[d] == dims[d] {
            off -= strides[d] * dims[d];
            idx[d] = 0;
            if d == 0 {
                break;
            }
            d -= 1;
            idx[d] += 1;
            off += strides[d];
        }
    }
}

/// The elements a step computes: flat indices `s..s + len` of the group,
/// at `local..local + len` of the chunk's output slices.
#[derive(Clone, Copy)]
struct Span {
    s: usize,
    local: usize,
    len: usize,
}

/// Computes one step's value for one span into its tile, or into its
/// output when the value is kept (`Loc::Out`), reading its operands from
/// the tiles, the inputs or the outputs written by earlier steps.
#[inline(always)]
fn run_step<T: Scalar + Value>(
    step: &Step,
    t: &mut Tiles<T>,
    b: &mut Tiles<u8>,
    inputs: &[InSlice<'_, T>],
    outs: &mut [Option<OutSlice<'_, T>>],
    span: Span,
) {
    let Span { local, len, .. } = span;
    // The kept output this step writes leaves `outs` while it runs (the
    // operands never name it: a value is computed after its operands).
    let mut taken = match step.dst {
        Loc::Out(o) => outs[o].take(),
        _ => None,
    };
    let read = &*outs;
    match step.kind {
        Kind::Const(_) => {}
        Kind::Compare(c) => {
            let tv = t.view();
            let o: &mut [u8] = match (step.dst, taken.as_mut()) {
                (Loc::B(d), _) => &mut b.get_mut(d)[..len],
                (Loc::Out(_), Some(OutSlice::B(v))) => &mut v[local..local + len],
                _ => unreachable!("comparisons make bools"),
            };
            let x = t_src(&tv, inputs, read, step.args[0], span);
            let y = t_src(&tv, inputs, read, step.args[1], span);
            with_compare!(c, C => {
                for ((o, &p), &q) in o.iter_mut().zip(x).zip(y) {
                    *o = compare_values(C, p, q) as u8;
                }
            })
        }
        kind => {
            let (o, tv): (&mut [T], View<'_, T>) = match (step.dst, taken.as_mut()) {
                (Loc::T(d), _) => {
                    let (dst, tv) = t.split(d);
                    (&mut dst[..len], tv)
                }
                (Loc::Out(_), Some(OutSlice::T(v))) => (&mut v[local..local + len], t.view()),
                _ => unreachable!("unary and binary ops and where make values"),
            };
            match kind {
                Kind::Unary(e) => {
                    let x = t_src(&tv, inputs, read, step.args[0], span);
                    match e {
                        Expr::Unary(f, &Expr::Arg(0)) => with_unary!(f, F => {
                            for (o, &v) in o.iter_mut().zip(x) {
                                *o = T::unary(F, v);
                            }
                        }),
                        expr => {
                            for (o, &v) in o.iter_mut().zip(x) {
                                *o = expr.eval(&[v]);
                            }
                        }
                    }
                }
                Kind::Binary(e) => {
                    let x = t_src(&tv, inputs, read, step.args[0], span);
                    let y = t_src(&tv, inputs, read, step.args[1], span);
                    match e {
                        Expr::Binary(f, &Expr::Arg(0), &Expr::Arg(1)) => with_binary!(f, F => {
                            for ((o, &p), &q) in o.iter_mut().zip(x).zip(y) {
                                *o = T::binary(F, p, q);
                            }
                        }),
                        expr => {
                            for ((o, &p), &q) in o.iter_mut().zip(x).zip(y) {
                                *o = expr.eval(&[p, q]);
                            }
                        }
                    }
                }
                Kind::Where => {
                    let bv = b.view();
                    let c = b_src(&bv, inputs, read, step.args[0], span);
                    let x = t_src(&tv, inputs, read, step.args[1], span);
                    let y = t_src(&tv, inputs, read, step.args[2], span);
                    for (((o, &k), &p), &q) in o.iter_mut().zip(c).zip(x).zip(y) {
                        *o = T::select(k, p, q);
                    }
                }
                Kind::Const(_) | Kind::Compare(_) => unreachable!("handled above"),
            }
        }
    }
    if let Loc::Out(o) = step.dst {
        outs[o] = taken;
    }
}

fn t_src<'r, T: Copy>(
    t: &View<'r, T>,
    inputs: &'r [InSlice<'r, T>],
    outs: &'r [Option<OutSlice<'_, T>>],
    loc: Loc,
    Span { s, local, len }: Span,
) -> &'r [T] {
    match loc {
        Loc::T(i) => &t.get(i)[..len],
        Loc::Input(k) => match inputs[k] {
            InSlice::T(v) => &v[s..s + len],
            InSlice::Rel(v, base) => &v[s - base..s - base + len],
            InSlice::B(_) => unreachable!("plan checked operand kinds"),
        },
        Loc::Out(o) => match &outs[o] {
            Some(OutSlice::T(v)) => &v[local..local + len],
            _ => unreachable!("plan checked operand kinds"),
        },
        Loc::B(_) => unreachable!("plan checked operand kinds"),
    }
}

fn b_src<'r, T: Copy>(
    b: &View<'r, u8>,
    inputs: &'r [InSlice<'r, T>],
    outs: &'r [Option<OutSlice<'_, T>>],
    loc: Loc,
    Span { s, local, len }: Span,
) -> &'r [u8] {
    match loc {
        Loc::B(i) => &b.get(i)[..len],
        Loc::Input(k) => match inputs[k] {
            InSlice::B(v) => &v[s..s + len],
            InSlice::T(_) | InSlice::Rel(..) => unreachable!("plan checked operand kinds"),
        },
        Loc::Out(o) => match &outs[o] {
            Some(OutSlice::B(v)) => &v[local..local + len],
            _ => unreachable!("plan checked operand kinds"),
        },
        Loc::T(_) => unreachable!("plan checked operand kinds"),
    }
}

#[cfg(test)]
mod tests {
    use super::{collapse, gather};
    use crate::shape::Dims;

    /// `gather` against the flat index arithmetic it replaces, for
    /// broadcast (stride 0), contiguous and permuted reads, from starts in
    /// the middle of a row and lengths crossing several rows.
    #[test]
    fn gather_reads_every_element_where_the_strides_say() {
        let x: Vec<u32> = (0..64).collect();
        let cases: [(&[usize], &[usize]); 8] = [
            (&[3, 4, 5], &[5, 0, 1]),  // a [3, 1, 5] operand
            (&[3, 4, 5], &[4, 1, 0]),  // [3, 4, 1]: a row statistic
            (&[3, 4, 5], &[0, 0, 1]),  // a bias
            (&[3, 4, 5], &[1, 15, 3]), // permuted
            (&[7], &[1]),
            (&[2, 3, 1, 4, 2], &[0, 2, 0, 0, 0]), // a conv bias [1, C, 1, 1] (a unit axis too)
            (&[2, 3, 4], &[12, 4, 1]),            // contiguous: one run
            (&[2, 3, 4], &[0, 0, 0]),             // one element everywhere
        ];
        for (dims, strides) in cases {
            let n: usize = dims.iter().product();
            let expected: Vec<u32> = (0..n)
                .map(|mut i| {
                    let mut off = 0;
                    for d in (0..dims.len()).rev() {
                        off += (i % dims[d]) * strides[d];
                        i /= dims[d];
                    }
                    x[off]
                })
                .collect();
            let (cdims, cstrides) = collapse(dims, strides);
            for start in [0, 1, 4, 6, n - 1] {
                for len in [1, 2, 7, n - start] {
                    let len = len.min(n - start);
                    let mut out = vec![u32::MAX; len];
                    gather(&x, strides, dims, start, &mut out);
                    assert_eq!(out, expected[start..start + len], "{dims:?} {strides:?} from {start}, {len}");
                    out.fill(u32::MAX);
                    gather(&x, &cstrides, &cdims, start, &mut out);
                    assert_eq!(
                        out,
                        expected[start..start + len],
                        "collapsed {cdims:?} {cstrides:?} from {start}, {len}"
                    );
                }
            }
        }
        // What the merging makes of the cases that motivate it.
        let pair = |(d, s): (Dims, Dims)| (d.to_vec(), s.to_vec());
        assert_eq!(pair(collapse(&[64, 32, 26, 26], &[0, 1, 0, 0])), (vec![64, 32, 676], vec![0, 1, 0]));
        assert_eq!(pair(collapse(&[2, 3, 4], &[12, 4, 1])), (vec![24], vec![1]));
        assert_eq!(pair(collapse(&[1, 1], &[0, 0])), (vec![1], vec![0]));
    }
}
