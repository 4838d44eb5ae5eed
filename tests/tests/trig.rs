//! wgpu Sin and Cos agree with the CPU backend over the whole finite f32
//! range (issue 9). WGSL's builtin sin/cos are accurate only near [-π, π]
//! (sin(1e30) was -1.0 on lavapipe, -0.7912 on the CPU); trig.wgsl reduces
//! the argument (Cody–Waite below 256, Payne–Hanek above) and these tests
//! compare every value bit pattern against the CPU within a few ulp.

mod common;

use kiln::prelude::*;

/// The most ulp by which Vulkan may differ from the CPU (measured: see the
/// test's output; the CPU's f32::sin/cos are correctly rounded or nearly).
const MAX_ULP: u64 = 2;

/// f32 bit patterns on one ordered integer line (so ulp distance is a
/// difference; -0 and +0 coincide).
fn ordered(v: f32) -> i64 {
    let b = v.to_bits();
    if b >> 31 == 1 {
        -((b & 0x7fff_ffff) as i64)
    } else {
        b as i64
    }
}

fn ulp_distance(a: f32, b: f32) -> u64 {
    (ordered(a) - ordered(b)).unsigned_abs()
}

/// A small deterministic generator (xorshift) for the sweep.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Arguments: magnitudes 1e-30 .. 3e38 (log-uniform) with both signs, the
/// f32 nearest to k·π/2 (and its neighbours) for k from 1 to 2^120, the
/// largest and smallest normal values, zeros, a subnormal.
fn arguments() -> Vec<f32> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut xs = vec![0.0f32, -0.0, 1e-40, -1e-40, f32::MIN_POSITIVE, f32::MAX, -f32::MAX, 1e30, -1e30, 0.5, 1.0, 3.0];
    for _ in 0..6000 {
        let magnitude = 10f64.powf(-30.0 + rng.unit() * 68.5) as f32;
        xs.push(if rng.next() & 1 == 1 { -magnitude } else { magnitude });
    }
    // Near multiples of π/2: the reduced argument is tiny there, so any
    // error in the reduction shows up as a large relative error.
    let mut ks: Vec<f64> = (1..=64).map(f64::from).collect();
    for j in 6..120 {
        let base = 2f64.powi(j);
        ks.extend([base - 1.0, base, base + 1.0, base * 1.37]);
    }
    for _ in 0..300 {
        ks.push((rng.unit() * 300.0).floor() + 1.0);
        ks.push((10f64.powf(rng.unit() * 9.0)).floor() + 1.0);
    }
    for k in ks {
        let x = (k * std::f64::consts::FRAC_PI_2) as f32;
        if !x.is_finite() {
            continue;
        }
        for step in [-2i32, -1, 0, 1, 2] {
            let n = f32::from_bits((x.to_bits() as i32 + step) as u32);
            xs.push(n);
            xs.push(-n);
        }
    }
    xs
}

fn apply(device: &Device, xs: &[f32], cos: bool) -> Vec<f32> {
    let graph = Graph::new(device);
    let x = graph.tensor_from(xs, &[xs.len()]).unwrap();
    let y = if cos { x.cos().unwrap() } else { x.sin().unwrap() };
    y.to_vec_blocking::<f32>().unwrap()
}

/// Compare the device's sin/cos with the CPU's on `xs`; returns the largest
/// ulp distance and the argument where it occurred.
fn compare(device: &Device, xs: &[f32], cos: bool) -> (u64, f32) {
    let name = if cos { "cos" } else { "sin" };
    let want = apply(&Device::cpu(), xs, cos);
    let got = apply(device, xs, cos);
    let mut worst = (0u64, 0.0f32);
    let mut bad = Vec::new();
    for ((&x, &g), &w) in xs.iter().zip(&got).zip(&want) {
        if w.is_nan() {
            if !g.is_nan() {
                bad.push(format!("{name}({x:e}) = {g:e}, want NaN"));
            }
            continue;
        }
        let d = if g.is_nan() { u64::MAX } else { ulp_distance(g, w) };
        if d > worst.0 {
            worst = (d, x);
        }
        if d > MAX_ULP {
            bad.push(format!("{name}({x:e} = {:#010x}) = {g:e}, CPU {w:e} ({d} ulp)", x.to_bits()));
        }
    }
    let n = bad.len();
    bad.truncate(20);
    assert!(n == 0, "{n} of {} {name} values differ by more than {MAX_ULP} ulp:\n{}", xs.len(), bad.join("\n"));
    worst
}

fn specials(device: &Device) {
    let xs = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, 1e-40, -0.0];
    for cos in [false, true] {
        let got = apply(device, &xs, cos);
        assert!(got[..4].iter().all(|v| v.is_nan()), "inf and NaN give NaN: {got:?}");
        if cos {
            assert_eq!(&got[4..], &[1.0, 1.0]);
        } else {
            // Tiny arguments are returned as they are, sign and all.
            assert_eq!(got[4].to_bits(), 1e-40f32.to_bits());
            assert_eq!(got[5].to_bits(), (-0.0f32).to_bits());
        }
    }
}

#[test]
fn cpu_specials() {
    specials(&Device::cpu());
}

#[test]
fn vulkan_sin_and_cos_match_the_cpu_over_the_f32_range() {
    let Some(device) = common::vulkan_device("trig") else { return };
    specials(&device);
    let xs = arguments();
    let (s, sx) = compare(&device, &xs, false);
    let (c, cx) = compare(&device, &xs, true);
    eprintln!("{} arguments: sin at most {s} ulp (at {sx:e}), cos at most {c} ulp (at {cx:e})", xs.len());
    // The case the fuzzer found (the builtin gave -1.0): sin of the f32
    // nearest 1e30 (1.0000000150474662e30) is -0.79116343852...
    let got = apply(&device, &[1e30], false)[0];
    assert!((got - (-0.791_163_44)).abs() < 1e-6, "sin(1e30) = {got}");
}

/// Every f32 bit pattern with a stride (about 2^24 values over the whole
/// range, both signs): slow on lavapipe, run on demand.
#[test]
#[ignore = "about 16 M values; run with --ignored"]
fn vulkan_sin_and_cos_dense_sweep() {
    let Some(device) = common::vulkan_device("trig") else { return };
    let stride = 253u32;
    let mut worst = (0u64, 0u64);
    let all: Vec<f32> = (0..0x7f80_0000u32 / stride).map(|i| f32::from_bits(i * stride)).collect();
    for chunk in all.chunks(1 << 21) {
        let mut xs = chunk.to_vec();
        xs.extend(chunk.iter().map(|v| -v));
        worst.0 = worst.0.max(compare(&device, &xs, false).0);
        worst.1 = worst.1.max(compare(&device, &xs, true).0);
    }
    eprintln!("{} arguments: sin at most {} ulp, cos at most {} ulp", 2 * all.len(), worst.0, worst.1);
}
