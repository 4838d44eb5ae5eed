//! Matmul epilogue fusion on the CPU: a product followed by element-wise
//! ops (a Linear layer's bias and activation, a scale) runs as one fused
//! group whose head is the product (`ExecStats::fused_products`), with the
//! same bits as fusion off — forward, backward, kept and unkept products,
//! transposed and batched operands, and shapes that take the unfused form.

use kiln::{Blocking, Device, ExecStats, Graph};

mod common;
use common::{bits, data};

/// relu(x·Wᵀ + b) then tanh(h·V + c)·0.5, with gradients of x, W, b, V, c:
/// every value and gradient's bits, and the executor's counts.
fn mlp(fusion: bool, batch: usize, inp: usize, hidden: usize, out: usize) -> (Vec<Vec<u32>>, ExecStats) {
    let device = Device::cpu();
    device.set_fusion(fusion);
    let g = Graph::new(&device);
    let x = g.variable(&data(batch * inp, 1), &[batch, inp]).unwrap();
    let w = g.variable(&data(hidden * inp, 2), &[hidden, inp]).unwrap();
    let b = g.variable(&data(hidden, 3), &[hidden]).unwrap();
    let v = g.variable(&data(hidden * out, 4), &[hidden, out]).unwrap();
    let c = g.variable(&data(out, 5), &[out]).unwrap();
    let h = x.matmul_t(w, false, true).unwrap().add(b).unwrap().relu().unwrap();
    let y = h.matmul(v).unwrap().add(c).unwrap().tanh().unwrap().mul(0.5).unwrap();
    let loss = y.square().unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    let mut all = vec![bits(&y), bits(&h), bits(&loss)];
    for p in [x, w, b, v, c] {
        all.push(bits(&p.grad().unwrap()));
    }
    (all, device.exec_stats())
}

#[test]
fn a_linear_layer_with_its_activation_fuses_with_the_same_bits() {
    // 128 x 784 x 512: W1's first layer, computed as column blocks.
    for (batch, inp, hidden, out) in [(128, 784, 512, 10), (64, 96, 300, 260), (8, 5, 6, 3)] {
        let (off, off_stats) = mlp(false, batch, inp, hidden, out);
        let (on, on_stats) = mlp(true, batch, inp, hidden, out);
        for (k, (a, b)) in on.iter().zip(&off).enumerate() {
            assert!(a == b, "{batch}x{inp}x{hidden}x{out}: value {k} differs with fusion");
        }
        assert_eq!(off_stats.fused_products, 0);
        assert!(on_stats.fused_products >= 2, "{batch}x{inp}x{hidden}x{out}: {on_stats:?}");
        assert!(on_stats.kernels < off_stats.kernels, "{on_stats:?} vs {off_stats:?}");
    }
}

/// A product read again after its epilogue (so it is kept), next to one
/// that is not; transposed left operands; f64.
#[test]
fn kept_products_transposes_and_f64_give_the_same_bits() {
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let run = |fusion: bool| {
            let device = Device::cpu();
            device.set_fusion(fusion);
            let g = Graph::new(&device);
            let (m, k, n) = (70, 40, 300);
            let a_dims: [usize; 2] = if ta { [k, m] } else { [m, k] };
            let b_dims: [usize; 2] = if tb { [n, k] } else { [k, n] };
            let a = g.variable(&data(m * k, 7), &a_dims).unwrap();
            let bm = g.variable(&data(k * n, 8), &b_dims).unwrap();
            let p = a.matmul_t(bm, ta, tb).unwrap();
            let e = p.mul(2.0).unwrap().sigmoid().unwrap();
            // p is read again after the group: it is kept.
            let r = e.sub(p).unwrap().sum_all().unwrap();
            let grads = g.grad(r, &[a, bm], None).unwrap();
            let a64 = a.cast(kiln::DType::F64).unwrap();
            let b64 = bm.cast(kiln::DType::F64).unwrap();
            let q = a64.matmul_t(b64, ta, tb).unwrap().exp().unwrap().neg().unwrap();
            let q: Vec<u64> = q.to_vec_blocking::<f64>().unwrap().iter().map(|v| v.to_bits()).collect();
            let out = vec![bits(&e), bits(&r), bits(&grads[0]), bits(&grads[1])];
            (out, q, device.exec_stats())
        };
        let (off, q_off, _) = run(false);
        let (on, q_on, stats) = run(true);
        assert_eq!(on, off, "ta {ta} tb {tb}");
        assert_eq!(q_on, q_off, "f64, ta {ta} tb {tb}");
        assert!(stats.fused_products >= 2, "{stats:?}");
    }
}

/// Products that do not run as column blocks (batched with their own right
/// operands, K above one chunk, tiny) still fuse through the unfused form:
/// the same bits.
#[test]
fn products_outside_the_blocked_form_give_the_same_bits() {
    let cases: [(&[usize], &[usize]); 4] = [
        (&[3, 40, 24], &[3, 24, 300]), // batched, both operands per batch
        (&[5, 64, 32], &[32, 300]),    // batch folded into the rows
        (&[16, 1500], &[1500, 300]),   // K in two chunks
        (&[2, 3], &[3, 4]),            // tiny
    ];
    for (ad, bd) in cases {
        let run = |fusion: bool| {
            let device = Device::cpu();
            device.set_fusion(fusion);
            let g = Graph::new(&device);
            let a = g.variable(&data(ad.iter().product(), 9), ad).unwrap();
            let b = g.variable(&data(bd.iter().product(), 10), bd).unwrap();
            let bias = g.tensor_from(&data(bd[bd.len() - 1], 11), &[bd[bd.len() - 1]]).unwrap();
            let y = a.matmul(b).unwrap().add(bias).unwrap().relu().unwrap();
            let grads = g.grad(y.sum_all().unwrap(), &[a, b], None).unwrap();
            (vec![bits(&y), bits(&grads[0]), bits(&grads[1])], device.exec_stats())
        };
        let (off, _) = run(false);
        let (on, stats) = run(true);
        assert_eq!(on, off, "{ad:?} x {bd:?}");
        assert!(stats.fused_products >= 1, "{ad:?} x {bd:?}: {stats:?}");
    }
}

/// A changed shape after a plan was recorded never replays the old plan's
/// fused product.
#[test]
fn a_new_shape_does_not_reuse_a_fused_products_plan() {
    let device = Device::cpu();
    let mut g = Graph::new(&device);
    let reference = |rows: usize| {
        let d = Device::cpu();
        d.set_fusion(false);
        let g = Graph::new(&d);
        let x = g.tensor_from(&data(rows * 30, 12), &[rows, 30]).unwrap();
        let w = g.tensor_from(&data(30 * 400, 13), &[30, 400]).unwrap();
        x.matmul(w).unwrap().relu().unwrap().sum_all().unwrap().to_vec_blocking::<f32>().unwrap()[0]
    };
    for rows in [50, 50, 60, 50, 61] {
        g.reset();
        let x = g.tensor_from(&data(rows * 30, 12), &[rows, 30]).unwrap();
        let w = g.tensor_from(&data(30 * 400, 13), &[30, 400]).unwrap();
        let y = x.matmul(w).unwrap().relu().unwrap().sum_all().unwrap();
        let got = y.to_vec_blocking::<f32>().unwrap()[0];
        assert_eq!(got.to_bits(), reference(rows).to_bits(), "{rows} rows");
    }
    assert!(device.exec_stats().fused_products >= 5);
    assert!(device.exec_stats().plans_reused >= 1);
}

/// The groups the CPU runs split (a batched product with a right operand
/// per batch, as attention's scores, followed by a scale; a sum over a
/// middle axis of a group's value) put their unkept intermediate in a
/// scratch buffer the backend reuses: after the first step, repeated steps
/// create none (`BackendCounters::scratch_bytes_allocated`), with the same
/// bits as fusion off.
#[test]
fn split_groups_reuse_their_scratch_buffers() {
    let step = |device: &Device| {
        let g = Graph::new(device);
        let q = g.tensor_from(&data(12 * 64 * 32, 1), &[12, 64, 32]).unwrap();
        let k = g.tensor_from(&data(12 * 64 * 32, 2), &[12, 64, 32]).unwrap();
        let scores = q.matmul_t(k, false, true).unwrap().mul(0.125).unwrap().tanh().unwrap();
        let x = g.tensor_from(&data(5 * 300 * 7, 3), &[5, 300, 7]).unwrap();
        let middle = x.mul(1.5).unwrap().exp().unwrap().sum(&[1], false).unwrap();
        g.realize(&[scores, middle]).unwrap();
        vec![bits(&scores), bits(&middle)]
    };
    let device = repeated_steps_reuse_scratch(step, (12 * 64 * 64 + 5 * 300 * 7) as u64 * 4);
    let stats = device.exec_stats();
    assert!(stats.fused_products >= 4 && stats.fused_reductions >= 4, "{stats:?}");
}

/// A product fused with its epilogue whose value the group does not keep
/// (`gelu(x · Wᵀ)` with no gradient) goes to a pooled scratch buffer: the
/// same bits as unfused, and a repeated step allocates no new one (it was a
/// fresh zero-filled buffer per call).
#[test]
fn blocked_products_not_kept_reuse_scratch_buffers() {
    let step = |device: &Device| {
        let g = Graph::new(device);
        let x = g.tensor_from(&data(192 * 64, 4), &[192, 64]).unwrap();
        let w = g.tensor_from(&data(512 * 64, 5), &[512, 64]).unwrap();
        let y = x.matmul_t(w, false, true).unwrap().gelu().unwrap();
        g.realize(&[y]).unwrap();
        vec![bits(&y)]
    };
    let device = repeated_steps_reuse_scratch(step, 192 * 512 * 4);
    assert!(device.exec_stats().fused_products >= 4, "{:?}", device.exec_stats());
}

/// Runs `step` on a fused CPU device: the bits of fusion off, at least
/// `min_scratch` scratch bytes made by the first step and none by three
/// repeats. Returns the fused device (for its counters).
fn repeated_steps_reuse_scratch(step: impl Fn(&Device) -> Vec<Vec<u32>>, min_scratch: u64) -> Device {
    let device = Device::cpu();
    let reference = Device::cpu();
    reference.set_fusion(false);
    let scratch = || device.backend().counters().scratch_bytes_allocated;
    let first = step(&device);
    assert_eq!(first, step(&reference));
    let after_first = scratch();
    assert!(after_first >= min_scratch, "{after_first} scratch bytes, expected at least {min_scratch}");
    for _ in 0..3 {
        assert_eq!(step(&device), first);
    }
    assert_eq!(scratch(), after_first, "a repeated step created scratch buffers");
    device
}
