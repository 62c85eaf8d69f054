//! The registrar (RFC 3261 §10.3): REGISTER adds, refreshes and removes bindings and is
//! answered with the bindings now current.
//!
//! Pure logic over a [`Location`] replica: it returns the response to send and the
//! [`BindingChange`]s to apply everywhere; the engine applies and distributes them.

use crate::config::RegistrarConfig;
use crate::engine::location::{Binding, BindingChange, Location};
use crate::net::transport::{uri_peer, Peer};
use sip_core::message::values::parse_delta_seconds;
use sip_core::message::{HeaderName, Message, NameAddr};
use std::fmt::Write as _;

/// The registrar's answer.
#[derive(Debug)]
pub struct Outcome {
    pub code: u16,
    pub reason: &'static str,
    /// Extra header lines for the response, each ending in CRLF.
    pub headers: String,
    pub changes: Vec<BindingChange>,
}

impl Outcome {
    fn reject(code: u16, reason: &'static str) -> Outcome {
        Outcome {
            code,
            reason,
            headers: String::new(),
            changes: Vec::new(),
        }
    }
}

/// The longest address-of-record, Contact URI and Call-ID a binding may have, in bytes: what
/// the store's columns hold in every database (PostgreSQL and MariaDB count characters, which
/// are never more than bytes).
pub const MAX_AOR: usize = 255;
pub const MAX_CONTACT: usize = 512;
pub const MAX_CALL_ID: usize = 255;

/// RFC 3261 §25.1: `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )`.
fn valid_qvalue(q: &[u8]) -> bool {
    let (int, frac) = match q.iter().position(|b| *b == b'.') {
        Some(dot) => (&q[..dot], Some(&q[dot + 1..])),
        None => (q, None),
    };
    let frac_ok = |digit: fn(&u8) -> bool| frac.is_none_or(|f| f.len() <= 3 && f.iter().all(digit));
    match int {
        b"0" => frac_ok(u8::is_ascii_digit),
        b"1" => frac_ok(|d| *d == b'0'),
        _ => false,
    }
}

struct Requested<'a> {
    contact: NameAddr<'a>,
    expires: u32,
}

/// Handles one REGISTER for `aor` (already checked to be in one of our domains). `own` tells
/// whether a target is one of the server's own listeners: a contact there would hand every
/// call back to the server (RFC 5393's amplification), so it is refused.
pub fn register(
    cfg: &RegistrarConfig,
    own: impl Fn(&Peer) -> bool,
    location: &Location,
    aor: &str,
    msg: &Message<'_>,
    source: Peer,
    now_unix_ms: u64,
) -> Outcome {
    let header_expires = match msg.expires() {
        None => None,
        Some(Ok(e)) => Some(e),
        Some(Err(_)) => return Outcome::reject(400, "Bad Expires header"),
    };
    let call_id = String::from_utf8_lossy(msg.call_id());
    let cseq = msg.cseq().seq;
    // What the store's columns hold (location_bindings): refused here with a clear answer
    // rather than accepted and then never written.
    if aor.len() > MAX_AOR {
        return Outcome::reject(400, "Address-of-Record Too Long");
    }
    if call_id.len() > MAX_CALL_ID {
        return Outcome::reject(400, "Call-ID Too Long");
    }
    let existing: Vec<&Binding> = location.bindings(aor, now_unix_ms).collect();

    if msg.contact_is_star() {
        let only = msg.headers_named(HeaderName::Contact).count() == 1;
        if !only || header_expires != Some(0) {
            return Outcome::reject(400, "Wildcard Contact needs Expires 0 and no other Contact");
        }
        for b in &existing {
            if *b.call_id == *call_id && cseq < b.cseq {
                return Outcome::reject(500, "Out of order CSeq");
            }
        }
        return Outcome {
            code: 200,
            reason: "OK",
            headers: String::new(),
            changes: vec![BindingChange::RemoveAll { aor: aor.into() }],
        };
    }

    let mut requested: Vec<Requested<'_>> = Vec::new();
    let mut bad_expires = false;
    let parsed = msg.name_addrs(HeaderName::Contact, |_, na| {
        let expires = match na.params.get(b"expires") {
            Some(value) => {
                let parsed = value.and_then(|v| parse_delta_seconds(v, "Contact").ok());
                bad_expires |= parsed.is_none();
                parsed.unwrap_or(0)
            }
            None => header_expires.unwrap_or(cfg.default_expires),
        };
        requested.push(Requested {
            contact: na,
            expires,
        });
    });
    if parsed.is_err() {
        return Outcome::reject(400, "Bad Contact header");
    }
    for r in &requested {
        if r.contact.uri.raw.len() > MAX_CONTACT {
            return Outcome::reject(400, "Contact Too Long");
        }
        if let Some(q) = r.contact.params.get(b"q") {
            if !q.is_some_and(valid_qvalue) {
                return Outcome::reject(400, "Bad q parameter");
            }
        }
    }
    if bad_expires {
        return Outcome::reject(400, "Bad expires parameter");
    }
    if requested
        .iter()
        .any(|r| r.expires > 0 && r.expires < cfg.min_expires)
    {
        return Outcome {
            code: 423,
            reason: "Interval Too Brief",
            headers: format!("Min-Expires: {}\r\n", cfg.min_expires),
            changes: Vec::new(),
        };
    }

    let mut changes = Vec::new();
    let mut live: Vec<Binding> = existing.iter().map(|b| (*b).clone()).collect();
    for r in &requested {
        let contact = String::from_utf8_lossy(r.contact.uri.raw);
        if let Some(b) = existing.iter().find(|b| *b.contact == *contact) {
            if *b.call_id == *call_id && cseq <= b.cseq {
                if cseq < b.cseq {
                    return Outcome::reject(500, "Out of order CSeq");
                }
                continue; // A retransmission of the same registration: nothing changes.
            }
        }
        live.retain(|b| *b.contact != *contact);
        if r.expires == 0 {
            changes.push(BindingChange::Remove {
                aor: aor.into(),
                contact: contact.into(),
            });
            continue;
        }
        let expires = r.expires.min(cfg.max_expires);
        let target = uri_peer(&r.contact.uri).unwrap_or(Peer::new(source.transport, source.addr));
        if own(&target) {
            return Outcome::reject(403, "Contact Points At This Server");
        }
        let binding = Binding {
            contact: contact.into(),
            target,
            expires_at: now_unix_ms + u64::from(expires) * 1000,
            q: r.contact
                .params
                .get(b"q")
                .flatten()
                .map(|q| String::from_utf8_lossy(q).into()),
            call_id: call_id.as_ref().into(),
            cseq,
        };
        live.push(binding.clone());
        changes.push(BindingChange::Upsert {
            aor: aor.into(),
            binding,
        });
    }
    if live.len() > cfg.max_contacts {
        return Outcome::reject(403, "Too Many Contacts");
    }
    let mut headers = String::new();
    for b in &live {
        let remaining = b.expires_at.saturating_sub(now_unix_ms).div_ceil(1000);
        let _ = write!(headers, "Contact: <{}>;expires={remaining}", b.contact);
        if let Some(q) = &b.q {
            let _ = write!(headers, ";q={q}");
        }
        headers.push_str("\r\n");
    }
    Outcome {
        code: 200,
        reason: "OK",
        headers,
        changes,
    }
}

#[cfg(test)]
mod tests {
    use super::valid_qvalue;

    #[test]
    fn qvalues_are_what_rfc_3261_allows() {
        for ok in ["0", "1", "0.5", "0.123", "1.0", "1.000", "0."] {
            assert!(valid_qvalue(ok.as_bytes()), "{ok}");
        }
        for bad in ["abc", "", "2", "1.5", "0.1234", "-1", "0,5", ".5", "1.001"] {
            assert!(!valid_qvalue(bad.as_bytes()), "{bad}");
        }
    }
}
