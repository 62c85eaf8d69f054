//! Per-source flood limits (`[flood]`) on a real server over loopback: one address floods
//! REGISTER, OPTIONS and INVITE while `sipsec load` calls from another; the flooding address
//! is banned (its requests go unanswered, or get the configured code at a bounded rate), the
//! calls keep succeeding, the counters and `/metrics` show the ban, and it ends after `ban_s`.

mod common;

use common::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::time::{Duration, Instant};

/// Loopback addresses: the load's caller, the flooder, the load's callee.
const CALLER: &str = "127.0.0.1";
const FLOODER: &str = "127.0.0.2";
const CALLEE: &str = "127.0.0.3";

fn config(dir: &std::path::Path, sip: u16, uas: u16, metrics: u16, flood: &str) -> String {
    format!(
        "[server]\nlisten = [\"udp:{CALLER}:{sip}\"]\nworkers = 2\n\
         [routing]\ndefault_route = \"sip:{CALLEE}:{uas}\"\n\
         [metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\
         [database]\nurl = \"sqlite://{}\"\n\
         [flood]\nexempt = []\n{flood}",
        dir.join("flood.db").display()
    )
}

/// The `n`th flood request: REGISTER, OPTIONS and INVITE in turn, each a new transaction.
/// OPTIONS and INVITE carry Max-Forwards: 0, so the server answers them itself (483) and no
/// flood request reaches the load's callee.
fn flood_request(n: u64, to: &str, from: &std::net::SocketAddr) -> String {
    let method = ["REGISTER", "OPTIONS", "INVITE"][(n % 3) as usize];
    let (uri, forwards) = match method {
        "REGISTER" => ("sip:localhost".to_string(), 70),
        _ => (format!("sip:nobody@{to}"), 0),
    };
    format!(
        "{method} {uri} SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bKflood{n}\r\n\
         Max-Forwards: {forwards}\r\nFrom: <sip:flood@localhost>;tag=f{n}\r\n\
         To: <sip:flood@localhost>\r\nCall-ID: flood-{n}\r\nCSeq: {n} {method}\r\n\
         Contact: <sip:flood@{from}>\r\nContent-Length: 0\r\n\r\n"
    )
}

/// Sends flood requests from `socket` at about `rate` a second for `length`; returns how
/// many it sent.
fn flood(socket: &UdpSocket, to: &str, rate: u64, length: Duration) -> u64 {
    let from = socket.local_addr().unwrap();
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < length {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            // A full socket buffer drops the datagram, which a flood does not mind.
            let _ = socket.send_to(flood_request(sent, to, &from).as_bytes(), to);
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sent
}

/// Reads what `socket` has received until nothing comes for `quiet`: the status lines.
fn drain(socket: &UdpSocket, quiet: Duration) -> Vec<String> {
    socket.set_read_timeout(Some(quiet)).unwrap();
    let mut buf = [0u8; 4096];
    let mut lines = Vec::new();
    while let Ok(n) = socket.recv(&mut buf) {
        let text = String::from_utf8_lossy(&buf[..n]);
        lines.push(text.lines().next().unwrap_or_default().to_string());
    }
    lines
}

/// Whether an OPTIONS from `socket` is answered within `wait`.
fn answered(socket: &UdpSocket, to: &str, n: u64, wait: Duration) -> bool {
    drain(socket, Duration::from_millis(1));
    let from = socket.local_addr().unwrap();
    let probe = flood_request(n * 3 + 1, to, &from);
    socket.send_to(probe.as_bytes(), to).unwrap();
    !drain(socket, wait).is_empty()
}

/// The samples of the server's `/metrics`, by name and labels.
fn metrics(port: u16) -> HashMap<String, f64> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: sipsec\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    text.lines()
        .filter(|l| l.starts_with("sipsec_"))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_flooding_address_is_banned_while_calls_from_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let base = ports(20000);
    let (sip, uas_port, metrics_port) = (base, base + 1, base + 2);
    let to = format!("{CALLER}:{sip}");
    let ban_s = 3;
    let uas = LoadUas::start(dir.path(), &format!("udp:{CALLEE}:{uas_port}"), &[]);
    // The caller sends about 3 × 300 requests a second, the flood 15,000: one limit between.
    let server = Server::start_logged(
        dir.path(),
        &config(
            dir.path(),
            sip,
            uas_port,
            metrics_port,
            &format!("rate = 2000\nban_s = {ban_s}\n"),
        ),
    );
    let calls = 1200;
    let load = {
        let (dir, to) = (dir.path().to_path_buf(), to.clone());
        std::thread::spawn(move || {
            load(
                &dir,
                &[
                    &format!("udp:{to}"),
                    "--local",
                    CALLER,
                    "--calls",
                    &calls.to_string(),
                    "--rate",
                    "300",
                ],
            )
        })
    };
    let flooder = UdpSocket::bind((FLOODER, 0)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    let sent = flood(&flooder, &to, 15_000, Duration::from_millis(1500));
    let answers = drain(&flooder, Duration::from_millis(300));
    // Answered until the limit (a window's worth), silence after it.
    assert!(sent > 15_000, "the flood sent {sent}");
    assert!(
        (100..=2 * 2000 + 100).contains(&answers.len()),
        "{} of {sent} flood requests answered",
        answers.len()
    );
    assert!(!answered(
        &flooder,
        &to,
        1_000_000,
        Duration::from_millis(500)
    ));
    let during = metrics(metrics_port);
    assert_eq!(during["sipsec_flood_banned_sources"], 1.0, "{during:?}");
    assert_eq!(during["sipsec_flood_bans_total"], 1.0);
    let refused = during["sipsec_flood_refused_total"];
    assert!(refused >= (sent / 2) as f64, "{refused} of {sent} refused");
    // The ban ends after ban_s (it began within the flood's first half second).
    let mut probe = 1_000_001;
    while !answered(&flooder, &to, probe, Duration::from_millis(200)) {
        probe += 1;
        assert!(
            start.elapsed() < Duration::from_secs(ban_s + 3),
            "still refused after {:?}",
            start.elapsed()
        );
    }
    let unbanned = start.elapsed();
    assert!(
        unbanned >= Duration::from_secs(ban_s),
        "unbanned after {unbanned:?}"
    );
    assert_eq!(metrics(metrics_port)["sipsec_flood_banned_sources"], 0.0);
    let (code, v, err) = load.join().unwrap();
    assert_eq!(code, 0, "{v} {err}");
    let succeeded = n(&v, "succeeded");
    assert!(
        succeeded * 100 >= calls * 99,
        "{succeeded} of {calls} calls succeeded during the flood: {v}"
    );
    uas.finish();
    let log = server.log();
    let counters = server.stop_counters();
    assert_eq!(counters.get("flood_bans"), 1);
    assert!(
        log.contains(&format!("flood: {FLOODER} sent over 2000 requests")),
        "{log}"
    );
    assert!(log.contains(&format!("flood: {FLOODER} no longer refused")));
}

#[test]
fn refusals_can_be_answered_503_at_a_bounded_rate() {
    let dir = tempfile::tempdir().unwrap();
    let base = ports(20000);
    let (sip, metrics_port) = (base, base + 2);
    let to = format!("{CALLER}:{sip}");
    let _server = Server::start(
        dir.path(),
        &config(
            dir.path(),
            sip,
            base + 1,
            metrics_port,
            "rate = 100\nban_s = 60\naction = \"503\"\n",
        ),
    );
    let flooder = UdpSocket::bind((FLOODER, 0)).unwrap();
    flood(&flooder, &to, 2_000, Duration::from_millis(500));
    let lines = drain(&flooder, Duration::from_millis(300));
    let refused = lines
        .iter()
        .filter(|l| l.starts_with("SIP/2.0 503 "))
        .count();
    let other = lines.len() - refused;
    // About one window's worth handled, then 503s: at most 100 a second per worker, so
    // within this half second at most the first second's 100.
    assert!((80..=250).contains(&other), "{other} handled: {lines:?}");
    assert!(
        (50..=100).contains(&refused),
        "{refused} refused: {lines:?}"
    );
}

#[test]
fn requests_on_a_stream_are_limited_too() {
    let dir = tempfile::tempdir().unwrap();
    let base = ports(20000);
    let sip = base;
    let mut cfg = config(
        dir.path(),
        sip,
        base + 1,
        base + 2,
        "rate = 100\nban_s = 60\naction = \"403\"\n",
    );
    cfg = cfg.replace(
        &format!("listen = [\"udp:{CALLER}:{sip}\"]"),
        &format!("listen = [\"udp:{CALLER}:{sip}\", \"tcp:{CALLER}:{sip}\"]"),
    );
    let _server = Server::start(dir.path(), &cfg);
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(
        &format!("{FLOODER}:0")
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    s.connect(
        &format!("{CALLER}:{sip}")
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    let mut c: TcpStream = s.into();
    let from = c.local_addr().unwrap();
    let mut all = Vec::new();
    for n in 0..150 {
        // OPTIONS only (n * 3 + 1), over TCP.
        let request = flood_request(n * 3 + 1, &format!("{CALLER}:{sip}"), &from)
            .replace("SIP/2.0/UDP", "SIP/2.0/TCP");
        all.extend_from_slice(request.as_bytes());
    }
    c.write_all(&all).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(1000)))
        .unwrap();
    let mut text = Vec::new();
    let mut buf = [0u8; 65536];
    while let Ok(n) = c.read(&mut buf) {
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&text);
    let statuses: Vec<&str> = text.lines().filter(|l| l.starts_with("SIP/2.0 ")).collect();
    let forbidden = statuses
        .iter()
        .filter(|l| l.starts_with("SIP/2.0 403"))
        .count();
    // A window's worth (100) handled, the other 50 refused 403 on the same connection.
    assert_eq!(statuses.len(), 150, "{statuses:?}");
    assert_eq!(forbidden, 50, "{statuses:?}");
}
