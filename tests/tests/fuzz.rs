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

use std::panic::{catch_unwind, AssertUnwindSafe};

use kiln::nn::{cross_entropy, mse_loss, nll_loss};
use kiln::prelude::*;
use kiln::{checkpoint, ReduceOp, UnaryOp, Window2d};
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

/// A cursor over the case's bytes; past the end every read is 0.
struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    fn below(&mut self, n: usize) -> usize {
        self.byte() as usize % n.max(1)
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
    fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }
    /// A dimension: usually 0..=4, sometimes absurd (each absurd one alone
    /// passes kiln's element maximum, so nothing that large is ever
    /// allocated: the build must refuse it).
    fn dim(&mut self) -> usize {
        match self.byte() {
            0..=239 => self.below(5),
            240..=243 => 1 << 41,
            244..=247 => 1 << 62,
            248..=251 => usize::MAX,
            _ => (1 << 63) + 1,
        }
    }
    fn dims(&mut self) -> Vec<usize> {
        let rank = self.below(5);
        (0..rank).map(|_| self.dim()).collect()
    }
    fn axis(&mut self) -> isize {
        self.below(11) as isize - 5
    }
    fn axes(&mut self) -> Vec<isize> {
        let n = self.below(4);
        (0..n).map(|_| self.axis()).collect()
    }
    fn value(&mut self) -> f64 {
        match self.byte() {
            0..=229 => (self.byte() as f64 - 128.0) / 32.0,
            230..=235 => 0.0,
            236..=240 => f64::INFINITY,
            241..=245 => f64::NEG_INFINITY,
            246..=250 => f64::NAN,
            _ => 1e30,
        }
    }
}

/// Which ops a program may use: everything on the CPU; on a CPU/wgpu pair,
/// the ops whose results are continuous in their inputs (no comparisons,
/// arg reductions or casts of computed floats, where ulp-level differences
/// between backends legitimately flip a result).
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Cpu,
    Paired,
}

/// What running a program produced, for comparing two devices.
#[derive(Debug, Default)]
struct Outcome {
    /// Ok/Err of every build step, in order: two devices are comparable
    /// only while these agree.
    trace: Vec<bool>,
    /// Values of every tensor read (None: the read failed).
    values: Vec<Option<HostData>>,
    /// Gradients of the leaf variables after backward, when it ran.
    grads: Vec<Option<HostData>>,
}

fn run_program(device: &Device, data: &[u8], mode: Mode) -> Outcome {
    let mut b = Bytes { data, at: 0 };
    let graph = Graph::new(device);
    let mut out = Outcome::default();
    let mut pool: Vec<Tensor<'_>> = Vec::new();
    let mut leaves: Vec<Tensor<'_>> = Vec::new();
    let dtypes: &[DType] = match mode {
        Mode::Cpu => &[DType::F32, DType::F32, DType::F64, DType::I32, DType::Bool],
        Mode::Paired => &[DType::F32, DType::F32, DType::F32, DType::I32],
    };

    // Leaves.
    for _ in 0..1 + b.below(3) {
        let dims = b.dims();
        let dtype = b.pick(dtypes);
        let variable = dtype.is_float() && b.flag();
        let n: usize = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or(usize::MAX);
        let n_data = if n <= 1024 { n } else { b.below(8) };
        let values: Vec<f64> = (0..n_data).map(|_| b.value()).collect();
        let host = match dtype {
            DType::F32 => HostData::F32(values.iter().map(|&v| v as f32).collect()),
            DType::F64 => HostData::F64(values),
            DType::I32 => HostData::I32(values.iter().map(|&v| (v * 4.0) as i32).collect()),
            DType::Bool => HostData::Bool(values.iter().map(|&v| v > 0.0).collect()),
        };
        let t = if variable { graph.variable_from_host(host, &dims) } else { graph.from_host(host, &dims) };
        out.trace.push(t.is_ok());
        if let Ok(t) = t {
            pool.push(t);
            if variable {
                leaves.push(t);
            }
        }
    }
    // The input data tensors are pool[..inputs].
    let inputs = pool.len();
    // Constructors with random sizes.
    let dims = b.dims();
    let made = match b.below(4) {
        0 => graph.zeros(&dims, b.pick(dtypes)),
        1 => graph.full(&dims, b.value(), b.pick(dtypes)),
        2 => graph.arange(b.value(), b.value(), b.dim(), b.pick(dtypes)),
        _ => graph.ones(&dims, DType::F32),
    };
    out.trace.push(made.is_ok());
    if let Ok(t) = made {
        pool.push(t);
    }

    let steps = 4 + b.below(12);
    for _ in 0..steps {
        if pool.is_empty() || b.done() {
            break;
        }
        let x = pool[b.below(pool.len())];
        let y = pool[b.below(pool.len())];
        let op = b.byte();
        let result: Result<Vec<Tensor<'_>>> = match op % 32 {
            0 => x.add(y).map(|t| vec![t]),
            1 => x.sub(y).map(|t| vec![t]),
            2 => x.mul(y).map(|t| vec![t]),
            3 if mode == Mode::Cpu => x.div(y).map(|t| vec![t]),
            4 if mode == Mode::Cpu => x.pow(y).map(|t| vec![t]),
            5 => x.maximum(y).map(|t| vec![t]),
            6 => {
                let u = b.pick(&[
                    UnaryOp::Neg,
                    UnaryOp::Abs,
                    UnaryOp::Exp,
                    UnaryOp::Tanh,
                    UnaryOp::Sigmoid,
                    UnaryOp::Relu,
                    UnaryOp::Sin,
                    UnaryOp::Cos,
                    UnaryOp::Log,
                    UnaryOp::Sqrt,
                    UnaryOp::Recip,
                    UnaryOp::Erf,
                ]);
                // Sin and Cos of large arguments are ill-conditioned (a
                // 1-ulp difference in a computed 1e30 changes the result
                // entirely), so a pair applies them to an input tensor, the
                // same bits on both devices: that still reaches every
                // argument reduction path (inputs hold 1e30, ±inf, NaN).
                let trig = matches!(u, UnaryOp::Sin | UnaryOp::Cos);
                let continuous = !matches!(u, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Recip);
                if mode == Mode::Cpu {
                    x.unary(u).map(|t| vec![t])
                } else if trig && inputs > 0 {
                    pool[b.below(inputs)].unary(u).map(|t| vec![t])
                } else if continuous && !trig {
                    x.unary(u).map(|t| vec![t])
                } else {
                    x.abs().map(|t| vec![t])
                }
            }
            7 => {
                let r = b.pick(&ReduceOp::ALL);
                let paired_ok = !matches!(r, ReduceOp::ArgMax | ReduceOp::ArgMin);
                let axes = b.axes();
                let keep = b.flag();
                if mode == Mode::Cpu || paired_ok {
                    x.reduce(r, &axes, keep).map(|t| vec![t])
                } else {
                    x.sum(&axes, keep).map(|t| vec![t])
                }
            }
            8 => x.mean(&b.axes(), b.flag()).map(|t| vec![t]),
            9 => x.var(&b.axes(), b.flag(), b.below(3)).map(|t| vec![t]),
            10 => x.matmul(y).map(|t| vec![t]),
            11 => x.matmul_t(y, b.flag(), b.flag()).map(|t| vec![t]),
            12 => x.reshape_to(&b.dims()).map(|t| vec![t]),
            13 => {
                let dims: Vec<isize> = (0..b.below(5)).map(|_| b.below(7) as isize - 2).collect();
                x.reshape(&dims).map(|t| vec![t])
            }
            14 => {
                let perm: Vec<usize> = (0..b.below(5)).map(|_| b.below(6)).collect();
                x.permute(&perm).map(|t| vec![t])
            }
            15 => x.transpose(b.axis(), b.axis()).map(|t| vec![t]),
            16 => x.expand(&b.dims()).map(|t| vec![t]),
            17 => {
                let (axis, start, end, step) = (b.axis(), b.dim(), b.dim(), b.dim());
                x.slice_axis(axis, start, end, step).map(|t| vec![t])
            }
            18 => Tensor::concat(&[x, y], b.axis()).map(|t| vec![t]),
            19 => {
                let n = b.below(5);
                let idx: Vec<i32> = (0..n).map(|_| b.below(9) as i32 - 2).collect();
                graph.tensor_from(&idx, &[n]).and_then(|i| x.index_select(b.axis(), i)).map(|t| vec![t])
            }
            20 => {
                let n = b.below(5);
                let idx: Vec<i32> = (0..n).map(|_| b.below(9) as i32 - 2).collect();
                graph.tensor_from(&idx, &[n]).and_then(|i| x.scatter_add(b.axis(), i, y)).map(|t| vec![t])
            }
            21 => x.softmax(b.axis()).map(|t| vec![t]),
            22 => x.log_softmax(b.axis()).map(|t| vec![t]),
            23 => x.logsumexp(&b.axes(), b.flag()).map(|t| vec![t]),
            24 => {
                let n = b.below(5);
                let labels: Vec<i32> = (0..n).map(|_| b.below(7) as i32 - 1).collect();
                let l = graph.tensor_from(&labels, &[n]);
                match b.below(3) {
                    0 => l.and_then(|l| cross_entropy(x, l)).map(|t| vec![t]),
                    1 => l.and_then(|l| nll_loss(x, l)).map(|t| vec![t]),
                    _ => mse_loss(x, y).map(|t| vec![t]),
                }
            }
            25 => {
                let w = Window2d::new(
                    [b.dim(), b.dim()],
                    [b.dim(), b.dim()],
                    [b.below(3), b.below(3)],
                    [1, 1 + b.below(2)],
                );
                w.and_then(|w| if b.flag() { x.im2col(w) } else { x.max_pool2d_window(w) }).map(|t| vec![t])
            }
            26 if mode == Mode::Cpu => x.cast(b.pick(dtypes)).map(|t| vec![t]),
            27 if mode == Mode::Cpu => x.lt(y).and_then(|m| m.where_(x, y)).map(|t| vec![t]),
            28 => x.clamp(b.value(), b.value()).map(|t| vec![t]),
            29 => x.split(&[b.below(3), b.below(3)], b.axis()),
            30 => x.chunk(b.dim(), b.axis()),
            31 => x.one_hot(b.dim(), DType::F32).map(|t| vec![t]),
            _ => x.square().map(|t| vec![t]),
        };
        if verbose() {
            let shown = match &result {
                Ok(ts) => format!("{:?}", ts.iter().map(|t| (t.dims().to_vec(), t.dtype())).collect::<Vec<_>>()),
                Err(e) => e.to_string(),
            };
            eprintln!("op {} on {:?} {:?} and {:?} {:?} -> {shown}", op % 32, x.dims(), x.dtype(), y.dims(), y.dtype());
        }
        out.trace.push(result.is_ok());
        if let Ok(ts) = result {
            pool.extend(ts);
        }
    }

    // Read everything (runtime errors such as bad indices surface here).
    for t in &pool {
        out.values.push(t.to_vec_blocking_host().ok());
    }
    // Backward from the last float result that needs a gradient.
    if let Some(root) = pool.iter().rev().find(|t| t.requires_grad() && t.dtype().is_float()) {
        let done = root.sum_all().and_then(|s| s.backward());
        out.trace.push(done.is_ok());
        if done.is_ok() {
            for l in &leaves {
                out.grads.push(l.grad().and_then(|g| g.to_vec_blocking_host().ok()));
            }
        }
    }
    // The graph still works after whatever failed.
    let fine = graph.ones(&[2], DType::F32).and_then(|t| t.sum_all()).and_then(|t| t.item_blocking());
    assert_eq!(fine.ok(), Some(2.0), "the graph is still usable");
    out
}

fn verbose() -> bool {
    std::env::var_os("KILN_FUZZ_VERBOSE").is_some()
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

trait ReadHost {
    fn to_vec_blocking_host(&self) -> Result<HostData>;
}

impl ReadHost for Tensor<'_> {
    fn to_vec_blocking_host(&self) -> Result<HostData> {
        pollster::block_on(self.to_host())
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
