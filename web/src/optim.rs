//! Parameter groups, learning-rate schedules and gradient clipping for
//! JavaScript: kiln-core's `optim::{ParamGroup, Schedule, LrScheduler,
//! clip_grad_norm, clip_grad_value}`.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Reflect};
use kiln_core::optim::{self, Optimizer, ParamGroup};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::error::{KilnError, Res};
use crate::nn::params_from_js;
use crate::promise::{promise_now, NumberPromise};

#[wasm_bindgen]
extern "C" {
    /// Any JS value that may be one of kiln's optimizers.
    type OptimizerHandle;
    #[wasm_bindgen(method, catch, js_name = "__kilnOptimizer")]
    fn kiln_optimizer(this: &OptimizerHandle) -> Result<(), JsValue>;

    /// What `decaySplit` gives: parameter groups for an optimizer.
    #[wasm_bindgen(typescript_type = "{ params: Param[]; weightDecay: number }[]")]
    pub type ParamGroupList;

    /// An optimizer for `LrScheduler`.
    #[wasm_bindgen(typescript_type = "Sgd | Adam")]
    pub type OptimizerArg;
}

/// One of the optimizers, shared with the JS object that owns it.
#[derive(Clone)]
pub(crate) enum SharedOptimizer {
    Sgd(Rc<RefCell<optim::Sgd>>),
    Adam(Rc<RefCell<optim::Adam>>),
}

impl SharedOptimizer {
    fn with<R>(&self, op: &'static str, f: impl FnOnce(&mut dyn Optimizer) -> R) -> Res<R> {
        let busy = || {
            KilnError::new(
                "InvalidArgument",
                op,
                format!("{op}: the optimizer's stateDict() is still being read; await it first"),
            )
        };
        Ok(match self {
            SharedOptimizer::Sgd(o) => f(&mut *o.try_borrow_mut().map_err(|_| busy())?),
            SharedOptimizer::Adam(o) => f(&mut *o.try_borrow_mut().map_err(|_| busy())?),
        })
    }
}

thread_local! {
    static OPTIMIZER_HANDOFF: RefCell<Option<SharedOptimizer>> = const { RefCell::new(None) };
}

/// Leave `optimizer` for the Rust code that asked a JS object for it.
pub(crate) fn hand_off_optimizer(optimizer: SharedOptimizer) {
    OPTIMIZER_HANDOFF.with(|h| *h.borrow_mut() = Some(optimizer));
}

fn optimizer_from_js(op: &'static str, value: &JsValue) -> Res<SharedOptimizer> {
    OPTIMIZER_HANDOFF.with(|h| h.borrow_mut().take());
    let called = value.unchecked_ref::<OptimizerHandle>().kiln_optimizer();
    match (called, OPTIMIZER_HANDOFF.with(|h| h.borrow_mut().take())) {
        (Ok(()), Some(o)) => Ok(o),
        _ => Err(KilnError::argument(op, "expected an optimizer (Sgd or Adam)")),
    }
}

/// Parameter groups from what an optimizer's constructor was given: an
/// array of `{ params, lr?, weightDecay? }` objects (PyTorch's
/// param_groups), or else parameters (an array of Params or a module) as
/// one group.
pub(crate) fn groups_from_js(op: &'static str, value: &JsValue) -> Res<Vec<ParamGroup>> {
    let is_group =
        |v: &JsValue| v.is_object() && !Array::is_array(v) && Reflect::has(v, &"params".into()).unwrap_or(false);
    if !(Array::is_array(value) && value.unchecked_ref::<Array>().iter().any(|v| is_group(&v))) {
        return Ok(vec![ParamGroup::new(params_from_js(op, value)?)]);
    }
    let number = |group: &JsValue, index: u32, key: &str| -> Res<Option<f64>> {
        let v = Reflect::get(group, &key.into()).unwrap_or(JsValue::UNDEFINED);
        if v.is_undefined() || v.is_null() {
            return Ok(None);
        }
        v.as_f64()
            .map(Some)
            .ok_or_else(|| KilnError::argument(op, format!("parameter group {index}: {key} must be a number")))
    };
    let mut groups = Vec::new();
    for (index, group) in value.unchecked_ref::<Array>().iter().enumerate() {
        let index = index as u32;
        if !is_group(&group) {
            return Err(KilnError::argument(
                op,
                format!("parameter group {index} is not a {{ params, lr?, weightDecay? }} object"),
            ));
        }
        let params = params_from_js(op, &Reflect::get(&group, &"params".into()).unwrap_or(JsValue::UNDEFINED))?;
        let mut g = ParamGroup::new(params);
        g.lr = number(&group, index, "lr")?;
        g.weight_decay = number(&group, index, "weightDecay")?;
        groups.push(g);
    }
    Ok(groups)
}

/// Two groups for the usual AdamW split: parameters of rank >= 2 (weight
/// matrices, kernels, embeddings) with `weightDecay`, the rest (biases,
/// norm scales) without. Pass the result to an optimizer's constructor.
#[wasm_bindgen(js_name = decaySplit)]
#[allow(non_snake_case)]
pub fn decay_split(params: &crate::nn::ParamsArg, weightDecay: f64) -> Res<ParamGroupList> {
    let params = params_from_js("decaySplit", params)?;
    let out = Array::new();
    for g in ParamGroup::decay_split(params, weightDecay) {
        let obj = js_sys::Object::new();
        let list = Array::new();
        for p in g.params {
            list.push(&JsValue::from(crate::nn::Param { inner: p }));
        }
        let set = |k: &str, v: &JsValue| Reflect::set(&obj, &k.into(), v).map(|_| ());
        set("params", &list)
            .and_then(|_| set("weightDecay", &JsValue::from_f64(g.weight_decay.unwrap_or(0.0))))
            .map_err(|_| KilnError::argument("decaySplit", "could not build the group objects"))?;
        out.push(&obj);
    }
    Ok(out.unchecked_into())
}

// ----- Schedules -----------------------------------------------------------

/// A learning-rate factor as a function of the step: kiln-core's
/// `Schedule`, built with the static methods and combined with
/// `followedBy` (Rust's `then`, renamed: a `then` method would make every
/// schedule a thenable) and `times`. Immutable; `factor(step)` evaluates it.
#[wasm_bindgen]
#[derive(Clone)]
pub struct Schedule {
    inner: optim::Schedule,
}

fn schedule(inner: optim::Schedule) -> Res<Schedule> {
    inner.validate()?;
    Ok(Schedule { inner })
}

/// A step count: a whole number from 0 to 2^53 (the integers a JS number
/// holds exactly), checked by the bindings' one integer check.
fn whole(op: &'static str, what: &str, v: f64) -> Res<u64> {
    crate::tensor_api::whole(op, what, v, 0.0, 2f64.powi(53)).map(|v| v as u64)
}

#[wasm_bindgen]
#[allow(non_snake_case)]
impl Schedule {
    /// Always 1.
    pub fn constant() -> Schedule {
        Schedule { inner: optim::Schedule::Constant }
    }

    /// From `startFactor` up to 1 linearly over `steps`, then 1.
    #[wasm_bindgen(js_name = linearWarmup)]
    pub fn linear_warmup(steps: f64, startFactor: f64) -> Res<Schedule> {
        let steps = whole("Schedule.linearWarmup", "steps", steps)?;
        schedule(optim::Schedule::LinearWarmup { steps, start_factor: startFactor })
    }

    /// From 1 down to `minFactor` along half a cosine over `steps`, then
    /// `minFactor`.
    pub fn cosine(steps: f64, minFactor: Option<f64>) -> Res<Schedule> {
        let steps = whole("Schedule.cosine", "steps", steps)?;
        schedule(optim::Schedule::Cosine { steps, min_factor: minFactor.unwrap_or(0.0) })
    }

    /// Multiplied by `gamma` every `stepSize` steps.
    pub fn step(stepSize: f64, gamma: f64) -> Res<Schedule> {
        let step_size = whole("Schedule.step", "stepSize", stepSize)?;
        schedule(optim::Schedule::Step { step_size, gamma })
    }

    /// Multiplied by `gamma` every step.
    pub fn exponential(gamma: f64) -> Res<Schedule> {
        schedule(optim::Schedule::Exponential { gamma })
    }

    /// PyTorch's OneCycleLR with the base rate as max_lr (defaults:
    /// pctStart 0.3, divFactor 25, finalDivFactor 1e4).
    #[wasm_bindgen(js_name = oneCycle)]
    pub fn one_cycle(
        total: f64,
        pctStart: Option<f64>,
        divFactor: Option<f64>,
        finalDivFactor: Option<f64>,
    ) -> Res<Schedule> {
        let total = whole("Schedule.oneCycle", "total", total)?;
        schedule(optim::Schedule::OneCycle {
            total,
            pct_start: pctStart.unwrap_or(0.3),
            div_factor: divFactor.unwrap_or(25.0),
            final_div_factor: finalDivFactor.unwrap_or(1e4),
        })
    }

    /// Linear warm-up over `warmup` steps, then a cosine decay to
    /// `minFactor` at step `total`.
    #[wasm_bindgen(js_name = warmupCosine)]
    pub fn warmup_cosine(warmup: f64, total: f64, minFactor: Option<f64>) -> Res<Schedule> {
        let warmup = whole("Schedule.warmupCosine", "warmup", warmup)?;
        let total = whole("Schedule.warmupCosine", "total", total)?;
        schedule(optim::Schedule::warmup_cosine(warmup, total, minFactor.unwrap_or(0.0)))
    }

    /// This schedule for `steps` steps, then `next` (counting from 0).
    #[wasm_bindgen(js_name = followedBy)]
    pub fn followed_by(&self, steps: f64, next: &Schedule) -> Res<Schedule> {
        let steps = whole("Schedule.followedBy", "steps", steps)?;
        Ok(Schedule { inner: self.inner.clone().then(steps, next.inner.clone()) })
    }

    /// The product of two schedules' factors.
    pub fn times(&self, other: &Schedule) -> Schedule {
        Schedule { inner: self.inner.clone().times(other.inner.clone()) }
    }

    /// The factor at `step`.
    pub fn factor(&self, step: f64) -> Res<f64> {
        Ok(self.inner.factor(whole("Schedule.factor", "step", step)?))
    }
}

/// Applies a `Schedule` to an optimizer: each group's learning rate is its
/// base rate (the one it had when the scheduler was made) times the
/// factor. Call `step()` after each `optimizer.step()`.
#[wasm_bindgen]
pub struct LrScheduler {
    inner: optim::LrScheduler,
    optimizer: SharedOptimizer,
}

#[wasm_bindgen]
impl LrScheduler {
    /// Records `optimizer`'s rates as the base rates and sets them to the
    /// factor at step 0.
    #[wasm_bindgen(constructor)]
    pub fn new(optimizer: &OptimizerArg, schedule: &Schedule) -> Res<LrScheduler> {
        let optimizer = optimizer_from_js("LrScheduler", optimizer)?;
        let inner = optimizer.with("LrScheduler", |o| optim::LrScheduler::new(o, schedule.inner.clone()))??;
        Ok(LrScheduler { inner, optimizer })
    }

    /// Advance one step and set the optimizer's learning rates.
    pub fn step(&mut self) -> Res<()> {
        let inner = &mut self.inner;
        self.optimizer.with("LrScheduler.step", |o| inner.step(o))
    }

    /// Steps taken so far.
    #[wasm_bindgen(getter)]
    pub fn steps(&self) -> f64 {
        self.inner.steps() as f64
    }

    /// The rates the schedule gives now, one per parameter group.
    #[wasm_bindgen(getter, js_name = currentLrs)]
    pub fn current_lrs(&self) -> Vec<f64> {
        self.inner.current_lrs()
    }

    /// The base rates, one per parameter group.
    #[wasm_bindgen(getter, js_name = baseLrs)]
    pub fn base_lrs(&self) -> Vec<f64> {
        self.inner.base_lrs().to_vec()
    }

    /// Resume: set the step count and base rates (from `steps` and
    /// `baseLrs` saved earlier) and the optimizer's rates to match.
    #[wasm_bindgen(js_name = loadState)]
    #[allow(non_snake_case)]
    pub fn load_state(&mut self, steps: f64, baseLrs: Vec<f64>) -> Res<()> {
        let steps = whole("LrScheduler.loadState", "steps", steps)?;
        let inner = &mut self.inner;
        self.optimizer.with("LrScheduler.loadState", |o| inner.load_state(o, steps, &baseLrs))??;
        Ok(())
    }
}

// ----- Gradient clipping -----------------------------------------------

/// Scale all gradients of `params` (Params or a module) together so that
/// their global `normType`-norm (default 2; `Infinity` for the largest
/// magnitude) is at most `maxNorm`, as PyTorch's `clip_grad_norm_`. The
/// clipping is done when this returns; the Promise gives the total norm
/// before clipping.
#[wasm_bindgen(js_name = clipGradNorm)]
#[allow(non_snake_case)]
pub fn clip_grad_norm(params: &crate::nn::ParamsArg, maxNorm: f64, normType: Option<f64>) -> Res<NumberPromise> {
    let params = params_from_js("clipGradNorm", params)?;
    let future = optim::clip_grad_norm(&params, maxNorm, normType.unwrap_or(2.0))?;
    let future = async move { Ok(future.await?) };
    Ok(promise_now(Box::pin(future), |v: f64| Ok(JsValue::from_f64(v))).unchecked_into())
}

/// Clamp every gradient element of `params` (Params or a module) to
/// [-clip, clip], as PyTorch's `clip_grad_value_`.
#[wasm_bindgen(js_name = clipGradValue)]
pub fn clip_grad_value(params: &crate::nn::ParamsArg, clip: f64) -> Res<()> {
    let params = params_from_js("clipGradValue", params)?;
    Ok(optim::clip_grad_value(&params, clip)?)
}
