//! Bench options for the stream transports: the transport, both sides' connection policies
//! (seed 000's four modes), mutual TLS and resumption, and how many idle connections to hold,
//! turned into the started server's config and the load generator's options, so one bench
//! command sets up one mode.

use anyhow::Result;
use sipsec_load::cli::{ConnectionArg, LoadArgs, OnOff};
use sipsec_server::config::OutboundConnections;
use sipsec_transport::net::transport::Transport;
use sipsec_transport::tls::{certs, ClientAuth};
use std::path::{Path, PathBuf};

/// The domain the bench's server registers and locates users of.
pub(crate) const BENCH_DOMAIN: &str = "bench.test";

/// Seed 000's connection modes, as (caller's connections, proxy's outbound connections).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SeedMode {
    /// Persistent connections on both sides (proxy to proxy).
    Chain,
    /// A connection per call from the callers; one reused connection onwards.
    Outbound,
    /// One connection in; a connection per call onwards.
    Inbound,
    /// A connection per call on both sides.
    Local,
}

impl SeedMode {
    pub(crate) fn caller_per_call(self) -> bool {
        matches!(self, SeedMode::Outbound | SeedMode::Local)
    }

    /// The started proxy's policy for its connections onwards in this mode.
    pub fn outbound(self) -> OutboundConnections {
        match self {
            SeedMode::Inbound | SeedMode::Local => OutboundConnections::PerCall,
            _ => OutboundConnections::Persistent,
        }
    }
}

/// `sipsec bench` transport options.
#[derive(clap::Args, Debug, Clone)]
pub struct StreamArgs {
    /// Transport of the calls, both sides of the proxy. Over `ws` and `wss` the callee
    /// registers over its own connection, as a browser does, and is called over it.
    #[arg(long, value_enum, default_value = "udp")]
    pub transport: Transport,
    /// Seed 000's connection mode over TCP, TLS, WS and WSS (ignored for UDP; over WS and
    /// WSS only the callers' side applies: the server opens no WebSocket).
    #[arg(long, value_enum, default_value = "chain")]
    pub mode: SeedMode,
    /// TLS: the proxy demands client certificates and the UAS demands the proxy's.
    #[arg(long)]
    pub mutual: bool,
    /// TLS session resumption (tickets and session IDs) on every side.
    #[arg(long, value_enum, default_value = "on")]
    pub tls_resumption: OnOff,
    /// TLS key-exchange group on every side (seed 000 and the crypto floor: P-256).
    #[arg(long, default_value = "secp256r1")]
    pub tls_key_exchange: String,
    /// TLS library on every side: rustls, or openssl (the `openssl` feature) for seed 000's
    /// suite.
    #[arg(long, value_enum, default_value = "rustls")]
    pub tls_backend: sipsec_transport::tls::Backend,
    /// The one cipher suite every side offers (default: the backend's set). Seed 000's:
    /// `--tls-backend openssl --tls-cipher-suite TLS_RSA_WITH_AES_128_CBC_SHA --tls-cert-type
    /// rsa-2048`.
    #[arg(long)]
    pub(crate) tls_cipher_suite: Option<String>,
    /// The one TLS version every side offers, 1.2 or 1.3 (default: both).
    #[arg(long)]
    pub(crate) tls_version: Option<String>,
    /// Key type of the certificates made for the run.
    #[arg(long, value_enum, default_value = "ecdsa-p256")]
    pub(crate) tls_cert_type: certs::KeyKind,
    /// Certificates made by `sipsec certs` (server.pem valid for 127.0.0.1 to 127.0.0.3);
    /// default: made here for the run.
    #[arg(long)]
    pub(crate) tls_dir: Option<PathBuf>,
    /// Connections opened to the server and held idle during the measured run, over the
    /// run's transport (TCP for a UDP run): TLS handshaken, WebSocket upgraded.
    #[arg(long, default_value_t = 0)]
    pub(crate) idle_connections: usize,
    /// The started server's `[websocket] ping_interval_s` (its default, 30, unless given;
    /// 0: no keep-alive Pings).
    #[arg(long)]
    pub(crate) ws_ping_interval_s: Option<u64>,
}

/// Makes certificates for the bench topology (server, caller and UAS addresses) in `dir`.
pub fn make_certs(dir: &Path, key: certs::KeyKind) -> Result<()> {
    certs::run(&certs::CertsArgs {
        out: dir.to_path_buf(),
        key,
        names: ["localhost", "127.0.0.1", "127.0.0.2", "127.0.0.3"]
            .map(String::from)
            .to_vec(),
        client_name: "sipsec-bench".into(),
        new_ca: false,
    })
    .map(|_| ())
}

impl StreamArgs {
    /// The `[server]` keys of this mode for the started server.
    pub fn server_keys(&self) -> String {
        let outbound = match self.mode.outbound() {
            OutboundConnections::Persistent => "persistent",
            OutboundConnections::PerCall => "per-call",
        };
        // The idle connections and the calls all come from this host.
        let per_ip = (self.idle_connections + 10_000).max(100_000);
        format!(
            "outbound_connections = \"{outbound}\"\nmax_connections_per_ip = {per_ip}\n\
             max_connections = {per_ip}\n"
        )
    }

    /// The `[websocket]` table for the started server (empty unless a ping interval is given).
    pub(crate) fn websocket_table(&self) -> String {
        self.ws_ping_interval_s
            .map(|s| format!("[websocket]\nping_interval_s = {s}\n"))
            .unwrap_or_default()
    }

    /// The `[tls]` table for the started server (empty unless the transport is TLS or WSS).
    pub(crate) fn tls_table(&self, tls_dir: &Path) -> String {
        let mut text = String::new();
        if self.transport.secure() {
            let p = |f: &str| tls_dir.join(f).display().to_string();
            text += &format!(
                "[tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\nclient_auth = \"{}\"\n\
                 session_resumption = {}\nkey_exchange = [\"{}\"]\n",
                p(certs::SERVER),
                p(certs::SERVER_KEY),
                p(certs::CA),
                if self.mutual { "required" } else { "none" },
                self.tls_resumption.is_on(),
                self.tls_key_exchange
            );
            let backend = format!("{:?}", self.tls_backend).to_lowercase();
            text += &format!("backend = \"{backend}\"\n");
            if let Some(suite) = &self.tls_cipher_suite {
                text += &format!("cipher_suites = [\"{suite}\"]\n");
            }
            if let Some(version) = &self.tls_version {
                text += &format!("versions = [\"{version}\"]\n");
            }
        }
        text
    }

    /// Sets the load generator's options for this transport and mode.
    pub(crate) fn configure_load(&self, load: &mut LoadArgs, tls_dir: &Path) {
        load.transport = Some(self.transport);
        if self.transport == Transport::Udp {
            return;
        }
        load.connection = if self.mode.caller_per_call() {
            ConnectionArg::PerCall
        } else {
            ConnectionArg::Persistent
        };
        if self.transport.secure() {
            load.tls_ca = Some(tls_dir.join(certs::CA));
            load.tls_cert = Some(tls_dir.join(certs::SERVER));
            load.tls_key = Some(tls_dir.join(certs::SERVER_KEY));
            load.tls_resumption = self.tls_resumption;
            load.tls_key_exchange = vec![self.tls_key_exchange.clone()];
            if self.mutual {
                load.tls_client_auth = ClientAuth::Required;
            }
            load.tls_backend = self.tls_backend;
            load.tls_cipher_suites = self.tls_cipher_suite.iter().cloned().collect();
            load.tls_versions = self.tls_version.iter().cloned().collect();
        }
    }
}
