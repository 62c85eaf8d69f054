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
use super::ua::{Endpoint, Transmit, Ua};
use sipsec_transport::net::udp::{self, RecvBatch, SendBatch};
use socket2::Socket;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A set of local endpoints the UA sends and receives on.
pub trait Links {
    /// Appends the descriptors to wait on, with POLLOUT where output is waiting.
    fn poll_set(&self, out: &mut Vec<libc::pollfd>);
    /// Reads what is waiting and hands each message to the UA. Returns how many arrived.
    fn receive(&mut self, ua: &mut Ua, now_us: u64, out: &mut Vec<Transmit>) -> usize;
    /// Sends (or queues) every transmission in `out`, emptying it. Returns how many failed.
    fn send(&mut self, out: &mut Vec<Transmit>) -> usize;
    /// Operations that ended (their per-call connections can close).
    fn release_calls(&mut self, ended: &mut Vec<u64>) {
        ended.clear();
    }
    /// Connection and TLS counts so far (zero for datagram links).
    fn counters(&self) -> LinkCounters {
        LinkCounters::default()
    }
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

/// UDP sockets, one per link index (0: the UAC's, 1: the UAS's when both run).
pub(crate) struct UdpLinks {
    sockets: Vec<Socket>,
    batch: RecvBatch,
    sender: SendBatch,
    queue: Vec<(SocketAddr, bytes::Bytes)>,
}

impl UdpLinks {
    pub(crate) fn new(sockets: Vec<Socket>) -> UdpLinks {
        UdpLinks {
            sockets,
            batch: RecvBatch::new(),
            sender: SendBatch::default(),
            queue: Vec::new(),
        }
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

impl Links for UdpLinks {
    fn poll_set(&self, out: &mut Vec<libc::pollfd>) {
        out.extend(self.sockets.iter().map(|s| pollfd(udp::fd(s), false)));
    }

    fn receive(&mut self, ua: &mut Ua, now_us: u64, out: &mut Vec<Transmit>) -> usize {
        let mut total = 0;
        for (link, socket) in self.sockets.iter().enumerate() {
            // Bounded, so a flood on one socket cannot starve the schedule or the other.
            for _ in 0..4 {
                let n = match self.batch.recv(udp::fd(socket)) {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::debug!("receive failed: {e}");
                        0
                    }
                };
                for i in 0..n {
                    if let Some((addr, data)) = self.batch.get(i) {
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
        }
        total
    }

    fn send(&mut self, out: &mut Vec<Transmit>) -> usize {
        let mut failed = 0;
        for (link, socket) in self.sockets.iter().enumerate() {
            self.queue.clear();
            self.queue.extend(
                out.iter()
                    .filter(|(p, _)| p.link as usize == link)
                    .map(|(p, d)| (p.addr, d.clone())),
            );
            if !self.queue.is_empty() {
                failed += self.sender.send(udp::fd(socket), &self.queue, |a| *a);
            }
        }
        out.clear();
        failed
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

/// Runs one schedule to completion.
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
    let elapsed_s;
    loop {
        let now = now_us(origin);
        let t = now as f64 / 1e6;
        if stop.load(Ordering::Relaxed) && !interrupted {
            interrupted = true;
            schedule_done_at.get_or_insert(t);
        }
        if opts.originate && !interrupted {
            for _ in 0..pacer.take_due(t) {
                ua.start(now, &mut out);
            }
            if pacer.finished(t) {
                schedule_done_at.get_or_insert(t);
            }
        }
        links.receive(ua, now, &mut out);
        if ua.next_deadline_us().is_some_and(|d| d <= now) {
            ua.on_tick(now, &mut out);
        }
        if !out.is_empty() {
            send_failures += links.send(&mut out) as u64;
        }
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
            wake = wake.min(d as f64 / 1e6);
        }
        let wait = (wake - now_us(origin) as f64 / 1e6).clamp(0.0, 0.2);
        if wait > 0.000_05 {
            pollfds.clear();
            links.poll_set(&mut pollfds);
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: (wait * 1e9) as libc::c_long,
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
    }
    links.send(&mut out);
    RunTimes {
        elapsed_s,
        schedule_s: schedule_done_at.unwrap_or(elapsed_s),
        send_failures,
        interrupted,
        links: links.counters().since(&counters_at_start),
    }
}
