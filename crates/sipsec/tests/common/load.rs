//! Helpers for tests that drive `sipsec load` and `sipsec certs`.

use super::Server;
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Runs `sipsec load --quiet` to completion; returns its exit code, JSON summary and stderr.
pub(crate) fn load(dir: &Path, args: &[&str]) -> (i32, Value, String) {
    let r = load_printing(dir, &[args, &["--quiet"]].concat());
    (r.code, r.summary, r.stderr)
}

/// `sipsec load`'s options for its TLS certificate, that certificate's key, and the CA that
/// verifies its peers.
pub(crate) fn tls_files<'a>(cert: &'a str, key: &'a str, ca: &'a str) -> [&'a str; 6] {
    ["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca]
}

/// Asserts that a `sipsec load` run, as [`load`] returns it, exited 0 with all `calls`
/// succeeded; else shows `what`, the run's stderr and summary, and the server's log.
pub(crate) fn assert_all_succeeded(
    run: &(i32, Value, String),
    calls: u64,
    what: &str,
    server: &Server,
) {
    let (code, v, err) = run;
    assert_eq!(
        (*code, n(v, "succeeded")),
        (0, calls),
        "{what}: {err}\n{v}\n{}",
        server.log()
    );
}

/// What a `sipsec load` run printed and wrote.
pub(crate) struct LoadRun {
    pub code: i32,
    /// The `--json` summary.
    pub summary: Value,
    /// The text summary.
    pub stdout: String,
    /// The progress lines (unless `--quiet`) and errors.
    pub stderr: String,
}

/// Runs `sipsec load ARGS --json FILE` to completion, keeping what it printed.
pub(crate) fn load_printing(dir: &Path, args: &[&str]) -> LoadRun {
    load_run(Command::new(env!("CARGO_BIN_EXE_sipsec")), dir, args)
}

/// Runs `sipsec load ARGS --json FILE` as `sipsec` (the binary, or a command that execs it,
/// such as `ip netns exec NS sipsec`), keeping what it printed.
pub(crate) fn load_run(mut sipsec: Command, dir: &Path, args: &[&str]) -> LoadRun {
    let json = dir.join(format!("load-{}.json", rand_name()));
    let out = sipsec
        .arg("load")
        .args(args)
        .args(["--json", json.to_str().unwrap()])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run sipsec load");
    LoadRun {
        code: out.status.code().unwrap_or(-1),
        summary: std::fs::read_to_string(&json)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub(crate) fn rand_name() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed) ^ (std::process::id() << 8)
}

/// A `sipsec load --role uas` in the background; `finish` stops it and reads its summary.
pub(crate) struct LoadUas {
    child: Child,
    json: std::path::PathBuf,
    text: std::path::PathBuf,
}

impl LoadUas {
    /// Starts a UAS on `addr` with `extra` options (e.g. the transport).
    pub(crate) fn start(dir: &Path, addr: &str, extra: &[&str]) -> LoadUas {
        let name = rand_name();
        let (json, text) = (
            dir.join(format!("uas-{name}.json")),
            dir.join(format!("uas-{name}.txt")),
        );
        let child = Command::new(env!("CARGO_BIN_EXE_sipsec"))
            .args(["load", "--role", "uas", "--uas", addr, "--quiet", "--json"])
            .arg(&json)
            .args(extra)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&text).expect("create the UAS's summary file"))
            .spawn()
            .expect("start the load UAS");
        std::thread::sleep(Duration::from_millis(300));
        LoadUas { child, json, text }
    }

    /// Stops the UAS; its JSON summary.
    pub(crate) fn finish(self) -> Value {
        self.finish_printing().0
    }

    /// Stops the UAS; its JSON summary and the text summary it printed.
    pub(crate) fn finish_printing(mut self) -> (Value, String) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(
            status.code().is_some(),
            "the UAS died of a signal: {status:?}"
        );
        (
            serde_json::from_str(&std::fs::read_to_string(&self.json).unwrap()).unwrap(),
            std::fs::read_to_string(&self.text).unwrap(),
        )
    }
}

impl Drop for LoadUas {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn n(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// `sipsec certs` into `dir`; returns the paths by file name.
pub(crate) fn make_certs(dir: &Path) -> impl Fn(&str) -> String + '_ {
    let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args(["certs", "--out"])
        .arg(dir)
        .output()
        .expect("run sipsec certs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    move |name: &str| dir.join(name).to_str().unwrap().to_string()
}
