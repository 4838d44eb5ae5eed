//! `kiln train --model gpt` and `kiln sample`: the char-level GPT from the
//! command line, with a progress bar, train/validation losses, a loss
//! plot, checkpoints and resume.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use kiln::checkpoint::{load_optimizer_state_with, read_metadata, save_optimizer_state_with, save_state_with};
use kiln::gpt::{self, CharVocab, Gpt, GptConfig, GptTrainConfig, TextData};
use kiln::nn::Module;
use kiln::rng::SplitMix64;
use kiln::{Device, DeviceSelection, Error, Graph, Result};

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

pub fn train(args: GptArgs) -> Result<()> {
    let text = gpt::load_text(&args.data)?;
    let data = TextData::new(&text, args.config.context)?;
    let device = Device::from_name(&args.device)?;
    let config = GptConfig { vocab: data.vocab.len(), ..args.config };
    let model = Gpt::new(&device, config, args.seed)?;
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
    if let Some(resume) = &args.resume {
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
    println!(
        "kiln train: char-level GPT ({} layers, {} heads, width {}, context {}, {} parameters) on {} ({} chars, vocabulary {}), batch {}, AdamW lr {} cosine to {} over {} steps, device {}",
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
        device.name()
    );
    let bar = ProgressBar::new(args.steps);
    bar.set_position(start_step);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
            .expect("static template"),
    );
    let mut graph = Graph::new(&device);
    let mut train_losses = Vec::new();
    let mut val_losses = Vec::new();
    let shape = [args.batch, config.context];
    let started = Instant::now();
    for step in start_step..args.steps {
        // Batches depend only on (seed, step): a resumed run sees the same data.
        let mut rng = SplitMix64::for_stream(args.seed, step);
        let (x, y) = gpt::random_batch(&data.train, args.batch, config.context, &mut rng);
        let loss =
            gpt::train_step(&mut graph, &model, &mut adam, &mut scheduler, (&x, &y), shape, train_config.grad_clip)?;
        if !loss.is_finite() {
            return Err(Error::invalid("train", format!("loss became {loss} at step {step}; lower the learning rate")));
        }
        train_losses.push((step as f64, loss));
        bar.inc(1);
        let done = step + 1;
        let per_step = started.elapsed().as_secs_f64() / (done - start_step) as f64;
        bar.set_message(format!("loss {loss:.4} lr {:.2e} {:.0} ms/step", adam_lr(&scheduler), per_step * 1e3));
        if args.eval_interval > 0 && done % args.eval_interval == 0 && done < args.steps {
            let val = gpt::estimate_loss(&device, &model, &data.val, args.batch, args.eval_batches, 7)?;
            val_losses.push((done as f64, val));
            bar.println(format!("step {done:>5}: train loss {loss:.4}, validation loss {val:.4}"));
        }
        if args.checkpoint_every > 0 && done % args.checkpoint_every == 0 {
            save(&model, &data.vocab, done, &adam, &scheduler, &args.checkpoint)?;
        }
    }
    bar.finish();
    let seconds = started.elapsed().as_secs_f64();
    let steps_run = args.steps.saturating_sub(start_step).max(1);
    save(&model, &data.vocab, args.steps, &adam, &scheduler, &args.checkpoint)?;
    println!("saved {} (+ {})", args.checkpoint.display(), optimizer_path(&args.checkpoint).display());
    let train_loss = gpt::estimate_loss(&device, &model, &data.train, args.batch, args.final_eval_batches, 11)?;
    let val = gpt::estimate_loss(&device, &model, &data.val, args.batch, args.final_eval_batches, 7)?;
    val_losses.push((args.steps as f64, val));
    crate::plot::write_loss_curves(&args.plot, "kiln train --model gpt", &train_losses, &val_losses)
        .map_err(|e| Error::io("train", e))?;
    println!("wrote {}", args.plot.display());
    println!(
        "{} steps in {:.1} s ({:.1} ms/step, {} threads)",
        steps_run,
        seconds,
        seconds * 1e3 / steps_run as f64,
        rayon::current_num_threads()
    );
    println!(
        "after {} steps: train loss {train_loss:.4}, validation loss {val:.4} nats/char (mean over {} batches)",
        args.steps, args.final_eval_batches
    );
    Ok(())
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
    print!("{}", args.prompt);
    gpt::generate(&device, &model, &vocab, &args.prompt, args.tokens, args.temperature, args.top_k, args.seed, |c| {
        print!("{c}");
        let _ = stdout.flush();
    })?;
    println!();
    Ok(())
}
