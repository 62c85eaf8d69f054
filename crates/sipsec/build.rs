//! Marks the integration tests whose peers are missing here, so `cargo test` lists them as
//! ignored, with the reason, in its summary instead of passing them silently. Under CI (`CI`
//! set) nothing is marked: there a missing peer fails its test.
//!
//! Flags: `sipsec_skip_sipp` (no `sipp` on PATH), `sipsec_skip_baresip` (no `baresip`),
//! `sipsec_skip_svcrack` (no sipvicious `svcrack`), `sipsec_skip_chromium` (no `chromium`),
//! `sipsec_skip_valgrind` (no `valgrind`), `sipsec_skip_curl` (no `curl`),
//! `sipsec_skip_fail2ban` (no `fail2ban-regex`), `sipsec_skip_systemd` (no `systemd-analyze`),
//! `sipsec_skip_prometheus_client` (no Python `prometheus_client`, the strict parser of
//! `/metrics`: `pip install prometheus-client`),
//! `sipsec_skip_netns` (not root, or no `ip` or `nft`: the NAT tests' network namespaces),
//! `sipsec_skip_kamailio` (no Kamailio with its
//! TLS module), `sipsec_skip_postgres` and `sipsec_skip_mariadb` (no SIPSEC_TEST_POSTGRES or
//! SIPSEC_TEST_MARIADB).

use std::path::Path;

/// Kamailio's TLS module as Debian installs it.
const KAMAILIO_TLS: &str = "/usr/lib/x86_64-linux-gnu/kamailio/modules/tls.so";

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Whether `python3` can import `module`. Installing one changes no file this script watches:
/// `touch build.rs` (or set `CI`) after `pip install` for the tests to run.
fn python_has(module: &str) -> bool {
    std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// Whether this build runs as root, which making network namespaces needs (the tests run as
/// the same user as their build, as `cargo test` does).
fn root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

fn main() {
    for var in ["CI", "PATH", "SIPSEC_TEST_POSTGRES", "SIPSEC_TEST_MARIADB"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    // Installing a peer does not change PATH; it does change dpkg's database.
    if Path::new("/var/lib/dpkg/status").exists() {
        println!("cargo::rerun-if-changed=/var/lib/dpkg/status");
    }
    let ci = std::env::var_os("CI").is_some();
    let missing = [
        ("sipsec_skip_sipp", !on_path("sipp")),
        ("sipsec_skip_baresip", !on_path("baresip")),
        ("sipsec_skip_svcrack", !on_path("svcrack")),
        ("sipsec_skip_chromium", !on_path("chromium")),
        ("sipsec_skip_valgrind", !on_path("valgrind")),
        ("sipsec_skip_curl", !on_path("curl")),
        (
            "sipsec_skip_netns",
            !root() || !on_path("ip") || !on_path("nft"),
        ),
        ("sipsec_skip_fail2ban", !on_path("fail2ban-regex")),
        ("sipsec_skip_systemd", !on_path("systemd-analyze")),
        (
            "sipsec_skip_prometheus_client",
            !python_has("prometheus_client"),
        ),
        (
            "sipsec_skip_kamailio",
            !on_path("kamailio") || !Path::new(KAMAILIO_TLS).exists(),
        ),
        (
            "sipsec_skip_postgres",
            std::env::var_os("SIPSEC_TEST_POSTGRES").is_none(),
        ),
        (
            "sipsec_skip_mariadb",
            std::env::var_os("SIPSEC_TEST_MARIADB").is_none(),
        ),
    ];
    for (flag, skip) in missing {
        println!("cargo::rustc-check-cfg=cfg({flag})");
        if skip && !ci {
            println!("cargo::rustc-cfg={flag}");
        }
    }
}
