//! The gradient-check harness of every suite: a table of named cases (the
//! same `Case` type as the coverage matrix's sample cases,
//! `kiln::coverage::op_case`, made with the same `case()`), each checked to
//! first and — unless marked `first_order_only` — second order against
//! central finite differences; every failure is listed at the end, so one
//! broken rule does not hide another.

use kiln::gradcheck::{gradcheck, gradcheck_on, gradgradcheck, gradgradcheck_on};
// Re-exported for the suites; not every suite uses every name.
#[allow(unused_imports)]
pub use kiln::gradcheck::{case, BoxedFn, Case, CheckInput, GradcheckOptions};
use kiln::host_rng::SplitMix64;
use kiln::{DType, Device, Graph, Result, Tensor};

/// How large a suite's cases may be. A gradcheck evaluates the function
/// twice per input element (a gradgradcheck differentiates it again for
/// each), so the cost grows with the elements checked. Every suite's cap is
/// stated here, side by side, so that they cannot drift unnoticed.
#[derive(Clone, Copy, Debug)]
pub enum SizeCap {
    /// Elements over all inputs of a case.
    Total(usize),
    /// Elements of each input of a case.
    PerInput(usize),
}

/// Ops and composed layers on the CPU (gradcheck_ops.rs, transformer_ops.rs).
pub const CPU_CAP: SizeCap = SizeCap::Total(24);
/// Window ops on the CPU (conv_ops.rs): an image with channels and a kernel
/// do not fit in 24 elements together, so the cap is per input.
pub const WINDOW_CAP: SizeCap = SizeCap::PerInput(48);
/// Through wgpu (wgpu_gradcheck.rs): lavapipe is slow and every pipeline
/// compiles on first use.
pub const WGPU_CAP: SizeCap = SizeCap::Total(30);

/// Where a suite's analytic gradients are computed, with what tolerances,
/// and how large its cases may be.
pub struct Suite<'a> {
    /// None: analytic and numeric side both in f64 on the CPU. Some: the
    /// analytic side on this device in f32, the numeric side in f64 on the
    /// CPU (`gradcheck_on`).
    pub device: Option<&'a Device>,
    /// For the cases without options of their own.
    pub options: GradcheckOptions,
    pub cap: SizeCap,
}

impl Suite<'static> {
    /// f64 on the CPU with the default tolerances.
    pub fn cpu(cap: SizeCap) -> Suite<'static> {
        Suite { device: None, options: GradcheckOptions::default(), cap }
    }
}

impl<'a> Suite<'a> {
    /// The analytic side on `device` in f32.
    pub fn on(device: &'a Device, options: GradcheckOptions, cap: SizeCap) -> Suite<'a> {
        Suite { device: Some(device), options, cap }
    }

    fn check(&self, c: &Case, second: bool) -> Result<kiln::gradcheck::GradcheckReport> {
        let options = c.options.unwrap_or(self.options);
        let cpu = Device::cpu();
        match (self.device, second) {
            (None, false) => gradcheck(&cpu, &*c.build, &c.inputs, options),
            (None, true) => gradgradcheck(&cpu, &*c.build, &c.inputs, options),
            (Some(d), false) => gradcheck_on(&cpu, d, DType::F32, &*c.build, &c.inputs, options),
            (Some(d), true) => gradgradcheck_on(&cpu, d, DType::F32, &*c.build, &c.inputs, options),
        }
    }
}

/// Run every case of `cases` in `suite`; fail once at the end, listing
/// every failing check with its report.
#[track_caller]
pub fn run_all(suite: &Suite<'_>, cases: Vec<Case>) {
    let mut failures = Vec::new();
    let (mut ran, mut elements, mut worst) = (0, 0, 0.0f64);
    for c in &cases {
        match suite.cap {
            SizeCap::Total(max) => {
                assert!(c.elements() <= max, "case {} checks {} elements; keep gradchecks small", c.name, c.elements())
            }
            SizeCap::PerInput(max) => {
                for i in &c.inputs {
                    let n = i.values.len();
                    assert!(n <= max, "case {}: an input of {n} elements; keep gradchecks small", c.name);
                }
            }
        }
        let orders: &[(&str, bool)] =
            if c.second_order { &[("gradcheck", false), ("gradgradcheck", true)] } else { &[("gradcheck", false)] };
        for &(label, second) in orders {
            ran += 1;
            match suite.check(c, second) {
                Ok(report) if report.passed() && report.checked == c.elements() => {
                    elements += report.checked;
                    worst = worst.max(report.worst_ratio);
                }
                Ok(report) => failures.push(format!("{} [{label}]: {report}", c.name)),
                Err(e) => failures.push(format!("{} [{label}]: error: {e}", c.name)),
            }
        }
    }
    let device = suite.device.map_or_else(|| "the CPU in f64".to_string(), |d| d.name());
    eprintln!(
        "{} cases, {ran} checks, {elements} elements compared on {device}; worst passing error {worst:.3} of tolerance",
        cases.len()
    );
    assert!(ran > 0);
    assert!(failures.is_empty(), "{} of {ran} checks failed:\n  {}", failures.len(), failures.join("\n  "));
}

/// A function in a box (for the cases that are not built by `case`).
pub fn boxed(f: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>> + 'static) -> BoxedFn {
    Box::new(f)
}

/// Seeded values uniform in [low, high).
pub fn rand(dims: &[usize], low: f64, high: f64, seed: u64) -> CheckInput {
    CheckInput::random(dims, low, high, seed)
}

/// Magnitudes in [low, high) with random signs: away from zero.
pub fn away_from_zero(dims: &[usize], low: f64, high: f64, seed: u64) -> CheckInput {
    let mut rng = SplitMix64::new(seed);
    let n = dims.iter().product();
    let values = (0..n)
        .map(|_| {
            let m = rng.uniform(low, high);
            if rng.next_u64() & 1 == 0 {
                m
            } else {
                -m
            }
        })
        .collect();
    CheckInput::new(values, dims)
}

pub fn given(values: &[f64], dims: &[usize]) -> CheckInput {
    CheckInput::new(values.to_vec(), dims)
}

/// Distinct values (a seeded shuffle of -2.0, -1.9, ...): no two elements
/// closer than 0.1, so no window has a tie and ±1e-6 never changes an
/// arg-max.
pub fn distinct(dims: &[usize], seed: u64) -> CheckInput {
    let n: usize = dims.iter().product();
    let mut v: Vec<f64> = (0..n).map(|i| -2.0 + 0.1 * i as f64).collect();
    let mut rng = SplitMix64::new(seed);
    for i in (1..n).rev() {
        v.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    CheckInput::new(v, dims)
}
