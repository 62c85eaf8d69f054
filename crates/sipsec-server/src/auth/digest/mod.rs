//! Digest authentication (RFC 3261 §22, RFC 7616, RFC 8760) with the database off the call
//! path: stateless nonces ([`super::nonce`]), a credential cache holding every user
//! ([`super::credentials`]) and failure throttling (`throttle`).
//!
//! The registrar challenges with 401 and `WWW-Authenticate`, everything else with 407 and
//! `Proxy-Authenticate`, offering each configured algorithm (SHA-256 first, then MD5) with
//! `qop="auth"`. A request passes when its credentials are for our realm, answer a nonce of
//! ours that is fresh and whose count was not used before, carry the response the user's HA1
//! gives, and name the user the request speaks for (From; To for REGISTER). Unknown users and
//! wrong passwords get the same answer after the same work.

use super::credentials::{self, Credentials, Lookup};
use super::nonce::{self, Count, NonceCounts, NonceState, Nonces};
use super::throttle::Throttle;
use super::{credentials_header, refuse, unavailable, user_of, AuthConfig, Verdict, Why};
use sip_core::digest;
use sip_core::message::{HeaderName, Message, Method};
use std::net::IpAddr;
use std::sync::Arc;

/// Entries the failure throttle holds per table (sources, users, known sources).
const THROTTLE_CAPACITY: usize = 100_000;

/// What the workers share: the nonce secret, nonce counts, failure counts and the credential
/// cache.
pub struct DigestShared {
    /// Makes and checks the nonces of our challenges.
    pub nonces: Nonces,
    /// The nonce counts used so far, for replay detection.
    pub counts: NonceCounts,
    throttle: Throttle,
    /// The users and their HA1s.
    pub credentials: Arc<Credentials>,
    /// Without the cache: each user's secrets as a query returned them, for the one request
    /// that waited for them.
    pub fetched: credentials::Fetched,
    pub(crate) uncached: bool,
    /// Returned unchanged by clients (RFC 7616); identifies this server's challenges.
    opaque: String,
}

impl DigestShared {
    /// A fresh secret from the OS: nonces do not survive a restart (clients then get
    /// `stale=true` and retry).
    pub fn new(cfg: &AuthConfig, credentials: Arc<Credentials>) -> std::io::Result<DigestShared> {
        let mut secret = [0u8; 32];
        getrandom::getrandom(&mut secret).map_err(std::io::Error::other)?;
        let nonces = Nonces::new(secret, cfg.nonce_lifetime_ms);
        // The MAC part of a nonce for time 0: fixed for this secret, and says nothing.
        let opaque =
            nonces.issue(0, 0, IpAddr::from([0u8; 4]))[nonce::NONCE_HEX_LEN - 16..].to_string();
        Ok(DigestShared {
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

/// One worker's authenticator.
pub(crate) struct DigestAuthenticator {
    cfg: Arc<AuthConfig>,
    shared: Arc<DigestShared>,
    worker: u64,
    counter: u64,
    /// HA1s that no user has, checked for unknown users so they cost what a wrong password
    /// costs.
    decoy: credentials::Secrets,
    /// Users whose secrets must be queried (without the cache); the engine hands them on.
    pub fetches: Vec<(String, bool)>,
    /// Without the cache: users this worker has a query out for (a retransmission or a
    /// second request of the same user waits for the same answer instead of querying
    /// again), and the answer its reruns are using now ([`Self::claim`]).
    pending: std::collections::HashSet<Box<str>>,
    claimed: Option<(Box<str>, Option<credentials::Secrets>)>,
}

impl DigestAuthenticator {
    pub(crate) fn new(cfg: Arc<AuthConfig>, shared: Arc<DigestShared>, worker: usize) -> Self {
        DigestAuthenticator {
            decoy: credentials::Secrets::from_password("", "", "decoy"),
            cfg,
            shared,
            worker: worker as u64,
            counter: 0,
            fetches: Vec::new(),
            pending: Default::default(),
            claimed: None,
        }
    }

    /// A reload's settings: the methods challenged, the sources trusted and the algorithms
    /// offered change; nonces, counts and the failure throttle (shared, set up at start) stay.
    pub(crate) fn set_config(&mut self, cfg: Arc<AuthConfig>) {
        self.cfg = cfg;
    }

    /// Without the cache: `user`'s answer has come (or the query failed). Takes it for the
    /// requests that waited, which run again next; [`Self::release`] after them.
    pub(crate) fn claim(&mut self, user: &str) {
        if self.shared.uncached && self.pending.remove(user) {
            let answer = self.shared.fetched.take(self.worker as usize, user);
            self.claimed = answer.map(|a| (user.into(), a));
        }
    }

    /// The reruns are done: the answer is not kept (it would be a cache).
    pub(crate) fn release(&mut self) {
        self.claimed = None;
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
    pub(crate) fn exempt(&self, msg: &Message<'_>, source: IpAddr) -> bool {
        self.cfg.scope.exempt(msg, source)
    }

    /// Whether `source` is in a trusted network.
    pub(crate) fn trusts(&self, source: IpAddr) -> bool {
        self.cfg.scope.trusts(source)
    }

    /// Decides on a request from `source` at Unix time `now_ms`.
    #[cfg(test)]
    pub(crate) fn check(&mut self, msg: &Message<'_>, source: IpAddr, now_ms: u64) -> Verdict {
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
    pub(crate) fn verify(&mut self, msg: &Message<'_>, source: IpAddr, now_ms: u64) -> Verdict {
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
            match &self.claimed {
                Some((user, Some(secrets))) if **user == *username => {
                    Lookup::Found(secrets.clone())
                }
                Some((user, None)) if **user == *username => Lookup::Unknown,
                _ => {
                    if self.pending.insert(username.into()) {
                        self.fetches.push((username.to_string(), false));
                    }
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
        // Seed 002's ablation (lab builds only): the response hash not computed at all.
        let matches = if cfg!(feature = "lab-noop") && sipsec_transport::ablation::server().digest {
            true
        } else {
            let expected = cred.expected_response(&ha1s.hex(cred.algorithm), msg.method_raw());
            bool::from(subtle::ConstantTimeEq::ct_eq(
                expected.as_bytes(),
                cred.response.as_ref(),
            ))
        };
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
    server: &sipsec_transport::net::names::ServerNames,
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
