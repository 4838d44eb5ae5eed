//! TopK: the positions of the k best elements of each row of the last
//! axis, best first. One order for every backend: by value (descending
//! for `largest`, ascending otherwise) with NaN above every number, ties
//! to the lower position; select.wgsl walks the same order.

use std::cmp::Ordering;

use super::layout::for_chunks;
use super::scalar::Scalar;
use super::{with_num, In, Out};
use crate::backend::checks;
use crate::error::Result;

pub(super) fn top_k(k: usize, largest: bool, [x]: &[In<'_>; 1], out: &mut Out<'_>) -> Result<()> {
    const OP: &str = "TopK";
    let (_, len) = checks::top_k(k, x.dims, x.dtype, out.dims, out.dtype)?;
    if out.numel() == 0 {
        return Ok(());
    }
    // Ranked as f64 (exact for f32 and i32), so the selection below exists
    // once, not once per dtype (download size).
    let values: Vec<f64> = with_num!(x.dtype, OP, T => Ok(x.slice::<T>(OP)?.iter().map(|v| v.to_f64()).collect()))?;
    for_chunks(out.slice::<i32>(OP)?, k, |start, chunk| {
        let mut order = Vec::with_capacity(len);
        for (r, dst) in chunk.chunks_exact_mut(k).enumerate() {
            best_of_row(&values[(start / k + r) * len..][..len], largest, &mut order, dst);
        }
    });
    Ok(())
}

/// The positions of the `dst.len()` best of `row`, best first: natively
/// a partial selection then a sort of the k; in the browser build k
/// passes over the row (select.wgsl's way: no sorting code in the
/// download). Both give the same positions (the order is total).
fn best_of_row(row: &[f64], largest: bool, order: &mut Vec<usize>, dst: &mut [i32]) {
    if cfg!(target_arch = "wasm32") {
        by_passes(row, largest, dst)
    } else {
        by_sorting(row, largest, order, dst)
    }
}

/// Each pass picks the best element after the previous pick.
fn by_passes(row: &[f64], largest: bool, dst: &mut [i32]) {
    let before = |a: usize, b: usize| rank(row[a], a, row[b], b, largest) == Ordering::Less;
    let mut prev: Option<usize> = None;
    for d in dst.iter_mut() {
        let mut best: Option<usize> = None;
        for j in 0..row.len() {
            if prev.is_none_or(|p| before(p, j)) && best.is_none_or(|b| before(j, b)) {
                best = Some(j);
            }
        }
        let b = best.unwrap_or(0);
        *d = b as i32;
        prev = Some(b);
    }
}

fn by_sorting(row: &[f64], largest: bool, order: &mut Vec<usize>, dst: &mut [i32]) {
    let k = dst.len();
    let cmp = |&a: &usize, &b: &usize| rank(row[a], a, row[b], b, largest);
    order.clear();
    order.extend(0..row.len());
    if k < row.len() {
        order.select_nth_unstable_by(k - 1, cmp);
    }
    order[..k].sort_unstable_by(cmp);
    for (d, &i) in dst.iter_mut().zip(&order[..k]) {
        *d = i as i32;
    }
}

/// Less = (a at position ia) comes before (b at ib). A total order: no two
/// positions are equal, so unstable sorts give one answer.
fn rank(a: f64, ia: usize, b: f64, ib: usize, largest: bool) -> Ordering {
    use Ordering::{Equal, Greater, Less};
    let by_value = match (a.is_nan(), b.is_nan()) {
        (true, true) => Equal,
        // NaN is the largest: first when largest, last otherwise.
        (true, false) => {
            if largest {
                Less
            } else {
                Greater
            }
        }
        (false, true) => {
            if largest {
                Greater
            } else {
                Less
            }
        }
        (false, false) => {
            let o = a.partial_cmp(&b).unwrap_or(Equal);
            if largest {
                o.reverse()
            } else {
                o
            }
        }
    };
    by_value.then(ia.cmp(&ib))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::dtype::{DType, HostData};
    use crate::op::Op;

    fn run(k: u32, largest: bool, x: HostData, dims: &[usize]) -> HostData {
        let mut out = dims.to_vec();
        *out.last_mut().unwrap() = k as usize;
        run_op(Op::TopK { k, largest }, &[(x, dims)], &out, DType::I32).unwrap()
    }

    #[test]
    fn best_first_ties_to_the_lower_position_nan_on_top() {
        let x = f32s(&[3., 1., 4., 1., 5., 9., 2., 6.]);
        assert_eq!(run(3, true, x.clone(), &[8]), i32s(&[5, 7, 4]));
        assert_eq!(run(3, false, x.clone(), &[8]), i32s(&[1, 3, 6]));
        assert_eq!(run(4, true, x, &[2, 4]), i32s(&[2, 0, 1, 3, 1, 3, 0, 2]));
        let nan = f32s(&[1., f32::NAN, 7., f32::NAN, 7.]);
        assert_eq!(run(4, true, nan.clone(), &[5]), i32s(&[1, 3, 2, 4]));
        assert_eq!(run(4, false, nan, &[5]), i32s(&[0, 2, 4, 1]));
        assert_eq!(run(2, true, i32s(&[5, -1, 5, 7]), &[2, 2]), i32s(&[0, 1, 1, 0]));
    }

    #[test]
    fn the_browser_passes_pick_what_the_sort_picks() {
        let mut row: Vec<f64> = (0..61).map(|i| ((i * 17) % 7) as f64 - 3.0).collect();
        row[5] = f64::NAN;
        row[40] = f64::NAN;
        row[9] = f64::NEG_INFINITY;
        for largest in [true, false] {
            for k in [1, 5, 61] {
                let (mut a, mut b) = (vec![0; k], vec![0; k]);
                super::by_passes(&row, largest, &mut a);
                super::by_sorting(&row, largest, &mut Vec::new(), &mut b);
                assert_eq!(a, b, "k {k} largest {largest}");
            }
        }
    }

    #[test]
    fn bad_calls_are_errors() {
        let e = run_op(Op::TopK { k: 3, largest: true }, &[(f32s(&[1., 2.]), &[2])], &[3], DType::I32).unwrap_err();
        assert_eq!(e.op(), "TopK");
        let e = run_op(Op::TopK { k: 1, largest: true }, &[(bools(&[true]), &[1])], &[1], DType::I32).unwrap_err();
        assert_eq!(e.op(), "TopK");
    }
}
