//! `sipsec load --role uas --register` against `sipsec serve` with digest on: the callee
//! registers each of its users over a flow of its own, answers the challenge, takes the calls
//! a `sipsec load` caller makes through the proxy on that flow, and unregisters at the end;
//! refused registrations are named. Over TCP and TLS the callee listens nowhere (its Contact
//! is `USER@<random>.invalid`), and as an RFC 5626 client (`--outbound`) it registers two
//! flows per user and keeps them alive.

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Users the caller calls (each the next one's caller) and the callee registers.
const USERS: &str = "u0,pw0\nu1,pw1\nu2,pw2\nu3,pw3\nu4,pw4\n";

/// A proxy and registrar for example.test on UDP and TCP at `port` and TLS at `port + 1`,
/// digest on, record-routing (so in-dialog requests come through it), the users of `USERS`
/// imported; its certificates in `dir`.
fn server(dir: &Path, port: u16) -> Server {
    let f = make_certs(dir);
    let config = format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\", \"tcp:127.0.0.1:{port}\", \
         \"tls:127.0.0.1:{}\"]\ndomains = [\"example.test\"]\nrecord_route = true\nworkers = 2\n\
         [tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n\
         [database]\nurl = \"sqlite://users.db\"\n[auth]\nscheme = \"digest\"\n\
         max_failures_per_user = 1000\nmax_failures_per_source = 1000\n\
         [nat]\nflow_timer_s = 1\n",
        port + 1,
        f("server.pem"),
        f("server-key.pem"),
        f("ca.pem")
    );
    std::fs::write(dir.join("sipsec.toml"), &config).unwrap();
    std::fs::write(dir.join("users.csv"), USERS).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args(["users", "--config", "sipsec.toml", "import", "users.csv"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    Server::start_logged(dir, &config)
}

/// A `sipsec load --role uas --register` in the background.
struct Callee {
    child: Child,
    json: std::path::PathBuf,
    /// What it printed on stderr until its registrations were in.
    registered: String,
}

impl Callee {
    /// Starts a callee registering with `target` and waits (up to 45 s) for its line saying
    /// how many flows registered.
    fn start(dir: &Path, target: &str, users: &str, extra: &[&str]) -> Callee {
        let json = dir.join(format!("callee-{}.json", rand_name()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_sipsec"))
            .args([
                "load",
                "--role",
                "uas",
                "--register",
                target,
                "--users",
                users,
            ])
            .args(["--domain", "example.test", "--quiet", "--json"])
            .arg(&json)
            .args(extra)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the registering callee");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut registered = String::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(45) {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            registered.push_str(&line);
            if line.contains("flows registered") {
                break;
            }
        }
        // Later lines are drained so the callee never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Callee {
            child,
            json,
            registered,
        }
    }

    /// Stops the callee (it unregisters on the way out): its exit code and JSON summary.
    fn finish(mut self) -> (i32, Value) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        let summary = std::fs::read_to_string(&self.json)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        (status.code().unwrap_or(-1), summary)
    }
}

impl Drop for Callee {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `calls` calls from a UDP caller through the proxy at `port` to the registered users.
fn call(dir: &Path, port: u16, calls: u64) -> (i32, Value, String) {
    let target = format!("udp:127.0.0.1:{port}");
    let calls = calls.to_string();
    load(
        dir,
        &[
            &target,
            "--users",
            "users.csv",
            "--domain",
            "example.test",
            "--calls",
            &calls,
            "--rate",
            "100",
            "--drain-s",
            "10",
        ],
    )
}

/// At least 99% of `calls` succeeded, and the callee answered them.
fn assert_calls_reached_the_callee(caller: &(i32, Value, String), calls: u64, server: &Server) {
    let (code, v, err) = caller;
    let ok = n(v, "succeeded");
    assert!(
        *code == 0 && ok * 100 >= calls * 99,
        "{ok} of {calls} calls: {err}\n{v}\n{}",
        server.log()
    );
}

/// The callee's registrations as its summary reports them.
fn registrations(v: &Value) -> &Value {
    let r = &v["registrations"];
    assert!(r.is_object(), "no registrations in {v}");
    r
}

/// Runs `calls` calls to a callee registered over `transport` with `extra` options and
/// checks what both sides counted; returns the callee's summary.
fn calls_over_registered_flows(transport: &str, extra: &[&str], calls: u64) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(20600);
    let server = server(dir.path(), port);
    let target = match transport {
        "tls" => format!("tls:127.0.0.1:{}", port + 1),
        t => format!("{t}:127.0.0.1:{port}"),
    };
    let ca = dir.path().join("ca.pem");
    let mut options = extra.to_vec();
    if transport == "tls" {
        options.extend(["--tls-ca", ca.to_str().unwrap()]);
    }
    let flows = if extra.contains(&"--flows") { 10 } else { 5 };
    let callee = Callee::start(dir.path(), &target, "users.csv", &options);
    assert!(
        callee
            .registered
            .contains(&format!("{flows} of {flows} flows registered")),
        "{}\n{}",
        callee.registered,
        server.log()
    );
    let caller = call(dir.path(), port, calls);
    assert_calls_reached_the_callee(&caller, calls, &server);
    let (code, v) = callee.finish();
    assert_eq!(code, 0, "{v}");
    assert!(n(&v, "uas_answered") * 100 >= calls * 99, "{v}");
    let r = registrations(&v);
    // Every flow registered once (at least: refreshes come later), each after a challenge,
    // which is not a refusal; each unregistered at the end.
    assert!(n(r, "made") >= flows, "{v}");
    assert_eq!(n(r, "refused"), 0, "{v}");
    assert_eq!(n(r, "unregistered"), flows, "{v}");
    if transport != "udp" {
        // The callee listens nowhere: every call came over a connection it opened.
        let c = &v["connections"];
        assert_eq!(n(c, "connections_accepted"), 0, "{v}");
        assert_eq!(n(c, "connections_opened"), flows, "{v}");
    }
    // Unregistered: a call now reaches nobody.
    let (_, after, err) = call(dir.path(), port, 1);
    assert_eq!(n(&after, "failed"), 1, "{err}\n{after}");
    v
}

/// Over UDP the Contact is the callee's own socket, which the server reaches as written: 200
/// calls through the proxy, with digest on both sides, each reaching the callee.
#[test]
fn a_udp_callee_registers_takes_calls_through_the_proxy_and_unregisters() {
    calls_over_registered_flows("udp", &[], 200);
}

/// `--role both`: the caller calls the users its own callee registered, in one process (the
/// lab's way), through the proxy.
#[test]
fn one_process_registers_its_callees_and_calls_them() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(20600);
    let server = server(dir.path(), port);
    let target = format!("udp:127.0.0.1:{port}");
    let run = load_printing(
        dir.path(),
        &[
            &target,
            "--role",
            "both",
            "--register",
            "--users",
            "users.csv",
            "--domain",
            "example.test",
            "--calls",
            "200",
            "--rate",
            "100",
            "--quiet",
        ],
    );
    let v = &run.summary;
    assert!(
        run.code == 0 && n(v, "succeeded") >= 198 && n(v, "uas_answered") >= 198,
        "{}\n{v}\n{}",
        run.stderr,
        server.log()
    );
    assert!(
        run.stderr.contains("5 of 5 flows registered"),
        "{}",
        run.stderr
    );
    let r = registrations(v);
    assert!(n(r, "made") >= 5 && n(r, "refused") == 0, "{v}");
    assert_eq!(n(r, "unregistered"), 5, "{v}");
    assert!(run.stdout.contains("registrations: "), "{}", run.stdout);
}

/// The calls come over the TCP connection the callee registered on.
#[test]
fn a_tcp_callee_listening_nowhere_takes_calls_on_its_registering_connection() {
    calls_over_registered_flows("tcp", &[], 200);
}

/// The same over TLS, the callee a TLS client of the server.
#[test]
fn a_tls_callee_listening_nowhere_takes_calls_on_its_registering_connection() {
    calls_over_registered_flows("tls", &[], 200);
}

/// RFC 5626 over TCP: two flows per user (reg-id 1 and 2), CRLF keep-alives every second or
/// so, each answered by the server's pong, and the calls arriving on one flow or the other.
#[test]
fn an_outbound_tcp_callee_keeps_two_flows_per_user_alive_and_takes_calls() {
    let v = calls_over_registered_flows(
        "tcp",
        &["--outbound", "--flows", "2", "--keepalive-s", "1"],
        200,
    );
    let r = registrations(&v);
    assert_keepalives_answered(r, 10, &v);
    assert_eq!(r["flows_failed"], serde_json::json!({}), "{v}");
}

/// At least `least` keep-alives went, none unanswered, and all answered but the last of each
/// flow, which may still be out when the run ends.
fn assert_keepalives_answered(r: &Value, least: u64, v: &Value) {
    let (sent, answered) = (n(r, "keepalives_sent"), n(r, "keepalives_answered"));
    assert!(sent >= least, "{v}");
    assert_eq!(n(r, "keepalives_unanswered"), 0, "{v}");
    assert!(answered <= sent && answered + 10 >= sent, "{v}");
}

/// RFC 5626 over TCP, without calls: two flows per user, each its own connection, and each double-CRLF ping answered by the server's pong.
#[test]
fn an_outbound_tcp_callee_keeps_its_flows_alive_with_crlf_pings() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(20600);
    let server = server(dir.path(), port);
    let run = load_printing(
        dir.path(),
        &[
            "--role",
            "uas",
            "--register",
            &format!("tcp:127.0.0.1:{port}"),
            "--users",
            "users.csv",
            "--domain",
            "example.test",
            "--outbound",
            "--flows",
            "2",
            "--keepalive-s",
            "1",
            "--duration",
            "3",
            "--quiet",
        ],
    );
    let v = &run.summary;
    assert!(
        run.code == 0 && run.stderr.contains("10 of 10 flows registered"),
        "{}\n{v}\n{}",
        run.stderr,
        server.log()
    );
    let r = registrations(v);
    assert_keepalives_answered(r, 20, v);
    assert_eq!((n(r, "made"), n(r, "unregistered")), (10, 10), "{v}");
    let c = &v["connections"];
    assert_eq!(
        (
            n(c, "connections_opened"),
            n(c, "connections_accepted"),
            n(c, "open")
        ),
        (10, 0, 0),
        "{v}"
    );
}

/// RFC 5626 over UDP: STUN keep-alives on each flow's socket, every one answered by the
/// server's STUN answer on its SIP port, and the calls go through.
#[test]
fn an_outbound_udp_callee_sends_stun_keepalives_and_takes_calls() {
    let v = calls_over_registered_flows(
        "udp",
        &["--outbound", "--flows", "2", "--keepalive-s", "1"],
        200,
    );
    let r = registrations(&v);
    assert_keepalives_answered(r, 10, &v);
}

/// A user whose password the server refuses is named with the reason, the run goes on with
/// the others; when none registers, the run ends at once with an error.
#[test]
fn refused_registrations_are_named_and_a_run_with_none_fails() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(20600);
    let server = server(dir.path(), port);
    std::fs::write(dir.path().join("some.csv"), "u0,pw0\nu1,wrong\n").unwrap();
    std::fs::write(dir.path().join("none.csv"), "u2,wrong\n").unwrap();
    let target = format!("udp:127.0.0.1:{port}");

    let callee = Callee::start(dir.path(), &target, "some.csv", &["--duration", "1"]);
    assert!(
        callee.registered.contains("1 of 2 flows registered"),
        "{}\n{}",
        callee.registered,
        server.log()
    );
    let (code, v) = callee.finish();
    assert_eq!(code, 0, "{v}");
    let r = registrations(&v);
    assert_eq!((n(r, "made"), n(r, "unregistered")), (1, 1), "{v}");
    assert!(n(r, "refused") >= 1, "{v}");
    assert!(
        r["refused_by_reason"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| k.contains("credentials refused")),
        "{v}"
    );

    let run = load_printing(
        dir.path(),
        &[
            "--role",
            "uas",
            "--register",
            &target,
            "--users",
            "none.csv",
            "--domain",
            "example.test",
            "--duration",
            "30",
            "--quiet",
        ],
    );
    assert_ne!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("0 of 1 flows registered")
            && run
                .stderr
                .contains("not registered: u2: 401 Unauthorized (credentials refused)")
            && run.stderr.contains("no registration succeeded"),
        "{}",
        run.stderr
    );
    assert_eq!(
        n(registrations(&run.summary), "refused"),
        1,
        "{}",
        run.summary
    );
}

/// What `--register` needs is said before anything is sent.
#[test]
fn register_options_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    for (args, expected) in [
        (
            vec!["127.0.0.1:5999", "--register", "--users", "x.csv"],
            "--register is for the callee",
        ),
        (
            vec!["--role", "uas", "--register", "--users", "x.csv"],
            "--register needs the registrar as the target",
        ),
        (
            vec!["--role", "uas", "--register", "127.0.0.1:5999"],
            "--register needs --users",
        ),
        (
            vec!["--role", "uas", "--uas", "127.0.0.1:0", "--outbound"],
            "--register",
        ),
        (
            vec![
                "--role",
                "uas",
                "--register",
                "127.0.0.1:5999",
                "--users",
                "x.csv",
                "--flows",
                "2",
            ],
            "--outbound",
        ),
    ] {
        let run = load_printing(dir.path(), &args);
        assert_ne!(run.code, 0, "{args:?}");
        assert!(run.stderr.contains(expected), "{args:?}: {}", run.stderr);
    }
}
