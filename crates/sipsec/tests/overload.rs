//! Overload control with real processes: a server made to think itself overloaded (a target
//! load of 2%, a cap on the load that any real load exceeds) sheds new calls with 503s that Kamailio,
//! a neighbour without RFC 7339, relays as valid SIP; a load generator that speaks RFC 7339
//! sends less instead of being refused; and an upstream sipsec refuses the excess itself.
//!
//! The curves (goodput against offered load up to three times the peak, control on and off,
//! Kamailio beside it) are measured by the lab's overload suite, not here: `sipsec lab run
//! overload`.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;

/// A stateful proxy on `port` routing every call to `uas`, whose overload control believes
/// itself saturated whenever its load is over 2% (a `target` below half load caps the load).
fn overloaded_config(port: u16, uas: &str, dir: &Path, extra: &str) -> String {
    format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\ndomains = [\"example.test\"]\n\
         workers = 1\n[routing]\ndefault_route = \"sip:{uas}\"\n[database]\n\
         url = \"sqlite://{}\"\n[overload]\ntarget = 0.02\nfeedback_target = 0.02\n\
         interval_ms = 20\n{extra}",
        dir.join(format!("db-{port}.sqlite")).display()
    )
}

fn failures(v: &Value, reason: &str) -> u64 {
    v["failures_by_reason"][reason].as_u64().unwrap_or(0)
}

/// Calls at 1,500/s for 3 s from `target` to the UAS at `uas`: the load's summary.
fn calls(dir: &Path, target: &str, uas: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        target,
        "--role",
        "both",
        "--uas",
        uas,
        "--rate",
        "1500",
        "--duration",
        "3",
        "--drain-s",
        "10",
    ];
    args.extend_from_slice(extra);
    let (code, v, err) = load(dir, &args);
    assert!(code == 0 || code == 1, "{err}\n{v}");
    v
}

#[test]
fn an_overloaded_server_sheds_new_calls_with_503s_that_kamailio_relays_as_valid_sip() {
    if !have_kamailio(&[]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = ports(29900);
    let (kamailio_port, uas) = (port + 1, format!("127.0.0.3:{}", port + 2));
    let server = Server::start_logged(dir.path(), &overloaded_config(port, &uas, dir.path(), ""));
    let _k = Kamailio::proxy(
        dir.path(),
        &format!("udp:127.0.0.1:{kamailio_port}"),
        &format!("sip:127.0.0.1:{port};transport=udp"),
        &[],
    );
    let v = calls(dir.path(), &format!("127.0.0.1:{kamailio_port}"), &uas, &[]);
    let c = server.stop_counters();
    let shed = c.get("overload_shed");
    assert!(shed > 100, "shed {shed}: {v}");
    // Every call shed was answered through Kamailio, which parsed and relayed each 503 (as
    // 500, as RFC 3261 §16.7 asks of a proxy: the 503 was not about Kamailio itself);
    // nothing else failed, and nothing stray came back.
    // A server keeps no state for what it sheds, so an INVITE Kamailio sends again (its
    // retransmission timer crossing the 503) is shed again: a few more sheds than calls.
    let relayed = failures(&v, "500 Service Unavailable");
    assert!(
        relayed <= shed && shed <= relayed + relayed / 10,
        "shed {shed}, relayed {relayed}: {v}"
    );
    assert_eq!(
        n(&v, "failed"),
        relayed,
        "only shed calls failed: {:?}",
        v["failures_by_reason"]
    );
    assert_eq!(n(&v, "stray_messages"), 0, "{v}");
    // The calls admitted completed, BYE included, through both proxies.
    let ok = n(&v, "succeeded");
    assert!(ok > 0, "{v}");
    assert_eq!(n(&v, "attempted"), ok + relayed, "{v}");
    // Kamailio does not speak RFC 7339: our 503s carried Retry-After, never feedback.
    assert_eq!(c.get("overload_throttled"), 0);
}

#[test]
fn a_caller_that_honours_feedback_sends_less_instead_of_being_refused() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(29900);
    let uas = format!("127.0.0.3:{}", port + 2);
    let target = format!("127.0.0.1:{port}");
    let server = Server::start_logged(dir.path(), &overloaded_config(port, &uas, dir.path(), ""));
    let v = calls(dir.path(), &target, &uas, &["--oc"]);
    let c = server.stop_counters();
    let held = failures(&v, "not sent: overload feedback");
    let refused = failures(&v, "503 Service Unavailable");
    assert!(held > 1000, "the caller held back only {held}: {v}");
    // What the caller held back never reached the server.
    assert_eq!(c.get("overload_shed"), refused, "{v}");
    assert!(refused < held, "refused {refused}, held back {held}");
    assert!(n(&v, "succeeded") > 0, "{v}");
}

#[test]
fn an_upstream_proxy_refuses_the_excess_itself_when_its_next_hop_asks() {
    let dir = tempfile::tempdir().unwrap();
    let port = ports(29900);
    let (upstream_port, uas) = (port + 1, format!("127.0.0.3:{}", port + 2));
    let downstream =
        Server::start_logged(dir.path(), &overloaded_config(port, &uas, dir.path(), ""));
    let up_dir = dir.path().join("upstream");
    std::fs::create_dir_all(&up_dir).unwrap();
    let upstream = Server::start_logged(
        &up_dir,
        &format!(
            "[server]\nlisten = [\"udp:127.0.0.1:{upstream_port}\"]\ndomains = [\"up.test\"]\n\
             workers = 1\n[routing]\ndefault_route = \"sip:127.0.0.1:{port}\"\n[database]\n\
             url = \"sqlite://{}\"\n",
            up_dir.join("up.sqlite").display()
        ),
    );
    let v = calls(dir.path(), &format!("127.0.0.1:{upstream_port}"), &uas, &[]);
    let (down, up) = (downstream.stop_counters(), upstream.stop_counters());
    let throttled = up.get("overload_throttled");
    assert!(
        throttled > 1000,
        "the upstream refused only {throttled}: {v}"
    );
    // Most of the excess never reached the overloaded server.
    assert!(
        down.get("overload_shed") < throttled,
        "downstream shed {}, upstream refused {throttled}",
        down.get("overload_shed")
    );
    // Every refusal came from one of the two (the upstream's own admission too, which a
    // burst past its CPU figure may trip); a retransmitted INVITE shed twice downstream
    // counts twice there.
    let refused = failures(&v, "503 Service Unavailable");
    let counted = throttled + down.get("overload_shed") + up.get("overload_shed");
    assert!(
        refused <= counted && counted <= refused + refused / 10,
        "refused {refused}, counted {counted}: {v}"
    );
    assert!(n(&v, "succeeded") > 0, "{v}");
}
