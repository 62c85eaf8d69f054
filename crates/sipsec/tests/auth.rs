//! Digest authentication end to end, against each user database: SQLite always, PostgreSQL and
//! MariaDB when their URLs are given (`SIPSEC_TEST_POSTGRES`, `SIPSEC_TEST_MARIADB`; `.ci/run`
//! starts both and sets them, and under CI a missing one is a failure).
//!
//! Per database: `sipsec users` imports, adds, lists and removes; real SIPp registers and calls
//! with digest credentials from an injection file; raw requests show each refusal — wrong
//! password, unknown user, replayed nonce count, stale nonce, spoofed From; a user added while
//! the server runs can register a second later without a restart. On the network databases, a
//! relay between server and database is cut to make an outage: unknown users get 503 with
//! Retry-After, known users still get through, and all is well again when the relay returns.

mod common;

use common::relay::Relay;
use common::*;
use sip_core::digest::Challenge;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The databases to test against: (name, URL for a fresh run).
/// The URL of database `name` for this test: SQLite in `dir`, or the network database its
/// variable names (the test is ignored without it, by the build script, outside CI).
fn database(name: &str, dir: &Path) -> String {
    let var = match name {
        "sqlite" => return format!("sqlite://{}", dir.join("users.db").display()),
        "postgresql" => "SIPSEC_TEST_POSTGRES",
        _ => "SIPSEC_TEST_MARIADB",
    };
    std::env::var(var).unwrap_or_else(|_| panic!("{var} must name a {name} database"))
}

/// A realm of its own per run, so runs sharing a network database do not meet.
fn realm() -> String {
    format!(
        "r{}-{}.test",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    )
}

/// A server config, on the default algorithms (MD5 only), which SIPp 3.6 answers. SHA-256 is
/// covered by the unit tests and `sipsec load`.
fn config(port: u16, url: &str, realm: &str, extra: &str) -> String {
    format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\ndomains = [\"example.test\"]\nworkers = 2\n\
         [routing]\ndefault_route = \"sip:127.0.0.1:{};transport=udp\"\n\
         [database]\nurl = \"{url}\"\n\
         [auth]\nscheme = \"digest\"\nrealm = \"{realm}\"\nnonce_lifetime_s = 2\n\
         max_failures_per_user = 1000\nmax_failures_per_source = 1000\n{extra}",
        port + 1
    )
}

/// `sipsec users …` with the config in `dir`; returns (success, stdout, stderr).
fn users(dir: &Path, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .arg("users")
        .args(["--config", dir.join("sipsec.toml").to_str().unwrap()])
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What `sipsec users` wrote is in the SQLite file itself when it exits, not left in the
/// write-ahead log: a copy of the file (a backup, or a database seeded for another server)
/// holds every user. (A WAL left behind once made every digest row of the lab fail: its
/// copies had no users.)
#[test]
fn a_copy_of_the_database_file_after_users_import_holds_the_users() {
    let dir = tempfile::tempdir().unwrap();
    let url = database("sqlite", dir.path());
    std::fs::write(
        dir.path().join("sipsec.toml"),
        config(ports(23100), &url, "copy.test", ""),
    )
    .unwrap();
    std::fs::write(dir.path().join("users.csv"), "user0,pw0\nuser1,pw1\n").unwrap();
    let (ok, out, err) = users(dir.path(), &["import", "users.csv"], "");
    assert!(ok, "{out}{err}");
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(dir.path().join("users.db"), copy.path().join("users.db")).unwrap();
    std::fs::write(
        copy.path().join("sipsec.toml"),
        config(
            ports(23100),
            &database("sqlite", copy.path()),
            "copy.test",
            "",
        ),
    )
    .unwrap();
    let (ok, list, err) = users(copy.path(), &["list"], "");
    assert!(ok, "{err}");
    assert_eq!(list, "user0\nuser1\n");
}

/// An INVITE from `user` (From) to a domain not ours (so it takes the default route to the
/// SIPp callee), with `auth` as an extra header line.
fn invite(ep: &Endpoint, server: &str, user: &str, call: &str, cseq: u32, auth: &str) -> String {
    format!(
        "INVITE sip:bob@elsewhere.test SIP/2.0\r\n\
         Via: SIP/2.0/UDP {};branch=z9hG4bK-{call}-{cseq}\r\n\
         Max-Forwards: 70\r\nFrom: <sip:{user}@example.test>;tag=t{call}\r\n\
         To: <sip:bob@elsewhere.test>\r\nCall-ID: {call}@{server}\r\nCSeq: {cseq} INVITE\r\n\
         Contact: <sip:{user}@{}>\r\n{auth}Content-Length: 0\r\n\r\n",
        ep.addr, ep.addr
    )
}

/// The status line's code of a response.
fn code(response: &str) -> u16 {
    response[8..11].parse().unwrap()
}

/// The first Proxy-Authenticate challenge in a response.
fn challenge(response: &str) -> Challenge {
    let line = response
        .lines()
        .find(|l| l.starts_with("Proxy-Authenticate:"))
        .unwrap_or_else(|| panic!("no challenge in {response}"));
    Challenge::parse(line.split_once(": ").unwrap().1.as_bytes()).unwrap()
}

fn credentials(c: &Challenge, user: &str, password: &str, nc: u32) -> String {
    format!(
        "Proxy-Authorization: {}\r\n",
        c.authorization(
            user,
            password,
            "INVITE",
            "sip:bob@elsewhere.test",
            nc,
            "abc"
        )
    )
}

/// Sends a request and returns its first response other than 100 (responses to earlier
/// requests, still arriving, are skipped by Call-ID and CSeq).
fn ask(ep: &Endpoint, server: &str, text: &str) -> String {
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap()
            .to_string()
    };
    let (call_id, cseq) = (line("Call-ID:"), line("CSeq:"));
    ep.send(server, text);
    loop {
        let r = ep.recv();
        if !r.starts_with("SIP/2.0 100") && r.contains(&call_id) && r.contains(&cseq) {
            return r;
        }
    }
}

/// Challenges, then answers; returns the answer's response.
fn call_with(ep: &Endpoint, server: &str, user: &str, password: &str, call: &str) -> String {
    let c = challenge(&ask(ep, server, &invite(ep, server, user, call, 1, "")));
    ask(
        ep,
        server,
        &invite(
            ep,
            server,
            user,
            call,
            2,
            &credentials(&c, user, password, 1),
        ),
    )
}

#[test]
#[cfg_attr(
    sipsec_skip_sipp,
    ignore = "SIPp is not installed (apt-get install sip-tester)"
)]
fn digest_with_sipp_and_every_refusal_on_sqlite() {
    digest_with_sipp_and_every_refusal("sqlite");
}

#[test]
#[cfg_attr(
    any(sipsec_skip_sipp, sipsec_skip_postgres),
    ignore = "needs SIPp and SIPSEC_TEST_POSTGRES"
)]
fn digest_with_sipp_and_every_refusal_on_postgresql() {
    digest_with_sipp_and_every_refusal("postgresql");
}

#[test]
#[cfg_attr(
    any(sipsec_skip_sipp, sipsec_skip_mariadb),
    ignore = "needs SIPp and SIPSEC_TEST_MARIADB"
)]
fn digest_with_sipp_and_every_refusal_on_mariadb() {
    digest_with_sipp_and_every_refusal("mariadb");
}

fn digest_with_sipp_and_every_refusal(db: &str) {
    if !have_sipp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    {
        let url = database(db, dir.path());
        let port = ports(23000);
        let realm = realm();
        std::fs::write(
            dir.path().join("sipsec.toml"),
            config(port, &url, &realm, ""),
        )
        .unwrap();

        // Users: 100 from a CSV (with a header), one added by hand, one removed.
        let mut csv = String::from("username,password\n");
        for n in 0..100 {
            csv += &format!("user{n},pw{n}\n");
        }
        std::fs::write(dir.path().join("users.csv"), &csv).unwrap();
        let (ok, out, err) = users(dir.path(), &["import", "users.csv"], "");
        assert!(ok && out.contains("100 users"), "{db}: {out}{err}");
        let (ok, _, err) = users(dir.path(), &["add", "alice"], "wonderland\n");
        assert!(ok, "{db}: {err}");
        let (ok, _, err) = users(dir.path(), &["remove", "user99"], "");
        assert!(ok, "{db}: {err}");
        let (ok, _, err) = users(dir.path(), &["remove", "nobody"], "");
        assert!(!ok && err.contains("no user"), "{db}: {err}");
        let (_, list, _) = users(dir.path(), &["list"], "");
        assert_eq!(list.lines().count(), 100, "{db}: {list}");
        assert!(list.contains("alice\n") && !list.contains("user99\n"));
        let (ok, _, err) = users(dir.path(), &["add", "bad name"], "x\n");
        assert!(!ok && err.contains("not a valid user name"), "{db}: {err}");

        let server = Server::start_logged(dir.path(), &config(port, &url, &realm, ""));
        let target = format!("127.0.0.1:{port}");

        // SIPp: 50 users register, then 50 call, each answering the challenge.
        let mut inf = String::from("SEQUENTIAL\n");
        for n in 0..50 {
            // SIPp expands no field inside [authentication …], so the whole keyword is one.
            inf += &format!("user{n};pw{n};[authentication username=user{n} password=pw{n}]\n");
        }
        std::fs::write(dir.path().join("users.inf"), inf).unwrap();
        // Each of the 50 users once, 50 a second, through scenario `xml` (with `extra`).
        let each_user = |xml: &str, extra: &[&str]| {
            let sf = scenario(xml);
            let mut args = vec!["-sf", sf.to_str().unwrap(), "-inf", "users.inf"];
            args.extend(["-m", "50", "-r", "50", "-i", "127.0.0.1"]);
            args.extend_from_slice(extra);
            sipp_client(dir.path(), &target, &args)
        };
        let reg = each_user("register_auth.xml", &[]);
        assert_eq!(
            (reg.successful, reg.failed),
            (50, 0),
            "{db}: {}",
            server.log()
        );
        let _uas = sipp_uas_with("127.0.0.1", port + 1, &["-sn", "uas"]);
        let calls = each_user("uac_auth.xml", &["-s", "bob"]);
        assert_eq!(
            (calls.successful, calls.failed),
            (50, 0),
            "{db}: {}",
            server.log()
        );

        // SIPp's own -au/-ap: a bare [authentication] takes them.
        std::fs::write(
            dir.path().join("alice.inf"),
            "SEQUENTIAL\nalice;wonderland;[authentication]\n",
        )
        .unwrap();
        let alice = sipp_client(
            dir.path(),
            &target,
            &[
                "-sf",
                scenario("register_auth.xml").to_str().unwrap(),
                "-inf",
                "alice.inf",
                "-au",
                "alice",
                "-ap",
                "wonderland",
                "-m",
                "1",
                "-i",
                "127.0.0.1",
            ],
        );
        assert_eq!((alice.successful, alice.failed), (1, 0), "{db}: -au/-ap");

        let ep = Endpoint::bind("127.0.0.1:0");
        // The right password passes (the call is proxied: 180/200 or the UAS's answer).
        let ok = call_with(&ep, &target, "alice", "wonderland", "ok1");
        assert!(code(&ok) < 300, "{db}: {ok}");
        // Wrong password, unknown user, removed user: challenged again, alike.
        for (user, pw) in [("alice", "guess"), ("mallory", "x"), ("user99", "pw99")] {
            let r = call_with(&ep, &target, user, pw, &format!("bad-{user}"));
            assert_eq!(code(&r), 407, "{db} {user}: {r}");
            assert!(!challenge(&r).stale);
        }
        // A replayed nonce count, on a new transaction.
        let c = challenge(&ask(
            &ep,
            &target,
            &invite(&ep, &target, "alice", "rp", 1, ""),
        ));
        let creds = credentials(&c, "alice", "wonderland", 1);
        assert!(
            code(&ask(
                &ep,
                &target,
                &invite(&ep, &target, "alice", "rp", 2, &creds)
            )) < 300
        );
        let replay = ask(
            &ep,
            &target,
            &invite(&ep, &target, "alice", "rp2", 2, &creds),
        );
        assert_eq!(code(&replay), 407, "{db}: {replay}");
        // Spoofing: alice's credentials on a request From bob.
        let c = challenge(&ask(
            &ep,
            &target,
            &invite(&ep, &target, "bob", "sp", 1, ""),
        ));
        let spoof = ask(
            &ep,
            &target,
            &invite(
                &ep,
                &target,
                "bob",
                "sp",
                2,
                &credentials(&c, "alice", "wonderland", 1),
            ),
        );
        assert_eq!(code(&spoof), 403, "{db}: {spoof}");
        // A stale nonce (lifetime 2 s) with the right password: stale=true.
        let c = challenge(&ask(
            &ep,
            &target,
            &invite(&ep, &target, "alice", "st", 1, ""),
        ));
        std::thread::sleep(Duration::from_millis(2_500));
        let stale = ask(
            &ep,
            &target,
            &invite(
                &ep,
                &target,
                "alice",
                "st",
                2,
                &credentials(&c, "alice", "wonderland", 1),
            ),
        );
        assert_eq!(code(&stale), 407, "{db}: {stale}");
        assert!(challenge(&stale).stale, "{db}: {stale}");

        // A user added while the server runs works within a couple of seconds.
        let (ok, _, err) = users(dir.path(), &["add", "late", "--password", "comer"], "");
        assert!(ok, "{err}");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let r = call_with(
                &ep,
                &target,
                "late",
                "comer",
                &format!("late{}", deadline.elapsed().as_nanos()),
            );
            if code(&r) < 300 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{db}: the new user never worked: {r}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let c = server.stop_counters();
        // 50 registrations, 50 SIPp calls, and the raw calls of alice (2) and the late user.
        assert!(c.get("auth_passed") >= 50 + 50 + 3, "{db}: {c:?}");
        assert!(c.get("auth_failed") >= 3, "{db}: {c:?}");
        assert_eq!(c.get("auth_replays"), 1, "{db}: {c:?}");
        assert_eq!(c.get("auth_identity_mismatches"), 1, "{db}: {c:?}");
        assert!(c.get("auth_stale") >= 1, "{db}: {c:?}");
    }
}

#[test]
#[cfg_attr(
    any(sipsec_skip_sipp, sipsec_skip_postgres),
    ignore = "needs SIPp and SIPSEC_TEST_POSTGRES"
)]
fn a_postgresql_outage_is_answered_503_and_recovers_by_itself() {
    a_database_outage_is_answered_503_and_recovers_by_itself("postgresql");
}

#[test]
#[cfg_attr(
    any(sipsec_skip_sipp, sipsec_skip_mariadb),
    ignore = "needs SIPp and SIPSEC_TEST_MARIADB"
)]
fn a_mariadb_outage_is_answered_503_and_recovers_by_itself() {
    a_database_outage_is_answered_503_and_recovers_by_itself("mariadb");
}

fn a_database_outage_is_answered_503_and_recovers_by_itself(db: &str) {
    if !have_sipp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    {
        let i = 0;
        let url = database(db, dir.path());
        let (relay, relayed) = Relay::for_database(&url);
        let port = ports(23500) + 100 * i as u16;
        let realm = realm();
        std::fs::write(
            dir.path().join("sipsec.toml"),
            config(port, &url, &realm, ""),
        )
        .unwrap();
        let (ok, _, err) = users(
            dir.path(),
            &["add", "alice", "--password", "wonderland"],
            "",
        );
        assert!(ok, "{db}: {err}");
        let server = Server::start_logged(dir.path(), &config(port, &relayed, &realm, ""));
        let _uas = sipp_uas_with("127.0.0.1", port + 1, &["-sn", "uas"]);
        let target = format!("127.0.0.1:{port}");
        let ep = Endpoint::bind("127.0.0.1:0");
        assert!(
            code(&call_with(&ep, &target, "alice", "wonderland", "a1")) < 300,
            "{db}: {}",
            server.log()
        );

        relay.up.store(false, Ordering::SeqCst);
        // The next poll fails (within the pool's 5 s acquire timeout).
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let r = call_with(
                &ep,
                &target,
                "carol",
                "x",
                &format!("c{}", deadline.elapsed().as_nanos()),
            );
            if code(&r) == 503 {
                assert!(r.contains("Retry-After:"), "{r}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{db}: no 503 during the outage: {r}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        // Known users are still authenticated from memory.
        assert!(code(&call_with(&ep, &target, "alice", "wonderland", "a2")) < 300);

        relay.up.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let r = call_with(
                &ep,
                &target,
                "carol",
                "x",
                &format!("d{}", deadline.elapsed().as_nanos()),
            );
            if code(&r) == 407 {
                break;
            }
            assert!(Instant::now() < deadline, "{db}: never recovered: {r}");
            std::thread::sleep(Duration::from_millis(300));
        }
        let log = server.log();
        // Said once per worker for the outage, however many requests it refused.
        let notices = log
            .matches("user database unavailable: answering 503")
            .count();
        assert!((1..=2).contains(&notices), "{notices} notices: {log}");
    }
}

#[test]
fn without_the_credential_cache_every_authentication_queries_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(23900);
    let url = format!("sqlite://{}", dir.path().join("users.db").display());
    let realm = realm();
    std::fs::write(
        dir.path().join("sipsec.toml"),
        config(port, &url, &realm, "credential_cache = false\n"),
    )
    .unwrap();
    let (ok, _, err) = users(dir.path(), &["add", "alice"], "wonderland\n");
    assert!(ok, "{err}");
    let server = Server::start_logged(
        dir.path(),
        &std::fs::read_to_string(dir.path().join("sipsec.toml")).unwrap(),
    );
    let _uas = LoadUas::start(dir.path(), &format!("127.0.0.1:{}", port + 1), &[]);
    let ep = Endpoint::bind("127.0.0.1:0");
    let target = format!("127.0.0.1:{port}");
    let good = call_with(&ep, &target, "alice", "wonderland", "u1");
    assert!(matches!(code(&good), 180 | 200), "{good}");
    assert_eq!(code(&call_with(&ep, &target, "alice", "wrong", "u2")), 407);
    assert_eq!(code(&call_with(&ep, &target, "nobody", "x", "u3")), 407);
    // A user added now is known at once: nothing is cached.
    let (ok, _, err) = users(dir.path(), &["add", "bob"], "builder\n");
    assert!(ok, "{err}");
    let bob = call_with(&ep, &target, "bob", "builder", "u4");
    assert!(matches!(code(&bob), 180 | 200), "{bob}");
    let c = server.stop_counters();
    assert!(
        c.get("auth_waited") >= 4,
        "each answer waited for its query"
    );
    assert!(c.get("auth_passed") >= 2 && c.get("auth_failed") >= 2);
}

/// One baresip softphone: `(user, password)`, on `ip`, registering through `outbound`,
/// answering calls by itself; `extra` config lines (TLS files). Runs `commands` at start and
/// quits after `seconds`; its output (with a SIP trace) goes to `dir/user.log`.
fn baresip(
    dir: &Path,
    (user, password): (&str, &str),
    ip: &str,
    outbound: &str,
    extra: &str,
    commands: &[&str],
    seconds: u32,
) -> std::process::Child {
    let home = dir.join(user);
    std::fs::create_dir_all(&home).unwrap();
    // Opus at 48 kHz because the sine source (no sound card here) only makes 48 kHz.
    std::fs::write(
        home.join("config"),
        format!(
            "sip_listen {ip}:5060\nnet_interface {ip}\nmodule_path /usr/lib/baresip/modules\n\
             module opus.so\nmodule ausine.so\nmodule aufile.so\nmodule_app account.so\n\
             module_app menu.so\naudio_source ausine,440\naudio_player aufile,/dev/null\n\
             audio_alert aufile,/dev/null\n{extra}"
        ),
    )
    .unwrap();
    std::fs::write(
        home.join("accounts"),
        format!(
            "<sip:{user}@example.test>;auth_pass={password};outbound=\"{outbound}\";\
             regint=600;answermode=auto\n"
        ),
    )
    .unwrap();
    let mut cmd = Command::new("baresip");
    cmd.arg("-f")
        .arg(&home)
        .args(["-s", "-t", &seconds.to_string()]);
    for c in commands {
        cmd.args(["-e", c]);
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("{user}.log"))).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start baresip")
}

/// Softphones, killed when the test ends however it ends.
struct Phones(Vec<std::process::Child>);

impl Drop for Phones {
    fn drop(&mut self) {
        for p in &mut self.0 {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

fn wait_for_line(log: &Path, text: &str, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if std::fs::read_to_string(log).is_ok_and(|l| l.contains(text)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// baresip, a real softphone, against the server's default digest settings (MD5 offered
/// alone: README, "MD5 by default"), over UDP, TCP and TLS at once: per transport a callee
/// and a caller register, the caller calls the callee, who answers, and hangs up after a few
/// seconds of audio. Every REGISTER and INVITE is challenged and answered, the call is
/// record-routed, and no answer is refused.
#[test]
#[cfg_attr(
    sipsec_skip_baresip,
    ignore = "baresip is not installed (apt-get install baresip-core)"
)]
fn baresip_registers_and_calls_on_the_default_digest_settings() {
    assert!(
        Command::new("baresip").arg("-h").output().is_ok(),
        "baresip (Debian package baresip-core) is required under CI"
    );
    let dir = tempfile::tempdir().unwrap();
    let port = ports(23950);
    let f = make_certs(dir.path());
    let (cert, key, ca) = (f("server.pem"), f("server-key.pem"), f("ca.pem"));
    // The TLS callee is a server too: the proxy connects to its contact address and checks
    // its certificate, made by the same CA for that address; baresip reads certificate and
    // key from one file.
    let phone_certs = dir.path().join("phone");
    std::fs::create_dir_all(&phone_certs).unwrap();
    for file in ["ca.pem", "ca-key.pem"] {
        std::fs::copy(dir.path().join(file), phone_certs.join(file)).unwrap();
    }
    let made = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args(["certs", "--name", "127.0.33.2", "--out"])
        .arg(&phone_certs)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let both = dir.path().join("baresip.pem");
    std::fs::write(
        &both,
        std::fs::read_to_string(phone_certs.join("server.pem")).unwrap()
            + &std::fs::read_to_string(phone_certs.join("server-key.pem")).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("sipsec.toml"),
        format!(
            "[server]\nlisten = [\"udp:127.0.0.1:{port}\", \"tcp:127.0.0.1:{port}\", \
             \"tls:127.0.0.1:{}\"]\ndomains = [\"example.test\"]\nrecord_route = true\n\
             [tls]\ncert = \"{cert}\"\nkey = \"{key}\"\nca = \"{ca}\"\n\
             [database]\nurl = \"sqlite://users.db\"\n[auth]\nscheme = \"digest\"\n",
            port + 1
        ),
    )
    .unwrap();
    let transports = [
        ("udp", format!("sip:127.0.0.1:{port}"), 31),
        ("tcp", format!("sip:127.0.0.1:{port};transport=tcp"), 32),
        (
            "tls",
            format!("sip:127.0.0.1:{};transport=tls", port + 1),
            33,
        ),
    ];
    for (t, _, _) in &transports {
        for who in ["caller", "callee"] {
            let (ok, _, err) = users(
                dir.path(),
                &[
                    "add",
                    &format!("{who}-{t}"),
                    "--password",
                    &format!("pw-{t}"),
                ],
                "",
            );
            assert!(ok, "{err}");
        }
    }
    let config = std::fs::read_to_string(dir.path().join("sipsec.toml")).unwrap();
    let server = Server::start_logged(dir.path(), &config);
    let tls_files = format!("sip_cafile {ca}\nsip_certificate {}\n", both.display());
    let mut phones = Phones(Vec::new());
    for (t, outbound, net) in &transports {
        let extra = if *t == "tls" { tls_files.as_str() } else { "" };
        let callee = format!("callee-{t}");
        phones.0.push(baresip(
            dir.path(),
            (&callee, &format!("pw-{t}")),
            &format!("127.0.{net}.2"),
            outbound,
            extra,
            &[],
            30,
        ));
        assert!(
            wait_for_line(
                &dir.path().join(format!("{callee}.log")),
                "200 OK (sipsec)",
                Duration::from_secs(10)
            ),
            "{callee} did not register: {}",
            std::fs::read_to_string(dir.path().join(format!("{callee}.log"))).unwrap()
        );
        phones.0.push(baresip(
            dir.path(),
            (&format!("caller-{t}"), &format!("pw-{t}")),
            &format!("127.0.{net}.1"),
            outbound,
            extra,
            &[&format!("/dial callee-{t}@example.test")],
            8,
        ));
    }
    for (t, _, _) in &transports {
        let log =
            |who: &str| std::fs::read_to_string(dir.path().join(format!("{who}-{t}.log"))).unwrap();
        assert!(
            wait_for_line(
                &dir.path().join(format!("caller-{t}.log")),
                "terminated (duration",
                Duration::from_secs(20)
            ),
            "{t}: the call did not end: {}",
            log("caller")
        );
        let (caller, callee) = (log("caller"), log("callee"));
        assert!(caller.contains("Call established"), "{t}: {caller}");
        assert!(callee.contains("Call established"), "{t}: {callee}");
        // The callee saw the INVITE record-routed by the proxy.
        assert!(
            callee.contains("Record-Route: <sip:127.0.0.1:"),
            "{t}: {callee}"
        );
    }
    drop(phones);
    let c = server.stop_counters();
    // Per transport: two REGISTERs and one INVITE, each challenged once and then let in.
    assert!(c.get("auth_challenged") >= 9, "{c:?}");
    assert!(c.get("auth_passed") >= 9, "{c:?}");
    assert_eq!(c.get("auth_failed"), 0, "{c:?}");
    assert!(c.get("registrations") >= 6, "{c:?}");
}

/// A REGISTER of `user` from `ep`, with `auth` as an extra header line.
fn register(ep: &Endpoint, user: &str, cseq: u32, auth: &str) -> String {
    format!(
        "REGISTER sip:example.test SIP/2.0\r\n\
         Via: SIP/2.0/UDP {};branch=z9hG4bK-reg-{cseq}\r\n\
         Max-Forwards: 70\r\nFrom: <sip:{user}@example.test>;tag=r{cseq}\r\n\
         To: <sip:{user}@example.test>\r\nCall-ID: reg-{user}@{}\r\nCSeq: {cseq} REGISTER\r\n\
         Contact: <sip:{user}@{}>\r\nExpires: 600\r\n{auth}Content-Length: 0\r\n\r\n",
        ep.addr, ep.addr, ep.addr
    )
}

/// Registers `user` from `ep` as a phone does: asks, takes the 401's challenge, answers it.
/// Returns the answer's status code.
fn register_with(ep: &Endpoint, server: &str, user: &str, password: &str, cseq: u32) -> u16 {
    let first = ask(ep, server, &register(ep, user, cseq, ""));
    let Some(line) = first.lines().find(|l| l.starts_with("WWW-Authenticate:")) else {
        return code(&first);
    };
    let c = Challenge::parse(line.split_once(": ").unwrap().1.as_bytes()).unwrap();
    let auth = c.authorization(user, password, "REGISTER", "sip:example.test", 1, "abc");
    code(&ask(
        ep,
        server,
        &register(ep, user, cseq + 1, &format!("Authorization: {auth}\r\n")),
    ))
}

/// sipvicious's `svcrack`, the password guesser attackers run against SIP servers, guessing
/// bob's password from one address on the default throttle settings (10 failures per user a
/// minute): every guess counts once, the 11th and later are refused without being checked,
/// so the right password, 16th in the dictionary, is never tried; bob's own phone, which
/// authenticated before the attack, still registers during it, and so does bob from an address
/// he never used: one address guessing cannot lock bob out of a new network.
#[test]
#[cfg_attr(
    sipsec_skip_svcrack,
    ignore = "svcrack is not installed (apt-get install sipvicious)"
)]
fn svcrack_guessing_a_password_is_stopped_after_the_configured_failures() {
    assert!(
        Command::new("svcrack").arg("--version").output().is_ok(),
        "svcrack (Debian package sipvicious) is required under CI"
    );
    let dir = tempfile::tempdir().unwrap();
    let port = ports(24000);
    std::fs::write(
        dir.path().join("sipsec.toml"),
        format!(
            "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\ndomains = [\"example.test\"]\n\
             [database]\nurl = \"sqlite://users.db\"\n[auth]\nscheme = \"digest\"\n"
        ),
    )
    .unwrap();
    let (ok, _, err) = users(dir.path(), &["add", "bob", "--password", "tr0ub4dor"], "");
    assert!(ok, "{err}");
    let config = std::fs::read_to_string(dir.path().join("sipsec.toml")).unwrap();
    let server = Server::start_logged(dir.path(), &config);
    let target = format!("127.0.0.1:{port}");
    let phone = Endpoint::bind("127.0.46.1:0");
    assert_eq!(register_with(&phone, &target, "bob", "tr0ub4dor", 1), 200);

    let dictionary = dir.path().join("dictionary.txt");
    let mut words: Vec<String> = (1..=15).map(|i| format!("guess{i}")).collect();
    words.push("tr0ub4dor".into());
    std::fs::write(&dictionary, words.join("\n") + "\n").unwrap();
    let out = Command::new("timeout")
        .arg("60")
        .arg("svcrack")
        .args(["-u", "bob", "-d"])
        .arg(&dictionary)
        .args(["-p", &port.to_string(), "-P", &(port + 1).to_string()])
        .args(["-b", "127.0.0.1", "127.0.0.1"])
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("tr0ub4dor"), "svcrack found it: {said}");

    // The phone is known for bob: the guesser's block is not its block.
    assert_eq!(register_with(&phone, &target, "bob", "tr0ub4dor", 3), 200);
    // Nor is the block of one guessing address bob's block at an address he never used.
    let new_network = Endpoint::bind("127.0.47.1:0");
    assert_eq!(
        register_with(&new_network, &target, "bob", "tr0ub4dor", 1),
        200
    );

    let c = server.stop_counters();
    assert_eq!(c.get("auth_failed"), 10, "one count per wrong guess: {c:?}");
    assert_eq!(
        c.get("auth_throttled"),
        6,
        "guesses 11 to 16, unchecked: {c:?}"
    );
    assert_eq!(c.get("auth_passed"), 3, "{c:?}");
}
