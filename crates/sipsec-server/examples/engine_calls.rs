//! Drives one engine through complete calls in memory, for instruction counts under callgrind:
//! INVITE, 100, 180, 200, ACK, BYE, 200 through a record-routing proxy, the same call flow as
//! the SIPp benchmark, with no sockets and no clock.
//!
//!     cargo build --release --example engine_calls
//!     valgrind --tool=callgrind target/release/examples/engine_calls stateful 2000
//!
//! `scripts/callgrind.sh` runs it twice and reports instructions per call.

use bytes::Bytes;
use sip_core::message::build;
use sip_core::message::Message;
use sipsec_server::config::Config;
use sipsec_server::engine::{Effects, Engine};
use sipsec_server::stats::Stats;
use sipsec_transport::net::transport::Peer;
use std::sync::Arc;

fn main() {
    let mut args = std::env::args().skip(1);
    let stateful = args.next().as_deref() != Some("stateless");
    let calls: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(1000);
    let cfg = Config::from_toml(&format!(
        "[server]\nlisten = [\"udp:127.0.0.1:5060\"]\ndomains = [\"bench.test\"]\nworkers = 1\n\
stateful = {stateful}\n[routing]\ndefault_route = \"sip:127.0.0.3:5080\"\n"
    ))
    .expect("valid config");
    let mut engine = Engine::new(Arc::new(cfg), 0, 0, Arc::new(Stats::default()));
    let uac = Peer::udp("127.0.0.2:5070".parse().unwrap());
    let uas = Peer::udp("127.0.0.3:5080".parse().unwrap());
    let mut fx = Effects::default();
    let mut now = 0;
    let mut completed = 0;
    for call in 0..calls {
        // 20 ms a call: after ~1,600 calls the 32 s transaction lingers expire as fast as new
        // ones start, so timer work is in the steady state being measured.
        now += 20;
        let invite = format!(
            "INVITE sip:bench@127.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.2:5070;branch=z9hG4bK-{call}-1\r\n\
From: sipp <sip:sipp@127.0.0.2:5070>;tag={call}SIPpTag00\r\nTo: <sip:bench@127.0.0.1:5060>\r\n\
Call-ID: {call}-bench@127.0.0.2\r\nCSeq: 1 INVITE\r\nContact: sip:sipp@127.0.0.2:5070\r\nMax-Forwards: 70\r\n\
Subject: Performance Test\r\nContent-Type: application/sdp\r\nContent-Length: 0\r\n\r\n"
        );
        engine.handle_message(now, uac, invite.as_bytes(), &mut fx);
        let forwarded = take_to(&mut fx, uas).expect("INVITE forwarded");
        fx.transmits.clear();
        let fwd = Message::parse(&forwarded).unwrap();
        let tag = format!("{call}SIPpTag01");
        let mut ringing = Vec::new();
        build::response(
            &fwd,
            180,
            "Ringing",
            Some(&tag),
            b"Contact: <sip:127.0.0.3:5080>\r\n",
            b"",
            &mut ringing,
        );
        copy_record_route(&fwd, &mut ringing);
        engine.handle_message(now, uas, &ringing, &mut fx);
        let mut ok = Vec::new();
        build::response(
            &fwd,
            200,
            "OK",
            Some(&tag),
            b"Contact: <sip:127.0.0.3:5080>\r\n",
            b"",
            &mut ok,
        );
        copy_record_route(&fwd, &mut ok);
        engine.handle_message(now, uas, &ok, &mut fx);
        let up = take_to(&mut fx, uac).expect("200 forwarded");
        assert!(
            up.starts_with(b"SIP/2.0 200"),
            "{}",
            String::from_utf8_lossy(&up)
        );
        fx.transmits.clear();
        let in_dialog = |method: &str, cseq: u32, branch: &str| {
            format!(
                "{method} sip:127.0.0.3:5080 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.2:5070;branch=z9hG4bK-{call}-{branch}\r\n\
From: sipp <sip:sipp@127.0.0.2:5070>;tag={call}SIPpTag00\r\nTo: <sip:bench@127.0.0.1:5060>;tag={tag}\r\n\
Call-ID: {call}-bench@127.0.0.2\r\nCSeq: {cseq} {method}\r\nRoute: <sip:127.0.0.1:5060;lr>\r\n\
Contact: sip:sipp@127.0.0.2:5070\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
            )
        };
        engine.handle_message(now, uac, in_dialog("ACK", 1, "2").as_bytes(), &mut fx);
        engine.handle_message(now, uac, in_dialog("BYE", 2, "3").as_bytes(), &mut fx);
        let bye = take_to(&mut fx, uas).expect("BYE forwarded");
        fx.transmits.clear();
        let bye = Message::parse(&bye).unwrap();
        let mut bye_ok = Vec::new();
        build::response(&bye, 200, "OK", None, b"", b"", &mut bye_ok);
        engine.handle_message(now, uas, &bye_ok, &mut fx);
        if take_to(&mut fx, uac).is_some_and(|r| r.starts_with(b"SIP/2.0 200")) {
            completed += 1;
        }
        fx.transmits.clear();
        engine.handle_timeout(now, &mut fx);
        fx.transmits.clear();
    }
    assert_eq!(completed, calls, "every call completes");
    println!(
        "{completed} calls completed ({})",
        if stateful { "stateful" } else { "stateless" }
    );
}

fn take_to(fx: &mut Effects, to: Peer) -> Option<Bytes> {
    fx.transmits
        .iter()
        .rev()
        // By address: the engine marks UDP destinations with the socket to send from.
        .find(|(dest, _)| (dest.transport, dest.addr) == (to.transport, to.addr))
        .map(|(_, d)| d.clone())
}

/// A UAS copies Record-Route into its responses.
fn copy_record_route(request: &Message<'_>, response: &mut Vec<u8>) {
    let Some(rr) = request.header_value(sip_core::message::HeaderName::RecordRoute) else {
        return;
    };
    let line = [b"Record-Route: ".as_slice(), rr, b"\r\n"].concat();
    let at = response.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    response.splice(at..at, line);
}
