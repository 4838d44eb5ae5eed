//! Activation checkpointing (`kiln::checkpoint`, `TransformerBlock::
//! set_checkpointing`): gradients bit-identical to the run without it
//! (dropout inside included), nesting, several inputs and outputs, values
//! kept for `retain_grad`, first and second derivatives against finite
//! differences on the CPU and on wgpu, less peak memory, and errors.

mod common;

use kiln::gradcheck::{gradcheck, gradcheck_on, gradgradcheck, gradgradcheck_on, CheckInput, GradcheckOptions};
use kiln::host_rng::SplitMix64;
use kiln::nn::{Module, TransformerBlock};
use kiln::{
    checkpoint, checkpoint_many, Blocking, BlockingParam, DType, Device, Element, ErrorKind, Graph, Result, Tensor,
};

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// A stack of causal transformer blocks with dropout, built from `seed`.
fn blocks(device: &Device, layers: usize, seed: u64) -> Vec<TransformerBlock> {
    (0..layers).map(|i| TransformerBlock::new(device, 16, 2, 32, 0.1, seed + i as u64).expect("block")).collect()
}

/// Loss, input gradient and every parameter's gradient of one step of the
/// stack on a fixed input, as bits. `wrap` decides how each block runs.
fn step_bits(
    device: &Device,
    stack: &[TransformerBlock],
    wrap: &dyn for<'g> Fn(usize, &TransformerBlock, Tensor<'g>) -> Result<Tensor<'g>>,
) -> (u32, Vec<u32>, Vec<Vec<u32>>) {
    let graph = Graph::new(device);
    let x = graph.variable(&random(2 * 8 * 16, 3), &[2, 8, 16]).unwrap();
    let mut h = x;
    for (i, b) in stack.iter().enumerate() {
        h = wrap(i, b, h).unwrap();
    }
    let loss = h.mul(h).unwrap().mean_all().unwrap();
    for b in stack {
        for p in b.parameters() {
            p.zero_grad();
        }
    }
    loss.backward().unwrap();
    let loss_bits = (loss.item_blocking().unwrap() as f32).to_bits();
    let gx = bits(&x.grad().unwrap().to_vec_blocking::<f32>().unwrap());
    let grads = stack
        .iter()
        .flat_map(|b| b.parameters())
        .map(|p| bits(&f32::from_host(p.grad_blocking().unwrap().unwrap()).unwrap()))
        .collect();
    (loss_bits, gx, grads)
}

fn plain<'g>(_: usize, b: &TransformerBlock, x: Tensor<'g>) -> Result<Tensor<'g>> {
    b.forward(x)
}

fn assert_bit_identical(device: &Device) {
    // Two identical stacks: dropout draws its masks from a per-layer call
    // counter, so each run needs a fresh one.
    let reference = step_bits(device, &blocks(device, 3, 7), &plain);
    let flagged = blocks(device, 3, 7);
    for b in &flagged {
        b.set_checkpointing(true);
    }
    assert_eq!(step_bits(device, &flagged, &plain), reference, "per-layer flag");
    let explicit = step_bits(device, &blocks(device, 3, 7), &|_, b, x| checkpoint(|x| b.forward(x), x));
    assert_eq!(explicit, reference, "checkpoint(|x| block.forward(x), x)");
    // Nested: layers 0 and 1 in one segment, layer 1 also in its own.
    let stack = blocks(device, 3, 7);
    let nested = {
        let graph = Graph::new(device);
        let x = graph.variable(&random(2 * 8 * 16, 3), &[2, 8, 16]).unwrap();
        let h = checkpoint(|x| checkpoint(|h| stack[1].forward(h), stack[0].forward(x)?), x).unwrap();
        let h = stack[2].forward(h).unwrap();
        let loss = h.mul(h).unwrap().mean_all().unwrap();
        loss.backward().unwrap();
        let loss_bits = (loss.item_blocking().unwrap() as f32).to_bits();
        let gx = bits(&x.grad().unwrap().to_vec_blocking::<f32>().unwrap());
        let grads: Vec<Vec<u32>> = stack
            .iter()
            .flat_map(|b| b.parameters())
            .map(|p| bits(&f32::from_host(p.grad_blocking().unwrap().unwrap()).unwrap()))
            .collect();
        (loss_bits, gx, grads)
    };
    assert_eq!(nested, reference, "nested segments");
}

#[test]
fn gradients_are_bit_identical_with_dropout_and_nesting_on_cpu() {
    assert_bit_identical(&Device::cpu());
}

#[test]
fn several_inputs_and_outputs_and_retained_values() {
    let device = Device::cpu();
    let run = |checkpointed: bool| {
        let graph = Graph::new(&device);
        let a = graph.variable(&random(12, 1), &[3, 4]).unwrap();
        let b = graph.variable(&random(4, 2), &[4]).unwrap();
        // A captured tensor computed outside the segment.
        let c = graph.tensor_from(&random(12, 5), &[3, 4]).unwrap().exp().unwrap();
        fn body<'g>(xs: &[Tensor<'g>], c: Tensor<'g>) -> Result<Vec<Tensor<'g>>> {
            let u = xs[0].mul(xs[1])?.tanh()?.retain_grad();
            // The second output also consumes the first inside the segment.
            let v = u.mul(c)?.add(xs[0])?.sigmoid()?;
            Ok(vec![u, v])
        }
        let outs =
            if checkpointed { checkpoint_many(|xs| body(xs, c), &[a, b]).unwrap() } else { body(&[a, b], c).unwrap() };
        let loss = outs[0].sum_all().unwrap().add(outs[1].mul(outs[1]).unwrap().sum_all().unwrap()).unwrap();
        loss.backward().unwrap();
        let read = |t: Tensor<'_>| bits(&t.grad().unwrap().to_vec_blocking::<f32>().unwrap());
        (read(a), read(b), read(outs[0]))
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn checkpointing_lowers_peak_memory() {
    // Peak bytes of one training step of 4 blocks, context 64: the
    // checkpointed run keeps block inputs only (a deterministic count).
    let peak = |on: bool| {
        let device = Device::cpu();
        let stack: Vec<TransformerBlock> =
            (0..4).map(|i| TransformerBlock::new(&device, 32, 4, 128, 0.0, i).unwrap()).collect();
        for b in &stack {
            b.set_checkpointing(on);
        }
        let graph = Graph::new(&device);
        let x = graph.tensor_from(&random(4 * 64 * 32, 9), &[4, 64, 32]).unwrap();
        device.reset_peak();
        let mut h = x;
        for b in &stack {
            h = b.forward(h).unwrap();
        }
        h.mul(h).unwrap().mean_all().unwrap().backward().unwrap();
        device.stats().peak_live_bytes
    };
    let (without, with) = (peak(false), peak(true));
    assert!(with * 10 < without * 7, "checkpointed peak {with} B is not well below {without} B");
}

/// A captured input (w), a nested segment and a fan-out inside.
fn nested_segments<'g>(_: &'g Graph, xs: &[Tensor<'g>]) -> Result<Tensor<'g>> {
    let w = xs[1];
    checkpoint(|x| checkpoint(|h| h.mul(w)?.tanh(), x.sin()?)?.mul(x)?.exp(), xs[0])
}

fn two_outputs<'g>(_: &'g Graph, xs: &[Tensor<'g>]) -> Result<Tensor<'g>> {
    let outs = checkpoint_many(|xs| Ok(vec![xs[0].mul(xs[1])?.sigmoid()?, xs[1].exp()?]), xs)?;
    outs[0].mul(outs[1])
}

#[test]
fn first_and_second_derivatives_through_segments_on_cpu() {
    let device = Device::cpu();
    let options = GradcheckOptions::default();
    let inputs = vec![CheckInput::random(&[2, 3], -1.0, 1.0, 1), CheckInput::random(&[3], -1.0, 1.0, 2)];
    let f = nested_segments;
    let first = gradcheck(&device, f, &inputs, options).unwrap();
    assert!(first.passed(), "{first}");
    let second = gradgradcheck(&device, f, &inputs, options).unwrap();
    assert!(second.passed(), "{second}");
    let several = two_outputs;
    let first = gradcheck(&device, several, &inputs, options).unwrap();
    assert!(first.passed(), "{first}");
    let second = gradgradcheck(&device, several, &inputs, options).unwrap();
    assert!(second.passed(), "{second}");
}

#[test]
fn gradient_and_checkpoint_in_one_graph_keep_working() {
    // Graph::grad through a segment, then backward over the same graph.
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let x = graph.variable(&[0.3f64, -0.7, 1.1], &[3]).unwrap();
    let y = checkpoint(|x| x.mul(x)?.sin(), x).unwrap();
    let g = graph.grad(y.sum_all().unwrap(), &[x], None).unwrap()[0];
    let expected: Vec<f64> = [0.3f64, -0.7, 1.1].iter().map(|v| 2.0 * v * (v * v).cos()).collect();
    common::assert_close(&g.to_vec_blocking::<f64>().unwrap(), &expected, 1e-12);
    g.sum_all().unwrap().backward().unwrap();
    let second: Vec<f64> =
        [0.3f64, -0.7, 1.1].iter().map(|v| 2.0 * (v * v).cos() - 4.0 * v * v * (v * v).sin()).collect();
    common::assert_close(&x.grad().unwrap().to_vec_blocking::<f64>().unwrap(), &second, 1e-12);
}

#[test]
fn bad_input_is_an_error_with_the_callers_location() {
    let device = Device::cpu();
    let graph = Graph::new(&device);
    let line = line!() + 1;
    let err = checkpoint_many(|xs: &[Tensor<'_>]| Ok(xs.to_vec()), &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("checkpoint"), "{err}");
    assert!(err.to_string().contains(&format!("{}:{line}", file!())), "{err}");
    // An error inside the segment comes out unchanged and the graph stays usable.
    let x = graph.variable(&[1.0f32, 2.0], &[2]).unwrap();
    let inner = checkpoint(|x| x.reshape(&[3]), x).unwrap_err();
    assert_eq!(inner.kind(), ErrorKind::Shape);
    let y = checkpoint(|x| x.exp(), x).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec_blocking::<f32>().unwrap(), vec![1f32.exp(), 2f32.exp()]);
    let _ = DType::F32;
}

#[test]
fn wgpu_gradients_bit_identical_and_checked_against_finite_differences() {
    let Some(wg) = common::vulkan_device("activation_checkpointing") else { return };
    assert_bit_identical(&wg);
    let cpu = Device::cpu();
    let options = GradcheckOptions { eps: 1e-6, atol: 1e-4, rtol: 1e-3, ..GradcheckOptions::default() };
    let inputs = vec![CheckInput::random(&[2, 3], -1.0, 1.0, 1), CheckInput::random(&[3], -1.0, 1.0, 2)];
    let f = nested_segments;
    let first = gradcheck_on(&cpu, &wg, DType::F32, f, &inputs, options).unwrap();
    assert!(first.passed(), "{first}");
    let second = gradgradcheck_on(&cpu, &wg, DType::F32, f, &inputs, options).unwrap();
    assert!(second.passed(), "{second}");
}
