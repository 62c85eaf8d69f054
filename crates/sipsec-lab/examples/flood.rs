//! A SIP flooder for measuring `[flood]` limits: sends REGISTER, OPTIONS and INVITE requests
//! (each a new transaction) from one bound address to a server at a paced rate, in
//! `sendmmsg` batches each millisecond, for a given time, and reads nothing back (answers
//! pile up in its socket and are dropped by the kernel). With `--ports N` it sends from N
//! sockets of that address, so SO_REUSEPORT spreads the flood over the server's workers.
//!
//!     cargo build --release --example flood
//!     target/release/examples/flood --from 127.0.0.2 --to 127.0.0.1:5060 --rate 50000 --seconds 10
//!
//! Prints one line at the end: datagrams sent, the rate achieved, and how many the kernel
//! refused. `scripts/flood_bar.py` runs it beside `sipsec load`.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Distinct requests the flooder cycles through.
const DISTINCT: usize = 3 * 1024;

/// Datagrams one `sendmmsg` takes at most.
const BATCH: usize = 256;

struct Options {
    from: IpAddr,
    to: SocketAddr,
    rate: f64,
    seconds: f64,
    ports: usize,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        from: "127.0.0.2".parse().expect("an address"),
        to: "127.0.0.1:5060".parse().expect("an address"),
        rate: 50_000.0,
        seconds: 10.0,
        ports: 1,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let [key, value] = pair else {
            return Err(format!("{pair:?}: an option needs a value"));
        };
        let bad = || format!("{key} {value}: not a valid value");
        match key.as_str() {
            "--from" => o.from = value.parse().map_err(|_| bad())?,
            "--to" => o.to = value.parse().map_err(|_| bad())?,
            "--rate" => o.rate = value.parse().map_err(|_| bad())?,
            "--seconds" => o.seconds = value.parse().map_err(|_| bad())?,
            "--ports" => o.ports = value.parse().map_err(|_| bad())?,
            _ => return Err(format!("unknown option {key}")),
        }
    }
    if o.ports == 0 || o.rate <= 0.0 {
        return Err("--ports and --rate must be positive".into());
    }
    Ok(o)
}

/// The `n`th request: REGISTER, OPTIONS, INVITE in turn. OPTIONS and INVITE carry
/// Max-Forwards: 0, so what a server lets through it answers itself (483) instead of
/// forwarding it.
fn request(n: usize, from: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let method = ["REGISTER", "OPTIONS", "INVITE"][n % 3];
    let (uri, forwards) = match method {
        "REGISTER" => (format!("sip:{}", to.ip()), 70),
        _ => (format!("sip:flood{n}@{to}"), 0),
    };
    format!(
        "{method} {uri} SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bKfl{n}\r\n\
         Max-Forwards: {forwards}\r\nFrom: <sip:flood@{}>;tag=fl{n}\r\nTo: <sip:flood@{}>\r\n\
         Call-ID: flood-{n}@{from}\r\nCSeq: 1 {method}\r\nContact: <sip:flood@{from}>\r\n\
         Content-Length: 0\r\n\r\n",
        to.ip(),
        to.ip()
    )
    .into_bytes()
}

/// Sends `count` of `messages` (from `next` on, cyclically) in one `sendmmsg` on `socket`,
/// connected to the server; returns how many the kernel took.
fn send_batch(socket: &UdpSocket, messages: &[Vec<u8>], next: usize, count: usize) -> usize {
    let mut iovecs: Vec<libc::iovec> = (0..count)
        .map(|i| {
            let m = &messages[(next + i) % messages.len()];
            libc::iovec {
                iov_base: m.as_ptr() as *mut libc::c_void,
                iov_len: m.len(),
            }
        })
        .collect();
    let mut headers: Vec<libc::mmsghdr> = iovecs
        .iter_mut()
        .map(|iov| {
            // SAFETY: an all-zero msghdr is a valid empty one.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    // SAFETY: `headers` points at `iovecs`, which point at `messages`, all alive for the call.
    let sent = unsafe {
        libc::sendmmsg(
            socket.as_raw_fd(),
            headers.as_mut_ptr(),
            headers.len() as u32,
            libc::MSG_DONTWAIT,
        )
    };
    sent.max(0) as usize
}

fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("flood: {e}\nusage: flood [--from IP] [--to IP:PORT] [--rate N] [--seconds S] [--ports N]");
            std::process::exit(2);
        }
    };
    let sockets: Vec<UdpSocket> = (0..o.ports)
        .map(|_| {
            let s = UdpSocket::bind((o.from, 0)).expect("bind the flooding address");
            s.connect(o.to).expect("a server address");
            s
        })
        .collect();
    let per_socket: Vec<Vec<Vec<u8>>> = sockets
        .iter()
        .map(|s| {
            let from = s.local_addr().expect("a bound socket");
            (0..DISTINCT).map(|n| request(n, from, o.to)).collect()
        })
        .collect();
    let start = Instant::now();
    let length = Duration::from_secs_f64(o.seconds);
    let (mut due_sent, mut sent, mut refused) = (0usize, 0usize, 0usize);
    let mut turn = 0;
    while start.elapsed() < length {
        let due = (start.elapsed().as_secs_f64() * o.rate) as usize;
        while due_sent < due {
            let count = (due - due_sent).min(BATCH);
            let s = turn % sockets.len();
            let took = send_batch(&sockets[s], &per_socket[s], due_sent, count);
            sent += took;
            refused += count - took;
            due_sent += count;
            turn += 1;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "flood: sent {sent} datagrams in {elapsed:.2} s ({:.0}/s) from {} port(s) of {}; {refused} refused by the kernel",
        sent as f64 / elapsed,
        sockets.len(),
        o.from
    );
}
