//! The JavaScript methods of `Graph` and `Tensor`.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Float32Array, Float64Array, Int32Array, Uint8Array};
use kiln_core::{BackwardOptions, HostData, Tensor as CoreTensor};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::error::{KilnError, Res};
use crate::graph::{dtype_name, parse_dtype, Graph, Slot, Tensor};
use crate::nn::Param;
use crate::promise::{ArrayPromise, NumberPromise};

#[wasm_bindgen]
extern "C" {
    /// A tensor or a plain number (made into a constant of the tensor's dtype).
    #[wasm_bindgen(typescript_type = "Tensor | number")]
    pub type Operand;
    #[wasm_bindgen(method, catch, js_name = "__kilnTensor")]
    fn kiln_tensor(this: &Operand) -> Result<(), JsValue>;

    /// A list of tensors of one graph.
    #[wasm_bindgen(typescript_type = "Tensor[]")]
    pub type TensorArray;

    /// Host data: a typed array (Float32Array, Int32Array, Float64Array,
    /// Uint8Array for bool) or a plain array of numbers (read as float32).
    #[wasm_bindgen(typescript_type = "Float32Array | Int32Array | Float64Array | Uint8Array | number[]")]
    pub type HostArray;

    /// A shape or a list of axes/indices.
    #[wasm_bindgen(typescript_type = "number[]")]
    pub type IntList;
    /// One axis or a list of axes.
    #[wasm_bindgen(typescript_type = "number | number[]")]
    pub type AxesArg;
    /// A tensor argument.
    #[wasm_bindgen(typescript_type = "Tensor")]
    pub type TensorArg;

    /// A function run with gradient recording off.
    #[wasm_bindgen(typescript_type = "() => any")]
    pub type NoGradFn;
}

thread_local! {
    /// Where `Tensor.__kilnTensor()` leaves a copy of its handle for the Rust
    /// code that asked (wasm-bindgen cannot borrow an exported object out of
    /// a `JsValue` without taking it from JavaScript).
    static HANDOFF: RefCell<Option<Tensor>> = const { RefCell::new(None) };
}

/// A tensor from a JS value that should be one.
pub(crate) fn tensor_from_js(op: &'static str, value: &JsValue) -> Res<Tensor> {
    HANDOFF.with(|h| h.borrow_mut().take());
    let called = value.unchecked_ref::<Operand>().kiln_tensor();
    let got = HANDOFF.with(|h| h.borrow_mut().take());
    match (called, got) {
        (Ok(()), Some(t)) => Ok(t),
        _ => Err(KilnError::argument(op, format!("expected a Tensor, got {}", describe(value)))),
    }
}

pub(crate) fn tensors_from_js(op: &'static str, value: &JsValue) -> Res<Vec<Tensor>> {
    let Some(array) = value.dyn_ref::<Array>() else {
        return Err(KilnError::argument(op, format!("expected an array of Tensors, got {}", describe(value))));
    };
    array.iter().map(|v| tensor_from_js(op, &v)).collect()
}

fn describe(value: &JsValue) -> String {
    if value.is_undefined() {
        "undefined".into()
    } else if value.is_null() {
        "null".into()
    } else if let Some(s) = value.as_string() {
        format!("the string {s:?}")
    } else {
        value.js_typeof().as_string().unwrap_or_default()
    }
}

/// A second operand: a tensor of the same step, or a number.
pub(crate) enum Other {
    Tensor(Tensor),
    Number(f64),
}

fn operand(op: &'static str, value: &Operand) -> Res<Other> {
    if let Some(x) = value.as_f64() {
        return Ok(Other::Number(x));
    }
    Ok(Other::Tensor(tensor_from_js(op, value)?))
}

pub(crate) fn host_from_js(op: &'static str, value: &JsValue) -> Res<HostData> {
    if let Some(a) = value.dyn_ref::<Float32Array>() {
        Ok(HostData::F32(a.to_vec()))
    } else if let Some(a) = value.dyn_ref::<Int32Array>() {
        Ok(HostData::I32(a.to_vec()))
    } else if let Some(a) = value.dyn_ref::<Float64Array>() {
        Ok(HostData::F64(a.to_vec()))
    } else if let Some(a) = value.dyn_ref::<Uint8Array>() {
        Ok(HostData::Bool(a.to_vec().into_iter().map(|b| b != 0).collect()))
    } else if let Some(a) = value.dyn_ref::<Array>() {
        let mut out = Vec::with_capacity(a.length() as usize);
        for v in a.iter() {
            match v.as_f64() {
                Some(x) => out.push(x as f32),
                None => return Err(KilnError::argument(op, format!("array element {} is not a number", describe(&v)))),
            }
        }
        Ok(HostData::F32(out))
    } else {
        Err(KilnError::argument(
            op,
            format!(
                "expected a Float32Array, Int32Array, Float64Array, Uint8Array or number[], got {}",
                describe(value)
            ),
        ))
    }
}

pub(crate) fn host_to_js(data: HostData) -> JsValue {
    match data {
        HostData::F32(v) => Float32Array::from(&v[..]).into(),
        HostData::I32(v) => Int32Array::from(&v[..]).into(),
        HostData::F64(v) => Float64Array::from(&v[..]).into(),
        HostData::Bool(v) => Uint8Array::from(&v.iter().map(|&b| b as u8).collect::<Vec<u8>>()[..]).into(),
    }
}

pub(crate) fn dims(shape: &[u32]) -> Vec<usize> {
    shape.iter().map(|&d| d as usize).collect()
}

/// Integers from a number, an array of numbers or a typed array.
pub(crate) fn ints(op: &'static str, value: &JsValue) -> Res<Vec<isize>> {
    let bad = || KilnError::argument(op, format!("expected an integer or a list of integers, got {}", describe(value)));
    let one = |v: &JsValue| -> Res<isize> {
        match v.as_f64() {
            Some(x) => whole(op, "", x, isize::MIN as f64, isize::MAX as f64).map(|x| x as isize),
            None => Err(bad()),
        }
    };
    if value.as_f64().is_some() {
        return Ok(vec![one(value)?]);
    }
    if value.is_object() && (Array::is_array(value) || js_sys::ArrayBuffer::is_view(value)) {
        return Array::from(value).iter().map(|v| one(&v)).collect();
    }
    Err(bad())
}

/// Non-negative integers (shapes, permutations).
pub(crate) fn uints(op: &'static str, value: &JsValue) -> Res<Vec<u32>> {
    ints(op, value)?
        .into_iter()
        .map(|x| {
            u32::try_from(x).map_err(|_| KilnError::argument(op, format!("{x} is not a valid size (must be >= 0)")))
        })
        .collect()
}

/// A JS number that must be a whole number in min..=max. The bindings take
/// integers as f64 and check them here because wasm-bindgen's own u32 and
/// i32 conversions wrap silently (-1 became 4294967295, 2 ** 32 + 1 became
/// 1, 2.5 became 2 and undefined 0).
pub(crate) fn whole(op: &'static str, what: &str, x: f64, min: f64, max: f64) -> Res<i64> {
    let name = if what.is_empty() { String::new() } else { format!("{what} = ") };
    if x.is_nan() || x.fract() != 0.0 {
        return Err(KilnError::argument(op, format!("{name}{x} is not a whole number")));
    }
    if x < min || x > max {
        return Err(KilnError::argument(op, format!("{name}{x} is out of range ({min} to {max})")));
    }
    Ok(x as i64)
}

/// A count or size argument: a whole number from 0 to 2^31 - 1 (sizes
/// beyond are over kiln's tensor limits anyway).
pub(crate) fn count(op: &'static str, what: &str, x: f64) -> Res<usize> {
    whole(op, what, x, 0.0, i32::MAX as f64).map(|x| x as usize)
}

/// An axis or signed offset argument: a whole number in i32's range.
pub(crate) fn signed(op: &'static str, what: &str, x: f64) -> Res<isize> {
    whole(op, what, x, i32::MIN as f64, i32::MAX as f64).map(|x| x as isize)
}

/// A seed: a whole number (|seed| <= 2^53, the integers a JS number holds
/// exactly); a negative seed is taken modulo 2^64, as PyTorch's
/// manual_seed does, so -1 and 0 are different streams.
pub(crate) fn seed_arg(op: &'static str, x: f64) -> Res<u64> {
    let limit = 2f64.powi(53);
    whole(op, "seed", x, -limit, limit).map(|s| s as u64)
}

/// An optional axis or offset argument.
pub(crate) fn signed_or(op: &'static str, what: &str, x: Option<f64>, default: isize) -> Res<isize> {
    x.map_or(Ok(default), |x| signed(op, what, x))
}

/// Turn a read into a Promise (settled already when the device answered
/// synchronously, as the CPU backend does).
fn promise_of(read: Res<crate::graph::ReadFuture>, map: fn(HostData) -> Res<JsValue>) -> js_sys::Promise {
    match read {
        Ok(r) => crate::promise::promise_now(Box::pin(r), map),
        Err(e) => js_sys::Promise::reject(&e.into()),
    }
}

fn item_of(data: HostData) -> Res<JsValue> {
    if data.len() != 1 {
        return Err(KilnError::new(
            "Shape",
            "item",
            format!("item: item() needs a one-element tensor, this one has {} elements", data.len()),
        ));
    }
    Ok(JsValue::from_f64(data.to_f64_vec()[0]))
}

// ----- Graph ---------------------------------------------------------------

impl Graph {
    /// A constant from host data (native tests and the JS API share this).
    pub fn from_host(&self, data: HostData, shape: &[u32]) -> Res<Tensor> {
        let d = dims(shape);
        let slot = self.slot()?;
        let t = slot.graph.from_host(data, &d)?;
        Ok(self.shared.register(&slot, t))
    }

    /// A leaf that requires grad and keeps its gradient.
    pub fn variable_from(&self, data: HostData, shape: &[u32]) -> Res<Tensor> {
        let d = dims(shape);
        let slot = self.slot()?;
        let t = slot.graph.variable_from_host(data, &d)?;
        Ok(self.shared.register(&slot, t))
    }
}

#[wasm_bindgen]
impl Graph {
    /// A constant tensor holding `data` with shape `shape` (row-major). The
    /// dtype follows the array: Float32Array → float32, Int32Array → int32
    /// (labels, indices), Float64Array → float64, Uint8Array → bool,
    /// number[] → float32.
    pub fn tensor(&self, data: &HostArray, shape: &IntList) -> Res<Tensor> {
        self.from_host(host_from_js("tensor", data)?, &uints("tensor", shape)?)
    }

    /// A leaf that requires grad; after `backward()` its gradient is
    /// `tensor.grad`. Float data only.
    pub fn variable(&self, data: &HostArray, shape: &IntList) -> Res<Tensor> {
        self.variable_from(host_from_js("variable", data)?, &uints("variable", shape)?)
    }

    /// Use a parameter in this step: a leaf reading the parameter's buffer
    /// in place. Its gradient accumulates in the `Param`.
    pub fn param(&self, param: &Param) -> Res<Tensor> {
        let p = param.core().clone();
        self.make(move |g| g.param(&p))
    }

    /// A tensor filled with `value`; dtype 'float32' (default), 'int32',
    /// 'float64' or 'bool'.
    pub fn full(&self, shape: &IntList, value: f64, dtype: Option<String>) -> Res<Tensor> {
        let dtype = parse_dtype("full", dtype)?;
        let d = dims(&uints("full", shape)?);
        self.make(|g| g.full(&d, value, dtype))
    }

    pub fn zeros(&self, shape: &IntList, dtype: Option<String>) -> Res<Tensor> {
        self.full(shape, 0.0, dtype)
    }

    pub fn ones(&self, shape: &IntList, dtype: Option<String>) -> Res<Tensor> {
        self.full(shape, 1.0, dtype)
    }

    /// A rank-0 tensor.
    pub fn scalar(&self, value: f64, dtype: Option<String>) -> Res<Tensor> {
        let dtype = parse_dtype("scalar", dtype)?;
        self.make(|g| g.scalar(value, dtype))
    }

    /// `length` values start, start + step, ...
    pub fn arange(&self, start: f64, step: f64, length: f64, dtype: Option<String>) -> Res<Tensor> {
        let dtype = parse_dtype("arange", dtype)?;
        let length = count("arange", "length", length)?;
        self.make(|g| g.arange(start, step, length, dtype))
    }

    /// Start the next step: frees every intermediate buffer of this one and
    /// makes its tensors stale. Parameters and their gradients are kept.
    pub fn reset(&self) {
        self.reset_graph();
    }

    /// The current step number (starts at 1; every `reset()` adds one).
    #[wasm_bindgen(getter)]
    pub fn step(&self) -> f64 {
        self.generation_now() as f64
    }

    /// This graph's number (error messages name it).
    #[wasm_bindgen(getter)]
    pub fn id(&self) -> u32 {
        self.id_number()
    }

    /// Number of nodes recorded in this step.
    #[wasm_bindgen(getter, js_name = nodeCount)]
    pub fn node_count(&self) -> Res<u32> {
        Ok(self.slot()?.graph.len() as u32)
    }

    /// How many nodes of this step were made by the op named `name` (see
    /// `opKinds()`), including those recorded by `backward()`.
    #[wasm_bindgen(js_name = countOps)]
    pub fn count_ops(&self, name: &str) -> Res<u32> {
        Ok(self.slot()?.graph.count_ops(name) as u32)
    }

    /// Whether new nodes record gradient structure.
    #[wasm_bindgen(getter, js_name = gradEnabled)]
    pub fn grad_enabled(&self) -> Res<bool> {
        Ok(self.slot()?.graph.is_grad_enabled())
    }

    /// Run `fn` with gradient recording off (optimizer-free evaluation,
    /// metrics) and return what it returns.
    #[wasm_bindgen(js_name = noGrad)]
    pub fn no_grad(&self, f: &NoGradFn) -> Result<JsValue, JsValue> {
        let slot = self.slot()?;
        let _guard = slot.graph.no_grad();
        let result = f.unchecked_ref::<js_sys::Function>().call0(&JsValue::UNDEFINED);
        drop(_guard);
        drop(slot);
        result
    }

    /// Compute these tensors now (values stay on the device).
    pub fn realize(&self, tensors: &TensorArray) -> Res<()> {
        let ts = tensors_from_js("realize", tensors)?;
        let slot = self.slot()?;
        let core = self.core_tensors("realize", &slot, &ts)?;
        slot.graph.realize(&core)?;
        Ok(())
    }

    /// Gradients of `root` with respect to `wrt`, as differentiable tensors
    /// of this graph (for higher-order derivatives). `seed` defaults to 1.
    pub fn grad(&self, root: &Tensor, wrt: &TensorArray, seed: Option<TensorArg>) -> Res<Array> {
        let ts = tensors_from_js("grad", wrt)?;
        let slot = self.slot()?;
        let r = self.core_tensors("grad", &slot, std::slice::from_ref(root))?[0];
        let core = self.core_tensors("grad", &slot, &ts)?;
        let s = match &seed {
            Some(s) => Some(self.core_tensors("grad", &slot, &[tensor_from_js("grad", s)?])?[0]),
            None => None,
        };
        let grads = slot.graph.grad(r, &core, s)?;
        let out = Array::new();
        for g in grads {
            out.push(&JsValue::from(self.shared.register(&slot, g)));
        }
        Ok(out)
    }

    /// Concatenate tensors of this graph along `axis`.
    pub fn concat(&self, tensors: &TensorArray, axis: f64) -> Res<Tensor> {
        let axis = signed("concat", "axis", axis)?;
        let ts = tensors_from_js("concat", tensors)?;
        Tensor::map_many(&ts, "concat", |core| CoreTensor::concat(core, axis))
    }
}

impl Graph {
    /// The core handles of tensors that must belong to this graph's live step.
    fn core_tensors<'s>(&self, op: &'static str, slot: &'s Slot, ts: &[Tensor]) -> Res<Vec<CoreTensor<'s>>> {
        ts.iter()
            .map(|t| {
                if !Rc::ptr_eq(&t.graph, &self.shared) {
                    return Err(KilnError::argument(op, "a tensor belongs to a different graph"));
                }
                t.slot()?;
                slot.get(t.id)
            })
            .collect()
    }
}

impl Tensor {
    /// Binary op with a tensor or number operand (native tests use this).
    pub(crate) fn binary_with(
        &self,
        op: &'static str,
        other: Other,
        f: for<'g> fn(CoreTensor<'g>, CoreTensor<'g>) -> kiln_core::Result<CoreTensor<'g>>,
    ) -> Res<Tensor> {
        match other {
            Other::Tensor(t) => self.map2(&t, op, f),
            Other::Number(x) => self.map(|a| {
                let b = a.graph().scalar(x, a.dtype())?;
                f(a, b)
            }),
        }
    }

    pub fn add_number(&self, x: f64) -> Res<Tensor> {
        self.binary_with("add", Other::Number(x), |a, b| a.add(b))
    }
    pub fn mul_number(&self, x: f64) -> Res<Tensor> {
        self.binary_with("mul", Other::Number(x), |a, b| a.mul(b))
    }
    pub fn add_tensor(&self, t: &Tensor) -> Res<Tensor> {
        self.binary_with("add", Other::Tensor(t.clone()), |a, b| a.add(b))
    }
    pub fn mul_tensor(&self, t: &Tensor) -> Res<Tensor> {
        self.binary_with("mul", Other::Tensor(t.clone()), |a, b| a.mul(b))
    }

    /// argmax over one axis (native tests).
    pub fn argmax_axis(&self, axis: isize) -> Res<Tensor> {
        self.map(|t| t.argmax(&[axis], false))
    }

    /// Read as f64 values, blocking (native tests only; the CPU backend
    /// answers at once).
    pub fn read_now(&self) -> Res<HostData> {
        pollster_lite(self.read()?)
    }
}

/// Drive a future that is expected to be ready (the CPU backend's reads).
fn pollster_lite<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

macro_rules! unary {
    ($($(#[$doc:meta])* $js:literal $name:ident => $core:ident),* $(,)?) => {
        #[wasm_bindgen]
        impl Tensor {
            $(
                $(#[$doc])*
                #[wasm_bindgen(js_name = $js)]
                pub fn $name(&self) -> Res<Tensor> {
                    self.map(|t| t.$core())
                }
            )*
        }
    };
}

unary! {
    "neg" neg => neg,
    "abs" abs => abs,
    "exp" exp => exp,
    /// Natural logarithm.
    "log" log => log,
    "sqrt" sqrt => sqrt,
    /// 1 / x.
    "recip" recip => recip,
    "sin" sin => sin,
    "cos" cos => cos,
    "tanh" tanh => tanh,
    "sigmoid" sigmoid => sigmoid,
    "relu" relu => relu,
    "gelu" gelu => gelu,
    /// GELU's derivative Φ(x) + x·φ(x).
    "geluDerivative" gelu_derivative => gelu_derivative,
    "silu" silu => silu,
    "square" square => square,
    "erf" erf => erf,
    /// 1 - erf(x), accurate where erf(x) is close to 1.
    "erfc" erfc => erfc,
    /// ln(1 + x), accurate for small x.
    "log1p" log1p => log1p,
    /// exp(x) - 1, accurate for small x.
    "expm1" expm1 => expm1,
    /// x / (1 + |x|).
    "softsign" softsign => softsign,
    /// -1, 0 or 1 (not differentiable).
    "sign" sign => sign,
    /// A copy that does not require grad (cuts the gradient).
    "detach" detach => detach,
}

macro_rules! binary {
    ($($(#[$doc:meta])* $js:literal $name:ident => $core:ident),* $(,)?) => {
        #[wasm_bindgen]
        impl Tensor {
            $(
                $(#[$doc])*
                #[wasm_bindgen(js_name = $js)]
                pub fn $name(&self, other: &Operand) -> Res<Tensor> {
                    let other = operand($js, other)?;
                    self.binary_with($js, other, |a, b| a.$core(b))
                }
            )*
        }
    };
}

binary! {
    /// Element-wise sum with broadcasting; `other` is a tensor or a number.
    "add" add => add,
    "sub" sub => sub,
    "mul" mul => mul,
    "div" div => div,
    /// this ^ other, element-wise.
    "pow" pow => pow,
    "maximum" maximum => maximum,
    "minimum" minimum => minimum,
    /// Element-wise comparisons give bool tensors.
    "eq" eq => eq,
    "ne" ne => ne,
    "lt" lt => lt,
    "le" le => le,
    "gt" gt => gt,
    "ge" ge => ge,
}

macro_rules! reductions {
    ($($(#[$doc:meta])* $js:literal $name:ident => $core:ident, $all:ident),* $(,)?) => {
        #[wasm_bindgen]
        impl Tensor {
            $(
                $(#[$doc])*
                #[wasm_bindgen(js_name = $js)]
                pub fn $name(&self, axes: Option<AxesArg>, keepdim: Option<bool>) -> Res<Tensor> {
                    match axes {
                        None => self.map(|t| t.$all()),
                        Some(a) => {
                            let a = ints($js, &a)?;
                            self.map(|t| t.$core(&a, keepdim.unwrap_or(false)))
                        }
                    }
                }
            )*
        }
    };
}

reductions! {
    /// Sum over `axes` (all axes when omitted, giving a rank-0 tensor).
    "sum" sum => sum, sum_all,
    "mean" mean => mean, mean_all,
    "max" max => max, max_all,
    "min" min => min, min_all,
    "prod" prod => prod, prod_all,
    /// Index of the largest element over `axes` (int32).
    "argmax" argmax => argmax, argmax_all,
    "argmin" argmin => argmin, argmin_all,
}

#[wasm_bindgen]
impl Tensor {
    /// `__kilnTensor` lets kiln's own functions accept a Tensor passed as a
    /// plain JS value (union arguments, arrays). Not for users.
    #[wasm_bindgen(js_name = "__kilnTensor")]
    pub fn kiln_tensor_handoff(&self) {
        HANDOFF.with(|h| *h.borrow_mut() = Some(self.clone()));
    }

    /// The shape, e.g. [batch, features].
    #[wasm_bindgen(getter)]
    pub fn shape(&self) -> Res<IntList> {
        let out = Array::new();
        for d in self.with(|t| Ok(t.dims()))?.iter() {
            out.push(&JsValue::from_f64(*d as f64));
        }
        Ok(out.unchecked_into())
    }

    /// 'float32', 'int32', 'float64' or 'bool'.
    #[wasm_bindgen(getter)]
    pub fn dtype(&self) -> Res<String> {
        Ok(dtype_name(self.core_dtype()?).to_string())
    }

    #[wasm_bindgen(getter)]
    pub fn rank(&self) -> Res<u32> {
        self.with(|t| Ok(t.rank() as u32))
    }

    /// Number of elements.
    #[wasm_bindgen(getter)]
    pub fn size(&self) -> Res<u32> {
        self.with(|t| Ok(t.numel() as u32))
    }

    #[wasm_bindgen(getter, js_name = requiresGrad)]
    pub fn requires_grad(&self) -> Res<bool> {
        self.with(|t| Ok(t.requires_grad()))
    }

    /// The step of its graph this tensor belongs to.
    #[wasm_bindgen(getter)]
    pub fn step(&self) -> f64 {
        self.generation as f64
    }

    /// The id of the graph this tensor belongs to (its `Graph.id`).
    #[wasm_bindgen(getter, js_name = graphId)]
    pub fn graph_id(&self) -> u32 {
        self.graph.id
    }

    /// Whether this tensor's step is still the graph's current one.
    #[wasm_bindgen(getter, js_name = isAlive)]
    pub fn is_alive(&self) -> bool {
        self.slot().is_ok()
    }

    /// The name of the op that made this tensor.
    #[wasm_bindgen(getter)]
    pub fn op(&self) -> Res<String> {
        self.with(|t| Ok(t.op().name().to_string()))
    }

    /// Matrix product (batched over leading axes).
    pub fn matmul(&self, other: &Tensor) -> Res<Tensor> {
        self.map2(other, "matmul", |a, b| a.matmul(b))
    }

    /// Matrix product with either operand transposed (no copy).
    #[wasm_bindgen(js_name = matmulT)]
    #[allow(non_snake_case)]
    pub fn matmul_t(&self, other: &Tensor, transposeA: bool, transposeB: bool) -> Res<Tensor> {
        self.map2(other, "matmul", move |a, b| a.matmul_t(b, transposeA, transposeB))
    }

    /// Softmax along `axis` (default -1).
    pub fn softmax(&self, axis: Option<f64>) -> Res<Tensor> {
        let axis = signed_or("softmax", "axis", axis, -1)?;
        self.map(|t| t.softmax(axis))
    }

    /// log(softmax(x)) along `axis` (default -1), computed stably.
    #[wasm_bindgen(js_name = logSoftmax)]
    pub fn log_softmax(&self, axis: Option<f64>) -> Res<Tensor> {
        let axis = signed_or("logSoftmax", "axis", axis, -1)?;
        self.map(|t| t.log_softmax(axis))
    }

    pub fn logsumexp(&self, axes: &AxesArg, keepdim: Option<bool>) -> Res<Tensor> {
        let a = ints("logsumexp", axes)?;
        self.map(|t| t.logsumexp(&a, keepdim.unwrap_or(false)))
    }

    /// Running sums along `axis` (default -1). `exclusive`: each element
    /// gets the sum of those before it (the first 0); `reverse`: counted
    /// from the end of the axis.
    pub fn cumsum(&self, axis: Option<f64>, exclusive: Option<bool>, reverse: Option<bool>) -> Res<Tensor> {
        let axis = signed_or("cumsum", "axis", axis, -1)?;
        self.map(|t| t.cumsum(axis, exclusive.unwrap_or(false), reverse.unwrap_or(false)))
    }

    /// Variance over `axes` with Bessel's `correction` (default 1).
    pub fn var(&self, axes: &AxesArg, keepdim: Option<bool>, correction: Option<f64>) -> Res<Tensor> {
        let a = ints("var", axes)?;
        let correction = count("var", "correction", correction.unwrap_or(1.0))?;
        self.map(|t| t.var(&a, keepdim.unwrap_or(false), correction))
    }

    pub fn clamp(&self, min: f64, max: f64) -> Res<Tensor> {
        self.map(|t| t.clamp(min, max))
    }

    /// New shape with the same number of elements; one entry may be -1.
    pub fn reshape(&self, shape: &IntList) -> Res<Tensor> {
        let s = ints("reshape", shape)?;
        self.map(|t| t.reshape(&s))
    }

    /// Swap two axes (default: the last two).
    pub fn transpose(&self, a: Option<f64>, b: Option<f64>) -> Res<Tensor> {
        let (a, b) = (signed_or("transpose", "a", a, -2)?, signed_or("transpose", "b", b, -1)?);
        self.map(|t| t.transpose(a, b))
    }

    /// Reorder axes.
    pub fn permute(&self, perm: &IntList) -> Res<Tensor> {
        let p = dims(&uints("permute", perm)?);
        self.map(|t| t.permute(&p))
    }

    /// Broadcast to a larger shape.
    pub fn expand(&self, shape: &IntList) -> Res<Tensor> {
        let d = dims(&uints("expand", shape)?);
        self.map(|t| t.expand(&d))
    }

    /// Elements start, start+step, ... below end along `axis`.
    #[wasm_bindgen(js_name = sliceAxis)]
    pub fn slice_axis(&self, axis: f64, start: f64, end: f64, step: Option<f64>) -> Res<Tensor> {
        const OP: &str = "sliceAxis";
        let axis = signed(OP, "axis", axis)?;
        let (start, end) = (count(OP, "start", start)?, count(OP, "end", end)?);
        let step = count(OP, "step", step.unwrap_or(1.0))?;
        self.map(|t| t.slice_axis(axis, start, end, step))
    }

    /// Pick entries along `axis` at int32 `index`.
    #[wasm_bindgen(js_name = indexSelect)]
    pub fn index_select(&self, axis: f64, index: &Tensor) -> Res<Tensor> {
        let axis = signed("indexSelect", "axis", axis)?;
        self.map2(index, "index_select", move |a, i| a.index_select(axis, i))
    }

    /// One-hot rows of int32 labels.
    #[wasm_bindgen(js_name = oneHot)]
    pub fn one_hot(&self, classes: f64, dtype: Option<String>) -> Res<Tensor> {
        let dtype = parse_dtype("oneHot", dtype)?;
        let classes = count("oneHot", "classes", classes)?;
        self.map(|t| t.one_hot(classes, dtype))
    }

    /// Convert to another dtype.
    pub fn cast(&self, dtype: String) -> Res<Tensor> {
        let dtype = parse_dtype("cast", Some(dtype))?;
        self.map(|t| t.cast(dtype))
    }

    /// Choose between `onTrue` and `onFalse` where this bool tensor is true.
    #[wasm_bindgen(js_name = "where")]
    pub fn where_(&self, on_true: &Operand, on_false: &Operand) -> Res<Tensor> {
        match (operand("where", on_true)?, operand("where", on_false)?) {
            (Other::Tensor(a), Other::Tensor(b)) => self.map3(&a, &b, "where", |c, a, b| c.where_(a, b)),
            (Other::Tensor(a), Other::Number(y)) => self.map2(&a, "where", move |c, a| c.where_(a, y)),
            (Other::Number(x), Other::Tensor(b)) => self.map2(&b, "where", move |c, b| c.where_(x, b)),
            (Other::Number(x), Other::Number(y)) => self.map(|c| c.where_(x, y)),
        }
    }

    /// Keep this intermediate's gradient after `backward()` (read `grad`).
    #[wasm_bindgen(js_name = retainGrad)]
    pub fn retain_grad(&self) -> Res<Tensor> {
        self.with(|t| {
            t.retain_grad();
            Ok(())
        })?;
        Ok(self.clone())
    }

    /// The gradient kept by the last backward pass, for variables and
    /// tensors marked with `retainGrad()`; undefined otherwise. (Parameters
    /// keep theirs: `param.grad()`.)
    #[wasm_bindgen(getter)]
    pub fn grad(&self) -> Res<Option<Tensor>> {
        let slot = self.slot()?;
        let grad = slot.get(self.id)?.grad();
        Ok(grad.map(|g| self.graph.register(&slot, g)))
    }

    /// Reverse-mode differentiation from this tensor: gradients accumulate
    /// into parameters (until `zeroGrad()`) and are kept for variables. A
    /// one-element tensor needs no `seed`; otherwise pass the cotangent.
    /// `keepGraph` allows a second backward over this step.
    #[allow(non_snake_case)]
    pub fn backward(&self, seed: Option<TensorArg>, keepGraph: Option<bool>) -> Res<()> {
        let slot = self.slot()?;
        let t = slot.get(self.id)?;
        let seed = match seed.map(|s| tensor_from_js("backward", &s)).transpose()? {
            Some(s) => Some(self.same("backward", &slot, &s)?),
            None => None,
        };
        t.backward_with_options(BackwardOptions { seed, keep_graph: keepGraph.unwrap_or(false) })?;
        Ok(())
    }

    /// The values, as a typed array matching the dtype. The graph runs
    /// when this is called; the Promise resolves when the values are on the
    /// host.
    #[wasm_bindgen(js_name = toArray)]
    pub fn to_array(&self) -> ArrayPromise {
        promise_of(self.read(), |d| Ok(host_to_js(d))).unchecked_into()
    }

    /// The single value of a one-element tensor.
    pub fn item(&self) -> NumberPromise {
        promise_of(self.read(), item_of).unchecked_into()
    }
}
