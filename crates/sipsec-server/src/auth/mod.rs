//! Authentication of requests, the two schemes side by side: digest ([`digest`], with its
//! stateless nonces [`nonce`], credential cache [`credentials`] and failure throttle)
//! and Proxychain ([`proxychain`], with its chain cache [`chains`] and the authority's wire
//! and backup formats). This module holds what both share: the `[auth]` settings, what is
//! challenged (`Scope`), and the `Verdict` either gives the engine.
//!
//! CANCEL and ACK are never challenged (RFC 3261 §22.1): a CANCEL matches a request that was
//! authenticated, and the ACK of a non-2xx response is absorbed by its transaction.

pub mod chains;
pub mod credentials;
pub mod digest;
pub mod nonce;
pub mod proxychain;
mod throttle;

use sip_core::digest::Algorithm;
use sip_core::message::{HeaderName, Message, Method};
use std::net::IpAddr;
use std::sync::Arc;

/// `[auth] scheme`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// No authentication: every request is served (the default).
    #[default]
    None,
    /// HTTP Digest (RFC 3261 §22, RFC 7616) against the user database.
    Digest,
    /// Hash-chain credentials from `sipsec authd` (`docs/proxychain.md`).
    Proxychain,
}

impl Scheme {
    /// The name in the config file.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::None => "none",
            Scheme::Digest => "digest",
            Scheme::Proxychain => "proxychain",
        }
    }
}

/// An address or a network (`10.0.0.0/8`, `::1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    pub(crate) fn parse(text: &str) -> Result<Network, String> {
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

    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
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
pub(crate) struct Scope {
    pub realm: String,
    /// Methods challenged, upper case (never ACK or CANCEL).
    pub methods: Vec<String>,
    /// Sources never challenged.
    pub(crate) trusted: Vec<Network>,
}

impl Scope {
    /// Whether a request from `source` goes unchallenged: ACK and CANCEL never are (RFC 3261
    /// §22.1), nor methods not in `methods`, nor requests from a trusted network.
    pub(crate) fn exempt(&self, msg: &Message<'_>, source: IpAddr) -> bool {
        matches!(msg.method(), Method::Ack | Method::Cancel)
            || !self
                .methods
                .iter()
                .any(|m| m.as_bytes().eq_ignore_ascii_case(msg.method_raw()))
            || self.trusts(source)
    }

    /// Whether `source` is in a trusted network (vouched for as if authenticated).
    pub(crate) fn trusts(&self, source: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(source))
    }
}

/// The validated `[auth]` settings.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// Which scheme authenticates requests (`scheme`, default none).
    pub scheme: Scheme,
    pub(crate) scope: Arc<Scope>,
    /// Offered in this order.
    pub algorithms: Vec<Algorithm>,
    pub(crate) nonce_lifetime_ms: u64,
    pub(crate) max_failures_per_source: u32,
    /// Failed attempts by one user within the failure window before the user is refused 403
    /// (`max_failures_per_user`, default 10).
    pub max_failures_per_user: u32,
    pub(crate) failure_window_ms: u64,
    pub(crate) max_tracked_nonces: usize,
    /// With `scheme = "proxychain"`.
    pub proxychain: Option<proxychain::PcConfig>,
    /// Digest: hold every user in memory (true), or query the database for each
    /// authentication (false: how the seeds' servers worked, kept to measure it).
    pub credential_cache: bool,
    /// The names this server answers to, for digest's `uri` check.
    pub server: sipsec_transport::net::names::ServerNames,
}

/// What to do with a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
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

/// The target of the log line of each failed authentication (`WARN sipsec::auth:
/// authentication failed: …`), a name that stays when code moves: fail2ban filters match it.
pub(crate) const LOG_TARGET: &str = "sipsec::auth";

/// Who a refused request is logged against: the user its credentials name (digest's
/// `username`, Proxychain's user), or, without any, the user it claims to be (the To of a
/// REGISTER, the From of other requests). As sent: escape it before showing it.
pub(crate) fn named_user(msg: &Message<'_>) -> Option<String> {
    for h in msg.headers_named(credentials_header(msg)) {
        let value = msg.value(h);
        if let Ok(c) = sip_core::digest::Credentials::parse(value) {
            return Some(String::from_utf8_lossy(&c.username).into_owned());
        }
        if let Ok(a) = sip_core::proxychain::Authorization::parse(value) {
            return Some(a.username().to_string());
        }
    }
    let claimed = match msg.method() {
        Method::Register => HeaderName::To,
        _ => HeaderName::From,
    };
    user_of(msg, claimed).map(|u| String::from_utf8_lossy(&u).into_owned())
}

/// The header carrying a request's credentials: the one answering the challenge we send it
/// (401 for REGISTER, 407 otherwise).
pub fn credentials_header(msg: &Message<'_>) -> HeaderName {
    sip_core::digest::credentials_header(sip_core::digest::challenge_status(
        msg.method() == Method::Register,
    ))
}

/// The user part of a From or To header.
fn user_of(msg: &Message<'_>, header: HeaderName) -> Option<Vec<u8>> {
    let na = match header {
        HeaderName::To => msg.to().ok()?,
        _ => msg.from().ok()?,
    };
    na.uri.user.map(<[u8]>::to_vec)
}
