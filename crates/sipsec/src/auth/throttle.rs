//! Failed authentications counted per source address and per user in fixed windows; past the
//! limit, that source or user is refused without a challenge until the window ends, so
//! guessing passwords costs an attacker time, not the server CPU.
//!
//! What counts as a failure is decided by the authenticator: only a wrong answer to a fresh
//! nonce that was issued to the very address answering (nonces are bound to the client's
//! address), so a datagram with a spoofed source or made-up credentials counts against no one.
//! A user's block does not apply to addresses that user authenticated from recently
//! ([`Throttle::succeeded`]): someone guessing bob's password from elsewhere cannot lock bob's
//! own phone out. This is fail2ban's per-address ban plus a per-user limit that, unlike a plain
//! account lock-out, is no button an attacker can press against the user.
//!
//! Shared by the workers (the limits mean what they say however the kernel spreads sources
//! over workers) and sharded so they rarely meet on a lock; only requests carrying credentials
//! touch it. Every table is bounded, and each event costs O(1) amortised: entries are kept in
//! the order their windows began, so expiry only looks at the front, and a full table forgets
//! its oldest entry.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};
use std::net::IpAddr;
use std::sync::Mutex;

const SHARDS: usize = 16;

/// How long a successful authentication makes its source address known for the user.
pub const KNOWN_SOURCE_MS: u64 = 24 * 3_600_000;

#[derive(Clone, Copy)]
struct Window {
    start_ms: u64,
    count: u32,
}

/// Windows per key, bounded, in the order they began.
struct Windows<K> {
    map: HashMap<K, Window>,
    order: VecDeque<(K, u64)>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone> Windows<K> {
    fn new(capacity: usize) -> Self {
        Windows {
            map: HashMap::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// The live window of `key`, if any.
    fn get<Q>(&self, key: &Q, now_ms: u64, length_ms: u64) -> Option<Window>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map
            .get(key)
            .filter(|w| now_ms < w.start_ms.saturating_add(length_ms))
            .copied()
    }

    /// Drops the windows that ended, and the oldest ones while the table is full.
    fn prune(&mut self, now_ms: u64, length_ms: u64) {
        while let Some((key, start)) = self.order.front() {
            let ended = start.saturating_add(length_ms) <= now_ms;
            if !ended && self.map.len() < self.capacity {
                break;
            }
            // A key whose window restarted has a later entry further back: only the entry
            // matching its current window removes it.
            if self.map.get(key).is_some_and(|w| w.start_ms == *start) {
                self.map.remove(key);
            }
            self.order.pop_front();
        }
    }

    /// Adds one to `key`'s window, starting a new window if it has none; returns the count.
    fn add(&mut self, key: K, now_ms: u64, length_ms: u64) -> u32 {
        self.prune(now_ms, length_ms);
        if let Some(w) = self.map.get_mut(&key) {
            if now_ms < w.start_ms.saturating_add(length_ms) {
                w.count = w.count.saturating_add(1);
                return w.count;
            }
        }
        self.map.insert(
            key.clone(),
            Window {
                start_ms: now_ms,
                count: 1,
            },
        );
        self.order.push_back((key, now_ms));
        1
    }
}

struct Shard {
    sources: Windows<IpAddr>,
    users: Windows<Box<str>>,
    /// (user, address) pairs that authenticated within [`KNOWN_SOURCE_MS`].
    known: Windows<(Box<str>, IpAddr)>,
}

/// Failure counts and known sources, shared by the workers.
pub struct Throttle {
    shards: Vec<Mutex<Shard>>,
    hasher: std::collections::hash_map::RandomState,
    per_source: u32,
    per_user: u32,
    window_ms: u64,
}

impl Throttle {
    /// `per_source` and `per_user` failures are allowed per `window_ms` (0: no limit); each
    /// table holds at most `capacity` entries.
    pub fn new(per_source: u32, per_user: u32, window_ms: u64, capacity: usize) -> Throttle {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        Throttle {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        sources: Windows::new(per_shard),
                        users: Windows::new(per_shard),
                        known: Windows::new(per_shard),
                    })
                })
                .collect(),
            hasher: Default::default(),
            per_source,
            per_user,
            window_ms,
        }
    }

    fn shard(&self, key: impl Hash) -> std::sync::MutexGuard<'_, Shard> {
        let i = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn source_blocked(&self, ip: IpAddr, now_ms: u64) -> bool {
        self.per_source > 0
            && self
                .shard(ip)
                .sources
                .get(&ip, now_ms, self.window_ms)
                .is_some_and(|w| w.count >= self.per_source)
    }

    /// Whether `user` is refused from `ip`: too many failures, and `ip` is not an address the
    /// user authenticated from recently.
    pub fn user_blocked(&self, user: &str, ip: IpAddr, now_ms: u64) -> bool {
        if self.per_user == 0 {
            return false;
        }
        let shard = self.shard(user);
        let over = shard
            .users
            .get(user, now_ms, self.window_ms)
            .is_some_and(|w| w.count >= self.per_user);
        over && shard
            .known
            .get(&(user.into(), ip), now_ms, KNOWN_SOURCE_MS)
            .is_none()
    }

    /// Counts one failure of `user` from `ip`.
    pub fn fail(&self, ip: IpAddr, user: &str, now_ms: u64) {
        if self.per_source > 0 {
            self.shard(ip).sources.add(ip, now_ms, self.window_ms);
        }
        if self.per_user > 0 {
            self.shard(user)
                .users
                .add(user.into(), now_ms, self.window_ms);
        }
    }

    /// Remembers that `user` authenticated from `ip`: a block on the user does not apply there.
    pub fn succeeded(&self, ip: IpAddr, user: &str, now_ms: u64) {
        if self.per_user == 0 {
            return;
        }
        let mut shard = self.shard(user);
        let key = (Box::<str>::from(user), ip);
        if shard.known.get(&key, now_ms, KNOWN_SOURCE_MS).is_none() {
            shard.known.add(key, now_ms, KNOWN_SOURCE_MS);
        }
    }

    /// Entries held in all tables.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.sources.map.len() + s.users.map.len() + s.known.map.len()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn limits_hold_for_their_window_then_lift() {
        let t = Throttle::new(3, 2, 1000, 1000);
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        t.fail(a, "alice", 0);
        assert!(!t.source_blocked(a, 1) && !t.user_blocked("alice", b, 1));
        t.fail(b, "alice", 1);
        assert!(t.user_blocked("alice", a, 2), "two failures for alice");
        assert!(!t.user_blocked("bob", a, 2));
        t.fail(a, "bob", 2);
        t.fail(a, "carol", 3);
        assert!(t.source_blocked(a, 4) && !t.source_blocked(b, 4));
        assert!(!t.source_blocked(a, 1000) && !t.user_blocked("alice", a, 1001));
        let off = Throttle::new(0, 0, 1000, 1000);
        off.fail(a, "alice", 0);
        assert!(!off.source_blocked(a, 0) && !off.user_blocked("alice", a, 0));
    }

    #[test]
    fn a_blocked_user_still_gets_in_from_where_it_authenticated_before() {
        let t = Throttle::new(100, 2, 60_000, 1000);
        let (phone, attacker) = (ip("10.0.0.7"), ip("192.0.2.66"));
        t.succeeded(phone, "bob", 0);
        t.fail(attacker, "bob", 10);
        t.fail(attacker, "bob", 11);
        assert!(t.user_blocked("bob", attacker, 12));
        assert!(!t.user_blocked("bob", phone, 12), "bob's phone is known");
    }

    #[test]
    fn a_flood_of_names_stays_within_capacity() {
        let t = Throttle::new(0, 5, 60_000, 1_600);
        let attacker = ip("192.0.2.1");
        for i in 0..200_000u32 {
            t.fail(attacker, &format!("user{i}"), u64::from(i) / 10);
        }
        // 16 shards of 100: the table never grows past its capacity.
        assert!(t.len() <= 1_600, "{}", t.len());
        // The newest names are still counted; the oldest were forgotten first.
        for _ in 0..4 {
            t.fail(attacker, "user199999", 20_000);
        }
        assert!(t.user_blocked("user199999", attacker, 20_000));
        assert!(!t.user_blocked("user0", attacker, 20_000));
    }

    #[test]
    fn windows_that_restart_are_not_dropped_by_their_old_entry() {
        let t = Throttle::new(2, 0, 100, 1000);
        let a = ip("10.0.0.1");
        t.fail(a, "x", 0);
        // A new window for the same source begins at 150; the entry of the first window is
        // pruned at 250 without taking the new window with it.
        t.fail(a, "x", 150);
        t.fail(a, "x", 240);
        t.fail(ip("10.0.0.2"), "x", 245);
        assert!(t.source_blocked(a, 245));
    }
}
