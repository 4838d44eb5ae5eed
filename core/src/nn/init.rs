//! Parameter initialisers, usable while building a module:
//! `init::xavier_uniform(&device, "weight", &[out, inp], 1.0, seed)?`.
//!
//! Fans follow PyTorch's `torch.nn.init`: for dims [out, in, k...],
//! fan_in = in·∏k and fan_out = out·∏k; a 1-D tensor has fan_in = fan_out =
//! its length. Values come from kiln's seeded SplitMix64 generator, so a
//! seed gives the same parameters on every machine and backend.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::host_rng::SplitMix64;
use crate::param::Param;

use super::layers::generated_param;

/// (fan_in, fan_out) of a weight of shape `dims`.
#[track_caller]
pub fn fans(op: &'static str, dims: &[usize]) -> Result<(usize, usize)> {
    match dims {
        [] => Err(Error::shape(op, "a scalar has no fan-in or fan-out")),
        [n] => Ok((*n, *n)),
        [out, inp, rest @ ..] => {
            let field: usize = rest.iter().product();
            Ok((inp * field, out * field))
        }
    }
}

/// A parameter whose values come from `value`, drawn in order.
#[track_caller]
fn build(op: &'static str, device: &Device, name: &str, dims: &[usize], value: impl FnMut() -> f64) -> Result<Param> {
    generated_param(device, op, name, dims, DType::F32, value)
}

#[track_caller]
fn check(op: &'static str, what: &str, value: f64, ok: bool) -> Result<()> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(Error::invalid(op, format!("{what} = {value} is out of range")))
    }
}

/// Every element `value`.
#[track_caller]
pub fn constant(device: &Device, name: &str, dims: &[usize], value: f64) -> Result<Param> {
    check("init::constant", "value", value, true)?;
    build("init::constant", device, name, dims, || value)
}

#[track_caller]
pub fn zeros(device: &Device, name: &str, dims: &[usize]) -> Result<Param> {
    build("init::zeros", device, name, dims, || 0.0)
}

#[track_caller]
pub fn ones(device: &Device, name: &str, dims: &[usize]) -> Result<Param> {
    build("init::ones", device, name, dims, || 1.0)
}

/// Uniform in [low, high).
#[track_caller]
pub fn uniform(device: &Device, name: &str, dims: &[usize], low: f64, high: f64, seed: u64) -> Result<Param> {
    check("init::uniform", "high - low", high - low, high >= low)?;
    let mut rng = SplitMix64::new(seed);
    build("init::uniform", device, name, dims, || rng.uniform(low, high))
}

/// Normal with the given mean and standard deviation.
#[track_caller]
pub fn normal(device: &Device, name: &str, dims: &[usize], mean: f64, std: f64, seed: u64) -> Result<Param> {
    check("init::normal", "std", std, std >= 0.0)?;
    check("init::normal", "mean", mean, true)?;
    let mut rng = SplitMix64::new(seed);
    build("init::normal", device, name, dims, || mean + std * rng.normal())
}

/// Glorot/Xavier uniform: ±gain·√(6 / (fan_in + fan_out)).
#[track_caller]
pub fn xavier_uniform(device: &Device, name: &str, dims: &[usize], gain: f64, seed: u64) -> Result<Param> {
    let (fan_in, fan_out) = fans("init::xavier_uniform", dims)?;
    let bound = gain * (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
    uniform(device, name, dims, -bound, bound, seed)
}

/// Glorot/Xavier normal: std = gain·√(2 / (fan_in + fan_out)).
#[track_caller]
pub fn xavier_normal(device: &Device, name: &str, dims: &[usize], gain: f64, seed: u64) -> Result<Param> {
    let (fan_in, fan_out) = fans("init::xavier_normal", dims)?;
    normal(device, name, dims, 0.0, gain * (2.0 / (fan_in + fan_out).max(1) as f64).sqrt(), seed)
}

/// He/Kaiming uniform for a leaky-ReLU slope `a` (0 for ReLU) over fan_in:
/// ±√(6 / ((1 + a²)·fan_in)). PyTorch's default Linear/Conv weight init is
/// this with a = √5, which gives ±1/√fan_in.
#[track_caller]
pub fn kaiming_uniform(device: &Device, name: &str, dims: &[usize], a: f64, seed: u64) -> Result<Param> {
    let (fan_in, _) = fans("init::kaiming_uniform", dims)?;
    let bound = (6.0 / ((1.0 + a * a) * fan_in.max(1) as f64)).sqrt();
    uniform(device, name, dims, -bound, bound, seed)
}

/// He/Kaiming normal over fan_in: std = √(2 / ((1 + a²)·fan_in)).
#[track_caller]
pub fn kaiming_normal(device: &Device, name: &str, dims: &[usize], a: f64, seed: u64) -> Result<Param> {
    let (fan_in, _) = fans("init::kaiming_normal", dims)?;
    normal(device, name, dims, 0.0, (2.0 / ((1.0 + a * a) * fan_in.max(1) as f64)).sqrt(), seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(p: &Param) -> (f64, f64, f64) {
        let v = pollster::block_on(p.value()).unwrap().to_f64_vec();
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        let max = v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        (mean, var.sqrt(), max)
    }

    #[test]
    fn initialisers_have_the_documented_spread() {
        let d = Device::cpu();
        let (_, _, max) = stats(&kaiming_uniform(&d, "w", &[64, 100], 5f64.sqrt(), 1).unwrap());
        assert!(max <= 0.1 && max > 0.09, "kaiming_uniform(a=√5) bound 1/√100: {max}");
        let (mean, std, _) = stats(&xavier_normal(&d, "w", &[200, 300], 1.0, 2).unwrap());
        assert!(mean.abs() < 0.005 && (std - (2.0f64 / 500.0).sqrt()).abs() < 0.003, "{mean} {std}");
        let (mean, std, _) = stats(&normal(&d, "w", &[10_000], 1.0, 0.02, 3).unwrap());
        assert!((mean - 1.0).abs() < 0.002 && (std - 0.02).abs() < 0.002, "{mean} {std}");
        assert_eq!(stats(&zeros(&d, "b", &[5]).unwrap()), (0.0, 0.0, 0.0));
        assert_eq!(fans("t", &[8, 3, 5, 5]).unwrap(), (75, 200));
    }

    #[test]
    fn bad_arguments_are_errors_at_the_callers_line() {
        let d = Device::cpu();
        let e = normal(&d, "w", &[2], 0.0, -1.0, 0).unwrap_err();
        assert_eq!(e.location().file(), file!(), "{e}");
        assert!(fans("t", &[]).is_err());
        assert!(uniform(&d, "w", &[2], 1.0, 0.0, 0).is_err());
    }
}
