//! Criterion benchmarks of the hot kernels, on the CPU and (when a wgpu
//! adapter works) on wgpu: the GEMMs of an MLP and of BENCHMARKS.md's W4,
//! element-wise ops, reductions, a row softmax, and W1's full training step.
//!
//! ```sh
//! cargo bench -p kiln --bench kernels              # ~1 minute on 2 cores; `-- --quick`: ~15 s
//! cargo bench -p kiln --bench kernels -- matmul     # a subset, by name
//! KILN_BENCH_WGPU=vulkan cargo bench -p kiln --bench kernels   # pick the wgpu API
//! ```
//!
//! What one iteration measures: reset the graph, build the op on inputs that
//! already live on the device (`Param`s, so nothing is uploaded), run it, and
//! read back ONE element of the result. The read is what makes wgpu wait for
//! the GPU (a submit returns before the work is done); it adds one tiny slice
//! kernel and a 4-byte copy, which on the CPU is well under a microsecond and
//! on wgpu is a fixed per-iteration cost (a submit and a buffer map) that a
//! real training step pays too. The MLP step reads back its loss, as W1 does.
//!
//! Matmul throughput is reported in elements/s where one "element" is one
//! floating-point operation (2·m·k·n per product), so Gelem/s reads as
//! GFLOP/s; element-wise ops, reductions and softmax count input elements,
//! the MLP step counts samples (128 per step). The build machines are
//! shared: compare numbers from one run.
//!
//! On a software Vulkan driver (Mesa's lavapipe), the wgpu numbers measure a
//! CPU pretending to be a GPU, not a GPU.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use kiln::host_rng::SplitMix64;
use kiln::prelude::*;

fn random_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect()
}

/// A device-resident f32 input of `dims`.
fn input(device: &Device, name: &str, dims: &[usize], seed: u64) -> Param {
    let n = dims.iter().product();
    Param::new(device, name, &random_vec(n, seed), dims).expect("uploading a bench input")
}

/// Benchmark `op` applied to device-resident `inputs`: build, run, and read
/// back one element (see the module comment).
fn bench_op(
    group: &mut BenchmarkGroup<'_, WallTime>,
    device: &Device,
    name: &str,
    inputs: &[Param],
    op: impl for<'g> Fn(&[Tensor<'g>]) -> kiln::Result<Tensor<'g>>,
) {
    let mut graph = Graph::new(device);
    group.bench_function(name, |b| {
        b.iter(|| {
            graph.reset();
            let _no_grad = graph.no_grad();
            let xs: Vec<Tensor<'_>> = inputs.iter().map(|p| graph.param(p)).collect::<kiln::Result<_>>().unwrap();
            let out = op(&xs).unwrap();
            let first = out.reshape(&[-1]).unwrap().slice_axis(0, 0, 1, 1).unwrap();
            black_box(first.to_vec_blocking::<f32>().unwrap());
        })
    });
}

/// BENCHMARKS.md's W1 step: MLP 784-512-512-10, ReLU, cross-entropy, Adam
/// lr 1e-3, batch 128, loss read back.
fn bench_mlp_step(group: &mut BenchmarkGroup<'_, WallTime>, device: &Device) {
    let model = Sequential::mlp(device, &[784, 512, 512, 10], Activation::Relu, 1).unwrap();
    let mut optimizer = Adam::new(model.parameters(), 1e-3).unwrap();
    let images = random_vec(128 * 784, 2);
    let mut rng = SplitMix64::new(3);
    let labels: Vec<i32> = (0..128).map(|_| rng.below(10) as i32).collect();
    let mut graph = Graph::new(device);
    group.bench_function("mlp step 784-512-512-10 b128 adam", |b| {
        b.iter(|| {
            graph.reset();
            let x = graph.tensor_from(&images, &[128, 784]).unwrap();
            let y = graph.tensor_from(&labels, &[128]).unwrap();
            let loss = cross_entropy(model.forward(x).unwrap(), y).unwrap();
            optimizer.zero_grad();
            loss.backward().unwrap();
            optimizer.step().unwrap();
            black_box(loss.item_blocking().unwrap());
        })
    });
}

/// Every kernel benchmark on one device, as the group `label`.
fn bench_device(c: &mut Criterion, label: &str, device: &Device) {
    let mut group = c.benchmark_group(label);
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));

    for (m, k, n) in [(128, 784, 512), (1024, 1024, 1024)] {
        let (a, b) = (input(device, "a", &[m, k], 10), input(device, "b", &[k, n], 11));
        group.throughput(Throughput::Elements(2 * (m * k * n) as u64));
        bench_op(&mut group, device, &format!("matmul {m}x{k}x{n}"), &[a, b], |x| x[0].matmul(x[1]));
    }

    let x = input(device, "x", &[128, 512], 12);
    let y = input(device, "y", &[128, 512], 13);
    let row = input(device, "row", &[512], 14);
    group.throughput(Throughput::Elements(128 * 512));
    bench_op(&mut group, device, "add [128,512]+[128,512]", &[x.clone(), y], |t| t[0].add(t[1]));
    bench_op(&mut group, device, "add [128,512]+[512]", &[x.clone(), row], |t| t[0].add(t[1]));
    bench_op(&mut group, device, "relu [128,512]", std::slice::from_ref(&x), |t| t[0].relu());
    bench_op(&mut group, device, "exp [128,512]", std::slice::from_ref(&x), |t| t[0].exp());
    bench_op(&mut group, device, "sum axis 0 [128,512]", std::slice::from_ref(&x), |t| t[0].sum(&[0], false));
    bench_op(&mut group, device, "sum axis -1 [128,512]", &[x], |t| t[0].sum(&[-1], false));
    let logits = input(device, "logits", &[128, 10], 15);
    group.throughput(Throughput::Elements(128 * 10));
    bench_op(&mut group, device, "softmax rows [128,10]", &[logits], |t| t[0].softmax(-1));

    group.throughput(Throughput::Elements(128));
    bench_mlp_step(&mut group, device);
    group.finish();
}

fn kernels(c: &mut Criterion) {
    bench_device(c, "cpu", &Device::cpu());
    // Any wgpu API unless KILN_BENCH_WGPU names one (vulkan, metal, dx12, gl).
    let api = std::env::var("KILN_BENCH_WGPU").unwrap_or_else(|_| "wgpu".to_string());
    match Device::from_name(&api) {
        Ok(device) => {
            eprintln!("wgpu benchmarks on {}", device.name());
            bench_device(c, "wgpu", &device);
        }
        Err(e) => eprintln!("note: no wgpu adapter ({e}); skipping the wgpu benchmarks"),
    }
}

criterion_group!(benches, kernels);
criterion_main!(benches);
