//! GFLOP/s of each matmul.wgsl kernel (and of the one the backend picks by
//! itself) on a few shapes, on the first Vulkan adapter:
//! `cargo run --release -p kiln-wgsl --example matmul_kernels [M K N ...]`
//! (triples; default: 1024³, the MLP's 128 x 784 x 512, a matrix-vector
//! product 1 x 1024 x 1024). Forward only, result read back, median of 5
//! after 2 warm-up runs; a measurement tool, not a test.

use std::time::Instant;

use kiln_core::{Device, Graph, Param, Result};
use kiln_wgsl::{MatMulKernel, WgpuBackend, WgpuOptions};

fn gflops(options: WgpuOptions, m: usize, k: usize, n: usize) -> Result<f64> {
    let options = WgpuOptions { backends: kiln_wgsl::wgpu::Backends::VULKAN, ..options };
    let device = Device::from_backend(pollster::block_on(WgpuBackend::new(options))?);
    let fill = |len: usize, s: usize| (0..len).map(|i| ((i * 7 + s) % 13) as f32 / 13.0 - 0.5).collect::<Vec<f32>>();
    let a = Param::new(&device, "a", &fill(m * k, 1), &[m, k])?;
    let b = Param::new(&device, "b", &fill(k * n, 2), &[k, n])?;
    let mut graph = Graph::new(&device);
    let mut times = Vec::new();
    for run in 0..7 {
        graph.reset();
        let start = Instant::now();
        let c = graph.param(&a)?.matmul(graph.param(&b)?)?;
        pollster::block_on(c.to_vec::<f32>())?;
        if run >= 2 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(2.0 * (m * k * n) as f64 / times[times.len() / 2] / 1e9)
}

fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("M K N as numbers")).collect();
    let shapes: Vec<[usize; 3]> = if args.is_empty() {
        vec![[1024, 1024, 1024], [128, 784, 512], [1, 1024, 1024]]
    } else {
        args.chunks(3).map(|c| [c[0], c[1], c[2]]).collect()
    };
    for [m, k, n] in shapes {
        let mut line = format!("{m} x {k} x {n}:");
        let chosen = gflops(WgpuOptions::default(), m, k, n)?;
        line += &format!(" chosen {chosen:.2}");
        for kernel in MatMulKernel::ALL {
            if kernel == MatMulKernel::Skinny && m.min(n) > 64 {
                continue; // a thread per output: minutes on a software adapter
            }
            let g = gflops(WgpuOptions { matmul_kernel: Some(kernel), ..WgpuOptions::default() }, m, k, n)?;
            line += &format!(" {kernel:?} {g:.2}");
        }
        println!("{line} GFLOP/s");
    }
    Ok(())
}
