//! Custom ops and `customVjp` from JavaScript.
//!
//! `customOp({ name, arity, forward, wgsl?, backward?, outputShape?, dtypes?,
//! differentiable? })` registers a kiln custom op (kiln-core's
//! `CustomOpBuilder`): `forward` is a JS function over typed arrays (the
//! CPU path), `wgsl` a kernel source whose interface is checked at
//! registration and which the browser compiles when it first runs (the
//! WebGPU path), `backward` a JS function written with kiln tensor ops
//! (recorded like any gradient rule, so differentiable again).
//! `customVjp(fn, inputs, backward)` gives any JS function built from kiln
//! ops a gradient written in JS.
//!
//! kiln-core keeps a custom op's functions as `Send + Sync` closures (the
//! native CPU backend may call them from a rayon thread); JS functions are
//! neither. So the closures registered here hold only the op's name, and
//! the JS functions live in a thread-local table read when a closure runs.
//! On wasm32 (single-threaded: no rayon, no atomics) that is always the
//! thread that registered them; on any other thread the lookup finds
//! nothing and the closure returns an error naming the op. No `unsafe`.
//!
//! A backward gets JS `Tensor` handles: the graph it runs in is found among
//! this thread's live JS graphs (a custom op applied in a graph made by
//! `kiln.graph()` is differentiated there).

use std::cell::RefCell;
use std::collections::HashMap;

use js_sys::{Array, Float32Array, Float64Array, Function, Int32Array, Reflect, Uint8Array};
use kiln_core::op::custom::{HostSlice, HostSliceMut, HostView, HostViewMut, TensorMeta};
use kiln_core::op::{CustomOp as CoreCustomOp, CustomOpBuilder};
use kiln_core::{DType, Error, Graph as CoreGraph, Result as CoreResult, Tensor as CoreTensor};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::error::{KilnError, Res};
use crate::graph::{js_graph_of, parse_dtype, Tensor};
use crate::tensor_api::{tensor_from_js, tensors_from_js, TensorArray};

#[wasm_bindgen]
extern "C" {
    /// What `customOp` takes.
    #[wasm_bindgen(typescript_type = "CustomOpSpec")]
    pub type CustomOpSpecArg;

    /// The function of a `customVjp`.
    #[wasm_bindgen(typescript_type = "(inputs: Tensor[]) => Tensor | Tensor[]")]
    pub type VjpFunction;

    /// The gradient of a `customVjp`.
    #[wasm_bindgen(
        typescript_type = "(inputs: Tensor[], outputs: Tensor[], grads: Tensor[]) => Array<Tensor | null | undefined>"
    )]
    pub type VjpBackwardFunction;
}

#[wasm_bindgen(typescript_custom_section)]
const CUSTOM_OP_SPEC: &str = r#"
/** Host data a custom op's JavaScript forward reads and writes (Uint8Array: bool as 0/1). */
export type HostTypedArray = Float32Array | Float64Array | Int32Array | Uint8Array;

/** The definition of a custom op (see `customOp`). */
export interface CustomOpSpec {
  /** Unique: 1 to 64 letters, digits, '_', '.' or ':'; errors and `countOps` use it. */
  name: string;
  /** Number of tensor operands (1 to 8). */
  arity: number;
  /** The CPU forward: fill `output` (row-major, the output's dtype) from `inputs` (copies of the
   *  operands, of their dtypes), or return the values. Must not call kiln. */
  forward: (inputs: HostTypedArray[], output: HostTypedArray, shapes: number[][]) => void | HostTypedArray | number[];
  /** A WGSL kernel for WebGPU: its interface is checked when the op is registered, the browser's
   *  compiler reports the rest (with your line) when it first runs on WebGPU (same contract as
   *  in Rust: entry `main`, `@workgroup_size(256)`, bindings 1..=arity read-only, arity+1 the output). */
  wgsl?: string;
  /** The gradient, written with kiln tensor ops: one entry per input (null: no gradient). */
  backward?: (inputs: Tensor[], output: Tensor, grad: Tensor) => Array<Tensor | null | undefined>;
  /** The output's shape from the operands' (default: operands of one shape, output alike). The
   *  output's dtype is the first operand's. */
  outputShape?: (shapes: number[][]) => number[];
  /** Output dtypes the forward handles (default ['float32', 'float64']). */
  dtypes?: Array<'float32' | 'float64' | 'int32' | 'bool'>;
  /** Which inputs the output depends on differentiably (default: all). */
  differentiable?: number[];
}
"#;

/// The JS functions of one custom op.
struct JsFunctions {
    forward: Function,
    backward: Option<Function>,
    output_shape: Option<Function>,
}

thread_local! {
    /// The JS side of every custom op registered from JS on this thread,
    /// by name (names are unique in kiln-core's registry).
    static JS_OPS: RefCell<HashMap<&'static str, JsFunctions>> = RefCell::new(HashMap::new());
}

fn js_functions<R>(name: &'static str, f: impl FnOnce(&JsFunctions) -> CoreResult<R>) -> CoreResult<R> {
    let found = JS_OPS.with(|t| {
        t.borrow().get(name).map(|j| JsFunctions {
            forward: j.forward.clone(),
            backward: j.backward.clone(),
            output_shape: j.output_shape.clone(),
        })
    });
    match found {
        Some(j) => f(&j),
        None => Err(Error::backend(
            name,
            "its JavaScript functions can only be called on the thread that registered the op",
        )),
    }
}

/// The message of a thrown JS value.
fn js_message(value: &JsValue) -> String {
    if let Some(e) = value.dyn_ref::<js_sys::Error>() {
        String::from(e.message())
    } else if let Some(s) = value.as_string() {
        s
    } else {
        format!("{value:?}")
    }
}

fn get(spec: &JsValue, key: &str) -> JsValue {
    Reflect::get(spec, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

fn optional_function(op: &'static str, spec: &JsValue, key: &str) -> Res<Option<Function>> {
    let v = get(spec, key);
    if v.is_undefined() || v.is_null() {
        return Ok(None);
    }
    v.dyn_into::<Function>().map(Some).map_err(|_| KilnError::argument(op, format!("'{key}' must be a function")))
}

fn shape_to_js(dims: &[usize]) -> Array {
    dims.iter().map(|&d| JsValue::from_f64(d as f64)).collect()
}

fn slice_to_js(data: &HostSlice<'_>) -> JsValue {
    match data {
        HostSlice::F32(v) => Float32Array::from(*v).into(),
        HostSlice::F64(v) => Float64Array::from(*v).into(),
        HostSlice::I32(v) => Int32Array::from(*v).into(),
        HostSlice::Bool(v) => Uint8Array::from(*v).into(),
    }
}

/// A typed array of the output's dtype and length, for the forward to fill.
fn output_array(out: &HostSliceMut<'_>) -> JsValue {
    match out {
        HostSliceMut::F32(v) => Float32Array::new_with_length(v.len() as u32).into(),
        HostSliceMut::F64(v) => Float64Array::new_with_length(v.len() as u32).into(),
        HostSliceMut::I32(v) => Int32Array::new_with_length(v.len() as u32).into(),
        HostSliceMut::Bool(v) => Uint8Array::new_with_length(v.len() as u32).into(),
    }
}

/// Copy what the forward produced into the output: a typed array of the
/// output's type or a plain array of numbers, of the output's length.
fn copy_output(name: &'static str, values: &JsValue, out: HostSliceMut<'_>) -> CoreResult<()> {
    let wrong = |what: String| Error::invalid(name, format!("the JavaScript forward {what}"));
    let numbers = |len: usize| -> CoreResult<Vec<f64>> {
        let a = values.dyn_ref::<Array>().ok_or_else(|| {
            wrong("must fill its output array or return a typed array of the output's dtype or a number[]".into())
        })?;
        if a.length() as usize != len {
            return Err(wrong(format!("returned {} values for an output of {len} elements", a.length())));
        }
        a.iter()
            .map(|v| v.as_f64().ok_or_else(|| wrong("returned an array holding something other than numbers".into())))
            .collect()
    };
    macro_rules! typed {
        ($array:ty, $dst:expr, $cast:expr) => {{
            let dst = $dst;
            if let Some(t) = values.dyn_ref::<$array>() {
                if t.length() as usize != dst.len() {
                    return Err(wrong(format!("gave {} values for an output of {} elements", t.length(), dst.len())));
                }
                t.copy_to(dst);
            } else {
                let values = numbers(dst.len())?;
                for (d, v) in dst.iter_mut().zip(values) {
                    *d = $cast(v);
                }
            }
        }};
    }
    match out {
        HostSliceMut::F32(dst) => typed!(Float32Array, dst, |v: f64| v as f32),
        HostSliceMut::F64(dst) => typed!(Float64Array, dst, |v: f64| v),
        HostSliceMut::I32(dst) => typed!(Int32Array, dst, |v: f64| v as i32),
        HostSliceMut::Bool(dst) => typed!(Uint8Array, dst, |v: f64| (v != 0.0) as u8),
    }
    Ok(())
}

/// The CPU forward of a JS custom op: operands copied into typed arrays,
/// the JS function called, its output copied back.
fn run_forward(name: &'static str, inputs: &[HostView<'_>], out: HostViewMut<'_>) -> CoreResult<()> {
    js_functions(name, |js| {
        let arrays: Array = inputs.iter().map(|v| slice_to_js(&v.data)).collect();
        let shapes: Array = inputs.iter().map(|v| JsValue::from(shape_to_js(v.dims))).collect();
        let output = output_array(&out.data);
        let returned = js
            .forward
            .call3(&JsValue::UNDEFINED, &arrays, &output, &shapes)
            .map_err(|e| Error::backend(name, format!("the JavaScript forward threw: {}", js_message(&e))))?;
        let values = if returned.is_undefined() || returned.is_null() { output } else { returned };
        copy_output(name, &values, out.data)
    })
}

/// The output shape from a JS `outputShape` (dtype: the first operand's).
fn run_output_shape(name: &'static str, metas: &[TensorMeta<'_>]) -> CoreResult<(Vec<usize>, DType)> {
    js_functions(name, |js| {
        let f = js.output_shape.as_ref().ok_or_else(|| Error::invalid(name, "no outputShape function"))?;
        let shapes: Array = metas.iter().map(|m| JsValue::from(shape_to_js(m.dims))).collect();
        let returned = f
            .call1(&JsValue::UNDEFINED, &shapes)
            .map_err(|e| Error::shape(name, format!("outputShape threw: {}", js_message(&e))))?;
        let dims = crate::tensor_api::uints("outputShape", &returned)
            .map_err(|e| Error::shape(name, format!("outputShape returned an invalid shape: {}", e.message)))?;
        Ok((dims.into_iter().map(|d| d as usize).collect(), metas[0].dtype))
    })
}

/// The JS handles of core tensors of a graph made from JS.
fn js_handles<'g>(op: &'static str, graph: &'g CoreGraph, tensors: &[CoreTensor<'g>]) -> CoreResult<Vec<Tensor>> {
    let Some((shared, slot)) = js_graph_of(graph) else {
        return Err(Error::unsupported(
            op,
            "a JavaScript backward runs only in graphs made with kiln.graph() (not in graphs kiln makes internally)",
        ));
    };
    Ok(tensors.iter().map(|&t| shared.register(&slot, t)).collect())
}

/// What a JS backward returned, as core gradients of `graph`: one entry
/// per input, a Tensor or null/undefined (their dims are checked by
/// kiln-core).
fn gradients_from_js<'g>(
    op: &'static str,
    graph: &'g CoreGraph,
    returned: &JsValue,
    inputs: usize,
) -> CoreResult<Vec<Option<CoreTensor<'g>>>> {
    let Some(array) = returned.dyn_ref::<Array>() else {
        return Err(Error::autograd(
            op,
            format!("the JavaScript backward must return an array of {inputs} gradients (Tensor or null)"),
        ));
    };
    array
        .iter()
        .enumerate()
        .map(|(k, v)| {
            if v.is_null() || v.is_undefined() {
                return Ok(None);
            }
            let t = tensor_from_js("backward", &v).map_err(|e| {
                Error::autograd(op, format!("gradient {k} returned by the JavaScript backward: {}", e.message))
            })?;
            graph.tensor_by_id(t.id).map(Some).map_err(|e| {
                Error::autograd(
                    op,
                    format!("gradient {k} returned by the JavaScript backward is not of this step: {}", e.message()),
                )
            })
        })
        .collect()
}

fn run_backward<'g>(
    name: &'static str,
    inputs: &[CoreTensor<'g>],
    output: CoreTensor<'g>,
    grad: CoreTensor<'g>,
) -> CoreResult<Vec<Option<CoreTensor<'g>>>> {
    js_functions(name, |js| {
        let f = js.backward.as_ref().ok_or_else(|| Error::autograd(name, "registered without a backward"))?;
        let graph = output.graph();
        let xs: Array = js_handles(name, graph, inputs)?.into_iter().map(JsValue::from).collect();
        let mut rest = js_handles(name, graph, &[output, grad])?.into_iter();
        let (y, g) = (rest.next().map(JsValue::from), rest.next().map(JsValue::from));
        let returned = f
            .call3(&JsValue::UNDEFINED, &xs, &y.unwrap_or_default(), &g.unwrap_or_default())
            .map_err(|e| Error::autograd(name, format!("the JavaScript backward threw: {}", js_message(&e))))?;
        gradients_from_js(name, graph, &returned, inputs.len())
    })
}

/// A custom op registered from JavaScript. Apply it with `apply`.
#[wasm_bindgen(js_name = CustomOp)]
pub struct JsCustomOp {
    op: CoreCustomOp,
}

/// Register a custom op (see `CustomOpSpec`). Throws a KilnError when the
/// definition is refused: a name in use or not valid, an arity outside
/// 1..=8, WGSL whose brackets do not pair or that breaks kiln's binding
/// contract (with the line in your source). WGSL errors only a compiler
/// sees (types, names) fail the first read of the op's result on WebGPU,
/// with the browser's message and your line.
#[wasm_bindgen(js_name = customOp)]
pub fn custom_op(spec: &CustomOpSpecArg) -> Res<JsCustomOp> {
    const OP: &str = "customOp";
    let spec: &JsValue = spec;
    if !spec.is_object() {
        return Err(KilnError::argument(OP, "expected a definition object { name, arity, forward, ... }"));
    }
    let name = get(spec, "name").as_string().ok_or_else(|| KilnError::argument(OP, "'name' must be a string"))?;
    let arity = match get(spec, "arity").as_f64() {
        Some(a) if a.fract() == 0.0 && (0.0..=1e6).contains(&a) => a as usize,
        _ => return Err(KilnError::argument(OP, format!("custom op {name}: 'arity' must be a whole number"))),
    };
    let forward = optional_function(OP, spec, "forward")?
        .ok_or_else(|| KilnError::argument(OP, format!("custom op {name}: 'forward' (the CPU forward) is required")))?;
    let backward = optional_function(OP, spec, "backward")?;
    let output_shape = optional_function(OP, spec, "outputShape")?;
    let wgsl = get(spec, "wgsl");
    let wgsl = if wgsl.is_undefined() || wgsl.is_null() {
        None
    } else {
        Some(
            wgsl.as_string()
                .ok_or_else(|| KilnError::argument(OP, format!("custom op {name}: 'wgsl' must be a string")))?,
        )
    };
    let dtypes = get(spec, "dtypes");
    let dtypes: Option<Vec<DType>> = if dtypes.is_undefined() || dtypes.is_null() {
        None
    } else {
        let list = dtypes.dyn_ref::<Array>().ok_or_else(|| {
            KilnError::argument(OP, format!("custom op {name}: 'dtypes' must be an array of dtype names"))
        })?;
        Some(list.iter().map(|v| parse_dtype(OP, Some(v.as_string().unwrap_or_default()))).collect::<Res<_>>()?)
    };
    let differentiable = get(spec, "differentiable");
    let differentiable: Option<Vec<usize>> = if differentiable.is_undefined() || differentiable.is_null() {
        None
    } else {
        Some(crate::tensor_api::uints(OP, &differentiable)?.into_iter().map(|i| i as usize).collect())
    };

    // The closures name the op; the JS functions are looked up by it. The
    // name is leaked like kiln-core's own copy: ops live for the program.
    let key: &'static str = Box::leak(name.trim().to_string().into_boxed_str());
    let mut builder = CustomOpBuilder::new(&name, arity).cpu(move |ins, out| run_forward(key, ins, out));
    if let Some(source) = &wgsl {
        builder = builder.wgsl(source);
    }
    if backward.is_some() {
        builder = builder.backward(move |xs, y, g| run_backward(key, xs, y, g));
    }
    if output_shape.is_some() {
        builder = builder.infer(move |metas| run_output_shape(key, metas));
    }
    if let Some(d) = &dtypes {
        builder = builder.dtypes(d);
    }
    if let Some(d) = &differentiable {
        builder = builder.differentiable(d);
    }
    let op = builder.register()?;
    JS_OPS.with(|t| t.borrow_mut().insert(op.name(), JsFunctions { forward, backward, output_shape }));
    Ok(JsCustomOp { op })
}

/// The registered custom op called `name` (one registered from JS, or
/// from Rust such as kiln's reference op `CustomCube`), if any.
#[wasm_bindgen(js_name = findCustomOp)]
pub fn find_custom_op(name: &str) -> Option<JsCustomOp> {
    kiln_core::op::custom::reference(); // registered on first use
    kiln_core::op::custom::find(name).map(|op| JsCustomOp { op })
}

#[wasm_bindgen(js_class = CustomOp)]
impl JsCustomOp {
    /// Record the op on `inputs` (tensors of one step of one graph). Shape
    /// and dtype are checked now; the forward runs when values are read.
    pub fn apply(&self, inputs: &TensorArray) -> Res<Tensor> {
        let name = self.op.name();
        let ts = tensors_from_js(name, inputs)?;
        let op = self.op;
        Tensor::map_many(&ts, name, move |core| op.apply(core))
    }

    #[wasm_bindgen(getter)]
    pub fn name(&self) -> String {
        self.op.name().to_string()
    }

    #[wasm_bindgen(getter)]
    pub fn arity(&self) -> u32 {
        self.op.arity() as u32
    }

    /// Whether the op has a WGSL kernel (it then runs on WebGPU too).
    #[wasm_bindgen(getter, js_name = hasWgsl)]
    pub fn has_wgsl(&self) -> bool {
        self.op.wgsl().is_some()
    }

    #[wasm_bindgen(getter, js_name = hasBackward)]
    pub fn has_backward(&self) -> bool {
        self.op.has_backward()
    }
}

/// `fn(inputs)` (kiln ops) differentiated with `backward(inputs, outputs,
/// grads)` instead of its own ops' gradients: a straight-through estimator,
/// gradient reversal, a clipped gradient. `backward` returns one gradient
/// per input (null: none), written with kiln ops so that second order works.
/// Returns the outputs (an array, even for one).
#[wasm_bindgen(js_name = customVjp, unchecked_return_type = "Tensor[]")]
pub fn custom_vjp(f: &VjpFunction, inputs: &TensorArray, backward: &VjpBackwardFunction) -> Res<Array> {
    const OP: &str = "custom_vjp";
    let (f, backward): (&JsValue, &JsValue) = (f, backward);
    let f: Function = f.clone().dyn_into().map_err(|_| KilnError::argument(OP, "the function must be a function"))?;
    let backward: Function =
        backward.clone().dyn_into().map_err(|_| KilnError::argument(OP, "the backward must be a function"))?;
    let ts = tensors_from_js(OP, inputs)?;
    let Some(first) = ts.first() else {
        return Err(KilnError::argument(OP, "needs at least one input tensor"));
    };
    let slot = first.slot()?;
    let core = ts.iter().map(|t| first.same(OP, &slot, t)).collect::<Res<Vec<_>>>()?;
    let rule = as_rule(move |xs, ys, gs| {
        let graph = xs[0].graph();
        let (xs_js, ys_js, gs_js) = (handle_array(graph, xs)?, handle_array(graph, ys)?, handle_array(graph, gs)?);
        let returned = backward
            .call3(&JsValue::UNDEFINED, &xs_js, &ys_js, &gs_js)
            .map_err(|e| Error::autograd(OP, format!("the JavaScript backward threw: {}", js_message(&e))))?;
        gradients_from_js(OP, graph, &returned, xs.len())
    });
    let graph = &slot.graph;
    let outputs = kiln_core::custom_vjp_many(
        |xs| {
            let handles: Array = js_handles(OP, graph, xs)?.into_iter().map(JsValue::from).collect();
            let returned = f
                .call1(&JsValue::UNDEFINED, &handles)
                .map_err(|e| Error::invalid(OP, format!("the JavaScript function threw: {}", js_message(&e))))?;
            let outs = if Array::is_array(&returned) {
                tensors_from_js(OP, &returned)
            } else {
                tensor_from_js(OP, &returned).map(|t| vec![t])
            }
            .map_err(|e| Error::invalid(OP, format!("the function must return a Tensor or Tensor[]: {}", e.message)))?;
            outs.iter().map(|t| graph.tensor_by_id(t.id)).collect()
        },
        &core,
        rule,
    )?;
    Ok(outputs.into_iter().map(|t| JsValue::from(first.graph.register(&slot, t))).collect())
}

/// JS handles of core tensors, as a JS array (for `customVjp`'s callbacks).
fn handle_array<'g>(graph: &'g CoreGraph, tensors: &[CoreTensor<'g>]) -> CoreResult<JsValue> {
    Ok(js_handles("custom_vjp", graph, tensors)?.into_iter().map(JsValue::from).collect::<Array>().into())
}

/// Gives a closure the higher-ranked signature kiln-core's `custom_vjp_many` wants.
fn as_rule<B>(b: B) -> B
where
    B: for<'a> Fn(&[CoreTensor<'a>], &[CoreTensor<'a>], &[CoreTensor<'a>]) -> CoreResult<Vec<Option<CoreTensor<'a>>>>,
{
    b
}
