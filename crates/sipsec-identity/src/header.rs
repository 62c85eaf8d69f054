//! The `Identity` header's value (RFC 8224 §4): a PASSporT in full form, then `;info=<x5u>`,
//! `;alg=ES256` and `;ppt=shaken`, as SHAKEN writes it:
//!
//! ```text
//! Identity: eyJhbGciOi….eyJhdHRlc3Qi….sBp3…;info=<https://cert.example.net/shaken.pem>;alg=ES256;ppt=shaken
//! ```
//!
//! [`value`] writes one; [`decode`] reads one into a [`Token`], checking that the header's
//! parameters agree with the token (a header saying one certificate URL while the signed
//! token names another is refused: the token's is the one a verifier may fetch).

use crate::error::Invalid;
use crate::passport::{Claims, SigningKey, Token};

/// The longest Identity value [`decode`] reads (the token's limit and room for the
/// parameters).
pub const MAX_VALUE: usize = crate::passport::MAX_TOKEN + 512;

/// The header value for `claims` signed with `key`.
pub fn value(key: &SigningKey, claims: &Claims) -> String {
    let mut v = key.sign(claims);
    v.push_str(";info=<");
    v.push_str(key.x5u());
    v.push_str(">;alg=ES256;ppt=shaken");
    v
}

/// An Identity value split into its token and parameters, unchecked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts<'a> {
    /// The PASSporT (compact JWS).
    pub token: &'a str,
    /// The `info` URI, without its angle brackets.
    pub info: Option<&'a str>,
    /// The `alg` parameter.
    pub alg: Option<&'a str>,
    /// The `ppt` parameter, unquoted.
    pub ppt: Option<&'a str>,
}

/// Splits a header value; parameters other than `info`, `alg` and `ppt` are skipped.
pub fn parts(value: &str) -> Result<Parts<'_>, Invalid> {
    if value.len() > MAX_VALUE {
        return Err(Invalid::TooLong(value.len()));
    }
    let value = value.trim();
    let (token, params) = value.split_once(';').unwrap_or((value, ""));
    let token = token.trim();
    if token.is_empty() {
        return Err(Invalid::Malformed("the Identity header carries no token"));
    }
    if token.starts_with('.') {
        // RFC 8224's compact form rebuilds the claims from the SIP request; SHAKEN sends
        // the full form, and so do we.
        return Err(Invalid::Malformed(
            "compact-form PASSporTs are not supported",
        ));
    }
    let mut parts = Parts {
        token,
        info: None,
        alg: None,
        ppt: None,
    };
    // `info=<…>` may hold `;` inside its angle brackets: read it up to the `>`.
    let mut rest = params;
    while !rest.is_empty() {
        // A name, then `=value` or nothing (a flag) before the next `;`.
        let (name, after) = match rest.find(['=', ';']) {
            Some(i) if rest.as_bytes()[i] == b'=' => (&rest[..i], &rest[i + 1..]),
            Some(i) => {
                rest = &rest[i + 1..];
                continue;
            }
            None => break,
        };
        let name = name.trim();
        let (val, next) = if after.trim_start().starts_with('<') {
            let after = after.trim_start();
            let close = after
                .find('>')
                .ok_or(Invalid::Malformed("info has no closing '>'"))?;
            let next = after[close + 1..].trim_start();
            let next = next.strip_prefix(';').unwrap_or(next);
            (&after[1..close], next)
        } else {
            after.split_once(';').unwrap_or((after, ""))
        };
        let val = val.trim();
        if name.eq_ignore_ascii_case("info") {
            parts.info = Some(val);
        } else if name.eq_ignore_ascii_case("alg") {
            parts.alg = Some(val);
        } else if name.eq_ignore_ascii_case("ppt") {
            parts.ppt = Some(val.trim_matches('"'));
        }
        rest = next;
    }
    Ok(parts)
}

/// Reads a header value into its token: [`parts`], then [`Token::decode`], then the
/// parameters against the token (`info` the token's `x5u`, `alg` ES256, `ppt` shaken).
pub fn decode(value: &str) -> Result<Token<'_>, Invalid> {
    let p = parts(value)?;
    if let Some(alg) = p.alg.filter(|a| *a != "ES256") {
        return Err(Invalid::Algorithm(alg.to_string()));
    }
    if let Some(ppt) = p.ppt.filter(|p| *p != "shaken") {
        return Err(Invalid::Extension(ppt.to_string()));
    }
    let token = Token::decode(p.token)?;
    if let Some(info) = p.info.filter(|i| *i != token.x5u) {
        return Err(Invalid::CertificateUrl(info.to_string()));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passport::{new_origid, Attest};

    fn key() -> SigningKey {
        crate::passport::test_key("https://cert.example.net/a;b.pem")
    }

    fn claims() -> Claims {
        Claims {
            attest: Attest::B,
            orig: "12155551212".into(),
            dest: vec!["12155551213".into()],
            iat: 1_443_208_345,
            origid: new_origid(),
        }
    }

    #[test]
    fn a_written_value_reads_back() {
        let k = key();
        let v = value(&k, &claims());
        assert!(v.ends_with(";info=<https://cert.example.net/a;b.pem>;alg=ES256;ppt=shaken"));
        let p = parts(&v).unwrap();
        assert_eq!(p.info, Some("https://cert.example.net/a;b.pem"));
        assert_eq!((p.alg, p.ppt), (Some("ES256"), Some("shaken")));
        let t = decode(&v).unwrap();
        assert_eq!(t.claims.orig, "12155551212");
    }

    #[test]
    fn parameters_may_be_spaced_quoted_and_extended() {
        let k = key();
        let jws = k.sign(&claims());
        let v = format!(
            "{jws} ; flag; info = <https://cert.example.net/a;b.pem> ; alg=ES256 ; ppt=\"shaken\";x=1"
        );
        decode(&v).unwrap();
        decode(&jws).unwrap();
    }

    #[test]
    fn parameters_that_disagree_with_the_token_are_refused() {
        let k = key();
        let jws = k.sign(&claims());
        assert_eq!(
            decode(&format!("{jws};info=<https://evil.example/c.pem>")).unwrap_err(),
            Invalid::CertificateUrl("https://evil.example/c.pem".into())
        );
        assert_eq!(
            decode(&format!("{jws};alg=none")).unwrap_err(),
            Invalid::Algorithm("none".into())
        );
        assert_eq!(
            decode(&format!("{jws};ppt=div")).unwrap_err(),
            Invalid::Extension("div".into())
        );
        assert!(matches!(
            decode(&format!("{jws};info=<https://x")),
            Err(Invalid::Malformed(_))
        ));
    }

    #[test]
    fn empty_compact_and_oversized_values_are_refused() {
        assert!(matches!(decode(""), Err(Invalid::Malformed(_))));
        assert!(matches!(
            decode(" ;info=<https://x/c>"),
            Err(Invalid::Malformed(_))
        ));
        assert!(matches!(
            decode("..sig;info=<https://x/c>"),
            Err(Invalid::Malformed(_))
        ));
        let huge = "a".repeat(MAX_VALUE + 1);
        assert_eq!(decode(&huge).unwrap_err(), Invalid::TooLong(MAX_VALUE + 1));
    }
}
