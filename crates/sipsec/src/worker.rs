//! A worker thread: the I/O driver around one [`Engine`].
//!
//! The loop: drain the mailbox (so bindings registered on other workers are seen before any
//! datagram that may depend on them), receive a batch per socket with `recvmmsg`, let the
//! engine handle each datagram, fire due timers, then send everything queued with one
//! `sendmmsg` and post mail. Only when a pass found nothing to do does the worker sleep in
//! `poll` on its sockets and its mailbox's eventfd, until the engine's next deadline: a busy
//! worker does not pay a wake-up per message. Under load it also lets datagrams accumulate
//! briefly after waking ([`Coalescer`]).

use crate::coalesce::Coalescer;
use crate::engine::{Effects, Engine, Mail};
use crate::store::StoreHandle;
use crate::transport::Peer;
use crate::udp::{self, RecvBatch, SendBatch};
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

/// Everything a worker thread needs.
pub struct Worker {
    pub engine: Engine,
    pub sockets: Vec<Socket>,
    pub mailbox: Mailbox,
    pub peers: Vec<MailboxSender>,
    pub store: Option<StoreHandle>,
    pub shutdown: Arc<AtomicBool>,
    pub started: Instant,
    pub index: usize,
    pub coalescer: Coalescer,
}

impl Worker {
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Runs until `shutdown` is set.
    pub fn run(mut self) {
        let mut batch = RecvBatch::new();
        let mut sender = SendBatch::default();
        let mut fx = Effects::default();
        let fds: Vec<RawFd> = self.sockets.iter().map(udp::fd).collect();
        let mut pollfds: Vec<libc::pollfd> = fds
            .iter()
            .chain(std::iter::once(&self.mailbox.wake.as_raw_fd()))
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        while !self.shutdown.load(Ordering::Relaxed) {
            let mut busy = false;
            while let Ok(mail) = self.mailbox.rx.try_recv() {
                busy = true;
                let now = self.now();
                self.engine.on_mail(now, mail, &mut fx);
            }
            for &fd in &fds {
                match batch.recv(fd) {
                    Ok(0) => {}
                    Ok(n) => {
                        busy = true;
                        let now = self.now();
                        self.coalescer.record(now, n);
                        for i in 0..n {
                            if let Some((source, data)) = batch.get(i) {
                                let source = Peer::udp(source);
                                self.engine.on_datagram(now, source, data, &mut fx);
                            }
                        }
                    }
                    Err(e) => tracing::warn!("receive failed: {e}"),
                }
            }
            let now = self.now();
            if self.engine.next_deadline().is_some_and(|d| d <= now) {
                self.engine.on_tick(now, &mut fx);
            }
            self.flush(&fds, &mut sender, &mut fx);
            if busy {
                continue;
            }
            // Idle: sleep until a datagram, mail, the next timer, or a shutdown check.
            let now = self.now();
            let timeout = self
                .engine
                .next_deadline()
                .map_or(200, |d| d.saturating_sub(now).min(200)) as i32;
            // SAFETY: pollfds is a live array of the declared length.
            let ready =
                unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, timeout) };
            let delay = self.coalescer.delay(self.now());
            if ready > 0 && !delay.is_zero() {
                std::thread::sleep(delay);
            }
            if pollfds.last().is_some_and(|p| p.revents != 0) {
                let mut counter = [0u8; 8];
                // SAFETY: reading 8 bytes into a live buffer from our eventfd.
                unsafe {
                    libc::read(
                        self.mailbox.wake.as_raw_fd(),
                        counter.as_mut_ptr().cast(),
                        8,
                    )
                };
            }
        }
        // Let the last datagrams out before the thread ends.
        self.flush(&fds, &mut sender, &mut fx);
    }

    fn flush(&mut self, fds: &[RawFd], sender: &mut SendBatch, fx: &mut Effects) {
        if fx.is_empty() {
            return;
        }
        if !fx.transmits.is_empty() {
            let failed = sender.send(fds[0], &fx.transmits, |p| p.addr);
            self.engine
                .stats()
                .send_errors
                .fetch_add(failed as u64, Ordering::Relaxed);
            fx.transmits.clear();
        }
        for (to, mail) in fx.mail.drain(..) {
            if let Some(peer) = self.peers.get(to) {
                peer.send(mail);
            }
        }
        for change in fx.changes.drain(..) {
            for (i, peer) in self.peers.iter().enumerate() {
                if i != self.index {
                    peer.send(Mail::Binding(change.clone()));
                }
            }
            if let Some(store) = &self.store {
                store.send(change);
            }
        }
    }
}
