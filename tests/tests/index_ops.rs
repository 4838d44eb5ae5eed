//! IndexSelect and ScatterAdd on Vulkan against the CPU (issue 9): the
//! index check runs one invocation per index, ScatterAdd sorts the index
//! vector and adds each output's duplicates in index order, so its results
//! must be bit-identical to the CPU's, run after run; an out-of-range index
//! is the same OutOfRange error on both devices.

mod common;

use kiln::prelude::*;
use kiln::ErrorKind;

/// Deterministic values with many distinct low bits (so that a different
/// summation order would change the result).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 20_000) as f32 / 997.0 - 10.0
        })
        .collect()
}

/// ScatterAdd of `index` along `axis` into a dest of `dims`, as f32 bits.
fn scatter(device: &Device, dims: &[usize], axis: usize, index: &[i32]) -> Result<Vec<u32>> {
    let graph = Graph::new(device);
    let n: usize = dims.iter().product();
    let mut src_dims = dims.to_vec();
    src_dims[axis] = index.len();
    let m: usize = src_dims.iter().product();
    let dest = graph.tensor_from(&values(n, 1), dims)?;
    let src = graph.tensor_from(&values(m, 2), &src_dims)?;
    let idx = graph.tensor_from(index, &[index.len()])?;
    let out = dest.scatter_add(axis as isize, idx, src)?;
    Ok(out.to_vec_blocking::<f32>()?.iter().map(|v| v.to_bits()).collect())
}

fn scatter_i32(device: &Device, index: &[i32]) -> Vec<i32> {
    let graph = Graph::new(device);
    let dest = graph.tensor_from(&[1i32, 2, 3, 4, 5, 6], &[3, 2]).unwrap();
    let src: Vec<i32> = (0..2 * index.len() as i32).collect();
    let src = graph.tensor_from(&src, &[index.len(), 2]).unwrap();
    let idx = graph.tensor_from(index, &[index.len()]).unwrap();
    dest.scatter_add(0, idx, src).unwrap().to_vec_blocking::<i32>().unwrap()
}

fn gather(device: &Device, index: &[i32]) -> Result<Vec<f32>> {
    let graph = Graph::new(device);
    let x = graph.tensor_from(&values(12, 3), &[4, 3])?;
    let idx = graph.tensor_from(index, &[index.len()])?;
    x.index_select(0, idx)?.to_vec_blocking::<f32>()
}

/// Indices in 0..size with many duplicates (and a few runs).
fn many_indices(count: usize, size: usize) -> Vec<i32> {
    (0..count).map(|i| ((i * 7 + i / 13) % size) as i32).collect()
}

#[test]
fn vulkan_scatter_add_matches_the_cpu_bit_for_bit() {
    let Some(gpu) = common::vulkan_device("index_ops") else { return };
    let cpu = Device::cpu();
    let cases: Vec<(Vec<usize>, usize, Vec<i32>)> = vec![
        // Duplicates, an index never used, along every axis position.
        (vec![5, 3], 0, vec![0, 2, 0, 4, 0, 2, 1]),
        (vec![2, 4, 3], 1, vec![3, 3, 0, 3, 1, 0]),
        (vec![3, 5], 1, vec![4, 4, 4, 4]),
        (vec![4], 0, vec![1]),
        // No indices: dest unchanged.
        (vec![3, 2], 0, vec![]),
        // More indices than a workgroup, not a power of two: several sort
        // merges and check workgroups; 300 duplicates per value.
        (vec![7, 2], 0, many_indices(2100, 7)),
        (vec![2, 40, 1], 1, many_indices(1000, 40)),
    ];
    for (dims, axis, index) in cases {
        let want = scatter(&cpu, &dims, axis, &index).unwrap();
        let got = scatter(&gpu, &dims, axis, &index).unwrap();
        assert_eq!(got, want, "ScatterAdd {dims:?} axis {axis}, {} indices", index.len());
        assert_eq!(scatter(&gpu, &dims, axis, &index).unwrap(), got, "the same bits on a second run");
    }
    let index = [2, 0, 2, 2, 1, 0];
    assert_eq!(scatter_i32(&gpu, &index), scatter_i32(&cpu, &index));
}

#[test]
fn vulkan_index_select_matches_the_cpu() {
    let Some(gpu) = common::vulkan_device("index_ops") else { return };
    let cpu = Device::cpu();
    for index in [vec![3, 0, 3, 1], many_indices(700, 4)] {
        assert_eq!(gather(&gpu, &index).unwrap(), gather(&cpu, &index).unwrap());
    }
}

/// The first bad index is reported, with its position, by both devices,
/// wherever it is among many indices; the graph stays usable.
#[test]
fn vulkan_out_of_range_indices_are_the_cpus_error() {
    let Some(gpu) = common::vulkan_device("index_ops") else { return };
    let cpu = Device::cpu();
    let mut index = many_indices(1000, 4);
    index[700] = 9;
    index[900] = -3;
    let first_bad = |e: kiln::Error| {
        assert_eq!(e.kind(), ErrorKind::OutOfRange, "{e}");
        assert!(e.message().contains("index 9 at position 700"), "{e}");
        e.op().to_string()
    };
    for device in [&cpu, &gpu] {
        let e = scatter(device, &[4, 2], 0, &index).unwrap_err();
        assert_eq!(first_bad(e), "ScatterAdd");
        let e = gather(device, &index).unwrap_err();
        assert_eq!(first_bad(e), "IndexSelect");
        // Only a negative index, at position 0, and one past the end.
        for (bad, message) in [(vec![-1, 0], "index -1 at position 0"), (vec![0, 1, 4], "index 4 at position 2")] {
            let e = scatter(device, &[4, 2], 0, &bad).unwrap_err();
            assert!(e.message().contains(message), "{e}");
            let e = gather(device, &bad).unwrap_err();
            assert!(e.message().contains(message), "{e}");
        }
        // Good indices afterwards still work.
        assert_eq!(gather(device, &[1, 1]).unwrap().len(), 6);
    }
}

/// Sizes where the old kernels looped over the whole index vector in every
/// invocation: the range check of 3,000,000 indices (one workgroup used to
/// scan them all, ~11,700 iterations per thread) and a ScatterAdd of 300,001
/// source rows with heavy duplicates (every output used to scan all of
/// them). Lavapipe stops any loop after 65,535 iterations without an error:
/// with each output adding its own 270,001 duplicates in one loop, the hot
/// output was exactly the sum of the first 65,535. Now the duplicates are
/// summed by the summation rule (leaves of 128, then a tree, one level per
/// pass) on both devices, and the bits must match the CPU's.
#[test]
fn vulkan_many_indices_and_heavy_duplicates() {
    let Some(gpu) = common::vulkan_device("index_ops") else { return };
    let cpu = Device::cpu();
    // Heavy duplicates: index 1 nearly everywhere, 0 and 2 now and then,
    // 3 never (its output must be dest's bits).
    let count = 300_001;
    let index: Vec<i32> =
        (0..count).map(|i| [1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1][i % 20]).collect();
    let want = scatter(&cpu, &[4, 3], 0, &index).unwrap();
    let got = scatter(&gpu, &[4, 3], 0, &index).unwrap();
    assert_eq!(got, want, "ScatterAdd of {count} heavily duplicated indices");
    // Along a middle axis, with more outer rows (each scans its own runs).
    let index = many_indices(40_000, 3);
    assert_eq!(scatter(&gpu, &[3, 3, 2], 1, &index).unwrap(), scatter(&cpu, &[3, 3, 2], 1, &index).unwrap());

    // The range check of many indices finds the first bad one near the end.
    let count = 3_000_000;
    let mut index = many_indices(count, 4);
    index[count - 10] = 99;
    index[count - 1] = -7;
    for device in [&cpu, &gpu] {
        let graph = Graph::new(device);
        let x = graph.tensor_from(&values(8, 3), &[4, 2]).unwrap();
        let idx = graph.tensor_from(&index[..], &[count]).unwrap();
        let e = x.index_select(0, idx).unwrap().sum_all().unwrap().item_blocking().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfRange, "{e}");
        assert!(e.message().contains(&format!("index 99 at position {}", count - 10)), "{e}");
        // All good: the sum of the selected rows is the CPU's.
        index[count - 10] = 3;
        index[count - 1] = 0;
        let idx = graph.tensor_from(&index[..], &[count]).unwrap();
        let x = graph.tensor_from(&values(8, 3), &[4, 2]).unwrap();
        let rows = x.index_select(0, idx).unwrap();
        let got = rows.to_vec_blocking::<f32>().unwrap();
        let xs = values(8, 3);
        let want: Vec<f32> = index.iter().flat_map(|&k| [xs[2 * k as usize], xs[2 * k as usize + 1]]).collect();
        assert!(got == want, "IndexSelect of {count} indices on {device:?}");
        index[count - 10] = 99;
        index[count - 1] = -7;
    }
}

fn one_hot(device: &Device, labels: &[i32], classes: usize) -> Result<Vec<f32>> {
    let graph = Graph::new(device);
    let labels = graph.tensor_from(labels, &[labels.len()])?;
    labels.one_hot(classes, DType::F32)?.to_vec_blocking::<f32>()
}

/// A label outside 0..classes is an OutOfRange error naming the label and
/// its position, on the CPU and on Vulkan (it used to give a row of zeros,
/// so a bad label silently dropped out of a loss built on one_hot).
#[test]
fn one_hot_rejects_out_of_range_labels() {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::vulkan_device("index_ops"));
    for device in &devices {
        assert_eq!(one_hot(device, &[2, 0], 3).unwrap(), [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
        for (labels, message) in [(vec![0, 5], "index 5 at position 1"), (vec![-1, 1], "index -1 at position 0")] {
            let e = one_hot(device, &labels, 3).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::OutOfRange, "{e}");
            assert!(e.message().contains(message), "{e}");
        }
        // No classes: every label is out of range; no labels: an empty result.
        assert!(one_hot(device, &[0], 0).is_err());
        assert_eq!(one_hot(device, &[], 3).unwrap(), Vec::<f32>::new());
    }
}
