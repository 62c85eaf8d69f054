//! TCP for the load generator: outbound connections for the caller — one per target reused by
//! every call (`--connection persistent`), or one per call closed when the call ends
//! (`per-call`) — and a listener for the callee that answers on the connection a request came
//! in on. Messages are framed by Content-Length (RFC 3261 §18.3); CRLF keep-alives are
//! skipped and a double-CRLF ping is answered.
//!
//! Link numbering: link 0 means "the caller's connection to this address" (found or opened
//! here); link n ≥ 1 is connection n−1 itself, which is how the UA answers on the connection a
//! request arrived on.

use super::driver::{pollfd, Links};
use super::ua::{self, Peer, Transmit, Ua};
use sip_core::message::framing::{next_frame, Frame};
use socket2::{Domain, SockAddr, Socket, Type};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;

/// Largest message accepted from a stream.
const MAX_MESSAGE: usize = 65_535;

struct Conn {
    stream: TcpStream,
    remote: SocketAddr,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    /// The call this connection was opened for (per-call mode).
    call: Option<u64>,
    /// The call ended with bytes still queued: close once they are written.
    close_when_flushed: bool,
}

/// TCP links: a listener for the UAS, connections both ways.
pub struct TcpLinks {
    listener: Option<TcpListener>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    by_remote: HashMap<SocketAddr, usize>,
    by_call: HashMap<u64, usize>,
    per_call: bool,
    local_ip: Option<std::net::IpAddr>,
    scratch: Vec<u8>,
    /// Connections refused, reset or closed with data unsent.
    pub errors: u64,
}

impl TcpLinks {
    pub fn new(
        listener: Option<TcpListener>,
        per_call: bool,
        local_ip: Option<std::net::IpAddr>,
    ) -> TcpLinks {
        TcpLinks {
            listener,
            conns: Vec::new(),
            free: Vec::new(),
            by_remote: HashMap::new(),
            by_call: HashMap::new(),
            per_call,
            local_ip,
            scratch: vec![0; 64 * 1024],
            errors: 0,
        }
    }

    /// Binds the UAS listener.
    pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
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
            if self.by_remote.get(&c.remote) == Some(&i) {
                self.by_remote.remove(&c.remote);
            }
            if let Some(call) = c.call {
                self.by_call.remove(&call);
            }
            self.free.push(i);
        }
    }

    /// Starts a non-blocking connection to `remote`.
    fn connect(&mut self, remote: SocketAddr, call: Option<u64>) -> io::Result<usize> {
        let socket = Socket::new(Domain::for_address(remote), Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        socket.set_nodelay(true)?;
        if let Some(ip) = self.local_ip {
            socket.bind(&SockAddr::from(SocketAddr::new(ip, 0)))?;
        }
        match socket.connect(&SockAddr::from(remote)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        let stream: TcpStream = socket.into();
        let i = self.insert(Conn {
            stream,
            remote,
            inbuf: Vec::new(),
            outbuf: Vec::new(),
            call,
            close_when_flushed: false,
        });
        Ok(i)
    }

    /// The connection a transmission goes on, opening one when needed.
    fn conn_for(&mut self, peer: Peer, data: &[u8]) -> Option<usize> {
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
        match self.connect(peer.addr, call) {
            Ok(i) => {
                match call {
                    Some(n) => self.by_call.insert(n, i),
                    None => self.by_remote.insert(peer.addr, i),
                };
                Some(i)
            }
            Err(e) => {
                tracing::debug!("connect to {} failed: {e}", peer.addr);
                self.errors += 1;
                None
            }
        }
    }

    /// Writes as much queued output as the socket takes; false when the connection failed.
    fn flush(conn: &mut Conn) -> bool {
        while !conn.outbuf.is_empty() {
            match conn.stream.write(&conn.outbuf) {
                Ok(0) => return false,
                Ok(n) => {
                    conn.outbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Closes the connections of calls that have ended (per-call mode).
    pub fn release_calls(&mut self, ended: &mut Vec<u64>) {
        for call in ended.drain(..) {
            if let Some(i) = self.by_call.get(&call).copied() {
                let done = self.conns[i].as_mut().is_some_and(|c| {
                    Self::flush(c);
                    c.outbuf.is_empty()
                });
                if done {
                    self.close(i);
                } else if let Some(c) = self.conns[i].as_mut() {
                    // Let the last bytes go first; the connection closes when they have.
                    c.call = None;
                    c.close_when_flushed = true;
                    self.by_call.remove(&call);
                }
            }
        }
    }

    /// Open connections (for the progress line and tests).
    pub fn open(&self) -> usize {
        self.conns.len() - self.free.len()
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
                    self.errors += 1;
                    break;
                }
            }
        }
        for (stream, remote) in accepted {
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let _ = stream.set_nodelay(true);
            self.insert(Conn {
                stream,
                remote,
                inbuf: Vec::new(),
                outbuf: Vec::new(),
                call: None,
                close_when_flushed: false,
            });
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

impl Links for TcpLinks {
    fn poll_set(&self, out: &mut Vec<libc::pollfd>) {
        out.extend(self.listener.iter().map(|l| pollfd(l.as_raw_fd(), false)));
        out.extend(
            self.conns
                .iter()
                .flatten()
                .map(|c| pollfd(c.stream.as_raw_fd(), !c.outbuf.is_empty())),
        );
    }

    fn receive(&mut self, ua: &mut Ua, now_us: u64, out: &mut Vec<Transmit>) -> usize {
        self.accept_all();
        let mut messages = 0;
        for i in 0..self.conns.len() {
            let mut failed = false;
            let mut frames = Vec::new();
            {
                let Some(c) = self.conns[i].as_mut() else {
                    continue;
                };
                if !Self::flush(c) {
                    failed = true;
                }
                loop {
                    match c.stream.read(&mut self.scratch) {
                        Ok(0) => {
                            failed = true;
                            break;
                        }
                        Ok(n) => c.inbuf.extend_from_slice(&self.scratch[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => break,
                        Err(_) => {
                            failed = true;
                            break;
                        }
                    }
                }
                let mut start = 0;
                loop {
                    match next_frame(&c.inbuf[start..], MAX_MESSAGE) {
                        Frame::Incomplete => break,
                        Frame::KeepAlive { len, ping } => {
                            if ping {
                                c.outbuf.extend_from_slice(b"\r\n");
                            }
                            start += len;
                        }
                        Frame::Message(len) => {
                            frames.push((start, len));
                            start += len;
                        }
                        Frame::Invalid(why) => {
                            tracing::debug!("closing a connection from {}: {why}", c.remote);
                            failed = true;
                            break;
                        }
                    }
                }
                let from = Peer {
                    link: i as u32 + 1,
                    addr: c.remote,
                };
                for &(s, len) in &frames {
                    ua.on_message(now_us, from, &c.inbuf[s..s + len], out);
                }
                messages += frames.len();
                c.inbuf.drain(..start);
                failed |= c.close_when_flushed && c.outbuf.is_empty();
            }
            if failed {
                let had_output = self.conns[i].as_ref().is_some_and(|c| !c.outbuf.is_empty());
                self.errors += u64::from(had_output);
                self.close(i);
            }
        }
        messages
    }

    fn send(&mut self, out: &mut Vec<Transmit>) -> usize {
        let mut failed = 0;
        let mut touched = Vec::new();
        for (peer, data) in out.drain(..) {
            match self.conn_for(peer, &data) {
                Some(i) => {
                    if let Some(c) = self.conns[i].as_mut() {
                        c.outbuf.extend_from_slice(&data);
                        touched.push(i);
                    }
                }
                None => failed += 1,
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for i in touched {
            let ok = self.conns[i].as_mut().is_some_and(Self::flush);
            if !ok {
                failed += 1;
                self.errors += 1;
                self.close(i);
            }
        }
        failed
    }
}
