//! kiln: train neural networks in Rust on every machine.
//!
//! This crate is what applications depend on. It re-exports the engine
//! (`kiln-core`) and adds what only native programs can do: block on the
//! engine's asynchronous reads (`Blocking`), and pick a device.
//!
//! ```
//! use kiln::prelude::*;
//!
//! # fn main() -> kiln::Result<()> {
//! let device = Device::cpu();
//! let model = Sequential::mlp(&device, &[2, 8, 1], Activation::Tanh, 0)?;
//! let mut optimizer = Adam::new(model.parameters(), 0.05)?;
//! let inputs = [0.0f32, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0];
//! let targets = [0.0f32, 1.0, 1.0, 0.0];
//! let mut graph = Graph::new(&device);
//! for _ in 0..300 {
//!     graph.reset();
//!     let x = graph.tensor_from(&inputs, &[4, 2])?;
//!     let y = graph.tensor_from(&targets, &[4, 1])?;
//!     let loss = mse_loss(model.forward(x)?, y)?;
//!     optimizer.zero_grad();
//!     loss.backward()?;
//!     optimizer.step()?;
//! }
//! graph.reset();
//! let x = graph.tensor_from(&inputs, &[4, 2])?;
//! let y = graph.tensor_from(&targets, &[4, 1])?;
//! assert!(mse_loss(model.forward(x)?, y)?.item_blocking()? < 0.05);
//! # Ok(())
//! # }
//! ```

// The engine's API, by name. Not re-exported: what only a backend needs
// (`kiln_core::backend`'s contract, the op table's attribute types, the
// memory pool), the generator of random tensors (`kiln_core::tensor_rng`),
// and the engine's async `checkpoint`/`gradcheck` functions, whose blocking
// forms are `kiln::checkpoint` and `kiln::gradcheck` below.
pub use kiln_core::autograd::{checkpoint, checkpoint_many, custom_vjp, custom_vjp_many, VjpBackward};
pub use kiln_core::op::Family;
pub use kiln_core::{coverage, data, host_rng, nn, op_profile, optim, shape};
pub use kiln_core::{
    on_cpu_pool, AxisSet, Backend, BackwardOptions, BinaryOp, BufferId, CompareOp, CpuNumerics, DType, Device, Dims,
    Element, Error, ErrorKind, ExecStats, Graph, HostData, IntoOperand, NoGradGuard, Op, OpInfo, Param, ParamUpdate,
    ParamUpdateCall, PoolStats, ReduceOp, Result, SliceSpec, Tensor, TensorId, UnaryOp, Window2d,
};

// Lets `#[derive(Module)]`'s generated `::kiln::...` paths resolve inside
// this crate too.
extern crate self as kiln;

pub mod checkpoint;
pub mod devices;
pub mod distributed;
pub mod gpt;

// The `kiln` binary's own modules (`kiln train`, `kiln bench`): public only
// because the binary and its end-to-end tests are separate crates; not API,
// free to change with the command line. `evaluate` is the one piece
// programs use, re-exported below.
#[doc(hidden)]
pub mod bench;
#[doc(hidden)]
pub mod models;
#[doc(hidden)]
pub mod snapshot;
#[doc(hidden)]
pub mod train;

pub use devices::DeviceSelection;
pub use kiln_wgsl::{WgpuBackend, WgpuOptions};
/// Test-set accuracy of a classifier, in [0, 1] (no gradients recorded).
pub use train::evaluate;

/// Everything a training program usually needs.
pub mod prelude {
    pub use crate::{clip_grad_norm, Blocking, BlockingParam, DeviceSelection};
    pub use kiln_core::nn::{
        cross_entropy, cross_entropy_probs, init, mse_loss, nll_loss, scaled_dot_product_attention, Activation,
        AdaptiveAvgPool2d, AttentionDropout, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d, ConvOptions, ConvTranspose2d,
        Dropout, Embedding, Flatten, GroupNorm, KvCache, LayerNorm, LeakyReLU, Linear, MaxPool2d, Mish, Module,
        MultiheadAttention, RMSNorm, Sequential, Softplus, TransformerBlock, Unflatten, ELU,
    };
    pub use kiln_core::optim::{
        clip_grad_value, Adam, LrScheduler, Optimizer, OptimizerState, ParamGroup, Schedule, Sgd,
    };
    pub use kiln_core::{DType, Device, Error, Graph, HostData, Param, Result, SliceSpec, Tensor};
}

/// Clip the global gradient norm of `params` to `max_norm` (on the device)
/// and return the norm before clipping: PyTorch's `clip_grad_norm_`. See
/// `kiln_core::optim::clip_grad_norm`; this waits for the one value read
/// back.
#[track_caller]
pub fn clip_grad_norm(params: &[Param], max_norm: f64, norm_type: f64) -> Result<f64> {
    let location = std::panic::Location::caller();
    let read = kiln_core::optim::clip_grad_norm(params, max_norm, norm_type)?;
    pollster::block_on(read).map_err(|e| e.at(location))
}

/// Blocking reads for native programs. The engine's reads are futures (a
/// browser must never block); natively we simply wait for them.
/// Errors point at the caller's line (`#[track_caller]` on the
/// declarations applies to the implementations).
pub trait Blocking {
    /// All values, as `T` (which must match the dtype).
    #[track_caller]
    fn to_vec_blocking<T: Element>(&self) -> Result<Vec<T>>;
    /// The value of a one-element tensor.
    #[track_caller]
    fn item_blocking(&self) -> Result<f64>;
}

impl Blocking for Tensor<'_> {
    fn to_vec_blocking<T: Element>(&self) -> Result<Vec<T>> {
        pollster::block_on(self.to_vec::<T>())
    }
    fn item_blocking(&self) -> Result<f64> {
        pollster::block_on(self.item())
    }
}

/// Blocking reads of parameters.
pub trait BlockingParam {
    #[track_caller]
    fn value_blocking(&self) -> Result<HostData>;
    #[track_caller]
    fn grad_blocking(&self) -> Result<Option<HostData>>;
}

impl BlockingParam for Param {
    fn value_blocking(&self) -> Result<HostData> {
        let caller = std::panic::Location::caller();
        pollster::block_on(self.value()).map_err(|e| e.or_at(caller))
    }
    fn grad_blocking(&self) -> Result<Option<HostData>> {
        let caller = std::panic::Location::caller();
        pollster::block_on(self.grad()).map_err(|e| e.or_at(caller))
    }
}

/// User-defined ops (see `kiln_core::op::custom`): define one with
/// `CustomOpBuilder`, apply it with `CustomOp::apply`, check it with
/// `check_custom_op`.
pub mod custom {
    pub use kiln_core::op::custom::wgsl::PRELUDE as WGSL_PRELUDE;
    pub use kiln_core::op::custom::{
        find, reference, registered, CustomBackward, CustomCheckOptions, CustomOpReport, HostSlice, HostSliceMut,
        HostView, HostViewMut, Parity, TensorMeta, WgslKernel, MAX_CUSTOM_ARITY,
    };
    pub use kiln_core::op::{CustomOp, CustomOpBuilder};

    use crate::gradcheck::CheckInput;
    use crate::{Device, DeviceSelection, Result};

    /// Check a custom op: its forward on a wgpu device, when this machine
    /// has one, against the CPU forward, and its gradient against finite
    /// differences (first and second order in f64 on the CPU; the f32
    /// gradient computed on wgpu). Read the outcome with
    /// `report.passed()`; printing the report says what was compared.
    /// Without a wgpu adapter only the CPU checks run (`parity` is empty).
    #[track_caller]
    pub fn check_custom_op(op: CustomOp, inputs: &[CheckInput]) -> Result<CustomOpReport> {
        let location = std::panic::Location::caller();
        let devices: Vec<Device> = Device::from_name("wgpu").into_iter().collect();
        check_custom_op_with(op, inputs, &devices, CustomCheckOptions::default()).map_err(|e| e.at(location))
    }

    /// `check_custom_op` on the given devices with the given tolerances
    /// (`gradients: false` for a backward that is deliberately not the
    /// derivative, such as a straight-through estimator).
    pub fn check_custom_op_with(
        op: CustomOp,
        inputs: &[CheckInput],
        devices: &[Device],
        options: CustomCheckOptions,
    ) -> Result<CustomOpReport> {
        pollster::block_on(kiln_core::op::custom::check_custom_op(op, inputs, devices, options))
    }
}

/// Blocking gradient checks (see `kiln_core::gradcheck`).
pub mod gradcheck {
    pub use kiln_core::gradcheck::{case, BoxedFn, Case, CheckInput, GradcheckOptions, GradcheckReport, Mismatch};
    use kiln_core::{Device, Graph, Result, Tensor};

    pub fn gradcheck(
        device: &Device,
        f: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
        inputs: &[CheckInput],
        options: GradcheckOptions,
    ) -> Result<GradcheckReport> {
        pollster::block_on(kiln_core::gradcheck::gradcheck(device, f, inputs, options))
    }

    /// Analytic gradients on `device` in `dtype` (f32 on a GPU), central
    /// differences in f64 on `reference`.
    pub fn gradcheck_on(
        reference: &Device,
        device: &Device,
        dtype: kiln_core::DType,
        f: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
        inputs: &[CheckInput],
        options: GradcheckOptions,
    ) -> Result<GradcheckReport> {
        pollster::block_on(kiln_core::gradcheck::gradcheck_on(reference, device, dtype, f, inputs, options))
    }

    /// Second order, analytic side on `device` in `dtype`.
    pub fn gradgradcheck_on(
        reference: &Device,
        device: &Device,
        dtype: kiln_core::DType,
        f: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
        inputs: &[CheckInput],
        options: GradcheckOptions,
    ) -> Result<GradcheckReport> {
        pollster::block_on(kiln_core::gradcheck::gradgradcheck_on(reference, device, dtype, f, inputs, options))
    }

    pub fn gradgradcheck(
        device: &Device,
        f: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
        inputs: &[CheckInput],
        options: GradcheckOptions,
    ) -> Result<GradcheckReport> {
        pollster::block_on(kiln_core::gradcheck::gradgradcheck(device, f, inputs, options))
    }
}
