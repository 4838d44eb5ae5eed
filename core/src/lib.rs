//! kiln-core: the engine behind kiln.
//!
//! See DESIGN.md for the architecture: a lazy arena graph (`graph`), gradient
//! rules written as forward ops (`autograd`), an executor that frees buffers
//! at their last use (`exec`), the `Backend` contract and the CPU backend
//! (`backend`), and the training stack (`nn`, `optim`, `data`).

// The multi-threaded browser build (wasm32 with shared memory; built with
// a pinned nightly, web/scripts/build.mjs) sleeps its Worker threads with
// memory.atomic.wait32, still unstable in core::arch (backend/cpu/threads.rs).
#![cfg_attr(all(target_arch = "wasm32", target_feature = "atomics"), feature(stdarch_wasm_atomic_wait))]

pub mod autograd;
pub mod backend;
pub mod checkpoint;
pub mod compile;
pub mod coverage;
mod cpu_pool;
pub mod data;
pub mod device;
pub mod dtype;
pub mod error;
mod exec;
pub mod gradcheck;
pub mod graph;
pub mod host_rng;
pub mod memory;
pub mod nn;
pub mod op;
#[cfg(not(target_arch = "wasm32"))]
pub mod op_profile;
mod ops;
pub mod optim;
pub mod param;
pub mod shape;
pub mod small;
pub mod tensor_rng;

pub use autograd::{checkpoint, checkpoint_many, custom_vjp, custom_vjp_many, BackwardOptions};
pub use backend::cpu::CpuNumerics;
pub use backend::{Backend, BufferId, Concurrency, KernelCall, ParamUpdate, ParamUpdateCall, TensorRef};
pub use compile::Compiled;
pub use cpu_pool::on_cpu_pool;
pub use device::{Device, ExecStats, PoolStats};
pub use dtype::{DType, Element, HostData};
pub use error::{Error, ErrorKind, Result};
pub use graph::{Graph, NoGradGuard, NodeId, Tensor, TensorId};
pub use op::{BinaryOp, CompareOp, Op, OpInfo, Perm, ReduceOp, SliceAttr, UnaryOp, Window2d};
pub use ops::{IntoOperand, SliceSpec};
pub use param::Param;
pub use shape::{AxisSet, Dims};
