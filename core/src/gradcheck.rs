//! Checking gradients against central finite differences.
//!
//! `gradcheck` compares the analytic gradient (one backward through the
//! rules) with (s(x + ε) − s(x − ε)) / 2ε per input element, in f64, where
//! s = Σ f(x)·r for a fixed random projection r (so one scalar covers every
//! output element). `gradgradcheck` does the same for the gradient itself,
//! which exercises every rule's own rule: second derivatives.

use crate::device::Device;
use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::graph::{Graph, Tensor};
use crate::host_rng::SplitMix64;

/// Tolerances: an element passes when |numeric − analytic| ≤ atol + rtol·|analytic|.
#[derive(Clone, Copy, Debug)]
pub struct GradcheckOptions {
    pub eps: f64,
    pub atol: f64,
    pub rtol: f64,
    /// Seed of the output projection.
    pub seed: u64,
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions { eps: 1e-6, atol: 1e-6, rtol: 1e-4, seed: 0x6b69_6c6e }
    }
}

/// The worst element found.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// Which input.
    pub input: usize,
    /// Multi-index within that input.
    pub index: Vec<usize>,
    pub numeric: f64,
    pub analytic: f64,
}

#[derive(Clone, Debug)]
pub struct GradcheckReport {
    /// Elements compared.
    pub checked: usize,
    /// The element with the largest error relative to its tolerance.
    pub worst: Option<Mismatch>,
    /// That element's |numeric − analytic| / (atol + rtol·|analytic|); ≤ 1 passes.
    pub worst_ratio: f64,
}

impl GradcheckReport {
    pub fn passed(&self) -> bool {
        self.worst_ratio <= 1.0
    }
}

impl std::fmt::Display for GradcheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.worst {
            None => write!(f, "gradcheck: nothing to check"),
            Some(m) => write!(
                f,
                "gradcheck {} ({} elements): worst at input {} index {:?}: numeric {:.9e} vs analytic {:.9e} ({:.3} of tolerance)",
                if self.passed() { "passed" } else { "FAILED" },
                self.checked,
                m.input,
                m.index,
                m.numeric,
                m.analytic,
                self.worst_ratio
            ),
        }
    }
}

/// An input to a checked function: f64 values and dims.
#[derive(Clone, Debug)]
pub struct CheckInput {
    pub values: Vec<f64>,
    pub dims: Vec<usize>,
}

impl CheckInput {
    pub fn new(values: Vec<f64>, dims: &[usize]) -> CheckInput {
        CheckInput { values, dims: dims.to_vec() }
    }
    /// Seeded values uniform in [low, high).
    pub fn random(dims: &[usize], low: f64, high: f64, seed: u64) -> CheckInput {
        let mut rng = SplitMix64::new(seed);
        let n = dims.iter().product();
        CheckInput { values: (0..n).map(|_| rng.uniform(low, high)).collect(), dims: dims.to_vec() }
    }
}

fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut index = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        index[i] = flat % dims[i].max(1);
        flat /= dims[i].max(1);
    }
    index
}

/// The checked function: builds a tensor from input variables.
pub trait CheckedFn: for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>> {}
impl<F> CheckedFn for F where F: for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>> {}

/// A checked function in a box, so that cases of different functions fit
/// in one list.
pub type BoxedFn = Box<dyn for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>>;

/// One named gradient check: f64 inputs, the function, whether the second
/// derivative is checked too, and tolerances of its own if it needs them.
/// The coverage matrix's sample cases (`coverage::op_case`) and the test
/// suites' tables are lists of these, made with [`case`].
pub struct Case {
    pub name: String,
    pub inputs: Vec<CheckInput>,
    pub build: BoxedFn,
    /// Check `gradgradcheck` as well as `gradcheck` (the default).
    pub second_order: bool,
    /// None: whatever the runner uses (`GradcheckOptions::default()` for
    /// the coverage matrix).
    pub options: Option<GradcheckOptions>,
}

/// A case checked to first and second order with the runner's options.
pub fn case(
    name: impl Into<String>,
    inputs: Vec<CheckInput>,
    build: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>> + 'static,
) -> Case {
    Case { name: name.into(), inputs, build: Box::new(build), second_order: true, options: None }
}

impl Case {
    /// Only the first derivative is checked (e.g. at a point where the
    /// second derivative has a kink, or where a second order costs too much).
    pub fn first_order_only(mut self) -> Case {
        self.second_order = false;
        self
    }
    /// Tolerances of this case's own.
    pub fn options(mut self, options: GradcheckOptions) -> Case {
        self.options = Some(options);
        self
    }
    /// Elements checked: the sum over inputs.
    pub fn elements(&self) -> usize {
        self.inputs.iter().map(|i| i.values.len()).sum()
    }
}

/// Host data of `dtype` (f32 or f64) from f64 values.
fn host_values(values: Vec<f64>, dtype: DType) -> Result<HostData> {
    match dtype {
        DType::F64 => Ok(HostData::F64(values)),
        DType::F32 => Ok(HostData::F32(values.into_iter().map(|v| v as f32).collect())),
        other => Err(Error::dtype("gradcheck", format!("can only check float functions, not {other}"))),
    }
}

/// A fixed random projection for a tensor of `dims`, in `dtype`.
fn projection<'g>(graph: &'g Graph, dims: &[usize], dtype: DType, seed: u64) -> Result<Tensor<'g>> {
    let mut rng = SplitMix64::new(seed);
    let r: Vec<f64> = (0..dims.iter().product()).map(|_| rng.uniform(0.5, 1.5)).collect();
    graph.from_host(host_values(r, dtype)?, dims)
}

/// s(x) = Σ f(x)·r, with r drawn once per output shape from `seed`.
fn projected<'g>(graph: &'g Graph, f: &dyn CheckedFn, xs: &[Tensor<'g>], seed: u64) -> Result<Tensor<'g>> {
    let y = f(graph, xs)?;
    if !y.dtype().is_float() {
        return Err(Error::dtype("gradcheck", format!("the function returned {}; it must be float", y.dtype())));
    }
    y.mul(projection(graph, &y.dims(), y.dtype(), seed)?)?.sum_all()
}

fn variables<'g>(graph: &'g Graph, inputs: &[CheckInput], dtype: DType) -> Result<Vec<Tensor<'g>>> {
    inputs.iter().map(|x| graph.variable_from_host(host_values(x.values.clone(), dtype)?, &x.dims)).collect()
}

/// d root / d xs. A root that does not depend on the inputs at all (the
/// derivative of a linear function, in gradgradcheck) has zero gradients;
/// `Graph::grad` refuses such a root, so handle it here.
fn gradients_or_zeros<'g>(graph: &'g Graph, root: Tensor<'g>, xs: &[Tensor<'g>]) -> Result<Vec<Tensor<'g>>> {
    if root.requires_grad() {
        graph.grad(root, xs, None)
    } else {
        xs.iter().map(|x| graph.zeros(&x.dims(), x.dtype())).collect()
    }
}

/// Compare analytic and numeric gradients of `f` at `inputs`, both in f64
/// on `device`.
pub async fn gradcheck(
    device: &Device,
    f: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
    inputs: &[CheckInput],
    options: GradcheckOptions,
) -> Result<GradcheckReport> {
    gradcheck_on(device, device, DType::F64, f, inputs, options).await
}

/// Compare the analytic gradient computed on `device` in `dtype` (e.g. a
/// GPU, which has no f64) with central differences computed in f64 on
/// `reference` (the CPU). Tolerances must allow for `dtype`'s precision.
pub async fn gradcheck_on(
    reference: &Device,
    device: &Device,
    dtype: DType,
    f: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
    inputs: &[CheckInput],
    options: GradcheckOptions,
) -> Result<GradcheckReport> {
    // Analytic: one differentiable gradient per input.
    let analytic: Vec<Vec<f64>> = {
        let graph = Graph::new(device);
        let xs = variables(&graph, inputs, dtype)?;
        let s = projected(&graph, &f, &xs, options.seed)?;
        let grads = gradients_or_zeros(&graph, s, &xs)?;
        let mut out = Vec::new();
        for g in grads {
            out.push(g.to_host().await?.to_f64_vec());
        }
        out
    };
    let eval = |values: Vec<CheckInput>| {
        let f = &f;
        async move {
            let graph = Graph::new(reference);
            let xs = variables(&graph, &values, DType::F64)?;
            projected(&graph, f, &xs, options.seed)?.item().await
        }
    };
    let mut report = GradcheckReport { checked: 0, worst: None, worst_ratio: 0.0 };
    for (i, input) in inputs.iter().enumerate() {
        for j in 0..input.values.len() {
            let mut plus = inputs.to_vec();
            plus[i].values[j] += options.eps;
            let mut minus = inputs.to_vec();
            minus[i].values[j] -= options.eps;
            let numeric = (eval(plus).await? - eval(minus).await?) / (2.0 * options.eps);
            let analytic = analytic[i][j];
            let ratio = (numeric - analytic).abs() / (options.atol + options.rtol * analytic.abs());
            let ratio = if ratio.is_nan() { f64::INFINITY } else { ratio };
            report.checked += 1;
            if report.worst.is_none() || ratio > report.worst_ratio {
                report.worst_ratio = ratio;
                report.worst = Some(Mismatch { input: i, index: unravel(j, &input.dims), numeric, analytic });
            }
        }
    }
    Ok(report)
}

/// Second order: gradcheck of x ↦ Σᵢ ⟨∂s/∂xᵢ, rᵢ⟩, whose analytic gradient
/// runs every rule's own gradient rule.
pub async fn gradgradcheck(
    device: &Device,
    f: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
    inputs: &[CheckInput],
    options: GradcheckOptions,
) -> Result<GradcheckReport> {
    gradgradcheck_on(device, device, DType::F64, f, inputs, options).await
}

/// Second order with the analytic side on `device` in `dtype` (see
/// `gradcheck_on`).
pub async fn gradgradcheck_on(
    reference: &Device,
    device: &Device,
    dtype: DType,
    f: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
    inputs: &[CheckInput],
    options: GradcheckOptions,
) -> Result<GradcheckReport> {
    let seed = options.seed;
    gradcheck_on(reference, device, dtype, move |graph, xs| first_derivative(&f, seed, graph, xs), inputs, options)
        .await
}

fn first_derivative<'g>(f: &dyn CheckedFn, seed: u64, graph: &'g Graph, xs: &[Tensor<'g>]) -> Result<Tensor<'g>> {
    let s = projected(graph, f, xs, seed)?;
    let grads = gradients_or_zeros(graph, s, xs)?;
    let mut total: Option<Tensor<'g>> = None;
    for (k, g) in grads.into_iter().enumerate() {
        let r = projection(graph, &g.dims(), g.dtype(), seed ^ (0x5eed + k as u64))?;
        let term = g.mul(r)?.sum_all()?;
        total = Some(match total {
            None => term,
            Some(t) => t.add(term)?,
        });
    }
    total.ok_or_else(|| Error::invalid("gradgradcheck", "no inputs"))
}
