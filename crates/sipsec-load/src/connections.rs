//! TCP, TLS and WebSocket for the load generator: outbound connections for the caller — one
//! per target reused by every call (`--connection persistent`), or one per call closed when the
//! call ends (`per-call`) — and a listener for the callee that answers on the connection a
//! request came in on. Messages are framed by Content-Length (RFC 3261 §18.3); CRLF keep-alives
//! are skipped and a double-CRLF ping is answered. Over `ws`/`wss` each connection first
//! upgrades (as a browser would, without an Origin) and messages are WebSocket messages.
//!
//! TLS is a `tls::Session` (rustls, or OpenSSL with the `openssl` feature) fed by hand from the
//! same non-blocking sockets, so one loop serves both and the handshakes, full or resumed, are
//! counted where they happen.
//!
//! Link numbering: link 0 means "the caller's connection to this address" (found or opened
//! here); link n ≥ 1 is connection n−1 itself, which is how the UA answers on the connection a
//! request arrived on.

use super::driver::{pollfd, LinkCounters, Links};
use super::sources::Sources;
use super::ua::{self, Endpoint, Transmit, Ua};
use sipsec_transport::net::conn::{Framed, ReadEnd, StreamConn};
use sipsec_transport::net::{set_int_option, unsent_in_kernel};
use sipsec_transport::tls::{ClientTls, HandshakeKind, ServerTls, Session};
use socket2::{Domain, SockAddr, Socket, Type};
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;

/// Largest message accepted from a stream.
const MAX_MESSAGE: usize = 65_535;
/// Unsent bytes on the caller's connection — queued here, or in the kernel's send queue and
/// not yet sent — beyond which new operations fail unsent ([`Links::backlogged`]); Kamailio's
/// default `tcp_conn_wq_max`, which counts only its own queue, is the same size. Judged before
/// each start, so what one turn of the loop starts at once (a batch after a stall) may go
/// past it. Past the server's read rate the excess then fails here at once instead of
/// queueing without limit and reaching the server seconds late, when every call it carries
/// is lost whatever the server does.
const MAX_QUEUED: usize = 32 * 1024;

struct Conn {
    io: StreamConn,
    /// The TLS handshake finished and was counted.
    established: bool,
    /// The call this connection was opened for (per-call mode).
    call: Option<u64>,
    /// The call ended with bytes still queued: close once they are written.
    closing: bool,
    /// A registering callee's flow: its closing is reported to the UA.
    flow: bool,
}

impl Conn {
    fn new(stream: TcpStream, remote: SocketAddr, tls: Option<Session>) -> Conn {
        Conn {
            io: StreamConn::new(stream, remote, tls),
            established: false,
            call: None,
            closing: false,
            flow: false,
        }
    }
}

/// What a link set needs for TLS: the caller's client configuration and the name it checks the
/// server's certificate against (default: the address), the callee's server configuration.
#[derive(Clone, Default)]
pub struct StreamTls {
    /// The caller's configuration and the name it checks; `None` for plain TCP.
    pub client: Option<(ClientTls, Option<String>)>,
    /// The callee's configuration; `None` for plain TCP.
    pub server: Option<ServerTls>,
}

/// TCP and TLS links: a listener for the UAS, connections both ways (the fields named as in
/// the server's connection table).
pub(crate) struct StreamLinks {
    listener: Option<TcpListener>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    by_remote: HashMap<SocketAddr, usize>,
    by_call: HashMap<u64, usize>,
    per_call: bool,
    local_ip: Option<std::net::IpAddr>,
    tls: StreamTls,
    scratch: Vec<u8>,
    counters: LinkCounters,
    /// The first TLS failure was logged (later ones are only counted).
    tls_failure_logged: bool,
    /// Where a registering callee's flows connect from (default: `local_ip`).
    flow_ip: Option<std::net::IpAddr>,
    /// Where each call's own connection comes from (per-call mode, `--source-addresses`;
    /// default: `local_ip`).
    sources: Option<Sources>,
    /// Flows that closed and are not yet reported to the UA (their slots are reused only
    /// once it knows).
    closed_flows: Vec<usize>,
    /// SIP over WebSocket (RFC 7118): connections upgrade first, messages are frames.
    websocket: Option<std::sync::Arc<sipsec_transport::net::ws::Policy>>,
}

impl StreamLinks {
    pub(crate) fn new(
        listener: Option<TcpListener>,
        per_call: bool,
        local_ip: Option<std::net::IpAddr>,
        tls: StreamTls,
    ) -> StreamLinks {
        StreamLinks {
            listener,
            conns: Vec::new(),
            free: Vec::new(),
            by_remote: HashMap::new(),
            by_call: HashMap::new(),
            per_call,
            local_ip,
            tls,
            scratch: vec![0; 64 * 1024],
            counters: LinkCounters::default(),
            tls_failure_logged: false,
            closed_flows: Vec::new(),
            flow_ip: None,
            sources: None,
            websocket: None,
        }
    }

    /// The same links speaking SIP over WebSocket when `on`.
    pub(crate) fn with_websocket(self, on: bool) -> StreamLinks {
        let policy = sipsec_transport::net::ws::Policy {
            max_message: MAX_MESSAGE,
            ..Default::default()
        };
        StreamLinks {
            websocket: on.then(|| std::sync::Arc::new(policy)),
            ..self
        }
    }

    /// The same links, a registering callee's flows connecting from `ip`.
    pub(crate) fn with_flows_from(self, ip: std::net::IpAddr) -> StreamLinks {
        StreamLinks {
            flow_ip: Some(ip),
            ..self
        }
    }

    /// The same links, each call's connection coming from its address among `sources`.
    pub(crate) fn with_sources(self, sources: Sources) -> StreamLinks {
        StreamLinks {
            sources: Some(sources),
            ..self
        }
    }

    /// Binds the UAS listener.
    pub(crate) fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
        let l = TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        Ok(l)
    }

    fn insert(&mut self, conn: Conn) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.conns[i] = Some(conn);
                i
            }
            None => {
                self.conns.push(Some(conn));
                self.conns.len() - 1
            }
        }
    }

    fn close(&mut self, i: usize) {
        if let Some(c) = self.conns.get_mut(i).and_then(Option::take) {
            if self.by_remote.get(&c.io.remote) == Some(&i) {
                self.by_remote.remove(&c.io.remote);
            }
            if let Some(call) = c.call {
                self.by_call.remove(&call);
            }
            if c.flow {
                self.closed_flows.push(i);
            } else {
                self.free.push(i);
            }
        }
    }

    /// Starts a non-blocking connection to `remote` from `local_ip` (the kernel's choice
    /// when none). A connection per call from one address would otherwise take an ephemeral
    /// port of its own at `bind` and hold it in TIME_WAIT for 60 s after the call: about 470
    /// connections a second before the range runs out, which back-to-back lab rows at 500
    /// calls/s reached (calls failing for the load's want of ports, not the server's).
    fn connect(
        &mut self,
        remote: SocketAddr,
        call: Option<u64>,
        local_ip: Option<std::net::IpAddr>,
    ) -> io::Result<usize> {
        let socket = Socket::new(Domain::for_address(remote), Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        socket.set_nodelay(true)?;
        if let Some(ip) = local_ip {
            bind_address_no_port(&socket);
            socket.bind(&SockAddr::from(SocketAddr::new(ip, 0)))?;
        }
        match socket.connect(&SockAddr::from(remote)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        let tls = match &self.tls.client {
            Some((cfg, name)) => {
                let name = sipsec_transport::tls::server_name(name.as_deref(), remote.ip())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
                Some(cfg.connect(name).map_err(io::Error::other)?)
            }
            None => None,
        };
        let mut conn = Conn::new(socket.into(), remote, tls);
        conn.call = call;
        if let Some(policy) = &self.websocket {
            conn.io.open_websocket(policy.clone(), &remote.to_string());
        }
        self.counters.connections_opened += 1;
        Ok(self.insert(conn))
    }

    /// The connection a transmission goes on, opening one when needed.
    fn conn_for(&mut self, peer: Endpoint, data: &[u8]) -> Option<usize> {
        if peer.link > 0 {
            let i = peer.link as usize - 1;
            return self.conns.get(i)?.as_ref().map(|_| i);
        }
        let call = if self.per_call {
            call_number(data)
        } else {
            None
        };
        let existing = match call {
            Some(n) => self.by_call.get(&n).copied(),
            None => self.by_remote.get(&peer.addr).copied(),
        };
        if let Some(i) = existing {
            return Some(i);
        }
        let from = match (call, self.sources) {
            (Some(n), Some(sources)) => Some(sources.of_call(n).ip()),
            _ => self.local_ip,
        };
        match self.connect(peer.addr, call, from) {
            Ok(i) => {
                match call {
                    Some(n) => self.by_call.insert(n, i),
                    None => self.by_remote.insert(peer.addr, i),
                };
                Some(i)
            }
            Err(e) => {
                tracing::debug!("connect to {} failed: {e}", peer.addr);
                self.counters.connection_errors += 1;
                None
            }
        }
    }

    fn accept_all(&mut self) {
        let Some(listener) = &self.listener else {
            return;
        };
        let mut accepted = Vec::new();
        loop {
            match listener.accept() {
                Ok((stream, remote)) => accepted.push((stream, remote)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!("accept failed: {e}");
                    self.counters.connection_errors += 1;
                    break;
                }
            }
        }
        for (stream, remote) in accepted {
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let _ = stream.set_nodelay(true);
            let tls = match &self.tls.server {
                Some(cfg) => match cfg.accept() {
                    Ok(session) => Some(session),
                    Err(e) => {
                        tracing::debug!("TLS for a connection from {remote} failed: {e}");
                        self.counters.connection_errors += 1;
                        continue;
                    }
                },
                None => None,
            };
            self.counters.connections_accepted += 1;
            let mut conn = Conn::new(stream, remote, tls);
            if let Some(policy) = &self.websocket {
                conn.io.serve_websocket(policy.clone());
            }
            self.insert(conn);
        }
    }

    /// Counts a failed TLS session; the first failure is logged with its reason, since it is
    /// usually a configuration error (an untrusted CA, a missing client certificate).
    fn tls_failed(&mut self, remote: SocketAddr, why: &dyn std::fmt::Display) {
        self.counters.tls_handshake_failures += 1;
        if !self.tls_failure_logged {
            self.tls_failure_logged = true;
            tracing::warn!("TLS with {remote} failed: {why} (further failures are only counted)");
        }
    }
}

/// The call number in one of our outgoing messages, found without parsing the whole message
/// (we write `Call-ID: ` ourselves).
fn call_number(data: &[u8]) -> Option<u64> {
    const LABEL: &[u8] = b"\r\nCall-ID: ";
    let at = memchr::memmem::find(data, LABEL)? + LABEL.len();
    let end = memchr::memchr(b'\r', &data[at..])?;
    ua::call_number(&data[at..at + end]).map(|(number, _)| number)
}

impl StreamLinks {
    /// Counts a handshake the moment it completes: the caller's by kind, the UAS's in all.
    fn note_handshake(&mut self, i: usize) {
        let Some(c) = self.conns[i].as_mut() else {
            return;
        };
        let Some(tls) = &c.io.tls else {
            return;
        };
        if c.established || tls.is_handshaking() {
            return;
        }
        c.established = true;
        let n = &mut self.counters;
        match (tls.is_server(), tls.handshake_kind()) {
            (true, _) => n.tls_accepted_handshakes += 1,
            (_, Some(HandshakeKind::Resumed)) => n.tls_resumed_handshakes += 1,
            _ => n.tls_full_handshakes += 1,
        }
    }
}

impl Links for StreamLinks {
    fn poll_set(&self, out: &mut Vec<libc::pollfd>) {
        out.extend(self.listener.iter().map(|l| pollfd(l.as_raw_fd(), false)));
        out.extend(
            self.conns
                .iter()
                .flatten()
                .map(|c| pollfd(c.io.stream.as_raw_fd(), c.io.has_output())),
        );
    }

    fn receive(&mut self, ua: &mut Ua, now_us: u64, out: &mut Vec<Transmit>) -> usize {
        for i in std::mem::take(&mut self.closed_flows) {
            ua.link_closed(now_us, i as u32 + 1, out);
            self.free.push(i);
        }
        self.accept_all();
        let mut messages = 0;
        let mut framed = Framed::default();
        for i in 0..self.conns.len() {
            let mut failed = false;
            let mut tls_error = None;
            {
                let Some(c) = self.conns[i].as_mut() else {
                    continue;
                };
                if !c.io.flush() {
                    failed = true;
                }
                match c.io.read(&mut self.scratch) {
                    // `read` has no limit, so never stops at one.
                    ReadEnd::Drained | ReadEnd::Limit => {}
                    ReadEnd::Closed => failed = true,
                    ReadEnd::TlsError(why) => {
                        failed = true;
                        tls_error = Some((c.io.remote, why));
                    }
                }
                c.io.frame(MAX_MESSAGE, &mut framed);
                if let Some(why) = framed.invalid {
                    tracing::debug!("closing a connection from {}: {why}", c.io.remote);
                    failed = true;
                }
                if framed.ping {
                    c.io.queue(b"\r\n");
                }
                // Keep-alive bytes that were not a ping: the pong to a flow's own ping. A lone
                // CRLF at the end is one too, though the framer waits to see whether it starts
                // a ping: on a flow the server answers pings, it does not send them (RFC 5626
                // §4.4.1).
                let framed_len: usize = framed.messages.iter().map(|&(_, len)| len).sum();
                let crlf = c.flow && self.websocket.is_none();
                let mut pong = crlf && !framed.ping && framed.consumed > framed_len;
                if crlf && c.io.inbuf[framed.consumed..] == *b"\r\n" {
                    framed.consumed += 2;
                    pong = true;
                }
                if pong {
                    ua.keepalive_answered(i as u32 + 1);
                }
                let from = Endpoint {
                    link: i as u32 + 1,
                    addr: c.io.remote,
                };
                for &(s, len) in &framed.messages {
                    if let Some(message) = c.io.message(s, len) {
                        ua.on_message(now_us, from, message, out);
                    }
                }
                messages += framed.messages.len();
                c.io.consume(framed.consumed);
                // Handshake replies (and pongs) go out now, not on the next send.
                failed |= !c.io.flush();
                failed |= c.closing && !c.io.has_output();
            }
            self.note_handshake(i);
            if let Some((remote, why)) = tls_error {
                self.tls_failed(remote, &why);
            }
            if failed {
                let had_output = self.conns[i].as_ref().is_some_and(|c| c.io.has_output());
                self.counters.connection_errors += u64::from(had_output);
                self.close(i);
            }
        }
        messages
    }

    fn backlogged(&self) -> bool {
        // Judged now, not at the last send: a backlog clears (or its connection closes) while
        // nothing is sent, and no new call would be sent to find out. A system call a start.
        !self.per_call
            && self.by_remote.values().any(|&i| {
                self.conns[i].as_ref().is_some_and(|c| {
                    c.io.queued_bytes() + unsent_in_kernel(c.io.stream.as_raw_fd()) > MAX_QUEUED
                })
            })
    }

    fn send(&mut self, out: &mut Vec<Transmit>) -> usize {
        let mut failed = 0;
        let mut touched = Vec::new();
        for (peer, data) in out.drain(..) {
            match self.conn_for(peer, &data) {
                Some(i) => {
                    if let Some(c) = self.conns[i].as_mut() {
                        c.io.queue(&data);
                        touched.push(i);
                    }
                }
                None => failed += 1,
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for i in touched {
            let ok = self.conns[i].as_mut().is_some_and(|c| c.io.flush());
            if !ok {
                failed += 1;
                self.counters.connection_errors += 1;
                self.close(i);
            }
        }
        failed
    }

    /// Closes the connections of calls that have ended (per-call mode).
    fn release_calls(&mut self, ended: &mut Vec<u64>) {
        for call in ended.drain(..) {
            if let Some(i) = self.by_call.get(&call).copied() {
                let done = self.conns[i].as_mut().is_some_and(|c| {
                    c.io.close_notify();
                    !c.io.has_output()
                });
                if done {
                    self.close(i);
                } else if let Some(c) = self.conns[i].as_mut() {
                    // Let the last bytes go first; the connection closes when they have.
                    c.call = None;
                    c.closing = true;
                    self.by_call.remove(&call);
                }
            }
        }
    }

    fn counters(&self) -> LinkCounters {
        LinkCounters {
            open: (self.conns.len() - self.free.len() - self.closed_flows.len()) as u64,
            ..self.counters
        }
    }

    fn open_flow(&mut self, remote: SocketAddr) -> io::Result<(u32, SocketAddr)> {
        let i = self.connect(remote, None, self.flow_ip.or(self.local_ip))?;
        let c = self.conns[i].as_mut().expect("just inserted");
        c.flow = true;
        match c.io.stream.local_addr() {
            Ok(local) => Ok((i as u32 + 1, local)),
            Err(e) => {
                c.flow = false;
                self.close(i);
                Err(e)
            }
        }
    }

    fn close_flow(&mut self, link: u32) {
        let Some(i) = (link as usize).checked_sub(1) else {
            return;
        };
        if let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) {
            // Closed at the UA's request: nothing to report back.
            c.flow = false;
            c.io.close_notify();
            let _ = c.io.flush();
            self.close(i);
        }
    }
}

/// Asks the kernel to choose the local port at `connect` rather than at `bind`
/// (`IP_BIND_ADDRESS_NO_PORT`, Linux 4.2), so connections from one bound address to different
/// peers share ports and loopback reuses TIME_WAIT ones. Best effort: without it (another
/// kernel) `bind` picks the port as before.
fn bind_address_no_port(socket: &Socket) {
    use std::os::fd::AsRawFd;
    set_int_option(
        socket.as_raw_fd(),
        libc::IPPROTO_IP,
        libc::IP_BIND_ADDRESS_NO_PORT,
        1,
    );
}
