//! The callee's registrations against a scripted registrar, in simulated time: what the
//! REGISTERs say (RFC 3261 §10.2, RFC 5626 §4.1–4.2), the challenge, the refresh at half the
//! granted time, the keep-alives (§4.4.1), a failed flow moving to a new one (§4.5), and the
//! unregistration at the end.

use super::*;
use crate::users::{User, Users};
use sip_core::digest::Algorithm;

const SERVER: &str = "192.0.2.1:5060";
const LOCAL: &str = "10.0.0.5:5062";

fn config(transport: Transport, outbound: bool, flows: u32) -> UaConfig {
    let users = Users::new(vec![User {
        username: "alice".into(),
        password: "s3cret".into(),
        domain: None,
    }]);
    UaConfig {
        target: Endpoint {
            link: 0,
            addr: SERVER.parse().unwrap(),
        },
        uas_local: None,
        transport,
        register: Some(Registering {
            flows,
            outbound,
            keepalive_ms: 20_000,
            contact_addr: None,
        }),
        ..crate::ua::tests::config(Scenario::Call, users)
    }
}

/// A UA whose registrations have started, and the flows it asked for.
fn started(transport: Transport, outbound: bool, flows: u32) -> (Ua, Vec<FlowOp>) {
    let mut ua = Ua::new(config(transport, outbound, flows), 0);
    ua.start_registrations();
    let ops = std::mem::take(&mut ua.flow_ops);
    (ua, ops)
}

/// Opens flow `flow` on `link` and returns the REGISTER it sends.
fn open(ua: &mut Ua, now_us: u64, flow: u32, link: u32) -> String {
    let mut out = Vec::new();
    ua.flow_opened(now_us, flow, link, LOCAL.parse().unwrap(), &mut out);
    let (to, data) = only(out);
    assert_eq!(to.link, link);
    assert_eq!(to.addr, SERVER.parse().unwrap());
    data
}

fn only(out: Vec<Transmit>) -> (Endpoint, String) {
    assert_eq!(out.len(), 1, "{out:?}");
    let (to, data) = out.into_iter().next().unwrap();
    (to, String::from_utf8(data.to_vec()).unwrap())
}

/// The registrar's answer to `request`, delivered to the UA on `link`; what the UA sends.
fn answer(
    ua: &mut Ua,
    now_us: u64,
    link: u32,
    request: &str,
    code: u16,
    extra: &str,
) -> Vec<Transmit> {
    let req = Message::parse(request.as_bytes()).unwrap();
    let mut m = Vec::new();
    build::response(
        &req,
        code,
        build::reason_phrase(code),
        Some("reg"),
        extra.as_bytes(),
        b"",
        &mut m,
    );
    let mut out = Vec::new();
    let from = Endpoint {
        link,
        addr: SERVER.parse().unwrap(),
    };
    ua.on_message(now_us, from, &m, &mut out);
    out
}

fn header<'a>(m: &'a str, name: &str) -> &'a str {
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
        .unwrap_or_else(|| panic!("no {name} in {m}"))
}

/// Runs the UA's timers from `from_ms` to `to_ms` in steps of 100 ms; what it sent, with the
/// time.
fn tick(ua: &mut Ua, from_ms: u64, to_ms: u64) -> Vec<(u64, Endpoint, String)> {
    let mut sent = Vec::new();
    let mut t = from_ms;
    while t <= to_ms {
        let mut out = Vec::new();
        ua.on_tick(t * 1000, &mut out);
        for (to, data) in out {
            sent.push((t, to, String::from_utf8_lossy(&data).into_owned()));
        }
        t += 100;
    }
    sent
}

#[test]
fn a_udp_registration_answers_the_challenge_refreshes_at_half_and_unregisters() {
    let (mut ua, ops) = started(Transport::Udp, false, 1);
    let remote = SERVER.parse().unwrap();
    assert_eq!(ops, [FlowOp::Open { flow: 0, remote }]);
    assert!(!ua.registrations_settled());
    let first = open(&mut ua, 0, 0, 3);
    assert!(
        first.starts_with("REGISTER sip:example.test SIP/2.0\r\n"),
        "{first}"
    );
    assert!(header(&first, "Via").starts_with(&format!("SIP/2.0/UDP {LOCAL};branch=z9hG4bK-")));
    assert!(
        header(&first, "Via").ends_with(";rport"),
        "behind a NAT: {first}"
    );
    assert_eq!(
        header(&first, "From").split(';').next(),
        Some("<sip:alice@example.test>")
    );
    assert_eq!(header(&first, "To"), "<sip:alice@example.test>");
    // Over UDP the Contact is the flow's own socket; no outbound without --outbound.
    assert_eq!(header(&first, "Contact"), format!("<sip:alice@{LOCAL}>"));
    assert_eq!(header(&first, "Expires"), "600");
    assert_eq!(header(&first, "CSeq"), "1 REGISTER");
    assert!(
        !first.contains("Supported:") && !first.contains("reg-id"),
        "{first}"
    );

    let challenge = "WWW-Authenticate: Digest realm=\"lab\", nonce=\"abc\", qop=\"auth\", \
                     algorithm=SHA-256\r\n";
    let (_, second) = only(answer(&mut ua, 1_000_000, 3, &first, 401, challenge));
    assert_eq!(header(&second, "CSeq"), "2 REGISTER");
    assert_eq!(header(&second, "Call-ID"), header(&first, "Call-ID"));
    assert_ne!(
        header(&second, "Via"),
        header(&first, "Via"),
        "a new branch"
    );
    // The digest answer checks out with the user's password.
    let auth = header(&second, "Authorization");
    let p = digest::parse_params(auth.as_bytes()).unwrap();
    let get = |n: &str| {
        p.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n.as_bytes()))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap()
    };
    assert_eq!(
        (get("username"), get("uri")),
        ("alice".into(), "sip:example.test".into())
    );
    let c = Challenge::parse(&challenge.as_bytes()[18..challenge.len() - 2]).unwrap();
    let ha1 = Algorithm::Sha256.ha1("alice", "lab", "s3cret");
    assert_eq!(
        get("response"),
        c.response(&ha1, "REGISTER", "sip:example.test", 1, &get("cnonce"))
    );

    // The registrar grants 120 s of the 600 asked for (in the Contact, over the header).
    let ok = format!("Contact: <sip:alice@{LOCAL}>;expires=120\r\nExpires: 600\r\n");
    assert!(answer(&mut ua, 2_000_000, 3, &second, 200, &ok).is_empty());
    assert!(ua.registrations_settled());
    let report = ua.registration_report();
    assert_eq!((report.registered, report.flows), (1, 1));
    let r = &ua.stats.registrations;
    assert_eq!(
        (r.tally.attempted, r.tally.succeeded, r.tally.failed),
        (1, 1, 0)
    );
    assert_eq!(r.tally.latency_us.max() / 1000, 2000, "challenge included");
    // No keep-alives without --outbound; the refresh at half the granted time, not before.
    let sent = tick(&mut ua, 2000, 62_100);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (at, to, refresh) = &sent[0];
    assert_eq!((*at, to.link), (62_000, 3));
    assert_eq!(header(refresh, "CSeq"), "3 REGISTER");
    assert_eq!(header(refresh, "Call-ID"), header(&first, "Call-ID"));
    assert!(answer(&mut ua, 62_200_000, 3, refresh, 200, &ok).is_empty());
    assert_eq!(
        (
            ua.stats.registrations.tally.succeeded,
            ua.stats.registrations.refreshes
        ),
        (2, 1)
    );

    // The end: Expires 0 for the binding, answered.
    let mut out = Vec::new();
    ua.unregister_all(70_000_000, &mut out);
    let (_, bye) = only(out);
    assert_eq!(header(&bye, "Expires"), "0");
    assert_eq!(header(&bye, "CSeq"), "4 REGISTER");
    assert_eq!(ua.unregistrations_pending(), 1);
    answer(&mut ua, 70_100_000, 3, &bye, 200, "");
    assert_eq!(ua.unregistrations_pending(), 0);
    assert_eq!(ua.stats.registrations.unregistered, 1);
    // Its socket closes with it.
    assert_eq!(ua.flow_ops, [FlowOp::Close(3)]);
    // Nothing is left to fire.
    assert!(tick(&mut ua, 70_100, 200_000).is_empty());
}

#[test]
fn a_refused_registration_is_reported_with_its_reason_and_retried_after_a_back_off() {
    let (mut ua, _) = started(Transport::Udp, false, 1);
    let first = open(&mut ua, 0, 0, 1);
    assert!(answer(&mut ua, 1_000_000, 1, &first, 403, "").is_empty());
    assert!(ua.registrations_settled());
    let report = ua.registration_report();
    assert_eq!(report.registered, 0);
    assert_eq!(report.failures, ["alice: 403 Forbidden"]);
    assert_eq!(
        ua.stats.registrations.tally.failures_by_reason["403 Forbidden"],
        1
    );
    assert_eq!(ua.flow_ops, [FlowOp::Close(1)]);
    ua.flow_ops.clear();
    // A new flow after 0.5–1 s (the back-off after the first failure, spread).
    tick(&mut ua, 1000, 1400);
    assert!(ua.flow_ops.is_empty());
    tick(&mut ua, 1500, 2100);
    let remote = SERVER.parse().unwrap();
    assert_eq!(ua.flow_ops, [FlowOp::Open { flow: 0, remote }]);
    assert_eq!(ua.stats.registrations.flows_reopened, 1);
    // A 200 that does not list our Contact bound nothing.
    let again = open(&mut ua, 2_200_000, 0, 1);
    assert_eq!(header(&again, "CSeq"), "2 REGISTER");
    answer(
        &mut ua,
        2_300_000,
        1,
        &again,
        200,
        "Contact: <sip:bob@192.0.2.9>;expires=60\r\n",
    );
    assert_eq!(
        ua.registration_report().failures,
        ["alice: 2xx without our Contact"]
    );
}

#[test]
fn outbound_flows_carry_instance_reg_id_and_ob_and_streams_name_an_invalid_host() {
    let (mut ua, ops) = started(Transport::Tcp, true, 2);
    assert_eq!(ops.len(), 2, "two flows for the one user");
    let one = open(&mut ua, 0, 0, 1);
    let two = open(&mut ua, 0, 1, 2);
    let (c1, c2) = (header(&one, "Contact"), header(&two, "Contact"));
    for (c, reg_id) in [(c1, 1), (c2, 2)] {
        let (uri, params) = c.split_once('>').unwrap();
        // RFC 7118's way: a host that resolves nowhere, so the flow is the only way in.
        assert!(uri.starts_with("<sip:alice@"), "{c}");
        assert!(uri.ends_with(".invalid;transport=tcp;ob"), "{c}");
        assert!(params.contains(&format!(";reg-id={reg_id}")), "{c}");
        assert!(params.starts_with(";+sip.instance=\"<urn:uuid:"), "{c}");
    }
    let instance = |c: &str| {
        c.split("+sip.instance=")
            .nth(1)
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(instance(c1), instance(c2), "one instance per user");
    let uuid = instance(c1);
    let uuid = uuid
        .trim_matches('"')
        .trim_matches(['<', '>'])
        .strip_prefix("urn:uuid:")
        .unwrap();
    assert_eq!(uuid.len(), 36);
    assert_eq!(&uuid[14..15], "4", "a version 4 UUID: {uuid}");
    assert_ne!(
        c1.split('>').next(),
        c2.split('>').next(),
        "each flow its own Contact"
    );
    assert_eq!(header(&one, "Supported"), "outbound, path");
    assert!(header(&one, "Via").starts_with("SIP/2.0/TCP "), "{one}");
    assert_ne!(header(&one, "Call-ID"), header(&two, "Call-ID"));
}

/// The 200 OK to an outbound REGISTER: the Contact bound, and what the registrar adds.
fn outbound_ok(register: &str, extra: &str) -> String {
    let contact = header(register, "Contact");
    format!("Contact: {contact};expires=3600\r\n{extra}")
}

#[test]
fn stream_keepalives_follow_flow_timer_and_an_unanswered_one_moves_the_flow() {
    let (mut ua, _) = started(Transport::Tls, true, 1);
    let reg = open(&mut ua, 0, 0, 5);
    let ok = outbound_ok(&reg, "Require: outbound\r\nFlow-Timer: 10\r\n");
    answer(&mut ua, 0, 5, &reg, 200, &ok);
    // A double-CRLF ping at 80–100% of the Flow-Timer, on the flow.
    let sent = tick(&mut ua, 100, 10_000);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (at, to, ping) = &sent[0];
    assert!((8000..=10_000).contains(at), "{at}");
    assert_eq!((to.link, ping.as_str()), (5, "\r\n\r\n"));
    ua.keepalive_answered(5);
    assert_eq!(ua.stats.registrations.keepalives_answered, 1);
    // The next goes unanswered: 7.5 s later the flow is failed and moves to a new one.
    let sent = tick(&mut ua, 10_100, 20_000);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let at = sent[0].0;
    tick(&mut ua, 20_100, at + 7400);
    assert!(ua.flow_ops.is_empty(), "{:?}", ua.flow_ops);
    tick(&mut ua, at + 7500, at + 7600);
    let r = &ua.stats.registrations;
    assert_eq!((r.keepalives_sent, r.keepalives_unanswered), (2, 1));
    assert_eq!(r.flow_failures["keep-alive unanswered"], 1);
    let remote = SERVER.parse().unwrap();
    assert_eq!(
        ua.flow_ops,
        [FlowOp::Close(5), FlowOp::Open { flow: 0, remote }]
    );
    ua.flow_ops.clear();
    // Registered again over the new flow: same Contact, Call-ID and instance, CSeq on.
    let again = open(&mut ua, (at + 7700) * 1000, 0, 6);
    assert_eq!(header(&again, "Contact"), header(&reg, "Contact"));
    assert_eq!(header(&again, "Call-ID"), header(&reg, "Call-ID"));
    assert_eq!(header(&again, "CSeq"), "2 REGISTER");
    // A pong on the old link means nothing now.
    ua.keepalive_answered(5);
    assert_eq!(ua.stats.registrations.keepalives_answered, 1);
}

#[test]
fn a_closed_connection_is_registered_again_at_once() {
    let (mut ua, _) = started(Transport::Tcp, false, 1);
    let reg = open(&mut ua, 0, 0, 2);
    answer(&mut ua, 0, 2, &reg, 200, &outbound_ok(&reg, ""));
    let mut out = Vec::new();
    ua.link_closed(5_000_000, 2, &mut out);
    assert!(out.is_empty());
    // The link is gone: nothing to close, a new flow to open, at once.
    assert!(ua.flow_ops.is_empty());
    tick(&mut ua, 5000, 5000);
    let remote = SERVER.parse().unwrap();
    assert_eq!(ua.flow_ops, [FlowOp::Open { flow: 0, remote }]);
    assert_eq!(ua.stats.registrations.flow_failures["connection closed"], 1);
    // A link nobody registered over is not ours.
    ua.link_closed(5_000_000, 9, &mut out);
    assert_eq!(ua.stats.registrations.flows_failed, 1);
}

#[test]
fn udp_keepalives_are_stun_and_without_confirmed_outbound_no_answer_is_only_counted() {
    let (mut ua, _) = started(Transport::Udp, true, 1);
    let reg = open(&mut ua, 0, 0, 1);
    // No Require: outbound, no Flow-Timer: the default interval (20 s here), and no
    // recovery when the registrar does not answer STUN.
    answer(&mut ua, 0, 1, &reg, 200, &outbound_ok(&reg, ""));
    let sent = tick(&mut ua, 100, 20_000);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (at, to, _) = &sent[0];
    assert!((16_000..=20_000).contains(at), "{at}");
    assert_eq!(to.link, 1);
    // A Binding request, answered with its transaction ID.
    let mut out = Vec::new();
    let request = ua.flows[0].stun_id;
    let mut response = vec![0x01, 0x01, 0, 0, 0x21, 0x12, 0xa4, 0x42];
    response.extend_from_slice(&request);
    let from = Endpoint {
        link: 1,
        addr: SERVER.parse().unwrap(),
    };
    ua.on_message(20_100_000, from, &response, &mut out);
    assert_eq!(ua.stats.registrations.keepalives_answered, 1);
    // Another ID is a stray, not an answer.
    response[8] ^= 1;
    ua.on_message(20_100_000, from, &response, &mut out);
    assert_eq!(
        (ua.stats.registrations.keepalives_answered, ua.stats.stray),
        (1, 1)
    );
    // Unanswered ones are counted; the flow stays.
    let sent = tick(&mut ua, 20_100, 80_000);
    assert!(sent.len() >= 3, "{sent:?}");
    assert!(sent
        .iter()
        .all(|(_, to, m)| to.link == 1 && !m.contains("SIP/2.0")));
    assert!(ua.stats.registrations.keepalives_unanswered >= 2);
    assert!(ua.flow_ops.is_empty());
    assert_eq!(ua.stats.registrations.flows_failed, 0);
    assert_eq!(ua.registration_report().registered, 1);
}

#[test]
fn a_call_on_the_flow_is_answered_with_the_registered_contact() {
    let (mut ua, _) = started(Transport::Tcp, true, 1);
    let reg = open(&mut ua, 0, 0, 4);
    answer(&mut ua, 0, 4, &reg, 200, &outbound_ok(&reg, ""));
    let registered = header(&reg, "Contact")
        .split('>')
        .next()
        .unwrap()
        .to_string()
        + ">";
    let invite = format!(
        "INVITE {} SIP/2.0\r\nVia: SIP/2.0/TCP 192.0.2.1:5060;branch=z9hG4bK-in1\r\n\
         Max-Forwards: 69\r\nFrom: <sip:bob@example.test>;tag=b1\r\n\
         To: <sip:alice@example.test>\r\nCall-ID: in1@x\r\nCSeq: 1 INVITE\r\n\
         Contact: <sip:bob@192.0.2.7:5060;transport=tcp>\r\nContent-Length: 0\r\n\r\n",
        registered.trim_matches(['<', '>'])
    );
    let mut out = Vec::new();
    let from = Endpoint {
        link: 4,
        addr: SERVER.parse().unwrap(),
    };
    ua.on_message(1_000_000, from, invite.as_bytes(), &mut out);
    let ok = out
        .iter()
        .map(|(to, d)| (to, String::from_utf8_lossy(d).into_owned()))
        .find(|(_, m)| m.starts_with("SIP/2.0 200"))
        .unwrap();
    assert_eq!(ok.0.link, 4, "answered on the flow it came in on");
    assert_eq!(header(&ok.1, "Contact"), registered);
}

#[test]
fn timings_follow_rfc_5626() {
    // The answer to a keep-alive is awaited 10 s at most, and never past the next one.
    assert_eq!(answer_wait_ms(25_000), 10_000);
    assert_eq!(answer_wait_ms(10_000), 7_500);
    // The back-off doubles from 1 s to 30 s, spread by the fraction.
    assert_eq!(backoff_ms(0, 1.0), 1000);
    assert_eq!(backoff_ms(3, 1.0), 8000);
    assert_eq!(backoff_ms(10, 1.0), 30_000);
    assert_eq!(backoff_ms(40, 0.5), 15_000);
    let id = uuid_v4([0xff; 16]);
    assert_eq!(id, "urn:uuid:ffffffff-ffff-4fff-bfff-ffffffffffff");
}

#[test]
fn a_udp_callee_can_name_a_private_address_in_its_contact() {
    let mut cfg = config(Transport::Udp, false, 1);
    if let Some(r) = cfg.register.as_mut() {
        r.contact_addr = Some("10.0.0.9:5060".into());
    }
    let mut ua = Ua::new(cfg, 0);
    ua.start_registrations();
    let register = open(&mut ua, 0, 0, 7);
    assert!(
        header(&register, "Contact").starts_with("<sip:alice@10.0.0.9:5060>"),
        "{register}"
    );
}
