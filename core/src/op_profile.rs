//! Per-kernel wall time, for finding where a step's time goes without an
//! external profiler (`Device::set_op_profile`, or `KILN_OP_PROFILE=1` when
//! the device is made). Native only: the browser has no clock worth it here.
//!
//! What a line measures is the backend call, from the executor's side: on
//! the CPU that is the kernel itself (calls are synchronous); on wgpu it is
//! only the recording of the dispatch, not its GPU time (use
//! `KILN_WGPU_PROFILE=1` for that). Labels name the op (or a fused group's
//! ops) and the shapes, so one line is one kind of kernel of the step.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The time spent in one kind of kernel since the profile was switched on.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    /// The op (or `fused[...]` with the group's ops) and its shapes.
    pub label: String,
    /// How many times it ran.
    pub calls: u64,
    /// Wall time of all those calls together.
    pub seconds: f64,
}

#[derive(Default)]
pub(crate) struct OpProfile {
    times: HashMap<String, (u64, Duration)>,
}

impl OpProfile {
    pub(crate) fn add(&mut self, label: String, elapsed: Duration) {
        let e = self.times.entry(label).or_default();
        e.0 += 1;
        e.1 += elapsed;
    }

    /// Everything recorded, the most time first.
    pub(crate) fn report(&self) -> Vec<OpTime> {
        let mut out: Vec<OpTime> = self
            .times
            .iter()
            .map(|(label, &(calls, t))| OpTime { label: label.clone(), calls, seconds: t.as_secs_f64() })
            .collect();
        out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then_with(|| a.label.cmp(&b.label)));
        out
    }
}

/// A started measurement; `Device::record_op` ends it.
pub(crate) struct Stopwatch(Instant);

impl Stopwatch {
    pub(crate) fn start() -> Stopwatch {
        Stopwatch(Instant::now())
    }
    pub(crate) fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

/// `[a,b]` for dims.
pub(crate) fn dims_label(dims: &[usize]) -> String {
    let inner: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", inner.join(","))
}

/// A table of the profile for people: share of the total, total ms, calls,
/// µs per call, label; `top` lines at most (the rest summed in one line).
pub fn format_table(times: &[OpTime], top: usize) -> String {
    let total: f64 = times.iter().map(|t| t.seconds).sum();
    let mut s = format!("{:>6} {:>10} {:>8} {:>10}  kernel\n", "share", "total ms", "calls", "us/call");
    let line = |s: &mut String, seconds: f64, calls: u64, label: &str| {
        let share = if total > 0.0 { 100.0 * seconds / total } else { 0.0 };
        let per = if calls > 0 { 1e6 * seconds / calls as f64 } else { 0.0 };
        s.push_str(&format!("{share:>5.1}% {:>10.2} {calls:>8} {per:>10.1}  {label}\n", 1e3 * seconds));
    };
    for t in times.iter().take(top) {
        line(&mut s, t.seconds, t.calls, &t.label);
    }
    if times.len() > top {
        let rest = &times[top..];
        let (secs, calls) = rest.iter().fold((0.0, 0), |(s, c), t| (s + t.seconds, c + t.calls));
        line(&mut s, secs, calls, &format!("({} other kinds)", rest.len()));
    }
    s.push_str(&format!("{:>6} {:>10.2}  all kernels\n", "", 1e3 * total));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The executor records every kernel it runs, by op and shapes, and the
    /// optimizer its update; nothing when the profile is off.
    #[test]
    fn the_device_records_kernels_by_op_and_shape() {
        use crate::nn::{Linear, Module};
        use crate::optim::{Optimizer, Sgd};
        use crate::{Device, Graph};
        let device = Device::cpu();
        device.set_fusion(false);
        let run = |device: &Device| {
            let layer = Linear::new(device, 3, 4, true, 7).unwrap();
            let mut sgd = Sgd::new(layer.parameters(), 0.1).unwrap();
            let g = Graph::new(device);
            let x = g.tensor_from(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0][..], &[2, 3]).unwrap();
            layer.forward(x).unwrap().relu().unwrap().sum_all().unwrap().backward().unwrap();
            sgd.step().unwrap();
        };
        run(&device);
        assert!(device.op_profile().is_empty(), "off by default (KILN_OP_PROFILE unset in tests)");
        device.set_op_profile(true);
        run(&device);
        let labels: Vec<String> = device.op_profile().into_iter().map(|t| t.label).collect();
        for want in ["MatMul Bᵀ [2,3] [4,3] -> [2,4]", "Relu [2,4] -> [2,4]", "optimizer update (2 tensors)"] {
            assert!(labels.iter().any(|l| l == want), "{want} missing from {labels:?}");
        }
        let fused = Device::cpu();
        fused.set_op_profile(true);
        run(&fused);
        let labels: Vec<String> = fused.op_profile().into_iter().map(|t| t.label).collect();
        assert!(labels.iter().any(|l| l.starts_with("fused[")), "no fused group in {labels:?}");
        device.set_op_profile(false);
        assert!(device.op_profile().is_empty());
    }

    #[test]
    fn report_sorts_by_time_and_sums_calls() {
        let mut p = OpProfile::default();
        p.add("a".into(), Duration::from_millis(2));
        p.add("b".into(), Duration::from_millis(5));
        p.add("a".into(), Duration::from_millis(4));
        let r = p.report();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].label.as_str(), r[0].calls), ("a", 2));
        assert!((r[0].seconds - 0.006).abs() < 1e-9);
        assert_eq!((r[1].label.as_str(), r[1].calls), ("b", 1));
        let table = format_table(&r, 1);
        assert!(table.contains("(1 other kinds)") && table.contains("11.00  all kernels"), "{table}");
    }
}
