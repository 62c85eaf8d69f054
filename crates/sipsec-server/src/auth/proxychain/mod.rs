//! Proxychain at the proxy (`[auth] scheme = "proxychain"`; `docs/proxychain.md`): challenges
//! from the cached chain, verifies responses with two hashes and steps the chain, asks the
//! authority for chains it lacks (the request waits, parked by the engine), prefetches the
//! next chain before the current one runs out, and falls back to backup credentials when the
//! authority cannot be reached.
//!
//! Answers:
//! - no `PC` credentials, or a response the proxy holds no chain for (evicted, revoked,
//!   expired, or raced by the same user's other call): 407 (401 for REGISTER) with the *hello
//!   challenge* `PC realm="P"`, which asks the client to start over with its nonce;
//! - a hello with a live chain: the full challenge, from the chain, at once;
//! - a hello without one: the request waits for the authority (`Verdict::Wait`);
//! - a user the authority does not know: a decoy challenge indistinguishable from a real one,
//!   which no password verifies;
//! - a response that verifies: pass, and the chain steps down;
//! - a response for another counter: the hello challenge (a replay gets nothing more); a bad
//!   HMAC or chain value: 403 — except a bad HMAC shortly after the user's chain was replaced,
//!   which is what an honest answer to the old chain's challenge looks like when the same
//!   user's other call spent that chain first: the hello challenge.

use super::chains::ChainCache;
use super::{refuse, Verdict, Why};
use sip_core::message::{Message, Method};
use sip_core::proxychain::{self, Authorization, Chain, Challenge, HashKind, Refusal, Token};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// How long after a chain replaced another a failed request proof is taken for a response to
/// the old chain's challenge (answered with the hello challenge) rather than a forgery (403):
/// 64·T1, the longest a client transaction waits for its answer.
const RACE_WINDOW_S: u32 = 32;

/// The validated Proxychain settings of `[auth]`.
#[derive(Debug, Clone)]
pub struct PcConfig {
    /// `tls:host:port` of `sipsec authd`.
    pub authority: std::net::SocketAddr,
    /// The server name the authority's certificate must carry.
    pub(crate) authority_name: String,
    /// Chain length asked for (the authority may issue longer under load).
    pub chain_length: u32,
    /// The hash function of the chains asked for (`hash`, default SHA-256).
    pub hash: HashKind,
    /// Credentials held at most.
    pub(crate) cache_size: usize,
    /// Fetch the next chain when this many values are left (0: never prefetch).
    pub prefetch_at: u32,
    /// Backup credentials (`sipsec authd backup`), used while the authority is unreachable.
    pub backup: Option<PathBuf>,
    /// The `[auth]` scope (its realm names the hello challenge until the authority has named
    /// this proxy).
    pub(crate) scope: Arc<super::Scope>,
    /// How long a request waits for the authority before it is answered 503.
    pub(crate) wait_ms: u64,
}

impl PcConfig {
    /// Whether `other` sets up the same Proxychain (authority, chains, cache, backup): what a
    /// reload cannot change. The scope (methods, trusted) may differ.
    pub(crate) fn same_setup(&self, other: &PcConfig) -> bool {
        (
            self.authority,
            &self.authority_name,
            self.chain_length,
            self.hash,
            self.cache_size,
            self.prefetch_at,
            &self.backup,
            self.wait_ms,
        ) == (
            other.authority,
            &other.authority_name,
            other.chain_length,
            other.hash,
            other.cache_size,
            other.prefetch_at,
            &other.backup,
            other.wait_ms,
        )
    }
}

/// What the workers share.
pub struct PcShared {
    /// The validated settings.
    pub cfg: Arc<PcConfig>,
    /// The chains held, per user.
    pub cache: ChainCache,
    /// P, as the authority (or the backup file) names this proxy.
    proxy: RwLock<Option<Arc<str>>>,
    /// Users the authority said it does not know, until when (Unix s).
    unknown: Mutex<HashMap<Box<str>, u64>>,
    /// Users with a request to the authority in flight.
    fetching: Mutex<HashSet<Box<str>>>,
    /// The authority cannot be reached.
    down: AtomicBool,
    /// Backup chains, read from the file at the first outage.
    backup: Mutex<Option<HashMap<Box<str>, Chain>>>,
}

/// How long an "unknown user" answer is believed before asking again.
const UNKNOWN_FOR_S: u64 = 10;

impl PcShared {
    /// Shared state for `cfg`, with an empty cache and P not yet known.
    pub fn new(cfg: PcConfig) -> PcShared {
        PcShared {
            cache: ChainCache::new(cfg.cache_size),
            cfg: Arc::new(cfg),
            proxy: RwLock::new(None),
            unknown: Mutex::new(HashMap::new()),
            fetching: Mutex::new(HashSet::new()),
            down: AtomicBool::new(false),
            backup: Mutex::new(None),
        }
    }

    /// P, once known.
    pub fn proxy(&self) -> Option<Arc<str>> {
        self.proxy.read().ok()?.clone()
    }

    /// Records P as the authority named this proxy.
    pub fn set_proxy(&self, p: &str) {
        if let Ok(mut g) = self.proxy.write() {
            if g.as_deref() != Some(p) {
                *g = Some(p.into());
            }
        }
    }

    /// Marks a fetch for `user` as started; false when one already is.
    pub(crate) fn start_fetch(&self, user: &str) -> bool {
        self.fetching
            .lock()
            .map(|mut f| f.insert(user.into()))
            .unwrap_or(false)
    }

    /// The authority answered `user` (or gave up): another fetch may start.
    pub fn end_fetch(&self, user: &str) {
        if let Ok(mut f) = self.fetching.lock() {
            f.remove(user);
        }
    }

    pub(crate) fn set_unknown(&self, user: &str, now_s: u64) {
        if let Ok(mut u) = self.unknown.lock() {
            if u.len() > 100_000 {
                u.retain(|_, until| *until > now_s);
            }
            u.insert(user.into(), now_s + UNKNOWN_FOR_S);
        }
    }

    fn is_unknown(&self, user: &str, now_s: u64) -> bool {
        self.unknown
            .lock()
            .is_ok_and(|u| u.get(user).is_some_and(|until| *until > now_s))
    }

    pub(crate) fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
    }

    pub(crate) fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Moves the user's backup chain into the cache, reading the file the first time.
    /// False when there is none.
    fn use_backup(&self, user: &str, now_s: u64) -> bool {
        let Some(path) = &self.cfg.backup else {
            return false;
        };
        let Ok(mut guard) = self.backup.lock() else {
            return false;
        };
        if guard.is_none() {
            match backup::read(path) {
                Ok((proxy, chains)) => {
                    tracing::warn!(
                        "authority unreachable: {} backup credentials loaded from {}",
                        chains.len(),
                        path.display()
                    );
                    if self.proxy().is_none() {
                        self.set_proxy(&proxy);
                    }
                    *guard = Some(chains);
                }
                Err(e) => {
                    tracing::error!("cannot read backup credentials {}: {e:#}", path.display());
                    *guard = Some(HashMap::new());
                }
            }
        }
        match guard.as_mut().and_then(|m| m.remove(user)) {
            Some(chain) => {
                self.cache.install(user, chain, 0, now_s);
                true
            }
            None => false,
        }
    }
}

/// A worker's Proxychain authenticator.
pub(crate) struct PcAuthenticator {
    shared: Arc<PcShared>,
    /// Which methods are challenged and who is trusted: the shared setup's until a reload
    /// changes them.
    scope: Arc<super::Scope>,
    /// Users to ask the authority for, with whether it is a prefetch; the engine hands them
    /// to the driver.
    pub fetches: Vec<(String, bool)>,
}

/// `user@host` of the From or To URI.
fn identity(msg: &Message<'_>, to: bool) -> Option<Vec<u8>> {
    let na = if to { msg.to().ok()? } else { msg.from().ok()? };
    let mut id = na.uri.user.unwrap_or_default().to_vec();
    id.push(b'@');
    id.extend_from_slice(na.uri.host);
    Some(id)
}

impl PcAuthenticator {
    pub(crate) fn new(shared: Arc<PcShared>) -> PcAuthenticator {
        PcAuthenticator {
            scope: shared.cfg.scope.clone(),
            shared,
            fetches: Vec::new(),
        }
    }

    /// A reload's methods and trusted sources (the realm cannot change without a restart).
    pub(crate) fn set_scope(&mut self, scope: Arc<super::Scope>) {
        self.scope = scope;
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<PcShared> {
        &self.shared
    }

    /// Not challenged: ACK, CANCEL, a method not configured, or a trusted source.
    pub(crate) fn exempt(&self, msg: &Message<'_>, source: IpAddr) -> bool {
        self.scope.exempt(msg, source)
    }

    /// Whether `source` is in a trusted network.
    pub(crate) fn trusts(&self, source: IpAddr) -> bool {
        self.scope.trusts(source)
    }

    /// The realm of challenges: P, or the configured realm until the authority names us.
    fn realm(&self) -> Arc<str> {
        self.shared
            .proxy()
            .unwrap_or_else(|| self.shared.cfg.scope.realm.as_str().into())
    }

    fn challenge(&self, register: bool, value: &str, why: Why) -> Verdict {
        let (code, reason, name) = if register {
            (401, "Unauthorized", "WWW-Authenticate")
        } else {
            (407, "Proxy Authentication Required", "Proxy-Authenticate")
        };
        refuse(code, reason, format!("{name}: {value}\r\n"), why)
    }

    fn hello_challenge(&self, register: bool, why: Why) -> Verdict {
        let hello = proxychain::Authenticate::Hello {
            realm: self.realm().to_string(),
        };
        self.challenge(register, &hello.render(), why)
    }

    /// Decides on a request that is not [`exempt`](Self::exempt), at Unix time `now_ms`.
    pub(crate) fn verify(&mut self, msg: &Message<'_>, now_ms: u64) -> Verdict {
        let now_s = now_ms / 1000;
        let register = msg.method() == Method::Register;
        let mut found = None;
        for h in msg.headers_named(super::credentials_header(msg)) {
            match Authorization::parse(msg.value(h)) {
                Ok(a) => {
                    found = Some(a);
                    break;
                }
                Err(proxychain::ParseError::NotPc) => {}
                Err(_) => {
                    return refuse(400, "Malformed Credentials", String::new(), Why::Malformed)
                }
            }
        }
        let Some(auth) = found else {
            return self.hello_challenge(register, Why::NoCredentials);
        };
        let (Some(from), Some(to)) = (identity(msg, false), identity(msg, true)) else {
            return refuse(400, "Bad From or To", String::new(), Why::Malformed);
        };
        // The user authenticated must be the one the request speaks for.
        let claimed = if register { &to } else { &from };
        let user = auth.username().to_string();
        if claimed.split(|&b| b == b'@').next() != Some(user.as_bytes()) {
            return refuse(
                403,
                "Identity Mismatch",
                String::new(),
                Why::IdentityMismatch,
            );
        }
        match auth {
            Authorization::Hello(hello) => self.on_hello(register, &user, &hello.n_ap, now_s),
            Authorization::Response(r) => self.on_response(register, &r, &from, &to, now_s),
        }
    }

    fn on_hello(
        &mut self,
        register: bool,
        user: &str,
        n_ap: &proxychain::Nonce,
        now_s: u64,
    ) -> Verdict {
        let shared = self.shared.clone();
        let challenge = |s: &PcShared| {
            let p = s.proxy()?;
            s.cache
                .with(user, |e| {
                    e.refresh(now_s).then(|| e.chain.challenge(&p, n_ap))
                })
                .flatten()
        };
        if let Some(ch) = challenge(&shared) {
            return self.challenge(register, &ch.render(), Why::NoCredentials);
        }
        if shared.is_unknown(user, now_s) {
            return self.challenge(register, &self.decoy().render(), Why::Failed);
        }
        if shared.is_down() {
            if shared.use_backup(user, now_s) {
                if let Some(ch) = challenge(&shared) {
                    return self.challenge(register, &ch.render(), Why::NoCredentials);
                }
            }
            return super::unavailable();
        }
        if shared.start_fetch(user) {
            self.fetches.push((user.to_string(), false));
        }
        Verdict::Wait {
            user: user.to_string(),
        }
    }

    fn on_response(
        &mut self,
        register: bool,
        r: &proxychain::Response,
        from: &[u8],
        to: &[u8],
        now_s: u64,
    ) -> Verdict {
        let shared = self.shared.clone();
        let prefetch_at = shared.cfg.prefetch_at;
        let outcome = shared.cache.with(&r.username, |e| {
            if !e.refresh(now_s) {
                return None;
            }
            let result = e.chain.verify(r, from, to);
            if result.is_ok() {
                e.uses = e.uses.saturating_add(1);
            }
            let wants_next = result.is_ok()
                && e.chain.counter <= prefetch_at
                && e.next.is_none()
                && prefetch_at > 0;
            let raced =
                result == Err(Refusal::RequestProof) && e.recently_replaced(now_s, RACE_WINDOW_S);
            Some((result, raced, wants_next))
        });
        match outcome.flatten() {
            Some((Ok(()), _, wants_next)) => {
                if wants_next && !shared.is_down() && shared.start_fetch(&r.username) {
                    self.fetches.push((r.username.clone(), true));
                }
                Verdict::Pass
            }
            Some((Err(_), true, _)) => self.hello_challenge(register, Why::Raced),
            Some((Err(Refusal::Counter), _, _)) => self.hello_challenge(register, Why::Replay),
            Some((Err(_), _, _)) => refuse(403, "Forbidden", String::new(), Why::Failed),
            None => self.hello_challenge(register, Why::Stale),
        }
    }

    /// A challenge shaped like a real one whose proof no key makes.
    fn decoy(&self) -> Challenge {
        let mut random = [0u8; 64];
        let _ = getrandom::getrandom(&mut random);
        let hash = self.shared.cfg.hash;
        let mut n_da = [0; 16];
        let mut n_dp = [0; 16];
        n_da.copy_from_slice(&random[..16]);
        n_dp.copy_from_slice(&random[16..32]);
        Challenge {
            realm: self.realm().to_string(),
            counter: self.shared.cfg.chain_length,
            n_da,
            n_dp,
            proof: Token::new(&random[32..32 + hash.output_len()]),
            hash,
        }
    }
}

#[cfg(test)]
mod tests;

pub mod backup;
pub mod wire;
