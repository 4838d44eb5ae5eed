//! Activation checkpointing on a character-level GPT (context 256, 4
//! layers, width 128, 4 heads, dropout 0.1, batch 4; 3 steps per mode, the
//! first untimed): peak device memory and forward+backward time with every
//! block's activations kept and with each block recomputed in backward,
//! then a bit-for-bit comparison of the loss and all parameter gradients.
//! Exits with status 1 when the gradients differ.
//!
//! cargo run --release -p kiln-examples --example activation_checkpointing [-- TEXT_FILE[.gz]] [LAYERS]
//!
//! Without a text file the tokens are random characters (the figures do
//! not depend on the text). KILN_DEVICE=wgpu runs it on wgpu.
//! KILN_EXAMPLE_PERTURB=1 scales the checkpointed run's loss by 1 + 1e-6
//! to show that the check fails (exit status 1) when gradients differ.

use kiln::gpt::{load_text, TextData};
use kiln::prelude::*;
use kiln_examples::checkpointing::{compare, synthetic_tokens, ModeFigures, Setup};

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}

fn run() -> Result<bool> {
    let mut setup = Setup::example();
    setup.perturb = kiln_examples::env_flag("KILN_EXAMPLE_PERTURB");
    let mut text = None;
    for arg in std::env::args().skip(1) {
        match arg.parse::<usize>() {
            Ok(layers) => setup.config.layers = layers,
            Err(_) => text = Some(arg),
        }
    }
    let tokens = match &text {
        Some(path) => {
            let data = TextData::new(&load_text(std::path::Path::new(path))?, setup.config.context)?;
            setup.config.vocab = data.vocab.len();
            data.train
        }
        None => synthetic_tokens(setup.config.vocab, 20_000, 1),
    };
    let device = Device::best()?;
    let c = setup.config;
    println!(
        "char-level GPT on {}: context {}, {} layers, width {}, {} heads, dropout {}, vocab {}, batch {}, {} steps per mode{}",
        device.name(),
        c.context,
        c.layers,
        c.width,
        c.heads,
        c.dropout,
        c.vocab,
        setup.batch,
        setup.steps,
        if setup.perturb { " (KILN_EXAMPLE_PERTURB: checkpointed loss scaled by 1 + 1e-6)" } else { "" }
    );
    let report = compare(&device, &setup, &tokens)?;
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let line = |m: &ModeFigures| {
        println!(
            "  checkpointing {:<3}: peak {:>7.1} MiB (step {:>7.1} MiB above the {:.1} MiB resident), forward+backward {:>8.1} ms",
            if m.checkpointing { "on" } else { "off" },
            mib(m.peak_bytes),
            mib(m.step_bytes()),
            mib(m.resident_bytes),
            m.median_ms
        )
    };
    line(&report.off);
    line(&report.on);
    println!(
        "  checkpointing on / off: peak memory {:.2}x, step memory {:.2}x, time {:.2}x",
        report.on.peak_bytes as f64 / report.off.peak_bytes as f64,
        report.on.step_bytes() as f64 / report.off.step_bytes().max(1) as f64,
        report.on.median_ms / report.off.median_ms
    );
    if report.identical() {
        println!(
            "  gradients bit-identical: yes ({} values compared: losses and every parameter gradient)",
            report.compared
        );
        Ok(true)
    } else {
        println!("  gradients bit-identical: NO ({} of {} values differ)", report.differing, report.compared);
        if let Some((name, step, i, off, on)) = &report.first_difference {
            println!("  first difference: {name} step {step} element {i}: {off:e} without, {on:e} with checkpointing");
        }
        Ok(false)
    }
}
