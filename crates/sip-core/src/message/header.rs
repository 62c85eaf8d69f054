//! Header names: the ones the core makes decisions on get an enum variant (compact forms
//! folded in, case ignored), every other header is `Other` and is carried through untouched.

use super::scan::eq_ic;

/// A header name the core recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum HeaderName {
    Via,
    From,
    To,
    CallId,
    CSeq,
    MaxForwards,
    ContentLength,
    ContentType,
    Contact,
    Route,
    RecordRoute,
    Expires,
    MinExpires,
    Require,
    ProxyRequire,
    Supported,
    Unsupported,
    Allow,
    Accept,
    Date,
    RetryAfter,
    Warning,
    Authorization,
    ProxyAuthorization,
    WwwAuthenticate,
    ProxyAuthenticate,
    UserAgent,
    Server,
    Subject,
    Event,
    ContentEncoding,
    Path,
    Other,
}

impl HeaderName {
    /// Recognises a header name as written on the wire (any case, compact or long form).
    pub fn from_bytes(name: &[u8]) -> HeaderName {
        use HeaderName::*;
        if name.len() == 1 {
            return match name[0].to_ascii_lowercase() {
                b'v' => Via,
                b'f' => From,
                b't' => To,
                b'i' => CallId,
                b'l' => ContentLength,
                b'c' => ContentType,
                b'm' => Contact,
                b'e' => ContentEncoding,
                b'k' => Supported,
                b's' => Subject,
                b'o' => Event,
                _ => Other,
            };
        }
        const TABLE: &[(&[u8], HeaderName)] = &[
            (b"via", Via),
            (b"from", From),
            (b"to", To),
            (b"call-id", CallId),
            (b"cseq", CSeq),
            (b"max-forwards", MaxForwards),
            (b"content-length", ContentLength),
            (b"content-type", ContentType),
            (b"contact", Contact),
            (b"route", Route),
            (b"record-route", RecordRoute),
            (b"expires", Expires),
            (b"min-expires", MinExpires),
            (b"require", Require),
            (b"proxy-require", ProxyRequire),
            (b"supported", Supported),
            (b"unsupported", Unsupported),
            (b"allow", Allow),
            (b"accept", Accept),
            (b"date", Date),
            (b"retry-after", RetryAfter),
            (b"warning", Warning),
            (b"authorization", Authorization),
            (b"proxy-authorization", ProxyAuthorization),
            (b"www-authenticate", WwwAuthenticate),
            (b"proxy-authenticate", ProxyAuthenticate),
            (b"user-agent", UserAgent),
            (b"server", Server),
            (b"subject", Subject),
            (b"event", Event),
            (b"content-encoding", ContentEncoding),
            (b"path", Path),
        ];
        TABLE
            .iter()
            .find(|(n, _)| n.len() == name.len() && eq_ic(n, name))
            .map_or(Other, |(_, h)| *h)
    }

    /// The canonical long form, as sipsec writes it.
    pub fn as_str(self) -> &'static str {
        use HeaderName::*;
        match self {
            Via => "Via",
            From => "From",
            To => "To",
            CallId => "Call-ID",
            CSeq => "CSeq",
            MaxForwards => "Max-Forwards",
            ContentLength => "Content-Length",
            ContentType => "Content-Type",
            Contact => "Contact",
            Route => "Route",
            RecordRoute => "Record-Route",
            Expires => "Expires",
            MinExpires => "Min-Expires",
            Require => "Require",
            ProxyRequire => "Proxy-Require",
            Supported => "Supported",
            Unsupported => "Unsupported",
            Allow => "Allow",
            Accept => "Accept",
            Date => "Date",
            RetryAfter => "Retry-After",
            Warning => "Warning",
            Authorization => "Authorization",
            ProxyAuthorization => "Proxy-Authorization",
            WwwAuthenticate => "WWW-Authenticate",
            ProxyAuthenticate => "Proxy-Authenticate",
            UserAgent => "User-Agent",
            Server => "Server",
            Subject => "Subject",
            Event => "Event",
            ContentEncoding => "Content-Encoding",
            Path => "Path",
            Other => "",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_and_case_insensitive() {
        assert_eq!(HeaderName::from_bytes(b"v"), HeaderName::Via);
        assert_eq!(
            HeaderName::from_bytes(b"MaX-fOrWaRdS"),
            HeaderName::MaxForwards
        );
        assert_eq!(HeaderName::from_bytes(b"i"), HeaderName::CallId);
        assert_eq!(HeaderName::from_bytes(b"L"), HeaderName::ContentLength);
        assert_eq!(HeaderName::from_bytes(b"C%6Fntact"), HeaderName::Other);
        assert_eq!(HeaderName::from_bytes(b"X-Custom"), HeaderName::Other);
    }
}
