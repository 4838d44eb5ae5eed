//! Host-side geometry: the strided parameter blocks the kernels read
//! (layout in shaders/common.wgsl), with unit axes dropped and axes that are
//! contiguous in every operand merged, so that the rank a kernel sees is
//! usually 1 or 2 and rarely reaches `MAX_DIMS`.

use kiln_core::shape::fmt_dims;
use kiln_core::{Error, Result};

use crate::params::{Axes, Strided};
use crate::shaders::MAX_DIMS;

/// `dims` and each operand's strides with unit axes dropped and mergeable
/// neighbours merged (outermost first).
pub(crate) fn collapse(dims: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut cd: Vec<usize> = Vec::new();
    let mut cs: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for d in 0..dims.len() {
        let n = dims[d];
        if n == 1 {
            continue;
        }
        if !cd.is_empty() {
            let k = cd.len() - 1;
            // The previous (outer) axis steps over exactly one of this axis.
            if strides.iter().enumerate().all(|(j, s)| cs[j][k] == s[d] * n) {
                cd[k] *= n;
                for (j, s) in strides.iter().enumerate() {
                    cs[j][k] = s[d];
                }
                continue;
            }
        }
        cd.push(n);
        for (j, s) in strides.iter().enumerate() {
            cs[j].push(s[d]);
        }
    }
    (cd, cs)
}

/// A value the kernels index with, as u32.
pub(crate) fn word(op: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::unsupported(op, format!("{v} elements exceed the wgpu kernels' 32-bit indexing; use the CPU device"))
    })
}

/// The strided geometry for iterating `dims` with up to four operands, each
/// given as (base offset, strides over `dims`).
pub(crate) fn strided(op: &'static str, dims: &[usize], operands: &[(usize, &[usize])]) -> Result<Strided> {
    debug_assert!(operands.len() <= 4);
    let n: usize = dims.iter().product();
    let strides: Vec<&[usize]> = operands.iter().map(|(_, s)| *s).collect();
    let (cd, cs) = collapse(dims, &strides);
    if cd.len() > MAX_DIMS {
        return Err(Error::unsupported(
            op,
            format!(
                "{} has {} axes that cannot be merged; the wgpu kernels take at most {MAX_DIMS} (use the CPU \
                 device, or reshape)",
                fmt_dims(dims),
                cd.len()
            ),
        ));
    }
    let mut g = Strided { n: word(op, n)?, rank: cd.len() as u32, ..Strided::default() };
    for (d, &v) in cd.iter().enumerate() {
        g.dims[d] = word(op, v)?;
    }
    for (k, (base, _)) in operands.iter().enumerate() {
        g.operands[k].base = word(op, *base)?;
        for (d, &s) in cs[k].iter().enumerate() {
            g.operands[k].strides[d] = word(op, s)?;
        }
    }
    Ok(g)
}

/// One group of axes collapsed (dims, strides), for the reduction
/// parameters.
pub(crate) fn group(op: &'static str, dims: &[usize], strides: &[usize]) -> Result<Axes> {
    let (cd, cs) = collapse(dims, &[strides]);
    if cd.len() > MAX_DIMS {
        return Err(Error::unsupported(
            op,
            format!("the reduction's axes of {} do not merge into {MAX_DIMS}; use the CPU device", fmt_dims(dims)),
        ));
    }
    let mut g = Axes { rank: cd.len() as u32, ..Axes::default() };
    for i in 0..cd.len() {
        g.dims[i] = word(op, cd[i])?;
        g.strides[i] = word(op, cs[0][i])?;
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapses_contiguous_and_unit_axes() {
        let (d, s) = collapse(&[2, 3, 4], &[&[12, 4, 1]]);
        assert_eq!((d, s), (vec![24], vec![vec![1]]));
        // Broadcast over the middle axis: [2, 3] with strides (3, 1) and (1, 0).
        let (d, s) = collapse(&[2, 1, 3], &[&[3, 3, 1], &[1, 1, 0]]);
        assert_eq!((d, s), (vec![2, 3], vec![vec![3, 1], vec![1, 0]]));
        // A transpose does not merge.
        let (d, _) = collapse(&[4, 3], &[&[1, 4], &[3, 1]]);
        assert_eq!(d, vec![4, 3]);
    }

    #[test]
    fn refuses_more_than_max_dims() {
        // Nine axes of 2 that alternate broadcast/not cannot merge.
        let dims = [2usize; 9];
        let s: Vec<usize> = (0..9).map(|i| if i % 2 == 0 { 1 << (i / 2) } else { 0 }).collect();
        let e = strided("Add", &dims, &[(0, &s)]).unwrap_err();
        assert!(e.message().contains("at most 8"), "{e}");
    }
}
