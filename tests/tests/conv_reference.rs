//! Convolution and pooling against reference values from an independent
//! implementation: tests/reference/make_conv_reference.py computes every
//! output element with nested loops straight from the definitions
//! (PyTorch's conventions; no im2col, no matrix products) and commits
//! tests/reference/conv_reference.json, which this test replays through
//! kiln's layers in f32 on the CPU (tolerance 1e-5).

mod common;

use common::values;
use kiln::nn::{AdaptiveAvgPool2d, AvgPool2d, Conv2d, ConvOptions, ConvTranspose2d, Module};
use kiln::{Device, Graph, HostData};
use serde_json::Value;

const TOLERANCE: f64 = 1e-5;

fn reference() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/reference/conv_reference.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).expect("conv_reference.json parses")
}

struct Array {
    dims: Vec<usize>,
    values: Vec<f64>,
}

impl Array {
    fn f32(&self) -> Vec<f32> {
        self.values.iter().map(|&v| v as f32).collect()
    }
}

fn array(v: &Value) -> Array {
    let dims = v["dims"].as_array().expect("dims").iter().map(|d| d.as_u64().unwrap() as usize).collect();
    let values = v["values"].as_array().expect("values").iter().map(|x| x.as_f64().unwrap()).collect();
    Array { dims, values }
}

fn pair(v: &Value) -> [usize; 2] {
    let a = v.as_array().expect("a pair");
    [a[0].as_u64().unwrap() as usize, a[1].as_u64().unwrap() as usize]
}

/// Compare, returning a description of the first problem (so every case
/// runs and all failures are reported together).
fn compare(name: &str, got_dims: &[usize], got: &[f64], expected: &Array) -> Option<String> {
    if got_dims != expected.dims.as_slice() {
        return Some(format!("{name}: shape {got_dims:?}, expected {:?}", expected.dims));
    }
    let worst = got
        .iter()
        .zip(&expected.values)
        .enumerate()
        .map(|(i, (g, e))| (i, (g - e).abs() / e.abs().max(1.0)))
        .fold((0, 0.0f64), |a, b| if b.1 > a.1 || b.1.is_nan() { b } else { a });
    if worst.1 > TOLERANCE || worst.1.is_nan() {
        let i = worst.0;
        return Some(format!(
            "{name}: element {i} is {} but the reference says {} (relative error {:.2e})",
            got[i], expected.values[i], worst.1
        ));
    }
    None
}

/// Run `run` on each case of `section` in a fresh graph on `device` (the
/// layers' parameters live there), collecting failures.
fn each_case(
    device: &Device,
    doc: &Value,
    section: &str,
    failures: &mut Vec<String>,
    mut run: impl FnMut(&Value, &Graph) -> kiln::Result<(Vec<usize>, Vec<f64>)>,
) -> usize {
    let cases = doc[section].as_array().unwrap_or_else(|| panic!("section {section}"));
    for case in cases {
        let name = format!("{section} '{}'", case["name"].as_str().unwrap());
        let graph = Graph::new(device);
        match run(case, &graph) {
            Ok((dims, got)) => failures.extend(compare(&name, &dims, &got, &array(&case["output"]))),
            Err(e) => failures.push(format!("{name}: error: {e}")),
        }
    }
    cases.len()
}

#[test]
fn layers_match_the_independent_reference() {
    let doc = reference();
    let device = Device::cpu();
    let mut failures = Vec::new();
    let mut counts = Vec::new();

    counts.push(each_case(&device, &doc, "conv2d", &mut failures, |case, graph| {
        let (x, weight) = (array(&case["input"]), array(&case["weight"]));
        let bias = (!case["bias"].is_null()).then(|| array(&case["bias"]));
        let groups = case["groups"].as_u64().unwrap() as usize;
        let options = ConvOptions {
            stride: pair(&case["stride"]),
            padding: pair(&case["padding"]),
            dilation: pair(&case["dilation"]),
            groups,
            bias: bias.is_some(),
        };
        let conv = Conv2d::new(&device, x.dims[1], weight.dims[0], pair(&case["kernel"]), options, 0)?;
        assert_eq!(conv.weight.dims().as_slice(), weight.dims.as_slice());
        conv.weight.set_value(&HostData::F32(weight.f32()))?;
        if let (Some(p), Some(b)) = (&conv.bias, &bias) {
            p.set_value(&HostData::F32(b.f32()))?;
        }
        let y = conv.forward(graph.tensor_from(&x.f32(), &x.dims)?)?;
        Ok((y.dims().to_vec(), values(&y)))
    }));

    counts.push(each_case(&device, &doc, "conv_transpose2d", &mut failures, |case, graph| {
        let (x, weight) = (array(&case["input"]), array(&case["weight"]));
        let bias = (!case["bias"].is_null()).then(|| array(&case["bias"]));
        let options = ConvOptions {
            stride: pair(&case["stride"]),
            padding: pair(&case["padding"]),
            dilation: pair(&case["dilation"]),
            groups: 1,
            bias: bias.is_some(),
        };
        let conv = ConvTranspose2d::new(
            &device,
            x.dims[1],
            weight.dims[1],
            pair(&case["kernel"]),
            options,
            pair(&case["output_padding"]),
            0,
        )?;
        assert_eq!(conv.weight.dims().as_slice(), weight.dims.as_slice());
        conv.weight.set_value(&HostData::F32(weight.f32()))?;
        if let (Some(p), Some(b)) = (&conv.bias, &bias) {
            p.set_value(&HostData::F32(b.f32()))?;
        }
        let y = conv.forward(graph.tensor_from(&x.f32(), &x.dims)?)?;
        Ok((y.dims().to_vec(), values(&y)))
    }));

    counts.push(each_case(&device, &doc, "max_pool2d", &mut failures, |case, graph| {
        let x = array(&case["input"]);
        let y = graph.tensor_from(&x.f32(), &x.dims)?.max_pool2d(
            pair(&case["kernel"]),
            pair(&case["stride"]),
            pair(&case["padding"]),
            pair(&case["dilation"]),
            case["ceil_mode"].as_bool().unwrap(),
        )?;
        Ok((y.dims().to_vec(), values(&y)))
    }));

    counts.push(each_case(&device, &doc, "avg_pool2d", &mut failures, |case, graph| {
        let x = array(&case["input"]);
        let pool =
            AvgPool2d { kernel: pair(&case["kernel"]), stride: pair(&case["stride"]), padding: pair(&case["padding"]) };
        let y = pool.forward(graph.tensor_from(&x.f32(), &x.dims)?)?;
        Ok((y.dims().to_vec(), values(&y)))
    }));

    counts.push(each_case(&device, &doc, "adaptive_avg_pool2d", &mut failures, |case, graph| {
        let x = array(&case["input"]);
        let y =
            AdaptiveAvgPool2d { output: pair(&case["output_size"]) }.forward(graph.tensor_from(&x.f32(), &x.dims)?)?;
        Ok((y.dims().to_vec(), values(&y)))
    }));

    let total: usize = counts.iter().sum();
    eprintln!("{total} reference cases (conv2d, conv_transpose2d, max_pool2d, avg_pool2d, adaptive: {counts:?})");
    assert!(counts.iter().all(|&c| c > 0) && total >= 8, "{counts:?}");
    assert!(failures.is_empty(), "{} of {total} reference cases failed:\n  {}", failures.len(), failures.join("\n  "));
}

/// The reference file covers what the issue names: per-axis stride,
/// padding and dilation that differ between the axes, groups > 1, and ceil
/// mode both adding a window and dropping one that would start in the
/// padding.
#[test]
fn the_reference_covers_every_named_combination() {
    let doc = reference();
    let cases = |s: &str| doc[s].as_array().unwrap().clone();
    let differs = |c: &Value, key: &str| {
        let p = pair(&c[key]);
        p[0] != p[1]
    };
    let conv = cases("conv2d");
    assert!(conv.iter().any(|c| differs(c, "stride") && differs(c, "padding") && differs(c, "dilation")));
    assert!(conv.iter().any(|c| c["groups"].as_u64().unwrap() > 1 && differs(c, "dilation")));
    assert!(conv.iter().any(|c| c["bias"].is_null()));
    let convt = cases("conv_transpose2d");
    assert!(convt.iter().any(|c| differs(c, "stride") && differs(c, "padding") && differs(c, "dilation")));
    let pools = cases("max_pool2d");
    assert!(pools.iter().any(|c| differs(c, "stride") && differs(c, "dilation") && c["ceil_mode"] == true));
    // Ceil mode adding a window (output larger than floor mode's) and
    // dropping one (PyTorch's rule), by the sizes in the file.
    let floor = |c: &Value, a: usize| {
        let (h, k, s, p, d) = (
            array(&c["input"]).dims[2 + a],
            pair(&c["kernel"])[a],
            pair(&c["stride"])[a],
            pair(&c["padding"])[a],
            pair(&c["dilation"])[a],
        );
        (h + 2 * p - d * (k - 1) - 1) / s + 1
    };
    let ceil_cases: Vec<&Value> = pools.iter().filter(|c| c["ceil_mode"] == true).collect();
    assert!(ceil_cases.iter().any(|c| (0..2).any(|a| array(&c["output"]).dims[2 + a] > floor(c, a))));
    assert!(ceil_cases.iter().any(|c| c["name"].as_str().unwrap().contains("drops")));
    let avg = cases("avg_pool2d");
    assert!(avg.iter().any(|c| pair(&c["padding"]) != [0, 0]));
    let adaptive = cases("adaptive_avg_pool2d");
    assert!(adaptive.iter().any(|c| {
        let (x, out) = (array(&c["input"]), pair(&c["output_size"]));
        x.dims[2] % out[0] != 0
    }));
}
