//! The per-step counters of `kiln bench` (kiln::bench::step_counters): a
//! W1 training step on the CPU, once warmed up, takes every device buffer
//! from the pool (0 bytes allocated per step) and issues the same kernel
//! calls each step; a workload whose shapes keep changing is seen
//! allocating, so the zero is a measurement, not a constant.

mod common;

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
    // The constant 2 (Full), the product and the sum; fused, one kernel
    // (the sum's prologue is the constant and the product).
    let expected = if device.fusion() { 1.0 } else { 3.0 };
    assert_eq!(counters.kernels_per_step, expected, "{counters:?}");
    // No counting allocator in the test binary: host counts are unknown.
    assert_eq!(counters.host_bytes_per_step, None);
}

/// On wgpu (lavapipe on CI), a warmed-up training step compiles no
/// pipeline and times no kernel: every pipeline, and the matmul kernel of
/// every shape class, comes from the backend's caches, which the counters
/// show answering. Small shapes: the driver is slow.
#[test]
fn warmed_up_wgpu_steps_compile_no_pipelines() {
    let Some(device) = common::vulkan_device("the wgpu step counters") else { return };
    let model = Sequential::mlp(&device, &[784, 32, 10], Activation::Relu, 1).unwrap();
    let mut step = training_step(&device, &model, 8, 2).unwrap();
    let first = step_counters(&device, 0, 1, &mut step).unwrap();
    assert!(first.pipelines_compiled_per_step >= 5.0, "the first step compiles its kernels: {first:?}");
    let warm = step_counters(&device, 1, 2, &mut step).unwrap();
    assert_eq!(warm.pipelines_compiled_per_step, 0.0, "{warm:?}");
    assert_eq!(warm.kernel_trials_per_step, 0.0, "{warm:?}");
    assert!(warm.pipeline_cache_hits_per_step >= 10.0, "{warm:?}");
    // The CPU compiles nothing, ever.
    let cpu = Device::cpu();
    let cpu_model = Sequential::mlp(&cpu, &[784, 32, 10], Activation::Relu, 1).unwrap();
    let mut cpu_step = training_step(&cpu, &cpu_model, 8, 2).unwrap();
    let c = step_counters(&cpu, 0, 1, &mut cpu_step).unwrap();
    assert_eq!((c.pipelines_compiled_per_step, c.pipeline_cache_hits_per_step), (0.0, 0.0), "{c:?}");
}

/// On wgpu, kernels' own intermediate buffers (a long K's chunk products,
/// a long sum's partials) are reused step after step: the first step
/// creates them (counted, so the zero below is a measurement), a
/// warmed-up step creates none. Before, each use made a new buffer, which
/// wgpu also zero-fills.
#[test]
fn warmed_up_wgpu_steps_create_no_scratch_buffers() {
    let Some(device) = common::vulkan_device("the wgpu scratch counters") else { return };
    let a: Vec<f32> = (0..8 * 2100).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..2100 * 8).map(|i| (i % 5) as f32 - 2.0).collect();
    let mut graph = Graph::new(&device);
    let mut step = || {
        graph.reset();
        let x = graph.tensor_from(&a, &[8, 2100])?;
        let y = graph.tensor_from(&b, &[2100, 8])?;
        // K = 2100: three chunks of 1024 combined through scratch; the
        // sum of 70,000 values goes through partials.
        let p = x.matmul(y)?;
        let long = graph.tensor_from(&vec![0.5f32; 70_000], &[70_000])?.mul(x.sum_all()?)?;
        let total = p.sum_all()?.add(long.sum_all()?)?.item_blocking()?;
        assert!(total.is_finite());
        Ok(())
    };
    let first = step_counters(&device, 0, 1, &mut step).unwrap();
    assert!(first.device_bytes_allocated_per_step > 0.0, "{first:?}");
    let warm = step_counters(&device, 2, 3, &mut step).unwrap();
    assert_eq!(warm.device_bytes_allocated_per_step, 0.0, "{warm:?}");
}
