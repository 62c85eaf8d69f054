//! STIR/SHAKEN's authentication service in simulated time (see `engine::identity`): an
//! initial INVITE the gate vouched for leaves with an Identity header that verifies against
//! the signing certificate; one naming no number, or already signed, is left alone.

use super::*;
use sipsec_identity::{cert, header, sti, Attest, Roots, Signer, SigningKey};
use std::sync::atomic::Ordering;

const X5U: &str = "https://cert.example.test/shaken.pem";

/// An engine signing with a fresh test certificate, Bob's number registered at BOB1; and the
/// certificate, checked, to verify with.
fn signing_engine() -> (Engine, Signer) {
    let dir = tempfile::tempdir().unwrap();
    sti::make(dir.path(), &cert::Authority::Codes(vec!["1234".into()])).unwrap();
    let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
    let mut e = engine(&format!(
        "[identity]\nsign = true\nkey = \"unused.pem\"\nx5u = \"{X5U}\"\n"
    ));
    let key = SigningKey::from_pem(&read(sti::SHAKEN_KEY), X5U).unwrap();
    e.enable_identity(Arc::new(key), "origin-1".into());
    preload_binding(
        &mut e,
        "15557654321@example.test",
        &format!("sip:15557654321@{BOB1}"),
        BOB1,
    );
    let roots = Roots::from_pem(&read(sti::STI_CA)).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let signer = Signer::from_pem(&read(sti::SHAKEN_CERT), &roots, now).unwrap();
    (e, signer)
}

fn invite(from: &str, branch: &str, extra: &str) -> String {
    format!(
        "INVITE sip:15557654321@example.test SIP/2.0\r\nVia: SIP/2.0/UDP {ALICE};branch={branch}\r\n\
         Max-Forwards: 70\r\nFrom: <{from}>;tag=a1\r\nTo: <sip:15557654321@example.test>\r\n\
         Call-ID: call-{branch}\r\nCSeq: 1 INVITE\r\nContact: <sip:alice@{ALICE}>\r\n{extra}\
         Content-Length: 0\r\n\r\n"
    )
}

fn forwarded(sent: &[Sent]) -> &Sent {
    sent.iter()
        .find(|s| s.status().is_none() && s.to == addr(BOB1))
        .expect("the INVITE was forwarded to Bob")
}

#[test]
fn a_vouched_invite_leaves_signed_for_its_numbers() {
    let (mut e, signer) = signing_engine();
    let from = "sip:+1-555-123-4567@example.test;user=phone";
    let (sent, _) = deliver(&mut e, 0, ALICE, &invite(from, "z9hG4bKs1", ""));
    let out = forwarded(&sent);
    let msg = out.msg();
    let value = std::str::from_utf8(msg.other_header(b"Identity").unwrap()).unwrap();
    let token = header::decode(value).unwrap();
    signer.verify(&token).unwrap();
    assert_eq!(token.claims.orig, "15551234567");
    assert_eq!(token.claims.dest, ["15557654321"]);
    assert_eq!(token.x5u, X5U);
    assert_eq!(token.claims.origid, "origin-1");
    // Authentication is off here: every caller is vouched for by configuration, so the
    // attestation is `attest_trusted`'s (C: we only know where the call entered).
    assert_eq!(token.claims.attest, Attest::C);
    // The engine's clock started at Unix time 1,000,000 ms.
    assert_eq!(token.claims.iat, 1_000);
    assert_eq!(e.stats.identity_signed.load(Ordering::Relaxed), 1);
}

#[test]
fn p_asserted_identity_names_the_caller_when_present() {
    let (mut e, signer) = signing_engine();
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &invite(
            "sip:alice@example.test",
            "z9hG4bKs2",
            "P-Asserted-Identity: \"Alice\" <sip:alice@example.test>, <tel:+15550001111>\r\n",
        ),
    );
    let msg = forwarded(&sent).msg();
    let token =
        header::decode(std::str::from_utf8(msg.other_header(b"Identity").unwrap()).unwrap())
            .unwrap();
    signer.verify(&token).unwrap();
    assert_eq!(token.claims.orig, "15550001111");
}

#[test]
fn no_number_or_an_identity_already_means_no_signature() {
    let (mut e, _) = signing_engine();
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &invite("sip:alice@example.test", "z9hG4bKs3", ""),
    );
    assert!(forwarded(&sent).msg().other_header(b"Identity").is_none());
    assert_eq!(e.stats.identity_unsigned.load(Ordering::Relaxed), 1);
    let theirs = "Identity: a.b.c;info=<https://other.example/c.pem>\r\n";
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &invite("sip:+15551234567@example.test", "z9hG4bKs4", theirs),
    );
    let out = forwarded(&sent);
    let msg = out.msg();
    let identities: Vec<_> = msg
        .headers()
        .iter()
        .filter(|h| msg.value(h).starts_with(b"a.b.c"))
        .collect();
    assert_eq!(identities.len(), 1, "{}", out.text);
    assert!(!out.text.contains("origin-1"));
    assert_eq!(e.stats.identity_signed.load(Ordering::Relaxed), 0);
}

#[test]
fn other_methods_are_not_signed() {
    let (mut e, _) = signing_engine();
    let text = invite("sip:+15551234567@example.test", "z9hG4bKs5", "")
        .replace("INVITE sip", "MESSAGE sip")
        .replace("1 INVITE", "1 MESSAGE");
    let (sent, _) = deliver(&mut e, 0, ALICE, &text);
    assert!(forwarded(&sent).msg().other_header(b"Identity").is_none());
}
