//! The proxy's Proxychain authenticator on hand-made requests: the hello challenge, waiting
//! for the authority, the full challenge, verification and the chain stepping down, replays,
//! moved responses, spoofed identities, unknown users, prefetching and backup credentials.

use super::*;
use sip_core::proxychain::{issue, user_key, ClientChain, Hello, Nonce};

const REALM: &str = "example.test";
const NOW_MS: u64 = 1_700_000_000_000;
const NOW_S: u64 = NOW_MS / 1000;

fn config(backup: Option<PathBuf>) -> PcConfig {
    PcConfig {
        authority: "127.0.0.1:5070".parse().unwrap(),
        authority_name: "127.0.0.1".into(),
        chain_length: 4,
        hash: HashKind::Sha256,
        cache_size: 1000,
        prefetch_at: 1,
        backup,
        scope: Arc::new(crate::auth::Scope {
            realm: REALM.into(),
            methods: vec!["INVITE".into(), "REGISTER".into()],
            trusted: vec![crate::auth::Network::parse("192.0.2.0/24").unwrap()],
        }),
        wait_ms: 1000,
    }
}

fn key(user: &str) -> [u8; 32] {
    user_key(user, REALM, "pw")
}

fn authenticator(backup: Option<PathBuf>) -> PcAuthenticator {
    let shared = Arc::new(PcShared::new(config(backup)));
    shared.set_proxy("p1");
    PcAuthenticator::new(shared)
}

/// Installs what the authority would issue for `user`.
fn install(a: &PcAuthenticator, user: &str, length: u32) {
    let issued = issue(HashKind::Sha256, &key(user), "p1", length, [1; 16], [2; 16]);
    a.shared().cache.install(user, issued.into(), 0, NOW_S);
}

fn request(method: &str, from: &str, to: &str, credentials: Option<String>) -> String {
    let header = if method == "REGISTER" {
        "Authorization"
    } else {
        "Proxy-Authorization"
    };
    let extra = credentials.map_or(String::new(), |c| format!("{header}: {c}\r\n"));
    format!(
        "{method} sip:{to}@example.test SIP/2.0\r\n\
         Via: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK-1\r\n\
         Max-Forwards: 70\r\n\
         From: <sip:{from}@example.test>;tag=a\r\n\
         To: <sip:{to}@example.test>\r\n\
         Call-ID: c1\r\nCSeq: 1 {method}\r\n{extra}Content-Length: 0\r\n\r\n"
    )
}

fn verify(a: &mut PcAuthenticator, text: &str) -> Verdict {
    let msg = Message::parse(text.as_bytes()).unwrap();
    a.verify(&msg, NOW_MS)
}

fn hello(user: &str, n_ap: Nonce) -> String {
    Hello {
        username: user.into(),
        n_ap,
    }
    .render()
}

/// The challenge a verdict carries.
fn challenge_of(v: &Verdict) -> Challenge {
    let Verdict::Refuse { headers, code, .. } = v else {
        panic!("not a challenge: {v:?}")
    };
    assert!(*code == 407 || *code == 401, "{v:?}");
    Challenge::parse(headers.split_once(": ").unwrap().1.trim_end().as_bytes()).unwrap()
}

/// Hello, challenge, response: the response request for alice → bob.
fn respond(a: &mut PcAuthenticator, n_ap: Nonce) -> String {
    let ch = challenge_of(&verify(
        a,
        &request("INVITE", "alice", "bob", Some(hello("alice", n_ap))),
    ));
    let (_, r) = ClientChain::answer(
        &key("alice"),
        &ch,
        &n_ap,
        "alice",
        b"alice@example.test",
        b"bob@example.test",
    )
    .expect("the network proves itself");
    request("INVITE", "alice", "bob", Some(r.render()))
}

#[test]
fn without_credentials_the_hello_challenge_asks_for_a_nonce() {
    let mut a = authenticator(None);
    let v = verify(&mut a, &request("INVITE", "alice", "bob", None));
    let Verdict::Refuse {
        code, headers, why, ..
    } = &v
    else {
        panic!("{v:?}")
    };
    assert_eq!((*code, *why), (407, Why::NoCredentials));
    assert_eq!(headers, "Proxy-Authenticate: PC realm=\"p1\"\r\n");
    let v = verify(&mut a, &request("REGISTER", "alice", "alice", None));
    assert!(
        matches!(v, Verdict::Refuse { code: 401, ref headers, .. } if headers.starts_with("WWW-Authenticate: PC"))
    );
}

#[test]
fn a_hello_without_a_chain_waits_for_the_authority_once() {
    let mut a = authenticator(None);
    let text = request("INVITE", "alice", "bob", Some(hello("alice", [3; 16])));
    let wait = Verdict::Wait {
        user: "alice".into(),
    };
    assert_eq!(verify(&mut a, &text), wait);
    assert_eq!(a.fetches, vec![("alice".to_string(), false)]);
    // A second request while the first fetch is out waits without another fetch.
    a.fetches.clear();
    assert_eq!(verify(&mut a, &text), wait);
    assert!(a.fetches.is_empty());
    // The chain arrives: the same request is challenged.
    a.shared().end_fetch("alice");
    install(&a, "alice", 4);
    let ch = challenge_of(&verify(&mut a, &text));
    assert_eq!((ch.counter, ch.realm.as_str()), (4, "p1"));
}

#[test]
fn responses_pass_once_each_and_step_the_chain_down() {
    let mut a = authenticator(None);
    install(&a, "alice", 4);
    for left in (0..4).rev() {
        let text = respond(&mut a, [left as u8; 16]);
        assert_eq!(verify(&mut a, &text), Verdict::Pass);
        assert_eq!(
            a.shared().cache.with("alice", |e| e.chain.counter),
            Some(left)
        );
        // The same response again is a replay: back to the hello challenge.
        let again = verify(&mut a, &text);
        assert!(
            matches!(
                again,
                Verdict::Refuse {
                    why: Why::Replay,
                    ..
                } | Verdict::Refuse {
                    why: Why::Stale,
                    ..
                }
            ),
            "{again:?}"
        );
    }
    // Spent (and nothing prefetched in this test): a hello now waits for a new chain.
    let text = request("INVITE", "alice", "bob", Some(hello("alice", [9; 16])));
    assert!(matches!(verify(&mut a, &text), Verdict::Wait { .. }));
}

#[test]
fn the_next_chain_is_prefetched_before_the_current_one_runs_out() {
    let mut a = authenticator(None);
    install(&a, "alice", 4);
    for _ in 0..2 {
        let text = respond(&mut a, [5; 16]);
        assert_eq!(verify(&mut a, &text), Verdict::Pass);
    }
    assert!(a.fetches.is_empty(), "two values left: no prefetch yet");
    let text = respond(&mut a, [6; 16]);
    assert_eq!(verify(&mut a, &text), Verdict::Pass);
    assert_eq!(
        a.fetches,
        vec![("alice".to_string(), true)],
        "one left: prefetch"
    );
    // The prefetched chain waits behind the last value, then takes over.
    a.shared().end_fetch("alice");
    let next = issue(HashKind::Sha256, &key("alice"), "p1", 4, [7; 16], [8; 16]);
    a.shared().cache.install("alice", next.into(), 0, NOW_S);
    let text = respond(&mut a, [1; 16]);
    assert_eq!(verify(&mut a, &text), Verdict::Pass);
    let ch = challenge_of(&verify(
        &mut a,
        &request("INVITE", "alice", "bob", Some(hello("alice", [2; 16]))),
    ));
    assert_eq!(
        (ch.counter, ch.n_da),
        (4, [7; 16]),
        "the new chain, without waiting"
    );
}

#[test]
fn a_response_moved_to_another_callee_or_a_bad_value_is_forbidden() {
    let mut a = authenticator(None);
    install(&a, "alice", 4);
    let text = respond(&mut a, [3; 16]);
    let moved = text.replace("bob@", "carol@");
    assert!(matches!(
        verify(&mut a, &moved),
        Verdict::Refuse {
            code: 403,
            why: Why::Failed,
            ..
        }
    ));
    // The genuine one still passes: a refusal does not step the chain.
    assert_eq!(verify(&mut a, &text), Verdict::Pass);
}

#[test]
fn an_answer_to_a_chain_another_call_spent_gets_a_fresh_challenge_not_403() {
    let mut a = authenticator(None);
    install(&a, "alice", 1);
    // Two calls of alice are challenged at the same counter; the second answers first.
    let first = respond(&mut a, [3; 16]);
    let second = respond(&mut a, [4; 16]);
    assert_eq!(verify(&mut a, &second), Verdict::Pass);
    // That spent the chain; the next one has the same counter, 1.
    let next = issue(HashKind::Sha256, &key("alice"), "p1", 1, [7; 16], [8; 16]);
    a.shared().cache.install("alice", next.into(), 0, NOW_S);
    // The first call's answer, honest but for the old chain, starts over.
    assert!(matches!(
        verify(&mut a, &first),
        Verdict::Refuse {
            code: 407,
            why: Why::Raced,
            ..
        }
    ));
    // Long after the replacement the same mismatch is a forgery.
    let msg = Message::parse(first.as_bytes()).unwrap();
    assert!(matches!(
        a.verify(&msg, NOW_MS + 60_000),
        Verdict::Refuse {
            code: 403,
            why: Why::Failed,
            ..
        }
    ));
}

#[test]
fn credentials_of_one_user_on_another_users_request_are_refused() {
    let mut a = authenticator(None);
    install(&a, "alice", 4);
    let spoof = request("INVITE", "mallory", "bob", Some(hello("alice", [1; 16])));
    assert!(matches!(
        verify(&mut a, &spoof),
        Verdict::Refuse {
            code: 403,
            why: Why::IdentityMismatch,
            ..
        }
    ));
}

#[test]
fn an_unknown_user_gets_a_decoy_no_key_answers() {
    let mut a = authenticator(None);
    a.shared().set_unknown("ghost", NOW_S);
    let n_ap = [4; 16];
    let v = verify(
        &mut a,
        &request("INVITE", "ghost", "bob", Some(hello("ghost", n_ap))),
    );
    let ch = challenge_of(&v);
    assert_eq!(
        (ch.counter, ch.realm.as_str()),
        (4, "p1"),
        "shaped like a real one"
    );
    assert_eq!(
        ClientChain::answer(
            &key("ghost"),
            &ch,
            &n_ap,
            "ghost",
            b"ghost@example.test",
            b"bob@example.test"
        )
        .map(|(_, r)| r),
        Err(Refusal::NetworkProof)
    );
}

#[test]
fn with_the_authority_down_backup_credentials_keep_calls_authenticated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p1.backup");
    backup::write(&path, "p1", &[("alice".to_string(), key("alice"))], |k| {
        Ok(issue(HashKind::Sha256, k, "p1", 50, [5; 16], [6; 16]))
    })
    .unwrap();
    let mut a = authenticator(Some(path));
    a.shared().set_down(true);
    let text = respond(&mut a, [1; 16]);
    assert_eq!(verify(&mut a, &text), Verdict::Pass);
    assert_eq!(
        a.shared().cache.with("alice", |e| e.chain.counter),
        Some(49)
    );
    // A user with no backup credential: 503, not a wait.
    let v = verify(
        &mut a,
        &request("INVITE", "bob", "alice", Some(hello("bob", [1; 16]))),
    );
    assert!(matches!(
        v,
        Verdict::Refuse {
            code: 503,
            why: Why::Unavailable,
            ..
        }
    ));
}

#[test]
fn without_backup_credentials_an_outage_is_answered_503() {
    let mut a = authenticator(None);
    a.shared().set_down(true);
    let v = verify(
        &mut a,
        &request("INVITE", "alice", "bob", Some(hello("alice", [1; 16]))),
    );
    assert!(matches!(
        v,
        Verdict::Refuse {
            code: 503,
            why: Why::Unavailable,
            ..
        }
    ));
    // A user whose chain is cached is not affected.
    install(&a, "alice", 4);
    let text = respond(&mut a, [2; 16]);
    assert_eq!(verify(&mut a, &text), Verdict::Pass);
}

#[test]
fn exemptions_and_malformed_credentials() {
    let a = authenticator(None);
    let ack_text = request("ACK", "alice", "bob", None);
    let ack = Message::parse(ack_text.as_bytes()).unwrap();
    assert!(a.exempt(&ack, "10.0.0.1".parse().unwrap()));
    let invite = request("INVITE", "alice", "bob", None);
    let msg = Message::parse(invite.as_bytes()).unwrap();
    assert!(
        a.exempt(&msg, "192.0.2.7".parse().unwrap()),
        "trusted network"
    );
    assert!(!a.exempt(&msg, "10.0.0.1".parse().unwrap()));
    let mut a = a;
    for bad in [
        "PC username=\"alice\"",
        "PC username=\"alice\", nap=\"xyz\"",
        "PC",
    ] {
        let v = verify(&mut a, &request("INVITE", "alice", "bob", Some(bad.into())));
        assert!(
            matches!(v, Verdict::Refuse { code: 400, .. }),
            "{bad}: {v:?}"
        );
    }
}
