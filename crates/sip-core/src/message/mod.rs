//! Zero-copy, lazy SIP message parsing (RFC 3261 §7, §20, §25).
//!
//! [`Message::parse`] walks the bytes once: it parses the start line, indexes every header
//! line (name kind and byte ranges; folded lines join the header above), frames the body by
//! Content-Length, and parses only what every message needs anyway to be routed or matched to
//! a transaction: the top Via, CSeq, Call-ID and Max-Forwards, plus the presence of From and
//! To. Everything else stays bytes until someone asks: `from()`, `to()`, `contacts()`,
//! `routes()` parse on demand, and [`Message::check_all`] validates every header the library
//! understands (what a strict endpoint or the RFC 4475 suite wants; a proxy does not need it).
//!
//! Nothing is copied: a `Message<'a>` borrows the receive buffer, and its views report
//! absolute offsets so [`rewrite`] can splice the bytes for forwarding.

pub mod build;
mod error;
pub mod framing;
mod header;
pub mod rewrite;
pub mod scan;
pub mod uri;
pub mod values;

pub use error::ParseError;
pub use header::HeaderName;
pub use uri::{Scheme, Uri};
pub use values::{CSeq, NameAddr, Via};

use scan::{is_token, parse_u64, Cursor};
use smallvec::SmallVec;
use std::cell::OnceCell;

/// A request method. Methods compare case-sensitively (RFC 3261 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Starts a session (RFC 3261 §13).
    Invite,
    /// Acknowledges a final response to an INVITE (RFC 3261 §13.2.2.4, §17.1.1.3).
    Ack,
    /// Ends a dialog (RFC 3261 §15).
    Bye,
    /// Cancels a pending INVITE (RFC 3261 §9).
    Cancel,
    /// Binds a contact to an address of record (RFC 3261 §10).
    Register,
    /// Queries a server's or user agent's capabilities (RFC 3261 §11).
    Options,
    /// Carries application information within a dialog (RFC 6086).
    Info,
    /// Modifies a session before the INVITE completes (RFC 3311).
    Update,
    /// Acknowledges a reliable provisional response (RFC 3262).
    Prack,
    /// Requests event notifications (RFC 6665).
    Subscribe,
    /// Reports an event to a subscriber (RFC 6665).
    Notify,
    /// Asks the recipient to contact a third party (RFC 3515).
    Refer,
    /// Carries an instant message (RFC 3428).
    Message,
    /// Publishes event state to a compositor (RFC 3903).
    Publish,
    /// An extension method; its text is in [`Message::method_raw`].
    Other,
}

impl Method {
    /// The method named by `b`, matched case-sensitively; any other token is [`Method::Other`].
    pub fn from_bytes(b: &[u8]) -> Method {
        match b {
            b"INVITE" => Method::Invite,
            b"ACK" => Method::Ack,
            b"BYE" => Method::Bye,
            b"CANCEL" => Method::Cancel,
            b"REGISTER" => Method::Register,
            b"OPTIONS" => Method::Options,
            b"INFO" => Method::Info,
            b"UPDATE" => Method::Update,
            b"PRACK" => Method::Prack,
            b"SUBSCRIBE" => Method::Subscribe,
            b"NOTIFY" => Method::Notify,
            b"REFER" => Method::Refer,
            b"MESSAGE" => Method::Message,
            b"PUBLISH" => Method::Publish,
            _ => Method::Other,
        }
    }

    /// The method's token as written on the wire; empty for [`Method::Other`].
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Invite => "INVITE",
            Method::Ack => "ACK",
            Method::Bye => "BYE",
            Method::Cancel => "CANCEL",
            Method::Register => "REGISTER",
            Method::Options => "OPTIONS",
            Method::Info => "INFO",
            Method::Update => "UPDATE",
            Method::Prack => "PRACK",
            Method::Subscribe => "SUBSCRIBE",
            Method::Notify => "NOTIFY",
            Method::Refer => "REFER",
            Method::Message => "MESSAGE",
            Method::Publish => "PUBLISH",
            Method::Other => "",
        }
    }
}

/// The first line of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartLine<'a> {
    /// A request line: `Method Request-URI SIP/2.0` (RFC 3261 §7.1).
    Request {
        /// The method, or [`Method::Other`] for an extension.
        method: Method,
        /// The method token as written.
        method_raw: &'a [u8],
        /// The parsed Request-URI.
        uri: Uri<'a>,
        /// Absolute offsets of the Request-URI.
        uri_start: usize,
        /// Absolute offset just past the Request-URI.
        uri_end: usize,
    },
    /// A status line: `SIP/2.0 Status-Code Reason-Phrase` (RFC 3261 §7.2).
    Response {
        /// The status code, 100 to 699.
        code: u16,
        /// The reason phrase as written; may be empty.
        reason: &'a [u8],
    },
}

/// One indexed header line: its kind and where its name, value and whole line sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderField {
    /// What header this line is, `Other` for one the core does not recognise.
    pub name: HeaderName,
    pub(crate) name_start: u32,
    pub(crate) name_end: u32,
    pub(crate) value_start: u32,
    pub(crate) value_end: u32,
    /// The whole line including continuation lines and the final line break.
    pub line_start: u32,
    pub(crate) line_end: u32,
}

/// A parsed SIP message borrowing its buffer.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    buf: &'a [u8],
    start: StartLine<'a>,
    headers: SmallVec<[HeaderField; 24]>,
    headers_end: usize,
    body_start: usize,
    body_end: usize,
    top_via: Via<'a>,
    top_via_field: usize,
    cseq: CSeq<'a>,
    call_id: &'a [u8],
    max_forwards: Option<u8>,
    /// From and To, parsed on first use: a proxy asks for their tags, a registrar for To's
    /// URI, a local response for From's tag, each once per message rather than once a question.
    from: OnceCell<Result<NameAddr<'a>, ParseError>>,
    to: OnceCell<Result<NameAddr<'a>, ParseError>>,
}

fn find_line_end(buf: &[u8], from: usize) -> Option<(usize, usize)> {
    // Returns (content end, next line start); accepts CRLF and bare LF.
    let nl = memchr::memchr(b'\n', &buf[from..])? + from;
    let content_end = if nl > from && buf[nl - 1] == b'\r' {
        nl - 1
    } else {
        nl
    };
    Some((content_end, nl + 1))
}

/// Bytes that may not appear in a header line: the ASCII controls but horizontal tab, and DEL.
fn is_forbidden_control(b: u8) -> bool {
    (b < 0x20 && b != b'\t') || b == 0x7f
}

/// Whether a header line holds a control character that is not escaped by a quoted-pair
/// inside a quoted string (`"\<NUL>"` is text, RFC 3261 §25.1 and RFC 4475's intmeth).
fn has_bare_control(line: &[u8]) -> bool {
    // Every byte of every header line passes here: the first look has no early exit, so the
    // compiler tests many bytes at once (`any` went byte by byte: a fifth of a proxied call's
    // instructions in the worker).
    if line
        .iter()
        .fold(0u8, |seen, &b| seen | u8::from(is_forbidden_control(b)))
        == 0
    {
        return false;
    }
    let (mut quoted, mut escaped) = (false, false);
    for &b in line {
        if escaped {
            // A quoted-pair may escape any control but CR and LF.
            if b == b'\r' {
                return true;
            }
            escaped = false;
        } else if is_forbidden_control(b) {
            return true;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        }
    }
    false
}

fn is_sip_version(v: &[u8]) -> bool {
    v.len() == 7 && v[..4].eq_ignore_ascii_case(b"SIP/") && &v[4..] == b"2.0"
}

/// Recognises `SIP/x.y` with another version (answered 505, not 400).
fn is_other_sip_version(v: &[u8]) -> bool {
    v.len() > 4
        && v[..4].eq_ignore_ascii_case(b"SIP/")
        && v[4..].iter().all(|b| b.is_ascii_digit() || *b == b'.')
}

fn parse_start_line(buf: &[u8], end: usize) -> Result<StartLine<'_>, ParseError> {
    let line = &buf[..end];
    if line.len() >= 4 && line[..4].eq_ignore_ascii_case(b"SIP/") {
        let sp = line
            .iter()
            .position(|b| *b == b' ')
            .ok_or(ParseError::StartLine("missing status code"))?;
        let version = &line[..sp];
        if !is_sip_version(version) {
            return Err(if is_other_sip_version(version) {
                ParseError::Version
            } else {
                ParseError::StartLine("bad version")
            });
        }
        let rest = &line[sp + 1..];
        let code_end = rest.iter().position(|b| *b == b' ').unwrap_or(rest.len());
        let code = &rest[..code_end];
        if code.len() != 3 {
            return Err(ParseError::StatusCode);
        }
        let code = parse_u64(code)
            .filter(|c| (100..700).contains(c))
            .ok_or(ParseError::StatusCode)? as u16;
        let reason = if code_end < rest.len() {
            &rest[code_end + 1..]
        } else {
            b"" as &[u8]
        };
        return Ok(StartLine::Response { code, reason });
    }
    let sp1 = line
        .iter()
        .position(|b| *b == b' ')
        .ok_or(ParseError::StartLine("not a request or response line"))?;
    let method_raw = &line[..sp1];
    if method_raw.is_empty() || !method_raw.iter().all(|b| is_token(*b)) {
        return Err(ParseError::StartLine("bad method"));
    }
    let uri_start = sp1 + 1;
    let sp2 = line[uri_start..]
        .iter()
        .position(|b| *b == b' ')
        .ok_or(ParseError::StartLine("missing SIP version"))?
        + uri_start;
    if sp2 == uri_start {
        return Err(ParseError::StartLine("extra whitespace"));
    }
    let version = &line[sp2 + 1..];
    if !is_sip_version(version) {
        if version.last().is_some_and(|b| scan::is_ws(*b)) && is_sip_version(scan::trim(version)) {
            return Err(ParseError::StartLine("trailing whitespace"));
        }
        if version.first() == Some(&b' ') {
            return Err(ParseError::StartLine("extra whitespace"));
        }
        return Err(if is_other_sip_version(version) {
            ParseError::Version
        } else {
            ParseError::StartLine("junk after Request-URI")
        });
    }
    let raw_uri = &line[uri_start..sp2];
    let uri = Uri::parse(raw_uri).map_err(|e| ParseError::RequestUri(e.as_str()))?;
    if !uri.headers.is_empty() {
        return Err(ParseError::RequestUri("headers not allowed"));
    }
    Ok(StartLine::Request {
        method: Method::from_bytes(method_raw),
        method_raw,
        uri,
        uri_start,
        uri_end: sp2,
    })
}

impl<'a> Message<'a> {
    /// Parses one complete message: a UDP datagram, or a frame cut by [`framing`]. Octets past
    /// the Content-Length are ignored (RFC 3261 §18.3).
    pub fn parse(buf: &'a [u8]) -> Result<Message<'a>, ParseError> {
        if buf.iter().all(|b| scan::is_ws(*b)) {
            return Err(ParseError::Empty);
        }
        let (sl_end, mut pos) = find_line_end(buf, 0).ok_or(ParseError::Unterminated)?;
        let start = parse_start_line(buf, sl_end)?;

        let mut headers: SmallVec<[HeaderField; 24]> = SmallVec::new();
        let headers_end;
        let body_start;
        loop {
            // A datagram whose last header line lacks the empty line (or even its CRLF) is
            // accepted with an empty body, so the real fault in such a message gets named.
            let (content_end, next) = if pos >= buf.len() {
                (pos, pos)
            } else {
                find_line_end(buf, pos).unwrap_or((buf.len(), buf.len()))
            };
            if content_end == pos {
                headers_end = pos;
                body_start = next;
                break;
            }
            // A control character (NUL, a bare CR, ...) has no place in a header line
            // (RFC 3261 §25.1: TEXT-UTF8 and LWS); forwarded, it could end a C string or a
            // line early at the next hop.
            if has_bare_control(&buf[pos..content_end]) {
                return Err(ParseError::HeaderLine("control character"));
            }
            let first = buf[pos];
            if first == b' ' || first == b'\t' {
                let last = headers
                    .last_mut()
                    .ok_or(ParseError::HeaderLine("continuation before any header"))?;
                last.value_end = content_end as u32;
                last.line_end = next as u32;
            } else {
                let colon = buf[pos..content_end]
                    .iter()
                    .position(|b| *b == b':')
                    .ok_or(ParseError::HeaderLine("missing colon"))?
                    + pos;
                let name = scan::trim(&buf[pos..colon]);
                if name.is_empty() || !name.iter().all(|b| is_token(*b)) || scan::is_ws(buf[pos]) {
                    return Err(ParseError::HeaderLine("bad header name"));
                }
                let mut value_start = colon + 1;
                while value_start < content_end && scan::is_ws(buf[value_start]) {
                    value_start += 1;
                }
                headers.push(HeaderField {
                    name: HeaderName::from_bytes(name),
                    name_start: pos as u32,
                    name_end: (pos + name.len()) as u32,
                    value_start: value_start as u32,
                    value_end: content_end as u32,
                    line_start: pos as u32,
                    line_end: next as u32,
                });
            }
            pos = next;
        }
        for h in headers.iter_mut() {
            let (s, mut e) = (h.value_start as usize, h.value_end as usize);
            while e > s && scan::is_ws(buf[e - 1]) {
                e -= 1;
            }
            // A value that is all folds starts after its end; clamp to empty.
            h.value_start = h.value_start.min(e as u32);
            h.value_end = e as u32;
        }

        let find_unique =
            |name: HeaderName, label: &'static str| -> Result<Option<usize>, ParseError> {
                let mut found = None;
                for (i, h) in headers.iter().enumerate() {
                    if h.name == name {
                        if found.is_some() {
                            return Err(ParseError::Duplicate(label));
                        }
                        found = Some(i);
                    }
                }
                Ok(found)
            };
        let value = |i: usize| &buf[headers[i].value_start as usize..headers[i].value_end as usize];

        let body_end = match find_unique(HeaderName::ContentLength, "Content-Length")? {
            Some(i) => {
                let v = value(i);
                if v.first() == Some(&b'-') {
                    return Err(ParseError::header("Content-Length", "negative"));
                }
                let len = parse_u64(v)
                    .and_then(|l| usize::try_from(l).ok())
                    .ok_or(ParseError::header("Content-Length", "not a number"))?;
                if len > buf.len().saturating_sub(body_start) {
                    return Err(ParseError::ContentLengthTooLarge);
                }
                body_start + len
            }
            None => buf.len().max(body_start),
        };

        let via_i = headers
            .iter()
            .position(|h| h.name == HeaderName::Via)
            .ok_or(ParseError::Missing("Via"))?;
        let mut c = Cursor::new(
            buf,
            headers[via_i].value_start as usize,
            headers[via_i].value_end as usize,
        );
        let top_via = values::parse_via(&mut c)?;
        c.skip_ws();
        if !c.at_end() && c.peek() != Some(b',') {
            return Err(ParseError::header("Via", "junk after value"));
        }

        let cseq_i = find_unique(HeaderName::CSeq, "CSeq")?.ok_or(ParseError::Missing("CSeq"))?;
        let cseq = values::parse_cseq(value(cseq_i))?;
        if let StartLine::Request { method_raw, .. } = start {
            // A CANCEL or ACK carries its own method in CSeq too (RFC 3261 §9.1, §17.1.1.3).
            if cseq.method != method_raw {
                return Err(ParseError::CSeqMethodMismatch);
            }
        }
        let call_id_i =
            find_unique(HeaderName::CallId, "Call-ID")?.ok_or(ParseError::Missing("Call-ID"))?;
        let call_id = value(call_id_i);
        if call_id.is_empty() || call_id.iter().any(|b| scan::is_ws(*b)) {
            return Err(ParseError::header(
                "Call-ID",
                "empty or contains whitespace",
            ));
        }
        find_unique(HeaderName::From, "From")?.ok_or(ParseError::Missing("From"))?;
        find_unique(HeaderName::To, "To")?.ok_or(ParseError::Missing("To"))?;
        let max_forwards = match find_unique(HeaderName::MaxForwards, "Max-Forwards")? {
            Some(i) => Some(values::parse_max_forwards(value(i))?),
            None => None,
        };

        Ok(Message {
            buf,
            start,
            headers,
            headers_end,
            body_start,
            body_end,
            top_via,
            top_via_field: via_i,
            cseq,
            call_id,
            max_forwards,
            from: OnceCell::new(),
            to: OnceCell::new(),
        })
    }

    /// The message bytes, without any octets past the body.
    pub fn as_bytes(&self) -> &'a [u8] {
        &self.buf[..self.body_end]
    }

    /// The parsed first line: a request line or a status line.
    pub fn start_line(&self) -> &StartLine<'a> {
        &self.start
    }

    /// Whether the message is a request (a response otherwise).
    pub fn is_request(&self) -> bool {
        matches!(self.start, StartLine::Request { .. })
    }

    /// The request method, or the CSeq method of a response.
    pub fn method(&self) -> Method {
        match self.start {
            StartLine::Request { method, .. } => method,
            StartLine::Response { .. } => Method::from_bytes(self.cseq.method),
        }
    }

    /// The method as written (request line, or CSeq for a response).
    pub fn method_raw(&self) -> &'a [u8] {
        match self.start {
            StartLine::Request { method_raw, .. } => method_raw,
            StartLine::Response { .. } => self.cseq.method,
        }
    }

    /// The Request-URI of a request; `None` for a response.
    pub fn request_uri(&self) -> Option<&Uri<'a>> {
        match &self.start {
            StartLine::Request { uri, .. } => Some(uri),
            StartLine::Response { .. } => None,
        }
    }

    /// Absolute offsets of the Request-URI (requests only).
    pub(crate) fn request_uri_range(&self) -> Option<(usize, usize)> {
        match self.start {
            StartLine::Request {
                uri_start, uri_end, ..
            } => Some((uri_start, uri_end)),
            StartLine::Response { .. } => None,
        }
    }

    /// The status code of a response; `None` for a request.
    pub fn status(&self) -> Option<u16> {
        match self.start {
            StartLine::Response { code, .. } => Some(code),
            StartLine::Request { .. } => None,
        }
    }

    /// Every header line, in message order.
    pub fn headers(&self) -> &[HeaderField] {
        &self.headers
    }

    /// Offset of the empty line ending the headers: where new headers can be appended.
    pub(crate) fn headers_end(&self) -> usize {
        self.headers_end
    }

    /// The value of a header line: from after the colon and its whitespace to the end of the
    /// line, continuation lines included.
    pub fn value(&self, h: &HeaderField) -> &'a [u8] {
        &self.buf[h.value_start as usize..h.value_end as usize]
    }

    /// The first header line of this kind.
    pub fn header(&self, name: HeaderName) -> Option<&HeaderField> {
        self.headers.iter().find(|h| h.name == name)
    }

    /// The value of the first header line of this kind.
    pub fn header_value(&self, name: HeaderName) -> Option<&'a [u8]> {
        self.header(name).map(|h| self.value(h))
    }

    /// Every line of one header kind, in order.
    pub fn headers_named(&self, name: HeaderName) -> impl Iterator<Item = &HeaderField> + '_ {
        self.headers.iter().filter(move |h| h.name == name)
    }

    /// Looks up a header that the core has no name for, case-insensitively.
    pub fn other_header(&self, name: &[u8]) -> Option<&'a [u8]> {
        self.headers
            .iter()
            .find(|h| {
                h.name == HeaderName::Other
                    && self.buf[h.name_start as usize..h.name_end as usize]
                        .eq_ignore_ascii_case(name)
            })
            .map(|h| self.value(h))
    }

    /// The values of every line of a header the core has no name for, case-insensitively, in
    /// order.
    pub fn other_headers<'s>(&'s self, name: &'s [u8]) -> impl Iterator<Item = &'a [u8]> + 's {
        self.headers
            .iter()
            .filter(move |h| {
                h.name == HeaderName::Other
                    && self.buf[h.name_start as usize..h.name_end as usize]
                        .eq_ignore_ascii_case(name)
            })
            .map(|h| self.value(h))
    }

    /// All comma-separated values of a list header, across its lines.
    pub fn list_values(&self, name: HeaderName) -> impl Iterator<Item = &'a [u8]> + '_ {
        let buf = self.buf;
        self.headers_named(name)
            .flat_map(move |h| {
                scan::split_commas(&buf[h.value_start as usize..h.value_end as usize])
            })
            .filter(|v| !v.is_empty())
    }

    /// The top Via (RFC 3261 §8.1.1.7), parsed with the message.
    pub fn top_via(&self) -> &Via<'a> {
        &self.top_via
    }

    /// The header line holding the top Via.
    pub(crate) fn top_via_field(&self) -> &HeaderField {
        &self.headers[self.top_via_field]
    }

    /// The Via below the top one (where a response goes after the top hop pops its own), parsing
    /// only that value.
    pub fn second_via(&self) -> Option<Result<Via<'a>, ParseError>> {
        let mut c = self.below_top_via().next()?;
        Some(values::parse_via(&mut c))
    }

    /// Visits every Via value top to bottom. The top one was parsed with the message and is
    /// not parsed again.
    pub fn vias(&self, mut each: impl FnMut(Via<'a>)) -> Result<(), ParseError> {
        each(self.top_via);
        for c in self.below_top_via() {
            values::parse_via_list(self.buf, c.pos, c.end, &mut each)?;
        }
        Ok(())
    }

    /// Where the Via values below the top one are written: the rest of the top one's line
    /// after its comma, if any, then every later Via line.
    fn below_top_via(&self) -> impl Iterator<Item = Cursor<'a>> + '_ {
        let top = &self.headers[self.top_via_field];
        // `parse` checked that the top value ends its line or is followed by a comma.
        let mut c = Cursor::new(self.buf, self.top_via.end, top.value_end as usize);
        c.skip_ws();
        let rest_of_line = c.eat(b',').then_some(c);
        let later_lines = self.headers[self.top_via_field + 1..]
            .iter()
            .filter(|h| h.name == HeaderName::Via)
            .map(|h| Cursor::new(self.buf, h.value_start as usize, h.value_end as usize));
        rest_of_line.into_iter().chain(later_lines)
    }

    /// The CSeq header (RFC 3261 §8.1.1.5).
    pub fn cseq(&self) -> &CSeq<'a> {
        &self.cseq
    }

    /// The Call-ID value (RFC 3261 §8.1.1.4): non-empty, without whitespace.
    pub fn call_id(&self) -> &'a [u8] {
        self.call_id
    }

    /// The Max-Forwards value (RFC 3261 §8.1.1.6); `None` when the header is absent.
    pub fn max_forwards(&self) -> Option<u8> {
        self.max_forwards
    }

    /// The delta-seconds of a Retry-After header (RFC 3261 §20.33), without its comment or
    /// parameters; None when there is none or it is not a number.
    pub fn retry_after(&self) -> Option<u32> {
        let v = self.header_value(HeaderName::RetryAfter)?;
        let digits = v.iter().take_while(|b| b.is_ascii_digit()).count();
        std::str::from_utf8(&v[..digits]).ok()?.parse().ok()
    }

    fn single_name_addr(
        &self,
        name: HeaderName,
        label: &'static str,
    ) -> Result<NameAddr<'a>, ParseError> {
        let h = self.header(name).ok_or(ParseError::Missing(label))?;
        values::parse_single_name_addr(
            self.buf,
            h.value_start as usize,
            h.value_end as usize,
            label,
        )
    }

    /// The From header (parsed once, on first use).
    pub fn from(&self) -> Result<NameAddr<'a>, ParseError> {
        *self
            .from
            .get_or_init(|| self.single_name_addr(HeaderName::From, "From"))
    }

    /// The To header (parsed once, on first use).
    pub fn to(&self) -> Result<NameAddr<'a>, ParseError> {
        *self
            .to
            .get_or_init(|| self.single_name_addr(HeaderName::To, "To"))
    }

    /// Visits name-addr values of a list header (Contact, Route, Record-Route) in order.
    pub fn name_addrs(
        &self,
        name: HeaderName,
        mut each: impl FnMut(&HeaderField, NameAddr<'a>),
    ) -> Result<(), ParseError> {
        let label = match name {
            HeaderName::Route => "Route",
            HeaderName::RecordRoute => "Record-Route",
            _ => "Contact",
        };
        for h in self.headers_named(name) {
            values::parse_name_addr_list(
                self.buf,
                h.value_start as usize,
                h.value_end as usize,
                label,
                |na| each(h, na),
            )?;
        }
        Ok(())
    }

    /// True when the Contact header is the wildcard `*`.
    pub fn contact_is_star(&self) -> bool {
        self.headers_named(HeaderName::Contact)
            .any(|h| self.value(h) == b"*")
    }

    /// The body: the bytes after the empty line, as many as Content-Length says (the rest of the
    /// datagram if there is none).
    pub fn body(&self) -> &'a [u8] {
        &self.buf[self.body_start..self.body_end]
    }

    /// Offset where the body starts.
    pub(crate) fn body_start(&self) -> usize {
        self.body_start
    }

    /// The Expires header, if present and valid.
    pub fn expires(&self) -> Option<Result<u32, ParseError>> {
        self.header_value(HeaderName::Expires)
            .map(|v| values::parse_delta_seconds(v, "Expires"))
    }

    /// The Max-Breadth header (RFC 5393 §5), if present and valid.
    pub fn max_breadth(&self) -> Option<Result<u32, ParseError>> {
        self.header_value(HeaderName::MaxBreadth)
            .map(|v| values::parse_delta_seconds(v, "Max-Breadth"))
    }

    /// Validates every header the library understands, strictly. The eager parse already
    /// checked the essentials; this adds From, To, all Vias, Contact, Route, Record-Route,
    /// Expires, Min-Expires, Date, Retry-After, Warning and Content-Type.
    pub fn check_all(&self) -> Result<(), ParseError> {
        self.vias(|_| {})?;
        self.from()?;
        self.to()?;
        for h in self.headers.iter() {
            let v = self.value(h);
            match h.name {
                HeaderName::Contact if v != b"*" => {
                    values::parse_name_addr_list(
                        self.buf,
                        h.value_start as usize,
                        h.value_end as usize,
                        "Contact",
                        |_| {},
                    )?;
                }
                HeaderName::Contact => {}
                HeaderName::Route | HeaderName::RecordRoute => {
                    self.name_addrs(h.name, |_, _| {})?;
                }
                HeaderName::Expires => {
                    values::parse_delta_seconds(v, "Expires")?;
                }
                HeaderName::MinExpires => {
                    values::parse_delta_seconds(v, "Min-Expires")?;
                }
                HeaderName::Date => values::check_date(v)?,
                HeaderName::RetryAfter => values::check_retry_after(v)?,
                HeaderName::Warning => values::check_warning(v)?,
                HeaderName::ContentType => {
                    let mut c = Cursor::new(self.buf, h.value_start as usize, h.value_end as usize);
                    if c.token().is_none() || !c.eat_sep(b'/') || c.token().is_none() {
                        return Err(ParseError::header("Content-Type", "bad media type"));
                    }
                }
                _ => {}
            }
        }
        let mut bad_expires = false;
        self.name_addrs(HeaderName::Contact, |_, na| {
            if let Some(e) = na.params.get(b"expires") {
                bad_expires |= e.is_none_or(|e| values::parse_delta_seconds(e, "Contact").is_err());
            }
        })
        .or_else(|e| {
            if self.contact_is_star() {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        if bad_expires {
            return Err(ParseError::header("Contact", "bad expires parameter"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
