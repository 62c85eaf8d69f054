//! Locating next hops in simulated time: requests waiting for DNS, cached and expired answers,
//! weighted routes, and failover (RFC 3263 §4.3).

use super::*;
use crate::dns::{Entry, Failure, Query, Resolution};
use std::sync::atomic::Ordering;

const NAMED: &str = "[routing]\ndefault_route = \"sip:carrier.example.net\"\n";
const TWO: &str = "[routing]\ndefault_routes = [{ uri = \"sip:127.0.0.3:5080\", priority = 1 }, \
                   { uri = \"sip:127.0.0.4:5090\", priority = 2 }]\n";

fn answer_a(ip: [u8; 4], ttl_s: u32) -> Arc<Resolution> {
    Arc::new(Resolution {
        entries: vec![Entry {
            rank: 0,
            weight: 0,
            transport: Transport::Udp,
            port: 5060,
            addrs: smallvec::smallvec![IpAddr::from(ip)],
        }],
        ttl_s,
        error: None,
    })
}

fn resolved(e: &mut Engine, now: Millis, query: Query, r: Arc<Resolution>) -> (Vec<Sent>, Effects) {
    let mut fx = Effects::default();
    e.handle_mail(
        now,
        Mail::Resolved {
            query,
            resolution: r,
        },
        &mut fx,
    );
    (sent(&mut fx), fx)
}

/// A new request from ALICE for a domain not ours (so routed by `[routing]`), with `branch`.
fn to_elsewhere(e: &mut Engine, now: Millis, method: &str, branch: &str) -> (Vec<Sent>, Effects) {
    let text = request(method, "sip:x@elsewhere.test", branch, "");
    deliver(e, now, ALICE, &text)
}

fn is_invite(s: &Sent) -> bool {
    s.msg().is_request() && s.method() == Method::Invite
}

fn carrier() -> Query {
    Query::new(b"carrier.example.net", None, None, false)
}

#[test]
fn a_named_route_waits_for_dns_then_uses_the_answer_until_it_expires() {
    let mut e = engine(NAMED);
    let invite = request("INVITE", "sip:someone@elsewhere.test", "z9hG4bKd1", "");
    let (sent, fx) = deliver(&mut e, 0, ALICE, &invite);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status(), Some(100), "the caller hears we are on it");
    assert_eq!(fx.lookups, vec![carrier()]);
    // Its retransmission is absorbed by the transaction it waits in; nothing is asked twice.
    let (sent, fx) = deliver(&mut e, 500, ALICE, &invite);
    assert_eq!((sent.len(), sent[0].status()), (1, Some(100)));
    assert!(fx.lookups.is_empty());
    let (sent, _) = resolved(&mut e, 600, carrier(), answer_a([10, 0, 0, 9], 60));
    assert_eq!(sent.len(), 1);
    assert!(is_invite(&sent[0]));
    assert_eq!(sent[0].to, addr("10.0.0.9:5060"));
    // The next call goes at once, from the cache.
    let (sent, fx) = to_elsewhere(&mut e, 700, "INVITE", "z9hG4bKd2");
    assert_eq!(
        sent.iter()
            .filter(|s| s.to == addr("10.0.0.9:5060"))
            .count(),
        1
    );
    assert!(fx.lookups.is_empty());
    assert_eq!(e.stats.dns_lookups.load(Ordering::Relaxed), 1);
    // Expired: used still, and asked again once.
    let (sent, fx) = to_elsewhere(&mut e, 61_000, "INVITE", "z9hG4bKd3");
    assert_eq!(
        sent.iter()
            .filter(|s| s.to == addr("10.0.0.9:5060"))
            .count(),
        1
    );
    assert_eq!(fx.lookups, vec![carrier()]);
    let (_, fx) = to_elsewhere(&mut e, 61_001, "INVITE", "z9hG4bKd4");
    assert!(fx.lookups.is_empty(), "one refresh at a time");
    // The new answer moves the calls.
    resolved(&mut e, 61_010, carrier(), answer_a([10, 0, 0, 10], 60));
    let (sent, _) = to_elsewhere(&mut e, 61_020, "INVITE", "z9hG4bKd5");
    assert_eq!(
        sent.iter()
            .filter(|s| s.to == addr("10.0.0.10:5060"))
            .count(),
        1
    );
    // DNS down at the next refresh: the stale answer is kept rather than failing calls.
    resolved(
        &mut e,
        130_000,
        carrier(),
        Arc::new(Resolution::failed(Failure::Unavailable, 5)),
    );
    let (sent, _) = to_elsewhere(&mut e, 130_010, "INVITE", "z9hG4bKd6");
    assert_eq!(
        sent.iter()
            .filter(|s| s.to == addr("10.0.0.10:5060"))
            .count(),
        1
    );
}

#[test]
fn names_without_servers_get_404_and_dns_outages_503() {
    for (failure, code) in [(Failure::NoRecords, 404), (Failure::Unavailable, 503)] {
        let mut e = engine(NAMED);
        to_elsewhere(&mut e, 0, "INVITE", "z9hG4bKn1");
        let (sent, _) = resolved(
            &mut e,
            10,
            carrier(),
            Arc::new(Resolution::failed(failure, 30)),
        );
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].status(), Some(code));
        assert_eq!(sent[0].to, addr(ALICE));
    }
}

#[test]
fn a_request_uri_host_is_located_when_there_is_no_route() {
    let mut e = engine("");
    let (sent, fx) = deliver(
        &mut e,
        0,
        ALICE,
        &request(
            "OPTIONS",
            "sips:bob@Partner.Example;transport=tls",
            "z9hG4bKu1",
            "",
        ),
    );
    assert!(sent.is_empty(), "a non-INVITE gets no 100");
    assert_eq!(
        fx.lookups,
        vec![Query::new(
            b"partner.example",
            Some(Transport::Tls),
            None,
            true
        )]
    );
}

#[test]
fn cancel_while_waiting_for_dns_ends_the_call_with_487() {
    let mut e = engine(NAMED);
    let invite = request("INVITE", "sip:x@elsewhere.test", "z9hG4bKc1", "");
    deliver(&mut e, 0, ALICE, &invite);
    let cancel = request("CANCEL", "sip:x@elsewhere.test", "z9hG4bKc1", "");
    let (sent, _) = deliver(&mut e, 100, ALICE, &cancel);
    let codes: Vec<_> = sent
        .iter()
        .map(|s| (s.status(), s.msg().cseq().method))
        .collect();
    assert!(codes.contains(&(Some(200), &b"CANCEL"[..])), "{codes:?}");
    assert!(codes.contains(&(Some(487), &b"INVITE"[..])), "{codes:?}");
    // The answer comes later; nothing goes out.
    let (sent, _) = resolved(&mut e, 200, carrier(), answer_a([10, 0, 0, 9], 60));
    assert!(sent.is_empty());
}

#[test]
fn a_503_fails_over_to_the_next_route_which_is_then_preferred_for_retry_after() {
    let mut e = engine(TWO);
    let (sent, _) = to_elsewhere(&mut e, 0, "INVITE", "z9hG4bKf1");
    let first = sent.iter().find(|s| is_invite(s)).unwrap();
    assert_eq!(first.to, addr(BOB1), "priority 1 first");
    let busy =
        answer(first, 503, "b").replace("Content-Length", "Retry-After: 2\r\nContent-Length");
    let (sent, fx) = deliver(&mut e, 10, BOB1, &busy);
    // The other worker is told to skip BOB1 for as long.
    let told: Vec<_> = fx
        .mail
        .iter()
        .filter_map(|(w, m)| match m {
            Mail::HoldDown { peer, until } => Some((*w, peer.addr, *until)),
            _ => None,
        })
        .collect();
    assert_eq!(told, [(1, addr(BOB1), 2_010)]);
    let ack = sent.iter().find(|s| s.method() == Method::Ack).unwrap();
    assert_eq!(ack.to, addr(BOB1));
    let next = sent.iter().find(|s| is_invite(s)).unwrap();
    assert_eq!(next.to, addr(BOB2));
    assert!(
        sent.iter().all(|s| s.to != addr(ALICE)),
        "the caller hears nothing of the 503"
    );
    let (up, _) = deliver(&mut e, 20, BOB2, &answer(next, 200, "c"));
    assert_eq!(
        up.iter().find(|s| s.to == addr(ALICE)).unwrap().status(),
        Some(200)
    );
    // For its Retry-After, the first route is skipped; then it has its calls back.
    let (sent, _) = to_elsewhere(&mut e, 1_000, "INVITE", "z9hG4bKf2");
    assert!(sent.iter().any(|s| is_invite(s) && s.to == addr(BOB2)));
    let (sent, _) = to_elsewhere(&mut e, 2_100, "INVITE", "z9hG4bKf3");
    assert!(sent.iter().any(|s| is_invite(s) && s.to == addr(BOB1)));
    assert_eq!(e.stats.failovers.load(Ordering::Relaxed), 1);
}

#[test]
fn a_silent_route_is_failed_over_after_failover_timeout_ms_and_the_last_503_reaches_the_caller() {
    let mut e = engine(&format!("{TWO}failover_timeout_ms = 1500\n"));
    let (sent, _) = to_elsewhere(&mut e, 0, "INVITE", "z9hG4bKt1");
    assert!(sent.iter().any(|s| is_invite(s) && s.to == addr(BOB1)));
    assert!(tick(&mut e, 1_499).iter().all(|s| s.to != addr(BOB2)));
    let sent = tick(&mut e, 1_500);
    let next = sent
        .iter()
        .find(|s| is_invite(s) && s.to == addr(BOB2))
        .unwrap();
    // The last destination fails too: its 503 is the caller's answer.
    let (up, _) = deliver(&mut e, 1_600, BOB2, &answer(next, 503, "d"));
    assert_eq!(
        up.iter().find(|s| s.to == addr(ALICE)).unwrap().status(),
        Some(503)
    );
}

#[test]
fn weighted_routes_share_new_calls_by_their_weights() {
    let mut e = engine(
        "[routing]\ndefault_routes = [{ uri = \"sip:127.0.0.3:5080\", weight = 3 }, \
         { uri = \"sip:127.0.0.4:5090\", weight = 1 }]\n",
    );
    let mut to_bob1 = 0;
    for i in 0..4000 {
        let (sent, _) = to_elsewhere(&mut e, i, "OPTIONS", &format!("z9hG4bKw{i}"));
        to_bob1 += sent.iter().filter(|s| s.to == addr(BOB1)).count();
    }
    let share = to_bob1 as f64 / 4000.0;
    assert!((share - 0.75).abs() < 0.03, "{share}");
}

#[test]
fn probes_mark_a_silent_route_down_in_every_worker_and_up_when_it_answers() {
    let mut e = engine(&format!(
        "{TWO}probe_interval_s = 5\nfailover_timeout_ms = 1000\n"
    ));
    let probes = tick(&mut e, 0);
    let to = |sent: &[Sent], a: &str| -> Option<String> {
        sent.iter()
            .find(|s| s.to == addr(a) && s.msg().is_request())
            .map(|s| s.text.clone())
    };
    let p1 = to(&probes, BOB1).expect("BOB1 probed");
    let p2 = to(&probes, BOB2).expect("BOB2 probed");
    assert!(p1.starts_with("OPTIONS sip:127.0.0.3:5080 SIP/2.0"), "{p1}");
    // BOB2 answers; BOB1 says nothing.
    let sent = |t: &str| Sent {
        to: addr(PROXY),
        transport: Transport::Udp,
        text: t.to_string(),
    };
    deliver(&mut e, 10, BOB2, &answer(&sent(&p2), 200, "p"));
    let mut fx = Effects::default();
    e.handle_timeout(1_000, &mut fx);
    assert!(
        fx.mail
            .iter()
            .any(|(w, m)| *w == 1
                && matches!(m, Mail::HoldDown { until, .. } if *until == Millis::MAX)),
        "the other worker is told"
    );
    // Calls skip BOB1 while it is down.
    let (sent_now, _) = to_elsewhere(&mut e, 1_100, "INVITE", "z9hG4bKp1");
    assert!(sent_now.iter().any(|s| is_invite(s) && s.to == addr(BOB2)));
    assert_eq!(e.stats.probe_failures.load(Ordering::Relaxed), 1);
    // The next round: BOB1 answers and has its calls back.
    let probes = tick(&mut e, 5_000);
    let p1 = to(&probes, BOB1).expect("BOB1 probed again");
    deliver(&mut e, 5_010, BOB1, &answer(&sent(&p1), 200, "p"));
    let (sent_now, _) = to_elsewhere(&mut e, 5_100, "INVITE", "z9hG4bKp2");
    assert!(sent_now.iter().any(|s| is_invite(s) && s.to == addr(BOB1)));
}

#[test]
fn a_hold_told_by_another_worker_is_kept_until_it_ends() {
    let mut e = engine(TWO);
    let mut fx = Effects::default();
    let bob1 = Peer::udp(addr(BOB1));
    e.handle_mail(
        0,
        Mail::HoldDown {
            peer: bob1,
            until: 1_000,
        },
        &mut fx,
    );
    assert!(fx.mail.is_empty(), "not told back");
    let (sent, _) = to_elsewhere(&mut e, 500, "INVITE", "z9hG4bKh1");
    assert!(sent.iter().any(|s| is_invite(s) && s.to == addr(BOB2)));
    let (sent, _) = to_elsewhere(&mut e, 1_000, "INVITE", "z9hG4bKh2");
    assert!(sent.iter().any(|s| is_invite(s) && s.to == addr(BOB1)));
}

#[test]
fn a_flood_waiting_for_dns_is_bounded_and_the_excess_answered_503() {
    let mut e = engine(NAMED);
    let mut refused = 0;
    for i in 0..10_050 {
        let (sent, _) = to_elsewhere(&mut e, 0, "OPTIONS", &format!("z9hG4bKfl{i}"));
        refused += sent.iter().filter(|s| s.status() == Some(503)).count();
    }
    assert_eq!(refused, 50, "10,000 wait; the rest are refused at once");
    // The answer releases every one that waited.
    let (sent, _) = resolved(&mut e, 10, carrier(), answer_a([10, 0, 0, 9], 60));
    assert_eq!(sent.iter().filter(|s| s.msg().is_request()).count(), 10_000);
}
