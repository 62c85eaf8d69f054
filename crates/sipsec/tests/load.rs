//! `sipsec load` end to end: the real binary against real SIPp in both directions, through
//! a real `sipsec serve` (proxy, registrar, redirect server), with digest checked by SIPp's
//! own implementation, and its JSON summary read back.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;

/// Every key the issue promises, with sane values.
fn assert_summary_shape(v: &Value) {
    for key in ["attempted", "succeeded", "failed", "retransmissions"] {
        n(v, key);
    }
    assert!(v["failures_by_reason"].is_object(), "{v}");
    assert!(v["throughput_per_s"].as_f64().unwrap() >= 0.0);
    let lat = &v["latency_ms"];
    let (p50, p90, p99, max) = (
        lat["p50"].as_f64().unwrap(),
        lat["p90"].as_f64().unwrap(),
        lat["p99"].as_f64().unwrap(),
        lat["max"].as_f64().unwrap(),
    );
    assert!(p50 <= p90 && p90 <= p99 && p99 <= max, "{lat}");
}

fn proxy_config(port: u16, uas: &str, dir: &Path, mode: &str) -> String {
    format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\ndomains = [\"example.test\"]\n\
mode = \"{mode}\"\nstateful = true\nrecord_route = true\nworkers = 2\n[routing]\n\
default_route = \"sip:{uas};transport=udp\"\n[database]\nurl = \"sqlite://{}\"\n",
        dir.join("s.db").display()
    )
}

#[test]
#[cfg_attr(
    sipsec_skip_sipp,
    ignore = "SIPp is not installed (apt-get install sip-tester)"
)]
fn load_calls_a_sipp_uas() {
    if !have_sipp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = ports(27000);
    let _uas = sipp_uas("127.0.0.3", port, &bench_sipp("uas.xml"));
    let target = format!("127.0.0.3:{port}");
    let (code, v, err) = load(
        dir.path(),
        &[
            &target,
            "--rate",
            "200",
            "--calls",
            "400",
            "--local",
            "127.0.0.2",
        ],
    );
    assert_eq!(code, 0, "{err}\n{v}");
    assert_summary_shape(&v);
    assert_eq!((n(&v, "attempted"), n(&v, "succeeded")), (400, 400), "{v}");
    assert!(v["latency_ms"]["p50"].as_f64().unwrap() > 0.0);
}

#[test]
#[cfg_attr(
    sipsec_skip_sipp,
    ignore = "SIPp is not installed (apt-get install sip-tester)"
)]
fn sipp_calls_the_load_uas() {
    if !have_sipp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = ports(27000);
    let addr = format!("127.0.0.3:{port}");
    let uas = LoadUas::start(dir.path(), &addr, &[]);
    let r = sipp_client(
        dir.path(),
        &addr,
        &[
            "-sn",
            "uac",
            "-i",
            "127.0.0.2",
            "-p",
            &(port + 1).to_string(),
            "-r",
            "200",
            "-m",
            "400",
        ],
    );
    assert_eq!((r.successful, r.failed, r.exit), (400, 0, 0), "{r:?}");
    let v = uas.finish();
    assert_eq!(
        (n(&v, "uas_answered"), n(&v, "uas_completed")),
        (400, 400),
        "{v}"
    );
    assert_eq!(n(&v, "failed"), 0, "{v}");
}

#[test]
fn calls_through_the_stateful_proxy_and_a_short_peak_search() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(27000);
    let uas = format!("127.0.0.3:{}", port + 1);
    let _server = Server::start(dir.path(), &proxy_config(port, &uas, dir.path(), "proxy"));
    let target = format!("127.0.0.1:{port}");
    let (code, v, err) = load(
        dir.path(),
        &[
            &target, "--role", "both", "--uas", &uas, "--rate", "500", "--calls", "2000",
        ],
    );
    assert_eq!(code, 0, "{err}\n{v}");
    assert_summary_shape(&v);
    assert_eq!(n(&v, "succeeded"), 2000, "{v}");
    // Every call crossed the proxy to our UAS and was ended by BYE there.
    assert_eq!(
        (n(&v, "uas_answered"), n(&v, "uas_completed")),
        (2000, 2000)
    );

    let (code, v, err) = load(
        dir.path(),
        &[
            &target,
            "--role",
            "both",
            "--uas",
            &uas,
            "--find-peak",
            "--rate",
            "100",
            "--max-rate",
            "200",
            "--step-s",
            "1",
        ],
    );
    assert_eq!(code, 0, "{err}\n{v}");
    assert_eq!(v["peak_per_s"].as_f64(), Some(200.0), "{v}");
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{v}");
    // Each trial's offered load and goodput are its own, and the totals are both trials'.
    for (st, rate) in steps.iter().zip([100.0, 200.0]) {
        let (offered, goodput) = (f(st, "offered_per_s"), f(st, "goodput_per_s"));
        assert!(offered > 0.9 * rate && offered < 1.1 * rate, "{st}");
        assert!(goodput > 0.9 * rate && goodput <= offered, "{st}");
    }
    assert_eq!(n(&v, "attempted"), sum(steps, "attempted"), "{v}");
}

fn f(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

fn sum(steps: &[Value], key: &str) -> u64 {
    steps.iter().map(|st| n(st, key)).sum()
}

/// A redirect server where u1 is registered and u2 is not: every other operation of the
/// redirect scenario fails (404), the rest succeed — a load with failures in every step.
fn half_failing_redirect(dir: &Path) -> (Server, String, String) {
    let port = ports(27000);
    let server = Server::start(dir, &proxy_config(port, "127.0.0.3:9", dir, "redirect"));
    let users = dir.join("users.csv");
    std::fs::write(&users, "u1,p1\nu2,p2\n").unwrap();
    let target = format!("127.0.0.1:{port}");
    let users = users.to_str().unwrap().to_string();
    let (code, v, err) = load(
        dir,
        &[
            &target,
            "--scenario",
            "register",
            "--users",
            &users,
            "--domain",
            "example.test",
            "--calls",
            "1",
            "--register-contact",
            "127.0.0.3:9",
        ],
    );
    assert_eq!((code, n(&v, "succeeded")), (0, 1), "{err}\n{v}");
    (server, target, users)
}

/// `--ramp` runs each step for `--step-s` (no `--duration`); the summary lists every step
/// with its own offered load, goodput and failures by reason, and its totals and
/// `failures_by_reason` are all the steps', said so in its heading.
#[test]
fn a_ramp_reports_every_step_with_its_failures_and_all_of_them_together() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, target, users) = half_failing_redirect(dir.path());
    let r = load_printing(
        dir.path(),
        &[
            &target,
            "--scenario",
            "redirect",
            "--users",
            &users,
            "--domain",
            "example.test",
            "--rate",
            "50",
            "--ramp",
            "50",
            "--max-rate",
            "100",
            "--step-s",
            "1",
        ],
    );
    let v = &r.summary;
    assert_eq!(r.code, 1, "a run with failures exits 1: {}\n{v}", r.stderr);
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{v}");
    for (st, rate) in steps.iter().zip([50.0, 100.0]) {
        let (offered, goodput) = (f(st, "offered_per_s"), f(st, "goodput_per_s"));
        assert!(offered > 0.9 * rate && offered < 1.1 * rate, "{st}");
        assert!(goodput > 0.4 * rate && goodput < 0.6 * rate, "{st}");
        assert_eq!(
            st["failures_by_reason"]["404 Not Found"], st["failed"],
            "{st}"
        );
        assert!(n(st, "failed") >= (0.4 * rate) as u64, "{st}");
    }
    assert_eq!(n(v, "attempted"), sum(steps, "attempted"), "{v}");
    assert_eq!(
        v["failures_by_reason"]["404 Not Found"].as_u64(),
        Some(sum(steps, "failed")),
        "{v}"
    );
    let text = &r.stdout;
    assert!(text.contains("ramp, 2 steps"), "{text}");
    assert!(
        text.contains(&format!(
            "all 2 steps together: {} attempted",
            n(v, "attempted")
        )),
        "{text}"
    );
    assert!(text.contains("× 404 Not Found"), "{text}");
}

/// The callee's summary says what it answered, not the caller's (all-zero) lines; the
/// caller's progress lines come under a legend, printed once, and say which columns cover the
/// last second and which the run so far.
#[test]
fn the_callee_summarises_what_it_answered_and_progress_lines_have_a_legend() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(27000);
    let addr = format!("127.0.0.3:{port}");
    let uas = LoadUas::start(dir.path(), &addr, &[]);
    let r = load_printing(
        dir.path(),
        &[
            &addr,
            "--rate",
            "20",
            "--duration",
            "2.5",
            "--local",
            "127.0.0.2",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let (v, text) = uas.finish_printing();
    assert_eq!(n(&v, "uas_completed"), 50, "{v}");
    assert!(
        text.starts_with("call (udp, role uas): 50 calls answered, 50 ended by BYE, 0 failed"),
        "{text}"
    );
    assert!(
        !text.contains("attempted") && !text.contains("latency"),
        "{text}"
    );

    let legend = "progress, a line a second";
    assert_eq!(r.stderr.matches(legend).count(), 1, "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| l.contains("s] ")).collect();
    assert!(lines.len() >= 2, "{}", r.stderr);
    for l in lines {
        assert!(
            l.contains("last 1 s: started") && l.contains("| since start: ok"),
            "{l}"
        );
    }
}

#[test]
fn users_register_then_are_redirected_to_their_contact() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(27000);
    let uas = format!("127.0.0.3:{}", port + 1);
    let _server = Server::start(
        dir.path(),
        &proxy_config(port, &uas, dir.path(), "redirect"),
    );
    let users = dir.path().join("users.csv");
    std::fs::write(&users, "username,password\nu1,p1\nu2,p2\nu3,p3\n").unwrap();
    let target = format!("127.0.0.1:{port}");
    let common = [
        target.as_str(),
        "--users",
        users.to_str().unwrap(),
        "--domain",
        "example.test",
    ];
    // Register the three users at the UAS's address.
    let (code, v, err) = load(
        dir.path(),
        &[
            &common[..],
            &[
                "--scenario",
                "register",
                "--calls",
                "3",
                "--register-contact",
                &uas,
            ],
        ]
        .concat(),
    );
    assert_eq!((code, n(&v, "succeeded")), (0, 3), "{err}\n{v}");
    // Stop at the 302...
    let (code, v, err) = load(
        dir.path(),
        &[
            &common[..],
            &["--scenario", "redirect", "--calls", "30", "--rate", "100"],
        ]
        .concat(),
    );
    assert_eq!((code, n(&v, "succeeded")), (0, 30), "{err}\n{v}");
    // ...or follow it to the registered contact, our own UAS.
    let (code, v, err) = load(
        dir.path(),
        &[
            &common[..],
            &[
                "--scenario",
                "redirect",
                "--redirect",
                "follow",
                "--role",
                "both",
                "--uas",
                &uas,
                "--calls",
                "30",
                "--rate",
                "100",
            ],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{err}\n{v}");
    assert_eq!(
        (n(&v, "succeeded"), n(&v, "uas_completed")),
        (30, 30),
        "{v}"
    );
}

#[test]
fn options_to_the_server_itself() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(27000);
    let _server = Server::start(
        dir.path(),
        &proxy_config(port, "127.0.0.3:9", dir.path(), "proxy"),
    );
    let (code, v, err) = load(
        dir.path(),
        &[
            &format!("127.0.0.1:{port}"),
            "--scenario",
            "options",
            "--domain",
            "example.test",
            "--calls",
            "50",
            "--rate",
            "100",
        ],
    );
    assert_eq!((code, n(&v, "succeeded")), (0, 50), "{err}\n{v}");
}

#[test]
#[cfg_attr(
    sipsec_skip_sipp,
    ignore = "SIPp is not installed (apt-get install sip-tester)"
)]
fn digest_answers_are_accepted_by_sipp_and_wrong_passwords_fail() {
    if !have_sipp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = ports(27000);
    let _uas = sipp_uas("127.0.0.3", port, &scenario("uas_digest_register.xml"));
    let target = format!("127.0.0.3:{port}");
    let good = dir.path().join("good.csv");
    std::fs::write(&good, "alice,s3cret,sipsec.test\n").unwrap();
    let (code, v, err) = load(
        dir.path(),
        &[
            &target,
            "--scenario",
            "register",
            "--users",
            good.to_str().unwrap(),
            "--calls",
            "20",
            "--rate",
            "50",
        ],
    );
    assert_eq!((code, n(&v, "succeeded")), (0, 20), "{err}\n{v}");
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "alice,guess,sipsec.test\n").unwrap();
    let (code, v, _) = load(
        dir.path(),
        &[
            &target,
            "--scenario",
            "register",
            "--users",
            bad.to_str().unwrap(),
            "--calls",
            "5",
            "--rate",
            "50",
        ],
    );
    assert_eq!(code, 1, "a run with failures exits 1");
    assert_eq!(v["failures_by_reason"]["403 Forbidden"], 5, "{v}");
}

#[test]
#[cfg_attr(
    sipsec_skip_sipp,
    ignore = "SIPp is not installed (apt-get install sip-tester)"
)]
fn failures_are_reported_by_reason() {
    if !have_sipp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = ports(27000);
    let _uas = sipp_uas("127.0.0.3", port, &scenario("uas_busy.xml"));
    let (code, v, _) = load(
        dir.path(),
        &[
            &format!("127.0.0.3:{port}"),
            "--calls",
            "20",
            "--rate",
            "100",
        ],
    );
    assert_eq!(code, 1);
    assert_eq!((n(&v, "attempted"), n(&v, "failed")), (20, 20), "{v}");
    assert_eq!(v["failures_by_reason"]["486 Busy Here"], 20, "{v}");
}

#[test]
fn bad_arguments_are_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad_users = dir.path().join("u.csv");
    std::fs::write(&bad_users, "alice,pw\nbob\n").unwrap();
    for (args, expected) in [
        (vec!["--calls", "1"], "give the target"),
        (vec!["127.0.0.1:5060"], "--duration SECONDS or --calls N"),
        (
            vec![
                "127.0.0.1:5060",
                "--ramp",
                "5",
                "--max-rate",
                "20",
                "--duration",
                "3",
            ],
            "for --step-s seconds",
        ),
        (vec!["example.com:5060", "--calls", "1"], "IP literals only"),
        (
            vec!["127.0.0.1:5060", "--calls", "1", "--rate", "0"],
            "--rate must be",
        ),
        (vec!["--role", "uas"], "needs --uas"),
        (
            vec!["127.0.0.1:5060", "--calls", "1", "--transport", "tls"],
            "--tls-ca",
        ),
        (
            vec!["tcp:127.0.0.1:5060", "--calls", "1", "--transport", "udp"],
            "another transport",
        ),
        (
            vec!["127.0.0.1:5060", "--calls", "1", "--tls-no-verify"],
            "need --transport tls",
        ),
        (
            vec![
                "tls:127.0.0.1:5060",
                "--calls",
                "1",
                "--tls-ca",
                "missing.pem",
            ],
            "missing.pem",
        ),
        (
            vec!["tls:127.0.0.1:5060", "--calls", "1", "--tls-cert", "c.pem"],
            "go together",
        ),
        (
            vec!["--role", "uas", "--uas", "tls:127.0.0.1:5999"],
            "the UAS needs a certificate",
        ),
        (
            vec![
                "127.0.0.1:5060",
                "--calls",
                "1",
                "--users",
                bad_users.to_str().unwrap(),
            ],
            "line 2",
        ),
    ] {
        let (code, _, err) = load(dir.path(), &args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

/// A server that stops reading: past what its connection holds unsent (its own queue and the
/// kernel's), the caller fails new calls at once, unsent, rather than queueing them without
/// limit to arrive seconds late; once the server reads again, calls are sent again (with
/// nothing sent meanwhile to notice it by).
#[test]
fn a_peer_that_stops_reading_backs_new_calls_off_unsent_until_it_reads() {
    use socket2::{Domain, SockAddr, Socket, Type};
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let port = ports(27000);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    // A small window, so the caller's kernel holds what this side does not read.
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind(&SockAddr::from(addr)).unwrap();
    socket.listen(8).unwrap();
    let listener: std::net::TcpListener = socket.into();
    // Accepts and holds the connection unread for 1.5 s of the 3 s run, then reads it all (a
    // black hole: no SIP answer).
    let held = std::thread::spawn(move || {
        let (mut c, _) = listener.accept()?;
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let mut buf = vec![0; 1 << 16];
        while c.read(&mut buf)? > 0 {}
        Ok::<(), std::io::Error>(())
    });
    let (code, v, err) = load(
        dir.path(),
        &[
            &format!("tcp:{addr}"),
            "--calls",
            "3000",
            "--rate",
            "1000",
            "--drain-s",
            "1",
        ],
    );
    assert_eq!(code, 1, "{err}\n{v}");
    let backlogged = v["failures_by_reason"]["not sent: connection backlogged"]
        .as_u64()
        .unwrap_or(0);
    // About 32 KiB unsent (some 60 INVITEs) go before the rest of the first 1.5 s back off.
    assert!(backlogged >= 1000, "{backlogged} backed off: {v}");
    // The second half was sent (and, unanswered, failed at the end of the run).
    let sent = n(&v, "attempted") - backlogged;
    assert!(sent >= 1000, "{sent} sent: {v}");
    assert_eq!(n(&v, "attempted"), 3000, "{v}");
    assert_eq!(n(&v, "succeeded"), 0, "{v}");
    held.join().unwrap().unwrap();
}

#[test]
#[cfg_attr(
    sipsec_skip_sipp,
    ignore = "SIPp is not installed (apt-get install sip-tester)"
)]
fn tcp_calls_both_ways_with_sipp_and_per_call_connections() {
    if !have_sipp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = ports(27000);
    // Our caller over one persistent TCP connection to SIPp's callee.
    let uas = sipp_uas_with("127.0.0.3", port, &["-sn", "uas", "-t", "t1"]);
    let target = format!("tcp:127.0.0.3:{port}");
    let (code, v, err) = load(
        dir.path(),
        &[
            &target,
            "--transport",
            "tcp",
            "--rate",
            "200",
            "--calls",
            "300",
        ],
    );
    assert_eq!((code, n(&v, "succeeded")), (0, 300), "{err}\n{v}");
    assert_eq!(v["transport"], "tcp");
    drop(uas);

    // SIPp's caller over TCP to our callee.
    let addr = format!("127.0.0.3:{}", port + 1);
    let ours = LoadUas::start(dir.path(), &addr, &["--transport", "tcp"]);
    let r = sipp_client(
        dir.path(),
        &addr,
        &[
            "-sn",
            "uac",
            "-t",
            "t1",
            "-i",
            "127.0.0.2",
            "-r",
            "200",
            "-m",
            "300",
        ],
    );
    assert_eq!((r.successful, r.failed, r.exit), (300, 0, 0), "{r:?}");
    let v = ours.finish();
    assert_eq!(n(&v, "uas_completed"), 300, "{v}");

    // Both sides ours, one connection per call.
    let addr = format!("127.0.0.3:{}", port + 2);
    let (code, v, err) = load(
        dir.path(),
        &[
            "--transport",
            "tcp",
            "--connection",
            "per-call",
            "--role",
            "both",
            "--uas",
            &addr,
            "--rate",
            "200",
            "--calls",
            "300",
        ],
    );
    assert_eq!((code, n(&v, "succeeded")), (0, 300), "{err}\n{v}");
}

#[test]
fn tls_calls_count_full_and_resumed_handshakes_in_each_connection_mode() {
    let dir = tempfile::tempdir().unwrap();
    let f = make_certs(dir.path());
    let port = ports(27100);
    let addr = format!("tls:127.0.0.1:{port}");
    let (cert, key, ca) = (f("server.pem"), f("server-key.pem"), f("ca.pem"));
    let uas = LoadUas::start(dir.path(), &addr, &["--tls-cert", &cert, "--tls-key", &key]);
    for (connection, resumption) in [
        ("persistent", "on"),
        ("per-call", "on"),
        ("per-call", "off"),
    ] {
        let (code, v, err) = load(
            dir.path(),
            &[
                &addr,
                "--tls-ca",
                &ca,
                "--connection",
                connection,
                "--tls-resumption",
                resumption,
                "--calls",
                "60",
                "--rate",
                "100",
            ],
        );
        assert_eq!(code, 0, "{connection} {resumption}: {err} {v}");
        assert_eq!(n(&v, "succeeded"), 60, "{v}");
        let c = &v["connections"];
        let opened = if connection == "persistent" { 1 } else { 60 };
        assert_eq!(n(c, "connections_opened"), opened, "{v}");
        let (full, resumed) = (n(c, "tls_full_handshakes"), n(c, "tls_resumed_handshakes"));
        assert_eq!(full + resumed, opened, "one handshake per connection: {v}");
        match (connection, resumption) {
            ("per-call", "on") => {
                // Calls that start before the first handshake has brought a ticket back
                // handshake in full; after that, every one resumes.
                assert!(full >= 1 && resumed >= 40, "{v}");
            }
            _ => assert_eq!(resumed, 0, "{connection}, resumption {resumption}: {v}"),
        }
        assert_eq!(n(c, "tls_handshake_failures"), 0, "{v}");
    }
    let u = uas.finish();
    assert_eq!(n(&u, "uas_answered"), 180, "{u}");
    assert_eq!(n(&u["connections"], "tls_accepted_handshakes"), 121, "{u}");
}

#[test]
fn tls_client_certificates_and_untrusted_servers() {
    let dir = tempfile::tempdir().unwrap();
    let f = make_certs(dir.path());
    let port = ports(27100) + 1;
    let addr = format!("tls:127.0.0.1:{port}");
    let uas = LoadUas::start(
        dir.path(),
        &addr,
        &[
            "--tls-cert",
            &f("server.pem"),
            "--tls-key",
            &f("server-key.pem"),
            "--tls-ca",
            &f("ca.pem"),
            "--tls-client-auth",
            "required",
        ],
    );
    let run = |extra: &[&str]| {
        let mut args = vec![
            addr.as_str(),
            "--calls",
            "5",
            "--rate",
            "50",
            "--drain-s",
            "2",
        ];
        args.extend_from_slice(extra);
        load(dir.path(), &args)
    };
    // With our client certificate: every call goes through.
    let (code, v, err) = run(&[
        "--tls-ca",
        &f("ca.pem"),
        "--tls-cert",
        &f("client.pem"),
        "--tls-key",
        &f("client-key.pem"),
    ]);
    assert_eq!((code, n(&v, "succeeded")), (0, 5), "{err} {v}");

    // Without one the UAS refuses the handshake: every call fails, the failure is counted and
    // its reason logged once.
    let (code, v, err) = run(&["--tls-ca", &f("ca.pem")]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(n(&v, "succeeded"), 0, "{v}");
    assert!(n(&v["connections"], "tls_handshake_failures") >= 1, "{v}");
    assert!(err.contains("TLS with 127.0.0.1"), "{err}");

    // A server whose certificate is not from the CA we trust (here: the client certificate's
    // own file as the "CA") is refused by us.
    let (code, v, _) = run(&[
        "--tls-ca",
        &f("client.pem"),
        "--tls-cert",
        &f("client.pem"),
        "--tls-key",
        &f("client-key.pem"),
    ]);
    assert_eq!((code, n(&v, "succeeded")), (1, 0), "{v}");
    assert!(n(&v["connections"], "tls_handshake_failures") >= 1, "{v}");

    let u = uas.finish();
    assert_eq!(n(&u, "uas_answered"), 5, "{u}");
    assert!(n(&u["connections"], "tls_handshake_failures") >= 1, "{u}");
}
