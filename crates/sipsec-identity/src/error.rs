//! Why a token or a certificate was refused, as types (rustls's way: a caller matches on the
//! reason, counts it, and answers with the response RFC 8224 §13.3 gives it — [`Invalid::status`],
//! [`CertError::status`]).

use thiserror::Error;

/// A status code and reason phrase.
pub type Status = (u16, &'static str);

/// 403 with RFC 8224 §6.2.1's reason: `iat` is outside the freshness window.
pub const STALE_DATE: Status = (403, "Stale Date");
/// 428: the request carries no Identity header and policy requires one.
pub const USE_IDENTITY_HEADER: Status = (428, "Use Identity Header");
/// 436: the certificate the `info`/`x5u` URL names cannot be had.
pub const BAD_IDENTITY_INFO: Status = (436, "Bad Identity Info");
/// 437: the certificate was had but is not one this verifier accepts.
pub const UNSUPPORTED_CREDENTIAL: Status = (437, "Unsupported Credential");
/// 438: the header or its token is malformed, or its signature does not verify.
pub const INVALID_IDENTITY_HEADER: Status = (438, "Invalid Identity Header");

/// Why an Identity header or its PASSporT was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Invalid {
    /// The header or the token is not what RFC 8224/8225 say (a part missing, bad base64,
    /// bad JSON, a claim of the wrong type). Says which part.
    #[error("malformed Identity: {0}")]
    Malformed(&'static str),
    /// Longer than the verifier reads.
    #[error("Identity header of {0} bytes is over the limit")]
    TooLong(usize),
    /// `alg` other than ES256 (including `none`): the only algorithm SHAKEN allows.
    #[error("unsupported alg {0:?}: SHAKEN signs with ES256 only")]
    Algorithm(String),
    /// `ppt` other than `shaken`, or `typ` other than `passport`.
    #[error("unsupported PASSporT type {0:?}")]
    Extension(String),
    /// `x5u` is not an `https:` URL (or the header's `info` differs from it).
    #[error("x5u {0:?} is not an https URL the token and header agree on")]
    CertificateUrl(String),
    /// `iat` is further from now than the freshness window, in the past or the future.
    #[error("iat is {age_s} s from now, beyond the {window_s} s window")]
    Stale {
        /// Now minus `iat`, seconds (negative: from the future).
        age_s: i64,
        /// The window it had to fall in.
        window_s: u64,
    },
    /// `orig` is not the calling number the request names.
    #[error("orig {token:?} is not the caller {request:?}")]
    Orig {
        /// The token's.
        token: String,
        /// The request's (From or P-Asserted-Identity), canonical; empty when it names none.
        request: String,
    },
    /// No `dest` is the called number the request names.
    #[error("dest {token:?} does not name the callee {request:?}")]
    Dest {
        /// The token's.
        token: Vec<String>,
        /// The request's (To or Request-URI), canonical; empty when it names none.
        request: String,
    },
    /// The signature does not verify with the signer's key.
    #[error("the signature does not verify")]
    Signature,
    /// The token was seen before, within its window, for another call.
    #[error("the token was already used for another call")]
    Replayed,
}

impl Invalid {
    /// The response RFC 8224 gives this failure.
    pub fn status(&self) -> Status {
        match self {
            Invalid::Stale { .. } => STALE_DATE,
            Invalid::CertificateUrl(_) => BAD_IDENTITY_INFO,
            _ => INVALID_IDENTITY_HEADER,
        }
    }

    /// A short fixed name for counting (a metric label).
    pub fn name(&self) -> &'static str {
        match self {
            Invalid::Malformed(_) | Invalid::TooLong(_) => "malformed",
            Invalid::Algorithm(_) => "algorithm",
            Invalid::Extension(_) => "extension",
            Invalid::CertificateUrl(_) => "x5u",
            Invalid::Stale { .. } => "stale",
            Invalid::Orig { .. } => "orig",
            Invalid::Dest { .. } => "dest",
            Invalid::Signature => "signature",
            Invalid::Replayed => "replayed",
        }
    }
}

/// Why a signing certificate was not had or not accepted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CertError {
    /// Fetching it failed (refused by the allow-list, unreachable, too slow, too big, not
    /// HTTP 200). Says why, for the log.
    #[error("certificate fetch failed: {0}")]
    Fetch(String),
    /// The body is not PEM certificates, or the first is not X.509 DER.
    #[error("not a certificate: {0}")]
    Parse(String),
    /// Its chain does not lead to a configured STI-CA root (or is expired, or misused).
    #[error("certificate not trusted: {0}")]
    Untrusted(String),
    /// Its key is not an ECDSA P-256 key.
    #[error("the certificate's key is not ECDSA P-256")]
    Key,
    /// Its TNAuthList lists numbers and the caller's is not among them.
    #[error("the certificate does not cover the number {0}")]
    NotAuthorised(String),
}

impl CertError {
    /// The response RFC 8224 gives this failure.
    pub fn status(&self) -> Status {
        match self {
            CertError::Fetch(_) => BAD_IDENTITY_INFO,
            _ => UNSUPPORTED_CREDENTIAL,
        }
    }

    /// A short fixed name for counting (a metric label).
    pub fn name(&self) -> &'static str {
        match self {
            CertError::Fetch(_) => "fetch",
            CertError::Parse(_) => "parse",
            CertError::Untrusted(_) => "untrusted",
            CertError::Key => "key",
            CertError::NotAuthorised(_) => "not_authorised",
        }
    }
}
