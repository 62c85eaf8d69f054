//! Shared helpers for the integration tests: start the real `sipsec` binary on its own
//! ports and database, run real SIPp against it, and talk raw SIP over UDP.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the shared helpers"
)]

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

pub(crate) mod load;
pub(crate) mod netns;
pub(crate) mod relay;
#[allow(unused_imports, reason = "only the load tests use them")]
pub(crate) use load::*;

/// Ports for one test: distinct per test in this process, and per test binary via `base`.
/// Bases stay below 32768, the kernel's ephemeral range, so a listener never collides with
/// the source port of some test's outgoing connection.
pub(crate) fn ports(base: u16) -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    base + NEXT.fetch_add(10, Ordering::Relaxed)
}

/// Whether the other side closed `c` (EOF or reset) within `wait`, for the tests of what a
/// daemon does to connections that never finish a request or a handshake.
pub(crate) fn closed_by_peer(c: &std::net::TcpStream, wait: Duration) -> bool {
    use std::io::Read;
    c.set_read_timeout(Some(wait)).unwrap();
    match (&*c).read(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// The repository's root: `testdata/` (RFC 4475's messages), `peers/sipp/` (SIPp scenarios
/// through a record-routing proxy), `peers/kamailio/` (the reference Kamailio configuration).
pub(crate) fn repo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A SIPp scenario of `peers/sipp/` (`uac.xml`, `uas.xml`: a call through a record-routing
/// proxy).
pub(crate) fn bench_sipp(name: &str) -> PathBuf {
    repo_dir().join("peers/sipp").join(name)
}

/// The reference Kamailio configuration, `peers/kamailio/proxy.cfg`.
pub(crate) fn kamailio_proxy_cfg() -> PathBuf {
    repo_dir().join("peers/kamailio/proxy.cfg")
}

pub(crate) fn scenario(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios")
        .join(name)
}

/// True when `command version_arg` runs here (Debian `package`). Under CI a missing one is a
/// failure, not a skip.
pub(crate) fn have_tool(command: &str, version_arg: &str, package: &str) -> bool {
    let ok = Command::new(command)
        .arg(version_arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{command} (Debian package {package}) is required under CI"
        );
        eprintln!("skipped: {command} is not installed (apt-get install {package})");
    }
    ok
}

/// True when SIPp can run here. Under CI a missing SIPp is a failure, not a skip.
pub(crate) fn have_sipp() -> bool {
    let ok = Command::new("sipp")
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "SIPp (Debian package sip-tester) is required under CI"
        );
        eprintln!("skipped: SIPp is not installed (apt-get install sip-tester)");
    }
    ok
}

/// True when Kamailio can run here with each of `modules` (`tls`, `websocket`: Debian's
/// `kamailio-NAME-modules`). Under CI a missing one is a failure, not a skip.
pub(crate) fn have_kamailio(modules: &[&str]) -> bool {
    let ok = Command::new("kamailio")
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
        && modules.iter().all(|m| {
            Path::new(&format!(
                "/usr/lib/x86_64-linux-gnu/kamailio/modules/{m}.so"
            ))
            .exists()
        });
    if !ok {
        let packages: Vec<String> = std::iter::once("kamailio".to_string())
            .chain(modules.iter().map(|m| format!("kamailio-{m}-modules")))
            .collect();
        let packages = packages.join(" ");
        assert!(
            std::env::var_os("CI").is_none(),
            "Kamailio (Debian {packages}) is required under CI"
        );
        eprintln!("skipped: Kamailio is not installed (apt-get install {packages})");
    }
    ok
}

/// A running `sipsec serve`, stopped with SIGTERM on drop.
pub(crate) struct Server {
    pub child: Child,
    pub dir: PathBuf,
    pub banner: String,
}

impl Server {
    /// Starts sipsec with `config` (written to `dir/sipsec.toml`) and waits for its banner.
    pub(crate) fn start(dir: &Path, config: &str) -> Server {
        let path = dir.join("sipsec.toml");
        std::fs::write(&path, config).unwrap();
        Self::spawn(dir, &["serve", "--config", path.to_str().unwrap()])
    }

    pub(crate) fn spawn(dir: &Path, args: &[&str]) -> Server {
        Self::spawn_with(dir, args, Stdio::inherit(), "warn", None)
    }

    /// Like [`Server::start`], with the log (at info, so the counters printed at exit are in
    /// it) going to `dir/serve.log` for [`Server::stop_counters`] and [`Server::log`].
    pub(crate) fn start_logged(dir: &Path, config: &str) -> Server {
        Self::start_logged_limited(dir, config, None)
    }

    /// Like [`Server::start_logged`], in a process allowed only `nofile` open files (soft and
    /// hard limit, so the server cannot raise it), as `ulimit -n` would leave it.
    pub(crate) fn start_with_fd_limit(dir: &Path, config: &str, nofile: u64) -> Server {
        Self::start_logged_limited(dir, config, Some(nofile))
    }

    fn start_logged_limited(dir: &Path, config: &str, nofile: Option<u64>) -> Server {
        let path = dir.join("sipsec.toml");
        std::fs::write(&path, config).unwrap();
        let log = std::fs::File::create(dir.join("serve.log")).unwrap();
        Self::spawn_with(
            dir,
            &["serve", "--config", path.to_str().unwrap()],
            Stdio::from(log),
            "info",
            nofile,
        )
    }

    fn spawn_with(
        dir: &Path,
        args: &[&str],
        stderr: Stdio,
        level: &str,
        nofile: Option<u64>,
    ) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sipsec"));
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: setrlimit is async-signal-safe, and `lim` is a plain copy.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command
            .args(args)
            .current_dir(dir)
            .env("SIPSEC_LOG", level)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start sipsec");
        Self::started(child, dir)
    }

    /// A server just spawned with its stdout piped, once it printed its banner (its log, if
    /// it fails, from `dir/serve.log`).
    pub(crate) fn started(mut child: Child, dir: &Path) -> Server {
        let mut banner = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut banner)
            .unwrap();
        assert!(
            banner.starts_with("sipsec listening on"),
            "unexpected banner: {banner:?}; log: {}",
            std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
        );
        Server {
            child,
            dir: dir.to_path_buf(),
            banner,
        }
    }

    /// Stops the server gracefully and waits for it to exit.
    pub(crate) fn stop(mut self) -> std::process::ExitStatus {
        self.terminate()
    }

    /// What a server started with [`Server::start_logged`] has logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// Stops a server started with [`Server::start_logged`] and returns the counters it
    /// logged on the way out (absent counters were zero).
    pub(crate) fn stop_counters(mut self) -> Counters {
        assert!(self.terminate().success(), "{}", self.log());
        let log = self.log();
        let line = log
            .lines()
            .find(|l| l.contains("stopped"))
            .unwrap_or_else(|| panic!("no exit line in the log:\n{log}"));
        Counters(
            line.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                .collect(),
        )
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: sending a signal to our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..100 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child.kill().unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.terminate();
        }
    }
}

/// A server's counters by name.
#[derive(Debug)]
pub(crate) struct Counters(pub std::collections::HashMap<String, u64>);

impl Counters {
    pub(crate) fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }
}

/// A running Kamailio, stopped with SIGTERM (which stops its children too) on drop.
pub(crate) struct Kamailio {
    child: Child,
    log: PathBuf,
}

impl Kamailio {
    /// Kamailio running `cfg` (one of `peers/kamailio/`) on `listen` (`udp:`, `tcp:` or
    /// `tls:` `127.0.0.1:PORT`, the config's `LISTEN`), with its other `-A` options in
    /// `defines`. Logs to `dir/kamailio-PORT.log` ([`Kamailio::log`]); returns once it
    /// listens and its children have had time to start.
    pub(crate) fn start(dir: &Path, cfg: &Path, listen: &str, defines: &[String]) -> Kamailio {
        let port: u16 = listen
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("listen is proto:ip:port");
        let run = dir.join(format!("kamailio-run-{port}"));
        std::fs::create_dir_all(&run).unwrap();
        let log = dir.join(format!("kamailio-{port}.log"));
        let mut command = Command::new("kamailio");
        command
            .args(["-DD", "-E", "-f"])
            .arg(cfg)
            .args(["-m", "256", "-M", "32", "-Y"])
            .arg(&run)
            .arg("-w")
            .arg(&run)
            .arg("-A")
            .arg(format!("LISTEN={listen}"));
        for define in defines {
            command.arg("-A").arg(define);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("start kamailio");
        let k = Kamailio { child, log };
        let listening = || {
            if listen.starts_with("udp:") {
                UdpSocket::bind(("127.0.0.1", port)).is_err()
            } else {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            }
        };
        let start = std::time::Instant::now();
        while !listening() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "Kamailio did not listen on {listen}: {}",
                k.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Its children start after the main process binds.
        std::thread::sleep(Duration::from_millis(500));
        k
    }

    /// The reference proxy (`peers/kamailio/proxy.cfg`) on `listen`, relaying every initial
    /// INVITE to `next_hop`, with the config's other `-A` options in `defines` (`WITH_TLS`,
    /// `SHAKEN_SIGN="key.pem"`, ...).
    pub(crate) fn proxy(dir: &Path, listen: &str, next_hop: &str, defines: &[String]) -> Kamailio {
        let mut all = vec![format!("NEXT_HOP=\"{next_hop}\"")];
        all.extend_from_slice(defines);
        Kamailio::start(dir, &kamailio_proxy_cfg(), listen, &all)
    }

    /// What it has logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Kamailio {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = std::time::Instant::now();
        while self.child.try_wait().ok().flatten().is_none() {
            if start.elapsed() > Duration::from_secs(5) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A SIPp process in the background (a UAS), killed on drop.
pub(crate) struct Background(pub Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn sipp_uas(ip: &str, port: u16, scenario: &Path) -> Background {
    sipp_uas_with(ip, port, &["-sf", scenario.to_str().unwrap()])
}

/// A SIPp callee on `ip:port` with the scenario and options in `args` (e.g. `-sn uas -t t1`).
pub(crate) fn sipp_uas_with(ip: &str, port: u16, args: &[&str]) -> Background {
    let child = Command::new("sipp")
        .args(args)
        .args([
            "-i",
            ip,
            "-p",
            &port.to_string(),
            "-nostdin",
            "-timeout",
            "120s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sipp uas");
    std::thread::sleep(Duration::from_millis(300));
    Background(child)
}

/// Outcome of a SIPp client run, from its statistics file.
#[derive(Debug)]
pub(crate) struct SippResult {
    pub successful: u64,
    pub failed: u64,
    pub exit: i32,
}

/// Runs a SIPp client to completion.
pub(crate) fn sipp_client(dir: &Path, target: &str, args: &[&str]) -> SippResult {
    let stat = dir.join(format!("stat-{}.csv", std::process::id() ^ rand_suffix()));
    let status = Command::new("sipp")
        .arg(target)
        .args(args)
        .args([
            "-nostdin",
            "-trace_stat",
            "-stf",
            stat.to_str().unwrap(),
            "-fd",
            "1",
            "-timeout",
            "120s",
        ])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run sipp");
    let text = std::fs::read_to_string(&stat).unwrap_or_default();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(';').collect())
        .collect();
    let col = |name: &str| -> u64 {
        let (Some(head), Some(last)) = (rows.first(), rows.last()) else {
            return 0;
        };
        head.iter()
            .position(|h| *h == name)
            .and_then(|i| last.get(i))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    SippResult {
        successful: col("SuccessfulCall(C)"),
        failed: col("FailedCall(C)"),
        exit: status.code().unwrap_or(-1),
    }
}

fn rand_suffix() -> u32 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
}

/// A raw SIP endpoint on a UDP socket.
pub(crate) struct Endpoint {
    pub socket: UdpSocket,
    pub addr: String,
}

impl Endpoint {
    pub(crate) fn bind(addr: &str) -> Endpoint {
        let socket = UdpSocket::bind(addr).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        Endpoint {
            addr: socket.local_addr().unwrap().to_string(),
            socket,
        }
    }

    pub(crate) fn send(&self, to: &str, text: &str) {
        self.socket.send_to(text.as_bytes(), to).unwrap();
    }

    pub(crate) fn recv(&self) -> String {
        let mut buf = vec![0u8; 65_536];
        let (n, _) = self
            .socket
            .recv_from(&mut buf)
            .expect("no datagram within 3 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// A datagram if one comes within `wait` (the usual 3 s wait is kept for `recv`).
    pub(crate) fn try_recv(&self, wait: Duration) -> Option<String> {
        let mut buf = vec![0u8; 65_536];
        self.socket.set_read_timeout(Some(wait)).unwrap();
        let got = self.socket.recv_from(&mut buf);
        self.socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        got.ok()
            .map(|(n, _)| String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// Receives until a message whose first line starts with `prefix`.
    pub(crate) fn recv_until(&self, prefix: &str) -> String {
        loop {
            let m = self.recv();
            if m.starts_with(prefix) {
                return m;
            }
        }
    }
}
