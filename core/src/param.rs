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
    value: BufferId,
    grad: Cell<Option<BufferId>>,
    requires_grad: Cell<bool>,
    /// Bumped by every in-place update; a graph that recorded an older
    /// version refuses to recompute from the changed value.
    version: Cell<u64>,
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
        let value = device.upload(&data).map_err(|e| e.for_op("Param").at(location))?;
        Ok(Param(Rc::new(ParamShared {
            device: device.clone(),
            name: RefCell::new(name.to_string()),
            dims: Dims::from_slice(dims),
            dtype: data.dtype(),
            value,
            grad: Cell::new(None),
            requires_grad: Cell::new(true),
            version: Cell::new(0),
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
        self.0.value
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
        self.0.device.backend().read(self.0.value, self.0.dtype, self.numel()).await
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
        self.0.device.backend().upload(self.0.value, data)?;
        self.bump_version();
        Ok(())
    }

    /// Replace the accumulated gradient with `data` (same dtype and size as
    /// the parameter). Data-parallel training writes the gradient averaged
    /// over all processes back this way; the optimizer then reads it as
    /// usual.
    #[track_caller]
    pub fn set_grad(&self, data: &HostData) -> Result<()> {
        if data.dtype() != self.0.dtype || data.len() != self.numel() {
            return Err(Error::shape(
                "Param::set_grad",
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
        backend.copy(source, self.0.value, self.0.dtype, self.numel())?;
        backend.flush()?;
        self.bump_version();
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
        let len = self.dims.iter().product();
        self.device.give_back(self.value, self.dtype, len);
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
