//! The counter-based generator random *tensors* are drawn from
//! (`Graph::rand_uniform` / `rand_normal`, the RandUniform and RandNormal
//! kernels of every backend). For a sequential seeded stream on the host
//! (initialisation, shuffling) see `host_rng`.
//!
//! Element i of a random tensor is a pure function of (seed, i), built from
//! 32-bit integer operations only, so the WGSL kernels compute the very same
//! bits (WGSL has no 64-bit integers) and dropout masks replay exactly on
//! every backend. The mixer is Chris Wellons' "lowbias32" hash.

/// lowbias32: a 32-bit integer hash with low bias.
#[inline]
pub fn hash32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// The two 32-bit keys a 64-bit seed is split into.
#[inline]
pub fn seed_keys(seed: u64) -> [u32; 2] {
    [hash32(seed as u32 ^ 0x9e37_79b9), hash32((seed >> 32) as u32 ^ 0x85eb_ca6b)]
}

/// 32 random bits for counter `i` under `keys`.
#[inline]
pub fn bits(keys: [u32; 2], i: u32) -> u32 {
    hash32(hash32(i ^ keys[0]).wrapping_add(keys[1]) ^ 0x2c1b_3c6d)
}

/// Uniform in [0, 1) with 24 random bits (exact in f32 and f64 alike).
#[inline]
pub fn uniform(keys: [u32; 2], i: u32) -> f64 {
    (bits(keys, i) >> 8) as f64 * (1.0 / 16_777_216.0)
}

/// Standard normal for element i (Box–Muller on counters 2i and 2i+1),
/// computed in f64; the f32 kernels compute the same formula in f32.
#[inline]
pub fn normal(keys: [u32; 2], i: u32) -> f64 {
    let u1 = 1.0 - uniform(keys, i.wrapping_mul(2));
    let u2 = uniform(keys, i.wrapping_mul(2).wrapping_add(1));
    // libm's log and cos (`math::portable`): the same bits on every target.
    use crate::op::expr::math::portable::double::{cos, ln};
    (-2.0 * ln(u1)).sqrt() * cos(2.0 * std::f64::consts::PI * u2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_values_look_uniform_and_depend_on_seed() {
        let keys = seed_keys(42);
        let n = 100_000u32;
        let values: Vec<f64> = (0..n).map(|i| uniform(keys, i)).collect();
        assert!(values.iter().all(|&v| (0.0..1.0).contains(&v)));
        let mean = values.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        let mut buckets = [0usize; 10];
        for v in &values {
            buckets[(v * 10.0) as usize] += 1;
        }
        assert!(buckets.iter().all(|&b| (9_500..10_500).contains(&b)), "{buckets:?}");
        assert_ne!(uniform(seed_keys(1), 0), uniform(seed_keys(2), 0));
        assert_ne!(uniform(seed_keys(1 << 32), 0), uniform(seed_keys(2 << 32), 0));
    }

    #[test]
    fn normal_values_have_unit_variance() {
        let keys = seed_keys(7);
        let n = 100_000u32;
        let values: Vec<f64> = (0..n).map(|i| normal(keys, i)).collect();
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.02 && (var - 1.0).abs() < 0.02, "mean {mean} var {var}");
    }
}
