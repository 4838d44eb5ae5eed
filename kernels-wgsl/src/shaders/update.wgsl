// update.wgsl — fused optimizer steps, in place on a parameter and its state,
// with the CPU backend's (PyTorch's) formulas term for term.
//
// Bindings: 0 params, 1 param: array<f32> (read_write), 2 grad: array<f32>
// (read), 3 state0: array<f32> (read_write: velocity, or Adam's first moment),
// 4 state1: array<f32> (read_write: Adam's second moment).
// Workgroup: 256 threads, one element each. Launch: ceil(n / 256) workgroups
// folded into a 2-D grid.
//
// Entry points and params (f32 values as bits; the host derives them in f64
// and rounds once, as the CPU does):
// - `sgd` (1, 2): p[0] n, p[1] lr, p[4] weight decay, p[5] flags (bit 0: apply
//   weight decay).
// - `sgd_momentum` (1, 2, 3): as `sgd`, plus p[2] momentum, p[3] 1 - dampening,
//   flags bit 1: Nesterov.
// - `adam` (1..4): p[0] n, p[1] lr, p[2] beta1, p[3] beta2, p[4] 1 - beta1,
//   p[5] 1 - beta2, p[6] 1 - beta1^t, p[7] 1 - beta2^t, p[8] eps,
//   p[9] weight decay, p[10] 1 - lr * weight decay, p[11] flags (bit 0:
//   decoupled weight decay, AdamW).

@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> state0: array<f32>;
@group(0) @binding(4) var<storage, read_write> state1: array<f32>;

fn decayed(i: u32) -> f32 {
    var g = grad[i];
    if ((p[5] & 1u) != 0u) {
        g = g + pf(4u) * param[i];
    }
    return g;
}

@compute @workgroup_size(256)
fn sgd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    let g = decayed(i);
    param[i] = param[i] - pf(1u) * g;
}

@compute @workgroup_size(256)
fn sgd_momentum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    var g = decayed(i);
    let mom = pf(2u);
    let v = mom * state0[i] + pf(3u) * g;
    state0[i] = v;
    if ((p[5] & 2u) != 0u) {
        g = g + mom * v;
    } else {
        g = v;
    }
    param[i] = param[i] - pf(1u) * g;
}

@compute @workgroup_size(256)
fn adam(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid);
    if (i >= p[0]) {
        return;
    }
    var w = param[i];
    var g = grad[i];
    if ((p[11] & 1u) != 0u) {
        w = w * pf(10u);
    } else {
        g = g + pf(9u) * w;
    }
    let m = pf(2u) * state0[i] + pf(4u) * g;
    let v = pf(3u) * state1[i] + pf(5u) * g * g;
    state0[i] = m;
    state1[i] = v;
    let mhat = m / pf(6u);
    let vhat = v / pf(7u);
    param[i] = w - pf(1u) * mhat / (sqrt(vhat) + pf(8u));
}
