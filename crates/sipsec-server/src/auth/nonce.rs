//! Digest nonces that need no table: a nonce is the time it was issued, a per-worker counter
//! and an HMAC-SHA256 of both and of the client's address under a secret made at start, so any
//! worker can check any nonce, a nonce is good only from the address it was sent to (a
//! spoofed datagram cannot answer one; Kamailio's `auth_checks` source-IP check), and nothing
//! can run out under load (OpenSIPS's fixed nonce table did, seeds 000 and
//! 004). Only nonces actually used are remembered, with the nonce counts seen, to refuse
//! replays; that memory is bounded and forgets a nonce when it expires.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;

/// Bytes of MAC kept in a nonce.
const MAC_LEN: usize = 16;
/// Hex characters of a nonce: issue time (8 bytes), counter (8 bytes), MAC.
pub(crate) const NONCE_HEX_LEN: usize = 2 * (8 + 8 + MAC_LEN);

/// What a nonce turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonceState {
    /// Ours and fresh; `id` names it for replay tracking, `issued_ms` is when it was made.
    Fresh {
        /// The nonce's MAC, unique to it: the key its counts are kept under.
        id: [u8; MAC_LEN],
        /// When the nonce was made, in ms since the Unix epoch.
        issued_ms: u64,
    },
    /// Ours but older than the nonce lifetime (answered `stale=true`).
    Stale,
    /// Not a nonce we made (or made before a restart).
    Unknown,
}

/// Makes and checks nonces under one secret.
pub struct Nonces {
    secret: [u8; 32],
    lifetime_ms: u64,
}

/// Decodes a nonce's hex: lower case only, as this server writes it.
fn unhex(text: &[u8], out: &mut [u8]) -> bool {
    !text.iter().any(u8::is_ascii_uppercase) && sip_core::hex::decode(text, out)
}

impl Nonces {
    /// Nonces MACed under `secret` (the server draws one at each start), fresh for `lifetime_ms`
    /// after they are made.
    pub fn new(secret: [u8; 32], lifetime_ms: u64) -> Nonces {
        Nonces {
            secret,
            lifetime_ms,
        }
    }

    fn mac(&self, body: &[u8; 16], client: IpAddr) -> [u8; MAC_LEN] {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.secret).expect("any key length works");
        m.update(body);
        let client = match client {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        m.update(&client.octets());
        let full = m.finalize().into_bytes();
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&full[..MAC_LEN]);
        out
    }

    /// A new nonce for `client`, issued at `now_ms` (Unix time); `counter` makes nonces issued
    /// in the same millisecond differ (callers pass a per-worker count with the worker in its
    /// high bits).
    pub fn issue(&self, now_ms: u64, counter: u64, client: IpAddr) -> String {
        let mut body = [0u8; 16];
        body[..8].copy_from_slice(&now_ms.to_be_bytes());
        body[8..].copy_from_slice(&counter.to_be_bytes());
        let mut out = String::with_capacity(NONCE_HEX_LEN);
        sip_core::hex::push(&body, &mut out);
        sip_core::hex::push(&self.mac(&body, client), &mut out);
        out
    }

    /// Checks a nonce `client` returned.
    pub fn check(&self, nonce: &[u8], now_ms: u64, client: IpAddr) -> NonceState {
        let mut raw = [0u8; 16 + MAC_LEN];
        if !unhex(nonce, &mut raw) {
            return NonceState::Unknown;
        }
        let body: [u8; 16] = raw[..16].try_into().expect("16 bytes");
        let mac = self.mac(&body, client);
        // Constant time: a forger learns nothing from how long the refusal took.
        if !bool::from(subtle::ConstantTimeEq::ct_eq(&mac[..], &raw[16..])) {
            return NonceState::Unknown;
        }
        let issued_ms = u64::from_be_bytes(body[..8].try_into().expect("8 bytes"));
        // A nonce may come back up to a second "from the future" (another worker's clock read
        // a little later than ours): its age is then zero, not a wrapped subtraction.
        if issued_ms > now_ms.saturating_add(1_000)
            || now_ms.saturating_sub(issued_ms) > self.lifetime_ms
        {
            return NonceState::Stale;
        }
        NonceState::Fresh { id: mac, issued_ms }
    }
}

/// Nonce counts seen per nonce (RFC 7616 §3.4: a repeated `nc` is a replay). Shared by the
/// workers, sharded so they rarely meet on a lock.
pub struct NonceCounts {
    shards: Vec<Mutex<Shard>>,
    /// Nonces remembered per shard; beyond it the oldest is forgotten early, and every nonce
    /// issued no later than it is then answered `stale=true` (the client retries at once with
    /// a new nonce), so forgetting never reopens a replay.
    per_shard: usize,
    lifetime_ms: u64,
}

#[derive(Default)]
struct Shard {
    seen: HashMap<[u8; MAC_LEN], Seen>,
    /// Nonces in the order first used, with when they were issued.
    order: VecDeque<([u8; MAC_LEN], u64)>,
    /// Nonces issued at or before this time may have been forgotten early.
    horizon_ms: u64,
}

/// The highest count used with a nonce, and which of the 64 below it were used too (UDP
/// may reorder requests).
#[derive(Clone, Copy)]
struct Seen {
    highest: u32,
    window: u64,
}

/// Whether a count was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// The count is new for this nonce.
    Accepted,
    /// Used before with this nonce.
    Replay,
    /// The nonce may have been forgotten under memory pressure: ask for a new one.
    Forgotten,
}

impl NonceCounts {
    /// Room for `capacity` nonces in all, each remembered until `lifetime_ms` after it was issued.
    pub fn new(capacity: usize, lifetime_ms: u64) -> NonceCounts {
        let shards = 16;
        let per_shard = capacity.div_ceil(shards).max(1);
        NonceCounts {
            shards: (0..shards)
                .map(|_| {
                    Mutex::new(Shard {
                        // Room for twice the most it holds: a full shard churns (one nonce
                        // in, the oldest out), and a hash table more than half full whose
                        // deleted slots run out doubles instead of rehashing in place — once,
                        // after some ten million nonces, by 16 × 4 MB: the soak's memory step
                        // (BENCHMARKS.md). Sized so, it only ever rehashes in place.
                        seen: HashMap::with_capacity(2 * per_shard),
                        order: VecDeque::with_capacity(per_shard),
                        horizon_ms: 0,
                    })
                })
                .collect(),
            per_shard,
            lifetime_ms,
        }
    }

    /// Records count `nc` of nonce `id`, issued at `issued_ms`.
    pub(crate) fn use_count(
        &self,
        id: [u8; MAC_LEN],
        issued_ms: u64,
        nc: u32,
        now_ms: u64,
    ) -> Count {
        let shard = &self.shards[id[0] as usize % self.shards.len()];
        let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(&(old, issued)) = s.order.front() {
            let expired = issued + self.lifetime_ms <= now_ms;
            if !expired && s.seen.len() < self.per_shard {
                break;
            }
            if !expired {
                s.horizon_ms = s.horizon_ms.max(issued);
            }
            s.order.pop_front();
            s.seen.remove(&old);
        }
        let horizon = s.horizon_ms;
        match s.seen.get_mut(&id) {
            None if issued_ms <= horizon => Count::Forgotten,
            None => {
                s.seen.insert(
                    id,
                    Seen {
                        highest: nc,
                        window: 1,
                    },
                );
                s.order.push_back((id, issued_ms));
                Count::Accepted
            }
            Some(seen) if nc > seen.highest => {
                let shift = nc - seen.highest;
                seen.window = if shift >= 64 {
                    1
                } else {
                    seen.window << shift | 1
                };
                seen.highest = nc;
                Count::Accepted
            }
            Some(seen) => {
                let back = seen.highest - nc;
                if back >= 64 || seen.window & (1 << back) != 0 {
                    return Count::Replay;
                }
                seen.window |= 1 << back;
                Count::Accepted
            }
        }
    }

    /// Nonces remembered now (for the memory report).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |s| s.seen.len()))
            .sum()
    }

    /// Whether no nonce is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table takes its memory once, when made, and a full table under churn never asks
    /// for more (before, each shard's map doubled once after enough churn, long after the
    /// table had filled: the soak's memory step).
    #[test]
    fn the_table_is_allocated_once_and_never_grows() {
        let counts = NonceCounts::new(16 * 1_000, 300_000);
        // What each map can hold without allocating (less its deleted slots: it falls as they
        // accumulate and comes back when the map rehashes in place). Growing would raise it.
        let capacities = |c: &NonceCounts| -> Vec<usize> {
            c.shards
                .iter()
                .map(|s| s.lock().unwrap().seen.capacity())
                .collect()
        };
        let allocated = capacities(&counts);
        assert!(allocated.iter().all(|&c| c >= 2 * 1_000), "{allocated:?}");
        let mut id = [0u8; MAC_LEN];
        for n in 0u64..3_000_000 {
            // Spread over the shards, every nonce new, issued one after another (none older
            // than what was forgotten) and none expired: the table fills, then forgets its
            // oldest for each.
            id[..8].copy_from_slice(&n.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
            let at = 1_000 + n;
            assert_eq!(counts.use_count(id, at, 1, at), Count::Accepted);
            if n % 10_000 == 0 {
                for (now, first) in capacities(&counts).iter().zip(&allocated) {
                    assert!(now <= first, "a shard's map grew: {now} > {first}");
                }
            }
        }
        assert_eq!(counts.len(), 16 * 1_000);
    }

    #[test]
    fn nonces_check_out_until_they_expire_and_forgeries_do_not() {
        let n = Nonces::new([7; 32], 30_000);
        let (client, other_client): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let nonce = n.issue(1_000_000, 5, client);
        assert_eq!(nonce.len(), NONCE_HEX_LEN);
        assert!(matches!(
            n.check(nonce.as_bytes(), 1_010_000, client),
            NonceState::Fresh {
                issued_ms: 1_000_000,
                ..
            }
        ));
        assert_eq!(
            n.check(nonce.as_bytes(), 1_030_001, client),
            NonceState::Stale
        );
        // From another address, another secret (a restart), a changed time, garbage: not ours.
        assert_eq!(
            n.check(nonce.as_bytes(), 1_010_000, other_client),
            NonceState::Unknown
        );
        let other = Nonces::new([8; 32], 30_000);
        assert_eq!(
            other.check(nonce.as_bytes(), 1_000_000, client),
            NonceState::Unknown
        );
        let mut forged = nonce.clone().into_bytes();
        forged[15] = if forged[15] == b'0' { b'1' } else { b'0' };
        assert_eq!(n.check(&forged, 1_000_000, client), NonceState::Unknown);
        assert_eq!(n.check(b"zz", 1_000_000, client), NonceState::Unknown);
        assert_eq!(
            n.check("é".repeat(32).as_bytes(), 1, client),
            NonceState::Unknown
        );
        // Issued up to a second after `now` (another worker read the clock later): fresh, not
        // an underflow (a panic in debug and fuzz builds, "stale" in release); later: stale.
        assert!(matches!(
            n.check(nonce.as_bytes(), 999_500, client),
            NonceState::Fresh { .. }
        ));
        assert_eq!(
            n.check(nonce.as_bytes(), 998_999, client),
            NonceState::Stale
        );
        // Two nonces in one millisecond differ.
        assert_ne!(n.issue(1, 1, client), n.issue(1, 2, client));
    }

    #[test]
    fn counts_refuse_replays_and_accept_reordering() {
        let c = NonceCounts::new(1000, 100);
        let id = [1; MAC_LEN];
        assert_eq!(c.use_count(id, 1, 1, 1), Count::Accepted);
        assert_eq!(c.use_count(id, 1, 1, 1), Count::Replay);
        assert_eq!(c.use_count(id, 1, 3, 1), Count::Accepted);
        // 2 arrives late: still unused, so accepted once.
        assert_eq!(c.use_count(id, 1, 2, 1), Count::Accepted);
        assert_eq!(c.use_count(id, 1, 2, 1), Count::Replay);
        assert_eq!(c.use_count(id, 1, 100, 1), Count::Accepted);
        assert_eq!(c.use_count(id, 1, 3, 1), Count::Replay);
        // Expired nonces are dropped from memory (the nonce check refuses them as stale) when
        // their shard is next used.
        let mut same_shard = id;
        same_shard[1] = 2;
        assert_eq!(c.use_count(same_shard, 150, 1, 200), Count::Accepted);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn memory_is_bounded_and_forgetting_reopens_no_replay() {
        let c = NonceCounts::new(160, u64::MAX / 2);
        let id = |i: u32| {
            let mut id = [0; MAC_LEN];
            id[..4].copy_from_slice(&i.to_le_bytes());
            id
        };
        for i in 0..10_000u32 {
            assert_eq!(
                c.use_count(id(i), 10 + i as u64, 1, 20_000),
                Count::Accepted
            );
        }
        assert!(c.len() <= 160, "{}", c.len());
        // The first nonce was forgotten: its replay is not accepted.
        assert_eq!(c.use_count(id(0), 10, 1, 20_000), Count::Forgotten);
        // A nonce issued after everything forgotten is still welcome.
        assert_eq!(c.use_count(id(20_000), 15_000, 1, 20_000), Count::Accepted);
    }
}
