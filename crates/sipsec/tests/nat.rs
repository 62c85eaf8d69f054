//! Phones behind a real NAT (issue 34): per test a home network masqueraded by an nftables
//! router with conntrack timeouts of seconds, and `sipsec serve` in the server's network, all
//! in network namespaces (`common/netns.rs`). The phones (SIPp with `peers/sipp/phone.xml`,
//! baresip) register their private Contact and are called from the server's side by
//! `sipsec load`. The server's namespace has no route to the home network: a call reaches a
//! phone only through the router's mapping of the address the phone registered from.
//!
//! Needs root (network namespaces), `ip`, `nft` (Debian nftables), SIPp and baresip; without
//! them each test says it skipped, and under CI fails.

mod common;

use common::netns::{baresip_phone, have_netns, load_phone, Nat};
use common::*;
use std::time::{Duration, Instant};

/// The calls of a `sipsec load` run that succeeded.
fn succeeded(run: &LoadRun) -> u64 {
    run.summary["succeeded"].as_u64().unwrap_or(0)
}

/// `count` calls at `rate` a second from caller address 1 to `user`, waiting up to 8 s for
/// the last.
fn calls(nat: &Nat, dir: &std::path::Path, user: &str, count: u32, rate: u32) -> LoadRun {
    nat.call(
        dir,
        1,
        user,
        &[
            "--calls",
            &count.to_string(),
            "--rate",
            &rate.to_string(),
            "--drain-s",
            "8",
        ],
    )
}

/// Asserts that every one of `count` calls in `run` succeeded; else shows the run and the
/// server's log.
fn assert_all(run: &LoadRun, count: u64, what: &str, server: &Server) {
    assert_eq!(
        (run.code, succeeded(run)),
        (0, count),
        "{what}: {}\n{}\nserver log:\n{}",
        run.stderr,
        run.summary,
        server.log()
    );
}

fn ready() -> bool {
    have_netns() && have_sipp()
}

/// The topology itself: the phone registers, though the home network is unreachable from
/// the server's namespace (so the 200 OK went back through the router's mapping of the
/// address the REGISTER came from), and the namespaces are gone once the topology is
/// dropped.
#[test]
#[cfg_attr(
    any(sipsec_skip_netns, sipsec_skip_sipp),
    ignore = "needs root with ip and nft, and SIPp (apt-get install nftables sip-tester)"
)]
fn the_router_masquerades_the_home_network_and_is_deleted_on_drop() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nat = Nat::new(30);
    let names = [&nat.home.name, &nat.router.name, &nat.server.name].map(|n| n.to_string());
    let server = nat.serve(dir.path(), &nat.config(dir.path(), ""));
    let phone = nat.sipp_phone(dir.path(), "alice", "u1", 5070, &[]);
    phone.registered(Duration::from_secs(5));
    let ep = nat.server.endpoint(&format!("{}:0", nat.caller_ip(1)));
    let unreachable = ep
        .socket
        .send_to(b"\r\n\r\n", format!("{}:5070", nat.home_ip(2)));
    assert_eq!(
        unreachable.map_err(|e| e.raw_os_error()),
        Err(Some(libc::ENETUNREACH))
    );
    drop((phone, ep, server));
    drop(nat);
    let left = String::from_utf8(
        std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for name in names {
        assert!(!left.contains(&name), "{name} left behind: {left}");
    }
}

/// A phone on UDP behind the NAT registers its private Contact and is called at the address
/// its REGISTER came from, on the embedded NAT defaults: every call completes (INVITE, 200,
/// ACK, BYE through the record-routing server), and each INVITE reached the phone.
#[test]
#[cfg_attr(
    any(sipsec_skip_netns, sipsec_skip_sipp),
    ignore = "needs root with ip and nft, and SIPp (apt-get install nftables sip-tester)"
)]
fn a_udp_phone_behind_a_nat_is_called_where_its_register_came_from() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nat = Nat::new(30);
    let server = nat.serve(dir.path(), &nat.config(dir.path(), ""));
    let phone = nat.sipp_phone(dir.path(), "alice", "u1", 5070, &[]);
    phone.registered(Duration::from_secs(5));
    assert_all(
        &calls(&nat, dir.path(), "alice", 10, 10),
        10,
        "udp",
        &server,
    );
    assert!(
        phone.received("INVITE ").len() >= 10,
        "{}",
        phone.messages()
    );
}

/// NAT keep-alive: the server's OPTIONS pings, every second against a conntrack timeout of
/// four, hold the router's UDP mapping open through three timeouts of the phone's silence,
/// and the call reaches the phone after them.
#[test]
#[cfg_attr(
    any(sipsec_skip_netns, sipsec_skip_sipp),
    ignore = "needs root with ip and nft, and SIPp (apt-get install nftables sip-tester)"
)]
fn pings_hold_a_udp_mapping_open_past_three_conntrack_timeouts() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nat = Nat::new(4);
    let config = nat.config(
        dir.path(),
        "[nat]\nping = \"options\"\nping_interval_ms = 1000\nping_timeout_ms = 0\n",
    );
    let server = nat.serve(dir.path(), &config);
    let phone = nat.sipp_phone(dir.path(), "alice", "u1", 5070, &[]);
    phone.registered(Duration::from_secs(5));
    nat.idle_past_three_timeouts();
    assert!(
        phone.received("OPTIONS ").len() >= 3,
        "the server pinged the phone: {}",
        phone.messages()
    );
    assert_all(
        &calls(&nat, dir.path(), "alice", 3, 10),
        3,
        "after three conntrack timeouts, with pings",
        &server,
    );
    assert!(phone.received("INVITE ").len() >= 3);
}

/// Without pings the router forgets the mapping: the phone, reached right after registering,
/// is not reached after three conntrack timeouts of silence, the INVITE never gets to it.
#[test]
#[cfg_attr(
    any(sipsec_skip_netns, sipsec_skip_sipp),
    ignore = "needs root with ip and nft, and SIPp (apt-get install nftables sip-tester)"
)]
fn without_pings_the_mapping_expires_and_the_phone_is_not_reached() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nat = Nat::new(4);
    let server = nat.serve(
        dir.path(),
        &nat.config(dir.path(), "[nat]\nping = \"off\"\n"),
    );
    let phone = nat.sipp_phone(dir.path(), "alice", "u1", 5070, &[]);
    phone.registered(Duration::from_secs(5));
    assert_all(
        &calls(&nat, dir.path(), "alice", 1, 10),
        1,
        "right after registering",
        &server,
    );
    let before = phone.received("INVITE ").len();
    nat.idle_past_three_timeouts();
    let after = calls(&nat, dir.path(), "alice", 1, 10);
    assert_eq!(succeeded(&after), 0, "{}", after.summary);
    assert_eq!(
        phone.received("INVITE ").len(),
        before,
        "no INVITE got through the expired mapping: {}",
        phone.messages()
    );
    assert!(phone.received("OPTIONS ").is_empty());
}

/// A TCP phone (SIPp) behind the NAT is called over the connection it registered on: the
/// router refuses connections from outside, so a call that completes came that way.
#[test]
#[cfg_attr(
    any(sipsec_skip_netns, sipsec_skip_sipp),
    ignore = "needs root with ip and nft, and SIPp (apt-get install nftables sip-tester)"
)]
fn a_tcp_phone_is_called_over_its_registering_connection() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nat = Nat::new(30);
    let server = nat.serve(dir.path(), &nat.config(dir.path(), ""));
    let phone = nat.sipp_phone(dir.path(), "bob", "t1", 5070, &[]);
    phone.registered(Duration::from_secs(5));
    assert_all(&calls(&nat, dir.path(), "bob", 5, 10), 5, "tcp", &server);
    let invites = phone.received("INVITE ");
    assert!(invites.len() >= 5, "{}", phone.messages());
    assert!(invites.iter().all(|m| m.contains("TCP message received")));
}

/// Streams behind the NAT: baresip as an RFC 5626 client (`sipnat=outbound`) over TCP and
/// over TLS keeps its connection's mapping open with CRLF keep-alives at the Flow-Timer the
/// server gives (10 s, its least, against a conntrack timeout of 15 s), and is called over
/// that connection after three conntrack timeouts; a TCP phone that sends nothing (SIPp) has
/// lost its mapping by then and is not reached.
#[test]
#[cfg_attr(
    any(sipsec_skip_netns, sipsec_skip_sipp, sipsec_skip_baresip),
    ignore = "needs root with ip and nft, SIPp and baresip (apt-get install nftables sip-tester baresip-core)"
)]
fn stream_keepalives_hold_mappings_past_three_conntrack_timeouts_and_silence_does_not() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nat = Nat::new(15);
    let server = nat.serve(
        dir.path(),
        &nat.config(dir.path(), "[nat]\nflow_timer_s = 10\n"),
    );
    let (ip, ca) = (nat.server_ip(), dir.path().join("ca.pem"));
    let outbound = ";sipnat=outbound";
    let tcp = baresip_phone(
        &nat,
        dir.path(),
        ("tcpphone", 5072),
        (&format!("sip:{ip}:5060;transport=tcp"), outbound),
        "",
        120,
    );
    let tls = baresip_phone(
        &nat,
        dir.path(),
        ("tlsphone", 5074),
        (&format!("sip:{ip}:5061;transport=tls"), outbound),
        &format!("sip_cafile {}\n", ca.display()),
        120,
    );
    let silent = nat.sipp_phone(dir.path(), "quiet", "t1", 5070, &[]);
    tcp.registered(Duration::from_secs(10));
    tls.registered(Duration::from_secs(10));
    silent.registered(Duration::from_secs(5));
    assert_all(
        &calls(&nat, dir.path(), "quiet", 1, 10),
        1,
        "the silent phone, right after registering",
        &server,
    );
    nat.idle_past_three_timeouts();
    for user in ["tcpphone", "tlsphone"] {
        assert_all(
            &calls(&nat, dir.path(), user, 3, 10),
            3,
            &format!("{user} after three conntrack timeouts"),
            &server,
        );
    }
    let before = silent.received("INVITE ").len();
    let lost = calls(&nat, dir.path(), "quiet", 1, 10);
    assert_eq!(succeeded(&lost), 0, "{}", lost.summary);
    assert_eq!(silent.received("INVITE ").len(), before);
}

/// `sipsec load --role uas --register --outbound`, the lab's phone, behind the NAT: it
/// registers over UDP, TCP and TLS and takes its calls on each flow, right away and after
/// three conntrack timeouts (its own keep-alives at the 10 s Flow-Timer holding the streams'
/// mappings, the server's pings the UDP one's).
#[test]
#[cfg_attr(
    sipsec_skip_netns,
    ignore = "needs root with ip and nft (apt-get install nftables)"
)]
fn the_load_generators_registering_callee_takes_calls_behind_the_nat() {
    if !have_netns() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nat = Nat::new(15);
    let config = nat.config(
        dir.path(),
        "[nat]\nflow_timer_s = 10\nping_interval_ms = 4000\n",
    );
    let server = nat.serve(dir.path(), &config);
    let phones: Vec<_> = ["udp", "tcp", "tls"]
        .map(|t| load_phone(&nat, dir.path(), &format!("{t}phone"), t, &["--outbound"]))
        .into_iter()
        .collect();
    for phone in &phones {
        phone.registered(Duration::from_secs(10));
    }
    for when in ["right away", "after three conntrack timeouts"] {
        if when != "right away" {
            nat.idle_past_three_timeouts();
        }
        for t in ["udp", "tcp", "tls"] {
            assert_all(
                &calls(&nat, dir.path(), &format!("{t}phone"), 3, 10),
                3,
                &format!("{t} {when}"),
                &server,
            );
        }
    }
}

/// baresip, behind the NAT, registers over TLS (checking the server's certificate) and is
/// called over that connection; and over UDP, beside a SIPp phone registered the same way
/// from the same home network: both answer every call.
#[test]
#[cfg_attr(
    any(sipsec_skip_netns, sipsec_skip_sipp, sipsec_skip_baresip),
    ignore = "needs root with ip and nft, SIPp and baresip (apt-get install nftables sip-tester baresip-core)"
)]
fn baresip_behind_the_nat_takes_calls_over_tls_and_udp_beside_sipp() {
    if !ready() {
        return;
    }
    assert!(
        std::process::Command::new("baresip")
            .arg("-h")
            .output()
            .is_ok(),
        "baresip (Debian package baresip-core) is required under CI"
    );
    let dir = tempfile::tempdir().unwrap();
    let nat = Nat::new(30);
    let config = nat.config(dir.path(), "");
    let server = nat.serve(dir.path(), &config);
    let ip = nat.server_ip();
    let ca = dir.path().join("ca.pem").display().to_string();
    let tls = baresip_phone(
        &nat,
        dir.path(),
        ("carol", 5072),
        (&format!("sip:{ip}:5061;transport=tls"), ""),
        &format!("sip_cafile {ca}\n"),
        60,
    );
    tls.registered(Duration::from_secs(10));
    assert_all(&calls(&nat, dir.path(), "carol", 3, 2), 3, "tls", &server);
    drop(tls);
    let udp = baresip_phone(
        &nat,
        dir.path(),
        ("dave", 5074),
        (&format!("sip:{ip}:5060"), ""),
        "",
        60,
    );
    udp.registered(Duration::from_secs(10));
    let sipp = nat.sipp_phone(dir.path(), "erin", "u1", 5070, &[]);
    sipp.registered(Duration::from_secs(5));
    assert_all(
        &calls(&nat, dir.path(), "dave", 3, 2),
        3,
        "baresip udp",
        &server,
    );
    assert_all(
        &calls(&nat, dir.path(), "erin", 3, 2),
        3,
        "sipp udp",
        &server,
    );
    assert!(
        udp.output().contains("Call established"),
        "{}",
        udp.output()
    );
}

/// An INVITE to `user`@example.test from `ep`.
fn invite(ep: &Endpoint, user: &str, branch: &str) -> String {
    format!(
        "INVITE sip:{user}@example.test SIP/2.0\r\n\
         Via: SIP/2.0/UDP {};branch=z9hG4bK-{branch}\r\nMax-Forwards: 70\r\n\
         From: <sip:caller@example.test>;tag=c-{branch}\r\nTo: <sip:{user}@example.test>\r\n\
         Call-ID: {branch}@{}\r\nCSeq: 1 INVITE\r\nContact: <sip:caller@{}>\r\n\
         Content-Length: 0\r\n\r\n",
        ep.addr, ep.addr, ep.addr
    )
}

/// The final status code the server answers `ep`'s INVITE with, and how long it took.
fn final_answer(ep: &Endpoint, server: &str, text: &str) -> (u16, Duration) {
    let start = Instant::now();
    ep.send(server, text);
    loop {
        let m = ep.recv();
        let code: u16 = m
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        if m.starts_with("SIP/2.0 ") && code >= 200 {
            return (code, start.elapsed());
        }
    }
}

/// RFC 5626 outbound behind the NAT: one instance registers two TCP flows (reg-id 1 and 2,
/// two SIPp phones with one `+sip.instance`); the first is killed, its connection closes,
/// and calls fail over to the second. Then a sole flow killed: the INVITE gets 430 Flow
/// Failed at once, not after a timeout.
#[test]
#[cfg_attr(
    any(sipsec_skip_netns, sipsec_skip_sipp),
    ignore = "needs root with ip and nft, and SIPp (apt-get install nftables sip-tester)"
)]
fn outbound_fails_over_to_the_second_flow_and_a_lost_sole_flow_gives_430() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nat = Nat::new(30);
    let server = nat.serve(dir.path(), &nat.config(dir.path(), ""));
    let flow = |user: &str, reg_id: &str, port: u16, uuid: &str| {
        let params = format!(";reg-id={reg_id};+sip.instance=\"<urn:uuid:{uuid}>\"");
        let phone = nat.sipp_phone(
            dir.path(),
            user,
            "t1",
            port,
            &[
                ("uri_params", ";ob"),
                ("contact_params", &params),
                ("supported", "path, outbound"),
            ],
        );
        phone.registered(Duration::from_secs(5));
        phone
    };
    let instance = "00000000-0000-4000-8000-00000000a1ce";
    let mut first = flow("alice", "1", 5071, instance);
    let second = flow("alice", "2", 5072, instance);
    first.kill();
    // The server sees the connection close; give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    assert_all(
        &calls(&nat, dir.path(), "alice", 3, 10),
        3,
        "after the first flow died",
        &server,
    );
    assert!(
        second.received("INVITE ").len() >= 3,
        "{}",
        second.messages()
    );

    let mut sole = flow("bob", "1", 5073, "00000000-0000-4000-8000-000000000b0b");
    sole.kill();
    std::thread::sleep(Duration::from_millis(500));
    let ep = nat.server.endpoint(&format!("{}:0", nat.caller_ip(2)));
    let to = format!("{}:5060", nat.server_ip());
    let (code, took) = final_answer(&ep, &to, &invite(&ep, "bob", "sole"));
    assert_eq!(code, 430, "{}", server.log());
    assert!(took < Duration::from_secs(1), "430 after {took:?}");
}

/// Per-source flood limits: a flood of OPTIONS from one address in the server's network is
/// banned (counted, its requests refused), while calls from another address to the phone
/// behind the NAT keep at least 99% success.
#[test]
#[cfg_attr(
    any(sipsec_skip_netns, sipsec_skip_sipp),
    ignore = "needs root with ip and nft, and SIPp (apt-get install nftables sip-tester)"
)]
fn a_flood_from_one_address_is_banned_while_other_callers_reach_the_nated_phone() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nat = Nat::new(30);
    let config = nat.config(
        dir.path(),
        "[flood]\nrate = 200\nwindow_ms = 1000\nban_s = 60\naction = \"drop\"\n",
    );
    let server = nat.serve(dir.path(), &config);
    let phone = nat.sipp_phone(dir.path(), "alice", "u1", 5070, &[]);
    phone.registered(Duration::from_secs(5));
    let flood = {
        let (nat, dir) = (&nat, dir.path());
        std::thread::scope(|s| {
            let flood = s.spawn(move || {
                nat.call(
                    dir,
                    2,
                    "nobody",
                    &[
                        "--scenario",
                        "options",
                        "--rate",
                        "5000",
                        "--duration",
                        "6",
                        "--drain-s",
                        "1",
                    ],
                )
            });
            std::thread::sleep(Duration::from_secs(1));
            let run = calls(nat, dir, "alice", 200, 50);
            (flood.join().unwrap(), run)
        })
    };
    let (flood, run) = flood;
    let ok = succeeded(&run);
    assert!(
        ok * 100 >= 200 * 99,
        "{ok} of 200 calls during the flood: {}",
        run.summary
    );
    let offered = flood.summary["attempted"].as_u64().unwrap_or(0);
    let c = server.stop_counters();
    eprintln!(
        "{ok} of 200 calls during a flood of {offered} OPTIONS: {} bans, {} refused",
        c.get("flood_bans"),
        c.get("flood_refused")
    );
    assert!(c.get("flood_bans") >= 1, "{:?}", c.0);
    assert!(
        c.get("flood_refused") * 2 > offered,
        "most of the {offered} flood requests refused: {:?}",
        c.0
    );
}
