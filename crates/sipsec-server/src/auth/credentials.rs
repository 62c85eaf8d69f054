//! The credential cache: every user of the realm with their HA1s, held in memory and shared
//! by the workers, so authenticating a call costs a hash-map lookup and no query (seeds 000
//! and 004 lost 2–5× throughput to per-call MySQL queries). The user database is the truth:
//! the cache is filled from it at start and kept in step by polling its change revision
//! (`userdb`), so `sipsec users` changes take effect without a restart.

use sip_core::digest::Algorithm;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::RwLock;

/// What the user database holds for one user, derived from the password and never the
/// password itself: the digest HA1 = H(username:realm:password) per algorithm, and the
/// Proxychain key k_AD (`docs/proxychain.md`), absent for users stored before schema 3 until
/// their password is set again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secrets {
    /// HA1 for MD5, the form a digest response with `algorithm=MD5` is checked against.
    pub md5: [u8; 16],
    pub(crate) sha256: [u8; 32],
    pub(crate) sha512_256: [u8; 32],
    pub(crate) pc_key: Option<[u8; 32]>,
}

fn bytes_of<const N: usize>(hex_text: &str) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    sip_core::hex::decode(hex_text.as_bytes(), &mut out).then_some(out)
}

impl Secrets {
    /// Computes every secret from a password.
    pub fn from_password(username: &str, realm: &str, password: &str) -> Secrets {
        let mut s = Secrets::from_hex(
            &Algorithm::Md5.ha1(username, realm, password),
            &Algorithm::Sha256.ha1(username, realm, password),
            &Algorithm::Sha512_256.ha1(username, realm, password),
            "",
        )
        .expect("hashes are hex of the right length");
        s.pc_key = Some(sip_core::proxychain::user_key(username, realm, password));
        s
    }

    /// From the database's hex columns; an empty `pc_key` means none.
    pub fn from_hex(md5: &str, sha256: &str, sha512_256: &str, pc_key: &str) -> Option<Secrets> {
        Some(Secrets {
            md5: bytes_of(md5)?,
            sha256: bytes_of(sha256)?,
            sha512_256: bytes_of(sha512_256)?,
            pc_key: if pc_key.is_empty() {
                None
            } else {
                Some(bytes_of(pc_key)?)
            },
        })
    }

    /// The HA1 for `algorithm`, as the hex a digest response is computed from.
    pub fn hex(&self, algorithm: Algorithm) -> String {
        match algorithm {
            Algorithm::Md5 => sip_core::hex::encode(&self.md5),
            Algorithm::Sha256 => sip_core::hex::encode(&self.sha256),
            Algorithm::Sha512_256 => sip_core::hex::encode(&self.sha512_256),
        }
    }

    /// (md5, sha256, sha512_256, pc_key) as hex, for the database.
    pub(crate) fn to_hex(&self) -> [String; 4] {
        [
            sip_core::hex::encode(&self.md5),
            sip_core::hex::encode(&self.sha256),
            sip_core::hex::encode(&self.sha512_256),
            self.pc_key
                .map_or_else(String::new, |k| sip_core::hex::encode(&k)),
        ]
    }
}

/// Without the credential cache: the answer of a query a worker made for a user, waiting for
/// that worker to take it when it reruns the requests that waited for it. One answer serves
/// the requests parked at that moment and is then gone, so every later request queries
/// again, as a server without the cache does (an answer kept any longer would be a cache).
#[derive(Default)]
pub struct Fetched {
    answers: std::sync::Mutex<Answers>,
}

/// Answers by (worker, user).
type Answers = HashMap<(usize, Box<str>), Option<Secrets>>;

impl Fetched {
    /// The answer to `worker`'s query for `user` (`None`: no such user). A failed query
    /// delivers nothing: the requests that waited are answered 503.
    pub fn deliver(&self, worker: usize, user: &str, answer: Option<Secrets>) {
        if let Ok(mut a) = self.answers.lock() {
            // Bounded: a worker takes its answer when told, so only a stopped worker leaves
            // answers behind.
            if a.len() > 100_000 {
                a.clear();
            }
            a.insert((worker, user.into()), answer);
        }
    }

    /// `worker`'s answer for `user`, if it came.
    pub fn take(&self, worker: usize, user: &str) -> Option<Option<Secrets>> {
        self.answers.lock().ok()?.remove(&(worker, user.into()))
    }
}

/// Whether the cache can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    /// Not loaded yet: nothing can be authenticated (answered 503).
    Loading = 0,
    /// Loaded and in step with the database.
    Current = 1,
    /// Loaded, but the database stopped answering: known users still authenticate from the
    /// cache; a user it does not know may have been added meanwhile, so is answered 503.
    Outage = 2,
}

/// The users of one realm.
pub struct Credentials {
    realm: String,
    users: RwLock<HashMap<Box<str>, Secrets>>,
    state: AtomicU8,
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The user is in the cache: these are the user's secrets.
    Found(Secrets),
    /// The cache is current and does not hold the user: no such user.
    Unknown,
    /// The cache cannot say (not loaded, or the database is down and the user is not known).
    Unavailable,
}

impl Credentials {
    /// An empty cache for `realm`, still loading (every lookup is unavailable until
    /// [`Credentials::set_state`] says otherwise).
    pub fn new(realm: &str) -> Credentials {
        Credentials {
            realm: realm.to_string(),
            users: RwLock::new(HashMap::new()),
            state: AtomicU8::new(CacheState::Loading as u8),
        }
    }

    /// The realm these users belong to.
    pub fn realm(&self) -> &str {
        &self.realm
    }

    /// Whether the cache can be trusted now.
    pub fn state(&self) -> CacheState {
        match self.state.load(Ordering::Acquire) {
            0 => CacheState::Loading,
            1 => CacheState::Current,
            _ => CacheState::Outage,
        }
    }

    /// Says whether the cache can be trusted: the user loader sets it after the first load, and
    /// at each database outage and recovery.
    pub fn set_state(&self, s: CacheState) {
        self.state.store(s as u8, Ordering::Release);
    }

    /// What the cache says about `username`.
    pub fn lookup(&self, username: &str) -> Lookup {
        let state = self.state();
        if state == CacheState::Loading {
            return Lookup::Unavailable;
        }
        let users = self.users.read().unwrap_or_else(|e| e.into_inner());
        match users.get(username) {
            Some(h) => Lookup::Found(h.clone()),
            None if state == CacheState::Outage => Lookup::Unavailable,
            None => Lookup::Unknown,
        }
    }

    /// Applies changes from the database: `Some` adds or replaces, `None` removes.
    pub fn apply(&self, changes: impl IntoIterator<Item = (String, Option<Secrets>)>) {
        let mut users = self.users.write().unwrap_or_else(|e| e.into_inner());
        for (name, ha1s) in changes {
            match ha1s {
                Some(h) => {
                    users.insert(name.into_boxed_str(), h);
                }
                None => {
                    users.remove(name.as_str());
                }
            }
        }
    }

    /// Users held.
    pub fn len(&self) -> usize {
        self.users.read().map_or(0, |u| u.len())
    }

    /// Whether no user is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ha1s_round_trip_through_hex() {
        let h = Secrets::from_password("alice", "example.test", "secret");
        let [a, b, c, d] = h.to_hex();
        assert_eq!(a, Algorithm::Md5.ha1("alice", "example.test", "secret"));
        assert_eq!(Secrets::from_hex(&a, &b, &c, &d), Some(h.clone()));
        assert_eq!(Secrets::from_hex(&a, &b, &c, "").unwrap().pc_key, None);
        assert_eq!(h.hex(Algorithm::Sha256), b);
        assert_eq!(Secrets::from_hex("zz", &b, &c, &d), None);
        assert_eq!(Secrets::from_hex(&a, &b, &c, "zz"), None);
    }

    #[test]
    fn lookups_follow_the_cache_state() {
        let c = Credentials::new("example.test");
        assert_eq!(c.lookup("alice"), Lookup::Unavailable);
        let h = Secrets::from_password("alice", "example.test", "pw");
        c.apply([("alice".to_string(), Some(h.clone()))]);
        c.set_state(CacheState::Current);
        assert_eq!(c.lookup("alice"), Lookup::Found(h.clone()));
        assert_eq!(c.lookup("bob"), Lookup::Unknown);
        c.set_state(CacheState::Outage);
        assert_eq!(c.lookup("alice"), Lookup::Found(h));
        assert_eq!(c.lookup("bob"), Lookup::Unavailable);
        c.apply([("alice".to_string(), None)]);
        assert_eq!(c.len(), 0);
    }
}
