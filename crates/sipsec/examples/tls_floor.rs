//! The crypto floor of a TLS call: server-side CPU per handshake, in memory, with the same
//! rustls configurations `sipsec` builds (the `tls` module) and certificates from `sipsec
//! certs`. Only the server's calls are timed (thread CPU time around them), so the figure is
//! what a proxy pays per accepted connection, without sockets or the client's share.
//!
//!     cargo run --release --example tls_floor [HANDSHAKES=2000]
//!
//! The bars compare the TLS cost per call above TCP with this floor.

use rustls::{ClientConnection, ServerConnection};
use sipsec::certs::{self, CertsArgs, KeyKind};
use sipsec::tls::{self, ClientAuth, ClientSide, Protocol, ServerSide};
use std::path::Path;
use std::sync::Arc;

/// CPU time of the calling thread, in seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Moves the client's bytes into the server, timing the server's work.
fn to_server(c: &mut ClientConnection, s: &mut ServerConnection, server_s: &mut f64) -> bool {
    let mut bytes = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut bytes).unwrap();
    }
    let t = thread_cpu();
    let mut rd = &bytes[..];
    while !rd.is_empty() {
        s.read_tls(&mut rd).unwrap();
        s.process_new_packets().unwrap();
    }
    *server_s += thread_cpu() - t;
    !bytes.is_empty()
}

/// Moves the server's bytes to the client, timing the server's writing.
fn to_client(s: &mut ServerConnection, c: &mut ClientConnection, server_s: &mut f64) -> bool {
    let mut bytes = Vec::new();
    let t = thread_cpu();
    while s.wants_write() {
        s.write_tls(&mut bytes).unwrap();
    }
    *server_s += thread_cpu() - t;
    let mut rd = &bytes[..];
    while !rd.is_empty() {
        c.read_tls(&mut rd).unwrap();
        c.process_new_packets().unwrap();
    }
    !bytes.is_empty()
}

/// Server CPU per handshake (µs) over `n` handshakes; the first (which fills the client's
/// session cache) is not counted. Returns also how many resumed.
fn measure(
    client: &Arc<rustls::ClientConfig>,
    server: &Arc<rustls::ServerConfig>,
    n: usize,
) -> (f64, usize) {
    let name = tls::server_name(None, "127.0.0.1".parse().unwrap()).unwrap();
    let mut server_s = 0.0;
    let mut resumed = 0;
    for i in 0..=n {
        let mut c = ClientConnection::new(client.clone(), name.clone()).unwrap();
        let t = thread_cpu();
        let mut s = ServerConnection::new(server.clone()).unwrap();
        let mut spent = thread_cpu() - t;
        while to_server(&mut c, &mut s, &mut spent) | to_client(&mut s, &mut c, &mut spent) {}
        assert!(!c.is_handshaking() && !s.is_handshaking());
        if i > 0 {
            server_s += spent;
            resumed += usize::from(c.handshake_kind() == Some(rustls::HandshakeKind::Resumed));
        }
    }
    (server_s / n as f64 * 1e6, resumed)
}

fn configs(
    dir: &Path,
    group: &str,
    version: &str,
    client_cert: bool,
    resumption: bool,
) -> (Arc<rustls::ClientConfig>, Arc<rustls::ServerConfig>) {
    let protocol = Protocol {
        versions: vec![version.into()],
        cipher_suites: Vec::new(),
        key_exchange: vec![group.into()],
        session_resumption: resumption,
    };
    let client = tls::client_config(&ClientSide {
        ca: Some(dir.join(certs::CA)),
        no_verify: false,
        identity: client_cert.then(|| (dir.join(certs::CLIENT), dir.join(certs::CLIENT_KEY))),
        protocol: protocol.clone(),
    })
    .unwrap();
    let server = tls::server_config(&ServerSide {
        cert: dir.join(certs::SERVER),
        key: dir.join(certs::SERVER_KEY),
        ca: Some(dir.join(certs::CA)),
        client_auth: if client_cert {
            ClientAuth::Required
        } else {
            ClientAuth::None
        },
        protocol,
    })
    .unwrap();
    (client, server)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(2000, |a| a.parse().expect("HANDSHAKES is a number"));
    for key in [KeyKind::EcdsaP256, KeyKind::Rsa2048] {
        let dir = tempfile::tempdir().unwrap();
        certs::run(&CertsArgs {
            out: dir.path().to_path_buf(),
            key,
            names: Vec::new(),
            client_name: "floor".into(),
            new_ca: true,
        })
        .unwrap();
        for group in ["secp256r1", "X25519", "X25519MLKEM768"] {
            println!("{key:?} certificates, {group} key exchange, server CPU per handshake over {n} handshakes:");
            for (label, version, client_cert, resumption) in [
                ("TLS 1.3 full", "1.3", false, false),
                ("TLS 1.3 full, client certificate", "1.3", true, false),
                ("TLS 1.3 resumed (ticket, PSK-DHE)", "1.3", false, true),
                ("TLS 1.2 full", "1.2", false, false),
                ("TLS 1.2 resumed", "1.2", false, true),
            ] {
                if version == "1.2" && group == "X25519MLKEM768" {
                    continue; // a TLS 1.3 group only
                }
                let (client, server) = configs(dir.path(), group, version, client_cert, resumption);
                let (us, resumed) = measure(&client, &server, n);
                println!("  {label:<36} {us:8.1} µs   ({resumed}/{n} resumed)");
            }
        }
    }
}
