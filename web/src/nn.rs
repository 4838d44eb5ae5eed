//! Parameters, modules, losses and optimizers for JavaScript.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::Array;
use kiln_core::nn::{self, Activation, Module};
use kiln_core::optim::{self, Optimizer};
use kiln_core::Tensor as CoreTensor;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::checkpoint::BytesPromise;
use crate::error::{KilnError, Res};
use crate::graph::{dtype_name, Tensor};
use crate::promise::{promise_now, ArrayPromise};
use crate::tensor_api::{host_from_js, host_to_js, HostArray, IntList};

#[wasm_bindgen]
extern "C" {
    /// Any JS value that may be one of kiln's objects.
    type Handle;
    #[wasm_bindgen(method, catch, js_name = "__kilnParam")]
    fn kiln_param(this: &Handle) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch, js_name = "__kilnModule")]
    fn kiln_module(this: &Handle) -> Result<(), JsValue>;

    /// What an optimizer updates: an array of parameters, or a module
    /// (all of its parameters).
    #[wasm_bindgen(typescript_type = "Param[] | Linear | Sequential | Layer")]
    pub type ParamsArg;

    /// A layer for `Sequential.add`: a module or an activation name.
    #[wasm_bindgen(typescript_type = "Linear | Sequential | Layer | 'relu' | 'tanh' | 'sigmoid' | 'gelu' | 'silu'")]
    pub type LayerArg;

    #[wasm_bindgen(typescript_type = "Param[]")]
    pub type ParamArray;

    /// What an optimizer's constructor takes: parameters, or parameter
    /// groups with their own learning rate / weight decay.
    #[wasm_bindgen(
        typescript_type = "Param[] | Linear | Sequential | Layer | { params: Param[] | Linear | Sequential | Layer; lr?: number; weightDecay?: number }[]"
    )]
    pub type ParamsOrGroups;

    #[wasm_bindgen(typescript_type = "Promise<Float32Array | Float64Array | undefined>")]
    pub type GradPromise;
}

thread_local! {
    static PARAM_HANDOFF: RefCell<Option<kiln_core::Param>> = const { RefCell::new(None) };
    static MODULE_HANDOFF: RefCell<Option<Rc<dyn Module>>> = const { RefCell::new(None) };
}

fn param_from_js(op: &'static str, value: &JsValue) -> Res<kiln_core::Param> {
    PARAM_HANDOFF.with(|h| h.borrow_mut().take());
    let called = value.unchecked_ref::<Handle>().kiln_param();
    match (called, PARAM_HANDOFF.with(|h| h.borrow_mut().take())) {
        (Ok(()), Some(p)) => Ok(p),
        _ => Err(KilnError::argument(op, "expected a Param")),
    }
}

fn module_from_js(op: &'static str, value: &JsValue) -> Res<Rc<dyn Module>> {
    if let Some(name) = value.as_string() {
        return Ok(Rc::new(parse_activation(op, &name)?));
    }
    MODULE_HANDOFF.with(|h| h.borrow_mut().take());
    let called = value.unchecked_ref::<Handle>().kiln_module();
    match (called, MODULE_HANDOFF.with(|h| h.borrow_mut().take())) {
        (Ok(()), Some(m)) => Ok(m),
        _ => Err(KilnError::argument(op, "expected a Linear, a Sequential, a Layer or an activation name")),
    }
}

/// Leave `module` for the Rust code that asked a JS object for its module.
pub(crate) fn hand_off_module(module: Rc<dyn Module>) {
    MODULE_HANDOFF.with(|h| *h.borrow_mut() = Some(module));
}

/// Parameters from an array of `Param`s or from a module.
pub(crate) fn params_from_js(op: &'static str, value: &JsValue) -> Res<Vec<kiln_core::Param>> {
    if Array::is_array(value) {
        return value.unchecked_ref::<Array>().iter().map(|v| param_from_js(op, &v)).collect();
    }
    module_from_js(op, value)
        .map(|m| m.parameters())
        .map_err(|_| KilnError::argument(op, "expected an array of Params or a module"))
}

pub(crate) fn parse_activation(op: &'static str, name: &str) -> Res<Activation> {
    Ok(match name {
        "relu" => Activation::Relu,
        "tanh" => Activation::Tanh,
        "sigmoid" => Activation::Sigmoid,
        "gelu" => Activation::Gelu,
        "silu" => Activation::Silu,
        other => {
            return Err(KilnError::argument(
                op,
                format!("unknown activation '{other}'; use 'relu', 'tanh', 'sigmoid', 'gelu' or 'silu'"),
            ))
        }
    })
}

fn shape_array(dims: &[usize]) -> IntList {
    let out = Array::new();
    for &d in dims {
        out.push(&JsValue::from_f64(d as f64));
    }
    out.unchecked_into()
}

fn forward_with(module: &dyn Module, x: &Tensor) -> Res<Tensor> {
    x.map(|t| module.forward(t))
}

fn wrap_params(params: Vec<kiln_core::Param>) -> Vec<Param> {
    params.into_iter().map(|inner| Param { inner }).collect()
}

// ----- Param ---------------------------------------------------------------

/// A trainable tensor that lives outside graphs, with its gradient.
/// Long-lived: release it with `free()` (or let the garbage collector).
#[wasm_bindgen]
pub struct Param {
    pub(crate) inner: kiln_core::Param,
}

impl Param {
    pub(crate) fn core(&self) -> &kiln_core::Param {
        &self.inner
    }
}

#[wasm_bindgen]
impl Param {
    /// Lets kiln's functions accept a Param inside arrays. Not for users.
    #[wasm_bindgen(js_name = "__kilnParam")]
    pub fn handoff(&self) {
        PARAM_HANDOFF.with(|h| *h.borrow_mut() = Some(self.inner.clone()));
    }

    #[wasm_bindgen(getter)]
    pub fn name(&self) -> String {
        self.inner.name()
    }

    #[wasm_bindgen(setter)]
    pub fn set_name(&self, name: String) {
        self.inner.set_name(&name);
    }

    #[wasm_bindgen(getter)]
    pub fn shape(&self) -> IntList {
        shape_array(&self.inner.dims())
    }

    #[wasm_bindgen(getter)]
    pub fn size(&self) -> u32 {
        self.inner.numel() as u32
    }

    #[wasm_bindgen(getter)]
    pub fn dtype(&self) -> String {
        dtype_name(self.inner.dtype()).to_string()
    }

    /// False freezes the parameter: graphs treat it as a constant.
    #[wasm_bindgen(getter, js_name = requiresGrad)]
    pub fn requires_grad(&self) -> bool {
        self.inner.requires_grad()
    }

    #[wasm_bindgen(setter, js_name = requiresGrad)]
    pub fn set_requires_grad(&self, value: bool) {
        self.inner.set_requires_grad(value);
    }

    /// Whether a gradient has accumulated since the last `zeroGrad()`.
    #[wasm_bindgen(getter, js_name = hasGrad)]
    pub fn has_grad(&self) -> bool {
        self.inner.has_grad()
    }

    #[wasm_bindgen(js_name = zeroGrad)]
    pub fn zero_grad(&self) {
        self.inner.zero_grad();
    }

    /// The current values.
    pub fn value(&self) -> ArrayPromise {
        let p = self.inner.clone();
        promise_now(Box::pin(async move { Ok(p.value().await?) }), |d| Ok(host_to_js(d))).unchecked_into()
    }

    /// The accumulated gradient, or undefined before any backward.
    pub fn grad(&self) -> GradPromise {
        let p = self.inner.clone();
        promise_now(Box::pin(async move { Ok(p.grad().await?) }), |d| {
            Ok(d.map(host_to_js).unwrap_or(JsValue::UNDEFINED))
        })
        .unchecked_into()
    }

    /// Overwrite the values (same length and dtype).
    #[wasm_bindgen(js_name = setValue)]
    pub fn set_value(&self, data: &HostArray) -> Res<()> {
        self.inner.set_value(&host_from_js("setValue", data)?)?;
        Ok(())
    }
}

// ----- Modules -------------------------------------------------------------

/// y = x · Wᵀ + b, W stored [out, in] (PyTorch's layout and initialisation).
#[wasm_bindgen]
pub struct Linear {
    pub(crate) inner: Rc<nn::Linear>,
}

struct SharedLinear(Rc<nn::Linear>);

impl Module for SharedLinear {
    fn forward<'g>(&self, x: CoreTensor<'g>) -> kiln_core::Result<CoreTensor<'g>> {
        self.0.forward(x)
    }
    fn parameters(&self) -> Vec<kiln_core::Param> {
        self.0.parameters()
    }
    fn named_parameters(&self) -> Vec<(String, kiln_core::Param)> {
        self.0.named_parameters()
    }
}

#[wasm_bindgen]
impl Linear {
    #[wasm_bindgen(js_name = "__kilnModule")]
    pub fn handoff(&self) {
        hand_off_module(Rc::new(SharedLinear(self.inner.clone())));
    }

    /// Apply the layer to `x` ([..., inFeatures]).
    pub fn forward(&self, x: &Tensor) -> Res<Tensor> {
        forward_with(self.inner.as_ref(), x)
    }

    pub fn parameters(&self) -> Vec<Param> {
        wrap_params(self.inner.parameters())
    }

    #[wasm_bindgen(getter)]
    pub fn weight(&self) -> Param {
        Param { inner: self.inner.weight.clone() }
    }

    #[wasm_bindgen(getter)]
    pub fn bias(&self) -> Option<Param> {
        self.inner.bias.clone().map(|inner| Param { inner })
    }

    /// The layer's parameters as safetensors bytes, keyed as native kiln
    /// ("weight", "bias").
    #[wasm_bindgen(js_name = stateDict)]
    pub fn state_dict(&self) -> BytesPromise {
        crate::checkpoint::module_state(Rc::new(SharedLinear(self.inner.clone())))
    }

    /// Load `stateDict()` bytes (from JS or native kiln).
    #[wasm_bindgen(js_name = loadStateDict)]
    pub fn load_state_dict(&self, bytes: &[u8]) -> Res<()> {
        crate::checkpoint::load_module(&SharedLinear(self.inner.clone()), bytes)
    }

    #[wasm_bindgen(getter, js_name = inFeatures)]
    pub fn in_features(&self) -> u32 {
        self.inner.in_features() as u32
    }

    #[wasm_bindgen(getter, js_name = outFeatures)]
    pub fn out_features(&self) -> u32 {
        self.inner.out_features() as u32
    }

    #[wasm_bindgen(getter, js_name = numParameters)]
    pub fn num_parameters(&self) -> u32 {
        self.inner.num_parameters() as u32
    }

    #[wasm_bindgen(js_name = zeroGrad)]
    pub fn zero_grad(&self) {
        self.inner.zero_grad();
    }
}

#[derive(Default)]
pub(crate) struct SeqInner {
    layers: RefCell<Vec<Rc<dyn Module>>>,
}

impl Module for SeqInner {
    fn forward<'g>(&self, x: CoreTensor<'g>) -> kiln_core::Result<CoreTensor<'g>> {
        let layers = self.layers.borrow().clone();
        layers.iter().try_fold(x, |x, layer| layer.forward(x))
    }
    fn parameters(&self) -> Vec<kiln_core::Param> {
        self.layers.borrow().iter().flat_map(|l| l.parameters()).collect()
    }
    /// "{index}.{key}", as kiln's (and PyTorch's) Sequential.
    fn named_parameters(&self) -> Vec<(String, kiln_core::Param)> {
        self.prefixed(|l| l.named_parameters())
    }
    fn buffers(&self) -> Vec<kiln_core::Param> {
        self.layers.borrow().iter().flat_map(|l| l.buffers()).collect()
    }
    fn named_buffers(&self) -> Vec<(String, kiln_core::Param)> {
        self.prefixed(|l| l.named_buffers())
    }
    fn set_training(&self, training: bool) {
        self.layers.borrow().iter().for_each(|l| l.set_training(training));
    }
}

impl SeqInner {
    fn prefixed(
        &self,
        entries: impl Fn(&dyn Module) -> Vec<(String, kiln_core::Param)>,
    ) -> Vec<(String, kiln_core::Param)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.borrow().iter().enumerate() {
            out.extend(entries(layer.as_ref()).into_iter().map(|(key, p)| (format!("{i}.{key}"), p)));
        }
        out
    }
}

/// Layers applied in order. Build one with `kiln.sequential()` and `add()`,
/// or `kiln.mlp(widths)`.
#[wasm_bindgen]
pub struct Sequential {
    pub(crate) inner: Rc<SeqInner>,
}

impl Sequential {
    /// The layers of a kiln-core Sequential, so that keys and parameter
    /// order are native kiln's.
    pub(crate) fn from_core(model: nn::Sequential) -> Sequential {
        let inner = SeqInner::default();
        inner.layers.borrow_mut().extend(model.into_layers().into_iter().map(Rc::<dyn Module>::from));
        Sequential { inner: Rc::new(inner) }
    }

    pub(crate) fn empty() -> Sequential {
        Sequential { inner: Rc::new(SeqInner::default()) }
    }

    /// Forward for native tests.
    pub fn forward_native(&self, x: &Tensor) -> Res<Tensor> {
        forward_with(self.inner.as_ref(), x)
    }

    pub fn core_parameters(&self) -> Vec<kiln_core::Param> {
        self.inner.parameters()
    }
}

#[wasm_bindgen]
impl Sequential {
    #[wasm_bindgen(js_name = "__kilnModule")]
    pub fn handoff(&self) {
        hand_off_module(self.inner.clone());
    }

    /// Append a layer: a `Linear`, another `Sequential`, or an activation
    /// name ('relu', 'tanh', 'sigmoid', 'gelu', 'silu'). The layer is shared,
    /// not copied.
    pub fn add(&self, layer: &LayerArg) -> Res<()> {
        let m = module_from_js("Sequential.add", layer)?;
        if Rc::as_ptr(&m) as *const () == Rc::as_ptr(&self.inner) as *const () {
            return Err(KilnError::argument("Sequential.add", "cannot add a Sequential to itself"));
        }
        self.inner.layers.borrow_mut().push(m);
        Ok(())
    }

    /// Apply every layer in order.
    pub fn forward(&self, x: &Tensor) -> Res<Tensor> {
        forward_with(self.inner.as_ref(), x)
    }

    pub fn parameters(&self) -> Vec<Param> {
        wrap_params(self.inner.parameters())
    }

    #[wasm_bindgen(getter)]
    pub fn length(&self) -> u32 {
        self.inner.layers.borrow().len() as u32
    }

    #[wasm_bindgen(getter, js_name = numParameters)]
    pub fn num_parameters(&self) -> u32 {
        self.inner.num_parameters() as u32
    }

    #[wasm_bindgen(js_name = zeroGrad)]
    pub fn zero_grad(&self) {
        self.inner.zero_grad();
    }

    /// Every layer's parameters and buffers as safetensors bytes, in native
    /// kiln's format and keys ("0.weight", "0.bias", "2.weight", ...):
    /// native kiln (`kiln_core::checkpoint::load_state`) and PyTorch read it.
    #[wasm_bindgen(js_name = stateDict)]
    pub fn state_dict(&self) -> BytesPromise {
        crate::checkpoint::module_state(self.inner.clone())
    }

    /// Load `stateDict()` bytes (from JS or native kiln). Every key must be
    /// present with its shape and dtype; otherwise nothing changes and the
    /// error lists every missing, unexpected and mismatched key.
    #[wasm_bindgen(js_name = loadStateDict)]
    pub fn load_state_dict(&self, bytes: &[u8]) -> Res<()> {
        crate::checkpoint::load_module(self.inner.as_ref(), bytes)
    }

    /// Training (true) or evaluation mode for every layer.
    #[wasm_bindgen(js_name = setTraining)]
    pub fn set_training(&self, training: bool) {
        self.inner.set_training(training);
    }
}

// ----- Losses --------------------------------------------------------------

/// Mean softmax cross-entropy of `logits` [N, C] against int32 `labels` [N].
#[wasm_bindgen(js_name = crossEntropy)]
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Res<Tensor> {
    logits.map2(labels, "cross_entropy", nn::cross_entropy)
}

/// Mean cross-entropy against target probabilities [N, C].
#[wasm_bindgen(js_name = crossEntropyProbs)]
pub fn cross_entropy_probs(logits: &Tensor, targets: &Tensor) -> Res<Tensor> {
    logits.map2(targets, "cross_entropy_probs", nn::cross_entropy_probs)
}

/// Mean negative log-likelihood of log-probabilities [N, C] at int32 labels.
#[wasm_bindgen(js_name = nllLoss)]
pub fn nll_loss(log_probs: &Tensor, labels: &Tensor) -> Res<Tensor> {
    log_probs.map2(labels, "nll_loss", nn::nll_loss)
}

/// Mean squared error.
#[wasm_bindgen(js_name = mseLoss)]
pub fn mse_loss(prediction: &Tensor, target: &Tensor) -> Res<Tensor> {
    prediction.map2(target, "mse_loss", nn::mse_loss)
}

// ----- Optimizers ----------------------------------------------------------

/// An optimizer shared with a pending `stateDict()` read (which holds it
/// until the device has copied the state out).
type SharedOpt<O> = Rc<RefCell<O>>;

fn busy(op: &'static str) -> KilnError {
    KilnError::new(
        "InvalidArgument",
        op,
        format!("{op}: this optimizer's stateDict() is still being read; await it first"),
    )
}

fn with_mut<O, R>(opt: &SharedOpt<O>, op: &'static str, f: impl FnOnce(&mut O) -> kiln_core::Result<R>) -> Res<R> {
    let mut o = opt.try_borrow_mut().map_err(|_| busy(op))?;
    Ok(f(&mut o)?)
}

macro_rules! optimizer_common {
    ($t:ident, $name:literal) => {
        #[wasm_bindgen]
        impl $t {
            /// Lets kiln's own functions (LrScheduler) take this optimizer
            /// as a plain JS value. Not for users.
            #[wasm_bindgen(js_name = "__kilnOptimizer")]
            pub fn handoff(&self) {
                crate::optim::hand_off_optimizer(crate::optim::SharedOptimizer::$t(self.inner.clone()));
            }

            /// The learning rate of each parameter group, in group order.
            #[wasm_bindgen(getter, js_name = groupLrs)]
            pub fn group_lrs(&self) -> Res<Vec<f64>> {
                Ok(self.inner.try_borrow().map_err(|_| busy(concat!($name, ".groupLrs")))?.group_learning_rates())
            }

            /// Set each group's learning rate (one per group, each finite and
            /// >= 0; otherwise an error and no change).
            #[wasm_bindgen(js_name = setGroupLrs)]
            pub fn set_group_lrs(&self, lrs: &[f64]) -> Res<()> {
                with_mut(&self.inner, concat!($name, ".setGroupLrs"), |o| o.set_group_learning_rates(lrs))
            }

            /// Update every parameter that has a gradient.
            pub fn step(&self) -> Res<()> {
                with_mut(&self.inner, concat!($name, ".step"), |o| o.step())
            }

            /// Drop the gradients of every parameter this optimizer updates.
            #[wasm_bindgen(js_name = zeroGrad)]
            pub fn zero_grad(&self) {
                if let Ok(o) = self.inner.try_borrow() {
                    o.zero_grad();
                }
            }

            #[wasm_bindgen(getter)]
            pub fn lr(&self) -> Res<f64> {
                Ok(self.inner.try_borrow().map_err(|_| busy(concat!($name, ".lr")))?.learning_rate())
            }

            /// Throws (and keeps the old value) unless lr is finite and >= 0.
            #[wasm_bindgen(setter)]
            pub fn set_lr(&self, lr: f64) -> Res<()> {
                with_mut(&self.inner, concat!($name, ".lr"), |o| o.set_learning_rate(lr))
            }

            /// The optimizer's state (step count, learning rate, per-parameter
            /// buffers) as safetensors bytes, in native kiln's format and keys
            /// ("optimizer.{i}.{slot}"; `kiln_core::checkpoint`).
            #[wasm_bindgen(js_name = stateDict)]
            pub fn state_dict(&self) -> BytesPromise {
                let opt = self.inner.clone();
                crate::checkpoint::bytes_promise(Box::pin(async move {
                    let o = opt.try_borrow().map_err(|_| busy(concat!($name, ".stateDict")))?;
                    Ok(kiln_core::checkpoint::save_optimizer_state(&*o).await?)
                }))
            }

            /// Restore `stateDict()` bytes (from JS or native kiln) into this
            /// optimizer, built over parameters of the same shapes; on any
            /// mismatch nothing changes and the error lists every problem.
            #[wasm_bindgen(js_name = loadStateDict)]
            pub fn load_state_dict(&self, bytes: &[u8]) -> Res<()> {
                with_mut(&self.inner, concat!($name, ".loadStateDict"), |o| {
                    kiln_core::checkpoint::load_optimizer_state(o, bytes)
                })
            }
        }
    };
}

/// Stochastic gradient descent (PyTorch's formulas): optional momentum,
/// Nesterov momentum and L2 weight decay.
#[wasm_bindgen]
pub struct Sgd {
    inner: SharedOpt<optim::Sgd>,
}

optimizer_common!(Sgd, "Sgd");

#[wasm_bindgen]
impl Sgd {
    /// `params`: an array of Params, a module, or parameter groups
    /// (`[{ params, lr?, weightDecay? }, ...]`, e.g. from `decaySplit`),
    /// whose unset values default to `lr` and `weightDecay`.
    #[wasm_bindgen(constructor)]
    #[allow(non_snake_case)]
    pub fn new(
        params: &ParamsOrGroups,
        lr: f64,
        momentum: Option<f64>,
        weightDecay: Option<f64>,
        nesterov: Option<bool>,
    ) -> Res<Sgd> {
        let groups = crate::optim::groups_from_js("Sgd", params)?;
        let inner = optim::Sgd::with_groups(
            groups,
            lr,
            momentum.unwrap_or(0.0),
            weightDecay.unwrap_or(0.0),
            nesterov.unwrap_or(false),
        )?;
        Ok(Sgd { inner: Rc::new(RefCell::new(inner)) })
    }
}

impl Sgd {
    pub fn create(
        params: Vec<kiln_core::Param>,
        lr: f64,
        momentum: Option<f64>,
        weight_decay: Option<f64>,
        nesterov: Option<bool>,
    ) -> Res<Sgd> {
        let inner = optim::Sgd::with_options(
            params,
            lr,
            momentum.unwrap_or(0.0),
            weight_decay.unwrap_or(0.0),
            nesterov.unwrap_or(false),
        )?;
        Ok(Sgd { inner: Rc::new(RefCell::new(inner)) })
    }
}

/// Adam (PyTorch's formulas, bias-corrected); AdamW with `decoupled`.
#[wasm_bindgen]
pub struct Adam {
    inner: SharedOpt<optim::Adam>,
}

optimizer_common!(Adam, "Adam");

#[wasm_bindgen]
impl Adam {
    /// `params`: an array of Params, a module, or parameter groups
    /// (`[{ params, lr?, weightDecay? }, ...]`, e.g. from `decaySplit`).
    /// Defaults: betas (0.9, 0.999), eps 1e-8, no weight decay;
    /// `decoupled` = true makes it AdamW.
    #[wasm_bindgen(constructor)]
    #[allow(non_snake_case)]
    pub fn new(
        params: &ParamsOrGroups,
        lr: f64,
        beta1: Option<f64>,
        beta2: Option<f64>,
        eps: Option<f64>,
        weightDecay: Option<f64>,
        decoupled: Option<bool>,
    ) -> Res<Adam> {
        let groups = crate::optim::groups_from_js("Adam", params)?;
        let inner = optim::Adam::with_groups(
            groups,
            lr,
            (beta1.unwrap_or(0.9), beta2.unwrap_or(0.999)),
            eps.unwrap_or(1e-8),
            weightDecay.unwrap_or(0.0),
            decoupled.unwrap_or(false),
        )?;
        Ok(Adam { inner: Rc::new(RefCell::new(inner)) })
    }

    /// Steps taken so far.
    #[wasm_bindgen(getter)]
    pub fn steps(&self) -> Res<f64> {
        Ok(self.inner.try_borrow().map_err(|_| busy("Adam.steps"))?.steps() as f64)
    }
}

impl Adam {
    pub fn create(
        params: Vec<kiln_core::Param>,
        lr: f64,
        beta1: Option<f64>,
        beta2: Option<f64>,
        eps: Option<f64>,
        weight_decay: Option<f64>,
        decoupled: Option<bool>,
    ) -> Res<Adam> {
        let inner = optim::Adam::with_options(
            params,
            lr,
            (beta1.unwrap_or(0.9), beta2.unwrap_or(0.999)),
            eps.unwrap_or(1e-8),
            weight_decay.unwrap_or(0.0),
            decoupled.unwrap_or(false),
        )?;
        Ok(Adam { inner: Rc::new(RefCell::new(inner)) })
    }
}
