//! `kiln train` with numbers no run can use, and the order of what it
//! writes (issue 9): one-line errors, never a panic; the model saved before
//! the optional plot; `--epochs 0 --load` evaluates what it loaded.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).env("KILN_DEVICE", "cpu").output().expect("run kiln")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The run failed with exit code 1 and a single `error:` line mentioning
/// every needle (no panic, no backtrace).
#[track_caller]
fn refused(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    for needle in needles {
        assert!(lines[0].contains(needle), "should mention {needle:?}: {stderr}");
    }
}

#[test]
fn bad_numbers_are_one_line_errors() {
    refused(&kiln(&["train", "--batch-size", "0"]), &["--batch-size"]);
    refused(&kiln(&["train", "--hidden", "18446744073709551615"]), &["--hidden"]);
    refused(&kiln(&["train", "--hidden", "100000000"]), &["--hidden"]);
    refused(&kiln(&["train", "--hidden", "64,0"]), &["--hidden 0"]);
    refused(&kiln(&["train", "--model", "cnn", "--hidden", "64"]), &["--hidden", "CNN"]);
    refused(&kiln(&["train", "--lr", "NaN"]), &["--lr"]);
    refused(&kiln(&["train", "--lr=-1"]), &["--lr"]);
}

fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b.extend_from_slice(data);
    b
}

#[test]
fn an_empty_training_set_is_an_error() {
    let dir = temp_dir("empty");
    let write = |name: &str, bytes: Vec<u8>| std::fs::write(dir.join(name), bytes).unwrap();
    write("train-images-idx3-ubyte", idx(&[0, 28, 28], &[]));
    write("train-labels-idx1-ubyte", idx(&[0], &[]));
    write("t10k-images-idx3-ubyte", idx(&[1, 28, 28], &[0; 784]));
    write("t10k-labels-idx1-ubyte", idx(&[1], &[3]));
    let out = kiln(&["train", "--dataset", "mnist", "--data", dir.to_str().unwrap(), "--epochs", "1"]);
    refused(&out, &["training set is empty"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// "test accuracy NN.NN%" from a run's output.
fn final_accuracy(out: &Output) -> f64 {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("test accuracy")).unwrap_or_else(|| panic!("{stdout}"));
    line.trim_start_matches("test accuracy ").split('%').next().unwrap().parse().unwrap()
}

#[test]
fn the_model_is_saved_before_the_plot_and_epochs_0_evaluates_it() {
    let dir = temp_dir("order");
    let model = dir.join("m.safetensors");
    let bad_plot = Path::new("/nonexistent-kiln-dir/plot.png");
    let out =
        kiln(&["train", "--epochs", "2", "--save", model.to_str().unwrap(), "--plot", bad_plot.to_str().unwrap()]);
    refused(&out, &["plot.png"]);
    assert!(model.exists(), "the trained model was saved although the plot failed");
    let trained = final_accuracy(&out);
    let out =
        kiln(&["train", "--epochs", "0", "--load", model.to_str().unwrap(), "--plot", bad_plot.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(final_accuracy(&out), trained, "the loaded model was evaluated");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kiln sample` refuses a request it cannot serve with its error alone
/// (nothing on stdout: the prompt is printed with the first generated
/// character), negative numbers included (`--temperature -1` reaches kiln's
/// check rather than clap's "unexpected argument").
#[test]
fn sample_refusals_print_only_the_error() {
    let dir = temp_dir("sample");
    let text = dir.join("text.txt");
    let line = "To be, or not to be, that is the question.\n";
    std::fs::write(&text, line.repeat(60)).unwrap();
    let ckpt = dir.join("gpt.safetensors");
    let (text_s, ckpt_s) = (text.to_str().unwrap(), ckpt.to_str().unwrap());
    let mut args: Vec<&str> = "train --model gpt --dataset shakespeare --steps 1 --layers 1 --heads 1 --width 8 \
         --context 8 --eval-interval 100000 --final-eval-batches 1"
        .split_whitespace()
        .collect();
    args.extend(["--data", text_s, "--checkpoint", ckpt_s]);
    let out = kiln(&args);
    assert!(out.status.success(), "train: {}", String::from_utf8_lossy(&out.stderr));
    let sample = |extra: &[&str]| {
        let mut args = vec!["sample", "--load", ckpt_s, "--prompt", "To be"];
        args.extend_from_slice(extra);
        kiln(&args)
    };
    for (extra, needle) in [
        (&["--temperature", "-1"][..], "temperature -1"),
        (&["--temperature", "0"][..], "temperature 0"),
        (&["--top-k", "0"][..], "k = 0"),
    ] {
        let out = sample(extra);
        refused(&out, &[needle]);
        assert!(out.stdout.is_empty(), "{extra:?} printed {:?}", String::from_utf8_lossy(&out.stdout));
    }
    let out = kiln(&["sample", "--load", ckpt_s, "--prompt", "Zebra\u{65e5}"]);
    refused(&out, &["not in the vocabulary"]);
    assert!(out.stdout.is_empty());
    let out = sample(&["--tokens", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "To be\n");
    let out = sample(&["--tokens", "5", "--seed", "3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.starts_with("To be") && printed.chars().count() == "To be".len() + 5 + 1, "{printed:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
