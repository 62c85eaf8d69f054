//! Phones behind NATs and RFC 5626 flows, in simulated time: where a binding is reached,
//! in-dialog requests through the flow token in our Record-Route, flows that are gone
//! (430/480 at once), failover between an instance's flows, 439, and Path.

use super::*;
use std::sync::atomic::Ordering;

/// The NAT's public side, as the server sees a phone behind it.
const NAT: &str = "198.51.100.7:40001";

fn deliver_from(e: &mut Engine, now: Millis, from: Peer, text: &str) -> Vec<(Peer, String)> {
    let mut fx = Effects::default();
    e.handle_message(now, from, text.as_bytes(), &mut fx);
    fx.transmits
        .drain(..)
        .map(|(to, d)| (to, String::from_utf8(d.to_vec()).unwrap()))
        .collect()
}

/// A REGISTER; `via` is the top Via's `TRANSPORT sent-by;params` (each REGISTER of a test
/// gets its own, which makes its branch and Call-ID its own).
fn register_as(user: &str, via: &str, contact: &str, extra: &str) -> String {
    let id = branch::fnv1a(&[via.as_bytes(), contact.as_bytes()]);
    format!(
        "REGISTER sip:example.test SIP/2.0\r\nVia: SIP/2.0/{via};branch=z9hG4bKr{id:x}\r\n\
Max-Forwards: 70\r\nFrom: <sip:{user}@example.test>;tag=r1\r\nTo: <sip:{user}@example.test>\r\n\
Call-ID: reg-{id:x}\r\nCSeq: 1 REGISTER\r\nContact: {contact}\r\n{extra}Expires: 600\r\n\
Content-Length: 0\r\n\r\n"
    )
}

/// An engine listening on UDP and TCP.
fn engine_with_tcp() -> Engine {
    let cfg = Config::from_toml(&format!(
        "[server]\nlisten = [\"udp:{PROXY}\", \"tcp:{PROXY}\"]\ndomains = [\"example.test\"]\nworkers = 2\n"
    ))
    .unwrap();
    Engine::new(Arc::new(cfg), 0, 1_000_000, Arc::new(Stats::default()))
}

/// A TCP connection `conn` from the NAT's public side.
fn nat_tcp(conn: ConnId) -> Peer {
    Peer {
        transport: Transport::Tcp,
        addr: addr(NAT),
        conn,
        flow: false,
    }
}

fn invite(user: &str, branch: &str) -> String {
    request("INVITE", &format!("sip:{user}@example.test"), branch, "")
}

fn status(text: &str) -> Option<u16> {
    Message::parse(text.as_bytes()).unwrap().status()
}

#[test]
fn a_udp_phone_behind_a_nat_is_called_where_its_register_came_from() {
    let mut e = engine("");
    let phone = Peer::udp_via(addr(NAT), 0);
    let reg = register_as(
        "carol",
        "UDP 192.168.1.20:5060;rport",
        "<sip:carol@192.168.1.20:5060>",
        "",
    );
    let out = deliver_from(&mut e, 0, phone, &reg);
    assert_eq!(status(&out[0].1), Some(200));
    assert_eq!(
        out[0].0.addr,
        addr(NAT),
        "the 200 goes back through the NAT"
    );
    assert!(
        out[0]
            .1
            .contains("Via: SIP/2.0/UDP 192.168.1.20:5060;rport=40001;branch=")
            && out[0].1.contains(";received=198.51.100.7\r\n"),
        "RFC 3581: the phone learns its public address: {}",
        out[0].1
    );

    let out = deliver_from(
        &mut e,
        10,
        Peer::udp_via(addr(ALICE), 0),
        &invite("carol", "z9hG4bKn1"),
    );
    let (to, fwd) = &out[1];
    assert_eq!(
        to.addr,
        addr(NAT),
        "sent to the NAT's mapping, not the Contact"
    );
    assert_eq!(
        to.udp_socket(),
        Some(0),
        "from the socket the REGISTER came in on"
    );
    let m = Message::parse(fwd.as_bytes()).unwrap();
    assert_eq!(
        m.request_uri().unwrap().raw,
        b"sip:carol@192.168.1.20:5060",
        "the Request-URI is the Contact as registered"
    );

    // Carol answers from behind the NAT; the 200 carries her flow in our Record-Route.
    let sent = Sent {
        to: to.addr,
        transport: to.transport,
        text: fwd.clone(),
    };
    // As a UAS does, the 200 copies the Record-Route of the INVITE.
    let rr = fwd
        .lines()
        .find(|l| l.starts_with("Record-Route:"))
        .expect("we record-route");
    assert!(
        !rr.contains(";fl="),
        "Alice is reachable at her Contact: {rr}"
    );
    let ok = answer(&sent, 200, "c1").replace(
        "Content-Length",
        &format!("{rr}\r\nContact: <sip:carol@192.168.1.20:5060>\r\nContent-Length"),
    );
    let out = deliver_from(&mut e, 20, phone, &ok);
    let up = &out[0].1;
    assert_eq!(status(up), Some(200));
    let rr_line = up
        .lines()
        .find(|l| l.starts_with("Record-Route:"))
        .expect("our Record-Route");
    assert!(rr_line.contains(";fl="), "{rr_line}");
    let rr = rr_line
        .trim_start_matches("Record-Route: <")
        .trim_end_matches('>');

    // Alice's BYE follows the route set to Carol's Contact, which nobody can reach: it goes
    // over the flow the token names.
    let bye = format!(
        "BYE sip:carol@192.168.1.20:5060 SIP/2.0\r\nVia: SIP/2.0/UDP {ALICE};branch=z9hG4bKbye1\r\n\
Route: <{rr}>\r\nMax-Forwards: 70\r\nFrom: <sip:alice@example.test>;tag=a1\r\n\
To: <sip:carol@example.test>;tag=c1\r\nCall-ID: call-z9hG4bKn1\r\nCSeq: 2 BYE\r\n\
Content-Length: 0\r\n\r\n"
    );
    let out = deliver_from(&mut e, 30, Peer::udp_via(addr(ALICE), 0), &bye);
    assert_eq!(out[0].0.addr, addr(NAT), "{}", out[0].1);
    assert_eq!(e.stats.flow_routed.load(Ordering::Relaxed), 1);

    // A token someone else wrote opens nothing: the BYE goes to the Request-URI.
    let forged = bye.replace(";fl=", ";fl=00").replace("bye1", "bye2");
    let out = deliver_from(&mut e, 40, Peer::udp_via(addr(ALICE), 0), &forged);
    assert_eq!(out[0].0.addr, addr("192.168.1.20:5060"));
}

#[test]
fn with_nat_mode_never_the_contact_is_used_as_written() {
    let mut e = engine("[nat]\nmode = \"never\"\n");
    let phone = Peer::udp_via(addr(NAT), 0);
    let reg = register_as(
        "carol",
        "UDP 192.168.1.20:5060;rport",
        "<sip:carol@192.168.1.20>",
        "",
    );
    deliver_from(&mut e, 0, phone, &reg);
    let out = deliver_from(
        &mut e,
        10,
        Peer::udp(addr(ALICE)),
        &invite("carol", "z9hG4bKn2"),
    );
    assert_eq!(out[1].0.addr, addr("192.168.1.20:5060"));
}

#[test]
fn a_phone_on_a_connection_is_called_over_it_and_a_gone_one_fails_at_once() {
    let mut e = engine_with_tcp();
    let conn = nat_tcp(5);
    let reg = register_as(
        "dave",
        "TCP x7.invalid;rport",
        "<sip:dave@x7.invalid;transport=tcp>",
        "",
    );
    assert_eq!(status(&deliver_from(&mut e, 0, conn, &reg)[0].1), Some(200));
    let out = deliver_from(
        &mut e,
        10,
        Peer::udp(addr(ALICE)),
        &invite("dave", "z9hG4bKt1"),
    );
    let (to, fwd) = out[1].clone();
    assert_eq!((to.conn, to.flow), (5, true), "over its connection only");

    // The connection is gone: the driver hands the request back, and the caller hears 480
    // now, not after 32 seconds.
    let mut fx = Effects::default();
    e.handle_transport_error(20, to, fwd.as_bytes(), &mut fx);
    let up = sent(&mut fx);
    assert_eq!(up.last().and_then(Sent::status), Some(480));
    assert_eq!(up.last().unwrap().to, addr(ALICE));
}

fn outbound_contact(reg_id: u32) -> String {
    format!(
        "<sip:erin@x9.invalid;transport=tcp;ob>;+sip.instance=\"<urn:uuid:00000000-0000-1000-8000-AABBCCDDEEFF>\";reg-id={reg_id}"
    )
}

#[test]
fn an_outbound_instance_is_called_over_one_flow_at_a_time_and_fails_over() {
    let mut e = engine_with_tcp();
    for (n, conn) in [(1, 5), (2, 6)] {
        let flow = Peer {
            transport: Transport::Tcp,
            addr: addr(&format!("198.51.100.7:4000{n}")),
            conn,
            flow: false,
        };
        let reg = register_as(
            "erin",
            &format!("TCP x9.invalid;rport;n={n}"),
            &outbound_contact(n),
            "Supported: outbound, path\r\n",
        );
        let out = deliver_from(&mut e, n.into(), flow, &reg);
        assert_eq!(status(&out[0].1), Some(200), "{}", out[0].1);
        assert!(out[0].1.contains("Require: outbound\r\n"));
        assert!(out[0].1.contains("Flow-Timer: 25\r\n"));
    }
    // Registering reg-id 1 again (a new connection) replaces its flow, not adds one.
    let again = Peer {
        transport: Transport::Tcp,
        addr: addr("198.51.100.7:40003"),
        conn: 7,
        flow: false,
    };
    let reg = register_as("erin", "TCP x9.invalid;rport;n=3", &outbound_contact(1), "");
    let out = deliver_from(&mut e, 5, again, &reg);
    assert_eq!(out[0].1.matches("Contact:").count(), 2, "{}", out[0].1);

    let out = deliver_from(
        &mut e,
        10,
        Peer::udp(addr(ALICE)),
        &invite("erin", "z9hG4bKo1"),
    );
    assert_eq!(
        out.len(),
        2,
        "one flow of the instance at a time: 100 and one INVITE"
    );
    let (first, fwd) = out[1].clone();
    assert_eq!(first.conn, 7, "the most recently registered flow first");

    let mut fx = Effects::default();
    e.handle_transport_error(20, first, fwd.as_bytes(), &mut fx);
    // The failed branch's ACK (the transaction's, to the dead flow) and the INVITE on the
    // other flow; nothing upstream yet.
    let next: Vec<Sent> = sent(&mut fx)
        .into_iter()
        .filter(|s| s.method() != Method::Ack)
        .collect();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].method(), Method::Invite);
    assert_eq!(next[0].to, addr("198.51.100.7:40002"));
    let mut fx = Effects::default();
    let second = Peer {
        transport: Transport::Tcp,
        addr: next[0].to,
        conn: 6,
        flow: true,
    };
    e.handle_transport_error(30, second, next[0].text.as_bytes(), &mut fx);
    let up = sent(&mut fx);
    assert_eq!(
        up.last().and_then(Sent::status),
        Some(430),
        "the last flow is gone"
    );
}

#[test]
fn outbound_through_a_proxy_without_outbound_is_refused_439() {
    let mut e = engine("");
    let reg = register_as(
        "erin",
        "UDP 203.0.113.5;branch=z9hG4bKe\r\nVia: SIP/2.0/UDP 192.0.2.9",
        &outbound_contact(1),
        "",
    );
    let out = deliver_from(&mut e, 0, Peer::udp(addr("203.0.113.5:5060")), &reg);
    assert_eq!(status(&out[0].1), Some(439));
}

/// What RFC 5626 and 3327 let a phone send that the registrar cannot keep is refused 400
/// with the reason, and nothing is bound: a reg-id that is not a positive number, an
/// instance longer than the store keeps, a Path longer than it keeps. At the limits they
/// are taken.
#[test]
fn outbound_and_path_values_the_store_cannot_keep_are_refused_400() {
    use crate::engine::registrar::{MAX_INSTANCE, MAX_PATH};
    let mut e = engine_with_tcp();
    let phone = nat_tcp(5);
    let with = |instance: &str, reg_id: &str| {
        format!(
            "<sip:gus@x9.invalid;transport=tcp;ob>;+sip.instance=\"{instance}\";reg-id={reg_id}"
        )
    };
    let uuid = "<urn:uuid:00000000-0000-1000-8000-AABBCCDDEEFF>";
    // An instance of n characters as the Contact carries it, its quotes counted.
    let long = |n: usize| format!("<urn:{}>", "x".repeat(n - 8));
    let mut port = 0;
    let mut answer = |e: &mut Engine, contact: &str, extra: &str| {
        port += 1;
        let reg = register_as("gus", &format!("TCP 192.168.1.20:{port}"), contact, extra);
        let out = deliver_from(e, 0, phone, &reg);
        let first = out[0].1.lines().next().unwrap().to_string();
        first
    };
    for (contact, extra, want) in [
        (with(uuid, "0"), "", "SIP/2.0 400 Bad reg-id parameter"),
        (with(uuid, "-1"), "", "SIP/2.0 400 Bad reg-id parameter"),
        (with(uuid, "x"), "", "SIP/2.0 400 Bad reg-id parameter"),
        (
            with(uuid, "4294967296"),
            "",
            "SIP/2.0 400 Bad reg-id parameter",
        ),
        (
            with(&long(MAX_INSTANCE + 1), "1"),
            "",
            "SIP/2.0 400 +sip.instance Too Long",
        ),
        (
            with(uuid, "1"),
            &format!("Path: <sip:{}@203.0.113.5;lr;ob>\r\n", "p".repeat(MAX_PATH)),
            "SIP/2.0 400 Path Too Long",
        ),
    ] {
        assert_eq!(answer(&mut e, &contact, extra), want, "{contact} {extra}");
    }
    assert_eq!(e.location.len(), 0, "nothing bound");
    // At the limits: bound.
    let ok = answer(&mut e, &with(&long(MAX_INSTANCE), "4294967295"), "");
    assert_eq!(ok, "SIP/2.0 200 OK");
    assert_eq!(e.location.len(), 1);
}

#[test]
fn a_binding_with_a_path_is_reached_along_it() {
    let mut e = engine("");
    let edge = Peer::udp_via(addr("203.0.113.5:5060"), 0);
    let reg = register_as(
        "finn",
        "UDP 203.0.113.5;branch=z9hG4bKp\r\nVia: SIP/2.0/UDP 192.0.2.9",
        &outbound_contact(1).replace("erin", "finn"),
        "Path: <sip:fl-abc@203.0.113.5:5060;lr;ob>\r\nSupported: path, outbound\r\n",
    );
    let out = deliver_from(&mut e, 0, edge, &reg);
    assert_eq!(status(&out[0].1), Some(200), "{}", out[0].1);
    assert!(out[0]
        .1
        .contains("Path: <sip:fl-abc@203.0.113.5:5060;lr;ob>\r\n"));

    let out = deliver_from(
        &mut e,
        10,
        Peer::udp(addr(ALICE)),
        &invite("finn", "z9hG4bKp1"),
    );
    let (to, fwd) = &out[1];
    assert_eq!(to.addr, addr("203.0.113.5:5060"), "to the edge proxy");
    assert!(
        fwd.contains("Route: <sip:fl-abc@203.0.113.5:5060;lr;ob>\r\n"),
        "{fwd}"
    );
}

/// One worker (so it pings every binding), pinging every second, dropping after three.
fn engine_pinging(ping: &str) -> Engine {
    let cfg = Config::from_toml(&format!(
        "[server]\nlisten = [\"udp:{PROXY}\"]\ndomains = [\"example.test\"]\nworkers = 1\n\
         [nat]\nping = \"{ping}\"\nping_interval_ms = 1000\nping_timeout_ms = 3000\n"
    ))
    .unwrap();
    Engine::new(Arc::new(cfg), 0, 1_000_000, Arc::new(Stats::default()))
}

#[test]
fn nated_udp_bindings_are_pinged_and_dropped_when_silent() {
    let mut e = engine_pinging("options");
    let phone = Peer::udp_via(addr(NAT), 0);
    let reg = register_as(
        "gus",
        "UDP 10.0.0.9:5060;rport",
        "<sip:gus@10.0.0.9:5060>",
        "",
    );
    deliver_from(&mut e, 0, phone, &reg);
    // A directly reachable phone is not pinged.
    let direct = register_as(
        "hal",
        &format!("UDP {BOB1}"),
        &format!("<sip:hal@{BOB1}>"),
        "",
    );
    deliver_from(&mut e, 0, Peer::udp_via(addr(BOB1), 0), &direct);
    assert_eq!(e.keepalive.len(), 1);

    let deadline = e.poll_timeout().expect("a ping is due");
    assert!(deadline <= 1001, "within one interval: {deadline}");
    let pings = tick(&mut e, 1001);
    assert_eq!(pings.len(), 1);
    assert_eq!(pings[0].to, addr(NAT));
    assert_eq!(pings[0].method(), Method::Options);
    // The phone answers (through the NAT): it stays.
    let (_, _) = deliver(&mut e, 1100, NAT, &answer(&pings[0], 200, "g1"));
    assert_eq!(tick(&mut e, 2001).len(), 1);
    assert_eq!(tick(&mut e, 3001).len(), 1);
    // Unanswered since 1100: at 4001 it has been silent over 3 s and is dropped everywhere.
    let mut fx = Effects::default();
    e.handle_timeout(4101, &mut fx);
    assert!(fx.transmits.is_empty());
    assert_eq!(
        fx.changes.len(),
        1,
        "the removal goes to the other workers and the store"
    );
    assert_eq!(e.stats.nat_ping_drops.load(Ordering::Relaxed), 1);
    let out = deliver_from(
        &mut e,
        4200,
        Peer::udp(addr(ALICE)),
        &invite("gus", "z9hG4bKg1"),
    );
    assert_eq!(status(&out[0].1), Some(404));
    assert_eq!(e.keepalive.len(), 0);
}

#[test]
fn crlf_pings_keep_the_mapping_without_dropping_anyone() {
    let mut e = engine_pinging("crlf");
    let reg = register_as(
        "ida",
        "UDP 10.0.0.9:5060;rport",
        "<sip:ida@10.0.0.9:5060>",
        "",
    );
    deliver_from(&mut e, 0, Peer::udp_via(addr(NAT), 0), &reg);
    for t in 1..=6 {
        let pings = tick(&mut e, t * 1000 + 1);
        assert_eq!(pings.len(), 1);
        assert_eq!(pings[0].text, "\r\n\r\n");
    }
    assert_eq!(e.keepalive.len(), 1);
}

#[test]
fn pings_stop_as_soon_as_a_binding_is_removed_and_once_it_expires() {
    let mut e = engine_pinging("crlf");
    let phone = Peer::udp_via(addr(NAT), 0);
    let via = |n: u32| format!("UDP 10.0.0.9:5060;rport;n={n}");
    for (n, (user, contact)) in [
        ("kim", "<sip:kim@10.0.0.9:5060>"),
        ("kim", "<sip:kim@10.0.0.9:5062>"),
        ("lou", "<sip:lou@10.0.0.9:5060>"),
        ("max", "<sip:max@10.0.0.9:5060>;expires=60"),
    ]
    .into_iter()
    .enumerate()
    {
        deliver_from(
            &mut e,
            0,
            phone,
            &register_as(user, &via(n as u32), contact, ""),
        );
    }
    assert_eq!(e.keepalive.len(), 4);
    assert_eq!(tick(&mut e, 1001).len(), 4);
    // kim takes one contact back: its entry goes with it, not at its next ping.
    let out = deliver_from(
        &mut e,
        1100,
        phone,
        &register_as("kim", &via(10), "<sip:kim@10.0.0.9:5062>;expires=0", ""),
    );
    assert_eq!(status(&out[0].1), Some(200));
    assert_eq!(e.keepalive.len(), 3);
    // Then all of them (`Contact: *`).
    let all = "REGISTER sip:example.test SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.9:5060;rport;branch=z9hG4bKall\r\n\
Max-Forwards: 70\r\nFrom: <sip:kim@example.test>;tag=r1\r\nTo: <sip:kim@example.test>\r\n\
Call-ID: reg-all\r\nCSeq: 1 REGISTER\r\nContact: *\r\nExpires: 0\r\nContent-Length: 0\r\n\r\n";
    let out = deliver_from(&mut e, 1200, phone, all);
    assert_eq!(status(&out[0].1), Some(200));
    assert_eq!(e.keepalive.len(), 2);
    assert_eq!(tick(&mut e, 2001).len(), 2, "lou and max");
    // max's binding expires at 60 s without a refresh: no ping once it has.
    assert_eq!(tick(&mut e, 59_001).len(), 2, "lou and max");
    assert_eq!(tick(&mut e, 60_001).len(), 1, "lou alone");
    assert_eq!(e.keepalive.len(), 1);
}

#[test]
fn as_an_edge_proxy_a_forwarded_register_gets_a_path_that_finds_the_flow_again() {
    let mut e = engine("[routing]\ndefault_route = \"sip:203.0.113.50:5060\"\n");
    let phone = Peer::udp_via(addr(NAT), 0);
    let reg = register_as(
        "jo",
        "UDP 10.0.0.9:5060;rport",
        "<sip:jo@10.0.0.9:5060>",
        "",
    )
    .replace("example.test", "other.test");
    let out = deliver_from(&mut e, 0, phone, &reg);
    let (to, fwd) = &out[0];
    assert_eq!(to.addr, addr("203.0.113.50:5060"), "{fwd}");
    let path = fwd
        .lines()
        .find(|l| l.starts_with("Path:"))
        .expect("a Path of ours");
    assert!(path.contains(";ob;fl="), "{path}");
    let path = path.trim_start_matches("Path: ");

    // The registrar calls the phone along the Path: we pop our entry and use the flow.
    let invite = format!(
        "INVITE sip:jo@10.0.0.9:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 203.0.113.50;branch=z9hG4bKreg1\r\n\
Route: {path}\r\nMax-Forwards: 70\r\nFrom: <sip:kim@other.test>;tag=k1\r\nTo: <sip:jo@other.test>\r\n\
Call-ID: edge1\r\nCSeq: 1 INVITE\r\nContact: <sip:kim@203.0.113.50>\r\nContent-Length: 0\r\n\r\n"
    );
    let out = deliver_from(
        &mut e,
        10,
        Peer::udp_via(addr("203.0.113.50:5060"), 0),
        &invite,
    );
    let fwd = out
        .iter()
        .find(|(_, t)| t.starts_with("INVITE"))
        .expect("forwarded");
    assert_eq!(fwd.0.addr, addr(NAT), "{}", fwd.1);
    assert!(
        !fwd.1.lines().any(|l| l.starts_with("Route:")),
        "our Path entry was consumed"
    );
}
