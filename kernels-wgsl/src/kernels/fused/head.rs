//! Groups headed by a matrix product (`FusedCall::head`, matmul epilogue
//! fusion): ONE dispatch of the product's kernel (the tuner's choice for
//! the shape, as `kernels::matmul` runs it) whose stores evaluate the
//! group's element-wise ops for the stored element and write only the kept
//! values, so the raw product reaches memory only when op 0 is kept.
//!
//! - **Generated from the matmul module.** The kernel is the chosen matmul
//!   module's text with every store `out[at] = v;` rewritten to
//!   `emit(at, v);`, its `out` binding replaced by the epilogue's bindings
//!   and parameter fields appended to its `MatMul` struct. `emit` is printed
//!   by fused.rs's generator (`Gen`), reading broadcast inputs (a bias) by
//!   the same index arithmetic as a headless group.
//! - **Same bits as unfused.** Each output is the same f32 sum as the
//!   product's own kernel computes (the same loop, only the store differs),
//!   then the same per-element expressions as their own kernels.
//! - **Fallback.** `run_head_split` (the product, then a headless group)
//!   where this kernel does not apply: K over `K_CHUNK` (the product is a
//!   sum of chunk products combined afterwards, so no store holds the final
//!   value), batches over the adapter's z limit (several dispatches), more
//!   storage bindings than the adapter has or more ops than
//!   `max_fused_ops`, an empty product, and groups of another dtype than
//!   f32 (the only matmul dtype).

use std::fmt::Write as _;
use std::rc::Rc;

use kiln_core::backend::checks::broadcast_to;
use kiln_core::backend::{run_head_split, FusedArg, FusedCall, TensorRef};
use kiln_core::op::Op;
use kiln_core::{DType, Result};

use super::{bad, check_io, check_op, params as epilogue_words, Gen, Read, Source, PLANS_KEPT};
use crate::kernels::matmul::{self, Launch};
use crate::params::words;
use crate::pipelines::Pipeline;
use crate::shaders::{self, Kernel, Ty};
use crate::{Arg, WgpuBackend};

const OP: &str = "fused";

/// A group's epilogue: everything but the product's kernel, which the
/// tuner picks per shape. `None` in `emit` when the group takes the
/// fallback whatever the shape (too many bindings or ops).
pub(crate) struct Epilogue {
    emit: Option<Emit>,
}

struct Emit {
    /// The module-scope WGSL: the parameter fields (appended to `MatMul`),
    /// the bindings (from 3, replacing `out`) and `fn emit`.
    fields: String,
    bindings: String,
    function: String,
    /// Bindings 3..: the inputs read, then the ops written.
    reads: Vec<(Source, Read)>,
    writes: Vec<usize>,
    consts: Vec<usize>,
}

pub(super) fn run(be: &WgpuBackend, call: &FusedCall<'_>) -> Result<()> {
    let head = call.head.ok_or_else(|| bad("a head group without a head"))?;
    let first = call.ops.first().filter(|o| o.op == head.op() && o.arity == 0);
    let Some(first) = first else {
        return Err(bad("op 0 of a group with a head must be its MatMul, without operands"));
    };
    // The matmul kernels are f32 only; run_head_split reports another dtype.
    if first.dtype != DType::F32 {
        return run_head_split(be, call);
    }
    let cached = call.plan_id.and_then(|id| be.fused.borrow().head_plans.get(&id).cloned());
    let epilogue = match cached {
        Some(e) => e,
        None => {
            let e = Rc::new(plan(be, call)?);
            if let Some(id) = call.plan_id {
                let mut cache = be.fused.borrow_mut();
                if cache.head_plans.len() >= PLANS_KEPT {
                    cache.head_plans.clear();
                }
                cache.head_plans.insert(id, e.clone());
            }
            e
        }
    };
    let Some(emit) = &epilogue.emit else { return run_head_split(be, call) };
    let Some(Launch { mut params, kernel, grid: (gx, gy), batches, chunks }) =
        matmul::prepare(be, head.transpose_a, head.transpose_b, &[head.a, head.b], call.dims, first.dtype)?
    else {
        return run_head_split(be, call); // no outputs: only kept constants to write
    };
    let max_z = be.ctx().limits.max_compute_workgroups_per_dimension.max(1) as usize;
    if chunks > 1 || batches > max_z {
        return run_head_split(be, call);
    }
    // One chunk, all batches in this dispatch (what `launch_chunks` sets).
    params.first_chunk = 0;
    params.chunks = 1;
    params.chunk_stride = 0;
    params.first_batch = 0;
    let n: usize = call.dims.iter().product();
    let mut args: Vec<(u32, Arg)> = vec![(1, Arg::input(&head.a)), (2, Arg::input(&head.b))];
    let mut strides: Vec<Vec<usize>> = Vec::new();
    for (r, &(source, read)) in emit.reads.iter().enumerate() {
        let Source::Input(k) = source else { return Err(bad("an epilogue reads an op's value from memory")) };
        let t = call.inputs[k as usize];
        if read == Read::Broadcast {
            strides.push(broadcast_to(OP, t.dims, call.dims)?.to_vec());
        }
        args.push((r as u32 + 3, Arg::input(&t)));
    }
    for (w, &k) in emit.writes.iter().enumerate() {
        let t = output_of(call, k).ok_or_else(|| bad(format!("op {k} is written but not kept")))?;
        args.push(((emit.reads.len() + w) as u32 + 3, Arg::output(&t)));
    }
    let mut words_ = words(&params).to_vec();
    // The epilogue's fields follow `MatMul`'s (fused.rs's layout without `n`).
    words_.extend_from_slice(&epilogue_words(call, &emit.consts, &strides, n)?[1..]);
    let module = kernel.shader(&params);
    let pipeline = pipeline(be, module, kernel.entry(), emit)?;
    let ops = call.ops.len() as u32;
    let z = crate::geometry::word(OP, batches)?;
    be.launch_pipeline(OP, Kernel::FusedMatMul { kernel, ops }, pipeline, &args, &words_, [gx, gy, z])
}

fn output_of<'a>(call: &FusedCall<'a>, k: usize) -> Option<TensorRef<'a>> {
    call.outputs.iter().find(|(o, _)| *o as usize == k).map(|&(_, t)| t)
}

/// Check the group (as fused.rs's `plan` does, op 0 being the product) and
/// generate its epilogue, or take the fallback when it needs more bindings
/// or ops than one kernel may have.
fn plan(be: &WgpuBackend, call: &FusedCall<'_>) -> Result<Epilogue> {
    let ops = call.ops;
    let t = Ty::F32;
    let n: usize = call.dims.iter().product();
    let kept = check_io(call, t)?;
    for (i, op) in ops.iter().enumerate().skip(1) {
        check_op(call, i, op, t)?;
    }
    if ops[1..].iter().any(|o| matches!(o.op, Op::MatMul { .. })) {
        return Err(bad("a group holds a product after its head"));
    }
    let writes: Vec<usize> = (0..ops.len()).filter(|&k| kept[k]).collect();
    let emit = generate(call, &writes, n);
    let limits = &be.ctx().limits;
    let bindings = 3 + emit.reads.len() + emit.writes.len();
    let max = limits.max_storage_buffers_per_shader_stage.min(limits.max_bindings_per_bind_group) as usize;
    let fits = bindings <= max && ops.len() <= be.max_fused_ops().max(1);
    Ok(Epilogue { emit: fits.then_some(emit) })
}

/// The epilogue's WGSL: `emit(i, h)` computes ops 1.. for the element at
/// flat index `i` of the group, the product's value there being `h`, and
/// writes the kept ones (op 0 too when kept). Its text depends only on the
/// group's structure, as a headless group's (fused.rs).
fn generate(call: &FusedCall<'_>, writes: &[usize], n: usize) -> Emit {
    // Not `b`: matmul.wgsl's kernels have locals b0, b1.
    let mut g = Gen::new(call, Ty::F32, n, "eb");
    g.names.insert(0, "h".to_string());
    g.compute(1..call.ops.len());
    for &k in writes {
        g.name(&FusedArg::Op(k as u16));
    }
    let fields = g.fields("ep_");
    let bindings = g.bindings(writes, 3, ("eb", "ew"));
    let mut f = String::from("fn emit(i: u32, h: f32) {\n");
    f.push_str(&g.offsets("ep_"));
    f.push_str(&g.read_lines);
    f.push_str(&g.body);
    f.push_str(&g.stores(writes, "ew"));
    f.push_str("}\n");
    Emit { fields, bindings, function: f, reads: g.reads, writes: writes.to_vec(), consts: g.consts }
}

/// The text `out: array<f32>` is declared by, in matmul_common.wgsl.
const OUT_BINDING: &str = "@group(0) @binding(3) var<storage, read_write> out: array<f32>;";
/// The end of matmul_common.wgsl's `MatMul` struct (as `wgsl_file!` keeps
/// it: comments out, indentation cut to one space).
const STRUCT_END: &str = " chunk_stride: u32,\n}";

/// The matmul module `source` (entry point `entry`) with its stores going
/// through `emit`: an error, not a wrong kernel, if the module's text is
/// not as this expects.
fn rewrite(source: &str, entry: &str, emit: &Emit) -> Result<String> {
    let unexpected = |what: &str| bad(format!("the matmul module's text is not as the epilogue expects ({what})"));
    if source.matches(OUT_BINDING).count() != 1 || source.matches(STRUCT_END).count() != 1 {
        return Err(unexpected("the out binding or the MatMul struct"));
    }
    let source = source
        .replace(STRUCT_END, &format!(" chunk_stride: u32,\n{}}}", emit.fields))
        .replace(OUT_BINDING, &emit.bindings);
    // store4 with ONE call of `emit`, not eight: the driver inlines every
    // call, and lavapipe took 30 s to compile W1's vec4 kernel with emit
    // inlined at all 256 places.
    let at = source.find("fn store4(").ok_or_else(|| unexpected("no store4"))?;
    let end = at + source[at..].find("\n}\n").ok_or_else(|| unexpected("store4's end"))? + 3;
    let source = format!("{}{STORE4}{}", &source[..at], &source[end..]);
    // `out[X] = Y;` -> `emit(X, Y);`: the only uses of `out`, each a
    // statement of one line (comments are left alone). A run of store4
    // calls (an entry point's register block) becomes one loop over the
    // values gathered in arrays, for the same reason.
    let mut text = String::with_capacity(source.len() + 4096);
    let mut stores = 0;
    let mut run: Vec<[&str; 3]> = Vec::new();
    for line in source.lines() {
        let (code, comment) = line.split_at(line.find("//").unwrap_or(line.len()));
        let call = code.trim().strip_prefix("store4(job, ").and_then(|c| c.strip_suffix(");"));
        if let Some(call) = call {
            let args: Vec<&str> = call.split(", ").collect();
            let [row, col, value] = args[..] else { return Err(unexpected("a store4 call")) };
            run.push([row, col, value]);
            stores += 1;
            continue;
        }
        if !run.is_empty() {
            store_loop(&mut text, &run);
            run.clear();
        }
        text.push_str(&rewrite_stores(code, &mut stores).ok_or_else(|| unexpected("a store to out"))?);
        text.push_str(comment);
        text.push('\n');
    }
    if stores == 0 {
        return Err(unexpected("no store to out"));
    }
    // The pipeline is made for the entry point `main`.
    if entry != "main" {
        let from = format!("fn {entry}(");
        if text.matches(&from).count() != 1 || text.contains("fn main(") {
            return Err(unexpected("the entry point"));
        }
        text = text.replace(&from, "fn main(");
    }
    Ok(format!("{text}\n{}\n{}\n{}", shaders::TRIG, shaders::SCALAR, emit.function))
}

/// matmul_common.wgsl's store4 for a fused kernel: the same outputs
/// (`job.out + row * n + col + j` where row and column exist), each through
/// `emit`.
const STORE4: &str = "fn store4(job: Job, row: u32, col: u32, v: vec4<f32>) {
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (row < params.m && col + j < params.n) {
            emit(job.out + row * params.n + col + j, v[j]);
        }
    }
}
";

/// A run of `store4(job, row, col, value);` calls as arrays of their
/// arguments and one loop calling store4 (the values are final: the calls
/// come after the accumulation).
fn store_loop(text: &mut String, run: &[[&str; 3]]) {
    let n = run.len();
    let _ = writeln!(text, " var e_r: array<u32, {n}>;\n var e_c: array<u32, {n}>;\n var e_v: array<vec4<f32>, {n}>;");
    for (q, [row, col, value]) in run.iter().enumerate() {
        let _ = writeln!(text, " e_r[{q}] = {row};\n e_c[{q}] = {col};\n e_v[{q}] = {value};");
    }
    let _ = writeln!(text, " for (var e_q = 0u; e_q < {n}u; e_q = e_q + 1u) {{");
    text.push_str("  store4(job, e_r[e_q], e_c[e_q], e_v[e_q]);\n }\n");
}

/// `code` (one line, no comment) with its stores `out[X] = Y;` written as
/// `emit(X, Y);`, or None if it uses `out` otherwise (a member `out:` is
/// no use).
fn rewrite_stores(code: &str, stores: &mut usize) -> Option<String> {
    let mut text = String::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "out") {
        text.push_str(&rest[..at]);
        let Some(tail) = rest[at + 3..].strip_prefix('[') else {
            // Job's member `out: u32` (an offset, not the binding).
            rest[at + 3..].starts_with(':').then_some(())?;
            text.push_str("out");
            rest = &rest[at + 3..];
            continue;
        };
        let close = tail.find(']')?;
        let (index, after) = (&tail[..close], tail[close + 1..].strip_prefix(" = ")?);
        let end = after.find(';')?;
        if index.contains('[') {
            return None;
        }
        text.push_str(&format!("emit({index}, {});", &after[..end]));
        rest = &after[end + 1..];
        *stores += 1;
    }
    text.push_str(rest);
    Some(text)
}

/// The first occurrence of the identifier `word` in `s` (not part of a
/// longer name or a member such as `job.out`).
fn find_word(s: &str, word: &str) -> Option<usize> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(i) = s[from..].find(word).map(|i| i + from) {
        let before = s[..i].chars().next_back();
        let after = s[i + word.len()..].chars().next();
        if !before.is_some_and(|c| is_ident(c) || c == '.') && !after.is_some_and(is_ident) {
            return Some(i);
        }
        from = i + word.len();
    }
    None
}

/// The generated pipeline of `emit` on entry `entry` of the matmul module
/// `module`, compiled once.
fn pipeline(be: &WgpuBackend, module: Kernel, entry: &'static str, emit: &Emit) -> Result<Rc<Pipeline>> {
    let key = (module, entry, format!("{}{}{}", emit.fields, emit.bindings, emit.function));
    super::cached_in(
        be,
        |c| &mut c.rewritten,
        key,
        OP,
        "FusedMatMul",
        |_| {
            let source = module.source().ok_or_else(|| bad(format!("no WGSL for {module:?}")))?;
            rewrite(&source, entry, emit)
        },
    )
}

#[cfg(test)]
mod tests {
    use kiln_core::backend::{BufferId, FusedArg, FusedCall, FusedMatMul, FusedOp, TensorRef};
    use kiln_core::op::{BinaryOp, CompareOp, Op, UnaryOp};
    use kiln_core::DType;

    use super::{generate, rewrite};
    use crate::kernels::matmul_tune::MatMulKernel;
    use crate::params::MatMul;
    use crate::shaders::Kernel;

    fn op(op: Op, args: &[FusedArg], dtype: DType) -> FusedOp {
        let mut a = [FusedArg::Input(0); 3];
        a[..args.len()].copy_from_slice(args);
        FusedOp { op, args: a, arity: args.len() as u8, dtype }
    }

    /// Every matmul module and entry point (every vec4 / staged operand
    /// layout) rewritten with epilogues of every kind of read and op, op 0
    /// kept or not, makes valid WGSL (naga, as wgpu checks it).
    #[test]
    fn every_generated_epilogue_kernel_validates() {
        use FusedArg::{Input, Op as V};
        let f = DType::F32;
        let dims = [4usize, 6];
        let (full, row, one, cond) = (&[4usize, 6][..], &[6usize][..], &[][..], &[4usize, 1][..]);
        let inputs = [
            TensorRef { buffer: BufferId(0), dims: row, dtype: f },
            TensorRef { buffer: BufferId(1), dims: full, dtype: f },
            TensorRef { buffer: BufferId(2), dims: one, dtype: f },
            TensorRef { buffer: BufferId(3), dims: cond, dtype: DType::Bool },
        ];
        let ab = TensorRef { buffer: BufferId(4), dims: full, dtype: f };
        let head = Some(FusedMatMul { transpose_a: false, transpose_b: true, a: ab, b: ab });
        let mm = Op::MatMul { transpose_a: false, transpose_b: true };
        let ops = [
            op(mm, &[], f),
            op(Op::Binary(BinaryOp::Add), &[V(0), Input(0)], f),
            op(Op::Full(0.0), &[], f),
            op(Op::Binary(BinaryOp::Maximum), &[V(1), V(2)], f),
            op(Op::Compare(CompareOp::Greater), &[V(1), V(2)], DType::Bool),
            op(Op::Binary(BinaryOp::Mul), &[V(3), Input(1)], f),
            op(Op::Unary(UnaryOp::Tanh), &[V(5)], f),
            op(Op::Where, &[Input(3), V(6), Input(2)], f),
            op(Op::Full(1.0), &[], DType::Bool),
        ];
        let out = |k: u16, dtype: DType, dims: &'static [usize]| (k, TensorRef { buffer: BufferId(9), dims, dtype });
        let with_head = [out(0, f, full), out(3, f, full), out(4, DType::Bool, full), out(7, f, full)];
        let without = [out(3, f, full), out(7, f, full), out(8, DType::Bool, one)];
        // Bias + relu, the Linear layer's epilogue: one read, one write.
        let linear = [out(3, f, full)];
        let mut modules: Vec<(Kernel, &str)> =
            vec![(Kernel::MatMul, "tile128"), (Kernel::MatMul, "tile64"), (Kernel::MatMul, "skinny")];
        for ta in [false, true] {
            for tb in [false, true] {
                let p = MatMul { a_col: if ta { 4 } else { 1 }, b_col: if tb { 4 } else { 1 }, ..MatMul::default() };
                modules.push((MatMulKernel::Vec4.shader(&p), "main"));
                modules.push((MatMulKernel::Vec4Tall.shader(&p), "main"));
                modules.push((MatMulKernel::Staged.shader(&p), "main"));
            }
        }
        for outputs in [&with_head[..], &without[..], &linear[..]] {
            let call = FusedCall { dims: &dims, ops: &ops, inputs: &inputs, outputs, plan_id: None, head };
            let writes: Vec<usize> = outputs.iter().map(|&(k, _)| k as usize).collect();
            let emit = generate(&call, &writes, 24);
            assert!(!emit.function.contains("0.0") && !emit.function.contains("1.0"), "values in the text");
            for &(module, entry) in &modules {
                let source = module.source().expect("a matmul module");
                let src = rewrite(&source, entry, &emit).unwrap();
                assert!(!src.contains("out["), "{module:?} {entry}: a store left");
                crate::shaders::validate_wgsl(&format!("epilogue kernel {module:?} {entry}"), &src);
            }
        }
    }
}
