//! Parameterised activation layers (the parameter-free ones are
//! `Activation`'s variants).

use super::Module;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::param::Param;

#[track_caller]
fn finite(op: &'static str, what: &str, v: f64) -> Result<f64> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(Error::invalid(op, format!("{what} = {v} must be finite")))
    }
}

/// x for x > 0, `negative_slope`·x otherwise (PyTorch's default slope 0.01).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeakyReLU {
    pub negative_slope: f64,
}

impl LeakyReLU {
    #[track_caller]
    pub fn new(negative_slope: f64) -> Result<LeakyReLU> {
        Ok(LeakyReLU { negative_slope: finite("LeakyReLU", "negative_slope", negative_slope)? })
    }
}

/// x for x > 0, alpha·(exp(x) − 1) otherwise.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ELU {
    pub alpha: f64,
}

impl ELU {
    #[track_caller]
    pub fn new(alpha: f64) -> Result<ELU> {
        Ok(ELU { alpha: finite("ELU", "alpha", alpha)? })
    }
}

/// log(1 + exp(beta·x)) / beta, computed without overflow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Softplus {
    pub beta: f64,
}

impl Softplus {
    #[track_caller]
    pub fn new(beta: f64) -> Result<Softplus> {
        if !(beta.is_finite() && beta > 0.0) {
            return Err(Error::invalid("Softplus", format!("beta = {beta} must be positive and finite")));
        }
        Ok(Softplus { beta })
    }
}

/// x · tanh(softplus(x)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Mish;

macro_rules! activation_module {
    ($t:ty, |$s:ident, $x:ident| $body:expr) => {
        impl Module for $t {
            #[track_caller]
            fn forward<'g>(&self, $x: Tensor<'g>) -> Result<Tensor<'g>> {
                let $s = self;
                $body
            }
            fn parameters(&self) -> Vec<Param> {
                Vec::new()
            }
        }
    };
}

activation_module!(LeakyReLU, |s, x| x.leaky_relu(s.negative_slope));
activation_module!(ELU, |s, x| x.elu(s.alpha));
activation_module!(Softplus, |s, x| x.softplus(s.beta));
activation_module!(Mish, |_s, x| x.mish());
