//! The operator coverage report, generated from the code: for every
//! primitive op, whether each backend has a kernel, whether it has a gradient
//! rule (or why not), and whether that rule passes a first- and second-order
//! finite-difference check *now*. `kiln ops` prints it; a test requires every
//! cell to be filled.

use crate::device::Device;
use crate::dtype::{DType, HostData};
use crate::error::Result;
use crate::gradcheck::{gradcheck, gradgradcheck, BoxedFn, Case, CheckInput};
use crate::graph::{Graph, Tensor};
use crate::op::{BinaryOp, CompareOp, Domain, Op, ReduceOp, UnaryOp, Window2d};
use crate::ops::SliceSpec;

/// What the report says about one op.
#[derive(Clone, Debug)]
pub struct OpCoverage {
    pub name: &'static str,
    /// Per device given: Some(true/false) kernel present, None for leaves
    /// (they hold data; nothing runs).
    pub kernels: Vec<Option<bool>>,
    /// Ok(()) when a rule exists, Err(reason) when declared non-differentiable.
    pub rule: std::result::Result<(), String>,
    /// Worst error/tolerance ratio of the first-order check (None: not applicable).
    pub first_order: Option<f64>,
    pub second_order: Option<f64>,
}

fn input(values: &[f64], dims: &[usize]) -> CheckInput {
    CheckInput::new(values.to_vec(), dims)
}

fn ramp(n: usize, low: f64, step: f64) -> Vec<f64> {
    // Distinct values (no ties for max/min), away from kinks.
    (0..n).map(|i| low + step * ((i * 7) % n) as f64).collect()
}

fn constant_i32<'g>(g: &'g Graph, values: &[i32]) -> Result<Tensor<'g>> {
    g.tensor_from(values, &[values.len()])
}

fn window(k: usize, s: usize, p: usize) -> Window2d {
    Window2d {
        kernel: [k as u32; 2],
        stride: [s as u32; 2],
        dilation: [1; 2],
        pad_begin: [p as u32; 2],
        pad_end: [p as u32; 2],
    }
}

/// Sample values of `dims` from an operand domain of the op table,
/// deterministic and free of ties.
pub fn sample(domain: Domain, dims: &[usize]) -> CheckInput {
    let n: usize = dims.iter().product();
    let values = match domain {
        Domain::Interval(low, high) => ramp(n, low, (high - low) / n.max(1) as f64),
        Domain::AwayFromZero(low, high) => ramp(n, low, (high - low) / n.max(1) as f64)
            .into_iter()
            .enumerate()
            .map(|(i, v)| if i % 2 == 0 { v } else { -v })
            .collect(),
    };
    input(&values, dims)
}

fn boxed(f: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>> + 'static) -> BoxedFn {
    Box::new(f)
}

/// The sample case for an op name (every name of `Op::kind_names()` has
/// one): a small instance of the op, of the same `gradcheck::Case` type the
/// test suites' tables hold.
pub fn op_case(name: &str) -> Option<Case> {
    fn case(
        name: &str,
        inputs: Vec<CheckInput>,
        build: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>> + 'static,
    ) -> Option<Case> {
        Some(crate::gradcheck::case(name, inputs, build))
    }
    let mat = |r, c| input(&ramp(r * c, -0.9, 0.13), &[r, c]);
    let image = || input(&ramp(16, -0.8, 0.11), &[1, 1, 4, 4]);
    let domains = |op: Op| op.info().elementwise.expect("element-wise").domains;
    let unary = |u: UnaryOp| -> Option<Case> {
        let inputs = vec![sample(domains(Op::Unary(u))[0], &[2, 3])];
        case(u.name(), inputs, move |_, x| x[0].unary(u))
    };
    let binary = |b: BinaryOp| -> Option<Case> {
        let [da, db] = domains(Op::Binary(b));
        let inputs = vec![sample(da, &[2, 3]), sample(db, &[3])];
        case(b.name(), inputs, move |_, x| x[0].binary(b, x[1]))
    };
    let compare = |c: CompareOp| -> Option<Case> {
        case(c.name(), vec![mat(2, 3), input(&[0.05, -0.35, 0.6], &[3])], move |_, x| x[0].compare(c, x[1]))
    };
    let reduce = |r: ReduceOp| -> Option<Case> {
        let build: BoxedFn = match r {
            ReduceOp::Sum => boxed(|_, x| x[0].sum(&[0, 2], true)),
            ReduceOp::Max => boxed(|_, x| x[0].max(&[1, 2], false)),
            ReduceOp::Min => boxed(|_, x| x[0].min(&[0], false)),
            ReduceOp::Prod => boxed(|_, x| x[0].prod(&[2], true)),
            ReduceOp::ArgMax => boxed(|_, x| x[0].argmax(&[1], false)),
            ReduceOp::ArgMin => boxed(|_, x| x[0].argmin(&[2], false)),
        };
        let inputs = vec![input(&ramp(12, 0.4, 0.1), &[2, 2, 3])];
        case(r.name(), inputs, build)
    };
    if let Some(&u) = UnaryOp::ALL.iter().find(|u| u.name() == name) {
        return unary(u);
    }
    if let Some(&b) = BinaryOp::ALL.iter().find(|b| b.name() == name) {
        return binary(b);
    }
    if let Some(&c) = CompareOp::ALL.iter().find(|c| c.name() == name) {
        return compare(c);
    }
    if let Some(&r) = ReduceOp::ALL.iter().find(|r| r.name() == name) {
        return reduce(r);
    }
    if let Some(op) = crate::op::custom::find(name) {
        let inputs = op.sample()?.to_vec();
        return case(op.name(), inputs, move |_, x| op.apply(x));
    }
    match name {
        "Input" => case("Input", vec![mat(2, 2)], |g, x| {
            g.tensor_from(&[1.0f64, 2.0], &[2]).and_then(|t| t.add(x[0].sum_all()?))
        }),
        "Param" => case("Param", vec![mat(2, 2)], |_, x| x[0].mul(2.0)),
        "Full" => case("Full", vec![mat(2, 2)], |g, x| x[0].add(g.full(&[2, 2], 0.5, x[0].dtype())?)),
        "Arange" => case("Arange", vec![mat(2, 2)], |g, x| x[0].add(g.arange(0.0, 0.5, 2, x[0].dtype())?)),
        "RandUniform" => {
            case("RandUniform", vec![mat(2, 2)], |g, x| x[0].mul(g.rand_uniform(&[2, 2], 3, x[0].dtype())?))
        }
        "RandNormal" => {
            case("RandNormal", vec![mat(2, 2)], |g, x| x[0].mul(g.rand_normal(&[2, 2], 3, x[0].dtype())?))
        }
        "Cast" => case("Cast", vec![mat(2, 3)], |_, x| x[0].cast(DType::F64)),
        "Where" => {
            case("Where", vec![mat(2, 3), input(&[0.2, 0.3, -0.4], &[3])], |_, x| x[0].gt(0.0)?.where_(x[0], x[1]))
        }
        "MatMul" => case("MatMul", vec![mat(2, 3), mat(3, 2)], |_, x| x[0].matmul(x[1])),
        "Reshape" => case("Reshape", vec![mat(2, 3)], |_, x| x[0].reshape(&[3, 2])),
        "Permute" => case("Permute", vec![input(&ramp(12, 0.1, 0.1), &[2, 3, 2])], |_, x| x[0].permute(&[2, 0, 1])),
        "Expand" => case("Expand", vec![input(&[0.1, 0.7, -0.2], &[3, 1])], |_, x| x[0].expand(&[2, 3, 2])),
        "Slice" => {
            case("Slice", vec![mat(4, 5)], |_, x| x[0].slice(&[SliceSpec::new(1, 4, 2), SliceSpec::new(0, 5, 3)]))
        }
        "SliceBackward" => case("SliceBackward", vec![mat(2, 2)], |_, x| {
            x[0].slice_backward(&[4, 5], &[SliceSpec::new(1, 4, 2), SliceSpec::new(0, 5, 3)])
        }),
        "Concat" => case("Concat", vec![mat(2, 3), mat(1, 3)], |_, x| Tensor::concat(&[x[0], x[1]], 0)),
        "IndexSelect" => {
            case("IndexSelect", vec![mat(3, 2)], |g, x| x[0].index_select(0, constant_i32(g, &[2, 0, 2])?))
        }
        "ScatterAdd" => {
            case("ScatterAdd", vec![mat(3, 2), mat(2, 2)], |g, x| x[0].scatter_add(0, constant_i32(g, &[1, 1])?, x[1]))
        }
        "Im2Col" => case("Im2Col", vec![image()], |_, x| x[0].im2col(window(2, 1, 1))),
        "Col2Im" => {
            case("Col2Im", vec![input(&ramp(36, -0.5, 0.05), &[1, 4, 9])], |_, x| x[0].col2im([4, 4], window(2, 1, 0)))
        }
        "MaxPool2d" => case("MaxPool2d", vec![image()], |_, x| x[0].max_pool2d_window(window(2, 2, 0))),
        "MaxPool2dBackward" => case("MaxPool2dBackward", vec![input(&ramp(4, 0.2, 0.3), &[1, 1, 2, 2])], |g, x| {
            let pooled_input = g.from_host(HostData::F64(ramp(16, -0.8, 0.11)), &[1, 1, 4, 4])?;
            pooled_input.max_pool2d_backward(x[0], window(2, 2, 0))
        }),
        // Diagonal -1 on 4 x 3: the rows keep 0 (all zeros), 1, 2 and 3 keys.
        "CausalSoftmax" => {
            case("CausalSoftmax", vec![input(&ramp(24, -0.9, 0.09), &[2, 4, 3])], |_, x| x[0].causal_softmax(-1))
        }
        // Rows of 5 with distinct values (an eps small next to their
        // variance); the primitive itself, whatever the device's numerics.
        "LayerNorm" => {
            case("LayerNorm", vec![input(&ramp(15, -0.9, 0.13), &[3, 5])], |_, x| x[0].layer_norm_rows(1e-5))
        }
        "LayerNormBackward" => case(
            "LayerNormBackward",
            vec![input(&ramp(15, -0.9, 0.13), &[3, 5]), input(&ramp(15, -0.7, 0.1), &[3, 5])],
            |_, x| x[0].layer_norm_backward(x[1], 1e-5),
        ),
        // Both directions, inclusive and exclusive, along either axis.
        "CumSum" => case("CumSum", vec![mat(3, 4)], |_, x| {
            x[0].cumsum(1, true, true)?.add(x[0].cumsum(0, false, false)?)?.mul(x[0])
        }),
        // Positions (no rule); the values' gradient goes through IndexSelect.
        "TopK" => case("TopK", vec![mat(3, 4)], |_, x| x[0].top_k(2, 1, true).map(|(_, i)| i)),
        _ => None,
    }
}

/// Check every primitive and every registered custom op on the CPU
/// (gradients, in f64) and ask each device in `devices` whether it has a
/// kernel for it. A custom op registered without sample operands gets a row
/// whose checks read "n/a" (and is incomplete).
pub async fn coverage(devices: &[Device]) -> Result<Vec<OpCoverage>> {
    let cpu = Device::cpu();
    let mut rows = Vec::new();
    let reference = crate::op::custom::reference();
    let mut kinds = Op::kinds();
    kinds.extend(crate::op::custom::registered().into_iter().filter(|&c| c != reference).map(Op::Custom));
    for kind in kinds {
        let name = kind.name();
        let case = match (op_case(name), kind) {
            (Some(case), _) => case,
            (None, Op::Custom(c)) => {
                let kernels = devices.iter().map(|d| Some(d.backend().supports(&kind, DType::F32))).collect();
                let rule = match kind.info().no_rule {
                    Some(reason) => Err(reason.to_string()),
                    None => Ok(()),
                };
                rows.push(OpCoverage { name: c.name(), kernels, rule, first_order: None, second_order: None });
                continue;
            }
            (None, _) => {
                return Err(crate::error::Error::unsupported("coverage", format!("no sample case for op {name}")))
            }
        };
        // Build once to find the op's node, its dtype, and whether a rule applies.
        let graph = Graph::new(&cpu);
        let xs: Vec<Tensor<'_>> = case
            .inputs
            .iter()
            .map(|i| graph.variable_from_host(HostData::F64(i.values.clone()), &i.dims))
            .collect::<Result<_>>()?;
        let out = (case.build)(&graph, &xs)?;
        let node = find_node(&graph, out, name).unwrap_or(out);
        let leaf = matches!(kind, Op::Input | Op::Param(_));
        let kernels = devices
            .iter()
            .map(|d| {
                if leaf {
                    None
                } else {
                    let dtype = if node.dtype() == DType::F64 { DType::F32 } else { node.dtype() };
                    let dtype = if d.name().starts_with("cpu") { node.dtype() } else { dtype };
                    Some(d.backend().supports(&node.op(), dtype))
                }
            })
            .collect();
        let op = if leaf { kind } else { node.op() };
        let rule = match op.info().no_rule {
            Some(reason) => Err(reason.to_string()),
            None => Ok(()),
        };
        let differentiable = !leaf && rule.is_ok() && out.dtype().is_float();
        let (first_order, second_order) = if differentiable {
            let options = case.options.unwrap_or_default();
            let first = gradcheck(&cpu, &*case.build, &case.inputs, options).await?;
            let second = match case.second_order {
                true => Some(gradgradcheck(&cpu, &*case.build, &case.inputs, options).await?.worst_ratio),
                false => None,
            };
            (Some(first.worst_ratio), second)
        } else {
            (None, None)
        };
        rows.push(OpCoverage { name, kernels, rule, first_order, second_order });
    }
    Ok(rows)
}

/// The first node named `name` at or below `out` (the case's op itself).
fn find_node<'g>(graph: &'g Graph, out: Tensor<'g>, name: &str) -> Option<Tensor<'g>> {
    (0..=out.id()).map(|id| graph.tensor(id)).find(|t| t.op().name() == name)
}

/// The report as a Markdown table.
pub fn markdown(rows: &[OpCoverage], device_names: &[String]) -> String {
    let mut s = String::from("| op |");
    for d in device_names {
        s.push_str(&format!(" kernel: {d} |"));
    }
    s.push_str(" gradient rule | 1st-order check | 2nd-order check |\n|---|");
    for _ in device_names {
        s.push_str("---|");
    }
    s.push_str("---|---|---|\n");
    let check = |r: Option<f64>| match r {
        None => "n/a".to_string(),
        Some(v) if v <= 1.0 => format!("pass ({v:.1e})"),
        Some(v) => format!("**FAIL** ({v:.1e})"),
    };
    for row in rows {
        s.push_str(&format!("| {} |", row.name));
        for k in &row.kernels {
            s.push_str(match k {
                None => " leaf |",
                Some(true) => " yes |",
                Some(false) => " **no** |",
            });
        }
        let rule = match &row.rule {
            Ok(()) => "yes".to_string(),
            Err(why) => format!("not differentiable: {why}"),
        };
        s.push_str(&format!(" {rule} | {} | {} |\n", check(row.first_order), check(row.second_order)));
    }
    s
}

/// True when a row is complete: kernels everywhere, and a passing rule or a
/// declared reason.
pub fn row_is_complete(row: &OpCoverage) -> bool {
    row.kernels.iter().all(|k| k != &Some(false))
        && match &row.rule {
            Ok(()) => row.first_order.is_some_and(|r| r <= 1.0) && row.second_order.is_some_and(|r| r <= 1.0),
            Err(_) => true,
        }
}
