//! The proxy's Proxychain credential cache: one hash chain per user (and the next one when it
//! was prefetched), shared by the workers, bounded in memory, evicting the least used entry
//! when full.
//!
//! Sixteen shards, each a slab of entries indexed by a `hashbrown::HashTable` of 4-byte slot
//! numbers, so the user's name is stored once and an entry costs its chain plus a few bytes
//! of index (`bytes_per_credential` reports it; the bar is 1,000,000 credentials in under
//! 200 MB). Eviction is least-frequently-used by sampling: when the cache is full, the entry
//! with the fewest uses among a few of the inserting shard's, from a random place, makes room,
//! as Redis approximates LFU; an exact LFU would need an ordered structure touched on every
//! call.

use hashbrown::HashTable;
use sip_core::proxychain::Chain;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

const SHARDS: usize = 16;
/// Entries compared when choosing one to evict.
const EVICTION_SAMPLE: usize = 8;

/// One user's credentials.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The chain authentications step down.
    pub chain: Chain,
    /// Unix seconds after which the chain is not used; 0: never (a backup credential).
    pub(crate) expires_s: u64,
    /// A chain fetched ahead of need, used when `chain` runs out or expires.
    pub next: Option<Box<(Chain, u64)>>,
    /// Authentications since the entry was made: what eviction keeps.
    pub uses: u32,
    /// Unix seconds (low 32 bits) when `chain` last replaced another chain: a response
    /// computed for the old one may still be on its way (see [`Entry::recently_replaced`]).
    pub(crate) replaced_at_s: u32,
}

impl Entry {
    /// An entry holding `chain`, unusable after `expires_s` (Unix s; 0: never), with no prefetched
    /// chain and no uses.
    pub fn new(chain: Chain, expires_s: u64) -> Entry {
        Entry {
            chain,
            expires_s,
            next: None,
            uses: 0,
            replaced_at_s: 0,
        }
    }

    /// Installs `chain` in place of the current one.
    pub fn replace(&mut self, chain: Chain, expires_s: u64, now_s: u64) {
        self.chain = chain;
        self.expires_s = expires_s;
        self.replaced_at_s = now_s as u32;
    }

    /// The chain replaced another within `window_s`: a response whose proof fails may have
    /// been made, honestly, for the old chain's challenge (another call of the same user
    /// spent the old chain first), so it earns a fresh challenge, not a 403.
    pub(crate) fn recently_replaced(&self, now_s: u64, window_s: u32) -> bool {
        self.replaced_at_s != 0 && (now_s as u32).wrapping_sub(self.replaced_at_s) <= window_s
    }

    /// The chain has values left and has not expired at `now_s`.
    pub fn live(&self, now_s: u64) -> bool {
        self.chain.counter > 0 && (self.expires_s == 0 || now_s < self.expires_s)
    }

    /// Moves to the prefetched chain when the current one is spent; true when a live chain
    /// is left.
    pub fn refresh(&mut self, now_s: u64) -> bool {
        if !self.live(now_s) {
            if let Some(next) = self.next.take() {
                self.replace(next.0, next.1, now_s);
            }
        }
        self.live(now_s)
    }
}

struct Slot {
    user: Box<str>,
    entry: Entry,
}

#[derive(Default)]
struct Shard {
    slots: Vec<Slot>,
    index: HashTable<u32>,
    /// xorshift state for eviction samples.
    rng: u64,
}

/// The cache.
pub struct ChainCache {
    shards: Vec<Mutex<Shard>>,
    capacity: usize,
    /// Entries in all shards: the bound is on the total, since users do not spread over
    /// the shards exactly evenly.
    len: AtomicUsize,
    hasher: std::collections::hash_map::RandomState,
}

impl ChainCache {
    /// A cache of `capacity` users. (It may hold a few more: an insertion into a shard with
    /// nothing to evict goes over by one.)
    pub fn new(capacity: usize) -> ChainCache {
        ChainCache {
            shards: (0..SHARDS)
                .map(|i| {
                    Mutex::new(Shard {
                        rng: 0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1),
                        ..Shard::default()
                    })
                })
                .collect(),
            capacity: capacity.max(1),
            len: AtomicUsize::new(0),
            hasher: Default::default(),
        }
    }

    fn hash(&self, user: &str) -> u64 {
        self.hasher.hash_one(user)
    }

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, Shard> {
        // The top bits pick the shard; hashbrown uses the low ones inside it.
        self.shards[(hash >> 60) as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the user's entry, if there is one.
    pub fn with<R>(&self, user: &str, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        let hash = self.hash(user);
        let mut shard = self.shard(hash);
        let Shard { slots, index, .. } = &mut *shard;
        let i = *index.find(hash, |&i| &*slots[i as usize].user == user)?;
        Some(f(&mut slots[i as usize].entry))
    }

    /// Installs a chain for `user`: replaces a spent or missing one, or is kept as the next
    /// one while the current chain is live. Evicts the least used of a sample when full.
    pub fn install(&self, user: &str, chain: Chain, expires_s: u64, now_s: u64) {
        let hash = self.hash(user);
        let mut shard = self.shard(hash);
        let shard = &mut *shard;
        if let Some(&i) = shard
            .index
            .find(hash, |&i| &*shard.slots[i as usize].user == user)
        {
            let e = &mut shard.slots[i as usize].entry;
            if e.live(now_s) {
                e.next = Some(Box::new((chain, expires_s)));
            } else {
                e.replace(chain, expires_s, now_s);
                e.next = None;
            }
            return;
        }
        if self.len.load(Ordering::Relaxed) >= self.capacity {
            self.evict_one(shard);
        }
        self.len.fetch_add(1, Ordering::Relaxed);
        let i = shard.slots.len() as u32;
        shard.slots.push(Slot {
            user: user.into(),
            entry: Entry::new(chain, expires_s),
        });
        let hasher = &self.hasher;
        let slots = &shard.slots;
        shard
            .index
            .insert_unique(hash, i, |&j| hasher.hash_one(&*slots[j as usize].user));
    }

    /// Drops the user's chains (revoked); true when there were some.
    pub fn remove(&self, user: &str) -> bool {
        let hash = self.hash(user);
        let mut shard = self.shard(hash);
        let found = shard
            .index
            .find(hash, |&i| &*shard.slots[i as usize].user == user)
            .copied();
        match found {
            Some(i) => {
                self.remove_slot(&mut shard, i);
                true
            }
            None => false,
        }
    }

    fn evict_one(&self, shard: &mut Shard) {
        let n = shard.slots.len();
        if n == 0 {
            return;
        }
        // A window of slots from a random start: no slot is looked at twice, and slots are
        // in no useful order (removals move the last slot into the gap).
        shard.rng ^= shard.rng << 13;
        shard.rng ^= shard.rng >> 7;
        shard.rng ^= shard.rng << 17;
        let start = (shard.rng % n as u64) as usize;
        let mut victim = 0u32;
        let mut fewest = u32::MAX;
        for k in 0..EVICTION_SAMPLE.min(n) {
            let i = ((start + k) % n) as u32;
            let uses = shard.slots[i as usize].entry.uses;
            if uses < fewest {
                (victim, fewest) = (i, uses);
            }
        }
        self.remove_slot(shard, victim);
    }

    /// Removes slot `i`, moving the last slot into its place.
    fn remove_slot(&self, shard: &mut Shard, i: u32) {
        let hash_of = |user: &str| self.hasher.hash_one(user);
        let gone = hash_of(&shard.slots[i as usize].user);
        if let Ok(e) = shard.index.find_entry(gone, |&j| j == i) {
            e.remove();
        }
        let last = shard.slots.len() as u32 - 1;
        if i != last {
            let moved = hash_of(&shard.slots[last as usize].user);
            if let Some(j) = shard.index.find_mut(moved, |&j| j == last) {
                *j = i;
            }
        }
        shard.slots.swap_remove(i as usize);
        self.len.fetch_sub(1, Ordering::Relaxed);
    }

    /// Credentials held.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether no credential is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Memory held per cached credential, in bytes: the slab slot, the index slot, and the
    /// name's heap allocation rounded as malloc rounds it (prefetched next chains, held only
    /// near the end of a chain, are not counted).
    pub fn bytes_per_credential(&self, typical_name_len: usize) -> usize {
        let slot = size_of::<Slot>();
        // hashbrown: one u32 and one control byte per bucket, buckets at most 7/8 full.
        let index = (size_of::<u32>() + 1) * 8 / 7;
        let name = (typical_name_len + 8).div_ceil(16) * 16;
        slot + index + name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sip_core::proxychain::{issue, HashKind};

    fn chain(length: u32, seed: u8) -> Chain {
        issue(
            HashKind::Sha256,
            &[seed; 32],
            "p",
            length,
            [seed; 16],
            [seed; 16],
        )
        .into()
    }

    #[test]
    fn installs_finds_and_removes() {
        let c = ChainCache::new(100);
        c.install("alice", chain(10, 1), 0, 0);
        c.install("bob", chain(10, 2), 0, 0);
        assert_eq!(c.len(), 2);
        assert_eq!(c.with("alice", |e| e.chain.n_da), Some([1; 16]));
        assert!(c.remove("alice"));
        assert!(!c.remove("alice"));
        assert_eq!(c.with("alice", |_| ()), None);
        assert_eq!(c.with("bob", |e| e.chain.n_da), Some([2; 16]));
    }

    #[test]
    fn a_chain_installed_over_a_live_one_waits_as_the_next() {
        let c = ChainCache::new(100);
        c.install("alice", chain(1, 1), 100, 0);
        c.install("alice", chain(10, 2), 200, 0);
        assert_eq!(c.with("alice", |e| e.chain.n_da), Some([1; 16]));
        // Spend the first chain: the next takes its place.
        c.with("alice", |e| e.chain.counter = 0);
        assert_eq!(
            c.with("alice", |e| (e.refresh(50), e.chain.n_da, e.expires_s)),
            Some((true, [2; 16], 200))
        );
        // Expiry counts as spent; with no next chain nothing is live.
        assert_eq!(c.with("alice", |e| e.refresh(200)), Some(false));
    }

    #[test]
    fn when_full_the_least_used_are_evicted_and_the_index_stays_true() {
        let c = ChainCache::new(SHARDS * 8);
        for i in 0..SHARDS * 8 {
            c.install(&format!("busy{i}"), chain(5, 1), 0, 0);
            c.with(&format!("busy{i}"), |e| e.uses = 100);
        }
        for i in 0..2000 {
            c.install(&format!("once{i}"), chain(5, 2), 0, 0);
        }
        let len = c.len();
        assert!(
            (SHARDS * 8..SHARDS * 9).contains(&len),
            "full, and not much more: {len}"
        );
        let busy_left = (0..SHARDS * 8)
            .filter(|i| c.with(&format!("busy{i}"), |_| ()).is_some())
            .count();
        // Random eviction would leave almost none after 2,000 inserts; sampled eviction keeps
        // about 100 of 128 (over 3,000 runs: median 102, lowest 94 — the first newcomer in each
        // shard must evict a busy entry, and the hash spreads users unevenly over shards).
        assert!(
            busy_left > SHARDS * 8 / 2,
            "frequently used entries survive: {busy_left} of {}",
            SHARDS * 8
        );
        // Every entry the index names is the entry for that name.
        for i in 0..2000 {
            let name = format!("once{i}");
            if let Some(n_da) = c.with(&name, |e| e.chain.n_da) {
                assert_eq!(n_da, [2; 16]);
            }
        }
    }
}
