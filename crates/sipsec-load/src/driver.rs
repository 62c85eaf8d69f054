//! The load generator's I/O loop: one thread that starts operations on the open-loop
//! schedule, feeds arriving messages to the [`Ua`], fires its timers, sends what it asks, and
//! prints a progress line every second. Transports plug in through [`Links`].
//!
//! One thread on purpose: the load generator's efficiency is measured per core, and a single
//! loop with batched system calls (`recvmmsg`/`sendmmsg` for UDP) is what lets one core
//! outrun SIPp. Sleeping is `ppoll` with microsecond timeouts, so a 10,000/s schedule is kept
//! without spinning.

use super::report::Progress;
use super::schedule::Pacer;
use super::ua::{Endpoint, FlowOp, Transmit, Ua};
use sipsec_transport::net::udp::{self, RecvBatch, SendBatch};
use socket2::Socket;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Why an operation failed without being sent while its connection was backlogged.
pub const BACKLOGGED: &str = "not sent: connection backlogged";

/// A set of local endpoints the UA sends and receives on.
pub trait Links {
    /// Appends the descriptors to wait on, with POLLOUT where output is waiting.
    fn poll_set(&self, out: &mut Vec<libc::pollfd>);
    /// Reads what is waiting and hands each message to the UA. Returns how many arrived.
    fn receive(&mut self, ua: &mut Ua, now_us: u64, out: &mut Vec<Transmit>) -> usize;
    /// Sends (or queues) every transmission in `out`, emptying it. Returns how many failed.
    fn send(&mut self, out: &mut Vec<Transmit>) -> usize;
    /// Whether a new operation must not be started now: the connection it would take holds
    /// more unsent bytes than a sender should queue (the peer reads slower than it is sent
    /// to). A real proxy fails such a request locally (Kamailio's `tcp_conn_wq_max`) rather
    /// than let it age in its own buffer, where no overload control can shed it.
    fn backlogged(&self) -> bool {
        false
    }
    /// Operations that ended (their per-call connections can close).
    fn release_calls(&mut self, ended: &mut Vec<u64>) {
        ended.clear();
    }
    /// Connection and TLS counts so far (zero for datagram links).
    fn counters(&self) -> LinkCounters {
        LinkCounters::default()
    }
    /// Opens a flow of its own to `remote` for a registration (a socket, or a connection);
    /// returns its link and local address.
    fn open_flow(&mut self, remote: SocketAddr) -> std::io::Result<(u32, SocketAddr)> {
        Err(std::io::Error::other(format!(
            "these links open no flows (to {remote})"
        )))
    }
    /// Closes a flow's link at the UA's request (the flow failed; it will not be reported
    /// back as closed).
    fn close_flow(&mut self, _link: u32) {}
}

/// What the stream links did: connections and TLS handshakes. Cumulative over the links'
/// life except `open`, which is the connections open now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkCounters {
    /// Connections the caller opened.
    pub connections_opened: u64,
    /// Connections the callee's listener accepted.
    pub connections_accepted: u64,
    /// Connections refused, reset, or closed with data unsent.
    pub connection_errors: u64,
    /// Connections open now.
    pub open: u64,
    /// The caller's handshakes, full and resumed.
    pub tls_full_handshakes: u64,
    /// The caller's handshakes that resumed a session.
    pub tls_resumed_handshakes: u64,
    /// Handshakes the UAS completed.
    pub tls_accepted_handshakes: u64,
    /// Handshakes either side gave up on.
    pub tls_handshake_failures: u64,
}

impl LinkCounters {
    /// What happened since `earlier` (a snapshot of the same links); `open` stays current.
    pub fn since(&self, earlier: &LinkCounters) -> LinkCounters {
        LinkCounters {
            connections_opened: self.connections_opened - earlier.connections_opened,
            connections_accepted: self.connections_accepted - earlier.connections_accepted,
            connection_errors: self.connection_errors - earlier.connection_errors,
            open: self.open,
            tls_full_handshakes: self.tls_full_handshakes - earlier.tls_full_handshakes,
            tls_resumed_handshakes: self.tls_resumed_handshakes - earlier.tls_resumed_handshakes,
            tls_accepted_handshakes: self.tls_accepted_handshakes - earlier.tls_accepted_handshakes,
            tls_handshake_failures: self.tls_handshake_failures - earlier.tls_handshake_failures,
        }
    }
}

impl std::ops::AddAssign for LinkCounters {
    /// Adds a later run's counts (what several trials did in all); `open` is the later one's.
    fn add_assign(&mut self, later: LinkCounters) {
        self.connections_opened += later.connections_opened;
        self.connections_accepted += later.connections_accepted;
        self.connection_errors += later.connection_errors;
        self.open = later.open;
        self.tls_full_handshakes += later.tls_full_handshakes;
        self.tls_resumed_handshakes += later.tls_resumed_handshakes;
        self.tls_accepted_handshakes += later.tls_accepted_handshakes;
        self.tls_handshake_failures += later.tls_handshake_failures;
    }
}

/// UDP sockets, one per link index (0: the UAC's, 1: the UAS's when both run; a registering
/// callee's flows each have their own, `None` once closed).
pub(crate) struct UdpLinks {
    sockets: Vec<Option<Socket>>,
    batch: RecvBatch,
    sender: SendBatch,
    queue: Vec<(SocketAddr, bytes::Bytes)>,
    /// Where the next flow's socket binds (its port is the first flow's only).
    flow_bind: Option<SocketAddr>,
    /// With a registering callee's flows, an epoll set of all the sockets, so that waiting and
    /// reading cost what the ready sockets do, not what all of them would (hundreds of flows).
    epoll: Option<std::os::fd::OwnedFd>,
    events: Vec<libc::epoll_event>,
}

impl UdpLinks {
    pub(crate) fn new(sockets: Vec<Socket>) -> UdpLinks {
        UdpLinks {
            sockets: sockets.into_iter().map(Some).collect(),
            batch: RecvBatch::new(),
            sender: SendBatch::default(),
            queue: Vec::new(),
            flow_bind: None,
            epoll: None,
            events: Vec::new(),
        }
    }

    /// The same sockets, and a registering callee's flows, each binding one of its own at
    /// `bind` (the first at its port, the others at ports the kernel picks).
    pub(crate) fn with_flows_at(self, bind: SocketAddr) -> std::io::Result<UdpLinks> {
        // SAFETY: epoll_create1 takes no pointers; its result is checked before use.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a new descriptor nothing else owns.
        let epoll = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let links = UdpLinks {
            flow_bind: Some(bind),
            epoll: Some(epoll),
            ..self
        };
        for link in 0..links.sockets.len() {
            links.watch(link)?;
        }
        Ok(links)
    }
}

/// A poll entry for reading, and writing too when `write`.
pub(crate) fn pollfd(fd: RawFd, write: bool) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: if write {
            libc::POLLIN | libc::POLLOUT
        } else {
            libc::POLLIN
        },
        revents: 0,
    }
}

impl UdpLinks {
    /// Adds socket `link` to the flows' epoll set.
    fn watch(&self, link: usize) -> std::io::Result<()> {
        let (Some(epoll), Some(Some(socket))) = (&self.epoll, self.sockets.get(link)) else {
            return Ok(());
        };
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: link as u64,
        };
        // SAFETY: both descriptors are open; event is a live epoll_event.
        let r = unsafe {
            libc::epoll_ctl(
                epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                udp::fd(socket),
                &mut event,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// The links with something to read, from the flows' epoll set: the ready ones only,
    /// however many flows there are.
    fn ready_links(&mut self) -> Vec<usize> {
        let Some(epoll) = &self.epoll else {
            return Vec::new();
        };
        self.events
            .resize(256, libc::epoll_event { events: 0, u64: 0 });
        // SAFETY: events is a live array of the declared length.
        let n = unsafe {
            libc::epoll_wait(
                epoll.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as libc::c_int,
                0,
            )
        };
        self.events[..n.max(0) as usize]
            .iter()
            .map(|e| e.u64 as usize)
            .collect()
    }
}

/// Reads what waits on `socket` (link `link`) and hands it to the UA; how many arrived.
fn receive_on(
    batch: &mut RecvBatch,
    socket: &Socket,
    link: usize,
    ua: &mut Ua,
    now_us: u64,
    out: &mut Vec<Transmit>,
) -> usize {
    let mut total = 0;
    // Bounded, so a flood on one socket cannot starve the schedule or the other.
    for _ in 0..4 {
        let n = match batch.recv(udp::fd(socket)) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!("receive failed: {e}");
                0
            }
        };
        for i in 0..n {
            if let Some((addr, data)) = batch.get(i) {
                let from = Endpoint {
                    link: link as u32,
                    addr,
                };
                ua.on_message(now_us, from, data, out);
            }
        }
        total += n;
        if n < udp::BATCH {
            break;
        }
    }
    total
}

impl Links for UdpLinks {
    fn poll_set(&self, out: &mut Vec<libc::pollfd>) {
        match &self.epoll {
            // Readable when any of its sockets is.
            Some(epoll) => out.push(pollfd(epoll.as_raw_fd(), false)),
            None => out.extend(
                self.sockets
                    .iter()
                    .flatten()
                    .map(|s| pollfd(udp::fd(s), false)),
            ),
        }
    }

    fn receive(&mut self, ua: &mut Ua, now_us: u64, out: &mut Vec<Transmit>) -> usize {
        let mut total = 0;
        if self.epoll.is_some() {
            for link in self.ready_links() {
                if let Some(Some(socket)) = self.sockets.get(link) {
                    total += receive_on(&mut self.batch, socket, link, ua, now_us, out);
                }
            }
            return total;
        }
        for (link, socket) in self.sockets.iter().enumerate() {
            if let Some(socket) = socket {
                total += receive_on(&mut self.batch, socket, link, ua, now_us, out);
            }
        }
        total
    }

    fn send(&mut self, out: &mut Vec<Transmit>) -> usize {
        let (mut failed, mut sent) = (0, 0);
        let mut links: Vec<usize> = Vec::new();
        if self.epoll.is_some() {
            // Many flows: visit only the sockets something is for.
            links.extend(out.iter().map(|(p, _)| p.link as usize));
            links.sort_unstable();
            links.dedup();
        }
        let all = 0..if self.epoll.is_some() {
            0
        } else {
            self.sockets.len()
        };
        for link in all.chain(links) {
            let Some(Some(socket)) = self.sockets.get(link) else {
                continue;
            };
            self.queue.clear();
            self.queue.extend(
                out.iter()
                    .filter(|(p, _)| p.link as usize == link)
                    .map(|(p, d)| (p.addr, d.clone())),
            );
            sent += self.queue.len();
            if !self.queue.is_empty() {
                failed += self.sender.send(udp::fd(socket), &self.queue, |a| *a);
            }
        }
        // What was for a closed socket cannot go.
        failed += out.len().saturating_sub(sent);
        out.clear();
        failed
    }

    fn open_flow(&mut self, remote: SocketAddr) -> std::io::Result<(u32, SocketAddr)> {
        let Some(bind) = self.flow_bind else {
            return Err(std::io::Error::other(format!(
                "no flows on these sockets (to {remote})"
            )));
        };
        let socket = udp::bind_reuseport(bind)?;
        let local = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| std::io::Error::other("a UDP socket without an address"))?;
        self.flow_bind = Some(SocketAddr::new(bind.ip(), 0));
        self.sockets.push(Some(socket));
        let link = self.sockets.len() - 1;
        if let Err(e) = self.watch(link) {
            self.sockets[link] = None;
            return Err(e);
        }
        Ok((link as u32, local))
    }

    fn close_flow(&mut self, link: u32) {
        if let Some(s) = self.sockets.get_mut(link as usize) {
            *s = None;
        }
    }
}

/// How a run ends.
pub struct RunOptions {
    /// Whether this process starts operations (a pure UAS only answers).
    pub(crate) originate: bool,
    /// Seconds to wait for operations in flight once the schedule is done; the rest fail as
    /// unfinished.
    pub(crate) drain_s: f64,
    /// For a pure UAS: stop after this long (else run until interrupted).
    pub(crate) uas_duration_s: Option<f64>,
    /// The callee registers its users first (`--register`), and unregisters them at the end.
    pub(crate) register: bool,
}

/// What the loop measured besides the UA's own statistics.
#[derive(Default)]
pub struct RunTimes {
    /// From the first start to the end of the last operation (or the stop).
    pub elapsed_s: f64,
    /// From the first start to the last (the schedule's span, the stop's if it came first):
    /// what a rate offered is measured over.
    pub(crate) schedule_s: f64,
    /// Transmissions the links could neither send nor queue.
    pub send_failures: u64,
    /// The caller's stop flag ended the run (SIGINT or SIGTERM): nothing started after it.
    pub interrupted: bool,
    /// What the links did during this run.
    pub links: LinkCounters,
}

impl RunTimes {
    /// Adds a later run's times and counts: what several trials took in all.
    pub fn add(&mut self, later: &RunTimes) {
        self.elapsed_s += later.elapsed_s;
        self.schedule_s += later.schedule_s;
        self.send_failures += later.send_failures;
        self.interrupted |= later.interrupted;
        self.links += later.links;
    }
}

/// The monotonic clock in microseconds since `origin`.
fn now_us(origin: Instant) -> u64 {
    origin.elapsed().as_micros() as u64
}

/// One turn of the loop's I/O at `now` (the UA's clock): what arrived, the UA's due timers,
/// the flows its registrations ask for, and the sends. Returns the sends that failed.
fn step(ua: &mut Ua, links: &mut dyn Links, now: u64, out: &mut Vec<Transmit>) -> u64 {
    links.receive(ua, now, out);
    if ua.next_deadline_us().is_some_and(|d| d <= now) {
        ua.on_tick(now, out);
    }
    if !ua.flow_ops.is_empty() {
        serve_flow_ops(ua, links, now, out);
    }
    if out.is_empty() {
        0
    } else {
        links.send(out) as u64
    }
}

/// Opens and closes the flows the UA's registrations asked for, and tells it what came of them.
fn serve_flow_ops(ua: &mut Ua, links: &mut dyn Links, now: u64, out: &mut Vec<Transmit>) {
    // Opening a flow registers over it at once, which may ask for more (a refused one closes).
    while !ua.flow_ops.is_empty() {
        for op in std::mem::take(&mut ua.flow_ops) {
            match op {
                FlowOp::Open { flow, remote } => match links.open_flow(remote) {
                    Ok((link, local)) => ua.flow_opened(now, flow, link, local, out),
                    Err(e) => ua.flow_unavailable(now, flow, &e.to_string()),
                },
                FlowOp::Close(link) => links.close_flow(link),
            }
        }
    }
}

/// Waits up to `wait_s` seconds for something to arrive on `links`.
fn wait(links: &dyn Links, pollfds: &mut Vec<libc::pollfd>, wait_s: f64) {
    if wait_s <= 0.000_05 {
        return;
    }
    pollfds.clear();
    links.poll_set(pollfds);
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: (wait_s.min(0.999) * 1e9) as libc::c_long,
    };
    // SAFETY: pollfds is a live array of the declared length; ts outlives the call.
    unsafe {
        libc::ppoll(
            pollfds.as_mut_ptr(),
            pollfds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
}

/// Runs the links and the UA's timers with nothing scheduled until `done` holds, the UA's
/// clock reaches `until_us`, or `stop` is set: the registrations before a run and the
/// unregistrations after it. Returns the sends that failed.
fn settle(
    ua: &mut Ua,
    links: &mut dyn Links,
    origin: Instant,
    until_us: u64,
    stop: Option<&AtomicBool>,
    done: impl Fn(&Ua) -> bool,
) -> u64 {
    let mut out = Vec::new();
    let mut pollfds = Vec::new();
    let mut failures = 0;
    loop {
        let now = now_us(origin);
        failures += step(ua, links, now, &mut out);
        if done(ua) || now >= until_us || stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return failures;
        }
        let wake = ua.next_deadline_us().unwrap_or(until_us).min(until_us);
        wait(links, &mut pollfds, wake.saturating_sub(now) as f64 / 1e6);
    }
}

/// How long the callee waits for its first registrations before the run (64·T1 for the
/// REGISTER, and the challenge's round trip).
const REGISTER_WAIT_US: u64 = 40_000_000;
/// How long the run's end waits for the unregistrations.
const UNREGISTER_WAIT_US: u64 = 5_000_000;

/// Registers the callee's flows before the run and says how that went: how many, how long,
/// and which failed and why. False when none registered.
fn register_first(
    ua: &mut Ua,
    links: &mut dyn Links,
    origin: Instant,
    stop: &AtomicBool,
) -> (bool, u64) {
    ua.start_registrations();
    let failures = settle(ua, links, origin, REGISTER_WAIT_US, Some(stop), |ua| {
        ua.registrations_settled()
    });
    let report = ua.registration_report();
    eprintln!(
        "sipsec load: {} of {} flows registered in {:.0} ms",
        report.registered,
        report.flows,
        now_us(origin) as f64 / 1e3
    );
    for failure in &report.failures {
        eprintln!("sipsec load: not registered: {failure}");
    }
    (report.registered > 0, failures)
}

/// Runs one schedule to completion (a registering callee registers first, and unregisters
/// after).
pub fn run(
    ua: &mut Ua,
    links: &mut dyn Links,
    pacer: &mut Pacer,
    opts: &RunOptions,
    progress: &mut Progress,
    stop: &AtomicBool,
) -> RunTimes {
    let origin = Instant::now();
    let counters_at_start = links.counters();
    let mut out: Vec<Transmit> = Vec::with_capacity(1024);
    let mut pollfds: Vec<libc::pollfd> = Vec::new();
    let mut send_failures = 0u64;
    let mut schedule_done_at: Option<f64> = None;
    let mut interrupted = false;
    // The run's clock starts once the registrations are in; the UA's runs on from `origin`.
    let mut offset = 0;
    if opts.register {
        let (any, failures) = register_first(ua, links, origin, stop);
        send_failures += failures;
        offset = now_us(origin);
        if !any {
            return RunTimes {
                send_failures,
                interrupted: stop.load(Ordering::Relaxed),
                links: links.counters().since(&counters_at_start),
                ..RunTimes::default()
            };
        }
    }
    let elapsed_s;
    loop {
        let now = now_us(origin);
        let t = (now - offset) as f64 / 1e6;
        if stop.load(Ordering::Relaxed) && !interrupted {
            interrupted = true;
            schedule_done_at.get_or_insert(t);
        }
        if opts.originate && !interrupted {
            for _ in 0..pacer.take_due(t) {
                if links.backlogged() {
                    ua.refuse_start(BACKLOGGED);
                } else {
                    ua.start(now, &mut out);
                }
            }
            if pacer.finished(t) {
                schedule_done_at.get_or_insert(t);
            }
        }
        send_failures += step(ua, links, now, &mut out);
        if !ua.ended.is_empty() {
            links.release_calls(&mut ua.ended);
        }
        progress.maybe_print(t, ua);
        // Termination.
        if opts.originate {
            if let Some(done) = schedule_done_at {
                if ua.in_flight() == 0 {
                    elapsed_s = t;
                    break;
                }
                if t - done > opts.drain_s || (interrupted && t - done > 2.0) {
                    ua.abandon_all("unfinished at end of run");
                    elapsed_s = t;
                    break;
                }
            }
        } else if interrupted || opts.uas_duration_s.is_some_and(|d| t >= d) {
            elapsed_s = t;
            break;
        }
        // Sleep until the next start, timer, progress line, or message.
        let mut wake = progress.next_due_s();
        if opts.originate && !interrupted {
            if let Some(n) = pacer.next_start_s(t) {
                wake = wake.min(n);
            }
        }
        if let Some(d) = ua.next_deadline_us() {
            wake = wake.min(d.saturating_sub(offset) as f64 / 1e6);
        }
        let waited = (wake - (now_us(origin) - offset) as f64 / 1e6).clamp(0.0, 0.2);
        wait(links, &mut pollfds, waited);
    }
    links.send(&mut out);
    if opts.register {
        let now = now_us(origin);
        ua.unregister_all(now, &mut out);
        send_failures += links.send(&mut out) as u64;
        send_failures += settle(ua, links, origin, now + UNREGISTER_WAIT_US, None, |ua| {
            ua.unregistrations_pending() == 0
        });
        ua.abandon_unregistrations();
        // The flows' links close (a run after this one opens its own).
        serve_flow_ops(ua, links, now_us(origin), &mut out);
    }
    RunTimes {
        elapsed_s,
        schedule_s: schedule_done_at.unwrap_or(elapsed_s),
        send_failures,
        interrupted,
        links: links.counters().since(&counters_at_start),
    }
}
