//! Adaptive wake-up coalescing for a worker, kept only while it is measured to pay.
//!
//! On virtual machines a wake-up (an interrupt, a scheduler switch, the `poll` return) costs far
//! more than handling a datagram. Like a NIC's interrupt moderation, a loaded worker may wait a
//! little after waking, so more datagrams arrive for one `recvmmsg` and more bytes for each
//! connection's read. It waits about as long as [`TARGET_BATCH`] messages take to arrive at the
//! measured rate, never longer than the configured cap (`server.max_batch_delay_us`), and only
//! above [`MIN_RATE`], so an idle or lightly loaded server adds no latency. Nor does it wait
//! while a backlog does (the worker's last read took a full batch): the next batch is
//! already there, and a wait would only drain it slower.
//!
//! Whether waiting pays depends on the machine and on how the traffic arrives, so the worker
//! measures it instead of assuming it. The wait is a timer wake-up of its own: on the VMs this
//! was measured on, an `epoll` wake-up by a packet costs about 13 µs of CPU and a 500 µs sleep
//! about 24 µs more. Against SIPp, whose processes send in bursts, waiting saved few wake-ups
//! and doubled the CPU per call at 1,000 calls/s (63 → 105 µs); against `sipsec load`, whose
//! messages arrive one by one, it saved 2.7 wake-ups a call and cut it from 175 to 117 µs.
//! So the coalescer runs windows of [`WINDOW_MS`] under one policy, waiting or not, and counts
//! the thread's CPU time per message in each ([`Coalescer::record`]). It keeps the cheaper
//! policy and now and then runs one window of the other, to notice when that one has become
//! cheaper; each time the check confirms the choice, the next one comes half as often
//! (from every [`MIN_EXPLORE`] windows down to every [`MAX_EXPLORE`]).

use std::time::Duration;

/// Messages a worker aims to find per wake-up under load.
pub(crate) const TARGET_BATCH: f64 = 8.0;
/// Below this rate (messages a second) there is no waiting.
pub(crate) const MIN_RATE: f64 = 2_000.0;
/// The length of a measuring window.
pub(crate) const WINDOW_MS: u64 = 100;
/// Windows under the chosen policy before the first look at the other one.
pub(crate) const MIN_EXPLORE: u32 = 4;
/// The most windows between two looks at the other policy (6.4 s).
pub(crate) const MAX_EXPLORE: u32 = 64;
/// A window with fewer messages than this says too little about the cost of either policy.
const MIN_MESSAGES: u64 = 100;
/// The other policy must be this much cheaper per message before the worker switches.
const MARGIN: f64 = 0.10;
/// Weight of the newest window in the chosen policy's running cost.
const ALPHA: f64 = 0.25;

/// Whether a wake-up waits for more messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    Wait,
    NoWait,
}

impl Policy {
    fn other(self) -> Policy {
        match self {
            Policy::Wait => Policy::NoWait,
            Policy::NoWait => Policy::Wait,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug)]
pub(crate) struct Coalescer {
    cap: Duration,
    window_start_ms: u64,
    /// The thread's CPU time when the window started.
    window_start_cpu: Duration,
    count: u64,
    /// Messages a second over the last complete window.
    rate: f64,
    /// The policy the current window runs under.
    current: Policy,
    /// The policy in force between looks at the other.
    chosen: Policy,
    /// CPU nanoseconds per message under each policy, as last measured.
    cost: [Option<f64>; 2],
    explore_every: u32,
    since_explore: u32,
}

impl Coalescer {
    pub(crate) fn new(cap: Duration) -> Self {
        Coalescer {
            cap,
            window_start_ms: 0,
            window_start_cpu: Duration::ZERO,
            count: 0,
            rate: 0.0,
            current: Policy::NoWait,
            chosen: Policy::NoWait,
            cost: [None, None],
            explore_every: MIN_EXPLORE,
            since_explore: 0,
        }
    }

    /// Records `n` messages handled at `now_ms`. When this ends a window, `thread_cpu` is
    /// asked for the CPU time the calling thread has used so far (a system call, so it is
    /// read once a window, not once a batch).
    pub(crate) fn record(&mut self, now_ms: u64, n: usize, thread_cpu: impl FnOnce() -> Duration) {
        let elapsed = now_ms.saturating_sub(self.window_start_ms);
        if elapsed >= WINDOW_MS {
            let cpu = thread_cpu();
            // A window counts only if the policies differed in it: loaded enough to wait,
            // and not ended by an idle spell (which says nothing about either policy).
            if self.waits_at_rate() && elapsed < 2 * WINDOW_MS && self.count >= MIN_MESSAGES {
                let spent = cpu.saturating_sub(self.window_start_cpu).as_nanos() as f64;
                self.judge(spent / self.count as f64);
            }
            // An idle gap longer than a window means the rate is what this window saw.
            self.rate = self.count as f64 * 1_000.0 / elapsed as f64;
            self.window_start_ms = now_ms;
            self.window_start_cpu = cpu;
            self.count = 0;
        }
        self.count += n as u64;
    }

    /// How long to wait after a wake-up at `now_ms` before receiving. A rate measured before
    /// an idle spell of two windows or more no longer counts.
    pub(crate) fn delay(&self, now_ms: u64) -> Duration {
        let stale = now_ms.saturating_sub(self.window_start_ms) >= 2 * WINDOW_MS;
        if self.current == Policy::NoWait || !self.waits_at_rate() || stale {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(TARGET_BATCH / self.rate).min(self.cap)
    }

    /// The policy in force between looks at the other one.
    #[cfg(test)]
    pub(crate) fn chosen(&self) -> Policy {
        self.chosen
    }

    fn waits_at_rate(&self) -> bool {
        !self.cap.is_zero() && self.rate >= MIN_RATE
    }

    /// Takes the cost per message of the window that just ended, and picks the policy of
    /// the next one.
    fn judge(&mut self, per_message: f64) {
        let i = self.current.index();
        if self.current != self.chosen {
            // A look at the other policy: one window, judged against the chosen one's
            // running cost.
            self.cost[i] = Some(per_message);
            let chosen_cost = self.cost[self.chosen.index()].unwrap_or(f64::INFINITY);
            if per_message < chosen_cost * (1.0 - MARGIN) {
                tracing::debug!(
                    "wake-up coalescing: {:?} now ({per_message:.0} ns a message against {chosen_cost:.0})",
                    self.current
                );
                self.chosen = self.current;
                self.explore_every = MIN_EXPLORE;
            } else {
                self.explore_every = (self.explore_every * 2).min(MAX_EXPLORE);
            }
            self.current = self.chosen;
            self.since_explore = 0;
            return;
        }
        self.cost[i] = Some(match self.cost[i] {
            Some(c) => c + ALPHA * (per_message - c),
            None => per_message,
        });
        self.since_explore += 1;
        if self.since_explore >= self.explore_every {
            self.current = self.chosen.other();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a coalescer through `windows` windows of 700 messages each, where a window
    /// costs `wait` or `no_wait` nanoseconds of CPU a message. Returns how many windows ran
    /// under each policy.
    fn drive(c: &mut Coalescer, start_ms: u64, windows: u64, wait: u64, no_wait: u64) -> [u64; 2] {
        let mut cpu = Duration::from_secs(1);
        let mut ran = [0; 2];
        for w in 0..windows {
            let t = start_ms + w * WINDOW_MS;
            // The first batch closes the last window, which sets the policy of this one.
            c.record(t, 10, || cpu);
            let per = if c.delay(t) > Duration::ZERO {
                ran[0] += 1;
                wait
            } else {
                ran[1] += 1;
                no_wait
            };
            // 69 more batches of 10 messages through the window.
            for b in 1..70 {
                c.record(t + b, 10, || cpu);
            }
            cpu += Duration::from_nanos(per * 700);
        }
        ran
    }

    #[test]
    fn no_delay_when_idle_or_disabled() {
        let mut c = Coalescer::new(Duration::from_micros(500));
        c.record(0, 10, || Duration::ZERO);
        c.record(100, 10, || Duration::ZERO);
        assert_eq!(
            c.delay(100),
            Duration::ZERO,
            "100 messages a second is light load"
        );
        let mut off = Coalescer::new(Duration::ZERO);
        assert_eq!(drive(&mut off, 0, 200, 1_000, 90_000), [0, 200]);
    }

    #[test]
    fn keeps_the_cheaper_policy_and_seldom_looks_at_the_other() {
        // (cost a message waiting, not waiting, the policy to keep)
        for (wait, no_wait, keep) in [
            (60_000, 100_000, Policy::Wait),
            (100_000, 60_000, Policy::NoWait),
        ] {
            let mut c = Coalescer::new(Duration::from_micros(500));
            let ran = drive(&mut c, 0, 1_000, wait, no_wait);
            assert_eq!(c.chosen(), keep);
            // After the first few windows, only one window in MAX_EXPLORE + 1 looks away.
            let away = ran[keep.other().index()];
            assert!(
                away <= 30,
                "{away} of 1,000 windows under {:?}",
                keep.other()
            );
        }
    }

    #[test]
    fn follows_the_traffic_when_it_changes() {
        let mut c = Coalescer::new(Duration::from_micros(500));
        drive(&mut c, 0, 500, 60_000, 100_000);
        assert_eq!(c.chosen(), Policy::Wait);
        // The same rate, now arriving in bursts: waiting has stopped paying.
        drive(&mut c, 500 * WINDOW_MS, 200, 100_000, 60_000);
        assert_eq!(c.chosen(), Policy::NoWait);
    }

    #[test]
    fn a_small_difference_does_not_flap() {
        let mut c = Coalescer::new(Duration::from_micros(500));
        drive(&mut c, 0, 1_000, 58_000, 60_000);
        assert_eq!(c.chosen(), Policy::NoWait, "3% is inside the margin");
    }

    #[test]
    fn delay_follows_the_rate_up_to_the_cap() {
        // A coalescer that has found waiting pays (and has no cost to measure here).
        let mut c = Coalescer::new(Duration::from_micros(500));
        c.current = Policy::Wait;
        c.chosen = Policy::Wait;
        let none = || Duration::ZERO;
        for t in 0..=100 {
            c.record(t, 4, none); // 4,000 a second: 8 messages take 2 ms, so the cap applies
        }
        assert_eq!(c.delay(150), Duration::from_micros(500));
        for t in 101..=200 {
            c.record(t, 40, none); // 40,000 a second: 8 messages take 200 us
        }
        let d = c.delay(250); // about 40,000 a second (the window edge makes it 39,640)
        assert!((190..=210).contains(&d.as_micros()), "{d:?}");
        assert_eq!(
            c.delay(2_000),
            Duration::ZERO,
            "after an idle spell nothing waits"
        );
        c.record(2_000, 1, none); // the window closes with a collapsed rate
        assert_eq!(c.delay(2_001), Duration::ZERO);
    }
}
