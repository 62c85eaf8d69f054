//! The registrar floor: answers every REGISTER 200 OK (and every INVITE 302, with a fixed
//! Contact; an ACK not at all) with nothing but the lines a client needs to match it (Via,
//! From, To, Call-ID, CSeq copied as they came) and remembers nothing. One blocking
//! `recv_from` per message and one `send_to` per answer, as Kamailio's UDP worker does: the
//! kernel and wake-up cost any UDP registrar or redirect server pays, and almost nothing else.
//! A server's CPU per operation minus this, under the same load, is the work it adds.
//!
//!     cargo build --release --example register_floor
//!     taskset -c 0 target/release/examples/register_floor 127.0.0.1:35060
//!
//! `scripts/registrar.py` measures it beside sipsec and Kamailio.

use std::net::UdpSocket;

fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:35060".into());
    let socket = UdpSocket::bind(&addr)?;
    let mut buf = vec![0u8; 65_536];
    let mut out = Vec::with_capacity(2048);
    loop {
        let (len, peer) = socket.recv_from(&mut buf)?;
        let request = &buf[..len];
        out.clear();
        if request.starts_with(b"ACK ") {
            continue;
        } else if request.starts_with(b"INVITE ") {
            out.extend_from_slice(
                b"SIP/2.0 302 Moved Temporarily\r\nContact: <sip:floor@127.0.0.9>\r\n",
            );
        } else {
            out.extend_from_slice(b"SIP/2.0 200 OK\r\n");
        }
        for line in request.split(|b| *b == b'\n').skip(1) {
            let name = line.split(|b| *b == b':').next().unwrap_or_default();
            if [&b"Via"[..], b"From", b"To", b"Call-ID", b"CSeq"]
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name))
            {
                out.extend_from_slice(line);
                out.push(b'\n');
            }
        }
        out.extend_from_slice(b"Content-Length: 0\r\n\r\n");
        let _ = socket.send_to(&out, peer);
    }
}
