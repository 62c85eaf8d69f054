//! Handshakes in memory between configurations built from `sipsec certs` output: verification,
//! client certificates, resumption on and off, and the configuration errors.

use super::*;
use crate::tls::certs::{self, CertsArgs, KeyKind};
use rustls::{ClientConnection, HandshakeKind, ServerConnection};

fn make_certs(dir: &Path, key: KeyKind, new_ca: bool) {
    certs::run(&CertsArgs {
        out: dir.to_path_buf(),
        key,
        names: Vec::new(),
        client_name: "load-1".into(),
        new_ca,
    })
    .unwrap();
}

fn protocol(versions: &[&str], resumption: bool) -> Protocol {
    Protocol {
        backend: Backend::Rustls,
        versions: versions.iter().map(|v| v.to_string()).collect(),
        cipher_suites: Vec::new(),
        key_exchange: Vec::new(),
        session_resumption: resumption,
        noop: Default::default(),
    }
}

fn client_side(dir: &Path, with_cert: bool, p: Protocol) -> ClientSide {
    ClientSide {
        ca: Some(dir.join(certs::CA)),
        no_verify: false,
        identity: with_cert.then(|| (dir.join(certs::CLIENT), dir.join(certs::CLIENT_KEY))),
        protocol: p,
    }
}

fn server_side(dir: &Path, auth: ClientAuth, p: Protocol) -> ServerSide {
    ServerSide {
        cert: dir.join(certs::SERVER),
        key: dir.join(certs::SERVER_KEY),
        ca: Some(dir.join(certs::CA)),
        client_auth: auth,
        protocol: p,
    }
}

/// Moves what `from` has to say into `to`; true when there was something.
fn pump<A, B>(
    from: &mut rustls::ConnectionCommon<A>,
    to: &mut rustls::ConnectionCommon<B>,
) -> Result<bool, rustls::Error> {
    let mut bytes = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut bytes).unwrap();
    }
    let mut rd = &bytes[..];
    while !rd.is_empty() {
        to.read_tls(&mut rd).unwrap();
        to.process_new_packets()?;
    }
    Ok(!bytes.is_empty())
}

/// Moves bytes both ways until neither side has anything to say; the first error wins.
fn handshake(c: &mut ClientConnection, s: &mut ServerConnection) -> Result<(), rustls::Error> {
    while pump(c, s)? | pump(s, c)? {}
    Ok(())
}

fn connect(
    client: &Arc<ClientConfig>,
    server: &Arc<ServerConfig>,
) -> Result<(ClientConnection, ServerConnection), rustls::Error> {
    let name = server_name(None, "127.0.0.1".parse().unwrap()).unwrap();
    let mut c = ClientConnection::new(client.clone(), name).unwrap();
    let mut s = ServerConnection::new(server.clone()).unwrap();
    handshake(&mut c, &mut s)?;
    assert!(!c.is_handshaking() && !s.is_handshaking());
    Ok((c, s))
}

#[test]
fn a_verified_handshake_on_the_address_in_the_certificate() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let client = client_config(&client_side(dir.path(), false, protocol(&[], true))).unwrap();
    let server = server_config(&server_side(
        dir.path(),
        ClientAuth::None,
        protocol(&[], true),
    ))
    .unwrap();
    let (c, _) = connect(&client, &server).unwrap();
    assert_eq!(c.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_3));

    // A name the certificate does not carry is refused.
    let name = server_name(Some("elsewhere.example"), "127.0.0.1".parse().unwrap()).unwrap();
    let mut c = ClientConnection::new(client, name).unwrap();
    let mut s = ServerConnection::new(server).unwrap();
    let err = handshake(&mut c, &mut s).unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    let (ours, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_certs(ours.path(), KeyKind::EcdsaP256, false);
    make_certs(theirs.path(), KeyKind::EcdsaP256, false);
    let client = client_config(&client_side(ours.path(), false, protocol(&[], true))).unwrap();
    let server = server_config(&server_side(
        theirs.path(),
        ClientAuth::None,
        protocol(&[], true),
    ))
    .unwrap();
    let err = connect(&client, &server).unwrap_err();
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
}

#[test]
fn required_client_certificates_are_enforced_and_optional_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let p = || protocol(&[], true);
    let with = client_config(&client_side(dir.path(), true, p())).unwrap();
    let without = client_config(&client_side(dir.path(), false, p())).unwrap();
    let required = server_config(&server_side(dir.path(), ClientAuth::Required, p())).unwrap();
    let optional = server_config(&server_side(dir.path(), ClientAuth::Optional, p())).unwrap();

    let (_, s) = connect(&with, &required).unwrap();
    assert_eq!(s.peer_certificates().map(<[_]>::len), Some(1));
    let err = connect(&without, &required).unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");
    let (_, s) = connect(&without, &optional).unwrap();
    assert!(s.peer_certificates().is_none());
}

#[test]
fn resumption_is_used_when_on_and_not_when_off_for_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    for version in ["1.2", "1.3"] {
        for on in [true, false] {
            let client =
                client_config(&client_side(dir.path(), false, protocol(&[version], on))).unwrap();
            let server = server_config(&server_side(
                dir.path(),
                ClientAuth::None,
                protocol(&[], on),
            ))
            .unwrap();
            let (c, _) = connect(&client, &server).unwrap();
            assert_eq!(c.handshake_kind(), Some(HandshakeKind::Full));
            let (c, _) = connect(&client, &server).unwrap();
            let want = if on {
                HandshakeKind::Resumed
            } else {
                HandshakeKind::Full
            };
            assert_eq!(
                c.handshake_kind(),
                Some(want),
                "TLS {version}, resumption {on}"
            );
        }
    }
}

/// Opens `n` connections whose first flights are all built before any handshake ends, as a
/// client opening a connection per call does when calls come faster than handshakes finish;
/// returns how many resumed.
fn resumed_of_concurrent(
    client: &Arc<ClientConfig>,
    server: &Arc<ServerConfig>,
    n: usize,
) -> usize {
    let name = server_name(None, "127.0.0.1".parse().unwrap()).unwrap();
    let mut pairs: Vec<_> = (0..n)
        .map(|_| {
            let c = ClientConnection::new(client.clone(), name.clone()).unwrap();
            (c, ServerConnection::new(server.clone()).unwrap())
        })
        .collect();
    for (c, s) in &mut pairs {
        handshake(c, s).unwrap();
    }
    pairs
        .iter()
        .filter(|(c, _)| c.handshake_kind() == Some(HandshakeKind::Resumed))
        .count()
}

#[test]
fn a_burst_of_connections_resumes_as_many_as_earlier_bursts_earned_tickets() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let client = client_config(&client_side(dir.path(), false, protocol(&["1.3"], true))).unwrap();
    let server = server_config(&server_side(
        dir.path(),
        ClientAuth::None,
        protocol(&[], true),
    ))
    .unwrap();
    // Nothing to resume yet: 40 full handshakes, each earning one ticket.
    assert_eq!(resumed_of_concurrent(&client, &server, 40), 0);
    // rustls's own store keeps 8 tickets per server, so 32 of these would be full.
    assert_eq!(resumed_of_concurrent(&client, &server, 40), 40);
    // Each resumed connection earned its ticket back.
    assert_eq!(resumed_of_concurrent(&client, &server, 40), 40);
}

#[test]
fn the_ticket_pool_is_bounded_per_server_and_in_servers() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let store = Arc::new(tickets::TicketStore::new(1));
    let server = server_config(&server_side(
        dir.path(),
        ClientAuth::None,
        protocol(&[], true),
    ))
    .unwrap();
    let mut cfg = (*client_config(&client_side(dir.path(), false, protocol(&["1.3"], true)))
        .unwrap())
    .clone();
    cfg.resumption = Resumption::store(store.clone());
    let client = Arc::new(cfg);
    let extra = 5;
    resumed_of_concurrent(&client, &server, tickets::TICKETS_PER_SERVER + extra);
    // Only the pool's depth is kept; the rest were dropped.
    assert_eq!(
        resumed_of_concurrent(&client, &server, tickets::TICKETS_PER_SERVER + extra),
        tickets::TICKETS_PER_SERVER
    );
    // A store for one server's tickets forgets the first server when a second one comes.
    let other = server_name(Some("localhost"), "127.0.0.1".parse().unwrap()).unwrap();
    let mut c = ClientConnection::new(client.clone(), other).unwrap();
    let mut s = ServerConnection::new(server.clone()).unwrap();
    handshake(&mut c, &mut s).unwrap();
    assert_eq!(resumed_of_concurrent(&client, &server, 1), 0);
}

#[test]
fn rsa_certificates_and_a_chosen_suite_work() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::Rsa2048, false);
    let mut p = protocol(&["1.2"], false);
    p.cipher_suites = vec!["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()];
    let client = client_config(&client_side(dir.path(), true, p.clone())).unwrap();
    let server = server_config(&server_side(dir.path(), ClientAuth::Required, p)).unwrap();
    let (c, _) = connect(&client, &server).unwrap();
    assert_eq!(
        c.negotiated_cipher_suite().map(|s| s.suite()),
        Some(rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)
    );
}

#[test]
fn a_reused_ca_still_trusts_the_certificates_made_before() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let old_client = tempfile::tempdir().unwrap();
    for f in [certs::CLIENT, certs::CLIENT_KEY, certs::CA] {
        std::fs::copy(dir.path().join(f), old_client.path().join(f)).unwrap();
    }
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let client = client_config(&client_side(old_client.path(), true, protocol(&[], true))).unwrap();
    let server = server_config(&server_side(
        dir.path(),
        ClientAuth::Required,
        protocol(&[], true),
    ))
    .unwrap();
    connect(&client, &server).unwrap();
}

#[test]
fn configuration_errors_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let mut side = client_side(dir.path(), false, protocol(&[], true));
    side.ca = None;
    let err = client_config(&side).unwrap_err().to_string();
    assert!(err.contains("needs a CA"), "{err}");

    let err = client_config(&client_side(dir.path(), false, protocol(&["1.1"], true)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown TLS version"), "{err}");

    let mut p = protocol(&[], true);
    p.cipher_suites = vec!["TLS_RSA_WITH_3DES_EDE_CBC_SHA".into()];
    let err = format!(
        "{:#}",
        client_config(&client_side(dir.path(), false, p)).unwrap_err()
    );
    assert!(err.contains("unknown cipher suite") && err.contains("TLS13_AES_128_GCM_SHA256"));

    let mut p = protocol(&[], true);
    p.key_exchange = vec!["ffdhe9999".into()];
    let err = format!(
        "{:#}",
        client_config(&client_side(dir.path(), false, p)).unwrap_err()
    );
    assert!(
        err.contains("unknown key exchange") && err.contains("X25519"),
        "{err}"
    );

    let mut s = server_side(dir.path(), ClientAuth::Required, protocol(&[], true));
    s.ca = None;
    let err = server_config(&s).unwrap_err().to_string();
    assert!(err.contains("needs a CA"), "{err}");

    let mut s = server_side(dir.path(), ClientAuth::None, protocol(&[], true));
    s.key = dir.path().join(certs::CLIENT_KEY);
    let err = format!("{:#}", server_config(&s).unwrap_err());
    assert!(err.contains("does not match"), "{err}");

    let missing = dir.path().join("nope.pem");
    let err = format!("{:#}", load_certs(&missing).unwrap_err());
    assert!(err.contains("nope.pem"), "{err}");
}

#[test]
fn the_chosen_key_exchange_group_is_the_one_negotiated() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    for group in ["secp256r1", "X25519"] {
        let mut p = protocol(&[], false);
        p.key_exchange = vec![group.into()];
        let client = client_config(&client_side(dir.path(), false, p.clone())).unwrap();
        let server = server_config(&server_side(dir.path(), ClientAuth::None, p)).unwrap();
        let (c, _) = connect(&client, &server).unwrap();
        let got = c
            .negotiated_key_exchange_group()
            .map(|g| format!("{:?}", g.name()));
        assert_eq!(got.as_deref(), Some(group));
    }
}

#[test]
fn by_default_the_server_chooses_aes_128_gcm_whatever_the_client_prefers() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let server = server_config(&server_side(
        dir.path(),
        ClientAuth::None,
        protocol(&[], false),
    ));
    for (versions, sha384_first, chosen) in [
        (
            &["1.3"][..],
            "TLS13_AES_256_GCM_SHA384",
            "TLS13_AES_128_GCM_SHA256",
        ),
        (
            &["1.2"][..],
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        ),
    ] {
        // A client like OpenSSL's defaults: SHA-384 first.
        let mut p = protocol(versions, false);
        p.cipher_suites = vec![sha384_first.into(), chosen.into()];
        let client = client_config(&client_side(dir.path(), false, p)).unwrap();
        let (c, _) = connect(&client, server.as_ref().unwrap()).unwrap();
        let got = c
            .negotiated_cipher_suite()
            .map(|s| format!("{:?}", s.suite()));
        assert_eq!(got.as_deref(), Some(chosen));
    }
}

/// Moves `from`'s bytes into `to` through the backend-neutral [`Session`]; true when there were
/// some.
fn pump_sessions(from: &mut Session, to: &mut Session, plain: &mut Vec<u8>) -> Result<bool, Error> {
    let mut bytes = Vec::new();
    while from.wants_write() {
        from.write_to(&mut bytes).unwrap();
    }
    if !bytes.is_empty() {
        to.receive(&bytes, plain)?;
    }
    Ok(!bytes.is_empty())
}

/// A client and a server session after their handshake, by the [`Session`] API the
/// connection loop uses.
fn session_pair(client: &ClientTls, server: &ServerTls) -> Result<(Session, Session), Error> {
    let name = server_name(None, "127.0.0.1".parse().unwrap()).unwrap();
    let mut c = client.connect(name)?;
    let mut s = server.accept()?;
    let mut plain = Vec::new();
    while pump_sessions(&mut c, &mut s, &mut plain)? | pump_sessions(&mut s, &mut c, &mut plain)? {}
    assert!(plain.is_empty());
    assert!(!c.is_handshaking() && !s.is_handshaking());
    Ok((c, s))
}

/// Plaintext sent each way arrives whole.
fn exchange(c: &mut Session, s: &mut Session) {
    let (mut at_server, mut at_client) = (Vec::new(), Vec::new());
    c.send(b"INVITE sip:b@example.com SIP/2.0\r\n");
    pump_sessions(c, s, &mut at_server).unwrap();
    s.send(b"SIP/2.0 200 OK\r\n");
    pump_sessions(s, c, &mut at_client).unwrap();
    assert_eq!(at_server, b"INVITE sip:b@example.com SIP/2.0\r\n");
    assert_eq!(at_client, b"SIP/2.0 200 OK\r\n");
}

#[test]
fn sessions_carry_plaintext_and_report_resumption() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let client = client(&client_side(dir.path(), false, protocol(&["1.2"], true))).unwrap();
    let server = server(&server_side(
        dir.path(),
        ClientAuth::None,
        protocol(&["1.2"], true),
    ))
    .unwrap();
    let (mut c, mut s) = session_pair(&client, &server).unwrap();
    assert_eq!(c.handshake_kind(), Some(HandshakeKind::Full));
    assert!(s.is_server() && !c.is_server());
    assert_eq!(
        c.cipher_suite().as_deref(),
        Some("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")
    );
    exchange(&mut c, &mut s);
    // Plaintext queued during the handshake goes out once it is over.
    let name = server_name(None, "127.0.0.1".parse().unwrap()).unwrap();
    let mut c = client.connect(name).unwrap();
    c.send(b"early");
    let mut s = server.accept().unwrap();
    let mut plain = Vec::new();
    while pump_sessions(&mut c, &mut s, &mut plain).unwrap()
        | pump_sessions(&mut s, &mut c, &mut Vec::new()).unwrap()
    {}
    assert_eq!(plain, b"early");
    assert_eq!(c.handshake_kind(), Some(HandshakeKind::Resumed));
    // close_notify reads as the end of the session.
    c.close_notify();
    let mut bytes = Vec::new();
    c.write_to(&mut bytes).unwrap();
    assert_eq!(s.receive(&bytes, &mut plain).unwrap(), Received::Closed);
    // Garbage is an error, not a panic.
    let mut s = server.accept().unwrap();
    assert!(s.receive(b"GET / HTTP/1.1\r\n\r\n", &mut plain).is_err());
}

#[cfg(not(feature = "openssl"))]
#[test]
fn the_openssl_backend_says_how_to_build_it() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let mut p = protocol(&[], true);
    p.backend = Backend::Openssl;
    let err = server(&server_side(dir.path(), ClientAuth::None, p))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("--features openssl"), "{err}");
}

/// Seed 000's suite: RSA key exchange, AES-128-CBC, HMAC-SHA1.
#[cfg(feature = "openssl")]
fn seed_suite(resumption: bool) -> Protocol {
    Protocol {
        backend: Backend::Openssl,
        versions: vec!["1.2".into()],
        cipher_suites: vec!["TLS_RSA_WITH_AES_128_CBC_SHA".into()],
        key_exchange: Vec::new(),
        session_resumption: resumption,
        noop: Default::default(),
    }
}

#[cfg(feature = "openssl")]
#[test]
fn openssl_negotiates_the_seed_suite_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::Rsa2048, true);
    let client = client(&client_side(dir.path(), false, seed_suite(true))).unwrap();
    let server = server(&server_side(dir.path(), ClientAuth::None, seed_suite(true))).unwrap();
    let (mut c, mut s) = session_pair(&client, &server).unwrap();
    assert_eq!(
        c.cipher_suite().as_deref(),
        Some("TLS_RSA_WITH_AES_128_CBC_SHA")
    );
    assert_eq!(
        s.cipher_suite().as_deref(),
        Some("TLS_RSA_WITH_AES_128_CBC_SHA")
    );
    assert_eq!(c.handshake_kind(), Some(HandshakeKind::Full));
    exchange(&mut c, &mut s);
    let (c, s) = session_pair(&client, &server).unwrap();
    assert_eq!(c.handshake_kind(), Some(HandshakeKind::Resumed));
    assert_eq!(s.handshake_kind(), Some(HandshakeKind::Resumed));

    // Resumption off on either side: every handshake is full.
    let fresh = super::client(&client_side(dir.path(), false, seed_suite(false))).unwrap();
    for _ in 0..2 {
        let (c, _) = session_pair(&fresh, &server).unwrap();
        assert_eq!(c.handshake_kind(), Some(HandshakeKind::Full));
    }
}

#[cfg(feature = "openssl")]
#[test]
fn openssl_checks_certificates_both_ways() {
    let (ours, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_certs(ours.path(), KeyKind::Rsa2048, true);
    make_certs(theirs.path(), KeyKind::Rsa2048, true);
    let server = server(&server_side(
        ours.path(),
        ClientAuth::Required,
        seed_suite(true),
    ))
    .unwrap();
    // Mutual authentication succeeds with our CA's client certificate ...
    let good = client(&client_side(ours.path(), true, seed_suite(true))).unwrap();
    session_pair(&good, &server).unwrap();
    // ... and fails without one, or with a server the client's CA did not sign.
    let anonymous = client(&client_side(ours.path(), false, seed_suite(true))).unwrap();
    assert!(session_pair(&anonymous, &server).is_err());
    let stranger = client(&client_side(theirs.path(), true, seed_suite(true))).unwrap();
    let err = session_pair(&stranger, &server).err().unwrap();
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[cfg(feature = "openssl")]
#[test]
fn openssl_and_rustls_interoperate_on_modern_suites() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, true);
    let mut ossl = protocol(&[], true);
    ossl.backend = Backend::Openssl;
    let client = client(&client_side(dir.path(), true, ossl.clone())).unwrap();
    let server = server(&server_side(
        dir.path(),
        ClientAuth::Required,
        protocol(&[], true),
    ))
    .unwrap();
    let (mut c, mut s) = session_pair(&client, &server).unwrap();
    assert_eq!(c.cipher_suite(), s.cipher_suite());
    exchange(&mut c, &mut s);
    let client = super::client(&client_side(dir.path(), false, protocol(&[], true))).unwrap();
    let server = super::server(&server_side(dir.path(), ClientAuth::None, ossl)).unwrap();
    let (mut c, mut s) = session_pair(&client, &server).unwrap();
    exchange(&mut c, &mut s);
}

#[cfg(feature = "openssl")]
#[test]
fn openssl_cannot_negotiate_3des() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::Rsa2048, true);
    let mut p = seed_suite(true);
    p.cipher_suites = vec!["TLS_RSA_WITH_3DES_EDE_CBC_SHA".into()];
    // Refused when configured, or at the handshake: either way, with a reason.
    let refused = server(&server_side(dir.path(), ClientAuth::None, p.clone()))
        .err()
        .map(|e| format!("{e:#}"))
        .or_else(|| {
            let server = server(&server_side(dir.path(), ClientAuth::None, p.clone())).ok()?;
            let client = client(&client_side(dir.path(), false, p)).ok()?;
            session_pair(&client, &server).err().map(|e| e.to_string())
        });
    let why = refused.expect("3DES was negotiated");
    assert!(why.contains("cipher") || why.contains("DES"), "{why}");
}

#[test]
fn a_backlog_beyond_rustls_default_buffer_is_kept_whole() {
    // A peer that reads slowly lets output pile up; rustls's default 64 KiB cap would cut
    // messages short and corrupt the stream.
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let client = client(&client_side(dir.path(), false, protocol(&[], true))).unwrap();
    let server = server(&server_side(
        dir.path(),
        ClientAuth::None,
        protocol(&[], true),
    ))
    .unwrap();
    let (mut c, mut s) = session_pair(&client, &server).unwrap();
    let message = |i: usize| format!("MESSAGE {i:06} {}\r\n", "x".repeat(1000));
    let mut sent = Vec::new();
    for i in 0..300 {
        c.send(message(i).as_bytes());
        sent.extend_from_slice(message(i).as_bytes());
    }
    let mut received = Vec::new();
    pump_sessions(&mut c, &mut s, &mut received).unwrap();
    assert_eq!(received.len(), sent.len());
    assert!(received == sent);
}

/// Seed 002's ablation (lab builds only): with each stage no-op on both ends the handshake
/// completes, mutual certificates included, and data flows; a no-op end cannot talk to a
/// real one, so the stage really was replaced (and plaintext is visible on the wire once
/// records are).
#[cfg(feature = "lab-noop")]
#[test]
fn no_op_stages_work_end_to_end_and_only_with_each_other() {
    use crate::ablation::Stages;
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), KeyKind::EcdsaP256, false);
    let with = |s: &str| Protocol {
        noop: Stages::parse(s).unwrap(),
        ..protocol(&[], false)
    };
    for stage in ["kx", "sign", "aead", "tls"] {
        let client = client_config(&client_side(dir.path(), true, with(stage))).unwrap();
        let server =
            server_config(&server_side(dir.path(), ClientAuth::Required, with(stage))).unwrap();
        let (mut c, mut s) = connect(&client, &server).unwrap_or_else(|e| panic!("{stage}: {e}"));
        c.writer().write_all(b"INVITE sip:secret").unwrap();
        let mut wire = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut wire).unwrap();
        }
        let plain = wire.windows(6).any(|w| w == b"secret");
        assert_eq!(plain, stage == "aead" || stage == "tls", "{stage}");
        s.read_tls(&mut &wire[..]).unwrap();
        s.process_new_packets().unwrap();
        let mut got = String::new();
        let _ = s.reader().read_to_string(&mut got);
        assert_eq!(got, "INVITE sip:secret", "{stage}");

        // Against a real server (which checks the client's signature too), the no-op end
        // fails the handshake.
        let real = server_config(&server_side(dir.path(), ClientAuth::Required, with(""))).unwrap();
        assert!(
            connect(&client, &real).is_err(),
            "{stage} against a real server"
        );
    }
}
