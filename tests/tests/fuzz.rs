//! Property-based fuzzing on stable Rust (issue 9, item 7): random graphs
//! and random/mutated checkpoint and IDX bytes must never panic or abort;
//! every failure is an `Err`, and where the CPU and wgpu both succeed they
//! agree within the parity tolerances.
//!
//! Each case is a byte string that `Program` interprets as a graph: leaves of
//! random shapes (sometimes absurd: 2^41, 2^62, usize::MAX), dtypes and
//! values, then a dozen ops with random operands, axes, shapes, windows,
//! indices (often out of range), then a read of every tensor and a backward
//! pass from a float result. proptest generates and shrinks the bytes, so a
//! failure prints a minimal program.
//!
//! The seeded default budget runs in seconds; lengthen it with
//! `KILN_FUZZ_CASES=<n>` (cases per property) and change the seed with
//! `KILN_FUZZ_SEED=<u64>`.

mod common;
mod program;

use std::panic::{catch_unwind, AssertUnwindSafe};

use kiln::checkpoint;
use kiln::prelude::*;
use program::{run_program, Mode};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

fn cases(default: u32) -> u32 {
    std::env::var("KILN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn runner(cases: u32, salt: u64) -> TestRunner {
    let seed: u64 = std::env::var("KILN_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x6b696c6e);
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&salt.to_le_bytes());
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key))
}

/// Run `f` and turn a panic into a test failure naming `what`.
fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, TestCaseError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("(non-string panic)");
        TestCaseError::fail(format!("{what} panicked: {msg}"))
    })
}

/// Replays one program (KILN_FUZZ_REPLAY="1,2,3") on the CPU and, where
/// there is one, Vulkan, printing every step and every value.
#[test]
fn replay() {
    let Ok(text) = std::env::var("KILN_FUZZ_REPLAY") else { return };
    let bytes: Vec<u8> = text.split(',').map(|v| v.trim().parse().unwrap()).collect();
    let mode = if std::env::var_os("KILN_FUZZ_CPU_ONLY").is_some() { Mode::Cpu } else { Mode::Paired };
    eprintln!("-- cpu");
    let cpu = run_program(&Device::cpu(), &bytes, mode);
    eprintln!("{cpu:?}");
    if let (Mode::Paired, Some(gpu)) = (mode, common::vulkan_device("fuzz")) {
        eprintln!("-- wgpu");
        let gpu = run_program(&gpu, &bytes, mode);
        eprintln!("{gpu:?}");
    }
}

fn program() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..160)
}

#[test]
fn random_graphs_on_the_cpu_never_panic() {
    let cpu = Device::cpu();
    let totals = std::cell::Cell::new([0usize; 5]);
    runner(cases(20_000), 1)
        .run(&program(), |bytes| {
            let o = no_panic("a CPU graph", || run_program(&cpu, &bytes, Mode::Cpu))?;
            let mut t = totals.get();
            t[0] += 1;
            t[1] += o.trace.len();
            t[2] += o.trace.iter().filter(|&&ok| ok).count();
            t[3] += o.values.iter().filter(|v| v.is_some()).count();
            t[4] += usize::from(!o.grads.is_empty());
            totals.set(t);
            Ok(())
        })
        .unwrap();
    let [programs, steps, ok, reads, backward] = totals.get();
    eprintln!(
        "{programs} programs: {steps} build steps, {ok} succeeded, {} refused with an error; {reads} tensors \
         read; {backward} backward passes with gradients read",
        steps - ok
    );
    assert!(ok > steps / 10 && backward > 0, "the generator should mostly build valid graphs");
}

/// Values agree when both finite within `tol` (relative to max(1, |a|, |b|)),
/// and NaN/±inf sit at the same places.
fn agree(what: &str, cpu: &HostData, gpu: &HostData, tol: f64) -> Result<(), TestCaseError> {
    let (a, g) = (cpu.to_f64_vec(), gpu.to_f64_vec());
    if a.len() != g.len() || cpu.dtype() != gpu.dtype() {
        return Err(TestCaseError::fail(format!("{what}: {cpu:?} vs {gpu:?}")));
    }
    for (i, (&x, &y)) in a.iter().zip(&g).enumerate() {
        let same = if x.is_finite() && y.is_finite() {
            (x - y).abs() <= tol * 1f64.max(x.abs()).max(y.abs())
        } else {
            x.is_nan() == y.is_nan() && (x.is_nan() || x == y)
        };
        if !same {
            return Err(TestCaseError::fail(format!("{what}[{i}]: cpu {x} vs wgpu {y}")));
        }
    }
    Ok(())
}

#[test]
fn random_graphs_agree_between_the_cpu_and_wgpu() {
    let Some(gpu) = common::vulkan_device("fuzz") else { return };
    let cpu = Device::cpu();
    let compared = std::cell::Cell::new(0usize);
    let (programs, comparable, gradients) =
        (std::cell::Cell::new(0usize), std::cell::Cell::new(0usize), std::cell::Cell::new(0usize));
    runner(cases(600), 2)
        .run(&program(), |bytes| {
            let on_cpu = no_panic("a CPU graph", || run_program(&cpu, &bytes, Mode::Paired))?;
            let on_gpu = no_panic("a wgpu graph", || run_program(&gpu, &bytes, Mode::Paired))?;
            programs.set(programs.get() + 1);
            if on_cpu.trace != on_gpu.trace {
                // Legitimate: the wgpu backend refuses some things the CPU
                // takes (limits); the rest of the programs then differ.
                return Ok(());
            }
            comparable.set(comparable.get() + 1);
            for (i, (c, g)) in on_cpu.values.iter().zip(&on_gpu.values).enumerate() {
                if let (Some(c), Some(g)) = (c, g) {
                    agree(&format!("tensor {i}"), c, g, 1e-3)?;
                    compared.set(compared.get() + 1);
                }
            }
            for (i, (c, g)) in on_cpu.grads.iter().zip(&on_gpu.grads).enumerate() {
                if let (Some(c), Some(g)) = (c, g) {
                    agree(&format!("gradient {i}"), c, g, 1e-3)?;
                    gradients.set(gradients.get() + 1);
                }
            }
            Ok(())
        })
        .unwrap();
    eprintln!(
        "{} programs, {} with the same build trace on both devices: {} tensors and {} gradients compared",
        programs.get(),
        comparable.get(),
        compared.get(),
        gradients.get()
    );
    assert!(compared.get() > 0, "no tensor was compared: the generator is broken");
}

/// A small model's checkpoint bytes: the seed the parser properties mutate.
fn checkpoint_seed() -> (Sequential, Vec<u8>) {
    let model = Sequential::mlp(&Device::cpu(), &[3, 4, 2], Activation::Tanh, 0).unwrap();
    let bytes = pollster::block_on(checkpoint::save_state(&model)).unwrap();
    (model, bytes)
}

/// Mutations of `seed`: flip, overwrite, truncate, insert, or rewrite the
/// 8-byte header length; or fully random bytes.
fn mutated(seed: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let n = seed.len();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        (prop::collection::vec((0..n, any::<u8>()), 1..8)).prop_map({
            let seed = seed.clone();
            move |edits| {
                let mut v = seed.clone();
                for (at, byte) in edits {
                    v[at] ^= byte;
                }
                v
            }
        }),
        (0..n).prop_map({
            let seed = seed.clone();
            move |len| seed[..len].to_vec()
        }),
        (any::<u64>(), 0..n).prop_map({
            let seed = seed.clone();
            move |(header, keep)| {
                let mut v = header.to_le_bytes().to_vec();
                v.extend_from_slice(&seed[8..keep.max(8)]);
                v
            }
        }),
        (0..n, prop::collection::vec(any::<u8>(), 1..16)).prop_map(move |(at, bytes)| {
            let mut v = seed.clone();
            v.splice(at..at, bytes);
            v
        }),
    ]
}

#[test]
fn mutated_checkpoints_never_panic() {
    let (model, seed) = checkpoint_seed();
    let before = pollster::block_on(checkpoint::save_state(&model)).unwrap();
    let sgd = std::cell::RefCell::new(Sgd::new(model.parameters(), 0.1).unwrap());
    runner(cases(20_000), 3)
        .run(&mutated(seed), |bytes| {
            let loaded = no_panic("load_state", || checkpoint::load_state(&model, &bytes))?;
            let _ = no_panic("read_metadata", || checkpoint::read_metadata(&bytes))?;
            let _ =
                no_panic("load_optimizer_state", || checkpoint::load_optimizer_state(&mut *sgd.borrow_mut(), &bytes))?;
            if loaded.is_err() {
                // Refused: nothing changed.
                let after = pollster::block_on(checkpoint::save_state(&model)).unwrap();
                prop_assert!(after == before, "a refused load changed the model");
            } else {
                // Accepted (a mutation that kept the file valid): put the
                // original values back for the next case.
                checkpoint::load_state(&model, &before).unwrap();
            }
            Ok(())
        })
        .unwrap();
}

/// A valid IDX file (raw or gzipped) of 2 images of 3 x 2 bytes.
fn idx_seed(gzip: bool) -> Vec<u8> {
    let mut raw = vec![0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 2];
    raw.extend(0..12u8);
    if !gzip {
        return raw;
    }
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(&raw).unwrap();
    e.finish().unwrap()
}

#[test]
fn mutated_idx_files_never_panic() {
    for (salt, gzip) in [(4, false), (5, true)] {
        runner(cases(20_000), salt)
            .run(&mutated(idx_seed(gzip)), |bytes| {
                if let Ok(array) = no_panic("parse_idx", || kiln::data::idx::parse_idx(&bytes))? {
                    let n: usize = array.dims.iter().product();
                    prop_assert!(n <= bytes.len().max(64) * 1032, "{:?} from {} bytes", array.dims, bytes.len());
                }
                Ok(())
            })
            .unwrap();
    }
}
