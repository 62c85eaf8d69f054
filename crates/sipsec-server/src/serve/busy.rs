//! A worker's load, the signal of overload control (`engine::overload`): its busy fraction,
//! the share of each interval it was not blocked in `epoll_wait` waiting for work (nor
//! sleeping on purpose to batch, `serve::coalesce`), two clock reads per loop pass; and,
//! near capacity, the longest a datagram waited in the kernel before it was read.

use std::time::{Duration, Instant};

/// Measures one worker's busy fraction over fixed intervals.
#[derive(Debug)]
pub(crate) struct BusyMeter {
    interval: Duration,
    start: Instant,
    idle: Duration,
    delay: Duration,
}

/// One interval's measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// The share of the interval the worker was busy.
    pub busy: f64,
    /// The longest a datagram waited in the kernel before it was read (zero unless
    /// measured).
    pub(crate) queue_delay: Duration,
}

impl BusyMeter {
    pub(crate) fn new(interval: Duration, now: Instant) -> BusyMeter {
        BusyMeter {
            interval,
            start: now,
            idle: Duration::ZERO,
            delay: Duration::ZERO,
        }
    }

    /// A datagram waited `d` in the kernel before it was read.
    pub(crate) fn queued(&mut self, d: Duration) {
        self.delay = self.delay.max(d);
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
        let load = Load {
            busy: busy.clamp(0.0, 1.0),
            queue_delay: self.delay,
        };
        self.start = now;
        self.idle = Duration::ZERO;
        self.delay = Duration::ZERO;
        Some(load)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_share_is_what_was_not_waited() {
        let t0 = Instant::now();
        let mut m = BusyMeter::new(Duration::from_millis(100), t0);
        m.idle(Duration::from_millis(25));
        assert_eq!(m.take(t0 + Duration::from_millis(50)), None);
        m.idle(Duration::from_millis(25));
        m.queued(Duration::from_millis(3));
        m.queued(Duration::from_millis(7));
        m.queued(Duration::from_millis(5));
        let load = m.take(t0 + Duration::from_millis(100)).unwrap();
        assert!((load.busy - 0.5).abs() < 1e-9, "{load:?}");
        assert_eq!(load.queue_delay, Duration::from_millis(7));
        // The next interval starts afresh.
        assert_eq!(m.take(t0 + Duration::from_millis(150)), None);
        let load = m.take(t0 + Duration::from_millis(200)).unwrap();
        assert!((load.busy - 1.0).abs() < 1e-9, "{load:?}");
        assert_eq!(load.queue_delay, Duration::ZERO);
    }
}
