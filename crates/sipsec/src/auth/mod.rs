//! Authentication of requests: Proxychain (`proxychain`, with its chain cache `chains`), and
//! digest (RFC 3261 §22, RFC 7616, RFC 8760) with the database off the call path: stateless nonces (`nonce`), a credential cache holding every user
//! (`credentials`, filled and kept current by `userdb`), and failure throttling (`throttle`).
//!
//! The registrar challenges with 401 and `WWW-Authenticate`, everything else with 407 and
//! `Proxy-Authenticate`, offering each configured algorithm (SHA-256 first, then MD5) with
//! `qop="auth"`. A request passes when its credentials are for our realm, answer a nonce of
//! ours that is fresh and whose count was not used before, carry the response the user's HA1
//! gives, and name the user the request speaks for (From; To for REGISTER). CANCEL and ACK are
//! never challenged (RFC 3261 §22.1): a CANCEL matches a request that was authenticated, and
//! the ACK of a non-2xx response is absorbed by its transaction. Unknown users and wrong
//! passwords get the same answer after the same work.

pub mod chains;
pub mod credentials;
pub mod nonce;
pub mod proxychain;
mod throttle;

use credentials::{Credentials, Lookup};
use nonce::{Count, NonceCounts, NonceState, Nonces};
use sip_core::digest::{self, Algorithm};
use sip_core::message::{HeaderName, Message, Method};
use std::net::IpAddr;
use std::sync::Arc;
use throttle::Throttle;

/// `[auth] scheme`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    #[default]
    None,
    Digest,
    /// Hash-chain credentials from `sipsec authd` (`docs/proxychain.md`).
    Proxychain,
}

/// An address or a network (`10.0.0.0/8`, `::1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    pub fn parse(text: &str) -> Result<Network, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an IP address or network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{text:?}: the prefix length must be 0 to {max}"))?,
            None => max,
        };
        Ok(Network { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => (u128::from(u32::from(v4)) << 96, 32u8),
            IpAddr::V6(v6) => (u128::from(v6), 128u8),
        };
        let ((net, len), (other, other_len)) = (bits(self.addr), bits(ip));
        if len != other_len {
            return false;
        }
        let mask = if self.prefix == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(self.prefix))
        };
        net & mask == other & mask
    }
}

/// What is challenged, whichever the scheme: one value shared by the digest and Proxychain
/// settings.
#[derive(Debug, Clone)]
pub struct Scope {
    pub realm: String,
    /// Methods challenged, upper case (never ACK or CANCEL).
    pub methods: Vec<String>,
    /// Sources never challenged.
    pub trusted: Vec<Network>,
}

impl Scope {
    /// Whether a request from `source` goes unchallenged: ACK and CANCEL never are (RFC 3261
    /// §22.1), nor methods not in `methods`, nor requests from a trusted network.
    pub fn exempt(&self, msg: &Message<'_>, source: IpAddr) -> bool {
        matches!(msg.method(), Method::Ack | Method::Cancel)
            || !self
                .methods
                .iter()
                .any(|m| m.as_bytes().eq_ignore_ascii_case(msg.method_raw()))
            || self.trusted.iter().any(|n| n.contains(source))
    }
}

/// The validated `[auth]` settings.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub scheme: Scheme,
    pub scope: Arc<Scope>,
    /// Offered in this order.
    pub algorithms: Vec<Algorithm>,
    pub nonce_lifetime_ms: u64,
    pub max_failures_per_source: u32,
    pub max_failures_per_user: u32,
    pub failure_window_ms: u64,
    pub max_tracked_nonces: usize,
    /// With `scheme = "proxychain"`.
    pub proxychain: Option<proxychain::PcConfig>,
    /// Digest: hold every user in memory (true), or query the database for each
    /// authentication (false: how the seeds' servers worked, kept to measure it).
    pub credential_cache: bool,
    /// The names this server answers to, for digest's `uri` check.
    pub server: crate::config::ServerNames,
}

/// Entries the failure throttle holds per table (sources, users, known sources).
const THROTTLE_CAPACITY: usize = 100_000;

/// What the workers share: the nonce secret, nonce counts, failure counts and the credential
/// cache.
pub struct Shared {
    pub nonces: Nonces,
    pub counts: NonceCounts,
    throttle: Throttle,
    pub credentials: Arc<Credentials>,
    /// Without the cache: each user's secrets as a query returned them, for the one request
    /// that waited for them.
    pub fetched: credentials::Fetched,
    pub uncached: bool,
    /// Returned unchanged by clients (RFC 7616); identifies this server's challenges.
    opaque: String,
}

impl Shared {
    /// A fresh secret from the OS: nonces do not survive a restart (clients then get
    /// `stale=true` and retry).
    pub fn new(cfg: &AuthConfig, credentials: Arc<Credentials>) -> std::io::Result<Shared> {
        let mut secret = [0u8; 32];
        getrandom::getrandom(&mut secret).map_err(std::io::Error::other)?;
        let nonces = Nonces::new(secret, cfg.nonce_lifetime_ms);
        // The MAC part of a nonce for time 0: fixed for this secret, and says nothing.
        let opaque =
            nonces.issue(0, 0, IpAddr::from([0u8; 4]))[nonce::NONCE_HEX_LEN - 16..].to_string();
        Ok(Shared {
            nonces,
            counts: NonceCounts::new(cfg.max_tracked_nonces, cfg.nonce_lifetime_ms),
            throttle: Throttle::new(
                cfg.max_failures_per_source,
                cfg.max_failures_per_user,
                cfg.failure_window_ms,
                THROTTLE_CAPACITY,
            ),
            credentials,
            fetched: credentials::Fetched::default(),
            uncached: !cfg.credential_cache,
            opaque,
        })
    }
}

/// What to do with a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated, exempt, or not a method we challenge.
    Pass,
    /// Answer with this status and these header lines.
    Refuse {
        code: u16,
        reason: &'static str,
        headers: String,
        /// Why, for the counters.
        why: Why,
    },
    /// Proxychain only: no chain for the user yet; the request waits for the authority.
    Wait { user: String },
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// No credentials for our realm: the first challenge.
    NoCredentials,
    /// Wrong password or unknown user (the same answer for both), on a fresh nonce of ours
    /// sent to the address answering; or an algorithm we did not offer.
    Failed,
    /// A nonce that is old, not ours, or issued to another address: challenged again with
    /// `stale=true` without looking at the password, and counted against no one.
    Stale,
    /// A nonce count (Proxychain: a chain value) used before.
    Replay,
    /// Proxychain: an answer to the challenge of a chain that another call of the same user
    /// spent, and that a new chain just replaced. Honest, so challenged again; not a replay.
    Raced,
    /// Credentials of one user for a request from another.
    IdentityMismatch,
    /// Too many failures from this source or for this user.
    Throttled,
    /// Credentials that cannot be parsed, or computed for another Request-URI.
    Malformed,
    /// The user database is not loaded or is down for a user the cache does not know.
    Unavailable,
}

/// One worker's authenticator.
pub struct Authenticator {
    cfg: Arc<AuthConfig>,
    shared: Arc<Shared>,
    worker: u64,
    counter: u64,
    /// HA1s that no user has, checked for unknown users so they cost what a wrong password
    /// costs.
    decoy: credentials::Secrets,
    /// Users whose secrets must be queried (without the cache); the engine hands them on.
    pub fetches: Vec<(String, bool)>,
}

pub(crate) fn refuse(code: u16, reason: &'static str, headers: String, why: Why) -> Verdict {
    Verdict::Refuse {
        code,
        reason,
        headers,
        why,
    }
}

/// The answer when what authentication needs (the user database, the authority) is not
/// there: 503, to try again shortly.
pub(crate) fn unavailable() -> Verdict {
    refuse(
        503,
        "Authentication Service Unavailable",
        "Retry-After: 5\r\n".into(),
        Why::Unavailable,
    )
}

/// The header carrying a request's credentials: the one answering the challenge we send it
/// (401 for REGISTER, 407 otherwise).
pub fn credentials_header(msg: &Message<'_>) -> HeaderName {
    digest::credentials_header(digest::challenge_status(msg.method() == Method::Register))
}

/// The user part of a From or To header.
fn user_of(msg: &Message<'_>, header: HeaderName) -> Option<Vec<u8>> {
    let na = match header {
        HeaderName::To => msg.to().ok()?,
        _ => msg.from().ok()?,
    };
    na.uri.user.map(<[u8]>::to_vec)
}

impl Authenticator {
    pub fn new(cfg: Arc<AuthConfig>, shared: Arc<Shared>, worker: usize) -> Self {
        Authenticator {
            decoy: credentials::Secrets::from_password("", "", "decoy"),
            cfg,
            shared,
            worker: worker as u64,
            counter: 0,
            fetches: Vec::new(),
        }
    }

    /// The challenge header lines, one per algorithm, with a nonce for `client`.
    fn challenge(&mut self, register: bool, client: IpAddr, now_ms: u64, stale: bool) -> String {
        self.counter += 1;
        let nonce = self
            .shared
            .nonces
            .issue(now_ms, self.worker << 48 | self.counter, client);
        let name = if register {
            "WWW-Authenticate"
        } else {
            "Proxy-Authenticate"
        };
        let mut out = String::new();
        for a in &self.cfg.algorithms {
            out.push_str(&format!(
                "{name}: Digest realm=\"{}\", nonce=\"{nonce}\", opaque=\"{}\", \
                 algorithm={}, qop=\"auth\"{}\r\n",
                self.cfg.scope.realm,
                self.shared.opaque,
                a.token(),
                if stale { ", stale=true" } else { "" }
            ));
        }
        out
    }

    fn challenge_verdict(
        &mut self,
        register: bool,
        client: IpAddr,
        now_ms: u64,
        stale: bool,
        why: Why,
    ) -> Verdict {
        let (code, reason) = if register {
            (401, "Unauthorized")
        } else {
            (407, "Proxy Authentication Required")
        };
        let headers = self.challenge(register, client, now_ms, stale);
        refuse(code, reason, headers, why)
    }

    /// Not challenged at all: a method we do not challenge, or a trusted source.
    pub fn exempt(&self, msg: &Message<'_>, source: IpAddr) -> bool {
        self.cfg.scope.exempt(msg, source)
    }

    /// Decides on a request from `source` at Unix time `now_ms`.
    pub fn check(&mut self, msg: &Message<'_>, source: IpAddr, now_ms: u64) -> Verdict {
        if self.exempt(msg, source) {
            return Verdict::Pass;
        }
        self.verify(msg, source, now_ms)
    }

    /// Verifies the credentials of a request that is not [`exempt`](Self::exempt).
    ///
    /// The order is what keeps blind attackers out: everything an attacker can send without
    /// having received a challenge at the address it claims (a made-up nonce, a spoofed
    /// source, another user's name) is answered before the password is looked at and counts
    /// against no one. Only a wrong answer to a fresh nonce issued to the answering address
    /// is a failure.
    pub fn verify(&mut self, msg: &Message<'_>, source: IpAddr, now_ms: u64) -> Verdict {
        let throttle = &self.shared.throttle;
        let throttled = || {
            refuse(
                403,
                "Too Many Failed Authentications",
                String::new(),
                Why::Throttled,
            )
        };
        if throttle.source_blocked(source, now_ms) {
            return throttled();
        }
        let register = msg.method() == Method::Register;
        // The credentials for our realm, among any for other realms.
        let mut found = None;
        for h in msg.headers_named(credentials_header(msg)) {
            match digest::Credentials::parse(msg.value(h)) {
                Ok(c) if c.realm.as_ref() == self.cfg.scope.realm.as_bytes() => {
                    found = Some(c);
                    break;
                }
                Ok(_) => {}
                Err(_) => {
                    return refuse(400, "Malformed Credentials", String::new(), Why::Malformed)
                }
            }
        }
        let Some(cred) = found else {
            return self.challenge_verdict(register, source, now_ms, false, Why::NoCredentials);
        };
        let Ok(username) = std::str::from_utf8(&cred.username) else {
            return refuse(400, "Malformed Credentials", String::new(), Why::Malformed);
        };
        if !self.cfg.algorithms.contains(&cred.algorithm) {
            return self.challenge_verdict(register, source, now_ms, false, Why::Failed);
        }
        // Credentials are for one Request-URI (RFC 3261 §22.4, RFC 7616 §3.4.6): a response
        // captured on its way to one destination must not carry a request to another.
        if !digest_uri_matches(&self.cfg.server, msg, &cred.uri) {
            return refuse(400, "Digest URI Mismatch", String::new(), Why::Malformed);
        }
        // The identity the request claims must be the one authenticated.
        let claimed = user_of(
            msg,
            if register {
                HeaderName::To
            } else {
                HeaderName::From
            },
        );
        if claimed.as_deref() != Some(cred.username.as_ref()) {
            return refuse(
                403,
                "Identity Mismatch",
                String::new(),
                Why::IdentityMismatch,
            );
        }
        // The nonce must be ours (with our opaque: a challenge from before a restart has
        // another), issued to this address, and fresh. If not, the client gets a new one
        // (stale=true, so it retries without asking its user) and nothing is counted: the
        // password was not even looked at, so there is nothing to learn from the answer.
        let ours = cred.opaque.as_deref() == Some(self.shared.opaque.as_bytes());
        let nonce = if ours {
            self.shared.nonces.check(&cred.nonce, now_ms, source)
        } else {
            NonceState::Unknown
        };
        let NonceState::Fresh { id, issued_ms } = nonce else {
            return self.challenge_verdict(register, source, now_ms, true, Why::Stale);
        };
        if throttle.user_blocked(username, source, now_ms) {
            return throttled();
        }
        let lookup = if self.shared.uncached {
            match self.shared.fetched.take(username) {
                Some(Some(secrets)) => Lookup::Found(secrets),
                Some(None) => Lookup::Unknown,
                None => {
                    self.fetches.push((username.to_string(), false));
                    return Verdict::Wait {
                        user: username.to_string(),
                    };
                }
            }
        } else {
            self.shared.credentials.lookup(username)
        };
        let (ha1s, known) = match lookup {
            Lookup::Found(h) => (h, true),
            Lookup::Unknown => (self.decoy.clone(), false),
            Lookup::Unavailable => return unavailable(),
        };
        let expected = cred.expected_response(&ha1s.hex(cred.algorithm), msg.method_raw());
        let matches = bool::from(subtle::ConstantTimeEq::ct_eq(
            expected.as_bytes(),
            cred.response.as_ref(),
        ));
        if !(matches && known) {
            self.shared.throttle.fail(source, username, now_ms);
            return self.challenge_verdict(register, source, now_ms, false, Why::Failed);
        }
        // The password is right; the nonce count must not have been used before.
        let nc = cred.nc.unwrap_or(1);
        match self.shared.counts.use_count(id, issued_ms, nc, now_ms) {
            Count::Accepted => {
                self.shared.throttle.succeeded(source, username, now_ms);
                Verdict::Pass
            }
            Count::Replay => self.challenge_verdict(register, source, now_ms, false, Why::Replay),
            Count::Forgotten => self.challenge_verdict(register, source, now_ms, true, Why::Stale),
        }
    }
}

/// Whether a digest `uri` names the request's Request-URI: the same scheme, user, host (any
/// case) and port (a missing port standing for the scheme's default), whatever the
/// parameters (RFC 3261 §19.1.4 is stricter, but clients and proxies add and drop
/// parameters). A `uri` naming this server itself (its address or domain, no user) is also
/// accepted, whatever the Request-URI: SIPp puts the address of the proxy it sends to there
/// by default, binding its credentials to the proxy rather than to one destination.
fn digest_uri_matches(
    server: &crate::config::ServerNames,
    msg: &Message<'_>,
    digest_uri: &[u8],
) -> bool {
    let (Some(ruri), Ok(uri)) = (msg.request_uri(), sip_core::message::Uri::parse(digest_uri))
    else {
        return false;
    };
    ruri.raw == digest_uri || ruri.same_resource(&uri) || (uri.user.is_none() && server.names(&uri))
}

#[cfg(test)]
mod tests;
