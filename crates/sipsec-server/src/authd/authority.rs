//! The authority's decisions, apart from its sockets: issuing chains from the users' keys
//! (held in memory by the same credential cache and database sync the digest server uses, so
//! issuing does no query), the chain length under load, and which proxies hold a chain for
//! which user, so a key change is pushed only to them.

use crate::auth::credentials::{Credentials, Lookup};
use crate::auth::proxychain::wire::{Credential, Reply};
use anyhow::Result;
use sip_core::proxychain::{self, HashKind, Issued};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The authority's settings.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The hash of the chains issued when a proxy names none.
    pub hash: HashKind,
    /// Chain length when the authority is not busy.
    pub chain_length: u32,
    /// The longest chain it issues under load.
    pub max_chain_length: u32,
    /// Issues per second above which chains grow in proportion (0: they never grow).
    pub busy_issues_per_s: u64,
    /// How long a chain may be used (0: forever).
    pub lifetime_s: u64,
}

/// A chain for `proxy` from the user's key, with fresh random nonces.
pub(crate) fn issue_fresh(hash: HashKind, key: &[u8], proxy: &str, length: u32) -> Result<Issued> {
    let mut nonces = [0u8; 32];
    getrandom::getrandom(&mut nonces)?;
    let (mut n_da, mut n_dp) = ([0; 16], [0; 16]);
    n_da.copy_from_slice(&nonces[..16]);
    n_dp.copy_from_slice(&nonces[16..]);
    Ok(proxychain::issue(hash, key, proxy, length, n_da, n_dp))
}

/// What a proxy asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ask {
    /// The chain length the proxy wants; clamped to 1 to the longest allowed.
    pub length: Option<u32>,
    /// The hash function the proxy wants; absent: the policy's.
    pub hash: Option<HashKind>,
}

/// Counters the authority reports.
#[derive(Default)]
pub struct AuthorityStats {
    /// Chains issued to proxies.
    pub issued: AtomicU64,
    /// Chains asked for users the authority does not know (or who have no Proxychain key).
    pub unknown: AtomicU64,
    pub(crate) revocations_pushed: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    /// Connections closed at accept: too many handshakes in progress (in all or from their
    /// address), or accepting failed (out of descriptors).
    pub connections_refused: AtomicU64,
    /// Connections whose TLS handshake failed or did not finish in time.
    pub(crate) handshake_failures: AtomicU64,
}

/// One counter as it is reported: its name in the log line (`name=value`, which the lab
/// reads), its Prometheus name (without `_total`), its help text and its value.
pub struct Reported {
    /// The name in the log line.
    pub log: &'static str,
    pub(crate) metric: &'static str,
    /// The Prometheus help text.
    pub help: &'static str,
    /// The count.
    pub value: u64,
}

impl AuthorityStats {
    /// Every counter, for the log line and `/metrics` alike.
    pub fn report(&self) -> [Reported; 7] {
        let r = |log, metric, help, c: &AtomicU64| Reported {
            log,
            metric,
            help,
            value: c.load(Ordering::Relaxed),
        };
        [
            r(
                "issued",
                "sipsec_authd_chains_issued",
                "Chains issued to proxies",
                &self.issued,
            ),
            r(
                "unknown",
                "sipsec_authd_unknown_users",
                "Chains asked for users the authority does not know",
                &self.unknown,
            ),
            r(
                "revocations_pushed",
                "sipsec_authd_revocations_pushed",
                "Revocations pushed to proxies holding a chain of a user whose key changed",
                &self.revocations_pushed,
            ),
            r(
                "bytes_in",
                "sipsec_authd_received_bytes",
                "Bytes read from proxies",
                &self.bytes_in,
            ),
            r(
                "bytes_out",
                "sipsec_authd_sent_bytes",
                "Bytes written to proxies",
                &self.bytes_out,
            ),
            r(
                "connections_refused",
                "sipsec_authd_connections_refused",
                "Connections closed at accept: too many TLS handshakes in progress, or out of \
                 descriptors",
                &self.connections_refused,
            ),
            r(
                "handshake_failures",
                "sipsec_authd_handshake_failures",
                "Connections whose TLS handshake failed or did not finish in time",
                &self.handshake_failures,
            ),
        ]
    }
}

/// The authority.
pub struct Authority {
    /// The chain lengths, hash and lifetime it issues with.
    pub policy: Policy,
    /// The users and their Proxychain keys.
    pub users: Arc<Credentials>,
    /// What it has done, for the log line and `/metrics`.
    pub stats: AuthorityStats,
    /// user → proxies holding a chain for them.
    holders: Mutex<HashMap<Box<str>, HashSet<Arc<str>>>>,
    /// Issues in the current second, and which second.
    window: Mutex<(u64, u64)>,
    /// The length chosen for the current second.
    length_now: AtomicU64,
}

impl Authority {
    /// An authority issuing by `policy` to the users in `users`.
    pub fn new(policy: Policy, users: Arc<Credentials>) -> Authority {
        Authority {
            length_now: AtomicU64::new(u64::from(policy.chain_length)),
            policy,
            users,
            stats: AuthorityStats::default(),
            holders: Mutex::new(HashMap::new()),
            window: Mutex::new((0, 0)),
        }
    }

    /// The chain length for an issue at `now_s`: the base length, grown in proportion to the
    /// last second's issues above the busy rate, at most the maximum — so that under a
    /// spike each proxy comes back less often (seed 001 §6.1).
    fn length(&self, now_s: u64) -> u32 {
        let p = &self.policy;
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.0 != now_s {
            let last = if w.0 + 1 == now_s { w.1 } else { 0 };
            let grown = if p.busy_issues_per_s > 0 && last > p.busy_issues_per_s {
                u64::from(p.chain_length) * last.div_ceil(p.busy_issues_per_s)
            } else {
                u64::from(p.chain_length)
            };
            self.length_now.store(
                grown.min(u64::from(p.max_chain_length.max(p.chain_length))),
                Ordering::Relaxed,
            );
            *w = (now_s, 0);
        }
        w.1 += 1;
        self.length_now.load(Ordering::Relaxed) as u32
    }

    /// Answers an issue request from `proxy` for `user`, with the chain length and hash the
    /// proxy asked for (else the authority's), the length grown under load.
    pub fn issue(&self, proxy: &Arc<str>, id: u64, user: &str, ask: Ask, now_s: u64) -> Reply {
        let key = match self.users.lookup(user) {
            Lookup::Found(secrets) => secrets.pc_key,
            Lookup::Unknown => None,
            Lookup::Unavailable => {
                return Reply::Unavailable {
                    id,
                    user: user.to_string(),
                }
            }
        };
        let Some(key) = key else {
            self.stats.unknown.fetch_add(1, Ordering::Relaxed);
            return Reply::Unknown {
                id,
                user: user.to_string(),
            };
        };
        let max = self.policy.max_chain_length.max(self.policy.chain_length);
        let base = ask
            .length
            .map_or(self.policy.chain_length, |l| l.clamp(1, max));
        let grown = self.length(now_s);
        // Under load the base length is multiplied as the authority's own would be.
        let length = (u64::from(base) * u64::from(grown) / u64::from(self.policy.chain_length))
            .clamp(u64::from(base), u64::from(max.max(base))) as u32;
        let hash = ask.hash.unwrap_or(self.policy.hash);
        let issued = match issue_fresh(hash, &key, proxy, length) {
            Ok(i) => i,
            Err(e) => {
                tracing::error!("no randomness for nonces: {e}");
                return Reply::Unavailable {
                    id,
                    user: user.to_string(),
                };
            }
        };
        if let Ok(mut h) = self.holders.lock() {
            h.entry(user.into()).or_default().insert(proxy.clone());
        }
        self.stats.issued.fetch_add(1, Ordering::Relaxed);
        let expires = (self.policy.lifetime_s > 0).then(|| now_s + self.policy.lifetime_s);
        Reply::Issued {
            id,
            user: user.to_string(),
            credential: Credential::new(&issued, expires),
        }
    }

    /// The proxies holding a chain for `user`, forgotten as they are returned: the user's key
    /// changed, so every chain issued for it is void.
    pub(crate) fn take_holders(&self, user: &str) -> Vec<Arc<str>> {
        self.holders
            .lock()
            .ok()
            .and_then(|mut h| h.remove(user))
            .map(|s| s.into_iter().collect())
            .unwrap_or_default()
    }

    /// Forgets a proxy everywhere (it was revoked).
    pub(crate) fn forget_proxy(&self, proxy: &str) {
        if let Ok(mut h) = self.holders.lock() {
            for set in h.values_mut() {
                set.remove(proxy);
            }
            h.retain(|_, s| !s.is_empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::credentials::{CacheState, Secrets};

    fn authority(busy: u64) -> Authority {
        let users = Arc::new(Credentials::new("example.com"));
        users.apply([
            (
                "alice".to_string(),
                Some(Secrets::from_password("alice", "example.com", "pw")),
            ),
            ("old".to_string(), {
                let mut s = Secrets::from_password("old", "example.com", "pw");
                s.pc_key = None;
                Some(s)
            }),
        ]);
        users.set_state(CacheState::Current);
        Authority::new(
            Policy {
                hash: HashKind::Sha256,
                chain_length: 10,
                max_chain_length: 40,
                busy_issues_per_s: busy,
                lifetime_s: 60,
            },
            users,
        )
    }

    #[test]
    fn issues_chains_the_user_can_answer_and_remembers_who_holds_them() {
        let a = authority(0);
        let p: Arc<str> = "p1".into();
        let Reply::Issued { credential, .. } = a.issue(&p, 1, "alice", Ask::default(), 1000) else {
            panic!("alice is known")
        };
        let ask = Ask {
            length: Some(25),
            hash: Some(HashKind::Md5),
        };
        let Reply::Issued {
            credential: md5, ..
        } = a.issue(&p, 9, "alice", ask, 1000)
        else {
            panic!("alice is known")
        };
        assert_eq!(
            (md5.length, md5.hash.as_str()),
            (25, "MD5"),
            "the proxy's choice"
        );
        assert_eq!(credential.expires_unix_s, Some(1060));
        let mut chain = proxychain::Chain::from(credential.issued().unwrap());
        let key = proxychain::user_key("alice", "example.com", "pw");
        let ch = chain.challenge("p1", &[1; 16]);
        let (_, r) =
            proxychain::ClientChain::answer(&key, &ch, &[1; 16], "alice", b"a@x", b"b@x").unwrap();
        chain.verify(&r, b"a@x", b"b@x").unwrap();
        assert_eq!(a.take_holders("alice"), vec![p.clone()]);
        assert!(a.take_holders("alice").is_empty());
        assert!(matches!(
            a.issue(&p, 2, "nobody", Ask::default(), 1000),
            Reply::Unknown { .. }
        ));
        assert!(
            matches!(
                a.issue(&p, 3, "old", Ask::default(), 1000),
                Reply::Unknown { .. }
            ),
            "a user stored before schema 3 has no key"
        );
    }

    #[test]
    fn chains_grow_with_load_up_to_the_maximum() {
        let a = authority(5);
        let p: Arc<str> = "p1".into();
        let len = |r: Reply| match r {
            Reply::Issued { credential, .. } => credential.length,
            other => panic!("{other:?}"),
        };
        for _ in 0..20 {
            assert_eq!(len(a.issue(&p, 1, "alice", Ask::default(), 100)), 10);
        }
        // 20 issues in the last second, 4x the busy rate: 40 (the maximum).
        assert_eq!(len(a.issue(&p, 1, "alice", Ask::default(), 101)), 40);
        // A quiet second later, back to the base length.
        assert_eq!(len(a.issue(&p, 1, "alice", Ask::default(), 103)), 10);
    }
}
