//! Launches update.wgsl: fused SGD (plain, momentum, Nesterov) and
//! Adam/AdamW steps in place, hyper-parameters derived in f64 on the host
//! and rounded once to f32, as the CPU backend does.

use kiln_core::backend::{checks, BufferId, ParamUpdate};
use kiln_core::{DType, Error, Result};

use crate::geometry::word;
use crate::params::{words, Update};
use crate::shaders::Kernel;
use crate::{Arg, WgpuBackend};

const OP: &str = "update_param";

pub(crate) fn update(
    be: &WgpuBackend,
    upd: &ParamUpdate,
    param: BufferId,
    grad: BufferId,
    state: &[BufferId],
    dtype: DType,
    len: usize,
) -> Result<()> {
    if dtype != DType::F32 {
        return Err(if dtype == DType::F64 {
            crate::buffers::f64_refused(OP)
        } else {
            Error::dtype(OP, format!("cannot optimise a {dtype} parameter"))
        });
    }
    checks::update_state_count(upd, state.len())?;
    let f = |v: f64| v as f32;
    let buf = |id: BufferId, write: bool| Arg::Buffer { id, dtype, len, write };
    let n = word(OP, len)?;
    let groups = be.grid_for(OP, len)?;
    match *upd {
        ParamUpdate::Sgd { lr, momentum, dampening, weight_decay, nesterov } => {
            let flags = u32::from(weight_decay != 0.0) | (u32::from(nesterov) << 1);
            let params = Update {
                n,
                flags,
                lr: f(lr),
                weight_decay: f(weight_decay),
                momentum: f(momentum),
                one_minus_dampening: f(1.0 - dampening),
                ..Update::default()
            };
            let params = words(&params);
            if momentum == 0.0 {
                let args = [(1, buf(param, true)), (2, buf(grad, false))];
                be.launch(OP, Kernel::Update, "sgd", &args, params, groups)
            } else {
                let args = [(1, buf(param, true)), (2, buf(grad, false)), (3, buf(state[0], true))];
                be.launch(OP, Kernel::Update, "sgd_momentum", &args, params, groups)
            }
        }
        ParamUpdate::Adam { lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, step } => {
            if step == 0 {
                return Err(Error::invalid(OP, "Adam's step counts from 1"));
            }
            let steps = i32::try_from(step).unwrap_or(i32::MAX);
            let params = Update {
                n,
                flags: u32::from(decoupled_weight_decay),
                lr: f(lr),
                weight_decay: f(weight_decay),
                beta1: f(beta1),
                beta2: f(beta2),
                one_minus_beta1: f(1.0 - beta1),
                one_minus_beta2: f(1.0 - beta2),
                bias1: f(1.0 - beta1.powi(steps)),
                bias2: f(1.0 - beta2.powi(steps)),
                eps: f(eps),
                decay_factor: f(1.0 - lr * weight_decay),
                ..Update::default()
            };
            let args =
                [(1, buf(param, true)), (2, buf(grad, false)), (3, buf(state[0], true)), (4, buf(state[1], true))];
            be.launch(OP, Kernel::Update, "adam", &args, words(&params), groups)
        }
    }
}
