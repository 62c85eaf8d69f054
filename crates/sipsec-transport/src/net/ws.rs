//! One WebSocket connection's SIP layer (RFC 7118 over RFC 6455): the HTTP upgrade that opens
//! it, checked against the server's [`Policy`], then SIP messages carried one per WebSocket
//! message. It sits between a [`StreamConn`](super::conn::StreamConn)'s bytes (plaintext,
//! after TLS for `wss:`) and the messages the engine sees, and does no I/O of its own: it is
//! given what arrived and writes what goes back into a [`Sink`].
//!
//! What to call when: [`WebSocket::decode`] with the bytes received so far (it answers the
//! upgrade, control frames and closes into the sink, lists whole messages, and says how many
//! bytes it used — a frame not yet whole waits in the caller's buffer); [`WebSocket::message`]
//! for a message it listed, until [`WebSocket::clear`]; [`WebSocket::send`] for each SIP
//! message going out; [`WebSocket::close`] before the connection is dropped.
//!
//! Why tungstenite, and only its protocol layer: `WebSocketContext` takes the stream per call,
//! so it runs over the worker's own buffers — the socket, TLS, epoll set and timing wheel stay
//! the worker's, as for TCP — and it carries the rules a SIP server should not rewrite (masking,
//! control frames inside fragmented messages, the close handshake, UTF-8 of text messages,
//! size limits), tested against the Autobahn suite. The upgrade is ours (httparse for the
//! request, tungstenite's accept key), because what it checks — the `sip` subprotocol, the
//! Origin and Host a browser sends — and how it refuses are the server's policy. Frames are
//! handed to tungstenite only when whole (their headers walked here first): a frame held
//! half-sent stays in the connection's buffer, where its message timeout sees it.

use super::conn::Framed;
use crate::tls::Session;
use std::io::{self, Cursor, Read, Write};
use std::net::IpAddr;
use std::sync::Arc;
use tungstenite::error::Error as WsError;
use tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tungstenite::protocol::frame::{CloseFrame, FrameHeader};
use tungstenite::protocol::{Message, Role, WebSocketConfig, WebSocketContext};

/// The longest upgrade request (or response) head read before it is refused.
pub const MAX_HEAD: usize = 8 * 1024;
/// Headers an upgrade request may carry.
const MAX_HEADERS: usize = 32;
/// What tungstenite reads at a time from the whole frames it is given (its buffer is kept
/// per connection, so small: 20,000 idle browsers hold 20,000 of them).
const READ_CHUNK: usize = 2 * 1024;

/// What a WebSocket listener accepts (`[websocket]`), shared by its connections.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Origins (`scheme://host[:port]`, as a browser sends them) allowed besides pages from
    /// the host the socket was opened to; `*` allows any.
    pub origins: Vec<String>,
    /// Names a client may give in `Host` besides IP literals: a page whose name an attacker
    /// points at us (DNS rebinding) names itself there, and is refused. `*` allows any.
    pub hosts: Vec<String>,
    /// The largest SIP message, and frame, accepted.
    pub max_message: usize,
}

/// Where bytes for the peer go: into TLS (`wss:`), or the plaintext output buffer (`ws:`).
pub enum Sink<'a> {
    /// Encrypted for the peer.
    Tls(&'a mut Session),
    /// Written as they are.
    Plain(&'a mut Vec<u8>),
}

impl Write for Sink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Tls(s) => s.send(buf),
            Sink::Plain(v) => v.extend_from_slice(buf),
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Whole frames for tungstenite to read (then `WouldBlock`, never end-of-file: the
/// connection's end is the caller's to see), and the sink its answers go to.
struct Pipe<'a, 'b> {
    input: &'a [u8],
    sink: &'a mut Sink<'b>,
}

impl Read for Pipe<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.input.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.input.len());
        buf[..n].copy_from_slice(&self.input[..n]);
        self.input = &self.input[n..];
        Ok(n)
    }
}

impl Write for Pipe<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sink.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum State {
    /// Server: waiting for the whole upgrade request. Client: for the 101 to the request it
    /// sent with this key.
    Upgrading { client_key: Option<String> },
    /// Upgraded: frames.
    Open(Box<WebSocketContext>),
    /// Closed by a Close frame either way, or refused: nothing more is read or sent.
    Closed,
}

/// One connection's WebSocket state.
pub struct WebSocket {
    policy: Arc<Policy>,
    state: State,
    /// Messages decoded this pass, back to back; [`Framed::messages`] ranges point here.
    decoded: Vec<u8>,
    /// A fragmented message has begun and not ended (its frames are with tungstenite).
    fragmented: bool,
    /// Client: messages queued before the upgrade finished, sent once it has.
    held: Vec<Vec<u8>>,
    /// The upgrade finished: the peer's Close frame or ours ended it (not a bare TCP close).
    closed_cleanly: bool,
}

/// The outcome of reading an upgrade request.
enum Upgrade {
    /// Not all of it has arrived.
    Incomplete,
    /// Answered 101; the request took this many bytes.
    Accepted(usize),
    /// Answered with an error (written to the sink); the connection closes.
    Refused(&'static str),
}

impl WebSocket {
    /// The server side of a connection accepted on a `ws:` or `wss:` listener: it waits for
    /// the upgrade request.
    pub fn server(policy: Arc<Policy>) -> WebSocket {
        WebSocket::new(policy, State::Upgrading { client_key: None })
    }

    /// The client side of a connection we opened to `host` (what `Host` names): the upgrade
    /// request is written to `sink` now, and messages wait until the 101 arrives.
    pub fn client(policy: Arc<Policy>, host: &str, sink: &mut Sink<'_>) -> WebSocket {
        let key = tungstenite::handshake::client::generate_key();
        let _ = write!(
            sink,
            "GET / HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Protocol: sip\r\n\r\n"
        );
        WebSocket::new(
            policy,
            State::Upgrading {
                client_key: Some(key),
            },
        )
    }

    fn new(policy: Arc<Policy>, state: State) -> WebSocket {
        WebSocket {
            policy,
            state,
            decoded: Vec::new(),
            fragmented: false,
            held: Vec::new(),
            closed_cleanly: false,
        }
    }

    /// The upgrade has finished and the connection is not closed: SIP can flow.
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open(_))
    }

    /// A message has begun and not ended (a fragmented one, whose frames are not all here).
    pub fn partial(&self) -> bool {
        self.fragmented
    }

    /// The WebSocket was closed by a Close frame (either way), not just dropped.
    pub fn closed_cleanly(&self) -> bool {
        self.closed_cleanly
    }

    /// A message [`WebSocket::decode`] listed, by its range.
    pub fn message(&self, start: usize, len: usize) -> Option<&[u8]> {
        self.decoded.get(start..start + len)
    }

    /// Forgets the messages decoded (once the caller has handled them).
    pub fn clear(&mut self) {
        self.decoded.clear();
        if self.decoded.capacity() > 64 * 1024 {
            self.decoded = Vec::new();
        }
    }

    /// Frames one SIP message for the peer (a text message when it is UTF-8, else binary).
    /// Before the upgrade a client holds it; after a close it is dropped (false).
    pub fn send(&mut self, data: &[u8], sink: &mut Sink<'_>) -> bool {
        let ctx = match &mut self.state {
            State::Open(ctx) => ctx,
            State::Upgrading {
                client_key: Some(_),
            } => {
                self.held.push(data.to_vec());
                return true;
            }
            _ => return false,
        };
        let message = sip_message(data.to_vec());
        let mut pipe = Pipe { input: &[], sink };
        ctx.write(&mut pipe, message).is_ok() && ctx.flush(&mut pipe).is_ok()
    }

    /// Sends a Ping (a keep-alive the peer must answer).
    pub fn ping(&mut self, sink: &mut Sink<'_>) {
        if let State::Open(ctx) = &mut self.state {
            let mut pipe = Pipe { input: &[], sink };
            let _ = ctx.write(&mut pipe, Message::Ping(Default::default()));
            let _ = ctx.flush(&mut pipe);
        }
    }

    /// Starts the close handshake (1001, going away) if the WebSocket is open.
    pub fn close(&mut self, sink: &mut Sink<'_>) {
        if let State::Open(ctx) = &mut self.state {
            send_close(ctx, sink, CloseCode::Away);
            self.closed_cleanly = true;
        }
    }

    /// Reads `input`, the bytes received and not yet used: the upgrade, then whole frames.
    /// Whole messages are kept and listed in `out.messages`; answers (the upgrade's, pongs,
    /// closes) go to `sink`; `out.consumed` says how much of `input` was used. A refusal or a
    /// protocol error sets `out.invalid` (its answer already written); a Close frame sets
    /// `out.closed`.
    pub fn decode(&mut self, input: &[u8], sink: &mut Sink<'_>, out: &mut Framed) {
        let mut at = 0;
        if let State::Upgrading { client_key } = &self.state {
            let role = if client_key.is_some() {
                Role::Client
            } else {
                Role::Server
            };
            let upgrade = match client_key {
                None => upgrade_request(&self.policy, input, sink),
                Some(key) => upgrade_response(key, input),
            };
            match upgrade {
                Upgrade::Incomplete => return,
                Upgrade::Refused(why) => {
                    self.state = State::Closed;
                    out.consumed = input.len();
                    out.invalid = Some(why);
                    return;
                }
                Upgrade::Accepted(len) => {
                    let max = Some(self.policy.max_message);
                    let config = WebSocketConfig::default()
                        .read_buffer_size(READ_CHUNK)
                        .write_buffer_size(0)
                        .max_message_size(max)
                        .max_frame_size(max);
                    let mut ctx = Box::new(WebSocketContext::new(role, Some(config)));
                    let mut pipe = Pipe { input: &[], sink };
                    for held in self.held.drain(..) {
                        let _ = ctx.write(&mut pipe, sip_message(held));
                    }
                    let _ = ctx.flush(&mut pipe);
                    self.state = State::Open(ctx);
                    at = len;
                }
            }
        }
        let WebSocket {
            state,
            decoded,
            fragmented,
            policy,
            closed_cleanly,
            ..
        } = self;
        let State::Open(ctx) = state else {
            out.consumed = input.len();
            return;
        };
        let whole = match whole_frames(&input[at..], policy.max_message, fragmented) {
            Ok(n) => at + n,
            Err(why) => {
                let code = if why == TOO_LARGE {
                    CloseCode::Size
                } else {
                    CloseCode::Protocol
                };
                send_close(ctx, sink, code);
                *state = State::Closed;
                out.consumed = input.len();
                out.invalid = Some(why);
                return;
            }
        };
        let mut pipe = Pipe {
            input: &input[at..whole],
            sink,
        };
        let mut failure = None;
        loop {
            match ctx.read(&mut pipe) {
                Ok(Message::Text(text)) => push(decoded, text.as_bytes(), out),
                Ok(Message::Binary(data)) => push(decoded, &data, out),
                // Pings are answered by tungstenite; a Close is answered, and the next read
                // ends the connection.
                Ok(_) => {}
                Err(WsError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(WsError::ConnectionClosed | WsError::AlreadyClosed) => {
                    *closed_cleanly = true;
                    out.closed = true;
                    break;
                }
                Err(WsError::Capacity(_)) => {
                    failure = Some((CloseCode::Size, TOO_LARGE));
                    break;
                }
                Err(WsError::Utf8(_)) => {
                    failure = Some((CloseCode::Invalid, "a text message that is not UTF-8"));
                    break;
                }
                Err(_) => {
                    failure = Some((CloseCode::Protocol, "a WebSocket protocol error"));
                    break;
                }
            }
        }
        let _ = ctx.flush(&mut pipe);
        out.consumed = whole;
        if let Some((code, why)) = failure {
            send_close(ctx, pipe.sink, code);
            out.invalid = Some(why);
            out.consumed = input.len();
        }
        if out.closed || out.invalid.is_some() {
            *state = State::Closed;
        }
    }
}

const TOO_LARGE: &str = "message too large";

/// Tells the peer why the connection ends (a Close frame with `code`): going away, or, as
/// RFC 6455 §7.1.7 asks of an endpoint that fails the WebSocket connection, what failed.
fn send_close(ctx: &mut WebSocketContext, sink: &mut Sink<'_>, code: CloseCode) {
    let mut pipe = Pipe { input: &[], sink };
    let _ = ctx.close(
        &mut pipe,
        Some(CloseFrame {
            code,
            reason: "".into(),
        }),
    );
}

/// A SIP message as a WebSocket message: text when it is UTF-8, else binary (RFC 7118 §4).
fn sip_message(data: Vec<u8>) -> Message {
    match String::from_utf8(data) {
        Ok(text) => Message::text(text),
        Err(e) => Message::binary(e.into_bytes()),
    }
}

fn push(decoded: &mut Vec<u8>, message: &[u8], out: &mut Framed) {
    out.messages.push((decoded.len(), message.len()));
    decoded.extend_from_slice(message);
}

/// How many bytes at the front of `buf` are whole frames; `fragmented` follows the data
/// frames among them. A frame announcing a payload over `max` is refused before it arrives.
fn whole_frames(buf: &[u8], max: usize, fragmented: &mut bool) -> Result<usize, &'static str> {
    let mut at = 0;
    loop {
        let mut cursor = Cursor::new(&buf[at..]);
        let (header, len) = match FrameHeader::parse(&mut cursor) {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(at),
            Err(_) => return Err("a malformed WebSocket frame"),
        };
        if len > max as u64 {
            return Err(TOO_LARGE);
        }
        let total = cursor.position() as usize + len as usize;
        if total > buf.len() - at {
            return Ok(at);
        }
        match header.opcode {
            OpCode::Data(Data::Continue) => *fragmented &= !header.is_final,
            OpCode::Data(_) => *fragmented = !header.is_final,
            OpCode::Control(_) => {}
        }
        at += total;
    }
}

/// Writes an HTTP refusal and says why, for the count and the log.
fn refuse(sink: &mut Sink<'_>, status: &str, extra: &str, why: &'static str) -> Upgrade {
    let _ = write!(
        sink,
        "HTTP/1.1 {status}\r\n{extra}Connection: close\r\nContent-Length: 0\r\n\r\n"
    );
    Upgrade::Refused(why)
}

/// The server's side of the upgrade (RFC 6455 §4.2, RFC 7118 §4): a GET asking for
/// `websocket` version 13 with the `sip` subprotocol, from a Host and Origin the policy allows.
fn upgrade_request(policy: &Policy, input: &[u8], sink: &mut Sink<'_>) -> Upgrade {
    // Where the head ends, or (while it has not) how long it is so far.
    let end = memchr::memmem::find(input, b"\r\n\r\n");
    if end.map_or(input.len(), |e| e + 4) > MAX_HEAD {
        return refuse(
            sink,
            "431 Request Header Fields Too Large",
            "",
            "an upgrade request too large",
        );
    }
    let Some(end) = end else {
        return Upgrade::Incomplete;
    };
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(&input[..end + 4]) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) | Err(_) => {
            return refuse(sink, "400 Bad Request", "", "not an HTTP upgrade request");
        }
    };
    if req.method != Some("GET") || req.version != Some(1) {
        return refuse(sink, "400 Bad Request", "", "not an HTTP/1.1 GET");
    }
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .map(str::trim)
    };
    let lists = |name: &str, token: &str| {
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .filter_map(|h| std::str::from_utf8(h.value).ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    if !lists("upgrade", "websocket") || !lists("connection", "upgrade") {
        return refuse(
            sink,
            "426 Upgrade Required",
            "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n",
            "no WebSocket upgrade asked for",
        );
    }
    if header("sec-websocket-version") != Some("13") {
        return refuse(
            sink,
            "426 Upgrade Required",
            "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n",
            "a WebSocket version other than 13",
        );
    }
    let Some(key) = header("sec-websocket-key").filter(|k| k.len() == 24) else {
        return refuse(sink, "400 Bad Request", "", "no Sec-WebSocket-Key");
    };
    // RFC 7118 §4: the `sip` subprotocol, or no SIP at all.
    if !lists("sec-websocket-protocol", "sip") {
        return refuse(sink, "400 Bad Request", "", "no sip subprotocol");
    }
    let Some(host) = header("host").filter(|h| !h.is_empty()) else {
        return refuse(sink, "400 Bad Request", "", "no Host");
    };
    if !host_allowed(policy, host) {
        return refuse(sink, "403 Forbidden", "", "a Host not ours");
    }
    if !origin_allowed(policy, header("origin"), host) {
        return refuse(sink, "403 Forbidden", "", "an Origin not allowed");
    }
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let _ = write!(
        sink,
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: sip\r\n\r\n"
    );
    Upgrade::Accepted(len)
}

/// The client's side: a 101 that accepts our key and the `sip` subprotocol.
fn upgrade_response(key: &str, input: &[u8]) -> Upgrade {
    let Some(end) = memchr::memmem::find(input, b"\r\n\r\n") else {
        if input.len() > MAX_HEAD {
            return Upgrade::Refused("an upgrade response too large");
        }
        return Upgrade::Incomplete;
    };
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(len)) = res.parse(&input[..end + 4]) else {
        return Upgrade::Refused("not an HTTP response to the upgrade");
    };
    if res.code != Some(101) {
        return Upgrade::Refused("the upgrade was refused");
    }
    let header = |name: &str| {
        res.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.trim_ascii())
    };
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    if header("sec-websocket-accept") != Some(accept.as_bytes()) {
        return Upgrade::Refused("a wrong Sec-WebSocket-Accept");
    }
    if !header("sec-websocket-protocol").is_some_and(|p| p.eq_ignore_ascii_case(b"sip")) {
        return Upgrade::Refused("no sip subprotocol in the upgrade");
    }
    Upgrade::Accepted(len)
}

/// The host part of `Host` or of an Origin's authority: without the port, brackets kept off.
fn host_part(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority.split(':').next().unwrap_or(authority)
}

/// `Host` names an address (no name an attacker could point at us), or a name listed.
fn host_allowed(policy: &Policy, host: &str) -> bool {
    let name = host_part(host);
    name.parse::<IpAddr>().is_ok()
        || policy
            .hosts
            .iter()
            .any(|h| h == "*" || h.eq_ignore_ascii_case(name))
}

/// No Origin (not a browser: a phone, a load generator, another proxy), one listed, or a page
/// from the host the socket was opened to. Any other page is refused: without this any web
/// site a user visits could register and call through the user's network (cross-site
/// WebSocket hijacking).
fn origin_allowed(policy: &Policy, origin: Option<&str>, host: &str) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    if policy
        .origins
        .iter()
        .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Some((_, authority)) = origin.split_once("://") else {
        return false;
    };
    let authority = authority.split('/').next().unwrap_or(authority);
    host_part(authority).eq_ignore_ascii_case(host_part(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Arc<Policy> {
        Arc::new(Policy {
            origins: vec!["https://app.example.com".into()],
            hosts: vec!["sip.example.com".into()],
            max_message: 4096,
        })
    }

    fn request(extra: &str) -> String {
        format!(
            "GET / HTTP/1.1\r\nHost: sip.example.com:8443\r\nUpgrade: websocket\r\n\
             Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n{extra}\r\n"
        )
    }

    /// A server fed `input`; what it wrote back (HTTP as text) and what it found.
    fn serve(ws: &mut WebSocket, input: &[u8]) -> (String, Framed) {
        let (wrote, out) = serve_bytes(ws, input);
        (String::from_utf8_lossy(&wrote).into_owned(), out)
    }

    /// The same, the answer as bytes (frames).
    fn serve_bytes(ws: &mut WebSocket, input: &[u8]) -> (Vec<u8>, Framed) {
        let mut wrote = Vec::new();
        let mut out = Framed::default();
        ws.decode(input, &mut Sink::Plain(&mut wrote), &mut out);
        (wrote, out)
    }

    /// A client's frame: masked, as RFC 6455 requires of clients.
    fn client_frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mask = [1, 2, 3, 4];
        let mut f = vec![opcode | if fin { 0x80 } else { 0 }];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    }

    fn upgraded() -> WebSocket {
        let mut ws = WebSocket::server(policy());
        let (said, out) = serve(
            &mut ws,
            request("Sec-WebSocket-Protocol: sip\r\n").as_bytes(),
        );
        assert!(said.starts_with("HTTP/1.1 101 "), "{said}");
        assert!(out.invalid.is_none() && ws.is_open());
        ws
    }

    #[test]
    fn the_upgrade_answers_rfc_6455s_example_key_with_the_sip_subprotocol() {
        let mut ws = WebSocket::server(policy());
        let req =
            request("Sec-WebSocket-Protocol: foo, sip\r\nOrigin: https://app.example.com\r\n");
        // Half of it: nothing yet.
        let (said, out) = serve(&mut ws, &req.as_bytes()[..40]);
        assert_eq!((said.as_str(), out.consumed), ("", 0));
        let (said, out) = serve(&mut ws, req.as_bytes());
        assert!(
            said.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
            "{said}"
        );
        assert!(said.contains("Sec-WebSocket-Protocol: sip\r\n"), "{said}");
        assert_eq!(out.consumed, req.len());
        assert!(ws.is_open());
    }

    #[test]
    fn upgrades_the_policy_forbids_are_refused_with_their_reason() {
        let refused = |extra: &str| {
            let mut ws = WebSocket::server(policy());
            let (said, out) = serve(&mut ws, request(extra).as_bytes());
            assert!(!ws.is_open());
            (said.lines().next().unwrap_or("").to_string(), out.invalid)
        };
        let sip = "Sec-WebSocket-Protocol: sip\r\n";
        assert_eq!(
            refused(""),
            (
                "HTTP/1.1 400 Bad Request".into(),
                Some("no sip subprotocol")
            )
        );
        assert_eq!(
            refused("Sec-WebSocket-Protocol: chat\r\n").1,
            Some("no sip subprotocol")
        );
        assert_eq!(
            refused(&format!("{sip}Origin: https://evil.example.net\r\n")),
            (
                "HTTP/1.1 403 Forbidden".into(),
                Some("an Origin not allowed")
            )
        );
        // A page from the host the socket was opened to is its own origin.
        let mut ws = WebSocket::server(policy());
        let (said, _) = serve(
            &mut ws,
            request(&format!("{sip}Origin: http://sip.example.com:8080\r\n")).as_bytes(),
        );
        assert!(said.starts_with("HTTP/1.1 101"), "{said}");
        // DNS rebinding: a page whose own name now points at us, naming itself in Host.
        let rebound = request(&format!("{sip}Origin: http://evil.example.net\r\n"))
            .replace("Host: sip.example.com:8443", "Host: evil.example.net");
        let mut ws = WebSocket::server(policy());
        let (_, out) = serve(&mut ws, rebound.as_bytes());
        assert_eq!(out.invalid, Some("a Host not ours"));
        // No upgrade at all: 426, which names what would be accepted.
        let plain = request(sip).replace("Upgrade: websocket\r\n", "");
        let mut ws = WebSocket::server(policy());
        let (said, out) = serve(&mut ws, plain.as_bytes());
        assert!(said.starts_with("HTTP/1.1 426") && said.contains("Upgrade: websocket"));
        assert_eq!(out.invalid, Some("no WebSocket upgrade asked for"));
        // A head that never ends is refused at the limit.
        let mut ws = WebSocket::server(policy());
        let endless = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD));
        let (said, out) = serve(&mut ws, endless.as_bytes());
        assert!(said.starts_with("HTTP/1.1 431"));
        assert_eq!(out.invalid, Some("an upgrade request too large"));
    }

    #[test]
    fn messages_come_one_per_websocket_message_and_half_frames_wait() {
        let mut ws = upgraded();
        let invite = b"INVITE sip:bob@example.com SIP/2.0\r\n\r\n";
        let options = b"OPTIONS sip:example.com SIP/2.0\r\n\r\n";
        let mut bytes = client_frame(0x1, true, invite);
        bytes.extend(client_frame(0x2, true, options));
        let whole = bytes.len();
        let half = client_frame(0x1, true, invite);
        bytes.extend_from_slice(&half[..10]);
        let (said, out) = serve(&mut ws, &bytes);
        assert_eq!(said, "");
        assert_eq!(out.consumed, whole, "the half frame stays with the caller");
        let got: Vec<_> = out
            .messages
            .iter()
            .map(|&(s, l)| ws.message(s, l).unwrap().to_vec())
            .collect();
        assert_eq!(got, vec![invite.to_vec(), options.to_vec()]);
        ws.clear();
        // A fragmented message, with a ping between its fragments: answered with a pong,
        // and the message is partial until its last fragment.
        let mut bytes = client_frame(0x1, false, &invite[..10]);
        bytes.extend(client_frame(0x9, true, b"hi"));
        let (said, out) = serve_bytes(&mut ws, &bytes);
        assert!(out.messages.is_empty() && ws.partial());
        assert_eq!(said, b"\x8a\x02hi", "a pong with the ping's payload");
        let (_, out) = serve(&mut ws, &client_frame(0x0, true, &invite[10..]));
        assert!(!ws.partial());
        let (s, l) = out.messages[0];
        assert_eq!(ws.message(s, l).unwrap(), invite);
    }

    #[test]
    fn frames_out_of_rule_end_the_connection_with_a_close_that_says_why() {
        // Unmasked from a client (RFC 6455 §5.1): protocol error, 1002.
        let mut ws = upgraded();
        let (said, out) = serve_bytes(&mut ws, b"\x81\x02hi");
        assert_eq!(out.invalid, Some("a WebSocket protocol error"));
        assert_eq!(&said[..4], b"\x88\x02\x03\xea");
        // A frame announcing more than the limit, refused before it arrives: 1009.
        let mut ws = upgraded();
        let mut big = vec![0x81, 0x80 | 127];
        big.extend_from_slice(&(1u64 << 32).to_be_bytes());
        big.extend_from_slice(&[1, 2, 3, 4]);
        let (said, out) = serve_bytes(&mut ws, &big);
        assert_eq!(out.invalid, Some(TOO_LARGE));
        assert_eq!(&said[..4], b"\x88\x02\x03\xf1");
        // A text message that is not UTF-8: 1007.
        let mut ws = upgraded();
        let (_, out) = serve_bytes(&mut ws, &client_frame(0x1, true, b"\xff\xfe"));
        assert_eq!(out.invalid, Some("a text message that is not UTF-8"));
        // A Close from the peer is answered, and the connection ends cleanly.
        let mut ws = upgraded();
        let (said, out) = serve_bytes(&mut ws, &client_frame(0x8, true, &[0x03, 0xe8]));
        assert!(out.closed && out.invalid.is_none() && ws.closed_cleanly());
        assert_eq!(said, b"\x88\x02\x03\xe8");
        let mut wrote = Vec::new();
        assert!(!ws.send(b"OPTIONS", &mut Sink::Plain(&mut wrote)));
    }

    #[test]
    fn a_client_and_a_server_talk_sip_after_the_upgrade() {
        let mut to_server = Vec::new();
        let mut client = WebSocket::client(
            policy(),
            "sip.example.com",
            &mut Sink::Plain(&mut to_server),
        );
        // Held until the upgrade is answered.
        assert!(client.send(
            b"REGISTER sip:example.com SIP/2.0\r\n\r\n",
            &mut Sink::Plain(&mut to_server)
        ));
        let mut server = WebSocket::server(policy());
        let (answer, out) = serve(&mut server, &to_server);
        assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
        assert!(out.messages.is_empty());
        let mut to_server = Vec::new();
        let mut out = Framed::default();
        client.decode(
            answer.as_bytes(),
            &mut Sink::Plain(&mut to_server),
            &mut out,
        );
        assert!(client.is_open() && out.invalid.is_none());
        let (_, out) = serve(&mut server, &to_server);
        let (s, l) = out.messages[0];
        assert_eq!(
            server.message(s, l).unwrap(),
            b"REGISTER sip:example.com SIP/2.0\r\n\r\n"
        );
        // And back: the server's frames are unmasked, the client reads them.
        let mut to_client = Vec::new();
        assert!(server.send(b"SIP/2.0 200 OK\r\n\r\n", &mut Sink::Plain(&mut to_client)));
        let mut out = Framed::default();
        client.decode(&to_client, &mut Sink::Plain(&mut Vec::new()), &mut out);
        let (s, l) = out.messages[0];
        assert_eq!(client.message(s, l).unwrap(), b"SIP/2.0 200 OK\r\n\r\n");
    }
}
