//! The engine driven in simulated time, without sockets: every role, forking, CANCEL,
//! timeouts and bad input.

use super::*;
use crate::config::Config;
use sipsec_transport::net::transport::{Peer, Transport};

mod dispatcher;
mod identity;
mod nat;
mod overload;
mod registrar;
mod relay;
mod routing;

const PROXY: &str = "127.0.0.1:5060";
const ALICE: &str = "127.0.0.2:5070";
const BOB1: &str = "127.0.0.3:5080";
const BOB2: &str = "127.0.0.4:5090";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn engine(extra: &str) -> Engine {
    let cfg = Config::from_toml(&format!(
        "[server]\nlisten = [\"udp:{PROXY}\"]\ndomains = [\"example.test\"]\nworkers = 2\n{extra}"
    ))
    .unwrap();
    Engine::new(Arc::new(cfg), 0, 1_000_000, Arc::new(Stats::default()))
}

struct Sent {
    to: SocketAddr,
    transport: Transport,
    text: String,
}

impl Sent {
    fn msg(&self) -> Message<'_> {
        Message::parse(self.text.as_bytes()).unwrap()
    }
    fn status(&self) -> Option<u16> {
        self.msg().status()
    }
    fn method(&self) -> Method {
        self.msg().method()
    }
}

/// `aor` registered at `contact`, reached at `target` (UDP), as the store would load it.
fn preload_binding(e: &mut Engine, aor: &str, contact: &str, target: &str) {
    e.preload(&BindingChange::Upsert {
        aor: aor.into(),
        binding: crate::location::Binding {
            contact: contact.into(),
            target: Peer::udp(addr(target)),
            expires_at: 2_000_000_000,
            q: None,
            call_id: "reg".into(),
            cseq: 1,
            received: None,
            outbound: None,
            path: None,
            node: None,
            via: None,
        },
    });
}

fn deliver(e: &mut Engine, now: Millis, from: &str, text: &str) -> (Vec<Sent>, Effects) {
    let mut fx = Effects::default();
    e.handle_message(now, Peer::udp(addr(from)), text.as_bytes(), &mut fx);
    (sent(&mut fx), fx)
}

/// The messages an input sent, taken out of its effects.
fn sent(fx: &mut Effects) -> Vec<Sent> {
    fx.transmits
        .drain(..)
        .map(|(to, d)| Sent {
            to: to.addr,
            transport: to.transport,
            text: String::from_utf8(d.to_vec()).unwrap(),
        })
        .collect()
}

fn tick(e: &mut Engine, now: Millis) -> Vec<Sent> {
    let mut fx = Effects::default();
    e.handle_timeout(now, &mut fx);
    sent(&mut fx)
}

fn request(method: &str, ruri: &str, branch: &str, extra: &str) -> String {
    format!(
        "{method} {ruri} SIP/2.0\r\nVia: SIP/2.0/UDP {ALICE};branch={branch}\r\nMax-Forwards: 70\r\n\
From: <sip:alice@example.test>;tag=a1\r\nTo: <sip:bob@example.test>{}\r\nCall-ID: call-{branch}\r\n\
CSeq: 1 {method}\r\nContact: <sip:alice@{ALICE}>\r\n{extra}Content-Length: 0\r\n\r\n",
        if method == "BYE" { ";tag=b1" } else { "" }
    )
}

fn register(user: &str, contact: &str, expires: &str, branch: &str, cseq: u32) -> String {
    format!(
        "REGISTER sip:example.test SIP/2.0\r\nVia: SIP/2.0/UDP {ALICE};branch={branch}\r\nMax-Forwards: 70\r\n\
From: <sip:{user}@example.test>;tag=r1\r\nTo: <sip:{user}@example.test>\r\nCall-ID: reg-{user}\r\n\
CSeq: {cseq} REGISTER\r\nContact: {contact}\r\n{expires}Content-Length: 0\r\n\r\n"
    )
}

/// A response from a downstream UAS to a request we forwarded.
fn answer(forwarded: &Sent, code: u16, to_tag: &str) -> String {
    let m = forwarded.msg();
    let mut out = Vec::new();
    build::response(&m, code, "X", Some(to_tag), b"", b"", &mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn options_to_the_server_is_answered() {
    let mut e = engine("");
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &request("OPTIONS", "sip:127.0.0.1:5060", "z9hG4bKo1", ""),
    );
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status(), Some(200));
    assert_eq!(sent[0].to, addr(ALICE));
    assert!(sent[0]
        .text
        .contains("Allow: INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER"));
    assert!(sent[0].msg().to().unwrap().tag().is_some());
}

/// An AOR is one key however its domain is written: registered as `bob@example.test` under a
/// config that spells the domain `Example.Test`, and called at the server's own address (which
/// stands for the first domain), the call finds the binding.
#[test]
fn a_mixed_case_domain_and_the_servers_address_name_one_aor() {
    let cfg = Config::from_toml(&format!(
        "[server]\nlisten = [\"udp:{PROXY}\"]\ndomains = [\"Example.Test\"]\nworkers = 1\n"
    ))
    .unwrap();
    let mut e = Engine::new(Arc::new(cfg), 0, 1_000_000, Arc::new(Stats::default()));
    let contact = format!("<sip:bob@{BOB1}>");
    let (sent, _) = deliver(
        &mut e,
        0,
        BOB1,
        &register("bob", &contact, "", "z9hG4bKr1", 1),
    );
    assert_eq!(sent[0].status(), Some(200), "{}", sent[0].text);
    let ruri = format!("sip:bob@{PROXY}");
    let (sent, _) = deliver(
        &mut e,
        10,
        ALICE,
        &request("INVITE", &ruri, "z9hG4bKi1", ""),
    );
    let fwd = sent
        .iter()
        .find(|s| s.status().is_none())
        .expect("INVITE forwarded");
    assert_eq!(fwd.to, addr(BOB1));
}

#[test]
fn register_then_invite_reaches_the_contact_with_the_proxy_edits() {
    let mut e = engine("");
    let (sent, fx) = deliver(
        &mut e,
        0,
        BOB1,
        &register(
            "bob",
            &format!("<sip:bob@{BOB1}>"),
            "Expires: 600\r\n",
            "z9hG4bKr1",
            1,
        ),
    );
    assert_eq!(sent[0].status(), Some(200));
    assert!(
        sent[0]
            .text
            .contains(&format!("Contact: <sip:bob@{BOB1}>;expires=600")),
        "{}",
        sent[0].text
    );
    assert_eq!(
        fx.changes.len(),
        1,
        "the binding goes to the other workers and the store"
    );

    let (sent, _) = deliver(
        &mut e,
        10,
        ALICE,
        &request("INVITE", "sip:bob@example.test", "z9hG4bKi1", ""),
    );
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0].status(),
        Some(100),
        "a stateful proxy answers INVITE with 100 Trying"
    );
    let fwd = &sent[1];
    assert_eq!(fwd.to, addr(BOB1));
    let m = fwd.msg();
    assert_eq!(
        m.request_uri().unwrap().raw,
        format!("sip:bob@{BOB1}").as_bytes()
    );
    assert_eq!(m.max_forwards(), Some(69));
    assert!(m.top_via().branch.unwrap().starts_with(b"z9hG4bKsS0"));
    assert_eq!(m.top_via().host, b"127.0.0.1");
    assert!(fwd.text.contains("Record-Route: <sip:127.0.0.1:5060;lr>"));

    // 180 and 200 come back through us, our Via popped.
    let (up, _) = deliver(&mut e, 20, BOB1, &answer(fwd, 180, "b1"));
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].status(), Some(180));
    assert_eq!(up[0].to, addr(ALICE));
    assert_eq!(up[0].msg().top_via().branch, Some(&b"z9hG4bKi1"[..]));
    let (up, _) = deliver(&mut e, 30, BOB1, &answer(fwd, 200, "b1"));
    assert_eq!(up[0].status(), Some(200));
    // A 2xx retransmission from the UAS is forwarded too (RFC 6026).
    let (up, _) = deliver(&mut e, 530, BOB1, &answer(fwd, 200, "b1"));
    assert_eq!(up.len(), 1);
}

#[test]
fn in_dialog_requests_follow_the_route_set() {
    let mut e = engine("");
    let bye = format!(
        "BYE sip:bob@{BOB1} SIP/2.0\r\nVia: SIP/2.0/UDP {ALICE};branch=z9hG4bKbye\r\nRoute: <sip:127.0.0.1:5060;lr>\r\n\
Max-Forwards: 70\r\nFrom: <sip:alice@example.test>;tag=a1\r\nTo: <sip:bob@example.test>;tag=b1\r\n\
Call-ID: dlg\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n"
    );
    let (sent, _) = deliver(&mut e, 0, ALICE, &bye);
    assert_eq!(sent.len(), 1, "no 100 for BYE");
    assert_eq!(sent[0].to, addr(BOB1));
    assert!(!sent[0].text.contains("Route:"), "our Route was consumed");
    assert!(
        !sent[0].text.contains("Record-Route"),
        "no Record-Route in dialog"
    );
    let ack = bye
        .replace("BYE", "ACK")
        .replace("z9hG4bKbye", "z9hG4bKack");
    let (sent, _) = deliver(&mut e, 1, ALICE, &ack);
    assert_eq!(sent.len(), 1, "2xx ACK passes end to end");
    assert_eq!(sent[0].method(), Method::Ack);
}

#[test]
fn unknown_and_unregistered_users() {
    let mut e = engine("");
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &request("INVITE", "sip:nobody@example.test", "z9hG4bKu1", ""),
    );
    assert_eq!(sent.last().unwrap().status(), Some(404));
    deliver(
        &mut e,
        0,
        BOB1,
        &register(
            "carol",
            &format!("<sip:carol@{BOB1}>"),
            "Expires: 60\r\n",
            "z9hG4bKr2",
            1,
        ),
    );
    deliver(
        &mut e,
        10,
        BOB1,
        &register("carol", "*", "Expires: 0\r\n", "z9hG4bKr3", 2),
    );
    let (sent, _) = deliver(
        &mut e,
        20,
        ALICE,
        &request("INVITE", "sip:carol@example.test", "z9hG4bKu2", ""),
    );
    // A user who registered once looks like one who never did.
    let unregistered = sent.last().unwrap();
    assert_eq!(unregistered.status(), Some(404));
    let nobody = request("INVITE", "sip:nobody@example.test", "z9hG4bKu3", "");
    let (sent, _) = deliver(&mut e, 30, ALICE, &nobody);
    let reason = |s: &Sent| s.text.lines().next().unwrap().to_string();
    assert_eq!(reason(unregistered), reason(sent.last().unwrap()));
    // And no response made here names our version.
    assert!(
        unregistered.text.contains("Server: sipsec\r\n"),
        "{}",
        unregistered.text
    );
}

#[test]
fn registrations_expire() {
    let mut e = engine("[registrar]\nmin_expires = 1\ndefault_expires = 60");
    deliver(
        &mut e,
        0,
        BOB1,
        &register(
            "dave",
            &format!("<sip:dave@{BOB1}>;expires=2"),
            "",
            "z9hG4bKr4",
            1,
        ),
    );
    let (sent, _) = deliver(
        &mut e,
        1_000,
        ALICE,
        &request("OPTIONS", "sip:dave@example.test", "z9hG4bKe1", ""),
    );
    assert_eq!(sent[0].to, addr(BOB1));
    tick(&mut e, 2_001);
    let (sent, _) = deliver(
        &mut e,
        2_001,
        ALICE,
        &request("OPTIONS", "sip:dave@example.test", "z9hG4bKe2", ""),
    );
    assert_eq!(sent[0].status(), Some(404));
}

#[test]
fn registrar_limits_and_wildcards() {
    let mut e = engine("");
    let (sent, _) = deliver(
        &mut e,
        0,
        BOB1,
        &register(
            "bob",
            &format!("<sip:bob@{BOB1}>"),
            "Expires: 5\r\n",
            "z9hG4bKr5",
            1,
        ),
    );
    assert_eq!(sent[0].status(), Some(423));
    assert!(sent[0].text.contains("Min-Expires: 60"));
    let (sent, _) = deliver(&mut e, 0, BOB1, &register("bob", "*", "", "z9hG4bKr6", 2));
    assert_eq!(sent[0].status(), Some(400), "a wildcard needs Expires: 0");
    // Two contacts in one REGISTER, then a refresh answers both.
    let two = format!("<sip:bob@{BOB1}>, <sip:bob@{BOB2}>;q=0.5");
    let (sent, _) = deliver(
        &mut e,
        0,
        BOB1,
        &register("bob", &two, "Expires: 100000\r\n", "z9hG4bKr7", 3),
    );
    assert_eq!(sent[0].status(), Some(200));
    assert_eq!(sent[0].text.matches("Contact:").count(), 2);
    assert!(
        sent[0].text.contains("expires=86400"),
        "clamped to max_expires: {}",
        sent[0].text
    );
    // An older CSeq from the same Call-ID is out of order.
    let (sent, _) = deliver(
        &mut e,
        0,
        BOB1,
        &register("bob", &format!("<sip:bob@{BOB1}>"), "", "z9hG4bKr8", 1),
    );
    assert_eq!(sent[0].status(), Some(500));
    // Registering for a foreign domain is refused.
    let foreign = register("bob", "<sip:bob@1.2.3.4>", "", "z9hG4bKr9", 9)
        .replace("To: <sip:bob@example.test>", "To: <sip:bob@elsewhere.test>");
    let (sent, _) = deliver(&mut e, 0, BOB1, &foreign);
    assert_eq!(sent[0].status(), Some(404));
}

#[test]
fn forking_forwards_the_first_2xx_and_cancels_the_rest() {
    let mut e = engine("");
    let two = format!("<sip:bob@{BOB1}>, <sip:bob@{BOB2}>");
    deliver(&mut e, 0, BOB1, &register("bob", &two, "", "z9hG4bKf0", 1));
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &request("INVITE", "sip:bob@example.test", "z9hG4bKf1", ""),
    );
    assert_eq!(sent.len(), 3, "100 plus two branches");
    let b1 = sent.iter().find(|s| s.to == addr(BOB1)).unwrap();
    let b2 = sent.iter().find(|s| s.to == addr(BOB2)).unwrap();
    assert_ne!(b1.msg().top_via().branch, b2.msg().top_via().branch);
    deliver(&mut e, 5, BOB2, &answer(b2, 180, "t2"));
    let (up, _) = deliver(&mut e, 10, BOB1, &answer(b1, 200, "t1"));
    let ok = up
        .iter()
        .find(|s| s.status() == Some(200))
        .expect("2xx forwarded");
    assert_eq!(ok.to, addr(ALICE));
    let cancel = up
        .iter()
        .find(|s| s.status().is_none())
        .expect("CANCEL to the ringing branch");
    assert_eq!(cancel.method(), Method::Cancel);
    assert_eq!(cancel.to, addr(BOB2));
    assert_eq!(cancel.msg().top_via().branch, b2.msg().top_via().branch);
    // The cancelled branch's 487 is not forwarded: a final was already sent.
    let (up, _) = deliver(&mut e, 20, BOB2, &answer(b2, 487, "t2"));
    assert!(
        up.iter().all(|s| s.status().is_none()),
        "only the ACK for the 487 goes out"
    );
}

#[test]
fn best_final_response_wins_when_every_branch_fails() {
    let mut e = engine("");
    let two = format!("<sip:bob@{BOB1}>, <sip:bob@{BOB2}>");
    deliver(&mut e, 0, BOB1, &register("bob", &two, "", "z9hG4bKg0", 1));
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &request("INVITE", "sip:bob@example.test", "z9hG4bKg1", ""),
    );
    let b1 = sent.iter().find(|s| s.to == addr(BOB1)).unwrap();
    let b2 = sent.iter().find(|s| s.to == addr(BOB2)).unwrap();
    let (up, _) = deliver(&mut e, 5, BOB1, &answer(b1, 503, "t1"));
    assert_eq!(
        up.len(),
        1,
        "only the ACK; the 503 waits for the other branch"
    );
    assert_eq!(up[0].method(), Method::Ack);
    let (up, _) = deliver(&mut e, 10, BOB2, &answer(b2, 486, "t2"));
    let final_up = up.iter().find(|s| s.status().is_some()).unwrap();
    assert_eq!(final_up.status(), Some(486), "4xx beats 5xx");
    assert_eq!(final_up.to, addr(ALICE));
}

#[test]
fn a_silent_branch_times_out_into_408() {
    let mut e = engine("");
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &request("MESSAGE", "sip:x@127.0.0.9", "z9hG4bKt1", ""),
    );
    assert_eq!(sent.len(), 1);
    let mut retransmits = 0;
    let mut final_up = None;
    for now in (0..=32_000).step_by(250) {
        for s in tick(&mut e, now) {
            match s.status() {
                None => retransmits += 1,
                Some(code) => final_up = Some((code, s.to)),
            }
        }
    }
    assert_eq!(
        retransmits, 10,
        "timer E: 0.5,1.5,3.5,7.5, then every 4 s to 31.5 s"
    );
    assert_eq!(final_up, Some((408, addr(ALICE))));
}

#[test]
fn cancel_is_answered_and_relayed_after_a_provisional() {
    let mut e = engine("");
    deliver(
        &mut e,
        0,
        BOB1,
        &register("bob", &format!("<sip:bob@{BOB1}>"), "", "z9hG4bKc0", 1),
    );
    let invite = request("INVITE", "sip:bob@example.test", "z9hG4bKc1", "");
    let (sent, _) = deliver(&mut e, 0, ALICE, &invite);
    let fwd = sent.iter().find(|s| s.to == addr(BOB1)).unwrap();
    deliver(&mut e, 5, BOB1, &answer(fwd, 180, "t1"));
    let cancel = invite.replace("INVITE", "CANCEL");
    let (sent, _) = deliver(&mut e, 10, ALICE, &cancel);
    let ok = sent
        .iter()
        .find(|s| s.status() == Some(200))
        .expect("200 for the CANCEL");
    assert_eq!(ok.msg().cseq().method, b"CANCEL");
    let down = sent
        .iter()
        .find(|s| s.status().is_none())
        .expect("CANCEL relayed");
    assert_eq!(down.method(), Method::Cancel);
    assert_eq!(down.msg().top_via().branch, fwd.msg().top_via().branch);
    let (up, _) = deliver(&mut e, 20, BOB1, &answer(fwd, 487, "t1"));
    assert!(up
        .iter()
        .any(|s| s.status() == Some(487) && s.to == addr(ALICE)));
    // A CANCEL for nothing gets 481.
    let (sent, _) = deliver(
        &mut e,
        30,
        ALICE,
        &request("CANCEL", "sip:bob@example.test", "z9hG4bKnone", ""),
    );
    assert_eq!(sent[0].status(), Some(481));
}

#[test]
fn retransmitted_invite_is_absorbed_and_gets_the_provisional_again() {
    let mut e = engine("[routing]\ndefault_route = \"sip:127.0.0.3:5080\"");
    let invite = request("INVITE", "sip:someone@elsewhere.test", "z9hG4bKrt", "");
    let (sent, _) = deliver(&mut e, 0, ALICE, &invite);
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[1].to,
        addr(BOB1),
        "foreign domains go to the default route"
    );
    let (sent, _) = deliver(&mut e, 500, ALICE, &invite);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status(), Some(100));
}

#[test]
fn loops_and_hop_limits() {
    let mut e = engine("[routing]\ndefault_route = \"sip:127.0.0.3:5080\"");
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &request("OPTIONS", "sip:x@elsewhere.test", "z9hG4bKl1", ""),
    );
    let fwd = &sent[0];
    // The same request comes back to us: a loop.
    let (back, _) = deliver(&mut e, 1, BOB1, &fwd.text);
    assert_eq!(back[0].status(), Some(482));
    let zero = request("OPTIONS", "sip:x@elsewhere.test", "z9hG4bKl2", "")
        .replace("Max-Forwards: 70", "Max-Forwards: 0");
    let (sent, _) = deliver(&mut e, 2, ALICE, &zero);
    assert_eq!(sent[0].status(), Some(483));
}

#[test]
fn stateless_mode_forwards_without_state_and_routes_responses_by_via() {
    let mut e = engine("stateful = false\n[routing]\ndefault_route = \"sip:127.0.0.3:5080\"");
    let invite = request("INVITE", "sip:x@elsewhere.test", "z9hG4bKs1", "");
    let (sent, _) = deliver(&mut e, 0, ALICE, &invite);
    assert_eq!(sent.len(), 1, "no 100 Trying");
    assert_eq!(e.transactions(), 0);
    let (again, _) = deliver(&mut e, 500, ALICE, &invite);
    assert_eq!(
        again[0].msg().top_via().branch,
        sent[0].msg().top_via().branch,
        "same branch for a retransmission"
    );
    let (up, _) = deliver(&mut e, 10, BOB1, &answer(&sent[0], 200, "t"));
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].to, addr(ALICE));
    assert_eq!(up[0].msg().top_via().branch, Some(&b"z9hG4bKs1"[..]));
    // A response whose top Via is not ours is dropped.
    let (up, _) = deliver(
        &mut e,
        20,
        BOB1,
        &answer(
            &Sent {
                to: addr(ALICE),
                transport: Transport::Udp,
                text: invite.clone(),
            },
            200,
            "t",
        ),
    );
    assert!(up.is_empty());
}

#[test]
fn redirect_mode_answers_302_with_the_contacts() {
    let mut e = engine("mode = \"redirect\"");
    deliver(
        &mut e,
        0,
        BOB1,
        &register("bob", &format!("<sip:bob@{BOB1}>"), "", "z9hG4bKd0", 1),
    );
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &request("INVITE", "sip:bob@example.test", "z9hG4bKd1", ""),
    );
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status(), Some(302));
    assert!(sent[0]
        .text
        .contains(&format!("Contact: <sip:bob@{BOB1}>;expires=3600")));
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &request("INVITE", "sip:nobody@example.test", "z9hG4bKd2", ""),
    );
    assert_eq!(sent[0].status(), Some(404));
}

#[test]
fn bad_requests_get_precise_answers() {
    let mut e = engine("");
    let cases: &[(&str, u16, &str)] = &[
        ("INVITE sip:bob@example.test SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.2:5070;branch=z9hG4bKb1\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@x>\r\nCall-ID: c\r\nCSeq: 99999999999 INVITE\r\n\r\n", 400, "Bad CSeq header: bad sequence number"),
        ("OPTIONS sip:bob@example.test SIP/3.0\r\nVia: SIP/2.0/UDP 127.0.0.2:5070;branch=z9hG4bKb2\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@x>\r\nCall-ID: c\r\nCSeq: 1 OPTIONS\r\n\r\n", 505, "Version Not Supported"),
        ("FOO sip:127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.2:5070;branch=z9hG4bKb3\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@x>\r\nCall-ID: c\r\nCSeq: 1 FOO\r\n\r\n", 501, "Not Implemented"),
        ("BYE sip:127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.2:5070;branch=z9hG4bKb4\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@x>\r\nCall-ID: c\r\nCSeq: 1 BYE\r\n\r\n", 405, "Method Not Allowed"),
        ("OPTIONS mailto:a@b SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.2:5070;branch=z9hG4bKb5\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@x>\r\nCall-ID: c\r\nCSeq: 1 OPTIONS\r\n\r\n", 416, "Unsupported URI Scheme"),
        ("OPTIONS sip:x@example.test SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.2:5070;branch=z9hG4bKb6\r\nProxy-Require: foo\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@x>\r\nCall-ID: c\r\nCSeq: 1 OPTIONS\r\n\r\n", 420, "Bad Extension"),
        ("OPTIONS sip:x@example.test SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.2:5070;branch=z9hG4bKb7\r\nFrom: \"unterminated <sip:a@x>;tag=1\r\nTo: <sip:b@x>\r\nCall-ID: c\r\nCSeq: 1 OPTIONS\r\n\r\n", 400, "Bad From or To header"),
    ];
    for (text, code, reason) in cases {
        let (sent, _) = deliver(&mut e, 0, ALICE, text);
        assert_eq!(sent.len(), 1, "{reason}");
        // Salvaged answers echo the request's broken lines, so read only the status line.
        let status_line = sent[0].text.lines().next().unwrap();
        assert_eq!(
            status_line,
            format!("SIP/2.0 {code} {reason}"),
            "{}",
            sent[0].text
        );
        assert!(sent[0].text.contains("Call-ID: c\r\n"));
        assert_eq!(sent[0].to, addr(ALICE));
    }
    // Oversize gets 513; garbage and malformed responses are dropped and counted.
    let big = request(
        "OPTIONS",
        "sip:x@example.test",
        "z9hG4bKbig",
        &format!("X-Pad: {}\r\n", "a".repeat(20_000)),
    );
    let (sent, _) = deliver(&mut e, 0, ALICE, &big);
    assert_eq!(sent[0].status(), Some(513));
    let (sent, _) = deliver(&mut e, 0, ALICE, "\u{1}\u{2}garbage");
    assert!(sent.is_empty());
    let (sent, _) = deliver(&mut e, 0, ALICE, "SIP/2.0 200 OK\r\nVia: broken\r\n\r\n");
    assert!(sent.is_empty());
    // RFC 4475 §3.1.2.18 (insuf): a Via but no From, To or Call-ID still gets its 400.
    let insuf = "INVITE sip:user@example.com SIP/2.0\r\nCSeq: 193942 INVITE\r\n\
Via: SIP/2.0/UDP 192.0.2.95;branch=z9hG4bKkdj.insuf\r\nContent-Type: application/sdp\r\n\
l: 0\r\n\r\n";
    let (sent, _) = deliver(&mut e, 0, ALICE, insuf);
    assert_eq!(sent.len(), 1);
    assert!(sent[0].text.starts_with("SIP/2.0 400 "), "{}", sent[0].text);
    assert!(sent[0].text.contains("branch=z9hG4bKkdj.insuf"));
    let snapshot = e.stats().snapshot();
    let get = |k: &str| snapshot.iter().find(|(n, _)| *n == k).unwrap().1;
    assert_eq!(get("oversize"), 1);
    assert_eq!(get("malformed_dropped"), 2);
    assert_eq!(get("not_allowed"), 2);
}

#[test]
fn responses_for_another_worker_are_handed_over() {
    let mut e = engine("");
    let resp = "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKsS1deadbeef.1\r\n\
Via: SIP/2.0/UDP 127.0.0.2:5070;branch=z9hG4bKx\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@x>;tag=2\r\n\
Call-ID: c\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n";
    let (sent, fx) = deliver(&mut e, 0, BOB1, resp);
    assert!(sent.is_empty());
    assert_eq!(fx.mail.len(), 1);
    assert_eq!(fx.mail[0].0, 1, "worker 1 owns branch z9hG4bKsS1...");
}

#[test]
fn never_panics_on_torture_messages_or_mutations() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/rfc4475");
    let mut e = engine("[routing]\ndefault_route = \"sip:127.0.0.3:5080\"");
    let mut seed: u64 = 0x1234_5678_9abc_def0;
    let mut now = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let buf = std::fs::read(entry.unwrap().path()).unwrap();
        let mut fx = Effects::default();
        e.handle_message(now, Peer::udp(addr(ALICE)), &buf, &mut fx);
        for _ in 0..300 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut b = buf.clone();
            let i = (seed as usize) % b.len().max(1);
            b[i] = (seed >> 32) as u8;
            b.truncate(((seed >> 40) as usize % (buf.len() + 1)).max(i));
            e.handle_message(now, Peer::udp(addr(ALICE)), &b, &mut fx);
            now += 7;
            e.handle_timeout(now, &mut fx);
        }
    }
}

#[test]
fn a_branch_that_rings_forever_is_cancelled_on_timer_c() {
    let mut e = engine("");
    deliver(
        &mut e,
        0,
        BOB1,
        &register("bob", &format!("<sip:bob@{BOB1}>"), "", "z9hG4bKtc0", 1),
    );
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &request("INVITE", "sip:bob@example.test", "z9hG4bKtc1", ""),
    );
    let fwd = sent.iter().find(|s| s.to == addr(BOB1)).unwrap();
    deliver(&mut e, 10, BOB1, &answer(fwd, 180, "t"));
    assert!(tick(&mut e, 170_000).is_empty());
    let out = tick(&mut e, 180_010);
    let cancel = out
        .iter()
        .find(|s| s.status().is_none())
        .expect("CANCEL downstream");
    assert_eq!((cancel.method(), cancel.to), (Method::Cancel, addr(BOB1)));
    let up = out
        .iter()
        .find(|s| s.status().is_some())
        .expect("final upstream");
    assert_eq!((up.status(), up.to), (Some(408), addr(ALICE)));
}

#[test]
fn a_full_transaction_table_answers_503_without_state() {
    let mut e = engine("max_transactions = 16\n[routing]\ndefault_route = \"sip:127.0.0.3:5080\"");
    for i in 0..8 {
        let (sent, _) = deliver(
            &mut e,
            0,
            ALICE,
            &request(
                "MESSAGE",
                "sip:x@elsewhere.test",
                &format!("z9hG4bKfull{i}"),
                "",
            ),
        );
        assert_eq!(sent.len(), 1, "forwarded");
    }
    assert_eq!(e.transactions(), 16);
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &request("MESSAGE", "sip:x@elsewhere.test", "z9hG4bKover", ""),
    );
    assert_eq!(sent[0].status(), Some(503));
    assert!(sent[0].text.contains("Retry-After: 1"));
    assert_eq!(e.transactions(), 16);
}

#[test]
fn a_table_full_of_finished_transactions_makes_room_for_new_ones() {
    let mut e = engine("max_transactions = 16\n[routing]\ndefault_route = \"sip:127.0.0.3:5080\"");
    // Eight calls answered 200: each leaves its server and client INVITE transactions
    // lingering (timers L and M, 32 s) with nothing left to do.
    let mut first = None;
    for i in 0..8 {
        let (sent, _) = deliver(
            &mut e,
            i,
            ALICE,
            &request(
                "INVITE",
                "sip:x@elsewhere.test",
                &format!("z9hG4bKdone{i}"),
                "",
            ),
        );
        let down = sent.iter().find(|s| s.to == addr(BOB1)).expect("forwarded");
        let ok = answer(down, 200, "t");
        let (up, _) = deliver(&mut e, i, BOB1, &ok);
        assert_eq!(up[0].status(), Some(200));
        first.get_or_insert(ok);
    }
    assert_eq!(e.transactions(), 16);
    // A new call is forwarded, not refused: the oldest finished transaction made room.
    let (sent, _) = deliver(
        &mut e,
        100,
        ALICE,
        &request("INVITE", "sip:x@elsewhere.test", "z9hG4bKnew", ""),
    );
    assert!(sent.iter().any(|s| s.to == addr(BOB1)), "forwarded");
    assert!(sent.iter().all(|s| s.status() != Some(503)));
    // One finished transaction out, the new call's server and client transactions in: the
    // bound is checked per admitted request, as with the 503 above.
    assert_eq!(e.transactions(), 17);
    // The first call's transactions are gone (its client transaction went first: it began
    // lingering first); a 2xx retransmitted by its callee still reaches the caller by its Via
    // (RFC 3261 §16.7).
    let (up, _) = deliver(&mut e, 200, BOB1, first.as_ref().unwrap());
    assert_eq!(
        up.iter().map(|s| (s.status(), s.to)).collect::<Vec<_>>(),
        [(Some(200), addr(ALICE))]
    );
}

#[test]
fn two_workers_share_bindings_and_hand_responses_to_their_owner() {
    let cfg = Arc::new(
        Config::from_toml(&format!(
            "[server]\nlisten = [\"udp:{PROXY}\"]\ndomains = [\"example.test\"]\nworkers = 2\n"
        ))
        .unwrap(),
    );
    let mut w0 = Engine::new(cfg.clone(), 0, 1_000_000, Arc::new(Stats::default()));
    let mut w1 = Engine::new(cfg, 1, 1_000_000, Arc::new(Stats::default()));
    // Bob registers through worker 0; the change is mailed to worker 1.
    let (_, fx) = deliver(
        &mut w0,
        0,
        BOB1,
        &register("bob", &format!("<sip:bob@{BOB1}>"), "", "z9hG4bKw0", 1),
    );
    assert_eq!(fx.changes.len(), 1);
    let mut sink = Effects::default();
    for change in fx.changes {
        w1.handle_mail(1, Mail::Binding(change), &mut sink);
    }
    // Alice's INVITE lands on worker 1, which now knows bob.
    let (sent, _) = deliver(
        &mut w1,
        2,
        ALICE,
        &request("INVITE", "sip:bob@example.test", "z9hG4bKw1", ""),
    );
    let fwd = sent
        .iter()
        .find(|s| s.to == addr(BOB1))
        .expect("worker 1 found the binding");
    assert!(fwd
        .msg()
        .top_via()
        .branch
        .unwrap()
        .starts_with(b"z9hG4bKsS1"));
    // Bob's 200 reaches worker 0's socket: worker 0 hands it to worker 1, which forwards it.
    let (sent, fx) = deliver(&mut w0, 3, BOB1, &answer(fwd, 200, "t"));
    assert!(sent.is_empty());
    let [(1, mail)] = fx.mail.as_slice() else {
        panic!("expected mail for worker 1")
    };
    let mut out = Effects::default();
    w1.handle_mail(3, mail.clone(), &mut out);
    let up: Vec<_> = out
        .transmits
        .iter()
        .filter(|(to, _)| to.addr == addr(ALICE))
        .collect();
    assert_eq!(up.len(), 1);
    assert!(up[0].1.starts_with(b"SIP/2.0 200"));
}

#[test]
fn ipv6_vias_are_recognised_as_ours() {
    let cfg = "[server]\nlisten = [\"udp:[::1]:5060\"]\ndomains = [\"example.test\"]\nworkers = 1\nstateful = false\n\
[routing]\ndefault_route = \"sip:[::1]:5080\"\n";
    let mut e = Engine::new(
        Arc::new(Config::from_toml(cfg).unwrap()),
        0,
        0,
        Arc::new(Stats::default()),
    );
    let caller = "[::1]:5070";
    let invite = format!(
        "INVITE sip:x@elsewhere.test SIP/2.0\r\nVia: SIP/2.0/UDP {caller};branch=z9hG4bKv6s\r\nMax-Forwards: 70\r\n\
From: <sip:a@example.test>;tag=a\r\nTo: <sip:x@elsewhere.test>\r\nCall-ID: v6s\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
    );
    let (sent, _) = deliver(&mut e, 0, caller, &invite);
    assert_eq!(sent[0].to, addr("[::1]:5080"));
    // Stateless response forwarding recognises our bracketed Via and pops it.
    let (up, _) = deliver(&mut e, 1, "[::1]:5080", &answer(&sent[0], 200, "t"));
    assert_eq!(up.len(), 1, "response routed back by Via");
    assert_eq!(up[0].to, addr(caller));
    // The same request coming back to us is a loop.
    let (back, _) = deliver(&mut e, 2, "[::1]:5080", &sent[0].text);
    assert_eq!(back[0].status(), Some(482));
}

#[test]
fn between_transports_the_proxy_record_routes_twice_and_pops_both_routes() {
    let cfg = Config::from_toml(&format!(
        "[server]\nlisten = [\"udp:{PROXY}\", \"tcp:{PROXY}\"]\ndomains = [\"example.test\"]\n\
         [routing]\ndefault_route = \"sip:{BOB1};transport=tcp\"\n"
    ))
    .unwrap();
    let mut e = Engine::new(Arc::new(cfg), 0, 1_000_000, Arc::new(Stats::default()));
    let invite = request("INVITE", "sip:bob@example.org", "z9hG4bKx1", "");
    let (sent, _) = deliver(&mut e, 0, ALICE, &invite);
    let fwd = sent.iter().find(|s| s.status().is_none()).unwrap();
    assert_eq!((fwd.to, fwd.transport), (addr(BOB1), Transport::Tcp));
    assert!(
        fwd.text
            .contains(&format!("Via: SIP/2.0/TCP {PROXY};branch=")),
        "{}",
        fwd.text
    );
    let rr: Vec<&str> = fwd
        .text
        .lines()
        .filter(|l| l.starts_with("Record-Route"))
        .collect();
    assert_eq!(
        rr,
        [
            format!("Record-Route: <sip:{PROXY};transport=tcp;lr>"),
            format!("Record-Route: <sip:{PROXY};lr>")
        ],
        "{}",
        fwd.text
    );

    // The callee's BYE comes over TCP with both entries as its route set (on one line, as
    // most UAs write it): both are ours and popped; it goes to Alice over UDP.
    let bye = format!(
        "BYE sip:alice@{ALICE} SIP/2.0\r\nVia: SIP/2.0/TCP {BOB1};branch=z9hG4bKb1\r\n\
         Max-Forwards: 70\r\nRoute: <sip:{PROXY};transport=tcp;lr>, <sip:{PROXY};lr>\r\n\
         From: <sip:bob@example.org>;tag=b1\r\nTo: <sip:alice@example.test>;tag=a1\r\n\
         Call-ID: call-z9hG4bKx1\r\nCSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n"
    );
    let mut fx = Effects::default();
    let from = Peer {
        transport: Transport::Tcp,
        addr: addr(BOB1),
        conn: 7,
        flow: false,
    };
    e.handle_message(10, from, bye.as_bytes(), &mut fx);
    let out: Vec<_> = fx.transmits.drain(..).collect();
    let (to, data) = out
        .iter()
        .find(|(_, d)| d.starts_with(b"BYE "))
        .expect("the BYE is forwarded");
    assert_eq!((to.addr, to.transport), (addr(ALICE), Transport::Udp));
    let text = String::from_utf8_lossy(data);
    assert!(!text.contains("Route:"), "{text}");
    assert!(
        text.contains(&format!("Via: SIP/2.0/UDP {PROXY};branch=")),
        "{text}"
    );

    // Its 200 goes back to Bob on the connection the BYE came in on.
    let bye_out = Message::parse(data).unwrap();
    let mut resp = Vec::new();
    build::response(&bye_out, 200, "OK", None, b"", b"", &mut resp);
    e.handle_message(11, Peer::udp(addr(ALICE)), &resp, &mut fx);
    let (to, _) = fx
        .transmits
        .iter()
        .find(|(_, d)| d.starts_with(b"SIP/2.0 200"))
        .expect("the 200 goes upstream");
    assert_eq!(*to, from);
}

/// Two proxies whose registrations point at each other, sent one INVITE: every forwarded
/// request is delivered to the other proxy as if over the network, until nothing is left.
/// Returns the requests both forwarded and the final status Alice got.
fn fork_loop(max_forwards: u32, max_breadth: Option<u32>) -> (u64, Option<u16>) {
    const A: &str = "127.0.0.1:5060";
    const B: &str = "127.0.0.5:5060";
    let server = |me: &str| {
        let cfg = Config::from_toml(&format!(
            "[server]\nlisten = [\"udp:{me}\"]\ndomains = [\"example.test\"]\nworkers = 1\n"
        ))
        .unwrap();
        Engine::new(Arc::new(cfg), 0, 1_000_000, Arc::new(Stats::default()))
    };
    let mut proxies = [(addr(A), server(A)), (addr(B), server(B))];
    // Sixteen contacts each, all at the other proxy, told apart by a parameter (so the
    // Request-URI, and with it the loop hash, differs at every pass: a spiral, not a loop).
    for (i, other) in [(0, B), (1, A)] {
        let contacts: Vec<String> = (0..16)
            .map(|n| format!("<sip:bob@{other};n={n}>"))
            .collect();
        let (sent, _) = deliver(
            &mut proxies[i].1,
            0,
            BOB1,
            &register("bob", &contacts.join(", "), "", "z9hG4bKreg", 1),
        );
        assert_eq!(sent[0].status(), Some(200), "{}", sent[0].text);
    }
    let mut invite = request("INVITE", "sip:bob@example.test", "z9hG4bKamp", "")
        .replace("Max-Forwards: 70", &format!("Max-Forwards: {max_forwards}"));
    if let Some(b) = max_breadth {
        invite = invite.replace("Call-ID", &format!("Max-Breadth: {b}\r\nCall-ID"));
    }
    let mut queue = std::collections::VecDeque::from([(addr(ALICE), addr(A), invite)]);
    let mut final_status = None;
    let mut delivered = 0u64;
    while let Some((from, to, text)) = queue.pop_front() {
        delivered += 1;
        assert!(delivered < 1_000_000, "the fork loop does not end");
        if to == addr(ALICE) {
            let status = Message::parse(text.as_bytes()).unwrap().status();
            if status >= Some(200) {
                final_status = status;
            }
            continue;
        }
        let (me, engine) = proxies.iter_mut().find(|(a, _)| *a == to).unwrap();
        let me = *me;
        let (sent, _) = deliver(engine, 1, &from.to_string(), &text);
        queue.extend(sent.into_iter().map(|s| (me, s.to, s.text)));
    }
    let forwarded = proxies
        .iter()
        .map(|(_, e)| {
            e.stats
                .forwarded_requests
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum();
    (forwarded, final_status)
}

#[test]
fn a_fork_loop_between_two_proxies_is_bounded_by_max_breadth() {
    // RFC 5393: at most Max-Breadth (60) concurrent branches, one pass per Max-Forwards hop.
    // Without it, Max-Forwards 5 gave 16 + 16² + … + 16⁵ ≈ 1.1 million forwards.
    let (forwarded, status) = fork_loop(5, None);
    // 16 branches, then at most 60 on each later hop (fewer where a Request-URI comes back
    // a second time and loop detection answers 482).
    assert!(
        (16 + 60..=16 + 60 * 4).contains(&forwarded),
        "{forwarded} forwarded"
    );
    assert!(
        matches!(status, Some(482 | 483)),
        "the best of the branches' 482 and 483: {status:?}"
    );
    // Measured: 233 at Max-Forwards 70 too, as loop detection ends the spiral once the 16
    // Request-URIs start coming round again.
    let (forwarded, status) = fork_loop(70, None);
    assert!(forwarded <= 60 * 70, "{forwarded} forwarded");
    assert!(matches!(status, Some(482 | 483)), "{status:?}");
    // A request arriving with less breadth forks less; with none left it is refused.
    let (forwarded, _) = fork_loop(5, Some(4));
    assert!((4..=4 * 5).contains(&forwarded), "{forwarded} forwarded");
    let (forwarded, status) = fork_loop(5, Some(0));
    assert_eq!((forwarded, status), (0, Some(440)));
}

#[test]
fn contacts_pointing_at_the_server_itself_are_refused_and_never_followed() {
    let mut e = engine("");
    for contact in [
        format!("<sip:bob@{PROXY};x=1>"),
        "<sip:bob@localhost:5060>".to_string(),
        format!("<sip:bob@{BOB1}>, <sip:bob@{PROXY}>"),
    ] {
        let (sent, fx) = deliver(
            &mut e,
            0,
            BOB1,
            &register("bob", &contact, "", "z9hG4bKself", 1),
        );
        assert_eq!(sent[0].status(), Some(403), "{contact}");
        assert!(sent[0].text.contains("Contact Points At This Server"));
        assert!(fx.changes.is_empty());
    }
    // A binding stored before this rule (or by another registrar) is not followed either.
    e.preload(&BindingChange::Upsert {
        aor: "bob@example.test".into(),
        binding: crate::location::Binding {
            contact: format!("sip:bob@{PROXY};x=1").into(),
            target: Peer::udp(addr(PROXY)),
            expires_at: 2_000_000_000,
            q: None,
            call_id: "old".into(),
            cseq: 1,
            received: None,
            outbound: None,
            path: None,
            node: None,
            via: None,
        },
    });
    let (sent, _) = deliver(
        &mut e,
        1,
        ALICE,
        &request("INVITE", "sip:bob@example.test", "z9hG4bKselfinv", ""),
    );
    let statuses: Vec<_> = sent.iter().map(Sent::status).collect();
    assert_eq!(statuses, [Some(482)], "nothing sent to ourselves");
}

#[test]
fn registrations_the_store_cannot_hold_are_refused_at_the_door() {
    let mut e = engine("");
    let long_host = "h".repeat(600);
    let cases = [
        (format!("<sip:bob@{long_host}>"), "Contact Too Long"),
        (format!("<sip:bob@{BOB1}>;q=abc"), "Bad q parameter"),
        (format!("<sip:bob@{BOB1}>;q=1.5"), "Bad q parameter"),
    ];
    for (i, (contact, reason)) in cases.iter().enumerate() {
        let (sent, fx) = deliver(
            &mut e,
            0,
            BOB1,
            &register("bob", contact, "", &format!("z9hG4bKdoor1{i}"), 1),
        );
        assert_eq!(
            sent[0].text.lines().next().unwrap(),
            format!("SIP/2.0 400 {reason}")
        );
        assert!(fx.changes.is_empty(), "nothing reaches the store");
    }
    let long_user = "u".repeat(300);
    let (sent, _) = deliver(
        &mut e,
        0,
        BOB1,
        &register(
            &long_user,
            &format!("<sip:x@{BOB1}>"),
            "",
            "z9hG4bKdoor2",
            1,
        ),
    );
    assert!(sent[0]
        .text
        .starts_with("SIP/2.0 400 Address-of-Record Too Long"));
    let (sent, _) = deliver(
        &mut e,
        0,
        BOB1,
        &register("bob", &format!("<sip:bob@{BOB1}>"), "", "z9hG4bKdoor3", 1)
            .replace("Call-ID: reg-bob", &format!("Call-ID: {}", "c".repeat(300))),
    );
    assert!(sent[0].text.starts_with("SIP/2.0 400 Call-ID Too Long"));
    let refused = e
        .stats
        .registrations_refused
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(refused, 5);
    // A good q is kept.
    let (sent, _) = deliver(
        &mut e,
        0,
        BOB1,
        &register(
            "bob",
            &format!("<sip:bob@{BOB1}>;q=0.5"),
            "",
            "z9hG4bKdoor4",
            1,
        ),
    );
    assert!(sent[0].text.contains(";q=0.5"), "{}", sent[0].text);
}

#[test]
fn each_address_family_is_sent_from_a_listener_of_its_own_or_refused_at_once() {
    for order in [
        ["tcp:127.0.0.1:5060", "tcp:[::1]:5062"],
        ["tcp:[::1]:5062", "tcp:127.0.0.1:5060"],
    ] {
        let cfg = Config::from_toml(&format!(
            "[server]\nlisten = [\"udp:{PROXY}\", \"{}\", \"{}\"]\ndomains = [\"example.test\"]\n",
            order[0], order[1]
        ))
        .unwrap();
        let mut e = Engine::new(Arc::new(cfg), 0, 1_000_000, Arc::new(Stats::default()));
        for (target, via) in [
            (
                "sip:x@[::1]:7000;transport=tcp",
                "Via: SIP/2.0/TCP [::1]:5062;",
            ),
            (
                "sip:x@127.0.0.9:7000;transport=tcp",
                "Via: SIP/2.0/TCP 127.0.0.1:5060;",
            ),
        ] {
            let (sent, _) = deliver(
                &mut e,
                0,
                ALICE,
                &request(
                    "OPTIONS",
                    target,
                    &format!("z9hG4bKfam{}", target.len()),
                    "",
                ),
            );
            let fwd = sent
                .iter()
                .find(|s| s.status().is_none())
                .expect("forwarded");
            assert!(fwd.text.contains(via), "{order:?} {target}: {}", fwd.text);
        }
    }
    // UDP to IPv6 with no IPv6 UDP listener: 503 at once, not a 32 s wait for 408.
    let mut e = engine("");
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &request("OPTIONS", "sip:x@[::1]:7000", "z9hG4bKnov6", ""),
    );
    let statuses: Vec<_> = sent.iter().map(Sent::status).collect();
    assert_eq!(statuses, [Some(503)]);
}

#[test]
fn a_durable_registrar_answers_once_the_store_has_committed() {
    for stateful in [true, false] {
        let mut e = engine(&format!(
            "stateful = {stateful}\n[registrar]\ndurable = true"
        ));
        let reg = register("bob", &format!("<sip:bob@{BOB1}>"), "", "z9hG4bKd1", 1);
        let (sent, fx) = deliver(&mut e, 0, BOB1, &reg);
        assert!(sent.is_empty(), "no 200 before the commit");
        assert_eq!(fx.changes.len(), 1);
        // The binding works from memory at once; the client's retransmission gets nothing
        // while it waits (stateful: the transaction absorbs it; stateless: it waits too).
        let (sent, fx) = deliver(&mut e, 100, BOB1, &reg);
        assert!(sent.is_empty());
        assert!(fx.changes.is_empty(), "a retransmission changes nothing");
        let mut fx = Effects::default();
        e.handle_saved(200, 1, &mut fx);
        // Stateless, the retransmission was answered too (its own 200, also held).
        let expected = if stateful { 1 } else { 2 };
        assert_eq!(fx.transmits.len(), expected, "stateful {stateful}");
        for (to, data) in &fx.transmits {
            // The source address with the Via's port (RFC 3261 §18.2.2).
            assert_eq!(to.addr, addr("127.0.0.3:5070"));
            assert!(data.starts_with(b"SIP/2.0 200 OK"));
        }
        // A refresh changes the binding (new CSeq), so it waits for its own commit.
        let (sent, _) = deliver(
            &mut e,
            300,
            BOB1,
            &register("bob", &format!("<sip:bob@{BOB1}>"), "", "z9hG4bKd2", 2),
        );
        assert!(sent.is_empty());
        let mut fx = Effects::default();
        e.handle_saved(400, 2, &mut fx);
        assert_eq!(fx.transmits.len(), 1);
        // A REGISTER that changes nothing, once everything is committed, needs no wait.
        let same = register("bob", &format!("<sip:bob@{BOB1}>"), "", "z9hG4bKd3", 2);
        let (sent, _) = deliver(&mut e, 500, BOB1, &same);
        assert_eq!(sent.len(), 1, "nothing uncommitted: answered at once");
        assert_eq!(sent[0].status(), Some(200));

        // The database does not confirm: after DURABLE_WAIT_MS the REGISTER gets 500 with
        // Retry-After, not a 200 the client would trust.
        let (sent, _) = deliver(
            &mut e,
            1_000,
            BOB1,
            &register("carol", &format!("<sip:carol@{BOB2}>"), "", "z9hG4bKd4", 1),
        );
        assert!(sent.is_empty());
        assert!(tick(&mut e, 1_000 + durable::DURABLE_WAIT_MS - 1).is_empty());
        let sent = tick(&mut e, 1_000 + durable::DURABLE_WAIT_MS);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].status(), Some(500));
        assert!(sent[0].text.contains("Retry-After: 5\r\n"));
        assert_eq!(
            e.stats
                .registrations_unsaved
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        // A late commit finds nothing to release twice.
        let mut fx = Effects::default();
        e.handle_saved(7_000, 3, &mut fx);
        assert!(fx.transmits.is_empty());
    }
}

#[test]
fn without_durable_the_registrar_answers_at_once() {
    let mut e = engine("");
    let reg = register("bob", &format!("<sip:bob@{BOB1}>"), "", "z9hG4bKw1", 1);
    let (sent, fx) = deliver(&mut e, 0, BOB1, &reg);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status(), Some(200));
    assert_eq!(fx.changes.len(), 1);
}
