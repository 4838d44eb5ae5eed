// update.wgsl — fused optimizer steps, in place on a parameter and its state,
// with the CPU backend's (PyTorch's) formulas term for term.
//
// Bindings: 0 params: Update, 1 param: array<V> (read_write), 2 grad: array<V>
// (read), 3 state0: array<V> (read_write: velocity, or Adam's first moment),
// 4 state1: array<V> (read_write: Adam's second moment).
// V is f32, or vec4<f32> for tensors of a multiple of 4 elements (the host
// specialises the alias; `n` then counts vec4s): the same operations on
// each lane, and a quarter of the threads, whose fixed cost dominates on
// software adapters.
// Launch: ceil(n / WG) workgroups folded into a 2-D grid, one element (or
// vec4) per thread.
//
// Entry points and params (the host derives the f32 values in f64 and rounds
// once, as the CPU does):
// - `sgd` (1, 2): n, lr, weight_decay, flags (bit 0: apply weight decay).
// - `sgd_momentum` (1, 2, 3): as `sgd`, plus momentum, one_minus_dampening,
//   flags bit 1: Nesterov.
// - `adam` (1..4): n, beta1, beta2, one_minus_beta1, one_minus_beta2,
//   step_size = lr / (1 - beta1^t), rsqrt_bias2 = 1 / sqrt(1 - beta2^t),
//   eps, weight_decay,
//   decay_factor = 1 - lr * weight decay, flags (bit 0: decoupled weight
//   decay, AdamW).

struct Update {
    n: u32,
    flags: u32,
    lr: f32,
    weight_decay: f32,
    momentum: f32,
    one_minus_dampening: f32,
    beta1: f32,
    beta2: f32,
    one_minus_beta1: f32,
    one_minus_beta2: f32,
    step_size: f32,
    rsqrt_bias2: f32,
    eps: f32,
    decay_factor: f32,
}

alias V = f32;

@group(0) @binding(0) var<storage, read> params: Update;

@group(0) @binding(1) var<storage, read_write> param: array<V>;
@group(0) @binding(2) var<storage, read> grad: array<V>;
@group(0) @binding(3) var<storage, read_write> state0: array<V>;
@group(0) @binding(4) var<storage, read_write> state1: array<V>;

fn decayed(i: u32) -> V {
    var g = grad[i];
    if ((params.flags & 1u) != 0u) {
        g = g + params.weight_decay * param[i];
    }
    return g;
}

@compute @workgroup_size(WG)
fn sgd(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    let g = decayed(i);
    param[i] = param[i] - params.lr * g;
}

@compute @workgroup_size(WG)
fn sgd_momentum(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    var g = decayed(i);
    let mom = params.momentum;
    let v = mom * state0[i] + params.one_minus_dampening * g;
    state0[i] = v;
    if ((params.flags & 2u) != 0u) {
        g = g + mom * v;
    } else {
        g = v;
    }
    param[i] = param[i] - params.lr * g;
}

@compute @workgroup_size(WG)
fn adam(wg: Workgroup, @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wg, lid);
    if (i >= params.n) {
        return;
    }
    var w = param[i];
    var g = grad[i];
    if ((params.flags & 1u) != 0u) {
        w = w * params.decay_factor;
    } else {
        g = g + params.weight_decay * w;
    }
    let m = params.beta1 * state0[i] + params.one_minus_beta1 * g;
    let v = params.beta2 * state1[i] + params.one_minus_beta2 * g * g;
    state0[i] = m;
    state1[i] = v;
    param[i] = w - params.step_size * (m / (sqrt(v) * params.rsqrt_bias2 + params.eps));
}
