//! Custom ops: operators defined by the user, with a place in the op table.
//!
//! A custom op has a name (errors and `kiln ops` use it), an arity, shape
//! and dtype inference, a forward on the CPU over host slices (required: it
//! is the reference every other backend is checked against), optionally a
//! WGSL kernel for wgpu and the browser (checked when the op is registered,
//! with naga or, without kiln-core's `wgsl` feature, a reader of its
//! interface; see `wgsl`), and optionally a backward written with kiln ops
//! (recorded like any gradient rule, so differentiable again when its ops
//! are). Registering it returns a `CustomOp`: a small `Copy` handle that
//! `Op::Custom` carries, so nodes stay plain data. `check::check_custom_op`
//! compares its backends and checks its gradient.
//!
//! Definitions live in a process-wide registry for the rest of the program
//! (registration leaks them on purpose: an op is defined once, nodes refer
//! to it by index, and its name is a `&'static str` like every op's).
//!
//! ```
//! use kiln_core::op::custom::{CustomOpBuilder, HostSlice, HostSliceMut};
//! use kiln_core::{Device, Error, Graph};
//! # fn main() -> kiln_core::Result<()> {
//! // y = x³ (CPU forward in f32 and f64), dy/dx = 3x² in kiln ops.
//! let cube = CustomOpBuilder::new("DocCube", 1)
//!     .cpu(|ins, out| match (&ins[0].data, out.data) {
//!         (HostSlice::F32(x), HostSliceMut::F32(y)) => Ok(y.iter_mut().zip(*x).for_each(|(y, x)| *y = x * x * x)),
//!         (HostSlice::F64(x), HostSliceMut::F64(y)) => Ok(y.iter_mut().zip(*x).for_each(|(y, x)| *y = x * x * x)),
//!         _ => Err(Error::unsupported("DocCube", "f32 and f64 only")),
//!     })
//!     .backward(|x, _y, g| Ok(vec![Some(g.mul(x[0].square()?.mul(3.0)?)?)]))
//!     .register()?;
//! let graph = Graph::new(&Device::cpu());
//! let x = graph.variable(&[2.0f32, -1.0], &[2])?;
//! let y = cube.apply(&[x])?;
//! y.sum_all()?.backward()?;
//! assert_eq!(pollster::block_on(y.to_vec::<f32>())?, vec![8.0, -1.0]);
//! assert_eq!(pollster::block_on(x.grad().unwrap().to_vec::<f32>())?, vec![12.0, 3.0]);
//! # Ok(())
//! # }
//! ```

mod check;
pub mod wgsl;
// naga's stand-in; compiled with naga too for its tests (which compare the two).
#[cfg(any(test, not(feature = "wgsl")))]
mod wgsl_scan;

pub use check::{check_custom_op, CustomCheckOptions, CustomOpReport, Parity};

use std::panic::Location;
use std::sync::RwLock;

use crate::small::SmallVec;

use super::table::{DTypeSet, Saved};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gradcheck::CheckInput;
use crate::graph::Tensor;
use crate::op::Op;

/// The most operands a custom op takes (gradient facts are 8-bit masks).
pub const MAX_CUSTOM_ARITY: usize = 8;

/// A registered custom op: an index into the registry. Cheap to copy; apply
/// it with `apply`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CustomOp {
    index: u32,
}

/// Dims and dtype of one operand, as shape inference sees it.
#[derive(Clone, Copy, Debug)]
pub struct TensorMeta<'a> {
    pub dims: &'a [usize],
    pub dtype: DType,
}

/// An operand's elements on the host, typed (bool as 0/1 bytes).
#[derive(Clone, Copy, Debug)]
pub enum HostSlice<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    I32(&'a [i32]),
    Bool(&'a [u8]),
}

/// The output's elements on the host, to be written completely.
#[derive(Debug)]
pub enum HostSliceMut<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    I32(&'a mut [i32]),
    Bool(&'a mut [u8]),
}

/// An operand of the CPU forward: its elements (row-major) and dims.
#[derive(Clone, Copy, Debug)]
pub struct HostView<'a> {
    pub data: HostSlice<'a>,
    pub dims: &'a [usize],
}

/// The output of the CPU forward: its elements (row-major) and dims.
#[derive(Debug)]
pub struct HostViewMut<'a> {
    pub data: HostSliceMut<'a>,
    pub dims: &'a [usize],
}

type InferFn = dyn Fn(&[TensorMeta<'_>]) -> Result<(Vec<usize>, DType)> + Send + Sync;
type CpuFn = dyn Fn(&[HostView<'_>], HostViewMut<'_>) -> Result<()> + Send + Sync;

/// A custom op's gradient: given its inputs, its output and the output's
/// gradient, one entry per input (None: no gradient), each of the input's
/// dims and dtype. Written with kiln ops.
pub trait CustomBackward:
    for<'g> Fn(&[Tensor<'g>], Tensor<'g>, Tensor<'g>) -> Result<Vec<Option<Tensor<'g>>>> + Send + Sync + 'static
{
}

impl<F> CustomBackward for F where
    F: for<'g> Fn(&[Tensor<'g>], Tensor<'g>, Tensor<'g>) -> Result<Vec<Option<Tensor<'g>>>> + Send + Sync + 'static
{
}

/// A WGSL kernel after validation: the full source (the user's plus kiln's
/// prelude) and the dtype each binding holds (inputs, then the output).
#[derive(Clone, Debug)]
pub struct WgslKernel {
    pub source: String,
    pub bindings: Vec<DType>,
}

/// Everything registered about one custom op.
pub(crate) struct Definition {
    pub name: &'static str,
    pub arity: usize,
    infer: Option<Box<InferFn>>,
    cpu: Box<CpuFn>,
    pub wgsl: Option<WgslKernel>,
    backward: Option<Box<dyn CustomBackward>>,
    pub grad_inputs: u8,
    pub saved: Saved,
    pub dtypes: DTypeSet,
    sample: Option<Vec<CheckInput>>,
}

static REGISTRY: RwLock<Vec<&'static Definition>> = RwLock::new(Vec::new());

fn registry() -> std::sync::RwLockReadGuard<'static, Vec<&'static Definition>> {
    // Nothing panics while holding the lock; a poisoned one is still intact.
    REGISTRY.read().unwrap_or_else(|e| e.into_inner())
}

/// Every registered custom op, in registration order.
pub fn registered() -> Vec<CustomOp> {
    (0..registry().len() as u32).map(|index| CustomOp { index }).collect()
}

/// The registered op called `name`, if any.
pub fn find(name: &str) -> Option<CustomOp> {
    registry().iter().position(|d| d.name == name).map(|i| CustomOp { index: i as u32 })
}

/// Defines a custom op; `register` validates it and makes it usable.
pub struct CustomOpBuilder {
    name: String,
    arity: usize,
    infer: Option<Box<InferFn>>,
    cpu: Option<Box<CpuFn>>,
    wgsl: Option<String>,
    backward: Option<Box<dyn CustomBackward>>,
    differentiable: Option<Vec<usize>>,
    saved: Option<Saved>,
    dtypes: DTypeSet,
    sample: Option<Vec<CheckInput>>,
}

impl CustomOpBuilder {
    /// An op called `name` taking `arity` tensors. Without `infer`, the
    /// operands must share dims and dtype and the output has them too.
    pub fn new(name: &str, arity: usize) -> CustomOpBuilder {
        CustomOpBuilder {
            name: name.to_string(),
            arity,
            infer: None,
            cpu: None,
            wgsl: None,
            backward: None,
            differentiable: None,
            saved: None,
            dtypes: DTypeSet::FLOAT,
            sample: None,
        }
    }

    /// Shape and dtype inference: the output's dims and dtype from the
    /// operands', or an error (it is re-attributed to this op and to the
    /// caller's line).
    pub fn infer(
        mut self,
        f: impl Fn(&[TensorMeta<'_>]) -> Result<(Vec<usize>, DType)> + Send + Sync + 'static,
    ) -> Self {
        self.infer = Some(Box::new(f));
        self
    }

    /// The CPU forward: writes every element of the output from the
    /// operands. Required.
    pub fn cpu(mut self, f: impl Fn(&[HostView<'_>], HostViewMut<'_>) -> Result<()> + Send + Sync + 'static) -> Self {
        self.cpu = Some(Box::new(f));
        self
    }

    /// A WGSL kernel for wgpu (see `wgsl` for the bindings and helpers it
    /// gets). Checked by `register`.
    pub fn wgsl(mut self, source: &str) -> Self {
        self.wgsl = Some(source.to_string());
        self
    }

    /// The gradient, written with kiln ops: `backward(inputs, output,
    /// output_grad)` returns one entry per input.
    pub fn backward<B>(mut self, backward: B) -> Self
    where
        B: for<'g> Fn(&[Tensor<'g>], Tensor<'g>, Tensor<'g>) -> Result<Vec<Option<Tensor<'g>>>> + Send + Sync + 'static,
    {
        self.backward = Some(Box::new(backward));
        self
    }

    /// Which inputs the output depends on differentiably (default: all).
    pub fn differentiable(mut self, inputs: &[usize]) -> Self {
        self.differentiable = Some(inputs.to_vec());
        self
    }

    /// Which values the backward reads (default: every input and the
    /// output). The executor keeps exactly these for the backward pass.
    pub fn saves(mut self, inputs: &[usize], output: bool) -> Self {
        let mask = inputs.iter().filter(|&&i| i < MAX_CUSTOM_ARITY).fold(0u8, |m, &i| m | 1 << i);
        self.saved = Some(Saved { inputs: mask, output });
        self
    }

    /// Output dtypes the forward supports (default: f32 and f64).
    pub fn dtypes(mut self, dtypes: &[DType]) -> Self {
        self.dtypes = DTypeSet::of(dtypes);
        self
    }

    /// Sample operands (f64 values and dims, in the op's smooth domain) on
    /// which the coverage report (`kiln ops`) checks the op's gradient.
    pub fn sample(mut self, inputs: Vec<CheckInput>) -> Self {
        self.sample = Some(inputs);
        self
    }

    /// Check the definition (name, arity, the WGSL source through naga) and
    /// add it to the registry.
    #[track_caller]
    pub fn register(self) -> Result<CustomOp> {
        const OP: &str = "register_custom_op";
        let location = Location::caller();
        let fail = |message: String| Err(Error::invalid(OP, message).at(location));
        let name = self.name.trim();
        let valid_name = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == ':')
            && name.len() <= 64;
        if !valid_name {
            return fail(format!(
                "custom op name '{}' must be 1 to 64 characters of letters, digits, '_', '.' or ':'",
                self.name
            ));
        }
        if self.arity == 0 || self.arity > MAX_CUSTOM_ARITY {
            return fail(format!("custom op {name}: arity {} is not between 1 and {MAX_CUSTOM_ARITY}", self.arity));
        }
        let Some(cpu) = self.cpu else {
            return fail(format!(
                "custom op {name} has no CPU forward (the reference other backends are checked against)"
            ));
        };
        let grad_inputs = match &self.differentiable {
            None => ((1u16 << self.arity) - 1) as u8,
            Some(list) => {
                if let Some(bad) = list.iter().find(|&&i| i >= self.arity) {
                    return fail(format!(
                        "custom op {name}: differentiable input {bad} of an op of arity {}",
                        self.arity
                    ));
                }
                list.iter().fold(0u8, |m, &i| m | 1 << i)
            }
        };
        let saved = self.saved.unwrap_or(Saved { inputs: ((1u16 << self.arity) - 1) as u8, output: true });
        let wgsl = match self.wgsl {
            None => None,
            Some(source) => Some(wgsl_kernel(name, self.arity, &source).map_err(|e| e.at(location))?),
        };
        let mut registry = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
        let taken = registry.iter().any(|d| d.name == name) || Op::builtin_names().contains(&name);
        if taken {
            return fail(format!("an op called {name} already exists; custom op names are unique"));
        }
        let index = u32::try_from(registry.len()).map_err(|_| Error::invalid(OP, "too many custom ops"))?;
        let definition = Definition {
            name: Box::leak(name.to_string().into_boxed_str()),
            arity: self.arity,
            infer: self.infer,
            cpu,
            wgsl,
            backward: self.backward,
            grad_inputs,
            saved,
            dtypes: self.dtypes,
            sample: self.sample,
        };
        registry.push(Box::leak(Box::new(definition)));
        Ok(CustomOp { index })
    }
}

fn wgsl_kernel(name: &str, arity: usize, source: &str) -> Result<WgslKernel> {
    wgsl::validate(name, arity, source)
}

impl CustomOp {
    pub(crate) fn definition(self) -> &'static Definition {
        registry()[self.index as usize]
    }

    pub fn name(self) -> &'static str {
        self.definition().name
    }

    pub fn arity(self) -> usize {
        self.definition().arity
    }

    /// The validated WGSL kernel, when the op has one.
    pub fn wgsl(self) -> Option<&'static WgslKernel> {
        self.definition().wgsl.as_ref()
    }

    /// The sample operands given at registration.
    pub fn sample(self) -> Option<&'static [CheckInput]> {
        self.definition().sample.as_deref()
    }

    pub fn has_backward(self) -> bool {
        self.definition().backward.is_some()
    }

    /// Record the op on `inputs`: operands checked, output shape and dtype
    /// inferred now (errors name the op and this call's line).
    #[track_caller]
    pub fn apply<'g>(self, inputs: &[Tensor<'g>]) -> Result<Tensor<'g>> {
        let location = Location::caller();
        let def = self.definition();
        let name = def.name;
        if inputs.len() != def.arity {
            return Err(
                Error::invalid(name, format!("takes {} operands, got {}", def.arity, inputs.len())).at(location)
            );
        }
        let graph = inputs[0].graph;
        if inputs.iter().any(|t| !std::ptr::eq(t.graph, graph)) {
            return Err(Error::invalid(name, "operands belong to different graphs").at(location));
        }
        let dims: SmallVec<[crate::shape::Dims; 4]> = inputs.iter().map(|t| t.dims()).collect();
        let metas: SmallVec<[TensorMeta<'_>; 4]> =
            inputs.iter().zip(&dims).map(|(t, d)| TensorMeta { dims: d, dtype: t.dtype() }).collect();
        let (out_dims, dtype) = match &def.infer {
            Some(infer) => infer(&metas).map_err(|e| e.for_op(name).at(location))?,
            None => same_as_operands(name, &metas).map_err(|e| e.at(location))?,
        };
        if !def.dtypes.contains(dtype) {
            return Err(Error::dtype(name, format!("the op has no kernel producing {dtype}")).at(location));
        }
        let ids: SmallVec<[u32; 4]> = inputs.iter().map(|t| t.id).collect();
        graph.record(Op::Custom(self), &ids, &out_dims, dtype, location)
    }

    /// Run the CPU forward (the CPU backend calls this), turning a panic in
    /// user code into an error that names the op.
    pub(crate) fn run_cpu(self, inputs: &[HostView<'_>], output: HostViewMut<'_>) -> Result<()> {
        let def = self.definition();
        let run = std::panic::AssertUnwindSafe(|| (def.cpu)(inputs, output));
        match std::panic::catch_unwind(run) {
            Ok(result) => result.map_err(|e| e.for_op(def.name)),
            Err(payload) => {
                let why = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_string());
                Err(Error::backend(def.name, format!("the CPU forward panicked: {why}")))
            }
        }
    }

    /// The input gradients from the user's backward, checked: one entry per
    /// input, each of that input's dims and dtype.
    pub(crate) fn gradients<'g>(
        self,
        inputs: &[Tensor<'g>],
        output: Tensor<'g>,
        grad: Tensor<'g>,
    ) -> Result<Vec<Option<Tensor<'g>>>> {
        let def = self.definition();
        let name = def.name;
        let Some(backward) = &def.backward else {
            return Err(crate::autograd::rules::no_rule(&Op::Custom(self)));
        };
        let grads = backward(inputs, output, grad).map_err(|e| e.for_op(name))?;
        crate::autograd::check_backward_gradients(name, inputs, &grads)?;
        Ok(grads)
    }
}

impl std::fmt::Debug for CustomOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CustomOp({})", self.name())
    }
}

/// The default inference: operands of one dims and dtype, output alike.
fn same_as_operands(name: &'static str, metas: &[TensorMeta<'_>]) -> Result<(Vec<usize>, DType)> {
    let first = metas[0];
    for (k, m) in metas.iter().enumerate().skip(1) {
        if m.dims != first.dims || m.dtype != first.dtype {
            return Err(Error::shape(
                name,
                format!(
                    "operand {k} is {} {} but operand 0 is {} {}; give the op an `infer` function for \
                     operands of different shapes",
                    crate::shape::fmt_dims(m.dims),
                    m.dtype,
                    crate::shape::fmt_dims(first.dims),
                    first.dtype
                ),
            ));
        }
    }
    Ok((first.dims.to_vec(), first.dtype))
}

impl<'a> HostSlice<'a> {
    pub fn dtype(&self) -> DType {
        match self {
            HostSlice::F32(_) => DType::F32,
            HostSlice::F64(_) => DType::F64,
            HostSlice::I32(_) => DType::I32,
            HostSlice::Bool(_) => DType::Bool,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            HostSlice::F32(v) => v.len(),
            HostSlice::F64(v) => v.len(),
            HostSlice::I32(v) => v.len(),
            HostSlice::Bool(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl HostSliceMut<'_> {
    pub fn dtype(&self) -> DType {
        match self {
            HostSliceMut::F32(_) => DType::F32,
            HostSliceMut::F64(_) => DType::F64,
            HostSliceMut::I32(_) => DType::I32,
            HostSliceMut::Bool(_) => DType::Bool,
        }
    }
}

/// The op that stands for the Custom kind in `Op::kinds()`: y = x³ with a
/// CPU forward, a WGSL kernel and a backward in kiln ops. The op table's
/// tests, the coverage report and the wgpu parity tests reach the custom-op
/// machinery (registration, both forwards, the backward) through it.
pub fn reference() -> CustomOp {
    static REFERENCE: std::sync::OnceLock<CustomOp> = std::sync::OnceLock::new();
    *REFERENCE.get_or_init(|| {
        let builder = CustomOpBuilder::new("CustomCube", 1)
            .cpu(|ins, out| {
                fn cube<T: Copy + std::ops::Mul<Output = T>>(x: &[T], y: &mut [T]) {
                    y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * x * x);
                }
                match (&ins[0].data, out.data) {
                    (HostSlice::F32(x), HostSliceMut::F32(y)) => cube(x, y),
                    (HostSlice::F64(x), HostSliceMut::F64(y)) => cube(x, y),
                    (x, _) => return Err(Error::unsupported("CustomCube", format!("no {} forward", x.dtype()))),
                }
                Ok(())
            })
            .backward(|x, _y, g| Ok(vec![Some(g.mul(x[0].square()?.mul(3.0)?)?)]))
            .saves(&[0], false)
            .sample(vec![CheckInput::new(vec![-0.9, -0.4, 0.1, 0.5, 0.8, 1.3], &[2, 3])]);
        let builder = builder.wgsl(REFERENCE_WGSL);
        builder.register().expect("the reference custom op is valid")
    })
}

/// A kernel that keeps the binding contract (y = 2x): the WGSL checks' tests
/// (naga's in `wgsl.rs`, the naga-free scan's in `wgsl_scan.rs`) edit it.
#[cfg(test)]
const DOUBLING_KERNEL: &str = "
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = kiln_index(wid, nwg, lid);
    if (i >= kiln_len()) { return; }
    y[i] = 2.0 * x[i];
}
";

const REFERENCE_WGSL: &str = "
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = kiln_index(wid, nwg, lid);
    if (i >= kiln_len()) {
        return;
    }
    let v = x[i];
    y[i] = v * v * v;
}
";
