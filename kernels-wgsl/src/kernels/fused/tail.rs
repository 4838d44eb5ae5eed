//! Groups ending in a reduction (`FusedCall::tail`, reduction prologue
//! fusion): the reduction's dispatches (reduce.rs's choice of entry points
//! and passes for the shape) with the dispatches that read its input's
//! elements computing them from the group instead, so the reduced value is
//! never written to memory unless kept (`sum(exp(x - m))` in one kernel).
//!
//! - **Generated from reduce.wgsl.** The kernel is the reduction's module
//!   (`Kernel::Reduce`, as `kernels::reduce` runs it) with `element` (the
//!   one function that reads the input) calling a generated
//!   `prologue(i)`: fused.rs's generator (`Gen`) printing the group's ops
//!   for flat index `i` and writing the kept values there. Its parameter
//!   fields are appended to the `Reduce` struct, its bindings follow the
//!   module's (from 5). Passes over partials read no element and run the
//!   reduction's own pipelines.
//! - **Same bits as unfused.** Every element is visited once, in the
//!   reduction's own order (the same module: leaves, the workgroup tree,
//!   the passes), and each value is the same expression its own kernel
//!   evaluates.
//! - **Fallback.** `run_tail_split` (the group, then the reduction) where
//!   this kernel does not apply: more storage bindings than the adapter has
//!   or more ops than `max_fused_ops`, an empty group, a reduced value that
//!   is not of the group's numeric type.

use std::rc::Rc;

use kiln_core::backend::checks::broadcast_to;
use kiln_core::backend::{run_tail_split, FusedArg, FusedCall, TensorRef};
use kiln_core::op::{Op, ReduceOp};
use kiln_core::{DType, Result};

use super::{bad, check_io, check_op, params as prologue_words, Gen, Read, Source, PLANS_KEPT};
use crate::kernels::{reduce, ty};
use crate::params::{words, Reduce};
use crate::pipelines::Pipeline;
use crate::shaders::{self, Kernel, Ty};
use crate::{Arg, WgpuBackend};

const OP: &str = "fused";
/// The first binding of the prologue's (reduce.wgsl uses 0 to 4).
const FIRST_BINDING: usize = 5;

/// A group's prologue; `None` in `text` when the group takes the fallback
/// whatever the shape (too many bindings or ops).
pub(crate) struct Prologue {
    text: Option<Text>,
}

struct Text {
    /// The parameter fields (appended to `Reduce`), the bindings and
    /// `fn prologue`, one string: the pipelines' cache key with the module
    /// and entry point.
    wgsl: String,
    fields: std::ops::Range<usize>,
    bindings: std::ops::Range<usize>,
    function: std::ops::Range<usize>,
    /// Bindings 5..: the inputs read, then the ops written.
    reads: Vec<(Source, Read)>,
    writes: Vec<usize>,
    consts: Vec<usize>,
}

pub(super) fn run(be: &WgpuBackend, call: &FusedCall<'_>) -> Result<()> {
    let tail = call.tail().ok_or_else(|| bad("a tail group without a reduction"))?;
    let (source, index) = (tail.source as usize, tail.index as usize);
    let src = call.ops.get(source).filter(|_| source < index);
    let Some(src) = src else { return Err(bad(format!("the reduction reads op {source}, which is not before it"))) };
    let Some(reduced) = output_of(call, index) else {
        return Err(bad("the reduction ending a group has no output"));
    };
    let value = call.value_dtype().ok_or_else(|| bad("a group without a value of a numeric dtype"))?;
    if value == DType::F64 {
        return Err(crate::buffers::f64_refused(OP));
    }
    let n: usize = call.dims.iter().product();
    // A reduction of bools, or of nothing: the split path gives the
    // reduction's own answer (its error, or the identity).
    if src.dtype != value || !matches!(value, DType::F32 | DType::I32) || n == 0 {
        return run_tail_split(be, call);
    }
    let t = ty(value);
    let cached = call.plan_id.and_then(|id| be.fused.borrow().tail_plans.get(&id).cloned());
    let prologue = match cached {
        Some(p) => p,
        None => {
            let p = Rc::new(plan(be, call, t, index, source)?);
            if let Some(id) = call.plan_id {
                let mut cache = be.fused.borrow_mut();
                if cache.tail_plans.len() >= PLANS_KEPT {
                    cache.tail_plans.clear();
                }
                cache.tail_plans.insert(id, p.clone());
            }
            p
        }
    };
    let Some(text) = &prologue.text else { return run_tail_split(be, call) };
    // The prologue's bindings and parameter words, the same for every
    // dispatch that reads elements.
    let mut bound: Vec<(u32, Arg)> = Vec::with_capacity(text.reads.len() + text.writes.len() + 1);
    let mut strides: Vec<Vec<usize>> = Vec::new();
    for (r, &(source, read)) in text.reads.iter().enumerate() {
        let Source::Input(k) = source else { return Err(bad("a prologue reads an op's value from memory")) };
        let t = call.inputs[k as usize];
        if read == Read::Broadcast {
            strides.push(broadcast_to(OP, t.dims, call.dims)?.to_vec());
        }
        bound.push(((FIRST_BINDING + r) as u32, Arg::input(&t)));
    }
    for (w, &k) in text.writes.iter().enumerate() {
        let t = output_of(call, k).ok_or_else(|| bad(format!("op {k} is written but not kept")))?;
        bound.push(((FIRST_BINDING + text.reads.len() + w) as u32, Arg::output(&t)));
    }
    // The prologue's fields follow `Reduce`'s (fused.rs's layout without `n`).
    let extra = prologue_words(call, &text.consts, &strides, n)?;
    let kernel = Kernel::FusedReduce { op: tail.op, ops: index as u32 };
    let mut record = |entry: &'static str, sink: (u32, Arg), params: &Reduce, grid: [u32; 3]| {
        let pipeline = pipeline(be, (tail.op, t), entry, text)?;
        let mut args = bound.clone();
        args.push(sink);
        let mut w = words(params).to_vec();
        w.extend_from_slice(&extra[1..]);
        be.launch_pipeline(OP, kernel, pipeline, &args, &w, grid)
    };
    let elements = reduce::Elements::Prologue(&mut record);
    reduce::schedule(be, tail.op, tail.axes, (call.dims, value), &reduced, elements)
}

fn output_of<'a>(call: &FusedCall<'a>, k: usize) -> Option<TensorRef<'a>> {
    call.outputs.iter().find(|(o, _)| *o as usize == k).map(|&(_, t)| t)
}

/// Check the group without its reduction (as fused.rs's `plan` does) and
/// generate the prologue, or take the fallback when it needs more bindings
/// or ops than one kernel may have.
fn plan(be: &WgpuBackend, call: &FusedCall<'_>, t: Ty, index: usize, source: usize) -> Result<Prologue> {
    let outputs: Vec<(u16, TensorRef<'_>)> =
        call.outputs.iter().filter(|(k, _)| (*k as usize) < index).copied().collect();
    let group = FusedCall { ops: &call.ops[..index], outputs: &outputs, ..*call };
    let kept = check_io(&group, t)?;
    for (i, op) in group.ops.iter().enumerate() {
        check_op(&group, i, op, t)?;
    }
    let reduction = &call.ops[index];
    if reduction.dtype != call.ops[source].dtype || !matches!(reduction.op, Op::Reduce { .. }) {
        return Err(bad("the reduction ending a group is not of its value's dtype"));
    }
    let writes: Vec<usize> = (0..index).filter(|&k| kept[k]).collect();
    let n: usize = call.dims.iter().product();
    let text = generate(&group, t, &writes, source, n);
    let limits = &be.ctx().limits;
    // Parameters, the sink and the prologue's bindings; numbered from 5.
    let used = 2 + text.reads.len() + text.writes.len();
    let highest = FIRST_BINDING + text.reads.len() + text.writes.len();
    let fits = used <= limits.max_storage_buffers_per_shader_stage as usize
        && highest <= limits.max_bindings_per_bind_group as usize
        && call.ops.len() <= be.max_fused_ops().max(1);
    Ok(Prologue { text: fits.then_some(text) })
}

/// The prologue's WGSL: `prologue(i)` computes the group's ops for the
/// element at flat index `i`, writes the kept ones and returns op
/// `source`'s value. Its text depends only on the group's structure.
fn generate(group: &FusedCall<'_>, t: Ty, writes: &[usize], source: usize, n: usize) -> Text {
    // Not `b` or `r`: reduce.wgsl has no `pb`/`pw` names.
    let mut g = Gen::new(group, t, n, "pb");
    g.compute(0..group.ops.len());
    for &k in writes {
        g.name(&FusedArg::Op(k as u16));
    }
    let value = g.name(&FusedArg::Op(source as u16));
    let fields = g.fields("pl_");
    let bindings = g.bindings(writes, FIRST_BINDING, ("pb", "pw"));
    let mut wgsl = fields;
    let fields = 0..wgsl.len();
    wgsl.push_str(&bindings);
    let bindings = fields.end..wgsl.len();
    wgsl.push_str("fn prologue(i: u32) -> T {\n");
    wgsl.push_str(&g.offsets("pl_"));
    wgsl.push_str(&g.read_lines);
    wgsl.push_str(&g.body);
    wgsl.push_str(&g.stores(writes, "pw"));
    wgsl.push_str(&format!("    return {value};\n}}\n"));
    let function = bindings.end..wgsl.len();
    Text { wgsl, fields, bindings, function, reads: g.reads, writes: writes.to_vec(), consts: g.consts }
}

/// The end of reduce.wgsl's `Reduce` struct as `wgsl_file!` keeps it.
const STRUCT_END: &str = " parts: u32,\n}";
/// reduce.wgsl's `element`, the only reader of the input `x`, as the
/// fused kernel has it.
const ELEMENT: &str = "fn element(off: u32, j: u32) -> Acc {\n    return Acc(prologue(off), j, 1u);\n}";

/// reduce.wgsl for `op` over type `t`, entry point `entry` as `main`, its
/// elements computed by the prologue: an error, not a wrong kernel, if the
/// module's text is not as this expects.
fn rewrite((op, t): (ReduceOp, Ty), entry: &str, text: &Text) -> Result<String> {
    let unexpected = |what: &str| bad(format!("the reduction module's text is not as the prologue expects ({what})"));
    let source = Kernel::Reduce(op, t).source().ok_or_else(|| unexpected("no module"))?;
    let (from, to) = (format!("fn {entry}("), "fn main(");
    if source.matches(STRUCT_END).count() != 1 || source.matches("\nfn element(").count() != 1 {
        return Err(unexpected("the Reduce struct or element"));
    }
    if source.matches(&from).count() != 1 || source.contains(to) {
        return Err(unexpected("the entry point"));
    }
    let source = shaders::specialise(&source, &[ELEMENT.to_string()])
        .replace(STRUCT_END, &format!(" parts: u32,\n{}}}", &text.wgsl[text.fields.clone()]))
        .replace(&from, to);
    Ok(format!(
        "{source}\n{}\n{}\n{}\n{}",
        &text.wgsl[text.bindings.clone()],
        shaders::TRIG,
        shaders::SCALAR,
        &text.wgsl[text.function.clone()]
    ))
}

/// The pipeline of `entry` for this prologue, from the cache when made.
fn pipeline(be: &WgpuBackend, reduction: (ReduceOp, Ty), entry: &'static str, text: &Text) -> Result<Rc<Pipeline>> {
    super::cached_in(
        be,
        |c| &mut c.rewritten,
        (Kernel::Reduce(reduction.0, reduction.1), entry, text.wgsl.clone()),
        OP,
        "FusedReduce",
        |_| rewrite(reduction, entry, text),
    )
}

#[cfg(test)]
mod tests {
    use kiln_core::backend::{BufferId, FusedArg, FusedCall, FusedOp, TensorRef};
    use kiln_core::op::{BinaryOp, Op, ReduceOp, UnaryOp};
    use kiln_core::DType;

    use super::{generate, rewrite, Ty};

    fn op(op: Op, args: &[FusedArg], dtype: DType) -> FusedOp {
        let mut a = [FusedArg::Input(0); 3];
        a[..args.len()].copy_from_slice(args);
        FusedOp { op, args: a, arity: args.len() as u8, dtype }
    }

    /// Every reduction and entry point, in f32 and i32, with broadcast and
    /// kept values and constants, makes a module naga accepts.
    #[test]
    fn generated_kernels_validate() {
        use FusedArg::{Input, Op as V};
        let dims = [4usize, 6];
        for (t, dtype) in [(Ty::F32, DType::F32), (Ty::I32, DType::I32)] {
            let inputs = [
                TensorRef { buffer: BufferId(0), dims: &dims, dtype },
                TensorRef { buffer: BufferId(1), dims: &[4, 1], dtype },
            ];
            let unary = if t == Ty::F32 { UnaryOp::Exp } else { UnaryOp::Neg };
            let ops = [
                op(Op::Binary(BinaryOp::Sub), &[Input(0), Input(1)], dtype),
                op(Op::Full(2.0), &[], dtype),
                op(Op::Binary(BinaryOp::Mul), &[V(0), V(1)], dtype),
                op(Op::Unary(unary), &[V(2)], dtype),
            ];
            let out = TensorRef { buffer: BufferId(9), dims: &dims, dtype };
            let outputs = [(2u16, out)];
            let group =
                FusedCall { dims: &dims, ops: &ops, inputs: &inputs, outputs: &outputs, plan_id: None, head: None };
            let text = generate(&group, t, &[2], 3, 24);
            assert_eq!((text.reads.len(), text.writes.len(), text.consts.len()), (2, 1, 1));
            for reduction in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                for entry in ["serial", "serial_leaves", "leaf_groups", "leaves_to_parts", "leaves_to_out"] {
                    let src = rewrite((reduction, t), entry, &text).unwrap();
                    crate::shaders::validate_wgsl("generated reduction prologue", &src);
                }
            }
            assert!(rewrite((ReduceOp::Sum, t), "no_such_entry", &text).is_err());
        }
    }
}
