//! Checkpoints of a training run, for resuming it: the model
//! (`model.safetensors`, PyTorch state_dict keys), the optimizer
//! (`optimizer.safetensors`: moments, step count, learning rate) and where
//! the run stands (`progress.txt`), in one directory, each file written
//! atomically. The position counts *global* batches, so a run saved with N
//! processes resumes on any other number of processes (with the same
//! global batch size) exactly where it stopped.

use std::path::Path;

use kiln_core::nn::Module;
use kiln_core::optim::OptimizerState;
use kiln_core::{Error, Result};

use crate::checkpoint::{load, load_optimizer, save, save_optimizer, write_atomic};
use crate::train::Position;

const MODEL: &str = "model.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
const PROGRESS: &str = "progress.txt";

/// What `progress.txt` records besides the position: a resumed run must
/// cut the data the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunShape {
    pub batch_size: usize,
    pub seed: u64,
}

/// Write a snapshot into `dir` (created if missing).
pub fn save_snapshot<O: OptimizerState>(
    dir: &Path,
    model: &dyn Module,
    optimizer: &O,
    position: &Position,
    shape: RunShape,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("save_snapshot", format!("{}: {e}", dir.display())))?;
    save(dir.join(MODEL), model)?;
    save_optimizer(dir.join(OPTIMIZER), optimizer)?;
    // Progress last: a snapshot is complete once it names its position.
    let text = format!(
        "epoch {}\nstep {}\nbatch_size {}\nseed {}\n",
        position.epoch, position.step, shape.batch_size, shape.seed
    );
    write_atomic("save_snapshot", &dir.join(PROGRESS), text.as_bytes())
}

/// Load a snapshot from `dir` into `model` and `optimizer`; returns the
/// position to continue from. Refuses a snapshot made with another global
/// batch size or seed (the position would mean different samples).
pub fn load_snapshot<O: OptimizerState>(
    dir: &Path,
    model: &dyn Module,
    optimizer: &mut O,
    shape: RunShape,
) -> Result<Position> {
    const OP: &str = "load_snapshot";
    let path = dir.join(PROGRESS);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(OP, format!("{}: {e}", path.display())))?;
    let field = |name: &str| -> Result<u64> {
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| Error::io(OP, format!("{}: no valid '{name}' line", path.display())))
    };
    let position = Position { epoch: field("epoch")? as usize, step: field("step")? as usize };
    let saved = RunShape { batch_size: field("batch_size")? as usize, seed: field("seed")? };
    if saved != shape {
        return Err(Error::invalid(
            OP,
            format!(
                "{} was made with global batch size {} and seed {}; this run uses {} and {} (use the same values to resume)",
                dir.display(),
                saved.batch_size,
                saved.seed,
                shape.batch_size,
                shape.seed
            ),
        ));
    }
    load(dir.join(MODEL), model)?;
    load_optimizer(dir.join(OPTIMIZER), optimizer)?;
    Ok(position)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_core::optim::{Adam, Optimizer};
    use kiln_core::Device;

    #[test]
    fn a_snapshot_round_trips_and_checks_the_run_shape() {
        let dir = std::env::temp_dir().join(format!("kiln-snapshot-test-{}", std::process::id()));
        let device = Device::cpu();
        let model = crate::models::mlp(&device, &[4, 3, 2], 1).unwrap();
        let mut adam = Adam::new(model.parameters(), 0.01).unwrap();
        adam.set_learning_rate(0.005).unwrap();
        let shape = RunShape { batch_size: 8, seed: 3 };
        save_snapshot(&dir, &model, &adam, &Position { epoch: 2, step: 5 }, shape).unwrap();
        let other = crate::models::mlp(&device, &[4, 3, 2], 9).unwrap();
        let mut adam2 = Adam::new(other.parameters(), 0.01).unwrap();
        let err = load_snapshot(&dir, &other, &mut adam2, RunShape { batch_size: 16, seed: 3 }).unwrap_err();
        assert!(err.to_string().contains("batch size 8"), "{err}");
        let position = load_snapshot(&dir, &other, &mut adam2, shape).unwrap();
        assert_eq!(position, Position { epoch: 2, step: 5 });
        assert_eq!(adam2.learning_rate(), 0.005);
        let a = crate::checkpoint::named_state(&model);
        let b = crate::checkpoint::named_state(&other);
        for ((_, p), (_, q)) in a.iter().zip(&b) {
            assert_eq!(pollster::block_on(p.value()).unwrap(), pollster::block_on(q.value()).unwrap());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
