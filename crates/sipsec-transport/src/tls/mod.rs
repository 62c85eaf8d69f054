//! TLS configuration shared by the server and the load generator: rustls client and server
//! configurations built from PEM files, with the knobs seed 000 varies — protocol versions,
//! cipher suites, client certificates and session resumption — each switchable.
//!
//! `sipsec certs` ([`certs`]) makes a test CA and certificates for both sides.
//!
//! The crypto provider is aws-lc-rs, rustls's default: its P-256 and RSA code is the faster of
//! the two rustls ships with, and the handshake is what a TLS call costs (seed 000).

pub mod certs;
#[cfg(feature = "openssl")]
mod openssl;
mod session;
mod tickets;
mod verify;

pub use session::{HandshakeKind, Received, Session};

use anyhow::{bail, Context, Result};
use rustls::client::{Resumption, Tls12Resumption};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache, WebPkiClientVerifier};
use rustls::{ClientConfig, RootCertStore, ServerConfig, SupportedProtocolVersion};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Sessions remembered for resumption, per side.
const SESSION_CACHE: usize = 65_536;

/// Whether and how a server asks its clients for certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// Never ask.
    #[default]
    None,
    /// Ask, and verify a certificate when one is sent; accept clients without one.
    Optional,
    /// Refuse clients without a certificate from the CA.
    Required,
}

/// Which TLS library speaks for a side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// rustls with aws-lc-rs: TLS 1.2 and 1.3 with forward-secret AEAD suites.
    #[default]
    Rustls,
    /// The system's OpenSSL (cargo feature `openssl`): also the RSA-key-exchange CBC suites
    /// of seed 000.
    Openssl,
}

/// The protocol choices common to both sides.
#[derive(Debug, Clone, Default)]
pub struct Protocol {
    /// Which TLS library runs the sessions.
    pub backend: Backend,
    /// "1.2" and/or "1.3"; empty means both.
    pub versions: Vec<String>,
    /// Suite names (rustls's, e.g. `TLS13_AES_128_GCM_SHA256`,
    /// `TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256`; with OpenSSL also `TLS_RSA_WITH_AES_128_CBC_SHA`
    /// or OpenSSL's own names); empty means the backend's defaults.
    pub cipher_suites: Vec<String>,
    /// Key-exchange groups by name (`X25519`, `secp256r1`, `secp384r1`, `X25519MLKEM768`),
    /// in preference order; empty means the provider's defaults.
    pub key_exchange: Vec<String>,
    /// Whether sessions may be resumed, by tickets and session IDs; `[tls] session_resumption`
    /// (default true).
    pub session_resumption: bool,
    /// Stages done without cryptography (seed 002's ablation; `lab-noop` builds only).
    pub noop: crate::ablation::Stages,
}

/// What the client side of a connection needs.
#[derive(Debug, Clone, Default)]
pub struct ClientSide {
    /// CA certificates (PEM) that server certificates must chain to.
    pub ca: Option<PathBuf>,
    /// Skip verifying the server's certificate (a lab convenience, never a default).
    pub no_verify: bool,
    /// Our certificate chain and key (PEM), presented when a server asks.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// Versions, suites, groups and resumption for the connections this side opens.
    pub protocol: Protocol,
}

/// What the server side needs.
#[derive(Debug, Clone)]
pub struct ServerSide {
    /// The server's certificate chain (PEM).
    pub cert: PathBuf,
    /// The server certificate's private key (PEM).
    pub key: PathBuf,
    /// CA that client certificates must chain to (needed unless `client_auth` is none).
    pub ca: Option<PathBuf>,
    /// Whether the server asks clients for a certificate, and whether it requires one.
    pub client_auth: ClientAuth,
    /// Versions, suites, groups and resumption for the connections the server accepts.
    pub protocol: Protocol,
}

/// Reads every certificate in a PEM file.
pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("cannot read certificates from {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{} is not a PEM certificate file", path.display()))?;
    if certs.is_empty() {
        bail!("{} holds no certificate", path.display());
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub(crate) fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("cannot read a private key from {}", path.display()))
}

fn root_store(ca: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots
            .add(cert)
            .with_context(|| format!("{} holds an unusable CA certificate", ca.display()))?;
    }
    Ok(roots)
}

fn versions(names: &[String]) -> Result<Vec<&'static SupportedProtocolVersion>> {
    if names.is_empty() {
        return Ok(rustls::ALL_VERSIONS.to_vec());
    }
    names
        .iter()
        .map(
            |v| match v.trim_start_matches("TLSv").trim_start_matches("tls") {
                "1.2" => Ok(&rustls::version::TLS12),
                "1.3" => Ok(&rustls::version::TLS13),
                _ => bail!("unknown TLS version {v:?}: use \"1.2\" or \"1.3\""),
            },
        )
        .collect()
}

/// The items of `all` named in `wanted`, in that order (all of them when none is named).
fn pick<T: Copy>(
    all: &[T],
    wanted: &[String],
    name: impl Fn(&T) -> String,
    what: &str,
) -> Result<Vec<T>> {
    if wanted.is_empty() {
        return Ok(all.to_vec());
    }
    wanted
        .iter()
        .map(|w| {
            all.iter()
                .find(|x| name(x).eq_ignore_ascii_case(w))
                .copied()
                .with_context(|| {
                    let known: Vec<String> = all.iter().map(&name).collect();
                    format!("unknown {what} {w:?}; known: {}", known.join(", "))
                })
        })
        .collect()
}

/// The provider restricted to the protocol's suites and key-exchange groups (with its no-op
/// stages, in a lab build).
fn provider(protocol: &Protocol) -> Result<Arc<CryptoProvider>> {
    let (suites, groups) = (&protocol.cipher_suites, &protocol.key_exchange);
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    p.kx_groups = pick(
        &p.kx_groups,
        groups,
        |g| format!("{:?}", g.name()),
        "key exchange",
    )?;
    p.cipher_suites = pick(
        &p.cipher_suites,
        suites,
        |s| format!("{:?}", s.suite()),
        "cipher suite",
    )?;
    if suites.is_empty() {
        prefer_sha256_suites(&mut p.cipher_suites);
    }
    #[cfg(feature = "lab-noop")]
    if protocol.noop.tls() {
        p = crate::ablation::ablate(p, protocol.noop);
    }
    Ok(Arc::new(p))
}

/// Moves the AES-128-GCM suites, which hash with SHA-256, ahead of the provider's first choice
/// (AES-256-GCM with SHA-384). A TLS 1.3 handshake runs a dozen HKDF steps with the suite's
/// hash; x86 CPUs of this class do SHA-256 in hardware (SHA-NI) and SHA-384 in software, so
/// under SHA-384 a third of a resumed handshake's instructions were HKDF. AES-128-GCM is the
/// first choice of most TLS stacks and no weaker for SIP's purposes. BENCHMARKS.md has the
/// figures.
fn prefer_sha256_suites(suites: &mut [rustls::SupportedCipherSuite]) {
    suites.sort_by_key(|s| !format!("{:?}", s.suite()).contains("AES_128_GCM_SHA256"));
}

/// A client configuration.
pub fn client_config(c: &ClientSide) -> Result<Arc<ClientConfig>> {
    let provider = provider(&c.protocol)?;
    let algorithms = provider.signature_verification_algorithms;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions(&c.protocol.versions)?)
        .context("no cipher suite fits the TLS versions chosen")?;
    let builder = match (&c.ca, c.no_verify) {
        (_, true) => builder
            .dangerous()
            .with_custom_certificate_verifier(verify::AnyServer::new(algorithms)),
        (Some(ca), false) => builder.with_root_certificates(root_store(ca)?),
        (None, false) => {
            bail!("TLS needs a CA to verify the server's certificate, or verification turned off")
        }
    };
    let mut cfg = match &c.identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .with_context(|| format!("{} does not match {}", key.display(), cert.display()))?,
        None => builder.with_no_client_auth(),
    };
    cfg.resumption = if c.protocol.session_resumption {
        Resumption::store(Arc::new(tickets::TicketStore::new(SESSION_CACHE)))
            .tls12_resumption(Tls12Resumption::SessionIdOrTickets)
    } else {
        Resumption::disabled()
    };
    Ok(Arc::new(cfg))
}

/// A server configuration.
pub fn server_config(s: &ServerSide) -> Result<Arc<ServerConfig>> {
    let provider = provider(&s.protocol)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions(&s.protocol.versions)?)
        .context("no cipher suite fits the TLS versions chosen")?;
    let builder = match (s.client_auth, &s.ca) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (auth, Some(ca)) => {
            let v =
                WebPkiClientVerifier::builder_with_provider(Arc::new(root_store(ca)?), provider);
            let v = if auth == ClientAuth::Optional {
                v.allow_unauthenticated()
            } else {
                v
            };
            builder.with_client_cert_verifier(v.build().context("client certificate verifier")?)
        }
        (_, None) => bail!("client_auth optional or required needs a CA (tls.ca) to verify with"),
    };
    let mut cfg = builder
        .with_single_cert(load_certs(&s.cert)?, load_key(&s.key)?)
        .with_context(|| format!("{} does not match {}", s.key.display(), s.cert.display()))?;
    // The server's suite order decides, so a peer preferring SHA-384 (OpenSSL's default)
    // gets the cheaper handshake too.
    cfg.ignore_client_order = true;
    if s.protocol.session_resumption {
        cfg.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE);
        cfg.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
        // One ticket per connection (rustls sends two): a SIP client opening a connection per
        // call uses one to resume the next, so the second is only work and bytes.
        cfg.send_tls13_tickets = 1;
    } else {
        cfg.session_storage = Arc::new(NoServerSessionStorage {});
        cfg.send_tls13_tickets = 0;
    }
    Ok(Arc::new(cfg))
}

/// Why a TLS session could not start, or ended in error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// rustls refused: a bad record, an alert from the peer, a certificate it would not
    /// accept.
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
    /// OpenSSL refused, during the handshake or on a record.
    #[cfg(feature = "openssl")]
    #[error(transparent)]
    Openssl(#[from] ::openssl::ssl::Error),
    /// OpenSSL could not set a session up.
    #[cfg(feature = "openssl")]
    #[error(transparent)]
    OpensslSetup(#[from] ::openssl::error::ErrorStack),
    /// The stream of records broke, or ended without `close_notify`.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection before the handshake finished.
    #[error("the peer closed the connection during the handshake")]
    ClosedInHandshake,
    /// A server name the backend cannot check a certificate against.
    #[error("unsupported server name {0}")]
    UnsupportedName(String),
}

/// A server-side configuration from either backend, shared by every connection it accepts.
#[derive(Clone)]
pub enum ServerTls {
    /// A rustls server configuration.
    Rustls(Arc<ServerConfig>),
    /// An OpenSSL server context (cargo feature `openssl`).
    #[cfg(feature = "openssl")]
    Openssl(Arc<openssl::Server>),
}

impl ServerTls {
    /// A session for a connection just accepted.
    pub fn accept(&self) -> Result<Session, Error> {
        match self {
            ServerTls::Rustls(cfg) => rustls::ServerConnection::new(cfg.clone())
                .map(|c| Session::rustls(c.into()))
                .map_err(Error::from),
            #[cfg(feature = "openssl")]
            ServerTls::Openssl(s) => s.accept().map(Session::Openssl),
        }
    }
}

/// A client-side configuration from either backend, with the sessions it may resume.
#[derive(Clone)]
pub enum ClientTls {
    /// A rustls client configuration; its resumable sessions live in its session store.
    Rustls(Arc<ClientConfig>),
    /// An OpenSSL client context and its session cache (cargo feature `openssl`).
    #[cfg(feature = "openssl")]
    Openssl(Arc<openssl::Client>),
}

impl ClientTls {
    /// A session for a connection to `name`; its first flight is queued.
    pub fn connect(&self, name: ServerName<'static>) -> Result<Session, Error> {
        match self {
            ClientTls::Rustls(cfg) => rustls::ClientConnection::new(cfg.clone(), name)
                .map(|c| Session::rustls(c.into()))
                .map_err(Error::from),
            #[cfg(feature = "openssl")]
            ClientTls::Openssl(c) => c.connect(&name).map(Session::Openssl),
        }
    }
}

#[cfg(not(feature = "openssl"))]
fn no_openssl() -> anyhow::Error {
    anyhow::anyhow!(
        "this sipsec is built without the OpenSSL backend: build it with `--features openssl` \
         (needs Debian's libssl-dev)"
    )
}

/// The server side, with the backend its protocol names.
pub fn server(s: &ServerSide) -> Result<ServerTls> {
    match s.protocol.backend {
        Backend::Rustls => Ok(ServerTls::Rustls(server_config(s)?)),
        #[cfg(feature = "openssl")]
        Backend::Openssl => Ok(ServerTls::Openssl(Arc::new(openssl::server(s)?))),
        #[cfg(not(feature = "openssl"))]
        Backend::Openssl => Err(no_openssl()),
    }
}

/// The client side, with the backend its protocol names.
pub fn client(c: &ClientSide) -> Result<ClientTls> {
    match c.protocol.backend {
        Backend::Rustls => Ok(ClientTls::Rustls(client_config(c)?)),
        #[cfg(feature = "openssl")]
        Backend::Openssl => Ok(ClientTls::Openssl(Arc::new(openssl::client(c)?))),
        #[cfg(not(feature = "openssl"))]
        Backend::Openssl => Err(no_openssl()),
    }
}

/// The name a client checks the server's certificate against: a DNS name when given, else the
/// address itself (certificates from `sipsec certs` carry the IP addresses they serve).
pub fn server_name(name: Option<&str>, ip: IpAddr) -> Result<ServerName<'static>> {
    match name {
        Some(n) => ServerName::try_from(n.to_string())
            .map_err(|_| anyhow::anyhow!("{n:?} is not a valid TLS server name")),
        None => Ok(ServerName::IpAddress(ip.into())),
    }
}

#[cfg(test)]
mod tests;
