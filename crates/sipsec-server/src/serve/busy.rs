//! A worker's load, the signal of overload control (`engine::overload`), measured over fixed
//! intervals:
//! - its **busy fraction**: the share of the interval it was not blocked in `epoll_wait`
//!   waiting for work (nor sleeping on purpose to batch, `serve::coalesce`), two clock reads
//!   per loop pass. Time a CPU quota or another process holds the worker off counts as busy;
//! - its **CPU fraction against its limit**: the thread's CPU time over the interval (one
//!   `clock_gettime` an interval) as a share of the CPU a cgroup quota lets each worker use
//!   (re-read every 5 s while loaded: cgroup v1 `cpu.cfs_quota_us`, v2 `cpu.max`, the tightest of the
//!   thread's group and its ancestors). Under a quota the busy fraction reads the work only
//!   once the quota runs out, leaping from a third to one at saturation; this reads it
//!   linearly. The load is the larger of the two (without a quota it is the busy fraction);
//! - near capacity, how long datagrams waited in the kernel before they were read (kernel
//!   receive timestamps, the oldest of each batch; on TCP and TLS connections, a bound on how
//!   long the head of each pass's longest read waited, `Connections::take_delay`): for each
//!   of the two queues, the least over the interval — a queue that stood the whole interval,
//!   CoDel's test, which one late batch after a hiccup does not pass, and a pass that found it
//!   empty fails — and the last, the queue as the interval ended. The worker's figures are the
//!   larger queue's: datagrams read at once do not say that the connections' queue is short,
//!   nor the other way round.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often the CPU limit is read again (a quota can be set or changed while we run), and
/// only while the worker is loaded enough for it to matter: reading the cgroup files costs a
/// light worker more than its calls (1.3% more instructions a call at 50 calls/s read every
/// second).
const LIMIT_EVERY: Duration = Duration::from_secs(5);
/// The busy fraction below which the limit is not read again.
const LIMIT_FROM_BUSY: f64 = 0.1;

/// Measures one worker's load over fixed intervals.
#[derive(Debug)]
pub(crate) struct BusyMeter {
    interval: Duration,
    start: Instant,
    idle: Duration,
    cpu_start: Duration,
    /// Cores' worth of CPU each worker may use (1 without a quota), and when it was read.
    limit: f64,
    limit_read: Option<Instant>,
    workers: usize,
    /// The datagrams' queue and the connections'.
    queues: [QueueDelay; 2],
}

/// Which of a worker's queues a delay was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queue {
    /// The UDP sockets' (kernel receive timestamps).
    Datagrams = 0,
    /// The TCP, TLS and WebSocket connections' (`Connections::take_delay`).
    Streams = 1,
}

/// One queue's delays over the current interval: each pass's figure is the longest it read
/// (a datagram read at once from an idle socket says nothing of another socket's queue), the
/// interval's the least of its passes'.
#[derive(Debug, Clone, Copy, Default)]
struct QueueDelay {
    /// The least pass figure so far (None: none this interval).
    least: Option<Duration>,
    /// The last pass's figure (zero if that pass found the queue empty).
    latest: Duration,
    /// This pass's figure so far.
    this_pass: Option<Duration>,
    /// Read this pass (with or without a figure).
    read: bool,
    /// A pass this interval found the queue empty: it did not stand.
    emptied: bool,
}

impl QueueDelay {
    /// What stood all interval, if anything was read.
    fn standing(&self) -> Option<Duration> {
        self.least
            .map(|d| if self.emptied { Duration::ZERO } else { d })
    }
}

/// One interval's measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// The share of the interval the worker was busy.
    pub busy: f64,
    /// The thread's CPU time over the interval, as a share of the CPU it may use.
    pub(crate) cpu: f64,
    /// The least time the longer queue (datagrams' or connections') made what was read from
    /// it wait over the interval, zero if a pass found it empty (None unless measured).
    pub(crate) standing_delay: Option<Duration>,
    /// The connections' queue's alone: a lower bound on what a stream's reads waited (the
    /// rest waits in the senders' windows, where no read sees it), so overload control judges
    /// it against a shorter limit.
    pub(crate) streams_standing_delay: Option<Duration>,
    /// How long what the last pass read had waited, the longer queue's (zero unless measured).
    pub(crate) queue_delay: Duration,
}

impl Load {
    /// What overload control reads: the busy fraction, or the CPU fraction against the
    /// limit where that is more.
    pub(crate) fn load(&self) -> f64 {
        self.busy.max(self.cpu).clamp(0.0, 1.0)
    }
}

impl BusyMeter {
    /// A meter for one of `workers` workers.
    pub(crate) fn new(interval: Duration, now: Instant, workers: usize) -> BusyMeter {
        BusyMeter {
            interval,
            start: now,
            idle: Duration::ZERO,
            cpu_start: thread_cpu_time(),
            limit: 1.0,
            limit_read: None,
            workers: workers.max(1),
            queues: [QueueDelay::default(); 2],
        }
    }

    /// A batch's oldest datagram, or the head of a pass's stream reads, waited `d` in the
    /// kernel before it was read.
    pub(crate) fn queued(&mut self, queue: Queue, d: Duration) {
        let q = &mut self.queues[queue as usize];
        q.this_pass = Some(q.this_pass.map_or(d, |l| l.max(d)));
        q.read = true;
    }

    /// Something was read from `queue` this pass whose wait is not known (a batch the kernel
    /// did not stamp): the queue was not empty.
    pub(crate) fn read(&mut self, queue: Queue) {
        self.queues[queue as usize].read = true;
    }

    /// A loop pass ended. A queue it read nothing from was empty — unless its wait's report
    /// was `full` (as many events as the list holds), which may have left that queue out.
    pub(crate) fn pass(&mut self, full: bool) {
        for q in &mut self.queues {
            if let Some(d) = q.this_pass.take() {
                q.least = Some(q.least.map_or(d, |l| l.min(d)));
                q.latest = d;
            } else if !q.read && !full {
                q.emptied = true;
                q.latest = Duration::ZERO;
            }
            q.read = false;
        }
    }

    /// The worker spent `d` waiting.
    pub(crate) fn idle(&mut self, d: Duration) {
        self.idle += d;
    }

    /// Once an interval has passed: what it measured, and the next one begins.
    pub(crate) fn take(&mut self, now: Instant) -> Option<Load> {
        let wall = now.saturating_duration_since(self.start);
        if wall < self.interval {
            return None;
        }
        let busy = 1.0 - self.idle.as_secs_f64() / wall.as_secs_f64();
        if self.limit_read.is_none_or(|t| {
            now.saturating_duration_since(t) >= LIMIT_EVERY && busy >= LIMIT_FROM_BUSY
        }) {
            self.limit = cpu_limit().map_or(1.0, |cores| (cores / self.workers as f64).min(1.0));
            self.limit_read = Some(now);
        }
        let cpu_now = thread_cpu_time();
        let cpu = cpu_now.saturating_sub(self.cpu_start).as_secs_f64();
        let [datagrams, streams] = self.queues;
        let load = Load {
            busy: busy.clamp(0.0, 1.0),
            cpu: cpu / wall.as_secs_f64() / self.limit,
            standing_delay: datagrams.standing().max(streams.standing()),
            streams_standing_delay: streams.standing(),
            queue_delay: datagrams.latest.max(streams.latest),
        };
        self.start = now;
        self.cpu_start = cpu_now;
        self.idle = Duration::ZERO;
        self.queues = [QueueDelay::default(); 2];
        Some(load)
    }
}

/// The calling thread's CPU time so far (also the coalescer's measure).
pub(crate) fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to write; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The CPU, in cores, the calling thread's cgroup (and its ancestors) may use, if a quota
/// limits it.
fn cpu_limit() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/cgroup").ok()?;
    limit_from(&text, Path::new("/sys/fs/cgroup"))
}

/// The tightest quota over the group named in `/proc/…/cgroup` text and its ancestors, under
/// the cgroup mount `root`.
fn limit_from(cgroup: &str, root: &Path) -> Option<f64> {
    let mut best: Option<f64> = None;
    let mut take = |cores: Option<f64>| {
        if let Some(c) = cores {
            best = Some(best.map_or(c, |b| b.min(c)));
        }
    };
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            // cgroup v2: the unified hierarchy, `cpu.max` = "QUOTA PERIOD" or "max PERIOD".
            for dir in ancestors(root, path) {
                take(read(&dir.join("cpu.max")).and_then(|t| {
                    let mut f = t.split_whitespace();
                    let quota: f64 = f.next()?.parse().ok()?;
                    let period: f64 = f.next()?.parse().ok()?;
                    (period > 0.0).then(|| quota / period)
                }));
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            // cgroup v1: the cpu controller's mount, named as the kernel lists it.
            for mount in [controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"] {
                let base = root.join(mount);
                if !base.join("cpu.cfs_quota_us").exists() {
                    continue;
                }
                for dir in ancestors(&base, path) {
                    let quota: Option<f64> =
                        read(&dir.join("cpu.cfs_quota_us")).and_then(|t| t.parse().ok());
                    let period: Option<f64> =
                        read(&dir.join("cpu.cfs_period_us")).and_then(|t| t.parse().ok());
                    take(match (quota, period) {
                        (Some(q), Some(p)) if q > 0.0 && p > 0.0 => Some(q / p),
                        _ => None,
                    });
                }
                break;
            }
        }
    }
    best
}

/// `base` joined with `path` and each of its ancestors up to `base` itself.
fn ancestors(base: &Path, path: &str) -> Vec<PathBuf> {
    let mut dir = base.join(path.trim_start_matches('/'));
    let mut out = vec![dir.clone()];
    while dir != base && dir.pop() {
        out.push(dir.clone());
    }
    out
}

fn read(p: &Path) -> Option<String> {
    Some(std::fs::read_to_string(p).ok()?.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_share_is_what_was_not_waited() {
        let t0 = Instant::now();
        let mut m = BusyMeter::new(Duration::from_millis(100), t0, 1);
        m.idle(Duration::from_millis(25));
        assert_eq!(m.take(t0 + Duration::from_millis(50)), None);
        m.idle(Duration::from_millis(25));
        let load = m.take(t0 + Duration::from_millis(100)).unwrap();
        assert!((load.busy - 0.5).abs() < 1e-9, "{load:?}");
        // The next interval starts afresh.
        assert_eq!(m.take(t0 + Duration::from_millis(150)), None);
        let load = m.take(t0 + Duration::from_millis(200)).unwrap();
        assert!((load.busy - 1.0).abs() < 1e-9, "{load:?}");
    }

    /// CoDel's rule: a queue counts when it stood the whole interval (its least delay), not
    /// when one batch came late after a hiccup; the last batch says where it ended.
    #[test]
    fn a_late_batch_is_not_a_standing_queue() {
        let t0 = Instant::now();
        let mut m = BusyMeter::new(Duration::from_millis(100), t0, 1);
        for d in [1, 2, 55, 30, 3, 2] {
            m.queued(Queue::Datagrams, Duration::from_millis(d));
            m.pass(false);
        }
        let load = m.take(t0 + Duration::from_millis(100)).unwrap();
        assert_eq!(load.standing_delay, Some(Duration::from_millis(1)));
        assert_eq!(load.queue_delay, Duration::from_millis(2));
        for d in [40, 60, 80] {
            m.queued(Queue::Datagrams, Duration::from_millis(d));
            m.pass(false);
        }
        let load = m.take(t0 + Duration::from_millis(200)).unwrap();
        assert_eq!(load.standing_delay, Some(Duration::from_millis(40)));
        assert_eq!(load.queue_delay, Duration::from_millis(80));
        // Not measured: none.
        let load = m.take(t0 + Duration::from_millis(300)).unwrap();
        assert_eq!(load.standing_delay, None);
    }

    /// The datagrams' queue and the connections' stand or not each on its own, and the worker
    /// reads the longer: datagrams read at once (a few stray ones while the connections stand
    /// full) do not hide the connections' queue. A pass that read nothing from a queue found it
    /// empty, so it did not stand that interval.
    #[test]
    fn each_queue_stands_on_its_own_and_the_longer_counts() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = BusyMeter::new(ms(100), t0, 1);
        for (udp, stream) in [(Some(1), 25), (None, 30), (Some(0), 22), (None, 28)] {
            if let Some(d) = udp {
                m.queued(Queue::Datagrams, ms(d));
            }
            m.queued(Queue::Streams, ms(stream));
            m.pass(false);
        }
        let load = m.take(t0 + ms(100)).unwrap();
        assert_eq!(load.standing_delay, Some(ms(22)));
        assert_eq!(load.queue_delay, ms(28));
        // A datagram queue that stood, and connections read in only some passes.
        for (udp, stream) in [(12, Some(40)), (9, None), (15, Some(3))] {
            m.queued(Queue::Datagrams, ms(udp));
            if let Some(d) = stream {
                m.queued(Queue::Streams, ms(d));
            }
            m.pass(false);
        }
        let load = m.take(t0 + ms(200)).unwrap();
        assert_eq!(load.standing_delay, Some(ms(9)));
        assert_eq!(load.queue_delay, ms(15));
        // Two reads of one queue in a pass (two UDP sockets, one idle but for a datagram read
        // at once): the pass's figure is the longer, so the idle one does not hide the other's
        // queue.
        for _ in 0..3 {
            m.queued(Queue::Datagrams, ms(20));
            m.queued(Queue::Datagrams, ms(1));
            m.pass(false);
        }
        let load = m.take(t0 + ms(300)).unwrap();
        assert_eq!(load.standing_delay, Some(ms(20)));
        assert_eq!(load.queue_delay, ms(20));
        // A pass whose wait's report was full may have left a queue out: not empty, then; nor
        // is one read without a stamp.
        m.queued(Queue::Datagrams, ms(9));
        m.pass(false);
        m.pass(true);
        m.read(Queue::Datagrams);
        m.pass(false);
        m.queued(Queue::Datagrams, ms(8));
        m.pass(false);
        let load = m.take(t0 + ms(400)).unwrap();
        assert_eq!(load.standing_delay, Some(ms(8)));
        assert_eq!(load.queue_delay, ms(8));
    }

    /// The CPU fraction is the thread's CPU time against its limit: a spinning thread reads
    /// some of a core and never more than one, and against a quarter core's limit four times
    /// what it used (the load clamps at 1). Bounds loose enough for a busy test machine.
    #[test]
    fn cpu_time_is_read_against_the_limit() {
        let spin = |m: &mut BusyMeter| {
            let t = Instant::now();
            let before = thread_cpu_time();
            while t.elapsed() < Duration::from_millis(60) {
                std::hint::black_box(0u64);
            }
            let used = thread_cpu_time().saturating_sub(before);
            (m.take(Instant::now()).unwrap(), used)
        };
        let t0 = Instant::now();
        let mut m = BusyMeter::new(Duration::from_millis(50), t0, 1);
        m.limit_read = Some(t0); // keep the default limit (1 core)
        let (load, used) = spin(&mut m);
        assert!(!used.is_zero());
        assert!(load.cpu > 0.0 && load.cpu <= 1.05, "{load:?}");
        m.limit = 0.25;
        let (load, used) = spin(&mut m);
        let wall = 0.06;
        assert!(
            load.cpu >= used.as_secs_f64() / wall / 0.25 * 0.5,
            "{load:?} {used:?}"
        );
        assert!(load.cpu <= 4.2, "{load:?}");
        assert!(load.load() <= 1.0);
    }

    #[test]
    fn quotas_are_read_from_cgroup_v1_and_v2_and_the_tightest_ancestor_wins() {
        let dir = std::env::temp_dir().join(format!("sipsec-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // v1: a quarter core on the group, half a core on its parent.
        let leaf = dir.join("cpu/outer/inner");
        std::fs::create_dir_all(&leaf).unwrap();
        let put = |d: &Path, f: &str, v: &str| std::fs::write(d.join(f), v).unwrap();
        put(&dir.join("cpu"), "cpu.cfs_quota_us", "-1\n");
        put(&dir.join("cpu"), "cpu.cfs_period_us", "100000\n");
        put(&dir.join("cpu/outer"), "cpu.cfs_quota_us", "50000\n");
        put(&dir.join("cpu/outer"), "cpu.cfs_period_us", "100000\n");
        put(&leaf, "cpu.cfs_quota_us", "2500\n");
        put(&leaf, "cpu.cfs_period_us", "10000\n");
        let v1 = "2:cpuacct:/\n1:cpu:/outer/inner\n0::/\n";
        assert_eq!(limit_from(v1, &dir), Some(0.25));
        // No quota anywhere: none.
        assert_eq!(limit_from("1:cpu:/\n", &dir), None);
        // v2: "max" is no limit; an ancestor's 1.5 cores is.
        let v2 = dir.join("a/b");
        std::fs::create_dir_all(&v2).unwrap();
        put(&v2, "cpu.max", "max 100000\n");
        put(&dir.join("a"), "cpu.max", "150000 100000\n");
        assert_eq!(limit_from("0::/a/b\n", &dir), Some(1.5));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
