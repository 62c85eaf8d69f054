//! `sipsec bench` end to end: it starts sipsec pinned and measures it, and it measures an
//! already running server by PID, both reporting CPU per operation in JSON.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;

fn load_cpu() -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus.min(2) - 1).to_string()
}

/// Runs `sipsec bench ARGS` pinned (the server on CPU 0, the load generator on the next) and
/// quiet, and returns its JSON report; shows what it printed if it fails.
fn run_bench(dir: &std::path::Path, args: &[&str]) -> Value {
    let json = dir.join("bench.json");
    let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .arg("bench")
        .args(args)
        .args([
            "--quiet",
            "--server-cpu",
            "0",
            "--load-cpu",
            &load_cpu(),
            "--json",
        ])
        .arg(&json)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

/// `sipsec bench ARGS` for 600 calls at 300 a second after 100 to warm up: checks the report
/// counts them and a measurable CPU cost per call.
fn bench(dir: &std::path::Path, args: &[&str]) -> Value {
    let sizes = ["--calls", "600", "--rate", "300", "--warmup-calls", "100"];
    let v = run_bench(dir, &[args, &sizes[..]].concat());
    assert_eq!(v["ops"], 600, "{v}");
    assert_eq!(v["rate"], 300.0, "{v}");
    assert_eq!(v["load"]["succeeded"], 600, "{v}");
    // 600 proxied calls cost the server something measurable, and not absurdly much.
    let per_op = v["server_cpu_us_per_op"].as_f64().unwrap();
    assert!(per_op > 0.0 && per_op < 100_000.0, "{v}");
    v
}

fn config(port: u16, uas: &str, dir: &std::path::Path) -> String {
    format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\ndomains = [\"bench.test\"]\n\
mode = \"proxy\"\nstateful = true\nrecord_route = true\nworkers = 1\n[routing]\n\
default_route = \"sip:{uas};transport=udp\"\n[database]\nurl = \"sqlite://{}\"\n",
        dir.join("b.db").display()
    )
}

#[test]
fn bench_starts_sipsec_and_reports_cpu_per_call() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(28000);
    let uas = format!("127.0.0.3:{}", port + 1);
    let path = dir.path().join("sipsec.toml");
    std::fs::write(&path, config(port, &uas, dir.path())).unwrap();
    // Named relative to the directory bench runs in, as an operator would: the server it
    // starts runs elsewhere and must still find it.
    let v = bench(dir.path(), &["--config", "sipsec.toml", "--uas", &uas]);
    assert_eq!(v["server"], "sipsec");
}

#[test]
fn bench_measures_a_running_server_by_pid() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(28000);
    let uas = format!("127.0.0.3:{}", port + 1);
    let server = Server::start(dir.path(), &config(port, &uas, dir.path()));
    let pid = server.child.id().to_string();
    let target = format!("127.0.0.1:{port}");
    let v = bench(
        dir.path(),
        &["--server-pid", &pid, "--target", &target, "--uas", &uas],
    );
    assert_eq!(v["server"], "external");
    assert_eq!(v["server_pids"][0].as_u64(), Some(server.child.id() as u64));
}

#[test]
fn bench_refuses_a_missing_pid() {
    let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args([
            "bench",
            "--server-pid",
            "4294967294",
            "--target",
            "127.0.0.1:9",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no process with PID"));
}

/// The bench's default topology (server 127.0.0.1:35060, UAS 127.0.0.3:35080) is one per
/// machine: the tests that use it take turns.
static DEFAULT_TOPOLOGY: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `sipsec bench ARGS` on the default topology with its JSON report, pinned like the
/// others.
fn bench_json(dir: &std::path::Path, args: &[&str]) -> Value {
    let _turn = DEFAULT_TOPOLOGY.lock().unwrap_or_else(|e| e.into_inner());
    run_bench(dir, args)
}

/// `--instructions` counts the server's user-space instructions per call with callgrind,
/// over the measured run only: a figure that repeats run to run where CPU time does not.
#[test]
#[cfg_attr(
    sipsec_skip_valgrind,
    ignore = "valgrind is not installed (apt-get install valgrind)"
)]
fn bench_counts_the_servers_instructions_per_call_with_callgrind() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--instructions",
        "--rate",
        "50",
        "--calls",
        "150",
        "--warmup-calls",
        "30",
    ];
    let (a, b) = (bench_json(dir.path(), &args), bench_json(dir.path(), &args));
    let per_call = |v: &Value| {
        assert_eq!(v["ops"], 150, "{v}");
        v["server_instructions_per_op"].as_f64().unwrap()
    };
    let (x, y) = (per_call(&a), per_call(&b));
    // A proxied call (INVITE..BYE, six messages in and out) is tens to hundreds of
    // thousands of instructions with its system-call wrappers; not millions.
    assert!((10_000.0..3_000_000.0).contains(&x), "{x}");
    assert!(
        (x - y).abs() / x < 0.05,
        "{x} and {y} differ by more than 5%"
    );
}

/// `--idle-connections` over WSS: each finishes its TLS handshake and WebSocket upgrade in a
/// holder process, the calls go through beside them, and the report gives the server's
/// resident memory before and with them.
#[test]
fn bench_holds_idle_websocket_connections_and_reports_their_memory() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_json(
        dir.path(),
        &[
            "--transport",
            "wss",
            "--idle-connections",
            "300",
            "--rate",
            "200",
            "--calls",
            "400",
            "--warmup-calls",
            "50",
        ],
    );
    assert_eq!(v["load"]["succeeded"], 400, "{v}");
    assert_eq!(v["idle_connections"], 300, "{v}");
    let m = &v["idle_memory"];
    let kb = |k: &str| m[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    let (before, with) = (kb("rss_kb_before"), kb("rss_kb_with"));
    // 300 TLS sessions with their WebSocket state: some kB each, not megabytes.
    assert!(with > before && with - before < 300 * 1000, "{v}");
}

/// `--goodput-curve` offers 0.5 to 2 times the peak it found and records the goodput.
#[test]
fn bench_measures_goodput_past_the_peak() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_json(
        dir.path(),
        &[
            "--stateless",
            "--rate",
            "1000",
            "--calls",
            "500",
            "--warmup-calls",
            "100",
            "--find-peak",
            "--step-s",
            "1",
            "--goodput-curve",
        ],
    );
    let peak = v["peak_per_s"].as_f64().unwrap();
    let curve = v["goodput_curve"].as_array().unwrap();
    assert_eq!(curve.len(), 6, "{v}");
    let rates: Vec<f64> = curve.iter().map(|p| p["rate"].as_f64().unwrap()).collect();
    assert!((rates[0] - peak * 0.5).abs() <= 1.0 && (rates[5] - peak * 2.0).abs() <= 1.0);
    // Below the peak, what is offered is served on time.
    let (offered, goodput) = (
        curve[0]["offered_per_s"].as_f64().unwrap(),
        curve[0]["goodput_per_s"].as_f64().unwrap(),
    );
    assert!(offered > 0.0 && goodput >= 0.9 * offered, "{v}");
}

/// `--peak-quota` holds the server to a share of a core during the peak search only, and
/// `--peak-source-addresses` spreads per-call callers over addresses: the report says under
/// which share the peak was found, that the quota held the server (its CPU share over the
/// search within it, and throttled), and from how many addresses the callers came. Needs
/// cgroup v1's cpu controller and root, as the overload suite does.
#[test]
fn bench_searches_the_peak_with_the_server_held_to_a_share_of_a_core() {
    let cgroup = std::path::Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
    // SAFETY: geteuid has no preconditions.
    if !cgroup.exists() || unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "the peak quota needs cgroup v1's cpu controller and root, which CI has"
        );
        eprintln!("skipped: no cgroup v1 cpu controller, or not root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let v = bench_json(
        dir.path(),
        &[
            "--transport",
            "tcp",
            "--mode",
            "local",
            "--rate",
            "300",
            "--calls",
            "300",
            "--warmup-calls",
            "100",
            "--find-peak",
            "--step-s",
            "1",
            "--peak-quota",
            "0.25",
            "--peak-source-addresses",
            "8",
        ],
    );
    let held = &v["peak_held"];
    let share = held["cpu_quota"].as_f64().unwrap();
    assert!((0.1..=0.25).contains(&share), "{held}");
    assert_eq!(held["source_addresses"].as_u64(), Some(8), "{held}");
    // The search goes past the peak, where the server uses up its share and is held off.
    assert!(held["cpu_throttled_s"].as_f64().unwrap() > 0.0, "{held}");
    let server = held["server_cpu_share"].as_f64().unwrap();
    assert!(server > 0.0 && server <= share * 1.1, "{held}");
    assert!(v["peak_per_s"].as_f64().unwrap() > 0.0, "{v}");
    // The measured run before the search kept its whole core (no quota fields at the top).
    assert!(v.get("cpu_quota").is_none(), "{v}");
}
