//! The random-program interpreter shared by the proptest properties in
//! `tests/fuzz.rs` and the cargo-fuzz target `fuzz/fuzz_targets/cpu_program.rs`:
//! any byte string is a program (leaves, constructors, ops, reads, backward).
#![allow(dead_code)]

use kiln::nn::{cross_entropy, mse_loss, nll_loss};
use kiln::prelude::*;
use kiln::{ReduceOp, UnaryOp, Window2d};

/// A cursor over the case's bytes; past the end every read is 0.
pub struct Bytes<'a> {
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
pub enum Mode {
    Cpu,
    Paired,
}

/// What running a program produced, for comparing two devices.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Ok/Err of every build step, in order: two devices are comparable
    /// only while these agree.
    pub trace: Vec<bool>,
    /// Values of every tensor read (None: the read failed).
    pub values: Vec<Option<HostData>>,
    /// Gradients of the leaf variables after backward, when it ran.
    pub grads: Vec<Option<HostData>>,
}

pub fn run_program(device: &Device, data: &[u8], mode: Mode) -> Outcome {
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

pub fn verbose() -> bool {
    std::env::var_os("KILN_FUZZ_VERBOSE").is_some()
}

pub trait ReadHost {
    fn to_vec_blocking_host(&self) -> Result<HostData>;
}

impl ReadHost for Tensor<'_> {
    fn to_vec_blocking_host(&self) -> Result<HostData> {
        pollster::block_on(self.to_host())
    }
}
