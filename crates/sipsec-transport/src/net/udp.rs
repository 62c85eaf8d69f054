//! UDP sockets with batched system calls: one `recvmmsg` takes up to [`BATCH`] datagrams and
//! one `sendmmsg` sends a worker's queued datagrams, so a busy worker pays a few system calls
//! per batch instead of two per message. Sockets are bound with SO_REUSEPORT so every worker
//! owns its own socket on the shared address and the kernel spreads peers across them.

use super::set_int_option;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

/// Datagrams per system call.
pub const BATCH: usize = 64;
/// Largest datagram we read.
pub(crate) const MAX_DATAGRAM: usize = 65_535;

/// Bytes of kernel buffer asked for in each direction.
const SOCKET_BUFFER: libc::c_int = 8 << 20;

/// 8-byte words of control buffer for the first datagram of a batch.
const CONTROL_WORDS: usize = 8;

/// Switches kernel receive timestamps (`SO_TIMESTAMPNS`) on or off for a UDP socket.
/// Off by default: while on, every packet the host receives is stamped, so a worker turns them
/// on only while it is near its capacity and queue delay is worth knowing.
pub fn set_timestamps(fd: RawFd, on: bool) -> bool {
    set_int_option(
        fd,
        libc::SOL_SOCKET,
        libc::SO_TIMESTAMPNS,
        libc::c_int::from(on),
    )
}

/// The kernel receive timestamp (`SCM_TIMESTAMPNS`) in the control data of a message
/// `recvmsg` filled, if any: when the datagram arrived.
pub(crate) fn timestamp_in(h: &libc::msghdr) -> Option<std::time::SystemTime> {
    if h.msg_control.is_null() || h.msg_controllen == 0 {
        return None;
    }
    // SAFETY: the header's control buffer is the caller's and the kernel set msg_controllen
    // to what it wrote; CMSG_* walk only within it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec =
                    std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                return Some(
                    std::time::UNIX_EPOCH
                        + std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32),
                );
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

/// Binds a non-blocking UDP socket with SO_REUSEPORT and large kernel buffers.
pub fn bind_reuseport(addr: SocketAddr) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    // Large buffers absorb bursts instead of dropping datagrams. The kernel caps the plain
    // options at net.core.{r,w}mem_max (about 200 KB by default); with CAP_NET_ADMIN the
    // FORCE variants are not capped. Best effort either way.
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        let fd = socket.as_raw_fd();
        if !set_int_option(fd, libc::SOL_SOCKET, force, SOCKET_BUFFER) {
            set_int_option(fd, libc::SOL_SOCKET, plain, SOCKET_BUFFER);
        }
    }
    socket.set_nonblocking(true)?;
    socket.bind(&SockAddr::from(addr))?;
    Ok(socket)
}

/// Receive buffers and headers for one `recvmmsg` call, reused across calls.
pub struct RecvBatch {
    buffers: Vec<u8>,
    /// Room for the first datagram's control messages: its kernel receive time, when
    /// [`set_timestamps`] is on (the oldest of a batch is all a queue delay needs).
    control: Vec<u64>,
    addrs: Vec<libc::sockaddr_storage>,
    iovecs: Vec<libc::iovec>,
    headers: Vec<libc::mmsghdr>,
    count: usize,
}

// The raw pointers inside point into the batch's own vectors, which never move once built.
unsafe impl Send for RecvBatch {}

impl Default for RecvBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl RecvBatch {
    /// Buffers for [`BATCH`] datagrams of up to 65,535 bytes each.
    pub fn new() -> Self {
        let mut b = RecvBatch {
            buffers: vec![0u8; BATCH * MAX_DATAGRAM],
            control: vec![0u64; CONTROL_WORDS],
            // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
            addrs: vec![unsafe { MaybeUninit::zeroed().assume_init() }; BATCH],
            iovecs: Vec::with_capacity(BATCH),
            headers: Vec::with_capacity(BATCH),
            count: 0,
        };
        for i in 0..BATCH {
            b.iovecs.push(libc::iovec {
                iov_base: b.buffers[i * MAX_DATAGRAM..].as_mut_ptr().cast(),
                iov_len: MAX_DATAGRAM,
            });
        }
        for i in 0..BATCH {
            // SAFETY: msghdr/mmsghdr are plain old data; fields are set below.
            let mut h: libc::mmsghdr = unsafe { MaybeUninit::zeroed().assume_init() };
            h.msg_hdr.msg_name = (&mut b.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
            h.msg_hdr.msg_iov = &mut b.iovecs[i];
            h.msg_hdr.msg_iovlen = 1;
            if i == 0 {
                h.msg_hdr.msg_control = b.control.as_mut_ptr().cast();
                h.msg_hdr.msg_controllen = CONTROL_WORDS * 8;
            }
            b.headers.push(h);
        }
        b
    }

    /// When the kernel received the first (oldest) datagram of the last `recv`, if
    /// timestamps are on for the socket ([`set_timestamps`]).
    pub fn first_timestamp(&self) -> Option<std::time::SystemTime> {
        if self.count == 0 {
            return None;
        }
        timestamp_in(&self.headers[0].msg_hdr)
    }

    /// Receives up to [`BATCH`] datagrams without blocking. Returns how many arrived (0 when
    /// none is waiting).
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        for h in &mut self.headers {
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
            h.msg_len = 0;
        }
        self.headers[0].msg_hdr.msg_controllen = CONTROL_WORDS * 8;
        // SAFETY: headers point at buffers, iovecs and addresses owned by self, sized as
        // declared; the kernel writes at most that much.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.headers.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            self.count = 0;
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        self.count = n as usize;
        Ok(self.count)
    }

    /// The `i`th datagram of the last `recv` and its source, if the address is IP.
    pub fn get(&self, i: usize) -> Option<(SocketAddr, &[u8])> {
        if i >= self.count {
            return None;
        }
        let len = (self.headers[i].msg_len as usize).min(MAX_DATAGRAM);
        let data = &self.buffers[i * MAX_DATAGRAM..i * MAX_DATAGRAM + len];
        // SAFETY: the kernel filled a sockaddr_storage of msg_namelen bytes.
        let addr = unsafe { SockAddr::new(self.addrs[i], self.headers[i].msg_hdr.msg_namelen) };
        addr.as_socket().map(|a| (a, data))
    }
}

/// Sends datagrams with `sendmmsg`, reusing its header arrays across calls so a flush
/// allocates nothing once warmed up.
#[derive(Default)]
pub struct SendBatch {
    addrs: Vec<SockAddr>,
    iovecs: Vec<libc::iovec>,
    headers: Vec<libc::mmsghdr>,
}

impl SendBatch {
    /// Sends every datagram, [`BATCH`] per system call, to the address `addr` reads from its
    /// destination. Returns how many the kernel refused.
    pub fn send<A>(
        &mut self,
        fd: RawFd,
        datagrams: &[(A, bytes::Bytes)],
        addr: impl Fn(&A) -> SocketAddr,
    ) -> usize {
        let mut failed = 0;
        for chunk in datagrams.chunks(BATCH) {
            self.addrs.clear();
            self.iovecs.clear();
            self.headers.clear();
            self.addrs
                .extend(chunk.iter().map(|(a, _)| SockAddr::from(addr(a))));
            self.iovecs.extend(chunk.iter().map(|(_, d)| libc::iovec {
                iov_base: d.as_ptr() as *mut _,
                iov_len: d.len(),
            }));
            for i in 0..chunk.len() {
                // SAFETY: plain old data, filled in below.
                let mut h: libc::mmsghdr = unsafe { MaybeUninit::zeroed().assume_init() };
                h.msg_hdr.msg_name = self.addrs[i].as_ptr() as *mut _;
                h.msg_hdr.msg_namelen = self.addrs[i].len();
                h.msg_hdr.msg_iov = &mut self.iovecs[i];
                h.msg_hdr.msg_iovlen = 1;
                self.headers.push(h);
            }
            let mut sent = 0;
            while sent < self.headers.len() {
                // SAFETY: every header points at live data in `chunk`, `addrs` and `iovecs`,
                // none of which is touched until the call returns.
                let n = unsafe {
                    libc::sendmmsg(
                        fd,
                        self.headers[sent..].as_mut_ptr(),
                        (self.headers.len() - sent) as u32,
                        0,
                    )
                };
                if n <= 0 {
                    if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    // Skip the datagram the kernel refused (e.g. unreachable); send the rest.
                    failed += 1;
                    sent += 1;
                    continue;
                }
                sent += n as usize;
            }
        }
        failed
    }
}

/// The raw descriptor of a socket.
pub fn fd(socket: &Socket) -> RawFd {
    socket.as_raw_fd()
}
