//! Loss functions, composed from primitive ops (their gradients follow).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;

#[track_caller]
fn check_logits_labels(op: &'static str, logits: &Tensor<'_>, labels: &Tensor<'_>) -> Result<(usize, usize)> {
    let (ld, yd) = (logits.dims(), labels.dims());
    if ld.len() != 2 || !logits.dtype().is_float() {
        return Err(Error::shape(
            op,
            format!("expects [batch, classes] float scores, got {:?} {}", ld.as_slice(), logits.dtype()),
        ));
    }
    if labels.dtype() != DType::I32 || yd.len() != 1 || yd[0] != ld[0] {
        return Err(Error::shape(
            op,
            format!("expects i32 labels of shape [{}], got {:?} {}", ld[0], yd.as_slice(), labels.dtype()),
        ));
    }
    if ld[0] == 0 {
        return Err(Error::shape(op, "the batch is empty"));
    }
    Ok((ld[0], ld[1]))
}

/// Mean softmax cross-entropy of `logits` [N, C] against integer `labels` [N]
/// in 0..C. (A label outside 0..C selects nothing and contributes 0 loss:
/// validate labels when loading data.)
#[track_caller]
pub fn cross_entropy<'g>(logits: Tensor<'g>, labels: Tensor<'g>) -> Result<Tensor<'g>> {
    check_logits_labels("cross_entropy", &logits, &labels)?;
    nll_loss(logits.log_softmax(-1)?, labels)
}

/// Mean cross-entropy against target probabilities [N, C] (rows sum to 1).
#[track_caller]
pub fn cross_entropy_probs<'g>(logits: Tensor<'g>, targets: Tensor<'g>) -> Result<Tensor<'g>> {
    if logits.dims() != targets.dims() || logits.rank() != 2 || logits.dtype() != targets.dtype() {
        return Err(Error::shape(
            "cross_entropy_probs",
            format!(
                "logits {:?} {} and targets {:?} {} must both be [batch, classes] of one float dtype",
                logits.dims().as_slice(),
                logits.dtype(),
                targets.dims().as_slice(),
                targets.dtype()
            ),
        ));
    }
    let n = logits.dims()[0];
    logits.log_softmax(-1)?.mul(targets)?.sum_all()?.div(-(n as f64))
}

/// Mean negative log-likelihood of log-probabilities [N, C] at `labels` [N].
#[track_caller]
pub fn nll_loss<'g>(log_probs: Tensor<'g>, labels: Tensor<'g>) -> Result<Tensor<'g>> {
    let (n, classes) = check_logits_labels("nll_loss", &log_probs, &labels)?;
    let picked = log_probs.mul(labels.one_hot(classes, log_probs.dtype())?)?;
    picked.sum_all()?.div(-(n as f64))
}

/// Mean squared error.
#[track_caller]
pub fn mse_loss<'g>(prediction: Tensor<'g>, target: Tensor<'g>) -> Result<Tensor<'g>> {
    if prediction.dims() != target.dims() {
        return Err(Error::shape(
            "mse_loss",
            format!(
                "prediction {:?} and target {:?} differ in shape",
                prediction.dims().as_slice(),
                target.dims().as_slice()
            ),
        ));
    }
    prediction.sub(target)?.square()?.mean_all()
}
