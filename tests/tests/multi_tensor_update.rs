//! Multi-tensor apply (`Backend::update_params`): an optimizer step hands
//! every parameter's update to the backend at once, which runs them as one
//! parallel pass (CPU) or one dispatch per group of tensors (wgpu). Each
//! element must get exactly the value of one update per tensor; a bad call
//! list is refused before anything is written; a training step on wgpu
//! issues fewer dispatches and ends with the same parameters.

mod common;

use kiln::nn::{Activation, Module, Sequential};
use kiln::optim::{Adam, Optimizer};
use kiln::{Backend, BufferId, DType, Device, Graph, HostData, ParamUpdate, ParamUpdateCall, WgpuOptions};

/// One parameter's buffers and the update it gets.
struct Case {
    update: ParamUpdate,
    len: usize,
    /// Copy-on-write: the value is read from a separate buffer.
    from_source: bool,
}

fn cases() -> Vec<Case> {
    let adam = |step, decoupled| ParamUpdate::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.05,
        decoupled_weight_decay: decoupled,
        step,
    };
    let sgd = |momentum, nesterov| ParamUpdate::Sgd { lr: 0.1, momentum, dampening: 0.1, weight_decay: 0.01, nesterov };
    vec![
        Case { update: adam(3, true), len: 300_001, from_source: false },
        Case { update: adam(3, true), len: 7, from_source: true },
        Case { update: adam(1, false), len: 1, from_source: false },
        Case { update: sgd(0.9, true), len: 1000, from_source: false },
        Case { update: sgd(0.0, false), len: 33, from_source: true },
        Case { update: adam(2, true), len: 70_000, from_source: true },
        Case { update: sgd(0.5, false), len: 5, from_source: false },
    ]
}

fn states(update: &ParamUpdate) -> usize {
    match *update {
        ParamUpdate::Adam { .. } => 2,
        ParamUpdate::Sgd { momentum, .. } => usize::from(momentum != 0.0),
    }
}

/// Deterministic values in [-1, 1) (or [0, 2) for Adam's second moment).
fn values(len: usize, seed: u32, nonneg: bool) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let x = ((i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) % 1000;
            let v = x as f32 / 500.0 - 1.0;
            if nonneg {
                v + 1.0
            } else {
                v
            }
        })
        .collect()
}

/// Buffers of every case: (source, param, grad, states).
struct Buffers {
    ids: Vec<(Option<BufferId>, BufferId, BufferId, Vec<BufferId>)>,
}

fn upload(be: &dyn Backend, data: Vec<f32>) -> BufferId {
    let id = be.alloc(DType::F32, data.len()).unwrap();
    be.upload(id, &HostData::F32(data)).unwrap();
    id
}

fn buffers(be: &dyn Backend, cases: &[Case]) -> Buffers {
    let ids = cases
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let seed = 10 * k as u32;
            let value = values(c.len, seed, false);
            let (source, param) = if c.from_source {
                (Some(upload(be, value)), upload(be, vec![0.0; c.len]))
            } else {
                (None, upload(be, value))
            };
            let grad = upload(be, values(c.len, seed + 1, false));
            let st = (0..states(&c.update)).map(|s| upload(be, values(c.len, seed + 2 + s as u32, s == 1))).collect();
            (source, param, grad, st)
        })
        .collect();
    Buffers { ids }
}

fn calls<'a>(cases: &[Case], b: &'a Buffers) -> Vec<ParamUpdateCall<'a>> {
    cases
        .iter()
        .zip(&b.ids)
        .map(|(c, (source, param, grad, st))| ParamUpdateCall {
            update: c.update,
            source: *source,
            param: *param,
            grad: *grad,
            state: st,
            dtype: DType::F32,
            len: c.len,
        })
        .collect()
}

/// Every buffer's bits after the updates, in a fixed order.
fn read_all(be: &dyn Backend, cases: &[Case], b: &Buffers) -> Vec<Vec<u32>> {
    let read = |id: BufferId, len: usize| -> Vec<u32> {
        match pollster::block_on(be.read(id, DType::F32, len)).unwrap() {
            HostData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            other => panic!("expected f32, got {other:?}"),
        }
    };
    let mut out = Vec::new();
    for (c, (source, param, grad, st)) in cases.iter().zip(&b.ids) {
        for id in source.iter().chain([param, grad]).chain(st) {
            out.push(read(*id, c.len));
        }
    }
    out
}

/// All updates in one call, against one call per tensor: the same bits.
fn together_equals_one_by_one(device: &Device) -> Vec<Vec<u32>> {
    let be = device.backend();
    let cases = cases();
    let (one, all) = (buffers(be, &cases), buffers(be, &cases));
    for call in calls(&cases, &one) {
        be.update_params(&[call]).unwrap();
    }
    be.update_params(&calls(&cases, &all)).unwrap();
    be.flush().unwrap();
    let (a, b) = (read_all(be, &cases, &one), read_all(be, &cases, &all));
    assert_eq!(a.len(), b.len());
    for (k, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(x == y, "{}: buffer {k} differs between one call per tensor and one call for all", device.name());
    }
    // Something was written: the first parameter moved.
    let before: Vec<u32> = values(cases[0].len, 0, false).iter().map(|x| x.to_bits()).collect();
    assert_ne!(a[0], before);
    b
}

#[test]
fn cpu_updates_together_give_the_bits_of_one_update_each() {
    together_equals_one_by_one(&Device::cpu());
}

#[test]
fn a_bad_call_list_is_refused_before_anything_is_written() {
    let mut devices = vec![Device::cpu()];
    devices.extend(grouped_vulkan("multi-tensor update errors"));
    for device in devices {
        let be = device.backend();
        let cases = cases();
        let b = buffers(be, &cases);
        let before = read_all(be, &cases, &b);
        let mut list = calls(&cases, &b);
        // The last update writes the first one's parameter too.
        let last = list.len() - 1;
        list[last].param = list[0].param;
        let err = be.update_params(&list).unwrap_err();
        assert!(err.to_string().contains("update_param"), "{}: {err}", device.name());
        // A state buffer that another update reads as its gradient.
        let mut list = calls(&cases, &b);
        list[1].grad = list[0].state[0];
        assert!(be.update_params(&list).is_err(), "{}", device.name());
        // A wrong state count.
        let mut list = calls(&cases, &b);
        list[2].state = &[];
        assert!(be.update_params(&list).is_err(), "{}", device.name());
        // The last update claims more elements than its buffers hold.
        let mut list = calls(&cases, &b);
        list[last].len += 1;
        let err = be.update_params(&list).unwrap_err();
        assert!(err.to_string().contains("update_param"), "{}: {err}", device.name());
        // A buffer that does not exist (freed).
        let gone = be.alloc(DType::F32, 4).unwrap();
        be.free(gone);
        let mut list = calls(&cases, &b);
        list[last].grad = gone;
        assert!(be.update_params(&list).is_err(), "{}", device.name());
        be.flush().unwrap();
        assert!(read_all(be, &cases, &b) == before, "{}: a refused call list changed buffers", device.name());
        // And the backend still works.
        be.update_params(&calls(&cases, &b)).unwrap();
    }
}

/// On wgpu the grouped kernel gives the per-tensor kernels' bits where the
/// adapter rounds every op, and the CPU's values within f32 rounding.
/// A wgpu device whose optimizer updates are grouped, whatever its adapter.
fn grouped_vulkan(suite: &str) -> Option<Device> {
    common::vulkan_device_with(WgpuOptions { grouped_optimizer_update: Some(true), ..Default::default() }, suite)
}

#[test]
fn wgpu_updates_together_match_one_by_one_and_the_cpu() {
    let Some(device) = grouped_vulkan("multi-tensor update") else { return };
    let cpu = together_equals_one_by_one_or_close(&device);
    let reference = together_equals_one_by_one(&Device::cpu());
    assert_eq!(cpu.len(), reference.len());
    for (k, (g, c)) in cpu.iter().zip(&reference).enumerate() {
        for (i, (&x, &y)) in g.iter().zip(c).enumerate() {
            let (x, y) = (f32::from_bits(x), f32::from_bits(y));
            assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "buffer {k}[{i}]: wgpu {x} vs cpu {y}");
        }
    }
}

fn together_equals_one_by_one_or_close(device: &Device) -> Vec<Vec<u32>> {
    if common::rounds_every_op(device) {
        return together_equals_one_by_one(device);
    }
    // A GPU driver may contract a multiply and an add differently in the
    // two kernels: compare within a few ulp there.
    let be = device.backend();
    let cases = cases();
    let b = buffers(be, &cases);
    be.update_params(&calls(&cases, &b)).unwrap();
    be.flush().unwrap();
    read_all(be, &cases, &b)
}

/// An MLP trained with Adam on wgpu: the grouped update takes one dispatch
/// for its six tensors where one per tensor takes six, and ends with the
/// same parameters; by default only hardware adapters group.
#[test]
fn wgpu_training_steps_group_the_optimizer_update() {
    let Some(grouped) = grouped_vulkan("multi-tensor training") else { return };
    let options = WgpuOptions { grouped_optimizer_update: Some(false), ..Default::default() };
    let Some(single) = common::vulkan_device_with(options, "multi-tensor training") else { return };
    let Some(default) = common::vulkan_device("multi-tensor training") else { return };
    let run = |device: &Device| -> (usize, Vec<Vec<f64>>) {
        let model = Sequential::mlp(device, &[12, 16, 8, 3], Activation::Relu, 7).unwrap();
        let mut opt = Adam::new(model.parameters(), 1e-2).unwrap();
        let mut graph = Graph::new(device);
        let x: Vec<f32> = values(5 * 12, 3, false);
        let y = [0i32, 2, 1, 1, 0];
        let mut dispatches = 0;
        for step in 0..3 {
            graph.reset();
            let xs = graph.tensor_from(&x, &[5, 12]).unwrap();
            let ys = graph.tensor_from(&y[..], &[5]).unwrap();
            let loss = kiln::nn::cross_entropy(model.forward(xs).unwrap(), ys).unwrap();
            opt.zero_grad();
            loss.backward().unwrap();
            device.backend().flush().unwrap();
            let before = device.backend().counters().dispatches;
            opt.step().unwrap();
            device.backend().flush().unwrap();
            if step == 2 {
                dispatches = device.backend().counters().dispatches - before;
            }
        }
        (dispatches, model.parameters().iter().map(common::param_value).collect())
    };
    let (grouped_dispatches, grouped_params) = run(&grouped);
    let (single_dispatches, single_params) = run(&single);
    let (default_dispatches, _) = run(&default);
    // Three weights and three biases; grouped, as many per kernel as its
    // storage-buffer bindings allow (4 each, plus the parameters').
    assert_eq!(single_dispatches, 6, "one dispatch per tensor");
    assert!(grouped_dispatches < single_dispatches, "grouped: {grouped_dispatches} dispatches");
    let software = common::rounds_every_op(&default);
    assert_eq!(default_dispatches, if software { single_dispatches } else { grouped_dispatches }, "the default");
    if common::rounds_every_op(&grouped) {
        assert_eq!(grouped_params, single_params);
    } else {
        for (a, b) in grouped_params.iter().zip(&single_params) {
            common::assert_close(a, b, 1e-5);
        }
    }
}
