//! `/metrics` scraped with a real HTTP client (curl) after a known load: the counts match what
//! `sipsec load` says it did, exactly.

mod common;

use common::*;
use std::collections::HashMap;
use std::process::Command;

/// Scrapes `url` with curl: (HTTP status, body).
fn curl(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", url])
        .output()
        .expect("run curl");
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap(), body.to_string())
}

/// The samples of an exposition: `name{labels}` → value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[test]
#[cfg_attr(
    sipsec_skip_curl,
    ignore = "curl is not installed (apt-get install curl)"
)]
fn scraped_counts_match_the_load_generators_summary() {
    let dir = tempfile::tempdir().unwrap();
    let base = ports(21500);
    let (sip, uas_port, metrics) = (base, base + 1, base + 2);
    let uas = LoadUas::start(dir.path(), &format!("udp:127.0.0.3:{uas_port}"), &[]);
    let server = Server::start(
        dir.path(),
        &format!(
            "[server]\nlisten = [\"udp:127.0.0.1:{sip}\"]\nworkers = 2\n\
             [routing]\ndefault_route = \"sip:127.0.0.3:{uas_port}\"\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\
             [database]\nurl = \"sqlite://{}\"\n",
            dir.path().join("m.db").display()
        ),
    );
    let calls = 500;
    let (code, v, err) = load(
        dir.path(),
        &[
            &format!("udp:127.0.0.1:{sip}"),
            "--calls",
            &calls.to_string(),
            "--rate",
            "250",
        ],
    );
    assert_eq!(code, 0, "{v} {err}");
    // Exact counts need every message once: no retransmission on either side.
    assert_eq!(n(&v, "retransmissions"), 0, "{v}");
    assert_eq!(n(&v, "succeeded"), calls, "{v}");
    let uas = uas.finish();
    assert_eq!(n(&uas, "retransmissions"), 0, "{uas}");
    let url = format!("http://127.0.0.1:{metrics}/metrics");
    let (status, body) = curl(&url);
    assert_eq!(status, 200, "{body}");
    assert!(body.trim_end().ends_with("# EOF"), "OpenMetrics text");
    let s = samples(&body);
    let get = |k: &str| *s.get(k).unwrap_or_else(|| panic!("{k} missing:\n{body}"));
    let calls = calls as f64;
    for method in ["INVITE", "ACK", "BYE"] {
        assert_eq!(
            get(&format!("sipsec_requests_total{{method=\"{method}\"}}")),
            calls
        );
    }
    assert_eq!(get("sipsec_requests_total{method=\"REGISTER\"}"), 0.0);
    for method in ["INVITE", "BYE"] {
        let key = format!("sipsec_responses_total{{method=\"{method}\",class=\"2xx\"}}");
        assert_eq!(get(&key), calls);
    }
    assert_eq!(
        get("sipsec_local_responses_total{class=\"1xx\"}"),
        calls,
        "100 Trying"
    );
    assert_eq!(get("sipsec_dialogs_established_total"), calls);
    assert_eq!(get("sipsec_dialogs_ended_total"), calls);
    assert_eq!(get("sipsec_dialogs"), 0.0);
    assert_eq!(get("sipsec_invite_final_response_seconds_count"), calls);
    assert_eq!(get("sipsec_invite_first_response_seconds_count"), calls);
    assert_eq!(
        get("sipsec_invite_final_response_seconds_bucket{le=\"+Inf\"}"),
        calls
    );
    assert_eq!(get("sipsec_forwarded_requests_total"), 3.0 * calls);
    assert_eq!(
        get("sipsec_auth_total{scheme=\"none\",result=\"passed\"}"),
        0.0
    );
    assert!(s.contains_key("sipsec_worker_busy_ratio{worker=\"1\"}"));
    assert!(s.contains_key("sipsec_transactions"));
    // Only /metrics is served.
    assert_eq!(curl(&format!("http://127.0.0.1:{metrics}/")).0, 404);
    server.stop();
}

/// The endpoint has no authentication, so it must not be a way to starve the server: past
/// `MAX_CONNECTIONS` (16) a connection is closed at once, and one that sends half a request
/// is closed after `HEADER_TIMEOUT` (5 s), after which a scrape gets through again.
#[test]
#[cfg_attr(
    sipsec_skip_curl,
    ignore = "curl is not installed (apt-get install curl)"
)]
fn a_flood_of_half_requests_is_capped_and_timed_out() {
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let base = ports(21550);
    let (sip, metrics) = (base, base + 1);
    let server = Server::start(
        dir.path(),
        &format!(
            "[server]\nlisten = [\"udp:127.0.0.1:{sip}\"]\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\
             [database]\nurl = \"sqlite://{}\"\n",
            dir.path().join("m.db").display()
        ),
    );
    let started = Instant::now();
    let held: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut c = TcpStream::connect(("127.0.0.1", metrics)).unwrap();
            c.write_all(b"GET /metr").unwrap();
            c
        })
        .collect();
    let refused = held
        .iter()
        .filter(|c| closed_by_peer(c, Duration::from_millis(100)))
        .count();
    assert_eq!(refused, 4, "past the cap of 16");
    // The half requests are closed at the header timeout, not before and not much after.
    for c in &held {
        assert!(closed_by_peer(c, Duration::from_secs(10)));
    }
    let after = started.elapsed();
    assert!(
        (Duration::from_millis(4_500)..Duration::from_secs(8)).contains(&after),
        "{after:?}"
    );
    assert_eq!(curl(&format!("http://127.0.0.1:{metrics}/metrics")).0, 200);
    server.stop();
}
