//! A CPU quota for the server under test (`sipsec bench --cpu-quota`): a cgroup v1 `cpu`
//! group whose CFS quota is a fraction of one core, over a 10 ms period so the server is
//! held off in slices short against SIP's timers (T1 = 500 ms). On a two-core machine this is
//! how one core of load generator can offer the server several times what it can handle:
//! seed 004's overload, where servers collapse.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// Where cgroup v1's cpu controller is mounted.
const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";
/// The CFS period, in microseconds.
const PERIOD_US: u64 = 10_000;

/// A cgroup holding processes to a share of a core; removed on drop (its processes go back
/// to the root group first).
#[derive(Debug)]
pub(crate) struct Quota {
    dir: PathBuf,
}

impl Quota {
    /// Puts `pids` (every thread of each) into a new group limited to `fraction` of a core.
    pub(crate) fn apply(fraction: f64, pids: &[u32]) -> Result<Quota> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            bail!("--cpu-quota is a fraction of one core, above 0 and at most 1");
        }
        let root = Path::new(CPU_ROOT);
        if !root.join("cpu.cfs_quota_us").exists() {
            bail!(
                "--cpu-quota needs cgroup v1's cpu controller at {CPU_ROOT} (and root): not \
                 found here"
            );
        }
        let dir = root.join(format!("sipsec-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {} (run as root)", dir.display()))?;
        let quota = Quota { dir };
        let quota_us = ((fraction * PERIOD_US as f64) as u64).max(1000);
        quota.write("cpu.cfs_period_us", &PERIOD_US.to_string())?;
        quota.write("cpu.cfs_quota_us", &quota_us.to_string())?;
        for pid in pids {
            quota.write("cgroup.procs", &pid.to_string())?;
        }
        Ok(quota)
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        std::fs::write(&path, value)
            .with_context(|| format!("cannot write {value} to {}", path.display()))
    }

    /// How often the group was held off for using up its quota, and for how long in all
    /// (seconds): evidence that the quota, not the load, set the pace.
    pub(crate) fn throttled(&self) -> (u64, f64) {
        let s = self.stat();
        (s.throttled, s.throttled_s)
    }

    /// The group's `cpu.stat` so far.
    pub(crate) fn stat(&self) -> QuotaStat {
        let text = std::fs::read_to_string(self.dir.join("cpu.stat")).unwrap_or_default();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        QuotaStat {
            periods: field("nr_periods"),
            throttled: field("nr_throttled"),
            throttled_s: field("throttled_time") as f64 / 1e9,
        }
    }
}

/// What a quota did so far (cgroup v1 `cpu.stat`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QuotaStat {
    /// CFS periods in which the group had threads ready to run.
    pub(crate) periods: u64,
    /// Of those, the periods in which it used up its quota and was held off.
    pub(crate) throttled: u64,
    /// Seconds held off in all.
    pub(crate) throttled_s: f64,
}

impl Drop for Quota {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write(Path::new(CPU_ROOT).join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
