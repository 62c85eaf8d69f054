//! Proxychain end to end, every part real: `sipsec authd` over mutual TLS with its user
//! database, `sipsec serve` with `scheme = "proxychain"`, and `sipsec load --proxychain` as
//! the users (plus raw SIP for the attacks).
//!
//! - calls authenticate (INVITE and BYE), chains run out and are renewed, the proxy waits for
//!   the authority only for a user's first chain; a client answering ahead (`--auth-reuse`)
//!   is challenged once per chain, not per request;
//! - a password change is pushed to the proxy: the old password stops working at once;
//! - attacks: a replayed response, a lowered counter, a response moved to another callee, a
//!   spoofed From, garbage credentials — each refused, the proxy unharmed;
//! - a proxy whose certificate the authority does not know is refused, and its callers get
//!   503, not a hang;
//! - the authority down: with backup credentials calls still authenticate, without them they
//!   get 503; a revoked proxy is cut off;
//! - a flood of connections that never handshake, past the authority's descriptors, neither
//!   stops it nor shuts a proxy out.

mod common;

use common::*;
use sip_core::proxychain::{self, Challenge, Hello};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const REALM: &str = "example.test";
const USERS: usize = 12;

/// A running `sipsec authd`, killed on drop.
struct Authd(Child);

impl Authd {
    fn start(dir: &Path, config: &Path) -> Authd {
        Self::start_with(dir, config, Command::new(env!("CARGO_BIN_EXE_sipsec")))
    }

    /// Started with at most `files` descriptors (soft and hard, so it cannot raise them).
    fn start_limited(dir: &Path, config: &Path, files: u64) -> Authd {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sipsec"));
        // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: files,
                    rlim_max: files,
                };
                match libc::setrlimit(libc::RLIMIT_NOFILE, &lim) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
        Self::start_with(dir, config, cmd)
    }

    fn start_with(dir: &Path, config: &Path, mut cmd: Command) -> Authd {
        let log = std::fs::File::create(dir.join("authd.log")).unwrap();
        let mut child = cmd
            .args(["authd", "--config", config.to_str().unwrap()])
            .current_dir(dir)
            .env("SIPSEC_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut banner = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut banner)
            .unwrap();
        assert!(
            banner.starts_with("sipsec authd listening"),
            "{banner:?}: {}",
            std::fs::read_to_string(dir.join("authd.log")).unwrap_or_default()
        );
        Authd(child)
    }
}

impl Drop for Authd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A lab: certificates (the proxy's certificate names it `proxy-1`), a user database with
/// `USERS` users (`user0..`, password `pw0..`), and the authority's config.
struct Lab {
    dir: tempfile::TempDir,
    port: u16,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let port = ports(29800);
        let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
            .args(["certs", "--client-name", "proxy-1", "--out"])
            .arg(dir.path().join("certs"))
            .output()
            .unwrap();
        assert!(out.status.success());
        let lab = Lab { dir, port };
        std::fs::write(
            lab.path("users.toml"),
            format!("[database]\nurl = \"sqlite://{}\"\n", lab.path("users.db")),
        )
        .unwrap();
        let csv: String = (0..USERS).map(|i| format!("user{i},pw{i}\n")).collect();
        std::fs::write(lab.path("users.csv"), &csv).unwrap();
        lab.users(&["import", &lab.path("users.csv")]);
        std::fs::write(
            lab.path("authd.toml"),
            format!(
                "[authd]\nlisten = \"127.0.0.1:{port}\"\nrealm = \"{REALM}\"\n\
                 database = \"sqlite://{}\"\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n\
                 chain_length = 4\n[metrics]\nlisten = \"127.0.0.1:{}\"\n",
                lab.path("users.db"),
                lab.path("certs/server.pem"),
                lab.path("certs/server-key.pem"),
                lab.path("certs/ca.pem"),
                port + 9,
            ),
        )
        .unwrap();
        lab
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }

    /// Runs `sipsec authd ARGS` on the authority's configuration.
    fn authd_command(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_sipsec"))
            .args(["authd", "--config", &self.path("authd.toml")])
            .args(args)
            .output()
            .unwrap()
    }

    fn users(&self, args: &[&str]) {
        let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
            .args([
                "users",
                "--config",
                &self.path("users.toml"),
                "--realm",
                REALM,
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The callee: a `sipsec load` UAS where the proxy routes calls.
    fn uas(&self) -> LoadUas {
        LoadUas::start(
            self.dir.path(),
            &format!("127.0.0.1:{}", self.port + 2),
            &[],
        )
    }

    fn authd(&self) -> Authd {
        Authd::start(self.dir.path(), Path::new(&self.path("authd.toml")))
    }

    /// The proxy's config: UDP on port+1, calls routed to the UAS on port+2, `extra` added to
    /// `[auth]` (with its `methods`); its certificate is `cert` (the lab's client certificate
    /// unless given).
    /// The authority, a proxy with the lab's settings and the callee, started in that order.
    fn start(&self) -> (Authd, Server, LoadUas) {
        (self.authd(), self.proxy(""), self.uas())
    }

    fn proxy_config(&self, certs: &str, extra: &str) -> String {
        let p = self.port;
        format!(
            "[server]\nlisten = [\"udp:127.0.0.1:{}\"]\ndomains = [\"{REALM}\"]\nworkers = 2\n\
             [routing]\ndefault_route = \"sip:127.0.0.1:{};transport=udp\"\n\
             [database]\nurl = \"sqlite://{}\"\n\
             [tls]\ncert = \"{certs}/client.pem\"\nkey = \"{certs}/client-key.pem\"\n\
             ca = \"{certs}/ca.pem\"\n\
             [auth]\nscheme = \"proxychain\"\nauthority = \"tls:127.0.0.1:{p}\"\n\
             chain_length = 4\nwait_ms = 1500\n{extra}",
            p + 1,
            p + 2,
            self.path("proxy.db"),
        )
    }

    /// A proxy that authenticates INVITE and BYE.
    fn proxy(&self, extra: &str) -> Server {
        self.proxy_for(r#"["INVITE", "BYE"]"#, extra)
    }

    fn proxy_for(&self, methods: &str, extra: &str) -> Server {
        Server::start_logged(
            self.dir.path(),
            &self.proxy_config(
                &self.path("certs"),
                &format!("methods = {methods}\n{extra}"),
            ),
        )
    }

    /// `sipsec load` calls through the proxy as the lab's users with `users_file`.
    fn calls(&self, users_file: &str, calls: u32) -> (i32, serde_json::Value, String) {
        self.calls_with(users_file, calls, &[])
    }

    fn calls_with(
        &self,
        users_file: &str,
        calls: u32,
        extra: &[&str],
    ) -> (i32, serde_json::Value, String) {
        self.calls_through(self.port + 1, users_file, calls, extra)
    }

    /// `sipsec load` calls through the proxy listening on `port`.
    fn calls_through(
        &self,
        port: u16,
        users_file: &str,
        calls: u32,
        extra: &[&str],
    ) -> (i32, serde_json::Value, String) {
        let calls = calls.to_string();
        let args = [
            &format!("127.0.0.1:{port}"),
            "--scenario",
            "call",
            "--local",
            "127.0.0.1",
            "--users",
            users_file,
            "--domain",
            "elsewhere.test",
            "--proxychain",
            "--proxychain-realm",
            REALM,
            "--rate",
            "40",
            "--calls",
            &calls,
        ];
        load(self.dir.path(), &[&args[..], extra].concat())
    }
}

#[test]
fn calls_authenticate_through_the_chain_and_a_new_password_is_pushed() {
    let lab = Lab::new();
    let (_authd, proxy, uas) = lab.start();
    // 60 calls over 12 users: 5 calls, 10 authentications (INVITE and BYE) per user on
    // chains of 4, so every user's chain is renewed at least twice.
    let (code, summary, stderr) = lab.calls(&lab.path("users.csv"), 60);
    assert_eq!(code, 0, "{summary}\n{stderr}");
    assert_eq!(n(&summary, "succeeded"), 60, "{summary}");
    // A new password for user0: the authority pushes a revocation, so the chain the proxy
    // holds (made from the old key) is dropped and the old password no longer works.
    lab.users(&["add", "user0", "--password", "changed"]);
    std::thread::sleep(Duration::from_millis(2500));
    std::fs::write(lab.path("user0-old.csv"), "user0,pw0\n").unwrap();
    let (_, summary, _) = lab.calls(&lab.path("user0-old.csv"), 3);
    assert_eq!(n(&summary, "succeeded"), 0, "old password: {summary}");
    let reasons = summary["failures_by_reason"].to_string();
    assert!(reasons.contains("network HMAC"), "{reasons}");
    std::fs::write(lab.path("user0-new.csv"), "user0,changed\n").unwrap();
    let (code, summary, _) = lab.calls(&lab.path("user0-new.csv"), 3);
    assert_eq!((code, n(&summary, "succeeded")), (0, 3), "{summary}");
    // The authority's own /metrics says the same, scraped as Prometheus would.
    let out = Command::new("curl")
        .arg(format!("http://127.0.0.1:{}/metrics", lab.port + 9))
        .output()
        .expect("curl");
    let body = String::from_utf8_lossy(&out.stdout);
    let value = |name: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{body}"))
    };
    assert!(
        value("sipsec_authd_chains_issued_total") >= 24.0,
        "two chains per user at least"
    );
    assert!(value("sipsec_authd_revocations_pushed_total") >= 1.0);
    assert_eq!(value("sipsec_authd_users"), USERS as f64);
    assert_eq!(value("sipsec_authd_proxies_connected"), 1.0);
    drop(uas);
    let c = proxy.stop_counters();
    assert!(c.get("auth_passed") >= 126, "INVITE and BYE of 63 calls");
    assert!(
        c.get("auth_waited") >= USERS as u64,
        "first chains are fetched"
    );
    let log = std::fs::read_to_string(lab.path("authd.log")).unwrap();
    assert!(log.contains("revocation pushed"), "{log}");
}

/// Two proxies — two nodes of a cluster, each with its own certificate (`proxy-1`,
/// `proxy-2`) — share one authority, and each holds a chain for the same user (calls landed
/// on both). A new password reaches both: the authority pushes the revocation to every
/// proxy holding one of the user's chains, and the old password fails through either.
#[test]
fn a_new_password_reaches_every_proxy_holding_the_users_chain() {
    let lab = Lab::new();
    let (_authd, _proxy, _uas) = lab.start();
    let certs2 = lab.path("certs2");
    std::fs::create_dir_all(&certs2).unwrap();
    for f in ["ca.pem", "ca-key.pem"] {
        std::fs::copy(lab.path(&format!("certs/{f}")), format!("{certs2}/{f}")).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args(["certs", "--client-name", "proxy-2", "--out", &certs2])
        .output()
        .unwrap();
    assert!(out.status.success());
    let second = lab.port + 3;
    let p2 = lab.dir.path().join("p2");
    std::fs::create_dir_all(&p2).unwrap();
    let config = lab
        .proxy_config(&certs2, "methods = [\"INVITE\", \"BYE\"]\n")
        .replace(
            &format!("udp:127.0.0.1:{}", lab.port + 1),
            &format!("udp:127.0.0.1:{second}"),
        )
        .replace("proxy.db", "proxy2.db");
    let _proxy2 = Server::start_logged(&p2, &config);
    std::fs::write(lab.path("user0.csv"), "user0,pw0\n").unwrap();
    for port in [lab.port + 1, second] {
        let (code, summary, _) = lab.calls_through(port, &lab.path("user0.csv"), 2, &[]);
        assert_eq!(
            (code, n(&summary, "succeeded")),
            (0, 2),
            "{port}: {summary}"
        );
    }
    lab.users(&["add", "user0", "--password", "changed"]);
    std::thread::sleep(Duration::from_millis(2500));
    let log = std::fs::read_to_string(lab.path("authd.log")).unwrap();
    for proxy in ["proxy-1", "proxy-2"] {
        assert!(
            log.lines()
                .any(|l| l.contains("revocation pushed") && l.contains(proxy)),
            "{proxy}: {log}"
        );
    }
    for port in [lab.port + 1, second] {
        let (_, summary, _) = lab.calls_through(port, &lab.path("user0.csv"), 2, &[]);
        assert_eq!(
            n(&summary, "succeeded"),
            0,
            "{port}, old password: {summary}"
        );
    }
}

#[test]
fn a_client_answering_ahead_skips_the_challenge_until_its_chain_is_spent() {
    let lab = Lab::new();
    let _authd = lab.authd();
    for (methods, auths, most_challenges) in [
        // 48 calls over 12 users: 8 authentications (INVITE and BYE) each, two chains of
        // 4: one challenge per chain (about 24), not one per request (96).
        (r#"["INVITE", "BYE"]"#, 96, 40),
        // BYE not authenticated: the client must not spend counters on it, or every later
        // answer misses and is challenged (48). One chain of 4 per user: about 12.
        (r#"["INVITE"]"#, 48, 20),
    ] {
        let proxy = lab.proxy_for(methods, "");
        let uas = lab.uas();
        let (code, summary, stderr) = lab.calls_with(&lab.path("users.csv"), 48, &["--auth-reuse"]);
        assert_eq!(code, 0, "{methods}: {summary}\n{stderr}");
        assert_eq!(n(&summary, "succeeded"), 48, "{methods}: {summary}");
        drop(uas);
        let c = proxy.stop_counters();
        assert!(c.get("auth_passed") >= auths, "{methods}");
        let challenged = c.get("auth_challenged")
            + c.get("auth_replays")
            + c.get("auth_races")
            + c.get("auth_stale");
        assert!(
            challenged <= most_challenges,
            "{methods}: {challenged} challenges for {auths} authentications"
        );
    }
}

/// A raw UDP exchange with the proxy: the first response to `text` other than 100 (earlier
/// calls' late responses are skipped by Call-ID).
fn exchange(ep: &Endpoint, proxy: &str, text: &str) -> String {
    let call_id = text
        .lines()
        .find(|l| l.starts_with("Call-ID:"))
        .unwrap()
        .to_string();
    ep.send(proxy, text);
    loop {
        let m = ep.recv();
        if !m.starts_with("SIP/2.0 100") && m.lines().any(|l| l == call_id) {
            return m;
        }
    }
}

fn invite(ep: &Endpoint, user: &str, to: &str, call: &str, cseq: u32, auth: &str) -> String {
    format!(
        "INVITE sip:{to}@elsewhere.test SIP/2.0\r\n\
         Via: SIP/2.0/UDP {};branch=z9hG4bK-{call}-{cseq}\r\n\
         Max-Forwards: 70\r\nFrom: <sip:{user}@elsewhere.test>;tag=t{call}\r\n\
         To: <sip:{to}@elsewhere.test>\r\nCall-ID: {call}\r\nCSeq: {cseq} INVITE\r\n\
         Contact: <sip:{user}@{}>\r\nProxy-Authorization: {auth}\r\nContent-Length: 0\r\n\r\n",
        ep.addr, ep.addr
    )
}

fn status(m: &str) -> u16 {
    m[8..11].parse().unwrap()
}

fn challenge_in(m: &str) -> Option<Challenge> {
    let line = m
        .lines()
        .find_map(|l| l.strip_prefix("Proxy-Authenticate: "))?;
    Challenge::parse(line.as_bytes()).ok()
}

#[test]
fn attacks_on_the_proxy_are_refused() {
    let lab = Lab::new();
    let (_authd, proxy_server, _uas) = lab.start();
    let proxy = format!("127.0.0.1:{}", lab.port + 1);
    let ep = Endpoint::bind("127.0.0.1:0");
    let key = proxychain::user_key("user1", REALM, "pw1");
    let (a, b) = (b"user1@elsewhere.test", b"user2@elsewhere.test");
    let hello = |n: u8| {
        Hello {
            username: "user1".into(),
            n_ap: [n; 16],
        }
        .render()
    };
    // Hello → the full challenge (after the proxy fetched the chain).
    let m = exchange(
        &ep,
        &proxy,
        &invite(&ep, "user1", "user2", "c1", 1, &hello(1)),
    );
    assert_eq!(status(&m), 407, "{m}");
    let ch = challenge_in(&m).expect("a full challenge");
    assert_eq!((ch.realm.as_str(), ch.counter), ("proxy-1", 4));
    let r = proxychain::ClientChain::answer(&key, &ch, &[1; 16], "user1", a, b)
        .map(|(_, r)| r)
        .expect("the network proves itself");
    // The response moved to another callee: 403.
    let moved = invite(&ep, "user1", "user3", "c2", 1, &r.render());
    assert_eq!(status(&exchange(&ep, &proxy, &moved)), 403);
    // Spoofed From (user1's credentials on user3's call): 403.
    let spoofed = invite(&ep, "user3", "user2", "c3", 1, &r.render());
    assert_eq!(status(&exchange(&ep, &proxy, &spoofed)), 403);
    // Garbage credentials: 400.
    let garbage = invite(
        &ep,
        "user1",
        "user2",
        "c4",
        1,
        "PC username=\"user1\", nap=\"zz\"",
    );
    assert_eq!(status(&exchange(&ep, &proxy, &garbage)), 400);
    // The genuine response passes (the refusals did not step the chain).
    let good = invite(&ep, "user1", "user2", "c5", 1, &r.render());
    let m = exchange(&ep, &proxy, &good);
    assert!(status(&m) == 180 || status(&m) == 200, "{m}");
    // Replayed: only the hello challenge (no counter) comes back.
    let replay = invite(&ep, "user1", "user2", "c6", 1, &r.render());
    let m = exchange(&ep, &proxy, &replay);
    assert_eq!(status(&m), 407);
    assert!(
        challenge_in(&m).is_none(),
        "a replay gets no chain challenge: {m}"
    );
    // A lowered counter (the small-n attack from the client side): an old value for a lower
    // i does not verify either.
    let mut low = r.clone();
    low.counter = 1;
    low.value = proxychain::HashKind::Sha256.hash_n(
        proxychain::chain_root(proxychain::HashKind::Sha256, &key, &ch.n_da, "proxy-1"),
        0,
    );
    let m = exchange(
        &ep,
        &proxy,
        &invite(&ep, "user1", "user2", "c7", 1, &low.render()),
    );
    assert_eq!(status(&m), 407, "{m}");
    // The proxy is unharmed: the next hello is challenged at counter 3.
    let m = exchange(
        &ep,
        &proxy,
        &invite(&ep, "user1", "user2", "c8", 1, &hello(8)),
    );
    assert_eq!(challenge_in(&m).map(|c| c.counter), Some(3), "{m}");
    let c = proxy_server.stop_counters();
    assert!(c.get("auth_failed") >= 1 && c.get("auth_identity_mismatches") >= 1);
    assert!(c.get("auth_replays") >= 2 && c.get("auth_malformed") >= 1);
}

#[test]
fn a_proxy_the_authority_does_not_know_is_refused_and_its_callers_get_503() {
    let lab = Lab::new();
    let _authd = lab.authd();
    // Certificates from another CA: the authority cannot verify this proxy.
    let other = lab.path("other-certs");
    let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args(["certs", "--client-name", "impostor", "--out", &other])
        .output()
        .unwrap();
    assert!(out.status.success());
    // It trusts the real authority's CA but presents an unknown certificate.
    std::fs::copy(lab.path("certs/ca.pem"), format!("{other}/ca.pem")).unwrap();
    let proxy = Server::start_logged(
        lab.dir.path(),
        &lab.proxy_config(&other, "methods = [\"INVITE\", \"BYE\"]\n"),
    );
    let _uas = lab.uas();
    let (_, summary, _) = lab.calls(&lab.path("users.csv"), 6);
    assert_eq!(n(&summary, "succeeded"), 0, "{summary}");
    let reasons = summary["failures_by_reason"].to_string();
    assert!(reasons.contains("503"), "{reasons}");
    drop(proxy);
    let log = std::fs::read_to_string(lab.path("authd.log")).unwrap();
    assert!(log.contains("proxy refused"), "{log}");
}

#[test]
fn with_the_authority_down_backup_credentials_carry_the_calls() {
    let lab = Lab::new();
    let out = lab.authd_command(&[
        "backup",
        "--proxy",
        "proxy-1",
        "--length",
        "50",
        "--out",
        &lab.path("p1.backup"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _uas = lab.uas();
    // No authority running. With backup credentials, calls are authenticated.
    let with = lab.proxy(&format!("backup = \"{}\"\n", lab.path("p1.backup")));
    let (code, summary, stderr) = lab.calls(&lab.path("users.csv"), 24);
    assert_eq!(
        (code, n(&summary, "succeeded")),
        (0, 24),
        "{summary}\n{stderr}"
    );
    drop(with);
    // Without them, callers are told 503 (and no request hangs).
    let without = lab.proxy("");
    let (_, summary, _) = lab.calls(&lab.path("users.csv"), 6);
    assert_eq!(n(&summary, "succeeded"), 0, "{summary}");
    assert!(summary["failures_by_reason"].to_string().contains("503"));
    drop(without);
}

#[test]
fn a_revoked_proxy_is_cut_off() {
    let lab = Lab::new();
    let (_authd, proxy, _uas) = lab.start();
    let (code, _, _) = lab.calls(&lab.path("users.csv"), 12);
    assert_eq!(code, 0);
    let out = lab.authd_command(&["revoke-proxy", "proxy-1"]);
    assert!(out.status.success());
    std::thread::sleep(Duration::from_millis(2500));
    // The proxy says what happened: revoked, not an outage.
    let proxy_log = proxy.log();
    assert!(
        proxy_log.contains("closed the connection: this proxy is revoked"),
        "{proxy_log}"
    );
    assert!(!proxy_log.contains("unreachable"), "{proxy_log}");
    drop(proxy);
    let log = std::fs::read_to_string(lab.path("authd.log")).unwrap();
    assert!(log.contains("proxy revoked"), "{log}");
    // A new connection from it is refused, and told why.
    let proxy = lab.proxy("");
    std::thread::sleep(Duration::from_millis(1500));
    let proxy_log = proxy.log();
    assert!(proxy_log.contains("this proxy is revoked"), "{proxy_log}");
    drop(proxy);
    let log = std::fs::read_to_string(lab.path("authd.log")).unwrap();
    assert!(log.contains("proxy refused: revoked"), "{log}");
}

/// Connections from `ip` to the authority that never say a word.
fn silent_connections(ip: [u8; 4], port: u16, count: usize) -> Vec<std::net::TcpStream> {
    use socket2::{Domain, Socket, Type};
    (0..count)
        .map(|_| {
            let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
            s.bind(&std::net::SocketAddr::from((ip, 0)).into()).unwrap();
            s.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())
                .unwrap();
            s.into()
        })
        .collect()
}

#[test]
fn a_flood_of_silent_connections_neither_stops_the_authority_nor_shuts_a_proxy_out() {
    let lab = Lab::new();
    // 64 descriptors: the flood runs the authority out of them.
    let authd = Authd::start_limited(lab.dir.path(), Path::new(&lab.path("authd.toml")), 64);
    let log = || std::fs::read_to_string(lab.path("authd.log")).unwrap();
    let flood: Vec<_> = (2..6)
        .flat_map(|i| silent_connections([127, 0, 0, i], lab.port, 32))
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        log().contains("accepting a proxy connection failed"),
        "{}",
        log()
    );
    drop(flood);
    std::thread::sleep(Duration::from_millis(500));
    // One address holds its 32 handshakes; its next connections are closed at once.
    let held = silent_connections([127, 0, 0, 6], lab.port, 40);
    let opened = std::time::Instant::now();
    let refused = held
        .iter()
        .filter(|c| closed_by_peer(c, Duration::from_millis(100)))
        .count();
    assert_eq!(refused, 8, "past 32 handshakes from one address");
    // Meanwhile a proxy from another address connects, and its callers authenticate.
    let proxy = lab.proxy("");
    let uas = lab.uas();
    let (code, summary, stderr) = lab.calls(&lab.path("users.csv"), 12);
    assert_eq!(code, 0, "{summary}\n{stderr}");
    assert_eq!(n(&summary, "succeeded"), 12, "{summary}");
    // The silent ones are closed at the handshake timeout (10 s).
    for c in &held {
        assert!(closed_by_peer(c, Duration::from_secs(15)));
    }
    let after = opened.elapsed();
    assert!(
        (Duration::from_secs(9)..Duration::from_secs(14)).contains(&after),
        "{after:?}"
    );
    assert!(log().contains("within 10 s"), "{}", log());
    drop(uas);
    proxy.stop();
    drop(authd);
}
