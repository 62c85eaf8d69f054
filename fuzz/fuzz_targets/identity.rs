//! The STIR/SHAKEN Identity header (RFC 8224) and its PASSporT (RFC 8225) on any bytes: what a
//! verifier reads from any network. Invariants: no panic; a value that decodes names an
//! https: certificate URL and canonical numbers; and every token we sign decodes back to the
//! claims it was signed with, whatever numbers and URL went in.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sipsec_identity::{header, tn, Attest, Claims, SigningKey};
use std::sync::LazyLock;

/// A fixed P-256 key (PKCS#8, made once per run).
static KEY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let dir = std::env::temp_dir().join(format!("sipsec-fuzz-identity-{}", std::process::id()));
    sipsec_identity::sti::make(&dir, &sipsec_identity::cert::Authority::Codes(vec!["1".into()]))
        .expect("a test certificate");
    std::fs::read(dir.join(sipsec_identity::sti::SHAKEN_KEY)).expect("the key just written")
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = tn::from_uri(text);
    if let Ok(token) = header::decode(text) {
        assert!(token.x5u.len() > 8 && token.x5u.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://")));
        assert_eq!(tn::canonical(&token.claims.orig).as_deref(), Some(token.claims.orig.as_str()));
        for d in &token.claims.dest {
            assert_eq!(tn::canonical(d).as_deref(), Some(d.as_str()));
        }
    }
    // The input split into a number, a URL tail and an origid: signed, decoded back.
    let mut parts = text.splitn(3, '\n');
    let (Some(number), Some(url), Some(origid)) = (parts.next(), parts.next(), parts.next()) else {
        return;
    };
    let (Some(orig), Ok(key)) = (
        tn::canonical(number),
        SigningKey::from_pem(&KEY, &format!("https://cert.example/{url}")),
    ) else {
        return;
    };
    if origid.is_empty() {
        return;
    }
    let claims = Claims {
        attest: Attest::B,
        orig: orig.clone(),
        dest: vec![orig],
        iat: 1_700_000_000,
        origid: origid.to_string(),
    };
    let value = header::value(&key, &claims);
    if value.len() > header::MAX_VALUE || value.split(';').next().map_or(0, str::len) > sipsec_identity::passport::MAX_TOKEN {
        // Too long to be read back, by design: the verifier's limit.
        return;
    }
    let token = header::decode(&value)
        .unwrap_or_else(|e| panic!("our own Identity does not decode ({e}): {value}"));
    assert_eq!(token.claims, claims, "{value}");
    assert_eq!(token.x5u, key.x5u());
});
