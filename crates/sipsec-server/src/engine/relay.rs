//! The relay policy: where a request may be forwarded, by who vouches for it.
//!
//! With authentication on, a request that nobody vouches for — its method is not challenged
//! (`auth.methods`), it came from no trusted network, and it carries no Route of ours with a
//! dialog token for where it goes — may be forwarded only to a registered contact of the
//! local user its Request-URI names, or along a configured route; anything else is answered
//! 403 "Relay Forbidden", as Kamailio's default configuration answers a request that is
//! neither authenticated nor for a local user. With `scheme = "none"` the server is an open
//! proxy by configuration and only the rule for its own ports applies: no request, whoever
//! sends it, reaches this server's management ports (`[metrics] listen`, the Proxychain
//! authority) — checked on the address actually connected to, after DNS.
//!
//! # Dialog tokens
//!
//! Requests inside a dialog are what make a stateless proof necessary: the proxy keeps no
//! dialog table (the workers share nothing, and caller and callee land on different ones),
//! and a To tag alone is something anyone can write. So a dialog this server set up carries
//! its proof in the server's own Record-Route URI: `;rt=` and the first 8 bytes (hex) of an
//! HMAC-SHA256, under a secret made at start and shared by the workers, of the hop the entry
//! authorises. RFC 3261 §16.7 step 4 lets a proxy rewrite its Record-Route in responses, so
//! the two directions get their own token:
//!
//! - in the request that opens the dialog, the hop back to the caller: the topmost
//!   Record-Route the request arrived with (a proxy nearer the caller), else its Contact. The
//!   callee keeps this Record-Route as its route set;
//! - in the 1xx/2xx answers, the hop on to the callee: the Record-Route just above ours (a
//!   proxy nearer the callee), else the answer's Contact. The caller's route set comes from
//!   these.
//!
//! An in-dialog request whose Routes of ours carry a token for the hop it is going to (its
//! next Route, else its Request-URI) is vouched for; one without falls under the rule for
//! requests outside a dialog, but for one thing: a Request-URI that names a configured route
//! itself (a peer behind the default route that did not keep our Record-Route, as SIPp's
//! built-in UAS does not) is still let through — it reaches nothing a configured route does
//! not. Between two transports both entries of ours (RFC 5658) carry the same token. A
//! restart changes the secret: dialogs set up before it can no longer send unauthenticated
//! in-dialog requests to foreign hops (they still can once authenticated, or through the
//! configured routes).

use super::reply::Answer;
use super::{Decision, Engine};
use crate::stats::inc;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use sip_core::message::rewrite::Rewriter;
use sip_core::message::{HeaderName, Message, Uri};
use std::net::SocketAddr;
use std::sync::LazyLock;

/// The Record-Route URI parameter that carries a dialog token.
pub(super) const TOKEN_PARAM: &[u8] = b"rt";
/// Bytes of MAC kept in a token.
const TOKEN_BYTES: usize = 8;
/// A token as written in a URI: hex.
pub(super) type Token = [u8; 2 * TOKEN_BYTES];

/// The secret tokens are made under: one per process, so any worker checks what another made.
static SECRET: LazyLock<[u8; 32]> = LazyLock::new(|| {
    let mut secret = [0u8; 32];
    getrandom::getrandom(&mut secret).expect("the operating system's random source works");
    secret
});

/// HMAC-SHA256 already keyed with [`SECRET`]: a clone starts each MAC, which saves the two
/// hash blocks of the key's pads that keying again would cost every token.
static KEYED: LazyLock<Hmac<Sha256>> =
    LazyLock::new(|| Hmac::new_from_slice(&*SECRET).expect("any key length works"));

/// A MAC under the per-process secret dialog and flow tokens are made under, to feed.
pub(super) fn keyed_mac() -> Hmac<Sha256> {
    KEYED.clone()
}

/// Who vouches for a request the gate let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Vouched {
    /// Its caller authenticated (digest or Proxychain): forwarded wherever routing says.
    User,
    /// From a trusted network: forwarded wherever routing says.
    Source,
    /// Authentication is off (an open proxy by configuration): forwarded wherever routing
    /// says and signed as from a trusted network, but not exempt from a verifier that
    /// requires Identity — with no one authenticated and no network named, any host is a
    /// caller.
    Open,
    /// Let through unchallenged (its method is not challenged): only to registered contacts,
    /// configured routes, or the hop its dialog token names.
    No,
}

/// The token authorising `hop`: the place a URI sends a request to (its `maddr` or host, port,
/// transport and whether it is `sips`), so a token for one Contact opens no other.
pub(super) fn token(hop: &Uri<'_>) -> Token {
    let mut m = keyed_mac();
    m.update(&[u8::from(hop.scheme == sip_core::message::Scheme::Sips)]);
    let host = hop.param(b"maddr").flatten().unwrap_or(hop.host);
    let host = sip_core::message::uri::unbracket(host);
    for chunk in host.chunks(64) {
        let mut lower = [0u8; 64];
        lower[..chunk.len()].copy_from_slice(chunk);
        lower[..chunk.len()].make_ascii_lowercase();
        m.update(&lower[..chunk.len()]);
    }
    m.update(&hop.port.unwrap_or(0).to_be_bytes());
    m.update(b"/");
    let transport = hop.param(b"transport").flatten().unwrap_or_default();
    for b in transport {
        m.update(&[b.to_ascii_lowercase()]);
    }
    let mac = m.finalize().into_bytes();
    let mut out = [0u8; 2 * TOKEN_BYTES];
    for (i, b) in mac[..TOKEN_BYTES].iter().enumerate() {
        out[2 * i] = b"0123456789abcdef"[usize::from(b >> 4)];
        out[2 * i + 1] = b"0123456789abcdef"[usize::from(b & 0xf)];
    }
    out
}

/// Whether `written` (a token from one of our Route entries) authorises `hop`.
pub(super) fn vouches(written: &[u8], hop: &Uri<'_>) -> bool {
    written.len() == 2 * TOKEN_BYTES
        && bool::from(subtle::ConstantTimeEq::ct_eq(written, &token(hop)[..]))
}

/// The hop back to whoever sent a dialog-forming request: the topmost Record-Route it came
/// with, else its Contact.
pub(super) fn hop_back<'a>(msg: &Message<'a>) -> Option<Uri<'a>> {
    let mut first = None;
    let _ = msg.name_addrs(HeaderName::RecordRoute, |_, na| {
        first.get_or_insert(na.uri);
    });
    first.or_else(|| first_contact(msg))
}

/// The first Contact's URI.
pub(super) fn first_contact<'a>(msg: &Message<'a>) -> Option<Uri<'a>> {
    let mut contact = None;
    let _ = msg.name_addrs(HeaderName::Contact, |_, na| {
        contact.get_or_insert(na.uri);
    });
    contact
}

impl Engine {
    /// Whether requests nobody vouches for are held to the relay rule (authentication on).
    pub(super) fn relay_restricted(&self) -> bool {
        self.gate.is_on()
    }

    /// 403 for a request the relay rule holds back (see `relay`).
    pub(super) fn relay_forbidden(&self) -> Decision {
        inc(&self.stats.relay_refused);
        Answer::new(403, "Relay Forbidden").into()
    }

    /// Whether `addr` is one of this server's management ports, which nothing is forwarded
    /// to: the metrics endpoint and the Proxychain authority. A wildcard listen address owns
    /// its port on the loopback and on the server's own addresses.
    pub(super) fn relay_is_management_port(&self, addr: SocketAddr) -> bool {
        let pc = self.cfg.auth.proxychain.as_ref().map(|pc| pc.authority);
        self.cfg.metrics_listen.into_iter().chain(pc).any(|m| {
            m.port() == addr.port()
                && (m.ip() == addr.ip()
                    || (m.ip().is_unspecified()
                        && m.is_ipv4() == addr.is_ipv4()
                        && (addr.ip().is_loopback()
                            || addr.ip().is_unspecified()
                            || self.cfg.names.addrs.iter().any(|a| a.ip() == addr.ip()))))
        })
    }

    /// Whether `hop` is where a configured route (default or per domain) goes.
    pub(super) fn relay_is_configured_route(&self, hop: &crate::dns::Hop<'_>) -> bool {
        let routing = &self.cfg.routing;
        let domain = routing.domain_routes.iter().map(|(_, r)| r);
        routing
            .default_routes
            .iter()
            .chain(domain)
            .any(|r| r.next.hop() == *hop)
    }

    /// Rewrites the tokens of our Record-Route entries in a response that may form a dialog
    /// (1xx with a tag, 2xx) to authorise the hop on to the callee (RFC 3261 §16.7 step 4):
    /// the entry just above ours, else the response's Contact.
    pub(super) fn relay_restamp_record_route(&self, rw: &mut Rewriter<'_, '_>) {
        let msg = rw.msg;
        if !self.relay_restricted() || !(101..300).contains(&msg.status().unwrap_or(0)) {
            return;
        }
        let base = msg.as_bytes().as_ptr() as usize;
        // Each entry, top first, with the offset of its token if it is ours.
        let mut entries: smallvec::SmallVec<[(Uri<'_>, Option<usize>); 4]> =
            smallvec::SmallVec::new();
        let _ = msg.name_addrs(HeaderName::RecordRoute, |_, na| {
            let ours = na
                .uri
                .param(TOKEN_PARAM)
                .flatten()
                .filter(|t| t.len() == 2 * TOKEN_BYTES && self.routing_is_local_host(&na.uri))
                .map(|t| t.as_ptr() as usize - base);
            entries.push((na.uri, ours));
        });
        let Some(first) = entries.iter().position(|(_, t)| t.is_some()) else {
            return;
        };
        // Our entries are together (two between transports); any further down are another
        // pass's (a spiral), left alone.
        let ours = entries[first..]
            .iter()
            .map_while(|(_, t)| *t)
            .collect::<smallvec::SmallVec<[usize; 2]>>();
        let hop = match first {
            0 => first_contact(msg),
            i => Some(entries[i - 1].0),
        };
        let Some(hop) = hop else {
            return;
        };
        let fresh = token(&hop);
        for at in ours {
            rw.splice.replace(at, at + fresh.len(), &fresh);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_one_hop() {
        let uri = |s: &'static str| Uri::parse(s.as_bytes()).unwrap();
        let t = token(&uri("sip:alice@192.0.2.1:5070"));
        assert!(vouches(&t, &uri("sip:alice@192.0.2.1:5070")));
        assert!(vouches(&t, &uri("sip:other@192.0.2.1:5070;ob")));
        for other in [
            "sip:alice@192.0.2.1:5071",
            "sip:alice@192.0.2.2:5070",
            "sip:alice@192.0.2.1:5070;maddr=198.51.100.1",
            "sip:alice@192.0.2.1:5070;transport=tcp",
            "sips:alice@192.0.2.1:5070",
            "sip:alice@192.0.2.1",
        ] {
            assert!(!vouches(&t, &uri(other)), "{other}");
        }
        assert!(vouches(
            &token(&uri("sip:a@Host.Example;Transport=TCP")),
            &uri("sip:a@host.example;transport=tcp")
        ));
        assert!(!vouches(b"short", &uri("sip:alice@192.0.2.1:5070")));
    }
}
