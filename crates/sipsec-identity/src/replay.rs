//! Replayed tokens: a PASSporT is good for one call. A verifier remembers each token it
//! accepted (by its signature, which no one without the key can make again) with the call it
//! came in, until the token's freshness window has passed; the same token for another call
//! within that window is a replay ([`Invalid::Replayed`]). The same token for the same call —
//! a retransmission, or the INVITE forked back to us — is not.
//!
//! Bounded, as digest's nonce counts are: at most `capacity` tokens, the oldest forgotten
//! first when a flood fills it (counted in [`Replays::evicted`], since a token forgotten
//! early could be replayed after). Tokens are forgotten in the order they were seen, which
//! is the order their windows close.

use crate::error::Invalid;
use std::collections::{HashMap, VecDeque};

/// The tokens seen within their windows.
#[derive(Debug)]
pub struct Replays {
    /// Signature prefix → (the call's key, when the entry may go, seconds).
    seen: HashMap<[u8; 32], (u64, u64)>,
    /// Signature prefixes in the order seen, with the time each may go.
    order: VecDeque<([u8; 32], u64)>,
    capacity: usize,
    evicted: u64,
}

impl Replays {
    /// A table of at most `capacity` tokens (at least 1).
    pub fn new(capacity: usize) -> Replays {
        Replays {
            seen: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
            evicted: 0,
        }
    }

    /// Records `signature` for the call `call` (a hash of its Call-ID) at `now_s`, kept until
    /// `until_s`; a replay when it was seen before for another call and has not yet gone.
    pub fn check(
        &mut self,
        signature: &[u8; 64],
        call: u64,
        now_s: u64,
        until_s: u64,
    ) -> Result<(), Invalid> {
        self.expire(now_s);
        let mut key = [0u8; 32];
        key.copy_from_slice(&signature[..32]);
        if let Some(&(seen_call, _)) = self.seen.get(&key) {
            return if seen_call == call {
                Ok(())
            } else {
                Err(Invalid::Replayed)
            };
        }
        if self.seen.len() >= self.capacity {
            if let Some((old, _)) = self.order.pop_front() {
                self.seen.remove(&old);
                self.evicted += 1;
            }
        }
        self.seen.insert(key, (call, until_s));
        self.order.push_back((key, until_s));
        Ok(())
    }

    /// Forgets the tokens whose windows closed by `now_s`.
    fn expire(&mut self, now_s: u64) {
        while let Some(&(key, until)) = self.order.front() {
            if until > now_s {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&key);
        }
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Tokens forgotten before their windows closed, because the table was full.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(n: u8) -> [u8; 64] {
        let mut s = [0u8; 64];
        s[0] = n;
        s[40] = 0xff;
        s
    }

    #[test]
    fn a_token_is_good_for_one_call_until_its_window_closes() {
        let mut r = Replays::new(10);
        r.check(&sig(1), 7, 100, 160).unwrap();
        r.check(&sig(1), 7, 101, 160).unwrap();
        assert_eq!(r.check(&sig(1), 8, 120, 180), Err(Invalid::Replayed));
        r.check(&sig(2), 8, 120, 180).unwrap();
        // The window closed: the token is gone (and iat freshness refuses it anyway).
        r.check(&sig(1), 8, 160, 220).unwrap();
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn a_full_table_forgets_the_oldest_and_counts_it() {
        let mut r = Replays::new(2);
        r.check(&sig(1), 1, 0, 60).unwrap();
        r.check(&sig(2), 2, 0, 60).unwrap();
        r.check(&sig(3), 3, 0, 60).unwrap();
        assert_eq!((r.len(), r.evicted()), (2, 1));
        r.check(&sig(1), 9, 1, 61).unwrap();
        assert_eq!(r.check(&sig(3), 9, 1, 61), Err(Invalid::Replayed));
    }
}
