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
//!
//! Where a binding is reached (`[nat]`): a phone behind a NAT registers a Contact nobody
//! outside can reach (`sip:alice@192.168.1.20`), and a TCP or TLS phone accepts no connection
//! at all. Each binding keeps where its REGISTER came from (`Binding::received`: transport,
//! address after the NAT, the listener socket or connection) and is reached there — a
//! [`Peer::flow`] — when the Contact is not reachable as written (see `reach`). RFC 5626
//! outbound registrations (`+sip.instance` and `reg-id`) are always flows, one binding per
//! instance and reg-id: a new flow replaces the one it re-registers. RFC 3327: a Path the
//! REGISTER brought is kept with the binding as the route set to it, and echoed in the 200.

use super::reply::Answer;
use crate::config::{NatConfig, NatMode, RegistrarConfig};
use crate::location::{Binding, BindingChange, Location, Outbound};
use sip_core::message::values::parse_delta_seconds;
use sip_core::message::{HeaderName, Message, NameAddr};
use sipsec_transport::net::transport::{uri_peer, Peer};
use smallvec::SmallVec;
use std::net::IpAddr;
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
/// The longest `+sip.instance` value, and Path (all its values together), in bytes.
pub(crate) const MAX_INSTANCE: usize = 255;
pub(crate) const MAX_PATH: usize = 1024;

/// Whether `ip` is an address a phone behind a NAT writes in its Contact and nobody outside
/// reaches: private (RFC 1918), shared (RFC 6598, carrier-grade NAT), link-local, IPv6 unique
/// local (RFC 4193) or link-local.
pub(crate) fn unreachable_as_written(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_private() || v4.is_link_local() || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80
        }
    }
}

/// Where requests for a contact go: `written` (the Contact's address, if it names one), or,
/// when that is not reachable, the flow the REGISTER came on (`source`).
///
/// With `auto`: a Contact that names no address (a host name, `*.invalid` as browsers
/// write), or names a private, shared or link-local one other than the source, or differs
/// from the source when the client asked for `rport` (RFC 3581: it knows it is behind a
/// NAT). RFC 5626 flows (`outbound`) are always reached over their flow.
fn reach(mode: NatMode, written: Option<Peer>, source: Peer, rport: bool, outbound: bool) -> Peer {
    let flow = source.as_flow();
    match (mode, written) {
        _ if outbound => flow,
        (NatMode::Always, _) | (_, None) => flow,
        (NatMode::Never, Some(w)) => w,
        (NatMode::Auto, Some(w)) => {
            let elsewhere = w.addr != source.addr;
            let nated = elsewhere && (rport || unreachable_as_written(w.addr.ip()));
            if nated {
                flow
            } else {
                w
            }
        }
    }
}

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
    outbound: Option<Outbound>,
}

/// The RFC 5626 identity a Contact carries: `+sip.instance` and `reg-id` both present (one
/// without the other is an ordinary registration, §6). `Err` for a reg-id that is not a
/// number or an instance too long to store.
fn outbound_of(na: &NameAddr<'_>) -> Result<Option<Outbound>, &'static str> {
    let (Some(Some(instance)), Some(reg_id)) =
        (na.params.get(b"+sip.instance"), na.params.get(b"reg-id"))
    else {
        return Ok(None);
    };
    let reg_id = reg_id
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|id| *id > 0)
        .ok_or("Bad reg-id parameter")?;
    if instance.len() > MAX_INSTANCE {
        return Err("+sip.instance Too Long");
    }
    Ok(Some(Outbound {
        instance: String::from_utf8_lossy(instance).into(),
        reg_id,
    }))
}

/// Whether the request lists `tag` in its Supported header (`outbound`, `path`).
fn supports(msg: &Message<'_>, tag: &[u8]) -> bool {
    msg.headers_named(HeaderName::Supported).any(|h| {
        msg.value(h)
            .split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(tag))
    })
}

/// The REGISTER's Path values, comma separated as written (RFC 3327), if any.
fn path_of(msg: &Message<'_>) -> Option<String> {
    let mut path = String::new();
    for h in msg.headers_named(HeaderName::Path) {
        if !path.is_empty() {
            path.push_str(", ");
        }
        path.push_str(&String::from_utf8_lossy(msg.value(h).trim_ascii()));
    }
    (!path.is_empty()).then_some(path)
}

/// Whether the first hop toward the client can keep an outbound flow (RFC 5626 §6): the
/// client sent the REGISTER to us directly (one Via), or an edge proxy's Path says it does
/// (its first URI carries `ob`).
fn first_hop_has_outbound(msg: &Message<'_>) -> bool {
    if msg.second_via().is_none() {
        return true;
    }
    let mut ob = false;
    let mut first = true;
    let _ = msg.name_addrs(HeaderName::Path, |_, na| {
        if std::mem::take(&mut first) {
            ob = na.uri.param(b"ob").is_some();
        }
    });
    ob
}

/// Handles one REGISTER for `aor` (already checked to be in one of our domains). `own` tells
/// whether a target is one of the server's own listeners or management ports: a contact there
/// would hand every call back to the server (RFC 5393's amplification), or make it a relay to
/// its own metrics or authority, so it is refused.
pub(super) fn register(
    (cfg, nat): (&RegistrarConfig, &NatConfig),
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
    let mut bad_outbound = None;
    let parsed = msg.name_addrs(HeaderName::Contact, |_, na| {
        let outbound = outbound_of(&na).unwrap_or_else(|e| {
            bad_outbound = Some(e);
            None
        });
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
            outbound,
        });
    });
    if parsed.is_err() {
        return Outcome::reject(400, "Bad Contact header");
    }
    if let Some(reason) = bad_outbound {
        return Outcome::reject(400, reason);
    }
    let path = path_of(msg);
    if path.as_ref().is_some_and(|p| p.len() > MAX_PATH) {
        return Outcome::reject(400, "Path Too Long");
    }
    let outbound = requested
        .iter()
        .any(|r| r.outbound.is_some() && r.expires > 0);
    if outbound && !first_hop_has_outbound(msg) {
        // §6: the flow would end at a proxy that cannot keep it.
        return Outcome::reject(439, "First Hop Lacks Outbound Support");
    }
    let rport = msg.top_via().rport().is_some();
    // Behind an edge proxy (Path), the flow is the edge's: requests go along the Path, and
    // the Contact is reached from there.
    let received_here = path.is_none();
    let path: Option<Arc<str>> = path.map(Into::into);
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
        let ob = r.outbound.as_ref();
        if let Some(b) = existing.iter().find(|b| b.is(&contact, ob)) {
            if *b.call_id == *call_id && cseq <= b.cseq {
                if cseq < b.cseq {
                    return Outcome::reject(500, "Out of order CSeq");
                }
                continue; // A retransmission of the same registration: nothing changes.
            }
        }
        changes.retain(|c| !c.is_about(&contact, ob));
        // RFC 5626 §6: an instance's reg-id names one flow; registering it again (from a new
        // connection, another NATed port) replaces the binding that held it.
        if let Some(ob) = &r.outbound {
            for old in &existing {
                if old.outbound.as_ref() == Some(ob) && *old.contact != *contact {
                    changes.push(BindingChange::Remove {
                        aor: aor.clone(),
                        contact: old.contact.clone(),
                    });
                }
            }
        }
        if r.expires == 0 {
            changes.push(BindingChange::Remove {
                aor: aor.clone(),
                contact: contact.into(),
            });
            continue;
        }
        let expires = r.expires.min(cfg.max_expires);
        let written = uri_peer(&r.contact.uri);
        if written.is_some_and(|w| own(&w)) {
            return Outcome::reject(403, "Contact Points At This Server");
        }
        let target = if received_here {
            let ob = r.outbound.is_some();
            reach(nat.mode, written, source, rport, ob)
        } else {
            // Reached along the Path; the Contact names what the edge proxy reaches.
            written.unwrap_or(Peer::new(source.transport, source.addr))
        };
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
                received: Some(source),
                outbound: r.outbound.clone(),
                path: path.clone(),
                node: None,
                via: None,
            },
        });
    }
    let Some(mut headers) = contact_lines(cfg, &existing, &changes, now_unix_ms) else {
        return Outcome::reject(403, "Too Many Contacts");
    };
    if let Some(full) = over_limits(cfg, location, &existing, &changes, source) {
        return full;
    }
    if outbound {
        // §6: the registrar says it kept the flow, and how often the client must keep it
        // alive.
        headers.push_str("Require: outbound\r\nFlow-Timer: ");
        headers.push_str(itoa::Buffer::new().format(nat.flow_timer_s));
        headers.push_str("\r\n");
    }
    if let Some(path) = path.as_deref().filter(|_| supports(msg, b"path")) {
        headers.push_str("Path: ");
        headers.push_str(path);
        headers.push_str("\r\n");
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
        match existing
            .iter()
            .find(|b| b.is(&binding.contact, binding.outbound.as_ref()))
        {
            None => (added, added_here) = (added + 1, added_here + 1),
            Some(b) if b.received.map(|p| p.addr.ip()) != Some(ip) => added_here += 1,
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
    let kept = existing.iter().copied().filter(|b| {
        !changes
            .iter()
            .any(|c| c.is_about(&b.contact, b.outbound.as_ref()))
    });
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
        if let Some(ob) = &b.outbound {
            headers.push_str(";+sip.instance=");
            headers.push_str(&ob.instance);
            headers.push_str(";reg-id=");
            headers.push_str(digits.format(ob.reg_id));
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
