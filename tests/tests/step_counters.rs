//! The per-step counters of `kiln bench` (kiln::bench::step_counters): a
//! W1 training step on the CPU, once warmed up, takes every device buffer
//! from the pool (0 bytes allocated per step) and issues the same kernel
//! calls each step; a workload whose shapes keep changing is seen
//! allocating, so the zero is a measurement, not a constant.

use kiln::bench::{step_counters, training_step};
use kiln::nn::{Activation, Sequential};
use kiln::{Blocking, Device, Graph};

#[test]
fn w1_steps_allocate_no_device_memory_after_warm_up() {
    let device = Device::cpu();
    let model = Sequential::mlp(&device, &[784, 512, 512, 10], Activation::Relu, 1).unwrap();
    let mut step = training_step(&device, &model, 128, 2).unwrap();
    let first = step_counters(&device, 3, 2, &mut step).unwrap();
    let again = step_counters(&device, 0, 2, &mut step).unwrap();
    assert_eq!(first.device_bytes_allocated_per_step, 0.0, "{first:?}");
    assert_eq!(again.device_bytes_allocated_per_step, 0.0, "{again:?}");
    // Three layers forward and backward: dozens of kernels, the same count
    // every step.
    assert!(first.kernels_per_step >= 30.0, "{first:?}");
    assert_eq!(first.kernels_per_step, again.kernels_per_step);
    assert_eq!(first.kernels_per_step.fract(), 0.0);
    // The peak covers at least the parameters and Adam's two moments.
    let params = (784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10) * 4;
    assert!(first.peak_device_bytes >= 3 * params, "{first:?}");
    assert_eq!(first.peak_device_bytes, again.peak_device_bytes);
    // Every execution of a warmed-up step replays a cached plan.
    if device.plan_cache_enabled() {
        assert_eq!(first.plans_built_per_step, 0.0, "{first:?}");
        assert!(first.plans_reused_per_step >= 2.0, "{first:?}");
    }
    if device.fusion() {
        assert!(first.fused_groups_per_step >= 1.0, "{first:?}");
    }
}

#[test]
fn steps_with_new_shapes_are_counted_allocating() {
    let device = Device::cpu();
    let mut graph = Graph::new(&device);
    let mut len = 1000;
    let counters = step_counters(&device, 1, 3, || {
        graph.reset();
        len *= 2;
        let x = graph.tensor_from(&vec![1.0f32; len], &[len])?;
        let s = x.mul(2.0)?.sum_all()?.item_blocking()?;
        assert_eq!(s, 2.0 * len as f64);
        Ok(())
    })
    .unwrap();
    assert!(counters.device_bytes_allocated_per_step > 0.0, "{counters:?}");
    // The constant 2 (Full), the product and the sum; fused, the constant
    // and the product are one kernel.
    let expected = if device.fusion() { 2.0 } else { 3.0 };
    assert_eq!(counters.kernels_per_step, expected, "{counters:?}");
    // No counting allocator in the test binary: host counts are unknown.
    assert_eq!(counters.host_bytes_per_step, None);
}
