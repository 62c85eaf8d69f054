//! The OpenSSL backend (cargo feature `openssl`): the system's OpenSSL, for what rustls will
//! not speak — seed 000's 2008 suite, TLS_RSA_WITH_AES_128_CBC_SHA (RSA key exchange, CBC
//! with HMAC-SHA1) — so the lab can put the seed's configuration beside the modern ones.
//!
//! OpenSSL runs over a memory pipe rather than the socket, so a session is driven exactly
//! like a rustls one (bytes in, plaintext out, bytes to write) by the same connection loop.
//! Suites may be named as IANA does (`TLS_RSA_WITH_AES_128_CBC_SHA`) or as OpenSSL does
//! (`AES128-SHA`); OpenSSL cipher-string words such as `@SECLEVEL=1` pass through, which is
//! how Debian's OpenSSL 3.0 is made to accept RSA-1024 keys.

use super::session::{HandshakeKind, Received};
use super::{ClientAuth, ClientSide, Error, Protocol, ServerSide};
use anyhow::{bail, Context, Result};
use openssl::ssl::{
    ErrorCode, ShutdownState, Ssl, SslContext, SslContextBuilder, SslFiletype, SslMethod,
    SslOptions, SslSession, SslSessionCacheMode, SslStream, SslVerifyMode, SslVersion,
};
use rustls::pki_types::ServerName;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex};

/// IANA names of suites OpenSSL spells its own way.
const SUITE_NAMES: &[(&str, &str)] = &[
    ("TLS_RSA_WITH_AES_128_CBC_SHA", "AES128-SHA"),
    ("TLS_RSA_WITH_AES_256_CBC_SHA", "AES256-SHA"),
    ("TLS_RSA_WITH_3DES_EDE_CBC_SHA", "DES-CBC3-SHA"),
    ("TLS_RSA_WITH_AES_128_GCM_SHA256", "AES128-GCM-SHA256"),
    ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "ECDHE-RSA-AES128-SHA"),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
        "ECDHE-ECDSA-AES128-SHA",
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
    ),
];

/// Group names as rustls spells them, to OpenSSL's.
const GROUP_NAMES: &[(&str, &str)] = &[
    ("secp256r1", "P-256"),
    ("secp384r1", "P-384"),
    ("secp521r1", "P-521"),
];

/// The OpenSSL spelling of a configured suite name.
fn openssl_suite(name: &str) -> String {
    let upper = name.to_ascii_uppercase();
    if let Some((_, ossl)) = SUITE_NAMES.iter().find(|(iana, _)| *iana == upper) {
        return ossl.to_string();
    }
    // rustls's TLS 1.3 names (TLS13_AES_128_GCM_SHA256) to IANA's, which OpenSSL uses.
    name.replacen("TLS13_", "TLS_", 1)
}

/// TLS 1.3 suites are set apart from the older ones in OpenSSL.
fn is_tls13_suite(name: &str) -> bool {
    name.starts_with("TLS_AES_") || name.starts_with("TLS_CHACHA20_")
}

/// Versions, suites and groups, set the same way on both sides.
fn apply_protocol(b: &mut SslContextBuilder, p: &Protocol) -> Result<()> {
    let mut lowest = None;
    let mut highest = None;
    for v in &p.versions {
        let version = match v.trim_start_matches("TLSv").trim_start_matches("tls") {
            "1.2" => SslVersion::TLS1_2,
            "1.3" => SslVersion::TLS1_3,
            _ => bail!("unknown TLS version {v:?}: use \"1.2\" or \"1.3\""),
        };
        let order = |x: SslVersion| u8::from(x == SslVersion::TLS1_3);
        if lowest.is_none_or(|l| order(version) < order(l)) {
            lowest = Some(version);
        }
        if highest.is_none_or(|h| order(version) > order(h)) {
            highest = Some(version);
        }
    }
    b.set_min_proto_version(lowest.or(Some(SslVersion::TLS1_2)))?;
    b.set_max_proto_version(highest)?;
    let names: Vec<String> = p.cipher_suites.iter().map(|s| openssl_suite(s)).collect();
    let (tls13, older): (Vec<&String>, Vec<&String>) =
        names.iter().partition(|s| is_tls13_suite(s));
    let join = |v: &[&String]| v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(":");
    if !older.is_empty() {
        let mut list = join(&older);
        if older.iter().all(|s| s.starts_with('@')) {
            // Only a word like @SECLEVEL=1: it qualifies the default list.
            list = format!("DEFAULT:{list}");
        }
        b.set_cipher_list(&list).with_context(|| {
            format!("OpenSSL cannot use the cipher suites {list} (it may not be built with them)")
        })?;
    }
    if !tls13.is_empty() {
        b.set_ciphersuites(&join(&tls13))
            .with_context(|| format!("OpenSSL cannot use the TLS 1.3 suites {}", join(&tls13)))?;
    }
    if !p.key_exchange.is_empty() {
        let groups: Vec<&str> = p
            .key_exchange
            .iter()
            .map(|g| {
                GROUP_NAMES
                    .iter()
                    .find(|(r, _)| r.eq_ignore_ascii_case(g))
                    .map_or(g.as_str(), |(_, o)| o)
            })
            .collect();
        b.set_groups_list(&groups.join(":"))
            .with_context(|| format!("OpenSSL cannot use the groups {}", groups.join(":")))?;
    }
    Ok(())
}

/// A server-side context.
pub struct Server {
    ctx: SslContext,
}

pub(super) fn server(s: &ServerSide) -> Result<Server> {
    let mut b = SslContextBuilder::new(SslMethod::tls_server())?;
    b.set_certificate_chain_file(&s.cert)
        .with_context(|| format!("cannot read certificates from {}", s.cert.display()))?;
    b.set_private_key_file(&s.key, SslFiletype::PEM)
        .with_context(|| format!("cannot read a private key from {}", s.key.display()))?;
    b.check_private_key()
        .with_context(|| format!("{} does not match {}", s.key.display(), s.cert.display()))?;
    apply_protocol(&mut b, &s.protocol)?;
    match (s.client_auth, &s.ca) {
        (ClientAuth::None, _) => b.set_verify(SslVerifyMode::NONE),
        (auth, Some(ca)) => {
            b.set_ca_file(ca)
                .with_context(|| format!("cannot read CA certificates from {}", ca.display()))?;
            let mut mode = SslVerifyMode::PEER;
            if auth == ClientAuth::Required {
                mode |= SslVerifyMode::FAIL_IF_NO_PEER_CERT;
            }
            b.set_verify(mode);
        }
        (_, None) => bail!("client_auth optional or required needs a CA (tls.ca) to verify with"),
    }
    // Resumed sessions must belong to this service (OpenSSL refuses them otherwise when it
    // verifies clients).
    b.set_session_id_context(b"sipsec")?;
    if s.protocol.session_resumption {
        b.set_session_cache_mode(SslSessionCacheMode::SERVER);
    } else {
        b.set_session_cache_mode(SslSessionCacheMode::OFF);
        b.set_options(SslOptions::NO_TICKET);
        b.set_num_tickets(0)?;
    }
    Ok(Server { ctx: b.build() })
}

impl Server {
    pub fn accept(&self) -> Result<Session, Error> {
        let mut ssl = Ssl::new(&self.ctx)?;
        ssl.set_accept_state();
        Session::new(ssl, true)
    }
}

/// Sessions to resume, by server name.
type SessionCache = Arc<Mutex<HashMap<String, SslSession>>>;

/// A client-side context and the sessions it may resume.
pub struct Client {
    ctx: SslContext,
    /// None when resumption is off.
    sessions: Option<SessionCache>,
    name_index: openssl::ex_data::Index<Ssl, String>,
}

pub(super) fn client(c: &ClientSide) -> Result<Client> {
    let mut b = SslContextBuilder::new(SslMethod::tls_client())?;
    apply_protocol(&mut b, &c.protocol)?;
    match (&c.ca, c.no_verify) {
        (_, true) => b.set_verify(SslVerifyMode::NONE),
        (Some(ca), false) => {
            b.set_ca_file(ca)
                .with_context(|| format!("cannot read CA certificates from {}", ca.display()))?;
            b.set_verify(SslVerifyMode::PEER);
        }
        (None, false) => {
            bail!("TLS needs a CA to verify the server's certificate, or verification turned off")
        }
    }
    if let Some((cert, key)) = &c.identity {
        b.set_certificate_chain_file(cert)
            .with_context(|| format!("cannot read certificates from {}", cert.display()))?;
        b.set_private_key_file(key, SslFiletype::PEM)
            .with_context(|| format!("cannot read a private key from {}", key.display()))?;
        b.check_private_key()
            .with_context(|| format!("{} does not match {}", key.display(), cert.display()))?;
    }
    let name_index = Ssl::new_ex_index::<String>()?;
    let sessions = if c.protocol.session_resumption {
        let cache = SessionCache::default();
        let store = cache.clone();
        b.set_session_cache_mode(SslSessionCacheMode::CLIENT);
        // Called for every session the server grants (TLS 1.2 at the handshake's end, TLS 1.3
        // with each ticket).
        b.set_new_session_callback(move |ssl, session| {
            if let Some(name) = ssl.ex_data(name_index) {
                if let Ok(mut cache) = store.lock() {
                    cache.insert(name.clone(), session);
                }
            }
        });
        Some(cache)
    } else {
        b.set_session_cache_mode(SslSessionCacheMode::OFF);
        b.set_options(SslOptions::NO_TICKET);
        None
    };
    Ok(Client {
        ctx: b.build(),
        sessions,
        name_index,
    })
}

impl Client {
    pub fn connect(&self, name: &ServerName<'static>) -> Result<Session, Error> {
        let mut ssl = Ssl::new(&self.ctx)?;
        ssl.set_connect_state();
        let key = match name {
            ServerName::IpAddress(ip) => {
                let ip = std::net::IpAddr::from(*ip);
                ssl.param_mut().set_ip(ip)?;
                ip.to_string()
            }
            ServerName::DnsName(host) => {
                let host = host.as_ref();
                ssl.set_hostname(host)?;
                ssl.param_mut().set_host(host)?;
                host.to_string()
            }
            _ => return Err(Error::UnsupportedName(format!("{name:?}"))),
        };
        if let Some(cache) = &self.sessions {
            let held = cache.lock().ok().and_then(|c| c.get(&key).cloned());
            if let Some(session) = held {
                // SAFETY: the session came from this context's own callback.
                unsafe { ssl.set_session(&session) }?;
            }
            ssl.set_ex_data(self.name_index, key);
        }
        let mut session = Session::new(ssl, false)?;
        // The ClientHello, queued for the socket.
        session.handshake()?;
        Ok(session)
    }
}

/// The bytes between OpenSSL and the socket: what arrived and is not yet consumed, and what
/// OpenSSL produced for the peer.
#[derive(Default)]
struct Pipe {
    input: Vec<u8>,
    consumed: usize,
    output: Vec<u8>,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = &self.input[self.consumed..];
        if left.is_empty() {
            self.input.clear();
            self.consumed = 0;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = left.len().min(buf.len());
        buf[..n].copy_from_slice(&left[..n]);
        self.consumed += n;
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One OpenSSL session.
pub struct Session {
    stream: SslStream<Pipe>,
    handshaking: bool,
    /// Plaintext queued before the handshake ended.
    pending: Vec<u8>,
    server: bool,
    /// The session failed (so it must not be resumed).
    failed: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        // OpenSSL forgets a session whose connection ended without a close_notify both ways,
        // which is how most SIP connections end (a peer closes the socket); rustls keeps
        // them. Sessions that did not fail stay resumable, as with rustls.
        if !self.failed && !self.handshaking {
            self.stream
                .set_shutdown(ShutdownState::SENT | ShutdownState::RECEIVED);
        }
    }
}

/// OpenSSL's "not yet": it needs more bytes from the peer (or to write, which the pipe
/// always takes).
fn would_block(e: &openssl::ssl::Error) -> bool {
    e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE
}

impl Session {
    fn new(ssl: Ssl, server: bool) -> Result<Session, Error> {
        let stream = SslStream::new(ssl, Pipe::default())?;
        Ok(Session {
            stream,
            handshaking: true,
            pending: Vec::new(),
            server,
            failed: false,
        })
    }

    /// Advances the handshake; once it is over, sends what was queued meanwhile.
    fn handshake(&mut self) -> Result<(), openssl::ssl::Error> {
        match self.stream.do_handshake() {
            Ok(()) => {
                self.handshaking = false;
                let pending = std::mem::take(&mut self.pending);
                self.send(&pending);
                Ok(())
            }
            Err(e) if would_block(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub fn receive(&mut self, wire: &[u8], plain: &mut Vec<u8>) -> Result<Received, Error> {
        let got = self.receive_inner(wire, plain);
        self.failed |= got.is_err();
        got
    }

    fn receive_inner(&mut self, wire: &[u8], plain: &mut Vec<u8>) -> Result<Received, Error> {
        self.stream.get_mut().input.extend_from_slice(wire);
        if self.handshaking {
            self.handshake()?;
            if self.handshaking {
                return Ok(Received::Open);
            }
        }
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.stream.ssl_read(&mut buf) {
                Ok(n) => plain.extend_from_slice(&buf[..n]),
                Err(e) if would_block(&e) => return Ok(Received::Open),
                Err(e) if e.code() == ErrorCode::ZERO_RETURN => return Ok(Received::Closed),
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub fn send(&mut self, mut data: &[u8]) {
        if self.handshaking {
            self.pending.extend_from_slice(data);
            return;
        }
        // The pipe takes everything, so a write fails only when the session has; the failure
        // then shows at the next receive.
        while !data.is_empty() {
            match self.stream.ssl_write(data) {
                Ok(n) => data = &data[n..],
                Err(_) => break,
            }
        }
    }

    pub fn wants_write(&self) -> bool {
        !self.stream.get_ref().output.is_empty()
    }

    pub fn write_to(&mut self, socket: &mut impl Write) -> io::Result<usize> {
        let output = &mut self.stream.get_mut().output;
        let n = socket.write(output)?;
        output.drain(..n);
        Ok(n)
    }

    pub fn is_handshaking(&self) -> bool {
        self.handshaking
    }

    pub fn handshake_kind(&self) -> HandshakeKind {
        if self.stream.ssl().session_reused() {
            HandshakeKind::Resumed
        } else {
            HandshakeKind::Full
        }
    }

    pub fn is_server(&self) -> bool {
        self.server
    }

    /// An accepted session whose client presented a certificate.
    pub fn client_certified(&self) -> bool {
        self.server && self.stream.ssl().peer_certificate().is_some()
    }

    pub fn close_notify(&mut self) {
        let _ = self.stream.shutdown();
    }

    /// The negotiated cipher suite by its IANA name, once the handshake is over.
    #[cfg(test)]
    pub(crate) fn cipher_suite(&self) -> Option<String> {
        let cipher = self.stream.ssl().current_cipher()?;
        Some(cipher.standard_name().unwrap_or(cipher.name()).to_string())
    }
}
