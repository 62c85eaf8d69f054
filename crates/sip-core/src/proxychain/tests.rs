use super::*;
use crate::hex;

/// docs/proxychain_vectors.json, made by docs/proxychain_vectors.py with Python's hashlib.
const VECTORS: &str = include_str!("../../../../docs/proxychain_vectors.json");

fn nonce(v: &serde_json::Value) -> Nonce {
    let mut n = [0; NONCE_LEN];
    assert!(hex::decode(v.as_str().unwrap().as_bytes(), &mut n));
    n
}

fn s(v: &serde_json::Value) -> &str {
    v.as_str().unwrap()
}

#[test]
fn the_independent_test_vectors_hold() {
    let all: serde_json::Value = serde_json::from_str(VECTORS).unwrap();
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 2, "SHA-256 and MD5");
    for v in all {
        let kind = HashKind::from_token(s(&v["algorithm"]).as_bytes()).unwrap();
        let k_ad = user_key(s(&v["username"]), s(&v["realm"]), s(&v["password"]));
        assert_eq!(hex::encode(&k_ad), s(&v["k_ad"]));
        let (proxy, n_da, n_dp, n_ap) = (
            s(&v["proxy"]),
            nonce(&v["n_da"]),
            nonce(&v["n_dp"]),
            nonce(&v["n_ap"]),
        );
        assert_eq!(chain_root(kind, &k_ad, &n_da, proxy).hex(), s(&v["tk_a"]));
        let length = v["length"].as_u64().unwrap() as u32;
        let issued = issue(kind, &k_ad, proxy, length, n_da, n_dp);
        assert_eq!(issued.anchor.hex(), s(&v["anchor"]));
        assert_eq!(issued.tk_p.hex(), s(&v["tk_p"]));
        let (from, to) = (s(&v["from"]).as_bytes(), s(&v["to"]).as_bytes());
        let mut chain = Chain::from(issued);
        for step in v["steps"].as_array().unwrap() {
            let i = step["i"].as_u64().unwrap() as u32;
            // Run the protocol down to this step's counter, checking each vector on the way.
            while chain.counter > i {
                let ch = chain.challenge(proxy, &n_ap);
                let (_, r) = ClientChain::answer(&k_ad, &ch, &n_ap, "alice", from, to).unwrap();
                chain.verify(&r, from, to).unwrap();
            }
            let ch = chain.challenge(proxy, &n_ap);
            assert_eq!(ch.counter, i);
            assert_eq!(ch.proof.hex(), s(&step["network_proof"]));
            let (_, r) = ClientChain::answer(&k_ad, &ch, &n_ap, "alice", from, to).unwrap();
            assert_eq!(r.value.hex(), s(&step["response"]));
            assert_eq!(r.proof.hex(), s(&step["request_proof"]));
            chain.verify(&r, from, to).unwrap();
            assert_eq!(chain.counter, i - 1);
        }
        assert_eq!(chain.counter, 0);
    }
}

struct Setup {
    k_ad: [u8; 32],
    chain: Chain,
    n_ap: Nonce,
}

fn setup(kind: HashKind, length: u32) -> Setup {
    let k_ad = user_key("alice", "example.com", "secret");
    let issued = issue(kind, &k_ad, "p1", length, [1; 16], [2; 16]);
    Setup {
        k_ad,
        chain: issued.into(),
        n_ap: [3; 16],
    }
}

const A: &[u8] = b"alice@example.com";
const B: &[u8] = b"bob@example.com";

#[test]
fn a_chain_authenticates_exactly_length_requests_then_is_exhausted() {
    for kind in [HashKind::Sha256, HashKind::Md5] {
        let mut s = setup(kind, 5);
        for _ in 0..5 {
            let ch = s.chain.challenge("p1", &s.n_ap);
            let (_, r) = ClientChain::answer(&s.k_ad, &ch, &s.n_ap, "alice", A, B).unwrap();
            s.chain.verify(&r, A, B).unwrap();
        }
        let ch = s.chain.challenge("p1", &s.n_ap);
        assert_eq!(
            ClientChain::answer(&s.k_ad, &ch, &s.n_ap, "alice", A, B).map(|(_, r)| r),
            Err(Refusal::CounterRange),
            "a client never reveals past the root"
        );
        let stale = Response {
            username: "alice".into(),
            realm: "p1".into(),
            counter: 0,
            value: Token::new(&[0; 32]),
            proof: Token::new(&[0; 32]),
            hash: kind,
        };
        assert_eq!(s.chain.verify(&stale, A, B), Err(Refusal::Exhausted));
    }
}

#[test]
fn a_replayed_response_is_refused() {
    let mut s = setup(HashKind::Sha256, 10);
    let ch = s.chain.challenge("p1", &s.n_ap);
    let (_, r) = ClientChain::answer(&s.k_ad, &ch, &s.n_ap, "alice", A, B).unwrap();
    s.chain.verify(&r, A, B).unwrap();
    assert_eq!(s.chain.verify(&r, A, B), Err(Refusal::Counter));
}

#[test]
fn a_lowered_counter_in_the_challenge_is_caught_by_the_client() {
    // The small-n attack: a man in the middle lowers i to harvest the chain below it.
    let s = setup(HashKind::Sha256, 10);
    let mut ch = s.chain.challenge("p1", &s.n_ap);
    ch.counter = 1;
    assert_eq!(
        ClientChain::answer(&s.k_ad, &ch, &s.n_ap, "alice", A, B).map(|(_, r)| r),
        Err(Refusal::NetworkProof)
    );
}

#[test]
fn a_forged_network_proof_or_a_proof_for_another_nonce_is_refused() {
    let s = setup(HashKind::Sha256, 10);
    let mut ch = s.chain.challenge("p1", &s.n_ap);
    ch.proof = Token::new(&[7; 32]);
    assert_eq!(
        ClientChain::answer(&s.k_ad, &ch, &s.n_ap, "alice", A, B).map(|(_, r)| r),
        Err(Refusal::NetworkProof)
    );
    // A challenge replayed from an earlier request (another n_AP) does not verify either.
    let old = s.chain.challenge("p1", &[9; 16]);
    assert_eq!(
        ClientChain::answer(&s.k_ad, &old, &s.n_ap, "alice", A, B).map(|(_, r)| r),
        Err(Refusal::NetworkProof)
    );
    // Nor does one made with another user's key.
    let other = user_key("mallory", "example.com", "secret");
    let ch = s.chain.challenge("p1", &s.n_ap);
    assert_eq!(
        ClientChain::answer(&other, &ch, &s.n_ap, "mallory", A, B).map(|(_, r)| r),
        Err(Refusal::NetworkProof)
    );
}

#[test]
fn a_response_moved_to_another_from_or_to_is_refused() {
    let mut s = setup(HashKind::Sha256, 10);
    let ch = s.chain.challenge("p1", &s.n_ap);
    let (_, r) = ClientChain::answer(&s.k_ad, &ch, &s.n_ap, "alice", A, B).unwrap();
    assert_eq!(
        s.chain.verify(&r, A, b"eve@example.com"),
        Err(Refusal::RequestProof)
    );
    assert_eq!(
        s.chain.verify(&r, b"eve@example.com", B),
        Err(Refusal::RequestProof)
    );
    // Refusals leave the chain where it was: the genuine request still passes.
    s.chain.verify(&r, A, B).unwrap();
}

#[test]
fn a_wrong_chain_value_is_refused_without_advancing() {
    let mut s = setup(HashKind::Sha256, 10);
    let ch = s.chain.challenge("p1", &s.n_ap);
    let (_, mut r) = ClientChain::answer(&s.k_ad, &ch, &s.n_ap, "alice", A, B).unwrap();
    r.value = Token::new(&[5; 32]);
    assert_eq!(s.chain.verify(&r, A, B), Err(Refusal::Chain));
    assert_eq!(s.chain.counter, 10);
}

#[test]
fn field_encoding_is_unambiguous() {
    let k = HashKind::Sha256;
    assert_ne!(
        k.hmac(b"k", &[b"ab", b"c"]),
        k.hmac(b"k", &[b"a", b"bc"]),
        "moving a byte between fields changes the HMAC"
    );
}

#[test]
fn headers_round_trip_and_bad_ones_are_refused() {
    let s = setup(HashKind::Sha256, 10);
    let ch = s.chain.challenge("p1", &s.n_ap);
    assert_eq!(Challenge::parse(ch.render().as_bytes()).unwrap(), ch);
    for offer in [
        Authenticate::Challenge(ch.clone()),
        Authenticate::Hello { realm: "p1".into() },
    ] {
        assert_eq!(
            Authenticate::parse(offer.render().as_bytes()).unwrap(),
            offer
        );
    }
    assert!(Challenge::parse(b"PC realm=\"p1\"").is_err());
    let (_, r) = ClientChain::answer(&s.k_ad, &ch, &s.n_ap, "alice", A, B).unwrap();
    assert_eq!(
        Authorization::parse(r.render().as_bytes()).unwrap(),
        Authorization::Response(r)
    );
    let hello = Hello {
        username: "alice".into(),
        n_ap: s.n_ap,
    };
    assert_eq!(
        Authorization::parse(hello.render().as_bytes()).unwrap(),
        Authorization::Hello(hello)
    );
    // The paper's own example header (MD5, no algorithm parameter) parses; the paper prints
    // ndp with 31 digits, one is added here.
    let paper = br#"PC realm="CISEC", i="10", nda="0ec497d9a5ba5e1f2b2177d83fb3d341", ndp="f1e992583dd5daecdde3309a01e53470", hmac="15f5d33206e79eaea7245682d9953164""#;
    let p = Challenge::parse(paper).unwrap();
    assert_eq!(
        (p.hash, p.counter, p.realm.as_str()),
        (HashKind::Md5, 10, "CISEC")
    );
    for bad in [
        &b"Digest realm=\"x\""[..],
        b"PC realm=\"p\", i=\"-1\", nda=\"00\", ndp=\"00\", hmac=\"00\"",
        b"PC realm=\"p\", i=\"99999999999\"",
        b"PC username=\"a\", nap=\"zz\"",
        b"PC username=\"a\", realm=\"p\", i=\"1\", response=\"00\", hmac=\"00\"",
        b"PC username=\"a\", realm=\"p\", i=\"1\", response=\"00\", hmac=\"00\", algorithm=SHA-1",
        b"PC username=\"a",
        b"PC",
        b"",
    ] {
        assert!(
            Challenge::parse(bad).is_err()
                && Authenticate::parse(bad).is_err()
                && Authorization::parse(bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn a_verified_chain_answers_the_next_counters_without_a_challenge() {
    let mut s = setup(HashKind::Sha256, 4);
    let ch = s.chain.challenge("p1", &s.n_ap);
    let (mut client, first) = ClientChain::answer(&s.k_ad, &ch, &s.n_ap, "alice", A, B).unwrap();
    s.chain.verify(&first, A, B).unwrap();
    // The remaining three values, each bound to its own request, then nothing.
    for i in (1..4).rev() {
        let r = client.next("alice", B, A).unwrap();
        assert_eq!(r.counter, i);
        assert_eq!(s.chain.verify(&r, A, B), Err(Refusal::RequestProof));
        s.chain.verify(&r, B, A).unwrap();
    }
    assert_eq!(s.chain.counter, 0);
    assert!(client.next("alice", A, B).is_none());
    // It still refuses a challenge the network cannot prove.
    let mut forged = s.chain.challenge("p1", &s.n_ap);
    forged.counter = 3;
    forged.proof = Token::new(&[7; 32]);
    assert!(ClientChain::answer(&s.k_ad, &forged, &s.n_ap, "alice", A, B).is_err());
}

#[test]
fn a_client_ahead_of_the_proxy_is_refused_on_the_counter() {
    // Two requests answered ahead arrive out of order: the later counter first.
    let mut s = setup(HashKind::Sha256, 5);
    let ch = s.chain.challenge("p1", &s.n_ap);
    let (mut client, first) = ClientChain::answer(&s.k_ad, &ch, &s.n_ap, "alice", A, B).unwrap();
    s.chain.verify(&first, A, B).unwrap();
    let early = client.next("alice", A, B).unwrap();
    let late = client.next("alice", A, B).unwrap();
    assert_eq!(s.chain.verify(&late, A, B), Err(Refusal::Counter));
    s.chain.verify(&early, A, B).unwrap();
    s.chain.verify(&late, A, B).unwrap();
}

#[test]
fn headers_render_what_they_parsed_even_with_quotes_inside() {
    // Found by the `proxychain` fuzz target: a realm holding quotes rendered as a header that
    // no longer parsed (or parsed as something else).
    let hello = Authenticate::parse(br#"PC realm=r"e"alm"#).unwrap();
    assert_eq!(
        hello,
        Authenticate::Hello {
            realm: r#"r"e"alm"#.into()
        }
    );
    assert_eq!(Authenticate::parse(hello.render().as_bytes()), Ok(hello));
    let a =
        Authorization::parse(br#"PC username="a\"l\\ice", nap="00112233445566778899aabbccddeeff""#)
            .unwrap();
    assert_eq!(a.username(), r#"a"l\ice"#);
    let Authorization::Hello(h) = &a else {
        panic!()
    };
    assert_eq!(Authorization::parse(h.render().as_bytes()), Ok(a.clone()));
}
