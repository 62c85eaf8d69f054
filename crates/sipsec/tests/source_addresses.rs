//! `sipsec load --source-addresses`: a caller's connection per call comes from several
//! loopback addresses, as the lab's peak searches use it so one address's ephemeral ports
//! do not run out first. Seen from the other end: each connection's peer address, and the
//! Via of the request on it naming that address; and calls through `sipsec serve` over TCP
//! and TLS, with its connections per call onwards, all completing.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::io::Read;
use std::net::{IpAddr, TcpListener};
use std::time::{Duration, Instant};

/// Where the tests' server side listens: an address of 127.0.0.0/8 that no other test's
/// connections come from, so none of their ports (their ports 45000 up are in the ephemeral
/// range, where an outgoing connection from 127.0.0.1 may hold one) is ever taken here.
const HOST: &str = "127.0.2.1";

/// The first request's Via sent-by host on a connection, read for at most `wait`.
fn via_host(mut c: std::net::TcpStream, wait: Duration) -> Option<String> {
    c.set_read_timeout(Some(Duration::from_millis(100))).ok()?;
    let until = Instant::now() + wait;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(_) => {}
        }
        let text = String::from_utf8_lossy(&got);
        if let Some(line) = text.lines().find(|l| l.starts_with("Via: ")) {
            // Via: SIP/2.0/TCP 127.0.1.2:5060;branch=...
            let sent_by = line.split_whitespace().nth(2)?;
            let host = sent_by.split(';').next()?.rsplit_once(':')?.0;
            return Some(host.to_string());
        }
    }
    None
}

#[test]
fn per_call_connections_come_from_every_source_address_each_named_in_its_via() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(45000);
    // The target: a listener that notes where each connection comes from and what its
    // request's Via says, and answers nothing (the calls then fail; the connections are
    // what is checked).
    let listener = TcpListener::bind((HOST, port)).unwrap();
    let seen = std::thread::spawn(move || {
        listener.set_nonblocking(true).unwrap();
        let mut seen: Vec<(IpAddr, Option<String>)> = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        while seen.len() < 8 && Instant::now() < until {
            match listener.accept() {
                Ok((c, peer)) => {
                    c.set_nonblocking(false).unwrap();
                    seen.push((peer.ip(), via_host(c, Duration::from_secs(2))));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        seen
    });
    let target = format!("tcp:{HOST}:{port}");
    let run = load_printing(
        dir.path(),
        &[
            &target,
            "--connection",
            "per-call",
            "--local",
            "127.0.1.1",
            "--source-addresses",
            "4",
            "--calls",
            "8",
            "--rate",
            "20",
            "--drain-s",
            "1",
            "--quiet",
        ],
    );
    // Unanswered, every call fails (and the run says so in its exit code); each was tried.
    assert_eq!(n(&run.summary, "attempted"), 8, "{}", run.stderr);
    let seen = seen.join().unwrap();
    assert_eq!(seen.len(), 8, "{seen:?}\n{}", run.stderr);
    let mut by_address: BTreeMap<IpAddr, u32> = BTreeMap::new();
    for (peer, via) in &seen {
        *by_address.entry(*peer).or_default() += 1;
        assert_eq!(
            via.as_deref(),
            Some(peer.to_string().as_str()),
            "the Via names where the connection comes from: {seen:?}"
        );
    }
    // Round robin: two calls from each of 127.0.1.1 to 127.0.1.4.
    let expected: BTreeMap<IpAddr, u32> =
        (1..=4).map(|k| (IpAddr::from([127, 0, 1, k]), 2)).collect();
    assert_eq!(by_address, expected);

    // Several addresses are for a connection per call, not for UDP or one connection.
    for refused in [
        &["udp:127.0.0.1:9", "--source-addresses", "2", "--calls", "1"][..],
        &[&target, "--source-addresses", "2", "--calls", "1"][..],
    ] {
        let r = load_printing(dir.path(), refused);
        assert_ne!(r.code, 0, "{refused:?}");
        assert!(r.stderr.contains("--source-addresses"), "{}", r.stderr);
    }
}

#[test]
fn calls_from_several_addresses_complete_through_the_server_over_tcp_and_tls() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args(["certs", "--name", HOST, "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let f = |name: &str| dir.path().join(name).display().to_string();
    let (cert, key, ca) = (f("server.pem"), f("server-key.pem"), f("ca.pem"));
    let port = ports(45100);
    let calls = 40u64;
    for (i, transport) in ["tcp", "tls"].into_iter().enumerate() {
        let (listen_port, uas_port) = (port + 2 * i as u16, port + 2 * i as u16 + 1);
        // The address the certificate, the server's and the UAS's, is made for.
        let uas_addr = format!("{transport}:{HOST}:{uas_port}");
        let tls_files = tls_files(&cert, &key, &ca);
        let tls: &[&str] = if transport == "tls" { &tls_files } else { &[] };
        let uas = LoadUas::start(dir.path(), &uas_addr, tls);
        let mut config = format!(
            "[server]\nlisten = [\"{transport}:{HOST}:{listen_port}\"]\n\
             domains = [\"example.test\"]\nworkers = 2\noutbound_connections = \"per-call\"\n\
             [routing]\ndefault_route = \"sip:{HOST}:{uas_port};transport={transport}\"\n\
             [database]\nurl = \"sqlite://{}\"\n",
            dir.path().join(format!("s{i}.db")).display()
        );
        if transport == "tls" {
            config += &format!("[tls]\ncert = \"{cert}\"\nkey = \"{key}\"\nca = \"{ca}\"\n");
        }
        let server = Server::start_logged(dir.path(), &config);
        let target = format!("{transport}:{HOST}:{listen_port}");
        let mut args = vec![
            target.as_str(),
            "--connection",
            "per-call",
            "--local",
            "127.0.1.1",
            "--source-addresses",
            "5",
            "--calls",
            "40",
            "--rate",
            "40",
        ];
        if transport == "tls" {
            args.extend(["--tls-ca", &ca]);
        }
        let run = load(dir.path(), &args);
        assert_all_succeeded(&run, calls, transport, &server);
        let c = server.stop_counters();
        assert_eq!(c.get("connections_accepted"), calls, "{transport}: {c:?}");
        assert_eq!(c.get("connections_opened"), calls, "{transport}: {c:?}");
        let uas = uas.finish();
        assert_eq!(n(&uas, "uas_completed"), calls, "{transport}: {uas}");
    }
}
