//! The crypto floor of a TLS call: CPU per handshake, in memory, with the same configurations
//! `sipsec` builds (the `tls` module, either backend) and certificates from `sipsec certs`.
//! Each side's calls are timed apart (thread CPU time around them), so the server column is
//! what a proxy pays per connection it accepts and the client column what it pays per
//! connection it opens, without sockets.
//!
//!     cargo run --release --example tls_floor [HANDSHAKES=2000]
//!     cargo run --release --features openssl --example tls_floor   # + seed 000's suite
//!     cargo run --release --example tls_floor 300 "1.3 resumed"      # only rows matching
//!     cargo run --release --example tls_floor 300 "" cold            # caches evicted
//!
//! Back to back, a handshake finds its code, tables and keys in cache; in a proxy it runs
//! between other calls' messages and the kernel's network work, and callgrind counts the same
//! instructions per handshake either way (BENCHMARKS.md). `cold` writes 64 MiB (more than
//! this machine's last-level cache) between handshakes, untimed, to show what misses cost.
//! With a row filter, one row runs alone: that is how callgrind counts instructions per
//! handshake in memory to compare with a running server.
//!
//! The bars compare the TLS cost per call above TCP with this floor.

use sipsec_transport::tls::certs::{self, CertsArgs, KeyKind};
use sipsec_transport::tls::{
    self, Backend, ClientAuth, ClientSide, ClientTls, Protocol, ServerSide, ServerTls, Session,
};
use std::path::Path;

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

/// Moves `from`'s bytes into `to`, timing each side's share; true when there were some.
fn pump(from: &mut Session, to: &mut Session, from_s: &mut f64, to_s: &mut f64) -> bool {
    let mut bytes = Vec::new();
    let t = thread_cpu();
    while from.wants_write() {
        from.write_to(&mut bytes).unwrap();
    }
    let t2 = thread_cpu();
    *from_s += t2 - t;
    if !bytes.is_empty() {
        to.receive(&bytes, &mut Vec::new()).unwrap();
    }
    *to_s += thread_cpu() - t2;
    !bytes.is_empty()
}

/// Server and client CPU per handshake (µs) over `n` handshakes; the first (which fills the
/// client's session cache) is not counted. Returns also how many resumed.
fn measure(client: &ClientTls, server: &ServerTls, n: usize, cold: bool) -> (f64, f64, usize) {
    let name = tls::server_name(None, "127.0.0.1".parse().unwrap()).unwrap();
    let (mut server_s, mut client_s) = (0.0, 0.0);
    let mut resumed = 0;
    let mut evict = vec![0u8; if cold { 64 << 20 } else { 0 }];
    for i in 0..=n {
        for (j, byte) in evict.iter_mut().enumerate().step_by(64) {
            *byte = byte.wrapping_add(j as u8);
        }
        std::hint::black_box(&evict);
        let (mut s_spent, mut c_spent) = (0.0, 0.0);
        let t = thread_cpu();
        let mut c = client.connect(name.clone()).unwrap();
        let t2 = thread_cpu();
        let mut s = server.accept().unwrap();
        s_spent += thread_cpu() - t2;
        c_spent += t2 - t;
        while pump(&mut c, &mut s, &mut c_spent, &mut s_spent)
            | pump(&mut s, &mut c, &mut s_spent, &mut c_spent)
        {}
        assert!(!c.is_handshaking() && !s.is_handshaking());
        if i > 0 {
            server_s += s_spent;
            client_s += c_spent;
            resumed += usize::from(c.handshake_kind() == Some(tls::HandshakeKind::Resumed));
        }
    }
    let per = |s: f64| s / n as f64 * 1e6;
    (per(server_s), per(client_s), resumed)
}

fn configs(
    dir: &Path,
    backend: Backend,
    suite: Option<&str>,
    group: &str,
    version: &str,
    client_cert: bool,
    resumption: bool,
) -> (ClientTls, ServerTls) {
    let protocol = Protocol {
        backend,
        versions: vec![version.into()],
        cipher_suites: suite.into_iter().map(String::from).collect(),
        key_exchange: vec![group.into()],
        session_resumption: resumption,
        noop: Default::default(),
    };
    let client = tls::client(&ClientSide {
        ca: Some(dir.join(certs::CA)),
        no_verify: false,
        identity: client_cert.then(|| (dir.join(certs::CLIENT), dir.join(certs::CLIENT_KEY))),
        protocol: protocol.clone(),
    })
    .unwrap();
    let server = tls::server(&ServerSide {
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

/// One row: a label, the backend, the suite (None: the backend's defaults), the group, the
/// version, a client certificate, resumption.
type Row = (
    &'static str,
    Backend,
    Option<&'static str>,
    &'static str,
    &'static str,
    bool,
    bool,
);

fn rows(key: KeyKind) -> Vec<Row> {
    let r = Backend::Rustls;
    let mut rows = Vec::new();
    for group in ["secp256r1", "X25519", "X25519MLKEM768"] {
        rows.extend([
            ("TLS 1.3 full", r, None, group, "1.3", false, false),
            (
                "TLS 1.3 full, client certificate",
                r,
                None,
                group,
                "1.3",
                true,
                false,
            ),
            (
                "TLS 1.3 resumed (ticket, PSK-DHE)",
                r,
                None,
                group,
                "1.3",
                false,
                true,
            ),
        ]);
        if group != "X25519MLKEM768" {
            // A TLS 1.3 group only.
            rows.extend([
                ("TLS 1.2 full", r, None, group, "1.2", false, false),
                ("TLS 1.2 resumed", r, None, group, "1.2", false, true),
            ]);
        }
    }
    if cfg!(feature = "openssl") {
        let o = Backend::Openssl;
        rows.extend([
            (
                "OpenSSL TLS 1.3 full",
                o,
                None,
                "secp256r1",
                "1.3",
                false,
                false,
            ),
            (
                "OpenSSL TLS 1.3 resumed",
                o,
                None,
                "secp256r1",
                "1.3",
                false,
                true,
            ),
        ]);
        if key == KeyKind::Rsa2048 {
            let seed = Some("TLS_RSA_WITH_AES_128_CBC_SHA");
            rows.extend([
                (
                    "seed 000: RSA kx, AES128-SHA, full",
                    o,
                    seed,
                    "secp256r1",
                    "1.2",
                    false,
                    false,
                ),
                (
                    "seed 000 suite, client certificate",
                    o,
                    seed,
                    "secp256r1",
                    "1.2",
                    true,
                    false,
                ),
                (
                    "seed 000 suite, resumed",
                    o,
                    seed,
                    "secp256r1",
                    "1.2",
                    false,
                    true,
                ),
            ]);
        }
    }
    rows
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(2000, |a| a.parse().expect("HANDSHAKES is a number"));
    let only = std::env::args().nth(2).filter(|f| !f.is_empty());
    let cold = std::env::args().nth(3).is_some_and(|a| a == "cold");
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
        let caches = if cold { ", caches evicted" } else { "" };
        println!("{key:?} certificates, CPU per handshake over {n} handshakes{caches} (µs):");
        println!(
            "  {:<38} {:<15} {:>8} {:>8}",
            "", "key exchange", "server", "client"
        );
        for (label, backend, suite, group, version, client_cert, resumption) in rows(key) {
            let row = format!("{label} {group}");
            if only.as_ref().is_some_and(|o| !row.contains(o.as_str())) {
                continue;
            }
            let (client, server) = configs(
                dir.path(),
                backend,
                suite,
                group,
                version,
                client_cert,
                resumption,
            );
            let (server_us, client_us, resumed) = measure(&client, &server, n, cold);
            let group = if suite.is_some() { "RSA" } else { group };
            println!(
                "  {label:<38} {group:<15} {server_us:8.1} {client_us:8.1}   ({resumed}/{n} resumed)"
            );
        }
    }
}
