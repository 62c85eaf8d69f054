//! Seed 002's no-op ablation: switches that make one stage of the server's work free, so the
//! lab can measure what that stage costs and what making it faster could ever buy (Amdahl's
//! bound). The stages: TLS key exchange (`kx`), TLS signatures and their verification
//! (`sign`), TLS record encryption (`aead`), and the digest response hash (`digest`).
//!
//! **Never for real traffic.** A stage switched off does no cryptography at all: anyone can
//! read, forge and impersonate. The switches exist only in builds with the `lab-noop` cargo
//! feature; a build without it refuses to start when they are asked for, so a production
//! binary cannot be talked into them, and a lab build says so loudly at every start.
//!
//! The server reads its stages from `SIPSEC_LAB_NOOP` (e.g. `kx,sign`), once; the load
//! generator takes them as `--lab-noop` for its own TLS, since both ends must agree (a no-op
//! cipher's records are not AES's).

#[cfg(feature = "lab-noop")]
mod provider;
#[cfg(feature = "lab-noop")]
pub use provider::ablate;

use anyhow::{bail, Result};
use std::sync::OnceLock;

/// The environment variable the server reads its stages from.
pub const ENV: &str = "SIPSEC_LAB_NOOP";

/// Which stages do no work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stages {
    /// TLS key exchange: the peers agree on a constant secret without arithmetic.
    pub kx: bool,
    /// TLS signatures: constant bytes that always verify (ECDSA P-256 with SHA-256).
    pub sign: bool,
    /// TLS 1.3 record encryption: plaintext copied, with a zero tag of AES-GCM's length.
    pub aead: bool,
    /// The digest response hash: the server does not compute it and takes any response.
    pub digest: bool,
}

impl Stages {
    /// `kx,sign,aead,digest` (any of them), `tls` (the three TLS stages) or `all`; empty is
    /// none. Only in `lab-noop` builds.
    pub fn parse(text: &str) -> Result<Stages> {
        let mut s = Stages::default();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "kx" => s.kx = true,
                "sign" => s.sign = true,
                "aead" => s.aead = true,
                "digest" => s.digest = true,
                "tls" => (s.kx, s.sign, s.aead) = (true, true, true),
                "all" => s = Stages::ALL,
                _ => bail!("unknown no-op stage {word:?}: kx, sign, aead, digest, tls or all"),
            }
        }
        if s.any() && !cfg!(feature = "lab-noop") {
            bail!(
                "no-op stages ({text}) exist only in lab builds (cargo build --features lab-noop); \
                 this build does real cryptography only"
            );
        }
        Ok(s)
    }

    /// Every stage switched off.
    pub const ALL: Stages = Stages {
        kx: true,
        sign: true,
        aead: true,
        digest: true,
    };

    /// Whether any stage is switched off.
    pub fn any(&self) -> bool {
        self.tls() || self.digest
    }

    /// Whether any of the three TLS stages is switched off.
    pub fn tls(&self) -> bool {
        self.kx || self.sign || self.aead
    }

    /// The form [`Stages::parse`] reads.
    pub fn to_arg(&self) -> String {
        let mut words = Vec::new();
        for (on, name) in [
            (self.kx, "kx"),
            (self.sign, "sign"),
            (self.aead, "aead"),
            (self.digest, "digest"),
        ] {
            if on {
                words.push(name);
            }
        }
        words.join(",")
    }
}

static SERVER: OnceLock<Stages> = OnceLock::new();

/// Reads the server's stages from [`ENV`] (once, at start) and warns loudly if any is off.
/// An error in a build without `lab-noop`, or for an unknown stage.
pub fn init_from_env() -> Result<Stages> {
    let text = std::env::var(ENV).unwrap_or_default();
    let stages = Stages::parse(&text)?;
    if stages.any() {
        warn_loudly(stages);
    }
    let _ = SERVER.set(stages);
    Ok(stages)
}

/// The server's stages ([`init_from_env`]); none until it is called.
pub fn server() -> Stages {
    SERVER.get().copied().unwrap_or_default()
}

/// Says, on standard error and in the log, that this process does no real cryptography.
pub fn warn_loudly(stages: Stages) {
    let text = format!(
        "LAB BUILD WITH NO-OP STAGES [{}]: this process does NO real cryptography for them; \
         its TLS and authentication can be read and forged by anyone. Never use it for real \
         traffic.",
        stages.to_arg()
    );
    eprintln!("*** {text} ***");
    tracing::error!("{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_parse_and_print_back() {
        assert_eq!(Stages::parse("").unwrap(), Stages::default());
        assert!(Stages::parse("rsa").is_err());
        if cfg!(feature = "lab-noop") {
            let s = Stages::parse("kx, digest").unwrap();
            assert!(s.kx && s.digest && !s.sign && !s.aead);
            assert_eq!(Stages::parse(&s.to_arg()).unwrap(), s);
            assert_eq!(Stages::parse("tls").unwrap().to_arg(), "kx,sign,aead");
        } else {
            let e = Stages::parse("kx").unwrap_err().to_string();
            assert!(e.contains("only in lab builds"), "{e}");
        }
    }
}
