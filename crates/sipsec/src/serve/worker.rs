//! A worker thread: the I/O driver around one [`Engine`].
//!
//! The loop: one `epoll_wait` on the worker's UDP sockets, mailbox, listeners and connections
//! (returning at once while anything is ready, sleeping until the next deadline otherwise);
//! for what is ready, take the mail, a `recvmmsg` batch per UDP socket, or the connection's
//! bytes ([`Streams`]), and let the engine handle each message; fire due timers; then send
//! everything queued — datagrams with one `sendmmsg`, one write per connection — and post
//! mail. A busy worker does not sleep between passes, and no pass makes a system call that
//! can only answer "nothing". Under load it also lets datagrams accumulate briefly after
//! waking ([`Coalescer`]).

use super::connections::{self, Streams};
use crate::db::store::StoreHandle;
use crate::engine::{Effects, Engine, Mail};
use crate::net::epoll::{self, Epoll};
use crate::net::transport::{Peer, Transport};
use crate::net::udp::{self, RecvBatch, SendBatch};
use crate::serve::coalesce::Coalescer;
use bytes::Bytes;
use socket2::Socket;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

/// The sending side of a worker's mailbox.
#[derive(Clone)]
pub struct MailboxSender {
    tx: Sender<Mail>,
    wake: Arc<OwnedFd>,
}

impl MailboxSender {
    pub fn send(&self, mail: Mail) {
        if self.tx.send(mail).is_ok() {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes from a live u64 to an eventfd we own.
            unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }
}

/// Tells every worker that `user`'s credentials came (or their fetch gave up), so the
/// requests parked for them run.
pub fn credentials_ready(workers: &[MailboxSender], user: &str) {
    let user: Arc<str> = user.into();
    for w in workers {
        w.send(Mail::Credential { user: user.clone() });
    }
}

/// The receiving side of a worker's mailbox.
pub struct Mailbox {
    rx: Receiver<Mail>,
    wake: Arc<OwnedFd>,
}

/// A mailbox: a channel plus an eventfd that wakes the owner from `poll`.
pub fn mailbox() -> std::io::Result<(MailboxSender, Mailbox)> {
    // SAFETY: eventfd returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
    let (tx, rx) = std::sync::mpsc::channel();
    Ok((
        MailboxSender {
            tx,
            wake: wake.clone(),
        },
        Mailbox { rx, wake },
    ))
}

/// The epoll token of the mailbox; UDP socket `i` has token `i`.
const MAILBOX: u64 = 0xffff_ffff;

/// Everything a worker thread needs.
pub struct Worker {
    pub engine: Engine,
    pub sockets: Vec<Socket>,
    /// Whether each UDP socket is IPv6, by index.
    pub udp_v6: Vec<bool>,
    pub streams: Streams,
    pub epoll: Epoll,
    pub mailbox: Mailbox,
    pub peers: Vec<MailboxSender>,
    pub store: Option<StoreHandle>,
    pub shutdown: Arc<AtomicBool>,
    pub started: Instant,
    pub index: usize,
    pub coalescer: Coalescer,
    /// Where credential fetches go: the Proxychain authority channel, or the user database
    /// for digest without the cache.
    pub fetcher: Option<crate::auth::FetchHandle>,
}

impl Worker {
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Registers the worker's own descriptors (UDP sockets, mailbox) with its epoll set;
    /// [`Streams::new`] registers the listeners.
    pub fn register(&self) -> std::io::Result<()> {
        for (i, s) in self.sockets.iter().enumerate() {
            self.epoll.add(udp::fd(s), epoll::READ, i as u64)?;
        }
        self.epoll
            .add(self.mailbox.wake.as_raw_fd(), epoll::READ, MAILBOX)
    }

    /// Runs until `shutdown` is set.
    pub fn run(mut self) {
        let mut batch = RecvBatch::new();
        let mut sender = SendBatch::default();
        let mut udp_out: Vec<(Peer, Bytes)> = Vec::new();
        let mut fx = Effects::default();
        let mut events = epoll::events(256);
        let fds: Vec<RawFd> = self.sockets.iter().map(udp::fd).collect();
        let mut failed: Vec<(Peer, Bytes)> = Vec::new();
        while !self.shutdown.load(Ordering::Relaxed) {
            // One wait per pass: it returns at once while anything is ready (UDP sockets and
            // the mailbox are level-triggered), and sleeps until the next deadline otherwise.
            let now = self.now();
            let timeout = [self.engine.next_deadline(), self.streams.next_deadline()]
                .into_iter()
                .flatten()
                .min()
                .map_or(200, |d| d.saturating_sub(now).min(200)) as i32;
            let n = self.epoll.wait(&mut events, timeout);
            let delay = self.coalescer.delay(self.now());
            if n > 0 && !delay.is_zero() {
                // Under load, let datagrams accumulate briefly so one batch takes them.
                std::thread::sleep(delay);
            }
            // Mail first: bindings registered on other workers must be seen before any
            // message that may depend on them.
            if events[..n].iter().any(|ev| ev.u64 == MAILBOX) {
                self.drain_mailbox(&mut fx);
            }
            for ev in &events[..n] {
                let token = ev.u64;
                if connections::owns(token) {
                    let now = self.now();
                    self.streams
                        .on_event(now, ev, &mut self.engine, &mut fx, &self.epoll);
                } else if let Some(&fd) = fds.get(token as usize) {
                    self.receive_udp(token as usize, fd, &mut batch, &mut fx);
                }
            }
            let now = self.now();
            if self.engine.next_deadline().is_some_and(|d| d <= now) {
                self.engine.on_tick(now, &mut fx);
            }
            if self.streams.next_deadline().is_some_and(|d| d <= now) {
                self.streams.on_tick(now);
            }
            self.flush(&fds, &mut sender, &mut udp_out, &mut fx);
            // Requests a connection could not deliver fail their branches now (503).
            self.streams.take_failed(&mut failed);
            if !failed.is_empty() {
                let now = self.now();
                for (to, data) in failed.drain(..) {
                    self.engine.on_transport_error(now, to, &data, &mut fx);
                }
                self.flush(&fds, &mut sender, &mut udp_out, &mut fx);
            }
        }
        // Let the last messages out before the thread ends.
        self.flush(&fds, &mut sender, &mut udp_out, &mut fx);
    }

    /// Takes mail from other workers. The eventfd is reset first, so mail sent while the
    /// channel drains wakes the next wait.
    fn drain_mailbox(&mut self, fx: &mut Effects) {
        let mut counter = [0u8; 8];
        // SAFETY: reading 8 bytes into a live buffer from our eventfd.
        unsafe {
            libc::read(
                self.mailbox.wake.as_raw_fd(),
                counter.as_mut_ptr().cast(),
                8,
            )
        };
        self.take_mail(fx);
    }

    /// Handles the mail already in the channel, without touching the eventfd (its next wait
    /// then returns at once and finds the channel empty).
    fn take_mail(&mut self, fx: &mut Effects) {
        while let Ok(mail) = self.mailbox.rx.try_recv() {
            let now = self.now();
            self.engine.on_mail(now, mail, fx);
        }
    }

    /// One `recvmmsg` batch from UDP socket number `socket`, which the wait found readable.
    fn receive_udp(&mut self, socket: usize, fd: RawFd, batch: &mut RecvBatch, fx: &mut Effects) {
        match batch.recv(fd) {
            Ok(0) => {}
            Ok(n) => {
                // A binding posted before this batch was read must be applied before it: the
                // other worker posts it before its 200 OK leaves, so a request the client sent
                // on seeing that 200 cannot find the binding missing here.
                self.take_mail(fx);
                let now = self.now();
                self.coalescer.record(now, n);
                for i in 0..n {
                    if let Some((source, data)) = batch.get(i) {
                        let source = Peer::udp_via(source, socket);
                        self.engine.on_datagram(now, source, data, fx);
                    }
                }
            }
            Err(e) => tracing::warn!("receive failed: {e}"),
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
            return;
        }
        // Bindings first: another worker must have a registration before the REGISTER's 200 OK
        // leaves, or a request the client sends on seeing it may meet a worker without it.
        for change in fx.changes.drain(..) {
            for (i, peer) in self.peers.iter().enumerate() {
                if i != self.index {
                    peer.send(Mail::Binding(change.clone()));
                }
            }
            if let Some(store) = &self.store {
                store.send(self.index, change);
            }
        }
        if !fx.transmits.is_empty() {
            let now = self.now();
            for (to, data) in fx.transmits.drain(..) {
                if to.transport == Transport::Udp {
                    udp_out.push((to, data));
                } else if let Some(owner) = self.streams.send(now, to, &data, &self.epoll) {
                    if let Some(peer) = self.peers.get(owner) {
                        peer.send(Mail::Transmit { to, data });
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
        self.streams.finish_calls(&mut fx.finished_calls);
        self.streams.flush();
        for (to, mail) in fx.mail.drain(..) {
            if let Some(peer) = self.peers.get(to) {
                peer.send(mail);
            }
        }
        for (user, prefetch) in fx.fetches.drain(..) {
            if let Some(fetcher) = &self.fetcher {
                fetcher.fetch(user, prefetch);
            }
        }
    }
}
