//! Parse errors, each naming the fault precisely enough to be a 400 reason phrase.

use thiserror::Error;

/// Why a message was rejected. `reason()` is suitable as a SIP reason phrase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ParseError {
    /// The buffer is empty or only whitespace.
    #[error("empty message")]
    Empty,
    /// The start line is neither a valid request line nor a status line; the string says what is
    /// wrong.
    #[error("bad start line: {0}")]
    StartLine(&'static str),
    /// The start line names a SIP version other than 2.0.
    #[error("unsupported SIP version")]
    Version,
    /// A status code that is not three digits from 100 to 699.
    #[error("bad status code")]
    StatusCode,
    /// The Request-URI does not parse, or carries `?headers`; the string names the fault.
    #[error("bad Request-URI: {0}")]
    RequestUri(&'static str),
    /// A header line is malformed: no colon, a bad name, a control character, or a continuation
    /// before any header.
    #[error("bad header line: {0}")]
    HeaderLine(&'static str),
    /// The start line has no line break.
    #[error("headers not terminated by an empty line")]
    Unterminated,
    /// A header every message needs (Via, CSeq, Call-ID, From, To) is absent; the string names it.
    #[error("missing {0} header")]
    Missing(&'static str),
    /// A header value does not parse.
    #[error("bad {header} header: {what}")]
    Header {
        /// The header's name.
        header: &'static str,
        /// What is wrong with its value.
        what: &'static str,
    },
    /// A header that must appear once (CSeq, Call-ID, From, To, Max-Forwards, Content-Length)
    /// appears more than once.
    #[error("{0} header must appear once")]
    Duplicate(&'static str),
    /// A request's CSeq method differs from its request method (RFC 3261 §8.1.1.5).
    #[error("CSeq method does not match the request method")]
    CSeqMethodMismatch,
    /// Content-Length counts more bytes than follow the headers.
    #[error("Content-Length larger than the message body")]
    ContentLengthTooLarge,
    /// The message is longer than the configured limit; answered 513 (RFC 3261 §21.5.11).
    #[error("message too large")]
    TooLarge,
}

impl ParseError {
    /// A short reason phrase for a 400 response naming the fault.
    pub fn reason(&self) -> String {
        match self {
            ParseError::Version => "Version Not Supported".into(),
            ParseError::TooLarge => "Message Too Large".into(),
            other => {
                let s = other.to_string();
                let mut c = s.chars();
                match c.next() {
                    Some(f) => f.to_uppercase().chain(c).collect(),
                    None => s,
                }
            }
        }
    }

    /// The status code a server answers this fault with.
    pub fn status(&self) -> u16 {
        match self {
            ParseError::Version => 505,
            ParseError::TooLarge => 513,
            _ => 400,
        }
    }

    pub(crate) fn header(header: &'static str, what: &'static str) -> Self {
        ParseError::Header { header, what }
    }
}
