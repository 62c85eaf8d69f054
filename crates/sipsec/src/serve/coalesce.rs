//! Adaptive wake-up coalescing for a worker.
//!
//! On virtual machines a wake-up (an interrupt, a scheduler switch, the `poll` return) costs far
//! more than handling a datagram, and at a few thousand datagrams a second a worker that wakes
//! for each one spends most of its time in the kernel. Like a NIC's interrupt moderation, the
//! worker may wait a little after waking so more datagrams arrive for one `recvmmsg`, and more
//! bytes for each connection's read (stream messages count toward the rate like datagrams:
//! without that, a TCP or TLS worker woke about once per message, 4 wake-ups a call instead
//! of UDP's 1.3, and cost 1.3–1.8× UDP per call). It does
//! so only when the measured rate is high (so an idle or lightly loaded server adds no
//! latency), waits about as long as [`TARGET_BATCH`] datagrams take to arrive at that rate, and
//! never longer than the configured cap (`server.max_batch_delay_us`).

use std::time::Duration;

/// Datagrams a worker aims to find per wake-up under load.
pub const TARGET_BATCH: f64 = 8.0;
/// Below this rate (datagrams a second) there is no waiting.
pub const MIN_RATE: f64 = 2_000.0;
const WINDOW_MS: u64 = 100;

#[derive(Debug)]
pub struct Coalescer {
    cap: Duration,
    window_start_ms: u64,
    count: u64,
    /// Datagrams a second over the last complete window.
    rate: f64,
}

impl Coalescer {
    pub fn new(cap: Duration) -> Self {
        Coalescer {
            cap,
            window_start_ms: 0,
            count: 0,
            rate: 0.0,
        }
    }

    /// Records `n` datagrams handled at `now_ms`.
    pub fn record(&mut self, now_ms: u64, n: usize) {
        let elapsed = now_ms.saturating_sub(self.window_start_ms);
        if elapsed >= WINDOW_MS {
            // An idle gap longer than a window means the rate is what this window saw.
            self.rate = self.count as f64 * 1_000.0 / elapsed as f64;
            self.window_start_ms = now_ms;
            self.count = 0;
        }
        self.count += n as u64;
    }

    /// How long to wait after a wake-up at `now_ms` before receiving. A rate measured before
    /// an idle spell of two windows or more no longer counts.
    pub fn delay(&self, now_ms: u64) -> Duration {
        let stale = now_ms.saturating_sub(self.window_start_ms) >= 2 * WINDOW_MS;
        if self.cap.is_zero() || self.rate < MIN_RATE || stale {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(TARGET_BATCH / self.rate).min(self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_delay_when_idle_or_disabled() {
        let mut c = Coalescer::new(Duration::from_micros(500));
        c.record(0, 10);
        c.record(100, 10);
        assert_eq!(
            c.delay(100),
            Duration::ZERO,
            "100 datagrams a second is light load"
        );
        let mut off = Coalescer::new(Duration::ZERO);
        for t in 0..1_000 {
            off.record(t, 50);
        }
        assert_eq!(off.delay(1_000), Duration::ZERO);
    }

    #[test]
    fn delay_follows_the_rate_up_to_the_cap() {
        let mut c = Coalescer::new(Duration::from_micros(500));
        for t in 0..=100 {
            c.record(t, 4); // 4,000 a second: 8 datagrams take 2 ms, so the cap applies
        }
        assert_eq!(c.delay(150), Duration::from_micros(500));
        for t in 101..=200 {
            c.record(t, 40); // 40,000 a second: 8 datagrams take 200 us
        }
        let d = c.delay(250); // about 40,000 a second (the window edge makes it 39,640)
        assert!((190..=210).contains(&d.as_micros()), "{d:?}");
        assert_eq!(
            c.delay(2_000),
            Duration::ZERO,
            "after an idle spell nothing waits"
        );
        c.record(2_000, 1); // the window closes with a collapsed rate
        assert_eq!(c.delay(2_001), Duration::ZERO);
    }
}
