//! Parser tests, including RFC 4475's torture messages read from `testdata/rfc4475` at the
//! repository's root.

use super::rewrite::{Rewriter, Splice};
use super::*;
use std::path::PathBuf;

/// The repository's copy of RFC 4475's messages.
fn torture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/rfc4475")
}

fn torture(name: &str) -> Vec<u8> {
    let dir = torture_dir();
    std::fs::read(dir.join(format!("{name}.dat")))
        .unwrap_or_else(|e| panic!("reading {name}.dat from {}: {e}", dir.display()))
}

/// Parse plus the strict check, as a validating endpoint would.
fn strict(buf: &[u8]) -> Result<Message<'_>, ParseError> {
    let m = Message::parse(buf)?;
    m.check_all()?;
    Ok(m)
}

#[test]
fn rfc4475_valid_messages_parse() {
    for name in [
        "wsinv",
        "intmeth",
        "esc01",
        "escnull",
        "esc02",
        "lwsdisp",
        "longreq",
        "dblreq",
        "semiuri",
        "transports",
        "mpart01",
        "unreason",
        "noreason",
    ] {
        let buf = torture(name);
        if let Err(e) = strict(&buf) {
            panic!("{name}: valid message rejected: {e}");
        }
    }
}

#[test]
fn rfc4475_invalid_messages_are_rejected_with_the_right_fault() {
    use ParseError as E;
    let h = |header, what| E::Header { header, what };
    let cases: &[(&str, ParseError)] = &[
        ("badinv01", h("Via", "empty parameter")),
        ("clerr", E::ContentLengthTooLarge),
        ("ncl", h("Content-Length", "negative")),
        ("scalar02", h("CSeq", "bad sequence number")),
        ("scalarlg", h("CSeq", "bad sequence number")),
        ("quotbal", h("To", "unbalanced quotes")),
        ("ltgtruri", E::RequestUri("bad scheme")),
        ("lwsruri", E::StartLine("junk after Request-URI")),
        ("lwsstart", E::StartLine("extra whitespace")),
        ("trws", E::StartLine("trailing whitespace")),
        ("escruri", E::RequestUri("headers not allowed")),
        ("baddate", h("Date", "not an RFC 1123 GMT date")),
        ("regbadct", h("Contact", "URI with headers needs <>")),
        ("badaspec", h("To", "whitespace inside <>")),
        ("baddn", h("From", "bad display name")),
        ("badvers", E::Version),
        ("mismatch01", E::CSeqMethodMismatch),
        ("mismatch02", E::CSeqMethodMismatch),
        ("bigcode", E::StatusCode),
    ];
    for (name, expected) in cases {
        let buf = torture(name);
        match strict(&buf) {
            Ok(_) => panic!("{name}: invalid message accepted"),
            Err(e) => assert_eq!(&e, expected, "{name}: wrong fault"),
        }
    }
}

#[test]
fn rfc4475_application_layer_messages_parse_or_fail_as_the_rfc_allows() {
    // Syntactically valid: the application decides (416, 420, 415, 483, ...).
    for name in [
        "badbranch",
        "unkscm",
        "novelsc",
        "unksm2",
        "bext01",
        "invut",
        "regaut01",
        "bcast",
        "zeromf",
        "cparam01",
        "cparam02",
        "regescrt",
        "sdp01",
        "inv2543",
    ] {
        let buf = torture(name);
        if let Err(e) = strict(&buf) {
            panic!("{name}: rejected at parse level: {e}");
        }
    }
    assert_eq!(
        Message::parse(&torture("insuf")).unwrap_err(),
        ParseError::Missing("Call-ID")
    );
    assert_eq!(
        Message::parse(&torture("multi01")).unwrap_err(),
        ParseError::Duplicate("CSeq")
    );
    assert_eq!(
        Message::parse(&torture("mcl01")).unwrap_err(),
        ParseError::Duplicate("Content-Length")
    );
}

#[test]
fn wsinv_values_survive_folding() {
    let buf = torture("wsinv");
    let m = Message::parse(&buf).unwrap();
    assert_eq!(m.method(), Method::Invite);
    assert_eq!(m.max_forwards(), Some(68));
    assert_eq!(m.cseq().seq, 9);
    assert_eq!(m.to().unwrap().tag(), Some(&b"1918181833n"[..]));
    assert_eq!(m.from().unwrap().tag(), Some(&b"98asjd8"[..]));
    let mut vias = Vec::new();
    m.vias(|v| vias.push((v.transport, v.host, v.branch)))
        .unwrap();
    assert_eq!(
        vias,
        vec![
            (&b"UDP"[..], &b"192.0.2.2"[..], Some(&b"390skdjuw"[..])),
            (
                &b"TCP"[..],
                &b"spindle.example.com"[..],
                Some(&b"z9hG4bK9ikj8"[..])
            ),
            (
                &b"UDP"[..],
                &b"192.168.255.111"[..],
                Some(&b"z9hG4bK30239"[..])
            ),
        ]
    );
    let mut q = None;
    m.name_addrs(HeaderName::Contact, |_, na| {
        q = na.params.get(b"q").flatten();
    })
    .unwrap();
    assert_eq!(q, Some(&b"0.33"[..]));
    assert_eq!(m.body().len(), 150);
}

#[test]
fn dblreq_ignores_octets_after_content_length() {
    let buf = torture("dblreq");
    let m = Message::parse(&buf).unwrap();
    assert!(m.as_bytes().len() < buf.len());
    assert_eq!(m.method(), Method::Register);
}

#[test]
fn escaped_method_and_compact_headers() {
    let buf = torture("esc02");
    let m = Message::parse(&buf).unwrap();
    assert_eq!(m.method(), Method::Other);
    assert_eq!(m.method_raw(), b"RE%47IST%45R");
    let mut contacts = 0;
    m.name_addrs(HeaderName::Contact, |_, _| contacts += 1)
        .unwrap();
    assert_eq!(contacts, 2, "C%6Fntact is not a Contact header");
    let buf = torture("esc01");
    let m = Message::parse(&buf).unwrap();
    assert_eq!(m.call_id(), b"esc01.239409asdfakjkn23onasd0-3234");
    assert_eq!(
        m.header_value(HeaderName::ContentType),
        Some(&b"application/sdp"[..])
    );
}

const INVITE: &[u8] = b"INVITE sip:bob@example.test SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.0.0.1:5070;rport;branch=z9hG4bKabc, SIP/2.0/UDP 10.0.0.9;branch=z9hG4bKold\r\n\
Max-Forwards: 70\r\n\
Route: <sip:127.0.0.1:5060;lr>, <sip:next.example.test;lr>\r\n\
From: <sip:alice@example.test>;tag=1\r\n\
To: <sip:bob@example.test>\r\n\
Call-ID: c1\r\n\
CSeq: 1 INVITE\r\n\
Content-Length: 4\r\n\
\r\n\
body";

#[test]
fn a_stream_source_is_stamped_with_its_port_even_unasked() {
    let m = Message::parse(
        b"OPTIONS sip:x@example.test SIP/2.0\r\nVia: SIP/2.0/TCP 10.0.0.1:5070;branch=z9hG4bKa\r\n\
From: <sip:a@example.test>;tag=1\r\nTo: <sip:x@example.test>\r\nCall-ID: c\r\n\
CSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n",
    )
    .unwrap();
    let stamped = |addr: &str, always: bool| {
        let mut splice = Splice::new();
        let mut rw = Rewriter::new(&m, &mut splice);
        rw.stamp_top_via(addr.parse().unwrap(), always);
        let mut out = Vec::new();
        rw.finish(&mut out);
        let again = Message::parse(&out).unwrap().top_via().params.0.to_vec();
        String::from_utf8(again).unwrap()
    };
    // Over UDP from the sent-by address, nothing changes; over a stream the connection's port
    // is recorded with the address it belongs to.
    assert_eq!(stamped("10.0.0.1:5070", false), ";branch=z9hG4bKa");
    assert_eq!(
        stamped("10.0.0.1:40001", true),
        ";branch=z9hG4bKa;received=10.0.0.1;rport=40001"
    );
}

#[test]
fn proxy_rewrite_splices_only_what_changes() {
    let m = Message::parse(INVITE).unwrap();
    let mut splice = Splice::new();
    let mut rw = Rewriter::new(&m, &mut splice);
    rw.stamp_top_via("192.0.2.7:5071".parse().unwrap(), false);
    rw.push_via("UDP", "127.0.0.1:5060", "z9hG4bKnew", "");
    rw.decrement_max_forwards();
    rw.push_record_route("sip:127.0.0.1:5060;lr", &[]);
    let route = m.header(HeaderName::Route).copied().unwrap();
    let mut first_route_end = 0;
    m.name_addrs(HeaderName::Route, |_, na| {
        if first_route_end == 0 {
            first_route_end = na.end;
        }
    })
    .unwrap();
    rw.remove_first_value(&route, first_route_end);
    rw.set_request_uri(b"sip:bob@192.0.2.44:5062");
    let mut out = Vec::new();
    rw.finish(&mut out);
    let text = String::from_utf8(out.clone()).unwrap();
    assert_eq!(
        text,
        "INVITE sip:bob@192.0.2.44:5062 SIP/2.0\r\n\
Via: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKnew\r\n\
Via: SIP/2.0/UDP 10.0.0.1:5070;rport=5071;branch=z9hG4bKabc;received=192.0.2.7, SIP/2.0/UDP 10.0.0.9;branch=z9hG4bKold\r\n\
Max-Forwards: 69\r\n\
Route: <sip:next.example.test;lr>\r\n\
From: <sip:alice@example.test>;tag=1\r\n\
To: <sip:bob@example.test>\r\n\
Call-ID: c1\r\n\
CSeq: 1 INVITE\r\n\
Content-Length: 4\r\n\
Record-Route: <sip:127.0.0.1:5060;lr>\r\n\
\r\n\
body"
    );
    let again = Message::parse(&out).unwrap();
    again.check_all().unwrap();
    // The Via below ours is the client's, with what we stamped into it.
    let second = again.second_via().unwrap().unwrap();
    assert_eq!(second.branch, Some(&b"z9hG4bKabc"[..]));
    assert_eq!(second.received(), Some(&b"192.0.2.7"[..]));
    // And below that, the second value of the same header line.
    let original = Message::parse(INVITE).unwrap();
    assert_eq!(
        original.second_via().unwrap().unwrap().branch,
        Some(&b"z9hG4bKold"[..])
    );
    assert_eq!(again.top_via().branch, Some(&b"z9hG4bKnew"[..]));

    // A response going back: pop our Via.
    let resp = b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKnew\r\nVia: SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bKabc\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@x>;tag=2\r\nCall-ID: c1\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n";
    let r = Message::parse(resp).unwrap();
    let mut rw = Rewriter::new(&r, &mut splice);
    rw.pop_via();
    let mut out = Vec::new();
    rw.finish(&mut out);
    let popped = Message::parse(&out).unwrap();
    assert_eq!(popped.top_via().branch, Some(&b"z9hG4bKabc"[..]));
    assert_eq!(popped.headers_named(HeaderName::Via).count(), 1);
}

#[test]
fn responses_copy_the_request_identity() {
    let m = Message::parse(INVITE).unwrap();
    let mut out = Vec::new();
    build::response(
        &m,
        404,
        "Not Found",
        Some("xyz"),
        b"Server: sipsec\r\n",
        b"",
        &mut out,
    );
    let r = Message::parse(&out).unwrap();
    r.check_all().unwrap();
    assert_eq!(r.status(), Some(404));
    assert_eq!(r.to().unwrap().tag(), Some(&b"xyz"[..]));
    assert_eq!(r.call_id(), b"c1");
    let mut n = 0;
    r.vias(|_| n += 1).unwrap();
    assert_eq!(n, 2);
    let mut ack = Vec::new();
    build::ack_for_non2xx(&m, &r, &mut ack);
    let a = Message::parse(&ack).unwrap();
    assert_eq!(a.method(), Method::Ack);
    assert_eq!(a.top_via().branch, m.top_via().branch);
    assert_eq!(a.to().unwrap().tag(), Some(&b"xyz"[..]));
}

#[test]
fn never_panics_on_truncations_and_mutations() {
    // Every prefix and a spread of single-byte mutations of every torture message.
    let dir = torture_dir();
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "dat") {
            continue;
        }
        let buf = std::fs::read(&path).unwrap();
        for cut in 0..buf.len() {
            if let Ok(m) = Message::parse(&buf[..cut]) {
                let _ = m.check_all();
            }
        }
        for i in (0..buf.len()).step_by(3) {
            for byte in [b'\0', b' ', b':', b';', b',', b'<', b'"', b'\n', b'%', b'['] {
                let mut b = buf.clone();
                b[i] = byte;
                if let Ok(m) = Message::parse(&b) {
                    let _ = m.check_all();
                    let _ = m.from();
                    let _ = m.name_addrs(HeaderName::Route, |_, _| {});
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 10_000);
}

#[test]
fn max_breadth_is_read_and_set_in_place_or_added() {
    let breadth = |text: &[u8], set: u32| {
        let m = Message::parse(text).unwrap();
        let read = m.max_breadth().map(|r| r.ok());
        let mut splice = Splice::new();
        let mut rw = Rewriter::new(&m, &mut splice);
        rw.set_max_breadth(set);
        let mut out = Vec::new();
        rw.finish(&mut out);
        let again = Message::parse(&out).unwrap().max_breadth().map(|r| r.ok());
        (read, again)
    };
    assert_eq!(breadth(INVITE, 60), (None, Some(Some(60))));
    let with = String::from_utf8(INVITE.to_vec())
        .unwrap()
        .replace("Call-ID: c1\r\n", "Call-ID: c1\r\nmax-breadth: 17\r\n");
    assert_eq!(breadth(with.as_bytes(), 4), (Some(Some(17)), Some(Some(4))));
    let bad = with.replace("max-breadth: 17", "Max-Breadth: many");
    assert_eq!(breadth(bad.as_bytes(), 4).0, Some(None));
}

/// A request that came without Content-Length (a datagram's end ends its body) leaves with one
/// naming its body: forwarded onto a stream without it, the next hop could not frame it.
#[test]
fn a_rewrite_adds_the_content_length_a_datagram_left_out() {
    let forward = |text: &[u8]| {
        let m = Message::parse(text).unwrap();
        let mut splice = Splice::new();
        let mut rw = Rewriter::new(&m, &mut splice);
        rw.decrement_max_forwards();
        let mut out = Vec::new();
        rw.finish(&mut out);
        out
    };
    let without = String::from_utf8(INVITE.to_vec())
        .unwrap()
        .replace("Content-Length: 4\r\n", "")
        .replace("body", "OPTIONS sip:x SIP/2.0\r\n\r\n");
    let out = forward(without.as_bytes());
    let body_len = "OPTIONS sip:x SIP/2.0\r\n\r\n".len();
    assert_eq!(
        framing::next_frame(&out, 4096),
        framing::Frame::Message(out.len()),
        "{}",
        String::from_utf8_lossy(&out)
    );
    let m = Message::parse(&out).unwrap();
    assert_eq!(m.body().len(), body_len);
    let named = body_len.to_string();
    assert_eq!(
        m.header_value(HeaderName::ContentLength),
        Some(named.as_bytes())
    );
    // Headers without the empty line after them, and no body: a whole frame too.
    let bare = "OPTIONS sip:x SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\n\
                From: <sip:a@h>;tag=1\r\nTo: <sip:x>\r\nCall-ID: c\r\nCSeq: 1 OPTIONS\r\n";
    let out = forward(bare.as_bytes());
    assert_eq!(
        framing::next_frame(&out, 4096),
        framing::Frame::Message(out.len())
    );
    // One that had it keeps it, unchanged.
    let out = forward(INVITE);
    assert_eq!(Message::parse(&out).unwrap().body(), b"body");
    assert_eq!(out.len(), INVITE.len());
}

/// A control character inside a header line is refused (forwarded, a NUL could end a C string
/// early at the next hop), tab included in what is allowed.
#[test]
fn control_characters_in_header_lines_are_refused() {
    let with = |bad: &str| {
        String::from_utf8(INVITE.to_vec())
            .unwrap()
            .replace("Call-ID: c1", &format!("Subject: a{bad}b\r\nCall-ID: c1"))
    };
    for bad in ["\0", "\x01", "\r", "\x1b", "\x7f"] {
        assert_eq!(
            Message::parse(with(bad).as_bytes()).err(),
            Some(ParseError::HeaderLine("control character")),
            "{bad:?}"
        );
    }
    assert!(Message::parse(with("\t").as_bytes()).is_ok());
    // Escaped in a quoted string (a quoted-pair, RFC 4475's intmeth), a control is text.
    let quoted = |q: &str| {
        String::from_utf8(INVITE.to_vec())
            .unwrap()
            .replace("To: <sip:bob", &format!("To: {q} <sip:bob"))
    };
    assert!(Message::parse(quoted("\"NUL:\\\0\"").as_bytes()).is_ok());
    for bad in ["\"NUL:\0\"", "\\\0", "\"a\\\\\0\""] {
        assert_eq!(
            Message::parse(quoted(bad).as_bytes()).err(),
            Some(ParseError::HeaderLine("control character")),
            "{bad:?}"
        );
    }
    // In the body, anything goes.
    let body = String::from_utf8(INVITE.to_vec())
        .unwrap()
        .replace("body", "b\0d\x01");
    assert!(Message::parse(body.as_bytes()).is_ok());
}

/// An IPv6 reference must hold an IPv6 address: three colons in a row are a 400, not a name
/// to route.
#[test]
fn ipv6_references_are_validated() {
    let with_ruri = |host: &str| {
        String::from_utf8(INVITE.to_vec())
            .unwrap()
            .replace("sip:bob@example.test SIP", &format!("sip:bob@{host} SIP"))
    };
    for bad in [
        "[2001:db8:::192.0.2.1]",
        "[::1::2]",
        "[12345::1]",
        "[:]",
        "[]",
    ] {
        let err = Message::parse(with_ruri(bad).as_bytes()).err();
        assert_eq!(err, Some(ParseError::RequestUri("bad host")), "{bad}");
        assert_eq!(err.map(|e| e.status()), Some(400));
    }
    for good in ["[2001:db8::192.0.2.1]", "[::1]:5060", "[2001:db8::10:5070]"] {
        assert!(Message::parse(with_ruri(good).as_bytes()).is_ok(), "{good}");
    }
    assert!(!uri::valid_host(b"[2001:db8:::1]"));
    assert!(uri::valid_host(b"[::ffff:192.0.2.1]"));
}
