//! Failed authentications counted per source address and per user in fixed windows; past the
//! limit, that source or user is refused without a challenge until the window ends, so
//! guessing passwords costs an attacker time, not the server CPU.
//!
//! What counts as a failure is decided by the authenticator: only a wrong answer to a fresh
//! nonce that was issued to the very address answering (nonces are bound to the client's
//! address), so a datagram with a spoofed source or made-up credentials counts against no one.
//! A user's block does not apply to addresses that user authenticated from recently
//! ([`Throttle::succeeded`]): someone guessing bob's password from elsewhere cannot lock bob's
//! own phone out. Nor can one address lock a user out of new addresses (a phone that moved to
//! another network): an address that reaches the per-user limit for a user is refused for that
//! user itself, but adds at most a [`SOURCE_SHARE`]th of the limit to the user's own count, so
//! blocking the user everywhere takes guessing from several addresses. This is fail2ban's
//! per-address ban plus a per-user limit that, unlike a plain account lock-out, is no button
//! an attacker can press against the user from one address.
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
pub(crate) const KNOWN_SOURCE_MS: u64 = 24 * 3_600_000;

/// The share of `max_failures_per_user` one source address can add to a user's count (a
/// quarter, at least one failure): blocking a user takes failures from four addresses.
pub(crate) const SOURCE_SHARE: u32 = 4;

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
    /// Failures per (user, address) pair in the window: what each address added to a user.
    pairs: Windows<(Box<str>, IpAddr)>,
}

/// Failure counts and known sources, shared by the workers.
pub(super) struct Throttle {
    shards: Vec<Mutex<Shard>>,
    hasher: std::collections::hash_map::RandomState,
    per_source: u32,
    per_user: u32,
    window_ms: u64,
}

impl Throttle {
    /// `per_source` and `per_user` failures are allowed per `window_ms` (0: no limit); each
    /// table holds at most `capacity` entries.
    pub(super) fn new(per_source: u32, per_user: u32, window_ms: u64, capacity: usize) -> Throttle {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        Throttle {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        sources: Windows::new(per_shard),
                        users: Windows::new(per_shard),
                        known: Windows::new(per_shard),
                        pairs: Windows::new(per_shard),
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

    pub(crate) fn source_blocked(&self, ip: IpAddr, now_ms: u64) -> bool {
        self.per_source > 0
            && self
                .shard(ip)
                .sources
                .get(&ip, now_ms, self.window_ms)
                .is_some_and(|w| w.count >= self.per_source)
    }

    /// Whether `user` is refused from `ip`: too many failures for the user (from several
    /// addresses) or for the user from `ip`, and `ip` is not an address the user authenticated
    /// from recently.
    pub(crate) fn user_blocked(&self, user: &str, ip: IpAddr, now_ms: u64) -> bool {
        if self.per_user == 0 {
            return false;
        }
        let shard = self.shard(user);
        let pair = (Box::<str>::from(user), ip);
        let over = shard
            .users
            .get(user, now_ms, self.window_ms)
            .is_some_and(|w| w.count >= self.per_user)
            || shard
                .pairs
                .get(&pair, now_ms, self.window_ms)
                .is_some_and(|w| w.count >= self.per_user);
        over && shard.known.get(&pair, now_ms, KNOWN_SOURCE_MS).is_none()
    }

    /// Counts one failure of `user` from `ip`: against the source, and against the user while
    /// this source has added less than its share to the user's count.
    pub(super) fn fail(&self, ip: IpAddr, user: &str, now_ms: u64) {
        if self.per_source > 0 {
            self.shard(ip).sources.add(ip, now_ms, self.window_ms);
        }
        if self.per_user > 0 {
            let share = (self.per_user / SOURCE_SHARE).max(1);
            let mut shard = self.shard(user);
            let from_here = shard.pairs.add((user.into(), ip), now_ms, self.window_ms);
            if from_here <= share {
                shard.users.add(user.into(), now_ms, self.window_ms);
            }
        }
    }

    /// Remembers that `user` authenticated from `ip`: a block on the user does not apply there.
    pub(super) fn succeeded(&self, ip: IpAddr, user: &str, now_ms: u64) {
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
    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.sources.map.len() + s.users.map.len() + s.known.map.len() + s.pairs.map.len()
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
        assert!(
            t.user_blocked("alice", a, 2),
            "two failures for alice, from two addresses"
        );
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
        let (phone, attacker, other) = (ip("10.0.0.7"), ip("192.0.2.66"), ip("192.0.2.67"));
        t.succeeded(phone, "bob", 0);
        t.fail(attacker, "bob", 10);
        t.fail(other, "bob", 11);
        assert!(t.user_blocked("bob", attacker, 12));
        assert!(!t.user_blocked("bob", phone, 12), "bob's phone is known");
    }

    #[test]
    fn one_address_cannot_lock_a_user_out_of_new_addresses() {
        // The defaults: 30 per source, 10 per user. Ten wrong answers from the attacker's
        // address used to block alice from every address she had not authenticated from.
        let t = Throttle::new(30, 10, 60_000, 1000);
        let attacker = ip("192.0.2.66");
        for i in 0..29 {
            t.fail(attacker, "alice", i);
        }
        let new_network = ip("198.51.100.7");
        assert!(
            !t.user_blocked("alice", new_network, 30),
            "one address locked alice out"
        );
        assert!(
            t.user_blocked("alice", attacker, 30),
            "the guesser is refused for alice"
        );
        assert!(!t.user_blocked("bob", attacker, 30), "but not for bob");
        assert!(!t.source_blocked(attacker, 30));
        t.fail(attacker, "alice", 30);
        assert!(
            t.source_blocked(attacker, 31),
            "the guesser meets the per-source limit"
        );
        // Guessing spread over four addresses (a quarter of the limit each) blocks the user.
        for n in 1..=3u8 {
            let from = IpAddr::from([192, 0, 2, 100 + n]);
            for i in 0..3u64 {
                t.fail(from, "alice", 40 + i);
            }
        }
        assert!(
            !t.user_blocked("alice", new_network, 50),
            "8 of 10 counted so far"
        );
        t.fail(ip("192.0.2.110"), "alice", 51);
        t.fail(ip("192.0.2.111"), "alice", 52);
        assert!(t.user_blocked("alice", new_network, 53));
    }

    #[test]
    fn a_flood_of_names_stays_within_capacity() {
        let t = Throttle::new(0, 5, 60_000, 1_600);
        let attacker = ip("192.0.2.1");
        for i in 0..200_000u32 {
            t.fail(attacker, &format!("user{i}"), u64::from(i) / 10);
        }
        // 16 shards of 100 per table (users, and what each address added): the tables never
        // grow past their capacity.
        assert!(t.len() <= 2 * 1_600, "{}", t.len());
        // The newest names are still counted; the oldest were forgotten first.
        for n in 1..=4u8 {
            t.fail(IpAddr::from([192, 0, 2, 10 + n]), "user199999", 20_000);
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
