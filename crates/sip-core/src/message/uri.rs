//! SIP, SIPS and tel URIs (RFC 3261 §19.1, RFC 3966), parsed in place.
//!
//! A [`Uri`] borrows its text; user, host, parameters and headers are sub-slices, still
//! escaped as written (`%41` stays `%41`): comparing or decoding is the caller's choice, and
//! forwarding never needs it. Other schemes (`mailto:`, `urn:`, ...) parse as
//! [`Scheme::Other`] with only the scheme split off, so an application can answer 416.

use super::scan::{check_escaped, class, eq_ic, is, parse_u64};

/// The URI scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `sip:` (RFC 3261 §19.1).
    Sip,
    /// `sips:`, which requires TLS on every hop (RFC 3261 §19.1).
    Sips,
    /// `tel:` (RFC 3966); the number is in [`Uri::user`].
    Tel,
    /// Any other scheme; only the scheme is split off.
    Other,
}

/// Why a URI was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UriError {
    /// The scheme is missing or malformed, or a URI of another scheme is empty or holds
    /// whitespace, `<` or `>`.
    Scheme,
    /// The user part has a character outside its class or a bad `%` escape.
    User,
    /// The password has a character outside its class or a bad `%` escape.
    Password,
    /// The host is neither a hostname, an IPv4 address nor a valid bracketed IPv6 reference.
    Host,
    /// The port is not a number from 0 to 65535.
    Port,
    /// A `;` parameter has an empty name or value, or a bad character.
    Param,
    /// The `?` header part is malformed.
    Header,
}

impl UriError {
    /// A short phrase naming the fault, used as a 400 reason.
    pub fn as_str(self) -> &'static str {
        match self {
            UriError::Scheme => "bad scheme",
            UriError::User => "bad user part",
            UriError::Password => "bad password",
            UriError::Host => "bad host",
            UriError::Port => "bad port",
            UriError::Param => "bad parameter",
            UriError::Header => "bad header part",
        }
    }
}

/// A parsed URI borrowing its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uri<'a> {
    /// The whole URI as written.
    pub raw: &'a [u8],
    /// The scheme; decides which parts are parsed.
    pub scheme: Scheme,
    /// User part (or the number of a tel URI), still escaped.
    pub user: Option<&'a [u8]>,
    /// Password part after `user:`, still escaped; RFC 3261 §19.1.1 advises against it.
    pub password: Option<&'a [u8]>,
    /// Host as written; an IPv6 reference keeps its brackets. Empty for tel and other schemes.
    pub host: &'a [u8],
    /// Port, if written.
    pub port: Option<u16>,
    /// `;name=value` parameters including the leading `;`, or empty.
    pub params: &'a [u8],
    /// Header part after `?`, or empty.
    pub headers: &'a [u8],
}

/// Validates a host: a hostname or IPv4 address, or an IPv6 reference in brackets whose
/// address is a real IPv6 address (RFC 3261 §25.1 `IPv6reference`): `[2001:db8:::1]` is not,
/// and would otherwise be routed as a name nobody can resolve.
pub fn valid_host(h: &[u8]) -> bool {
    match h {
        [] => false,
        [b'[', inner @ .., b']'] => {
            // The longest IPv6 text, a full address with an embedded IPv4 one, is 45 bytes.
            inner.len() <= 45
                && std::str::from_utf8(inner).is_ok_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
        }
        _ => h.iter().all(|b| is(*b, class::HOSTNAME)) && h[0] != b'-' && h[0] != b'.',
    }
}

/// A host without the brackets of an IPv6 reference (`[::1]` → `::1`); other hosts unchanged.
pub fn unbracket(host: &[u8]) -> &[u8] {
    match host {
        [b'[', inner @ .., b']'] => inner,
        h => h,
    }
}

/// Splits `host[:port]`, keeping IPv6 brackets on the host.
pub(crate) fn split_hostport(hp: &[u8]) -> Result<(&[u8], Option<u16>), UriError> {
    let (host, port) = if hp.first() == Some(&b'[') {
        let close = hp.iter().position(|b| *b == b']').ok_or(UriError::Host)?;
        match &hp[close + 1..] {
            [] => (&hp[..=close], None),
            [b':', port @ ..] => (&hp[..=close], Some(port)),
            _ => return Err(UriError::Host),
        }
    } else {
        split_at_first(hp, b':')
    };
    if !valid_host(host) {
        return Err(UriError::Host);
    }
    let port = match port {
        None => None,
        Some(p) => Some(
            parse_u64(p)
                .and_then(|v| u16::try_from(v).ok())
                .ok_or(UriError::Port)?,
        ),
    };
    Ok((host, port))
}

/// `s` split at its first `sep`: what comes before, and what comes after if `sep` is there
/// (`host:port`, `name=value`, `user:password`).
fn split_at_first(s: &[u8], sep: u8) -> (&[u8], Option<&[u8]>) {
    match s.iter().position(|b| *b == sep) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    }
}

fn check_params(params: &[u8]) -> Result<(), UriError> {
    // params is ";a;b=c..." : every element needs a non-empty name.
    for p in params.split(|b| *b == b';').skip(1) {
        let (name, value) = split_at_first(p, b'=');
        if name.is_empty() || !check_escaped(name, class::PARAM) {
            return Err(UriError::Param);
        }
        if let Some(v) = value {
            if v.is_empty() || !check_escaped(v, class::PARAM) {
                return Err(UriError::Param);
            }
        }
    }
    Ok(())
}

impl<'a> Uri<'a> {
    /// Parses a complete URI (no surrounding whitespace or brackets).
    pub fn parse(raw: &'a [u8]) -> Result<Uri<'a>, UriError> {
        let colon = raw
            .iter()
            .position(|b| *b == b':')
            .ok_or(UriError::Scheme)?;
        let scheme_text = &raw[..colon];
        if scheme_text.is_empty()
            || !scheme_text[0].is_ascii_alphabetic()
            || !scheme_text
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(b))
        {
            return Err(UriError::Scheme);
        }
        let rest = &raw[colon + 1..];
        let scheme = if eq_ic(scheme_text, b"sip") {
            Scheme::Sip
        } else if eq_ic(scheme_text, b"sips") {
            Scheme::Sips
        } else if eq_ic(scheme_text, b"tel") {
            Scheme::Tel
        } else {
            if rest.is_empty() || rest.iter().any(|b| *b <= b' ' || *b == b'<' || *b == b'>') {
                return Err(UriError::Scheme);
            }
            return Ok(Uri {
                raw,
                scheme: Scheme::Other,
                user: None,
                password: None,
                host: b"",
                port: None,
                params: b"",
                headers: b"",
            });
        };
        if scheme == Scheme::Tel {
            let end = rest.iter().position(|b| *b == b';').unwrap_or(rest.len());
            let number = &rest[..end];
            if number.is_empty()
                || !number
                    .iter()
                    .all(|b| b.is_ascii_hexdigit() || b"+-.()*#".contains(b))
            {
                return Err(UriError::User);
            }
            check_params(&rest[end..])?;
            return Ok(Uri {
                raw,
                scheme,
                user: Some(number),
                password: None,
                host: b"",
                port: None,
                params: &rest[end..],
                headers: b"",
            });
        }
        // userinfo ends at the first '@': no other part of a SIP URI may hold a raw '@'.
        let (userinfo, hostpart) = match rest.iter().position(|b| *b == b'@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(ui) => {
                let (u, p) = split_at_first(ui, b':');
                if u.is_empty() || !check_escaped(u, class::USER) {
                    return Err(UriError::User);
                }
                if let Some(p) = p {
                    if !check_escaped(p, class::PASSWORD) {
                        return Err(UriError::Password);
                    }
                }
                (Some(u), p)
            }
        };
        let q = hostpart
            .iter()
            .position(|b| *b == b'?')
            .unwrap_or(hostpart.len());
        let headers = if q < hostpart.len() {
            &hostpart[q + 1..]
        } else {
            b"" as &[u8]
        };
        let before_q = &hostpart[..q];
        // An IPv6 reference contains ':' but never ';', so the first ';' ends host[:port].
        let semi = before_q
            .iter()
            .position(|b| *b == b';')
            .unwrap_or(before_q.len());
        let (host, port) = split_hostport(&before_q[..semi])?;
        let params = &before_q[semi..];
        check_params(params)?;
        let headers_ok = |hs: &[u8]| {
            !hs.is_empty()
                && hs.split(|b| *b == b'&').all(|h| {
                    h.iter().position(|b| *b == b'=').is_some_and(|i| {
                        i > 0
                            && check_escaped(&h[..i], class::HEADER)
                            && check_escaped(&h[i + 1..], class::HEADER)
                    })
                })
        };
        if q < hostpart.len() && !headers_ok(headers) {
            return Err(UriError::Header);
        }
        Ok(Uri {
            raw,
            scheme,
            user,
            password,
            host,
            port,
            params,
            headers,
        })
    }

    /// Looks up a URI parameter by name (case-insensitive): `Some(None)` for a parameter
    /// without a value.
    pub fn param(&self, name: &[u8]) -> Option<Option<&'a [u8]>> {
        param_lookup(self.params, b';', name)
    }

    /// Whether `other` names the same resource, leniently: the same scheme, user and host (any
    /// case), and port (a missing one standing for the scheme's default), whatever the
    /// parameters and headers. Digest's `uri` check uses it (RFC 3261 §22.4).
    pub fn same_resource(&self, other: &Uri<'_>) -> bool {
        let default = |u: &Uri<'_>| match u.scheme {
            Scheme::Sips => 5061,
            _ => 5060,
        };
        self.scheme == other.scheme
            && self.user == other.user
            && self.host.eq_ignore_ascii_case(other.host)
            && self.port.unwrap_or(default(self)) == other.port.unwrap_or(default(other))
    }

    /// The host without IPv6 brackets.
    pub fn host_unbracketed(&self) -> &'a [u8] {
        unbracket(self.host)
    }

    /// The `transport` parameter, lower-cased comparison left to the caller.
    pub fn transport(&self) -> Option<&'a [u8]> {
        self.param(b"transport").flatten()
    }
}

/// Looks up `name` in a `;a=b;c` list (leading separator included), tolerating whitespace
/// around the separators as header parameters allow.
pub(crate) fn param_lookup<'a>(params: &'a [u8], sep: u8, name: &[u8]) -> Option<Option<&'a [u8]>> {
    use super::scan::trim;
    // What precedes the first separator is not a parameter.
    let mut rest = &params[memchr::memchr(sep, params)? + 1..];
    loop {
        let end = memchr::memchr(sep, rest).unwrap_or(rest.len());
        let p = &rest[..end];
        let eq = memchr::memchr(b'=', p);
        let n = trim(&p[..eq.unwrap_or(p.len())]);
        if eq_ic(n, name) {
            return Some(eq.map(|e| trim(&p[e + 1..])));
        }
        rest = rest.get(end + 1..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sip_uri_parts() {
        let u = Uri::parse(b"sip:alice:pw@[2001:db8::1]:5070;transport=udp;lr?Subject=hi").unwrap();
        assert_eq!(u.scheme, Scheme::Sip);
        assert_eq!(u.user, Some(&b"alice"[..]));
        assert_eq!(u.password, Some(&b"pw"[..]));
        assert_eq!(u.host, b"[2001:db8::1]");
        assert_eq!(u.host_unbracketed(), b"2001:db8::1");
        assert_eq!(u.port, Some(5070));
        assert_eq!(u.transport(), Some(&b"udp"[..]));
        assert_eq!(u.param(b"LR"), Some(None));
        assert_eq!(u.headers, b"Subject=hi");
    }

    #[test]
    fn user_with_semicolons_and_escapes() {
        let u = Uri::parse(b"sip:user;par=u%40example.net@example.com").unwrap();
        assert_eq!(u.user, Some(&b"user;par=u%40example.net"[..]));
        assert_eq!(u.host, b"example.com");
    }

    #[test]
    fn tel_and_other_schemes() {
        let t = Uri::parse(b"tel:+1-201-555-0123;phone-context=example.com").unwrap();
        assert_eq!(t.scheme, Scheme::Tel);
        assert_eq!(t.user, Some(&b"+1-201-555-0123"[..]));
        assert_eq!(Uri::parse(b"mailto:a@b").unwrap().scheme, Scheme::Other);
    }

    #[test]
    fn rejects_bad_uris() {
        assert_eq!(Uri::parse(b"<sip:a@b>"), Err(UriError::Scheme));
        assert_eq!(Uri::parse(b"sip:a@b:99999"), Err(UriError::Port));
        assert_eq!(Uri::parse(b"sip:a@b;;x"), Err(UriError::Param));
        assert_eq!(Uri::parse(b"sip:a%4@b"), Err(UriError::User));
        assert_eq!(Uri::parse(b"sip:a@b c"), Err(UriError::Host));
        assert_eq!(Uri::parse(b"sip:a@[::1"), Err(UriError::Host));
    }
}
