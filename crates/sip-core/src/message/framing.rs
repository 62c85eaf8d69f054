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
    KeepAlive { len: usize, ping: bool },
    /// A whole message of this many bytes.
    Message(usize),
    /// A message longer than allowed begins here: answer 513 if it can be addressed, then
    /// close (the rest of it cannot be skipped reliably).
    TooLarge,
    /// The stream is unusable; close it.
    Invalid(&'static str),
}

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
    let Some(head_end) = memchr::memmem::find(buf, b"\r\n\r\n") else {
        return if buf.len() > max {
            Frame::TooLarge
        } else {
            Frame::Incomplete
        };
    };
    let body_start = head_end + 4;
    let mut content_length = None;
    for line in buf[..head_end].split(|b| *b == b'\n').skip(1) {
        if line.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
            continue;
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        if HeaderName::from_bytes(trim(&line[..colon])) == HeaderName::ContentLength {
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
}
