//! The configuration contract: the TOML file `sipsec serve --config FILE` reads, its embedded
//! defaults, and validation that names the offending key.
//!
//! The keys documented in README.md are public; unknown keys are rejected so a typo fails at
//! start instead of being silently ignored.

mod cluster;
mod identity;
mod nat;
mod routing;
mod websocket;

pub use cluster::ClusterConfig;
use cluster::RawCluster;
pub use identity::{IdentityConfig, Policy as IdentityPolicy, SignConfig, VerifyConfig};
use nat::RawNat;
pub use nat::{NatConfig, NatMode, NatPing};
use routing::RawRouting;
pub use routing::{Next, Route, RoutingConfig};
pub use websocket::WebSocketConfig;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use sipsec_transport::net::names::ServerNames;
use sipsec_transport::tls::ClientAuth;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Where the server listens: `transport:ip:port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen {
    /// The transport the listener speaks.
    pub transport: Transport,
    /// The local address it binds.
    pub addr: SocketAddr,
}

pub use sipsec_transport::net::transport::Transport;

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.transport, self.addr)
    }
}

/// Parses `udp:127.0.0.1:5060`, `tcp:[::1]:5060`, `tls:127.0.0.1:5061`, `ws:0.0.0.0:8080`,
/// `wss:0.0.0.0:8443`.
pub(crate) fn parse_listen(s: &str) -> Result<Listen, String> {
    let (transport, addr) = s
        .split_once(':')
        .ok_or_else(|| format!("'{s}' is not transport:ip:port"))?;
    let transport = Transport::parse(transport.as_bytes())
        .ok_or_else(|| format!("unknown transport '{transport}' (udp, tcp, tls, ws or wss)"))?;
    let addr: SocketAddr = addr
        .parse()
        .map_err(|_| format!("'{addr}' is not an ip:port address"))?;
    Ok(Listen { transport, addr })
}

/// What the server does with a request for one of its users (`[server] mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Forwards it to the user's registered contacts (the default).
    Proxy,
    /// Answers 302 with the registered contacts (RFC 3261 §8.3).
    Redirect,
    /// A front end to a cluster: spreads every new request over the default routes (the
    /// nodes) by a hash — of the AOR for REGISTER, of the Call-ID for the rest — holding no
    /// registrations itself; in-dialog requests follow their Route.
    Dispatcher,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawServer {
    listen: Vec<String>,
    domains: Vec<String>,
    mode: Mode,
    stateful: bool,
    record_route: bool,
    workers: usize,
    max_message_size: usize,
    max_batch_delay_us: u64,
    max_transactions: usize,
    max_breadth: u32,
    server_header: String,
    outbound_connections: OutboundConnections,
    idle_timeout_s: u64,
    message_timeout_ms: u64,
    max_connections: usize,
    max_connections_per_ip: usize,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            listen: vec!["udp:127.0.0.1:5060".into()],
            domains: vec!["localhost".into()],
            mode: Mode::Proxy,
            stateful: true,
            record_route: true,
            workers: 0,
            max_message_size: 16 * 1024,
            max_batch_delay_us: 500,
            max_transactions: 500_000,
            max_breadth: 60,
            server_header: "sipsec".into(),
            outbound_connections: OutboundConnections::Persistent,
            idle_timeout_s: 120,
            message_timeout_ms: 10_000,
            max_connections: 100_000,
            max_connections_per_ip: 10_000,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawDatabase {
    url: String,
}

impl Default for RawDatabase {
    fn default() -> Self {
        RawDatabase {
            url: "sqlite://sipsec.db".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawRegistrar {
    min_expires: u32,
    max_expires: u32,
    default_expires: u32,
    max_contacts: usize,
    max_bindings: usize,
    max_bindings_per_source: usize,
    durable: bool,
}

impl Default for RawRegistrar {
    fn default() -> Self {
        RawRegistrar {
            min_expires: 60,
            max_expires: 86_400,
            default_expires: 3_600,
            max_contacts: 16,
            max_bindings: 100_000,
            max_bindings_per_source: 1_000,
            durable: false,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawAuth {
    scheme: crate::auth::Scheme,
    realm: Option<String>,
    methods: Vec<String>,
    algorithms: Vec<String>,
    nonce_lifetime_s: u64,
    trusted: Vec<String>,
    max_failures_per_source: u32,
    max_failures_per_user: u32,
    failure_window_s: u64,
    max_tracked_nonces: usize,
    // Proxychain.
    authority: Option<String>,
    authority_name: Option<String>,
    chain_length: u32,
    hash: String,
    cache_size: usize,
    prefetch_at: Option<u32>,
    backup: Option<PathBuf>,
    wait_ms: u64,
    credential_cache: bool,
}

impl Default for RawAuth {
    fn default() -> Self {
        RawAuth {
            scheme: crate::auth::Scheme::None,
            realm: None,
            methods: vec!["INVITE".into(), "REGISTER".into()],
            // MD5 alone by default: SIPp answers only the first challenge, and baresip and
            // sipsak refuse a 401 offering any algorithm they lack, whatever the order (README,
            // "Users and digest authentication").
            algorithms: vec!["MD5".into()],
            nonce_lifetime_s: 300,
            trusted: Vec::new(),
            max_failures_per_source: 30,
            max_failures_per_user: 10,
            failure_window_s: 60,
            max_tracked_nonces: 1_000_000,
            authority: None,
            authority_name: None,
            chain_length: 10,
            hash: "SHA-256".into(),
            cache_size: 1_000_000,
            prefetch_at: None,
            backup: None,
            wait_ms: 3000,
            credential_cache: true,
        }
    }
}

impl RawAuth {
    fn proxychain(
        &self,
        scope: &std::sync::Arc<crate::auth::Scope>,
    ) -> Result<crate::auth::proxychain::PcConfig> {
        use sip_core::proxychain::{HashKind, MAX_COUNTER};
        let authority = self
            .authority
            .as_deref()
            .context("auth.authority: proxychain needs the authority's \"tls:host:port\"")?;
        let peer = sipsec_transport::net::transport::Peer::parse(authority)
            .filter(|p| p.transport == Transport::Tls)
            .with_context(|| format!("auth.authority: {authority:?} is not \"tls:ip:port\""))?;
        let hash = HashKind::from_token(self.hash.as_bytes())
            .with_context(|| format!("auth.hash: {:?} is not MD5 or SHA-256", self.hash))?;
        if self.chain_length == 0 || self.chain_length > MAX_COUNTER {
            bail!("auth.chain_length must be 1 to {MAX_COUNTER}");
        }
        if self.cache_size == 0 {
            bail!("auth.cache_size must be positive");
        }
        Ok(crate::auth::proxychain::PcConfig {
            authority: peer.addr,
            authority_name: self
                .authority_name
                .clone()
                .unwrap_or_else(|| peer.addr.ip().to_string()),
            chain_length: self.chain_length,
            hash,
            cache_size: self.cache_size,
            // By default the next chain is fetched when a quarter of this one is left.
            prefetch_at: self
                .prefetch_at
                .unwrap_or(self.chain_length.div_ceil(4))
                .min(self.chain_length),
            backup: self.backup.clone(),
            scope: scope.clone(),
            wait_ms: self.wait_ms.max(100),
        })
    }

    fn validate(self, domains: &[String], listen: &[Listen]) -> Result<crate::auth::AuthConfig> {
        use sip_core::digest::Algorithm;
        let methods = method_list("auth.methods", &self.methods)?;
        for m in &methods {
            if m == "ACK" || m == "CANCEL" {
                bail!("auth.methods: {m} cannot be challenged (RFC 3261 §22.1)");
            }
        }
        let algorithms = self
            .algorithms
            .iter()
            .map(|a| {
                Algorithm::from_token(a.as_bytes()).with_context(|| {
                    format!("auth.algorithms: unknown algorithm {a:?} (MD5, SHA-256, SHA-512-256)")
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if algorithms.is_empty() {
            bail!("auth.algorithms: offer at least one");
        }
        if self.nonce_lifetime_s == 0 {
            bail!("auth.nonce_lifetime_s must be positive");
        }
        let trusted = network_list("auth.trusted", &self.trusted)?;
        let realm = self.realm.clone().unwrap_or_else(|| domains[0].clone());
        if realm.is_empty() || realm.contains(['"', '\\', '\r', '\n']) {
            bail!("auth.realm: {realm:?} cannot be used as a realm");
        }
        let scope = std::sync::Arc::new(crate::auth::Scope {
            realm,
            methods,
            trusted,
        });
        let proxychain = if self.scheme == crate::auth::Scheme::Proxychain {
            Some(self.proxychain(&scope)?)
        } else {
            None
        };
        Ok(crate::auth::AuthConfig {
            proxychain,
            credential_cache: self.credential_cache,
            scheme: self.scheme,
            scope,
            algorithms,
            nonce_lifetime_ms: self.nonce_lifetime_s * 1000,
            max_failures_per_source: self.max_failures_per_source,
            max_failures_per_user: self.max_failures_per_user,
            failure_window_ms: self.failure_window_s.max(1) * 1000,
            max_tracked_nonces: self.max_tracked_nonces.max(1000),
            server: ServerNames {
                domains: domains.to_vec(),
                addrs: listen.iter().map(|l| l.addr).collect(),
            },
        })
    }
}

/// A list of IP networks from the file (`key` names the list in the error).
fn network_list(key: &str, networks: &[String]) -> Result<Vec<crate::auth::Network>> {
    networks
        .iter()
        .map(|t| crate::auth::Network::parse(t).map_err(|e| anyhow::anyhow!("{key}: {e}")))
        .collect()
}

/// A list of SIP methods from the file, upper-cased, each checked to be a method token
/// (`key` names the list in the error).
fn method_list(key: &str, methods: &[String]) -> Result<Vec<String>> {
    let methods: Vec<String> = methods
        .iter()
        .map(|m| m.trim().to_ascii_uppercase())
        .collect();
    for m in &methods {
        if m.is_empty()
            || !m
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.!%*_+`'~".contains(&b))
        {
            bail!("{key}: {m:?} is not a SIP method");
        }
    }
    Ok(methods)
}

/// How the server opens connections to the next hop over TCP and TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutboundConnections {
    /// One connection per target (and worker), kept open and shared by every call: seed 000's
    /// persistent connections, its proxy chain. `"reuse"`, its first name, is still read.
    #[serde(alias = "reuse")]
    Persistent,
    /// A connection per call, closed when the call ends: seed 000's inbound and local modes.
    PerCall,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTls {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
    client_auth: ClientAuth,
    session_resumption: bool,
    versions: Vec<String>,
    cipher_suites: Vec<String>,
    key_exchange: Vec<String>,
    verify_server: bool,
    backend: sipsec_transport::tls::Backend,
}

impl Default for RawTls {
    fn default() -> Self {
        RawTls {
            cert: None,
            key: None,
            ca: None,
            client_auth: ClientAuth::None,
            session_resumption: true,
            versions: Vec::new(),
            cipher_suites: Vec::new(),
            key_exchange: Vec::new(),
            verify_server: true,
            backend: sipsec_transport::tls::Backend::Rustls,
        }
    }
}

/// TLS settings (`[tls]`): the server side for `tls:` listeners, the client side for
/// connections the server opens. Both present `cert`; `ca` verifies client certificates and
/// the certificates of servers we connect to.
#[derive(Debug, Clone, Default)]
pub struct TlsConfig {
    /// Our certificate chain (PEM, `tls.cert`): presented to TLS clients, and as our client
    /// certificate to servers that ask.
    pub cert: Option<PathBuf>,
    /// The private key of `cert` (PEM, `tls.key`).
    pub key: Option<PathBuf>,
    /// CA certificates (PEM, `tls.ca`) that client certificates and the servers we connect to must
    /// chain to.
    pub ca: Option<PathBuf>,
    /// Whether `tls:` listeners ask clients for a certificate (`tls.client_auth`: none, optional or
    /// required; default none).
    pub client_auth: ClientAuth,
    /// Whether the certificates of servers we connect to are verified (`tls.verify_server`, default
    /// true; false is for labs).
    pub verify_server: bool,
    /// Backend, versions, suites, key-exchange groups and session resumption, for both sides.
    pub protocol: sipsec_transport::tls::Protocol,
}

impl TlsConfig {
    /// The server side of `tls:` listeners.
    pub fn server(&self) -> Result<sipsec_transport::tls::ServerTls> {
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            bail!("tls: a tls listener needs tls.cert and tls.key");
        };
        sipsec_transport::tls::server(&sipsec_transport::tls::ServerSide {
            cert: cert.clone(),
            key: key.clone(),
            ca: self.ca.clone(),
            client_auth: self.client_auth,
            protocol: self.protocol.clone(),
        })
        .context("tls")
    }

    /// The client side of TLS connections we open.
    pub fn client(&self) -> Result<sipsec_transport::tls::ClientTls> {
        if self.ca.is_none() && self.verify_server {
            bail!("tls: opening TLS connections needs tls.ca, or tls.verify_server = false");
        }
        sipsec_transport::tls::client(&sipsec_transport::tls::ClientSide {
            ca: self.ca.clone(),
            no_verify: !self.verify_server,
            identity: self.cert.clone().zip(self.key.clone()),
            protocol: self.protocol.clone(),
        })
        .context("tls")
    }
}

/// Connection handling for TCP, TLS and WebSocket (`[server]` keys, and `[websocket]`'s).
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Whether connections to the next hop are kept per target or opened per call
    /// (`outbound_connections`, default persistent).
    pub outbound: OutboundConnections,
    /// A connection with no traffic this long is closed.
    pub(crate) idle_timeout_ms: u64,
    /// A message (or a TLS handshake) must arrive whole within this time once begun, and a
    /// peer must take some of what waits to be sent to it within it.
    pub message_timeout_ms: u64,
    /// Open connections per worker beyond which new ones are refused.
    pub(crate) max_connections_per_worker: usize,
    /// Connections accepted from one IP address, per worker, beyond which that address's
    /// new ones are refused (so one host cannot take every slot).
    pub(crate) max_per_ip_per_worker: usize,
    /// Who may open SIP over WebSocket, and keep-alives (`[websocket]`).
    pub websocket: WebSocketConfig,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawOverload {
    enabled: bool,
    target: f64,
    /// None: [`FEEDBACK_MARGIN`] of `target`, whatever `target` is set to.
    feedback_target: Option<f64>,
    interval_ms: u64,
    max_queue_delay_ms: u64,
    max_rate: Option<f64>,
    methods: Vec<String>,
    retry_after_s: u32,
    priority: bool,
    priority_sources: Vec<String>,
    feedback: bool,
    algorithm: String,
    validity_ms: u32,
    announce: bool,
}

impl Default for RawOverload {
    fn default() -> Self {
        RawOverload {
            enabled: true,
            target: 0.95,
            feedback_target: None,
            interval_ms: 100,
            max_queue_delay_ms: DEFAULT_MAX_QUEUE_DELAY_MS,
            max_rate: None,
            methods: [
                "INVITE",
                "SUBSCRIBE",
                "REFER",
                "MESSAGE",
                "OPTIONS",
                "PUBLISH",
            ]
            .map(String::from)
            .to_vec(),
            retry_after_s: 1,
            priority: true,
            priority_sources: Vec::new(),
            feedback: true,
            algorithm: "loss".into(),
            validity_ms: 500,
            announce: true,
        }
    }
}

/// Overload control (`[overload]`, `engine::overload`).
#[derive(Debug, Clone)]
pub struct OverloadConfig {
    /// Local admission control on: a saturated worker refuses new requests beyond its
    /// estimated capacity.
    pub enabled: bool,
    /// The load that counts as saturation where no queue delay is measured (below half
    /// load, where the worker does not measure it).
    pub target: f64,
    /// RFC 7339/7415 neighbours are given `feedback_target / target` of the capacity: a
    /// margin, so a neighbour that honours it is never shed locally as well.
    pub(crate) feedback_target: f64,
    /// How often a worker measures its load and updates what it admits, in milliseconds.
    pub interval_ms: u64,
    /// A queue (datagrams', kernel receive to read) standing longer than this drains:
    /// admission keeps less of the capacity until it is gone. The connections' queue is
    /// judged against this or 20 ms, whichever is less (`overload::control`).
    pub(crate) max_queue_delay_ms: u64,
    /// New sheddable requests the server admits per second at most, whatever its load,
    /// shared equally between its workers (a fixed limit, as Kamailio's `ratelimit` keeps);
    /// 0 admits none, for a node being drained. None: no fixed limit.
    pub(crate) max_rate: Option<f64>,
    /// Methods whose out-of-dialog requests may be shed (upper case).
    pub methods: Vec<String>,
    /// `Retry-After` of the 503s that shed a request (0: none), for clients that do not
    /// speak RFC 7339 (those that do get feedback instead).
    pub(crate) retry_after_s: u32,
    /// Requests with a `Resource-Priority` header (RFC 4412, emergency calls) from
    /// `priority_sources` are never shed.
    pub priority: bool,
    /// The networks whose `Resource-Priority` is honoured: shedding runs before
    /// authentication, so only the source address can say a request is entitled to priority
    /// (RFC 4412 §11: priority is granted to authorised requests only). Empty: nobody.
    pub(crate) priority_sources: Vec<crate::auth::Network>,
    /// Answer neighbours that announce `oc` in their Via with feedback (RFC 7339).
    pub feedback: bool,
    /// The algorithm offered to a neighbour that supports both.
    pub algorithm: sip_core::overload::Algorithm,
    /// `oc-validity` of our feedback.
    pub validity_ms: u32,
    /// Announce `oc` in our own Via and honour a next hop's feedback (RFC 7339 client).
    pub announce: bool,
}

/// `[overload] max_queue_delay_ms` unless set: how long a queue may stand before it drains.
/// Up to it the controller lets a queue stand, and a longer one means fuller batches, so a
/// call costs the worker less: RFC 7339 callers at the lab grid's 4× kept 1.10 [1.01, 1.19] of
/// what they kept with 20 ms (2×: 1.05 [0.99, 1.11]; 5 rotated rounds over UDP, the best of
/// 20, 50 and 100 ms, BENCHMARKS.md). The price under that overload: first responses at most
/// 340 ms (inside SIP's 500 ms T1, so no INVITE is retransmitted for want of one), calls' 99th
/// percentile 340–575 ms against 198–387. The connections' queue, whose figure is a lower
/// bound on the wait, keeps a 20 ms limit (`STREAMS_MAX_DELAY_MS`).
pub(crate) const DEFAULT_MAX_QUEUE_DELAY_MS: u64 = 100;

/// Where `[overload] feedback_target` is not set, RFC 7339/7415 neighbours are given this
/// share of the capacity (`feedback_target = FEEDBACK_MARGIN · target`): a 2% margin, enough
/// with a capacity read from the CPU; a set `target` keeps it.
const FEEDBACK_MARGIN: f64 = 0.98;

impl RawOverload {
    fn validate(self) -> Result<OverloadConfig> {
        if !(self.target > 0.0 && self.target <= 1.0) {
            bail!("overload.target: a busy fraction above 0 and at most 1");
        }
        let feedback_target = self
            .feedback_target
            .unwrap_or(FEEDBACK_MARGIN * self.target);
        if !(feedback_target > 0.0 && feedback_target <= self.target) {
            bail!("overload.feedback_target: a busy fraction above 0 and at most overload.target");
        }
        if !(10..=10_000).contains(&self.interval_ms) {
            bail!("overload.interval_ms: between 10 and 10000");
        }
        if !(1..=10_000).contains(&self.max_queue_delay_ms) {
            bail!("overload.max_queue_delay_ms: between 1 and 10000");
        }
        if self.max_rate.is_some_and(|r| !(r.is_finite() && r >= 0.0)) {
            bail!("overload.max_rate: new requests per second, 0 or more");
        }
        if self.retry_after_s > 3600 {
            bail!("overload.retry_after_s: at most 3600");
        }
        if !(100..=60_000).contains(&self.validity_ms) {
            bail!("overload.validity_ms: between 100 and 60000");
        }
        let algorithm = match self.algorithm.to_ascii_lowercase().as_str() {
            "loss" => sip_core::overload::Algorithm::Loss,
            "rate" => sip_core::overload::Algorithm::Rate,
            other => bail!("overload.algorithm: {other:?} is not \"loss\" or \"rate\""),
        };
        let methods = method_list("overload.methods", &self.methods)?;
        for m in &methods {
            if matches!(m.as_str(), "ACK" | "CANCEL" | "BYE") {
                bail!("overload.methods: {m} completes a call already admitted and is never shed");
            }
        }
        Ok(OverloadConfig {
            enabled: self.enabled,
            target: self.target,
            feedback_target,
            interval_ms: self.interval_ms,
            max_queue_delay_ms: self.max_queue_delay_ms,
            max_rate: self.max_rate,
            methods,
            retry_after_s: self.retry_after_s,
            priority: self.priority,
            priority_sources: network_list("overload.priority_sources", &self.priority_sources)?,
            feedback: self.feedback,
            algorithm,
            validity_ms: self.validity_ms,
            announce: self.announce,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawFlood {
    rate: u32,
    window_ms: u64,
    ban_s: u64,
    action: String,
    max_sources: usize,
    exempt: Vec<String>,
}

impl Default for RawFlood {
    fn default() -> Self {
        RawFlood {
            // Far above what a phone sends (a few requests a minute, a burst of tens when it
            // starts), far below a flood (tens of thousands a second).
            rate: 1_000,
            window_ms: 1_000,
            ban_s: 60,
            action: "drop".into(),
            max_sources: 50_000,
            exempt: vec!["127.0.0.0/8".into(), "::1".into()],
        }
    }
}

/// What a worker does with a request from a source over the flood limit (`[flood] action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloodAction {
    /// Nothing: the request is dropped unread (the default, and the cheapest).
    Drop,
    /// A response with this code (503 or 403), at most `flood::ANSWERS_PER_SECOND` a second per
    /// worker; requests beyond that, and ACKs, are dropped.
    Answer(u16),
}

/// Per-source flood limits (`[flood]`, `flood`): a source IP address (an IPv6 /64) sending
/// requests faster than `rate` over `window_ms` is refused for `ban_ms`. Each worker keeps its
/// own table, so the limit holds per worker.
#[derive(Debug, Clone)]
pub struct FloodConfig {
    /// Requests one source may send within one window (`rate` × `window_ms`); 0: no limit.
    pub(crate) limit: u32,
    /// The window the rate is measured over (a two-bucket sliding window).
    pub(crate) window_ms: u64,
    /// How long a source over the limit is refused.
    pub(crate) ban_ms: u64,
    /// Drop or answer what a refused source sends.
    pub action: FloodAction,
    /// Sources each worker tracks; past it the least recently seen is forgotten.
    pub(crate) max_sources: usize,
    /// Networks never limited: `[flood] exempt` and `[auth] trusted`.
    pub(crate) exempt: Vec<crate::auth::Network>,
}

impl RawFlood {
    fn validate(self, trusted: &[crate::auth::Network]) -> Result<FloodConfig> {
        if self.rate > 10_000_000 {
            bail!("flood.rate: at most 10000000 requests a second (0 switches the limit off)");
        }
        if !(100..=60_000).contains(&self.window_ms) {
            bail!("flood.window_ms: between 100 and 60000");
        }
        let limit = u64::from(self.rate) * self.window_ms / 1000;
        if self.rate > 0 && limit == 0 {
            bail!("flood.rate: less than one request per flood.window_ms; lengthen the window");
        }
        if !(1..=86_400).contains(&self.ban_s) {
            bail!("flood.ban_s: between 1 and 86400 seconds");
        }
        if !(1..=10_000_000).contains(&self.max_sources) {
            bail!("flood.max_sources: between 1 and 10000000");
        }
        let action = match self.action.trim().to_ascii_lowercase().as_str() {
            "drop" => FloodAction::Drop,
            "503" => FloodAction::Answer(503),
            "403" => FloodAction::Answer(403),
            other => bail!("flood.action: {other:?} is not \"drop\", \"503\" or \"403\""),
        };
        let mut exempt = network_list("flood.exempt", &self.exempt)?;
        exempt.extend(trusted.iter().copied());
        Ok(FloodConfig {
            limit: limit.min(u64::from(u32::MAX)) as u32,
            window_ms: self.window_ms,
            ban_ms: self.ban_s * 1000,
            action,
            max_sources: self.max_sources,
            exempt,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawMetrics {
    listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawControl {
    socket: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawConfig {
    server: RawServer,
    metrics: RawMetrics,
    control: RawControl,
    tls: RawTls,
    routing: RawRouting,
    database: RawDatabase,
    registrar: RawRegistrar,
    auth: RawAuth,
    overload: RawOverload,
    nat: RawNat,
    flood: RawFlood,
    cluster: RawCluster,
    websocket: websocket::RawWebSocket,
    identity: identity::RawIdentity,
}

/// Registrar limits (`[registrar]`).
#[derive(Debug, Clone)]
pub struct RegistrarConfig {
    pub(crate) min_expires: u32,
    pub(crate) max_expires: u32,
    pub(crate) default_expires: u32,
    /// Contacts one address-of-record may hold (`max_contacts`, default 16); more is answered 403.
    pub max_contacts: usize,
    /// Bindings held in all, across workers; a REGISTER that would add one more is answered
    /// 503 (with Retry-After), and no more than this many are loaded from the database.
    pub max_bindings: usize,
    /// Bindings registered from one source IP address (0: no limit); beyond, 503. Phones
    /// behind one NAT share an address: size it for the largest site.
    pub(crate) max_bindings_per_source: usize,
    /// Answer a REGISTER only once its binding is committed to the database (group commit),
    /// instead of writing behind.
    pub durable: bool,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The addresses the server listens on (`listen`, default `udp:127.0.0.1:5060`).
    pub listen: Vec<Listen>,
    /// The domains whose users this server registers and locates, lower case (`domains`, default
    /// `localhost`).
    pub domains: Vec<String>,
    /// Proxy or redirect server (`mode`, default proxy).
    pub mode: Mode,
    /// Whether requests are proxied statefully, with transactions (RFC 3261 §17), or forwarded
    /// statelessly (§16.11); `stateful`, default true.
    pub stateful: bool,
    pub(crate) record_route: bool,
    /// Resolved worker count (never 0).
    pub workers: usize,
    /// The largest message accepted, in bytes (`max_message_size`, default 16384); larger ones are
    /// answered 513.
    pub max_message_size: usize,
    /// Cap on how long a loaded worker lets messages accumulate after waking, while it
    /// measures that waiting costs less CPU than not (0: never; `serve::coalesce`).
    pub(crate) max_batch_delay_us: u64,
    /// Transactions per worker at which the oldest finished (lingering) one is ended early to
    /// admit a new request, or, with none finished, the request is answered 503.
    pub max_transactions: usize,
    /// Max-Breadth (RFC 5393) given to requests that arrive without one, and the most any
    /// request may carry on: the parallel branches one request can fan out to, across every
    /// proxy it passes.
    pub max_breadth: u32,
    /// The `Server` header line of responses made here ("" when none is sent); the version is
    /// left out by default, so a prober learns less.
    pub(crate) server_line: String,
    /// Our domains and listen addresses, as routing and authentication ask about them.
    pub names: ServerNames,
    /// The host's interface addresses: what a listener on the unspecified address
    /// (`0.0.0.0`, `[::]`) is reachable at. Not from the file: `serve` enumerates them at
    /// start and on reload ([`sipsec_transport::net::names::host_addresses`]); empty otherwise.
    pub(crate) host_addrs: Vec<std::net::IpAddr>,
    /// Default and per-domain routes, DNS and failover (`[routing]`).
    pub routing: RoutingConfig,
    pub(crate) database_url: String,
    /// Registration expiry bounds and binding limits (`[registrar]`).
    pub registrar: RegistrarConfig,
    /// TCP and TLS connection handling (`[server]` keys).
    pub streams: StreamConfig,
    /// Certificates and protocol choices for TLS (`[tls]`).
    pub tls: TlsConfig,
    /// Who is challenged and how (`[auth]`).
    pub auth: crate::auth::AuthConfig,
    /// Local admission control and RFC 7339 feedback (`[overload]`).
    pub overload: OverloadConfig,
    /// Phones behind NATs and RFC 5626 flows (`[nat]`).
    pub nat: NatConfig,
    /// Per-source flood limits (`[flood]`).
    pub flood: FloodConfig,
    /// Sharing registrations with other nodes through PostgreSQL (`[cluster]`), if on.
    pub cluster: Option<ClusterConfig>,
    /// STIR/SHAKEN: signing our callers' INVITEs, verifying others' (`[identity]`).
    pub identity: IdentityConfig,
    /// Where Prometheus metrics are served (`[metrics] listen`), if anywhere.
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// The Unix socket `sipsec ctl` talks to (`[control] socket`), if any.
    pub control_socket: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config::from_toml("").expect("the embedded defaults are valid")
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = read_file(path)?;
        let mut cfg = Config::from_toml(&text)
            .with_context(|| format!("invalid config file {}", path.display()))?;
        // Relative paths in the file mean relative to the file, wherever the command runs.
        let base = path.parent().unwrap_or(Path::new(""));
        cfg.database_url = resolve_relative(&cfg.database_url, base);
        for p in [&mut cfg.tls.cert, &mut cfg.tls.key, &mut cfg.tls.ca]
            .into_iter()
            .flatten()
        {
            *p = base.join(&*p);
        }
        if let Some(pc) = cfg.auth.proxychain.as_mut() {
            if let Some(b) = pc.backup.as_mut() {
                *b = base.join(&*b);
            }
        }
        if let Some(s) = cfg.control_socket.as_mut() {
            *s = base.join(&*s);
        }
        if let Some(sign) = cfg.identity.sign.as_mut() {
            sign.key = base.join(&sign.key);
        }
        if let Some(verify) = cfg.identity.verify.as_mut() {
            verify.roots = base.join(&verify.roots);
            if let Some(ca) = verify.fetch_ca.as_mut() {
                *ca = base.join(&*ca);
            }
        }
        Ok(cfg)
    }

    /// The keys that differ between this (running) configuration and `new` but cannot change
    /// without a restart: what the server bound, spawned or connected to at start, and state
    /// that outlives a request (transactions, nonces, the credential cache). Everything else
    /// — routes, registrar limits, overload control, flood limits, which methods are
    /// challenged and who is trusted, the digest algorithms, domains, the server's own
    /// answers, TLS certificates — a reload applies.
    pub(crate) fn restart_only_changes(&self, new: &Config) -> Vec<&'static str> {
        let (a, b) = (self, new);
        let (x, y) = (&a.auth, &b.auth);
        [
            ("server.listen", a.listen != b.listen),
            ("server.workers", a.workers != b.workers),
            ("server.stateful", a.stateful != b.stateful),
            (
                "server.max_message_size",
                a.max_message_size != b.max_message_size,
            ),
            (
                "server.max_batch_delay_us",
                a.max_batch_delay_us != b.max_batch_delay_us,
            ),
            (
                "server.outbound_connections",
                a.streams.outbound != b.streams.outbound,
            ),
            (
                "server.idle_timeout_s",
                a.streams.idle_timeout_ms != b.streams.idle_timeout_ms,
            ),
            (
                "server.message_timeout_ms",
                a.streams.message_timeout_ms != b.streams.message_timeout_ms,
            ),
            // Held per worker: compared when the workers are the same.
            (
                "server.max_connections",
                a.workers == b.workers
                    && a.streams.max_connections_per_worker != b.streams.max_connections_per_worker,
            ),
            (
                "server.max_connections_per_ip",
                a.workers == b.workers
                    && a.streams.max_per_ip_per_worker != b.streams.max_per_ip_per_worker,
            ),
            ("database.url", a.database_url != b.database_url),
            ("cluster", a.cluster != b.cluster),
            ("metrics.listen", a.metrics_listen != b.metrics_listen),
            ("control.socket", a.control_socket != b.control_socket),
            // The signing key, the roots and the fetcher are set up once, at start.
            ("identity", a.identity != b.identity),
            (
                "registrar.durable",
                a.registrar.durable != b.registrar.durable,
            ),
            (
                "overload.interval_ms",
                a.overload.interval_ms != b.overload.interval_ms,
            ),
            ("auth.scheme", x.scheme != y.scheme),
            ("auth.realm", x.scope.realm != y.scope.realm),
            (
                "auth.nonce_lifetime_s",
                x.nonce_lifetime_ms != y.nonce_lifetime_ms,
            ),
            (
                "auth.max_tracked_nonces",
                x.max_tracked_nonces != y.max_tracked_nonces,
            ),
            (
                "auth.max_failures_per_source",
                x.max_failures_per_source != y.max_failures_per_source,
            ),
            (
                "auth.max_failures_per_user",
                x.max_failures_per_user != y.max_failures_per_user,
            ),
            (
                "auth.failure_window_s",
                x.failure_window_ms != y.failure_window_ms,
            ),
            (
                "auth.credential_cache",
                x.credential_cache != y.credential_cache,
            ),
            (
                "auth.authority (or another Proxychain key)",
                match (&x.proxychain, &y.proxychain) {
                    (Some(p), Some(q)) => !p.same_setup(q),
                    (p, q) => p.is_some() != q.is_some(),
                },
            ),
        ]
        .into_iter()
        .filter_map(|(key, changed)| changed.then_some(key))
        .collect()
    }

    /// Parses and validates TOML text (empty text gives the embedded defaults).
    pub fn from_toml(text: &str) -> Result<Config> {
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
        let mut listen = Vec::new();
        if raw.server.listen.is_empty() {
            bail!("server.listen: at least one address is needed");
        }
        for (i, l) in raw.server.listen.iter().enumerate() {
            listen.push(parse_listen(l).map_err(|e| anyhow::anyhow!("server.listen[{i}]: {e}"))?);
        }
        if raw.server.domains.is_empty() {
            bail!("server.domains: at least one domain is needed");
        }
        for (i, d) in raw.server.domains.iter().enumerate() {
            if !sip_core::message::uri::valid_host(d.as_bytes()) {
                bail!("server.domains[{i}]: '{d}' is not a valid host name");
            }
        }
        if !(1024..=65_535).contains(&raw.server.max_message_size) {
            bail!("server.max_message_size: must be between 1024 and 65535 bytes");
        }
        if raw.server.max_batch_delay_us > 10_000 {
            bail!("server.max_batch_delay_us: at most 10000 (10 ms)");
        }
        if raw.server.max_transactions < 16 {
            bail!("server.max_transactions: at least 16");
        }
        if raw.server.server_header.contains(['\r', '\n']) {
            bail!("server.server_header: one line of text");
        }
        if !(1..=1000).contains(&raw.server.max_breadth) {
            bail!("server.max_breadth: must be between 1 and 1000");
        }
        let workers = match raw.server.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n if n > 36 => bail!("server.workers: at most 36 workers"),
            n => n,
        };
        let routing = raw.routing.validate(&listen)?;
        let nat = raw.nat.validate()?;
        let metrics_listen =
            match raw.metrics.listen {
                None => None,
                Some(l) => Some(l.parse::<SocketAddr>().map_err(|_| {
                    anyhow::anyhow!("metrics.listen: {l:?} is not an ip:port address")
                })?),
            };
        let control_socket = match raw.control.socket {
            Some(s) if s.trim().is_empty() => bail!("control.socket: an empty path"),
            s => s.map(PathBuf::from),
        };
        let url = raw.database.url;
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres:")
            || url.starts_with("postgresql:")
            || url.starts_with("mysql:")
            || url.starts_with("mariadb:"))
        {
            bail!("database.url: '{url}' is not a sqlite://, postgres:// or mysql:// URL");
        }
        let domains: Vec<String> = raw
            .server
            .domains
            .iter()
            .map(|d| d.to_ascii_lowercase())
            .collect();
        let auth = raw.auth.validate(&domains, &listen)?;
        let websocket = raw
            .websocket
            .validate(&domains, raw.server.max_message_size)?;
        let cluster = raw.cluster.validate(&url, &listen)?;
        if raw.server.mode == Mode::Dispatcher {
            if routing.default_routes.is_empty() {
                bail!(
                    "server.mode = \"dispatcher\": name the nodes it spreads requests over in \
                     [routing] default_routes (or default_route)"
                );
            }
            if cluster.is_some() {
                bail!("cluster: a dispatcher holds no registrations; remove [cluster]");
            }
        }
        let overload = raw.overload.validate()?;
        let flood = raw.flood.validate(&auth.scope.trusted)?;
        let identity = raw.identity.validate()?;
        let reg = raw.registrar;
        if reg.min_expires > reg.max_expires {
            bail!("registrar.min_expires: must not exceed registrar.max_expires");
        }
        if reg.default_expires < reg.min_expires || reg.default_expires > reg.max_expires {
            bail!("registrar.default_expires: must lie between min_expires and max_expires");
        }
        if reg.max_contacts == 0 {
            bail!("registrar.max_contacts: must be at least 1");
        }
        if reg.max_bindings == 0 {
            bail!("registrar.max_bindings: must be at least 1");
        }
        let server = &raw.server;
        if !(1..=86_400).contains(&server.idle_timeout_s) {
            bail!("server.idle_timeout_s: between 1 and 86400 seconds");
        }
        if !(100..=600_000).contains(&server.message_timeout_ms) {
            bail!("server.message_timeout_ms: between 100 and 600000 ms");
        }
        if server.max_connections < workers {
            bail!("server.max_connections: at least one per worker ({workers})");
        }
        if server.max_connections_per_ip < workers {
            bail!("server.max_connections_per_ip: at least one per worker ({workers})");
        }
        let streams = StreamConfig {
            outbound: server.outbound_connections,
            idle_timeout_ms: server.idle_timeout_s * 1000,
            message_timeout_ms: server.message_timeout_ms,
            max_connections_per_worker: server.max_connections.div_ceil(workers),
            max_per_ip_per_worker: server.max_connections_per_ip.div_ceil(workers),
            websocket,
        };
        let t = raw.tls;
        if t.cert.is_some() != t.key.is_some() {
            bail!("tls.cert and tls.key: give both or neither");
        }
        let tls = TlsConfig {
            cert: t.cert,
            key: t.key,
            ca: t.ca,
            client_auth: t.client_auth,
            verify_server: t.verify_server,
            protocol: sipsec_transport::tls::Protocol {
                backend: t.backend,
                versions: t.versions,
                cipher_suites: t.cipher_suites,
                key_exchange: t.key_exchange,
                session_resumption: t.session_resumption,
                noop: sipsec_transport::ablation::server(),
            },
        };
        if let Some(l) = listen.iter().find(|l| l.transport.secure()) {
            if tls.cert.is_none() {
                bail!(
                    "tls.cert: a {} listener needs a certificate and key ([tls] cert, key)",
                    l.transport
                );
            }
        }
        Ok(Config {
            listen,
            domains,
            mode: raw.server.mode,
            stateful: raw.server.stateful,
            record_route: raw.server.record_route,
            workers,
            max_message_size: raw.server.max_message_size,
            max_batch_delay_us: raw.server.max_batch_delay_us,
            max_transactions: raw.server.max_transactions,
            max_breadth: raw.server.max_breadth,
            server_line: match raw.server.server_header.trim() {
                "" => String::new(),
                v => format!("Server: {v}\r\n"),
            },
            names: auth.server.clone(),
            host_addrs: Vec::new(),
            routing,
            metrics_listen,
            control_socket,
            database_url: url,
            registrar: RegistrarConfig {
                min_expires: reg.min_expires,
                max_expires: reg.max_expires,
                default_expires: reg.default_expires,
                max_contacts: reg.max_contacts,
                max_bindings: reg.max_bindings,
                max_bindings_per_source: reg.max_bindings_per_source,
                durable: reg.durable,
            },
            streams,
            tls,
            auth,
            overload,
            nat,
            flood,
            cluster,
            identity,
        })
    }
}

/// The text of the config file at `path`, which must be a regular file (or a link to one).
///
/// A FIFO, socket or device is refused, never read: a read from a FIFO with no writer would
/// block the thread that asked — the server's main thread, on SIGHUP — until someone writes.
/// The file is opened without blocking and checked once open, so a path swapped for a FIFO
/// between a check and the open cannot block either.
pub(crate) fn read_file(path: &Path) -> Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let cannot = || format!("cannot read config file {}", path.display());
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(cannot)?;
    let kind = file.metadata().with_context(cannot)?.file_type();
    if !kind.is_file() {
        bail!(
            "config file {} is not a regular file (a {}): give the path of a file",
            path.display(),
            file_kind(kind)
        );
    }
    let mut text = String::new();
    file.read_to_string(&mut text).with_context(cannot)?;
    Ok(text)
}

/// What a file that is not a regular file is, in words.
fn file_kind(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    match kind {
        k if k.is_dir() => "directory",
        k if k.is_fifo() => "FIFO",
        k if k.is_socket() => "socket",
        k if k.is_char_device() => "character device",
        k if k.is_block_device() => "block device",
        _ => "special file",
    }
}

/// The file path and the `?…` rest of a SQLite URL naming a file (not `:memory:`).
pub(crate) fn sqlite_file_path(url: &str) -> Option<(&str, &str)> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let (path, query) = rest.split_at(rest.find('?').unwrap_or(rest.len()));
    (!path.is_empty() && !path.starts_with(":memory:")).then_some((path, query))
}

/// A SQLite URL with a relative file path taken from `base` (the directory of the config
/// file that named it), so a command run from elsewhere opens the same database. Other URLs
/// come back unchanged.
pub(crate) fn resolve_relative(url: &str, base: &Path) -> String {
    let Some((path, query)) = sqlite_file_path(url).filter(|(p, _)| !p.starts_with('/')) else {
        return url.to_string();
    };
    let base = if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base
    };
    let base = base.canonicalize().unwrap_or_else(|_| base.to_path_buf());
    format!("sqlite://{}{query}", base.join(path).display())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        format!("{:#}", Config::from_toml(text).unwrap_err())
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = Config::default();
        assert_eq!(c.listen, vec![parse_listen("udp:127.0.0.1:5060").unwrap()]);
        assert_eq!(c.domains, vec!["localhost"]);
        assert_eq!(c.mode, Mode::Proxy);
        assert!(c.stateful && c.record_route);
        assert!(c.workers >= 1);
        assert_eq!(c.database_url, "sqlite://sipsec.db");
    }

    #[test]
    fn the_documented_example_parses() {
        let c = Config::from_toml(
            r#"
            [server]
            listen = ["udp:127.0.0.1:5060"]
            domains = ["example.test"]
            mode = "proxy"
            stateful = true
            record_route = true
            workers = 0
            [routing]
            default_route = "sip:127.0.0.1:5080;transport=udp"
            [database]
            url = "sqlite://sipsec.db"
            "#,
        )
        .unwrap();
        assert_eq!(
            c.routing.default_routes[0].next,
            Next::Addr(sipsec_transport::net::transport::Peer::udp(
                "127.0.0.1:5080".parse().unwrap()
            ))
        );
    }

    /// The configuration reference in README.md is a file the server accepts.
    #[test]
    fn the_readme_reference_parses() {
        let readme = include_str!("../../../../README.md");
        let start = readme
            .find("## Configuration reference")
            .and_then(|at| {
                readme[at..]
                    .find("```toml")
                    .map(|i| at + i + "```toml".len())
            })
            .expect("the reference block");
        let end = start + readme[start..].find("```").unwrap();
        let c = Config::from_toml(&readme[start..end]).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(c.routing.domain_routes.len(), 1);
        assert_eq!(c.routing.hosts["carrier.example.net"].len(), 2);
        // And every other server configuration README shows (the authority's has its own
        // test).
        let mut shown = 0;
        for block in readme.split("```toml\n").skip(1) {
            let text = &block[..block.find("```").expect("a closed block")];
            if !text.starts_with("[authd]") {
                Config::from_toml(text).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
                shown += 1;
            }
        }
        assert!(shown >= 2, "{shown}");
    }

    /// A `target` set alone brings the feedback margin with it (a fixed default above a low
    /// target refused the config, and a SIGHUP's reload); one set beyond it is refused.
    #[test]
    fn feedback_target_follows_target_unless_set() {
        let base = "[server]\nlisten = [\"udp:127.0.0.1:5060\"]\n[overload]\n";
        let c = Config::from_toml(&format!("{base}target = 0.5\n")).unwrap();
        assert!((c.overload.feedback_target - 0.49).abs() < 1e-9);
        let c = Config::from_toml(base).unwrap();
        assert!((c.overload.feedback_target - 0.98 * 0.95).abs() < 1e-9);
        let c = Config::from_toml(&format!("{base}target = 0.9\nfeedback_target = 0.8\n")).unwrap();
        assert!((c.overload.feedback_target - 0.8).abs() < 1e-9);
        let e = Config::from_toml(&format!("{base}target = 0.9\nfeedback_target = 0.95\n"));
        assert!(format!("{:#}", e.unwrap_err()).contains("feedback_target"));
    }

    #[test]
    fn a_reload_may_change_routes_but_not_what_was_bound_at_start() {
        let base = "[server]\nlisten = [\"udp:127.0.0.1:5060\"]\nworkers = 2\n";
        let running = Config::from_toml(base).unwrap();
        let changes = |extra: &str| {
            let new = Config::from_toml(&format!("{base}{extra}")).unwrap();
            running.restart_only_changes(&new)
        };
        assert!(changes("[routing]\ndefault_route = \"sip:gw.example\"\n").is_empty());
        assert!(changes("[registrar]\nmax_contacts = 2\n[overload]\ntarget = 0.97\n").is_empty());
        assert!(changes("[auth]\nmethods = [\"INVITE\"]\ntrusted = [\"10.0.0.0/8\"]\n").is_empty());
        assert!(changes("[flood]\nrate = 10\nmax_sources = 5\naction = \"403\"\n").is_empty());
        let new = Config::from_toml("[server]\nlisten = [\"udp:127.0.0.1:5070\"]\nworkers = 3\n")
            .unwrap();
        assert_eq!(
            running.restart_only_changes(&new),
            ["server.listen", "server.workers"]
        );
        assert_eq!(changes("[auth]\nrealm = \"other\"\n"), ["auth.realm"]);
        assert_eq!(
            changes("[database]\nurl = \"sqlite://x.db\"\n"),
            ["database.url"]
        );
        assert_eq!(
            changes("[metrics]\nlisten = \"127.0.0.1:9090\"\n"),
            ["metrics.listen"]
        );
        assert_eq!(
            changes("[control]\nsocket = \"sipsec.sock\"\n"),
            ["control.socket"]
        );
    }

    #[test]
    fn errors_name_the_key() {
        assert!(err("[server]\nlisten = [\"udp:1.2.3:5060\"]").contains("server.listen[0]"));
        assert!(err("[server]\nlisten = [\"sctp:1.2.3.4:5060\"]").contains("unknown transport"));
        assert!(
            err("[routing]\ndefault_route = \"sip:1.2.3.4;transport=tls\"")
                .contains("server.listen has no tls address")
        );
        assert!(
            err("[routing]\ndefault_route = \"sip:1.2.3.4;transport=sctp\"")
                .contains("unknown transport 'sctp'")
        );
        assert!(err("[server]\nmode = \"relay\"").contains("mode"));
        assert!(err("[server]\nlisten_typo = []").contains("listen_typo"));
        assert!(err("[routing]\ndefault_route = \"nonsense\"").contains("routing.default_route"));
        assert!(
            err("[routing]\ndefault_route = \"sip:a.example\"\ndefault_routes = [{ uri = \"sip:b.example\" }]")
                .contains("not both")
        );
        assert!(
            err("[routing]\ndefault_routes = [{ uri = \"sip:b.example\", weight = -1 }]")
                .contains("default_routes")
        );
        assert!(err("[routing.hosts]\n\"gw.example\" = [\"not-an-ip\"]")
            .contains("routing.hosts.\"gw.example\""));
        assert!(
            err("[routing.domain_routes]\n\"partner.example\" = \"sips:gw.partner.example\"")
                .contains("server.listen has no tls address")
        );
        assert!(err("[routing]\ndns_servers = [\"ns.example\"]").contains("routing.dns_servers"));
        assert!(err("[routing]\nfailover_timeout_ms = 50").contains("routing.failover_timeout_ms"));
        assert!(err("[database]\nurl = \"redis://x\"").contains("database.url"));
        assert!(err("[registrar]\nmin_expires = 100\nmax_expires = 50")
            .contains("registrar.min_expires"));
        assert!(err("[server]\nworkers = \"two\"").contains("workers"));
        assert!(err("[server]\nlisten = [\"tls:127.0.0.1:5061\"]").contains("tls.cert"));
        assert!(err("[tls]\ncert = \"c.pem\"").contains("tls.cert and tls.key"));
        assert!(
            err("[server]\noutbound_connections = \"sometimes\"").contains("outbound_connections")
        );
        assert!(err("[server]\nidle_timeout_s = 0").contains("server.idle_timeout_s"));
        assert!(err("[server]\nmessage_timeout_ms = 5").contains("server.message_timeout_ms"));
        assert!(err("[tls]\nclient_auth = \"always\"").contains("client_auth"));
        assert!(err("[tls]\nbackend = \"gnutls\"").contains("backend"));
    }

    #[test]
    fn flood_limits_are_on_by_default_and_validated() {
        let c = Config::default().flood;
        assert_eq!((c.limit, c.window_ms, c.ban_ms), (1_000, 1_000, 60_000));
        assert_eq!(c.action, FloodAction::Drop);
        assert_eq!(c.exempt.len(), 2, "loopback, IPv4 and IPv6");
        let c = Config::from_toml(
            "[flood]\nrate = 50\nwindow_ms = 2000\naction = \"503\"\nexempt = []\n\
             [auth]\ntrusted = [\"10.0.0.0/8\"]",
        )
        .unwrap()
        .flood;
        assert_eq!((c.limit, c.action), (100, FloodAction::Answer(503)));
        assert!(
            c.exempt[0].contains("10.1.2.3".parse().unwrap()),
            "trusted is exempt"
        );
        assert!(err("[flood]\naction = \"reject\"").contains("flood.action"));
        assert!(err("[flood]\nwindow_ms = 10").contains("flood.window_ms"));
        assert!(err("[flood]\nrate = 1\nwindow_ms = 500").contains("flood.rate"));
        assert!(err("[flood]\nban_s = 0").contains("flood.ban_s"));
        assert!(err("[flood]\nmax_sources = 0").contains("flood.max_sources"));
        assert!(err("[flood]\nexempt = [\"10.0.0.0/40\"]").contains("flood.exempt"));
        assert!(err("[flood]\nburst = 3").contains("burst"));
    }

    #[test]
    fn stream_settings_are_split_per_worker() {
        let c = Config::from_toml(
            "[server]\nworkers = 2\noutbound_connections = \"per-call\"\nmax_connections = 1001\n\
             max_connections_per_ip = 10\nidle_timeout_s = 30",
        )
        .unwrap();
        assert_eq!(c.streams.outbound, OutboundConnections::PerCall);
        assert_eq!(c.streams.max_connections_per_worker, 501);
        assert_eq!(c.streams.max_per_ip_per_worker, 5);
        assert_eq!(c.streams.idle_timeout_ms, 30_000);
        assert!(c.tls.protocol.session_resumption && c.tls.verify_server);
        assert_eq!(
            c.tls.protocol.backend,
            sipsec_transport::tls::Backend::Rustls
        );
        let c = Config::from_toml("[tls]\nbackend = \"openssl\"").unwrap();
        assert_eq!(
            c.tls.protocol.backend,
            sipsec_transport::tls::Backend::Openssl
        );
    }

    #[test]
    fn persistent_outbound_connections_are_the_default_and_reuse_is_still_read() {
        assert_eq!(
            Config::default().streams.outbound,
            OutboundConnections::Persistent
        );
        for name in ["persistent", "reuse"] {
            let c = Config::from_toml(&format!("[server]\noutbound_connections = \"{name}\""));
            assert_eq!(c.unwrap().streams.outbound, OutboundConnections::Persistent);
        }
    }
}
