//! Handshakes in memory between configurations built from `sipsec certs` output: verification,
//! client certificates, resumption on and off, and the configuration errors.

use super::*;
use crate::certs::{self, CertsArgs, KeyKind};
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
        versions: versions.iter().map(|v| v.to_string()).collect(),
        cipher_suites: Vec::new(),
        key_exchange: Vec::new(),
        session_resumption: resumption,
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
    assert!(err.contains("--tls-ca"), "{err}");

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
