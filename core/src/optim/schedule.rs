//! Learning-rate schedules. A `Schedule` is a pure function from the step
//! count to a factor of each group's base learning rate (PyTorch's
//! `LambdaLR` view of every scheduler); schedules compose (`then`,
//! `times`), and an `LrScheduler` applies one to an optimizer and keeps
//! the step count that a checkpoint saves.

use std::f64::consts::PI;

use super::Optimizer;
use crate::error::{Error, Result};

/// A learning-rate factor as a function of the step (0 before the first
/// optimizer step).
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    /// Always 1.
    Constant,
    /// From `start_factor` up to 1 linearly over `steps`, then 1
    /// (PyTorch's `LinearLR` with end_factor 1).
    LinearWarmup { steps: u64, start_factor: f64 },
    /// From 1 down to `min_factor` along half a cosine over `steps`, then
    /// `min_factor` (`CosineAnnealingLR` with eta_min = min_factor · base).
    Cosine { steps: u64, min_factor: f64 },
    /// Multiplied by `gamma` every `step_size` steps (`StepLR`).
    Step { step_size: u64, gamma: f64 },
    /// Multiplied by `gamma` every step (`ExponentialLR`).
    Exponential { gamma: f64 },
    /// PyTorch's `OneCycleLR` (cosine annealing, two phases) with the base
    /// learning rate as max_lr: from 1/div_factor up to 1 over the first
    /// `pct_start` of `total` steps, then down to 1/(div_factor ·
    /// final_div_factor).
    OneCycle { total: u64, pct_start: f64, div_factor: f64, final_div_factor: f64 },
    /// The first schedule for `steps` steps, then the second counting its
    /// steps from 0 (`SequentialLR`).
    Then(Box<Schedule>, u64, Box<Schedule>),
    /// The product of two schedules' factors (`ChainedScheduler`).
    Times(Box<Schedule>, Box<Schedule>),
}

impl Schedule {
    /// Linear warm-up over `warmup` steps (from 1/warmup), then a cosine
    /// decay to `min_factor` at step `total` — the usual transformer
    /// schedule.
    pub fn warmup_cosine(warmup: u64, total: u64, min_factor: f64) -> Schedule {
        let cosine = Schedule::Cosine { steps: total.saturating_sub(warmup), min_factor };
        if warmup == 0 {
            return cosine;
        }
        Schedule::LinearWarmup { steps: warmup, start_factor: 1.0 / warmup as f64 }.then(warmup, cosine)
    }

    /// `self` for `steps` steps, then `next`.
    pub fn then(self, steps: u64, next: Schedule) -> Schedule {
        Schedule::Then(Box::new(self), steps, Box::new(next))
    }

    /// Multiply with another schedule.
    pub fn times(self, other: Schedule) -> Schedule {
        Schedule::Times(Box::new(self), Box::new(other))
    }

    /// Refuse parameters that would give a negative or non-finite factor.
    #[track_caller]
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::invalid("Schedule", what));
        match self {
            Schedule::Constant => Ok(()),
            Schedule::LinearWarmup { start_factor, .. } if !(start_factor.is_finite() && *start_factor >= 0.0) => {
                bad(format!("start_factor {start_factor} must be finite and >= 0"))
            }
            Schedule::Cosine { min_factor, .. } if !(min_factor.is_finite() && *min_factor >= 0.0) => {
                bad(format!("min_factor {min_factor} must be finite and >= 0"))
            }
            Schedule::Step { step_size, gamma } if *step_size == 0 || !(gamma.is_finite() && *gamma >= 0.0) => {
                bad(format!("step_size {step_size} must be > 0 and gamma {gamma} finite and >= 0"))
            }
            Schedule::Exponential { gamma } if !(gamma.is_finite() && *gamma >= 0.0) => {
                bad(format!("gamma {gamma} must be finite and >= 0"))
            }
            Schedule::OneCycle { total, pct_start, div_factor, final_div_factor } => {
                if *total < 2 || !(0.0..=1.0).contains(pct_start) || !(*div_factor > 0.0) || !(*final_div_factor > 0.0)
                {
                    bad(format!(
                        "OneCycle needs total >= 2, pct_start in [0, 1], positive divisors; got {total}, {pct_start}, {div_factor}, {final_div_factor}"
                    ))
                } else {
                    Ok(())
                }
            }
            Schedule::Then(a, _, b) | Schedule::Times(a, b) => {
                a.validate()?;
                b.validate()
            }
            _ => Ok(()),
        }
    }

    /// The factor at `step`. cos and pow are libm's (`math::portable`): the
    /// same bits on every target.
    pub fn factor(&self, step: u64) -> f64 {
        use crate::op::expr::math::portable::double::{cos, pow};
        match self {
            Schedule::Constant => 1.0,
            Schedule::LinearWarmup { steps, start_factor } => {
                if step >= *steps {
                    1.0
                } else {
                    start_factor + (1.0 - start_factor) * step as f64 / *steps as f64
                }
            }
            Schedule::Cosine { steps, min_factor } => {
                if step >= *steps {
                    *min_factor
                } else {
                    let t = step as f64 / *steps as f64;
                    min_factor + (1.0 - min_factor) * 0.5 * (1.0 + cos(PI * t))
                }
            }
            Schedule::Step { step_size, gamma } => pow(*gamma, (step / step_size) as f64),
            Schedule::Exponential { gamma } => pow(*gamma, step as f64),
            Schedule::OneCycle { total, pct_start, div_factor, final_div_factor } => {
                let initial = 1.0 / div_factor;
                let min = initial / final_div_factor;
                let up_end = (pct_start * *total as f64) - 1.0;
                let down_end = (*total - 1) as f64;
                let anneal = |start: f64, end: f64, pct: f64| end + (start - end) / 2.0 * (cos(PI * pct) + 1.0);
                let s = step as f64;
                if s <= up_end {
                    anneal(initial, 1.0, if up_end > 0.0 { s / up_end } else { 1.0 })
                } else {
                    let span = (down_end - up_end).max(1.0);
                    anneal(1.0, min, ((s - up_end) / span).min(1.0))
                }
            }
            Schedule::Then(first, steps, next) => {
                if step < *steps {
                    first.factor(step)
                } else {
                    next.factor(step - steps)
                }
            }
            Schedule::Times(a, b) => a.factor(step) * b.factor(step),
        }
    }
}

/// Applies a `Schedule` to an optimizer: every group's learning rate is its
/// base rate (the one it had when the scheduler was made) times the factor.
/// Call `step` after each `optimizer.step()`, as in PyTorch.
#[derive(Clone, Debug)]
pub struct LrScheduler {
    schedule: Schedule,
    base_lrs: Vec<f64>,
    step: u64,
}

impl LrScheduler {
    /// Records the optimizer's learning rates as the base rates and sets
    /// them to the factor at step 0.
    #[track_caller]
    pub fn new(optimizer: &mut dyn Optimizer, schedule: Schedule) -> Result<LrScheduler> {
        schedule.validate()?;
        let base_lrs = optimizer.group_learning_rates();
        let scheduler = LrScheduler { schedule, base_lrs, step: 0 };
        scheduler.apply(optimizer);
        Ok(scheduler)
    }

    fn apply(&self, optimizer: &mut dyn Optimizer) {
        let f = self.schedule.factor(self.step);
        let lrs: Vec<f64> = self.base_lrs.iter().map(|lr| lr * f).collect();
        // Base rates and factors are checked finite and >= 0 when the
        // scheduler is built or loaded; a product that still overflows is
        // refused by the optimizer, which then keeps its current rates.
        let _ = optimizer.set_group_learning_rates(&lrs);
    }

    /// Advance one step and set the optimizer's learning rates.
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) {
        self.step += 1;
        self.apply(optimizer);
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The learning rates the schedule gives now, per group.
    pub fn current_lrs(&self) -> Vec<f64> {
        let f = self.schedule.factor(self.step);
        self.base_lrs.iter().map(|lr| lr * f).collect()
    }

    pub fn base_lrs(&self) -> &[f64] {
        &self.base_lrs
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The state a checkpoint keeps: the step count and the base rates
    /// (the schedule itself is code, built again on resume).
    pub fn state(&self) -> (u64, Vec<f64>) {
        (self.step, self.base_lrs.clone())
    }

    /// Restore `state()` and set the optimizer's rates accordingly.
    #[track_caller]
    pub fn load_state(&mut self, optimizer: &mut dyn Optimizer, step: u64, base_lrs: &[f64]) -> Result<()> {
        if base_lrs.len() != self.base_lrs.len() || base_lrs.iter().any(|lr| !(lr.is_finite() && *lr >= 0.0)) {
            return Err(Error::invalid(
                "LrScheduler::load_state",
                format!(
                    "{} base rates {:?} for an optimizer with {} groups",
                    base_lrs.len(),
                    base_lrs,
                    self.base_lrs.len()
                ),
            ));
        }
        self.step = step;
        self.base_lrs = base_lrs.to_vec();
        self.apply(optimizer);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }

    #[test]
    fn factors_match_pytorch_formulas() {
        let w = Schedule::LinearWarmup { steps: 4, start_factor: 0.25 };
        close(w.factor(0), 0.25);
        close(w.factor(2), 0.625);
        close(w.factor(4), 1.0);
        let c = Schedule::Cosine { steps: 10, min_factor: 0.1 };
        close(c.factor(0), 1.0);
        close(c.factor(5), 0.55);
        close(c.factor(10), 0.1);
        close(c.factor(20), 0.1);
        close(Schedule::Step { step_size: 3, gamma: 0.5 }.factor(7), 0.25);
        close(Schedule::Exponential { gamma: 0.9 }.factor(2), 0.81);
        let s = Schedule::warmup_cosine(10, 110, 0.1);
        close(s.factor(0), 0.1);
        close(s.factor(10), 1.0);
        close(s.factor(60), 0.55);
        close(s.factor(110), 0.1);
        close(Schedule::Exponential { gamma: 0.5 }.times(Schedule::Step { step_size: 2, gamma: 0.1 }).factor(2), 0.025);
        // OneCycleLR(max_lr=1, total_steps=10) in PyTorch: initial 0.04,
        // peak 1.0 at step 2 (pct_start 0.3 → 3 - 1), final 4e-6.
        let o = Schedule::OneCycle { total: 10, pct_start: 0.3, div_factor: 25.0, final_div_factor: 1e4 };
        close(o.factor(0), 0.04);
        close(o.factor(2), 1.0);
        close(o.factor(9), 0.04 / 1e4);
    }

    #[test]
    fn bad_schedules_are_refused() {
        assert!(Schedule::Step { step_size: 0, gamma: 0.5 }.validate().is_err());
        assert!(Schedule::Cosine { steps: 3, min_factor: f64::NAN }.validate().is_err());
        assert!(Schedule::OneCycle { total: 1, pct_start: 0.3, div_factor: 25.0, final_div_factor: 1e4 }
            .validate()
            .is_err());
    }
}
