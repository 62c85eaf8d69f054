//! `[identity]`: STIR/SHAKEN. The authentication service (`sign`): the INVITEs of callers
//! this server vouches for are signed (RFC 8224's `Identity` header with a SHAKEN PASSporT)
//! with the configured ES256 key, naming the `x5u` URL verifiers fetch its certificate from.
//! The verification service (`verify`): INVITEs that arrive with one are checked — token,
//! freshness, numbers, the certificate fetched from `x5u` (allow-listed, bounded, cached) and
//! its chain to `roots`, the signature, replays — and marked with the result or refused, per
//! `policy`.
//!
//! Attestation (ATIS-1000074 §5.2.3): a caller the gate authenticated (digest or Proxychain)
//! whose user name is the calling number gets `attest` (A by default); an authenticated caller
//! calling from another number gets at most B; a request vouched for only by its trusted
//! source (or an open proxy, with authentication off) gets `attest_trusted` (C by default:
//! we only know where the call entered).

use anyhow::{bail, Result};
use serde::Deserialize;
use sipsec_identity::Attest;
use std::path::PathBuf;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawIdentity {
    sign: bool,
    key: Option<String>,
    x5u: Option<String>,
    attest: String,
    attest_trusted: String,
    verify: bool,
    roots: Option<String>,
    fetch_allow: Vec<String>,
    fetch_ca: Option<String>,
    freshness_s: u64,
    policy: String,
    require: bool,
    fetch_timeout_ms: u64,
    fetch_max_bytes: usize,
    fetch_concurrency: usize,
    cert_ttl_s: u64,
    cert_max_ttl_s: u64,
    cert_failure_ttl_s: u64,
    replay_entries: usize,
}

impl Default for RawIdentity {
    fn default() -> Self {
        RawIdentity {
            sign: false,
            key: None,
            x5u: None,
            attest: "A".into(),
            attest_trusted: "C".into(),
            verify: false,
            roots: None,
            fetch_allow: Vec::new(),
            fetch_ca: None,
            freshness_s: 60,
            policy: "mark".into(),
            require: false,
            fetch_timeout_ms: 2_000,
            fetch_max_bytes: 65_536,
            fetch_concurrency: 8,
            cert_ttl_s: 3_600,
            cert_max_ttl_s: 86_400,
            cert_failure_ttl_s: 30,
            replay_entries: 100_000,
        }
    }
}

/// The authentication service's settings (`[identity] sign = true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignConfig {
    /// The ES256 (P-256) private key, PEM (`key`); relative paths are the config file's.
    pub key: PathBuf,
    /// Where verifiers fetch our certificate (`x5u`, an `https:` URL).
    pub x5u: String,
    /// The attestation of an authenticated caller calling from its own number (`attest`).
    pub attest: Attest,
    /// The attestation of a caller vouched for by its source only (`attest_trusted`).
    pub attest_trusted: Attest,
}

/// What the verification service does with an INVITE whose Identity fails (`policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Pass it on, its caller's number marked `verstat=TN-Validation-Failed` (3GPP TS 24.229):
    /// the callee's side decides (the default).
    Mark,
    /// Answer it with RFC 8224's response (403 Stale Date, 436, 437, 438).
    Reject,
}

/// The verification service's settings (`[identity] verify = true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyConfig {
    /// The STI-CA roots, PEM (`roots`); relative paths are the config file's.
    pub roots: PathBuf,
    /// Hosts (and, explicitly, addresses) `x5u` may name (`fetch_allow`).
    pub fetch_allow: Vec<String>,
    /// More CAs for the HTTPS fetches, beside the system's (`fetch_ca`).
    pub fetch_ca: Option<PathBuf>,
    /// How far `iat` may be from now, seconds (`freshness_s`).
    pub freshness_s: u64,
    /// What a failure does (`policy`).
    pub policy: Policy,
    /// INVITEs without Identity are answered 428, but for authenticated users' and trusted
    /// networks'; with authentication off, everyone's (`require`).
    pub require: bool,
    /// All of one fetch, ms (`fetch_timeout_ms`).
    pub fetch_timeout_ms: u64,
    /// The largest certificate body read (`fetch_max_bytes`).
    pub fetch_max_bytes: usize,
    /// Fetches at once (`fetch_concurrency`).
    pub fetch_concurrency: usize,
    /// How long a certificate is kept when its response gives no max-age (`cert_ttl_s`).
    pub cert_ttl_s: u64,
    /// The longest a certificate is kept (`cert_max_ttl_s`).
    pub cert_max_ttl_s: u64,
    /// How long a failed fetch is remembered (`cert_failure_ttl_s`).
    pub cert_failure_ttl_s: u64,
    /// Tokens remembered against replay (`replay_entries`).
    pub replay_entries: usize,
}

/// STIR/SHAKEN (`[identity]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentityConfig {
    /// Signing, when `sign = true`.
    pub sign: Option<SignConfig>,
    /// Verifying, when `verify = true`.
    pub verify: Option<VerifyConfig>,
}

fn attest(key: &str, value: &str) -> Result<Attest> {
    Attest::parse(value)
        .ok_or_else(|| anyhow::anyhow!("identity.{key}: \"A\", \"B\" or \"C\", got {value:?}"))
}

impl RawIdentity {
    pub(super) fn validate(self) -> Result<IdentityConfig> {
        let verify = self.verify()?;
        let sign = self.sign()?;
        Ok(IdentityConfig { sign, verify })
    }

    fn verify(&self) -> Result<Option<VerifyConfig>> {
        if !self.verify {
            if self.roots.is_some() || !self.fetch_allow.is_empty() {
                bail!(
                    "identity.roots and identity.fetch_allow verify calls: set identity.verify = true to use them"
                );
            }
            return Ok(None);
        }
        let Some(roots) = self.roots.as_ref().filter(|r| !r.trim().is_empty()) else {
            bail!("identity.verify: needs identity.roots, the STI-CA certificates (PEM) to trust");
        };
        if let Err(e) = sipsec_identity::fetch::Allow::new(&self.fetch_allow) {
            bail!("identity.fetch_allow: {e}");
        }
        let policy = match self.policy.as_str() {
            "mark" => Policy::Mark,
            "reject" => Policy::Reject,
            p => bail!("identity.policy: \"mark\" or \"reject\", got {p:?}"),
        };
        if !(1..=3_600).contains(&self.freshness_s) {
            bail!("identity.freshness_s: 1 to 3600 seconds");
        }
        if !(100..=60_000).contains(&self.fetch_timeout_ms) {
            bail!("identity.fetch_timeout_ms: 100 to 60000");
        }
        if !(1_024..=1_048_576).contains(&self.fetch_max_bytes) {
            bail!("identity.fetch_max_bytes: 1024 to 1048576");
        }
        if !(1..=256).contains(&self.fetch_concurrency) {
            bail!("identity.fetch_concurrency: 1 to 256");
        }
        if self.cert_ttl_s > self.cert_max_ttl_s || self.cert_max_ttl_s > 7 * 86_400 {
            bail!("identity.cert_ttl_s: at most cert_max_ttl_s, itself at most a week");
        }
        if !(1..=3_600).contains(&self.cert_failure_ttl_s) {
            bail!("identity.cert_failure_ttl_s: 1 to 3600 seconds");
        }
        if !(1_000..=10_000_000).contains(&self.replay_entries) {
            bail!("identity.replay_entries: 1000 to 10000000");
        }
        Ok(Some(VerifyConfig {
            roots: PathBuf::from(roots),
            fetch_allow: self.fetch_allow.clone(),
            fetch_ca: self.fetch_ca.as_ref().map(PathBuf::from),
            freshness_s: self.freshness_s,
            policy,
            require: self.require,
            fetch_timeout_ms: self.fetch_timeout_ms,
            fetch_max_bytes: self.fetch_max_bytes,
            fetch_concurrency: self.fetch_concurrency,
            cert_ttl_s: self.cert_ttl_s,
            cert_max_ttl_s: self.cert_max_ttl_s,
            cert_failure_ttl_s: self.cert_failure_ttl_s,
            replay_entries: self.replay_entries,
        }))
    }

    fn sign(self) -> Result<Option<SignConfig>> {
        let attest_user = attest("attest", &self.attest)?;
        let attest_trusted = attest("attest_trusted", &self.attest_trusted)?;
        if !self.sign {
            if self.key.is_some() || self.x5u.is_some() {
                bail!("identity.key and identity.x5u sign calls: set identity.sign = true to use them");
            }
            return Ok(None);
        }
        let Some(key) = self.key.filter(|k| !k.trim().is_empty()) else {
            bail!("identity.sign: needs identity.key, the ES256 private key (PEM) to sign with");
        };
        let Some(x5u) = self.x5u else {
            bail!("identity.sign: needs identity.x5u, the https: URL of the signing certificate");
        };
        let https = x5u
            .get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
            && x5u.len() > 8
            && !x5u.bytes().any(|b| b <= b' ' || b"<>\"".contains(&b));
        if !https {
            bail!("identity.x5u: {x5u:?} must be an https: URL (ATIS-1000074), without spaces or <>\"");
        }
        Ok(Some(SignConfig {
            key: PathBuf::from(key),
            x5u,
            attest: attest_user,
            attest_trusted,
        }))
    }
}
