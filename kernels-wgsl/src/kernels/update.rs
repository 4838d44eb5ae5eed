//! Launches update.wgsl: fused SGD (plain, momentum, Nesterov) and
//! Adam/AdamW steps in place, hyper-parameters derived in f64 on the host
//! and rounded once to f32, as the CPU backend does.

#[cfg(not(target_arch = "wasm32"))]
use kiln_core::backend::ParamUpdateCall;
use kiln_core::backend::{checks, BufferId, ParamUpdate};
use kiln_core::{DType, Error, Result};

use crate::geometry::word;
use crate::params::{words, Update};
use crate::shaders::Kernel;
use crate::{Arg, WgpuBackend};

const OP: &str = "update_param";

pub(crate) fn update(
    be: &WgpuBackend,
    upd: &ParamUpdate,
    param: BufferId,
    grad: BufferId,
    state: &[BufferId],
    dtype: DType,
    len: usize,
) -> Result<()> {
    check(upd, state, dtype)?;
    // Four elements per thread when they divide evenly: the same operations
    // on each lane, a quarter of the threads (on lavapipe W1's Adam took
    // 7.5 ms per step one element per thread, 3.1 ms four; docs/performance.md).
    let vec4 = len % 4 == 0;
    let threads = if vec4 { len / 4 } else { len };
    let (entry, params) = prepare(upd, word(OP, threads)?)?;
    let buf = |id: BufferId, write: bool| Arg::Buffer { id, dtype, len, write };
    let groups = be.grid_for(OP, threads)?;
    let (p, g) = ((1, buf(param, true)), (2, buf(grad, false)));
    let params = words(&params);
    let kernel = Kernel::Update { vec4 };
    match entry {
        Entry::Sgd => be.launch(OP, kernel, "sgd", &[p, g], params, groups),
        Entry::SgdMomentum => be.launch(OP, kernel, "sgd_momentum", &[p, g, (3, buf(state[0], true))], params, groups),
        Entry::Adam => {
            let args = [p, g, (3, buf(state[0], true)), (4, buf(state[1], true))];
            be.launch(OP, kernel, "adam", &args, params, groups)
        }
    }
}

/// Which of update.wgsl's steps an update runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Sgd,
    SgdMomentum,
    Adam,
}

impl Entry {
    /// State buffers it reads and writes.
    #[cfg(not(target_arch = "wasm32"))]
    fn states(self) -> usize {
        match self {
            Entry::Sgd => 0,
            Entry::SgdMomentum => 1,
            Entry::Adam => 2,
        }
    }
}

/// The update's dtype and state buffers are what its kernel needs.
fn check(upd: &ParamUpdate, state: &[BufferId], dtype: DType) -> Result<()> {
    if dtype != DType::F32 {
        return Err(if dtype == DType::F64 {
            crate::buffers::f64_refused(OP)
        } else {
            Error::dtype(OP, format!("cannot optimise a {dtype} parameter"))
        });
    }
    checks::update_state_count(upd, state.len())?;
    Ok(())
}

/// The step to run and its parameters for `n` elements; the hyper-parameters
/// derived in f64 and rounded once to f32, as the CPU backend does.
fn prepare(upd: &ParamUpdate, n: u32) -> Result<(Entry, Update)> {
    let f = |v: f64| v as f32;
    Ok(match *upd {
        ParamUpdate::Sgd { lr, momentum, dampening, weight_decay, nesterov } => {
            let flags = u32::from(weight_decay != 0.0) | (u32::from(nesterov) << 1);
            let params = Update {
                n,
                flags,
                lr: f(lr),
                weight_decay: f(weight_decay),
                momentum: f(momentum),
                one_minus_dampening: f(1.0 - dampening),
                ..Update::default()
            };
            (if momentum == 0.0 { Entry::Sgd } else { Entry::SgdMomentum }, params)
        }
        ParamUpdate::Adam { lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, step } => {
            if step == 0 {
                return Err(Error::invalid(OP, "Adam's step counts from 1"));
            }
            let steps = i32::try_from(step).unwrap_or(i32::MAX);
            // The CPU's form of the update (see `adam_step_constants`).
            let (step_size, rsqrt_bias2) = kiln_core::backend::adam_step_constants(lr, beta1, beta2, steps);
            let params = Update {
                n,
                flags: u32::from(decoupled_weight_decay),
                weight_decay: f(weight_decay),
                beta1: f(beta1),
                beta2: f(beta2),
                one_minus_beta1: f(1.0 - beta1),
                one_minus_beta2: f(1.0 - beta2),
                step_size: f(step_size),
                rsqrt_bias2: f(rsqrt_bias2),
                eps: f(eps),
                decay_factor: f(1.0 - lr * weight_decay),
                ..Update::default()
            };
            (Entry::Adam, params)
        }
    })
}

/// Most parameters one multi-tensor kernel updates (a cap on its bindings
/// and its text on adapters that allow many storage buffers).
#[cfg(not(target_arch = "wasm32"))]
const MAX_TENSORS: usize = 16;

/// Multi-tensor apply: consecutive updates share one generated kernel and
/// one dispatch, as many as the adapter's storage-buffer bindings allow
/// (binding 0 holds every tensor's parameters, then each tensor binds its
/// parameter, gradient, copy-on-write source if any, and state). Each
/// tensor owns a range of whole workgroups (`generate`), and each element
/// gets the arithmetic of update.wgsl's step for it, in the same order: the
/// same bits as one dispatch per tensor where the adapter rounds every op. Every
/// call is checked before anything is recorded; where only one tensor fits,
/// or `grouped` is off (`WgpuOptions::grouped_optimizer_update`),
/// update.wgsl runs once per tensor.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn update_many(be: &WgpuBackend, calls: &[ParamUpdateCall<'_>], grouped: bool) -> Result<()> {
    let mut prepared = Vec::with_capacity(calls.len());
    for c in calls {
        check(&c.update, c.state, c.dtype)?;
        prepared.push(prepare(&c.update, word(OP, c.len)?)?);
    }
    // A buffer one update writes must not be bound by another (a dispatch
    // may not bind it twice, and the updates would race).
    let written: Vec<BufferId> = calls
        .iter()
        .zip(&prepared)
        .flat_map(|(c, (e, _))| std::iter::once(c.param).chain(c.state[..e.states()].iter().copied()))
        .collect();
    for c in calls {
        let reads = std::iter::once(c.grad).chain(c.source);
        if let Some(id) = reads.into_iter().find(|id| written.contains(id)) {
            return Err(Error::backend(OP, format!("buffer {} is both written and read by the updates", id.0)));
        }
    }
    let mut sorted = written.clone();
    sorted.sort_unstable_by_key(|b| b.0);
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::backend(OP, format!("buffer {} is written by two updates", w[0].0)));
    }
    // Every buffer exists, holds the update's elements and can be bound
    // (what recording checks dispatch by dispatch, checked before anything
    // is recorded).
    {
        let buffers = be.buffers.borrow();
        for (c, (entry, _)) in calls.iter().zip(&prepared) {
            let ids = [c.param, c.grad].into_iter().chain(c.source).chain(c.state[..entry.states()].iter().copied());
            for id in ids {
                be.bindable(&buffers, OP, id, c.dtype, c.len)?;
            }
        }
    }
    let limits = &be.ctx().limits;
    let max_bindings = limits.max_storage_buffers_per_shader_stage.min(limits.max_bindings_per_bind_group) as usize;
    // Ungrouped: one tensor per kernel, as if only one fit.
    let max_bindings = if grouped { max_bindings } else { 0 };
    let bindings = |k: usize| 2 + usize::from(calls[k].source.is_some()) + prepared[k].0.states();
    let mut start = 0;
    while start < calls.len() {
        let (mut end, mut used) = (start, 1);
        while end < calls.len() && end - start < MAX_TENSORS && used + bindings(end) <= max_bindings {
            used += bindings(end);
            end += 1;
        }
        if end - start <= 1 {
            let c = &calls[start];
            if let Some(source) = c.source {
                be.record_copy(OP, source, c.param, c.len)?;
            }
            update(be, &c.update, c.param, c.grad, c.state, c.dtype, c.len)?;
            start += 1;
            continue;
        }
        launch_group(be, &calls[start..end], &prepared[start..end])?;
        start = end;
    }
    Ok(())
}

/// One dispatch updating every tensor of `calls`.
#[cfg(not(target_arch = "wasm32"))]
fn launch_group(be: &WgpuBackend, calls: &[ParamUpdateCall<'_>], prepared: &[(Entry, Update)]) -> Result<()> {
    let key: Vec<u8> =
        calls.iter().zip(prepared).map(|(c, (e, _))| e.states() as u8 | (u8::from(c.source.is_some()) << 2)).collect();
    let pipeline = super::fused::cached_pipeline(be, OP, "MultiUpdate", key, || generate(calls, prepared))?;
    let mut args = Vec::new();
    let mut params: Vec<u32> = Vec::with_capacity(calls.len() * 15);
    let mut first_group = 0usize;
    for (c, (entry, p)) in calls.iter().zip(prepared) {
        let buf = |id: BufferId, write: bool| Arg::Buffer { id, dtype: c.dtype, len: c.len, write };
        let mut bind = |arg: Arg| args.push((args.len() as u32 + 1, arg));
        bind(buf(c.param, true));
        bind(buf(c.grad, false));
        if let Some(s) = c.source {
            bind(buf(s, false));
        }
        for &s in &c.state[..entry.states()] {
            bind(buf(s, true));
        }
        // Each tensor owns a range of whole workgroups, starting here.
        params.extend_from_slice(words(p));
        params.push(word(OP, first_group)?);
        first_group += c.len.div_ceil(crate::shaders::WG as usize);
    }
    let groups = be.grid_for(OP, first_group.saturating_mul(crate::shaders::WG as usize))?;
    be.launch_pipeline(OP, Kernel::Update { vec4: false }, pipeline, &args, &params, groups)
}

/// The WGSL of one multi-tensor update: update.wgsl's steps, one branch per
/// tensor, reading the hyper-parameters of `params[t]` in place (a copy of
/// the whole struct per thread is a cost lavapipe does not optimise away,
/// see docs/performance.md). A tensor owns a range of whole workgroups, so
/// the branch a workgroup takes is the same for all its threads: measured
/// on lavapipe, a branch per element (threads finding their tensor by
/// subtracting counts) made W1's update 4x slower than one kernel per
/// tensor.
#[cfg(not(target_arch = "wasm32"))]
fn generate(calls: &[ParamUpdateCall<'_>], prepared: &[(Entry, Update)]) -> String {
    use std::fmt::Write;
    let mut src = String::from(crate::shaders::COMMON);
    src.push_str(
        "\nstruct Step {\n n: u32,\n flags: u32,\n lr: f32,\n weight_decay: f32,\n momentum: f32,\n \
         one_minus_dampening: f32,\n beta1: f32,\n beta2: f32,\n one_minus_beta1: f32,\n one_minus_beta2: f32,\n \
         step_size: f32,\n rsqrt_bias2: f32,\n eps: f32,\n decay_factor: f32,\n first_group: u32,\n}\n",
    );
    let _ = writeln!(src, "@group(0) @binding(0) var<storage, read> params: array<Step, {}>;", calls.len());
    let mut binding = 1;
    let mut decl = |src: &mut String, name: String, write: bool| {
        let access = if write { "read_write" } else { "read" };
        let _ = writeln!(src, "@group(0) @binding({binding}) var<storage, {access}> {name}: array<f32>;");
        binding += 1;
    };
    for (t, (c, (entry, _))) in calls.iter().zip(prepared).enumerate() {
        decl(&mut src, format!("p{t}"), true);
        decl(&mut src, format!("g{t}"), false);
        if c.source.is_some() {
            decl(&mut src, format!("s{t}"), false);
        }
        if entry.states() > 0 {
            decl(&mut src, format!("m{t}"), true);
        }
        if entry.states() > 1 {
            decl(&mut src, format!("v{t}"), true);
        }
    }
    src.push_str(
        "@compute @workgroup_size(WG)\nfn main(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {\n \
         let group = flat_group(wg);\n",
    );
    // From the last tensor down: the first whose range starts at or before
    // this workgroup holds it.
    for (t, (c, (entry, _))) in calls.iter().zip(prepared).enumerate().rev() {
        // The current value: the copy-on-write source, or the parameter.
        let cur = if c.source.is_some() { format!("s{t}") } else { format!("p{t}") };
        let _ = writeln!(
            src,
            " if (group >= params[{t}].first_group) {{\n  let i = (group - params[{t}].first_group) * WG + lid;\n  \
             if (i >= params[{t}].n) {{\n   return;\n  }}\n  var g = g{t}[i];"
        );
        match entry {
            Entry::Sgd | Entry::SgdMomentum => {
                let _ = writeln!(
                    src,
                    "  if ((params[{t}].flags & 1u) != 0u) {{\n   g = g + params[{t}].weight_decay * {cur}[i];\n  }}"
                );
                if *entry == Entry::SgdMomentum {
                    let _ = writeln!(
                        src,
                        "  let mom = params[{t}].momentum;\n  let v = mom * m{t}[i] + params[{t}].one_minus_dampening * g;\n  \
                         m{t}[i] = v;\n  if ((params[{t}].flags & 2u) != 0u) {{\n   g = g + mom * v;\n  }} else {{\n   g = v;\n  }}"
                    );
                }
                let _ = writeln!(src, "  p{t}[i] = {cur}[i] - params[{t}].lr * g;");
            }
            Entry::Adam => {
                let _ = writeln!(
                    src,
                    "  var w = {cur}[i];\n  if ((params[{t}].flags & 1u) != 0u) {{\n   w = w * params[{t}].decay_factor;\n  }} else {{\n   \
                     g = g + params[{t}].weight_decay * w;\n  }}\n  let m = params[{t}].beta1 * m{t}[i] + params[{t}].one_minus_beta1 * g;\n  \
                     let v = params[{t}].beta2 * v{t}[i] + params[{t}].one_minus_beta2 * g * g;\n  m{t}[i] = m;\n  v{t}[i] = v;\n  \
                     p{t}[i] = w - params[{t}].step_size * (m / (sqrt(v) * params[{t}].rsqrt_bias2 + params[{t}].eps));"
                );
            }
        }
        src.push_str("  return;\n }\n");
    }
    src.push_str("}\n");
    src
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use kiln_core::backend::{BufferId, ParamUpdate, ParamUpdateCall};
    use kiln_core::DType;

    use super::{generate, prepare};

    fn validate(src: &str) {
        crate::shaders::validate_wgsl("generated update kernel", src);
    }

    /// Every kind of update, with and without a copy-on-write source, alone
    /// and all in one kernel, makes valid WGSL (naga, as wgpu checks it
    /// before creating the pipeline), without an adapter.
    #[test]
    fn grouped_kernels_validate_for_every_kind_of_update() {
        let adam = |decoupled| ParamUpdate::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decoupled_weight_decay: decoupled,
            step: 1,
        };
        let sgd =
            |momentum, nesterov| ParamUpdate::Sgd { lr: 0.1, momentum, dampening: 0.0, weight_decay: 0.0, nesterov };
        let updates = [adam(true), adam(false), sgd(0.0, false), sgd(0.9, false), sgd(0.9, true)];
        let state = [BufferId(0), BufferId(1)];
        let calls: Vec<ParamUpdateCall<'_>> = updates
            .iter()
            .flat_map(|&update| {
                [None, Some(BufferId(9))].map(|source| ParamUpdateCall {
                    update,
                    source,
                    param: BufferId(2),
                    grad: BufferId(3),
                    state: &state,
                    dtype: DType::F32,
                    len: 10,
                })
            })
            .collect();
        let prepared: Vec<_> = calls.iter().map(|c| prepare(&c.update, 10).unwrap()).collect();
        for k in 0..calls.len() {
            validate(&generate(&calls[k..k + 1], &prepared[k..k + 1]));
        }
        let all = generate(&calls, &prepared);
        validate(&all);
        // One branch per tensor, each reading its own parameters.
        assert_eq!(all.matches("if (group >= params[").count(), calls.len());
    }
}
