//! Messages the parser refused: answered with the status and reason the fault calls for when
//! enough of the raw text can be salvaged to address a response, dropped and counted otherwise.

use super::stats::inc;
use super::{Effects, Engine, SERVER};
use crate::transport::Peer;
use bytes::Bytes;
use sip_core::message::{HeaderName, ParseError};
use sip_core::timer::Millis;
use smallvec::SmallVec;

impl Engine {
    /// Answers a message the parser refused, when enough of it is readable to address a
    /// response; otherwise drops it. Never answers a response or an ACK.
    pub(super) fn reject_unparsed(
        &mut self,
        now: Millis,
        source: Peer,
        data: &[u8],
        err: ParseError,
        fx: &mut Effects,
    ) {
        if self.log.allow(now) {
            tracing::warn!(%source, "rejected message: {err}");
        }
        let mut out = Vec::new();
        if salvage_response(data, err.status(), &err.reason(), &mut out) {
            inc(&self.stats.local_responses);
            fx.transmits.push((source, Bytes::from(out)));
        } else {
            inc(&self.stats.malformed_dropped);
        }
    }
}

/// Builds an error response to a request the parser refused, copying the raw Via, From, To,
/// Call-ID and CSeq lines. Returns false (nothing to send) for responses, ACKs, or when any
/// of those headers is missing.
pub(super) fn salvage_response(data: &[u8], code: u16, reason: &str, out: &mut Vec<u8>) -> bool {
    let mut lines = data
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let Some(first) = lines.next() else {
        return false;
    };
    if first.len() >= 4 && first[..4].eq_ignore_ascii_case(b"SIP/") || first.starts_with(b"ACK ") {
        return false;
    }
    let mut wanted: [Option<&[u8]>; 4] = [None; 4];
    let mut vias: SmallVec<[&[u8]; 4]> = SmallVec::new();
    for line in lines {
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let name = sip_core::message::scan::trim(&line[..colon]);
        let slot = match HeaderName::from_bytes(name) {
            HeaderName::Via => {
                vias.push(line);
                continue;
            }
            HeaderName::From => 0,
            HeaderName::To => 1,
            HeaderName::CallId => 2,
            HeaderName::CSeq => 3,
            _ => continue,
        };
        wanted[slot].get_or_insert(line);
    }
    if vias.is_empty() || wanted.iter().any(Option::is_none) {
        return false;
    }
    let reason: String = reason.chars().filter(|c| !c.is_control()).collect();
    let _ = std::io::Write::write_fmt(out, format_args!("SIP/2.0 {code} {reason}\r\n"));
    for line in vias.iter().copied().chain(wanted.iter().flatten().copied()) {
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(SERVER.as_bytes());
    out.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    true
}
