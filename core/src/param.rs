//! Parameters: persistent tensors that live outside graphs.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::backend::{BufferId, KernelCall, TensorRef};
use crate::device::Device;
use crate::dtype::{DType, Element, HostData};
use crate::error::{Error, Result};
use crate::op::{BinaryOp, Op};
use crate::shape::{check_shape, fmt_dims, Dims};

/// A trainable tensor: a persistent device buffer plus its gradient buffer.
/// Cloning shares the parameter (a module and its optimizer hold the same
/// one). Using it in a graph makes a leaf that reads the buffer in place.
#[derive(Clone)]
pub struct Param(Rc<ParamShared>);

struct ParamShared {
    device: Device,
    name: RefCell<String>,
    dims: Dims,
    dtype: DType,
    /// The current value. Graphs that use the parameter hold a clone of the
    /// `Rc`; an in-place write while one does copies first (copy-on-write),
    /// so those graphs keep reading the values they were built with.
    value: RefCell<Rc<ValueBuffer>>,
    grad: Cell<Option<BufferId>>,
    requires_grad: Cell<bool>,
    /// Bumped by every in-place update; a graph that recorded an older
    /// version refuses to recompute from the changed value.
    version: Cell<u64>,
    copies_on_write: Cell<u64>,
}

/// A parameter's value buffer, given back to the device's pool when the
/// parameter and every graph that used this version have let go of it.
pub(crate) struct ValueBuffer {
    device: Device,
    pub(crate) id: BufferId,
    dtype: DType,
    len: usize,
}

impl Drop for ValueBuffer {
    fn drop(&mut self) {
        self.device.give_back(self.id, self.dtype, self.len);
    }
}

impl Param {
    /// A parameter holding `data` with shape `dims`.
    #[track_caller]
    pub fn new<T: Element>(device: &Device, name: &str, data: &[T], dims: &[usize]) -> Result<Param> {
        Param::from_host(device, name, T::into_host(data.to_vec()), dims)
    }

    #[track_caller]
    pub fn from_host(device: &Device, name: &str, data: HostData, dims: &[usize]) -> Result<Param> {
        let location = std::panic::Location::caller();
        if !data.dtype().is_float() {
            return Err(Error::dtype(
                "Param",
                format!("parameter '{name}' must be floating point, got {}", data.dtype()),
            ));
        }
        let numel = check_shape("Param", dims, data.dtype())?;
        if data.len() != numel {
            return Err(Error::shape(
                "Param",
                format!("parameter '{name}': {} values for shape {}", data.len(), fmt_dims(dims)),
            ));
        }
        let id = device.upload(&data).map_err(|e| e.for_op("Param").at(location))?;
        let value = ValueBuffer { device: device.clone(), id, dtype: data.dtype(), len: numel };
        Ok(Param(Rc::new(ParamShared {
            device: device.clone(),
            name: RefCell::new(name.to_string()),
            dims: Dims::from_slice(dims),
            dtype: data.dtype(),
            value: RefCell::new(Rc::new(value)),
            grad: Cell::new(None),
            requires_grad: Cell::new(true),
            version: Cell::new(0),
            copies_on_write: Cell::new(0),
        })))
    }

    pub fn name(&self) -> String {
        self.0.name.borrow().clone()
    }
    pub fn set_name(&self, name: &str) {
        *self.0.name.borrow_mut() = name.to_string();
    }
    pub fn dims(&self) -> Dims {
        self.0.dims.clone()
    }
    pub fn numel(&self) -> usize {
        self.0.dims.iter().product()
    }
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    pub fn device(&self) -> &Device {
        &self.0.device
    }
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad.get()
    }
    /// Freeze (false) or unfreeze (true). A frozen parameter is a constant
    /// in graphs: no gradient work is recorded for it.
    pub fn set_requires_grad(&self, requires_grad: bool) {
        self.0.requires_grad.set(requires_grad);
    }
    pub fn same(&self, other: &Param) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }
    pub(crate) fn buffer(&self) -> BufferId {
        self.0.value.borrow().id
    }

    /// The current value buffer, shared: a graph keeps it alive (and its
    /// contents unchanged) for as long as it may read it.
    pub(crate) fn value_snapshot(&self) -> Rc<ValueBuffer> {
        self.0.value.borrow().clone()
    }

    /// The buffer to write a new value into, in place. When a graph still
    /// holds the current buffer, the parameter first moves to a copy of it
    /// (copy-on-write) and the graph keeps the old one; when nothing else
    /// holds it, no copy is made.
    /// `keep_contents` is false when the caller overwrites every element
    /// anyway: a fresh buffer then needs no copy.
    pub(crate) fn writable_buffer(&self, keep_contents: bool) -> Result<BufferId> {
        let mut value = self.0.value.borrow_mut();
        if Rc::strong_count(&value) == 1 {
            return Ok(value.id);
        }
        let device = &self.0.device;
        let (dtype, len) = (self.0.dtype, self.numel());
        let copy = device.take_buffer(dtype, len)?;
        if keep_contents {
            if let Err(e) = device.backend().copy(value.id, copy, dtype, len) {
                device.give_back(copy, dtype, len);
                return Err(e);
            }
        }
        *value = Rc::new(ValueBuffer { device: device.clone(), id: copy, dtype, len });
        self.0.copies_on_write.set(self.0.copies_on_write.get() + 1);
        Ok(copy)
    }

    /// The buffer an update writes the new value into, and the buffer it
    /// reads the current value from: the same one when nothing else holds
    /// it; otherwise (copy-on-write) a fresh buffer and the shared old one,
    /// kept alive by the returned handle, so the update reads the old value
    /// and writes the new one in one pass instead of copying first.
    pub(crate) fn buffer_to_update(&self) -> Result<(BufferId, Rc<ValueBuffer>)> {
        let old = self.value_snapshot();
        if Rc::strong_count(&old) == 2 {
            // Only this handle and the parameter hold it: in place.
            return Ok((old.id, old));
        }
        let target = self.writable_buffer(false)?;
        Ok((target, old))
    }

    /// How many times an update had to copy this parameter's buffer because
    /// a live graph still referenced the old value (see `writable_buffer`).
    pub fn copies_on_write(&self) -> u64 {
        self.0.copies_on_write.get()
    }
    pub(crate) fn version(&self) -> u64 {
        self.0.version.get()
    }
    pub(crate) fn bump_version(&self) {
        self.0.version.set(self.0.version.get() + 1);
    }
    pub(crate) fn grad_buffer(&self) -> Option<BufferId> {
        self.0.grad.get()
    }

    /// Whether a gradient has been accumulated since the last `zero_grad`.
    pub fn has_grad(&self) -> bool {
        self.0.grad.get().is_some()
    }

    /// Drop the accumulated gradient (PyTorch's `zero_grad(set_to_none=True)`).
    pub fn zero_grad(&self) {
        if let Some(buffer) = self.0.grad.take() {
            self.0.device.give_back(buffer, self.0.dtype, self.numel());
        }
    }

    /// The parameter's values.
    pub async fn value(&self) -> Result<HostData> {
        let buffer = self.buffer();
        self.0.device.backend().read(buffer, self.0.dtype, self.numel()).await
    }

    /// The accumulated gradient, or None before any backward.
    pub async fn grad(&self) -> Result<Option<HostData>> {
        match self.0.grad.get() {
            None => Ok(None),
            Some(buffer) => Ok(Some(self.0.device.backend().read(buffer, self.0.dtype, self.numel()).await?)),
        }
    }

    /// Overwrite the values (for loading checkpoints and tests).
    #[track_caller]
    pub fn set_value(&self, data: &HostData) -> Result<()> {
        if data.dtype() != self.0.dtype || data.len() != self.numel() {
            return Err(Error::shape(
                "Param::set_value",
                format!(
                    "parameter '{}' is {} {}, got {} values of {}",
                    self.name(),
                    fmt_dims(&self.0.dims),
                    self.0.dtype,
                    data.len(),
                    data.dtype()
                ),
            ));
        }
        let buffer = self.writable_buffer(false)?;
        self.0.device.backend().upload(buffer, data)?;
        self.bump_version();
        Ok(())
    }

    /// Replace the accumulated gradient with `data` (same dtype and size as
    /// the parameter). Data-parallel training writes the gradient averaged
    /// over all processes back this way; the optimizer then reads it as
    /// usual.
    #[track_caller]
    pub fn set_grad_host(&self, data: &HostData) -> Result<()> {
        if data.dtype() != self.0.dtype || data.len() != self.numel() {
            return Err(Error::shape(
                "Param::set_grad_host",
                format!(
                    "parameter '{}' is {} {}, got {} values of {}",
                    self.name(),
                    fmt_dims(&self.0.dims),
                    self.0.dtype,
                    data.len(),
                    data.dtype()
                ),
            ));
        }
        match self.0.grad.get() {
            Some(buffer) => self.0.device.backend().upload(buffer, data),
            None => {
                let buffer = self.0.device.upload(data)?;
                self.0.grad.set(Some(buffer));
                Ok(())
            }
        }
    }

    /// Overwrite the values with a graph tensor's (computed now). For state
    /// updated outside autograd, such as batch-norm running statistics; call
    /// it under `no_grad`. Graphs that read the old values refuse to
    /// recompute from the new ones.
    #[track_caller]
    pub fn assign(&self, value: crate::graph::Tensor<'_>) -> Result<()> {
        if value.dims() != self.0.dims || value.dtype() != self.0.dtype {
            return Err(Error::shape(
                "Param::assign",
                format!(
                    "parameter '{}' is {} {}, the value is {} {}",
                    self.name(),
                    fmt_dims(&self.0.dims),
                    self.0.dtype,
                    fmt_dims(&value.dims()),
                    value.dtype()
                ),
            ));
        }
        let graph = value.graph();
        if !graph.device().same(&self.0.device) {
            return Err(Error::invalid("Param::assign", "the value lives on another device"));
        }
        graph.realize(&[value])?;
        let source = graph.value_buffer(value.id()).ok_or_else(|| Error::backend("Param::assign", "value missing"))?;
        let backend = self.0.device.backend();
        let target = self.writable_buffer(false)?;
        backend.copy(source, target, self.0.dtype, self.numel())?;
        backend.flush()?;
        self.bump_version();
        Ok(())
    }

    /// Replace the accumulated gradient by `buffer` (owned from now on),
    /// giving the previous one back to the pool.
    pub(crate) fn replace_grad_buffer(&self, buffer: BufferId) {
        if let Some(old) = self.0.grad.replace(Some(buffer)) {
            self.0.device.give_back(old, self.0.dtype, self.numel());
        }
    }

    #[track_caller]
    fn check_grad_shape(&self, op: &'static str, dims: &[usize], dtype: DType) -> Result<()> {
        if dims != self.0.dims.as_slice() || dtype != self.0.dtype {
            return Err(Error::shape(
                op,
                format!(
                    "parameter '{}' is {} {}, the gradient given is {} {}",
                    self.name(),
                    fmt_dims(&self.0.dims),
                    self.0.dtype,
                    fmt_dims(dims),
                    dtype
                ),
            ));
        }
        Ok(())
    }

    /// The accumulated gradient as a tensor of `graph` (a device-side copy,
    /// so later changes to the gradient do not affect it), or None before
    /// any backward. Compute with it and write the result back with
    /// `set_grad_tensor`: together they are PyTorch's `p.grad` read/modify/write.
    #[track_caller]
    pub fn grad_tensor<'g>(&self, graph: &'g crate::graph::Graph) -> Result<Option<crate::graph::Tensor<'g>>> {
        let Some(grad) = self.0.grad.get() else { return Ok(None) };
        if !graph.device().same(&self.0.device) {
            return Err(Error::invalid("Param::grad_tensor", "the graph runs on another device than the parameter"));
        }
        let location = std::panic::Location::caller();
        let copy = graph.device().take_buffer(self.0.dtype, self.numel())?;
        if let Err(e) = self.0.device.backend().copy(grad, copy, self.0.dtype, self.numel()) {
            graph.device().give_back(copy, self.0.dtype, self.numel());
            return Err(e.at(location));
        }
        match graph.owned_leaf(copy, &self.0.dims, self.0.dtype, location) {
            Ok(t) => Ok(Some(t)),
            Err(e) => {
                graph.device().give_back(copy, self.0.dtype, self.numel());
                Err(e)
            }
        }
    }

    /// Set the gradient to a tensor's values (computed now; same shape and
    /// dtype as the parameter). The next `step` uses it; `backward` adds to it.
    #[track_caller]
    pub fn set_grad_tensor(&self, value: crate::graph::Tensor<'_>) -> Result<()> {
        self.check_grad_shape("Param::set_grad_tensor", &value.dims(), value.dtype())?;
        let graph = value.graph();
        if !graph.device().same(&self.0.device) {
            return Err(Error::invalid("Param::set_grad_tensor", "the value lives on another device"));
        }
        graph.realize(&[value])?;
        let source =
            graph.value_buffer(value.id()).ok_or_else(|| Error::backend("Param::set_grad_tensor", "value missing"))?;
        let (dtype, len) = (self.0.dtype, self.numel());
        let target = self.0.device.take_buffer(dtype, len)?;
        let copied =
            self.0.device.backend().copy(source, target, dtype, len).and_then(|_| self.0.device.backend().flush());
        if let Err(e) = copied {
            self.0.device.give_back(target, dtype, len);
            return Err(e);
        }
        self.replace_grad_buffer(target);
        Ok(())
    }

    /// Multiply the accumulated gradient by `factor` on the device (no host
    /// round trip); nothing happens before any backward.
    #[track_caller]
    pub fn scale_grad(&self, factor: f64) -> Result<()> {
        if !factor.is_finite() {
            return Err(Error::invalid("Param::scale_grad", format!("factor {factor} must be finite")));
        }
        let Some(grad) = self.0.grad.get() else { return Ok(()) };
        let device = &self.0.device;
        let (dtype, len) = (self.0.dtype, self.numel());
        let out = device.take_buffer(dtype, len)?;
        let host = match dtype {
            DType::F64 => HostData::F64(vec![factor]),
            _ => HostData::F32(vec![factor as f32]),
        };
        let scalar = device.upload(&host)?;
        let dims = &self.0.dims;
        let inputs = [TensorRef { buffer: grad, dims, dtype }, TensorRef { buffer: scalar, dims: &[], dtype }];
        let call = KernelCall {
            op: Op::Binary(BinaryOp::Mul),
            inputs: &inputs,
            output: TensorRef { buffer: out, dims, dtype },
        };
        let run = device.backend().run(&call).and_then(|_| device.backend().flush());
        device.give_back(scalar, dtype, 1);
        if let Err(e) = run {
            device.give_back(out, dtype, len);
            return Err(e);
        }
        self.replace_grad_buffer(out);
        Ok(())
    }

    /// Add a gradient held in `buffer` (owned by the caller, who gives up
    /// ownership when `take` is true) to the accumulated gradient.
    pub(crate) fn accumulate_grad(&self, buffer: BufferId, take: bool) -> Result<()> {
        let device = &self.0.device;
        let len = self.numel();
        let dtype = self.0.dtype;
        match self.0.grad.get() {
            None if take => self.0.grad.set(Some(buffer)),
            None => {
                let copy = device.take_buffer(dtype, len)?;
                if let Err(e) = device.backend().copy(buffer, copy, dtype, len) {
                    device.give_back(copy, dtype, len);
                    return Err(e);
                }
                self.0.grad.set(Some(copy));
            }
            Some(old) => {
                let sum = device.take_buffer(dtype, len)?;
                let dims = &self.0.dims;
                let inputs = [TensorRef { buffer: old, dims, dtype }, TensorRef { buffer, dims, dtype }];
                let call = KernelCall {
                    op: Op::Binary(BinaryOp::Add),
                    inputs: &inputs,
                    output: TensorRef { buffer: sum, dims, dtype },
                };
                let run = device.backend().run(&call).and_then(|_| device.backend().flush());
                if let Err(e) = run {
                    device.give_back(sum, dtype, len);
                    return Err(e);
                }
                device.give_back(old, dtype, len);
                if take {
                    device.give_back(buffer, dtype, len);
                }
                self.0.grad.set(Some(sum));
            }
        }
        Ok(())
    }
}

impl Drop for ParamShared {
    fn drop(&mut self) {
        // The value buffer goes back with the last `Rc<ValueBuffer>`.
        let len = self.dims.iter().product();
        if let Some(grad) = self.grad.take() {
            self.device.give_back(grad, self.dtype, len);
        }
    }
}

impl std::fmt::Debug for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Param({} {} {})", self.name(), fmt_dims(&self.0.dims), self.0.dtype)
    }
}
