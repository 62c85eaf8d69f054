//! Digest header parsing (RFC 7616) on any bytes: the server's reading of credentials, and
//! the client's reading of a challenge (the load generator talks to servers it does not
//! trust). Invariants: no panic; a challenge that parses yields an Authorization header that
//! parses back to the same realm, nonce and opaque (nothing a server sends can inject
//! parameters into the client's answer).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sip_core::digest::{parse_params, Challenge, Credentials};

fuzz_target!(|data: &[u8]| {
    let _ = parse_params(data);
    if let Ok(c) = Credentials::parse(data) {
        let _ = c.expected_response("0123456789abcdef0123456789abcdef", b"INVITE");
    }
    if let Ok(ch) = Challenge::parse(data) {
        let header = ch.authorization("alice", "secret", "REGISTER", "sip:example.test", 1, "c0");
        let back = Credentials::parse(header.as_bytes())
            .unwrap_or_else(|e| panic!("our own Authorization does not parse ({e:?}): {header}"));
        assert_eq!(&*back.realm, ch.realm.as_bytes(), "{header}");
        assert_eq!(&*back.nonce, ch.nonce.as_bytes(), "{header}");
        assert_eq!(
            back.opaque.as_deref(),
            ch.opaque.as_ref().map(|o| o.as_bytes()),
            "{header}"
        );
        assert_eq!(&*back.username, b"alice", "{header}");
    }
});
