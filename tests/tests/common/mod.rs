//! Helpers shared by the cross-crate test files.
#![allow(dead_code)]

pub mod cases;
pub mod chains;

use kiln::{Blocking, BlockingParam, Device, DeviceSelection, Param, Tensor, WgpuOptions};
use kiln_wgsl::wgpu;

/// The wgpu device the GPU tests run on: Vulkan, which on CI is Mesa's
/// software driver (lavapipe). With the `CI` environment variable set a
/// missing adapter FAILS the test, so CI cannot pass by skipping; without
/// it the caller gets `None` and a note, and passes vacuously.
pub fn vulkan_device(suite: &str) -> Option<Device> {
    accept_vulkan(Device::from_name("vulkan"), suite)
}

/// `vulkan_device` with explicit options (e.g. lowered limits); the
/// backend set is forced to Vulkan.
pub fn vulkan_device_with(options: WgpuOptions, suite: &str) -> Option<Device> {
    accept_vulkan(Device::wgpu(WgpuOptions { backends: wgpu::Backends::VULKAN, ..options }), suite)
}

fn accept_vulkan(device: kiln::Result<Device>, suite: &str) -> Option<Device> {
    match device {
        Ok(device) => {
            // "wgpu (<adapter>, Vulkan, <type>)"
            assert!(device.name().contains(", Vulkan,"), "asked for Vulkan, got {}", device.name());
            Some(device)
        }
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("note: no Vulkan adapter ({e}); skipping {suite}");
            None
        }
        Err(e) => panic!("CI is set but no Vulkan adapter was found for {suite}: {e}"),
    }
}

/// Whether the adapter rounds every f32 operation of a shader on its own, so
/// that a fused kernel gives the unfused kernels' bits. Software adapters
/// (lavapipe, SwiftShader) do. GPU drivers may contract `a * b + c` into one
/// fused multiply-add, which WGSL allows: on an NVIDIA H200 (Vulkan, driver
/// 580) fused chains differed from the unfused kernels in the last bit of a
/// few gradients. There, fusion tests compare within a few ulp instead, and
/// still require identical bits run after run.
pub fn rounds_every_op(device: &Device) -> bool {
    // "wgpu (<adapter>, Vulkan, <type>)": the type is Cpu for software adapters.
    device.name().ends_with(", Cpu)")
}

/// Values of a float tensor as f64, whatever its float dtype.
pub fn values(t: &Tensor<'_>) -> Vec<f64> {
    kiln_read(t).unwrap_or_else(|e| panic!("reading {t:?} failed: {e}"))
}

fn kiln_read(t: &Tensor<'_>) -> kiln::Result<Vec<f64>> {
    Ok(match t.dtype() {
        kiln::DType::F32 => t.to_vec_blocking::<f32>()?.into_iter().map(f64::from).collect(),
        kiln::DType::F64 => t.to_vec_blocking::<f64>()?,
        kiln::DType::I32 => t.to_vec_blocking::<i32>()?.into_iter().map(f64::from).collect(),
        kiln::DType::Bool => t.to_vec_blocking::<bool>()?.into_iter().map(|b| b as u8 as f64).collect(),
    })
}

/// The gradient a tensor kept (leaf variable or `retain_grad`), as f64.
pub fn grad_of(t: &Tensor<'_>) -> Vec<f64> {
    let g = t.grad().unwrap_or_else(|| panic!("{t:?} kept no gradient"));
    values(&g)
}

/// A parameter's accumulated gradient (panics when there is none).
pub fn param_grad(p: &Param) -> Vec<f64> {
    p.grad_blocking().expect("reading the gradient").expect("the parameter has a gradient").to_f64_vec()
}

pub fn param_value(p: &Param) -> Vec<f64> {
    p.value_blocking().expect("reading the parameter").to_f64_vec()
}

/// Element-wise |a - e| <= tol * max(1, |e|), with a readable failure.
#[track_caller]
pub fn assert_close(actual: &[f64], expected: &[f64], tol: f64) {
    assert_eq!(actual.len(), expected.len(), "length differs: got {actual:?}, expected {expected:?}");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        let ok = (a - e).abs() <= tol * e.abs().max(1.0) || (a.is_nan() && e.is_nan());
        assert!(ok, "element {i}: got {a}, expected {e} (tol {tol})\n  got      {actual:?}\n  expected {expected:?}");
    }
}

/// `n` values in [-1, 1] from an xorshift stream seeded by `seed`:
/// reproducible inputs for the bit-for-bit fusion tests.
pub fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// An f32 tensor's values as bits, to compare exactly.
pub fn bits(t: &Tensor<'_>) -> Vec<u32> {
    t.to_vec_blocking::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Per-step losses of `steps` Adam steps (lr 3e-3) of the digits CNN
/// (seed 11) at `batch`, and the model's parameters afterwards.
pub fn digits_cnn_steps(device: &Device, batch: usize, steps: usize) -> (Vec<f64>, Vec<Param>) {
    use kiln::nn::Module;
    let data = kiln::data::load_embedded_digits(0.2, 3).unwrap();
    let model = kiln::models::cnn(device, data.train.image_dims, data.train.classes, 11).unwrap();
    let mut optimizer = kiln::optim::Adam::new(model.parameters(), 3e-3).unwrap();
    let mut graph = kiln::Graph::new(device);
    let batches = data.train.batches(batch, Some(5), 0).unwrap().take(steps);
    let losses =
        batches.map(|b| classifier_step(&mut graph, &model, &mut optimizer, &b, data.train.features)).collect();
    (losses, model.parameters())
}

/// One training step of a classifier on `batch` (`features` values per
/// image): cross-entropy, backward, optimizer step, in a reset `graph`;
/// returns the loss.
pub fn classifier_step(
    graph: &mut kiln::Graph,
    model: &impl kiln::nn::Module,
    optimizer: &mut impl kiln::optim::Optimizer,
    batch: &kiln::data::Batch,
    features: usize,
) -> f64 {
    graph.reset();
    let x = graph.tensor_from(&batch.images, &[batch.len, features]).unwrap();
    let y = graph.tensor_from(&batch.labels, &[batch.len]).unwrap();
    let loss = kiln::prelude::cross_entropy(model.forward(x).unwrap(), y).unwrap();
    optimizer.zero_grad();
    loss.backward().unwrap();
    optimizer.step().unwrap();
    loss.item_blocking().unwrap()
}
