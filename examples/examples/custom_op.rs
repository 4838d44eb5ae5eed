//! Custom gradients two ways:
//! - a fused swish as a custom op: CPU forward, WGSL kernel (validated by
//!   naga at registration), backward in kiln ops; `check_custom_op` compares
//!   the WGSL forward with the CPU one on wgpu (when this machine has an
//!   adapter) and checks first and second derivatives;
//! - a straight-through quantiser: `custom_vjp` around a rounding custom op
//!   (CPU + WGSL, no gradient of its own), whose values and gradients are
//!   checked exactly on the CPU and on wgpu.
//! Exits with status 1 when a check fails.
//!
//! cargo run --release -p kiln-examples --example custom_op
//!
//! KILN_EXAMPLE_WRONG_BACKWARD=1 registers both with a wrong backward (swish
//! without its x·s·(1 − s) term, the quantiser without its clipping), which
//! the checks catch: the example then exits with status 1.

use kiln::prelude::*;
use kiln_examples::custom_op::{check_quantiser, check_round_parity, check_swish, quantise, swish_op};

fn main() {
    match run() {
        Ok(true) => println!("all checks passed"),
        Ok(false) => {
            println!("a check FAILED");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}

fn run() -> Result<bool> {
    let wrong = kiln_examples::env_flag("KILN_EXAMPLE_WRONG_BACKWARD");
    if wrong {
        println!("KILN_EXAMPLE_WRONG_BACKWARD: registering deliberately wrong backwards");
    }
    let devices: Vec<Device> = match Device::from_name("wgpu") {
        Ok(d) => {
            println!("wgpu adapter: {}", d.name());
            vec![d]
        }
        Err(e) => {
            println!("no wgpu adapter ({}): CPU checks only", e.message());
            vec![]
        }
    };

    // The swish op used like any other op.
    let cpu = Device::cpu();
    let graph = Graph::new(&cpu);
    let x = graph.variable(&[-2.0f32, -0.5, 0.0, 0.5, 2.0], &[5])?;
    let y = swish_op(wrong)?.apply(&[x])?;
    y.sum_all()?.backward()?;
    let dx = x.grad().ok_or_else(|| Error::autograd("swish", "no gradient"))?;
    println!("swish({:?}) = {:?}", x.to_vec_blocking::<f32>()?, y.to_vec_blocking::<f32>()?);
    println!("d/dx sum(swish(x)) = {:?}", dx.to_vec_blocking::<f32>()?);

    let mut passed = true;
    let swish = check_swish(wrong, &devices)?;
    print!("{swish}");
    passed &= swish.passed();

    let round = check_round_parity(&devices)?;
    print!("{round}");
    passed &= round.passed();

    let graph = Graph::new(&cpu);
    let x = graph.variable(&[-1.3f32, -0.3, 0.1, 0.37, 0.9, 1.2], &[6])?;
    let q = quantise(x, wrong)?;
    q.sum_all()?.backward()?;
    println!(
        "quantise({:?}) = {:?}, straight-through gradient {:?}",
        x.to_vec_blocking::<f32>()?,
        q.to_vec_blocking::<f32>()?,
        x.grad().ok_or_else(|| Error::autograd("quantise", "no gradient"))?.to_vec_blocking::<f32>()?
    );
    for device in std::iter::once(&cpu).chain(&devices) {
        let report = check_quantiser(device, wrong)?;
        println!("{report}");
        passed &= report.passed();
    }
    Ok(passed)
}
