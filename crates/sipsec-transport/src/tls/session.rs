//! One TLS session over a stream, whichever backend made it: rustls (always), or OpenSSL (the
//! `openssl` feature, for seed 000's 2008 suite). Both are driven the same way, bytes in from
//! the socket and bytes out to it, so `net::conn` runs TCP and either TLS with one loop.

use super::Error;
use std::io::{self, Read, Write};

/// How a handshake went, as the counters report it.
pub use rustls::HandshakeKind;

/// A TLS session's state.
#[allow(
    clippy::large_enum_variant,
    reason = "connections hold it boxed, so the rustls variant's size costs nothing per idle connection"
)]
pub enum Session {
    /// A rustls client or server connection.
    Rustls(rustls::Connection),
    /// An OpenSSL session (cargo feature `openssl`).
    #[cfg(feature = "openssl")]
    Openssl(super::openssl::Session),
}

/// What the peer said, beyond plaintext.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// The session stays open.
    Open,
    /// The peer sent close_notify.
    Closed,
}

impl Session {
    /// A rustls session whose output is never refused. rustls caps what it buffers for the
    /// peer (64 KiB by default) and a write past the cap is cut short; a SIP message cut
    /// short corrupts the stream for every message after it. The connection's owner bounds
    /// what it queues, as it does for TCP.
    pub fn rustls(mut connection: rustls::Connection) -> Session {
        connection.set_buffer_limit(None);
        Session::Rustls(connection)
    }

    /// Feeds bytes read from the socket; plaintext they complete is appended to `plain`. An
    /// error means the session is over (a bad record, an alert, a refused certificate); the
    /// alert telling the peer why, if any, is queued to be written.
    pub fn receive(&mut self, mut wire: &[u8], plain: &mut Vec<u8>) -> Result<Received, Error> {
        match self {
            Session::Rustls(tls) => {
                while !wire.is_empty() {
                    tls.read_tls(&mut wire)?;
                    tls.process_new_packets()?;
                    match tls.reader().read_to_end(plain) {
                        Ok(_) => return Ok(Received::Closed),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        // Closed without close_notify, or a broken record: either way, gone.
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(Received::Open)
            }
            #[cfg(feature = "openssl")]
            Session::Openssl(tls) => tls.receive(wire, plain),
        }
    }

    /// Queues plaintext (held until the handshake ends when it is still running).
    pub fn send(&mut self, data: &[u8]) {
        match self {
            Session::Rustls(tls) => {
                // Unlimited buffers (see `Session::rustls`): this cannot fall short.
                let written = tls.writer().write_all(data);
                debug_assert!(written.is_ok(), "rustls refused plaintext: {written:?}");
            }
            #[cfg(feature = "openssl")]
            Session::Openssl(tls) => tls.send(data),
        }
    }

    /// Bytes are waiting to go to the socket.
    pub fn wants_write(&self) -> bool {
        match self {
            Session::Rustls(tls) => tls.wants_write(),
            #[cfg(feature = "openssl")]
            Session::Openssl(tls) => tls.wants_write(),
        }
    }

    /// Writes waiting bytes to `socket` (one write); how many it took.
    pub fn write_to(&mut self, socket: &mut impl Write) -> io::Result<usize> {
        match self {
            Session::Rustls(tls) => tls.write_tls(socket),
            #[cfg(feature = "openssl")]
            Session::Openssl(tls) => tls.write_to(socket),
        }
    }

    /// Whether the handshake has not finished yet.
    pub fn is_handshaking(&self) -> bool {
        match self {
            Session::Rustls(tls) => tls.is_handshaking(),
            #[cfg(feature = "openssl")]
            Session::Openssl(tls) => tls.is_handshaking(),
        }
    }

    /// Full or resumed, once the handshake is over.
    pub fn handshake_kind(&self) -> Option<HandshakeKind> {
        if self.is_handshaking() {
            return None;
        }
        match self {
            Session::Rustls(tls) => tls.handshake_kind(),
            #[cfg(feature = "openssl")]
            Session::Openssl(tls) => Some(tls.handshake_kind()),
        }
    }

    /// This end accepted the connection.
    pub fn is_server(&self) -> bool {
        match self {
            Session::Rustls(tls) => matches!(tls, rustls::Connection::Server(_)),
            #[cfg(feature = "openssl")]
            Session::Openssl(tls) => tls.is_server(),
        }
    }

    /// This end accepted the connection and the client presented a certificate (mutual TLS),
    /// which the handshake verified.
    pub fn client_certified(&self) -> bool {
        match self {
            Session::Rustls(rustls::Connection::Server(tls)) => tls.peer_certificates().is_some(),
            Session::Rustls(_) => false,
            #[cfg(feature = "openssl")]
            Session::Openssl(tls) => tls.client_certified(),
        }
    }

    /// Queues a close_notify alert.
    pub fn close_notify(&mut self) {
        match self {
            Session::Rustls(tls) => tls.send_close_notify(),
            #[cfg(feature = "openssl")]
            Session::Openssl(tls) => tls.close_notify(),
        }
    }

    /// The negotiated cipher suite by its IANA name (`TLS_…`), once the handshake is over.
    #[cfg(test)]
    pub(crate) fn cipher_suite(&self) -> Option<String> {
        match self {
            Session::Rustls(tls) => tls.negotiated_cipher_suite().map(|s| {
                // rustls spells TLS 1.3 suites TLS13_…; IANA spells them TLS_….
                format!("{:?}", s.suite()).replacen("TLS13_", "TLS_", 1)
            }),
            #[cfg(feature = "openssl")]
            Session::Openssl(tls) => tls.cipher_suite(),
        }
    }
}
