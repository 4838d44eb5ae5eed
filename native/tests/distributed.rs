//! Data-parallel training over MPI, end to end: this test binary launches
//! itself (and the `kiln` binary) under `mpirun` with 2 and 4 processes.
//!
//! Run: `cargo test --release -p kiln --features mpi --test distributed`
//! (Open MPI's `mpirun` on PATH). Started with `KILN_DIST_SCENARIO` set,
//! the binary is one MPI process of a scenario instead of the test driver.
//!
//! Checked:
//! - N = 2 and 4 processes, K = 20 steps, MLP and CNN on the digits: the
//!   parameters equal one process's on the whole batch within summation
//!   tolerance; two runs are bit-identical; every rank holds the same bits;
//!   bucket size and overlap do not change a bit (the order of the sum is
//!   per element, by rank, whatever the packing);
//! - the same on a wgpu device (Vulkan; asserted present under CI);
//! - `mpirun -np 4 kiln train --distributed` trains the digits MLP and
//!   prints the test accuracy; a snapshot made on 2 processes resumes on 4;
//! - `kiln train --distributed --model gpt` on 2 processes ends where one
//!   process does, and a checkpoint made on 2 resumes on 3;
//! - a rank that errors, dies or hangs ends the job with a clear message in
//!   seconds; different models on different ranks are refused at start-up,
//!   naming the first differing parameter.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln::data::{load_embedded_digits, Dataset};
use kiln::distributed::{gather, DataParallel, DataParallelOptions, DistributedSampler, World};
use kiln::gpt::{Gpt, GptConfig};
use kiln::nn::{cross_entropy, Module, Sequential};
use kiln::optim::{Optimizer, Sgd};
use kiln::prelude::Adam;
use kiln::{models, BlockingParam, Device, DeviceSelection, Graph, HostData, Result};

const STEPS: usize = 20;
const GLOBAL_BATCH: usize = 64;
const SEED: u64 = 5;

// ----- what every process of a scenario runs --------------------------------

fn build(device: &Device, model: &str, hidden: usize) -> Result<Sequential> {
    match model {
        "mlp" => models::mlp(device, &[64, hidden, 10], SEED),
        "cnn" => models::cnn(device, [1, 8, 8], 10, SEED),
        other => panic!("unknown model {other}"),
    }
}

fn optimizer_for(kind: &str, model: &Sequential) -> Result<Box<dyn Optimizer>> {
    Ok(match kind {
        "sgd" => Box::new(Sgd::with_options(model.parameters(), 0.05, 0.9, 0.0, false)?),
        _ => Box::new(Adam::new(model.parameters(), 3e-3)?),
    })
}

fn flat_values(model: &Sequential) -> Vec<f32> {
    let mut out = Vec::new();
    for p in model.parameters() {
        match p.value_blocking().unwrap() {
            HostData::F32(v) => out.extend(v),
            other => panic!("f32 expected, got {}", other.dtype()),
        }
    }
    out
}

fn write_f32(path: &Path, values: &[f32]) {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// K data-parallel steps; every rank writes its parameters.
fn scenario_train(world: &World, out: &Path, device: &Device) -> Result<()> {
    let split = load_embedded_digits(0.2, 0)?;
    let bucket_bytes: usize = std::env::var("KILN_DIST_BUCKET").map(|b| b.parse().unwrap()).unwrap_or(4 << 20);
    let overlap = std::env::var("KILN_DIST_OVERLAP").map(|o| o == "1").unwrap_or(true);
    let optimizer_kind = std::env::var("KILN_DIST_OPTIMIZER").unwrap_or_else(|_| "sgd".into());
    let fault = std::env::var("KILN_DIST_FAULT").unwrap_or_default();
    let models: Vec<String> =
        std::env::var("KILN_DIST_MODELS").unwrap_or_else(|_| "mlp,cnn".into()).split(',').map(String::from).collect();
    for name in &models {
        let model = build(device, name, 32)?;
        let mut ddp = DataParallel::new(world, &model, DataParallelOptions { bucket_bytes, overlap })?;
        let mut optimizer = optimizer_for(&optimizer_kind, &model)?;
        let sampler = DistributedSampler::new(split.train.len, GLOBAL_BATCH, world.rank(), world.size(), Some(SEED))?;
        let mut graph = Graph::new(device);
        for shard in sampler.epoch(0, 0).into_iter().take(STEPS) {
            if shard.step == 3 && world.rank() == world.size() - 1 {
                match fault.as_str() {
                    // A real kiln error on one rank: images of the wrong width.
                    "error" => {
                        let x = graph.tensor_from(&[0.0f32; 63], &[1, 63])?;
                        model.forward(x)?;
                    }
                    // Killed outright: no destructor, no MPI call.
                    "die" => {
                        let pid = std::process::id().to_string();
                        let _ = Command::new("kill").args(["-KILL", &pid]).status();
                        std::thread::sleep(Duration::from_secs(60));
                    }
                    "hang" => std::thread::sleep(Duration::from_secs(120)),
                    _ => {}
                }
            }
            graph.reset();
            let batch = gather(&split.train, &shard.indices)?;
            let x = graph.tensor_from(&batch.images, &[batch.len, 64])?;
            let y = graph.tensor_from(&batch.labels, &[batch.len])?;
            let loss = cross_entropy(model.forward(x)?, y)?;
            optimizer.zero_grad();
            ddp.backward(loss, shard.weight())?;
            optimizer.step()?;
        }
        write_f32(&out.join(format!("{name}-rank{}.bin", world.rank())), &flat_values(&model));
        if world.is_root() {
            let stats = ddp.stats();
            println!("{name}: {} buckets, {} left during backward", ddp.buckets(), stats.overlapped_buckets);
        }
    }
    Ok(())
}

/// Ranks build models that differ; every rank must get the error.
fn scenario_mismatch(world: &World) -> Result<()> {
    let device = Device::cpu();
    let last = world.rank() == world.size() - 1;
    // A different width on the last rank: the first parameter differs.
    let model = build(&device, "mlp", if last { 48 } else { 32 })?;
    let err = DataParallel::new(world, &model, DataParallelOptions::default()).err().expect("a width mismatch");
    if world.is_root() {
        println!("width mismatch: {err}");
    }
    // An extra layer on the last rank: the parameter count differs.
    let widths: &[usize] = if last { &[64, 32, 32, 10] } else { &[64, 32, 10] };
    let model = models::mlp(&device, widths, SEED)?;
    let err = DataParallel::new(world, &model, DataParallelOptions::default()).err().expect("a depth mismatch");
    if world.is_root() {
        println!("depth mismatch: {err}");
    }
    // Agreement afterwards still works (the failed handshakes left no debris).
    let model = build(&device, "mlp", 32)?;
    DataParallel::new(world, &model, DataParallelOptions::default())?;
    if world.is_root() {
        println!("agreement ok");
    }
    Ok(())
}

fn child(scenario: &str) {
    let world = World::init().expect("MPI init");
    let result = match scenario {
        "train" => {
            let out = PathBuf::from(std::env::var("KILN_DIST_OUT").expect("KILN_DIST_OUT"));
            let device = Device::from_name(&std::env::var("KILN_DIST_DEVICE").unwrap_or_else(|_| "cpu".into()));
            device.and_then(|d| scenario_train(&world, &out, &d))
        }
        "mismatch" => scenario_mismatch(&world),
        other => panic!("unknown scenario {other}"),
    };
    world.abort_on_error(result);
}

// ----- the driver ------------------------------------------------------------

/// One process on the whole global batch: the plain loop, no MPI.
fn reference(model_name: &str, optimizer_kind: &str) -> Vec<f32> {
    let device = Device::cpu();
    let split = load_embedded_digits(0.2, 0).unwrap();
    let model = build(&device, model_name, 32).unwrap();
    let mut optimizer = optimizer_for(optimizer_kind, &model).unwrap();
    let mut graph = Graph::new(&device);
    for batch in split.train.batches(GLOBAL_BATCH, Some(SEED), 0).unwrap().take(STEPS) {
        graph.reset();
        let x = graph.tensor_from(&batch.images, &[batch.len, 64]).unwrap();
        let y = graph.tensor_from(&batch.labels, &[batch.len]).unwrap();
        let loss = cross_entropy(model.forward(x).unwrap(), y).unwrap();
        optimizer.zero_grad();
        loss.backward().unwrap();
        optimizer.step().unwrap();
    }
    let _: &Dataset = &split.train;
    flat_values(&model)
}

struct Run {
    status: std::process::ExitStatus,
    output: String,
    seconds: f64,
}

fn mpirun(np: usize, program: &Path, args: &[&str], env: &[(&str, String)]) -> Run {
    let mut command = Command::new("mpirun");
    command
        .args(["-np", &np.to_string(), "--oversubscribe", "--allow-run-as-root"])
        // Quiet the transports this container cannot use; keep the job on this machine.
        .args(["--mca", "btl", "self,vader", "--bind-to", "none"])
        .arg(program)
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // Several processes share two cores: one kernel thread each.
        .env("RAYON_NUM_THREADS", "1")
        .stdin(Stdio::null());
    for (k, v) in env {
        command.env(k, v);
    }
    let start = Instant::now();
    let out = command.output().expect("mpirun (Open MPI) must be on PATH; scripts/test installs it");
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Run { status: out.status, output, seconds: start.elapsed().as_secs_f64() }
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-dist-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn self_exe() -> PathBuf {
    std::env::current_exe().unwrap()
}

/// Largest |a − b| / (atol + rtol·|b|): at most 1 passes.
fn tolerance_ratio(a: &[f32], b: &[f32], atol: f64, rtol: f64) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).abs() / (atol + rtol * (y as f64).abs())).fold(0.0, f64::max)
}

fn train_run(np: usize, dir: &Path, env: &[(&str, String)]) -> Run {
    let mut all = vec![("KILN_DIST_SCENARIO", "train".to_string()), ("KILN_DIST_OUT", dir.display().to_string())];
    all.extend(env.iter().cloned());
    let run = mpirun(np, &self_exe(), &[], &all);
    assert!(run.status.success(), "mpirun -np {np} failed:\n{}", run.output);
    run
}

/// Bits of every rank's parameters agree; returns rank 0's.
fn replicas_agree(dir: &Path, model: &str, np: usize) -> Vec<f32> {
    let first = read_f32(&dir.join(format!("{model}-rank0.bin")));
    for r in 1..np {
        let other = read_f32(&dir.join(format!("{model}-rank{r}.bin")));
        assert!(first == other, "{model}: rank {r}'s parameters differ from rank 0's in {}", dir.display());
    }
    first
}

fn same_answer_as_one_process() {
    let references: Vec<(&str, Vec<f32>)> = ["mlp", "cnn"].iter().map(|m| (*m, reference(m, "sgd"))).collect();
    for np in [2, 4] {
        let dirs: Vec<PathBuf> =
            ["a", "again", "small", "late"].iter().map(|r| scratch_dir(&format!("same-{np}-{r}"))).collect();
        train_run(np, &dirs[0], &[]);
        train_run(np, &dirs[1], &[]);
        // Small buckets (several messages), leaving during backward.
        let run = train_run(np, &dirs[2], &[("KILN_DIST_BUCKET", "8192".into())]);
        print!("{}", run.output);
        for model in ["mlp", "cnn"] {
            let line = run.output.lines().find(|l| l.starts_with(&format!("{model}:"))).expect("a bucket report");
            assert!(!line.contains(" 0 left during backward"), "no bucket overlapped backward: {line}");
        }
        // The same small buckets, exchanged after backward only.
        train_run(np, &dirs[3], &[("KILN_DIST_BUCKET", "8192".into()), ("KILN_DIST_OVERLAP", "0".into())]);
        for (model, expected) in &references {
            let runs: Vec<Vec<f32>> = dirs.iter().map(|d| replicas_agree(d, model, np)).collect();
            assert!(runs[0] == runs[1], "{model}, {np} processes: two identical runs differ");
            assert!(runs[0] == runs[2], "{model}, {np} processes: small buckets changed the result");
            assert!(runs[0] == runs[3], "{model}, {np} processes: exchanging after backward changed the result");
            let ratio = tolerance_ratio(&runs[0], expected, 1e-6, 1e-5);
            let max_diff = runs[0].iter().zip(expected).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            println!(
                "{model}, {np} processes, {STEPS} SGD steps: max |difference| to one process {max_diff:.3e} \
                 ({:.1}% of tolerance); bit-identical over 2 runs, 2 bucket sizes, with and without overlap",
                ratio * 100.0
            );
            assert!(ratio <= 1.0, "{model}, {np} processes: {max_diff} from the single-process parameters");
        }
        for d in dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn same_answer_with_adam() {
    // Adam divides by the gradient's running magnitude, so summation noise
    // in near-zero gradients moves parameters by up to lr per step: the
    // comparison is looser, the bit-identity as strict.
    let expected = reference("mlp", "adam");
    let env = [("KILN_DIST_OPTIMIZER", "adam".to_string()), ("KILN_DIST_MODELS", "mlp".to_string())];
    let a = scratch_dir("adam-a");
    let b = scratch_dir("adam-b");
    train_run(4, &a, &env);
    train_run(4, &b, &env);
    let first = replicas_agree(&a, "mlp", 4);
    assert!(first == replicas_agree(&b, "mlp", 4), "Adam: two runs differ");
    let max_diff = first.iter().zip(&expected).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    println!("mlp, 4 processes, {STEPS} Adam steps: max |difference| to one process {max_diff:.3e}");
    assert!(max_diff < 1e-4, "Adam: {max_diff}");
    let _ = std::fs::remove_dir_all(a);
    let _ = std::fs::remove_dir_all(b);
}

fn same_answer_on_wgpu() {
    if Device::from_name("vulkan").is_err() {
        assert!(std::env::var_os("CI").is_none(), "CI must have a Vulkan adapter (scripts/test installs lavapipe)");
        println!("no Vulkan adapter: the wgpu data-parallel check did not run");
        return;
    }
    let expected = reference("mlp", "sgd");
    let dir = scratch_dir("wgpu");
    let env = [("KILN_DIST_DEVICE", "vulkan".to_string()), ("KILN_DIST_MODELS", "mlp".to_string())];
    train_run(2, &dir, &env);
    let got = replicas_agree(&dir, "mlp", 2);
    let ratio = tolerance_ratio(&got, &expected, 1e-5, 1e-4);
    println!("mlp on wgpu, 2 processes: {:.1}% of the CPU tolerance", ratio * 100.0);
    assert!(ratio <= 1.0, "wgpu data-parallel run differs from the CPU single process");
    let _ = std::fs::remove_dir_all(dir);
}

fn faults_end_the_job_quickly() {
    // Generous bounds: they catch a hang, not slowness.
    let dir = scratch_dir("faults");
    for (fault, np, expect) in
        [("error", 4, "error: rank 3 of 4"), ("die", 4, "signal 9"), ("hang", 2, "did not complete within 3 s")]
    {
        let env = [
            ("KILN_DIST_SCENARIO", "train".to_string()),
            ("KILN_DIST_OUT", dir.display().to_string()),
            ("KILN_DIST_FAULT", fault.to_string()),
            ("KILN_DIST_MODELS", "mlp".to_string()),
            ("KILN_DIST_TIMEOUT", "3".to_string()),
        ];
        let run = mpirun(np, &self_exe(), &[], &env);
        println!("fault '{fault}' on {np} processes: job ended in {:.1} s with {}", run.seconds, run.status);
        assert!(!run.status.success(), "fault '{fault}': the job reported success\n{}", run.output);
        assert!(run.output.contains(expect), "fault '{fault}': no '{expect}' in:\n{}", run.output);
        assert!(run.seconds < 60.0, "fault '{fault}': took {:.0} s", run.seconds);
        if fault == "error" {
            assert!(run.output.contains("63"), "the kiln error itself is shown:\n{}", run.output);
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn mismatches_are_named_at_start_up() {
    let run = mpirun(4, &self_exe(), &[], &[("KILN_DIST_SCENARIO", "mismatch".to_string())]);
    print!("{}", run.output);
    assert!(run.status.success(), "{}", run.output);
    let width = run.output.lines().find(|l| l.starts_with("width mismatch")).expect("width line");
    assert!(width.contains("'0.weight'") && width.contains("[32, 64]") && width.contains("[48, 64]"), "{width}");
    assert!(width.contains("rank 3"), "{width}");
    let depth = run.output.lines().find(|l| l.starts_with("depth mismatch")).expect("depth line");
    assert!(depth.contains("'2.weight'") && depth.contains("[10, 32]") && depth.contains("[32, 32]"), "{depth}");
    assert!(run.output.contains("agreement ok"));
}

/// The number in `kiln train`'s last "test accuracy N% after …" line.
fn final_accuracy(output: &str) -> f64 {
    output
        .lines()
        .find_map(|l| l.strip_prefix("test accuracy "))
        .and_then(|rest| rest.split('%').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no test accuracy in:\n{output}"))
}

fn cli_trains_and_resumes() {
    // KILN_BIN: the binary when this test runs away from its build tree.
    let kiln = std::env::var_os("KILN_BIN").map(PathBuf::from).unwrap_or_else(|| env!("CARGO_BIN_EXE_kiln").into());
    let dir = scratch_dir("cli");
    let plot = dir.join("plot.png").display().to_string();
    // No other flags: the digits MLP, test accuracy printed.
    let run = mpirun(4, &kiln, &["train", "--distributed", "--plot", &plot], &[]);
    assert!(run.status.success(), "{}", run.output);
    let accuracy = final_accuracy(&run.output);
    println!("mpirun -np 4 kiln train --distributed: {accuracy:.2}% test accuracy in {:.1} s", run.seconds);
    assert!(accuracy > 90.0, "{}", run.output);
    let finals = run.output.lines().filter(|l| l.starts_with("test accuracy ")).count();
    assert_eq!(finals, 1, "rank 0 alone reports:\n{}", run.output);

    // The CNN through the CLI: the same accuracy as one process.
    let cnn_args = ["train", "--model", "cnn", "--epochs", "2", "--plot", &plot];
    let one = Command::new(&kiln).args(cnn_args).env("RAYON_NUM_THREADS", "1").output().unwrap();
    assert!(one.status.success(), "{}", String::from_utf8_lossy(&one.stderr));
    let one = final_accuracy(&String::from_utf8_lossy(&one.stdout));
    let mut distributed_args = vec!["train", "--distributed"];
    distributed_args.extend(&cnn_args[1..]);
    let run = mpirun(2, &kiln, &distributed_args, &[]);
    assert!(run.status.success(), "{}", run.output);
    let two = final_accuracy(&run.output);
    println!("kiln train --model cnn --epochs 2: {one:.2}% on one process, {two:.2}% on 2");
    assert!((one - two).abs() <= 1.0, "CNN: {one}% on one process, {two}% on two");

    // 4 epochs straight on 2 processes, against 2 epochs on 2 then 2 more on 4.
    let straight = dir.join("straight.safetensors").display().to_string();
    let resumed = dir.join("resumed.safetensors").display().to_string();
    let again = dir.join("again.safetensors").display().to_string();
    let snap = dir.join("snap").display().to_string();
    let base = ["train", "--distributed", "--plot", &plot, "--seed", "3"];
    let with = |extra: &[&str]| -> Vec<String> { base.iter().chain(extra).map(|s| s.to_string()).collect() };
    let run_cli = |np: usize, args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = mpirun(np, &kiln, &args, &[]);
        assert!(run.status.success(), "{args:?}:\n{}", run.output);
        run
    };
    run_cli(2, with(&["--epochs", "4", "--save", &straight]));
    run_cli(2, with(&["--epochs", "2", "--checkpoint-dir", &snap, "--checkpoint-every", "10"]));
    let resumed_run = run_cli(4, with(&["--epochs", "4", "--resume", &snap, "--save", &resumed]));
    assert!(resumed_run.output.contains("resuming"), "{}", resumed_run.output);
    run_cli(2, with(&["--epochs", "4", "--resume", &snap, "--save", &again]));
    let load = |path: &str| {
        let device = Device::cpu();
        let model = models::mlp(&device, &[64, 128, 10], 0).unwrap();
        kiln::checkpoint::load(path, &model).unwrap();
        flat_values(&model)
    };
    let (s, r, a) = (load(&straight), load(&resumed), load(&again));
    assert!(s == a, "resuming on the same number of processes is exact");
    let max_diff = s.iter().zip(&r).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    println!("resumed on 4 processes after 2 epochs on 2: max |difference| {max_diff:.3e} to the straight run");
    assert!(max_diff < 1e-4, "resume on another process count drifted by {max_diff}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A GPT checkpoint's parameters, flattened in the model's order.
fn gpt_values(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config = GptConfig::from_metadata(&kiln::checkpoint::read_metadata(&bytes).unwrap()).unwrap();
    let model = Gpt::new(&Device::cpu(), config, 0).unwrap();
    kiln::checkpoint::load_state(&model, &bytes).unwrap();
    model.parameters().iter().flat_map(|p| p.value_blocking().unwrap().to_f64_vec()).map(|v| v as f32).collect()
}

/// The number in the GPT run's "after N steps: train loss X, …" line.
fn gpt_final_train_loss(output: &str) -> f64 {
    output
        .lines()
        .find_map(|l| l.split_once(": train loss ").filter(|(head, _)| head.starts_with("after ")))
        .and_then(|(_, rest)| rest.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no final train loss in:\n{output}"))
}

fn gpt_matches_one_process_and_resumes() {
    let kiln = std::env::var_os("KILN_BIN").map(PathBuf::from).unwrap_or_else(|| env!("CARGO_BIN_EXE_kiln").into());
    let dir = scratch_dir("gpt");
    let text: String =
        (0..300).map(|i| format!("line {i}: {} quick foxes jump over {} lazy dogs.\n", i % 7, (i * 5) % 11)).collect();
    let data = dir.join("text.txt");
    std::fs::write(&data, text).unwrap();
    let (data, plot) = (data.display().to_string(), dir.join("plot.png").display().to_string());
    let checkpoint = |name: &str| dir.join(format!("{name}.safetensors"));
    // A tiny model; the learning rate is high for the warm-up's first steps
    // (lr·(s+1)/101) so that 6 steps move the parameters by far more than
    // the tolerance. The global batch of 8 splits 4+4 on 2, 3+3+2 on 3.
    let args = |steps: &str, name: &str| -> Vec<String> {
        let out = checkpoint(name).display().to_string();
        [
            "train",
            "--model",
            "gpt",
            "--dataset",
            "shakespeare",
            "--data",
            &data,
            "--device",
            "cpu",
            "--layers",
            "1",
            "--heads",
            "2",
            "--width",
            "16",
            "--context",
            "16",
            "--batch-size",
            "8",
            "--lr",
            "0.05",
            "--steps",
            steps,
            "--eval-interval",
            "2",
            "--eval-batches",
            "3",
            "--final-eval-batches",
            "3",
            "--save-every",
            "0",
            "--plot",
            &plot,
            "--checkpoint",
            &out,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let one = Command::new(&kiln).args(args("6", "one")).env("RAYON_NUM_THREADS", "1").output().unwrap();
    let one_output = String::from_utf8_lossy(&one.stdout).to_string();
    assert!(one.status.success(), "{one_output}{}", String::from_utf8_lossy(&one.stderr));
    let distributed = |np: usize, mut args: Vec<String>, extra: &[&str]| {
        args.insert(1, "--distributed".into());
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = mpirun(np, &kiln, &args, &[]);
        assert!(run.status.success(), "mpirun -np {np} {args:?}:\n{}", run.output);
        run
    };
    let two = distributed(2, args("6", "two"), &[]);
    assert_eq!(two.output.matches("after 6 steps").count(), 1, "rank 0 alone reports:\n{}", two.output);
    assert!(two.output.contains("2 processes"), "{}", two.output);
    // 3 steps on 2 processes, then on to 6 on 3 processes.
    distributed(2, args("3", "half"), &[]);
    let half = checkpoint("half").display().to_string();
    let resumed = distributed(3, args("6", "resumed"), &["--resume", &half]);
    assert!(resumed.output.contains("at step 3"), "{}", resumed.output);

    let expected = gpt_values(&checkpoint("one"));
    let moved = max_abs_diff(&expected, &gpt_values(&checkpoint("half")));
    for (what, name, output) in [("2 processes", "two", &two.output), ("resumed on 3", "resumed", &resumed.output)] {
        let got = gpt_values(&checkpoint(name));
        let diff = max_abs_diff(&got, &expected);
        let (loss_one, loss_got) = (gpt_final_train_loss(&one_output), gpt_final_train_loss(output));
        println!(
            "gpt, {what}: max |difference| to one process {diff:.3e} (steps 4-6 moved parameters by up to \
             {moved:.3e}); final train loss {loss_got:.5} vs {loss_one:.5}"
        );
        assert!(diff < 2e-5, "gpt, {what}: parameters {diff} from one process's");
        assert!((loss_one - loss_got).abs() < 5e-4, "gpt, {what}: final loss {loss_got} vs {loss_one}");
    }
    assert!(moved > 1e-3, "the test is blind: 3 more steps moved the parameters by only {moved}");
    let _ = std::fs::remove_dir_all(dir);
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max)
}

/// Mesa's Wayland probe prints "XDG_RUNTIME_DIR is invalid" without a
/// private runtime directory (as the kiln CLI, give it one); set before any
/// thread starts, inherited by every process launched.
fn quiet_display_probe() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join("kiln-xdg-runtime");
        if std::fs::create_dir_all(&dir).is_ok() {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
            std::env::set_var("XDG_RUNTIME_DIR", &dir);
        }
    }
}

fn main() {
    quiet_display_probe();
    if let Ok(scenario) = std::env::var("KILN_DIST_SCENARIO") {
        child(&scenario);
        return;
    }
    let tests: [(&str, fn()); 7] = [
        ("same_answer_as_one_process", same_answer_as_one_process),
        ("same_answer_with_adam", same_answer_with_adam),
        ("mismatches_are_named_at_start_up", mismatches_are_named_at_start_up),
        ("faults_end_the_job_quickly", faults_end_the_job_quickly),
        ("cli_trains_and_resumes", cli_trains_and_resumes),
        ("gpt_matches_one_process_and_resumes", gpt_matches_one_process_and_resumes),
        ("same_answer_on_wgpu", same_answer_on_wgpu),
    ];
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let mut failed = Vec::new();
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        println!("test {name} ...");
        let start = Instant::now();
        match std::panic::catch_unwind(test) {
            Ok(()) => println!("test {name} ... ok ({:.1} s)", start.elapsed().as_secs_f64()),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(name);
            }
        }
    }
    if !failed.is_empty() {
        eprintln!("failed: {failed:?}");
        std::process::exit(1);
    }
}
