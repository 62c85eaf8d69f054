//! `sipsec certs`: a test CA and a server and a client certificate signed by it, so the quick
//! start and the tests need no openssl commands. ECDSA P-256 by default (the cheap handshake),
//! RSA on request (the seed's 2008 setup). An existing CA in the output directory is reused,
//! so certificates made at different times trust each other.

use anyhow::{bail, Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The key type of the certificates `sipsec certs` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyKind {
    /// ECDSA on P-256 (secp256r1), signed with SHA-256: the cheap handshake and the default.
    EcdsaP256,
    /// ECDSA on P-384 (secp384r1), signed with SHA-384.
    EcdsaP384,
    /// RSA with a 2048-bit modulus, as in the seed's 2008 setup.
    #[value(name = "rsa-2048", alias = "rsa2048")]
    Rsa2048,
    /// RSA with a 3072-bit modulus.
    #[value(name = "rsa-3072", alias = "rsa3072")]
    Rsa3072,
    /// RSA with a 4096-bit modulus.
    #[value(name = "rsa-4096", alias = "rsa4096")]
    Rsa4096,
}

/// `sipsec certs` options.
#[derive(clap::Args, Debug, Clone)]
pub struct CertsArgs {
    /// Directory to write into (created if missing).
    #[arg(long, default_value = "certs")]
    pub out: PathBuf,
    /// Key type of the server and client certificates (and of a new CA).
    #[arg(long, value_enum, default_value = "ecdsa-p256")]
    pub key: KeyKind,
    /// Names the server certificate is valid for: DNS names or IP addresses (repeatable;
    /// default localhost, 127.0.0.1 and ::1).
    #[arg(long = "name")]
    pub names: Vec<String>,
    /// Common name of the client certificate (how a server knows this client).
    #[arg(long, default_value = "sipsec-client")]
    pub client_name: String,
    /// Make a new CA even when the directory holds one.
    #[arg(long)]
    pub new_ca: bool,
}

/// The files `sipsec certs` writes, relative to `--out`.
pub const CA: &str = "ca.pem";
pub(crate) const CA_KEY: &str = "ca-key.pem";
/// The server's certificate (PEM), valid for the `--name`s.
pub const SERVER: &str = "server.pem";
/// The server certificate's private key (PEM, mode 0600).
pub const SERVER_KEY: &str = "server-key.pem";
/// The client certificate (PEM), for mutual TLS.
pub const CLIENT: &str = "client.pem";
/// The client certificate's private key (PEM, mode 0600).
pub const CLIENT_KEY: &str = "client-key.pem";

fn key_pair(kind: KeyKind) -> Result<KeyPair> {
    let rsa = |size| KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, size);
    Ok(match kind {
        KeyKind::EcdsaP256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?,
        KeyKind::EcdsaP384 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384)?,
        KeyKind::Rsa2048 => rsa(rcgen::RsaKeySize::_2048)?,
        KeyKind::Rsa3072 => rsa(rcgen::RsaKeySize::_3072)?,
        KeyKind::Rsa4096 => rsa(rcgen::RsaKeySize::_4096)?,
    })
}

fn san(name: &str) -> Result<SanType> {
    Ok(match name.parse::<IpAddr>() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(
            name.to_string()
                .try_into()
                .with_context(|| format!("{name:?} is neither an IP address nor a DNS name"))?,
        ),
    })
}

/// The CA: read back from `dir` when present (and not `new`), else made and written.
fn ca(dir: &Path, kind: KeyKind, new: bool) -> Result<(rcgen::Certificate, KeyPair, bool)> {
    let (cert_path, key_path) = (dir.join(CA), dir.join(CA_KEY));
    if !new && cert_path.exists() && key_path.exists() {
        let key = KeyPair::from_pem(&std::fs::read_to_string(&key_path)?)
            .with_context(|| format!("{} is not a usable key", key_path.display()))?;
        let params = CertificateParams::from_ca_cert_pem(&std::fs::read_to_string(&cert_path)?)
            .with_context(|| format!("{} is not a CA certificate", cert_path.display()))?;
        // Re-signing the same name and key reproduces the issuer certificates are chained to.
        let cert = params.self_signed(&key)?;
        return Ok((cert, key, true));
    }
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // A distinct name per CA, so a certificate from another test CA is an unknown issuer
    // rather than a bad signature, and the error says so.
    let id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()) << 32;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("sipsec test CA {id:016x}"));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = key_pair(kind)?;
    let cert = params.self_signed(&key)?;
    write(&cert_path, &cert.pem())?;
    write_private(&key_path, &key.serialize_pem())?;
    Ok((cert, key, false))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Keys are written readable by their owner only.
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

fn leaf(
    common_name: &str,
    names: &[String],
    usages: &[ExtendedKeyUsagePurpose],
    kind: KeyKind,
    issuer: &(rcgen::Certificate, KeyPair, bool),
) -> Result<(String, String)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.subject_alt_names = names.iter().map(|n| san(n)).collect::<Result<_>>()?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = usages.to_vec();
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    if matches!(kind, KeyKind::Rsa2048 | KeyKind::Rsa3072 | KeyKind::Rsa4096) {
        // RSA key exchange (the seed's TLS_RSA_* suites) encrypts with the certificate's key.
        params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
    }
    let key = key_pair(kind)?;
    let cert = params.signed_by(&key, &issuer.0, &issuer.1)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// `sipsec certs`.
pub fn run(a: &CertsArgs) -> Result<()> {
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    if a.client_name.trim().is_empty() {
        bail!("--client-name must not be empty");
    }
    let names = if a.names.is_empty() {
        vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
    } else {
        a.names.clone()
    };
    let issuer = ca(&a.out, a.key, a.new_ca)?;
    let server_cn = names[0].clone();
    let (cert, key) = leaf(
        &server_cn,
        &names,
        // A proxy presents the same certificate when it connects onwards (mutual TLS between
        // neighbours), so the server certificate serves as a client certificate too.
        &[
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        a.key,
        &issuer,
    )?;
    write(&a.out.join(SERVER), &cert)?;
    write_private(&a.out.join(SERVER_KEY), &key)?;
    // A client name that is no DNS name (spaces, say) goes in the subject only.
    let client_sans: &[String] = if san(&a.client_name).is_ok() {
        std::slice::from_ref(&a.client_name)
    } else {
        &[]
    };
    let (cert, key) = leaf(
        &a.client_name,
        client_sans,
        &[ExtendedKeyUsagePurpose::ClientAuth],
        a.key,
        &issuer,
    )?;
    write(&a.out.join(CLIENT), &cert)?;
    write_private(&a.out.join(CLIENT_KEY), &key)?;
    let d = a.out.display();
    println!(
        "{} CA {d}/{CA}; server certificate {d}/{SERVER} (key {d}/{SERVER_KEY}) for {}; client \
         certificate {d}/{CLIENT} (key {d}/{CLIENT_KEY}) for {:?}",
        if issuer.2 { "reused the" } else { "made a new" },
        names.join(", "),
        a.client_name
    );
    Ok(())
}
