//! Checkpoint files: `kiln_core::checkpoint`'s safetensors bytes written
//! atomically (a temporary file in the target's directory, fsynced, then
//! renamed over the target), so a crash or a full disk never leaves a
//! half-written checkpoint where a good one was.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use kiln_core::checkpoint::{announced_length, header_length};
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
    let location = std::panic::Location::caller();
    let bytes = read_bounded("checkpoint::load", path.as_ref()).map_err(|e| e.at(location))?;
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
    let location = std::panic::Location::caller();
    let bytes = read_bounded("checkpoint::load_optimizer", path.as_ref()).map_err(|e| e.at(location))?;
    load_optimizer_state(optimizer, &bytes)
}

/// A safetensors file's bytes, read no further than its header announces:
/// the 8-byte header length (at most 100 MB), the header, then the data up
/// to the end of the last tensor it lists. Anything longer (`/dev/zero`, a
/// file with junk appended) is refused once it passes that length, without
/// reading the rest; memory grows with what is read, never with what the
/// header claims.
fn read_bounded(op: &'static str, path: &Path) -> Result<Vec<u8>> {
    let fail = |e: std::io::Error| Error::io(op, format!("{}: {e}", path.display()));
    let mut file = std::io::BufReader::new(File::open(path).map_err(fail)?);
    let mut bytes = Vec::new();
    (&mut file).take(8).read_to_end(&mut bytes).map_err(fail)?;
    let n = header_length(op, &bytes).map_err(|e| in_file(e, op, path))?;
    (&mut file).take(n as u64).read_to_end(&mut bytes).map_err(fail)?;
    if bytes.len() < 8 + n {
        return Err(Error::io(
            op,
            format!("{}: truncated: the header announces {n} bytes, the file has {}", path.display(), bytes.len() - 8),
        ));
    }
    let total = announced_length(op, &bytes[8..]).map_err(|e| in_file(e, op, path))?;
    let rest = total - bytes.len() as u64;
    (&mut file).take(rest + 1).read_to_end(&mut bytes).map_err(fail)?;
    if bytes.len() as u64 > total {
        return Err(Error::io(
            op,
            format!("{}: the file goes on past the {total} bytes its header announces", path.display()),
        ));
    }
    if (bytes.len() as u64) < total {
        return Err(Error::io(
            op,
            format!("{}: truncated: its header announces {total} bytes, the file has {}", path.display(), bytes.len()),
        ));
    }
    Ok(bytes)
}

/// `e` with the file's path in front of its message.
fn in_file(e: Error, op: &'static str, path: &Path) -> Error {
    Error::io(op, format!("{}: {}", path.display(), e.message()))
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
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".tmp-");
    remove_stale_temps(&dir, &prefix);
    let mut temp_name = prefix;
    temp_name.push(format!("{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
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

/// Remove temporary files an earlier save to the same target left behind
/// when it was killed (`.{name}.tmp-{pid}-{n}`): those of processes that no
/// longer run. Where a process's liveness cannot be checked (no `/proc`),
/// only temporaries untouched for an hour are removed, so a save running
/// in another process at the same time is never disturbed. Best effort:
/// failures are ignored.
fn remove_stale_temps(dir: &Path, prefix: &std::ffi::OsStr) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let prefix = prefix.to_string_lossy();
    let proc_fs = Path::new("/proc/self").exists();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Some(rest) = name.strip_prefix(prefix.as_ref()) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let stale = if proc_fs {
            pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
        } else {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > std::time::Duration::from_secs(3600))
        };
        if stale {
            let _ = fs::remove_file(entry.path());
        }
    }
}
