//! The models `kiln train` and `kiln bench` build.

use kiln_core::nn::{Activation, Conv2d, ConvOptions, Flatten, Linear, MaxPool2d, Sequential, Unflatten};
use kiln_core::{Device, Error, Result};

/// An MLP with ReLU between the given widths.
pub fn mlp(device: &Device, widths: &[usize], seed: u64) -> Result<Sequential> {
    Sequential::mlp(device, widths, Activation::Relu, seed)
}

/// A small CNN for single-channel images given as flat rows.
/// 28x28 inputs get BENCHMARKS.md's W2 network: conv 1→32 3x3 + ReLU +
/// maxpool 2, conv 32→64 3x3 + ReLU + maxpool 2, flatten 1600 → 128 + ReLU
/// → classes. Small images (8x8 digits) get conv 1→16 3x3 (padding 1) +
/// ReLU + maxpool 2, conv 16→32 3x3 (padding 1) + ReLU + maxpool 2 → 128 → classes.
pub fn cnn(device: &Device, image: [usize; 3], classes: usize, seed: u64) -> Result<Sequential> {
    let [c, h, w] = image;
    let unflatten = Unflatten { dims: vec![c, h, w] };
    let (channels, padding) = if h >= 16 && w >= 16 { ([32, 64], 0) } else { ([16, 32], 1) };
    let options = ConvOptions { padding: [padding, padding], ..ConvOptions::default() };
    let after = |size: usize| -> Option<usize> {
        let conv1 = (size + 2 * padding).checked_sub(2)? / 2;
        Some((conv1 + 2 * padding).checked_sub(2)? / 2)
    };
    let (Some(fh), Some(fw)) = (after(h), after(w)) else {
        return Err(Error::invalid("cnn", format!("images of {h}x{w} are too small for two conv+pool stages")));
    };
    if fh == 0 || fw == 0 {
        return Err(Error::invalid("cnn", format!("images of {h}x{w} are too small for two conv+pool stages")));
    }
    Ok(Sequential::new()
        .add(unflatten)
        .add(Conv2d::new(device, c, channels[0], [3, 3], options, seed)?)
        .add(Activation::Relu)
        .add(MaxPool2d::new(2))
        .add(Conv2d::new(device, channels[0], channels[1], [3, 3], options, seed.wrapping_add(1))?)
        .add(Activation::Relu)
        .add(MaxPool2d::new(2))
        .add(Flatten)
        .add(Linear::new(device, channels[1] * fh * fw, 128, true, seed.wrapping_add(2))?)
        .add(Activation::Relu)
        .add(Linear::new(device, 128, classes, true, seed.wrapping_add(3))?))
}
