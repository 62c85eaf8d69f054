//! Failed authentications counted per source address and per user in fixed windows; past
//! the limit, that source or user is refused without a challenge until the window ends, so
//! guessing passwords costs an attacker time, not the server CPU. Per worker (a source's
//! requests usually reach one worker), with the limits split between workers like the
//! connection limits; memory is bounded by pruning windows that have ended.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;

#[derive(Clone, Copy)]
struct Window {
    start_ms: u64,
    failures: u32,
}

struct Counter<K> {
    windows: HashMap<K, Window>,
    limit: u32,
}

impl<K: Hash + Eq> Counter<K> {
    fn blocked(&self, key: &K, now_ms: u64, window_ms: u64) -> bool {
        self.limit > 0
            && self
                .windows
                .get(key)
                .is_some_and(|w| now_ms < w.start_ms + window_ms && w.failures >= self.limit)
    }

    fn fail(&mut self, key: K, now_ms: u64, window_ms: u64) {
        if self.limit == 0 {
            return;
        }
        if self.windows.len() >= 100_000 {
            self.windows.retain(|_, w| now_ms < w.start_ms + window_ms);
        }
        let w = self.windows.entry(key).or_insert(Window {
            start_ms: now_ms,
            failures: 0,
        });
        if now_ms >= w.start_ms + window_ms {
            *w = Window {
                start_ms: now_ms,
                failures: 0,
            };
        }
        w.failures = w.failures.saturating_add(1);
    }
}

/// Failure counts for one worker.
pub struct Throttle {
    sources: Counter<IpAddr>,
    users: Counter<Box<str>>,
    window_ms: u64,
}

impl Throttle {
    /// `per_source` and `per_user` failures are allowed per `window_ms` (0: no limit).
    pub fn new(per_source: u32, per_user: u32, window_ms: u64) -> Throttle {
        Throttle {
            sources: Counter {
                windows: HashMap::new(),
                limit: per_source,
            },
            users: Counter {
                windows: HashMap::new(),
                limit: per_user,
            },
            window_ms,
        }
    }

    pub fn source_blocked(&self, ip: IpAddr, now_ms: u64) -> bool {
        self.sources.blocked(&ip, now_ms, self.window_ms)
    }

    pub fn user_blocked(&self, user: &str, now_ms: u64) -> bool {
        self.users.blocked(&Box::from(user), now_ms, self.window_ms)
    }

    /// Counts one failure of `user` from `ip`.
    pub fn fail(&mut self, ip: IpAddr, user: &str, now_ms: u64) {
        self.sources.fail(ip, now_ms, self.window_ms);
        self.users.fail(user.into(), now_ms, self.window_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_hold_for_their_window_then_lift() {
        let mut t = Throttle::new(3, 2, 1000);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        t.fail(a, "alice", 0);
        assert!(!t.source_blocked(a, 1) && !t.user_blocked("alice", 1));
        t.fail(b, "alice", 1);
        assert!(t.user_blocked("alice", 2), "two failures for alice");
        assert!(!t.user_blocked("bob", 2));
        t.fail(a, "bob", 2);
        t.fail(a, "carol", 3);
        assert!(t.source_blocked(a, 4) && !t.source_blocked(b, 4));
        assert!(!t.source_blocked(a, 1000) && !t.user_blocked("alice", 1001));
        let off = Throttle::new(0, 0, 1000);
        assert!(!off.source_blocked(a, 0));
    }
}
