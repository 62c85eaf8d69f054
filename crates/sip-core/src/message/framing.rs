//! Stream framing (RFC 3261 §18.3): on TCP and TLS a message ends where its Content-Length
//! says, and CRLF keep-alives (RFC 5626) may sit between messages. This finds message
//! boundaries in a receive buffer without parsing anything else.

use super::scan::{parse_u64, trim};
use super::HeaderName;

/// What the front of a stream buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// Need more bytes.
    Incomplete,
    /// A keep-alive of this many bytes (`CRLF` or `CRLFCRLF`): a double CRLF is a ping to
    /// answer with a single CRLF pong.
    KeepAlive {
        /// Bytes the keep-alive occupies: 2 or 4.
        len: usize,
        /// Whether it is a double-CRLF ping that expects a pong.
        ping: bool,
    },
    /// A whole message of this many bytes.
    Message(usize),
    /// A message longer than allowed begins here: answer 513 if it can be addressed, then
    /// close (the rest of it cannot be skipped reliably).
    TooLarge,
    /// The stream is unusable; close it.
    Invalid(&'static str),
    /// A message with more than one Content-Length: where it ends, and so where the next one
    /// starts, cannot be known. Its head (this many bytes) can still be answered 400; then
    /// the stream must close, whatever the values said (a proxy and its next hop that each
    /// believed another would frame the rest of the stream differently: request smuggling).
    Ambiguous(usize),
}

/// The empty line ending a message's headers. The searcher is built once: building it is
/// most of the cost of searching a few hundred bytes.
static HEAD_END: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\r\n\r\n"));

/// Finds the first frame in `buf`. `max` bounds a message so a peer cannot make us buffer
/// without limit.
pub fn next_frame(buf: &[u8], max: usize) -> Frame {
    if buf.starts_with(b"\r\n\r\n") {
        return Frame::KeepAlive { len: 4, ping: true };
    }
    if buf.starts_with(b"\r\n") {
        if buf.len() < 4 && b"\r\n\r\n".starts_with(buf) {
            return Frame::Incomplete;
        }
        return Frame::KeepAlive {
            len: 2,
            ping: false,
        };
    }
    if buf.is_empty() {
        return Frame::Incomplete;
    }
    let Some(head_end) = HEAD_END.find(buf) else {
        return if buf.len() > max {
            Frame::TooLarge
        } else {
            Frame::Incomplete
        };
    };
    let body_start = head_end + 4;
    let mut content_length = None;
    let head = &buf[..head_end];
    // Every line after the start line; only one starting as Content-Length or its compact
    // form `l` can matter, so the others cost a look at their first byte.
    let mut next = memchr::memchr(b'\n', head).map_or(head.len(), |i| i + 1);
    while next < head.len() {
        let start = next;
        let end = memchr::memchr(b'\n', &head[start..]).map_or(head.len(), |i| start + i);
        next = end + 1;
        let line = &head[start..end];
        if !matches!(line.first(), Some(b'c' | b'C' | b'l' | b'L')) {
            continue;
        }
        let Some(colon) = memchr::memchr(b':', line) else {
            continue;
        };
        if HeaderName::from_bytes(trim(&line[..colon])) == HeaderName::ContentLength {
            if content_length.is_some() {
                return Frame::Ambiguous(body_start);
            }
            match parse_u64(trim(&line[colon + 1..])).and_then(|v| usize::try_from(v).ok()) {
                Some(v) => content_length = Some(v),
                None => return Frame::Invalid("bad Content-Length"),
            }
        }
    }
    let Some(len) = content_length else {
        return Frame::Invalid("missing Content-Length on a stream");
    };
    let total = body_start.saturating_add(len);
    if total > max {
        Frame::TooLarge
    } else if buf.len() < total {
        Frame::Incomplete
    } else {
        Frame::Message(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_by_content_length() {
        let m = b"OPTIONS sip:a SIP/2.0\r\nl: 3\r\n\r\nabcNEXT";
        assert_eq!(next_frame(m, 1000), Frame::Message(m.len() - 4));
        assert_eq!(next_frame(&m[..20], 1000), Frame::Incomplete);
        assert_eq!(next_frame(&m[..m.len() - 6], 1000), Frame::Incomplete);
    }

    #[test]
    fn keepalives_and_errors() {
        assert_eq!(
            next_frame(b"\r\n\r\nINVITE", 100),
            Frame::KeepAlive { len: 4, ping: true }
        );
        assert_eq!(
            next_frame(b"\r\nINVITE", 100),
            Frame::KeepAlive {
                len: 2,
                ping: false
            }
        );
        assert_eq!(next_frame(b"\r\n\r", 100), Frame::Incomplete);
        assert!(matches!(
            next_frame(b"INVITE x SIP/2.0\r\n\r\n", 100),
            Frame::Invalid(_)
        ));
        assert_eq!(
            next_frame(b"A\r\nContent-Length: 9999\r\n\r\n", 100),
            Frame::TooLarge
        );
        assert_eq!(next_frame(&[b'a'; 200], 100), Frame::TooLarge);
    }

    #[test]
    fn two_content_lengths_leave_the_stream_unframeable() {
        for second in ["Content-Length: 3", "l: 0", "content-length:3"] {
            let m = format!("OPTIONS sip:a SIP/2.0\r\nl: 3\r\n{second}\r\n\r\nabcNEXT");
            let head = m.find("\r\n\r\n").unwrap() + 4;
            assert_eq!(
                next_frame(m.as_bytes(), 1000),
                Frame::Ambiguous(head),
                "{second}"
            );
        }
    }
}
