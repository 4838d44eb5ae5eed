//! The extension-point examples' checks, run as tests: they pass on the
//! real code and fail on the deliberately wrong variants (what makes the
//! examples exit with status 1).

use kiln::gpt::GptConfig;
use kiln::prelude::*;
use kiln_examples::checkpointing::{compare, synthetic_tokens, Setup};
use kiln_examples::custom_op::{check_quantiser, check_round_parity, check_swish};

/// A small GPT (2 layers, context 32) so that the test is quick; the
/// example itself runs context 256.
fn small() -> Setup {
    Setup {
        config: GptConfig { vocab: 17, context: 32, layers: 2, heads: 2, width: 16, dropout: 0.1, bias: true },
        batch: 2,
        steps: 2,
        perturb: false,
    }
}

#[test]
fn checkpointing_gives_identical_gradients_and_less_memory() {
    let device = Device::cpu();
    let tokens = synthetic_tokens(17, 500, 3);
    let report = compare(&device, &small(), &tokens).unwrap();
    assert!(report.identical(), "{report:?}");
    // Loss + every gradient element of every step.
    assert!(report.compared > 2 * 1000, "{report:?}");
    assert!(report.on.step_bytes() < report.off.step_bytes(), "{report:?}");
}

#[test]
fn checkpointing_check_fails_when_the_gradients_differ() {
    let device = Device::cpu();
    let tokens = synthetic_tokens(17, 500, 3);
    let report = compare(&device, &Setup { perturb: true, ..small() }, &tokens).unwrap();
    assert!(!report.identical(), "{report:?}");
    assert!(report.first_difference.is_some());
}

#[test]
fn swish_passes_and_a_wrong_backward_fails() {
    let good = check_swish(false, &[]).unwrap();
    assert!(good.passed(), "{good}");
    assert!(good.first_order.is_some() && good.second_order.is_some());
    let bad = check_swish(true, &[]).unwrap();
    assert!(!bad.passed(), "{bad}");
}

#[test]
fn quantiser_passes_and_a_wrong_backward_fails() {
    let cpu = Device::cpu();
    let good = check_quantiser(&cpu, false).unwrap();
    assert!(good.passed(), "{good}");
    let bad = check_quantiser(&cpu, true).unwrap();
    assert!(bad.forward_mismatches == 0 && bad.gradient_mismatches > 0, "{bad}");
}

/// The WGSL kernels on wgpu (lavapipe in CI): skipped without an adapter
/// unless CI is set.
#[test]
fn wgsl_kernels_match_the_cpu() {
    let device = match Device::from_name("wgpu") {
        Ok(d) => d,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no wgpu adapter ({})", e.message());
            return;
        }
        Err(e) => panic!("CI is set but there is no wgpu adapter: {e}"),
    };
    let swish = check_swish(false, std::slice::from_ref(&device)).unwrap();
    assert!(swish.passed() && swish.parity.len() == 1, "{swish}");
    let round = check_round_parity(std::slice::from_ref(&device)).unwrap();
    assert!(round.passed() && round.parity.len() == 1, "{round}");
    let q = check_quantiser(&device, false).unwrap();
    assert!(q.passed(), "{q}");
    let bad = check_swish(true, std::slice::from_ref(&device)).unwrap();
    assert!(!bad.passed(), "{bad}");
}

/// The example binaries themselves (built by `cargo test` next to the test
/// executables): exit status 0 normally, 1 when a check fails. Skipped when
/// the binaries were not built (e.g. `cargo test --test examples` alone).
#[test]
fn examples_exit_with_status_1_when_a_check_fails() {
    let Some(dir) = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.parent()?.join("examples"))) else {
        return;
    };
    let run = |name: &str, env: &[(&str, &str)], args: &[&str]| {
        let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
        if !path.exists() {
            eprintln!("skipped: {} not built", path.display());
            return None;
        }
        let mut command = std::process::Command::new(&path);
        command.args(args).env("KILN_DEVICE", "cpu").env_remove("KILN_EXAMPLE_PERTURB");
        command.env_remove("KILN_EXAMPLE_WRONG_BACKWARD");
        for (k, v) in env {
            command.env(k, v);
        }
        let output = command.output().expect("the example runs");
        Some((output.status.code(), String::from_utf8_lossy(&output.stdout).into_owned()))
    };
    if let Some((code, out)) = run("custom_op", &[], &[]) {
        assert_eq!(code, Some(0), "{out}");
        assert!(out.contains("all checks passed"), "{out}");
    }
    if let Some((code, out)) = run("custom_op", &[("KILN_EXAMPLE_WRONG_BACKWARD", "1")], &[]) {
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains("FAILED"), "{out}");
    }
    // One layer keeps it quick; context 256 as in the default run.
    if let Some((code, out)) = run("activation_checkpointing", &[], &["1"]) {
        assert_eq!(code, Some(0), "{out}");
        assert!(out.contains("gradients bit-identical: yes"), "{out}");
    }
    if let Some((code, out)) = run("activation_checkpointing", &[("KILN_EXAMPLE_PERTURB", "1")], &["1"]) {
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains("gradients bit-identical: NO"), "{out}");
    }
}
