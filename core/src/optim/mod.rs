//! Optimizers. They run outside any graph (so no gradient structure is ever
//! recorded for an update) as fused in-place kernels on the parameters'
//! persistent buffers: one pass over memory per parameter per step.

mod clip;
mod schedule;

pub use clip::{clip_grad_norm, clip_grad_value};
pub use schedule::{LrScheduler, Schedule};

use crate::backend::{BufferId, ParamUpdate, ParamUpdateCall};
use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::param::Param;

/// What every optimizer offers.
pub trait Optimizer {
    /// Update every parameter that has a gradient, then bump its version.
    /// Errors point at the caller's line (here and below, `#[track_caller]`
    /// on the declaration applies to every implementation).
    #[track_caller]
    fn step(&mut self) -> Result<()>;
    /// Drop the gradients of every parameter this optimizer updates.
    fn zero_grad(&self);
    /// The learning rate of the first parameter group.
    fn learning_rate(&self) -> f64;
    /// Set every parameter group's learning rate: finite and >= 0, else an
    /// error and no change.
    #[track_caller]
    fn set_learning_rate(&mut self, lr: f64) -> Result<()>;
    /// Each parameter group's learning rate, in group order.
    fn group_learning_rates(&self) -> Vec<f64> {
        vec![self.learning_rate()]
    }
    /// Set each group's learning rate (one value per group; schedulers use
    /// this so that groups keep their ratios). Each finite and >= 0, else an
    /// error and no change.
    #[track_caller]
    fn set_group_learning_rates(&mut self, lrs: &[f64]) -> Result<()> {
        match lrs.first() {
            Some(&lr) => self.set_learning_rate(lr),
            None => Ok(()),
        }
    }
}

/// One learning rate per group, no more and no fewer.
#[track_caller]
fn check_group_count(given: usize, groups: usize) -> Result<()> {
    if given != groups {
        return Err(Error::invalid(
            "set_group_learning_rates",
            format!("{given} learning rates given for {groups} parameter groups"),
        ));
    }
    Ok(())
}

/// Parameters that share hyper-parameters. `lr`/`weight_decay` left as
/// None take the optimizer's defaults (PyTorch's `param_groups`).
#[derive(Clone, Debug, Default)]
pub struct ParamGroup {
    pub params: Vec<Param>,
    pub lr: Option<f64>,
    pub weight_decay: Option<f64>,
}

impl ParamGroup {
    pub fn new(params: Vec<Param>) -> ParamGroup {
        ParamGroup { params, lr: None, weight_decay: None }
    }
    pub fn lr(mut self, lr: f64) -> ParamGroup {
        self.lr = Some(lr);
        self
    }
    pub fn weight_decay(mut self, weight_decay: f64) -> ParamGroup {
        self.weight_decay = Some(weight_decay);
        self
    }

    /// The usual split in one line: weight matrices (and embeddings, and
    /// convolution kernels — every parameter of rank >= 2) decay by
    /// `weight_decay`; biases and normalisation scales (rank < 2) do not.
    /// `Adam::adamw_groups(ParamGroup::decay_split(model.parameters(), 0.1), 1e-3)`.
    pub fn decay_split(params: Vec<Param>, weight_decay: f64) -> Vec<ParamGroup> {
        let (decay, no_decay): (Vec<Param>, Vec<Param>) = params.into_iter().partition(|p| p.dims().len() >= 2);
        vec![ParamGroup::new(decay).weight_decay(weight_decay), ParamGroup::new(no_decay).weight_decay(0.0)]
    }
}

/// The hyper-parameters a group resolves to.
#[derive(Clone, Copy, Debug, PartialEq)]
struct GroupSettings {
    lr: f64,
    weight_decay: f64,
}

/// Resolve groups against defaults, refusing bad values and parameters
/// listed twice (they would be updated twice per step).
#[track_caller]
fn resolve_groups(
    op: &'static str,
    groups: Vec<ParamGroup>,
    lr: f64,
    weight_decay: f64,
    slots: usize,
) -> Result<(Vec<StateBuffers>, Vec<GroupSettings>)> {
    let mut state: Vec<StateBuffers> = Vec::new();
    let mut settings = Vec::with_capacity(groups.len());
    for (g, group) in groups.into_iter().enumerate() {
        let s = GroupSettings { lr: group.lr.unwrap_or(lr), weight_decay: group.weight_decay.unwrap_or(weight_decay) };
        check_hyper(op, "lr", s.lr, s.lr >= 0.0)?;
        check_hyper(op, "weight_decay", s.weight_decay, s.weight_decay >= 0.0)?;
        for p in group.params {
            if state.iter().any(|st| st.param.same(&p)) {
                return Err(Error::invalid(
                    op,
                    format!("parameter '{}' is listed twice (a parameter belongs to one group once)", p.name()),
                ));
            }
            let mut st = StateBuffers::new(&p, slots)?;
            st.group = g;
            state.push(st);
        }
        settings.push(s);
    }
    Ok((state, settings))
}

/// Per-parameter state buffers, zero-initialised, freed with the optimizer.
struct StateBuffers {
    param: Param,
    buffers: Vec<BufferId>,
    /// Index of the parameter group.
    group: usize,
}

impl StateBuffers {
    fn new(param: &Param, count: usize) -> Result<StateBuffers> {
        let zeros = match param.dtype() {
            DType::F32 => HostData::F32(crate::memory::try_vec("optimizer", param.numel(), 0.0)?),
            DType::F64 => HostData::F64(crate::memory::try_vec("optimizer", param.numel(), 0.0)?),
            other => return Err(Error::dtype("optimizer", format!("cannot optimise a {other} parameter"))),
        };
        let mut buffers = Vec::with_capacity(count);
        for _ in 0..count {
            buffers.push(param.device().upload(&zeros)?);
        }
        Ok(StateBuffers { param: param.clone(), buffers, group: 0 })
    }

    /// Every state buffer's values, in slot order.
    async fn read(&self) -> Result<Vec<HostData>> {
        let p = &self.param;
        let mut out = Vec::with_capacity(self.buffers.len());
        for &b in &self.buffers {
            out.push(p.device().backend().read(b, p.dtype(), p.numel()).await?);
        }
        Ok(out)
    }

    /// Overwrite the state buffers (one value per slot, the parameter's
    /// dtype and size); checked by `check` first.
    fn write(&self, values: &[HostData]) -> Result<()> {
        for (&b, data) in self.buffers.iter().zip(values) {
            self.param.device().backend().upload(b, data)?;
        }
        Ok(())
    }

    /// Why `values` cannot be this parameter's state, if it cannot.
    fn check(&self, values: &[HostData]) -> Option<String> {
        if values.len() != self.buffers.len() {
            return Some(format!("{} state buffers, expected {}", values.len(), self.buffers.len()));
        }
        let p = &self.param;
        values.iter().find(|v| v.dtype() != p.dtype() || v.len() != p.numel()).map(|v| {
            format!(
                "a state buffer of {} {} values for a {} parameter of {} values",
                v.len(),
                v.dtype(),
                p.dtype(),
                p.numel()
            )
        })
    }
}

/// Update every parameter that has a gradient (multi-tensor apply): each
/// run of consecutive parameters on one device goes to its backend as one
/// `update_params` call, so the CPU makes one parallel pass over all of
/// them and wgpu (on hardware adapters) one dispatch per group of tensors,
/// not one per tensor.
fn apply_all(state: &[StateBuffers], update_for: &dyn Fn(&StateBuffers) -> ParamUpdate) -> Result<()> {
    let mut start = 0;
    while start < state.len() {
        let device = state[start].param.device();
        let end = start + state[start..].iter().take_while(|s| s.param.device().same(device)).count();
        let mut calls = Vec::with_capacity(end - start);
        // The old value buffers stay alive until the updates are recorded.
        let mut held = Vec::with_capacity(end - start);
        let mut failed = Ok(());
        for s in &state[start..end] {
            let p = &s.param;
            let Some(grad) = p.grad_buffer() else { continue };
            // Copy-on-write: a graph that still reads the old value keeps it;
            // the update then reads it and writes a fresh buffer. (A failure
            // here still lets the parameters before it be updated: their new
            // buffers must not be left unwritten.)
            let (value, old) = match p.buffer_to_update() {
                Ok(v) => v,
                Err(e) => {
                    failed = Err(e);
                    break;
                }
            };
            let source = (old.id != value).then_some(old.id);
            calls.push(ParamUpdateCall {
                update: update_for(s),
                source,
                param: value,
                grad,
                state: &s.buffers,
                dtype: p.dtype(),
                len: p.numel(),
            });
            held.push((p, old));
        }
        let watch = device.op_watch();
        let updated = device.backend().update_params(&calls);
        device.record_op(watch, || format!("optimizer update ({} tensors)", calls.len()));
        updated?;
        for (p, _old) in held {
            p.bump_version();
        }
        failed?;
        start = end;
    }
    Ok(())
}

impl Drop for StateBuffers {
    fn drop(&mut self) {
        for &b in &self.buffers {
            self.param.device().give_back(b, self.param.dtype(), self.param.numel());
        }
    }
}

/// What a checkpoint reads from and restores into an optimizer
/// (`kiln_core::checkpoint::save_optimizer_state`): the step count, the
/// hyper-parameters and each parameter's state buffers, named as in
/// PyTorch's optimizer state ("exp_avg", "exp_avg_sq", "momentum_buffer").
pub trait OptimizerState: Optimizer {
    /// "Adam" or "Sgd".
    fn kind(&self) -> &'static str;
    /// Names of the per-parameter state buffers, in slot order (empty for
    /// plain SGD, which keeps none).
    fn slot_names(&self) -> &'static [&'static str];
    /// The parameters, in the order the optimizer was given them.
    fn params(&self) -> Vec<Param>;
    /// Steps taken so far (0 for SGD, whose update does not depend on it).
    fn step_count(&self) -> u64;
    fn set_step_count(&mut self, step: u64);
    /// Hyper-parameters as (name, value), for a checkpoint's metadata.
    fn hyper_parameters(&self) -> Vec<(&'static str, f64)>;
    /// Each parameter's state buffers, in slot order.
    fn read_state(&self) -> impl std::future::Future<Output = Result<Vec<Vec<HostData>>>>;
    /// Overwrite every parameter's state buffers; checks all of them before
    /// writing any.
    fn write_state(&mut self, state: &[Vec<HostData>]) -> Result<()>;
}

async fn read_all(state: &[StateBuffers]) -> Result<Vec<Vec<HostData>>> {
    let mut out = Vec::with_capacity(state.len());
    for s in state {
        out.push(s.read().await?);
    }
    Ok(out)
}

#[track_caller]
fn write_all(op: &'static str, state: &[StateBuffers], values: &[Vec<HostData>]) -> Result<()> {
    if values.len() != state.len() {
        return Err(Error::invalid(
            op,
            format!("state for {} parameters, the optimizer has {}", values.len(), state.len()),
        ));
    }
    let problems: Vec<String> = state
        .iter()
        .zip(values)
        .enumerate()
        .filter_map(|(i, (s, v))| s.check(v).map(|why| format!("parameter {i} ('{}'): {why}", s.param.name())))
        .collect();
    if !problems.is_empty() {
        return Err(Error::shape(op, problems.join("; ")));
    }
    state.iter().zip(values).try_for_each(|(s, v)| s.write(v))
}

#[track_caller]
fn check_hyper(op: &'static str, name: &str, value: f64, ok: bool) -> Result<()> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(Error::invalid(op, format!("{name} = {value} is out of range")))
    }
}

/// Stochastic gradient descent with optional momentum, Nesterov momentum
/// and L2 weight decay (PyTorch's formulas; the velocity starts at zero).
pub struct Sgd {
    state: Vec<StateBuffers>,
    groups: Vec<GroupSettings>,
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
}

impl Sgd {
    #[track_caller]
    pub fn new(params: Vec<Param>, lr: f64) -> Result<Sgd> {
        Sgd::with_options(params, lr, 0.0, 0.0, false)
    }

    #[track_caller]
    pub fn with_options(params: Vec<Param>, lr: f64, momentum: f64, weight_decay: f64, nesterov: bool) -> Result<Sgd> {
        Sgd::with_groups(vec![ParamGroup::new(params)], lr, momentum, weight_decay, nesterov)
    }

    /// SGD over parameter groups; `lr` and `weight_decay` are the defaults
    /// for groups that do not set their own.
    #[track_caller]
    pub fn with_groups(
        groups: Vec<ParamGroup>,
        lr: f64,
        momentum: f64,
        weight_decay: f64,
        nesterov: bool,
    ) -> Result<Sgd> {
        check_hyper("Sgd", "momentum", momentum, momentum >= 0.0)?;
        if nesterov && momentum == 0.0 {
            return Err(Error::invalid("Sgd", "Nesterov momentum needs momentum > 0"));
        }
        let slots = if momentum != 0.0 { 1 } else { 0 };
        let (state, groups) = resolve_groups("Sgd", groups, lr, weight_decay, slots)?;
        Ok(Sgd { state, groups, momentum, dampening: 0.0, nesterov })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        apply_all(&self.state, &|s| {
            let g = self.groups[s.group];
            ParamUpdate::Sgd {
                lr: g.lr,
                momentum: self.momentum,
                dampening: self.dampening,
                weight_decay: g.weight_decay,
                nesterov: self.nesterov,
            }
        })
    }
    fn zero_grad(&self) {
        self.state.iter().for_each(|s| s.param.zero_grad());
    }
    fn learning_rate(&self) -> f64 {
        self.groups.first().map_or(0.0, |g| g.lr)
    }
    fn set_learning_rate(&mut self, lr: f64) -> Result<()> {
        check_hyper("set_learning_rate", "lr", lr, lr >= 0.0)?;
        self.groups.iter_mut().for_each(|g| g.lr = lr);
        Ok(())
    }
    fn group_learning_rates(&self) -> Vec<f64> {
        self.groups.iter().map(|g| g.lr).collect()
    }
    fn set_group_learning_rates(&mut self, lrs: &[f64]) -> Result<()> {
        check_group_count(lrs.len(), self.groups.len())?;
        for &lr in lrs {
            check_hyper("set_group_learning_rates", "lr", lr, lr >= 0.0)?;
        }
        self.groups.iter_mut().zip(lrs).for_each(|(g, &lr)| g.lr = lr);
        Ok(())
    }
}

/// Adam (and AdamW with `decoupled_weight_decay`), PyTorch's formulas with
/// bias correction.
pub struct Adam {
    state: Vec<StateBuffers>,
    groups: Vec<GroupSettings>,
    step: u64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub decoupled_weight_decay: bool,
}

impl Adam {
    /// Adam with betas (0.9, 0.999), eps 1e-8, no weight decay.
    #[track_caller]
    pub fn new(params: Vec<Param>, lr: f64) -> Result<Adam> {
        Adam::with_options(params, lr, (0.9, 0.999), 1e-8, 0.0, false)
    }

    /// AdamW: weight decay applied to the weights directly, not to the gradient.
    #[track_caller]
    pub fn adamw(params: Vec<Param>, lr: f64, weight_decay: f64) -> Result<Adam> {
        Adam::with_options(params, lr, (0.9, 0.999), 1e-8, weight_decay, true)
    }

    /// AdamW over parameter groups (e.g. `ParamGroup::decay_split`), betas
    /// (0.9, 0.999), eps 1e-8; groups without a weight decay get none.
    #[track_caller]
    pub fn adamw_groups(groups: Vec<ParamGroup>, lr: f64) -> Result<Adam> {
        Adam::with_groups(groups, lr, (0.9, 0.999), 1e-8, 0.0, true)
    }

    #[track_caller]
    pub fn with_options(
        params: Vec<Param>,
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
        decoupled_weight_decay: bool,
    ) -> Result<Adam> {
        Adam::with_groups(vec![ParamGroup::new(params)], lr, betas, eps, weight_decay, decoupled_weight_decay)
    }

    /// Adam over parameter groups; `lr` and `weight_decay` are the defaults
    /// for groups that do not set their own.
    #[track_caller]
    pub fn with_groups(
        groups: Vec<ParamGroup>,
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
        decoupled_weight_decay: bool,
    ) -> Result<Adam> {
        check_hyper("Adam", "beta1", betas.0, (0.0..1.0).contains(&betas.0))?;
        check_hyper("Adam", "beta2", betas.1, (0.0..1.0).contains(&betas.1))?;
        check_hyper("Adam", "eps", eps, eps >= 0.0)?;
        let (state, groups) = resolve_groups("Adam", groups, lr, weight_decay, 2)?;
        Ok(Adam { state, groups, step: 0, beta1: betas.0, beta2: betas.1, eps, decoupled_weight_decay })
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Each group's weight decay, in group order.
    pub fn group_weight_decays(&self) -> Vec<f64> {
        self.groups.iter().map(|g| g.weight_decay).collect()
    }
}

impl Optimizer for Adam {
    fn step(&mut self) -> Result<()> {
        self.step += 1;
        apply_all(&self.state, &|s| {
            let g = self.groups[s.group];
            ParamUpdate::Adam {
                lr: g.lr,
                beta1: self.beta1,
                beta2: self.beta2,
                eps: self.eps,
                weight_decay: g.weight_decay,
                decoupled_weight_decay: self.decoupled_weight_decay,
                step: self.step,
            }
        })
    }
    fn zero_grad(&self) {
        self.state.iter().for_each(|s| s.param.zero_grad());
    }
    fn learning_rate(&self) -> f64 {
        self.groups.first().map_or(0.0, |g| g.lr)
    }
    fn set_learning_rate(&mut self, lr: f64) -> Result<()> {
        check_hyper("set_learning_rate", "lr", lr, lr >= 0.0)?;
        self.groups.iter_mut().for_each(|g| g.lr = lr);
        Ok(())
    }
    fn group_learning_rates(&self) -> Vec<f64> {
        self.groups.iter().map(|g| g.lr).collect()
    }
    fn set_group_learning_rates(&mut self, lrs: &[f64]) -> Result<()> {
        check_group_count(lrs.len(), self.groups.len())?;
        for &lr in lrs {
            check_hyper("set_group_learning_rates", "lr", lr, lr >= 0.0)?;
        }
        self.groups.iter_mut().zip(lrs).for_each(|(g, &lr)| g.lr = lr);
        Ok(())
    }
}

impl OptimizerState for Sgd {
    fn kind(&self) -> &'static str {
        "Sgd"
    }
    fn slot_names(&self) -> &'static [&'static str] {
        // Buffers exist when the optimizer was built with momentum.
        if self.state.iter().any(|s| !s.buffers.is_empty()) {
            &["momentum_buffer"]
        } else {
            &[]
        }
    }
    fn params(&self) -> Vec<Param> {
        self.state.iter().map(|s| s.param.clone()).collect()
    }
    fn step_count(&self) -> u64 {
        0
    }
    fn set_step_count(&mut self, _step: u64) {}
    fn hyper_parameters(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("lr", self.learning_rate()),
            ("momentum", self.momentum),
            ("dampening", self.dampening),
            ("weight_decay", self.groups.first().map_or(0.0, |g| g.weight_decay)),
            ("nesterov", if self.nesterov { 1.0 } else { 0.0 }),
        ]
    }
    async fn read_state(&self) -> Result<Vec<Vec<HostData>>> {
        read_all(&self.state).await
    }
    #[track_caller]
    fn write_state(&mut self, state: &[Vec<HostData>]) -> Result<()> {
        write_all("Sgd::write_state", &self.state, state)
    }
}

impl OptimizerState for Adam {
    fn kind(&self) -> &'static str {
        "Adam"
    }
    fn slot_names(&self) -> &'static [&'static str] {
        &["exp_avg", "exp_avg_sq"]
    }
    fn params(&self) -> Vec<Param> {
        self.state.iter().map(|s| s.param.clone()).collect()
    }
    fn step_count(&self) -> u64 {
        self.step
    }
    fn set_step_count(&mut self, step: u64) {
        self.step = step;
    }
    fn hyper_parameters(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("lr", self.learning_rate()),
            ("beta1", self.beta1),
            ("beta2", self.beta2),
            ("eps", self.eps),
            ("weight_decay", self.groups.first().map_or(0.0, |g| g.weight_decay)),
            ("decoupled_weight_decay", if self.decoupled_weight_decay { 1.0 } else { 0.0 }),
        ]
    }
    async fn read_state(&self) -> Result<Vec<Vec<HostData>>> {
        read_all(&self.state).await
    }
    #[track_caller]
    fn write_state(&mut self, state: &[Vec<HostData>]) -> Result<()> {
        write_all("Adam::write_state", &self.state, state)
    }
}
