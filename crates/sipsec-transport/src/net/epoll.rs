//! A thin epoll wrapper for the workers: one epoll set per worker holding its UDP sockets,
//! mailbox, stream listeners and connections, each tagged with a `u64` the caller chooses.
//! epoll, not poll, because a wake-up must cost the same with 20,000 connections open as with
//! none (seed 000's OpenSIPS scanned its whole connection table on every event).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// One epoll set (closed when dropped).
pub struct Epoll {
    fd: OwnedFd,
}

/// Readiness as epoll reports it.
pub type Event = libc::epoll_event;

/// Read readiness, level-triggered (sockets the loop drains by itself every pass anyway).
pub const READ: u32 = libc::EPOLLIN as u32;
/// Connections: edge-triggered read, write and hang-up, registered once so that queuing output
/// never costs an `epoll_ctl`.
pub const STREAM: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

impl Epoll {
    /// A new, empty set (close-on-exec).
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 returns a new descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: a live epoll_event for the duration of the call, on descriptors we hold.
        if unsafe { libc::epoll_ctl(std::os::fd::AsRawFd::as_raw_fd(&self.fd), op, fd, &mut ev) }
            < 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Registers `fd` for `events` ([`READ`] or [`STREAM`]); `token` comes back in its events.
    pub fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, token)
    }

    /// Waits up to `timeout_ms` (0: just look; -1: forever) and fills `events`, returning how
    /// many are ready.
    pub fn wait(&self, events: &mut [Event], timeout_ms: i32) -> usize {
        // SAFETY: events is a live, writable array of the length passed.
        let n = unsafe {
            libc::epoll_wait(
                std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                timeout_ms,
            )
        };
        n.max(0) as usize
    }
}

/// A zeroed event buffer of `n` entries.
pub fn events(n: usize) -> Vec<Event> {
    vec![libc::epoll_event { events: 0, u64: 0 }; n]
}
