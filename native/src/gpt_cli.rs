//! `kiln train --model gpt` and `kiln sample`: the char-level GPT from the
//! command line, with a progress bar, train/validation losses, a loss
//! plot, checkpoints and resume, on one process or data-parallel over MPI
//! (`mpirun -np N kiln train --distributed --model gpt …`).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use kiln::checkpoint::{load_optimizer_state_with, read_metadata, save_optimizer_state_with, save_state_with};
use kiln::distributed::shard_range;
use kiln::distributed::{Replicas, SingleProcess};
use kiln::gpt::{self, CharVocab, Gpt, GptConfig, GptTrainConfig, TextData};
use kiln::host_rng::SplitMix64;
use kiln::nn::Module;
use kiln::optim::{Adam, LrScheduler};
use kiln::{Device, DeviceSelection, Error, Graph, Result};

use crate::{DistributedArgs, WorldRef};

/// What `kiln train --model gpt` was asked for.
pub struct GptArgs {
    pub data: PathBuf,
    pub device: String,
    pub steps: u64,
    pub batch: usize,
    pub lr: f64,
    pub seed: u64,
    pub config: GptConfig,
    pub plot: PathBuf,
    pub checkpoint: PathBuf,
    pub checkpoint_every: u64,
    /// Continue from this checkpoint (its optimizer state is beside it).
    pub resume: Option<PathBuf>,
    pub eval_interval: u64,
    pub eval_batches: usize,
    pub final_eval_batches: usize,
}

fn optimizer_path(checkpoint: &Path) -> PathBuf {
    let mut name = checkpoint.as_os_str().to_owned();
    name.push(".optim");
    PathBuf::from(name)
}

fn save(
    model: &Gpt,
    vocab: &CharVocab,
    step: u64,
    adam: &kiln::optim::Adam,
    sched: &kiln::optim::LrScheduler,
    path: &Path,
) -> Result<()> {
    let mut meta: HashMap<String, String> = model.config().to_metadata();
    meta.insert("gpt.vocab_chars".to_string(), vocab.as_string());
    meta.insert("gpt.step".to_string(), step.to_string());
    let bytes = pollster::block_on(save_state_with(model, meta))?;
    kiln::checkpoint::write_atomic("checkpoint::save", path, &bytes)?;
    let bytes = pollster::block_on(save_optimizer_state_with(adam, Some(sched)))?;
    kiln::checkpoint::write_atomic("checkpoint::save_optimizer", &optimizer_path(path), &bytes)
}

/// Train the GPT on this process, or (`world` Some, under `mpirun`) as one
/// of the processes of a data-parallel job: every process draws the same
/// global batch of each step and trains on its rows of it, so N processes
/// follow one process's run up to float summation order. Rank 0 alone
/// reads the checkpoint to resume from, prints, plots and saves.
pub fn train(args: GptArgs, world: WorldRef<'_>, parallel: &DistributedArgs) -> Result<()> {
    if args.batch == 0 {
        return Err(Error::invalid("train", "--batch-size must be at least 1"));
    }
    let (rank, size) = crate::rank_and_size(world);
    let root = rank == 0;
    let text = gpt::load_text(&args.data)?;
    let data = TextData::new(&text, args.config.context)?;
    let device = Device::from_name(&args.device)?;
    let config = GptConfig { vocab: data.vocab.len(), ..args.config };
    // Rank 0's initial parameters are copied to the others; a seed of their
    // own gives the other ranks dropout masks of their own.
    let model_seed = if root { args.seed } else { SplitMix64::for_stream(args.seed, rank as u64).next_u64() };
    let model = Gpt::new(&device, config, model_seed)?;
    let train_config = GptTrainConfig {
        steps: args.steps,
        batch: args.batch,
        lr: args.lr,
        min_lr: args.lr / 10.0,
        seed: args.seed,
        eval_interval: args.eval_interval,
        eval_batches: args.eval_batches,
        ..GptTrainConfig::default()
    };
    let (mut adam, mut scheduler) = gpt::optimizer_for(&model, &train_config)?;
    let mut start_step = 0;
    if let (true, Some(resume)) = (root, &args.resume) {
        let bytes =
            std::fs::read(resume).map_err(|e| Error::io("train", format!("--resume: {}: {e}", resume.display())))?;
        let meta = read_metadata(&bytes)?;
        if GptConfig::from_metadata(&meta)? != config || meta.get("gpt.vocab_chars") != Some(&data.vocab.as_string()) {
            return Err(Error::invalid(
                "train",
                "--resume: the checkpoint's model or vocabulary differs from this run's",
            ));
        }
        kiln::checkpoint::load_state(&model, &bytes)?;
        let optim = std::fs::read(optimizer_path(resume))
            .map_err(|e| Error::io("train", format!("--resume: {}: {e}", optimizer_path(resume).display())))?;
        load_optimizer_state_with(&mut adam, Some(&mut scheduler), &optim)?;
        start_step = meta.get("gpt.step").and_then(|s| s.parse().ok()).unwrap_or(0);
        println!("resumed from {} at step {start_step}", resume.display());
    }
    let mut replicas =
        make_replicas(world, parallel, &model, &mut adam, &mut scheduler, &mut start_step, args.resume.is_some())?;
    if root {
        println!(
            "kiln train: char-level GPT ({} layers, {} heads, width {}, context {}, {} parameters) on {} ({} chars, vocabulary {}), batch {}, AdamW lr {} cosine to {} over {} steps, device {}{}",
            config.layers,
            config.heads,
            config.width,
            config.context,
            model.num_parameters(),
            args.data.display(),
            text.chars().count(),
            data.vocab.len(),
            args.batch,
            args.lr,
            train_config.min_lr,
            args.steps,
            device.name(),
            if size > 1 {
                format!(", {size} processes (about {} sequences each)", args.batch.div_ceil(size))
            } else {
                String::new()
            }
        );
    }
    let bar = if root { ProgressBar::new(args.steps) } else { ProgressBar::hidden() };
    bar.set_position(start_step);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
            .expect("static template"),
    );
    let mut graph = Graph::new(&device);
    let mut train_losses = Vec::new();
    let mut val_losses = Vec::new();
    let context = config.context;
    let mine = shard_range(args.batch, rank, size);
    let weight = mine.len() as f64 / args.batch as f64;
    let shape = [mine.len(), context];
    let rows = mine.start * context..mine.end * context;
    let started = Instant::now();
    for step in start_step..args.steps {
        // Batches depend only on (seed, step): a resumed run sees the same
        // data, on any number of processes; each trains on its rows.
        let mut rng = SplitMix64::for_stream(args.seed, step);
        let (x, y) = gpt::random_batch(&data.train, args.batch, context, &mut rng);
        let batch = (&x[rows.clone()], &y[rows.clone()]);
        let loss = gpt::train_step_with(
            replicas.as_mut(),
            &mut graph,
            &model,
            &mut adam,
            &mut scheduler,
            batch,
            shape,
            weight,
            train_config.grad_clip,
        )?;
        if !loss.is_finite() {
            return Err(Error::invalid("train", format!("loss became {loss} at step {step}; lower the learning rate")));
        }
        train_losses.push((step as f64, loss));
        bar.inc(1);
        let done = step + 1;
        let per_step = started.elapsed().as_secs_f64() / (done - start_step) as f64;
        bar.set_message(format!("loss {loss:.4} lr {:.2e} {:.0} ms/step", adam_lr(&scheduler), per_step * 1e3));
        if args.eval_interval > 0 && done % args.eval_interval == 0 && done < args.steps {
            let val = gpt::estimate_loss_with(
                replicas.as_mut(),
                &device,
                &model,
                &data.val,
                args.batch,
                args.eval_batches,
                7,
            )?;
            val_losses.push((done as f64, val));
            let line = format!("step {done:>5}: train loss {loss:.4}, validation loss {val:.4}");
            // A hidden bar (output not a terminal: a log file, a pipe)
            // drops its println, so rank 0 prints the line itself then.
            if root && bar.is_hidden() {
                println!("{line}");
            } else {
                bar.println(line);
            }
        }
        if root && args.checkpoint_every > 0 && done % args.checkpoint_every == 0 {
            save(&model, &data.vocab, done, &adam, &scheduler, &args.checkpoint)?;
        }
    }
    bar.finish();
    let seconds = started.elapsed().as_secs_f64();
    let steps_run = args.steps.saturating_sub(start_step).max(1);
    if root {
        save(&model, &data.vocab, args.steps, &adam, &scheduler, &args.checkpoint)?;
        println!("saved {} (+ {})", args.checkpoint.display(), optimizer_path(&args.checkpoint).display());
    }
    // KILN_OP_PROFILE: the training steps' kernels (before the final
    // evaluation adds its own).
    if root {
        crate::print_op_profile(&device, "training");
    }
    // The validation loss over the whole validation split (exact), unless
    // asked for a quicker estimate from random batches; the training loss
    // from random batches (the training split is 9 times larger).
    let final_batches = args.final_eval_batches;
    let train_batches = if final_batches == 0 { 200 } else { final_batches };
    let train_loss =
        gpt::estimate_loss_with(replicas.as_mut(), &device, &model, &data.train, args.batch, train_batches, 11)?;
    let (val, val_over) = if final_batches == 0 {
        let (loss, windows) = gpt::split_loss_with(replicas.as_mut(), &device, &model, &data.val, args.batch)?;
        (loss, format!("validation: the whole split, {windows} windows of {context}"))
    } else {
        let loss =
            gpt::estimate_loss_with(replicas.as_mut(), &device, &model, &data.val, args.batch, final_batches, 7)?;
        (loss, format!("validation: {final_batches} random batches"))
    };
    if !root {
        return Ok(());
    }
    val_losses.push((args.steps as f64, val));
    crate::plot::write_loss_curves(&args.plot, "kiln train --model gpt", &train_losses, &val_losses)
        .map_err(|e| Error::io("train", e))?;
    println!("wrote {}", args.plot.display());
    println!(
        "{} steps in {:.1} s ({:.1} ms/step, {} threads{})",
        steps_run,
        seconds,
        seconds * 1e3 / steps_run as f64,
        rayon::current_num_threads(),
        if size > 1 { format!(" on each of {size} processes") } else { String::new() }
    );
    println!(
        "after {} steps: train loss {train_loss:.4}, validation loss {val:.4} nats/char ({val_over}; train: {train_batches} random batches)",
        args.steps
    );
    Ok(())
}

/// One process, or data parallelism over `world`: the model (and, when
/// resuming, the optimizer, the schedule and the step) copied from rank 0.
#[cfg(feature = "mpi")]
fn make_replicas(
    world: WorldRef<'_>,
    parallel: &DistributedArgs,
    model: &Gpt,
    adam: &mut Adam,
    scheduler: &mut LrScheduler,
    start_step: &mut u64,
    resumed: bool,
) -> Result<Box<dyn Replicas>> {
    use kiln::distributed::DataParallel;
    let Some(world) = world else { return Ok(Box::new(SingleProcess)) };
    let ddp = DataParallel::new(world, model, crate::data_parallel_options(parallel)?)?;
    if resumed {
        ddp.broadcast_optimizer(adam)?;
        let (steps, mut base_lrs) = scheduler.state();
        // The number of groups comes from the model, the same everywhere.
        let mut header = [*start_step, steps];
        ddp.comm().broadcast(0, &mut header);
        ddp.comm().broadcast(0, &mut base_lrs);
        *start_step = header[0];
        scheduler.load_state(adam, header[1], &base_lrs)?;
    }
    Ok(Box::new(ddp))
}

#[cfg(not(feature = "mpi"))]
fn make_replicas(
    _world: WorldRef<'_>,
    _parallel: &DistributedArgs,
    _model: &Gpt,
    _adam: &mut Adam,
    _scheduler: &mut LrScheduler,
    _start_step: &mut u64,
    _resumed: bool,
) -> Result<Box<dyn Replicas>> {
    Ok(Box::new(SingleProcess))
}

fn adam_lr(scheduler: &kiln::optim::LrScheduler) -> f64 {
    scheduler.current_lrs().first().copied().unwrap_or(0.0)
}

/// What `kiln sample` was asked for.
pub struct SampleArgs {
    pub load: PathBuf,
    pub prompt: String,
    pub tokens: usize,
    pub temperature: f64,
    pub top_k: Option<usize>,
    pub seed: u64,
    pub device: String,
}

pub fn sample(args: SampleArgs) -> Result<()> {
    let bytes = std::fs::read(&args.load).map_err(|e| Error::io("sample", format!("{}: {e}", args.load.display())))?;
    let meta = read_metadata(&bytes)?;
    let config = GptConfig::from_metadata(&meta)?;
    let vocab = CharVocab::from_string(
        meta.get("gpt.vocab_chars").ok_or_else(|| Error::invalid("sample", "the checkpoint has no vocabulary"))?,
    );
    let device = Device::from_name(&args.device)?;
    let model = Gpt::new(&device, config, 0)?;
    kiln::checkpoint::load_state(&model, &bytes)?;
    let mut stdout = std::io::stdout();
    // The prompt is printed with the first generated character, so that a
    // refused request (a prompt outside the vocabulary, a temperature of 0)
    // prints only its error.
    let mut started = false;
    gpt::generate(&device, &model, &vocab, &args.prompt, args.tokens, args.temperature, args.top_k, args.seed, |c| {
        if !std::mem::replace(&mut started, true) {
            print!("{}", args.prompt);
        }
        print!("{c}");
        let _ = stdout.flush();
    })?;
    if !started {
        print!("{}", args.prompt);
    }
    println!();
    Ok(())
}
