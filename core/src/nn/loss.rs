//! Loss functions, composed from primitive ops (their gradients follow).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;

#[track_caller]
fn check_logits_labels(op: &'static str, logits: &Tensor<'_>, labels: &Tensor<'_>) -> Result<(usize, usize)> {
    let (ld, yd) = (logits.dims(), labels.dims());
    // A wrong dtype is a DType error, as everywhere else (oneHot, casts).
    if !logits.dtype().is_float() {
        return Err(Error::dtype(op, format!("expects float scores, got {}", logits.dtype())));
    }
    if labels.dtype() != DType::I32 {
        return Err(Error::dtype(op, format!("expects i32 labels, got {}", labels.dtype())));
    }
    if ld.len() != 2 {
        return Err(Error::shape(op, format!("expects [batch, classes] scores, got {:?}", ld.as_slice())));
    }
    if yd.len() != 1 || yd[0] != ld[0] {
        return Err(Error::shape(op, format!("expects labels of shape [{}], got {:?}", ld[0], yd.as_slice())));
    }
    if ld[0] == 0 {
        return Err(Error::shape(op, "the batch is empty"));
    }
    Ok((ld[0], ld[1]))
}

/// Mean softmax cross-entropy of `logits` [N, C] against integer `labels` [N]
/// in 0..C. A label outside 0..C is an out-of-range error naming the label
/// and its row (`index L at position R`), raised when the loss is computed
/// (the labels' values are only known then), on every backend. Logits of
/// ±inf give PyTorch's values: a row [0, -inf] with label 0 costs 0.
#[track_caller]
pub fn cross_entropy<'g>(logits: Tensor<'g>, labels: Tensor<'g>) -> Result<Tensor<'g>> {
    check_logits_labels("cross_entropy", &logits, &labels)?;
    nll_loss(logits.log_softmax(-1)?, labels)
}

/// Mean cross-entropy against target probabilities [N, C] (rows sum to 1).
#[track_caller]
pub fn cross_entropy_probs<'g>(logits: Tensor<'g>, targets: Tensor<'g>) -> Result<Tensor<'g>> {
    if !logits.dtype().is_float() || logits.dtype() != targets.dtype() {
        return Err(Error::dtype(
            "cross_entropy_probs",
            format!("logits ({}) and targets ({}) must share one float dtype", logits.dtype(), targets.dtype()),
        ));
    }
    if logits.dims() != targets.dims() || logits.rank() != 2 {
        return Err(Error::shape(
            "cross_entropy_probs",
            format!(
                "logits {:?} and targets {:?} must both be [batch, classes]",
                logits.dims().as_slice(),
                targets.dims().as_slice()
            ),
        ));
    }
    let n = logits.dims()[0];
    logits.log_softmax(-1)?.mul(targets)?.sum_all()?.div(-(n as f64))
}

/// Mean negative log-likelihood of log-probabilities [N, C] at `labels` [N]
/// (labels checked as in `cross_entropy`).
#[track_caller]
pub fn nll_loss<'g>(log_probs: Tensor<'g>, labels: Tensor<'g>) -> Result<Tensor<'g>> {
    let (n, classes) = check_logits_labels("nll_loss", &log_probs, &labels)?;
    let picked = label_mask(labels, classes)?.where_(log_probs, 0.0)?;
    picked.sum_all()?.div(-(n as f64))
}

/// [N, C] bool, true at (row, label). Selecting (not multiplying by a one-hot
/// row) keeps a -inf log-probability off the unselected classes (-inf · 0 is
/// NaN). The labels pass through an IndexSelect of 0..C first: its
/// backend-side range check makes a label outside 0..C an error naming the
/// label and its row, at run time on every backend.
#[track_caller]
fn label_mask<'g>(labels: Tensor<'g>, classes: usize) -> Result<Tensor<'g>> {
    let graph = labels.graph();
    let class_ids = graph.arange(0.0, 1.0, classes, DType::I32)?;
    let checked = class_ids.index_select(0, labels)?;
    let n = labels.numel();
    checked.reshape_to(&[n, 1])?.eq(class_ids.reshape_to(&[1, classes])?)
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
