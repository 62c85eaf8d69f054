//! `sipsec serve` over TCP and TLS, end to end: real SIPp over TCP (one connection, and one
//! per call), `sipsec load` through all four connection modes of seed 000 over TLS (with
//! mutual authentication and resumption), and hostile peers — garbage, failed handshakes,
//! missing and untrusted client certificates, slowloris, floods of idle connections — each
//! refused or timed out and counted while real calls keep flowing.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// A server config: `listen` addresses, `[server]` extras, a default route, and `[tls]` with
/// the certificates in `dir` when `tls` holds extra `[tls]` lines.
fn config(dir: &Path, listen: &[String], server: &str, route: &str, tls: Option<&str>) -> String {
    let listen: Vec<String> = listen.iter().map(|l| format!("\"{l}\"")).collect();
    let mut text = format!(
        "[server]\nlisten = [{}]\ndomains = [\"example.test\"]\nworkers = 2\n{server}\n\
[routing]\ndefault_route = \"{route}\"\n[database]\nurl = \"sqlite://{}\"\n",
        listen.join(", "),
        dir.join("s.db").display()
    );
    if let Some(extra) = tls {
        let p = |f: &str| dir.join(f).display().to_string();
        text += &format!(
            "[tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n{extra}\n",
            p("server.pem"),
            p("server-key.pem"),
            p("ca.pem")
        );
    }
    text
}

fn sipp_tcp_calls(dir: &Path, port: u16, mode: &str, calls: u32) -> SippResult {
    let uac = bench_sipp("uac.xml");
    let calls = calls.to_string();
    let local_port = (port + 2).to_string();
    sipp_client(
        dir,
        &format!("127.0.0.1:{port}"),
        &[
            "-sf",
            uac.to_str().unwrap(),
            "-s",
            "bench",
            "-i",
            "127.0.0.2",
            "-p",
            &local_port,
            "-t",
            mode,
            "-max_socket",
            "1000",
            "-r",
            "100",
            "-m",
            &calls,
        ],
    )
}

/// SIPp calls over TCP through sipsec to a SIPp callee over TCP, with the proxy's outbound
/// connections in `outbound` mode: first on one connection (`-t t1`), then one per call
/// (`-t tn`).
fn sipp_over_tcp(outbound: &str) {
    if !have_sipp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = ports(29000) + if outbound == "persistent" { 0 } else { 5 };
    let uas_port = port + 1;
    let _uas = sipp_uas_with(
        "127.0.0.3",
        uas_port,
        &[
            "-sf",
            bench_sipp("uas.xml").to_str().unwrap(),
            "-t",
            "t1",
            "-max_socket",
            "1000",
        ],
    );
    let server = Server::start_logged(
        dir.path(),
        &config(
            dir.path(),
            &[format!("tcp:127.0.0.1:{port}")],
            &format!("outbound_connections = \"{outbound}\""),
            &format!("sip:127.0.0.3:{uas_port};transport=tcp"),
            None,
        ),
    );
    for (mode, calls) in [("t1", 200), ("tn", 200)] {
        let r = sipp_tcp_calls(dir.path(), port, mode, calls);
        assert_eq!(
            (r.successful, r.failed, r.exit),
            (calls as u64, 0, 0),
            "SIPp -t {mode}, outbound {outbound}: {r:?}\n{}",
            server.log()
        );
    }
    let c = server.stop_counters();
    // One connection from SIPp in t1 mode, then one per call in tn mode.
    assert_eq!(c.get("connections_accepted"), 1 + 200, "{c:?}");
    let opened = c.get("connections_opened");
    if outbound == "persistent" {
        assert!((1..=2).contains(&opened), "one per worker at most: {c:?}");
    } else {
        assert_eq!(opened, 400, "one per call: {c:?}");
    }
    assert_eq!(c.get("connection_errors"), 0, "{c:?}");
    assert_eq!(
        c.get("forwarded_requests"),
        3 * 400,
        "INVITE, ACK, BYE: {c:?}"
    );
}

#[test]
#[cfg_attr(
    sipsec_skip_sipp,
    ignore = "SIPp is not installed (apt-get install sip-tester)"
)]
fn sipp_calls_over_tcp_with_reused_outbound_connections() {
    sipp_over_tcp("persistent");
}

#[test]
#[cfg_attr(
    sipsec_skip_sipp,
    ignore = "SIPp is not installed (apt-get install sip-tester)"
)]
fn sipp_calls_over_tcp_with_a_connection_per_call() {
    sipp_over_tcp("per-call");
}

/// One seed-000 mode: how the caller connects and how the proxy connects onwards.
struct Mode {
    name: &'static str,
    caller: &'static str,
    outbound: &'static str,
    mutual: bool,
}

#[test]
fn the_four_seed_000_modes_over_tls_with_sipsec_load() {
    let dir = tempfile::tempdir().unwrap();
    let f = make_certs(dir.path());
    let port = ports(29100);
    let uas_addr = format!("tls:127.0.0.1:{}", port + 1);
    let (cert, key, ca) = (f("server.pem"), f("server-key.pem"), f("ca.pem"));
    // The callee demands client certificates, so the proxy must present its own.
    let uas = LoadUas::start(
        dir.path(),
        &uas_addr,
        &[
            &tls_files(&cert, &key, &ca)[..],
            &["--tls-client-auth", "optional"],
        ]
        .concat(),
    );
    let modes = [
        Mode {
            name: "chain",
            caller: "persistent",
            outbound: "persistent",
            mutual: false,
        },
        Mode {
            name: "outbound",
            caller: "per-call",
            outbound: "persistent",
            mutual: false,
        },
        Mode {
            name: "inbound",
            caller: "persistent",
            outbound: "per-call",
            mutual: false,
        },
        Mode {
            name: "local",
            caller: "per-call",
            outbound: "per-call",
            mutual: false,
        },
        Mode {
            name: "local, mutual TLS",
            caller: "per-call",
            outbound: "per-call",
            mutual: true,
        },
    ];
    let calls = 80u64;
    for (i, m) in modes.iter().enumerate() {
        let listen = format!("tls:127.0.0.1:{}", port + 2 + i as u16);
        let client_auth = if m.mutual { "required" } else { "none" };
        let server = Server::start_logged(
            dir.path(),
            &config(
                dir.path(),
                std::slice::from_ref(&listen),
                &format!("outbound_connections = \"{}\"", m.outbound),
                &format!("sip:{};transport=tls", &uas_addr[4..]),
                Some(&format!("client_auth = \"{client_auth}\"")),
            ),
        );
        let mut args = vec![
            listen.as_str(),
            "--tls-ca",
            &ca,
            "--connection",
            m.caller,
            "--calls",
            "80",
            "--rate",
            "100",
        ];
        if m.mutual {
            args.extend(["--tls-cert", &cert, "--tls-key", &key]);
        }
        let (code, v, err) = load(dir.path(), &args);
        assert_eq!(
            (code, n(&v, "succeeded")),
            (0, calls),
            "{}: {err}\n{v}\n{}",
            m.name,
            server.log()
        );
        let c = server.stop_counters();
        let accepted = c.get("connections_accepted");
        let opened = c.get("connections_opened");
        match m.caller {
            "persistent" => assert_eq!(accepted, 1, "{}: {c:?}", m.name),
            _ => assert_eq!(accepted, calls, "{}: {c:?}", m.name),
        }
        match m.outbound {
            "persistent" => assert!((1..=2).contains(&opened), "{}: {c:?}", m.name),
            _ => assert_eq!(opened, calls, "{}: {c:?}", m.name),
        }
        let (full, resumed) = (
            c.get("tls_handshakes_full"),
            c.get("tls_handshakes_resumed"),
        );
        assert_eq!(
            full + resumed,
            accepted + opened,
            "{}: one handshake per connection: {c:?}",
            m.name
        );
        // By side: each connection accepted ended one handshake as the TLS server, each
        // opened one as the client, and the sides add up to the totals.
        let [fa, fo, ra, ro] = [
            "full_accepted",
            "full_opened",
            "resumed_accepted",
            "resumed_opened",
        ]
        .map(|k| c.get(&format!("tls_handshakes_{k}")));
        assert_eq!(
            (fa + ra, fo + ro, fa + fo, ra + ro),
            (accepted, opened, full, resumed),
            "{}: handshakes by side: {c:?}",
            m.name
        );
        if m.caller == "per-call" || m.outbound == "per-call" {
            // Resumption is on by default on both sides; a few early calls handshake in
            // full before the first ticket is back.
            assert!(resumed >= calls / 2, "{}: {c:?}", m.name);
        }
        assert_eq!(c.get("tls_failures"), 0, "{}: {c:?}", m.name);
    }
    let u = uas.finish();
    assert_eq!(n(&u, "uas_answered"), calls * modes.len() as u64, "{u}");
}

/// A TCP connection to `to` from the address `ip`.
fn connect_from(ip: &str, to: &str) -> Option<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    let from: std::net::SocketAddr = format!("{ip}:0").parse().unwrap();
    socket.bind(&from.into()).ok()?;
    let to: std::net::SocketAddr = to.parse().unwrap();
    socket.connect(&to.into()).ok()?;
    Some(socket.into())
}

/// Reads until the peer closes; the time it took, or None if it stayed open past `limit`.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    stream
        .set_read_timeout(Some(limit.min(Duration::from_millis(100))))
        .unwrap();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match stream.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}

#[test]
fn hostile_peers_are_refused_or_timed_out_and_counted_while_calls_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let f = make_certs(dir.path());
    let other = tempfile::tempdir().unwrap();
    let g = make_certs(other.path());
    let port = ports(29200);
    let (tcp, tls) = (
        format!("tcp:127.0.0.1:{port}"),
        format!("tls:127.0.0.1:{}", port + 1),
    );
    let uas_addr = format!("tcp:127.0.0.1:{}", port + 2);
    let uas = LoadUas::start(dir.path(), &uas_addr, &[]);
    let server = Server::start_logged(
        dir.path(),
        &config(
            dir.path(),
            &[tcp.clone(), tls.clone()],
            // max_connections fits this machine's descriptor limit, so the per-address limit holds as written.
            "message_timeout_ms = 500\nidle_timeout_s = 2\nmax_connections_per_ip = 1500\nmax_connections = 10000",
            &format!("sip:{};transport=tcp", &uas_addr[4..]),
            Some("client_auth = \"required\""),
        ),
    );
    let tcp_addr = &tcp[4..];
    let tls_addr = &tls[4..];

    // A keep-alive ping is answered with a pong (RFC 5626).
    let mut ping = TcpStream::connect(tcp_addr).unwrap();
    ping.write_all(b"\r\n\r\n").unwrap();
    ping.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut pong = [0u8; 2];
    ping.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"\r\n");

    // Garbage on the TLS port: the connection is closed at once.
    let mut garbage = TcpStream::connect(tls_addr).unwrap();
    garbage.write_all(b"OPTIONS sip:x SIP/2.0\r\n\r\n").unwrap();
    assert!(closed_within(&mut garbage, Duration::from_secs(2)).is_some());
    // Bytes that are not SIP framing on the TCP port: closed too.
    let mut unframed = TcpStream::connect(tcp_addr).unwrap();
    unframed
        .write_all(b"OPTIONS sip:x SIP/2.0\r\nVia: x\r\n\r\n")
        .unwrap();
    assert!(closed_within(&mut unframed, Duration::from_secs(2)).is_some());
    // A message over max_message_size (a header of 20 kB, and a body too long) is answered
    // 513, as over UDP, before the connection closes.
    for (header, body_len) in [
        ("X-Pad: ".to_string() + &"a".repeat(20_000), 0),
        (String::new(), 40_000),
    ] {
        let mut big = TcpStream::connect(tcp_addr).unwrap();
        let head = format!(
            "OPTIONS sip:x@example.test SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bKbig\r\n\
From: <sip:a@example.test>;tag=1\r\nTo: <sip:x@example.test>\r\nCall-ID: big\r\nCSeq: 1 OPTIONS\r\n\
Max-Forwards: 70\r\n{header}{}Content-Length: {body_len}\r\n\r\n",
            if header.is_empty() { "" } else { "\r\n" }
        );
        let _ = big.write_all(head.as_bytes());
        big.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut answer = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(&big), &mut answer);
        assert!(answer.starts_with("SIP/2.0 513"), "{answer:?}");
        assert!(closed_within(&mut big, Duration::from_secs(2)).is_some());
    }

    // A request followed in the same segment by bytes that are not SIP framing: the request
    // is answered on that connection before it closes for the bytes after it.
    let mut last_words = TcpStream::connect(tcp_addr).unwrap();
    last_words
        .write_all(
            b"OPTIONS sip:example.test SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bKlast\r\n\
From: <sip:a@example.test>;tag=1\r\nTo: <sip:example.test>\r\nCall-ID: last\r\nCSeq: 1 OPTIONS\r\n\
Max-Forwards: 70\r\nContent-Length: 0\r\n\r\nOPTIONS sip:x SIP/2.0\r\nVia: x\r\n\r\n",
        )
        .unwrap();
    last_words
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut answer = String::new();
    let closed = last_words.read_to_string(&mut answer);
    assert!(answer.starts_with("SIP/2.0 200"), "{answer:?}");
    assert!(closed.is_ok(), "not closed after the answer: {closed:?}");

    // Slowloris: half a message, and a TLS connection that never says hello. Both are closed
    // after message_timeout_ms, not after the idle timeout.
    let mut half = TcpStream::connect(tcp_addr).unwrap();
    half.write_all(b"INVITE sip:bob@example.test SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.9")
        .unwrap();
    let mut silent = TcpStream::connect(tls_addr).unwrap();
    let (t_half, t_silent) = (
        closed_within(&mut half, Duration::from_secs(3)),
        closed_within(&mut silent, Duration::from_secs(3)),
    );
    assert!(
        t_half.is_some() && t_silent.is_some(),
        "{t_half:?} {t_silent:?}"
    );

    // TLS clients that fail: no client certificate, a certificate from another CA, and a
    // client that does not trust the server.
    let tls_call = |extra: &[&str]| {
        let mut args = vec![
            tls.as_str(),
            "--calls",
            "3",
            "--rate",
            "50",
            "--drain-s",
            "1",
        ];
        args.extend_from_slice(extra);
        let (_, v, _) = load(dir.path(), &args);
        n(&v, "succeeded")
    };
    let (ca, cert, key) = (f("ca.pem"), f("client.pem"), f("client-key.pem"));
    assert_eq!(tls_call(&["--tls-ca", &ca]), 0, "no client certificate");
    let (other_cert, other_key) = (g("client.pem"), g("client-key.pem"));
    assert_eq!(
        tls_call(&[
            "--tls-ca",
            &ca,
            "--tls-cert",
            &other_cert,
            "--tls-key",
            &other_key
        ]),
        0,
        "a client certificate from another CA"
    );
    assert_eq!(
        tls_call(&[
            "--tls-ca",
            &g("ca.pem"),
            "--tls-cert",
            &cert,
            "--tls-key",
            &key
        ]),
        0,
        "a client that does not trust the server"
    );

    // A flood of idle connections from one host (127.0.0.5), more than
    // max_connections_per_ip (1500, 750 per worker), held open while real calls from
    // another host run over TCP and TLS.
    sipsec_transport::net::raise_fd_limit();
    let flood: Vec<TcpStream> = (0..2000)
        .filter_map(|_| connect_from("127.0.0.5", tcp_addr))
        .collect();
    assert!(flood.len() > 1500, "{}", flood.len());
    for (addr, extra) in [
        (tcp.as_str(), vec![]),
        (
            tls.as_str(),
            vec!["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
        ),
    ] {
        let mut args = vec![addr, "--calls", "100", "--rate", "100"];
        args.extend(extra.iter().copied());
        let (code, v, err) = load(dir.path(), &args);
        assert_eq!(
            (code, n(&v, "succeeded")),
            (0, 100),
            "{addr}: {err}\n{v}\n{}",
            server.log()
        );
    }
    // Past the idle timeout (2 s) the server closes the flood's connections; a loaded
    // machine may take a little longer to get round to it, so allow until 5 s.
    std::thread::sleep(Duration::from_millis(2000));
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut flood = flood;
    let still_open = flood
        .iter_mut()
        .map(|s| {
            let left = deadline.saturating_duration_since(Instant::now());
            closed_within(s, left.max(Duration::from_millis(1)))
        })
        .filter(Option::is_none)
        .count();
    assert_eq!(still_open, 0);
    drop(flood);
    let log = server.log();
    let c = server.stop_counters();
    assert!(c.get("framing_errors") >= 1, "{c:?}");
    assert!(c.get("message_timeouts") >= 2, "{c:?}");
    // Garbage, three failed handshakes.
    assert!(c.get("tls_failures") >= 4, "{c:?}");
    assert!(c.get("connections_refused") >= 400, "{c:?}");
    assert!(c.get("idle_closed") >= 1000, "{c:?}");
    // Logged without flooding: a bounded number of lines for hundreds of refusals.
    let refusal_lines = log.lines().filter(|l| l.contains("refused a tcp")).count();
    assert!(
        (1..=40).contains(&refusal_lines),
        "{refusal_lines} refusal lines"
    );
    let u = uas.finish();
    assert_eq!(n(&u, "uas_answered"), 200, "{u}");
}

/// Peers that send requests and never read the answers (an attacker's way to make the server
/// queue without limit): one that sent enough to fill the socket's buffers and stopped is
/// closed once the socket has taken nothing for `message_timeout_ms`; one that goes on
/// sending is closed once its queue passes its ceiling (`MAX_QUEUED`); both are counted, and a
/// peer that reads is answered as before. Without the limits such a connection stayed open
/// for as long as it kept sending (17 million OPTIONS over a minute, their answers queued).
#[test]
fn peers_that_never_read_their_answers_are_closed_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(29500);
    let tcp = format!("tcp:127.0.0.1:{port}");
    let server = Server::start_logged(
        dir.path(),
        &config(
            dir.path(),
            std::slice::from_ref(&tcp),
            "message_timeout_ms = 500\nidle_timeout_s = 60",
            "sip:127.0.0.3:9;transport=tcp",
            None,
        ),
    );
    let addr = &tcp[4..];
    let options = |i: u64| {
        format!(
            "OPTIONS sip:example.test SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bKdeaf{i}\r\n\
From: <sip:a@example.test>;tag=1\r\nTo: <sip:example.test>\r\nCall-ID: deaf{i}\r\nCSeq: 1 OPTIONS\r\n\
Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
        )
    };
    // A small receive buffer, never read: the server's answers fill it and the server's send
    // buffer, then wait in the server's queue. The server reads on while it cannot write, so
    // a write blocks only for moments; one that blocks for seconds means it stopped reading.
    let deaf = || {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let to: std::net::SocketAddr = addr.parse().unwrap();
        socket.connect(&to.into()).unwrap();
        let c: TcpStream = socket.into();
        c.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        c
    };
    // Sends OPTIONS from `first` in batches of 100 until `until` are sent or the server
    // closes the connection (then the time it took).
    let send = |c: &mut TcpStream, first: u64, until: u64| -> (u64, Option<Duration>) {
        let start = Instant::now();
        let mut sent = first;
        let mut batch = String::new();
        while sent < until && start.elapsed() < Duration::from_secs(20) {
            batch.clear();
            for _ in 0..100 {
                batch += &options(sent);
                sent += 1;
            }
            match c.write_all(batch.as_bytes()) {
                Ok(()) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    panic!(
                        "the server stopped reading after {sent} OPTIONS\n{}",
                        server.log()
                    )
                }
                Err(_) => return (sent, Some(start.elapsed())),
            }
        }
        (sent, None)
    };

    // 30,000 OPTIONS (some 10 MB of answers: more than the kernel's buffers, less than the
    // ceiling), then silence: closed for taking nothing.
    let mut stopped = deaf();
    let (sent, closed) = send(&mut stopped, 0, 30_000);
    assert_eq!(closed, None, "closed while sending: {}", server.log());
    let timed_out = "it took nothing sent to it in time";
    let deadline = Instant::now() + Duration::from_secs(5);
    while !server.log().contains(timed_out) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        server.log().contains(timed_out),
        "{sent} sent:\n{}",
        server.log()
    );

    // OPTIONS for as long as the connection takes them: closed at the ceiling.
    let mut flooding = deaf();
    let (sent, closed) = send(&mut flooding, sent, u64::MAX);
    let closed = closed.unwrap_or_else(|| {
        panic!(
            "still open after {sent} OPTIONS never read\n{}",
            server.log()
        )
    });
    assert!(
        server.log().contains("passed MAX_QUEUED"),
        "closed after {closed:?}:\n{}",
        server.log()
    );

    // A peer that reads is answered as ever.
    let mut reader = TcpStream::connect(addr).unwrap();
    reader.write_all(options(u64::MAX).as_bytes()).unwrap();
    reader
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut answer = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&reader), &mut answer).unwrap();
    assert!(answer.starts_with("SIP/2.0 200"), "{answer:?}");
    let c = server.stop_counters();
    assert!(c.get("send_stalls") >= 2, "{c:?}");
    drop((stopped, flooding));
}

#[test]
fn a_next_hop_that_refuses_the_connection_or_the_handshake_fails_at_once_with_503() {
    let dir = tempfile::tempdir().unwrap();
    let _ = make_certs(dir.path());
    let port = ports(29600);
    // Nothing listens at port+3 (refused); at port+4 a TCP listener that closes every
    // connection at once (the TLS handshake fails).
    let closer = std::net::TcpListener::bind(format!("127.0.0.1:{}", port + 4)).unwrap();
    std::thread::spawn(move || {
        for stream in closer.incoming() {
            drop(stream);
        }
    });
    for (route, what) in [
        (
            format!("sip:127.0.0.1:{};transport=tcp", port + 3),
            "refused",
        ),
        (
            format!("sip:127.0.0.1:{};transport=tls", port + 4),
            "handshake",
        ),
    ] {
        let listen = [
            format!("udp:127.0.0.1:{port}"),
            format!("tcp:127.0.0.1:{}", port + 1),
            format!("tls:127.0.0.1:{}", port + 2),
        ];
        let server = Server::start_logged(
            dir.path(),
            &config(
                dir.path(),
                &listen,
                "",
                &route,
                Some("verify_server = false"),
            ),
        );
        let caller = Endpoint::bind("127.0.0.1:0");
        let started = Instant::now();
        caller.send(
            &format!("127.0.0.1:{port}"),
            &format!(
                "INVITE sip:x@elsewhere.test SIP/2.0\r\nVia: SIP/2.0/UDP {};branch=z9hG4bKte{port}\r\n\
Max-Forwards: 70\r\nFrom: <sip:a@example.test>;tag=1\r\nTo: <sip:x@elsewhere.test>\r\n\
Call-ID: te-{what}\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n",
                caller.addr
            ),
        );
        let answer = caller.recv_until("SIP/2.0 5");
        assert!(answer.starts_with("SIP/2.0 503"), "{what}: {answer}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{what}: answered after {:?}",
            started.elapsed()
        );
        let log = server.log();
        let c = server.stop_counters();
        assert_eq!(c.get("transport_errors"), 1, "{what}: {c:?}");
        assert!(log.contains("cannot deliver INVITE"), "{what}: {log}");
    }
}

/// Framing across transports: a datagram whose body has no Content-Length reaches a TCP next
/// hop with one (without it, the next hop closes the shared connection or runs the body as a
/// second, smuggled request), and a request with two Content-Lengths on TCP is answered 400
/// and its connection closed (nothing after it can be framed with confidence).
#[test]
fn stream_framing_is_never_left_to_guesswork() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(29300);
    let next_hop = std::net::TcpListener::bind(("127.0.0.1", port + 2)).unwrap();
    let (udp, tcp) = (
        format!("udp:127.0.0.1:{port}"),
        format!("tcp:127.0.0.1:{port}"),
    );
    let _server = Server::start(
        dir.path(),
        &config(
            dir.path(),
            &[udp, tcp.clone()],
            "",
            &format!("sip:127.0.0.1:{};transport=tcp", port + 2),
            None,
        ),
    );
    let smuggled = "OPTIONS sip:victim@example.test SIP/2.0\r\nVia: SIP/2.0/TCP 10.9.9.9\r\n\r\n";
    let caller = Endpoint::bind("127.0.0.1:0");
    caller.send(
        &format!("127.0.0.1:{port}"),
        &format!(
            "MESSAGE sip:bob@elsewhere.test SIP/2.0\r\nVia: SIP/2.0/UDP {};branch=z9hG4bKnocl\r\n\
From: <sip:a@example.test>;tag=1\r\nTo: <sip:bob@elsewhere.test>\r\nCall-ID: nocl\r\n\
CSeq: 1 MESSAGE\r\nMax-Forwards: 70\r\nContent-Type: text/plain\r\n\r\n{smuggled}",
            caller.addr
        ),
    );
    next_hop.set_nonblocking(false).unwrap();
    let (mut conn, _) = next_hop.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got
        .windows(smuggled.len())
        .any(|w| w == smuggled.as_bytes())
    {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let head = &text[..text.find("\r\n\r\n").unwrap()];
    assert!(
        head.lines()
            .any(|l| l == format!("Content-Length: {}", smuggled.len())),
        "forwarded onto TCP without the body's Content-Length:\n{text}"
    );

    // Two Content-Lengths (equal or not): 400, then the connection closes.
    for (first, second) in [(0, 0), (0, 40)] {
        let mut c = TcpStream::connect(&tcp[4..]).unwrap();
        c.write_all(
            format!(
                "OPTIONS sip:example.test SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bKdup\r\n\
From: <sip:a@example.test>;tag=1\r\nTo: <sip:example.test>\r\nCall-ID: dup\r\nCSeq: 1 OPTIONS\r\n\
Max-Forwards: 70\r\nContent-Length: {first}\r\nContent-Length: {second}\r\n\r\n{smuggled}"
            )
            .as_bytes(),
        )
        .unwrap();
        c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut answer = String::new();
        let closed = c.read_to_string(&mut answer);
        assert!(answer.starts_with("SIP/2.0 400"), "{answer:?}");
        assert_eq!(answer.matches("SIP/2.0 ").count(), 1, "{answer:?}");
        assert!(closed.is_ok(), "not closed after the 400: {closed:?}");
    }
}
