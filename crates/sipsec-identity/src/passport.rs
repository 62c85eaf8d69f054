//! SHAKEN PASSporTs (RFC 8225, RFC 8588): the claims, signing them (ES256) into a compact
//! JWS, and decoding one back with every check that needs no certificate.
//!
//! A PASSporT is `BASE64URL(header) . BASE64URL(payload) . BASE64URL(signature)`: the header
//! `{"alg":"ES256","ppt":"shaken","typ":"passport","x5u":…}`, the payload `{"attest":…,
//! "dest":{"tn":[…]},"iat":…,"orig":{"tn":…},"origid":…}`, and an ECDSA P-256 signature over
//! the first two parts as JWS wants it (r‖s, 64 bytes). We write keys in lexicographic order
//! with no white space (RFC 8225 §9's form), so a token is the same bytes whoever makes it;
//! a verifier checks the signature over the bytes it was sent, whatever their order.
//!
//! Signing costs one ECDSA signature and two small base64 encodings; the header part is
//! encoded once per key ([`SigningKey`]). Decoding ([`Token::decode`]) reads at most
//! [`MAX_TOKEN`] bytes and refuses anything but ES256 and `ppt` `shaken` before it looks at
//! the claims, so an `alg` of `none` never gets near a signature check.

use crate::error::Invalid;
use crate::tn;
use aws_lc_rs::signature::{
    EcdsaKeyPair, KeyPair, ParsedPublicKey, ECDSA_P256_SHA256_FIXED_SIGNING,
};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use serde::Deserialize;

/// The longest token [`Token::decode`] reads: a SHAKEN token is ~450 bytes; a few `dest`
/// numbers and a long `x5u` stay far below this.
pub const MAX_TOKEN: usize = 4096;

/// How well the signer knows the caller (ATIS-1000074 §5.2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attest {
    /// Full: the signer authenticated the caller and knows the number is theirs.
    A,
    /// Partial: the signer authenticated the caller but cannot vouch for the number.
    B,
    /// Gateway: the signer only knows where the call entered its network.
    C,
}

impl Attest {
    /// `A`, `B` or `C`.
    pub fn as_str(self) -> &'static str {
        match self {
            Attest::A => "A",
            Attest::B => "B",
            Attest::C => "C",
        }
    }

    /// `A`, `B` or `C` (case as written); `None` otherwise.
    pub fn parse(s: &str) -> Option<Attest> {
        match s {
            "A" => Some(Attest::A),
            "B" => Some(Attest::B),
            "C" => Some(Attest::C),
            _ => None,
        }
    }

    /// The lower of two attestations (C is lowest): a rule may lower one, never raise it.
    pub fn min(self, other: Attest) -> Attest {
        if self.as_str() >= other.as_str() {
            self
        } else {
            other
        }
    }
}

/// What a SHAKEN PASSporT says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The attestation.
    pub attest: Attest,
    /// The calling number, canonical ([`tn::canonical`]).
    pub orig: String,
    /// The called numbers, canonical.
    pub dest: Vec<String>,
    /// When the token was made, seconds since the Unix epoch.
    pub iat: u64,
    /// The signer's opaque identifier of where the call entered its network (a UUID).
    pub origid: String,
}

/// Why a signing key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The PEM holds no private key.
    #[error("no private key in the PEM: {0}")]
    Pem(String),
    /// The key is not an ECDSA P-256 key.
    #[error("not an ECDSA P-256 private key: {0}")]
    Key(String),
    /// `x5u` is not an `https:` URL.
    #[error("x5u {0:?} must be an https: URL")]
    Url(String),
}

/// An ES256 key and the `x5u` its certificate is published at: what an authentication
/// service signs with.
pub struct SigningKey {
    key: EcdsaKeyPair,
    x5u: String,
    /// The JWS header, base64url: the same for every token this key signs.
    header: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("x5u", &self.x5u)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// The first private key in `pem` (PKCS#8 or SEC1 `EC PRIVATE KEY`, as openssl and
    /// `sipsec certs --shaken` write them), publishing its certificate at `x5u`.
    pub fn from_pem(pem: &[u8], x5u: &str) -> Result<SigningKey, KeyError> {
        use rustls_pki_types::pem::PemObject;
        let der = rustls_pki_types::PrivateKeyDer::from_pem_slice(pem)
            .map_err(|e| KeyError::Pem(e.to_string()))?;
        SigningKey::from_der(der.secret_der(), x5u)
    }

    /// A private key in DER (PKCS#8 or SEC1).
    pub fn from_der(der: &[u8], x5u: &str) -> Result<SigningKey, KeyError> {
        if !is_https(x5u) {
            return Err(KeyError::Url(x5u.to_string()));
        }
        let key = EcdsaKeyPair::from_private_key_der(&ECDSA_P256_SHA256_FIXED_SIGNING, der)
            .map_err(|e| KeyError::Key(e.to_string()))?;
        let mut json = String::from(r#"{"alg":"ES256","ppt":"shaken","typ":"passport","x5u":"#);
        json_string(&mut json, x5u);
        json.push('}');
        Ok(SigningKey {
            key,
            x5u: x5u.to_string(),
            header: B64.encode(json),
        })
    }

    /// Where verifiers fetch this key's certificate.
    pub fn x5u(&self) -> &str {
        &self.x5u
    }

    /// The public key (an uncompressed P-256 point), as the certificate carries it.
    pub fn public_key(&self) -> &[u8] {
        self.key.public_key().as_ref()
    }

    /// `claims` signed: the compact JWS.
    pub fn sign(&self, claims: &Claims) -> String {
        let mut json = String::with_capacity(160);
        json.push_str(r#"{"attest":""#);
        json.push_str(claims.attest.as_str());
        json.push_str(r#"","dest":{"tn":["#);
        for (i, tn) in claims.dest.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json_string(&mut json, tn);
        }
        json.push_str(r#"]},"iat":"#);
        json.push_str(&claims.iat.to_string());
        json.push_str(r#","orig":{"tn":"#);
        json_string(&mut json, &claims.orig);
        json.push_str(r#"},"origid":"#);
        json_string(&mut json, &claims.origid);
        json.push('}');
        let mut token = String::with_capacity(self.header.len() + json.len() * 4 / 3 + 92);
        token.push_str(&self.header);
        token.push('.');
        B64.encode_string(json, &mut token);
        let rng = aws_lc_rs::rand::SystemRandom::new();
        // Signing with a valid key and the system's random source fails only if the process's
        // crypto library is broken; a token we cannot sign is a bug, not an input.
        let signature = self
            .key
            .sign(&rng, token.as_bytes())
            .expect("ECDSA P-256 signing with a loaded key");
        token.push('.');
        B64.encode_string(signature.as_ref(), &mut token);
        token
    }
}

/// A fresh key publishing its certificate at `x5u`, for tests.
#[cfg(test)]
pub(crate) fn test_key(x5u: &str) -> SigningKey {
    let doc = EcdsaKeyPair::generate_pkcs8(
        &ECDSA_P256_SHA256_FIXED_SIGNING,
        &aws_lc_rs::rand::SystemRandom::new(),
    )
    .expect("a new P-256 key");
    SigningKey::from_der(doc.as_ref(), x5u).expect("a new key loads")
}

/// A fresh `origid`: a random (version 4) UUID.
pub fn new_origid() -> String {
    let mut b = [0u8; 16];
    // As for signing: the system's random source failing is no input error.
    aws_lc_rs::rand::fill(&mut b).expect("the system random source");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// `s` as a JSON string, quoted and escaped, appended to `out`.
fn json_string(out: &mut String, s: &str) {
    if s.bytes()
        .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b < 0x7f)
    {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        // Serialising a &str to JSON cannot fail.
        out.push_str(&serde_json::to_string(s).expect("a string serialises"));
    }
}

/// An `https:` URL of printable ASCII with nothing after the scheme that would end it in a
/// header (`<`, `>`, `"`, white space).
pub(crate) fn is_https(url: &str) -> bool {
    url.len() > 8
        && url
            .get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
        && url
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'<' | b'>' | b'"'))
}

#[derive(Deserialize)]
struct HeaderJson {
    alg: Option<String>,
    /// JWS `crit` (RFC 7515 §4.1.11): extensions a verifier must understand; SHAKEN has none.
    crit: Option<serde_json::Value>,
    ppt: Option<String>,
    typ: Option<String>,
    x5u: Option<String>,
}

#[derive(Deserialize)]
struct OrigJson {
    tn: Option<String>,
}

#[derive(Deserialize)]
struct DestJson {
    tn: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct PayloadJson {
    attest: Option<String>,
    dest: Option<DestJson>,
    iat: Option<u64>,
    orig: Option<OrigJson>,
    origid: Option<String>,
}

/// A decoded PASSporT: its claims, where its certificate is, and what its signature covers.
/// Nothing here is trusted until the signer's certificate (`cert::Signer::verify`) has checked the signature.
#[derive(Debug, Clone)]
pub struct Token<'a> {
    /// The signing input: the first two parts and the dot between them.
    pub signed: &'a str,
    /// The signature, r‖s.
    pub signature: [u8; 64],
    /// Where the signer's certificate is (`https:`).
    pub x5u: String,
    /// The claims.
    pub claims: Claims,
}

impl<'a> Token<'a> {
    /// Decodes a compact JWS: three parts, a header saying ES256, `shaken` and `passport` with
    /// an `https:` `x5u`, and every SHAKEN claim of the right type with numbers canonical.
    pub fn decode(jws: &'a str) -> Result<Token<'a>, Invalid> {
        if jws.len() > MAX_TOKEN {
            return Err(Invalid::TooLong(jws.len()));
        }
        let mut parts = jws.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Invalid::Malformed(
                "a PASSporT has three dot-separated parts",
            ));
        };
        let header: HeaderJson = serde_json::from_slice(
            &B64.decode(header)
                .map_err(|_| Invalid::Malformed("header is not base64url"))?,
        )
        .map_err(|_| Invalid::Malformed("header is not a JSON object"))?;
        match header.alg.as_deref() {
            Some("ES256") => {}
            other => return Err(Invalid::Algorithm(other.unwrap_or("").to_string())),
        }
        match header.ppt.as_deref() {
            Some("shaken") => {}
            other => return Err(Invalid::Extension(other.unwrap_or("").to_string())),
        }
        if header.crit.is_some() {
            return Err(Invalid::Extension("crit".into()));
        }
        if header.typ.as_deref() != Some("passport") {
            return Err(Invalid::Extension(header.typ.unwrap_or_default()));
        }
        let x5u = header.x5u.unwrap_or_default();
        if !is_https(&x5u) {
            return Err(Invalid::CertificateUrl(x5u));
        }
        let payload: PayloadJson = serde_json::from_slice(
            &B64.decode(payload)
                .map_err(|_| Invalid::Malformed("payload is not base64url"))?,
        )
        .map_err(|_| Invalid::Malformed("payload is not the SHAKEN claims"))?;
        let attest = payload
            .attest
            .as_deref()
            .and_then(Attest::parse)
            .ok_or(Invalid::Malformed("attest is not A, B or C"))?;
        let orig = payload
            .orig
            .and_then(|o| o.tn)
            .and_then(|t| tn::canonical(&t))
            .ok_or(Invalid::Malformed("orig.tn is not a telephone number"))?;
        let dest = payload
            .dest
            .and_then(|d| d.tn)
            .filter(|d| !d.is_empty() && d.len() <= 16)
            .ok_or(Invalid::Malformed(
                "dest.tn is not a list of telephone numbers",
            ))?
            .iter()
            .map(|t| tn::canonical(t))
            .collect::<Option<Vec<_>>>()
            .ok_or(Invalid::Malformed(
                "dest.tn is not a list of telephone numbers",
            ))?;
        let iat = payload.iat.ok_or(Invalid::Malformed("iat is not a time"))?;
        let origid = payload
            .origid
            .filter(|o| !o.is_empty())
            .ok_or(Invalid::Malformed("origid is missing"))?;
        let mut sig = [0u8; 64];
        match B64.decode(signature) {
            Ok(s) if s.len() == 64 => sig.copy_from_slice(&s),
            _ => return Err(Invalid::Malformed("signature is not 64 bytes of base64url")),
        }
        Ok(Token {
            signed: &jws[..jws.len() - signature.len() - 1],
            signature: sig,
            x5u,
            claims: Claims {
                attest,
                orig,
                dest,
                iat,
                origid,
            },
        })
    }

    /// `iat` within `window_s` of `now_s`, either side (a clock ahead of ours is as suspect as
    /// a token held back).
    pub fn check_fresh(&self, now_s: u64, window_s: u64) -> Result<(), Invalid> {
        let age_s = now_s as i64 - self.claims.iat.min(i64::MAX as u64) as i64;
        if age_s.unsigned_abs() > window_s {
            return Err(Invalid::Stale { age_s, window_s });
        }
        Ok(())
    }

    /// The token's numbers against the request's: `orig` must be the caller's number, and
    /// one of `dest` the callee's (both canonical; `None` when the request names no number,
    /// which no token matches).
    pub fn check_numbers(&self, orig: Option<&str>, dest: Option<&str>) -> Result<(), Invalid> {
        if orig != Some(self.claims.orig.as_str()) {
            return Err(Invalid::Orig {
                token: self.claims.orig.clone(),
                request: orig.unwrap_or_default().to_string(),
            });
        }
        if !dest.is_some_and(|d| self.claims.dest.iter().any(|t| t == d)) {
            return Err(Invalid::Dest {
                token: self.claims.dest.clone(),
                request: dest.unwrap_or_default().to_string(),
            });
        }
        Ok(())
    }

    /// The signature checked with `key` (the signer's certificate's).
    pub fn check_signature(&self, key: &ParsedPublicKey) -> Result<(), Invalid> {
        key.verify_sig(self.signed.as_bytes(), &self.signature)
            .map_err(|_| Invalid::Signature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED;

    fn key() -> SigningKey {
        test_key("https://cert.example.net/shaken.pem")
    }

    fn claims() -> Claims {
        Claims {
            attest: Attest::A,
            orig: "15551234567".into(),
            dest: vec!["15557654321".into()],
            iat: 1_700_000_000,
            origid: new_origid(),
        }
    }

    fn public(k: &SigningKey) -> ParsedPublicKey {
        ParsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, k.public_key()).unwrap()
    }

    #[test]
    fn a_signed_token_decodes_to_its_claims_and_verifies() {
        let k = key();
        let jws = k.sign(&claims());
        let t = Token::decode(&jws).unwrap();
        assert_eq!(t.claims, claims_with_origid(&t.claims.origid));
        assert_eq!(t.x5u, "https://cert.example.net/shaken.pem");
        t.check_signature(&public(&k)).unwrap();
        t.check_fresh(1_700_000_030, 60).unwrap();
        t.check_numbers(Some("15551234567"), Some("15557654321"))
            .unwrap();
        // RFC 8225 §9's form: lexicographic keys, no white space.
        let payload = B64.decode(jws.split('.').nth(1).unwrap()).unwrap();
        let text = String::from_utf8(payload).unwrap();
        assert!(text.starts_with(r#"{"attest":"A","dest":{"tn":["15557654321"]},"iat":1700000000,"orig":{"tn":"15551234567"},"origid":""#), "{text}");
    }

    fn claims_with_origid(origid: &str) -> Claims {
        Claims {
            origid: origid.to_string(),
            ..claims()
        }
    }

    /// The STIR working group's published PASSporT example (draft-ietf-stir-passport-05,
    /// Appendix A: a P-256 key as SEC1 PEM, its public key, and a token its authors signed
    /// with it). Our key loading reads the key to the published public key, and our
    /// signature check accepts that token — an ES256 JWS another implementation made — over
    /// its signing input and nothing else. As SHAKEN the token is refused: a base PASSporT
    /// (no `ppt`, a URI destination, `iat` a string), not one a SHAKEN verifier accepts.
    #[test]
    fn the_passport_drafts_published_example_verifies() {
        const KEY: &str = "-----BEGIN EC PRIVATE KEY-----\n\
            MHcCAQEEIFeZ1R208QCvcu5GuYyMfG4W7sH4m99/7eHSDLpdYllFoAoGCCqGSM49\n\
            AwEHoUQDQgAE8HNbQd/TmvCKwPKHkMF9fScavGeH78YTU8qLS8I5HLHSSmlATLcs\n\
            lQMhNC/OhlWBYC626nIlo7XeebYS7Sb37g==\n\
            -----END EC PRIVATE KEY-----\n";
        const PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\n\
            MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE8HNbQd/TmvCKwPKHkMF9fScavGeH\n\
            78YTU8qLS8I5HLHSSmlATLcslQMhNC/OhlWBYC626nIlo7XeebYS7Sb37g==\n\
            -----END PUBLIC KEY-----\n";
        const TOKEN: &str = "eyJhbGciOiJFUzI1NiIsInR5cCI6InBhc3Nwb3J0IiwieDV1IjoiaHR0cHM6Ly9j\
            ZXJ0LmV4YW1wbGUub3JnL3Bhc3Nwb3J0LmNlciJ9.eyJkZXN0Ijp7InVyaSI6WyJzaXA6YWxpY2VAZXhhbXBs\
            ZS5jb20iXX0sImlhdCI6IjE0NDMyMDgzNDUiLCJvcmlnIjp7InRuIjoiMTIxNTU1NTEyMTIifX0.rq3pjT1ho\
            RwakEGjHCnWSwUnshd0-zJ6F1VOgFWSjHBr8Qjpjlk-cpFYpFYsojNCpTzO3QfPOlckGaS6hEck7w";
        use rustls_pki_types::pem::PemObject;
        let key =
            SigningKey::from_pem(KEY.as_bytes(), "https://cert.example.org/passport.cer").unwrap();
        let spki =
            rustls_pki_types::SubjectPublicKeyInfoDer::from_pem_slice(PUBLIC.as_bytes()).unwrap();
        // The SubjectPublicKeyInfo ends with the uncompressed point.
        assert!(spki.as_ref().ends_with(key.public_key()));
        let (signed, sig) = TOKEN.rsplit_once('.').unwrap();
        let mut signature = [0u8; 64];
        signature.copy_from_slice(&B64.decode(sig).unwrap());
        let token = Token {
            signed,
            signature,
            x5u: key.x5u().to_string(),
            claims: claims(),
        };
        token.check_signature(&public(&key)).unwrap();
        let shorter = Token {
            signed: &signed[..signed.len() - 1],
            ..token.clone()
        };
        assert_eq!(
            shorter.check_signature(&public(&key)),
            Err(Invalid::Signature)
        );
        assert!(matches!(Token::decode(TOKEN), Err(Invalid::Extension(_))));
    }

    #[test]
    fn another_key_or_a_changed_byte_fails_the_signature() {
        let (k, other) = (key(), key());
        let jws = k.sign(&claims());
        let t = Token::decode(&jws).unwrap();
        assert_eq!(t.check_signature(&public(&other)), Err(Invalid::Signature));
        // The payload re-encoded with another caller, the signature kept.
        let mut parts: Vec<String> = jws.split('.').map(String::from).collect();
        let payload = String::from_utf8(B64.decode(&parts[1]).unwrap()).unwrap();
        parts[1] = B64.encode(payload.replace("15551234567", "15550000000"));
        let forged = parts.join(".");
        let t = Token::decode(&forged).unwrap();
        assert_eq!(t.check_signature(&public(&k)), Err(Invalid::Signature));
    }

    #[test]
    fn alg_none_and_other_algorithms_are_refused_before_the_claims() {
        let body = B64.encode(r#"{"attest":"A"}"#);
        for alg in ["none", "HS256", "RS256", "ES384"] {
            let h = B64.encode(format!(
                r#"{{"alg":"{alg}","ppt":"shaken","typ":"passport","x5u":"https://x/c.pem"}}"#
            ));
            let jws = format!("{h}.{body}.");
            assert_eq!(
                Token::decode(&jws).unwrap_err(),
                Invalid::Algorithm(alg.into())
            );
        }
        let h = B64.encode(r#"{"ppt":"shaken"}"#);
        assert_eq!(
            Token::decode(&format!("{h}.{body}.")).unwrap_err(),
            Invalid::Algorithm(String::new())
        );
    }

    #[test]
    fn other_extensions_and_certificate_urls_are_refused() {
        let body = B64.encode("{}");
        let case =
            |header: &str| Token::decode(&format!("{}.{body}.AA", B64.encode(header))).map(|_| ());
        assert_eq!(
            case(r#"{"alg":"ES256","ppt":"div","typ":"passport","x5u":"https://x/c"}"#)
                .unwrap_err(),
            Invalid::Extension("div".into())
        );
        assert_eq!(
            case(r#"{"alg":"ES256","ppt":"shaken","typ":"JWT","x5u":"https://x/c"}"#).unwrap_err(),
            Invalid::Extension("JWT".into())
        );
        assert_eq!(
            case(r#"{"alg":"ES256","crit":["x"],"ppt":"shaken","typ":"passport","x5u":"https://x/c"}"#)
                .unwrap_err(),
            Invalid::Extension("crit".into())
        );
        for url in [
            "http://x/c.pem",
            "file:///etc/passwd",
            "",
            "https://",
            "https://x/c\u{a0}",
        ] {
            let h = format!(r#"{{"alg":"ES256","ppt":"shaken","typ":"passport","x5u":"{url}"}}"#);
            assert_eq!(case(&h).unwrap_err(), Invalid::CertificateUrl(url.into()));
        }
    }

    #[test]
    fn malformed_tokens_say_which_part() {
        let k = key();
        let jws = k.sign(&claims());
        let (h, rest) = jws.split_once('.').unwrap();
        let (p, s) = rest.split_once('.').unwrap();
        let bad =
            |payload: &str| Token::decode(&format!("{h}.{}.{s}", B64.encode(payload))).unwrap_err();
        assert!(matches!(Token::decode("a.b"), Err(Invalid::Malformed(_))));
        assert!(matches!(
            Token::decode("a.b.c.d"),
            Err(Invalid::Malformed(_))
        ));
        assert!(matches!(
            Token::decode(&format!("{h}.{p}.@@")),
            Err(Invalid::Malformed(_))
        ));
        assert!(matches!(
            Token::decode(&format!("{h}.{p}.AAAA")),
            Err(Invalid::Malformed(_))
        ));
        assert!(matches!(
            Token::decode(&format!("!!.{p}.{s}")),
            Err(Invalid::Malformed(_))
        ));
        assert!(matches!(bad("[]"), Invalid::Malformed(_)));
        assert!(matches!(
            bad(r#"{"attest":"D","dest":{"tn":["1"]},"iat":1,"orig":{"tn":"1"},"origid":"x"}"#),
            Invalid::Malformed(_)
        ));
        assert!(matches!(
            bad(r#"{"attest":"A","dest":{"tn":[]},"iat":1,"orig":{"tn":"1"},"origid":"x"}"#),
            Invalid::Malformed(_)
        ));
        assert!(matches!(
            bad(r#"{"attest":"A","dest":{"tn":["1"]},"iat":-5,"orig":{"tn":"1"},"origid":"x"}"#),
            Invalid::Malformed(_)
        ));
        assert!(matches!(
            bad(r#"{"attest":"A","dest":{"tn":["1"]},"iat":1,"orig":{"tn":"alice"},"origid":"x"}"#),
            Invalid::Malformed(_)
        ));
        assert!(matches!(
            bad(r#"{"attest":"A","dest":{"tn":["1"]},"iat":1,"orig":{"tn":"1"}}"#),
            Invalid::Malformed(_)
        ));
        assert_eq!(
            Token::decode(&"a".repeat(MAX_TOKEN + 1)).unwrap_err(),
            Invalid::TooLong(MAX_TOKEN + 1)
        );
    }

    #[test]
    fn stale_and_future_tokens_and_other_numbers_are_refused() {
        let k = key();
        let jws = k.sign(&claims());
        let t = Token::decode(&jws).unwrap();
        assert_eq!(
            t.check_fresh(1_700_000_061, 60),
            Err(Invalid::Stale {
                age_s: 61,
                window_s: 60
            })
        );
        assert!(t.check_fresh(1_699_999_000, 60).is_err(), "from the future");
        assert!(t.check_fresh(1_699_999_940, 60).is_ok());
        assert!(matches!(
            t.check_numbers(Some("15550000000"), Some("15557654321")),
            Err(Invalid::Orig { .. })
        ));
        assert!(matches!(
            t.check_numbers(Some("15551234567"), Some("15550000000")),
            Err(Invalid::Dest { .. })
        ));
        assert!(matches!(
            t.check_numbers(None, Some("15557654321")),
            Err(Invalid::Orig { .. })
        ));
    }

    #[test]
    fn attestation_only_goes_down() {
        assert_eq!(Attest::A.min(Attest::B), Attest::B);
        assert_eq!(Attest::C.min(Attest::A), Attest::C);
        assert_eq!(Attest::B.min(Attest::B), Attest::B);
    }

    #[test]
    fn origids_are_version_4_uuids() {
        let a = new_origid();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_ne!(a, new_origid());
    }
}
