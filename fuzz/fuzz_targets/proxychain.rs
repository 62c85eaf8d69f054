//! Proxychain's header values and the authority channel's wire format on any bytes.
//! Invariants: no panic, and whatever parses renders to text that parses back to the same
//! value (so nothing received can smuggle a parameter or a field into what we send on).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sip_core::proxychain::{Authenticate, Authorization};
use sipsec_server::auth::proxychain::wire::{self, Reply, Request};

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = Authenticate::parse(data) {
        let text = a.render();
        assert_eq!(
            Authenticate::parse(text.as_bytes()).as_ref(),
            Ok(&a),
            "{text}"
        );
    }
    if let Ok(a) = Authorization::parse(data) {
        let text = match &a {
            Authorization::Hello(h) => h.render(),
            Authorization::Response(r) => r.render(),
        };
        assert_eq!(
            Authorization::parse(text.as_bytes()).as_ref(),
            Ok(&a),
            "{text}"
        );
    }
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(r) = wire::parse::<Request>(line) {
        assert_eq!(
            wire::parse::<Request>(wire::line(&r).trim_end()).ok(),
            Some(r)
        );
    }
    if let Ok(r) = wire::parse::<Reply>(line) {
        if let Reply::Issued { credential, .. } = &r {
            let _ = credential.issued();
        }
        assert_eq!(
            wire::parse::<Reply>(wire::line(&r).trim_end()).ok(),
            Some(r)
        );
    }
});
