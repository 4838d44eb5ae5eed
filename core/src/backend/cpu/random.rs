//! RandUniform and RandNormal: element i = f(seed, i) (see `crate::tensor_rng`).

use super::layout::for_chunks;
use super::{with_float, Out};
use crate::error::Result;
use crate::tensor_rng;

pub(super) fn rand_uniform(seed: u64, out: &mut Out<'_>) -> Result<()> {
    let keys = tensor_rng::seed_keys(seed);
    with_float!(out.dtype, "RandUniform", T => {
        for_chunks(out.slice::<T>("RandUniform")?, 1, |s, c| {
            for (i, o) in c.iter_mut().enumerate() {
                // 24-bit uniforms are exact in f32 and f64.
                *o = tensor_rng::uniform(keys, (s + i) as u32) as T;
            }
        });
        Ok(())
    })
}

/// `portable`: log and cos from the libm crate (`CpuNumerics::Portable`;
/// the browser build's host functions are those already).
pub(super) fn rand_normal(seed: u64, out: &mut Out<'_>, portable: bool) -> Result<()> {
    use crate::op::expr::math;
    let keys = tensor_rng::seed_keys(seed);
    match out.dtype {
        crate::dtype::DType::F32 if portable => {
            normal_f32(keys, out.slice::<f32>("RandNormal")?, math::portable::single::ln, math::portable::single::cos);
            Ok(())
        }
        crate::dtype::DType::F32 => {
            normal_f32(keys, out.slice::<f32>("RandNormal")?, math::host::single::ln, math::host::single::cos);
            Ok(())
        }
        _ => with_float!(out.dtype, "RandNormal", T => {
            for_chunks(out.slice::<T>("RandNormal")?, 1, |s, c| {
                for (i, o) in c.iter_mut().enumerate() {
                    *o = tensor_rng::normal(keys, (s + i) as u32) as T;
                }
            });
            Ok(())
        }),
    }
}

/// f32 normals with the given log and cos: the same f32 arithmetic as the
/// WGSL kernel.
#[inline(always)]
fn normal_f32(
    keys: [u32; 2],
    out: &mut [f32],
    ln: impl Fn(f32) -> f32 + Sync + Send,
    cos: impl Fn(f32) -> f32 + Sync + Send,
) {
    for_chunks(out, 1, |s, c| {
        for (i, o) in c.iter_mut().enumerate() {
            let n = (s + i) as u32;
            let u1 = 1.0 - tensor_rng::uniform(keys, n.wrapping_mul(2)) as f32;
            let u2 = tensor_rng::uniform(keys, n.wrapping_mul(2).wrapping_add(1)) as f32;
            *o = (-2.0 * ln(u1)).sqrt() * cos(std::f32::consts::TAU * u2);
        }
    });
}
