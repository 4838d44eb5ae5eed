//! Untrusted files (issue 9): checkpoint readers stop where the header says
//! the file ends, refuse repeated keys and non-finite hyper-parameters, and
//! a save removes the temporaries of saves killed before it. (The IDX
//! reader's bounds are tested next to it, in core/src/data/idx.rs.)

use std::path::{Path, PathBuf};

use kiln::checkpoint;
use kiln::optim::{Adam, Optimizer, OptimizerState};
use kiln::prelude::*;
use kiln::{Error, ErrorKind};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-readers-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn model(device: &Device) -> Sequential {
    Sequential::mlp(device, &[3, 4, 2], Activation::Relu, 0).unwrap()
}

/// The error is of `kind`, names `op`, mentions every needle and points at
/// this file.
#[track_caller]
fn check(err: Error, kind: ErrorKind, op: &str, needles: &[&str]) {
    assert_eq!(err.kind(), kind, "{err}");
    assert_eq!(err.op(), op, "{err}");
    for needle in needles {
        assert!(err.message().contains(needle), "the message should mention {needle:?}: {err}");
    }
    assert_eq!(err.location().file(), file!(), "the error points at the caller: {err}");
}

/// safetensors bytes with a hand-written header and `data` after it.
fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

#[test]
fn endless_and_overlong_files_are_refused_without_reading_them_all() {
    let device = Device::cpu();
    let m = model(&device);
    // /dev/zero: a zero-length header, refused after 8 bytes.
    if Path::new("/dev/zero").exists() {
        check(checkpoint::load("/dev/zero", &m).unwrap_err(), ErrorKind::Io, "checkpoint::load", &["/dev/zero"]);
    }
    // A good file with a lot appended: refused once past the announced end.
    let dir = temp_dir("overlong");
    let path = dir.join("m.safetensors");
    checkpoint::save(&path, &m).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let good = bytes.len();
    bytes.extend(std::iter::repeat_n(0u8, 1 << 20));
    std::fs::write(&path, &bytes).unwrap();
    check(checkpoint::load(&path, &m).unwrap_err(), ErrorKind::Io, "checkpoint::load", &[&format!("{good} bytes")]);
    // Cut short: truncated.
    std::fs::write(&path, &bytes[..good - 1]).unwrap();
    check(checkpoint::load(&path, &m).unwrap_err(), ErrorKind::Io, "checkpoint::load", &[]);
    // A header length beyond the format's 100 MB limit.
    std::fs::write(&path, u64::MAX.to_le_bytes()).unwrap();
    check(checkpoint::load(&path, &m).unwrap_err(), ErrorKind::Io, "checkpoint::load", &["header"]);
    std::fs::write(&path, &bytes[..good]).unwrap();
    checkpoint::load(&path, &m).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn repeated_keys_are_refused() {
    let device = Device::cpu();
    let m = Linear::new(&device, 1, 1, false, 0).unwrap();
    let entry = r#"{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]}"#;
    let twice = with_header(&format!(r#"{{"weight":{entry},"weight":{entry}}}"#), &1f32.to_le_bytes());
    check(
        checkpoint::load_state(&m, &twice).unwrap_err(),
        ErrorKind::Io,
        "checkpoint::load_state",
        &["'weight' appears twice"],
    );
    let once = with_header(&format!(r#"{{"weight":{entry}}}"#), &1f32.to_le_bytes());
    checkpoint::load_state(&m, &once).unwrap();
    // In the metadata too.
    let meta = with_header(&format!(r#"{{"__metadata__":{{"a":"1","a":"2"}},"weight":{entry}}}"#), &1f32.to_le_bytes());
    check(
        checkpoint::load_state(&m, &meta).unwrap_err(),
        ErrorKind::Io,
        "checkpoint::load_state",
        &["'a' appears twice"],
    );
}

/// The optimizer file of `optimizer` with one metadata entry's text replaced.
fn edited(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    assert!(header.contains(from), "{header}");
    let header = header.replace(from, to);
    with_header(&header, &bytes[8 + n..])
}

#[test]
fn non_finite_learning_rates_are_refused() {
    let device = Device::cpu();
    let m = model(&device);
    let mut adam = Adam::new(m.parameters(), 1e-3).unwrap();
    for bad in [f64::NAN, f64::INFINITY, -1.0] {
        check(adam.set_learning_rate(bad).unwrap_err(), ErrorKind::InvalidArgument, "set_learning_rate", &["lr"]);
        assert_eq!(adam.learning_rate(), 1e-3, "unchanged");
    }
    adam.set_learning_rate(2e-3).unwrap();
    let bytes = pollster::block_on(checkpoint::save_optimizer_state(&adam)).unwrap();
    let mut fresh = Adam::new(m.parameters(), 1e-3).unwrap();
    for (from, to) in [
        (r#""lr":"0.002""#, r#""lr":"NaN""#),
        (r#""lr":"0.002""#, r#""lr":"inf""#),
        (r#""eps":"0.00000001""#, r#""eps":"NaN""#),
    ] {
        let bad = edited(&bytes, from, to);
        let e = checkpoint::load_optimizer_state(&mut fresh, &bad).unwrap_err();
        check(e, ErrorKind::InvalidArgument, "checkpoint::load_optimizer_state", &["finite"]);
        assert_eq!(fresh.learning_rate(), 1e-3, "nothing was loaded");
    }
    checkpoint::load_optimizer_state(&mut fresh, &bytes).unwrap();
    assert_eq!((fresh.learning_rate(), fresh.step_count()), (2e-3, 0));
}

#[test]
fn a_save_removes_temporaries_left_by_killed_saves() {
    let device = Device::cpu();
    let m = model(&device);
    let dir = temp_dir("stale");
    let path = dir.join("m.safetensors");
    // What a save killed mid-write leaves: a temporary of a process that is
    // gone (pid 2^31 - 1 does not run), and one of another target.
    let stale = dir.join(format!(".m.safetensors.tmp-{}-0", i32::MAX));
    let other = dir.join(format!(".n.safetensors.tmp-{}-0", i32::MAX));
    std::fs::write(&stale, b"half a checkpoint").unwrap();
    std::fs::write(&other, b"another file's").unwrap();
    checkpoint::save(&path, &m).unwrap();
    if Path::new("/proc/self").exists() {
        assert!(!stale.exists(), "the stale temporary was removed");
    }
    assert!(other.exists(), "temporaries of other targets are left alone");
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(!names.iter().any(|n| n.starts_with(".m.safetensors.tmp-")), "{names:?}");
    checkpoint::load(&path, &m).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
