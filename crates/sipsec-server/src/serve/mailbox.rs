//! A worker's mailbox: how other threads reach a worker — other workers (handed-off
//! messages, binding changes, bytes for a connection it owns), the store's writer (commits),
//! the credential fetchers and DNS (answers in), and the main thread (a reload). A channel
//! plus an eventfd in the worker's epoll set, so mail wakes it from its wait.

use crate::engine::Mail;
use bytes::Bytes;
use sipsec_transport::net::transport::Peer;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

/// What a worker can be sent.
#[derive(Debug)]
pub enum Letter {
    /// For the worker's engine.
    Engine(Mail),
    /// Bytes for a connection the receiving worker owns: I/O, which its engine never sees.
    Transmit {
        /// The peer, on a connection the receiving worker owns.
        to: Peer,
        /// The bytes to write.
        data: Bytes,
    },
    /// A reloaded configuration and the TLS made from it (SIGHUP, `sipsec ctl reload`).
    Reload(Arc<super::reload::Reloaded>),
    /// `sipsec ctl bindings`: the worker answers with its replica's bindings.
    Bindings(super::control::Request),
}

impl From<Mail> for Letter {
    fn from(mail: Mail) -> Letter {
        Letter::Engine(mail)
    }
}

/// The sending side of a worker's mailbox.
#[derive(Clone)]
pub struct MailboxSender {
    tx: Sender<Letter>,
    wake: Arc<OwnedFd>,
}

impl MailboxSender {
    /// Sends a letter and wakes the worker for it.
    pub fn send(&self, letter: impl Into<Letter>) {
        if self.tx.send(letter.into()).is_ok() {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes from a live u64 to an eventfd we own.
            unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// Leaves a letter without waking the worker: it reads it before anything else it next
    /// wakes for (a datagram, a deadline, other mail), at most 200 ms on. For what only
    /// matters to the work that wakes it, such as a binding a later request may look up.
    pub(crate) fn post(&self, letter: impl Into<Letter>) {
        let _ = self.tx.send(letter.into());
    }
}

/// Tells every worker that `user`'s credentials came (or their fetch gave up), so the
/// requests parked for them run.
pub(crate) fn credentials_ready(workers: &[MailboxSender], user: &str) {
    let user: Arc<str> = user.into();
    for w in workers {
        w.send(Mail::Credential { user: user.clone() });
    }
}

/// The receiving side of a worker's mailbox.
pub struct Mailbox {
    rx: Receiver<Letter>,
    wake: Arc<OwnedFd>,
}

impl Mailbox {
    /// The eventfd to watch for readability.
    pub fn fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Resets the eventfd, so mail sent after this wakes the next wait.
    pub fn reset(&self) {
        let mut counter = [0u8; 8];
        // SAFETY: reading 8 bytes into a live buffer from our eventfd.
        unsafe { libc::read(self.wake.as_raw_fd(), counter.as_mut_ptr().cast(), 8) };
    }

    /// The next letter already in the channel, without waiting.
    pub(crate) fn try_recv(&self) -> Option<Letter> {
        self.rx.try_recv().ok()
    }
}

/// A mailbox: a channel plus an eventfd that wakes the owner from `epoll_wait`.
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
