// binary.wgsl — broadcasting binary ops and comparisons:
// out[i] = op(a[offset_a(i)], b[offset_b(i)]).
//
// Bindings: 0 params: Strided (common.wgsl; operand 0 = a, operand 1 = b,
// broadcast axes have stride 0), 1 a: array<TI> (read), 2 b: array<TI>
// (read), 3 out: array<TO> (read_write, contiguous).
// Launch: ceil(n / WG) workgroups folded into a 2-D grid, one output element
// per thread.
// Specialisation (shaders.rs replaces these whole declarations): `TI` the
// operand type (f32, i32, u32 = bool for comparisons), `TO` the output type
// (TI, or u32 for comparisons) and `op`, an expression of `a` and `b`, e.g.
// `return a + b;` or `return cmp(a < b);`. As written: f32 addition.
//
// i32 arithmetic wraps (WGSL's integer semantics, like the CPU's wrapping
// ops). Maximum/Minimum propagate NaN and keep `a` on ties, as the CPU does.
// Comparisons are IEEE: every ordered comparison with NaN is false and
// NotEqual is written `!(a == b)` so that it is true for NaN.

alias TI = f32;
alias TO = f32;

fn op(a: TI, b: TI) -> TO {
    return a + b;
}

@group(0) @binding(0) var<storage, read> params: Strided;
@group(0) @binding(1) var<storage, read> in_a: array<TI>;
@group(0) @binding(2) var<storage, read> in_b: array<TI>;
@group(0) @binding(3) var<storage, read_write> out: array<TO>;

fn cmp(c: bool) -> u32 {
    return select(0u, 1u, c);
}

fn max_f(a: f32, b: f32) -> f32 {
    if (is_nan(a)) {
        return a;
    }
    if (is_nan(b)) {
        return b;
    }
    return select(b, a, a >= b);
}

fn min_f(a: f32, b: f32) -> f32 {
    if (is_nan(a)) {
        return a;
    }
    if (is_nan(b)) {
        return b;
    }
    return select(b, a, a <= b);
}

// powf with the C/Rust special cases that exp2(b * log2(a)) gets wrong:
// a negative base with an integer exponent, zero and one bases, zero exponents.
fn pow_f(a: f32, b: f32) -> f32 {
    if (b == 0.0 || a == 1.0) {
        return 1.0;
    }
    if (is_nan(a) || is_nan(b)) {
        return a + b;
    }
    let r = pow(abs(a), b);
    if (a < 0.0) {
        if (floor(b) != b) {
            // Through a runtime value: browsers' WGSL compilers reject a
            // constant expression that evaluates to NaN or infinity.
            let nan_bits = 0x7fc00000u;
            return bitcast<f32>(nan_bits);
        }
        // Odd integer exponents keep the sign (|b| >= 2^24 is always even).
        let odd = abs(b) < 16777216.0 && (i32(b) & 1) == 1;
        return select(r, -r, odd);
    }
    if (a == 0.0) {
        if (b < 0.0) {
            let infinity_bits = 0x7f800000u;
            return bitcast<f32>(infinity_bits);
        }
        return 0.0;
    }
    return r;
}

@compute @workgroup_size(WG)
fn main(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    let o = offsets(params, i);
    out[i] = op(in_a[o.x], in_b[o.y]);
}
