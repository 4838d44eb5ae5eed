//! The same seeded CNN training run on wgpu and on the CPU gives the same
//! loss curve within tolerance (issue: "a shorter run on wgpu showing the
//! same loss curve").

mod common;

use kiln::prelude::*;

/// Per-step losses of 25 Adam steps of the digits CNN.
fn losses(device: &Device) -> Vec<f64> {
    common::digits_cnn_steps(device, 32, 25).0
}

#[test]
fn cnn_loss_curve_on_wgpu_matches_the_cpu() {
    let Some(gpu) = common::vulkan_device("wgpu_training") else { return };
    let cpu_losses = losses(&Device::cpu());
    let gpu_losses = losses(&gpu);
    assert!(cpu_losses.last() < cpu_losses.first(), "the loss falls: {cpu_losses:?}");
    // f32 on both sides; summation orders differ (GEMM tiling, reductions),
    // and Adam's normalised steps carry the differences forward, so allow
    // 1e-3 relative per step over 25 steps.
    for (step, (c, g)) in cpu_losses.iter().zip(&gpu_losses).enumerate() {
        assert!((c - g).abs() <= 1e-3 * c.abs().max(1.0), "step {step}: cpu {c} vs wgpu {g}");
    }
    // And wgpu replays itself bit for bit.
    assert_eq!(gpu_losses, losses(&gpu));
}
