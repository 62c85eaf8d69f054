//! What an operator relies on, against the real binary: `serve --check` and `authd --check`
//! (valid or not, nothing bound or created), a config path that is a FIFO (refused, never
//! blocking SIGHUP), failed authentications logged with user and source (text, JSON, and
//! contrib/'s fail2ban filter run on the log), `sipsec ctl` believing only its own user or
//! root and printing plain text, the control socket's connection cap, shell completions and
//! man pages, and contrib/'s systemd units verified by systemd-analyze.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sipsec");

fn sipsec(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run sipsec")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn listing(dir: &Path) -> Vec<PathBuf> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    names
}

fn contrib(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../contrib")
        .join(path)
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// A server config on `port` with a control socket `ctl.sock`.
fn with_control(port: u16) -> String {
    format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\nworkers = 1\n\
         [control]\nsocket = \"ctl.sock\"\n"
    )
}

/// `sipsec serve` as `command` has it, once it has printed its banner.
fn started(dir: &Path, command: &mut Command) -> Server {
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut banner = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    assert!(banner.starts_with("sipsec listening"), "{banner:?}");
    Server {
        child,
        dir: dir.to_path_buf(),
        banner,
    }
}

/// `serve --check`: a good file exits 0 and says what it would listen on — with its ports
/// held by someone else meanwhile, its database unreachable, and nothing created; a broken
/// file exits 1 naming the key; a FIFO is refused at once.
#[test]
fn serve_check_validates_without_binding_connecting_or_creating() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = ports(31300);
    let good = d.join("good.toml");
    std::fs::write(
        &good,
        format!(
            "[server]\nlisten = [\"udp:127.0.0.1:{port}\", \"tcp:127.0.0.1:{port}\"]\n\
             [database]\nurl = \"sqlite://sipsec.db\"\n\
             [metrics]\nlisten = \"127.0.0.1:{}\"\n[control]\nsocket = \"ctl.sock\"\n",
            port + 1
        ),
    )
    .unwrap();
    // Every port it names is taken while the check runs: a server would refuse to start; the
    // check, which binds nothing, does not notice.
    let held = (
        std::net::UdpSocket::bind(("127.0.0.1", port)).unwrap(),
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap(),
        std::net::TcpListener::bind(("127.0.0.1", port + 1)).unwrap(),
    );
    let before = listing(d);
    let out = sipsec(d, &["serve", "--check", "-c", "good.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    for line in [
        format!("listen udp:127.0.0.1:{port}"),
        format!("listen tcp:127.0.0.1:{port}"),
        format!("metrics http://127.0.0.1:{}/metrics", port + 1),
        "control ctl.sock".into(),
        format!(
            "database sqlite://{}",
            d.canonicalize().unwrap().join("sipsec.db").display()
        ),
    ] {
        assert!(said.lines().any(|l| l == line), "{line:?} not in:\n{said}");
    }
    assert_eq!(listing(d), before, "the check created files");
    drop(held);

    // A database that is not there is not connected to; its password is not printed.
    std::fs::write(
        d.join("pg.toml"),
        "[database]\nurl = \"postgres://sipsec:s3cret@127.0.0.1:1/sipsec\"\n",
    )
    .unwrap();
    let out = sipsec(d, &["serve", "--check", "--config", "pg.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("database postgres://sipsec:***@127.0.0.1:1/sipsec"),
        "{said}"
    );
    assert!(!said.contains("s3cret"), "{said}");

    // Broken files: exit 1, the key named.
    for (body, key) in [
        (
            "[server]\nlisten = [\"udp:127.0.0.1:x\"]\n",
            "server.listen[0]",
        ),
        ("[server]\nlisen = [\"udp:127.0.0.1:5060\"]\n", "lisen"),
        ("[registrar]\nmax_contacts = 0\n", "registrar.max_contacts"),
        ("[server]\nlisten = [\"tls:127.0.0.1:5061\"]\n", "tls.cert"),
    ] {
        std::fs::write(d.join("bad.toml"), body).unwrap();
        let out = sipsec(d, &["serve", "--check", "-c", "bad.toml"]);
        assert_eq!(out.status.code(), Some(1), "{body}");
        assert!(
            text(&out.stderr).contains(key),
            "{key}: {}",
            text(&out.stderr)
        );
    }

    // A FIFO: refused without waiting for a writer.
    mkfifo(&d.join("fifo.toml"));
    let started = Instant::now();
    for sub in ["serve", "authd"] {
        let out = sipsec(d, &[sub, "--check", "-c", "fifo.toml"]);
        assert_eq!(out.status.code(), Some(1), "{sub}");
        assert!(
            text(&out.stderr).contains("is not a regular file (a FIFO)"),
            "{}",
            text(&out.stderr)
        );
    }
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// `authd --check`: its TLS files read, its listener and database printed, nothing bound or
/// created; a bad value exits 1 naming the key.
#[test]
fn authd_check_validates_without_binding_or_creating() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = ports(31300);
    let _ = make_certs(d);
    std::fs::write(
        d.join("authd.toml"),
        format!(
            "[authd]\nlisten = \"127.0.0.1:{port}\"\ndatabase = \"sqlite://authd.db\"\n\
             cert = \"server.pem\"\nkey = \"server-key.pem\"\nca = \"ca.pem\"\n"
        ),
    )
    .unwrap();
    let held = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let before = listing(d);
    let out = sipsec(d, &["authd", "-c", "authd.toml", "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!("listen tls:127.0.0.1:{port}\n")),
        "{said}"
    );
    assert!(said.contains("metrics off\n"), "{said}");
    assert_eq!(listing(d), before, "the check created files");
    drop(held);

    let conf = std::fs::read_to_string(d.join("authd.toml")).unwrap();
    std::fs::write(d.join("authd.toml"), format!("{conf}hash = \"SHA-1\"\n")).unwrap();
    let out = sipsec(d, &["authd", "--check", "--config", "authd.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("authd.hash"),
        "{}",
        text(&out.stderr)
    );
    // Certificates that are not there fail the check as they would fail the start.
    std::fs::write(
        d.join("authd.toml"),
        conf.replace("\"ca.pem\"", "\"none.pem\""),
    )
    .unwrap();
    let out = sipsec(d, &["authd", "--check", "-c", "authd.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("none.pem"),
        "{}",
        text(&out.stderr)
    );
}

/// SIGHUP with the config path replaced by a FIFO: the reload is refused at once, and the
/// main thread goes on answering `ctl` and stops on SIGTERM (before, it waited in open()
/// for a writer that never came).
#[test]
fn a_fifo_config_does_not_block_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = ports(31300);
    let server = Server::start_logged(d, &with_control(port));
    std::fs::remove_file(d.join("sipsec.toml")).unwrap();
    mkfifo(&d.join("sipsec.toml"));
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(300));
    let out = sipsec(
        d,
        &[
            "ctl",
            "counters",
            "--socket",
            "ctl.sock",
            "--timeout-s",
            "3",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = sipsec(
        d,
        &["ctl", "reload", "--socket", "ctl.sock", "--timeout-s", "3"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not a regular file"),
        "{}",
        text(&out.stderr)
    );
    let log = server.log();
    assert!(log.contains("SIGHUP: reload refused"), "{log}");
    assert!(server.stop().success());
}

/// A server started with `SIPSEC_LOG_FORMAT=format`, digest on and one user, asked once
/// with a wrong password; its log.
fn wrong_password_log(format: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = ports(31300);
    std::fs::write(
        d.join("sipsec.toml"),
        format!(
            "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\ndomains = [\"example.test\"]\n\
             workers = 1\n[database]\nurl = \"sqlite://users.db\"\n\
             [auth]\nscheme = \"digest\"\nrealm = \"example.test\"\n"
        ),
    )
    .unwrap();
    let out = sipsec(
        d,
        &[
            "users",
            "-c",
            "sipsec.toml",
            "add",
            "alice",
            "--password",
            "right",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::write(d.join("users.csv"), "alice,wrong\n").unwrap();
    let mut serve = Command::new(BIN);
    serve
        .args(["serve", "-c", "sipsec.toml"])
        .current_dir(d)
        .env("SIPSEC_LOG", "info")
        .env("SIPSEC_LOG_FORMAT", format)
        .stderr(std::fs::File::create(d.join("serve.log")).unwrap());
    let server = started(d, &mut serve);
    let target = format!("udp:127.0.0.1:{port}");
    let (code, _, err) = load(
        d,
        &[
            &target,
            "--scenario",
            "register",
            "--users",
            "users.csv",
            "--domain",
            "example.test",
            "--calls",
            "1",
            "--drain-s",
            "3",
        ],
    );
    assert_eq!(code, 1, "the wrong password must fail: {err}");
    assert!(server.stop().success());
    std::fs::read_to_string(d.join("serve.log")).unwrap()
}

/// A wrong password is logged with the user and the source address: in the text format as
/// `source_ip=… user="…"`, and in the JSON format as one object a line with both fields.
#[test]
fn a_wrong_password_is_logged_with_user_and_source() {
    let log = wrong_password_log("text");
    let line = log
        .lines()
        .find(|l| l.contains("authentication failed"))
        .unwrap_or_else(|| panic!("no failure logged:\n{log}"));
    assert!(
        line.contains("WARN sipsec::auth: authentication failed: Failed (401 Unauthorized) source_ip=127.0.0.1 source=udp:127.0.0.1:"),
        "{line}"
    );
    assert!(line.ends_with(" user=\"alice\""), "{line}");

    let log = wrong_password_log("json");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(lines.len() >= 2, "{log}");
    assert!(lines
        .iter()
        .all(|v| v.is_object() && v["level"].is_string()));
    let failed = lines
        .iter()
        .find(|v| v["target"] == "sipsec::auth")
        .unwrap_or_else(|| panic!("no failure logged:\n{log}"));
    assert_eq!(failed["user"], "alice", "{failed}");
    assert_eq!(failed["source_ip"], "127.0.0.1", "{failed}");
    assert_eq!(failed["level"], "WARN", "{failed}");
}

/// contrib/'s fail2ban filter, run by fail2ban itself on the server's log, finds the source
/// of the wrong password.
#[test]
#[cfg_attr(
    sipsec_skip_fail2ban,
    ignore = "fail2ban is not installed (apt-get install fail2ban)"
)]
fn the_fail2ban_filter_finds_the_source_of_a_wrong_password() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("sipsec.log");
    std::fs::write(&log, wrong_password_log("text")).unwrap();
    let out = Command::new("fail2ban-regex")
        .args(["-o", "ip"])
        .arg(&log)
        .arg(contrib("fail2ban/filter.d/sipsec.conf"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "127.0.0.1");
}

/// A fake "server" on a socket: answers every connection with `reply`.
fn fake_server(path: &Path, reply: &'static [u8]) {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut line = String::new();
            let _ = BufReader::new(&s).read_line(&mut line);
            let _ = s.write_all(reply);
        }
    });
}

/// Whatever the server says, ctl prints plain text: escape sequences removed, other control
/// characters shown, never passed to the terminal.
#[test]
fn ctl_prints_only_plain_text() {
    use sipsec_server::cmd::ctl::plain;
    assert_eq!(plain("reloaded\n"), "reloaded\n");
    assert_eq!(plain("a\tb\n"), "a\tb\n");
    assert_eq!(plain("\x1b[1;31mreloaded\x1b[0m\n"), "reloaded\n");
    assert_eq!(plain("\x1b]0;owned\x07title"), "title");
    assert_eq!(plain("\x1b]8;;http://x\x1b\\link"), "link");
    assert_eq!(plain("\x1bcreset"), "reset");
    assert_eq!(plain("bell\x07\r\x7f"), "bell\\x07\\x0d\\x7f");
    assert_eq!(plain("c1 \u{9b}31m"), "c1 \\u{9b}31m");
    assert_eq!(plain("dangling \x1b["), "dangling ");
    assert_eq!(plain("ünïcode ✓"), "ünïcode ✓");

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fake_server(
        &d.join("ok.sock"),
        b"ok\n\x1b[31mreloaded\x1b[0m\x07\x1b]0;pwned\x07\n",
    );
    fake_server(&d.join("err.sock"), b"error\n\x1b[2J\x1b[Hwiped\r\n");
    let out = sipsec(d, &["ctl", "reload", "--socket", "ok.sock"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "reloaded\\x07\n");
    let out = sipsec(d, &["ctl", "reload", "--socket", "err.sock"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "sipsec ctl reload: wiped\\x0d\n");
}

/// A server whose socket is held by another user is not believed: ctl exits 2 without
/// printing its answer. Run as root, with the server as `nobody`.
#[test]
fn ctl_refuses_a_server_run_by_another_user() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: only root can start a server as another user here");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    let port = ports(31300);
    std::fs::write(d.join("sipsec.toml"), with_control(port)).unwrap();
    let server = started(
        d,
        Command::new(BIN)
            .args(["serve", "-c", "sipsec.toml"])
            .current_dir(d)
            .uid(65534)
            .gid(65534),
    );
    // The server itself would answer root ...
    let mut raw = UnixStream::connect(d.join("ctl.sock")).unwrap();
    raw.write_all(b"counters\n").unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("ok\n"), "{answer}");
    // ... but ctl, as root, does not believe a socket held by uid 65534.
    let out = sipsec(d, &["ctl", "counters", "--socket", "ctl.sock"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("is held by uid 65534"),
        "{}",
        text(&out.stderr)
    );
    assert!(server.stop().success());
}

/// The control socket serves 8 connections at once: a 9th is told it is busy at once; one
/// that sends nothing is closed after 5 s; then ctl is served again.
#[test]
fn the_control_socket_caps_its_connections() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = ports(31300);
    let server = Server::start(d, &with_control(port));
    let socket = d.join("ctl.sock");
    let idle: Vec<UnixStream> = (0..8)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    let mut ninth = UnixStream::connect(&socket).unwrap();
    ninth
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut answer = String::new();
    ninth.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "error\nbusy: 8 connections already\n");
    // The idle ones are closed after 5 s, told why.
    let started = Instant::now();
    let mut first = &idle[0];
    first
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    first.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "error\nno command within 5 s\n");
    assert!(started.elapsed() < Duration::from_secs(8));
    drop(idle);
    let out = sipsec(d, &["ctl", "counters", "--socket", "ctl.sock"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(server.stop().success());
}

/// The subcommands `sipsec help` lists.
fn subcommands() -> Vec<String> {
    let out = sipsec(Path::new("."), &["help"]);
    let help = text(&out.stdout);
    let names: Vec<String> = help
        .split("Commands:")
        .nth(1)
        .unwrap()
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|n| n != "help")
        .collect();
    assert!(names.len() >= 10, "{help}");
    names
}

/// `sipsec completions` and `sipsec man`, generated by clap: every subcommand completed and
/// documented.
#[test]
fn completions_and_man_pages_cover_every_subcommand() {
    let names = subcommands();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = sipsec(d, &["completions", "bash"]);
    assert!(out.status.success());
    let bash = text(&out.stdout);
    assert!(bash.contains("complete -F _sipsec"), "{bash}");
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = sipsec(d, &["completions", shell]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let out = sipsec(d, &["man"]);
    assert!(out.status.success());
    let page = text(&out.stdout);
    assert!(page.starts_with(".ie"), "{page}");
    assert!(page.contains(".TH sipsec 1"), "{page}");
    let words: Vec<&str> = bash
        .split(|c: char| c.is_whitespace() || c == '"')
        .collect();
    for name in &names {
        assert!(words.contains(&name.as_str()), "{name} not completed");
        // roff escapes dashes.
        let see = format!("sipsec\\-{}(1)", name.replace('-', "\\-"));
        assert!(page.contains(&see), "{see} not in sipsec.1");
    }
    let out = sipsec(d, &["man", "--out", "man/man1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for name in &names {
        let page = d.join(format!("man/man1/sipsec-{name}.1"));
        assert!(page.is_file(), "{} missing", page.display());
    }
    assert!(d.join("man/man1/sipsec-users-import.1").is_file());
}

/// contrib/'s units pass `systemd-analyze verify` (with the binary they name and the man
/// pages they cite), run as their own user with only the capability to bind port 5060, and
/// contrib/sipsec.toml, the file they read, passes `--check`.
#[test]
#[cfg_attr(
    sipsec_skip_systemd,
    ignore = "systemd-analyze is not installed (apt-get install systemd)"
)]
fn the_systemd_units_verify() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = sipsec(d, &["man", "--out", "man/man1"]);
    assert!(out.status.success());
    std::fs::create_dir(d.join("units")).unwrap();
    let mut units = Vec::new();
    for name in ["sipsec.service", "sipsec-authd.service"] {
        let unit = std::fs::read_to_string(contrib(&format!("systemd/{name}"))).unwrap();
        for line in ["User=sipsec", "NoNewPrivileges=yes", "ProtectSystem=strict"] {
            assert!(unit.lines().any(|l| l == line), "{name}: {line}");
        }
        let path = d.join("units").join(name);
        std::fs::write(&path, unit.replace("/usr/local/bin/sipsec", BIN)).unwrap();
        units.push(path);
    }
    let serve = std::fs::read_to_string(contrib("systemd/sipsec.service")).unwrap();
    for line in [
        "AmbientCapabilities=CAP_NET_BIND_SERVICE",
        "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "StateDirectory=sipsec",
        "ExecStart=/usr/local/bin/sipsec serve --config /etc/sipsec/sipsec.toml",
    ] {
        assert!(serve.lines().any(|l| l == line), "{line}");
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .env("MANPATH", d.join("man"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        text(&out.stderr)
    );
    let example = contrib("sipsec.toml");
    let out = sipsec(d, &["serve", "--check", "-c", example.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("listen udp:0.0.0.0:5060\n"), "{said}");
    assert!(
        said.contains("database sqlite:///var/lib/sipsec/sipsec.db\n"),
        "{said}"
    );
    assert!(said.contains("control /run/sipsec/ctl.sock\n"), "{said}");
}

/// `sipsec ctl bindings` lists what the registrar holds, with where each binding is reached:
/// a phone behind a NAT (a private Contact, registered with `rport`) is reached where its
/// REGISTER came from, and says so.
#[test]
fn ctl_lists_the_bindings_with_where_they_are_reached() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = ports(31300);
    let server = Server::start(d, &with_control(port));
    let phone = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    phone
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let local = phone.local_addr().unwrap();
    let register = format!(
        "REGISTER sip:127.0.0.1:{port} SIP/2.0\r\nVia: SIP/2.0/UDP 192.168.1.20:5060;rport;branch=z9hG4bKctl1\r\n\
Max-Forwards: 70\r\nFrom: <sip:carol@localhost>;tag=c1\r\nTo: <sip:carol@localhost>\r\n\
Call-ID: ctl-bindings\r\nCSeq: 1 REGISTER\r\nContact: <sip:carol@192.168.1.20:5060>\r\n\
Expires: 600\r\nContent-Length: 0\r\n\r\n"
    );
    phone
        .send_to(register.as_bytes(), ("127.0.0.1", port))
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = phone.recv(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"SIP/2.0 200"), "{}", text(&buf[..n]));
    let out = sipsec(d, &["ctl", "bindings", "--socket", "ctl.sock"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert!(
        listed.contains("carol@localhost <sip:carol@192.168.1.20:5060> expires="),
        "{listed}"
    );
    assert!(
        listed.contains(&format!("target=udp:{local};flow received=udp:{local}")),
        "{listed}"
    );
    assert!(server.stop().success());
}
