//! Nanoseconds per element of the element-wise and copy kernels on the
//! GPT's shapes ([12, 64, 128] activations), on the first Vulkan adapter:
//! `cargo run --release -p kiln-wgsl --example elementwise_kernels`.
//! Each case chains 8 launches of one kernel in one execution and reads the
//! result back; best of 5 after a warm-up. A measurement tool, not a test.
//! Every case runs with fusion off (8 dispatches) and on (the element-wise
//! chains become generated kernels, see kernels/fused.rs).

use std::time::Instant;

use kiln_core::{Device, Graph, Param, Result, Tensor};
use kiln_wgsl::{WgpuBackend, WgpuOptions};

const CHAIN: usize = 8;

fn case(
    device: &Device,
    name: &str,
    x_dims: &[usize],
    y_dims: &[usize],
    step: &dyn for<'g> Fn(Tensor<'g>, Tensor<'g>) -> Result<Tensor<'g>>,
) -> Result<()> {
    let fill = |len: usize, s: usize| (0..len).map(|i| ((i * 7 + s) % 13) as f32 / 13.0 - 0.5).collect::<Vec<f32>>();
    let numel = |d: &[usize]| d.iter().product::<usize>();
    let x = Param::new(device, "x", &fill(numel(x_dims), 1), x_dims)?;
    let y = Param::new(device, "y", &fill(numel(y_dims), 2), y_dims)?;
    let mut graph = Graph::new(device);
    let mut best = f64::INFINITY;
    let mut elements = 0;
    for run in 0..6 {
        graph.reset();
        let start = Instant::now();
        let yv = graph.param(&y)?;
        let mut v = graph.param(&x)?;
        for _ in 0..CHAIN {
            v = step(v, yv)?;
        }
        elements = v.dims().iter().product::<usize>();
        pollster::block_on(v.to_vec::<f32>())?;
        if run > 0 {
            best = best.min(start.elapsed().as_secs_f64());
        }
    }
    println!(
        "{name:40} {:8.2} ns/element ({:.2} ms per launch)",
        best * 1e9 / (CHAIN * elements) as f64,
        best * 1e3 / CHAIN as f64
    );
    Ok(())
}

fn main() -> Result<()> {
    let options = WgpuOptions { backends: kiln_wgsl::wgpu::Backends::VULKAN, ..WgpuOptions::default() };
    let device = Device::from_backend(pollster::block_on(WgpuBackend::new(options))?);
    for fusion in [false, true] {
        device.set_fusion(fusion);
        println!("fusion {}:", if fusion { "on" } else { "off" });
        cases(&device)?;
    }
    Ok(())
}

fn cases(device: &Device) -> Result<()> {
    let device = device.clone();
    let act = [12, 64, 128];
    case(&device, "exp (unary)", &act, &[1], &|v, _| v.exp())?;
    case(&device, "add, same shape", &act, &act, &|v, y| v.add(y))?;
    case(&device, "add, bias [128]", &act, &[128], &|v, y| v.add(y))?;
    case(&device, "mul, row statistic [12, 64, 1]", &act, &[12, 64, 1], &|v, y| v.mul(y))?;
    case(&device, "relu backward (greater, where)", &act, &act, &|v, y| v.gt(0.0)?.where_(y, v))?;
    case(&device, "permute [12,64,4,32] -> [12,4,64,32]", &[12, 64, 4, 32], &[1], &|v, _| {
        v.permute(&[0, 2, 1, 3])?.reshape(&[12, 64, 4, 32])
    })?;
    case(&device, "W2 permute [32,64,676] -> [64,32,676]", &[32, 64, 676], &[1], &|v, _| {
        v.permute(&[1, 0, 2])?.reshape(&[32, 64, 676])
    })?;
    case(&device, "sum over the last axis + expand", &act, &[1], &|v, _| v.sum(&[2], true)?.expand(&act))?;
    case(&device, "sum over [768, 128]'s rows + expand", &[768, 128], &[1], &|v, _| {
        v.sum(&[0], true)?.expand(&[768, 128])
    })?;
    Ok(())
}
