//! Signing certificates: the STI-CA roots a verifier trusts ([`Roots`]), and a certificate
//! fetched from a token's `x5u` checked against them ([`Signer`]) — its chain (rustls's
//! `webpki`, the path builder rustls itself trusts), its validity, its key (ECDSA P-256, as
//! ES256 needs) and its TNAuthList (RFC 8226): the numbers or service provider codes it
//! may sign for.
//!
//! A [`Signer`] is built once per certificate and kept (the server caches it per URL): it
//! holds the key parsed for verification, so checking a token's signature is one ECDSA
//! verification and nothing else.

use crate::error::{CertError, Invalid};
use crate::passport::Token;
use aws_lc_rs::signature::{ParsedPublicKey, ECDSA_P256_SHA256_FIXED};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, SignatureVerificationAlgorithm, TrustAnchor, UnixTime};
use std::time::Duration;

/// TNAuthList's OID, id-pe-TNAuthList (1.3.6.1.5.5.7.1.26).
pub const TN_AUTH_LIST_OID: &[u64] = &[1, 3, 6, 1, 5, 5, 7, 1, 26];

/// The most certificates [`Signer::from_pem`] reads from one body (the signer's and its
/// intermediates).
pub const MAX_CHAIN: usize = 8;

/// The signature algorithms a chain may use.
static ALGORITHMS: &[&dyn SignatureVerificationAlgorithm] = &[
    webpki::aws_lc_rs::ECDSA_P256_SHA256,
    webpki::aws_lc_rs::ECDSA_P256_SHA384,
    webpki::aws_lc_rs::ECDSA_P384_SHA256,
    webpki::aws_lc_rs::ECDSA_P384_SHA384,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA256,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA384,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA512,
];

/// The STI-CA certificates a verifier trusts.
#[derive(Debug, Clone)]
pub struct Roots {
    anchors: Vec<TrustAnchor<'static>>,
}

impl Roots {
    /// Every certificate in `pem` as a trust anchor; an error when there is none or one is
    /// not a certificate.
    pub fn from_pem(pem: &[u8]) -> Result<Roots, CertError> {
        let mut anchors = Vec::new();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| CertError::Parse(e.to_string()))?;
            let anchor = webpki::anchor_from_trusted_cert(&cert)
                .map_err(|e| CertError::Parse(format!("root: {e}")))?;
            anchors.push(anchor.to_owned());
        }
        if anchors.is_empty() {
            return Err(CertError::Parse("no certificate in the roots' PEM".into()));
        }
        Ok(Roots { anchors })
    }

    /// How many roots.
    pub fn len(&self) -> usize {
        self.anchors.len()
    }

    /// Whether there are none (never, for roots [`Roots::from_pem`] made).
    pub fn is_empty(&self) -> bool {
        self.anchors.is_empty()
    }
}

/// What a certificate's TNAuthList lets it sign for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authority {
    /// Service provider codes only (SHAKEN's usual case): who the signer is, not which
    /// numbers it holds; any number passes, as in ATIS-1000080.
    Codes(Vec<String>),
    /// Telephone numbers, single and ranges (start, count): only these pass.
    Numbers {
        /// Single numbers.
        ones: Vec<String>,
        /// Ranges: a first number and how many follow it, itself included.
        ranges: Vec<(String, u64)>,
    },
}

/// A certificate whose chain checked out: the key that verifies its tokens, what it may sign
/// for, and when it stops being valid.
#[derive(Debug)]
pub struct Signer {
    key: ParsedPublicKey,
    authority: Authority,
    not_after_s: u64,
}

/// Any extended key usage, or none: SHAKEN's certificates are not TLS certificates, and
/// ATIS-1000080 names no purpose they must carry. A malformed extension still fails.
struct AnyPurpose;

impl webpki::ExtendedKeyUsageValidator for AnyPurpose {
    fn validate(&self, iter: webpki::KeyPurposeIdIter<'_, '_>) -> Result<(), webpki::Error> {
        for purpose in iter {
            purpose?;
        }
        Ok(())
    }
}

impl Signer {
    /// A certificate body as an `x5u` URL serves it (PEM: the signer's certificate first,
    /// then any intermediates), checked at `now_s` (seconds since the Unix epoch) against
    /// `roots`.
    pub fn from_pem(pem: &[u8], roots: &Roots, now_s: u64) -> Result<Signer, CertError> {
        let mut certs = Vec::new();
        for cert in CertificateDer::pem_slice_iter(pem) {
            if certs.len() == MAX_CHAIN {
                return Err(CertError::Parse(format!(
                    "more than {MAX_CHAIN} certificates"
                )));
            }
            certs.push(cert.map_err(|e| CertError::Parse(e.to_string()))?);
        }
        let Some((leaf, intermediates)) = certs.split_first() else {
            return Err(CertError::Parse("no PEM certificate in the body".into()));
        };
        let ee =
            webpki::EndEntityCert::try_from(leaf).map_err(|e| CertError::Parse(e.to_string()))?;
        ee.verify_for_usage(
            ALGORITHMS,
            &roots.anchors,
            intermediates,
            UnixTime::since_unix_epoch(Duration::from_secs(now_s)),
            AnyPurpose,
            None,
            None,
        )
        .map_err(|e| CertError::Untrusted(e.to_string()))?;
        let (_, x509) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| CertError::Parse(e.to_string()))?;
        let key = ParsedPublicKey::new(
            &ECDSA_P256_SHA256_FIXED,
            x509.public_key().subject_public_key.data.as_ref(),
        )
        .map_err(|_| CertError::Key)?;
        let mut authority = None;
        for ext in x509.extensions() {
            if ext
                .oid
                .iter()
                .is_some_and(|arcs| arcs.eq(TN_AUTH_LIST_OID.iter().copied()))
            {
                authority = Some(
                    parse_tn_auth_list(ext.value)
                        .ok_or_else(|| CertError::Parse("malformed TNAuthList".into()))?,
                );
            }
        }
        let authority = authority.ok_or_else(|| {
            CertError::Untrusted("no TNAuthList: not a STIR/SHAKEN certificate".into())
        })?;
        Ok(Signer {
            key,
            authority,
            not_after_s: x509.validity().not_after.timestamp().max(0) as u64,
        })
    }

    /// What the certificate may sign for.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// When the certificate expires, seconds since the Unix epoch: a cache keeps it no longer.
    pub fn not_after_s(&self) -> u64 {
        self.not_after_s
    }

    /// Whether the certificate may sign for `tn` (canonical): any number under service
    /// provider codes, a listed one under numbers.
    pub fn authorises(&self, tn: &str) -> Result<(), CertError> {
        match &self.authority {
            Authority::Codes(_) => Ok(()),
            Authority::Numbers { ones, ranges } => {
                let in_range = |(start, count): &(String, u64)| {
                    start.len() == tn.len()
                        && match (start.parse::<u128>(), tn.parse::<u128>()) {
                            (Ok(s), Ok(n)) => n >= s && n - s < u128::from(*count),
                            _ => false,
                        }
                };
                if ones.iter().any(|o| o == tn) || ranges.iter().any(in_range) {
                    Ok(())
                } else {
                    Err(CertError::NotAuthorised(tn.to_string()))
                }
            }
        }
    }

    /// The token's signature checked with this certificate's key.
    pub fn verify(&self, token: &Token<'_>) -> Result<(), Invalid> {
        token.check_signature(&self.key)
    }
}

/// One DER element: its tag, its contents and what follows it. Short and long lengths up to
/// four bytes; `None` for anything truncated or indefinite.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &b| a << 8 | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// An IA5String's text from its tag and contents (printable ASCII only).
fn text(tag: u8, body: &[u8]) -> Option<String> {
    (tag == 0x16 && body.iter().all(|b| (0x20..0x7f).contains(b)))
        .then(|| String::from_utf8_lossy(body).into_owned())
}

/// An element that is exactly one IA5String.
fn ia5(element: &[u8]) -> Option<String> {
    let (tag, body, rest) = tlv(element)?;
    rest.is_empty().then_some(())?;
    text(tag, body)
}

/// RFC 8226's `TNAuthorizationList ::= SEQUENCE SIZE (1..MAX) OF TNEntry`, explicitly tagged:
/// `[0]` a service provider code, `[1]` a range (start, count), `[2]` one number.
fn parse_tn_auth_list(der: &[u8]) -> Option<Authority> {
    let (tag, mut entries, rest) = tlv(der)?;
    if tag != 0x30 || !rest.is_empty() || entries.is_empty() {
        return None;
    }
    let (mut codes, mut ones, mut ranges) = (Vec::new(), Vec::new(), Vec::new());
    while !entries.is_empty() {
        let (tag, body, rest) = tlv(entries)?;
        entries = rest;
        match tag {
            0xa0 => codes.push(ia5(body)?),
            0xa1 => {
                let (seq, range, after) = tlv(body)?;
                if seq != 0x30 || !after.is_empty() {
                    return None;
                }
                let (tag, start, rest) = tlv(range)?;
                let start = text(tag, start)?;
                let (int, count, _) = tlv(rest)?;
                if int != 0x02 || count.is_empty() || count.len() > 9 || count[0] & 0x80 != 0 {
                    return None;
                }
                if count.len() == 9 && count[0] != 0 {
                    return None;
                }
                let count = count.iter().fold(0u64, |a, &b| a << 8 | u64::from(b));
                ranges.push((start, count));
            }
            0xa2 => ones.push(ia5(body)?),
            _ => return None,
        }
    }
    Some(if ones.is_empty() && ranges.is_empty() {
        Authority::Codes(codes)
    } else {
        Authority::Numbers { ones, ranges }
    })
}

/// RFC 8226's TNAuthList in DER, for a certificate maker: service provider codes, or numbers.
pub fn tn_auth_list_der(authority: &Authority) -> Vec<u8> {
    fn element(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let len = body.len();
        if len < 0x80 {
            out.push(len as u8);
        } else if len < 0x100 {
            out.extend([0x81, len as u8]);
        } else {
            out.extend([0x82, (len >> 8) as u8, len as u8]);
        }
        out.extend_from_slice(body);
        out
    }
    let ia5 = |s: &str| element(0x16, s.as_bytes());
    let mut entries = Vec::new();
    match authority {
        Authority::Codes(codes) => {
            for c in codes {
                entries.extend(element(0xa0, &ia5(c)));
            }
        }
        Authority::Numbers { ones, ranges } => {
            for (start, count) in ranges {
                let mut int: Vec<u8> = count.to_be_bytes().to_vec();
                while int.len() > 1 && int[0] == 0 && int[1] & 0x80 == 0 {
                    int.remove(0);
                }
                if int[0] & 0x80 != 0 {
                    int.insert(0, 0);
                }
                let mut seq = ia5(start);
                seq.extend(element(0x02, &int));
                entries.extend(element(0xa1, &element(0x30, &seq)));
            }
            for one in ones {
                entries.extend(element(0xa2, &ia5(one)));
            }
        }
    }
    element(0x30, &entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tn_auth_lists_round_trip() {
        let codes = Authority::Codes(vec!["1234".into()]);
        let der = tn_auth_list_der(&codes);
        // RFC 8226's SPC example shape: SEQUENCE { [0] { IA5String "1234" } }.
        assert_eq!(
            der,
            [0x30, 0x08, 0xa0, 0x06, 0x16, 0x04, b'1', b'2', b'3', b'4']
        );
        assert_eq!(parse_tn_auth_list(&der), Some(codes));
        let numbers = Authority::Numbers {
            ones: vec!["15551230000".into()],
            ranges: vec![("15557000000".into(), 200), ("1".into(), 1 << 40)],
        };
        assert_eq!(
            parse_tn_auth_list(&tn_auth_list_der(&numbers)),
            Some(numbers)
        );
    }

    #[test]
    fn malformed_tn_auth_lists_are_refused() {
        for bad in [
            &[][..],
            &[0x30, 0x00],
            &[0x30, 0x08, 0xa0, 0x06, 0x16, 0x05, b'1', b'2', b'3', b'4'],
            &[0x30, 0x04, 0xa3, 0x02, 0x16, 0x00],
            &[0x30, 0x05, 0xa0, 0x03, 0x16, 0x01, 0x07],
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
            &[0x31, 0x08, 0xa0, 0x06, 0x16, 0x04, b'1', b'2', b'3', b'4'],
        ] {
            assert_eq!(parse_tn_auth_list(bad), None, "{bad:02x?}");
        }
    }

    #[test]
    fn numbers_authorise_only_themselves() {
        let signer = Signer {
            key: ParsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, test_point()).unwrap(),
            authority: Authority::Numbers {
                ones: vec!["15551230000".into()],
                ranges: vec![("15557000000".into(), 200)],
            },
            not_after_s: 0,
        };
        let check = |tn: &str| signer.authorises(tn).is_ok();
        assert!(check("15551230000"));
        assert!(check("15557000000"));
        assert!(check("15557000199"));
        assert!(!check("15557000200"));
        assert!(!check("1555700019"), "a prefix is another number");
        assert!(!check("15551230001"));
        let codes = Signer {
            authority: Authority::Codes(vec!["1234".into()]),
            ..signer
        };
        assert!(codes.authorises("4930123456").is_ok());
    }

    /// A valid P-256 point (the generator).
    fn test_point() -> Vec<u8> {
        let x = "6b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296";
        let y = "4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5";
        let mut p = vec![4u8];
        for h in [x, y] {
            p.extend((0..32).map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap()));
        }
        p
    }
}
