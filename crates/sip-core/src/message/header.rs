//! Header names: the ones the core makes decisions on get an enum variant (compact forms
//! folded in, case ignored), every other header is `Other` and is carried through untouched.

use super::scan::eq_ic;

/// Declares [`HeaderName`] from one list of variants and canonical spellings, so the enum,
/// [`HeaderName::KNOWN`] and [`HeaderName::as_str`] cannot drift apart.
macro_rules! header_names {
    ($($variant:ident => $name:literal,)*) => {
        /// A header name the core recognises.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum HeaderName {
            $(
                #[doc = concat!("The `", $name, "` header.")]
                $variant,
            )*
            /// Any header the core does not recognise, carried through untouched.
            Other,
        }

        impl HeaderName {
            /// Every recognised header (all variants but `Other`).
            #[cfg(test)]
            pub(crate) const KNOWN: &'static [HeaderName] = &[$(HeaderName::$variant,)*];

            /// The canonical long form, as sipsec writes it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(HeaderName::$variant => $name,)*
                    HeaderName::Other => "",
                }
            }
        }
    };
}

header_names! {
    Via => "Via",
    From => "From",
    To => "To",
    CallId => "Call-ID",
    CSeq => "CSeq",
    MaxForwards => "Max-Forwards",
    MaxBreadth => "Max-Breadth",
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
        // Dispatch on length and first letter, then one comparison: this runs for every
        // header line of every message.
        let first = name.first().map_or(0, u8::to_ascii_lowercase);
        let candidate: &[(&[u8], HeaderName)] = match (name.len(), first) {
            (2, b't') => &[(b"to", To)],
            (3, b'v') => &[(b"via", Via)],
            (4, b'f') => &[(b"from", From)],
            (4, b'c') => &[(b"cseq", CSeq)],
            (4, b'd') => &[(b"date", Date)],
            (4, b'p') => &[(b"path", Path)],
            (5, b'r') => &[(b"route", Route)],
            (5, b'a') => &[(b"allow", Allow)],
            (5, b'e') => &[(b"event", Event)],
            (6, b'a') => &[(b"accept", Accept)],
            (6, b's') => &[(b"server", Server)],
            (7, b'c') => &[(b"call-id", CallId), (b"contact", Contact)],
            (7, b'e') => &[(b"expires", Expires)],
            (7, b'r') => &[(b"require", Require)],
            (7, b's') => &[(b"subject", Subject)],
            (7, b'w') => &[(b"warning", Warning)],
            (9, b's') => &[(b"supported", Supported)],
            (10, b'u') => &[(b"user-agent", UserAgent)],
            (11, b'm') => &[(b"min-expires", MinExpires), (b"max-breadth", MaxBreadth)],
            (11, b'r') => &[(b"retry-after", RetryAfter)],
            (11, b'u') => &[(b"unsupported", Unsupported)],
            (12, b'm') => &[(b"max-forwards", MaxForwards)],
            (12, b'r') => &[(b"record-route", RecordRoute)],
            (12, b'c') => &[(b"content-type", ContentType)],
            (13, b'p') => &[(b"proxy-require", ProxyRequire)],
            (13, b'a') => &[(b"authorization", Authorization)],
            (14, b'c') => &[(b"content-length", ContentLength)],
            (16, b'w') => &[(b"www-authenticate", WwwAuthenticate)],
            (16, b'c') => &[(b"content-encoding", ContentEncoding)],
            (18, b'p') => &[(b"proxy-authenticate", ProxyAuthenticate)],
            (19, b'p') => &[(b"proxy-authorization", ProxyAuthorization)],
            _ => &[],
        };
        candidate
            .iter()
            .find(|(n, _)| eq_ic(n, name))
            .map_or(Other, |(_, h)| *h)
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
        // Every long form round-trips through the canonical spelling.
        for &h in HeaderName::KNOWN {
            assert_eq!(
                HeaderName::from_bytes(h.as_str().as_bytes()),
                h,
                "{}",
                h.as_str()
            );
            assert_eq!(
                HeaderName::from_bytes(h.as_str().to_uppercase().as_bytes()),
                h
            );
        }
    }
}
