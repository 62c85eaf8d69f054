//! A worker's busy fraction, the load signal of overload control (`engine::overload`): the
//! share of each interval the worker was not blocked in `epoll_wait` waiting for work (nor
//! sleeping on purpose to batch, `serve::coalesce`). Two clock reads per loop pass.

use std::time::{Duration, Instant};

/// Measures one worker's busy fraction over fixed intervals.
#[derive(Debug)]
pub struct BusyMeter {
    interval: Duration,
    start: Instant,
    idle: Duration,
}

impl BusyMeter {
    pub fn new(interval: Duration, now: Instant) -> BusyMeter {
        BusyMeter {
            interval,
            start: now,
            idle: Duration::ZERO,
        }
    }

    /// The worker spent `d` waiting.
    pub fn idle(&mut self, d: Duration) {
        self.idle += d;
    }

    /// Once an interval has passed: the busy share of it, and the next one begins.
    pub fn take(&mut self, now: Instant) -> Option<f64> {
        let wall = now.saturating_duration_since(self.start);
        if wall < self.interval {
            return None;
        }
        let busy = 1.0 - self.idle.as_secs_f64() / wall.as_secs_f64();
        self.start = now;
        self.idle = Duration::ZERO;
        Some(busy.clamp(0.0, 1.0))
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
        let busy = m.take(t0 + Duration::from_millis(100)).unwrap();
        assert!((busy - 0.5).abs() < 1e-9, "{busy}");
        // The next interval starts afresh.
        assert_eq!(m.take(t0 + Duration::from_millis(150)), None);
        let busy = m.take(t0 + Duration::from_millis(200)).unwrap();
        assert!((busy - 1.0).abs() < 1e-9, "{busy}");
    }
}
