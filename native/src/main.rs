//! The `kiln` command-line tool: train, bench, devices.

mod gpt_cli;
mod plot;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use kiln::bench;
use kiln::data::{self, DatasetSplit};
use kiln::distributed::{Replicas, SingleProcess};
use kiln::models;
use kiln::nn::Module;
use kiln::optim::Adam;
use kiln::snapshot::{load_snapshot, save_snapshot, RunShape};
use kiln::train::{run_classifier, Position, TrainConfig};
use kiln::{Device, DeviceSelection, Error, Result};

/// Counts host allocations for `kiln bench`'s per-step counters.
#[global_allocator]
static ALLOCATOR: bench::host_heap::CountingAllocator = bench::host_heap::CountingAllocator;

#[derive(Parser)]
#[command(name = "kiln", version, about = "Train neural networks on every machine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Train a classifier (default: an MLP on the embedded 8x8 digits), or
    /// the char-level GPT (--model gpt --dataset shakespeare --data FILE).
    Train(TrainArgs),
    /// Generate text with a GPT checkpoint written by `kiln train --model gpt`.
    Sample(SampleArgs),
    /// Run the benchmark workloads of BENCHMARKS.md, printing JSON lines.
    Bench(BenchArgs),
    /// List the compute devices kiln can use.
    Devices,
    /// Print the operator coverage matrix (kernels per backend, gradient
    /// rules, first- and second-order checks run now).
    Ops {
        /// Also write the table to this Markdown file.
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DatasetName {
    /// 1,797 8x8 handwritten digits, embedded in the binary (UCI, CC BY 4.0).
    Digits,
    /// MNIST IDX files from --data.
    Mnist,
    /// Fashion-MNIST IDX files from --data.
    FashionMnist,
    /// Any text file from --data (plain or .gz), for --model gpt.
    Shakespeare,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModelName {
    /// Fully connected layers (widths from --hidden).
    Mlp,
    /// Two conv + ReLU + maxpool stages, then a 128-wide hidden layer.
    Cnn,
    /// A character-level transformer language model (nanoGPT's).
    Gpt,
}

#[derive(clap::Args)]
struct TrainArgs {
    #[arg(long, value_enum, default_value = "digits")]
    dataset: DatasetName,
    #[arg(long, value_enum, default_value = "mlp")]
    model: ModelName,
    /// Directory holding the IDX files (for mnist and fashion-mnist).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Device: best, cpu, cpu-portable, wgpu, vulkan, metal, dx12, gl (KILN_DEVICE sets the default).
    #[arg(long, env = "KILN_DEVICE", default_value = "best")]
    device: String,
    /// Epochs (default: 30 for digits, 10 otherwise).
    #[arg(long)]
    epochs: Option<usize>,
    /// Mini-batch size (default: 32 for digits, 128 otherwise).
    #[arg(long)]
    batch_size: Option<usize>,
    /// Adam learning rate (default: 3e-3 for digits, 1e-3 otherwise).
    #[arg(long, allow_negative_numbers = true)]
    lr: Option<f64>,
    /// Hidden layer widths, comma separated (default: 128 for digits, 512,256 otherwise).
    #[arg(long, value_delimiter = ',')]
    hidden: Option<Vec<usize>>,
    /// Seed for initialisation, shuffling and the digits split.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write the loss/accuracy plot.
    #[arg(long, default_value = "kiln-train.png")]
    plot: PathBuf,
    /// Save the trained model's parameters (safetensors, PyTorch state_dict keys).
    #[arg(long)]
    save: Option<PathBuf>,
    /// Start from parameters saved with --save (same --model/--hidden).
    #[arg(long)]
    load: Option<PathBuf>,
    /// GPT: optimizer steps (default 2000).
    #[arg(long)]
    steps: Option<u64>,
    /// GPT: transformer blocks, heads, width and context length.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    #[arg(long, default_value_t = 4)]
    heads: usize,
    #[arg(long, default_value_t = 128)]
    width: usize,
    #[arg(long, default_value_t = 64)]
    context: usize,
    /// GPT: dropout on attention, residual branches.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    dropout: f64,
    /// GPT: checkpoint file (model; the optimizer and schedule go to FILE.optim).
    #[arg(long, default_value = "kiln-gpt.safetensors")]
    checkpoint: PathBuf,
    /// GPT: write --checkpoint every N steps (0: only at the end). Resume a
    /// GPT run with --resume CHECKPOINT (same data and model options).
    #[arg(long, default_value_t = 500)]
    save_every: u64,
    /// GPT: evaluate the validation loss every N steps.
    #[arg(long, default_value_t = 250)]
    eval_interval: u64,
    /// GPT: random batches per evaluation during training.
    #[arg(long, default_value_t = 20)]
    eval_batches: usize,
    /// GPT: the final validation loss over N random batches instead of the
    /// whole validation split (0); the final training loss over N random
    /// batches (200 when 0).
    #[arg(long, default_value_t = 0)]
    final_eval_batches: usize,
    /// GPT: biases in the blocks' linear layers and layer norms (nanoGPT's
    /// recipe, the default, has none).
    #[arg(long)]
    bias: bool,
    /// Write a resumable snapshot (model, optimizer, position) into this
    /// directory after every epoch (and every --checkpoint-every steps).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Also snapshot every this many steps within an epoch.
    #[arg(long, default_value_t = 0, requires = "checkpoint_dir")]
    checkpoint_every: usize,
    /// Continue the run whose snapshot is in this directory (same --batch-size
    /// and --seed; any number of processes).
    #[arg(long, conflicts_with = "load")]
    resume: Option<PathBuf>,
    #[command(flatten)]
    distributed: DistributedArgs,
}

#[derive(clap::Args)]
struct SampleArgs {
    /// A checkpoint written by `kiln train --model gpt`.
    #[arg(long)]
    load: PathBuf,
    #[arg(long, default_value = "\n")]
    prompt: String,
    /// Characters to generate.
    #[arg(long, default_value_t = 500)]
    tokens: usize,
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    temperature: f64,
    /// Sample only among the k most likely characters.
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Device: best, cpu, cpu-portable, wgpu, vulkan, metal, dx12, gl (KILN_DEVICE sets the default).
    #[arg(long, env = "KILN_DEVICE", default_value = "best")]
    device: String,
}

/// Data-parallel training over MPI: start with `mpirun -np N kiln train
/// --distributed …` (a kiln built with `--features mpi`). --batch-size is
/// then the global batch, split across the processes.
#[derive(clap::Args)]
struct DistributedArgs {
    /// Train on every process mpirun started, each on its shard of every batch.
    #[arg(long)]
    distributed: bool,
    /// Largest gradient message in MiB.
    #[arg(long, default_value_t = 4.0, allow_negative_numbers = true)]
    bucket_mb: f64,
    /// Exchange gradients only after backward, not during it.
    #[arg(long)]
    no_overlap: bool,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Under mpirun (a kiln built with --features mpi): all-reduce
    /// bandwidth and latency from 4 KB to 64 MB, and the W1 step time on
    /// 1, 2, 4, … of the processes, instead of the workloads.
    #[arg(long)]
    distributed: bool,
    /// Device: best, cpu, cpu-portable, wgpu, vulkan, metal, dx12, gl (KILN_DEVICE sets the default).
    #[arg(long, env = "KILN_DEVICE", default_value = "cpu")]
    device: String,
    /// Workloads to run (W1, W2, W3, W4, GEMM = GFLOP/s of W1's and W2's
    /// matmul shapes, CKPT = activation checkpointing on the char-level
    /// GPT, BRANCH = parallel branches on 8 towers, GEMM4096 = a 4096³ product
    /// for real GPUs; with --distributed: allreduce, W1).
    #[arg(long, value_delimiter = ',', default_value = "W1,W2,W3,W4")]
    workloads: Vec<String>,
    /// Instead of the workloads: N W1 training steps (after 50 warm-up
    /// steps), printing RSS and device memory at the start and the end and
    /// their growth in percent.
    #[arg(long, value_name = "N")]
    soak: Option<usize>,
}

/// The short backend label of BENCHMARKS.md's JSON lines.
fn backend_label(device: &Device) -> &'static str {
    if device.name().starts_with("cpu") {
        "cpu"
    } else {
        "wgpu"
    }
}

fn load(args: &TrainArgs) -> Result<DatasetSplit> {
    match args.dataset {
        DatasetName::Digits => data::load_embedded_digits(0.2, args.seed),
        DatasetName::Shakespeare => Err(Error::invalid("train", "text data trains --model gpt")),
        DatasetName::Mnist | DatasetName::FashionMnist => {
            let dir = args.data.as_ref().ok_or_else(|| {
                Error::invalid("train", "--dataset mnist/fashion-mnist needs --data DIR with the IDX files")
            })?;
            data::load_mnist_dir(dir)
        }
    }
}

fn train_gpt(args: TrainArgs, world: WorldRef<'_>) -> Result<()> {
    if args.dataset != DatasetName::Shakespeare || args.model != ModelName::Gpt {
        return Err(Error::invalid(
            "train",
            "the GPT trains on text: use --model gpt --dataset shakespeare --data FILE",
        ));
    }
    let data = args
        .data
        .clone()
        .ok_or_else(|| Error::invalid("train", "--dataset shakespeare needs --data FILE (text or .gz)"))?;
    let plot =
        if args.plot == std::path::Path::new("kiln-train.png") { PathBuf::from("kiln-gpt.png") } else { args.plot };
    let parallel = args.distributed;
    gpt_cli::train(
        gpt_cli::GptArgs {
            data,
            device: args.device,
            steps: args.steps.unwrap_or(2000),
            batch: args.batch_size.unwrap_or(12),
            lr: args.lr.unwrap_or(1e-3),
            seed: args.seed,
            config: kiln::gpt::GptConfig {
                vocab: 0,
                context: args.context,
                layers: args.layers,
                heads: args.heads,
                width: args.width,
                dropout: args.dropout,
                bias: args.bias,
            },
            plot,
            checkpoint: args.checkpoint,
            checkpoint_every: args.save_every,
            resume: args.resume,
            eval_interval: args.eval_interval,
            eval_batches: args.eval_batches,
            final_eval_batches: args.final_eval_batches,
        },
        world,
        &parallel,
    )
}

#[cfg(feature = "mpi")]
type WorldRef<'a> = Option<&'a kiln::distributed::World>;
/// Without MPI support there is never a world.
#[cfg(not(feature = "mpi"))]
type WorldRef<'a> = Option<std::convert::Infallible>;

#[cfg(feature = "mpi")]
fn rank_and_size(world: WorldRef<'_>) -> (usize, usize) {
    world.map_or((0, 1), |w| (w.rank(), w.size()))
}
#[cfg(not(feature = "mpi"))]
fn rank_and_size(_world: WorldRef<'_>) -> (usize, usize) {
    (0, 1)
}

fn train(args: TrainArgs) -> Result<()> {
    let gpt = args.model == ModelName::Gpt || args.dataset == DatasetName::Shakespeare;
    if !args.distributed.distributed {
        return if gpt { train_gpt(args, None) } else { train_on(&args, None) };
    }
    #[cfg(feature = "mpi")]
    {
        // Bad options are one clear error, before MPI starts.
        data_parallel_options(&args.distributed)?;
        let world = kiln::distributed::World::init()?;
        let result = if gpt { train_gpt(args, Some(&world)) } else { train_on(&args, Some(&world)) };
        world.abort_on_error(result);
        Ok(())
    }
    #[cfg(not(feature = "mpi"))]
    Err(Error::unsupported(
        "train",
        "--distributed needs a kiln built with MPI support: cargo build --release -p kiln --features mpi",
    ))
}

/// The widest hidden layer `--hidden` accepts (a 784-wide input makes that
/// 3 GiB of f32 weights; wider is a typo, not a model).
const MAX_HIDDEN: usize = 1 << 20;

/// One-line errors for numbers no run can use, before anything is loaded.
fn check_train_args(args: &TrainArgs) -> Result<()> {
    let bad = |message: String| Err(Error::invalid("train", message));
    if args.batch_size == Some(0) {
        return bad("--batch-size must be at least 1".into());
    }
    if let Some(hidden) = &args.hidden {
        if args.model == ModelName::Cnn {
            return bad(
                "--hidden sets the MLP's hidden widths; the CNN's layers are fixed (drop --hidden, or use --model mlp)"
                    .into(),
            );
        }
        if let Some(w) = hidden.iter().find(|&&w| w == 0 || w > MAX_HIDDEN) {
            return bad(format!("--hidden {w}: hidden widths must be between 1 and {MAX_HIDDEN}"));
        }
    }
    if let Some(lr) = args.lr {
        if !(lr.is_finite() && lr > 0.0) {
            return bad(format!("--lr {lr}: the learning rate must be a finite number above 0"));
        }
    }
    Ok(())
}

/// One process's part of `kiln train`; `world` is Some under --distributed.
fn train_on(args: &TrainArgs, world: WorldRef<'_>) -> Result<()> {
    check_train_args(args)?;
    let (rank, size) = rank_and_size(world);
    let root = rank == 0;
    let digits = args.dataset == DatasetName::Digits;
    let split = load(args)?;
    let device = Device::from_name(&args.device)?;
    let cnn = args.model == ModelName::Cnn;
    let (model, description) = if cnn {
        let image = split.train.image_dims;
        (models::cnn(&device, image, split.train.classes, args.seed)?, format!("CNN for {image:?} images"))
    } else {
        let hidden = args.hidden.clone().unwrap_or(if digits { vec![128] } else { vec![512, 256] });
        let mut widths = vec![split.train.features];
        widths.extend(&hidden);
        widths.push(split.train.classes);
        (models::mlp(&device, &widths, args.seed)?, format!("MLP {widths:?}"))
    };
    let lr = args.lr.unwrap_or(if digits { 3e-3 } else { 1e-3 });
    let mut optimizer = Adam::new(model.parameters(), lr)?;
    let mut config = TrainConfig {
        epochs: args.epochs.unwrap_or(if digits { 30 } else { 10 }),
        batch_size: args.batch_size.unwrap_or(if digits {
            32
        } else if cnn {
            64
        } else {
            128
        }),
        seed: args.seed,
        lr_decay: if digits { 0.93 } else { 0.8 },
        start: Position::default(),
        snapshot_every: args.checkpoint_every,
    };
    let shape = RunShape { batch_size: config.batch_size, seed: config.seed };
    // Only rank 0 reads files; the others receive what it read.
    if root {
        if let Some(path) = &args.load {
            kiln::checkpoint::load(path, &model)?;
            println!("loaded {}", path.display());
        }
        if let Some(dir) = &args.resume {
            config.start = load_snapshot(dir, &model, &mut optimizer, shape)?;
            println!("resuming {} at epoch {} step {}", dir.display(), config.start.epoch + 1, config.start.step);
        }
    }
    let mut replicas = make_replicas(args, world, &model, &mut optimizer, &mut config)?;
    if args.resume.is_some() && config.start.epoch >= config.epochs {
        return Err(Error::invalid(
            "train",
            format!(
                "the snapshot is at epoch {} of the run; ask for more --epochs than that to continue it",
                config.start.epoch
            ),
        ));
    }
    if root {
        println!(
            "kiln train: {description} ({} parameters) on {} ({} train / {} test), device {}{}",
            model.num_parameters(),
            match args.dataset {
                DatasetName::Digits => "embedded digits",
                DatasetName::Mnist => "MNIST",
                DatasetName::FashionMnist => "Fashion-MNIST",
                DatasetName::Shakespeare => "text",
            },
            split.train.len,
            split.test.len,
            device.name(),
            if size > 1 {
                format!(
                    ", {size} processes (global batch {}, about {} each)",
                    config.batch_size,
                    config.batch_size.div_ceil(size)
                )
            } else {
                String::new()
            }
        );
    }
    let steps = config.epochs * split.train.len.div_ceil(config.batch_size);
    let bar = if root { ProgressBar::new(steps as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
            .expect("static template"),
    );
    let done = config.start.epoch * split.train.len.div_ceil(config.batch_size) + config.start.step;
    bar.set_position(done as u64);
    let mut on_step = |epoch: usize, _step: usize, _per_epoch: usize, loss: f64, rate: f64| {
        bar.inc(1);
        bar.set_message(format!("epoch {} loss {loss:.4} {rate:.0} samples/s", epoch + 1));
    };
    let mut snapshot = |position: &Position, optimizer: &Adam| match &args.checkpoint_dir {
        Some(dir) => save_snapshot(dir, &model, optimizer, position, shape),
        None => Ok(()),
    };
    let report = run_classifier(
        replicas.as_mut(),
        &device,
        &model,
        &mut optimizer,
        &split.train,
        &split.test,
        &config,
        &mut on_step,
        &mut snapshot,
    )?;
    bar.finish();
    if !root {
        return Ok(());
    }
    print_op_profile(&device, "training, evaluations included");
    for (epoch, acc) in &report.test_accuracy {
        println!("epoch {epoch:>3}: test accuracy {:.2}%", acc * 100.0);
    }
    println!(
        "test accuracy {:.2}% after {} epochs, {:.1} s ({:.0} samples/s)",
        report.final_accuracy() * 100.0,
        config.epochs,
        report.seconds,
        report.samples_per_second
    );
    // The model first: a plot that cannot be written must not lose it.
    if let Some(path) = &args.save {
        kiln::checkpoint::save(path, &model)?;
        println!("saved the model to {}", path.display());
    }
    if let Some(dir) = &args.checkpoint_dir {
        println!("snapshots in {} (continue with --resume {})", dir.display(), dir.display());
    }
    if !report.losses.is_empty() {
        plot::write_training_curves(&args.plot, "kiln train", &report.losses, &report.test_accuracy)
            .map_err(|e| Error::io("train", e))?;
        println!("wrote {}", args.plot.display());
    }
    Ok(())
}

/// How `DataParallel` exchanges gradients, from `--bucket-mb` and `--no-overlap`.
#[cfg(feature = "mpi")]
fn data_parallel_options(d: &DistributedArgs) -> Result<kiln::distributed::DataParallelOptions> {
    if !(d.bucket_mb > 0.0 && d.bucket_mb.is_finite()) {
        return Err(Error::invalid("train", format!("--bucket-mb {} must be a positive number", d.bucket_mb)));
    }
    let bucket_bytes = ((d.bucket_mb * 1048576.0) as usize).max(4);
    Ok(kiln::distributed::DataParallelOptions { bucket_bytes, overlap: !d.no_overlap })
}

/// One process, or data parallelism over `world`: the model and (when
/// resuming) the optimizer state and position are copied from rank 0.
#[cfg(feature = "mpi")]
fn make_replicas(
    args: &TrainArgs,
    world: WorldRef<'_>,
    model: &dyn Module,
    optimizer: &mut Adam,
    config: &mut TrainConfig,
) -> Result<Box<dyn Replicas>> {
    use kiln::distributed::DataParallel;
    let Some(world) = world else { return Ok(Box::new(SingleProcess)) };
    let ddp = DataParallel::new(world, model, data_parallel_options(&args.distributed)?)?;
    if args.resume.is_some() {
        ddp.broadcast_optimizer(optimizer)?;
        let mut position = [config.start.epoch as u64, config.start.step as u64];
        ddp.comm().broadcast(0, &mut position);
        config.start = Position { epoch: position[0] as usize, step: position[1] as usize };
    }
    Ok(Box::new(ddp))
}

#[cfg(not(feature = "mpi"))]
fn make_replicas(
    _args: &TrainArgs,
    _world: WorldRef<'_>,
    _model: &dyn Module,
    _optimizer: &mut Adam,
    _config: &mut TrainConfig,
) -> Result<Box<dyn Replicas>> {
    Ok(Box::new(SingleProcess))
}

fn run_bench(args: BenchArgs) -> Result<()> {
    if args.distributed {
        #[cfg(feature = "mpi")]
        {
            let world = kiln::distributed::World::init()?;
            let result = (|| {
                let device = Device::from_name(&args.device)?;
                let wants = |name: &str| args.workloads.iter().any(|w| w.eq_ignore_ascii_case(name));
                // The default workload list means "everything".
                let all = args.workloads.len() == 4 && wants("W1") && wants("W4");
                kiln::distributed::bench::run(
                    &world,
                    &device,
                    backend_label(&device),
                    all || wants("allreduce"),
                    all || wants("W1"),
                )
            })();
            world.abort_on_error(result);
            return Ok(());
        }
        #[cfg(not(feature = "mpi"))]
        return Err(Error::unsupported(
            "bench",
            "--distributed needs a kiln built with MPI support: cargo build --release -p kiln --features mpi",
        ));
    }
    if args.soak == Some(0) {
        return Err(Error::invalid("bench", "--soak needs at least 1 step"));
    }
    let device = Device::from_name(&args.device)?;
    let backend = backend_label(&device);
    eprintln!("kiln bench on {}", device.name());
    if let Some(steps) = args.soak {
        let report = bench::soak(&device, backend, steps, 50)?;
        eprintln!("{}", report.text());
        println!("{}", report.json());
        return Ok(());
    }
    for w in &args.workloads {
        // KILN_OP_PROFILE: a table of each workload's kernels on stderr.
        if device.op_profile_on() {
            device.set_op_profile(true);
        }
        let _report = OpProfileReport { device: &device, title: w };
        let result = match w.to_ascii_uppercase().as_str() {
            "W1" => bench::w1_mlp_step(&device, backend, 100)?,
            // Two lines: the graph built every step (as a training loop
            // does), and the same step through `Compiled` (jax.jit's
            // counterpart: traced once, replayed).
            "W3" => {
                println!("{}", bench::w3_graph_overhead(&device, backend, 20)?.json());
                bench::w3_compiled(&device, backend, 20)?
            }
            "W4" => bench::w4_gemm(&device, backend, 10)?,
            "W2" => bench::w2_cnn_step(&device, backend, 20)?,
            // Activation checkpointing: a software GPU (lavapipe) is slow,
            // so it gets one layer count and fewer steps.
            "CKPT" if backend == "cpu" => {
                for r in bench::ckpt_gpt(&device, backend, &[4, 8], 4, 1, 3)? {
                    println!("{}", r.json());
                }
                continue;
            }
            "CKPT" => {
                for r in bench::ckpt_gpt(&device, backend, &[4], 2, 1, 2)? {
                    println!("{}", r.json());
                }
                continue;
            }
            // The GEMM shapes of W1 and W2 next to 1024³, GFLOP/s each.
            "GEMM" => {
                for r in bench::gemm_shapes(&device, backend, 30)? {
                    println!("{}", r.json());
                }
                continue;
            }
            // A large square product (KILN_GEMM_SIZE=n, default 4096;
            // KILN_GEMM_REPEAT products per step, default 4): the real-GPU
            // check of the matmul kernels against the device's FP32 peak.
            "GEMM4096" | "GEMM_LARGE" => {
                let env = |key: &str, default: usize| {
                    std::env::var(key).ok().and_then(|v| v.parse().ok()).filter(|&v| v > 0).unwrap_or(default)
                };
                bench::gemm_large(&device, backend, env("KILN_GEMM_SIZE", 4096), env("KILN_GEMM_REPEAT", 4), 10)?
            }
            // Parallel branches: 8 towers of small matmuls, serial vs
            // concurrent (the CPU executor; other backends run it serially).
            "BRANCH" => {
                // KILN_BRANCH_SIZE=towers,width,batch tries other sizes.
                let size: Vec<usize> = std::env::var("KILN_BRANCH_SIZE")
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|v| v.parse().ok())
                    .collect();
                let (towers, width, batch) = match size[..] {
                    [t, w, b] => (t, w, b),
                    _ => (8, 64, 32),
                };
                for r in bench::branches(&device, backend, towers, width, batch, 30)? {
                    println!("{}", r.json());
                }
                continue;
            }
            other => {
                return Err(Error::invalid(
                    "bench",
                    format!("unknown workload {other}; use W1, W2, W3, W4, GEMM, GEMM4096, CKPT or BRANCH"),
                ))
            }
        };
        println!("{}", result.json());
    }
    Ok(())
}

/// Prints the device's op profile to stderr when dropped, if it is on
/// (`KILN_OP_PROFILE=1`; `Device::set_op_profile`).
struct OpProfileReport<'a> {
    device: &'a Device,
    title: &'a str,
}

impl Drop for OpProfileReport<'_> {
    fn drop(&mut self) {
        print_op_profile(self.device, self.title);
    }
}

/// The device's op profile on stderr, if it is on (`KILN_OP_PROFILE=1`).
fn print_op_profile(device: &Device, title: &str) {
    if device.op_profile_on() {
        let table = kiln::op_profile::format_table(&device.op_profile(), 30);
        eprintln!("kernel time ({title}, {}):\n{table}", device.name());
    }
}

fn print_ops(output: Option<PathBuf>) -> Result<()> {
    let mut devices = vec![Device::cpu()];
    match Device::from_name("wgpu") {
        Ok(d) => devices.push(d),
        Err(e) => eprintln!("no wgpu device ({e}); the table shows the CPU only"),
    }
    let names: Vec<String> = devices.iter().map(|d| d.name()).collect();
    let rows = pollster::block_on(kiln::coverage::coverage(&devices))?;
    let table = kiln::coverage::markdown(&rows, &names);
    print!("{table}");
    let incomplete: Vec<&str> = rows.iter().filter(|r| !kiln::coverage::row_is_complete(r)).map(|r| r.name).collect();
    if let Some(path) = output {
        let text = format!(
            "# Operator coverage\n\nGenerated by `kiln ops --output {}` from the code itself: kernels are what each backend's `supports` reports, rules are the gradient table's, and the checks are finite-difference gradchecks (f64, CPU) run when the table was made. Worst error as a fraction of the tolerance in brackets.\n\n{table}",
            path.display()
        );
        std::fs::write(&path, text).map_err(|e| Error::io("ops", format!("{}: {e}", path.display())))?;
        eprintln!("wrote {}", path.display());
    }
    if incomplete.is_empty() {
        Ok(())
    } else {
        Err(Error::unsupported("ops", format!("incomplete rows: {}", incomplete.join(", "))))
    }
}

fn list_devices() -> Result<()> {
    println!("cpu       {}", Device::cpu().name());
    let adapters = kiln::devices::adapters();
    if adapters.is_empty() {
        println!("wgpu      no adapter found (install a Vulkan/Metal/DX12/GL driver; on Debian: mesa-vulkan-drivers)");
    }
    for a in adapters {
        println!(
            "wgpu      {} [{} {}] driver {}; max buffer {} MiB, max storage binding {} MiB, {} workgroups/dim, {} invocations/workgroup, {} KiB workgroup memory",
            a.name,
            a.backend,
            a.device_type,
            a.driver,
            a.max_buffer_size >> 20,
            a.max_storage_buffer_binding_size >> 20,
            a.max_compute_workgroups_per_dimension,
            a.max_compute_invocations_per_workgroup,
            a.max_compute_workgroup_storage_size >> 10
        );
    }
    println!("best      {}  (override with KILN_DEVICE={})", Device::best()?.name(), kiln::devices::DEVICE_NAMES);
    Ok(())
}

/// Mesa's Vulkan driver asks the Wayland client library for a display while
/// wgpu looks for adapters, and on machines without a desktop session
/// (servers, CI) that library prints "error: XDG_RUNTIME_DIR is invalid" —
/// noise that reads like a kiln error. Point it at an empty private
/// directory instead: the connection attempt then fails quietly. Done first
/// thing in main, while the process is still single-threaded.
fn quiet_display_probe() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return;
    }
    let dir = std::env::temp_dir().join("kiln-xdg-runtime");
    if std::fs::create_dir_all(&dir).is_ok() {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        }
        std::env::set_var("XDG_RUNTIME_DIR", &dir);
    }
}

fn main() -> ExitCode {
    quiet_display_probe();
    let cli = Cli::parse();
    let run = move || match cli.command {
        Command::Train(args) => train(args),
        Command::Sample(args) => gpt_cli::sample(gpt_cli::SampleArgs {
            load: args.load,
            prompt: args.prompt.replace("\\n", "\n"),
            tokens: args.tokens,
            temperature: args.temperature,
            top_k: args.top_k,
            seed: args.seed,
            device: args.device,
        }),
        Command::Bench(args) => run_bench(args),
        Command::Devices => list_devices(),
        Command::Ops { output } => print_ops(output),
    };
    // The whole command runs on one of the CPU backend's threads, so that
    // the serial work between kernels does not compete with idle workers
    // for the cores (kiln::on_cpu_pool says why).
    let result = kiln::on_cpu_pool(run);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
