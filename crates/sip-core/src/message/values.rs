//! Parsers for the header values the core decides on: Via, CSeq, name-addr headers (From, To,
//! Contact, Route, Record-Route), and scalar values. Each works on an absolute range of the
//! message buffer so the positions it reports can be spliced.

use super::error::ParseError;
use super::scan::{class, eq_ic, is, is_token, parse_u64, Cursor};
use super::uri::{param_lookup, split_hostport, Uri, UriError};

/// Header parameters (`;tag=x;expires=60`) as written, leading `;` included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Params<'a>(pub &'a [u8]);

impl<'a> Params<'a> {
    /// `Some(None)` for a parameter present without a value.
    pub fn get(&self, name: &[u8]) -> Option<Option<&'a [u8]>> {
        param_lookup(self.0, b';', name)
    }
}

/// Parses `*(SEMI generic-param)` at the cursor; stops before anything else (a comma, the end).
/// Every parameter needs a name; a value is a token, a host or a quoted string (quotes kept).
/// `each` sees every parameter, name and value, as it is parsed.
fn parse_params<'a>(
    c: &mut Cursor<'a>,
    header: &'static str,
    mut each: impl FnMut(&'a [u8], Option<&'a [u8]>),
) -> Result<Params<'a>, ParseError> {
    let start = c.pos;
    let mut end = c.pos;
    while c.eat_sep(b';') {
        let name = c
            .token()
            .ok_or(ParseError::header(header, "empty parameter"))?;
        let mut value = None;
        if c.eat_sep(b'=') {
            let v = if c.peek() == Some(b'"') {
                c.quoted()
            } else {
                Some(c.take_while(|b| is_token(b) || b == b':' || b == b'[' || b == b']'))
                    .filter(|v| !v.is_empty())
            };
            value = Some(v.ok_or(ParseError::header(header, "bad parameter value"))?);
        }
        each(name, value);
        end = c.pos;
    }
    c.pos = end;
    Ok(Params(&c.buf[start..end]))
}

/// One Via value (`via-parm`). The parameters a proxy reads on every message are found while
/// parsing, so asking for them costs nothing; any other is in `params`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Via<'a> {
    /// The transport token of `SIP/2.0/<transport>`, e.g. `UDP`, `TLS`, `WS`.
    pub transport: &'a [u8],
    /// The sent-by host as written; an IPv6 reference keeps its brackets.
    pub host: &'a [u8],
    /// The sent-by port, if written.
    pub port: Option<u16>,
    /// All the via-params as written, leading `;` included.
    pub params: Params<'a>,
    /// The `branch` parameter (RFC 3261 §8.1.1.7): the transaction id, when it has the magic
    /// cookie.
    pub branch: Option<&'a [u8]>,
    /// `rport` as written: `None` absent, `Some(None)` without a value.
    rport: Option<Option<&'a [u8]>>,
    received: Option<&'a [u8]>,
    maddr: Option<&'a [u8]>,
    oc: Option<Option<&'a [u8]>>,
    /// Absolute offsets of this via-parm in the buffer.
    pub start: usize,
    /// Absolute offset just past the via-parm.
    pub end: usize,
}

impl<'a> Via<'a> {
    /// Where responses to a request that arrived from `source` with this top Via go over an
    /// unreliable transport (RFC 3261 §18.2.2, RFC 3581): the source address, at the Via's
    /// port (5060 if none) unless `rport` asked for the source port.
    pub fn response_addr(&self, source: std::net::SocketAddr) -> std::net::SocketAddr {
        if self.rport.is_some() {
            source
        } else {
            std::net::SocketAddr::new(source.ip(), self.port.unwrap_or(5060))
        }
    }

    /// The sent-by host without IPv6 brackets.
    pub fn host_unbracketed(&self) -> &'a [u8] {
        super::uri::unbracket(self.host)
    }

    /// The `received` parameter a server added: the source address it saw (RFC 3261 §18.2.1).
    pub fn received(&self) -> Option<&'a [u8]> {
        self.received
    }

    /// `None`: no rport; `Some(None)`: rport requested (no value yet); `Some(Some(p))`: filled.
    pub fn rport(&self) -> Option<Option<u16>> {
        self.rport
            .map(|v| v.and_then(parse_u64).and_then(|p| u16::try_from(p).ok()))
    }

    /// The `maddr` parameter: the address a response goes to instead of sent-by (RFC 3261 §18.2.2).
    pub fn maddr(&self) -> Option<&'a [u8]> {
        self.maddr
    }

    /// `oc` as written (RFC 7339): `None` absent, `Some(None)` a client announcing overload
    /// control, `Some(Some(v))` a server's feedback. A server reads it on every request and a
    /// client on every response, so it is found while parsing; the other `oc-*` parameters
    /// are in `params`.
    pub fn oc(&self) -> Option<Option<&'a [u8]>> {
        self.oc
    }

    /// True when the branch carries the RFC 3261 magic cookie.
    pub fn is_rfc3261(&self) -> bool {
        self.branch
            .is_some_and(|b| b.len() > 7 && b[..7].eq_ignore_ascii_case(b"z9hG4bK"))
    }
}

/// Parses one via-parm at the cursor.
pub(crate) fn parse_via<'a>(c: &mut Cursor<'a>) -> Result<Via<'a>, ParseError> {
    const H: &str = "Via";
    c.skip_ws();
    let start = c.pos;
    let name = c.token().ok_or(ParseError::header(H, "bad protocol"))?;
    if !c.eat_sep(b'/') {
        return Err(ParseError::header(H, "bad protocol"));
    }
    let version = c.token().ok_or(ParseError::header(H, "bad protocol"))?;
    if !eq_ic(name, b"SIP") {
        return Err(ParseError::header(H, "bad protocol"));
    }
    if version != b"2.0" {
        return Err(ParseError::Version);
    }
    if !c.eat_sep(b'/') {
        return Err(ParseError::header(H, "bad protocol"));
    }
    let transport = c.token().ok_or(ParseError::header(H, "bad transport"))?;
    if !c.skip_ws() {
        return Err(ParseError::header(H, "missing sent-by"));
    }
    let host_start = c.pos;
    if c.peek() == Some(b'[') {
        c.take_while(|b| b != b']');
        if !c.eat(b']') {
            return Err(ParseError::header(H, "bad sent-by"));
        }
    } else {
        c.take_while(|b| is(b, class::HOSTNAME));
    }
    let host = &c.buf[host_start..c.pos];
    let port = if c.eat_sep(b':') {
        let p = c.take_while(|b| b.is_ascii_digit());
        Some(
            parse_u64(p)
                .and_then(|v| u16::try_from(v).ok())
                .ok_or(ParseError::header(H, "bad port"))?,
        )
    } else {
        None
    };
    split_hostport(host).map_err(|_| ParseError::header(H, "bad sent-by"))?;
    // The first of each parameter counts, as a lookup by name would find it.
    let (mut branch, mut rport, mut received, mut maddr, mut oc) = (None, None, None, None, None);
    let params = parse_params(c, H, |name, value| {
        let slot = match name.len() {
            2 if eq_ic(name, b"oc") => &mut oc,
            6 if eq_ic(name, b"branch") => &mut branch,
            5 if eq_ic(name, b"rport") => &mut rport,
            8 if eq_ic(name, b"received") => &mut received,
            5 if eq_ic(name, b"maddr") => &mut maddr,
            _ => return,
        };
        slot.get_or_insert(value);
    })?;
    if branch == Some(None) {
        return Err(ParseError::header(H, "empty branch"));
    }
    Ok(Via {
        transport,
        host,
        port,
        params,
        branch: branch.flatten(),
        rport,
        received: received.flatten(),
        maddr: maddr.flatten(),
        oc,
        start,
        end: c.pos,
    })
}

/// Iterates the via-parms of one Via header value, reporting the first syntax error.
pub(crate) fn parse_via_list<'a>(
    buf: &'a [u8],
    start: usize,
    end: usize,
    mut each: impl FnMut(Via<'a>),
) -> Result<(), ParseError> {
    let mut c = Cursor::new(buf, start, end);
    loop {
        each(parse_via(&mut c)?);
        c.skip_ws();
        if c.at_end() {
            return Ok(());
        }
        if !c.eat(b',') {
            return Err(ParseError::header("Via", "junk after value"));
        }
    }
}

/// The CSeq header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CSeq<'a> {
    /// The sequence number, below 2^31 (RFC 3261 §8.1.1.5).
    pub seq: u32,
    /// The method token, as written.
    pub method: &'a [u8],
}

pub(crate) fn parse_cseq(value: &[u8]) -> Result<CSeq<'_>, ParseError> {
    const H: &str = "CSeq";
    let mut c = Cursor::new(value, 0, value.len());
    c.skip_ws();
    let digits = c.take_while(|b| b.is_ascii_digit());
    let seq = parse_u64(digits)
        .filter(|v| *v < (1 << 31))
        .ok_or(ParseError::header(H, "bad sequence number"))? as u32;
    if !c.skip_ws() {
        return Err(ParseError::header(H, "missing method"));
    }
    let method = c.token().ok_or(ParseError::header(H, "bad method"))?;
    c.skip_ws();
    if !c.at_end() {
        return Err(ParseError::header(H, "junk after method"));
    }
    Ok(CSeq { seq, method })
}

/// A name-addr or addr-spec with header parameters (From, To, Contact, Route, Record-Route).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameAddr<'a> {
    /// The display name as written (quotes kept), if any.
    pub display: Option<&'a [u8]>,
    /// The address.
    pub uri: Uri<'a>,
    /// The header parameters after the address (`;tag=`, `;expires=`, ...), leading `;` included.
    pub params: Params<'a>,
    /// Whether the URI was in angle brackets.
    pub bracketed: bool,
    /// The first `tag` parameter's value, found while parsing.
    tag: Option<&'a [u8]>,
    /// Absolute offset where the value starts in the message buffer.
    pub start: usize,
    /// Absolute offset just past the value and its parameters.
    pub end: usize,
}

impl<'a> NameAddr<'a> {
    /// The `tag` parameter (RFC 3261 §19.3): identifies a dialog's end.
    pub fn tag(&self) -> Option<&'a [u8]> {
        self.tag
    }
}

fn uri_err(header: &'static str, e: UriError) -> ParseError {
    ParseError::header(header, e.as_str())
}

/// Parses one name-addr / addr-spec at the cursor, with its parameters.
pub(crate) fn parse_name_addr<'a>(
    c: &mut Cursor<'a>,
    header: &'static str,
) -> Result<NameAddr<'a>, ParseError> {
    c.skip_ws();
    let start = c.pos;
    let mut display = None;
    // Display name: a quoted string, or tokens separated by whitespace, then '<'.
    if c.peek() == Some(b'"') {
        display = Some(
            c.quoted()
                .ok_or(ParseError::header(header, "unbalanced quotes"))?,
        );
        c.skip_ws();
        if c.peek() != Some(b'<') {
            return Err(ParseError::header(header, "missing <URI>"));
        }
    } else {
        let save = c.pos;
        let mut last_end = c.pos;
        while c.token().is_some() {
            last_end = c.pos;
            c.skip_ws();
        }
        if c.peek() == Some(b'<') {
            if last_end > save {
                display = Some(&c.buf[save..last_end]);
            }
        } else if last_end > save && c.peek() != Some(b':') {
            // Tokens not followed by '<' can only be an addr-spec's scheme.
            return Err(ParseError::header(header, "bad display name"));
        } else {
            c.pos = save;
        }
    }
    let (uri, bracketed) = if c.eat(b'<') {
        let uri_start = c.pos;
        let close = c.rest().iter().position(|b| *b == b'>');
        let Some(close) = close else {
            return Err(ParseError::header(header, "missing '>'"));
        };
        let raw = &c.buf[uri_start..uri_start + close];
        if raw.first().is_some_and(|b| super::scan::is_ws(*b))
            || raw.last().is_some_and(|b| super::scan::is_ws(*b))
        {
            return Err(ParseError::header(header, "whitespace inside <>"));
        }
        c.pos = uri_start + close + 1;
        (Uri::parse(raw).map_err(|e| uri_err(header, e))?, true)
    } else {
        // addr-spec: the URI ends at whitespace, ';' or ','; it may not carry '?' headers.
        let raw = c.take_while(|b| !super::scan::is_ws(b) && b != b';' && b != b',');
        if raw.is_empty() {
            return Err(ParseError::header(header, "missing URI"));
        }
        let uri = Uri::parse(raw).map_err(|e| uri_err(header, e))?;
        if !uri.headers.is_empty() || raw.contains(&b'?') {
            return Err(ParseError::header(header, "URI with headers needs <>"));
        }
        (uri, false)
    };
    let mut tag = None;
    let params = parse_params(c, header, |name, value| {
        if name.len() == 3 && eq_ic(name, b"tag") {
            tag.get_or_insert(value);
        }
    })?;
    Ok(NameAddr {
        display,
        uri,
        params,
        bracketed,
        tag: tag.flatten(),
        start,
        end: c.pos,
    })
}

/// Parses a whole single-valued name-addr header value (From, To).
pub(crate) fn parse_single_name_addr<'a>(
    buf: &'a [u8],
    start: usize,
    end: usize,
    header: &'static str,
) -> Result<NameAddr<'a>, ParseError> {
    let mut c = Cursor::new(buf, start, end);
    let na = parse_name_addr(&mut c, header)?;
    c.skip_ws();
    if !c.at_end() {
        return Err(ParseError::header(
            header,
            if c.peek() == Some(b',') {
                "several values"
            } else {
                "junk after value"
            },
        ));
    }
    Ok(na)
}

/// Parses a comma-separated list of name-addrs (Contact, Route, Record-Route).
pub(crate) fn parse_name_addr_list<'a>(
    buf: &'a [u8],
    start: usize,
    end: usize,
    header: &'static str,
    mut each: impl FnMut(NameAddr<'a>),
) -> Result<(), ParseError> {
    let mut c = Cursor::new(buf, start, end);
    loop {
        each(parse_name_addr(&mut c, header)?);
        c.skip_ws();
        if c.at_end() {
            return Ok(());
        }
        if !c.eat(b',') {
            return Err(ParseError::header(header, "junk after value"));
        }
    }
}

/// A 32-bit delta-seconds value (Expires, Retry-After, expires parameters).
pub fn parse_delta_seconds(value: &[u8], header: &'static str) -> Result<u32, ParseError> {
    parse_u64(super::scan::trim(value))
        .and_then(|v| u32::try_from(v).ok())
        .ok_or(ParseError::header(header, "bad or out-of-range number"))
}

/// Validates an RFC 1123 date in GMT: `Sun, 06 Nov 1994 08:49:37 GMT`.
pub(crate) fn check_date(value: &[u8]) -> Result<(), ParseError> {
    const H: &str = "Date";
    let v = super::scan::trim(value);
    let ok = v.len() == 29
        && v[3] == b','
        && v[4] == b' '
        && v[5..7].iter().all(u8::is_ascii_digit)
        && v[7] == b' '
        && v[11] == b' '
        && v[12..16].iter().all(u8::is_ascii_digit)
        && v[16] == b' '
        && v[19] == b':'
        && v[22] == b':'
        && v[25] == b' '
        && &v[26..] == b"GMT";
    if ok {
        Ok(())
    } else {
        Err(ParseError::header(H, "not an RFC 1123 GMT date"))
    }
}

/// Validates a Retry-After value: delta-seconds, optional comment and parameters.
pub(crate) fn check_retry_after(value: &[u8]) -> Result<(), ParseError> {
    let v = super::scan::trim(value);
    let digits_end = v
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(v.len());
    parse_delta_seconds(&v[..digits_end], "Retry-After").map(|_| ())
}

/// Validates every Warning value's 3-digit code.
pub(crate) fn check_warning(value: &[u8]) -> Result<(), ParseError> {
    for w in super::scan::split_commas(value) {
        let code_end = w.iter().position(|b| *b == b' ').unwrap_or(w.len());
        if code_end != 3 || !w[..3].iter().all(u8::is_ascii_digit) {
            return Err(ParseError::header("Warning", "warn-code must be 3 digits"));
        }
    }
    Ok(())
}

/// Parses Max-Forwards (0–255).
pub(crate) fn parse_max_forwards(value: &[u8]) -> Result<u8, ParseError> {
    parse_u64(super::scan::trim(value))
        .and_then(|v| u8::try_from(v).ok())
        .ok_or(ParseError::header(
            "Max-Forwards",
            "not a number from 0 to 255",
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn via(s: &str) -> Result<Via<'_>, ParseError> {
        let mut c = Cursor::new(s.as_bytes(), 0, s.len());
        parse_via(&mut c)
    }

    fn na(s: &str) -> Result<NameAddr<'_>, ParseError> {
        parse_single_name_addr(s.as_bytes(), 0, s.len(), "To")
    }

    #[test]
    fn via_with_folding_and_spaces() {
        let v = via("SIP  /   2.0\r\n /UDP\r\n    192.0.2.2;branch=390skdjuw").unwrap();
        assert_eq!(v.transport, b"UDP");
        assert_eq!(v.host, b"192.0.2.2");
        assert_eq!(v.branch, Some(&b"390skdjuw"[..]));
        assert!(!v.is_rfc3261());
        let v =
            via("SIP/2.0/UDP [2001:db8::9:1]:5070;branch=z9hG4bKx;rport;received=1.2.3.4").unwrap();
        assert_eq!(v.port, Some(5070));
        assert_eq!(v.rport(), Some(None));
        assert_eq!(v.received(), Some(&b"1.2.3.4"[..]));
        assert!(v.is_rfc3261());
    }

    #[test]
    fn via_errors() {
        assert_eq!(via("SIP/7.0/UDP h"), Err(ParseError::Version));
        assert!(via("SIP/2.0/UDP 192.0.2.15;;,;,,").is_err());
        assert!(via("SIP/2.0/UDP h;branch=").is_err());
        assert!(via("SIP/2.0/UDP").is_err());
    }

    #[test]
    fn name_addr_forms() {
        let a = na(
            "\"J Rosenberg \\\\\\\"\"       <sip:jdrosen@example.com>\r\n  ;\r\n  tag = 98asjd8",
        )
        .unwrap();
        assert_eq!(a.tag(), Some(&b"98asjd8"[..]));
        let b = na("caller<sip:caller@example.com>;tag=323").unwrap();
        assert_eq!(b.display, Some(&b"caller"[..]));
        let c = na("sip:user@example.com;tag=x").unwrap();
        assert!(!c.bracketed);
        assert_eq!(c.tag(), Some(&b"x"[..]));
        assert!(
            c.uri.params.is_empty(),
            "addr-spec params are header params"
        );
    }

    #[test]
    fn name_addr_errors() {
        assert!(na("\"Mr. J. User <sip:j.user@example.com>").is_err());
        assert!(na("Bell, Alexander <sip:a@example.com>").is_err());
        assert!(na("\"W\" < sip:t.watson@example.org >").is_err());
        assert!(na("sip:user@example.com?Route=%3Csip:x%3E").is_err());
        assert!(na("<sip:a@b>, <sip:c@d>").is_err());
    }

    #[test]
    fn cseq_limits() {
        assert_eq!(parse_cseq(b"0009\r\n  INVITE").unwrap().seq, 9);
        assert!(parse_cseq(b"36893488147419103232 REGISTER").is_err());
        assert!(parse_cseq(b"2147483648 INVITE").is_err());
        assert!(parse_cseq(b"1INVITE").is_err());
    }
}
