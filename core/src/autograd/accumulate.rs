//! Adding a gradient contribution to what a node has already received.
//!
//! Usually an Add. One pattern gets a cheaper form: a tensor split into
//! pieces along an axis (`split`, `chunk`, attention's q/k/v taken from one
//! stacked projection) sends back one contribution per piece, each a
//! SliceBackward — a zero tensor of the whole shape with the piece written
//! in. Added up, that is k zero-filled full-size tensors and k − 1 full-size
//! Adds; as a Concat of the pieces (zeros standing in for pieces that sent
//! nothing yet), one pass that writes each element once. The values are the
//! same (x + 0 = x), except that a −0 in a piece stays −0 where the sum
//! made it +0.
//!
//! Native only for now (the module is not in the browser build): there it
//! cost 1.9 KB of gzipped wasm (measured 2026-12-06), over the size
//! budget, so the browser adds the pieces as before.

use crate::small::SmallVec;

use super::Graph;
use crate::error::Result;
use crate::graph::{NodeId, Tensor};
use crate::op::Op;

/// `previous + c` as a node of the gradient graph.
pub(super) fn accumulate<'g>(graph: &'g Graph, previous: NodeId, c: Tensor<'g>) -> Result<NodeId> {
    if let Some(merged) = merge_pieces(graph, previous, c)? {
        return Ok(merged);
    }
    Ok(graph.tensor(previous).add(c)?.id)
}

/// A run of positions along the split axis, and what it holds.
#[derive(Clone, Copy)]
struct Piece {
    start: usize,
    len: usize,
    /// The contribution written there, or None for zeros.
    value: Option<NodeId>,
}

/// What a contribution places along one axis: every other axis whole.
struct Placed {
    axis: usize,
    pieces: SmallVec<[Piece; 4]>,
}

/// `previous + c` as one Concat when `previous` is a placement along one
/// axis (a SliceBackward, or a Concat of pieces some of which are zeros)
/// and `c` a SliceBackward along the same axis that lands inside one of
/// its zero pieces. None otherwise (the caller adds).
fn merge_pieces<'g>(graph: &'g Graph, previous: NodeId, c: Tensor<'g>) -> Result<Option<NodeId>> {
    let (Some(old), Some(new)) = (placed(graph, previous), placed(graph, c.id)) else { return Ok(None) };
    if old.axis != new.axis || graph.node(previous).dtype != c.dtype() || graph.tensor(previous).dims() != c.dims() {
        return Ok(None);
    }
    let [incoming] = new.pieces.iter().filter(|p| p.value.is_some()).copied().collect::<SmallVec<[Piece; 1]>>()[..]
    else {
        return Ok(None);
    };
    // The zero piece of `old` that holds the incoming range.
    let Some(k) = old.pieces.iter().position(|p| {
        p.value.is_none() && p.start <= incoming.start && incoming.start + incoming.len <= p.start + p.len
    }) else {
        return Ok(None);
    };
    let zero = old.pieces[k];
    let mut pieces: SmallVec<[Piece; 6]> = SmallVec::new();
    pieces.extend_from_slice(&old.pieces[..k]);
    for p in [
        Piece { start: zero.start, len: incoming.start - zero.start, value: None },
        incoming,
        Piece {
            start: incoming.start + incoming.len,
            len: zero.start + zero.len - incoming.start - incoming.len,
            value: None,
        },
    ] {
        if p.len > 0 {
            pieces.push(p);
        }
    }
    pieces.extend_from_slice(&old.pieces[k + 1..]);
    let whole = c.dims();
    let mut parts: Vec<Tensor<'g>> = Vec::with_capacity(pieces.len());
    for p in &pieces {
        parts.push(match p.value {
            Some(v) => graph.tensor(v),
            None => {
                let mut dims = whole.clone();
                dims[old.axis] = p.len;
                graph.zeros(&dims, c.dtype())?
            }
        });
    }
    Ok(Some(Tensor::concat(&parts, old.axis as isize)?.id))
}

/// `id` as pieces along one axis: a SliceBackward that writes a contiguous
/// range of one axis (every other axis whole), or a Concat of such values
/// and zero fills. None for anything else.
fn placed(graph: &Graph, id: NodeId) -> Option<Placed> {
    let node = graph.node(id);
    let whole = graph.tensor(id).dims();
    match node.op {
        Op::SliceBackward(attr) => {
            let input = graph.inputs_of(id)[0];
            let part = graph.tensor(input).dims();
            if part.len() != whole.len() || attr.rank() != whole.len() {
                return None;
            }
            let mut axis = None;
            for d in 0..whole.len() {
                if part[d] == whole[d] && attr.start(d) == 0 {
                    continue;
                }
                if axis.is_some() || (attr.step(d) != 1 && part[d] > 1) {
                    return None;
                }
                axis = Some(d);
            }
            // A SliceBackward of the whole: not a split (the caller adds).
            let axis = axis?;
            let (start, len) = (attr.start(axis), part[axis]);
            let mut pieces = SmallVec::new();
            for p in [
                Piece { start: 0, len: start, value: None },
                Piece { start, len, value: Some(input) },
                Piece { start: start + len, len: whole[axis] - start - len, value: None },
            ] {
                if p.len > 0 {
                    pieces.push(p);
                }
            }
            Some(Placed { axis, pieces })
        }
        Op::Concat { axis } => {
            let axis = axis as usize;
            let mut pieces = SmallVec::new();
            let mut start = 0;
            let mut zeros = 0;
            for input in graph.inputs_of(id) {
                let len = graph.tensor(input).dims()[axis];
                let zero = matches!(graph.node(input).op, Op::Full(v) if v == 0.0);
                zeros += zero as usize;
                pieces.push(Piece { start, len, value: (!zero).then_some(input) });
                start += len;
            }
            // Only a Concat with a gap left to fill is worth rebuilding.
            (zeros > 0).then_some(Placed { axis, pieces })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use crate::gradcheck::{gradcheck, gradgradcheck, BoxedFn, CheckInput, GradcheckOptions};
    use crate::graph::{Graph, Tensor};
    use crate::op::Op;
    use crate::ops::SliceSpec;
    use crate::Device;

    fn values(t: Tensor<'_>) -> Vec<f32> {
        pollster::block_on(t.to_vec::<f32>()).unwrap()
    }

    /// x [3, 2] as rows r0..r2; loss = Σ rows[i] · (i + 1) for the rows
    /// `used`: the gradient of row i is i + 1 where used, 0 elsewhere.
    fn split_rows(used: &[usize]) -> (Vec<f32>, Op) {
        let device = Device::cpu();
        let g = Graph::new(&device);
        let x = g.variable(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
        let rows = x.chunk(3, 0).unwrap();
        let mut loss = g.scalar(0.0, crate::DType::F32).unwrap();
        for &i in used {
            loss = loss.add(rows[i].mul((i + 1) as f32).unwrap().sum_all().unwrap()).unwrap();
        }
        let grad = g.grad(loss, &[x], None).unwrap()[0];
        (values(grad), g.node(grad.id).op)
    }

    #[test]
    fn the_pieces_of_a_split_join_as_one_concat() {
        let (grad, op) = split_rows(&[0, 1, 2]);
        assert_eq!(grad, [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        assert!(matches!(op, Op::Concat { axis: 0 }), "{op:?}");
        // Pieces that never sent a gradient are zeros.
        let (grad, op) = split_rows(&[2, 0]);
        assert_eq!(grad, [1.0, 1.0, 0.0, 0.0, 3.0, 3.0]);
        assert!(matches!(op, Op::Concat { axis: 0 }), "{op:?}");
        // One piece alone stays a SliceBackward.
        let (grad, op) = split_rows(&[1]);
        assert_eq!(grad, [0.0, 0.0, 2.0, 2.0, 0.0, 0.0]);
        assert!(matches!(op, Op::SliceBackward(_)), "{op:?}");
    }

    /// Contributions that are not disjoint pieces of one axis are added.
    #[test]
    fn overlapping_strided_or_crossed_slices_are_added() {
        let device = Device::cpu();
        let g = Graph::new(&device);
        let x = g.variable(&[1.0f32; 12], &[3, 4]).unwrap();
        let grad_of = |parts: &[Tensor<'_>]| {
            let mut loss = g.scalar(0.0, crate::DType::F32).unwrap();
            for p in parts {
                loss = loss.add(p.sum_all().unwrap()).unwrap();
            }
            let grad = g.grad(loss, &[x], None).unwrap()[0];
            (values(grad), g.node(grad.id).op)
        };
        // Rows 0..2 and 1..3 overlap on row 1.
        let (grad, op) = grad_of(&[x.slice_axis(0, 0, 2, 1).unwrap(), x.slice_axis(0, 1, 3, 1).unwrap()]);
        assert_eq!(grad, [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0]);
        assert!(matches!(op, Op::Binary(_)), "{op:?}");
        // Every other column (step 2), and the rest.
        let (grad, op) = grad_of(&[x.slice_axis(1, 0, 4, 2).unwrap(), x.slice_axis(1, 1, 4, 2).unwrap()]);
        assert_eq!(grad, [1.0; 12]);
        assert!(matches!(op, Op::Binary(_)), "{op:?}");
        // A row and a column: different axes.
        let (grad, op) = grad_of(&[x.slice_axis(0, 0, 1, 1).unwrap(), x.slice_axis(1, 3, 4, 1).unwrap()]);
        assert_eq!(grad, [1.0, 1.0, 1.0, 2.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
        assert!(matches!(op, Op::Binary(_)), "{op:?}");
        // A block in two axes at once is not a split of one.
        let block = x.slice(&[SliceSpec::new(0, 2, 1), SliceSpec::new(0, 2, 1)]).unwrap();
        let (grad, op) = grad_of(&[block, x.slice_axis(0, 2, 3, 1).unwrap()]);
        assert_eq!(grad, [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
        assert!(matches!(op, Op::Binary(_)), "{op:?}");
    }

    /// First and second derivatives through a split whose pieces meet
    /// again (the merged Concat is differentiated in turn).
    #[test]
    fn a_split_passes_finite_difference_checks_of_both_orders() {
        let device = Device::cpu();
        let f: BoxedFn = Box::new(|_, t| {
            let p = t[0].split(&[1, 2, 1], 1)?;
            p[0].mul(p[0])?.sum_all()?.add(p[1].mul(p[1])?.mul(p[1])?.sum_all()?)?.add(p[2].exp()?.sum_all()?)
        });
        let inputs = [CheckInput::random(&[3, 4], -1.0, 1.0, 5)];
        let options = GradcheckOptions::default();
        let first = pollster::block_on(gradcheck(&device, &*f, &inputs, options)).unwrap();
        assert!(first.passed(), "{first}");
        let second = pollster::block_on(gradgradcheck(&device, &*f, &inputs, options)).unwrap();
        assert!(second.passed(), "{second}");
    }
}
