//! Reloading the configuration on SIGHUP and by `sipsec ctl reload`: under TLS load, with
//! certificates rotated, with bad files and with changes only a restart may make.

mod common;

use common::*;
use std::path::Path;
use std::time::Duration;

fn hangup(server: &Server) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGHUP) };
}

/// `sipsec certs` into `dir` for `names` (the CA is made once and kept), the server's pair
/// copied to `<label>.pem` and `<label>-key.pem`.
fn certs(dir: &Path, label: &str, names: &[&str]) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sipsec"));
    cmd.args(["certs", "--out"]).arg(dir);
    for n in names {
        cmd.args(["--name", n]);
    }
    assert!(cmd.output().unwrap().status.success());
    std::fs::copy(dir.join("server.pem"), dir.join(format!("{label}.pem"))).unwrap();
    std::fs::copy(
        dir.join("server-key.pem"),
        dir.join(format!("{label}-key.pem")),
    )
    .unwrap();
}

fn config(dir: &Path, sip: u16, tls: u16, uas: u16, extra: &str) -> String {
    format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{sip}\", \"tls:127.0.0.1:{tls}\"]\n\
         [tls]\ncert = \"live.pem\"\nkey = \"live-key.pem\"\nca = \"ca.pem\"\n\
         [routing]\ndefault_route = \"sip:127.0.0.3:{uas}\"\n{extra}\
         [database]\nurl = \"sqlite://{}\"\n",
        dir.join("reload.db").display()
    )
}

/// Ten SIGHUPs, each with a changed file and the certificate rotated, while calls run over a
/// TLS connection: every call completes, the connection stays up, and a new handshake after
/// the rotation gets the new certificate.
#[test]
fn ten_sighups_during_a_tls_load_lose_no_call_and_close_no_connection() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = ports(21600);
    let (sip, tls, uas_port) = (base, base + 1, base + 2);
    certs(d, "a", &["a.test", "127.0.0.1"]);
    certs(d, "b", &["b.test", "127.0.0.1"]);
    let rotate = |label: &str| {
        std::fs::copy(d.join(format!("{label}.pem")), d.join("live.pem")).unwrap();
        std::fs::copy(d.join(format!("{label}-key.pem")), d.join("live-key.pem")).unwrap();
    };
    rotate("a");
    let uas = LoadUas::start(d, &format!("udp:127.0.0.3:{uas_port}"), &[]);
    let server = Server::start_logged(d, &config(d, sip, tls, uas_port, ""));
    let ca = d.join("ca.pem").to_str().unwrap().to_string();
    let target = format!("tls:127.0.0.1:{tls}");
    let caller = {
        let (d, ca, target) = (d.to_path_buf(), ca.clone(), target.clone());
        std::thread::spawn(move || {
            load(
                &d,
                &[&target, "--tls-ca", &ca, "--calls", "1500", "--rate", "300"],
            )
        })
    };
    for i in 0..10 {
        std::thread::sleep(Duration::from_millis(400));
        rotate(if i % 2 == 0 { "a" } else { "b" });
        let extra = format!("hold_down_s = {}\n[overload]\ntarget = 0.9{i}\n", 10 + i);
        std::fs::write(d.join("sipsec.toml"), config(d, sip, tls, uas_port, &extra)).unwrap();
        hangup(&server);
    }
    let (code, v, err) = caller.join().unwrap();
    assert_eq!(code, 0, "{v} {err}");
    assert_eq!(
        (n(&v, "attempted"), n(&v, "succeeded")),
        (1500, 1500),
        "{v}"
    );
    assert_eq!(n(&v, "send_failures"), 0, "{v}");
    assert_eq!(n(&v["connections"], "connections_opened"), 1, "{v}");
    assert_eq!(n(&v["connections"], "tls_full_handshakes"), 1, "{v}");
    // The last rotation left certificate "b": a new handshake checking for its name gets in,
    // one checking for the old one's is refused.
    let name = |n: &str| {
        load(
            d,
            &[
                &target,
                "--tls-ca",
                &ca,
                "--tls-server-name",
                n,
                "--calls",
                "1",
                "--drain-s",
                "2",
            ],
        )
    };
    let (code, v, _) = name("b.test");
    assert_eq!((code, n(&v, "succeeded")), (0, 1), "{v}");
    let (_, v, _) = name("a.test");
    assert_eq!(n(&v, "succeeded"), 0, "{v}");
    drop(uas);
    let log = server.log();
    assert_eq!(log.matches("reloaded").count(), 10, "{log}");
    let c = server.stop_counters();
    // One connection carried the whole run; the two probes made the other two (the second
    // one's handshake refused by the caller).
    assert_eq!(c.get("connections_accepted"), 3, "{:?}", c.0);
    assert_eq!(c.get("tls_handshakes_full"), 2, "{:?}", c.0);
    assert_eq!(c.get("tls_failures"), 1, "{:?}", c.0);
}

/// A reload changes the routes; a file that does not load, or changes the listen addresses,
/// is refused with the key named, and the server keeps running what it ran.
#[test]
fn bad_files_and_restart_only_changes_leave_the_running_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = ports(21700);
    let (sip, tls, uas1, uas2) = (base, base + 1, base + 2, base + 3);
    certs(d, "live", &["127.0.0.1"]);
    let one = LoadUas::start(d, &format!("udp:127.0.0.3:{uas1}"), &[]);
    let two = LoadUas::start(d, &format!("udp:127.0.0.3:{uas2}"), &[]);
    let server = Server::start_logged(d, &config(d, sip, tls, uas1, ""));
    let calls = || {
        let (code, v, err) = load(d, &[&format!("udp:127.0.0.1:{sip}"), "--calls", "5"]);
        assert_eq!(code, 0, "{v} {err}");
    };
    calls();
    let reload = |text: &str| {
        std::fs::write(d.join("sipsec.toml"), text).unwrap();
        hangup(&server);
        std::thread::sleep(Duration::from_millis(300));
    };
    // The route moves.
    reload(&config(d, sip, tls, uas2, ""));
    calls();
    // Not TOML; a bad value; a new listen address: each refused, naming what is wrong.
    reload("[server\nlisten = ");
    reload(&config(d, sip, tls, uas1, "failover_timeout_ms = 5\n"));
    reload(&config(d, sip, tls + 5, uas1, ""));
    calls();
    let log = server.log();
    assert_eq!(log.matches("reload refused").count(), 3, "{log}");
    assert!(log.contains("routing.failover_timeout_ms"), "{log}");
    assert!(
        log.contains("server.listen cannot change without a restart"),
        "{log}"
    );
    assert_eq!(n(&one.finish(), "uas_answered"), 5);
    assert_eq!(n(&two.finish(), "uas_answered"), 10);
    server.stop();
}

/// `sipsec ctl` against the control socket: counters as the server counts them, a reload's
/// outcome (refused with the key named, or done) in its exit code and output; the socket
/// private, refused to a second server, removed at exit; bad commands answered, not obeyed.
#[test]
fn ctl_answers_what_sighup_only_logs() {
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = ports(21750);
    let (sip, tls, uas1, uas2) = (base, base + 1, base + 2, base + 3);
    certs(d, "live", &["127.0.0.1"]);
    let control = "[control]\nsocket = \"ctl.sock\"\n";
    let one = LoadUas::start(d, &format!("udp:127.0.0.3:{uas1}"), &[]);
    let two = LoadUas::start(d, &format!("udp:127.0.0.3:{uas2}"), &[]);
    let server = Server::start_logged(d, &config(d, sip, tls, uas1, control));
    let file = d.join("sipsec.toml");
    let socket = d.join("ctl.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let ctl = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sipsec"))
            .arg("ctl")
            .args(args)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let config_arg = ["--config", file.to_str().unwrap()];
    let calls = || {
        let (code, v, err) = load(d, &[&format!("udp:127.0.0.1:{sip}"), "--calls", "5"]);
        assert_eq!(code, 0, "{v} {err}");
    };
    calls();

    // Counters: every one, zeros included, as the server counts them.
    let (code, out, err) = ctl(&["counters", config_arg[0], config_arg[1]]);
    assert_eq!(code, Some(0), "{err}");
    let counted: std::collections::HashMap<&str, u64> = out
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k, v.parse().unwrap())
        })
        .collect();
    assert!(counted.contains_key("failovers"), "{out}");
    assert!(counted["requests_in"] >= 10, "{out}");

    // A bad value: refused, exit 1, the key named; the route stays.
    std::fs::write(
        &file,
        config(
            d,
            sip,
            tls,
            uas2,
            &format!("failover_timeout_ms = 5\n{control}"),
        ),
    )
    .unwrap();
    let (code, _, err) = ctl(&["reload", "--config", file.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("reload refused"), "{err}");
    assert!(err.contains("routing.failover_timeout_ms"), "{err}");
    // Not TOML: the socket is still found by --socket, and the server says what is wrong.
    std::fs::write(&file, "[server\n").unwrap();
    let (code, _, err) = ctl(&["reload", "--config", file.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("give --socket"), "{err}");
    let (code, _, err) = ctl(&["reload", "--socket", socket.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("invalid config file"), "{err}");
    calls();
    // A good one: done, exit 0, and the route moves.
    std::fs::write(&file, config(d, sip, tls, uas2, control)).unwrap();
    let (code, out, err) = ctl(&["reload", "--config", file.to_str().unwrap()]);
    assert_eq!(
        (code, out.trim_end()),
        (Some(0), &*format!("{} reloaded", file.display())),
        "{err}"
    );
    calls();

    // Nobody there; a second server on the same socket; words that are not commands.
    let (code, _, err) = ctl(&["reload", "--socket", d.join("none.sock").to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot reach a server"), "{err}");
    let other = d.join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(
        other.join("sipsec.toml"),
        format!(
            "[server]\nlisten = [\"udp:127.0.0.1:{}\"]\n[control]\nsocket = \"{}\"\n",
            base + 4,
            socket.display()
        ),
    )
    .unwrap();
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args([
            "serve",
            "--config",
            other.join("sipsec.toml").to_str().unwrap(),
        ])
        .current_dir(&other)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{err}");
    assert!(err.contains("another server is listening there"), "{err}");
    for (sent, expect) in [
        ("status\n", "error\nunknown command \"status\""),
        (&*"x".repeat(300), "error\na command is one line"),
    ] {
        let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        s.write_all(sent.as_bytes()).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with(expect), "{reply}");
    }

    let log = server.log();
    assert_eq!(
        log.matches("sipsec ctl: reload refused").count(),
        2,
        "{log}"
    );
    assert_eq!(log.matches("sipsec ctl: ").count(), 3, "{log}");
    let (_, out, _) = ctl(&["counters", "--socket", socket.to_str().unwrap()]);
    let last = out
        .lines()
        .find_map(|l| l.strip_prefix("requests_in "))
        .unwrap();
    let stopped = server.stop_counters();
    assert_eq!(
        stopped.get("requests_in").to_string(),
        last,
        "{:?}",
        stopped.0
    );
    assert!(stopped.get("requests_in") > counted["requests_in"]);
    assert!(!socket.exists(), "the socket outlived the server");
    assert_eq!(n(&one.finish(), "uas_answered"), 10);
    assert_eq!(n(&two.finish(), "uas_answered"), 5);
}
