//! A worker thread: the I/O driver around one [`Engine`].
//!
//! The loop, one pass at a time:
//! 1. one `epoll_wait` on the worker's UDP sockets, mailbox, listeners and connections
//!    (returning at once while anything is ready, or a connection was read to its limit last
//!    pass, sleeping until the next deadline otherwise);
//! 2. mail first (bindings other workers made must be in place before any message that may
//!    depend on them), then a `recvmmsg` batch per readable UDP socket and the bytes of each
//!    readable connection, up to a limit a pass ([`Connections`]; those read to it first),
//!    every message handed to the engine by the same
//!    call, [`Engine::handle_message`], after the mail that arrived meanwhile — except
//!    requests from a source over its flood limit (`Flood`, counted before they are parsed)
//!    and STUN Binding requests on UDP, answered here (`crate::stun`);
//! 3. the engine's, the connections' and the flood limits' due timers;
//! 4. every `[overload] interval_ms`, the share of it the worker was busy
//!    (`Engine::handle_load`);
//! 5. everything the engine asked for ([`Effects`]): binding changes posted to the other
//!    workers (without waking them: step 2 takes them first) and the store before any answer
//!    leaves, datagrams with one `sendmmsg` per
//!    socket, one write per connection, mail, credential fetches, DNS lookups, certificate
//!    fetches.
//!
//! A busy worker does not sleep between passes, and no pass makes a system call that can
//! only answer "nothing". Under load it also lets datagrams accumulate briefly after waking
//! (`Coalescer`), as long as that is measured to cost less CPU than waking for each.

use super::busy::{BusyMeter, Queue};
use super::coalesce::Coalescer;
use super::connections::{Connections, Received};
use super::fetch::FetchHandle;
use super::mailbox::{Letter, Mailbox, MailboxSender};
use super::token::Token;
use crate::db::store::StoreHandle;
use crate::engine::{Effects, Engine, Mail, Measured};
use crate::flood::{Flood, Verdict};
use crate::stats::Stats;
use bytes::Bytes;
use sip_core::timer::Millis;
use sipsec_transport::net::epoll::{self, Epoll};
use sipsec_transport::net::transport::{Peer, Transport};
use sipsec_transport::net::udp::{self, RecvBatch, SendBatch};
use socket2::Socket;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a worker is made of; [`Worker::new`] registers its descriptors.
pub(crate) struct Parts {
    pub index: usize,
    pub engine: Engine,
    /// UDP sockets, in listen order.
    pub sockets: Vec<Socket>,
    pub connections: Connections,
    /// The epoll set the connection table registered its listeners with.
    pub epoll: Epoll,
    pub mailbox: Mailbox,
    /// Every worker's mailbox, by index (this one's included).
    pub workers: Vec<MailboxSender>,
    pub store: Option<StoreHandle>,
    /// Where credential fetches go: the Proxychain authority's channel, or the user database
    /// for digest without the cache.
    pub(crate) fetcher: Option<FetchHandle>,
    /// Where names to locate by DNS go.
    pub(crate) resolver: Option<super::dns::LookupHandle>,
    /// Where STIR/SHAKEN certificates to fetch go (`[identity] verify`).
    pub(crate) certs: Option<super::certs::CertHandle>,
    pub(crate) coalescer: Coalescer,
    /// The worker's own flood limits.
    pub(crate) flood: Flood,
    pub shutdown: Arc<AtomicBool>,
    /// Monotonic time 0 of every worker's clock.
    pub started: Instant,
}

/// A worker thread's state: see the module doc for its loop.
pub(crate) struct Worker {
    index: usize,
    engine: Engine,
    sockets: Vec<Socket>,
    /// Whether each UDP socket is IPv6, by index.
    udp_v6: Vec<bool>,
    connections: Connections,
    epoll: Epoll,
    mailbox: Mailbox,
    workers: Vec<MailboxSender>,
    store: Option<StoreHandle>,
    fetcher: Option<FetchHandle>,
    resolver: Option<super::dns::LookupHandle>,
    certs: Option<super::certs::CertHandle>,
    coalescer: Coalescer,
    flood: Flood,
    shutdown: Arc<AtomicBool>,
    started: Instant,
}

impl Worker {
    /// A worker, its UDP sockets and mailbox registered with its epoll set.
    pub(crate) fn new(p: Parts) -> std::io::Result<Worker> {
        for (i, s) in p.sockets.iter().enumerate() {
            p.epoll
                .add(udp::fd(s), epoll::READ, Token::Udp(i).encode())?;
        }
        p.epoll
            .add(p.mailbox.fd(), epoll::READ, Token::Mailbox.encode())?;
        let udp_v6 = p
            .sockets
            .iter()
            .map(|s| s.local_addr().ok().and_then(|a| a.as_socket()))
            .map(|a| a.is_some_and(|a| a.is_ipv6()))
            .collect();
        Ok(Worker {
            index: p.index,
            engine: p.engine,
            sockets: p.sockets,
            udp_v6,
            connections: p.connections,
            epoll: p.epoll,
            mailbox: p.mailbox,
            workers: p.workers,
            store: p.store,
            fetcher: p.fetcher,
            resolver: p.resolver,
            certs: p.certs,
            coalescer: p.coalescer,
            flood: p.flood,
            shutdown: p.shutdown,
            started: p.started,
        })
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Reads the clock: the engine's milliseconds, and the same reading in microseconds for
    /// its latency histograms (one clock read for both).
    fn now(&mut self) -> u64 {
        let us = Instant::now()
            .saturating_duration_since(self.started)
            .as_micros() as u64;
        self.engine.set_clock_us(us);
        us / 1000
    }

    /// `t` in the engine's milliseconds (since the workers started).
    fn millis(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.started).as_millis() as u64
    }

    /// Runs until `shutdown` is set.
    // Never inlined: the callgrind scripts (`scripts/callgrind_paths.sh`, `callgrind_nat.sh`)
    // count instructions from this function's entry, and inlined into the thread's closure it
    // has no symbol to name.
    #[inline(never)]
    pub(crate) fn run(mut self) {
        let mut batch = RecvBatch::new();
        let mut sender = SendBatch::default();
        let mut udp_out: Vec<(Peer, Bytes)> = Vec::new();
        let mut fx = Effects::default();
        let mut events = epoll::events(256);
        let fds: Vec<RawFd> = self.sockets.iter().map(udp::fd).collect();
        let mut failed: Vec<(Peer, Bytes)> = Vec::new();
        let interval = Duration::from_millis(self.engine.overload_interval_ms());
        let mut busy = BusyMeter::new(interval, Instant::now(), self.workers.len());
        // Queue delay is measured (UDP kernel timestamps on, connections' reads timed).
        let mut measuring = false;
        // The last pass read a full batch from some socket: more is waiting already.
        let mut backlog = false;
        // When what each wait reports can have arrived (for the connections' queue delay).
        let mut arrivals = Arrivals::default();
        while !self.shutdown.load(Ordering::Relaxed) {
            // One wait per pass (two while queue delay is measured: a look, then the wait): it
            // returns at once while anything is ready (UDP sockets and the mailbox are
            // level-triggered), and sleeps until the next deadline otherwise.
            // The clock is read twice a pass, around the wait: what the wait took is the idle
            // time overload control measures.
            let wait_start = Instant::now();
            let now = self.millis(wait_start);
            let timeout = [
                self.engine.poll_timeout(),
                self.connections.next_deadline(),
                self.flood.next_deadline(),
            ]
            .into_iter()
            .flatten()
            .min()
            .map_or(200, |d| d.saturating_sub(now).min(200)) as i32;
            // A connection read to its limit last pass has more waiting, and no edge will say so.
            let unread = self.connections.has_unread();
            let timeout = if unread { 0 } else { timeout };
            // While queue delay is measured, a look before the wait says whether it sleeps:
            // what a wait that slept reports arrived as it woke (the first edge ends it).
            let (n, slept) = if measuring && timeout > 0 {
                match self.epoll.wait(&mut events, 0) {
                    0 => (self.epoll.wait(&mut events, timeout), true),
                    n => (n, false),
                }
            } else {
                (self.epoll.wait(&mut events, timeout), false)
            };
            let woke = Instant::now();
            busy.idle(woke.saturating_duration_since(wait_start));
            let full = n == events.len();
            let woke_ms = self.millis(woke);
            self.connections
                .woke(arrivals.after_wait(woke_ms, slept, full));
            let delay = self.coalescer.delay(woke_ms);
            if n > 0 && !delay.is_zero() && !backlog && !unread {
                // Under load, let datagrams accumulate briefly so one batch takes them; not
                // while a backlog waits, which would only be drained slower (measured: a
                // worker that slept before every batch sat idle a seventh of the time while
                // a queue of 5–30 ms stood, at 70% of a core).
                std::thread::sleep(delay);
                busy.idle(delay);
            }
            let tokens = || events[..n].iter().map(|ev| (Token::decode(ev.u64), ev));
            if tokens().any(|(t, _)| t == Some(Token::Mailbox)) {
                self.mailbox.reset();
            }
            // Every pass, woken for mail or not: bindings are posted without a wake-up, so an
            // idle worker's replica is never more than one wait (200 ms) behind. (Each receive
            // batch takes the mail again first, for what came during the pass.)
            self.take_mail(&mut fx);
            backlog = false;
            if unread {
                let now = self.now();
                self.connections.read_unread(now);
            }
            for (token, ev) in tokens() {
                match token {
                    Some(Token::Udp(i)) if i < fds.len() => {
                        let got = self.receive_udp(i, fds[i], &mut batch, &mut fx);
                        backlog |= got == udp::BATCH;
                        if measuring && got > 0 {
                            if let Some(t) = batch.first_timestamp() {
                                let waited = t.elapsed().unwrap_or_default();
                                busy.queued(Queue::Datagrams, waited);
                            } else {
                                busy.read(Queue::Datagrams);
                            }
                        }
                    }
                    Some(t @ (Token::Listener(_) | Token::Connection(_))) => {
                        let now = self.now();
                        self.connections.on_event(now, t, ev, &self.epoll);
                    }
                    _ => {}
                }
            }
            self.receive_streams(&mut fx);
            if let Some(d) = self.connections.take_delay() {
                busy.queued(Queue::Streams, Duration::from_millis(d));
            }
            let now = self.now();
            if self.engine.poll_timeout().is_some_and(|d| d <= now) {
                self.engine.handle_timeout(now, &mut fx);
            }
            if self.connections.next_deadline().is_some_and(|d| d <= now) {
                self.connections.on_tick(now);
            }
            if self.flood.next_deadline().is_some_and(|d| d <= now) {
                self.flood.on_tick(now, self.engine.stats());
            }
            busy.pass(full);
            if let Some(load) = busy.take(woke) {
                self.engine.handle_load(
                    now,
                    Measured {
                        load: load.load(),
                        cpu: load.cpu,
                        standing_delay_ms: load.standing_delay.map(|d| d.as_millis() as u64),
                        streams_standing_delay_ms: load
                            .streams_standing_delay
                            .map(|d| d.as_millis() as u64),
                        queue_delay_ms: load.queue_delay.as_millis() as u64,
                    },
                );
                let open = self.connections.open() as u64;
                let traffic = &self.engine.stats().traffic;
                traffic.connections_open.store(open, Ordering::Relaxed);
                // Queue delay only near capacity, where it is worth knowing (kernel timestamps
                // cost every packet the host receives).
                let want = load.load() >= QUEUE_MEASURED_FROM_LOAD
                    || load.standing_delay.is_some_and(|d| !d.is_zero());
                if want != measuring {
                    measuring = want;
                    for &fd in &fds {
                        udp::set_timestamps(fd, want);
                    }
                    self.connections.set_measuring(want);
                }
            }
            self.flush(&fds, &mut sender, &mut udp_out, &mut fx);
            // Requests a connection could not deliver fail their branches now (503).
            self.connections.take_failed(&mut failed);
            if !failed.is_empty() {
                let now = self.now();
                for (to, data) in failed.drain(..) {
                    self.engine.handle_transport_error(now, to, &data, &mut fx);
                }
                self.flush(&fds, &mut sender, &mut udp_out, &mut fx);
            }
        }
        // Let the last messages out before the thread ends.
        self.flush(&fds, &mut sender, &mut udp_out, &mut fx);
    }

    /// Handles the mail already in the channel. Engine mail goes to the engine; bytes for
    /// one of our connections join this pass's output.
    fn take_mail(&mut self, fx: &mut Effects) {
        while let Some(letter) = self.mailbox.try_recv() {
            match letter {
                Letter::Engine(mail) => {
                    let now = self.now();
                    self.engine.handle_mail(now, mail, fx);
                }
                Letter::Transmit { to, data } => fx.transmits.push((to, data)),
                Letter::Bindings(request) => {
                    let now = self.now();
                    request.answer(Ok(self.engine.bindings_report(now)));
                }
                Letter::Reload(r) => {
                    self.flood.reconfigure(&r.cfg.flood, self.engine.stats());
                    self.engine.handle_reload(r.cfg.clone());
                    self.connections
                        .set_tls(r.tls_server.clone(), r.tls_client.clone());
                }
            }
        }
    }

    /// One `recvmmsg` batch from UDP socket number `socket`, which the wait found readable.
    /// Returns how many datagrams it took.
    fn receive_udp(
        &mut self,
        socket: usize,
        fd: RawFd,
        batch: &mut RecvBatch,
        fx: &mut Effects,
    ) -> usize {
        match batch.recv(fd) {
            Ok(0) => 0,
            Ok(n) => {
                // A binding posted before this batch was read must be applied before it: the
                // other worker posts it before its 200 OK leaves, so a request the client sent
                // on seeing that 200 cannot find the binding missing here.
                self.take_mail(fx);
                let now = self.now();
                self.coalescer.record(now, n, super::busy::thread_cpu_time);
                for i in 0..n {
                    if let Some((source, data)) = batch.get(i) {
                        let source = Peer::udp_via(source, socket);
                        if !admit(&mut self.flood, self.engine.stats(), now, source, data, fx) {
                            continue;
                        }
                        if crate::stun::is_stun(data) {
                            self.answer_stun(source, data, fx);
                            continue;
                        }
                        self.engine.handle_message(now, source, data, fx);
                    }
                }
                n
            }
            Err(e) => {
                tracing::warn!("receive failed: {e}");
                0
            }
        }
    }

    /// Hands the messages the connections framed this pass to the engine, after the mail
    /// that came meanwhile (as for a UDP batch), then lets the connections consume them.
    fn receive_streams(&mut self, fx: &mut Effects) {
        if !self.connections.read_any() {
            return;
        }
        let count = self.connections.received_len();
        let now = self.now();
        if count > 0 {
            self.take_mail(fx);
            // Stream messages count toward the rate that sets how long a wake-up may wait
            // for more, as datagrams do: at the same rate, a TCP or TLS worker is woken as
            // rarely as a UDP one.
            self.coalescer
                .record(now, count, super::busy::thread_cpu_time);
        }
        for i in 0..count {
            match self.connections.received(i) {
                Some(Received::Message(source, data))
                    if admit(&mut self.flood, self.engine.stats(), now, source, data, fx) =>
                {
                    self.engine.handle_message(now, source, data, fx);
                }
                Some(Received::Oversize(source, head)) => {
                    self.engine.handle_oversize(now, source, head, fx);
                }
                // Refused by the flood limits (`admit` counted it), or nothing.
                _ => {}
            }
        }
        self.connections.release(now);
    }

    /// Answers a STUN-shaped datagram from `source` (a Binding request gets its mapped
    /// address back from the socket it came in on), or drops and counts it.
    fn answer_stun(&mut self, source: Peer, data: &[u8], fx: &mut Effects) {
        let mut out = [0; crate::stun::MAX_ANSWER];
        let stats = self.engine.stats();
        match crate::stun::answer(data, source.addr, &mut out) {
            Some(n) => {
                crate::stats::inc(&stats.stun_answered);
                fx.transmits
                    .push((source, Bytes::copy_from_slice(&out[..n])));
            }
            None => crate::stats::inc(&stats.stun_dropped),
        }
    }

    /// Sends datagrams from the socket each names (`Peer::udp_socket`), or else the first of
    /// the destination's address family, one `sendmmsg` run per socket. Returns how many
    /// could not be sent.
    fn send_udp(&self, fds: &[RawFd], sender: &mut SendBatch, out: &mut [(Peer, Bytes)]) -> usize {
        let socket_for = |p: &Peer| {
            p.udp_socket()
                .filter(|&s| s < fds.len())
                .or_else(|| self.udp_v6.iter().position(|&v6| v6 == p.addr.is_ipv6()))
        };
        match fds {
            // No UDP listener to send from (a contact registered over UDP with a
            // stream-only server).
            [] => out.len(),
            [fd] => sender.send(*fd, out, |p| p.addr),
            _ => {
                // Runs of one socket, in the order they were queued within each socket.
                out.sort_by_key(|(p, _)| socket_for(p));
                let mut failed = 0;
                for run in out.chunk_by(|(a, _), (b, _)| socket_for(a) == socket_for(b)) {
                    failed += match socket_for(&run[0].0) {
                        Some(s) => sender.send(fds[s], run, |p| p.addr),
                        None => run.len(),
                    };
                }
                failed
            }
        }
    }

    fn flush(
        &mut self,
        fds: &[RawFd],
        sender: &mut SendBatch,
        udp_out: &mut Vec<(Peer, Bytes)>,
        fx: &mut Effects,
    ) {
        if fx.is_empty() {
            if self.connections.has_dirty() {
                // Keep-alive answers and connections that ended.
                let now = self.now();
                self.connections.flush(now);
            }
            return;
        }
        let now = self.now();
        // Bindings first: another worker must have a registration before the REGISTER's 200 OK
        // leaves, or a request the client sends on seeing it may meet a worker without it.
        // Posted, not sent: the other worker takes its mail before handling whatever wakes it
        // next, so a REGISTER costs it no wake-up.
        for change in fx.changes.drain(..) {
            for (i, worker) in self.workers.iter().enumerate() {
                if i != self.index {
                    worker.post(Mail::Binding(change.clone()));
                }
            }
            if let Some(store) = &self.store {
                store.send(self.index, change);
            }
        }
        // Before any connection to them is opened.
        for (addr, domain) in fx.tls_names.drain(..) {
            self.connections.name_tls_destination(addr, domain);
        }
        if !fx.transmits.is_empty() {
            for (to, data) in fx.transmits.drain(..) {
                if to.transport == Transport::Udp {
                    udp_out.push((to, data));
                } else if let Some(owner) = self.connections.send(now, to, &data, &self.epoll) {
                    if let Some(worker) = self.workers.get(owner) {
                        worker.send(Letter::Transmit { to, data });
                    }
                }
            }
            if !udp_out.is_empty() {
                let failed = self.send_udp(fds, sender, udp_out);
                self.engine
                    .stats()
                    .send_errors
                    .fetch_add(failed as u64, Ordering::Relaxed);
                udp_out.clear();
            }
        }
        self.connections.finish_calls(&mut fx.finished_calls);
        self.connections.flush(now);
        for (to, mail) in fx.mail.drain(..) {
            if let Some(worker) = self.workers.get(to) {
                worker.send(mail);
            }
        }
        for (user, prefetch) in fx.fetches.drain(..) {
            if let Some(fetcher) = &self.fetcher {
                fetcher.fetch(user, prefetch, self.index);
            }
        }
        for query in fx.lookups.drain(..) {
            if let Some(resolver) = &self.resolver {
                resolver.lookup(query, self.index);
            }
        }
        for url in fx.cert_fetches.drain(..) {
            if let Some(certs) = &self.certs {
                certs.fetch(url, self.index);
            }
        }
    }
}

/// Whether a message from `source` goes on, by its source's flood limit: responses always
/// do, and every request (anything not starting with `SIP/2.0 `: a request line, a
/// keep-alive, STUN) is counted first, unparsed. A refused one is dropped, or answered as
/// `[flood] action` says.
fn admit(
    flood: &mut Flood,
    stats: &Stats,
    now: u64,
    source: Peer,
    data: &[u8],
    fx: &mut Effects,
) -> bool {
    if data.starts_with(b"SIP/2.0 ") {
        return true;
    }
    match flood.check(now, source.addr.ip(), stats) {
        Verdict::Pass => true,
        Verdict::Refused { until } => {
            if let Some(answer) = flood.answer(now, until, data) {
                fx.transmits.push((source, Bytes::from(answer)));
            }
            false
        }
    }
}

/// The load from which a worker measures queue delay: it has the kernel stamp its datagrams,
/// times its connections' reads, and looks before each wait whether it will sleep; below it
/// none of that is done. Overload control reads a `target`
/// below it as a cap on the load (`engine::overload::control::QUEUE_MEASURED_FROM`, the same).
const QUEUE_MEASURED_FROM_LOAD: f64 = 0.5;

/// When the data a loop pass's wait reports can have arrived, for the connections' queue
/// delay (`Connections::woke`).
#[derive(Debug, Default)]
struct Arrivals {
    /// When the last wait whose report was whole returned, engine milliseconds.
    returned: Millis,
}

impl Arrivals {
    /// A wait returned at `woke`; it `slept` first (nothing was ready when it began), and its
    /// report was `full` (as many events as the list holds). What it reports arrived as it
    /// woke if it slept; otherwise at any time since the last wait returned — except what a
    /// full list left out, which the next wait reports though it arrived before this one
    /// returned, so the next looks back as far as this one did (or to this one's wake, if it
    /// slept: all it could have reported came as it woke).
    fn after_wait(&mut self, woke: Millis, slept: bool, full: bool) -> Millis {
        let since = if slept { woke } else { self.returned };
        if !full || slept {
            self.returned = woke;
        }
        since
    }
}

#[cfg(test)]
mod tests {
    use super::Arrivals;

    /// What a wait that slept reports arrived as it woke; what one that did not reports, at
    /// any time since the last returned; and what a full event list left out, since the one
    /// before it.
    #[test]
    fn a_wait_s_report_arrived_after_the_last_wait_or_as_it_woke() {
        let mut a = Arrivals::default();
        assert_eq!(a.after_wait(10, false, false), 0);
        // Did not sleep: since the wait at 10 returned.
        assert_eq!(a.after_wait(35, false, false), 10);
        // Slept until an edge at 80: as it woke, not since 35, nor since it began.
        assert_eq!(a.after_wait(80, true, false), 80);
        // A full list at 90: the next wait reports what it left out, from before 90.
        assert_eq!(a.after_wait(90, false, true), 80);
        assert_eq!(a.after_wait(120, false, false), 80);
        assert_eq!(a.after_wait(130, false, false), 120);
        // A full list after a sleep that woke at 300: what it left out came as it woke.
        assert_eq!(a.after_wait(300, true, true), 300);
        assert_eq!(a.after_wait(305, false, false), 300);
    }
}
