//! The floor under STIR/SHAKEN's cost per call: what signing a SHAKEN PASSporT and verifying
//! one cost in this crate alone (ES256 by AWS-LC, the claims, base64 and JSON), with no SIP
//! around them, so the lab's identity rows can be read as this floor plus what the proxy
//! adds (BENCHMARKS.md, "Caller identity").
//!
//! ```text
//! cargo run --release -p sipsec-identity --example es256_floor -- [ROUNDS] [OPS]
//! ```
//!
//! Prints µs per signature and per verification (decode, checks and the signature) for each
//! of ROUNDS rounds (default 5) of OPS operations each (default 20,000), alternating the two.

use sipsec_identity::{cert, passport, sti, Attest, Claims, Roots, Signer, SigningKey, Token};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<u64>().expect("a count"));
    let (rounds, ops) = (args.next().unwrap_or(5), args.next().unwrap_or(20_000));
    let dir = tempfile::tempdir().expect("a scratch directory");
    sti::make(dir.path(), &cert::Authority::Codes(vec!["1234".into()])).expect("certificates");
    let read = |name| std::fs::read(dir.path().join(name)).expect("made above");
    let x5u = "https://cert.example.net/shaken.pem";
    let key = SigningKey::from_pem(&read(sti::SHAKEN_KEY), x5u).expect("the key");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let roots = Roots::from_pem(&read(sti::STI_CA)).expect("the STI-CA");
    let signer = Signer::from_pem(&read(sti::SHAKEN_CERT), &roots, now).expect("the certificate");
    let claims = |i: u64| Claims {
        attest: Attest::A,
        orig: "15551230000".into(),
        dest: vec![format!("1555765{:04}", i % 10_000)],
        iat: now,
        origid: passport::new_origid(),
    };
    let all: Vec<Claims> = (0..ops).map(claims).collect();
    let tokens: Vec<String> = all.iter().map(|c| key.sign(c)).collect();
    println!("round  sign µs  verify µs");
    for round in 1..=rounds {
        let began = Instant::now();
        let mut bytes = 0;
        for c in &all {
            bytes += key.sign(c).len();
        }
        let sign = began.elapsed().as_secs_f64() * 1e6 / ops as f64;
        let began = Instant::now();
        for t in &tokens {
            let token = Token::decode(t).expect("a token we signed");
            token.check_fresh(now, 3600).expect("fresh");
            signer.verify(&token).expect("verifies");
        }
        let verify = began.elapsed().as_secs_f64() * 1e6 / ops as f64;
        println!("{round:>5}  {sign:>7.1}  {verify:>9.1}  ({bytes} bytes signed)");
    }
}
