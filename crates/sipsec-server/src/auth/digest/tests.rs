//! The authenticator on hand-made requests: challenges, good and bad answers, replays, stale
//! nonces, spoofed identities, throttling, and a user database that is not there.

use super::credentials::{CacheState, Credentials, Secrets};
use super::*;
use crate::auth::{Network, Scheme, Scope};
use sip_core::digest::{Algorithm, Challenge};
use sipsec_transport::net::names::ServerNames;

const REALM: &str = "example.test";
const NOW: u64 = 1_700_000_000_000;

fn config(trusted: &[&str]) -> AuthConfig {
    AuthConfig {
        scheme: Scheme::Digest,
        scope: Arc::new(Scope {
            realm: REALM.into(),
            methods: vec!["INVITE".into(), "REGISTER".into()],
            trusted: trusted.iter().map(|t| Network::parse(t).unwrap()).collect(),
        }),
        algorithms: vec![Algorithm::Sha256, Algorithm::Md5],
        nonce_lifetime_ms: 30_000,
        max_failures_per_source: 4,
        max_failures_per_user: 100,
        failure_window_ms: 60_000,
        max_tracked_nonces: 10_000,
        proxychain: None,
        credential_cache: true,
        server: ServerNames {
            domains: vec!["example.test".into()],
            addrs: vec!["127.0.0.1:5060".parse().unwrap()],
        },
    }
}

fn setup(trusted: &[&str]) -> (DigestAuthenticator, Arc<Credentials>) {
    let cfg = config(trusted);
    let creds = Arc::new(Credentials::new(REALM));
    creds.apply([(
        "alice".to_string(),
        Some(Secrets::from_password("alice", REALM, "wonderland")),
    )]);
    creds.set_state(CacheState::Current);
    let shared = Arc::new(DigestShared::new(&cfg, creds.clone()).unwrap());
    (DigestAuthenticator::new(Arc::new(cfg), shared, 0), creds)
}

/// A request from `from_user`, with an extra header line (credentials) if given.
fn request(method: &str, from_user: &str, extra: &str) -> String {
    let to_user = if method == "REGISTER" {
        from_user
    } else {
        "bob"
    };
    format!(
        "{method} sip:bob@example.test SIP/2.0\r\n\
         Via: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK-1\r\n\
         Max-Forwards: 70\r\n\
         From: <sip:{from_user}@example.test>;tag=a\r\n\
         To: <sip:{to_user}@example.test>\r\n\
         Call-ID: c1\r\nCSeq: 1 {method}\r\n{extra}Content-Length: 0\r\n\r\n"
    )
}

fn check(a: &mut DigestAuthenticator, text: &str, now: u64) -> Verdict {
    let msg = Message::parse(text.as_bytes()).unwrap();
    a.check(&msg, "10.0.0.1".parse().unwrap(), now)
}

/// The challenge in a refusal, for `algorithm`.
fn challenge_of(v: &Verdict, algorithm: &str) -> Challenge {
    let Verdict::Refuse { headers, .. } = v else {
        panic!("not refused: {v:?}")
    };
    let line = headers
        .lines()
        .find(|l| l.contains(&format!("algorithm={algorithm},")))
        .unwrap_or_else(|| panic!("no {algorithm} challenge in {headers}"));
    Challenge::parse(line.split_once(": ").unwrap().1.as_bytes()).unwrap()
}

fn answer(
    c: &Challenge,
    user: &str,
    password: &str,
    method: &str,
    nc: u32,
    register: bool,
) -> String {
    let name = if register {
        "Authorization"
    } else {
        "Proxy-Authorization"
    };
    let value = c.authorization(user, password, method, "sip:bob@example.test", nc, "cn0");
    format!("{name}: {value}\r\n")
}

/// A `method` request from `user` answering `c` with `password` at nonce count `nc`, in the
/// header its challenge came in (Authorization for REGISTER's 401, else Proxy-Authorization).
fn answered(c: &Challenge, method: &str, user: &str, password: &str, nc: u32) -> String {
    request(
        method,
        user,
        &answer(c, user, password, method, nc, method == "REGISTER"),
    )
}

fn code_and_why(v: &Verdict) -> (u16, Why) {
    match v {
        Verdict::Refuse { code, why, .. } => (*code, *why),
        Verdict::Pass => (200, Why::NoCredentials),
        Verdict::Wait { .. } => panic!("digest never waits"),
    }
}

#[test]
fn a_challenge_answered_with_the_right_password_passes_once_per_count() {
    let (mut a, _) = setup(&[]);
    let first = check(&mut a, &request("INVITE", "alice", ""), NOW);
    assert_eq!(code_and_why(&first), (407, Why::NoCredentials));
    let Verdict::Refuse { headers, .. } = &first else {
        unreachable!()
    };
    assert_eq!(
        headers.matches("Proxy-Authenticate: Digest").count(),
        2,
        "{headers}"
    );
    assert!(
        headers.find("SHA-256") < headers.find("algorithm=MD5"),
        "SHA-256 first"
    );
    for alg in ["SHA-256", "MD5"] {
        // Each challenge carries one nonce for every algorithm; take a fresh one per round.
        let c = challenge_of(&check(&mut a, &request("INVITE", "alice", ""), NOW), alg);
        assert!(c.qop_auth && !c.stale && c.opaque.is_some());
        let creds = answer(&c, "alice", "wonderland", "INVITE", 1, false);
        let text = request("INVITE", "alice", &creds);
        assert_eq!(check(&mut a, &text, NOW + 10), Verdict::Pass, "{alg}");
        // The same count again is a replay; the next count is fine.
        assert_eq!(
            code_and_why(&check(&mut a, &text, NOW + 20)),
            (407, Why::Replay)
        );
        let next = answered(&c, "INVITE", "alice", "wonderland", 2);
        assert_eq!(check(&mut a, &next, NOW + 30), Verdict::Pass);
    }
}

#[test]
fn the_registrar_challenges_with_401() {
    let (mut a, _) = setup(&[]);
    let first = check(&mut a, &request("REGISTER", "alice", ""), NOW);
    assert_eq!(code_and_why(&first), (401, Why::NoCredentials));
    let c = challenge_of(&first, "SHA-256");
    let text = answered(&c, "REGISTER", "alice", "wonderland", 1);
    assert_eq!(check(&mut a, &text, NOW), Verdict::Pass);
    // Credentials in the wrong header are no credentials.
    let text = request(
        "REGISTER",
        "alice",
        &answer(&c, "alice", "wonderland", "REGISTER", 2, false),
    );
    assert_eq!(
        code_and_why(&check(&mut a, &text, NOW)),
        (401, Why::NoCredentials)
    );
}

#[test]
fn wrong_passwords_and_unknown_users_get_the_same_answer() {
    let (mut a, _) = setup(&[]);
    let c = challenge_of(&check(&mut a, &request("INVITE", "alice", ""), NOW), "MD5");
    let wrong = check(&mut a, &answered(&c, "INVITE", "alice", "guess", 1), NOW);
    let unknown = check(&mut a, &answered(&c, "INVITE", "mallory", "x", 1), NOW);
    assert_eq!(code_and_why(&wrong), (407, Why::Failed));
    assert_eq!(code_and_why(&unknown), (407, Why::Failed));
    let shape = |v: &Verdict| match v {
        Verdict::Refuse {
            reason, headers, ..
        } => (reason.to_string(), headers.len()),
        other => panic!("{other:?}"),
    };
    assert_eq!(shape(&wrong), shape(&unknown));
    // A response computed for another method does not pass either.
    let other = check(
        &mut a,
        &request(
            "INVITE",
            "alice",
            &answer(&c, "alice", "wonderland", "BYE", 1, false),
        ),
        NOW,
    );
    assert_eq!(code_and_why(&other), (407, Why::Failed));
}

#[test]
fn old_or_foreign_nonces_with_the_right_password_are_stale() {
    let (mut a, _) = setup(&[]);
    let c = challenge_of(
        &check(&mut a, &request("INVITE", "alice", ""), NOW),
        "SHA-256",
    );
    let text = answered(&c, "INVITE", "alice", "wonderland", 1);
    let late = check(&mut a, &text, NOW + 31_000);
    assert_eq!(code_and_why(&late), (407, Why::Stale));
    assert!(challenge_of(&late, "SHA-256").stale);
    // A nonce made by another server (or before a restart): also stale.
    let (mut other, _) = setup(&[]);
    assert_eq!(
        code_and_why(&check(&mut other, &text, NOW)),
        (407, Why::Stale)
    );
    // A wrong password on an old nonce is not even checked: stale too, and not a failure.
    let wrong = answered(&c, "INVITE", "alice", "nope", 1);
    let v = check(&mut a, &wrong, NOW + 31_000);
    assert_eq!(code_and_why(&v), (407, Why::Stale));
    assert!(challenge_of(&v, "SHA-256").stale);
}

#[test]
fn credentials_for_another_identity_are_forbidden() {
    let (mut a, _) = setup(&[]);
    let c = challenge_of(
        &check(&mut a, &request("INVITE", "alice", ""), NOW),
        "SHA-256",
    );
    // alice's valid credentials on a request From bob.
    let text = request(
        "INVITE",
        "bob",
        &answer(&c, "alice", "wonderland", "INVITE", 1, false),
    );
    assert_eq!(
        code_and_why(&check(&mut a, &text, NOW)),
        (403, Why::IdentityMismatch)
    );
}

#[test]
fn repeated_failures_are_throttled_even_with_the_right_password() {
    let (mut a, _) = setup(&[]);
    let c = challenge_of(&check(&mut a, &request("INVITE", "alice", ""), NOW), "MD5");
    for nc in 1..=4 {
        let wrong = answered(&c, "INVITE", "alice", "guess", nc);
        assert_eq!(
            code_and_why(&check(&mut a, &wrong, NOW)),
            (407, Why::Failed)
        );
    }
    let right = answered(&c, "INVITE", "alice", "wonderland", 9);
    assert_eq!(
        code_and_why(&check(&mut a, &right, NOW)),
        (403, Why::Throttled)
    );
    // The window ends; the right password works again.
    let later = NOW + 61_000;
    let c2 = challenge_of(
        &check(&mut a, &request("INVITE", "alice", ""), later),
        "MD5",
    );
    let fresh = answered(&c2, "INVITE", "alice", "wonderland", 1);
    assert_eq!(check(&mut a, &fresh, later), Verdict::Pass);
}

#[test]
fn without_the_user_database_the_answer_is_503() {
    let (mut a, creds) = setup(&[]);
    let c = challenge_of(&check(&mut a, &request("INVITE", "alice", ""), NOW), "MD5");
    let alice = answered(&c, "INVITE", "alice", "wonderland", 1);
    let carol = answered(&c, "INVITE", "carol", "x", 1);
    creds.set_state(CacheState::Loading);
    let v = check(&mut a, &alice, NOW);
    assert_eq!(code_and_why(&v), (503, Why::Unavailable));
    let Verdict::Refuse { headers, .. } = v else {
        unreachable!()
    };
    assert!(headers.contains("Retry-After:"));
    // In an outage the cache still knows alice; carol may be new, so she waits.
    creds.set_state(CacheState::Outage);
    assert_eq!(check(&mut a, &alice, NOW), Verdict::Pass);
    assert_eq!(
        code_and_why(&check(&mut a, &carol, NOW)),
        (503, Why::Unavailable)
    );
}

#[test]
fn ack_cancel_other_methods_and_trusted_peers_pass_unchallenged() {
    let (mut a, _) = setup(&["10.0.0.0/8"]);
    assert_eq!(
        check(&mut a, &request("INVITE", "alice", ""), NOW),
        Verdict::Pass
    );
    let (mut a, _) = setup(&["192.168.0.0/16", "::1"]);
    for method in ["ACK", "CANCEL", "OPTIONS", "BYE"] {
        assert_eq!(
            check(&mut a, &request(method, "alice", ""), NOW),
            Verdict::Pass,
            "{method}"
        );
    }
    assert_eq!(
        code_and_why(&check(&mut a, &request("INVITE", "alice", ""), NOW)).0,
        407
    );
}

#[test]
fn malformed_credentials_are_a_400() {
    let (mut a, _) = setup(&[]);
    let text = request(
        "INVITE",
        "alice",
        "Proxy-Authorization: Digest username=\"alice\r\n",
    );
    assert_eq!(
        code_and_why(&check(&mut a, &text, NOW)),
        (400, Why::Malformed)
    );
    let text = request("INVITE", "alice", "Proxy-Authorization: Digest username=alice, realm=\"example.test\", nonce=x, uri=\"sip:b\", response=\"0\", qop=auth-int\r\n");
    assert_eq!(
        code_and_why(&check(&mut a, &text, NOW)),
        (400, Why::Malformed)
    );
}

#[test]
fn networks_contain_what_they_should() {
    let n = Network::parse("10.1.0.0/16").unwrap();
    assert!(n.contains("10.1.200.3".parse().unwrap()));
    assert!(!n.contains("10.2.0.1".parse().unwrap()));
    assert!(!n.contains("::1".parse().unwrap()));
    assert!(Network::parse("::1")
        .unwrap()
        .contains("::1".parse().unwrap()));
    assert!(Network::parse("0.0.0.0/0")
        .unwrap()
        .contains("8.8.8.8".parse().unwrap()));
    assert!(Network::parse("10.0.0.0/33").is_err());
    assert!(Network::parse("example.com").is_err());
}

fn check_from(a: &mut DigestAuthenticator, text: &str, source: &str, now: u64) -> Verdict {
    let msg = Message::parse(text.as_bytes()).unwrap();
    a.check(&msg, source.parse().unwrap(), now)
}

#[test]
fn blind_datagrams_cannot_lock_a_user_out() {
    let (mut a, _) = setup(&[]);
    // Made-up credentials (all-zero nonce and response, no challenge fetched) from many
    // spoofed sources: challenged again, counted against nobody.
    let zeros = "0".repeat(64);
    let forged = format!(
        "Authorization: Digest username=\"alice\", realm=\"{REALM}\", nonce=\"{zeros}\", \
         uri=\"sip:bob@example.test\", response=\"{}\", algorithm=MD5\r\n",
        &zeros[..32]
    );
    for i in 0..50 {
        let v = check_from(
            &mut a,
            &request("REGISTER", "alice", &forged),
            &format!("192.0.2.{i}"),
            NOW,
        );
        assert_eq!(code_and_why(&v), (401, Why::Stale));
    }
    // A real nonce, answered from an address it was not sent to (a spoofed copy of a
    // challenge someone else fetched): not counted either.
    let c = challenge_of(
        &check_from(
            &mut a,
            &request("REGISTER", "alice", ""),
            "198.51.100.1",
            NOW,
        ),
        "MD5",
    );
    for i in 0..50 {
        let wrong = answer(&c, "alice", "guess", "REGISTER", i + 1, true);
        let v = check_from(
            &mut a,
            &request("REGISTER", "alice", &wrong),
            &format!("192.0.2.{i}"),
            NOW,
        );
        assert_eq!(code_and_why(&v), (401, Why::Stale));
    }
    // alice is not locked out.
    let c = challenge_of(
        &check(&mut a, &request("REGISTER", "alice", ""), NOW),
        "MD5",
    );
    let right = answer(&c, "alice", "wonderland", "REGISTER", 1, true);
    assert_eq!(
        check(&mut a, &request("REGISTER", "alice", &right), NOW),
        Verdict::Pass
    );
}

#[test]
fn a_guesser_locks_itself_out_but_not_the_users_own_device() {
    let (mut a, _) = setup(&[]);
    // alice's phone at 10.0.0.1 has authenticated before.
    let c = challenge_of(&check(&mut a, &request("INVITE", "alice", ""), NOW), "MD5");
    let right = answer(&c, "alice", "wonderland", "INVITE", 1, false);
    assert_eq!(
        check(&mut a, &request("INVITE", "alice", &right), NOW),
        Verdict::Pass
    );
    // Someone at 192.0.2.9 fetches real challenges and guesses: 4 failures (its limit).
    let challenges: Vec<Challenge> = (0..5)
        .map(|_| {
            challenge_of(
                &check_from(&mut a, &request("INVITE", "alice", ""), "192.0.2.9", NOW),
                "MD5",
            )
        })
        .collect();
    let mut from_elsewhere = |c: &Challenge, password: &str| {
        let creds = answer(c, "alice", password, "INVITE", 1, false);
        code_and_why(&check_from(
            &mut a,
            &request("INVITE", "alice", &creds),
            "192.0.2.9",
            NOW,
        ))
    };
    for c in &challenges[..4] {
        assert_eq!(from_elsewhere(c, "guess"), (407, Why::Failed));
    }
    // The guesser is refused even with the right password; alice's phone is not.
    assert_eq!(
        from_elsewhere(&challenges[4], "wonderland"),
        (403, Why::Throttled)
    );
    let c = challenge_of(&check(&mut a, &request("INVITE", "alice", ""), NOW), "MD5");
    let phone = answer(&c, "alice", "wonderland", "INVITE", 1, false);
    assert_eq!(
        check(&mut a, &request("INVITE", "alice", &phone), NOW),
        Verdict::Pass
    );
}

#[test]
fn failure_limits_are_shared_by_the_workers() {
    let cfg = config(&[]);
    let creds = Arc::new(Credentials::new(REALM));
    creds.set_state(CacheState::Current);
    let shared = Arc::new(DigestShared::new(&cfg, creds).unwrap());
    let cfg = Arc::new(cfg);
    let mut workers = [
        DigestAuthenticator::new(cfg.clone(), shared.clone(), 0),
        DigestAuthenticator::new(cfg, shared, 1),
    ];
    let c = challenge_of(
        &check(&mut workers[0], &request("INVITE", "mallory", ""), NOW),
        "MD5",
    );
    let fifth = answer(&c, "mallory", "x", "INVITE", 1, false);
    // Four failures from one address (the per-source limit), alternating between two workers.
    for i in 0..4 {
        let w = &mut workers[i % 2];
        let c = challenge_of(&check(w, &request("INVITE", "mallory", ""), NOW), "MD5");
        let wrong = answer(&c, "mallory", "x", "INVITE", 1, false);
        assert_eq!(
            code_and_why(&check(w, &request("INVITE", "mallory", &wrong), NOW)),
            (407, Why::Failed)
        );
    }
    assert_eq!(
        code_and_why(&check(
            &mut workers[0],
            &request("INVITE", "mallory", &fifth),
            NOW
        )),
        (403, Why::Throttled)
    );
}

#[test]
fn credentials_for_another_request_uri_are_refused() {
    let (mut a, _) = setup(&[]);
    let c = challenge_of(&check(&mut a, &request("INVITE", "alice", ""), NOW), "MD5");
    // Computed for sip:bob@example.test, sent on a request to carol.
    let creds = answer(&c, "alice", "wonderland", "INVITE", 1, false);
    let to_carol = request("INVITE", "alice", &creds).replacen(
        "INVITE sip:bob@example.test",
        "INVITE sip:carol@example.test",
        1,
    );
    let v = check(&mut a, &to_carol, NOW);
    assert_eq!(code_and_why(&v), (400, Why::Malformed));
    // Credentials for this server itself (SIPp's default uri) pass, wherever the request
    // goes; credentials for another server or another user do not.
    for (digest_uri, ruri, code) in [
        ("sip:127.0.0.1:5060", "sip:carol@example.test", 200),
        ("sip:example.test", "sip:carol@elsewhere.test", 200),
        ("sip:192.0.2.1:5060", "sip:carol@elsewhere.test", 400),
        ("sip:carol@127.0.0.1:5060", "sip:dave@example.test", 400),
    ] {
        let c = challenge_of(&check(&mut a, &request("INVITE", "alice", ""), NOW), "MD5");
        let value = c.authorization("alice", "wonderland", "INVITE", digest_uri, 1, "c");
        let text = request(
            "INVITE",
            "alice",
            &format!("Proxy-Authorization: {value}\r\n"),
        )
        .replacen("INVITE sip:bob@example.test", &format!("INVITE {ruri}"), 1);
        assert_eq!(code_and_why(&check(&mut a, &text, NOW)).0, code, "{ruri}");
    }
    // The same resource written differently (case, default port, parameters) is fine.
    let same = request("INVITE", "alice", &creds).replacen(
        "INVITE sip:bob@example.test",
        "INVITE sip:bob@EXAMPLE.test:5060;transport=udp",
        1,
    );
    assert_eq!(check(&mut a, &same, NOW), Verdict::Pass);
}

/// Without the cache, an answer serves the requests that waited for it and is then gone:
/// a retransmission that arrives while the query is out waits for the same answer (one
/// query, not two), and the next request of the user queries again. Before, each arrival
/// made its own query and an answer nobody took stayed behind, so a later request passed
/// on it without asking the database: a cache by accident, and a stale one.
#[test]
fn without_the_cache_an_answer_serves_the_waiting_requests_once() {
    let mut cfg = config(&[]);
    cfg.credential_cache = false;
    let creds = Arc::new(Credentials::new(REALM));
    let shared = Arc::new(DigestShared::new(&cfg, creds).unwrap());
    let mut a = DigestAuthenticator::new(Arc::new(cfg), shared.clone(), 3);
    let c = challenge_of(&check(&mut a, &request("INVITE", "alice", ""), NOW), "MD5");
    let first = answered(&c, "INVITE", "alice", "wonderland", 1);
    let waits = |v: Verdict| matches!(v, Verdict::Wait { ref user } if user == "alice");
    assert!(waits(check(&mut a, &first, NOW + 1)));
    assert!(
        waits(check(&mut a, &first, NOW + 500)),
        "the retransmission"
    );
    assert_eq!(
        a.fetches.drain(..).collect::<Vec<_>>(),
        [("alice".to_string(), false)]
    );

    // The answer, for worker 3; the engine claims it and reruns what waited.
    let secrets = Secrets::from_password("alice", REALM, "wonderland");
    shared.fetched.deliver(3, "alice", Some(secrets));
    a.claim("alice");
    assert_eq!(check(&mut a, &first, NOW + 600), Verdict::Pass);
    a.release();

    // The next request queries again.
    let next = answered(&c, "INVITE", "alice", "wonderland", 2);
    assert!(waits(check(&mut a, &next, NOW + 700)));
    assert_eq!(a.fetches.len(), 1, "a new query");
    // An answer for another worker is not this one's.
    shared.fetched.deliver(0, "alice", None);
    a.claim("alice");
    assert!(waits(check(&mut a, &next, NOW + 800)));
}
