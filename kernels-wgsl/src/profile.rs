//! Per-kernel timing for finding what a step spends its time on
//! (`KILN_WGPU_PROFILE=1`, native only): every recorded dispatch and copy is
//! submitted on its own and waited for, and the wall time is summed per
//! op, kernel, entry point and grid. The waits serialise the GPU, so the
//! totals are for comparing kernels with each other, not a step's normal
//! time. The table goes to stderr when the backend is dropped.

use std::collections::HashMap;
use std::time::Duration;

/// What a row of the table sums over.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub op: &'static str,
    pub kernel: String,
    pub entry: &'static str,
    pub groups: [u32; 3],
}

#[derive(Default)]
pub(crate) struct Profile {
    rows: HashMap<Key, (u64, Duration)>,
}

impl Profile {
    /// On when `KILN_WGPU_PROFILE` is set to anything but "0".
    pub fn from_env() -> Option<Profile> {
        match std::env::var("KILN_WGPU_PROFILE") {
            Ok(v) if v != "0" => Some(Profile::default()),
            _ => None,
        }
    }

    pub fn add(&mut self, key: Key, time: Duration) {
        let row = self.rows.entry(key).or_default();
        row.0 += 1;
        row.1 += time;
    }

    /// The rows by total time, largest first, then totals per op.
    pub fn report(&self) -> String {
        let total: Duration = self.rows.values().map(|r| r.1).sum();
        let pct = |d: Duration| 100.0 * d.as_secs_f64() / total.as_secs_f64().max(1e-12);
        let mut rows: Vec<_> = self.rows.iter().collect();
        rows.sort_by(|a, b| b.1 .1.cmp(&a.1 .1));
        let mut out = format!("kiln wgpu profile: {:.3} s in {} kinds of dispatch\n", total.as_secs_f64(), rows.len());
        out += "   % |     total s |  count |   ms each | op / kernel::entry [groups]\n";
        for (k, (count, time)) in rows.iter().take(40) {
            out += &format!(
                "{:5.1} | {:11.3} | {:6} | {:9.3} | {} / {}::{} {:?}\n",
                pct(*time),
                time.as_secs_f64(),
                count,
                1e3 * time.as_secs_f64() / *count as f64,
                k.op,
                k.kernel,
                k.entry,
                k.groups
            );
        }
        let mut ops: HashMap<&str, (u64, Duration)> = HashMap::new();
        for (k, (count, time)) in &self.rows {
            let row = ops.entry(k.op).or_default();
            row.0 += count;
            row.1 += *time;
        }
        let mut ops: Vec<_> = ops.into_iter().collect();
        ops.sort_by(|a, b| b.1 .1.cmp(&a.1 .1));
        out += "per op:\n";
        for (op, (count, time)) in ops {
            out += &format!("{:5.1} | {:11.3} | {:6} | {op}\n", pct(time), time.as_secs_f64(), count);
        }
        out
    }
}
