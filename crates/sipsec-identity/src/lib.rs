//! STIR/SHAKEN caller identity, with no I/O: what an authentication service needs to sign a
//! call and a verification service to check one (RFC 8224, RFC 8225, RFC 8588, ATIS-1000074).
//!
//! A call's INVITE carries an `Identity` header ([`header`]) holding a PASSporT ([`passport`]):
//! a JWS whose claims name the calling and called numbers ([`tn`]), when it was made and how
//! well the signer knows the caller (its attestation), signed with ES256 by a key whose
//! certificate the verifier fetches from the token's `x5u` URL. The verifier checks that
//! certificate's chain to its STI-CA roots and its TNAuthList ([`cert`]), the signature, the
//! token's freshness and its numbers against the request, and that the token was not seen
//! before for another call ([`replay`]). Fetching the certificate is the caller's business
//! (the server does it off its workers, bounded, to the hosts and addresses [`fetch`]
//! allows); everything here is pure and cheap to test. [`sti`] makes a test STI-CA and signing certificate (`sipsec certs
//! --shaken`).
//!
//! Errors are typed ([`Invalid`] for a token, [`CertError`] for a certificate) and each says
//! which RFC 8224 response it calls for.
//!
//! The modules, lowest first; each imports only from the modules before it:
//!
//! - [`tn`]: telephone numbers in RFC 8224 §8's canonical form.
//! - [`error`]: why a token or a certificate was refused, and the SIP status each calls for.
//! - [`passport`]: SHAKEN PASSporTs: claims, signing (ES256) and decoding.
//! - [`header`]: the `Identity` header's value: written and parsed.
//! - [`fetch`]: where a certificate may be fetched from: `https:`, an allow-listed host, a
//!   public (or explicitly listed) address; how long a response may be cached.
//! - [`cert`]: STI-CA roots, and a signing certificate checked against them ([`cert::Signer`]):
//!   its chain, its TNAuthList and the key that verifies tokens.
//! - [`replay`]: tokens already seen within their freshness window.
//! - [`sti`]: a test STI-CA and signing certificate (`sipsec certs --shaken`).

pub mod tn;

pub mod error;

pub mod passport;

pub mod header;

pub mod fetch;

pub mod cert;

pub mod replay;

pub mod sti;

pub use cert::{Roots, Signer};
pub use error::{CertError, Invalid};
pub use passport::{Attest, Claims, SigningKey, Token};
