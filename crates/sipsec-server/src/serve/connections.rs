//! A worker's TCP, TLS and WebSocket connections: its listeners (one SO_REUSEPORT socket per
//! worker per `tcp:`/`tls:`/`ws:`/`wss:` address, so the kernel spreads connections across
//! workers), the connections it accepted or opened, their framing, TLS, WebSocket upgrade,
//! keep-alives and timeouts.
//!
//! Costs that must not grow with the number of connections (seed 000 found OpenSIPS spending
//! half its CPU scanning its connection table for timeouts): readiness comes from the worker's
//! epoll set, so an event touches only its connection; each connection has at most one entry
//! on a timing wheel, re-armed lazily — activity only stamps `last_active`, and when the entry
//! fires it either closes the connection or moves it to its real deadline — so a tick touches
//! only the connections whose time is up.
//!
//! Like a UDP batch, the table hands what it read back to the worker: `Connections::on_event`
//! reads and frames, [`Connections::received`] lists the framed messages (still in their
//! connections' buffers, not copied), the worker gives them to the engine, and
//! [`Connections::release`] then consumes them. A connection that ends (the peer closed, or
//! sent bytes that are not SIP) is drained first: answers to what it sent still go out on
//! it, then it closes.
//!
//! Connection ids ([`ConnId`]) carry the owning worker, so a message for another worker's
//! connection is mailed to it. Outbound connections are found by remote address and reused
//! (`outbound_connections = "persistent"`), or opened per call and closed when the engine says the
//! call is over (`"per-call"`, keyed by Call-ID). A flow ([`Peer::flow`]: a phone that
//! registered over a connection and accepts no other) is never reopened: a request for it
//! goes over the connection named or fails at once.
//!
//! A WebSocket connection (RFC 7118) is only ever accepted — a browser opens it and is reached
//! over it, as a flow. Until its upgrade is answered it is a handshake like TLS's; once open,
//! a quiet one is sent a Ping every `[websocket] ping_interval_s` and closed if it stays silent
//! through the next, instead of being closed for idleness.
//!
//! Hostile peers: a connection past `max_connections`, or past `max_connections_per_ip` from
//! one address, is refused at accept; a handshake (TLS, or a WebSocket upgrade) or a
//! message begun but not finished within `message_timeout_ms` (slowloris) closes the
//! connection; bytes that are not SIP framing close it; TLS failures close it; an upgrade the
//! `[websocket]` policy forbids is answered 4xx and closed. A peer that does not read what is
//! sent to it is closed too, as Kamailio's `tcp_send_timeout` and `tcp_conn_wq_max` close one:
//! when the socket has taken nothing of its queue for `message_timeout_ms`, when its queue
//! would pass [`MAX_QUEUED`], or when the worker's connections together hold more than
//! [`MAX_QUEUED_TOTAL`] and its own queue is past [`SLOW_QUEUE`], untaken for a quarter of
//! `message_timeout_ms` — so requests sent by a peer that never reads the answers cannot grow
//! the server's memory without limit (the total is not a hard cap: queues under
//! [`SLOW_QUEUE`] are never closed by it). Each is counted and logged at a bounded rate.

use super::token::Token;
use crate::config::{OutboundConnections, StreamConfig};
use crate::stats::{inc, LogLimiter, Stats};
use bytes::Bytes;
use sip_core::timer::{Millis, TimerHandle, TimerWheel};
use sipsec_transport::net::conn::{Framed, ReadEnd, StreamConn};
use sipsec_transport::net::epoll::{self, Epoll, Event};
use sipsec_transport::net::transport::{ConnId, Peer, Transport};
use sipsec_transport::tls::{ClientTls, HandshakeKind, ServerTls, Session};
use socket2::{Domain, SockAddr, Socket, Type};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Connections accepted per listener per pass, so a flood of connects cannot starve the rest.
const ACCEPT_BATCH: usize = 256;
/// Requests remembered per connection while it comes up.
const MAX_UNCONFIRMED: usize = 64;
/// What one read of a connection takes at most (its kernel receive buffer's worth): the
/// rest waits for the next pass, after what this one read was answered. Read until the
/// socket was empty, a peer that sent as fast as the worker read kept one read going for
/// seconds — two million OPTIONS held in memory, none answered, every other connection of
/// the worker unread meanwhile.
const READ_LIMIT: usize = 256 << 10;
/// A connection the worker opened to forward a request to a next hop carries the answers to
/// requests it already took in; bounded like a caller's, the answers to the calls the worker
/// admitted wait behind the new calls it reads (a callee's responses are longer than the
/// requests they answer), and at four times capacity over TLS the callee's own send buffer
/// held 4 MB of them — half a second of admitted calls. Its receive buffer and its read are
/// four times a caller's: still bounded. A peer that has requests routed to it (any peer
/// where nothing authenticates them) gains from it no more than four accepted connections
/// would give it; a connection opened to return a response (RFC 3261 §18.2.2, the one it
/// came on gone) is not one — a peer can have that opened to it by closing its own.
const OPENED_SCALE: usize = 4;
/// What one connection may hold queued for its peer: past it the peer is reading far slower
/// than it is sent to, and the connection is closed. Large, because the worker's own
/// neighbours fall behind in bursts: a quarter of this held at four times capacity over TLS
/// would be seconds of calls, where a 1 MiB ceiling closed the load generator's callee within
/// tens of milliseconds of such a burst (Kamailio's `tcp_conn_wq_max` default, 32 KiB, is
/// for a server whose reads block).
pub(crate) const MAX_QUEUED: usize = 16 << 20;
/// What a worker's connections may hold queued together. Past it, a connection that is sent
/// more (or written to) while its own queue is past [`SLOW_QUEUE`] and its socket has taken
/// nothing for a quarter of `message_timeout_ms` is closed: many slow readers cannot take
/// memory that one may not, and a next hop still taking a burst is not closed for them.
pub(crate) const MAX_QUEUED_TOTAL: usize = 256 << 20;
/// A queue past this is a slow reader's, for [`MAX_QUEUED_TOTAL`]: a connection that keeps
/// up holds at most what a pass wrote to it while the socket's buffer was full.
pub(crate) const SLOW_QUEUE: usize = 256 << 10;

/// The kernel receive buffer asked for on every SIP connection (four times it on one opened to
/// a next hop, [`OPENED_SCALE`]) (the kernel keeps at most
/// `net.core.rmem_max` and reports double). Left to autotuning it grows to `tcp_rmem`'s
/// maximum (32 MiB on the lab's machine): seconds of requests that arrived but that the worker
/// has not read, where overload control can neither see their age nor refuse them, so past
/// the worker's read rate every call on the connection came late (the lab's TLS rows at 3–4×
/// its capacity: 0.3 of it). Bounded, the sender's queue fills instead and a sender that caps
/// it fails the excess at once (as `sipsec load` and Kamailio do). 256 KiB is a few hundred
/// INVITEs — tens of milliseconds of a worker's reading. The price: with autotuning off, one
/// connection carries at most about its window per round trip — 5–10 MB/s over a 50 ms path
/// (the kernel keeps up to twice the smaller of this and `net.core.rmem_max`), some 3,000–6,000
/// calls/s, against ~12 MB/s one TLS worker took on loopback; a trunk past that over a long
/// path needs several connections.
pub(crate) const RECEIVE_BUFFER: usize = 256 * 1024;

/// Binds a listening socket with SO_REUSEPORT, one per worker on the same address. Its
/// connections inherit [`RECEIVE_BUFFER`] (set before `listen`, so the window scale fits it).
pub(crate) fn listen_reuseport(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_recv_buffer_size(RECEIVE_BUFFER)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&SockAddr::from(addr))?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Descriptors kept for everything but SIP connections when `max_connections` is fitted to
/// the open-file limit: the database pools, the async runtime, DNS lookups, the control
/// socket and its clients, logs. Per worker and per listen address, and for the metrics
/// endpoint, more is kept on top ([`fit_to_descriptors`]).
const RESERVED_DESCRIPTORS: usize = 256;

/// `max_connections` (and `max_connections_per_ip` in proportion) lowered as far as the open-
/// file limit requires, so that connections run out before descriptors do: a server out of
/// descriptors accepts nothing — no call on any transport, no scrape — until some close.
/// Descriptors are kept for the listeners, the workers' own, the metrics endpoint and the rest
/// ([`RESERVED_DESCRIPTORS`]). Returns the configured and effective totals when lowered.
pub(crate) fn fit_to_descriptors(
    cfg: &mut crate::config::Config,
    fd_limit: Option<u64>,
) -> Option<(usize, usize)> {
    let limit = usize::try_from(fd_limit?).unwrap_or(usize::MAX);
    let workers = cfg.workers.max(1);
    // Per worker: its epoll set, mailbox and timers, and one socket per listen address.
    let per_worker = 4 + cfg.listen.len();
    let metrics = if cfg.metrics_listen.is_some() {
        crate::metrics::MAX_CONNECTIONS + 1
    } else {
        0
    };
    let reserved = RESERVED_DESCRIPTORS + workers * per_worker + metrics;
    let s = &mut cfg.streams;
    let (was, configured) = (
        s.max_connections_per_worker,
        s.max_connections_per_worker * workers,
    );
    let fits = limit.saturating_sub(reserved).max(workers);
    if configured <= fits {
        return None;
    }
    s.max_connections_per_worker = fits / workers;
    // One address keeps the share of the whole it was configured to have.
    let per_ip = s.max_per_ip_per_worker * s.max_connections_per_worker / was;
    s.max_per_ip_per_worker = per_ip.clamp(1, s.max_connections_per_worker);
    Some((configured, s.max_connections_per_worker * workers))
}

fn conn_id(worker: usize, slot: usize) -> ConnId {
    ((worker as u32) << 24) | (slot as u32 + 1)
}

/// The worker and slot of a connection id.
fn split_id(id: ConnId) -> (usize, usize) {
    ((id >> 24) as usize, ((id & 0xff_ffff) - 1) as usize)
}

struct Conn {
    io: StreamConn,
    transport: Transport,
    /// The call this connection was opened for (per-call outbound), by Call-ID hash.
    call: Option<u64>,
    /// TLS: the handshake finished (and was counted).
    established: bool,
    /// An outbound connect has not completed yet.
    connecting: bool,
    /// Accepted from a listener (counted in `per_ip`).
    accepted: bool,
    /// Opened to forward a request to a next hop: read [`OPENED_SCALE`] times as far a pass.
    next_hop: bool,
    last_active: Millis,
    /// Since when a handshake or a partial message has been waiting to complete.
    pending_since: Option<Millis>,
    timer: Option<TimerHandle>,
    timer_at: Millis,
    /// Close once the queued output is written: the call it was opened for ended.
    closing: bool,
    /// Close, for this reason, once the answers to what it sent are written: the peer
    /// closed, or sent bytes that are not SIP.
    drain: Option<Close>,
    /// Queued output waits for this pass's flush.
    dirty: bool,
    /// WebSocket keep-alive: when a Ping went to this quiet connection, unanswered so far.
    pinged: Option<Millis>,
    /// How much sooner than `ping_interval_s` this connection's next Ping is due: up to a
    /// tenth of the interval, drawn afresh at each Ping ([`ping_early`]), so connections
    /// opened together (browsers reconnecting after a restart) drift out of step instead of
    /// being Pinged in one burst every interval for as long as they stay.
    ping_early: Millis,
    /// Requests queued on an outbound connection before it was up (connected, and for TLS
    /// through its handshake): if it fails instead, each is handed back to the engine as a
    /// transport error, which fails its branch at once (RFC 3261 §8.1.3.1).
    unconfirmed: Vec<Bytes>,
    /// Since when output has waited for the socket without it taking any (None: nothing
    /// waits, or the last write took some): `message_timeout_ms` past it, the peer is closed.
    blocked_since: Option<Millis>,
    /// Its queued bytes as last added to [`Connections::queued`].
    counted: usize,
    /// The pass it was last read in ([`Connections::pass`]): once a pass.
    read_pass: u64,
    /// Its last read stopped at its limit ([`READ_LIMIT`], [`OPENED_SCALE`] times it for a
    /// next hop): it is in [`Connections::unread`].
    unread: bool,
    /// When it was last read (or opened), for the queue delay ([`Connections::take_delay`]).
    read_at: Millis,
    /// Which connection this is, of all the worker opened: a slot is reused, and a read,
    /// closed and reused within one pass must not be taken for the new one's.
    serial: u64,
    /// What the socket had taken ([`StreamConn::written`]) when `blocked_since` was last set.
    written_at_block: u64,
}

impl Conn {
    /// When the connection's time runs out: its pending handshake or message, else its
    /// keep-alive's next step (a WebSocket), else idleness.
    fn deadline(&self, cfg: &StreamConfig) -> Millis {
        let own = self.own_deadline(cfg);
        match self.blocked_since {
            Some(t) => own.min(t + cfg.message_timeout_ms),
            None => own,
        }
    }

    /// The deadline without what waits to be written.
    fn own_deadline(&self, cfg: &StreamConfig) -> Millis {
        match self.pending_since {
            Some(t) => t + cfg.message_timeout_ms,
            None if self.kept_alive(cfg) => match self.pinged {
                // Unanswered: closed if still silent a whole interval after the Ping.
                Some(at) => at + cfg.websocket.ping_interval_ms,
                None => self.last_active + cfg.websocket.ping_interval_ms - self.ping_early,
            },
            None => self.last_active + cfg.idle_timeout_ms,
        }
    }

    /// A WebSocket, which is pinged while quiet instead of closed for idleness.
    fn kept_alive(&self, cfg: &StreamConfig) -> bool {
        self.transport.websocket() && cfg.websocket.ping_interval_ms > 0
    }
}

/// Why a connection was closed.
#[derive(Debug, Clone, Copy)]
enum Close {
    Peer,
    Error,
    Idle,
    MessageTimeout,
    /// The peer does not read what is sent to it (see the module's doc).
    Stalled(&'static str),
    Framing(&'static str),
    Tls,
    CallOver,
    /// A WebSocket upgrade refused (answered 4xx), for this reason.
    Upgrade(&'static str),
}

/// A message framed on a connection this pass, for the worker to hand to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received<'a> {
    /// A whole message.
    Message(Peer, &'a [u8]),
    /// The start of a message over `max_message_size`: the engine may answer it (513), and
    /// the connection then closes (the rest cannot be skipped reliably).
    Oversize(Peer, &'a [u8]),
}

/// One message framed this pass: where it is in its connection's input buffer.
struct Frame {
    slot: usize,
    /// The connection's serial ([`Conn::serial`]): a slot closed and taken by a new
    /// connection within the pass is not the one read.
    serial: u64,
    start: usize,
    len: usize,
    oversize: bool,
}

/// One connection read this pass, and what is left to do once its messages are handled.
struct Read {
    slot: usize,
    serial: u64,
    consumed: usize,
    ping: bool,
    invalid: Option<&'static str>,
    /// The peer closed its WebSocket with a Close frame.
    closed: bool,
    /// What was invalid was a WebSocket upgrade (refused), not a message.
    refused: bool,
    end: ReadEnd,
}

/// A worker's TCP, TLS and WebSocket connections and listeners.
pub struct Connections {
    worker: usize,
    cfg: StreamConfig,
    max_message: usize,
    listeners: Vec<(Transport, TcpListener)>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    open: usize,
    by_remote: HashMap<(Transport, SocketAddr), usize>,
    by_call: HashMap<(Transport, SocketAddr, u64), usize>,
    /// Accepted connections open per remote IP.
    per_ip: HashMap<IpAddr, u32>,
    timers: TimerWheel<usize>,
    expired: Vec<usize>,
    dirty: Vec<usize>,
    tls_server: Option<ServerTls>,
    tls_client: Option<ClientTls>,
    scratch: Vec<u8>,
    framed: Framed,
    stats: Arc<Stats>,
    log: LogLimiter,
    /// Requests that could not be delivered (see `Conn::unconfirmed`), for the worker to hand
    /// to the engine.
    failed: Vec<(Peer, Bytes)>,
    /// Bytes queued on all the connections, as last counted (`Conn::counted`).
    queued: usize,
    /// The pass the worker is in (one per [`Connections::release`]).
    pass: u64,
    /// Connections whose last read stopped at its limit, to read again next pass.
    unread: Vec<usize>,
    /// What one read of an accepted connection takes at most ([`READ_LIMIT`]; a test
    /// lowers it to what any kernel's receive buffer holds).
    read_limit: usize,
    /// The serial the next connection gets.
    next_serial: u64,
    /// What this pass read, until [`Connections::release`].
    frames: Vec<Frame>,
    reads: Vec<Read>,
    /// The domain a TLS destination was located from, which its certificate must name
    /// (RFC 5922 §4); addresses not here are checked against their IP address.
    tls_names: HashMap<SocketAddr, Arc<str>>,
    /// Whether a read's queue delay is measured (near capacity, when the UDP sockets have
    /// kernel timestamps on), the earliest anything this pass's wait reported can have arrived
    /// ([`Connections::woke`]), and the longest delay a read found since taken.
    measuring: bool,
    since: Millis,
    delay: Option<Millis>,
}

/// Domains remembered for TLS destinations, per worker.
const MAX_TLS_NAMES: usize = 4096;

impl Connections {
    /// A worker's connection table. `listeners` are registered with `epoll` here.
    #[allow(
        clippy::too_many_arguments,
        reason = "built once per worker from the start-up state it shares; each argument is a distinct resource"
    )]
    pub fn new(
        worker: usize,
        cfg: StreamConfig,
        max_message: usize,
        listeners: Vec<(Transport, TcpListener)>,
        tls_server: Option<ServerTls>,
        tls_client: Option<ClientTls>,
        stats: Arc<Stats>,
        epoll: &Epoll,
    ) -> io::Result<Connections> {
        for (i, (_, l)) in listeners.iter().enumerate() {
            epoll.add(l.as_raw_fd(), epoll::READ, Token::Listener(i).encode())?;
        }
        Ok(Connections {
            worker,
            cfg,
            max_message,
            listeners,
            conns: Vec::new(),
            free: Vec::new(),
            open: 0,
            by_remote: HashMap::new(),
            by_call: HashMap::new(),
            per_ip: HashMap::new(),
            timers: TimerWheel::new(0),
            expired: Vec::new(),
            dirty: Vec::new(),
            tls_server,
            tls_client,
            scratch: vec![0; 64 * 1024],
            read_limit: READ_LIMIT,
            tls_names: HashMap::new(),
            measuring: false,
            since: 0,
            delay: None,
            framed: Framed::default(),
            failed: Vec::new(),
            queued: 0,
            pass: 1,
            unread: Vec::new(),
            next_serial: 1,
            frames: Vec::new(),
            reads: Vec::new(),
            stats,
            log: LogLimiter::new(10),
        })
    }

    /// Switches the measure of queue delay on or off (see [`Connections::take_delay`]).
    pub(crate) fn set_measuring(&mut self, on: bool) {
        self.measuring = on;
        self.delay = None;
    }

    /// Says the earliest the data this pass's wait reported can have arrived: as the wait woke
    /// if it slept (the first readiness edge ends it), otherwise when the wait before returned
    /// (a readiness edge raised before that would have been in its report) — the worker's
    /// `Arrivals`.
    pub(crate) fn woke(&mut self, since: Millis) {
        self.since = since;
    }

    /// The longest the head of a read's data had waited in the kernel, since the last call,
    /// while measuring ([`Connections::set_measuring`]): the stream side of the worker's queue
    /// delay. Kernel receive timestamps cannot say it (they stamp a read with its newest
    /// segment, and TCP merges the segments it queues, each merge taking the newest stamp:
    /// measured over TLS at four times capacity, reads' stamps said 0 ms while the callers'
    /// connections stood full). It is bounded instead: what a read takes arrived after the
    /// connection's last read and no earlier than [`Connections::woke`] says — or, for a
    /// connection whose last read stopped at its limit, was waiting at that read (there the
    /// bound is short of the head's wait, by what the buffer held beyond the limit). The
    /// bound is the head's wait when data arrives throughout, as it does on a connection
    /// whose sender is held back by its window, the stream's standing queue; after a wait
    /// that slept it is the time from the wake to the read. The longest of a pass: every
    /// connection is a queue, and one read every pass because little comes on it says nothing
    /// of the callers' connections' queue. Milliseconds: ±1 ms, against a standing queue of
    /// `SATURATED_MS` (5 ms) and more. An accepted connection's first read counts from the
    /// accept, though what it sent may have waited in the backlog before.
    pub(crate) fn take_delay(&mut self) -> Option<Millis> {
        self.delay.take()
    }

    /// The next time [`Connections::on_tick`] has work.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.timers.next_deadline()
    }

    /// Handles one epoll event for `token`, a listener or connection of ours: accepts, or
    /// reads and frames (the messages wait in [`Connections::received`]), or writes what
    /// was waiting for the socket.
    pub(crate) fn on_event(&mut self, now: Millis, token: Token, ev: &Event, epoll: &Epoll) {
        let index = match token {
            Token::Listener(i) => {
                self.accept(now, i, epoll);
                return;
            }
            Token::Connection(i) => i,
            Token::Udp(_) | Token::Mailbox => return,
        };
        let flags = ev.events;
        let hangup = (libc::EPOLLHUP | libc::EPOLLERR) as u32;
        if flags & (libc::EPOLLIN as u32 | libc::EPOLLRDHUP as u32 | hangup) != 0 {
            self.read(now, index);
        }
        if flags & libc::EPOLLOUT as u32 != 0 {
            let Some(c) = self.conns.get_mut(index).and_then(Option::as_mut) else {
                return;
            };
            if c.connecting {
                c.connecting = false;
                if c.established {
                    // A TCP connect completed; TLS still has its handshake to finish.
                    c.pending_since = None;
                    c.unconfirmed = Vec::new();
                }
            }
            self.flush_one(now, index);
        }
    }

    fn accept(&mut self, now: Millis, index: usize, epoll: &Epoll) {
        for _ in 0..ACCEPT_BATCH {
            let Some((transport, listener)) = self.listeners.get(index) else {
                return;
            };
            let transport = *transport;
            let (stream, remote) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // EMFILE and friends: the listener stays readable, so try next pass.
                    inc(&self.stats.connection_errors);
                    if self.log.allow(now) {
                        tracing::warn!("accepting a {transport} connection failed: {e}");
                    }
                    return;
                }
            };
            let from_ip = self.per_ip.get(&remote.ip()).copied().unwrap_or(0);
            let full = if self.open >= self.cfg.max_connections_per_worker {
                Some("max_connections")
            } else if from_ip as usize >= self.cfg.max_per_ip_per_worker {
                Some("max_connections_per_ip")
            } else {
                None
            };
            if let Some(limit) = full {
                inc(&self.stats.connections_refused);
                if self.log.allow(now) {
                    tracing::warn!("refused a {transport} connection from {remote}: {limit} open");
                }
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let _ = stream.set_nodelay(true);
            let tls = match (transport, &self.tls_server) {
                (Transport::Tls | Transport::Wss, Some(cfg)) => match cfg.accept() {
                    Ok(session) => Some(session),
                    Err(e) => {
                        inc(&self.stats.tls_failures);
                        if self.log.allow(now) {
                            tracing::warn!("TLS for a connection from {remote} failed: {e}");
                        }
                        continue;
                    }
                },
                _ => None,
            };
            // A handshake (TLS's, or the WebSocket upgrade) must finish in time.
            let pending = (tls.is_some() || transport.websocket()).then_some(now);
            match self.insert(now, transport, stream, remote, tls, None, pending, epoll) {
                Ok(slot) => {
                    inc(&self.stats.connections_accepted);
                    self.by_remote.insert((transport, remote), slot);
                    *self.per_ip.entry(remote.ip()).or_default() += 1;
                    if let Some(c) = self.conns[slot].as_mut() {
                        c.accepted = true;
                        if transport.websocket() {
                            c.io.serve_websocket(self.cfg.websocket.policy.clone());
                        }
                    }
                }
                Err(e) => {
                    inc(&self.stats.connection_errors);
                    if self.log.allow(now) {
                        tracing::warn!("cannot watch a connection from {remote}: {e}");
                    }
                }
            }
        }
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "an accepted or dialled stream's parts, moved in once"
    )]
    fn insert(
        &mut self,
        now: Millis,
        transport: Transport,
        stream: TcpStream,
        remote: SocketAddr,
        tls: Option<Session>,
        call: Option<u64>,
        pending_since: Option<Millis>,
        epoll: &Epoll,
    ) -> io::Result<usize> {
        let slot = match self.free.pop() {
            Some(i) => i,
            None => {
                if self.conns.len() >= 0xff_fffe {
                    return Err(io::Error::other("connection table full"));
                }
                self.conns.push(None);
                self.conns.len() - 1
            }
        };
        let token = Token::Connection(slot).encode();
        if let Err(e) = epoll.add(stream.as_raw_fd(), epoll::STREAM, token) {
            self.free.push(slot);
            return Err(e);
        }
        let mut c = Conn {
            io: StreamConn::new(stream, remote, tls),
            transport,
            call,
            established: !transport.secure(),
            connecting: false,
            accepted: false,
            next_hop: false,
            last_active: now,
            pending_since,
            timer: None,
            timer_at: 0,
            closing: false,
            drain: None,
            dirty: false,
            pinged: None,
            ping_early: ping_early(
                (u64::from(remote.port()) << 32) | slot as u64,
                self.cfg.websocket.ping_interval_ms,
            ),
            unconfirmed: Vec::new(),
            blocked_since: None,
            counted: 0,
            read_pass: 0,
            read_at: now,
            unread: false,
            serial: self.next_serial,
            written_at_block: 0,
        };
        self.next_serial += 1;
        let at = c.deadline(&self.cfg);
        c.timer = Some(self.timers.insert(at, slot));
        c.timer_at = at;
        self.conns[slot] = Some(c);
        self.open += 1;
        Ok(slot)
    }

    /// Moves a connection's timer earlier if its deadline now is (later deadlines are found
    /// when the timer fires).
    fn rearm_if_earlier(&mut self, slot: usize) {
        let Some(c) = self.conns[slot].as_mut() else {
            return;
        };
        let at = c.deadline(&self.cfg);
        if at >= c.timer_at {
            return;
        }
        if let Some(h) = c.timer.take() {
            self.timers.cancel(h);
        }
        c.timer = Some(self.timers.insert(at, slot));
        c.timer_at = at;
    }

    /// Reads what the connection has, and frames it; the messages stay in its buffer until
    /// [`Connections::release`].
    fn read(&mut self, now: Millis, slot: usize) {
        let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if c.drain.is_some() {
            // Ended: nothing more is read, only the answers written.
            return;
        }
        if c.read_pass == self.pass {
            // Read already this pass (as unread, then woken): what woke it was read then.
            return;
        }
        c.read_pass = self.pass;
        if self.measuring {
            let from = if c.unread {
                c.read_at
            } else {
                c.read_at.max(self.since)
            };
            let d = now.saturating_sub(from);
            self.delay = Some(self.delay.map_or(d, |l| l.max(d)));
        }
        c.read_at = now;
        c.unread = false;
        c.last_active = now;
        c.pinged = None;
        let limit = if c.next_hop {
            OPENED_SCALE * self.read_limit
        } else {
            self.read_limit
        };
        let end = c.io.read_up_to(&mut self.scratch, limit);
        if matches!(end, ReadEnd::Limit) {
            c.unread = true;
            self.unread.push(slot);
        }
        if !c.established {
            if let Some(kind) = c.io.handshake_kind() {
                c.established = true;
                c.unconfirmed = Vec::new();
                let s = &self.stats;
                let (total, side) = match (kind == HandshakeKind::Resumed, c.accepted) {
                    (true, true) => (
                        &s.tls_handshakes_resumed,
                        &s.tls_handshakes_resumed_accepted,
                    ),
                    (true, false) => (&s.tls_handshakes_resumed, &s.tls_handshakes_resumed_opened),
                    (false, true) => (&s.tls_handshakes_full, &s.tls_handshakes_full_accepted),
                    (false, false) => (&s.tls_handshakes_full, &s.tls_handshakes_full_opened),
                };
                inc(total);
                inc(side);
                if c.io.client_certified() {
                    inc(&self.stats.tls_client_certificates);
                }
            }
        }
        let framed = &mut self.framed;
        let was_up = c.io.upgraded();
        c.io.frame(self.max_message, framed);
        if !was_up && c.io.upgraded() {
            inc(&self.stats.websocket_upgrades);
        }
        for &(start, len) in &framed.messages {
            self.frames.push(Frame {
                slot,
                serial: c.serial,
                start,
                len,
                oversize: false,
            });
        }
        if framed.too_large {
            // The oversize message starts where the framed ones end.
            self.frames.push(Frame {
                slot,
                serial: c.serial,
                start: framed.consumed,
                len: c.io.inbuf.len() - framed.consumed,
                oversize: true,
            });
        }
        self.reads.push(Read {
            slot,
            serial: c.serial,
            consumed: framed.consumed,
            ping: framed.ping,
            invalid: framed.invalid,
            closed: framed.closed,
            refused: !was_up && framed.invalid.is_some(),
            end,
        });
    }

    /// Whether a connection's last read stopped at its limit, so the next pass must read it
    /// without waiting for readiness ([`Connections::read_unread`]).
    pub(crate) fn has_unread(&self) -> bool {
        !self.unread.is_empty()
    }

    /// Reads the connections whose last read stopped at its limit. Call once a pass, before
    /// its events' reads ([`Connections::on_event`]).
    pub(crate) fn read_unread(&mut self, now: Millis) {
        let slots = std::mem::take(&mut self.unread);
        for &slot in &slots {
            if self
                .conns
                .get(slot)
                .and_then(Option::as_ref)
                .is_some_and(|c| c.unread)
            {
                self.read(now, slot);
            }
        }
        if self.unread.is_empty() {
            let mut slots = slots;
            slots.clear();
            self.unread = slots;
        }
    }

    /// Whether this pass read any connection, so [`Connections::release`] has work.
    pub(crate) fn read_any(&self) -> bool {
        !self.reads.is_empty()
    }

    /// How many messages this pass framed (see [`Connections::received`]).
    pub(crate) fn received_len(&self) -> usize {
        self.frames.len()
    }

    /// Message `i` of those framed this pass, with the connection it came on.
    pub fn received(&self, i: usize) -> Option<Received<'_>> {
        let f = self.frames.get(i)?;
        let c = self.conns.get(f.slot)?.as_ref()?;
        if c.serial != f.serial {
            return None;
        }
        let peer = Peer {
            transport: c.transport,
            addr: c.io.remote,
            conn: conn_id(self.worker, f.slot),
            flow: false,
        };
        let data = c.io.message(f.start, f.len)?;
        Some(if f.oversize {
            Received::Oversize(peer, data)
        } else {
            Received::Message(peer, data)
        })
    }

    /// Consumes what this pass read, once the worker has handed it to the engine: answers
    /// keep-alive pings, re-arms timeouts, and ends the connections that ended.
    pub fn release(&mut self, now: Millis) {
        self.pass += 1;
        self.frames.clear();
        let mut reads = std::mem::take(&mut self.reads);
        for r in reads.drain(..) {
            let Some(c) = self.conns.get_mut(r.slot).and_then(Option::as_mut) else {
                continue;
            };
            if c.serial != r.serial {
                // Closed since it was read, its slot taken by a new connection.
                continue;
            }
            if r.ping {
                c.io.queue(b"\r\n");
            }
            c.io.consume(r.consumed);
            c.pending_since = if !c.established || !c.io.upgraded() {
                c.pending_since.or(Some(now))
            } else if !c.io.partial() {
                None
            } else if r.consumed > 0 {
                Some(now)
            } else {
                c.pending_since.or(Some(now))
            };
            let abrupt = c.transport.websocket() && c.io.upgraded() && !c.io.closed_cleanly();
            if c.io.has_output() {
                self.mark_dirty(r.slot);
            }
            match (r.end, r.invalid) {
                (_, Some(why)) if r.refused => self.drain(now, r.slot, Close::Upgrade(why)),
                (_, Some(why)) => self.drain(now, r.slot, Close::Framing(why)),
                (ReadEnd::Drained | ReadEnd::Limit, None) if r.closed => {
                    self.drain(now, r.slot, Close::Peer);
                }
                (ReadEnd::Drained | ReadEnd::Limit, None) => self.rearm_if_earlier(r.slot),
                (ReadEnd::Closed, None) => {
                    if abrupt {
                        inc(&self.stats.websocket_closed_abruptly);
                    }
                    self.drain(now, r.slot, Close::Peer);
                }
                (ReadEnd::TlsError(why), None) => {
                    if self.log.allow(now) {
                        let remote = self.conns[r.slot].as_ref().map(|c| c.io.remote);
                        tracing::warn!("TLS with {} failed: {why}", fmt_remote(remote));
                    }
                    self.close(now, r.slot, Close::Tls);
                }
            }
        }
        self.reads = reads;
    }

    /// Ends a connection once the answers to what it sent are written (by this pass's
    /// flush, or within `message_timeout_ms` if the peer does not take them).
    fn drain(&mut self, now: Millis, slot: usize, why: Close) {
        if let Some(c) = self.conns[slot].as_mut() {
            c.drain = Some(why);
            c.pending_since = Some(now);
        }
        self.rearm_if_earlier(slot);
        // Marked dirty even with nothing queued, so the flush closes it.
        self.mark_dirty(slot);
    }

    fn mark_dirty(&mut self, slot: usize) {
        if let Some(c) = self.conns[slot].as_mut() {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(slot);
            }
        }
    }

    /// Moves the requests that could not be delivered since the last call into `out`.
    pub(crate) fn take_failed(&mut self, out: &mut Vec<(Peer, Bytes)>) {
        out.append(&mut self.failed);
    }

    /// Queues `data` for `to`. Returns the worker to mail it to when another worker owns the
    /// connection named.
    pub fn send(&mut self, now: Millis, to: Peer, data: &[u8], epoll: &Epoll) -> Option<usize> {
        let request = !data.starts_with(b"SIP/2.0 ");
        let slot = match self.find(now, to, data, request, epoll) {
            Ok(slot) => slot,
            Err(Some(owner)) => return Some(owner),
            Err(None) => {
                inc(&self.stats.stream_transmit_failures);
                if request {
                    self.failed.push((to, Bytes::copy_from_slice(data)));
                }
                return None;
            }
        };
        let mut remembered = false;
        if let Some(c) = self.conns[slot].as_mut() {
            c.io.queue(data);
            c.last_active = now;
            let up = !c.connecting && c.established;
            if request && !c.accepted && !up && c.unconfirmed.len() < MAX_UNCONFIRMED {
                c.unconfirmed.push(Bytes::copy_from_slice(data));
                remembered = true;
            }
        }
        if let Some(why) = self.count_queued(now, slot) {
            // What was just queued dies with the connection: a request's branch fails now
            // (handed back by the close if it was remembered as unconfirmed).
            if request && !remembered {
                self.failed.push((to, Bytes::copy_from_slice(data)));
            }
            self.close(now, slot, Close::Stalled(why));
            return None;
        }
        self.mark_dirty(slot);
        None
    }

    /// Brings [`Connections::queued`] up to date with what the connection at `slot` holds,
    /// and says why it must be closed if its queue is past a ceiling.
    fn count_queued(&mut self, now: Millis, slot: usize) -> Option<&'static str> {
        let c = self.conns.get_mut(slot).and_then(Option::as_mut)?;
        let held = c.io.queued_bytes();
        self.queued = self.queued - c.counted + held;
        c.counted = held;
        // Only a queue the socket has taken nothing of for a while counts against the total:
        // a next hop still taking its burst is not closed for what slow readers hold.
        let stuck = c
            .blocked_since
            .is_some_and(|t| now.saturating_sub(t) >= self.cfg.message_timeout_ms / 4);
        if held > MAX_QUEUED {
            Some("it reads far slower than it is sent to (its queue passed MAX_QUEUED)")
        } else if self.queued > MAX_QUEUED_TOTAL && held > SLOW_QUEUE && stuck {
            Some("it reads slower than it is sent to, and the worker's queues are full")
        } else {
            None
        }
    }

    /// The connection a message goes on: the one named if it is still open, else one to the
    /// address (per call for requests when so configured), opened if needed; `request`: `data`
    /// is a request (else a response). `Err(Some(w))`: worker `w` owns the connection named.
    fn find(
        &mut self,
        now: Millis,
        to: Peer,
        data: &[u8],
        request: bool,
        epoll: &Epoll,
    ) -> Result<usize, Option<usize>> {
        if to.conn != 0 {
            let (owner, slot) = split_id(to.conn);
            if owner != self.worker {
                return Err(Some(owner));
            }
            let same = self
                .conns
                .get(slot)
                .and_then(Option::as_ref)
                .is_some_and(|c| {
                    c.io.remote == to.addr
                        && c.transport == to.transport
                        && !c.closing
                        && !(to.flow && c.drain.is_some())
                });
            if same {
                return Ok(slot);
            }
        }
        if to.flow {
            // The phone's connection is gone, and it accepts no other: the request fails
            // now (the engine answers 430 or 480) rather than after a connect that cannot
            // succeed.
            return Err(None);
        }
        let call = match self.cfg.outbound {
            OutboundConnections::PerCall if request => call_hash(data),
            _ => None,
        };
        let existing = match call {
            Some(h) => self.by_call.get(&(to.transport, to.addr, h)),
            None => self.by_remote.get(&(to.transport, to.addr)),
        };
        if let Some(&slot) = existing {
            if self.conns[slot].as_ref().is_some_and(|c| c.drain.is_none()) {
                return Ok(slot);
            }
        }
        match self.connect(now, to, call, request, epoll) {
            Ok(slot) => {
                match call {
                    Some(h) => self.by_call.insert((to.transport, to.addr, h), slot),
                    None => self.by_remote.insert((to.transport, to.addr), slot),
                };
                Ok(slot)
            }
            Err(e) => {
                inc(&self.stats.connection_errors);
                if self.log.allow(now) {
                    tracing::warn!("cannot connect to {}:{}: {e}", to.transport, to.addr);
                }
                Err(None)
            }
        }
    }

    /// Opens a connection to `to`; `request`: to forward a request (a next hop), not to
    /// return a response.
    fn connect(
        &mut self,
        now: Millis,
        to: Peer,
        call: Option<u64>,
        request: bool,
        epoll: &Epoll,
    ) -> io::Result<usize> {
        if self.open >= self.cfg.max_connections_per_worker {
            return Err(io::Error::other("max_connections are open"));
        }
        let tls = match to.transport {
            Transport::Tls => {
                let cfg = self.tls_client.as_ref().ok_or_else(|| {
                    io::Error::other("no TLS client configuration ([tls] ca or verify_server)")
                })?;
                let domain = self.tls_names.get(&to.addr).map(|d| &**d);
                let name = sipsec_transport::tls::server_name(domain, to.addr.ip())
                    .map_err(|e| io::Error::other(e.to_string()))?;
                Some(cfg.connect(name).map_err(io::Error::other)?)
            }
            Transport::Tcp => None,
            Transport::Udp => return Err(io::Error::other("UDP is not a stream")),
            // RFC 7118 §5: the browser opens the connection; there is no reaching it otherwise.
            Transport::Ws | Transport::Wss => {
                return Err(io::Error::other(
                    "a WebSocket peer is reached only over the connection it opened",
                ))
            }
        };
        let socket = Socket::new(Domain::for_address(to.addr), Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        socket.set_nodelay(true)?;
        let scale = if request { OPENED_SCALE } else { 1 };
        socket.set_recv_buffer_size(scale * RECEIVE_BUFFER)?;
        match socket.connect(&SockAddr::from(to.addr)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        // The connect (and handshake) must finish within the message timeout.
        let slot = self.insert(
            now,
            to.transport,
            socket.into(),
            to.addr,
            tls,
            call,
            Some(now),
            epoll,
        )?;
        if let Some(c) = self.conns[slot].as_mut() {
            c.connecting = true;
            c.next_hop = request;
        }
        inc(&self.stats.connections_opened);
        Ok(slot)
    }

    /// TLS for connections accepted and opened from now on (a reload: a rotated certificate,
    /// a new CA); those already up keep theirs.
    pub(crate) fn set_tls(&mut self, server: Option<ServerTls>, client: Option<ClientTls>) {
        self.tls_server = server;
        self.tls_client = client;
    }

    /// Connections open in this worker.
    pub fn open(&self) -> usize {
        self.open
    }

    /// Remembers the domain TLS destination `addr` was located from (RFC 5922): connections
    /// opened to it from now on check the server's certificate against that name.
    pub(crate) fn name_tls_destination(&mut self, addr: SocketAddr, domain: Arc<str>) {
        if self.tls_names.len() >= MAX_TLS_NAMES && !self.tls_names.contains_key(&addr) {
            self.tls_names.clear();
        }
        self.tls_names.insert(addr, domain);
    }

    /// Marks the per-call connections whose call ended for closing once their output is out.
    pub(crate) fn finish_calls(&mut self, ids: &mut Vec<ConnId>) {
        for id in ids.drain(..) {
            let (owner, slot) = split_id(id);
            if owner != self.worker {
                continue;
            }
            let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let Some(h) = c.call else {
                continue;
            };
            c.closing = true;
            let key = (c.transport, c.io.remote, h);
            if let Some(tls) = &mut c.io.tls {
                tls.close_notify();
            }
            if self.by_call.get(&key) == Some(&slot) {
                self.by_call.remove(&key);
            }
            // Marked dirty even with nothing queued, so the flush closes it.
            self.mark_dirty(slot);
        }
    }

    /// Whether [`Connections::flush`] has anything to write or close.
    pub(crate) fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Writes every connection that has queued output this pass (one write per connection,
    /// however many messages it got), and closes those that are done.
    pub fn flush(&mut self, now: Millis) {
        let dirty = std::mem::take(&mut self.dirty);
        for &slot in &dirty {
            if let Some(c) = self.conns[slot].as_mut() {
                c.dirty = false;
            }
            self.flush_one(now, slot);
        }
        let mut dirty = dirty;
        dirty.clear();
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
    }

    fn flush_one(&mut self, now: Millis, slot: usize) {
        let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if !c.io.flush() {
            self.close(now, slot, Close::Error);
            return;
        }
        let waits = c.io.has_output();
        if !waits {
            c.blocked_since = None;
        } else if !c.connecting
            && c.established
            && (c.blocked_since.is_none() || c.io.written() > c.written_at_block)
        {
            // The rest goes when the socket is writable again, and the peer has
            // `message_timeout_ms` from now to take more. (A connection still coming up is
            // timed by its connect or handshake instead.)
            c.blocked_since = Some(now);
            c.written_at_block = c.io.written();
        }
        if let Some(why) = self.count_queued(now, slot) {
            self.close(now, slot, Close::Stalled(why));
            return;
        }
        let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if waits {
            self.rearm_if_earlier(slot);
        } else if let Some(why) = c.drain {
            self.close(now, slot, why);
        } else if c.closing {
            self.close(now, slot, Close::CallOver);
        }
    }

    /// Runs the connection timers due at `now`.
    pub fn on_tick(&mut self, now: Millis) {
        let mut expired = std::mem::take(&mut self.expired);
        self.timers.advance(now, &mut expired);
        for &slot in &expired {
            let Some(c) = self.conns[slot].as_mut() else {
                continue;
            };
            c.timer = None;
            if c.blocked_since
                .is_some_and(|t| t + self.cfg.message_timeout_ms <= now)
            {
                // Progress shows only at a write, and a peer reading slowly raises no
                // writable edge until a third of the send buffer is free: try once more.
                let alive = c.io.flush();
                if alive && c.io.written() > c.written_at_block {
                    c.blocked_since = Some(now);
                    c.written_at_block = c.io.written();
                } else if alive && !c.io.has_output() {
                    c.blocked_since = None;
                } else {
                    self.close(
                        now,
                        slot,
                        Close::Stalled("it took nothing sent to it in time"),
                    );
                    continue;
                }
            }
            let mut at = c.deadline(&self.cfg);
            // A quiet WebSocket is asked to answer, and closed if it does not by the next
            // interval (its deadline, from the ping).
            let ping = at <= now
                && c.pending_since.is_none()
                && c.kept_alive(&self.cfg)
                && c.pinged.is_none();
            if ping {
                c.io.ping();
                c.pinged = Some(now);
                c.ping_early = ping_early(
                    now ^ ((slot as u64) << 32) ^ c.ping_early,
                    self.cfg.websocket.ping_interval_ms,
                );
                at = c.deadline(&self.cfg);
            }
            if at > now {
                c.timer = Some(self.timers.insert(at, slot));
                c.timer_at = at;
            } else if c.pending_since.is_some() {
                self.close(now, slot, Close::MessageTimeout);
            } else {
                self.close(now, slot, Close::Idle);
            }
            if ping {
                inc(&self.stats.websocket_pings);
                self.mark_dirty(slot);
            }
        }
        expired.clear();
        self.expired = expired;
    }

    fn close(&mut self, now: Millis, slot: usize, why: Close) {
        let Some(mut c) = self.conns.get_mut(slot).and_then(Option::take) else {
            return;
        };
        if let Some(h) = c.timer.take() {
            self.timers.cancel(h);
        }
        let key = (c.transport, c.io.remote);
        if self.by_remote.get(&key) == Some(&slot) {
            self.by_remote.remove(&key);
        }
        if let Some(h) = c.call {
            let key = (c.transport, c.io.remote, h);
            if self.by_call.get(&key) == Some(&slot) {
                self.by_call.remove(&key);
            }
        }
        if c.accepted {
            let ip = c.io.remote.ip();
            if let Some(n) = self.per_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    self.per_ip.remove(&ip);
                }
            }
        }
        self.free.push(slot);
        self.open -= 1;
        self.queued -= c.counted;
        // Closed before it was up, whatever closed it (refused, reset, a failed or abandoned
        // handshake): what was queued on it never left.
        let to = Peer::new(c.transport, c.io.remote);
        self.failed
            .extend(c.unconfirmed.drain(..).map(|data| (to, data)));
        let counter = match why {
            Close::Peer | Close::CallOver => None,
            Close::Error => Some(&self.stats.connection_errors),
            Close::Idle => Some(&self.stats.idle_closed),
            Close::MessageTimeout => Some(&self.stats.message_timeouts),
            Close::Stalled(_) => Some(&self.stats.send_stalls),
            Close::Framing(_) => Some(&self.stats.framing_errors),
            Close::Tls => Some(&self.stats.tls_failures),
            Close::Upgrade(_) => Some(&self.stats.websocket_refused),
        };
        if let Some(counter) = counter {
            inc(counter);
        }
        let problem = match why {
            Close::Framing(f) | Close::Upgrade(f) | Close::Stalled(f) => Some(f),
            Close::MessageTimeout if !c.established => Some("handshake not finished in time"),
            Close::MessageTimeout => Some("message not finished in time"),
            Close::Idle => {
                c.io.close_notify();
                None
            }
            _ => None,
        };
        if let Some(what) = problem.filter(|_| self.log.allow(now)) {
            tracing::warn!(
                "closed a {} connection from {}: {what}",
                c.transport,
                c.io.remote
            );
        }
        // Dropping the stream closes the descriptor, which takes it out of the epoll set.
    }
}

/// A share of up to a tenth of `interval`, spread evenly over `seed` (a SplitMix64 step: no
/// clock or randomness needed, only seeds that differ between connections and Pings).
fn ping_early(seed: u64, interval: Millis) -> Millis {
    crate::hash::mix64(seed.wrapping_add(0x9e37_79b9_7f4a_7c15)) % (interval / 10 + 1)
}

fn fmt_remote(remote: Option<SocketAddr>) -> String {
    remote.map_or_else(|| "a peer".into(), |r| r.to_string())
}

/// A hash of a request's Call-ID, which keys per-call connections (only per-call mode pays
/// for this parse).
fn call_hash(data: &[u8]) -> Option<u64> {
    let msg = sip_core::message::Message::parse(data).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    msg.call_id().hash(&mut h);
    Some(h.finish())
}

#[cfg(test)]
mod ping_tests {
    use super::ping_early;
    use sip_core::timer::Millis;

    /// Keep-alive Pings come up to a tenth of the interval early, spread evenly: 10,000
    /// connections opened in one millisecond (slots 0..10,000) are Pinged over the whole
    /// tenth, not at once, and each Ping draws its connection a new offset.
    #[test]
    fn pings_of_connections_opened_together_are_spread_over_a_tenth_of_the_interval() {
        let interval = 30_000;
        let offsets: Vec<Millis> = (0..10_000u64)
            .map(|slot| ping_early((40_000 << 32) | slot, interval))
            .collect();
        assert!(offsets.iter().all(|&o| o <= interval / 10));
        // Every 300 ms bucket of the 3 s window holds about a tenth of them.
        let mut buckets = [0u32; 10];
        for &o in &offsets {
            buckets[(o * 10 / (interval / 10 + 1)) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&n| (850..=1150).contains(&n)),
            "{buckets:?}"
        );
        let next = ping_early(1_000 ^ (7 << 32) ^ offsets[7], interval);
        assert_ne!(next, offsets[7]);
    }
}

#[cfg(test)]
mod descriptor_tests {
    use super::fit_to_descriptors;
    use crate::config::Config;

    #[test]
    fn max_connections_follows_the_open_file_limit() {
        let toml =
            "[server]\nworkers = 2\nlisten = [\"udp:127.0.0.1:5060\", \"tcp:127.0.0.1:5060\"]\n\
                    [metrics]\nlisten = \"127.0.0.1:9090\"\n";
        let mut c = Config::from_toml(toml).unwrap();
        // The defaults: 100,000 connections, 10,000 from one address, against 20,000 files.
        assert_eq!(
            fit_to_descriptors(&mut c, Some(20_000)),
            Some((100_000, 19_714))
        );
        // Kept: 256, six per worker (two listen addresses), 17 for the metrics endpoint.
        assert_eq!(c.streams.max_connections_per_worker, 9_857);
        // One address keeps its tenth of the whole.
        assert_eq!(c.streams.max_per_ip_per_worker, 985);
        // Room enough, or no limit: nothing changes.
        let mut c = Config::from_toml(toml).unwrap();
        assert_eq!(fit_to_descriptors(&mut c, Some(1 << 20)), None);
        assert_eq!(fit_to_descriptors(&mut c, None), None);
        assert_eq!(c.streams.max_connections_per_worker, 50_000);
        // A limit below what is kept still leaves each worker a connection.
        let mut c = Config::from_toml(toml).unwrap();
        assert_eq!(fit_to_descriptors(&mut c, Some(100)), Some((100_000, 2)));
        assert_eq!(c.streams.max_per_ip_per_worker, 1);
    }
}

/// A worker's table on the default config, listening for TCP on a port of loopback the kernel
/// chose (tests of the table on real sockets).
#[cfg(test)]
fn test_table(ep: &Epoll) -> (Connections, SocketAddr) {
    let toml = "[server]\nlisten = [\"tcp:127.0.0.1:5060\"]\n";
    let cfg = crate::config::Config::from_toml(toml).unwrap();
    let listener = listen_reuseport("127.0.0.1:0".parse().unwrap()).unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let conns = Connections::new(
        0,
        cfg.streams.clone(),
        65_535,
        vec![(Transport::Tcp, listener)],
        None,
        None,
        Default::default(),
        ep,
    )
    .unwrap();
    (conns, addr)
}

#[cfg(test)]
mod receive_buffer_tests {
    use super::{listen_reuseport, RECEIVE_BUFFER};
    use std::io;
    use std::net::TcpStream;

    /// A worker's connections take the bounded receive buffer from its listener, not the
    /// kernel's autotuned one (which starts at `tcp_rmem`'s default and grows to its maximum).
    #[test]
    fn accepted_connections_inherit_the_bounded_receive_buffer() {
        let listener = listen_reuseport("127.0.0.1:0".parse().unwrap()).unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let accepted = loop {
            match listener.accept() {
                Ok((c, _)) => break c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "no connection accepted"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e) => panic!("{e}"),
            }
        };
        // The kernel caps the request at net.core.rmem_max and reports twice what it keeps;
        // where that file is not visible (some containers), at least not the autotuned start.
        let got = socket2::SockRef::from(&accepted)
            .recv_buffer_size()
            .unwrap();
        match std::fs::read_to_string("/proc/sys/net/core/rmem_max") {
            Ok(max) => {
                let max: usize = max.trim().parse().unwrap();
                assert_eq!(got, 2 * RECEIVE_BUFFER.min(max));
            }
            Err(_) => {
                let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let _c = TcpStream::connect(plain.local_addr().unwrap()).unwrap();
                let (control, _) = plain.accept().unwrap();
                let autotuned = socket2::SockRef::from(&control).recv_buffer_size().unwrap();
                assert!(
                    got <= 2 * RECEIVE_BUFFER && got != autotuned,
                    "{got} {autotuned}"
                );
            }
        }
    }
}

#[cfg(test)]
mod delay_tests {
    use super::{Connections, Token};
    use sip_core::timer::Millis;
    use sipsec_transport::net::epoll::{self, Epoll};
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    /// Waits until something is readable and hands the events to the table at `now` (engine
    /// milliseconds, made up here: the bound is arithmetic on them), as one pass.
    fn pass(conns: &mut Connections, ep: &Epoll, now: Millis) {
        let mut events = epoll::events(16);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut readable = false;
        while !readable {
            let n = ep.wait(&mut events, 50);
            for ev in &events[..n] {
                let token = Token::decode(ev.u64).expect("ours");
                conns.on_event(now, token, ev, ep);
                readable |= ev.events & libc::EPOLLIN as u32 != 0;
            }
            assert!(Instant::now() < deadline, "nothing became readable");
        }
        conns.release(now);
    }

    /// A stream read's queue delay is bounded by when its data can have arrived: after the
    /// connection's last read, and no earlier than the worker says its wait's report can have
    /// (when the wait before returned, or as it woke if it slept) — so a connection read every
    /// pass while the worker never waits says the pass's length (its sender's queue stands),
    /// and one read after a sleep says how long since the wake.
    #[test]
    fn a_stream_read_s_delay_is_bounded_by_its_last_read_and_the_wait() {
        let ep = Epoll::new().unwrap();
        let (mut conns, addr) = super::test_table(&ep);
        conns.set_measuring(true);
        let mut client = TcpStream::connect(addr).unwrap();
        conns.woke(0);
        pass(&mut conns, &ep, 0); // accepted at 0
        assert_eq!(conns.take_delay(), None, "an accept reads nothing");

        // The worker never waited since: the data may have waited since the accept.
        client.write_all(b"\r\n\r\n").unwrap();
        conns.woke(0);
        pass(&mut conns, &ep, 30);
        assert_eq!(conns.take_delay(), Some(30));
        assert_eq!(conns.take_delay(), None, "taken once");

        // Read again 12 ms later, the wait not having slept: a pass's length.
        client.write_all(b"\r\n\r\n").unwrap();
        conns.woke(30);
        pass(&mut conns, &ep, 42);
        assert_eq!(conns.take_delay(), Some(12));

        // The wait slept, and woke at 100 as the data came: read at 103.
        client.write_all(b"\r\n\r\n").unwrap();
        conns.woke(100);
        pass(&mut conns, &ep, 103);
        assert_eq!(conns.take_delay(), Some(3));

        // What a wait reports is bounded by the connection's last read too: the wait before
        // returned at 90, but this connection was read at 103.
        client.write_all(b"\r\n\r\n").unwrap();
        conns.woke(90);
        pass(&mut conns, &ep, 110);
        assert_eq!(conns.take_delay(), Some(7));

        // Not measuring: nothing.
        conns.set_measuring(false);
        conns.woke(200);
        client.write_all(b"\r\n\r\n").unwrap();
        pass(&mut conns, &ep, 250);
        assert_eq!(conns.take_delay(), None);
    }
}

#[cfg(test)]
mod read_limit_tests {
    use super::{Connections, Token};
    use sipsec_transport::net::epoll::{self, Epoll};
    use sipsec_transport::net::transport::{Peer, Transport};
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    /// Writes `len` bytes of CRLF keep-alives from `socket` on a thread of its own (its peer
    /// reads only what a pass takes); the receiver hears when all of it has reached the
    /// peer's receive queue (nothing left unacknowledged on loopback).
    fn send_pings(mut socket: TcpStream, len: usize) -> std::sync::mpsc::Receiver<()> {
        let (done, delivered) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            if socket.write_all(&b"\r\n\r\n".repeat(len / 4)).is_err() {
                return;
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let mut unacked: libc::c_int = 0;
                // SAFETY: TIOCOUTQ writes one int for our own socket.
                let r = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut unacked) };
                if r == 0 && unacked == 0 {
                    let _ = done.send(());
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        delivered
    }

    /// A connection the worker opened to forward a request to a next hop (it carries the
    /// answers to what the worker forwarded) is read up to four times as far a pass as one it
    /// accepted, so the answers to admitted calls do not wait behind new ones; one it opened
    /// to return a response (the one the request came on gone) is not: a peer can have that
    /// opened by closing its own.
    #[test]
    fn a_connection_opened_to_a_next_hop_is_read_further_a_pass_than_others() {
        let ep = Epoll::new().unwrap();
        let (mut conns, addr) = super::test_table(&ep);
        // A limit a stock kernel's receive buffer holds three times over (it caps a
        // socket's at twice `net.core.rmem_max`, 416 KiB on Debian, so the real limit's
        // three times could not all be queued), and no less than one read into the
        // worker's 64 KiB scratch (a read's granule).
        const READ_LIMIT: usize = 64 << 10;
        conns.read_limit = READ_LIMIT;
        // The next hop: the worker opens a connection to it by sending.
        let next_hop = TcpListener::bind("127.0.0.1:0").unwrap();
        let hop_addr = next_hop.local_addr().unwrap();
        let owner = conns.send(0, Peer::new(Transport::Tcp, hop_addr), b"OPTIONS", &ep);
        assert_eq!(owner, None, "this worker's own connection");
        let (hop_side, _) = next_hop.accept().unwrap();
        // A response's way back, opened because the connection it came on is gone.
        let answered = TcpListener::bind("127.0.0.1:0").unwrap();
        let back = Peer::new(Transport::Tcp, answered.local_addr().unwrap());
        assert_eq!(conns.send(0, back, b"SIP/2.0 200 OK", &ep), None);
        let (answered_side, _) = answered.accept().unwrap();
        // A caller: the worker accepts it.
        let caller = TcpStream::connect(addr).unwrap();

        let len = 3 * READ_LIMIT;
        let hop_delivered = send_pings(hop_side, len);
        let _caller_writes = send_pings(caller, len);
        let _answered_writes = send_pings(answered_side, len);
        // The next hop's window takes all of it.
        hop_delivered
            .recv_timeout(Duration::from_secs(10))
            .expect("all of the next hop's bytes in the worker's receive queue");
        std::thread::sleep(Duration::from_millis(100));

        // Events until both connections were read once (one pass: nothing is released).
        let mut events = epoll::events(16);
        let deadline = Instant::now() + Duration::from_secs(5);
        // What the pass read from each: the caller (accepted), the next hop, the way back.
        let read = |conns: &Connections, which: usize| {
            conns.reads.iter().find_map(|r| {
                let c = conns.conns[r.slot].as_ref()?;
                let kind = match c.io.remote {
                    a if a == hop_addr => 1,
                    a if a == back.addr => 2,
                    _ => 0,
                };
                (kind == which).then_some(r.consumed)
            })
        };
        while (0..3).any(|k| read(&conns, k).is_none()) {
            assert!(Instant::now() < deadline, "not both read");
            let n = ep.wait(&mut events, 50);
            for ev in &events[..n] {
                let token = Token::decode(ev.u64).expect("ours");
                conns.on_event(0, token, ev, &ep);
            }
        }
        let (accepted, next_hop, back) = (
            read(&conns, 0).unwrap(),
            read(&conns, 1).unwrap(),
            read(&conns, 2).unwrap(),
        );
        assert!(next_hop > READ_LIMIT, "next hop: {next_hop}");
        assert!(next_hop <= 4 * READ_LIMIT, "next hop: {next_hop}");
        assert!(accepted <= READ_LIMIT, "accepted: {accepted}");
        assert!(back <= READ_LIMIT, "a response's way back: {back}");
    }
}
