//! Groups headed by a matrix product (matmul epilogue fusion): the product
//! runs as the plain product's column blocks (`matmul::Blocked`), and each
//! block's epilogue (bias, activation, scale...) runs on the thread that
//! computed it, row by row, while the block is in cache. The product is
//! written to memory only when it is kept; otherwise it lives in a scratch
//! buffer that only cache lines see. The same gemm calls and per-element
//! functions as unfused, so the same bits.

use crate::small::SmallVec;

use super::super::matmul::{Block, Blocked};
use super::super::scalar::{Float, Scalar};
use super::super::CpuStorage;
use super::{
    bad, eval_range, fill_constants, typed_inputs, typed_outputs, write_constants, InSlice, OutSlice, Plan, Shared,
    Tiles, TILE,
};
use crate::backend::{FusedCall, FusedMatMul, TensorRef};
use crate::error::Result;
use crate::op::Value;

/// The group's head: its product, how it runs, its operands' storage, and
/// the pooled buffer for the product when the group does not keep it.
pub(super) struct Head<'a> {
    pub product: &'a FusedMatMul<'a>,
    pub blocked: &'a Blocked,
    pub operands: [&'a CpuStorage; 2],
    pub scratch: Option<&'a mut CpuStorage>,
}

pub(super) fn eval<T: Float + Scalar + Value>(
    call: &FusedCall<'_>,
    head: Head<'_>,
    plan: &Plan,
    ins: &[&CpuStorage],
    outs: &mut [(TensorRef<'_>, CpuStorage)],
) -> Result<()> {
    let Head { product: head, blocked, operands: [sa, sb], scratch } = head;
    let n: usize = call.dims.iter().product();
    let cols = *call.dims.last().ok_or_else(|| bad("a product with no axes"))?;
    let lhs = T::of(sa).and_then(|v| v.get(..head.a.numel())).ok_or_else(|| bad("left operand of the wrong dtype"))?;
    let rhs = T::of(sb).and_then(|v| v.get(..head.b.numel())).ok_or_else(|| bad("right operand of the wrong dtype"))?;
    let mut inputs = typed_inputs::<T>(call, ins)?;
    // The product goes to its own output when kept, else to the pooled
    // `scratch` buffer (whose old contents the product overwrites); the
    // other kept values are written block by block.
    let head_output = call.outputs.iter().position(|&(k, _)| k == 0);
    let mut fresh: Vec<T>;
    let mut product: Option<&mut [T]> = None;
    let mut shared: SmallVec<[Shared<T>; 8]> = SmallVec::new();
    for (o, slice) in write_constants(plan, typed_outputs(outs)?).into_iter().enumerate() {
        shared.push(match slice {
            None => Shared::None,
            Some(OutSlice::T(v)) if Some(o) == head_output => {
                product = Some(v);
                Shared::None
            }
            Some(OutSlice::T(v)) => Shared::T(v.as_mut_ptr(), v.len()),
            Some(OutSlice::B(v)) => Shared::B(v.as_mut_ptr(), v.len()),
        });
    }
    let product = match (product, scratch.and_then(|s| T::of_mut(s)).and_then(|v| v.get_mut(..n))) {
        (Some(p), _) | (None, Some(p)) => p,
        (None, None) => {
            fresh = crate::memory::try_vec("MatMul", n, T::ZERO)?;
            &mut fresh[..]
        }
    };
    if n == 0 {
        return Ok(());
    }
    let head_input = call.inputs.len();
    inputs.push(InSlice::Rel(&[], 0));
    let (inputs, shared) = (&inputs[..], &shared[..]);
    blocked.run_blocks(lhs, rhs, product, &|block| {
        super::super::simd::dispatch(Epilogue { plan, inputs, shared, head_input, cols, block });
    })
}

/// One block's epilogue, to run with the widest vectors the CPU has.
struct Epilogue<'a, 'i, T> {
    plan: &'a Plan,
    inputs: &'a [InSlice<'i, T>],
    shared: &'a [Shared<T>],
    head_input: usize,
    /// The product's columns (its row stride).
    cols: usize,
    block: Block<'a, T>,
}

impl<T: Float + Scalar + Value> super::super::simd::Kernel for Epilogue<'_, '_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let Epilogue { plan, inputs, shared, head_input, cols, block } = self;
        let tile = TILE.min(block.cols);
        let mut t: Tiles<T> = Tiles::new(plan.t_tiles, tile);
        let mut b: Tiles<u8> = Tiles::new(plan.b_tiles, tile);
        fill_constants(plan, inputs, &mut t, &mut b);
        let mut row_inputs: SmallVec<[InSlice<'_, T>; 8]> = SmallVec::from_slice(inputs);
        for i in 0..block.rows() {
            let start = i * cols + block.j0;
            row_inputs[head_input] = InSlice::Rel(block.row(i), start);
            // SAFETY: this block owns columns j0..j0 + cols of every row of
            // the product, so elements start..start + cols of each output
            // (the same flat indices) are written by this block alone, and
            // the slices die before the next row's are made.
            let mut outs: SmallVec<[Option<OutSlice<'_, T>>; 8]> =
                shared.iter().map(|s| unsafe { s.segment(start, block.cols) }).collect();
            eval_range(plan, &mut t, &mut b, &row_inputs, &mut outs, start, start + block.cols, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::cpu::testutil::rand_f32;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::{run_head_split, Backend, BufferId, FusedArg, FusedCall, FusedMatMul, FusedOp, TensorRef};
    use crate::dtype::{DType, HostData};
    use crate::op::{Op, UnaryOp};

    const MATMUL: Op = Op::MatMul { transpose_a: false, transpose_b: false };

    fn buffer(be: &CpuBackend, data: &[f32]) -> BufferId {
        let id = be.alloc(DType::F32, data.len()).unwrap();
        be.upload(id, &HostData::F32(data.to_vec())).unwrap();
        id
    }

    fn read(be: &CpuBackend, id: BufferId, n: usize) -> Vec<f32> {
        match pollster::block_on(be.read(id, DType::F32, n)).unwrap() {
            HostData::F32(v) => v,
            other => panic!("{other:?}"),
        }
    }

    /// Malformed product-headed calls are errors that say what is wrong,
    /// and leave the backend usable: a good call afterwards computes
    /// relu(a x b), the same as the product and a relu run alone.
    #[test]
    fn malformed_head_calls_are_errors_and_leave_the_backend_usable() {
        let be = CpuBackend::new();
        let (m, k, n) = (64, 48, 512); // column blocks: the fused path
        let (av, bv) = (rand_f32(m * k, 1), rand_f32(k * n, 2));
        let (a, b, out) = (buffer(&be, &av), buffer(&be, &bv), be.alloc(DType::F32, m * n).unwrap());
        let (ad, bd, od) = ([m, k], [k, n], [m, n]);
        let head = FusedMatMul {
            transpose_a: false,
            transpose_b: false,
            a: TensorRef { buffer: a, dims: &ad, dtype: DType::F32 },
            b: TensorRef { buffer: b, dims: &bd, dtype: DType::F32 },
        };
        let product = FusedOp { op: MATMUL, args: [FusedArg::Input(0); 3], arity: 0, dtype: DType::F32 };
        let relu = FusedOp {
            op: Op::Unary(UnaryOp::Relu),
            args: [FusedArg::Op(0), FusedArg::Input(0), FusedArg::Input(0)],
            arity: 1,
            dtype: DType::F32,
        };
        let outputs = [(1u16, TensorRef { buffer: out, dims: &od, dtype: DType::F32 })];
        let call = |ops: &[FusedOp], head: Option<FusedMatMul<'_>>, outputs: &[(u16, TensorRef<'_>)]| {
            let call = FusedCall { dims: &od, ops, inputs: &[], outputs, plan_id: None, head };
            be.run_fused(&call).map_err(|e| e.to_string())
        };
        let constant = FusedOp { op: Op::Full(1.0), ..product };
        let err = call(&[constant, relu], Some(head), &outputs).unwrap_err();
        assert!(err.contains("op 0 of a group with a head must be its MatMul"), "{err}");
        let err = call(&[product, product], Some(head), &outputs).unwrap_err();
        assert!(err.contains("op 1 is a MatMul that is not the group's head"), "{err}");
        let bad_dims = [k + 1, n];
        let bad = FusedMatMul { b: TensorRef { dims: &bad_dims, ..head.b }, ..head };
        let err = call(&[product, relu], Some(bad), &outputs).unwrap_err();
        assert!(err.contains("MatMul"), "{err}");
        // An operand that is also an output: missing, never aliased.
        let aliased = [(1u16, TensorRef { buffer: a, dims: &od, dtype: DType::F32 })];
        assert!(call(&[product, relu], Some(head), &aliased).is_err());
        let no_head = FusedCall { dims: &od, ops: &[relu], inputs: &[], outputs: &outputs, plan_id: None, head: None };
        assert!(run_head_split(&be, &no_head).unwrap_err().to_string().contains("needs a call with a head"));

        call(&[product, relu], Some(head), &outputs).unwrap();
        let got = read(&be, out, m * n);
        let plain = be.alloc(DType::F32, m * n).unwrap();
        let refs = [head.a, head.b];
        be.run(&crate::backend::KernelCall {
            op: MATMUL,
            inputs: &refs,
            output: TensorRef { buffer: plain, dims: &od, dtype: DType::F32 },
        })
        .unwrap();
        let want: Vec<u32> = read(&be, plain, m * n).iter().map(|v| v.max(0.0).to_bits()).collect();
        assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
        assert_eq!(read(&be, a, m * k), av, "the operand is intact");
    }
}
