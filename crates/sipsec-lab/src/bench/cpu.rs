//! CPU accounting from /proc: user and system time of a process and everything it forked
//! (Kamailio runs a dozen processes), and pinning to a core. This is the figure the seeds
//! report — server CPU per call — read the same way `scripts/kamailio_compare.py`
//! reads it, so the two harnesses can be checked against each other.

use anyhow::{bail, Context, Result};

/// CPU seconds: user and system time as the kernel samples them (in clock ticks, 10 ms
/// here), and the time on CPU as the scheduler accounts it (nanoseconds, from each thread's
/// `schedstat`). A 1,000-call quick run at 50 µs per call is 5 ticks, so the tick split is
/// ±20% noise there; the scheduler's figure is exact, and is the total whenever the kernel
/// provides it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTime {
    pub(crate) user_s: f64,
    pub(crate) sys_s: f64,
    /// On-CPU time of the threads alive now (0 where `schedstat` is not available).
    pub(crate) run_s: f64,
}

impl CpuTime {
    /// User plus system time: the scheduler's exact figure where there is one.
    pub fn total_s(&self) -> f64 {
        if self.run_s > 0.0 {
            self.run_s
        } else {
            self.user_s + self.sys_s
        }
    }

    /// The total split between user and system time in the proportion the ticks saw.
    pub(crate) fn split_s(&self) -> (f64, f64) {
        let ticks = self.user_s + self.sys_s;
        if ticks <= 0.0 {
            return (self.total_s(), 0.0);
        }
        let user = self.total_s() * self.user_s / ticks;
        (user, self.total_s() - user)
    }

    /// The CPU time spent between `earlier`, a reading of the same processes, and this one.
    pub fn since(&self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user_s: self.user_s - earlier.user_s,
            sys_s: self.sys_s - earlier.sys_s,
            run_s: self.run_s - earlier.run_s,
        }
    }
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The fields of /proc/PID/stat after the command name (which may contain spaces).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = text.rsplit_once(')')?.1;
    Some(after.split_whitespace().map(str::to_string).collect())
}

/// `pid` and all its descendants that are alive now.
pub(crate) fn process_tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            // Field 4 of stat (index 1 after the name) is the parent pid.
            if let Some(ppid) = stat_fields(p).and_then(|f| f.get(1)?.parse::<u32>().ok()) {
                parents.push((p, ppid));
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree
}

/// Summed user and system time of `pids` (all their threads). Processes that have exited
/// are skipped, as compare.py does.
pub fn cpu_of(pids: &[u32]) -> CpuTime {
    let tck = ticks_per_second();
    let mut t = CpuTime::default();
    for &pid in pids {
        if let Some(f) = stat_fields(pid) {
            // utime and stime are fields 14 and 15: indices 11 and 12 after the name.
            let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            t.user_s += get(11) as f64 / tck;
            t.sys_s += get(12) as f64 / tck;
        }
        t.run_s += run_ns_of(pid) as f64 / 1e9;
    }
    t
}

/// Nanoseconds on CPU of every live thread of `pid` (the first field of each thread's
/// `schedstat`; the process's own file covers only its main thread).
fn run_ns_of(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Voluntary context switches of every thread of `pids` so far: how often the server went
/// to sleep waiting for work, so how often it was woken. A count that noise barely moves,
/// unlike CPU time (the seeds' 10x losses were often wake-ups and scans, not arithmetic).
pub(crate) fn wakeups_of(pids: &[u32]) -> u64 {
    let mut n = 0;
    for &pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
                continue;
            };
            n += status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    n
}

/// CPU time of this process so far (all threads).
pub(crate) fn own_cpu() -> CpuTime {
    cpu_of(&[std::process::id()])
}

/// Checks that a process exists.
pub(crate) fn check_alive(pid: u32) -> Result<()> {
    if stat_fields(pid).is_none() {
        bail!("no process with PID {pid}");
    }
    Ok(())
}

/// Pins the calling thread to one CPU. Allocates nothing and makes only async-signal-safe
/// calls, so it may run between fork and exec.
pub(crate) fn set_affinity(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Pins the calling thread to one CPU.
pub(crate) fn pin_current_thread(cpu: usize) -> Result<()> {
    set_affinity(cpu).with_context(|| format!("cannot pin to CPU {cpu}"))
}

/// Online CPUs: all of them, not only those this thread may run on (a bench pins its own
/// thread to the load's CPU, and the lab runs one bench after another in one thread).
pub(crate) fn cpu_count() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_in_the_tree_and_its_cpu_is_counted() {
        // A child that burns CPU in a shell loop until killed.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let me = std::process::id();
        let tree = process_tree(me);
        assert!(tree.contains(&me) && tree.contains(&child.id()), "{tree:?}");
        let before = cpu_of(&[child.id()]);
        // Wait until the child has been charged at least two clock ticks.
        let mut after = before;
        for _ in 0..200 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            after = cpu_of(&[child.id()]);
            if after.total_s() - before.total_s() >= 0.02 {
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let used = after.since(before);
        assert!(used.total_s() >= 0.02, "{after:?}");
        // The scheduler's exact figure agrees with the ticks to within a few ticks.
        assert!(used.run_s > 0.0, "schedstat is read: {used:?}");
        assert!(
            (used.run_s - (used.user_s + used.sys_s)).abs() < 0.05,
            "{used:?}"
        );
        assert!(!process_tree(me).contains(&child.id()));
        assert_eq!(
            cpu_of(&[child.id()]),
            CpuTime::default(),
            "an exited PID counts 0"
        );
    }

    #[test]
    fn missing_processes_are_reported() {
        assert!(check_alive(std::process::id()).is_ok());
        assert!(check_alive(u32::MAX - 1).is_err());
    }

    #[test]
    fn a_process_that_sleeps_and_wakes_counts_its_wakeups() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do sleep 0.01; done"])
            .spawn()
            .unwrap();
        let before = wakeups_of(&[child.id()]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let after = wakeups_of(&[child.id()]);
        child.kill().unwrap();
        child.wait().unwrap();
        // The shell waits for each of its ~30 sleeps.
        assert!(after >= before + 5, "{before} -> {after}");
        assert_eq!(wakeups_of(&[child.id()]), 0, "an exited PID counts 0");
    }
}
