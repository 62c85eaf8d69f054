//! The four machines driven in simulated time, checked against RFC 3261 §17's timer values.

use super::*;

type Table = Transactions<u8, &'static str>;
const PEER: u8 = 7;

fn invite(branch: &str) -> Vec<u8> {
    format!(
        "INVITE sip:b@example.test SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.1:5060;branch={branch}\r\n\
From: <sip:a@example.test>;tag=f\r\nTo: <sip:b@example.test>\r\nCall-ID: call-1\r\n\
CSeq: 1 INVITE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

fn request(method: &str, branch: &str, to_tag: &str) -> Vec<u8> {
    format!(
        "{method} sip:b@example.test SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.1:5060;branch={branch}\r\n\
From: <sip:a@example.test>;tag=f\r\nTo: <sip:b@example.test>{to_tag}\r\nCall-ID: call-1\r\n\
CSeq: 1 {method}\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

fn response(code: u16, branch: &str, method: &str) -> Vec<u8> {
    format!(
        "SIP/2.0 {code} X\r\nVia: SIP/2.0/UDP 10.0.0.1:5060;branch={branch}\r\n\
From: <sip:a@example.test>;tag=f\r\nTo: <sip:b@example.test>;tag=t\r\nCall-ID: call-1\r\n\
CSeq: 1 {method}\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

fn transmits(out: &mut Vec<Output<u8, &'static str>>) -> usize {
    let n = out
        .iter()
        .filter(|o| matches!(o, Output::Transmit { .. }))
        .count();
    out.clear();
    n
}

/// Advances millisecond by millisecond up to `until`, recording when transmits happen.
fn run(
    t: &mut Table,
    from: Millis,
    until: Millis,
    out: &mut Vec<Output<u8, &'static str>>,
) -> Vec<Millis> {
    let mut at = Vec::new();
    let mut now = from;
    while now <= until {
        let before = out.len();
        t.advance(now, out);
        for o in &out[before..] {
            if matches!(o, Output::Transmit { .. }) {
                at.push(now);
            }
        }
        now += 1;
    }
    at
}

#[test]
fn client_invite_retransmits_on_timer_a_and_times_out_on_b() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let req = invite("z9hG4bK1");
    let id = t.create_client(
        0,
        Bytes::from(req),
        b"z9hG4bK1",
        b"INVITE",
        PEER,
        false,
        "inv",
        &mut out,
    );
    assert_eq!(transmits(&mut out), 1);
    let sends = run(&mut t, 1, 32_000, &mut out);
    // Timer A doubles from T1 with no cap: 500, 1500, 3500, 7500, 15500, 31500.
    assert_eq!(sends, vec![500, 1_500, 3_500, 7_500, 15_500, 31_500]);
    assert!(out.iter().any(|o| matches!(
        o,
        Output::Timeout { id: i, kind: Kind::ClientInvite, state: State::Calling, dest: PEER, user: "inv", message }
            if *i == id && message.starts_with(b"INVITE")
    )));
    assert!(t.is_empty());
}

#[test]
fn client_invite_non2xx_is_acked_and_retransmissions_absorbed() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let id = t.create_client(
        0,
        Bytes::from(invite("z9hG4bK2")),
        b"z9hG4bK2",
        b"INVITE",
        PEER,
        false,
        "inv",
        &mut out,
    );
    out.clear();
    let ringing = response(180, "z9hG4bK2", "INVITE");
    assert_eq!(
        t.recv_response(100, &Message::parse(&ringing).unwrap(), &mut out),
        ResponseMatch::Deliver(id)
    );
    assert_eq!(t.state(id), Some(State::Proceeding));
    // No more retransmissions once a provisional arrived.
    assert!(run(&mut t, 101, 5_000, &mut out).is_empty());
    let busy = response(486, "z9hG4bK2", "INVITE");
    let busy = Message::parse(&busy).unwrap();
    assert_eq!(
        t.recv_response(5_001, &busy, &mut out),
        ResponseMatch::Deliver(id)
    );
    let Output::Transmit { data, .. } = &out[0] else {
        panic!("expected the ACK")
    };
    let ack = Message::parse(data).unwrap();
    assert_eq!(ack.method(), Method::Ack);
    assert_eq!(ack.top_via().branch, Some(&b"z9hG4bK2"[..]));
    assert_eq!(ack.to().unwrap().tag(), Some(&b"t"[..]));
    out.clear();
    assert_eq!(
        t.recv_response(5_100, &busy, &mut out),
        ResponseMatch::Absorbed
    );
    assert_eq!(
        transmits(&mut out),
        1,
        "ACK re-sent for a retransmitted final"
    );
    // Timer D (32 s) then terminated.
    t.advance(5_001 + 31_999, &mut out);
    assert_eq!(t.state(id), Some(State::Completed));
    t.advance(5_001 + 32_000, &mut out);
    assert_eq!(t.state(id), None);
}

#[test]
fn client_invite_2xx_enters_accepted_and_passes_retransmissions() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let id = t.create_client(
        0,
        Bytes::from(invite("z9hG4bK3")),
        b"z9hG4bK3",
        b"INVITE",
        PEER,
        false,
        "inv",
        &mut out,
    );
    let ok = response(200, "z9hG4bK3", "INVITE");
    let ok = Message::parse(&ok).unwrap();
    assert_eq!(
        t.recv_response(10, &ok, &mut out),
        ResponseMatch::Deliver(id)
    );
    assert_eq!(t.state(id), Some(State::Accepted));
    assert_eq!(
        t.recv_response(600, &ok, &mut out),
        ResponseMatch::Deliver(id)
    );
    t.advance(10 + 64 * 500, &mut out);
    assert_eq!(t.state(id), None, "timer M ends the Accepted state");
    assert_eq!(
        t.recv_response(40_000, &ok, &mut out),
        ResponseMatch::Unmatched
    );
}

#[test]
fn client_non_invite_timer_e_caps_at_t2_and_f_times_out() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    t.create_client(
        0,
        Bytes::from(request("BYE", "z9hG4bK4", ";tag=t")),
        b"z9hG4bK4",
        b"BYE",
        PEER,
        false,
        "bye",
        &mut out,
    );
    out.clear();
    let sends = run(&mut t, 1, 32_000, &mut out);
    assert_eq!(&sends[..5], &[500, 1_500, 3_500, 7_500, 11_500]);
    assert!(sends.windows(2).skip(3).all(|w| w[1] - w[0] == 4_000));
    assert!(out.iter().any(|o| matches!(
        o,
        Output::Timeout {
            kind: Kind::ClientNonInvite,
            ..
        }
    )));
}

#[test]
fn client_non_invite_final_then_timer_k() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let id = t.create_client(
        0,
        Bytes::from(request("BYE", "z9hG4bK5", ";tag=t")),
        b"z9hG4bK5",
        b"BYE",
        PEER,
        false,
        "bye",
        &mut out,
    );
    let ok = response(200, "z9hG4bK5", "BYE");
    let ok = Message::parse(&ok).unwrap();
    assert_eq!(
        t.recv_response(50, &ok, &mut out),
        ResponseMatch::Deliver(id)
    );
    assert_eq!(t.recv_response(60, &ok, &mut out), ResponseMatch::Absorbed);
    t.advance(50 + 4_999, &mut out);
    assert_eq!(t.state(id), Some(State::Completed));
    t.advance(50 + 5_000, &mut out);
    assert_eq!(t.state(id), None);
}

#[test]
fn server_invite_retransmits_final_on_g_until_ack() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let raw = invite("z9hG4bK6");
    let inv = Message::parse(&raw).unwrap();
    assert_eq!(t.recv_request(0, &inv, &mut out), RequestMatch::New);
    let id = t.create_server(&inv, PEER, false, "srv");
    assert!(t.respond(0, id, 100, Bytes::from_static(b"100"), &mut out));
    out.clear();
    // A retransmitted INVITE gets the last provisional again.
    assert_eq!(
        t.recv_request(200, &inv, &mut out),
        RequestMatch::Retransmission(id)
    );
    assert_eq!(transmits(&mut out), 1);
    assert!(t.respond(1_000, id, 486, Bytes::from_static(b"486"), &mut out));
    assert!(!t.respond(1_001, id, 200, Bytes::from_static(b"late"), &mut out));
    out.clear();
    let sends = run(&mut t, 1_001, 5_000, &mut out);
    assert_eq!(
        sends,
        vec![1_500, 2_500, 4_500],
        "timer G: T1, 2T1, 4T1 ... capped at T2"
    );
    let ack = request("ACK", "z9hG4bK6", ";tag=t");
    let ack = Message::parse(&ack).unwrap();
    assert_eq!(
        t.recv_request(5_001, &ack, &mut out),
        RequestMatch::AckAbsorbed(id)
    );
    assert_eq!(t.state(id), Some(State::Confirmed));
    assert!(
        run(&mut t, 5_002, 20_000, &mut out).is_empty(),
        "no retransmission after ACK"
    );
    assert_eq!(t.state(id), None, "timer I ended it");
}

#[test]
fn server_invite_without_ack_times_out_on_h() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let raw = invite("z9hG4bK7");
    let inv = Message::parse(&raw).unwrap();
    let id = t.create_server(&inv, PEER, false, "srv");
    t.respond(0, id, 404, Bytes::from_static(b"404"), &mut out);
    out.clear();
    run(&mut t, 1, 64 * 500, &mut out);
    assert!(out.iter().any(|o| matches!(
        o,
        Output::Timeout {
            kind: Kind::ServerInvite,
            ..
        }
    )));
    assert_eq!(t.state(id), None);
}

#[test]
fn server_invite_2xx_accepted_passes_ack_and_more_2xx() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let raw = invite("z9hG4bK8");
    let inv = Message::parse(&raw).unwrap();
    let id = t.create_server(&inv, PEER, false, "srv");
    assert!(t.respond(0, id, 200, Bytes::from_static(b"200"), &mut out));
    assert_eq!(t.state(id), Some(State::Accepted));
    assert!(
        t.respond(500, id, 200, Bytes::from_static(b"200 again"), &mut out),
        "2xx retransmission passes"
    );
    let ack = request("ACK", "z9hG4bK8", ";tag=t");
    assert_eq!(
        t.recv_request(600, &Message::parse(&ack).unwrap(), &mut out),
        RequestMatch::Ack
    );
    out.clear();
    assert_eq!(
        t.recv_request(700, &inv, &mut out),
        RequestMatch::Retransmission(id)
    );
    assert_eq!(
        transmits(&mut out),
        0,
        "INVITE retransmissions are absorbed in Accepted"
    );
    t.advance(64 * 500, &mut out);
    assert_eq!(t.state(id), None, "timer L");
}

#[test]
fn server_non_invite_absorbs_and_lingers_for_j() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let raw = request("BYE", "z9hG4bK9", ";tag=t");
    let bye = Message::parse(&raw).unwrap();
    let id = t.create_server(&bye, PEER, false, "srv");
    assert_eq!(
        t.recv_request(10, &bye, &mut out),
        RequestMatch::Retransmission(id)
    );
    assert_eq!(transmits(&mut out), 0, "nothing to resend while Trying");
    t.respond(20, id, 200, Bytes::from_static(b"200"), &mut out);
    out.clear();
    assert_eq!(
        t.recv_request(30, &bye, &mut out),
        RequestMatch::Retransmission(id)
    );
    assert_eq!(transmits(&mut out), 1);
    t.advance(20 + 32_000, &mut out);
    assert_eq!(t.state(id), None);
}

#[test]
fn cancel_finds_its_invite_and_reliable_transports_skip_retransmission() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let raw = invite("z9hG4bKa");
    let inv = Message::parse(&raw).unwrap();
    let id = t.create_server(&inv, PEER, true, "srv");
    let cancel = request("CANCEL", "z9hG4bKa", "");
    let cancel = Message::parse(&cancel).unwrap();
    assert_eq!(
        t.recv_request(5, &cancel, &mut out),
        RequestMatch::New,
        "CANCEL is its own transaction"
    );
    assert_eq!(t.find_cancelled(&cancel), Some(id));
    t.respond(10, id, 487, Bytes::from_static(b"487"), &mut out);
    out.clear();
    assert!(
        run(&mut t, 11, 40_000, &mut out).is_empty(),
        "no timer G over a reliable transport"
    );
}

#[test]
fn rfc2543_requests_match_without_a_cookie() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let raw = invite("old-style");
    let inv = Message::parse(&raw).unwrap();
    let id = t.create_server(&inv, PEER, false, "srv");
    assert_eq!(
        t.recv_request(1, &inv, &mut out),
        RequestMatch::Retransmission(id)
    );
}

#[test]
fn timer_c_ends_an_invite_that_rings_forever() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let id = t.create_client(
        0,
        Bytes::from(invite("z9hG4bKc")),
        b"z9hG4bKc",
        b"INVITE",
        PEER,
        false,
        "inv",
        &mut out,
    );
    let ringing = response(180, "z9hG4bKc", "INVITE");
    let ringing = Message::parse(&ringing).unwrap();
    t.recv_response(1_000, &ringing, &mut out);
    // Timer B (32 s) no longer applies once ringing; a later provisional resets timer C.
    t.advance(100_000, &mut out);
    t.recv_response(100_000, &ringing, &mut out);
    t.advance(100_000 + 179_999, &mut out);
    assert_eq!(t.state(id), Some(State::Proceeding));
    out.clear();
    t.advance(100_000 + 180_000, &mut out);
    assert!(matches!(
        out.as_slice(),
        [Output::Timeout {
            kind: Kind::ClientInvite,
            state: State::Proceeding,
            user: "inv",
            ..
        }]
    ));
    assert!(t.is_empty());
}

#[test]
fn the_longest_lingering_transaction_is_evicted_first_and_live_ones_never() {
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    // Three non-INVITE server transactions: two answered (timer J, lingering), one not.
    let mut ids = Vec::new();
    for (i, branch) in ["z9hG4bKa", "z9hG4bKb", "z9hG4bKc"].iter().enumerate() {
        let req = request("MESSAGE", branch, "");
        let msg = Message::parse(&req).unwrap();
        assert_eq!(
            t.recv_request(i as Millis, &msg, &mut out),
            RequestMatch::New
        );
        ids.push(t.create_server(&msg, PEER, false, branch));
    }
    // Answered b first, then a; c stays live.
    for (now, id) in [(10, ids[1]), (20, ids[0])] {
        let resp = Bytes::from(response(200, "z9hG4bKx", "MESSAGE"));
        assert!(t.respond(now, id, 200, resp, &mut out));
    }
    out.clear();
    assert_eq!((t.len(), t.lingering()), (3, 2));
    assert!(t.evict_lingering(&mut out));
    assert!(matches!(out[..], [Output::Terminated { id, user: "z9hG4bKb" }] if id == ids[1]));
    out.clear();
    assert!(t.evict_lingering(&mut out));
    assert!(matches!(
        out[..],
        [Output::Terminated {
            user: "z9hG4bKa",
            ..
        }]
    ));
    out.clear();
    assert_eq!((t.len(), t.lingering()), (1, 0));
    // The unanswered one is live work: never evicted.
    assert!(!t.evict_lingering(&mut out));
    assert_eq!(t.state(ids[2]), Some(State::Trying));
    // A transaction that ended on its own timer leaves no stale entry behind to evict.
    let resp = Bytes::from(response(200, "z9hG4bKc", "MESSAGE"));
    assert!(t.respond(30, ids[2], 200, resp, &mut out));
    run(&mut t, 31, 30 + 64 * 500, &mut out);
    assert_eq!((t.len(), t.lingering()), (0, 0));
    assert!(!t.evict_lingering(&mut out));
}

#[test]
fn a_hurried_client_times_out_early_unless_the_peer_answers() {
    let timeouts = |out: &Vec<Output<u8, &'static str>>| {
        out.iter()
            .filter(|o| matches!(o, Output::Timeout { .. }))
            .count()
    };
    // Nothing answers: Timer B comes at 2 s instead of 32 s.
    let mut t = Table::new(0, Timers::default());
    let mut out = Vec::new();
    let id = t.create_client(
        0,
        Bytes::from(invite("z9hG4bKh1")),
        b"z9hG4bKh1",
        b"INVITE",
        PEER,
        false,
        "inv",
        &mut out,
    );
    t.expect_response_within(0, id, 2_000);
    out.clear();
    run(&mut t, 1, 1_999, &mut out);
    assert_eq!(timeouts(&out), 0);
    run(&mut t, 2_000, 2_000, &mut out);
    assert_eq!(timeouts(&out), 1);
    // A non-INVITE whose peer says 100 Trying gets its full Timer F back.
    let mut t = Table::new(0, Timers::default());
    let id = t.create_client(
        0,
        Bytes::from(request("OPTIONS", "z9hG4bKh2", "")),
        b"z9hG4bKh2",
        b"OPTIONS",
        PEER,
        false,
        "opt",
        &mut out,
    );
    t.expect_response_within(0, id, 2_000);
    let trying = response(100, "z9hG4bKh2", "OPTIONS");
    let msg = Message::parse(&trying).unwrap();
    assert!(matches!(
        t.recv_response(1_000, &msg, &mut out),
        ResponseMatch::Deliver(_)
    ));
    out.clear();
    run(&mut t, 1, 32_999, &mut out);
    assert_eq!(timeouts(&out), 0);
    run(&mut t, 33_000, 33_000, &mut out);
    assert_eq!(timeouts(&out), 1);
}
