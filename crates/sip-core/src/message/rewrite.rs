//! Rewriting by splicing byte ranges: a proxy forwards the bytes it received with a few edits
//! (a Via added or removed, Max-Forwards decremented, a Record-Route added, a Route removed, the
//! Request-URI retargeted) instead of re-serialising the message.
//!
//! A [`Splice`] collects edits as (offset range of the original, replacement text) and writes
//! the result in one pass. Replacement text is appended to one scratch buffer, so a whole
//! forward costs the output buffer and no per-edit allocation.

use super::build::{push_all, push_int};
use super::{HeaderField, HeaderName, Message};
use std::io::Write as _;

#[derive(Debug, Clone, Copy)]
struct Edit {
    start: usize,
    end: usize,
    text_start: usize,
    text_end: usize,
    /// Orders edits at one offset: inserts keep the order they were added in.
    seq: usize,
}

/// A set of edits over one source buffer.
#[derive(Debug, Default)]
pub struct Splice {
    edits: Vec<Edit>,
    text: Vec<u8>,
}

impl Splice {
    /// An empty set of edits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Clears the edits, keeping the allocations for the next message.
    pub fn clear(&mut self) {
        self.edits.clear();
        self.text.clear();
    }

    /// Replaces `src[start..end]` with text written by `write` (empty range: an insert), into
    /// the splice's own buffer: no allocation for text made of pieces.
    pub fn replace_with(&mut self, start: usize, end: usize, write: impl FnOnce(&mut Vec<u8>)) {
        let text_start = self.text.len();
        write(&mut self.text);
        let seq = self.edits.len();
        self.edits.push(Edit {
            start,
            end,
            text_start,
            text_end: self.text.len(),
            seq,
        });
    }

    /// Replaces `src[start..end]` with `text`.
    pub fn replace(&mut self, start: usize, end: usize, text: &[u8]) {
        self.replace_with(start, end, |t| t.extend_from_slice(text));
    }

    /// Inserts `text` at offset `at`; inserts at one offset keep the order they were added in.
    pub fn insert(&mut self, at: usize, text: &[u8]) {
        self.replace(at, at, text);
    }

    /// Removes `src[start..end]`.
    pub fn remove(&mut self, start: usize, end: usize) {
        self.replace(start, end, b"");
    }

    /// Writes `src` with the edits applied onto `out`. Edits must not overlap.
    pub fn apply(&mut self, src: &[u8], out: &mut Vec<u8>) {
        self.edits
            .sort_unstable_by_key(|e| (e.start, e.end != e.start, e.seq));
        let growth: usize = self.edits.iter().map(|e| e.text_end - e.text_start).sum();
        out.reserve(src.len() + growth);
        let mut pos = 0;
        for e in &self.edits {
            debug_assert!(e.start >= pos, "overlapping splice edits");
            out.extend_from_slice(&src[pos..e.start.max(pos)]);
            out.extend_from_slice(&self.text[e.text_start..e.text_end]);
            pos = e.end.max(pos);
        }
        out.extend_from_slice(&src[pos..]);
    }
}

/// Edits a proxy makes, expressed on a parsed message.
pub struct Rewriter<'m, 'a> {
    /// The message being forwarded; its offsets address the source buffer.
    pub msg: &'m Message<'a>,
    /// The edits collected so far.
    pub splice: &'m mut Splice,
}

impl<'m, 'a> Rewriter<'m, 'a> {
    /// A rewriter over `msg`, clearing what `splice` held.
    pub fn new(msg: &'m Message<'a>, splice: &'m mut Splice) -> Self {
        splice.clear();
        Rewriter { msg, splice }
    }

    /// Adds a Via line above all others; `params` (`;name=value`..., or "") follow the branch.
    pub fn push_via(&mut self, transport: &str, sent_by: &str, branch: &str, params: &str) {
        let at = self.first_line_of(HeaderName::Via);
        self.splice.replace_with(at, at, |t| {
            push_all(
                t,
                &[
                    b"Via: SIP/2.0/",
                    transport.as_bytes(),
                    b" ",
                    sent_by.as_bytes(),
                    b";branch=",
                    branch.as_bytes(),
                    params.as_bytes(),
                    b"\r\n",
                ],
            );
        });
    }

    /// Answers a client's overload control announcement in `via` (one of this message's Via
    /// values): its `oc` and `oc-algo` parameters give way to the server's feedback.
    pub fn set_overload_feedback(&mut self, via: &super::Via<'_>, fb: &crate::overload::Feedback) {
        let base = via.params.0.as_ptr() as usize - self.msg.as_bytes().as_ptr() as usize;
        for (start, end) in crate::overload::announcement_ranges(via.params.0) {
            self.splice.remove(base + start, base + end);
        }
        self.splice.replace_with(via.end, via.end, |t| fb.write(t));
    }

    /// Records the source of a request in its top Via (RFC 3261 §18.2.1, RFC 3581): adds
    /// `received` when the sent-by host is not the source address, fills `rport` if asked.
    /// `always_rport` records the source port even unasked: a stream's source port is the
    /// connection's, which a response must find again (the sent-by port is a listener's).
    pub fn stamp_top_via(&mut self, source: std::net::SocketAddr, always_rport: bool) {
        let (source_ip, source_port) = (source.ip(), source.port());
        let via = *self.msg.top_via();
        let sent_by_ip = std::str::from_utf8(via.host_unbracketed())
            .ok()
            .and_then(|h| h.parse::<std::net::IpAddr>().ok());
        let add_rport = always_rport && via.rport().is_none();
        let needs_received = sent_by_ip != Some(source_ip) || via.rport().is_some() || add_rport;
        if via.rport() == Some(None) {
            // Replace the bare `rport` parameter with a filled one.
            if let Some(pos) = find_param(self.msg.as_bytes(), via.params.0, b"rport") {
                let start =
                    via.params.0.as_ptr() as usize - self.msg.as_bytes().as_ptr() as usize + pos;
                self.splice.replace_with(start, start + 5, |t| {
                    t.extend_from_slice(b"rport=");
                    push_int(t, source_port);
                });
            }
        }
        if (needs_received && via.received().is_none()) || add_rport {
            self.splice.replace_with(via.end, via.end, |t| {
                if needs_received && via.received().is_none() {
                    t.extend_from_slice(b";received=");
                    push_ip(t, source_ip);
                }
                if add_rport {
                    t.extend_from_slice(b";rport=");
                    push_int(t, source_port);
                }
            });
        }
    }

    /// Removes the top Via value (and its line if it was the only value there).
    pub fn pop_via(&mut self) {
        let field = *self.msg.top_via_field();
        let via = *self.msg.top_via();
        self.remove_first_value(&field, via.end);
    }

    /// Removes the first value of a list header line whose first value ends at `value_end`.
    pub fn remove_first_value(&mut self, field: &HeaderField, value_end: usize) {
        let src = self.msg.as_bytes();
        let line_value_end = field.value_end as usize;
        let mut i = value_end;
        while i < line_value_end && super::scan::is_ws(src[i]) {
            i += 1;
        }
        if i < line_value_end && src[i] == b',' {
            i += 1;
            while i < line_value_end && super::scan::is_ws(src[i]) {
                i += 1;
            }
            self.splice.remove(field.value_start as usize, i);
        } else {
            self.splice
                .remove(field.line_start as usize, field.line_end as usize);
        }
    }

    /// Decrements Max-Forwards, or adds `Max-Forwards: 70` when absent.
    pub fn decrement_max_forwards(&mut self) {
        match (
            self.msg.header(HeaderName::MaxForwards),
            self.msg.max_forwards(),
        ) {
            (Some(h), Some(mf)) => {
                let (s, e) = (h.value_start as usize, h.value_end as usize);
                self.splice.replace_with(s, e, |t| {
                    push_int(t, mf.saturating_sub(1));
                });
            }
            _ => {
                let at = self.msg.headers_end();
                self.splice.insert(at, b"Max-Forwards: 70\r\n");
            }
        }
    }

    /// Sets Max-Breadth (RFC 5393) to `breadth`, replacing the value received or adding the
    /// header.
    pub fn set_max_breadth(&mut self, breadth: u32) {
        match self.msg.header(HeaderName::MaxBreadth) {
            Some(h) => {
                let (s, e) = (h.value_start as usize, h.value_end as usize);
                self.splice.replace_with(s, e, |t| {
                    push_int(t, breadth);
                });
            }
            None => {
                let at = self.msg.headers_end();
                self.splice.replace_with(at, at, |t| {
                    t.extend_from_slice(b"Max-Breadth: ");
                    push_int(t, breadth);
                    t.extend_from_slice(b"\r\n");
                });
            }
        }
    }

    /// Adds a Record-Route above any existing ones: `uri`, then the pieces of `params`
    /// (`;name=value` text) written after it.
    pub fn push_record_route(&mut self, uri: &str, params: &[&[u8]]) {
        self.push_uri_header(HeaderName::RecordRoute, uri, params);
    }

    /// Adds a Path (RFC 3327) above any existing ones, as [`Rewriter::push_record_route`]
    /// adds a Record-Route.
    pub fn push_path(&mut self, uri: &str, params: &[&[u8]]) {
        self.push_uri_header(HeaderName::Path, uri, params);
    }

    fn push_uri_header(&mut self, name: HeaderName, uri: &str, params: &[&[u8]]) {
        let at = self
            .msg
            .header(name)
            .map_or(self.msg.headers_end(), |h| h.line_start as usize);
        self.splice.replace_with(at, at, |t| {
            push_all(t, &[name.as_str().as_bytes(), b": <", uri.as_bytes()]);
            push_all(t, params);
            t.extend_from_slice(b">\r\n");
        });
    }

    /// Adds a Route line above any existing ones, its values (`<uri>, <uri>`) as given: a
    /// pre-loaded route set, such as a registration's Path (RFC 3327).
    pub fn push_route(&mut self, values: &[u8]) {
        let at = self.first_line_of(HeaderName::Route);
        self.splice.replace_with(at, at, |t| {
            push_all(t, &[b"Route: ", values, b"\r\n"]);
        });
    }

    /// Adds a header line after all others: `name: value`.
    pub fn append_header(&mut self, name: &[u8], value: &[u8]) {
        let at = self.msg.headers_end();
        self.splice.replace_with(at, at, |t| {
            push_all(t, &[name, b": ", value, b"\r\n"]);
        });
    }

    /// Replaces the Request-URI.
    pub fn set_request_uri(&mut self, uri: &[u8]) {
        if let Some((s, e)) = self.msg.request_uri_range() {
            self.splice.replace(s, e, uri);
        }
    }

    fn first_line_of(&self, name: HeaderName) -> usize {
        self.msg
            .header(name)
            .map_or(self.msg.headers_end(), |h| h.line_start as usize)
    }

    /// Writes the rewritten message. One that came without Content-Length (legal on UDP,
    /// where the datagram ends the body) gets one naming its body: forwarded onto a stream
    /// without it, the next hop could not tell where it ends, and would close the shared
    /// connection or read the body as a second, smuggled message (RFC 3261 §18.3).
    pub fn finish(self, out: &mut Vec<u8>) {
        if self.msg.header(HeaderName::ContentLength).is_none() {
            let at = self.msg.headers_end();
            let len = self.msg.body().len();
            // A datagram may even lack the empty line ending its headers.
            let unterminated = self.msg.body_start() == at;
            self.splice.replace_with(at, at, |t| {
                t.extend_from_slice(b"Content-Length: ");
                push_int(t, len);
                t.extend_from_slice(if unterminated { b"\r\n\r\n" } else { b"\r\n" });
            });
        }
        self.splice.apply(self.msg.as_bytes(), out);
    }
}

/// Appends an IP address as text: IPv4 (nearly every address here) without the formatting
/// machinery.
pub(super) fn push_ip(out: &mut Vec<u8>, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                push_int(out, octet);
            }
        }
        std::net::IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// Finds the offset of parameter `name` (its name's first byte) within a `;a;b=c` string.
pub(super) fn find_param(_src: &[u8], params: &[u8], name: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < params.len() {
        if params[i] == b';' {
            let mut j = i + 1;
            while j < params.len() && super::scan::is_ws(params[j]) {
                j += 1;
            }
            let end = j + name.len();
            if end <= params.len()
                && params[j..end].eq_ignore_ascii_case(name)
                && params.get(end).is_none_or(|b| !super::scan::is_token(*b))
            {
                return Some(j);
            }
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{push_ip, Rewriter, Splice};
    use crate::message::Message;

    #[test]
    fn an_appended_header_is_the_last_before_the_body() {
        for (text, body) in [
            (&b"INVITE sip:b@h SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nFrom: <sip:a@h>;tag=1\r\nTo: <sip:b@h>\r\nCall-ID: x\r\nCSeq: 1 INVITE\r\nContent-Length: 2\r\n\r\nhi"[..], &b"hi"[..]),
            // A datagram without Content-Length gets one, after the appended header.
            (&b"INVITE sip:b@h SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nFrom: <sip:a@h>;tag=1\r\nTo: <sip:b@h>\r\nCall-ID: x\r\nCSeq: 1 INVITE\r\n\r\nhi"[..], &b"hi"[..]),
        ] {
            let msg = Message::parse(text).unwrap();
            let mut splice = Splice::new();
            let mut rw = Rewriter::new(&msg, &mut splice);
            rw.append_header(b"Identity", b"a.b.c;info=<https://x/c>");
            let mut out = Vec::new();
            rw.finish(&mut out);
            let again = Message::parse(&out).unwrap();
            assert_eq!(
                again.other_header(b"identity"),
                Some(&b"a.b.c;info=<https://x/c>"[..])
            );
            assert_eq!(again.body(), body);
        }
    }

    #[test]
    fn addresses_are_written_as_std_writes_them() {
        for ip in [
            "0.0.0.0",
            "192.168.10.255",
            "255.255.255.255",
            "::1",
            "2001:db8::7",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            assert_eq!(out, ip.to_string().as_bytes());
        }
    }
}
