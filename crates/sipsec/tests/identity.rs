//! STIR/SHAKEN tokens cross-checked with an independent implementation, `secsipidx` (Debian;
//! the Go library behind Kamailio's `secsipid` module): it verifies the Identity headers
//! sipsec signs, and sipsec verifies the ones it signs, both with the STI-CA and signing
//! certificate `sipsec certs --shaken` makes — and the INVITE a signing `sipsec serve`
//! forwards verifies there. Kamailio's `secsipid` module (the same library inside a SIP
//! server, `peers/kamailio/proxy.cfg` with `SHAKEN_SIGN`/`SHAKEN_VERIFY`) is the peer on the
//! wire both ways: it verifies the calls a signing sipsec forwards, and sipsec verifies the
//! calls it signs. Under CI a missing `secsipidx` or Kamailio module is a failure.

mod common;

use common::{have_kamailio, have_tool, load, n, ports, Endpoint, Kamailio, Server};
use sipsec_identity::{cert, header, passport, sti, Attest, Claims, Roots, Signer, SigningKey};
use std::path::Path;
use std::process::Command;

fn have_secsipidx() -> bool {
    have_tool("secsipidx", "-version", "secsipidx")
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `sipsec certs --shaken` into `dir`, as a newcomer would run it.
fn make_certs(dir: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args(["certs", "--shaken", "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("STIR/SHAKEN signing certificate"), "{said}");
}

/// `secsipidx -check` of an Identity value, with the signing certificate's key and a
/// 60-second freshness window: whether it says the value verifies.
fn secsipidx_accepts(value: &str, cert: &Path) -> bool {
    let out = Command::new("secsipidx")
        .args(["-check", "-expire", "60", "-identity", value, "-p"])
        .arg(cert)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    out.status.success() && said.trim() == "ok"
}

const X5U: &str = "https://cert.example.net/shaken.pem";

#[test]
fn secsipidx_verifies_what_sipsec_signs() {
    if !have_secsipidx() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let key = SigningKey::from_pem(
        &std::fs::read(dir.path().join(sti::SHAKEN_KEY)).unwrap(),
        X5U,
    )
    .unwrap();
    let claims = Claims {
        attest: Attest::A,
        orig: "15551234567".into(),
        dest: vec!["15557654321".into()],
        iat: now(),
        origid: passport::new_origid(),
    };
    let value = header::value(&key, &claims);
    let cert = dir.path().join(sti::SHAKEN_CERT);
    assert!(
        secsipidx_accepts(&value, &cert),
        "secsipidx refused {value}"
    );
    // The control: the same value with another caller in its claims, signature kept, fails
    // there as here — so the acceptance above says something.
    let token = value.split(';').next().unwrap();
    let mut parts: Vec<&str> = token.split('.').collect();
    let other = {
        let t = passport::Token::decode(token).unwrap();
        let mut forged = t.claims.clone();
        forged.orig = "15550000000".into();
        key.sign(&forged)
    };
    let forged_payload = other.split('.').nth(1).unwrap().to_string();
    parts[1] = &forged_payload;
    let forged = format!("{};info=<{X5U}>;alg=ES256;ppt=shaken", parts.join("."));
    assert!(!secsipidx_accepts(&forged, &cert));
    // A stale token is refused there too (its freshness check against ours).
    let stale = header::value(
        &key,
        &Claims {
            iat: now() - 120,
            ..claims
        },
    );
    assert!(!secsipidx_accepts(&stale, &cert));
}

#[test]
fn sipsec_verifies_what_secsipidx_signs() {
    if !have_secsipidx() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let out = Command::new("secsipidx")
        .args([
            "-sign-full",
            "-orig-tn",
            "12155551212",
            "-dest-tn",
            "12155551213",
            "-attest",
            "B",
            "-orig-id",
            "123e4567-e89b-12d3-a456-426655440000",
            "-x5u",
            X5U,
            "-k",
        ])
        .arg(dir.path().join(sti::SHAKEN_KEY))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "secsipidx could not sign with sipsec's key: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value = String::from_utf8(out.stdout).unwrap();
    let value = value.trim();
    let token = header::decode(value).unwrap();
    assert_eq!(token.claims.attest, Attest::B);
    assert_eq!(token.claims.orig, "12155551212");
    assert_eq!(token.claims.dest, ["12155551213"]);
    assert_eq!(token.x5u, X5U);
    token.check_fresh(now(), 60).unwrap();
    token
        .check_numbers(Some("12155551212"), Some("12155551213"))
        .unwrap();
    let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
    let roots = Roots::from_pem(&read(sti::STI_CA)).unwrap();
    let signer = Signer::from_pem(&read(sti::SHAKEN_CERT), &roots, now()).unwrap();
    assert_eq!(
        signer.authority(),
        &cert::Authority::Codes(vec!["1234".into()])
    );
    signer.verify(&token).unwrap();
    // And a certificate from another STI-CA does not vouch for it.
    let other = tempfile::tempdir().unwrap();
    make_certs(other.path());
    let other_roots =
        Roots::from_pem(&std::fs::read(other.path().join(sti::STI_CA)).unwrap()).unwrap();
    assert!(Signer::from_pem(&read(sti::SHAKEN_CERT), &other_roots, now()).is_err());
    let other_signer = Signer::from_pem(
        &std::fs::read(other.path().join(sti::SHAKEN_CERT)).unwrap(),
        &other_roots,
        now(),
    )
    .unwrap();
    assert!(other_signer.verify(&token).is_err());
}

#[test]
fn a_call_through_a_signing_proxy_verifies_in_secsipidx() {
    if !have_secsipidx() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let port = ports(30600);
    let uas = Endpoint::bind("127.0.0.1:0");
    let caller = Endpoint::bind("127.0.0.1:0");
    // The key path is relative: the config file's directory.
    let config = format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\ndomains = [\"example.test\"]\nworkers = 2\n\
         [routing]\ndefault_route = \"sip:{}\"\n[database]\nurl = \"sqlite://{}\"\n\
         [identity]\nsign = true\nkey = \"{}\"\nx5u = \"{X5U}\"\n",
        uas.addr,
        dir.path().join("s.db").display(),
        sti::SHAKEN_KEY
    );
    let server = Server::start(dir.path(), &config);
    caller.send(
        &format!("127.0.0.1:{port}"),
        &format!(
            "INVITE sip:+15557654321@elsewhere.test;user=phone SIP/2.0\r\n\
             Via: SIP/2.0/UDP {};branch=z9hG4bKid1\r\nMax-Forwards: 70\r\n\
             From: <sip:+15551234567@example.test;user=phone>;tag=1\r\n\
             To: <sip:+15557654321@elsewhere.test;user=phone>\r\nCall-ID: id1\r\n\
             CSeq: 1 INVITE\r\nContact: <sip:a@{}>\r\nContent-Length: 0\r\n\r\n",
            caller.addr, caller.addr
        ),
    );
    let forwarded = uas.recv();
    let value = forwarded
        .lines()
        .find_map(|l| l.strip_prefix("Identity: "))
        .unwrap_or_else(|| panic!("no Identity in {forwarded}"));
    assert!(
        secsipidx_accepts(value, &dir.path().join(sti::SHAKEN_CERT)),
        "secsipidx refused {value}"
    );
    let token = header::decode(value).unwrap();
    assert_eq!(
        (token.claims.orig.as_str(), token.claims.dest.as_slice()),
        ("15551234567", &["15557654321".to_string()][..])
    );
    server.stop();
}

/// A small HTTPS server for the verification tests, on 127.0.0.1 with `sipsec certs`'
/// server certificate: `/shaken.pem` serves the signing certificate (counting its fetches),
/// `/other.pem` one from another STI-CA, and the hostile paths misbehave as their names say —
/// `/silent` never answers, `/forever` streams a body that never ends, `/huge` announces and
/// sends 50 MB, `/moved` redirects to `/shaken.pem`.
struct CertServer {
    port: u16,
    fetches: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CertServer {
    fn start(dir: &Path, other_cert: Vec<u8>) -> CertServer {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain: Vec<_> = CertificateDer::pem_file_iter(dir.join("server.pem"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(dir.join("server-key.pem")).unwrap();
        let config = std::sync::Arc::new(
            rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::aws_lc_rs::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let fetches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let shaken = std::sync::Arc::new(std::fs::read(dir.join(sti::SHAKEN_CERT)).unwrap());
        let other = std::sync::Arc::new(other_cert);
        let counter = fetches.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let (config, shaken, other, counter) = (
                    config.clone(),
                    shaken.clone(),
                    other.clone(),
                    counter.clone(),
                );
                std::thread::spawn(move || {
                    let _ = serve_one(tcp, config, &shaken, &other, &counter);
                });
            }
        });
        CertServer { port, fetches }
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    fn fetches(&self) -> usize {
        self.fetches.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn serve_one(
    tcp: std::net::TcpStream,
    config: std::sync::Arc<rustls::ServerConfig>,
    shaken: &[u8],
    other: &[u8],
    fetches: &std::sync::atomic::AtomicUsize,
) -> std::io::Result<()> {
    use std::io::{Read, Write};
    let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        if tls.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let target = head.split(' ').nth(1).unwrap_or("/");
    let path = target.split('?').next().unwrap_or("/").to_string();
    let ok = |body: &[u8], extra: &str| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/pem-certificate-chain\r\n{extra}\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
    };
    match path.as_str() {
        "/shaken.pem" => {
            fetches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tls.write_all(ok(shaken, "Cache-Control: max-age=600\r\n").as_bytes())?;
            tls.write_all(shaken)?;
        }
        "/other.pem" => {
            tls.write_all(ok(other, "").as_bytes())?;
            tls.write_all(other)?;
        }
        "/silent" => std::thread::sleep(std::time::Duration::from_secs(30)),
        "/forever" => {
            tls.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")?;
            loop {
                tls.write_all(b"400\r\n")?;
                tls.write_all(&[b'A'; 1024])?;
                tls.write_all(b"\r\n")?;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        "/huge" => {
            tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 52428800\r\n\r\n")?;
            let chunk = vec![b'-'; 65536];
            for _ in 0..800 {
                tls.write_all(&chunk)?;
            }
        }
        "/moved" => {
            tls.write_all(
                b"HTTP/1.1 302 Found\r\nLocation: /shaken.pem\r\nContent-Length: 0\r\n\r\n",
            )?;
        }
        _ => tls.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?,
    }
    tls.flush()?;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}

/// An INVITE from +1 555 123 4567 to +1 555 765 4321 with `identity` (if any) and `from`.
fn signed_invite(caller: &Endpoint, call: &str, from_user: &str, identity: Option<&str>) -> String {
    format!(
        "INVITE sip:+15557654321@elsewhere.test;user=phone SIP/2.0\r\n\
         Via: SIP/2.0/UDP {};branch=z9hG4bK{call}\r\nMax-Forwards: 70\r\n\
         From: <sip:{from_user}@example.test;user=phone>;tag=1\r\n\
         To: <sip:+15557654321@elsewhere.test;user=phone>\r\nCall-ID: {call}\r\n\
         CSeq: 1 INVITE\r\nContact: <sip:a@{}>\r\n{}Content-Length: 0\r\n\r\n",
        caller.addr,
        caller.addr,
        identity.map_or(String::new(), |i| format!("Identity: {i}\r\n"))
    )
}

/// The final response to `call` (after any 100 Trying), within 3 s of each datagram.
fn final_response(caller: &Endpoint, call: &str) -> String {
    loop {
        let m = caller.recv();
        if !m.starts_with("SIP/2.0 100") && m.contains(&format!("Call-ID: {call}\r\n")) {
            return m;
        }
    }
}

/// The INVITE of `call` as the callee got it (the proxy retransmits earlier ones, which
/// nobody answers here).
fn forwarded(uas: &Endpoint, call: &str) -> String {
    loop {
        let m = uas.recv();
        if m.contains(&format!("Call-ID: {call}\r\n")) {
            return m;
        }
    }
}

fn verifying_server(dir: &Path, uas: &Endpoint, port: u16, policy: &str) -> Server {
    let config = format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\ndomains = [\"example.test\"]\nworkers = 2\n\
         [routing]\ndefault_route = \"sip:{}\"\n[database]\nurl = \"sqlite://{}\"\n\
         [identity]\nverify = true\nroots = \"{}\"\nfetch_allow = [\"127.0.0.1\"]\n\
         fetch_ca = \"ca.pem\"\nfetch_timeout_ms = 1000\npolicy = \"{policy}\"\n",
        uas.addr,
        dir.join(format!("{policy}.db")).display(),
        sti::STI_CA
    );
    std::fs::write(dir.join(format!("{policy}.toml")), &config).unwrap();
    Server::spawn(
        dir,
        &[
            "serve",
            "--config",
            dir.join(format!("{policy}.toml")).to_str().unwrap(),
        ],
    )
}

#[test]
fn a_verifying_proxy_passes_good_calls_and_refuses_every_hostile_one() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let other = tempfile::tempdir().unwrap();
    make_certs(other.path());
    let certs = CertServer::start(
        dir.path(),
        std::fs::read(other.path().join(sti::SHAKEN_CERT)).unwrap(),
    );
    let key_pem = std::fs::read(dir.path().join(sti::SHAKEN_KEY)).unwrap();
    let key_at = |path: &str| SigningKey::from_pem(&key_pem, &certs.url(path)).unwrap();
    let claims = |iat: u64| Claims {
        attest: Attest::A,
        orig: "15551234567".into(),
        dest: vec!["15557654321".into()],
        iat,
        origid: passport::new_origid(),
    };
    let port = ports(30700);
    let uas = Endpoint::bind("127.0.0.1:0");
    let caller = Endpoint::bind("127.0.0.1:0");
    let proxy = format!("127.0.0.1:{port}");
    let server = verifying_server(dir.path(), &uas, port, "reject");
    let good = key_at("/shaken.pem");

    // A good call passes, marked; the next one too, from the cache.
    for call in ["good-1", "good-2"] {
        let value = header::value(&good, &claims(now()));
        caller.send(
            &proxy,
            &signed_invite(&caller, call, "+15551234567", Some(&value)),
        );
        let forwarded = forwarded(&uas, call);
        assert!(
            forwarded.contains(
                "From: <sip:+15551234567;verstat=TN-Validation-Passed@example.test;user=phone>"
            ),
            "{forwarded}"
        );
    }
    assert_eq!(
        certs.fetches(),
        1,
        "the certificate was fetched once and cached"
    );

    // Each hostile case is answered as RFC 8224 says, and nothing hangs.
    let replayed = header::value(&good, &claims(now()));
    caller.send(
        &proxy,
        &signed_invite(&caller, "replay-1", "+15551234567", Some(&replayed)),
    );
    forwarded(&uas, "replay-1");
    let cases: Vec<(&str, String, &str, &str)> = vec![
        ("replay-2", replayed.clone(), "+15551234567", "SIP/2.0 438"),
        (
            "stale",
            header::value(&good, &claims(now() - 120)),
            "+15551234567",
            "SIP/2.0 403 Stale Date",
        ),
        (
            "future",
            header::value(&good, &claims(now() + 120)),
            "+15551234567",
            "SIP/2.0 403 Stale Date",
        ),
        (
            "spoofed-from",
            header::value(&good, &claims(now())),
            "+15550000000",
            "SIP/2.0 438",
        ),
        (
            "alg-none",
            {
                let v = header::value(&good, &claims(now()));
                let (_, rest) = v.split_once('.').unwrap();
                let none = base64_url(
                    r#"{"alg":"none","ppt":"shaken","typ":"passport","x5u":"https://127.0.0.1/x"}"#,
                );
                format!("{none}.{rest}")
            },
            "+15551234567",
            "SIP/2.0 438",
        ),
        (
            "garbage",
            "not.a.token;info=<https://127.0.0.1/x>".into(),
            "+15551234567",
            "SIP/2.0 438",
        ),
        (
            "loopback-name",
            header::value(
                &SigningKey::from_pem(
                    &key_pem,
                    &format!("https://localhost:{}/shaken.pem", certs.port),
                )
                .unwrap(),
                &claims(now()),
            ),
            "+15551234567",
            "SIP/2.0 436",
        ),
        (
            "other-address",
            header::value(
                &SigningKey::from_pem(
                    &key_pem,
                    &format!("https://127.0.0.2:{}/shaken.pem", certs.port),
                )
                .unwrap(),
                &claims(now()),
            ),
            "+15551234567",
            "SIP/2.0 436",
        ),
        (
            "silent",
            header::value(&key_at("/silent"), &claims(now())),
            "+15551234567",
            "SIP/2.0 436",
        ),
        (
            "forever",
            header::value(&key_at("/forever"), &claims(now())),
            "+15551234567",
            "SIP/2.0 436",
        ),
        (
            "huge",
            header::value(&key_at("/huge"), &claims(now())),
            "+15551234567",
            "SIP/2.0 436",
        ),
        (
            "moved",
            header::value(&key_at("/moved"), &claims(now())),
            "+15551234567",
            "SIP/2.0 436",
        ),
        (
            "other-ca",
            header::value(&key_at("/other.pem"), &claims(now())),
            "+15551234567",
            "SIP/2.0 437",
        ),
    ];
    for (call, value, from, expected) in &cases {
        let started = std::time::Instant::now();
        caller.send(&proxy, &signed_invite(&caller, call, from, Some(value)));
        let answer = final_response(&caller, call);
        assert!(answer.starts_with(expected), "{call}: {answer}");
        assert!(
            started.elapsed() < std::time::Duration::from_millis(2_500),
            "{call} took {:?}",
            started.elapsed()
        );
    }
    // The worker kept serving: a good call still passes, and a call held while a silent
    // certificate server is waited for does not hold up another.
    let slow = header::value(&key_at("/silent?again"), &claims(now()));
    caller.send(
        &proxy,
        &signed_invite(&caller, "held", "+15551234567", Some(&slow)),
    );
    let value = header::value(&good, &claims(now()));
    let started = std::time::Instant::now();
    caller.send(
        &proxy,
        &signed_invite(&caller, "good-3", "+15551234567", Some(&value)),
    );
    forwarded(&uas, "good-3");
    assert!(started.elapsed() < std::time::Duration::from_millis(500));
    let held = final_response(&caller, "held");
    assert!(held.starts_with("SIP/2.0 436"), "{held}");
    assert_eq!(certs.fetches(), 1);
    // A flood of certificates that never come, each at a URL of its own (so no remembered
    // failure answers them), four times what may be fetched at once: each INVITE is
    // answered within twice the fetch time-out (1 s) — none queues behind the others'
    // time-outs — and so is an honest call whose certificate is new to the verifier. That
    // one is usually refused (its wait for a slot ends first): bounded, not fair — the
    // slots are first come, first served.
    let flood: Vec<String> = (0..32).map(|i| format!("flood-{i}")).collect();
    let started = std::time::Instant::now();
    for call in &flood {
        let value = header::value(&key_at(&format!("/silent?{call}")), &claims(now()));
        caller.send(
            &proxy,
            &signed_invite(&caller, call, "+15551234567", Some(&value)),
        );
    }
    let fresh = header::value(&key_at("/shaken.pem?fresh"), &claims(now()));
    caller.send(
        &proxy,
        &signed_invite(&caller, "fresh", "+15551234567", Some(&fresh)),
    );
    // Twice the time-out and room for a loaded machine; queued, the fourth wave would end
    // at 4 s.
    let within = std::time::Duration::from_millis(3_500);
    let mut waiting: std::collections::BTreeSet<String> = flood.iter().cloned().collect();
    let mut fresh_refused = false;
    while !waiting.is_empty() {
        let m = caller.recv();
        let call = m.lines().find_map(|l| l.strip_prefix("Call-ID: "));
        match call {
            _ if m.starts_with("SIP/2.0 100") => continue,
            Some("fresh") => fresh_refused = m.starts_with("SIP/2.0 436"),
            Some(call) if waiting.contains(call) => {
                assert!(m.starts_with("SIP/2.0 436"), "{call}: {m}");
                waiting.remove(call);
            }
            _ => {}
        }
        assert!(
            started.elapsed() < within,
            "still unanswered after {:?}: {waiting:?}",
            started.elapsed()
        );
    }
    // The honest call got a slot in time and went on, or was refused in time.
    let is_fresh = |m: &String| m.contains("Call-ID: fresh\r\n");
    let wait = std::time::Duration::from_millis(20);
    while !fresh_refused {
        if uas.try_recv(wait).is_some_and(|m| is_fresh(&m)) {
            break;
        }
        fresh_refused = caller
            .try_recv(wait)
            .is_some_and(|m| is_fresh(&m) && m.starts_with("SIP/2.0 436"));
        assert!(
            started.elapsed() < within,
            "the honest call is neither on its way nor refused after {:?}",
            started.elapsed()
        );
    }
    // Without an Identity the call goes on unmarked (require is off).
    caller.send(
        &proxy,
        &signed_invite(&caller, "unsigned", "+15551234567", None),
    );
    let unsigned = forwarded(&uas, "unsigned");
    assert!(
        unsigned.contains("From: <sip:+15551234567@example.test;user=phone>"),
        "{unsigned}"
    );
    server.stop();
}

#[test]
fn marking_policy_passes_failures_marked_and_strips_forged_marks() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let certs = CertServer::start(dir.path(), Vec::new());
    let key = SigningKey::from_pem(
        &std::fs::read(dir.path().join(sti::SHAKEN_KEY)).unwrap(),
        &certs.url("/shaken.pem"),
    )
    .unwrap();
    let port = ports(30800);
    let uas = Endpoint::bind("127.0.0.1:0");
    let caller = Endpoint::bind("127.0.0.1:0");
    let proxy = format!("127.0.0.1:{port}");
    let server = verifying_server(dir.path(), &uas, port, "mark");
    let stale = header::value(
        &key,
        &Claims {
            attest: Attest::A,
            orig: "15551234567".into(),
            dest: vec!["15557654321".into()],
            iat: now() - 600,
            origid: passport::new_origid(),
        },
    );
    caller.send(
        &proxy,
        &signed_invite(&caller, "m-stale", "+15551234567", Some(&stale)),
    );
    let marked = forwarded(&uas, "m-stale");
    assert!(
        marked.contains(
            "From: <sip:+15551234567;verstat=TN-Validation-Failed@example.test;user=phone>"
        ),
        "{marked}"
    );
    // A caller who marks itself: the mark is not ours, so it goes.
    caller.send(
        &proxy,
        &signed_invite(
            &caller,
            "m-forged",
            "+15551234567;verstat=TN-Validation-Passed",
            None,
        ),
    );
    let stripped = forwarded(&uas, "m-forged");
    assert!(
        stripped.contains("From: <sip:+15551234567@example.test;user=phone>"),
        "{stripped}"
    );
    server.stop();
}

#[test]
fn calls_sipsec_load_signs_all_verify_through_a_verifying_proxy() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let certs = CertServer::start(dir.path(), Vec::new());
    let port = ports(30900);
    let uas = format!("127.0.0.3:{}", port + 1);
    let config = format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\ndomains = [\"example.test\"]\nworkers = 2\n\
         [routing]\ndefault_route = \"sip:{uas}\"\n[database]\nurl = \"sqlite://{}\"\n\
         [identity]\nverify = true\nroots = \"{}\"\nfetch_allow = [\"127.0.0.1\"]\n\
         fetch_ca = \"ca.pem\"\npolicy = \"reject\"\nrequire = true\n",
        dir.path().join("load.db").display(),
        sti::STI_CA
    );
    let server = Server::start_logged(dir.path(), &config);
    let key = dir.path().join(sti::SHAKEN_KEY);
    let x5u = certs.url("/shaken.pem");
    let run = load(
        dir.path(),
        &[
            &format!("127.0.0.1:{port}"),
            "--role",
            "both",
            "--uas",
            &uas,
            "--rate",
            "100",
            "--calls",
            "200",
            "--caller",
            "+15551234567",
            "--service",
            "+15557654321",
            "--identity-key",
            key.to_str().unwrap(),
            "--x5u",
            &x5u,
        ],
    );
    assert_eq!(
        (run.0, n(&run.1, "succeeded")),
        (0, 200),
        "{}\n{}",
        run.2,
        run.1
    );
    // Authentication is off, so nobody is exempt from `require`: unsigned calls are refused.
    let unsigned = numbered_calls(dir.path(), &format!("127.0.0.1:{port}"), &uas, 10, &[]);
    assert_eq!(
        (n(&unsigned.1, "succeeded"), failed_with(&unsigned.1, "428")),
        (0, 10),
        "{}",
        unsigned.1
    );
    let counters = server.stop_counters();
    assert_eq!(counters.get("identity_verified"), 200);
    assert_eq!(counters.get("identity_missing"), 10);
    assert_eq!(counters.get("identity_failed"), 0);
    // One fetch per worker at most (each asks until the first answer reaches it), and the
    // certificate server saw no more.
    assert!(counters.get("identity_fetches") <= 2);
    assert!((1..=2).contains(&certs.fetches()), "{}", certs.fetches());
}

fn base64_url(text: &str) -> String {
    // RFC 4648 §5 without padding, enough for a test header.
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let b = text.as_bytes();
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = chunk.iter().fold(0u32, |a, &x| a << 8 | u32::from(x)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// How many of a `sipsec load` run's calls failed with `status` (e.g. `428`).
fn failed_with(v: &serde_json::Value, status: &str) -> u64 {
    v["failures_by_reason"]
        .as_object()
        .map(|by| {
            by.iter()
                .filter(|(reason, _)| reason.starts_with(status))
                .filter_map(|(_, n)| n.as_u64())
                .sum()
        })
        .unwrap_or(0)
}

/// `sipsec load` calls from +1 555 123 4567 to +1 555 765 4321 into `target`, answered by its
/// own callee on `uas`; `extra` adds options (a signing key and x5u).
fn numbered_calls(
    dir: &Path,
    target: &str,
    uas: &str,
    calls: u64,
    extra: &[&str],
) -> (i32, serde_json::Value, String) {
    let calls = calls.to_string();
    let mut args = vec![
        target,
        "--role",
        "both",
        "--uas",
        uas,
        "--rate",
        "50",
        "--calls",
        &calls,
        "--caller",
        "+15551234567",
        "--service",
        "+15557654321",
    ];
    args.extend(extra);
    load(dir, &args)
}

/// sipsec signs, Kamailio's `secsipid_check_identity` verifies: calls through a signing
/// sipsec and then a verifying Kamailio all connect, and the same calls sent to Kamailio
/// directly (unsigned, or signed with another STI-CA's key) are refused by it — so the
/// calls that connected were the ones it verified.
#[test]
fn kamailio_secsipid_verifies_the_calls_a_signing_sipsec_forwards() {
    if !have_kamailio(&["secsipid"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certs(d);
    let other = tempfile::tempdir().unwrap();
    make_certs(other.path());
    let port = ports(31000);
    let (kamailio, uas) = (port + 1, format!("127.0.0.3:{}", port + 2));
    let config = format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\ndomains = [\"example.test\"]\nworkers = 2\n\
         [routing]\ndefault_route = \"sip:127.0.0.1:{kamailio}\"\n[database]\nurl = \"sqlite://{}\"\n\
         [identity]\nsign = true\nkey = \"{}\"\nx5u = \"{X5U}\"\n",
        d.join("s.db").display(),
        sti::SHAKEN_KEY
    );
    let server = Server::start_logged(d, &config);
    let k = Kamailio::proxy(
        d,
        &format!("udp:127.0.0.1:{kamailio}"),
        &format!("sip:{uas}"),
        &[format!(
            "SHAKEN_VERIFY=\"{}\"",
            d.join(sti::SHAKEN_CERT).display()
        )],
    );
    let run = numbered_calls(d, &format!("127.0.0.1:{port}"), &uas, 40, &[]);
    assert_eq!(
        (run.0, n(&run.1, "succeeded")),
        (0, 40),
        "through sipsec, then Kamailio: {}\n{}\n{}",
        run.2,
        run.1,
        k.log()
    );
    assert_eq!(server.stop_counters().get("identity_signed"), 40);

    let kamailio_target = format!("127.0.0.1:{kamailio}");
    let unsigned = numbered_calls(d, &kamailio_target, &uas, 10, &[]);
    assert_eq!(
        (n(&unsigned.1, "succeeded"), failed_with(&unsigned.1, "428")),
        (0, 10),
        "unsigned, straight to Kamailio: {}",
        unsigned.1
    );
    let foreign_key = other.path().join(sti::SHAKEN_KEY);
    let foreign = numbered_calls(
        d,
        &kamailio_target,
        &uas,
        10,
        &[
            "--identity-key",
            foreign_key.to_str().unwrap(),
            "--x5u",
            X5U,
        ],
    );
    assert_eq!(
        (n(&foreign.1, "succeeded"), failed_with(&foreign.1, "438")),
        (0, 10),
        "signed by another STI-CA's key, straight to Kamailio: {}",
        foreign.1
    );
}

/// Kamailio's `secsipid_add_identity` signs (as its documentation's example does, with the
/// From user as it stands: `+15551234567`), sipsec verifies — fetching the certificate from
/// the x5u Kamailio put in the token, checking its chain, the numbers and the signature —
/// and refuses the same calls when they reach it unsigned.
#[test]
fn sipsec_verifies_the_calls_kamailio_secsipid_signs() {
    if !have_kamailio(&["secsipid"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certs(d);
    let certs = CertServer::start(d, Vec::new());
    let port = ports(31100);
    let (kamailio, uas_addr) = (port + 1, format!("127.0.0.3:{}", port + 2));
    let config = format!(
        "[server]\nlisten = [\"udp:127.0.0.1:{port}\"]\ndomains = [\"example.test\"]\nworkers = 2\n\
         [routing]\ndefault_route = \"sip:{uas_addr}\"\n[database]\nurl = \"sqlite://{}\"\n\
         [identity]\nverify = true\nroots = \"{}\"\nfetch_allow = [\"127.0.0.1\"]\n\
         fetch_ca = \"ca.pem\"\npolicy = \"reject\"\nrequire = true\n",
        d.join("v.db").display(),
        sti::STI_CA
    );
    let server = Server::start_logged(d, &config);
    let k = Kamailio::proxy(
        d,
        &format!("udp:127.0.0.1:{kamailio}"),
        &format!("sip:127.0.0.1:{port}"),
        &[
            format!("SHAKEN_SIGN=\"{}\"", d.join(sti::SHAKEN_KEY).display()),
            format!("SHAKEN_X5U=\"{}\"", certs.url("/shaken.pem")),
        ],
    );
    let run = numbered_calls(d, &format!("127.0.0.1:{kamailio}"), &uas_addr, 40, &[]);
    assert_eq!(
        (run.0, n(&run.1, "succeeded")),
        (0, 40),
        "through Kamailio, then sipsec: {}\n{}\n{}\n{}",
        run.2,
        run.1,
        k.log(),
        server.log()
    );
    let unsigned = numbered_calls(d, &format!("127.0.0.1:{port}"), &uas_addr, 10, &[]);
    assert_eq!(
        (n(&unsigned.1, "succeeded"), failed_with(&unsigned.1, "428")),
        (0, 10),
        "unsigned, straight to sipsec: {}",
        unsigned.1
    );
    let counters = server.stop_counters();
    assert_eq!(counters.get("identity_verified"), 40);
    assert!((1..=2).contains(&certs.fetches()), "{}", certs.fetches());
}
