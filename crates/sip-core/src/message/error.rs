//! Parse errors, each naming the fault precisely enough to be a 400 reason phrase.

use thiserror::Error;

/// Why a message was rejected. `reason()` is suitable as a SIP reason phrase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ParseError {
    #[error("empty message")]
    Empty,
    #[error("bad start line: {0}")]
    StartLine(&'static str),
    #[error("unsupported SIP version")]
    Version,
    #[error("bad status code")]
    StatusCode,
    #[error("bad Request-URI: {0}")]
    RequestUri(&'static str),
    #[error("bad header line: {0}")]
    HeaderLine(&'static str),
    #[error("headers not terminated by an empty line")]
    Unterminated,
    #[error("missing {0} header")]
    Missing(&'static str),
    #[error("bad {header} header: {what}")]
    Header {
        header: &'static str,
        what: &'static str,
    },
    #[error("{0} header must appear once")]
    Duplicate(&'static str),
    #[error("CSeq method does not match the request method")]
    CSeqMethodMismatch,
    #[error("Content-Length larger than the message body")]
    ContentLengthTooLarge,
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
