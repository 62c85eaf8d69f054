//! Building messages the server originates: responses to a request, and the ACK for a non-2xx
//! final response (RFC 3261 §17.1.1.3). Header values are copied verbatim from the request, so
//! building costs one output buffer.

use super::rewrite::push_ip;
use super::{HeaderName, Message};

/// Appends the decimal form of `n`. Messages are built on every forward, and this costs a
/// fraction of `write!`'s formatting machinery.
pub(crate) fn push_int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Appends byte strings in order.
pub(crate) fn push_all(out: &mut Vec<u8>, parts: &[&[u8]]) {
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// Appends a status line.
fn status_line(out: &mut Vec<u8>, code: u16, reason: &str) {
    out.extend_from_slice(b"SIP/2.0 ");
    push_int(out, code);
    push_all(out, &[b" ", reason.as_bytes(), b"\r\n"]);
}

/// The default reason phrase for a status code.
pub fn reason_phrase(code: u16) -> &'static str {
    match code {
        100 => "Trying",
        180 => "Ringing",
        183 => "Session Progress",
        200 => "OK",
        202 => "Accepted",
        302 => "Moved Temporarily",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        415 => "Unsupported Media Type",
        416 => "Unsupported URI Scheme",
        420 => "Bad Extension",
        423 => "Interval Too Brief",
        480 => "Temporarily Unavailable",
        481 => "Call/Transaction Does Not Exist",
        482 => "Loop Detected",
        483 => "Too Many Hops",
        487 => "Request Terminated",
        500 => "Server Internal Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        504 => "Server Time-out",
        505 => "Version Not Supported",
        513 => "Message Too Large",
        _ => "Unknown",
    }
}

/// Writes a response to `req` into `out`: Via, From, To (with `to_tag` added when the To has
/// no tag and the code is above 100), Call-ID and CSeq copied; then `extra` header lines (each
/// ending in CRLF), and `body`.
pub fn response(
    req: &Message<'_>,
    code: u16,
    reason: &str,
    to_tag: Option<&str>,
    extra: &[u8],
    body: &[u8],
    out: &mut Vec<u8>,
) {
    response_from(req, None, code, reason, to_tag, extra, body, out);
}

/// [`response`] to a request that came from `source`, when known: its top Via says where the
/// request came from (RFC 3261 §18.2.1 `received`, RFC 3581 `rport` filled in), as a proxy
/// stamps it on the way through, so a phone behind a NAT learns its public address and port
/// from the answer to its REGISTER.
#[allow(
    clippy::too_many_arguments,
    reason = "response's arguments and the source"
)]
pub fn response_from(
    req: &Message<'_>,
    source: Option<std::net::SocketAddr>,
    code: u16,
    reason: &str,
    to_tag: Option<&str>,
    extra: &[u8],
    body: &[u8],
    out: &mut Vec<u8>,
) {
    status_line(out, code, reason);
    let mut first = true;
    for h in req.headers_named(HeaderName::Via) {
        out.extend_from_slice(b"Via: ");
        match source.filter(|_| std::mem::take(&mut first)) {
            Some(source) => stamped_top_via(req, h, source, out),
            None => out.extend_from_slice(req.value(h)),
        }
        out.extend_from_slice(b"\r\n");
    }
    copy_header(req, HeaderName::From, "From", out);
    if let Some(h) = req.header(HeaderName::To) {
        out.extend_from_slice(b"To: ");
        out.extend_from_slice(req.value(h));
        let has_tag = req.to().ok().and_then(|t| t.tag()).is_some();
        if let (false, Some(tag), true) = (has_tag, to_tag, code > 100) {
            push_all(out, &[b";tag=", tag.as_bytes()]);
        }
        out.extend_from_slice(b"\r\n");
    }
    copy_header(req, HeaderName::CallId, "Call-ID", out);
    copy_header(req, HeaderName::CSeq, "CSeq", out);
    out.extend_from_slice(extra);
    out.extend_from_slice(b"Content-Length: ");
    push_int(out, body.len());
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body);
}

/// The value of the first Via line `h`, its first value (the top Via) stamped with where the
/// request came from: `;received=` when the sent-by host is not the source address or
/// `rport` was asked, and a bare `rport` filled in.
fn stamped_top_via(
    req: &Message<'_>,
    h: &super::HeaderField,
    source: std::net::SocketAddr,
    out: &mut Vec<u8>,
) {
    let src = req.as_bytes();
    let via = req.top_via();
    let (start, end) = (h.value_start as usize, h.value_end as usize);
    let sent_by_ip = std::str::from_utf8(via.host_unbracketed())
        .ok()
        .and_then(|h| h.parse::<std::net::IpAddr>().ok());
    let rport = via.rport();
    let needs_received =
        via.received().is_none() && (sent_by_ip != Some(source.ip()) || rport.is_some());
    // The bare `rport`, if any, as an offset in the message.
    let bare = (rport == Some(None))
        .then(|| {
            let params = via.params.0;
            let base = params.as_ptr() as usize - src.as_ptr() as usize;
            super::rewrite::find_param(src, params, b"rport").map(|pos| base + pos)
        })
        .flatten()
        .filter(|at| (start..via.end).contains(at));
    let mut at = start;
    if let Some(r) = bare {
        out.extend_from_slice(&src[at..r]);
        out.extend_from_slice(b"rport=");
        push_int(out, source.port());
        at = r + b"rport".len();
    }
    out.extend_from_slice(&src[at..via.end.max(at)]);
    if needs_received {
        out.extend_from_slice(b";received=");
        push_ip(out, source.ip());
    }
    out.extend_from_slice(&src[via.end.max(at)..end]);
}

fn copy_header(req: &Message<'_>, name: HeaderName, label: &str, out: &mut Vec<u8>) {
    if let Some(v) = req.header_value(name) {
        out.extend_from_slice(label.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes the ACK a client INVITE transaction sends for a non-2xx final response: same
/// Request-URI, top Via, From, Call-ID, CSeq number and Route as the INVITE, To from the
/// response (RFC 3261 §17.1.1.3).
pub fn ack_for_non2xx(invite: &Message<'_>, response: &Message<'_>, out: &mut Vec<u8>) {
    same_hop(b"ACK", invite, response, out);
}

/// Writes a CANCEL for a request this element sent (RFC 3261 §9.1): same Request-URI, top Via,
/// From, To, Call-ID, CSeq number and Route.
pub fn cancel_for(request: &Message<'_>, out: &mut Vec<u8>) {
    same_hop(b"CANCEL", request, request, out);
}

/// Writes a `method` request on the hop of one this element sent (an ACK for a non-2xx, a
/// CANCEL): `sent`'s Request-URI, top Via, From, Call-ID, CSeq number and Route, and the To
/// of `to` (the response for an ACK, the request itself for a CANCEL).
fn same_hop(method: &[u8], sent: &Message<'_>, to: &Message<'_>, out: &mut Vec<u8>) {
    let uri = sent.request_uri().map_or(&b""[..], |u| u.raw);
    out.extend_from_slice(method);
    out.push(b' ');
    out.extend_from_slice(uri);
    out.extend_from_slice(b" SIP/2.0\r\nVia: ");
    let via = sent.top_via();
    out.extend_from_slice(&sent.as_bytes()[via.start..via.end]);
    out.extend_from_slice(b"\r\n");
    copy_header(sent, HeaderName::From, "From", out);
    copy_header(to, HeaderName::To, "To", out);
    copy_header(sent, HeaderName::CallId, "Call-ID", out);
    out.extend_from_slice(b"CSeq: ");
    push_int(out, sent.cseq().seq);
    out.push(b' ');
    out.extend_from_slice(method);
    out.extend_from_slice(b"\r\n");
    for h in sent.headers_named(HeaderName::Route) {
        out.extend_from_slice(b"Route: ");
        out.extend_from_slice(sent.value(h));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n");
}

/// Builds an error response to a request the parser refused, copying its raw Via lines and
/// whichever of From, To, Call-ID and CSeq it has (RFC 4475 §3.1.2.18 asks for a 400 even
/// when they are missing), then `extra` (header lines, each ending in CRLF). Returns false,
/// with nothing written, for responses, ACKs, and text without a Via to answer along.
pub fn salvage_response(
    data: &[u8],
    code: u16,
    reason: &str,
    extra: &[u8],
    out: &mut Vec<u8>,
) -> bool {
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
    let mut vias: Vec<&[u8]> = Vec::new();
    for line in lines {
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let name = super::scan::trim(&line[..colon]);
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
    if vias.is_empty() {
        return false;
    }
    let reason: String = reason.chars().filter(|c| !c.is_control()).collect();
    status_line(out, code, &reason);
    for line in vias.iter().copied().chain(wanted.iter().flatten().copied()) {
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(extra);
    out.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    true
}
