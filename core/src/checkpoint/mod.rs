//! Checkpoints: a module's parameters and buffers, and an optimizer's state,
//! as safetensors bytes.
//!
//! A model's file holds one tensor per `Module::named_parameters` and
//! `Module::named_buffers` entry, keyed as PyTorch's `state_dict` (an MLP
//! built with `Sequential` has "0.weight", "0.bias", "2.weight", ...), in
//! the parameters' dtype (F32, or F64 for f64 models), little-endian, with
//! `{"format": "pt"}` metadata. `safetensors.torch.load_file` followed by
//! `load_state_dict` reads it into the equivalent torch model. One known
//! difference: PyTorch's BatchNorm also has a "num_batches_tracked" counter,
//! which kiln does not keep; PyTorch fills it in when it is missing from a
//! plain dict, and `load_state` ignores it in files written by PyTorch.
//!
//! An optimizer's file (`save_optimizer_state`) holds "optimizer.{i}.{slot}" per
//! parameter i (slots "exp_avg"/"exp_avg_sq" for Adam, "momentum_buffer"
//! for SGD with momentum) and, in the safetensors `__metadata__`, the kind,
//! the step count and the hyper-parameters.
//!
//! These functions work on bytes so that the browser can use them; the
//! `kiln` crate writes files atomically (`kiln::checkpoint`).

use std::collections::{HashMap, HashSet};

mod format;
mod number;

use format::{File, View};

use crate::dtype::HostData;
use crate::error::{Error, Result};
use crate::nn::Module;
use crate::optim::{LrScheduler, OptimizerState};
use crate::param::Param;
use crate::shape::fmt_dims;

/// Everything a module's checkpoint holds: `named_parameters()` then
/// `named_buffers()`, each `Param` once, under the first key that names it.
/// One `Param` used by two modules (weight tying: a language model's output
/// layer sharing the token embedding) is saved once under that stable key;
/// loading it restores the one shared `Param`, so the tie holds.
pub fn named_state(module: &dyn Module) -> Vec<(String, Param)> {
    state_and_aliases(module).0
}

/// `named_state`, and the later keys of tied parameters as (alias key,
/// index of the entry it repeats). The aliases come from
/// `Module::state_dict_entries`, which lists a tied `Param` under every
/// name (a derived module's `named_parameters` lists it once).
fn state_and_aliases(module: &dyn Module) -> (Vec<(String, Param)>, Vec<(String, usize)>) {
    let mut all = module.named_parameters();
    all.extend(module.named_buffers());
    let mut entries: Vec<(String, Param)> = Vec::with_capacity(all.len());
    let mut aliases: Vec<(String, usize)> = Vec::new();
    for (key, param) in all {
        match entries.iter().position(|(_, p)| p.same(&param)) {
            Some(first) => aliases.push((key, first)),
            None => entries.push((key, param)),
        }
    }
    for (key, param) in module.state_dict_entries() {
        let known = entries.iter().any(|(k, _)| *k == key) || aliases.iter().any(|(k, _)| *k == key);
        if let (false, Some(first)) = (known, entries.iter().position(|(_, p)| p.same(&param))) {
            aliases.push((key, first));
        }
    }
    (entries, aliases)
}

/// The module's parameters and buffers as a safetensors file's bytes.
#[track_caller]
pub fn save_state(module: &dyn Module) -> impl std::future::Future<Output = Result<Vec<u8>>> + '_ {
    save_state_with(module, HashMap::new())
}

/// `save_state` with extra string metadata (a model's configuration, a
/// vocabulary…), read back with `read_metadata`.
#[track_caller]
pub fn save_state_with(
    module: &dyn Module,
    extra: HashMap<String, String>,
) -> impl std::future::Future<Output = Result<Vec<u8>>> + '_ {
    let location = std::panic::Location::caller();
    async move {
        let entries = named_state(module);
        let mut seen = HashSet::new();
        if let Some((key, _)) = entries.iter().find(|(key, _)| !seen.insert(key.as_str())) {
            return Err(Error::invalid(
                "checkpoint::save_state",
                format!(
                    "two entries share the key '{key}': a module that holds other modules must override \
                     named_parameters/named_buffers to prefix their keys"
                ),
            )
            .at(location));
        }
        let mut tensors = Vec::with_capacity(entries.len());
        for (key, param) in &entries {
            let data = param.value().await.map_err(|e| e.at(location))?;
            tensors.push((key.clone(), param.dims().to_vec(), data));
        }
        let mut metadata = extra;
        metadata.insert("format".to_string(), "pt".to_string());
        serialize("checkpoint::save_state", &tensors, metadata).map_err(|e| e.at(location))
    }
}

/// Load a safetensors file's bytes into the module. Every parameter and
/// buffer must be present with its shape and dtype, and the file must hold
/// nothing else; otherwise the error lists every missing, unexpected and
/// mismatched key and the module is left unchanged.
#[track_caller]
pub fn load_state(module: &dyn Module, bytes: &[u8]) -> Result<()> {
    const OP: &str = "checkpoint::load_state";
    let file = parse(OP, bytes)?;
    let (entries, aliases) = state_and_aliases(module);
    let mut expected: HashSet<&str> = entries.iter().map(|(key, _)| key.as_str()).collect();
    expected.extend(aliases.iter().map(|(key, _)| key.as_str()));
    let mut missing = Vec::new();
    let mut mismatched = Vec::new();
    let mut values = Vec::with_capacity(entries.len());
    for (i, (key, param)) in entries.iter().enumerate() {
        // A tied parameter may also (or only) be in the file under a later
        // key, as in a PyTorch state_dict: the copies must agree.
        let mut found = file.tensor(key).map(|view| (key, view));
        for (alias, _) in aliases.iter().filter(|(_, first)| *first == i) {
            if let Some(view) = file.tensor(alias) {
                match &found {
                    None => found = Some((alias, view)),
                    Some((k, v)) if *v != view => mismatched
                        .push(format!("'{k}' and '{alias}' name one tied parameter but hold different values")),
                    Some(_) => {}
                }
            }
        }
        match found {
            None => missing.push(key.clone()),
            Some((_, view)) => match host_data(&view) {
                Some(data) if data.dtype() == param.dtype() && view.shape == param.dims().as_slice() => {
                    values.push((param, data))
                }
                _ => mismatched.push(format!(
                    "'{key}': file has {} {}, module has {} {}",
                    fmt_dims(view.shape),
                    dtype_name(view.dtype),
                    fmt_dims(&param.dims()),
                    param.dtype()
                )),
            },
        }
    }
    let mut unexpected: Vec<String> = file
        .names()
        .filter(|name| !expected.contains(name) && !is_batch_count(name, &expected))
        .map(str::to_string)
        .collect();
    unexpected.sort();
    check_match(OP, "module", &missing, &unexpected, &mismatched)?;
    for (param, data) in values {
        param.set_value(&data)?;
    }
    Ok(())
}

/// PyTorch's "{prefix}num_batches_tracked" next to an expected
/// "{prefix}running_mean": a counter kiln does not keep.
fn is_batch_count(name: &str, expected: &HashSet<&str>) -> bool {
    name.strip_suffix("num_batches_tracked")
        .is_some_and(|prefix| expected.contains(format!("{prefix}running_mean").as_str()))
}

/// The optimizer's step count, hyper-parameters and per-parameter state
/// buffers as a safetensors file's bytes.
#[track_caller]
pub fn save_optimizer_state<O: OptimizerState>(
    optimizer: &O,
) -> impl std::future::Future<Output = Result<Vec<u8>>> + '_ {
    save_optimizer_state_with(optimizer, None)
}

/// `save_optimizer_state` plus a learning-rate scheduler's state (its step
/// count and base rates, in the metadata as "scheduler.step" and
/// "scheduler.base_lrs"), so that a resumed run continues the schedule.
#[track_caller]
pub fn save_optimizer_state_with<'a, O: OptimizerState>(
    optimizer: &'a O,
    scheduler: Option<&'a LrScheduler>,
) -> impl std::future::Future<Output = Result<Vec<u8>>> + 'a {
    let location = std::panic::Location::caller();
    async move {
        let state = optimizer.read_state().await.map_err(|e| e.at(location))?;
        let about = About::of(optimizer);
        optimizer_file(&about, optimizer.step_count(), scheduler, state).map_err(|e| e.at(location))
    }
}

/// What the checkpoint code needs to know of an optimizer, gathered once:
/// the file is written and read by non-generic functions (one copy in the
/// browser's wasm for Sgd and Adam, not one per optimizer type).
struct About {
    kind: &'static str,
    params: Vec<Param>,
    slots: &'static [&'static str],
    group_lrs: Vec<f64>,
    hyper: Vec<(&'static str, f64)>,
}

impl About {
    fn of<O: OptimizerState>(optimizer: &O) -> About {
        About {
            kind: optimizer.kind(),
            params: optimizer.params(),
            slots: optimizer.slot_names(),
            group_lrs: optimizer.group_learning_rates(),
            hyper: optimizer.hyper_parameters(),
        }
    }
}

/// The safetensors bytes of an optimizer's state (`save_optimizer_state_with`).
fn optimizer_file(
    about: &About,
    step: u64,
    scheduler: Option<&LrScheduler>,
    state: Vec<Vec<HostData>>,
) -> Result<Vec<u8>> {
    let mut tensors = Vec::new();
    for (i, (param, buffers)) in about.params.iter().zip(state).enumerate() {
        for (slot, data) in about.slots.iter().zip(buffers) {
            tensors.push((format!("optimizer.{i}.{slot}"), param.dims().to_vec(), data));
        }
    }
    let mut metadata = HashMap::new();
    metadata.insert("optimizer".to_string(), about.kind.to_string());
    metadata.insert("step".to_string(), step.to_string());
    metadata.insert("params".to_string(), about.params.len().to_string());
    metadata.insert("group_lrs".to_string(), join(&about.group_lrs));
    if let Some(s) = scheduler {
        let (step, base) = s.state();
        metadata.insert("scheduler.step".to_string(), step.to_string());
        metadata.insert("scheduler.base_lrs".to_string(), join(&base));
    }
    for (name, value) in &about.hyper {
        metadata.insert(name.to_string(), value.to_string());
    }
    serialize("checkpoint::save_optimizer_state", &tensors, metadata)
}

/// Restore an optimizer from `save_optimizer_state`'s bytes: the state buffers,
/// the step count and the learning rate (as PyTorch's `load_state_dict`
/// does; the other hyper-parameters in the metadata are informational and
/// keep the values the optimizer was built with). The optimizer must be of
/// the same kind over parameters of the same shapes; otherwise nothing
/// changes.
#[track_caller]
pub fn load_optimizer_state<O: OptimizerState>(optimizer: &mut O, bytes: &[u8]) -> Result<()> {
    load_optimizer_state_with(optimizer, None, bytes)
}

/// `load_optimizer_state` that also restores a scheduler saved with
/// `save_optimizer_state_with` (the scheduler must be built with the same
/// schedule; its step count and base rates come from the file).
#[track_caller]
pub fn load_optimizer_state_with<O: OptimizerState>(
    optimizer: &mut O,
    scheduler: Option<&mut LrScheduler>,
    bytes: &[u8],
) -> Result<()> {
    let location = std::panic::Location::caller();
    load_optimizer(optimizer, scheduler, bytes).map_err(|e| e.at(location))
}

fn load_optimizer<O: OptimizerState>(
    optimizer: &mut O,
    scheduler: Option<&mut LrScheduler>,
    bytes: &[u8],
) -> Result<()> {
    let file = read_optimizer_file(&About::of(optimizer), scheduler.is_some(), bytes)?;
    optimizer.write_state(&file.state)?;
    optimizer.set_step_count(file.step);
    optimizer.set_learning_rate(file.lr)?;
    if let Some(lrs) = file.group_lrs {
        optimizer.set_group_learning_rates(&lrs)?;
    }
    if let (Some(s), Some((step, base))) = (scheduler, file.schedule) {
        s.load_state(optimizer, step, &base)?;
    }
    Ok(())
}

/// An optimizer checkpoint read and checked against the optimizer
/// (`read_optimizer_file`), ready to be written into it.
struct OptimizerFile {
    state: Vec<Vec<HostData>>,
    step: u64,
    lr: f64,
    group_lrs: Option<Vec<f64>>,
    /// The scheduler's step count and base rates, when one is restored.
    schedule: Option<(u64, Vec<f64>)>,
}

/// Everything `load_optimizer` checks, before anything changes.
fn read_optimizer_file(about: &About, with_scheduler: bool, bytes: &[u8]) -> Result<OptimizerFile> {
    const OP: &str = "checkpoint::load_optimizer_state";
    let file = parse(OP, bytes)?;
    let empty = HashMap::new();
    let metadata = file.metadata.as_ref().unwrap_or(&empty);
    let field = |name: &str| {
        metadata.get(name).ok_or_else(|| Error::invalid(OP, format!("the checkpoint's metadata has no '{name}'")))
    };
    let kind = field("optimizer")?;
    if kind != about.kind {
        return Err(Error::invalid(OP, format!("the checkpoint holds {kind} state, the optimizer is {}", about.kind)));
    }
    let step: u64 = field("step")?.parse().map_err(|_| Error::invalid(OP, "the metadata's 'step' is not a count"))?;
    // Every hyper-parameter the file records must be a finite number (only
    // lr is restored; a NaN anywhere means a corrupt or hostile file).
    for (name, _) in &about.hyper {
        if let Some(text) = metadata.get(*name) {
            match number::parse_f64(text) {
                Some(v) if v.is_finite() => {}
                _ => {
                    return Err(Error::invalid(
                        OP,
                        format!("the metadata's '{name}' = {text:?} is not a finite number"),
                    ))
                }
            }
        }
    }
    let lr =
        number::parse_f64(field("lr")?).ok_or_else(|| Error::invalid(OP, "the metadata's 'lr' is not a number"))?;
    if !(lr.is_finite() && lr >= 0.0) {
        return Err(Error::invalid(OP, format!("the metadata's lr = {lr} is not a finite number >= 0")));
    }
    let mut expected = HashSet::new();
    let mut missing = Vec::new();
    let mut mismatched = Vec::new();
    let mut state = Vec::with_capacity(about.params.len());
    for (i, param) in about.params.iter().enumerate() {
        let mut buffers = Vec::with_capacity(about.slots.len());
        for slot in about.slots {
            let key = format!("optimizer.{i}.{slot}");
            match file.tensor(&key) {
                None => missing.push(key.clone()),
                Some(view) => match host_data(&view) {
                    Some(data) if data.dtype() == param.dtype() && view.shape == param.dims().as_slice() => {
                        buffers.push(data)
                    }
                    _ => mismatched.push(format!(
                        "'{key}': file has {} {}, parameter '{}' is {} {}",
                        fmt_dims(view.shape),
                        dtype_name(view.dtype),
                        param.name(),
                        fmt_dims(&param.dims()),
                        param.dtype()
                    )),
                },
            }
            expected.insert(key);
        }
        state.push(buffers);
    }
    let mut unexpected: Vec<String> =
        file.names().filter(|name| !expected.contains(*name)).map(str::to_string).collect();
    unexpected.sort();
    check_match(OP, "optimizer", &missing, &unexpected, &mismatched)?;
    let group_lrs = match metadata.get("group_lrs") {
        Some(text) => Some(split_numbers(OP, "group_lrs", text)?),
        None => None,
    };
    let groups = about.group_lrs.len();
    if let Some(lrs) = group_lrs.as_ref().filter(|lrs| lrs.len() != groups) {
        return Err(Error::invalid(
            OP,
            format!("the file has {} parameter groups' learning rates, the optimizer {groups} groups", lrs.len()),
        ));
    }
    let schedule = if with_scheduler {
        let step: u64 = field("scheduler.step")?
            .parse()
            .map_err(|_| Error::invalid(OP, "the metadata's 'scheduler.step' is not a count"))?;
        Some((step, split_numbers(OP, "scheduler.base_lrs", field("scheduler.base_lrs")?)?))
    } else {
        None
    };
    Ok(OptimizerFile { state, step, lr, group_lrs, schedule })
}

/// The string metadata of a safetensors file's bytes.
#[track_caller]
pub fn read_metadata(bytes: &[u8]) -> Result<HashMap<String, String>> {
    match File::parse(bytes) {
        Ok(file) => Ok(file.metadata.unwrap_or_default()),
        Err(e) => Err(Error::io("checkpoint::read_metadata", format!("not a safetensors file: {e}"))),
    }
}

/// Numbers as a comma-separated list (Rust's shortest round-trip form).
fn join(values: &[f64]) -> String {
    values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")
}

#[track_caller]
fn split_numbers(op: &'static str, key: &str, text: &str) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for piece in text.split(',').filter(|p| !p.is_empty()) {
        match number::parse_f64(piece) {
            Some(v) if v.is_finite() => out.push(v),
            _ => {
                return Err(Error::invalid(op, format!("the metadata's '{key}' holds '{piece}', not a finite number")))
            }
        }
    }
    Ok(out)
}

#[track_caller]
fn parse<'a>(op: &'static str, bytes: &'a [u8]) -> Result<File<'a>> {
    let n = header_length(op, bytes)?;
    if bytes.len() - 8 < n {
        return Err(Error::io(op, format!("truncated safetensors file: a {n}-byte header in {} bytes", bytes.len())));
    }
    match File::parse(bytes) {
        Ok(file) => Ok(file),
        Err(e) => Err(Error::io(op, format!("not a safetensors file: {e}"))),
    }
}

/// The largest header kiln reads (the format's limit, as the safetensors
/// crate has it).
const MAX_HEADER: usize = 100_000_000;

/// The header length a safetensors file announces in its first 8 bytes
/// (little-endian u64), checked against the 100 MB the format allows.
#[track_caller]
pub fn header_length(op: &'static str, bytes: &[u8]) -> Result<usize> {
    let Some(first) = bytes.get(..8) else {
        return Err(Error::io(
            op,
            format!("not a safetensors file: {} bytes, shorter than the 8-byte header length", bytes.len()),
        ));
    };
    let n = u64::from_le_bytes(first.try_into().expect("8 bytes"));
    if n > MAX_HEADER as u64 {
        return Err(Error::io(
            op,
            format!("not a safetensors file: it announces a {n}-byte header (at most {MAX_HEADER})"),
        ));
    }
    Ok(n as usize)
}

/// The total size, in bytes, of the safetensors file whose JSON header is
/// `header` (the bytes after the length): 8 + header + the end of the last
/// tensor's data. A reader can stop there instead of reading to the end of
/// whatever it was given.
#[track_caller]
pub fn announced_length(op: &'static str, header: &[u8]) -> Result<u64> {
    match format::announced_data_end(header) {
        Ok(end) => Ok(8u64.saturating_add(header.len() as u64).saturating_add(end)),
        Err(e) => Err(Error::io(op, format!("not a safetensors file: {e}"))),
    }
}

/// (key, dims, values) entries as safetensors bytes.
fn serialize(
    op: &'static str,
    tensors: &[(String, Vec<usize>, HostData)],
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>> {
    let raw: Vec<(&'static str, Vec<u8>)> = tensors.iter().map(|(_, _, data)| le_bytes(data)).collect();
    let mut entries = Vec::with_capacity(tensors.len());
    for ((key, dims, data), (dtype, bytes)) in tensors.iter().zip(&raw) {
        if dims.iter().product::<usize>() != data.len() {
            return Err(Error::invalid(
                op,
                format!("tensor '{key}': {} values do not fill the shape {}", data.len(), fmt_dims(dims)),
            ));
        }
        entries.push((key.as_str(), *dtype, dims.as_slice(), bytes.as_slice()));
    }
    Ok(format::serialize(&entries, &metadata))
}

/// Values as safetensors' little-endian bytes, with the format's dtype name.
fn le_bytes(data: &HostData) -> (&'static str, Vec<u8>) {
    match data {
        HostData::F32(v) => ("F32", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::F64(v) => ("F64", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::I32(v) => ("I32", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::Bool(v) => ("BOOL", v.iter().map(|&b| b as u8).collect()),
    }
}

/// A tensor's values, or None for a dtype kiln has no counterpart of.
fn host_data(view: &View<'_>) -> Option<HostData> {
    let bytes = view.data;
    Some(match view.dtype {
        "F32" => HostData::F32(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()),
        "F64" => HostData::F64(bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()),
        "I32" => HostData::I32(bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()),
        "BOOL" => HostData::Bool(bytes.iter().map(|&b| b != 0).collect()),
        _ => return None,
    })
}

/// A stored dtype in kiln's words where kiln has it ("f32"), else in
/// safetensors' ("F16").
fn dtype_name(dtype: &str) -> String {
    match dtype {
        "F32" => "f32".into(),
        "F64" => "f64".into(),
        "I32" => "i32".into(),
        "BOOL" => "bool".into(),
        other => other.to_string(),
    }
}

/// One error listing every missing, unexpected and mismatched key, if any.
#[track_caller]
fn check_match(
    op: &'static str,
    target: &str,
    missing: &[String],
    unexpected: &[String],
    mismatched: &[String],
) -> Result<()> {
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing keys {missing:?}"));
    }
    if !unexpected.is_empty() {
        parts.push(format!("unexpected keys {unexpected:?}"));
    }
    if !mismatched.is_empty() {
        parts.push(format!("mismatched {}", mismatched.join(", ")));
    }
    if parts.is_empty() {
        return Ok(());
    }
    Err(Error::invalid(
        op,
        format!("the checkpoint does not match the {target} (nothing was loaded): {}", parts.join("; ")),
    ))
}
