//! Matmul epilogue fusion on wgpu (lavapipe on CI; `CI=1` requires a
//! Vulkan adapter): a product and the element-wise ops reading it (bias,
//! activation) run as ONE generated kernel (`Backend::fuses_matmul`,
//! kernels-wgsl/src/kernels/fused/head.rs). Against the same device with
//! `WgpuOptions::fuse_matmul_epilogue` off (the product's kernel, then a
//! fused element-wise kernel) and with fusion off altogether: the same bits
//! where the adapter rounds every op (`common::rounds_every_op`), within
//! 1e-4 of the CPU, one dispatch fewer per fused product; op 0 kept or not,
//! transposed operands, batched products, and the fallbacks (K over one
//! chunk, too few storage bindings) that run the product and the epilogue
//! as two kernels.

mod common;

use kiln::nn::{Linear, Module};
use kiln::{Blocking, BlockingParam, Device, Graph, Tensor, WgpuOptions};

/// Relative to max(1, |value|), where the driver may contract a multiply
/// and an add into an FMA (a GPU; see `common::rounds_every_op`).
const CONTRACTED_TOL: f64 = 1e-5;

fn wgpu(fuse_matmul: bool, fusion: bool) -> Option<Device> {
    let options = WgpuOptions { fuse_matmul_epilogue: Some(fuse_matmul), ..Default::default() };
    let device = common::vulkan_device_with(options, "wgpu matmul epilogue")?;
    device.set_fusion(fusion);
    Some(device)
}

fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// Every value a case returns, as f32 bits.
type Outcome = Vec<Vec<u32>>;

fn bits(t: &Tensor<'_>) -> Vec<u32> {
    t.to_vec_blocking::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
}

fn floats(o: &[u32]) -> Vec<f64> {
    o.iter().map(|&b| f64::from(f32::from_bits(b))).collect()
}

/// `a` and `b` have the same bits where the adapter rounds every op on its
/// own, else agree within `CONTRACTED_TOL`.
#[track_caller]
fn assert_same(device: &Device, a: &Outcome, b: &Outcome, what: &str) {
    if common::rounds_every_op(device) {
        assert_eq!(a, b, "{what}");
    } else {
        for (x, y) in a.iter().zip(b) {
            common::assert_close(&floats(x), &floats(y), CONTRACTED_TOL);
        }
    }
}

#[track_caller]
fn assert_near_cpu(a: &Outcome, cpu: &Outcome) {
    assert_eq!(a.len(), cpu.len());
    for (x, y) in a.iter().zip(cpu) {
        common::assert_close(&floats(x), &floats(y), 1e-4);
    }
}

/// A two-layer MLP step: relu(x W1ᵀ + b1) W2ᵀ + b2, tanh, summed;
/// the output, the input's gradient and every parameter's gradient.
fn mlp(device: &Device, batch: usize, dims: [usize; 3]) -> Outcome {
    let [inp, hidden, out] = dims;
    let l1 = Linear::new(device, inp, hidden, true, 3).unwrap();
    let l2 = Linear::new(device, hidden, out, true, 4).unwrap();
    let graph = Graph::new(device);
    let x = graph.variable(&data(batch * inp, 1), &[batch, inp]).unwrap();
    let h = l1.forward(x).unwrap().relu().unwrap();
    let y = l2.forward(h).unwrap().tanh().unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let mut o = vec![bits(&y), bits(&x.grad().unwrap())];
    for p in l1.parameters().into_iter().chain(l2.parameters()) {
        let g = p.grad_blocking().unwrap().unwrap().to_f64_vec();
        o.push(g.iter().map(|&v| (v as f32).to_bits()).collect());
    }
    o
}

/// Dispatches of the second run of `f` (the first tunes the matmul kernels
/// and compiles).
fn dispatches<T>(device: &Device, f: impl Fn(&Device) -> T) -> (T, usize) {
    f(device);
    let before = device.backend().counters().dispatches;
    let r = f(device);
    (r, device.backend().counters().dispatches - before)
}

#[test]
fn linear_bias_relu_step_fuses_with_the_same_bits() {
    let Some(on) = wgpu(true, true) else { return };
    let off = wgpu(false, true).unwrap();
    let unfused = wgpu(true, false).unwrap();
    let cpu = Device::cpu();
    for (batch, dims) in [(8, [12, 16, 5]), (33, [20, 40, 3]), (64, [128, 96, 10])] {
        let what = format!("batch {batch}, {dims:?}");
        let (a, on_count) = dispatches(&on, |d| mlp(d, batch, dims));
        let (b, off_count) = dispatches(&off, |d| mlp(d, batch, dims));
        let (c, _) = dispatches(&unfused, |d| mlp(d, batch, dims));
        assert_same(&on, &a, &b, &format!("{what}: epilogue fused vs not"));
        assert_same(&on, &a, &c, &format!("{what}: epilogue fused vs no fusion"));
        assert_eq!(a, mlp(&on, batch, dims), "{what}: run after run");
        assert_near_cpu(&a, &mlp(&cpu, batch, dims));
        // At least both forward products (bias + relu, bias + tanh) and the
        // hidden layer's input gradient (relu's backward) lose a dispatch.
        assert!(on_count + 3 <= off_count, "{what}: {on_count} dispatches fused vs {off_count}");
    }
}

/// One product and its epilogue, forward only: exactly one dispatch fewer.
fn linear_relu(device: &Device, m: usize, k: usize, n: usize) -> Outcome {
    let graph = Graph::new(device);
    let x = graph.tensor_from(&data(m * k, 5), &[m, k]).unwrap();
    let w = graph.tensor_from(&data(n * k, 6), &[n, k]).unwrap();
    let b = graph.tensor_from(&data(n, 7), &[n]).unwrap();
    let y = x.matmul_t(w, false, true).unwrap().add(b).unwrap().relu().unwrap();
    vec![bits(&y)]
}

#[test]
fn one_layer_forward_is_one_dispatch() {
    let Some(on) = wgpu(true, true) else { return };
    let off = wgpu(false, true).unwrap();
    let cpu = Device::cpu();
    // Shapes the tuner gives different kernels: skinny (small M), the vec4
    // kernel (aligned), the tiles (K or N not a multiple of 4).
    for (m, k, n) in [(2, 32, 48), (64, 128, 96), (70, 30, 50), (300, 17, 129)] {
        let (a, on_count) = dispatches(&on, |d| linear_relu(d, m, k, n));
        let (b, off_count) = dispatches(&off, |d| linear_relu(d, m, k, n));
        assert_same(&on, &a, &b, &format!("{m} x {k} x {n}"));
        assert_near_cpu(&a, &linear_relu(&cpu, m, k, n));
        assert_eq!((on_count, off_count), (1, 2), "{m} x {k} x {n}");
    }
}

/// The product is also read after the group (a reduction), so the fused
/// kernel writes it too; and a second product of the same operands whose
/// value only the epilogue reads. Operands transposed in every way.
fn kept_and_transposed(device: &Device, ta: bool, tb: bool) -> Outcome {
    let (m, k, n) = (24, 36, 20);
    let graph = Graph::new(device);
    let a_dims = if ta { [k, m] } else { [m, k] };
    let b_dims = if tb { [n, k] } else { [k, n] };
    let a = graph.tensor_from(&data(m * k, 8), &a_dims).unwrap();
    let b = graph.tensor_from(&data(n * k, 9), &b_dims).unwrap();
    let bias = graph.tensor_from(&data(m, 10), &[m, 1]).unwrap();
    let p = a.matmul_t(b, ta, tb).unwrap();
    let q = p.mul(bias).unwrap().sub(0.25).unwrap().tanh().unwrap();
    let kept = p.sum(&[1], false).unwrap();
    vec![bits(&q), bits(&kept)]
}

#[test]
fn kept_product_and_transposed_operands() {
    let Some(on) = wgpu(true, true) else { return };
    let off = wgpu(false, true).unwrap();
    let cpu = Device::cpu();
    for ta in [false, true] {
        for tb in [false, true] {
            let (a, on_count) = dispatches(&on, |d| kept_and_transposed(d, ta, tb));
            let (b, off_count) = dispatches(&off, |d| kept_and_transposed(d, ta, tb));
            assert_same(&on, &a, &b, &format!("ta {ta}, tb {tb}"));
            assert_near_cpu(&a, &kept_and_transposed(&cpu, ta, tb));
            assert_eq!(on_count + 1, off_count, "ta {ta}, tb {tb}");
        }
    }
}

/// Batched products: per-batch operands, and a shared B broadcast over two
/// batch axes, with a bias over the last axis and one over a batch axis.
fn batched(device: &Device, k: usize) -> Outcome {
    let graph = Graph::new(device);
    let a = graph.tensor_from(&data(3 * 10 * k, 11), &[3, 10, k]).unwrap();
    let b = graph.tensor_from(&data(3 * k * 12, 12), &[3, k, 12]).unwrap();
    let bias = graph.tensor_from(&data(12, 13), &[12]).unwrap();
    let y = a.matmul(b).unwrap().add(bias).unwrap().relu().unwrap();
    let c = graph.tensor_from(&data(2 * 3 * 8 * k, 14), &[2, 3, 8, k]).unwrap();
    let w = graph.tensor_from(&data(k * 16, 15), &[k, 16]).unwrap();
    let per_batch = graph.tensor_from(&data(3, 16), &[3, 1, 1]).unwrap();
    let z = c.matmul(w).unwrap().mul(per_batch).unwrap().gelu().unwrap();
    vec![bits(&y), bits(&z)]
}

#[test]
fn batched_products() {
    let Some(on) = wgpu(true, true) else { return };
    let off = wgpu(false, true).unwrap();
    let cpu = Device::cpu();
    let (a, on_count) = dispatches(&on, |d| batched(d, 20));
    let (b, off_count) = dispatches(&off, |d| batched(d, 20));
    assert_same(&on, &a, &b, "batched");
    assert_near_cpu(&a, &batched(&cpu, 20));
    assert_eq!(on_count + 2, off_count);
}

/// K over one chunk (`K_CHUNK` = 1024): the product is a sum of chunk
/// products, so the group takes the fallback (the product, then the
/// epilogue as a fused element-wise kernel): the same dispatches and bits
/// as without epilogue fusion. Also a device whose kernels may bind only 4
/// storage buffers (params, a, b and one more), too few for a bias read and
/// an output.
#[test]
fn fallbacks_give_the_same_bits() {
    let Some(on) = wgpu(true, true) else { return };
    let off = wgpu(false, true).unwrap();
    let cpu = Device::cpu();
    let (a, on_count) = dispatches(&on, |d| linear_relu(d, 6, 1100, 10));
    let (b, off_count) = dispatches(&off, |d| linear_relu(d, 6, 1100, 10));
    assert_same(&on, &a, &b, "K = 1100");
    assert_near_cpu(&a, &linear_relu(&cpu, 6, 1100, 10));
    assert_eq!(on_count, off_count, "K = 1100 takes the fallback");
    let (c, batched_count) = dispatches(&on, |d| batched(d, 1030));
    assert_same(&on, &c, &batched(&off, 1030), "batched, K = 1030");
    assert_near_cpu(&c, &batched(&cpu, 1030));
    assert!(batched_count > 4, "{batched_count}");

    let options = WgpuOptions {
        fuse_matmul_epilogue: Some(true),
        max_storage_buffers_per_shader_stage: Some(4),
        ..Default::default()
    };
    let narrow = common::vulkan_device_with(options, "wgpu matmul epilogue").unwrap();
    let (d, narrow_count) = dispatches(&narrow, |d| linear_relu(d, 64, 128, 96));
    assert_same(&on, &d, &linear_relu(&off, 64, 128, 96), "4 storage buffers");
    assert_eq!(narrow_count, 2, "too few bindings: the product, then the epilogue");
}

/// Not a check: the time of one layer's forward (product, bias, relu) at
/// W1's shapes with the epilogue fused and not, in interleaved rounds
/// (`cargo test --release -p kiln-tests --test wgpu_matmul_epilogue --
/// --ignored --nocapture`). The best round of each is printed.
#[test]
#[ignore]
fn epilogue_timing() {
    let Some(on) = wgpu(true, true) else { return };
    let off = wgpu(false, true).unwrap();
    for (m, k, n) in [(128, 784, 512), (128, 512, 512), (128, 512, 10)] {
        let mut best = [f64::INFINITY; 2];
        for _round in 0..5 {
            for (i, d) in [&on, &off].into_iter().enumerate() {
                linear_relu(d, m, k, n);
                let t = std::time::Instant::now();
                for _ in 0..10 {
                    linear_relu(d, m, k, n);
                }
                best[i] = best[i].min(t.elapsed().as_secs_f64() * 100.0);
            }
        }
        println!("{m} x {k} x {n}: fused {:.2} ms, product + epilogue {:.2} ms per forward", best[0], best[1]);
    }
}
