// binary.wgsl — broadcasting binary ops and comparisons:
// out[i] = f(a[offset_a(i)], b[offset_b(i)]).
//
// Bindings: 0 params (strided geometry, common.wgsl: operand 0 = a,
// operand 1 = b; broadcast axes have stride 0), 1 a: array<{TI}> (read),
// 2 b: array<{TI}> (read), 3 out: array<{TO}> (read_write, contiguous).
// Workgroup: 256 threads, one output element each. Launch: ceil(n / 256)
// workgroups folded into a 2-D grid.
// Specialisation: {TI} operand type (f32, i32, u32 = bool for comparisons),
// {TO} output type ({TI}, or u32 for comparisons), {EXPR} an expression of
// `a` and `b` (the two operand values), e.g. `a + b` or `cmp(a < b)`.
//
// i32 arithmetic wraps (WGSL's integer semantics, like the CPU's wrapping
// ops). Maximum/Minimum propagate NaN and keep `a` on ties, as the CPU does.
// Comparisons are IEEE: every ordered comparison with NaN is false and
// NotEqual is written `!(a == b)` so that it is true for NaN.

@group(0) @binding(1) var<storage, read> in_a: array<{TI}>;
@group(0) @binding(2) var<storage, read> in_b: array<{TI}>;
@group(0) @binding(3) var<storage, read_write> out: array<{TO}>;

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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    let o = offsets(i);
    let a = in_a[o.x];
    let b = in_b[o.y];
    out[i] = {EXPR};
}
