//! A real browser as a SIP peer (RFC 7118): JsSIP (pinned in `peers/browser/package-lock.json`)
//! in headless Chromium, driven over the DevTools protocol by `peers/browser/run.mjs`,
//! registers over WSS with digest, calls a `sipsec load` callee on UDP through sipsec, and
//! answers a call from a `sipsec load` caller on UDP. The outcome is read from the page; the
//! screenshot is kept in `target/tmp/browser.png`.

mod common;

use common::load::make_certs;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn peer_dir() -> PathBuf {
    repo_dir().join("peers/browser")
}

/// Node, Chromium and the browser peer's packages (`npm ci` in peers/browser). Under CI a
/// missing one is a failure, not a skip.
fn have_browser() -> bool {
    let runs = |cmd: &str, arg: &str| {
        Command::new(cmd)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let missing = if !runs("node", "--version") {
        Some("node (Debian package nodejs)")
    } else if !runs("chromium", "--version") {
        Some("chromium (Debian package chromium)")
    } else if !peer_dir().join("node_modules/jssip").is_dir() {
        Some("peers/browser/node_modules (run `npm ci` in peers/browser)")
    } else {
        None
    };
    if let Some(what) = missing {
        assert!(
            std::env::var_os("CI").is_none(),
            "{what} is required under CI"
        );
        eprintln!("skipped: {what} is missing");
        return false;
    }
    true
}

/// A `sipsec load` process whose stderr is drained in the background.
fn load(dir: &Path, args: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .arg("load")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sipsec load");
    let stderr = child.stderr.take().unwrap();
    let name = args.join(" ");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[load {name}] {line}");
        }
    });
    child
}

fn wait_for(path: &Path, limit: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn a_browser_registers_calls_and_is_called_over_wss_with_digest() {
    if !have_browser() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = ports(30500);
    let f = make_certs(d);
    let config = format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\", \"wss:127.0.0.1:{}\"]\n\
         domains = [\"example.test\"]\nrecord_route = true\nworkers = 2\n\
         [tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n\
         [database]\nurl = \"sqlite://users.db\"\n[auth]\nscheme = \"digest\"\n",
        port + 1,
        f("server.pem"),
        f("server-key.pem"),
        f("ca.pem")
    );
    std::fs::write(d.join("sipsec.toml"), &config).unwrap();
    std::fs::write(
        d.join("users.csv"),
        "alice,alice-pw\nbob,bob-pw\ncarol,carol-pw\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args(["users", "--config", "sipsec.toml", "import", "users.csv"])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let server = Server::start_logged(d, &config);
    let udp = format!("udp:127.0.0.1:{port}");

    // Bob: a callee on UDP, registered with digest, answering with a WebRTC description.
    std::fs::write(d.join("bob.csv"), "bob,bob-pw\n").unwrap();
    let mut bob = load(
        d,
        &[
            "--role",
            "uas",
            "--register",
            &udp,
            "--users",
            "bob.csv",
            "--domain",
            "example.test",
            "--sdp",
            "webrtc",
            "--quiet",
        ],
    );
    std::thread::sleep(Duration::from_secs(2));

    // Alice: the browser. It calls bob once registered, and waits to answer one call.
    let ready = d.join("ready");
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser.png");
    let _ = std::fs::remove_file(&screenshot);
    let browser = Command::new("node")
        .arg(peer_dir().join("run.mjs"))
        .args(["--server", &format!("wss://127.0.0.1:{}", port + 1)])
        .args([
            "--domain",
            "example.test",
            "--user",
            "alice",
            "--password",
            "alice-pw",
        ])
        .args([
            "--call",
            "sip:bob@example.test",
            "--answer",
            "1",
            "--wait-s",
            "40",
        ])
        .arg("--ready")
        .arg(&ready)
        .arg("--screenshot")
        .arg(&screenshot)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the browser peer");
    assert!(
        wait_for(&ready, Duration::from_secs(30)),
        "the browser did not register; server log:\n{}",
        server.log()
    );

    // Carol calls alice from UDP.
    std::fs::write(d.join("carol.csv"), "carol,carol-pw\nalice,unused\n").unwrap();
    let caller_json = d.join("carol.json");
    let mut carol = load(
        d,
        &[
            &udp,
            "--users",
            "carol.csv",
            "--domain",
            "example.test",
            "--sdp",
            "webrtc",
            "--rate",
            "1",
            "--calls",
            "1",
            "--hold-ms",
            "1000",
            "--quiet",
            "--json",
            caller_json.to_str().unwrap(),
        ],
    );
    let carol_status = carol.wait().unwrap();
    let out = browser.wait_with_output().unwrap();
    let outcome = String::from_utf8_lossy(&out.stdout).into_owned();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(bob.id() as i32, libc::SIGTERM) };
    let _ = bob.wait();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&caller_json).unwrap_or_default())
            .unwrap_or_default();
    let counters = server.stop_counters();

    assert!(
        out.status.success(),
        "the browser's outcome: {outcome}; carol: {summary}"
    );
    let o: serde_json::Value = serde_json::from_str(outcome.trim()).unwrap();
    assert_eq!(o["registered"], true);
    assert_eq!(o["outgoing"], "confirmed", "{o}");
    assert!(
        o["incoming"][0]["from"]
            .as_str()
            .is_some_and(|f| f.starts_with("sip:carol@")),
        "{o}"
    );
    assert!(carol_status.success(), "carol's call: {summary}");
    assert_eq!(summary["succeeded"], 1, "{summary}");
    assert!(screenshot.exists(), "no screenshot");
    assert!(counters.get("websocket_upgrades") >= 1);
    assert!(counters.get("auth_passed") >= 3, "{:?}", counters.0);
}
