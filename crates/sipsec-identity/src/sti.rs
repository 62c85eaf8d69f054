//! `sipsec certs --shaken`: a test STI-CA and a STIR/SHAKEN signing certificate it issued, so
//! the tests, the lab and a newcomer can sign and verify calls with no openssl commands and no
//! real STI-CA. The signing certificate carries a TNAuthList (a service provider code by
//! default, or numbers); its key is written as SEC1 (`EC PRIVATE KEY`), which `secsipidx`
//! and Kamailio's `secsipid` read as well as we do. An STI-CA already in the directory is
//! reused, as `sipsec certs` reuses its TLS CA.

use crate::cert::{tn_auth_list_der, Authority, TN_AUTH_LIST_OID};
use anyhow::{bail, Context, Result};
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use std::path::Path;

/// The STI-CA's certificate: what verifiers configure as `roots`.
pub const STI_CA: &str = "sti-ca.pem";
const STI_CA_KEY: &str = "sti-ca-key.pem";
/// The signing certificate: what the `x5u` URL serves.
pub const SHAKEN_CERT: &str = "shaken.pem";
/// The signing key (SEC1 PEM, mode 0600): the authentication service's `key`.
pub const SHAKEN_KEY: &str = "shaken-key.pem";

/// `sipsec certs` options for STIR/SHAKEN.
#[derive(clap::Args, Debug, Clone)]
pub struct ShakenArgs {
    /// Also make a test STI-CA and a STIR/SHAKEN signing certificate issued by it
    /// (sti-ca.pem, shaken.pem, shaken-key.pem).
    #[arg(long)]
    pub shaken: bool,
    /// The service provider code the signing certificate's TNAuthList names.
    #[arg(long, default_value = "1234", requires = "shaken")]
    pub spc: String,
    /// Numbers the signing certificate may sign for instead of a code: a number, or a range
    /// FIRST+COUNT (repeatable).
    #[arg(long = "tn", requires = "shaken")]
    pub tns: Vec<String>,
}

impl ShakenArgs {
    /// What the certificate's TNAuthList should say.
    pub fn authority(&self) -> Result<Authority> {
        if self.tns.is_empty() {
            if self.spc.is_empty() || !self.spc.bytes().all(|b| (0x21..0x7f).contains(&b)) {
                bail!("--spc must be printable ASCII, got {:?}", self.spc);
            }
            return Ok(Authority::Codes(vec![self.spc.clone()]));
        }
        let (mut ones, mut ranges) = (Vec::new(), Vec::new());
        for tn in &self.tns {
            // A leading `+` is the number's; a later one starts the count.
            let body = tn.strip_prefix('+').unwrap_or(tn);
            let (first, count) = match body.rsplit_once('+') {
                Some((f, c)) => (
                    f,
                    Some(c.parse::<u64>().ok().filter(|c| *c >= 2).with_context(|| {
                        format!("--tn {tn:?}: the count after + must be a number of at least 2")
                    })?),
                ),
                None => (body, None),
            };
            let first = crate::tn::canonical(first)
                .with_context(|| format!("--tn {tn:?} is not a telephone number"))?;
            match count {
                Some(c) => ranges.push((first, c)),
                None => ones.push(first),
            }
        }
        Ok(Authority::Numbers { ones, ranges })
    }
}

/// Writes the STI-CA (made, or reused from `dir`) and a signing certificate with `authority`.
pub fn make(dir: &Path, authority: &Authority) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (ca_path, ca_key_path) = (dir.join(STI_CA), dir.join(STI_CA_KEY));
    let (ca, ca_key) = if ca_path.exists() && ca_key_path.exists() {
        let key = KeyPair::from_pem(&std::fs::read_to_string(&ca_key_path)?)
            .with_context(|| format!("{} is not a usable key", ca_key_path.display()))?;
        let params = CertificateParams::from_ca_cert_pem(&std::fs::read_to_string(&ca_path)?)
            .with_context(|| format!("{} is not a CA certificate", ca_path.display()))?;
        (params.self_signed(&key)?, key)
    } else {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "sipsec test STI-CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let cert = params.self_signed(&key)?;
        write(&ca_path, &cert.pem(), false)?;
        write(&ca_key_path, &key.serialize_pem(), true)?;
        (cert, key)
    };
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let name = match authority {
        Authority::Codes(codes) => format!("SHAKEN {}", codes.join(" ")),
        Authority::Numbers { .. } => "SHAKEN numbers".to_string(),
    };
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.custom_extensions = vec![CustomExtension::from_oid_content(
        TN_AUTH_LIST_OID,
        tn_auth_list_der(authority),
    )];
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    write(&dir.join(SHAKEN_CERT), &cert.pem(), false)?;
    write(
        &dir.join(SHAKEN_KEY),
        &sec1_pem(&key.serialize_der())?,
        true,
    )?;
    Ok(())
}

/// A PKCS#8 P-256 key re-encoded as SEC1 (RFC 5915) PEM.
fn sec1_pem(pkcs8: &[u8]) -> Result<String> {
    let key = EcdsaKeyPair::from_private_key_der(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8)
        .map_err(|e| anyhow::anyhow!("the new key does not load: {e}"))?;
    let der = key
        .private_key()
        .as_der()
        .map_err(|_| anyhow::anyhow!("the new key does not encode as SEC1"))?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut pem = String::from("-----BEGIN EC PRIVATE KEY-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line)?);
        pem.push('\n');
    }
    pem.push_str("-----END EC PRIVATE KEY-----\n");
    Ok(pem)
}

fn write(path: &Path, text: &str, private: bool) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cert::{Roots, Signer};
    use crate::passport::{new_origid, Attest, Claims, SigningKey};

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    #[test]
    fn a_made_certificate_verifies_what_its_key_signs() {
        let dir = tempfile::tempdir().unwrap();
        make(dir.path(), &Authority::Codes(vec!["1234".into()])).unwrap();
        let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
        let key = SigningKey::from_pem(&read(SHAKEN_KEY), "https://c.example/shaken.pem").unwrap();
        let roots = Roots::from_pem(&read(STI_CA)).unwrap();
        let signer = Signer::from_pem(&read(SHAKEN_CERT), &roots, now()).unwrap();
        assert_eq!(signer.authority(), &Authority::Codes(vec!["1234".into()]));
        let jws = key.sign(&Claims {
            attest: Attest::A,
            orig: "15551234567".into(),
            dest: vec!["15557654321".into()],
            iat: now(),
            origid: new_origid(),
        });
        let token = crate::passport::Token::decode(&jws).unwrap();
        signer.verify(&token).unwrap();
        assert!(std::fs::read_to_string(dir.path().join(SHAKEN_KEY))
            .unwrap()
            .starts_with("-----BEGIN EC PRIVATE KEY-----"));
    }

    #[test]
    fn another_ca_an_expired_check_and_a_tls_certificate_are_refused() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        make(a.path(), &Authority::Codes(vec!["1".into()])).unwrap();
        make(b.path(), &Authority::Codes(vec!["2".into()])).unwrap();
        let read = |d: &tempfile::TempDir, f: &str| std::fs::read(d.path().join(f)).unwrap();
        let roots_b = Roots::from_pem(&read(&b, STI_CA)).unwrap();
        let err = Signer::from_pem(&read(&a, SHAKEN_CERT), &roots_b, now()).unwrap_err();
        assert!(matches!(err, crate::CertError::Untrusted(_)), "{err}");
        // rcgen's default validity ends in 4096; a check "then" fails.
        let roots_a = Roots::from_pem(&read(&a, STI_CA)).unwrap();
        let late = 420_000_000_000;
        assert!(matches!(
            Signer::from_pem(&read(&a, SHAKEN_CERT), &roots_a, late),
            Err(crate::CertError::Untrusted(_))
        ));
        // The CA itself is no signing certificate: no TNAuthList.
        let err = Signer::from_pem(&read(&a, STI_CA), &roots_a, now()).unwrap_err();
        assert!(
            matches!(
                err,
                crate::CertError::Untrusted(_) | crate::CertError::Parse(_)
            ),
            "{err}"
        );
        assert!(matches!(
            Signer::from_pem(b"not pem", &roots_a, now()),
            Err(crate::CertError::Parse(_))
        ));
    }

    #[test]
    fn the_ca_is_reused_and_numbers_are_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let args = ShakenArgs {
            shaken: true,
            spc: "1234".into(),
            tns: vec!["+1-555-700-0000+200".into(), "15551230000".into()],
        };
        let authority = args.authority().unwrap();
        assert_eq!(
            authority,
            Authority::Numbers {
                ones: vec!["15551230000".into()],
                ranges: vec![("15557000000".into(), 200)]
            }
        );
        make(dir.path(), &authority).unwrap();
        let ca = std::fs::read(dir.path().join(STI_CA)).unwrap();
        make(dir.path(), &authority).unwrap();
        assert_eq!(ca, std::fs::read(dir.path().join(STI_CA)).unwrap());
        let roots = Roots::from_pem(&ca).unwrap();
        let signer = Signer::from_pem(
            &std::fs::read(dir.path().join(SHAKEN_CERT)).unwrap(),
            &roots,
            now(),
        )
        .unwrap();
        assert!(signer.authorises("15557000199").is_ok());
        assert!(signer.authorises("15557000200").is_err());
        for bad in ["x+2", "1555+1", "1555+x"] {
            let a = ShakenArgs {
                tns: vec![bad.into()],
                ..args.clone()
            };
            assert!(a.authority().is_err(), "{bad}");
        }
    }
}
