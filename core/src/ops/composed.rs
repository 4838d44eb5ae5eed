//! Operations composed from the primitives. Their gradients come from the
//! primitives' rules; nothing here needs a rule of its own.

use std::panic::Location;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::op::Op;

use super::reduce::axis_set;

/// The longest row the LayerNorm primitive takes (longer rows compose):
/// 256 leaves of the summation rule, which one wgpu workgroup reduces in one
/// pass (rowwise norm kernels), on every backend alike.
pub(crate) const LAYER_NORM_MAX_ROW: usize = 256 * 128;

impl<'g> Tensor<'g> {
    /// Number of elements covered by `axes` (for means).
    #[track_caller]
    fn count_over(&self, op: &'static str, axes: &[isize]) -> Result<usize> {
        let dims = self.dims();
        let set = axis_set(op, axes, dims.len())?;
        Ok(set.iter(dims.len()).map(|a| dims[a]).product())
    }

    #[track_caller]
    fn require_float(&self, op: &'static str) -> Result<()> {
        if self.dtype().is_float() {
            Ok(())
        } else {
            Err(Error::dtype(op, format!("needs a float tensor, got {}", self.dtype())))
        }
    }

    #[track_caller]
    pub fn mean(self, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
        self.require_float("mean")?;
        let count = self.count_over("mean", axes)?;
        if count == 0 {
            return Err(Error::shape("mean", "mean over zero elements is undefined"));
        }
        self.sum(axes, keepdim)?.div(count as f64)
    }

    #[track_caller]
    pub fn mean_all(self) -> Result<Tensor<'g>> {
        let axes: Vec<isize> = (0..self.rank() as isize).collect();
        self.mean(&axes, false)
    }

    /// Variance over `axes` with `correction` subtracted from the count
    /// (1 = unbiased, as PyTorch's default; 0 = population variance).
    #[track_caller]
    pub fn var(self, axes: &[isize], keepdim: bool, correction: usize) -> Result<Tensor<'g>> {
        self.require_float("var")?;
        let count = self.count_over("var", axes)?;
        if count <= correction {
            return Err(Error::shape(
                "var",
                format!("{count} elements with correction {correction} leave no degrees of freedom"),
            ));
        }
        let centered = self.sub(self.mean(axes, true)?)?;
        centered.square()?.sum(axes, keepdim)?.div((count - correction) as f64)
    }

    #[track_caller]
    pub fn square(self) -> Result<Tensor<'g>> {
        self.mul(self)
    }

    /// Limit values to [min, max].
    #[track_caller]
    pub fn clamp(self, min: f64, max: f64) -> Result<Tensor<'g>> {
        if min > max {
            return Err(Error::invalid("clamp", format!("min {min} is greater than max {max}")));
        }
        self.maximum(min)?.minimum(max)
    }

    /// Softmax along `axis` (shifted by the detached maximum for stability;
    /// the shift does not change the value or the gradient).
    #[track_caller]
    pub fn softmax(self, axis: isize) -> Result<Tensor<'g>> {
        self.require_float("softmax")?;
        let shifted = self.sub(self.max(&[axis], true)?.detach()?)?;
        let e = shifted.exp()?;
        e.div(e.sum(&[axis], true)?)
    }

    #[track_caller]
    pub fn log_softmax(self, axis: isize) -> Result<Tensor<'g>> {
        self.require_float("log_softmax")?;
        let shifted = self.sub(self.max(&[axis], true)?.detach()?)?;
        shifted.sub(shifted.exp()?.sum(&[axis], true)?.log()?)
    }

    /// log(sum(exp(x))) over `axes`, computed stably. As in PyTorch, an
    /// infinite maximum is not subtracted (-inf - -inf is NaN): all -inf
    /// gives -inf, any +inf gives +inf.
    #[track_caller]
    pub fn logsumexp(self, axes: &[isize], keepdim: bool) -> Result<Tensor<'g>> {
        self.require_float("logsumexp")?;
        let m = self.max(axes, true)?.detach()?;
        let m = m.abs()?.eq(f64::INFINITY)?.where_(0.0, m)?;
        let lse = self.sub(m)?.exp()?.sum(axes, true)?.log()?.add(m)?;
        if keepdim {
            Ok(lse)
        } else {
            let dims = crate::shape::reduced_dims(&self.dims(), axis_set("logsumexp", axes, self.rank())?, false);
            lse.reshape_to(&dims)
        }
    }

    /// GELU, exact form: x · Φ(x) = x/2 · (1 + erf(x/√2)).
    #[track_caller]
    pub fn gelu(self) -> Result<Tensor<'g>> {
        self.require_float("gelu")?;
        self.unary(crate::op::UnaryOp::Gelu)
    }

    /// SiLU (swish): x · sigmoid(x).
    #[track_caller]
    pub fn silu(self) -> Result<Tensor<'g>> {
        self.require_float("silu")?;
        self.mul(self.sigmoid()?)
    }

    /// Leaky ReLU: x for x > 0, `slope`·x otherwise (the gradient at 0 is
    /// `slope`, as PyTorch's).
    #[track_caller]
    pub fn leaky_relu(self, slope: f64) -> Result<Tensor<'g>> {
        self.require_float("leaky_relu")?;
        if !slope.is_finite() {
            return Err(Error::invalid("leaky_relu", format!("slope {slope} must be finite")));
        }
        self.gt(0.0)?.where_(self, self.mul(slope)?)
    }

    /// ELU: x for x > 0, alpha·(exp(x) − 1) otherwise.
    #[track_caller]
    pub fn elu(self, alpha: f64) -> Result<Tensor<'g>> {
        self.require_float("elu")?;
        if !alpha.is_finite() {
            return Err(Error::invalid("elu", format!("alpha {alpha} must be finite")));
        }
        // expm1 of min(x, 0): the branch where() discards never overflows,
        // so its zero gradient is never 0 · inf; and expm1, not exp − 1,
        // which would give 0 for x = −1e-8 in f32 (the value is ≈ x there).
        let negative = self.minimum(0.0)?.expm1()?.mul(alpha)?;
        self.gt(0.0)?.where_(self, negative)
    }

    /// Softplus: log(1 + exp(beta·x)) / beta, computed as
    /// max(x, 0) + log1p(exp(−|z|)) / beta with z = beta·x, so that it
    /// neither overflows (not even beta·x) nor loses the small values
    /// (log1p: ≈ exp(−|z|) where 1 + exp(−|z|) rounds to 1), nor the
    /// gradient at 0 (which is exactly 1/2).
    #[track_caller]
    pub fn softplus(self, beta: f64) -> Result<Tensor<'g>> {
        self.require_float("softplus")?;
        if !(beta.is_finite() && beta > 0.0) {
            return Err(Error::invalid("softplus", format!("beta {beta} must be positive and finite")));
        }
        let z = if beta == 1.0 { self } else { self.mul(beta)? };
        let positive = self.gt(0.0)?;
        // -|z| and max(x, 0) written with where(), whose branch gradients
        // are exact (abs/maximum would send the whole gradient one way at 0).
        let minus_abs = positive.where_(z.neg()?, z)?;
        let relu = positive.where_(self, 0.0)?;
        let tail = minus_abs.exp()?.log1p()?;
        relu.add(if beta == 1.0 { tail } else { tail.div(beta)? })
    }

    /// Mish: x · tanh(softplus(x)).
    #[track_caller]
    pub fn mish(self) -> Result<Tensor<'g>> {
        self.require_float("mish")?;
        self.mul(self.softplus(1.0)?.tanh()?)
    }

    /// x / √(mean(x²) + eps) over the last `dims` axes (RMSNorm without
    /// its scale).
    #[track_caller]
    pub fn rms_norm(self, dims: usize, eps: f64) -> Result<Tensor<'g>> {
        self.require_float("rms_norm")?;
        if dims == 0 || dims > self.rank() || !(eps.is_finite() && eps > 0.0) {
            return Err(Error::invalid(
                "rms_norm",
                format!("needs 1 <= dims <= rank {} and eps > 0, got dims {dims}, eps {eps}", self.rank()),
            ));
        }
        let axes: Vec<isize> = (self.rank() - dims..self.rank()).map(|a| a as isize).collect();
        self.div(self.square()?.mean(&axes, true)?.add(eps)?.sqrt()?)
    }

    /// Layer normalisation over the last `dims` axes without weight or
    /// bias: (x − mean) / √(var + eps), the population variance over those
    /// axes (`nn::LayerNorm` adds the scale and shift).
    ///
    /// Natively one primitive (LayerNorm, its gradient the LayerNormBackward
    /// primitive) whose forward values are bit for bit those of the
    /// composed form below. Composed from ordinary ops instead (mean, sub,
    /// square, mean, add, sqrt, recip, mul) in the browser build (download
    /// size), with portable numerics (which must compute the browser's
    /// bits), on a backend without the kernels (wgpu for f64, custom
    /// backends) and for rows of more than `LAYER_NORM_MAX_ROW` elements.
    #[track_caller]
    pub fn layer_norm(self, dims: usize, eps: f64) -> Result<Tensor<'g>> {
        const OP: &str = "layer_norm";
        self.require_float(OP)?;
        if dims == 0 || dims > self.rank() || !(eps.is_finite() && eps > 0.0) {
            return Err(Error::invalid(
                OP,
                format!("needs 1 <= dims <= rank {} and eps > 0, got dims {dims}, eps {eps}", self.rank()),
            ));
        }
        let d = self.dims();
        let row: usize = d[d.len() - dims..].iter().product();
        if row == 0 {
            return Err(Error::shape(OP, format!("input {:?} has no elements to normalise over", d.as_slice())));
        }
        let backend = self.graph.device().backend();
        let primitive = Op::LayerNorm { eps };
        if row <= LAYER_NORM_MAX_ROW && !backend.portable_numerics() && backend.supports(&primitive, self.dtype()) {
            if dims == 1 {
                return self.layer_norm_rows(eps);
            }
            let rows = self.numel() / row;
            return self.reshape_to(&[rows, row])?.layer_norm_rows(eps)?.reshape_to(&d);
        }
        // One mean, whose centred values serve both the variance and the
        // output, and one reciprocal standard deviation per row (a multiply
        // per element, not a divide). The primitive computes exactly this.
        let axes: Vec<isize> = (d.len() - dims..d.len()).map(|a| a as isize).collect();
        let centered = self.sub(self.mean(&axes, true)?)?;
        let inv_std = centered.square()?.mean(&axes, true)?.add(eps)?.sqrt()?.recip()?;
        centered.mul(inv_std)
    }

    /// The LayerNorm primitive over the last axis (checked by the caller).
    #[track_caller]
    pub(crate) fn layer_norm_rows(self, eps: f64) -> Result<Tensor<'g>> {
        let d = self.dims();
        self.graph.record(Op::LayerNorm { eps }, &[self.id], &d, self.dtype(), Location::caller())
    }

    /// The LayerNormBackward primitive: the gradient of `layer_norm_rows`
    /// at `self` given `g` (same dims and dtype).
    #[track_caller]
    pub(crate) fn layer_norm_backward(self, g: Tensor<'g>, eps: f64) -> Result<Tensor<'g>> {
        const OP: &str = "LayerNormBackward";
        let d = self.dims();
        if g.dims() != d || g.dtype() != self.dtype() || d.is_empty() || d[d.len() - 1] == 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "x ({} {:?}) and g ({} {:?}) need the same dims and dtype and a non-empty last axis",
                    self.dtype(),
                    d.as_slice(),
                    g.dtype(),
                    g.dims().as_slice()
                ),
            ));
        }
        self.require_float(OP)?;
        self.graph.record(Op::LayerNormBackward { eps }, &[self.id, g.id], &d, self.dtype(), Location::caller())
    }

    /// Group normalisation without the affine part: the channels (axis 1)
    /// of an [N, C, ...] tensor are split into `groups`, each normalised to
    /// zero mean and unit (population) variance over its channels and
    /// positions.
    #[track_caller]
    pub fn group_norm(self, groups: usize, eps: f64) -> Result<Tensor<'g>> {
        self.require_float("group_norm")?;
        let d = self.dims();
        if d.len() < 2 || groups == 0 || d[1] % groups != 0 || !(eps.is_finite() && eps > 0.0) {
            return Err(Error::invalid(
                "group_norm",
                format!("needs [N, C, ...] with groups {groups} dividing C and eps {eps} > 0, got {:?}", d.as_slice()),
            ));
        }
        let per_group: usize = d[1] / groups * d[2..].iter().product::<usize>();
        if per_group == 0 {
            return Err(Error::shape("group_norm", format!("input {:?} has no elements per group", d.as_slice())));
        }
        let grouped = self.reshape_to(&[d[0], groups, per_group])?;
        let mean = grouped.mean(&[2], true)?;
        let var = grouped.var(&[2], true, 0)?;
        grouped.sub(mean)?.div(var.add(eps)?.sqrt()?)?.reshape_to(&d)
    }

    /// One-hot rows: an i32 label vector [n] becomes [n, classes] of `dtype`.
    /// A label outside 0..classes is an error naming the label and its
    /// position (as PyTorch's one_hot), not a row of zeros.
    #[track_caller]
    pub fn one_hot(self, classes: usize, dtype: DType) -> Result<Tensor<'g>> {
        if self.dtype() != DType::I32 {
            return Err(Error::dtype("one_hot", format!("labels must be an i32 tensor, got {}", self.dtype())));
        }
        if self.rank() != 1 {
            return Err(Error::shape("one_hot", format!("labels must be 1-D, got shape {:?}", self.dims().as_slice())));
        }
        let n = self.numel();
        // Gathering from a [classes] tensor range-checks every label on
        // every backend (IndexSelect's check, done where the labels are,
        // without a host round trip) and gives zeros; adding them leaves
        // the labels as they were.
        let classes_row = self.graph.arange(0.0, 1.0, classes, DType::I32)?.reshape_to(&[1, classes])?;
        let checked = self.graph.zeros(&[classes], DType::I32)?.index_select(0, self)?.add(self)?;
        checked.reshape_to(&[n, 1])?.eq(classes_row)?.cast(dtype)
    }
}
