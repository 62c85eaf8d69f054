//! `/metrics` scraped with a real HTTP client (curl) after a known load: the counts match what
//! `sipsec load` says it did, exactly; a scrape taken during load passes Python's
//! `prometheus_client` strict OpenMetrics parser; and the endpoint holds against a flood of
//! connections from one address, a scraper in a tight loop, and a server short of descriptors.

mod common;

use common::*;
use serde_json::Value;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// Scrapes `url` with curl: (HTTP status, body).
fn curl(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", url])
        .output()
        .expect("run curl");
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap(), body.to_string())
}

/// The samples of an exposition: `name{labels}` → value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[test]
#[cfg_attr(
    sipsec_skip_curl,
    ignore = "curl is not installed (apt-get install curl)"
)]
fn scraped_counts_match_the_load_generators_summary() {
    let dir = tempfile::tempdir().unwrap();
    let base = ports(21500);
    let (sip, uas_port, metrics) = (base, base + 1, base + 2);
    let uas = LoadUas::start(dir.path(), &format!("udp:127.0.0.3:{uas_port}"), &[]);
    let server = Server::start(
        dir.path(),
        &config(dir.path(), false, 2, Some(uas_port), sip, metrics),
    );
    let calls = 500;
    let (code, v, err) = load(
        dir.path(),
        &[
            &format!("udp:127.0.0.1:{sip}"),
            "--calls",
            &calls.to_string(),
            "--rate",
            "250",
        ],
    );
    assert_eq!(code, 0, "{v} {err}");
    // Exact counts need every message once: no retransmission on either side.
    assert_eq!(n(&v, "retransmissions"), 0, "{v}");
    assert_eq!(n(&v, "succeeded"), calls, "{v}");
    let uas = uas.finish();
    assert_eq!(n(&uas, "retransmissions"), 0, "{uas}");
    let url = format!("http://127.0.0.1:{metrics}/metrics");
    let (status, body) = curl(&url);
    assert_eq!(status, 200, "{body}");
    assert!(body.trim_end().ends_with("# EOF"), "OpenMetrics text");
    let s = samples(&body);
    let get = |k: &str| *s.get(k).unwrap_or_else(|| panic!("{k} missing:\n{body}"));
    let calls = calls as f64;
    for method in ["INVITE", "ACK", "BYE"] {
        assert_eq!(
            get(&format!("sipsec_requests_total{{method=\"{method}\"}}")),
            calls
        );
    }
    assert_eq!(get("sipsec_requests_total{method=\"REGISTER\"}"), 0.0);
    for method in ["INVITE", "BYE"] {
        let key = format!("sipsec_responses_total{{method=\"{method}\",class=\"2xx\"}}");
        assert_eq!(get(&key), calls);
    }
    assert_eq!(
        get("sipsec_local_responses_total{class=\"1xx\"}"),
        calls,
        "100 Trying"
    );
    assert_eq!(get("sipsec_dialogs_established_total"), calls);
    assert_eq!(get("sipsec_dialogs_ended_total"), calls);
    assert_eq!(get("sipsec_dialogs"), 0.0);
    assert_eq!(get("sipsec_invite_final_response_seconds_count"), calls);
    assert_eq!(get("sipsec_invite_first_response_seconds_count"), calls);
    assert_eq!(
        get("sipsec_invite_final_response_seconds_bucket{le=\"+Inf\"}"),
        calls
    );
    assert_eq!(get("sipsec_forwarded_requests_total"), 3.0 * calls);
    // Authentication and TLS are off: nothing is said about them.
    assert!(!body.contains("sipsec_auth_total"), "{body}");
    assert!(!body.contains("sipsec_tls_handshakes"), "{body}");
    assert!(s.contains_key("sipsec_worker_busy_ratio{worker=\"1\"}"));
    assert!(s.contains_key("sipsec_transactions"));
    // Only /metrics is served.
    assert_eq!(curl(&format!("http://127.0.0.1:{metrics}/")).0, 404);
    server.stop();
}

/// The endpoint has no authentication, so it must not be a way to starve the server: past
/// `MAX_CONNECTIONS` (16, from several addresses) a connection is closed at once, and one that sends half a request
/// is closed after `HEADER_TIMEOUT` (5 s), after which a scrape gets through again.
#[test]
#[cfg_attr(
    sipsec_skip_curl,
    ignore = "curl is not installed (apt-get install curl)"
)]
fn a_flood_of_half_requests_is_capped_and_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    let base = ports(21550);
    let (sip, metrics) = (base, base + 1);
    let server = Server::start(
        dir.path(),
        &config(dir.path(), false, 1, None, sip, metrics),
    );
    let started = Instant::now();
    // Four from each of five addresses: within the cap per address, past the cap in all.
    let held: Vec<TcpStream> = (0..20)
        .map(|i| {
            let from = format!("127.0.0.{}", 11 + i / 4);
            let mut c = connect_from(&from, metrics_addr(metrics)).unwrap();
            c.write_all(b"GET /metr").unwrap();
            c
        })
        .collect();
    let refused = held
        .iter()
        .filter(|c| closed_by_peer(c, Duration::from_millis(100)))
        .count();
    assert_eq!(refused, 4, "past the cap of 16");
    // The half requests are closed at the header timeout, not before and not much after.
    for c in &held {
        assert!(closed_by_peer(c, Duration::from_secs(10)));
    }
    let after = started.elapsed();
    assert!(
        (Duration::from_millis(4_500)..Duration::from_secs(8)).contains(&after),
        "{after:?}"
    );
    assert_eq!(curl(&format!("http://127.0.0.1:{metrics}/metrics")).0, 200);
    server.stop();
}

/// A server on UDP (and TCP with `tcp`) at 127.0.0.1:`sip` with `workers`, routing to a UAS
/// at 127.0.0.3:`uas` if given, serving /metrics at 127.0.0.1:`metrics`.
fn config(
    dir: &std::path::Path,
    tcp: bool,
    workers: usize,
    uas: Option<u16>,
    sip: u16,
    metrics: u16,
) -> String {
    let tcp = if tcp {
        format!(", \"tcp:127.0.0.1:{sip}\"")
    } else {
        String::new()
    };
    let route = uas
        .map(|p| format!("[routing]\ndefault_route = \"sip:127.0.0.3:{p}\"\n"))
        .unwrap_or_default();
    format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{sip}\"{tcp}]\nworkers = {workers}\n{route}\
         [metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\
         [database]\nurl = \"sqlite://{}\"\n",
        dir.join("m.db").display()
    )
}

fn metrics_addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A TCP connection to `to` from the loopback address `from` (127.0.0.0/8 is all ours).
fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    let local: SocketAddr = format!("{from}:0").parse().unwrap();
    s.bind(&local.into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(2))?;
    Ok(s.into())
}

/// One `GET /metrics` on a kept-alive connection: the status and body, or None if the
/// connection failed or was closed.
fn get_metrics(c: &mut TcpStream) -> Option<(u16, Vec<u8>)> {
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: sipsec\r\n\r\n")
        .ok()?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if c.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))?
        .trim()
        .parse()
        .ok()?;
    let mut body = vec![0u8; length];
    c.read_exact(&mut body).ok()?;
    Some((status, body))
}

/// One scrape on a new connection from `from`, within two seconds: whether it got a whole
/// exposition.
fn scrape_from(from: &str, metrics: u16) -> bool {
    let Ok(mut c) = connect_from(from, metrics_addr(metrics)) else {
        return false;
    };
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    get_metrics(&mut c).is_some_and(|(status, body)| status == 200 && body.ends_with(b"# EOF\n"))
}

/// `text` through Python's `prometheus_client` strict OpenMetrics parser
/// (`tests/openmetrics_strict.py`): its families by name, or a panic with the parser's error.
fn parse_strictly(text: &str) -> HashMap<String, Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openmetrics_strict.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run python3 (needed with prometheus_client: pip install prometheus-client)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the strict parser refused the scrape: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The value of the sample `name` with exactly `labels` in a parsed family.
fn sample(family: &Value, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    family["samples"].as_array()?.iter().find_map(|s| {
        let same = s[0] == name
            && s[1].as_object()?.len() == labels.len()
            && labels.iter().all(|(k, v)| s[1][*k] == *v);
        same.then(|| s[2].as_f64()).flatten()
    })
}

/// What the issue found Prometheus would refuse or misread: a scrape taken while calls are
/// running is parsed by a strict OpenMetrics parser (one family per name), the latency
/// histograms reach from 0.1 ms to past 10 s, the transaction gauge counts only transactions
/// in progress, and features that are off (authentication, TLS) export nothing.
#[test]
#[cfg_attr(
    sipsec_skip_curl,
    ignore = "curl is not installed (apt-get install curl)"
)]
#[cfg_attr(
    sipsec_skip_prometheus_client,
    ignore = "Python's prometheus_client is not installed (pip install prometheus-client)"
)]
fn a_scrape_during_load_passes_a_strict_openmetrics_parser() {
    let dir = tempfile::tempdir().unwrap();
    let base = ports(21600);
    let (sip, uas_port, metrics) = (base, base + 1, base + 2);
    let _uas = LoadUas::start(dir.path(), &format!("udp:127.0.0.3:{uas_port}"), &[]);
    let _server = Server::start(
        dir.path(),
        &config(dir.path(), false, 2, Some(uas_port), sip, metrics),
    );
    let url = format!("http://127.0.0.1:{metrics}/metrics");
    let calls = std::thread::spawn({
        let dir = dir.path().to_path_buf();
        move || {
            load(
                &dir,
                &[
                    &format!("udp:127.0.0.1:{sip}"),
                    "--calls",
                    "1500",
                    "--rate",
                    "500",
                ],
            )
        }
    });
    std::thread::sleep(Duration::from_millis(1500));
    let (status, during) = curl(&url);
    assert_eq!(status, 200);
    let (code, v, err) = calls.join().unwrap();
    assert_eq!(code, 0, "{v} {err}");
    let families = parse_strictly(&during);
    let calls_then = families["sipsec_requests"]["samples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s[1]["method"] == "INVITE")
        .and_then(|s| s[2].as_f64())
        .unwrap();
    assert!(
        (100.0..1500.0).contains(&calls_then),
        "taken during the load: {calls_then} INVITEs"
    );
    // Features that are off say nothing.
    for off in [
        "sipsec_auth",
        "sipsec_tls_handshakes",
        "sipsec_digest_checks",
        "sipsec_tls_client_certificates",
    ] {
        assert!(!families.contains_key(off), "{off} exported: {during}");
    }
    // Sub-millisecond to past 10 s, and the calls here mostly in the low buckets.
    for name in [
        "sipsec_invite_first_response_seconds",
        "sipsec_invite_final_response_seconds",
    ] {
        let h = &families[name];
        assert_eq!(h["type"], "histogram");
        let bounds: Vec<f64> = h["samples"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s[1]["le"].as_str()?.parse().ok())
            .collect();
        let finite = bounds.iter().filter(|b| b.is_finite());
        assert!(
            finite.clone().copied().fold(f64::MAX, f64::min) <= 0.0001,
            "{bounds:?}"
        );
        assert!(finite.copied().fold(0.0, f64::max) >= 10.0, "{bounds:?}");
        let under_5ms = sample(h, &format!("{name}_bucket"), &[("le", "0.0025")]).unwrap();
        assert!(under_5ms > 0.0, "{name}: none under 2.5 ms\n{during}");
    }
    // After the load: nothing is in progress, though finished transactions linger (32 s over
    // UDP) to absorb retransmissions. Gauges are refreshed every 100 ms; the exposition is
    // cached for 250 ms.
    std::thread::sleep(Duration::from_millis(600));
    let after = parse_strictly(&curl(&url).1);
    let gauge = |name: &str| sample(&after[name], name, &[]).unwrap();
    assert_eq!(after["sipsec_transactions"]["type"], "gauge");
    assert_eq!(gauge("sipsec_transactions"), 0.0);
    assert!(gauge("sipsec_transactions_lingering") > 0.0);
    assert_eq!(gauge("sipsec_dialogs"), 0.0);
}

/// The lock-out: 16 sockets from one address, reconnecting whenever they are closed,
/// took every slot of the endpoint (0 of 80 scrapes got through). With at most four
/// connections per address, scrapes from another address all get through.
#[test]
fn idle_sockets_from_one_address_leave_scrapes_from_another_through() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let base = ports(21650);
    let (sip, metrics) = (base, base + 1);
    let _server = Server::start(
        dir.path(),
        &config(dir.path(), false, 1, None, sip, metrics),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let holders: Vec<_> = (0..16)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut connects = 0;
                while !stop.load(Ordering::Relaxed) {
                    connects += 1;
                    if let Ok(c) = connect_from("127.0.0.5", metrics_addr(metrics)) {
                        // Idle until the server closes it (or the test ends).
                        while !stop.load(Ordering::Relaxed)
                            && !closed_by_peer(&c, Duration::from_millis(100))
                        {
                        }
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                connects
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let tries = 100;
    let got = (0..tries)
        .filter(|_| {
            std::thread::sleep(Duration::from_millis(30));
            scrape_from("127.0.0.1", metrics)
        })
        .count();
    stop.store(true, Ordering::Relaxed);
    let connects: usize = holders.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(
        connects > 16,
        "the holders reconnected ({connects} connects)"
    );
    assert!(
        got * 100 >= tries * 99,
        "{got} of {tries} scrapes got through"
    );
}

/// The burn: four keep-alive connections scraping as fast as they could took 70% of
/// a core. Answers are paced and the exposition cached, so the server's CPU while clients
/// scrape in a tight loop stays a few percent of a core (README's bar: 5%). The figure is
/// printed; the assertion is generous (CPU time, not wall time, and 4x the bar) so a loaded
/// machine cannot fail it, while the old 70% would.
#[test]
fn scraping_in_a_tight_loop_costs_the_server_little_cpu() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let base = ports(21700);
    let (sip, metrics) = (base, base + 1);
    let server = Server::start(
        dir.path(),
        &config(dir.path(), false, 2, None, sip, metrics),
    );
    let pid = server.child.id();
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let cpu_time = |pid| Duration::from_secs_f64(sipsec_lab::bench::cpu::cpu_of(&[pid]).total_s());
    let (cpu0, t0) = (cpu_time(pid), Instant::now());
    let scrapers: Vec<_> = (0..4)
        .map(|i| {
            let (stop, answered) = (stop.clone(), answered.clone());
            std::thread::spawn(move || {
                let from = format!("127.0.0.{}", 21 + i);
                let mut c = connect_from(&from, metrics_addr(metrics)).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    match get_metrics(&mut c) {
                        Some((200, _)) => answered.fetch_add(1, Ordering::Relaxed),
                        _ => break,
                    };
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for s in scrapers {
        s.join().unwrap();
    }
    let (cpu, wall) = (cpu_time(pid) - cpu0, t0.elapsed());
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    let answered = answered.load(Ordering::Relaxed);
    println!(
        "tight-loop scraping: {answered} scrapes in {wall:.1?} ({:.0}/s), server CPU {cpu:?} \
         = {:.1}% of a core",
        answered as f64 / wall.as_secs_f64(),
        share * 100.0
    );
    assert!(answered > 10, "the scrapers were served ({answered})");
    assert!(share < 0.20, "server CPU {:.1}% of a core", share * 100.0);
}

/// The descriptor exhaustion: `max_connections` (100,000 by default) above the open-
/// file limit let idle TCP connections take every descriptor, and then no call and no scrape
/// got through. Under `ulimit -n 512` the server lowers the cap (and says so), refuses the
/// idle flood from three addresses past it, and a TCP call and a scrape still succeed.
#[test]
#[cfg_attr(
    sipsec_skip_curl,
    ignore = "curl is not installed (apt-get install curl)"
)]
fn max_connections_follows_the_descriptor_limit() {
    let dir = tempfile::tempdir().unwrap();
    let base = ports(21750);
    let (sip, uas_port, metrics) = (base, base + 1, base + 2);
    let _uas = LoadUas::start(dir.path(), &format!("udp:127.0.0.3:{uas_port}"), &[]);
    let server = Server::start_with_fd_limit(
        dir.path(),
        &config(dir.path(), true, 1, Some(uas_port), sip, metrics),
        512,
    );
    assert!(
        server.log().contains("max_connections lowered from 100000"),
        "{}",
        server.log()
    );
    // 600 idle connections from three addresses: more than the server has descriptors.
    let sip_addr = SocketAddr::from(([127, 0, 0, 1], sip));
    let idle: Vec<TcpStream> = (0..600)
        .filter_map(|i| connect_from(&format!("127.0.0.{}", 31 + i % 3), sip_addr).ok())
        .collect();
    assert_eq!(idle.len(), 600, "the kernel took every connection");
    std::thread::sleep(Duration::from_millis(500));
    let (code, v, err) = load(
        dir.path(),
        &[
            &format!("127.0.0.1:{sip}"),
            "--transport",
            "tcp",
            "--calls",
            "5",
            "--rate",
            "10",
        ],
    );
    assert_eq!(code, 0, "{v} {err}\n{}", server.log());
    assert_eq!(n(&v, "succeeded"), 5, "{v}");
    let (status, body) = curl(&format!("http://127.0.0.1:{metrics}/metrics"));
    assert_eq!(status, 200, "{body}");
    let refused = samples(&body)["sipsec_connections_refused_total"];
    assert!(refused > 0.0, "{body}");
    drop(idle);
}
