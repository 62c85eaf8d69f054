//! One TCP, TLS or WebSocket connection's bytes: plaintext queued out, bytes read in, TLS (a
//! `tls::Session` fed the socket's bytes by hand, so one loop serves TCP and TLS alike, with
//! either TLS backend, and handshakes are seen where they finish), and framing: on a plain
//! stream RFC 3261 §18.3's by Content-Length with RFC 5626 CRLF keep-alives, on a WebSocket
//! one message per WebSocket message ([`super::ws`]).

use super::ws::{Policy, Sink, WebSocket};
use crate::tls::{Received, Session};
use sip_core::message::framing::{next_frame, Frame};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

/// One accepted or opened stream connection: its socket, its TLS session if any, and the bytes
/// waiting to be framed or written.
pub struct StreamConn {
    /// The non-blocking socket.
    pub stream: TcpStream,
    /// The peer's address.
    pub remote: SocketAddr,
    /// TLS state: plaintext goes through it, and its records are moved to `outbuf` as they
    /// are made, so what waits for the socket is counted exactly on every transport.
    pub tls: Option<Box<Session>>,
    /// WebSocket state (`ws:`, `wss:`): between the plaintext and SIP.
    ws: Option<Box<WebSocket>>,
    /// Received plaintext not yet framed. Empty (and unallocated) on an idle connection.
    pub inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    /// Plaintext queued while the TLS handshake runs, which the session holds until it
    /// finishes (and then seals into `outbuf`).
    handshake_plain: usize,
    /// Bytes the socket has taken, all told.
    written: u64,
}

/// How reading a connection ended.
#[derive(Debug)]
pub enum ReadEnd {
    /// Nothing more to read for now.
    Drained,
    /// The read stopped at its limit ([`StreamConn::read_up_to`]) with more perhaps waiting:
    /// no new readiness edge comes for it, so read again soon.
    Limit,
    /// The peer closed or reset the connection.
    Closed,
    /// TLS failed (bad record, alert, certificate refused).
    TlsError(crate::tls::Error),
}

/// What framing found in the received bytes.
#[derive(Debug, Default)]
pub struct Framed {
    /// Whole messages, as (start, length) in `inbuf`.
    pub messages: Vec<(usize, usize)>,
    /// Bytes consumed: messages and keep-alives.
    pub consumed: usize,
    /// A double-CRLF ping arrived; answer with a CRLF pong.
    pub ping: bool,
    /// The stream cannot be framed (no Content-Length, oversize); close it.
    pub invalid: Option<&'static str>,
    /// What made it invalid was a message over the size limit, starting at `consumed`.
    pub too_large: bool,
    /// The peer closed the WebSocket with a Close frame (answered); the connection ends.
    pub closed: bool,
}

impl StreamConn {
    /// A connection over `stream`, TLS if a session is given, with empty buffers.
    pub fn new(stream: TcpStream, remote: SocketAddr, tls: Option<Session>) -> Self {
        StreamConn {
            stream,
            remote,
            tls: tls.map(Box::new),
            ws: None,
            inbuf: Vec::new(),
            outbuf: Vec::new(),
            handshake_plain: 0,
            written: 0,
        }
    }

    /// Speaks SIP over WebSocket as the server: the peer's first bytes must be the upgrade.
    pub fn serve_websocket(&mut self, policy: Arc<Policy>) {
        self.ws = Some(Box::new(WebSocket::server(policy)));
    }

    /// Speaks SIP over WebSocket as the client: the upgrade request, naming `host`, is
    /// queued now, and messages queued wait for its answer.
    pub fn open_websocket(&mut self, policy: Arc<Policy>, host: &str) {
        let ws = WebSocket::client(policy, host, &mut sink(&mut self.tls, &mut self.outbuf));
        self.ws = Some(Box::new(ws));
    }

    /// Queues one SIP message (or, on a plain stream, any bytes) for the peer.
    pub fn queue(&mut self, data: &[u8]) {
        if self.tls.as_ref().is_some_and(|t| t.is_handshaking()) {
            self.handshake_plain += data.len();
        }
        let mut out = sink(&mut self.tls, &mut self.outbuf);
        match &mut self.ws {
            Some(ws) => {
                ws.send(data, &mut out);
            }
            None => {
                let _ = out.write_all(data);
            }
        }
        self.seal();
    }

    /// Moves the records the TLS session has made into `outbuf` (the copy is small beside the
    /// encryption, and it is what lets [`StreamConn::queued_bytes`] be exact over TLS).
    fn seal(&mut self) {
        let Some(tls) = &mut self.tls else {
            return;
        };
        while tls.wants_write() {
            match tls.write_to(&mut self.outbuf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        if !tls.is_handshaking() {
            self.handshake_plain = 0;
        }
    }

    /// A keep-alive the peer answers: a WebSocket Ping (nothing on other streams, whose
    /// clients send the keep-alives).
    pub fn ping(&mut self) {
        if let Some(ws) = &mut self.ws {
            ws.ping(&mut sink(&mut self.tls, &mut self.outbuf));
        }
    }

    /// Whether SIP can flow: always on a plain stream, after the upgrade on a WebSocket.
    pub fn upgraded(&self) -> bool {
        self.ws.as_ref().is_none_or(|ws| ws.is_open())
    }

    /// A message has begun and not ended: bytes wait to be framed, or a WebSocket message's
    /// fragments are not all here.
    pub fn partial(&self) -> bool {
        !self.inbuf.is_empty() || self.ws.as_ref().is_some_and(|ws| ws.partial())
    }

    /// A WebSocket connection that ended with a Close frame either way (false on others).
    pub fn closed_cleanly(&self) -> bool {
        self.ws.as_ref().is_some_and(|ws| ws.closed_cleanly())
    }

    /// The message [`StreamConn::frame`] listed at `(start, len)`: in `inbuf`, or on a
    /// WebSocket among the messages it decoded.
    pub fn message(&self, start: usize, len: usize) -> Option<&[u8]> {
        match &self.ws {
            Some(ws) => ws.message(start, len),
            None => self.inbuf.get(start..start + len),
        }
    }

    /// Whether output is queued that the socket has not taken yet.
    pub fn has_output(&self) -> bool {
        !self.outbuf.is_empty() || self.tls.as_ref().is_some_and(|t| t.wants_write())
    }

    /// Bytes queued that the socket has not taken yet: what a sender that must not queue without
    /// limit (a peer that reads slower than it is sent to) checks before queueing more: the
    /// bytes waiting for the socket (TLS records included), and the plaintext a TLS session
    /// holds until its handshake finishes.
    pub fn queued_bytes(&self) -> usize {
        self.outbuf.len() + self.handshake_plain
    }

    /// Bytes the socket has taken from this connection, all told: whether a peer that is sent
    /// more than it reads is reading at all.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Writes as much queued output as the socket takes; false when the connection failed.
    pub fn flush(&mut self) -> bool {
        let would_wait = |e: &io::Error| {
            e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOTCONN)
        };
        self.seal();
        while !self.outbuf.is_empty() {
            match self.stream.write(&self.outbuf) {
                Ok(0) => return false,
                Ok(n) => {
                    self.outbuf.drain(..n);
                    self.written += n as u64;
                }
                Err(e) if would_wait(&e) => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        if self.outbuf.capacity() > 64 * 1024 {
            // A burst grew the buffer; an idle connection should not keep it.
            self.outbuf = Vec::new();
        }
        true
    }

    /// Reads what the socket holds into `inbuf` (through TLS when there is TLS). A read
    /// shorter than `scratch` means the socket was drained, so the usual extra read that
    /// only returns EAGAIN is skipped (a later arrival raises a new edge).
    pub fn read(&mut self, scratch: &mut [u8]) -> ReadEnd {
        self.read_up_to(scratch, usize::MAX)
    }

    /// As [`StreamConn::read`], but stops once `limit` bytes (as received: ciphertext over
    /// TLS) have been read and the socket may hold more ([`ReadEnd::Limit`]): a peer that
    /// sends as fast as it is read would otherwise keep one read going for as long as it
    /// sends, everything it sent held in `inbuf` and nothing answered meanwhile.
    pub fn read_up_to(&mut self, scratch: &mut [u8], limit: usize) -> ReadEnd {
        let mut taken = 0usize;
        loop {
            if taken >= limit {
                return ReadEnd::Limit;
            }
            let n = match self.recv(scratch) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return ReadEnd::Drained,
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return ReadEnd::Drained,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return ReadEnd::Closed,
            };
            taken += n;
            let Some(tls) = &mut self.tls else {
                if n == 0 {
                    return ReadEnd::Closed;
                }
                self.inbuf.extend_from_slice(&scratch[..n]);
                if n < scratch.len() {
                    return ReadEnd::Drained;
                }
                continue;
            };
            if n == 0 {
                if tls.is_handshaking() {
                    return ReadEnd::TlsError(crate::tls::Error::ClosedInHandshake);
                }
                return ReadEnd::Closed;
            }
            match tls.receive(&scratch[..n], &mut self.inbuf) {
                Ok(Received::Open) => {}
                Ok(Received::Closed) => return ReadEnd::Closed,
                Err(why) => {
                    // Tell the peer why (the alert the session queued), then give up on it.
                    let _ = tls.write_to(&mut self.stream);
                    return ReadEnd::TlsError(why);
                }
            }
            if n < scratch.len() {
                return ReadEnd::Drained;
            }
        }
    }

    /// One read of the socket into `scratch`.
    fn recv(&mut self, scratch: &mut [u8]) -> io::Result<usize> {
        self.stream.read(scratch)
    }

    /// Finds the whole messages and keep-alives at the front of `inbuf`; `max` bounds one
    /// message (on a WebSocket, the policy's limit does). The caller handles the messages
    /// (by [`StreamConn::message`]), then calls [`StreamConn::consume`].
    pub fn frame(&mut self, max: usize, out: &mut Framed) {
        out.messages.clear();
        out.consumed = 0;
        out.ping = false;
        out.invalid = None;
        out.too_large = false;
        out.closed = false;
        if let Some(ws) = &mut self.ws {
            ws.decode(&self.inbuf, &mut sink(&mut self.tls, &mut self.outbuf), out);
            return;
        }
        loop {
            match next_frame(&self.inbuf[out.consumed..], max) {
                Frame::Incomplete => break,
                Frame::KeepAlive { len, ping } => {
                    out.ping |= ping;
                    out.consumed += len;
                }
                Frame::Message(len) => {
                    out.messages.push((out.consumed, len));
                    out.consumed += len;
                }
                Frame::TooLarge => {
                    out.invalid = Some("message too large");
                    out.too_large = true;
                    break;
                }
                Frame::Invalid(why) => {
                    out.invalid = Some(why);
                    break;
                }
                Frame::Ambiguous(head) => {
                    // Answered (the parser refuses the duplicate with a 400), then closed:
                    // nothing after it can be framed with confidence.
                    out.messages.push((out.consumed, head));
                    out.consumed += head;
                    out.invalid = Some("duplicate Content-Length");
                    break;
                }
            }
        }
    }

    /// Drops the first `n` bytes of `inbuf` (and the messages a WebSocket decoded), and its
    /// allocation once it is empty and large.
    pub fn consume(&mut self, n: usize) {
        if let Some(ws) = &mut self.ws {
            ws.clear();
        }
        self.inbuf.drain(..n);
        if self.inbuf.is_empty() && self.inbuf.capacity() > 64 * 1024 {
            self.inbuf = Vec::new();
        }
    }

    /// The handshake just finished: how (`None` while it is still running or on TCP).
    pub fn handshake_kind(&self) -> Option<crate::tls::HandshakeKind> {
        self.tls.as_ref()?.handshake_kind()
    }

    /// An accepted TLS connection whose client presented a certificate (false on TCP).
    pub fn client_certified(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.client_certified())
    }

    /// Sends a WebSocket Close (going away) and a TLS close_notify, as the connection has
    /// them, and writes what it can.
    pub fn close_notify(&mut self) {
        if let Some(ws) = &mut self.ws {
            ws.close(&mut sink(&mut self.tls, &mut self.outbuf));
        }
        if let Some(tls) = &mut self.tls {
            tls.close_notify();
        }
        self.flush();
    }
}

/// Where bytes for the peer go: TLS if the connection has it, else the output buffer.
fn sink<'a>(tls: &'a mut Option<Box<Session>>, outbuf: &'a mut Vec<u8>) -> Sink<'a> {
    match tls {
        Some(tls) => Sink::Tls(tls),
        None => Sink::Plain(outbuf),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    /// A connection over an accepted loopback stream (non-blocking), and its peer.
    fn accepted() -> (StreamConn, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, remote) = listener.accept().unwrap();
        stream.set_nonblocking(true).unwrap();
        (StreamConn::new(stream, remote, None), peer)
    }

    /// What the socket has not taken is counted, here and in the kernel, while the peer does
    /// not read, and it all goes once it does.
    #[test]
    fn queued_bytes_count_what_the_socket_has_not_taken() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, remote) = listener.accept().unwrap();
        client.set_nonblocking(true).unwrap();
        let mut conn = StreamConn::new(client, remote, None);
        let chunk = vec![b'x'; 64 * 1024];
        let total = 256 * chunk.len();
        for _ in 0..256 {
            conn.queue(&chunk);
        }
        assert_eq!(conn.queued_bytes(), total);
        assert!(conn.flush());
        let here = conn.queued_bytes();
        let in_kernel = crate::net::unsent_in_kernel(conn.stream.as_raw_fd());
        assert!(here > 0 && here < total, "{here} of {total} still here");
        assert!(in_kernel > 0, "the kernel holds what the peer did not read");
        // The peer reads everything: nothing stays queued.
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0; 1 << 20];
            let mut got = 0;
            while got < total {
                got += server.read(&mut buf).unwrap();
            }
            got
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while conn.has_output() && std::time::Instant::now() < deadline {
            assert!(conn.flush());
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(reader.join().unwrap(), total);
        assert_eq!(conn.queued_bytes(), 0);
    }

    /// A read with a limit stops there while the socket holds more, and says so; the next
    /// takes the rest, and says the socket is drained.
    #[test]
    fn a_limited_read_stops_at_its_limit_and_the_next_takes_the_rest() {
        let (mut conn, mut peer) = accepted();
        let total = 1 << 20;
        // The writer hands the stream back, so the connection stays open.
        let writer = std::thread::spawn(move || peer.write_all(&vec![b'x'; total]).map(|()| peer));
        // Small beside what a blocked writer leaves queued on loopback whatever the
        // kernel's buffer settings (a 256 KiB limit was never reached under Debian's
        // default tcp_rmem, where the receive queue stands near 128 KiB).
        let mut scratch = vec![0; 4 * 1024];
        let limit = 16 * 1024;
        // Wait until more than the limit has arrived.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut first = None;
        while std::time::Instant::now() < deadline {
            match conn.read_up_to(&mut scratch, limit) {
                ReadEnd::Limit => {
                    first = Some(conn.inbuf.len());
                    break;
                }
                ReadEnd::Drained => std::thread::sleep(Duration::from_millis(1)),
                end => panic!("{end:?}"),
            }
        }
        let first = first.expect("never reached the limit");
        // What an earlier drained read took, plus at most the limit and one scratch over.
        assert!(first < total, "{first}");
        let _peer = writer.join().unwrap().unwrap();
        while conn.inbuf.len() < total && std::time::Instant::now() < deadline {
            let before = conn.inbuf.len();
            match conn.read_up_to(&mut scratch, limit) {
                ReadEnd::Limit => assert!(conn.inbuf.len() - before <= limit + scratch.len()),
                ReadEnd::Drained => {}
                end => panic!("{end:?}"),
            }
        }
        assert_eq!(conn.inbuf.len(), total);
        assert!(matches!(
            conn.read_up_to(&mut scratch, limit),
            ReadEnd::Drained
        ));
    }
}
