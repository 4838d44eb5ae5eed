//! Checkpoint files: `kiln_core::checkpoint`'s safetensors bytes written
//! atomically (a temporary file in the target's directory, fsynced, then
//! renamed over the target), so a crash or a full disk never leaves a
//! half-written checkpoint where a good one was.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The byte-level functions (what the browser uses), re-exported.
pub use kiln_core::checkpoint::{
    load_optimizer_state, load_optimizer_state_with, load_state, named_state, read_metadata, save_optimizer_state,
    save_optimizer_state_with, save_state, save_state_with,
};
use kiln_core::nn::Module;
use kiln_core::optim::OptimizerState;
use kiln_core::{Error, Result};

/// Write the module's parameters and buffers to `path` (safetensors, keys
/// as PyTorch's `state_dict`).
#[track_caller]
pub fn save(path: impl AsRef<Path>, module: &dyn Module) -> Result<()> {
    let bytes = pollster::block_on(save_state(module))?;
    write_atomic("checkpoint::save", path.as_ref(), &bytes)
}

/// Load `path` (written by `save`, or by PyTorch through
/// `safetensors.torch.save_file(model.state_dict(), path)`) into the module.
/// Nothing changes unless every key matches.
#[track_caller]
pub fn load(path: impl AsRef<Path>, module: &dyn Module) -> Result<()> {
    let path = path.as_ref();
    let bytes = fs::read(path).map_err(|e| Error::io("checkpoint::load", format!("{}: {e}", path.display())))?;
    load_state(module, &bytes)
}

/// Write the optimizer's state (step count, hyper-parameters, per-parameter
/// buffers) to `path`.
#[track_caller]
pub fn save_optimizer<O: OptimizerState>(path: impl AsRef<Path>, optimizer: &O) -> Result<()> {
    let bytes = pollster::block_on(save_optimizer_state(optimizer))?;
    write_atomic("checkpoint::save_optimizer", path.as_ref(), &bytes)
}

/// Restore an optimizer from a file written by `save_optimizer`.
#[track_caller]
pub fn load_optimizer<O: OptimizerState>(path: impl AsRef<Path>, optimizer: &mut O) -> Result<()> {
    let path = path.as_ref();
    let bytes =
        fs::read(path).map_err(|e| Error::io("checkpoint::load_optimizer", format!("{}: {e}", path.display())))?;
    load_optimizer_state(optimizer, &bytes)
}

/// Write `bytes` to `path` so that `path` holds either its old contents or
/// all of the new ones: a temporary file next to it, fsynced, renamed over
/// it, then the directory fsynced (Unix) so the rename itself is durable.
/// On failure the temporary file is removed.
#[track_caller]
pub fn write_atomic(op: &'static str, path: &Path, bytes: &[u8]) -> Result<()> {
    let location = std::panic::Location::caller();
    let fail = |what: &str, e: std::io::Error| Error::io(op, format!("{}: {what}: {e}", path.display())).at(location);
    let name = path.file_name().ok_or_else(|| Error::invalid(op, format!("{} is not a file path", path.display())))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".tmp-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    let temp = dir.join(temp_name);
    let mut file =
        OpenOptions::new().write(true).create_new(true).open(&temp).map_err(|e| fail("cannot create a file", e))?;
    let written = file.write_all(bytes).and_then(|_| file.sync_all());
    drop(file);
    if let Err(e) = written.and_then(|_| fs::rename(&temp, path)) {
        let _ = fs::remove_file(&temp);
        return Err(fail("cannot write", e));
    }
    // Persist the directory entry; not possible (nor needed) everywhere.
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
