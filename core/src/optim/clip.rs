//! Gradient clipping over many parameters at once, on the device.
//!
//! One small graph reads every gradient buffer in place (no copies, no
//! host round trip per tensor), computes the global norm and the clipped
//! gradients, and hands the new buffers to the parameters. The only value
//! read back is the total norm, once.

use std::panic::Location;

use crate::error::{Error, Result};
use crate::graph::{Graph, Tensor};
use crate::param::Param;

/// The parameters that have a gradient, all on one device.
#[track_caller]
fn with_grads(op: &'static str, params: &[Param]) -> Result<Vec<Param>> {
    let present: Vec<Param> = params.iter().filter(|p| p.has_grad()).cloned().collect();
    if let Some(first) = present.first() {
        if let Some(other) = present.iter().find(|p| !p.device().same(first.device())) {
            return Err(Error::invalid(
                op,
                format!("parameters '{}' and '{}' live on different devices", first.name(), other.name()),
            ));
        }
    }
    Ok(present)
}

/// Run `f` over leaves that read each parameter's gradient buffer in place,
/// then give each parameter the buffer of its new gradient. `f` returns the
/// new gradients and extra tensors whose buffers are handed back.
#[track_caller]
fn rewrite_grads(
    op: &'static str,
    params: &[Param],
    f: impl for<'g> FnOnce(&'g Graph, &[Tensor<'g>]) -> Result<(Vec<Tensor<'g>>, Vec<Tensor<'g>>)>,
) -> Result<Vec<(crate::backend::BufferId, crate::dtype::DType)>> {
    let location = Location::caller();
    let device = params[0].device().clone();
    let graph = Graph::new(&device);
    let no_grad = graph.no_grad();
    let mut leaves: Vec<Tensor<'_>> = Vec::with_capacity(params.len());
    for p in params {
        let Some(buffer) = p.grad_buffer() else {
            return Err(Error::backend(op, format!("parameter '{}' lost its gradient", p.name())).at(location));
        };
        leaves.push(graph.borrowed_leaf(buffer, &p.dims(), p.dtype(), location)?);
    }
    let (new_grads, extra) = f(&graph, &leaves).map_err(|e| e.at(location))?;
    let mut targets = new_grads.clone();
    targets.extend(&extra);
    graph.realize(&targets).map_err(|e| e.at(location))?;
    let mut buffers = Vec::with_capacity(targets.len());
    for t in &targets {
        match graph.take_value(t.id()) {
            Some(b) => buffers.push((b, t.dtype())),
            None => {
                for (b, t) in buffers.iter().zip(&targets) {
                    device.give_back(b.0, t.dtype(), t.numel());
                }
                return Err(Error::backend(op, "a clipped gradient was not computed").at(location));
            }
        }
    }
    drop(no_grad);
    drop(graph);
    let extra_buffers = buffers.split_off(params.len());
    for (p, (buffer, _)) in params.iter().zip(buffers) {
        p.replace_grad_buffer(buffer);
    }
    Ok(extra_buffers)
}

/// Scale all gradients together so that their global `norm_type`-norm
/// (2.0 for Euclidean, `f64::INFINITY` for the largest magnitude) is at
/// most `max_norm`: each gradient is multiplied by
/// min(1, max_norm / (total + 1e-6)), as PyTorch's `clip_grad_norm_`.
///
/// The clipping happens on the device when this is called; the returned
/// future only reads the total norm before clipping (the one value that
/// comes back to the host: `kiln::clip_grad_norm` waits for it). Parameters
/// without a gradient are skipped.
#[track_caller]
pub fn clip_grad_norm(
    params: &[Param],
    max_norm: f64,
    norm_type: f64,
) -> Result<impl std::future::Future<Output = Result<f64>>> {
    const OP: &str = "clip_grad_norm";
    if !(max_norm.is_finite() && max_norm >= 0.0) {
        return Err(Error::invalid(OP, format!("max_norm {max_norm} must be finite and >= 0")));
    }
    if !(norm_type == f64::INFINITY || (norm_type.is_finite() && norm_type > 0.0)) {
        return Err(Error::invalid(OP, format!("norm_type {norm_type} must be positive (or infinity)")));
    }
    let params = with_grads(OP, params)?;
    let read = if params.is_empty() {
        None
    } else {
        let extra = rewrite_grads(OP, &params, |_, grads| {
            let dtype = grads[0].dtype();
            let partials: Vec<Tensor<'_>> = grads
                .iter()
                .map(|g| {
                    let g = if g.dtype() == dtype { *g } else { g.cast(dtype)? };
                    let part = if norm_type == f64::INFINITY {
                        g.abs()?.max_all()?
                    } else if norm_type == 2.0 {
                        g.square()?.sum_all()?
                    } else {
                        g.abs()?.pow(norm_type)?.sum_all()?
                    };
                    part.reshape_to(&[1])
                })
                .collect::<Result<_>>()?;
            let joined = Tensor::concat(&partials, 0)?;
            let total = if norm_type == f64::INFINITY {
                joined.max_all()?
            } else if norm_type == 2.0 {
                joined.sum_all()?.sqrt()?
            } else {
                joined.sum_all()?.pow(1.0 / norm_type)?
            };
            let coef = total.add(1e-6)?.recip()?.mul(max_norm)?.minimum(1.0)?;
            let new_grads = grads
                .iter()
                .map(|g| g.mul(if coef.dtype() == g.dtype() { coef } else { coef.cast(g.dtype())? }))
                .collect::<Result<Vec<_>>>()?;
            Ok((new_grads, vec![total]))
        })?;
        let (buffer, dtype) = extra[0];
        let device = params[0].device().clone();
        // The backend snapshots the buffer when `read` is called, so it can
        // go back to the pool right away.
        let future = device.backend().read(buffer, dtype, 1);
        device.give_back(buffer, dtype, 1);
        Some(future)
    };
    Ok(async move {
        match read {
            None => Ok(0.0),
            Some(future) => Ok(future.await?.to_f64_vec()[0]),
        }
    })
}

/// Clamp every gradient element to [-clip, clip] (PyTorch's
/// `clip_grad_value_`), on the device.
#[track_caller]
pub fn clip_grad_value(params: &[Param], clip: f64) -> Result<()> {
    const OP: &str = "clip_grad_value";
    if !(clip.is_finite() && clip >= 0.0) {
        return Err(Error::invalid(OP, format!("clip {clip} must be finite and >= 0")));
    }
    let params = with_grads(OP, params)?;
    if params.is_empty() {
        return Ok(());
    }
    rewrite_grads(OP, &params, |_, grads| {
        let new_grads = grads.iter().map(|g| g.clamp(-clip, clip)).collect::<Result<Vec<_>>>()?;
        Ok((new_grads, Vec::new()))
    })?;
    Ok(())
}
