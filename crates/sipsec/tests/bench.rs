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

fn bench(dir: &std::path::Path, args: &[&str]) -> Value {
    let json = dir.join("bench.json");
    let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .arg("bench")
        .args(args)
        .args([
            "--calls",
            "600",
            "--rate",
            "300",
            "--warmup-calls",
            "100",
            "--quiet",
        ])
        .args(["--server-cpu", "0", "--load-cpu", &load_cpu(), "--json"])
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
    let v: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
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
