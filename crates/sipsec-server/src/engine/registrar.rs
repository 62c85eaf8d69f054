//! The registrar (RFC 3261 §10.3): REGISTER adds, refreshes and removes bindings and is
//! answered with the bindings now current.
//!
//! Pure logic over a [`Location`] replica: it returns the response to send and the
//! [`BindingChange`]s to apply everywhere; the engine applies and distributes them.
//!
//! Bindings are bounded in all (`max_bindings`) and per source address
//! (`max_bindings_per_source`): with no authentication, anyone may register anything, and
//! each binding is memory in every worker and a row in the database. Every replica holds
//! every binding, so its count is the server's, across workers (give or take the
//! registrations other workers took in the same instant, not yet delivered). A REGISTER that
//! would add bindings beyond either is answered 503 with Retry-After: refreshing, removing
//! and moving existing bindings still work at the cap.

use super::reply::Answer;
use crate::config::RegistrarConfig;
use crate::location::{Binding, BindingChange, Location};
use sip_core::message::values::parse_delta_seconds;
use sip_core::message::{HeaderName, Message, NameAddr};
use sipsec_transport::net::transport::{uri_peer, Peer};
use smallvec::SmallVec;
use std::sync::Arc;

/// The registrar's answer, and the binding changes it made.
#[derive(Debug)]
pub(super) struct Outcome {
    pub answer: Answer,
    pub changes: Vec<BindingChange>,
}

impl Outcome {
    fn reject(code: u16, reason: &'static str) -> Outcome {
        Outcome::refuse(Answer::new(code, reason))
    }

    fn refuse(answer: Answer) -> Outcome {
        Outcome {
            answer,
            changes: Vec::new(),
        }
    }
}

/// The longest address-of-record, Contact URI and Call-ID a binding may have, in bytes: what
/// the store's columns hold in every database (PostgreSQL and MariaDB count characters, which
/// are never more than bytes).
pub(crate) const MAX_AOR: usize = 255;
pub(crate) const MAX_CONTACT: usize = 512;
pub(crate) const MAX_CALL_ID: usize = 255;

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
/// whether a target is one of the server's own listeners or management ports: a contact there
/// would hand every call back to the server (RFC 5393's amplification), or make it a relay to
/// its own metrics or authority, so it is refused.
pub(super) fn register(
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
    let existing: SmallVec<[&Binding; 4]> = location.bindings(aor, now_unix_ms).collect();

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
            answer: Answer::new(200, "OK"),
            changes: vec![BindingChange::RemoveAll { aor: aor.into() }],
        };
    }

    let mut requested: SmallVec<[Requested<'_>; 2]> = SmallVec::new();
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
        let brief = Answer::new(423, "Interval Too Brief");
        return Outcome::refuse(
            brief.with_headers(format!("Min-Expires: {}\r\n", cfg.min_expires)),
        );
    }

    // The changes, last one per contact (a contact listed twice is bound as its last entry
    // says), and the contacts they touch.
    let aor: Arc<str> = location.aor(aor).cloned().unwrap_or_else(|| aor.into());
    let mut shared_call_id: Option<Arc<str>> = None;
    let mut changes: Vec<BindingChange> = Vec::with_capacity(requested.len());
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
        changes.retain(|c| c.contact() != Some(&*contact));
        if r.expires == 0 {
            changes.push(BindingChange::Remove {
                aor: aor.clone(),
                contact: contact.into(),
            });
            continue;
        }
        let expires = r.expires.min(cfg.max_expires);
        let target = uri_peer(&r.contact.uri).unwrap_or(Peer::new(source.transport, source.addr));
        if own(&target) {
            return Outcome::reject(403, "Contact Points At This Server");
        }
        let call_id = shared_call_id.get_or_insert_with(|| call_id.as_ref().into());
        changes.push(BindingChange::Upsert {
            aor: aor.clone(),
            binding: Binding {
                contact: contact.into(),
                target,
                expires_at: now_unix_ms + u64::from(expires) * 1000,
                q: r.contact
                    .params
                    .get(b"q")
                    .flatten()
                    .map(|q| String::from_utf8_lossy(q).into()),
                call_id: call_id.clone(),
                cseq,
                source: Some(source.addr.ip()),
            },
        });
    }
    let Some(headers) = contact_lines(cfg, &existing, &changes, now_unix_ms) else {
        return Outcome::reject(403, "Too Many Contacts");
    };
    if let Some(full) = over_limits(cfg, location, &existing, &changes, source) {
        return full;
    }
    Outcome {
        answer: Answer::new(200, "OK").with_headers(headers),
        changes,
    }
}

/// How long a client refused for a full registrar is asked to wait: bindings leave only as
/// they expire or are removed.
const FULL_RETRY_AFTER_S: u32 = 60;

/// The refusal when `changes` would take the bindings held beyond `max_bindings`, or those
/// from `source` beyond `max_bindings_per_source`.
fn over_limits(
    cfg: &RegistrarConfig,
    location: &Location,
    existing: &[&Binding],
    changes: &[BindingChange],
    source: Peer,
) -> Option<Outcome> {
    let ip = source.addr.ip();
    // New bindings, and bindings that become this source's (new, or moved from another).
    let (mut added, mut added_here) = (0, 0);
    for c in changes {
        let BindingChange::Upsert { binding, .. } = c else {
            continue;
        };
        match existing.iter().find(|b| b.contact == binding.contact) {
            None => (added, added_here) = (added + 1, added_here + 1),
            Some(b) if b.source != Some(ip) => added_here += 1,
            Some(_) => {}
        }
    }
    let reason = if added > 0 && location.len() + added > cfg.max_bindings {
        "Service Unavailable (registrar full)"
    } else if added_here > 0
        && cfg.max_bindings_per_source > 0
        && location.held_from(ip) + added_here > cfg.max_bindings_per_source
    {
        "Service Unavailable (too many bindings from this address)"
    } else {
        return None;
    };
    let full = Answer::new(503, reason);
    Some(Outcome::refuse(full.with_headers(format!(
        "Retry-After: {FULL_RETRY_AFTER_S}\r\n"
    ))))
}

/// The Contact lines of a 200 OK: the bindings current once `changes` apply (the existing
/// ones they leave alone, then the new), each with its remaining time; `None` if they are
/// more than the registrar allows.
fn contact_lines(
    cfg: &RegistrarConfig,
    existing: &[&Binding],
    changes: &[BindingChange],
    now_unix_ms: u64,
) -> Option<String> {
    let kept = existing
        .iter()
        .copied()
        .filter(|b| !changes.iter().any(|c| c.contact() == Some(&*b.contact)));
    let bound = changes.iter().filter_map(|c| match c {
        BindingChange::Upsert { binding, .. } => Some(binding),
        _ => None,
    });
    let live: SmallVec<[&Binding; 4]> = kept.chain(bound).collect();
    if live.len() > cfg.max_contacts {
        return None;
    }
    let mut headers = String::with_capacity(live.len() * 64);
    let mut digits = itoa::Buffer::new();
    for b in &live {
        let remaining = b.expires_at.saturating_sub(now_unix_ms).div_ceil(1000);
        headers.push_str("Contact: <");
        headers.push_str(&b.contact);
        headers.push_str(">;expires=");
        headers.push_str(digits.format(remaining));
        if let Some(q) = &b.q {
            headers.push_str(";q=");
            headers.push_str(q);
        }
        headers.push_str("\r\n");
    }
    Some(headers)
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
