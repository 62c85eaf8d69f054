//! The message parser on any bytes: parse, read every lazily parsed part the engine reads,
//! and build the responses the engine builds (a reply to what parsed, a salvaged 400 to what
//! did not). Invariants: no panic; a response built from a request parses; a salvaged one is
//! no bigger than the request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sip_core::message::{build, HeaderName, Message};

fuzz_target!(|data: &[u8]| {
    let msg = match Message::parse(data) {
        Ok(m) => m,
        Err(_) => {
            let mut out = Vec::new();
            if build::salvage_response(data, 400, "Bad Request", b"", &mut out) {
                // It echoes the request's lines, however bad; but it is one response, no
                // bigger than what came (no reflection amplification) but for a CR added to
                // lines that ended in a bare LF.
                assert!(out.starts_with(b"SIP/2.0 400 Bad Request\r\n"));
                assert!(out.ends_with(b"\r\nContent-Length: 0\r\n\r\n"));
                let lines = data.iter().filter(|b| **b == b'\n').count();
                assert!(
                    out.len() <= data.len() + lines + 64,
                    "{} from {}",
                    out.len(),
                    data.len()
                );
            }
            return;
        }
    };
    let _ = (
        msg.method(),
        msg.status(),
        msg.request_uri(),
        msg.max_forwards(),
    );
    let _ = (
        msg.from(),
        msg.to(),
        msg.second_via(),
        msg.expires(),
        msg.max_breadth(),
    );
    let _ = msg.vias(|v| {
        let _ = (
            v.received(),
            v.rport(),
            v.maddr(),
            v.is_rfc3261(),
            v.host_unbracketed(),
        );
    });
    let _ = msg.name_addrs(HeaderName::Contact, |_, na| {
        let _ = (
            na.uri.host_unbracketed(),
            na.uri.transport(),
            na.params.get(b"q"),
        );
    });
    let _ = msg.name_addrs(HeaderName::RecordRoute, |_, _| {});
    let _ = msg.name_addrs(HeaderName::Route, |_, _| {});
    let _ = (msg.contact_is_star(), msg.check_all(), msg.body());
    for v in msg.list_values(HeaderName::Contact) {
        let _ = v.len();
    }
    if msg.is_request() {
        let mut out = Vec::new();
        build::response(&msg, 200, "OK", Some("t1"), b"", b"", &mut out);
        Message::parse(&out).expect("a response built from a request parses");
    }
});
