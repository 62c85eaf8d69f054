//! `sipsec load`'s options: what a run is asked to do, before [`super::Plan`] checks it and
//! works out the rest — parsed from the command line, or built as a value by a caller (the
//! bench) from [`LoadArgs::default`], whose defaults are the command line's own.

use anyhow::{Context, Result};
use clap::ValueEnum;
use sipsec_transport::net::transport::Transport;
use sipsec_transport::tls;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// What each operation of a run is (`--scenario`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScenarioArg {
    /// INVITE, 180, 200, ACK, (hold), BYE, 200.
    Call,
    /// REGISTER, 200.
    Register,
    /// INVITE answered 302; stopped there or followed (--redirect follow).
    Redirect,
    /// OPTIONS, 200.
    Options,
}

/// Which side of the operations a run plays (`--role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// The caller: sends requests to the target.
    Uac,
    /// The callee: answers at --uas.
    Uas,
    /// Caller and callee in one process.
    Both,
}

/// How the caller uses TCP and TLS connections (`--connection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConnectionArg {
    /// One connection per target, reused by every call (the seeds' "persistent").
    Persistent,
    /// A new connection for each call, closed when it ends.
    PerCall,
}

/// A switch given as `on` or `off` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

impl OnOff {
    /// Whether the switch is `on`.
    pub fn is_on(self) -> bool {
        self == OnOff::On
    }
}

/// The options `A` has when none is given: the defaults its `#[arg]` attributes declare, so a
/// caller building options as a value starts from the command line's defaults, not a copy.
pub fn defaults<A: clap::Args + clap::FromArgMatches>() -> A {
    let command = A::augment_args(clap::Command::new("defaults"));
    let matches = command
        .try_get_matches_from(["defaults"])
        .expect("every option has a default or is optional");
    A::from_arg_matches(&matches).expect("the defaults parse")
}

/// What the caller does with a 3xx in the redirect scenario (`--redirect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedirectArg {
    /// Count the 3xx as the success.
    Stop,
    /// Call the first Contact of the 3xx.
    Follow,
}

/// `sipsec load` options: the typed plan of a run, before [`super::Plan`] checks it.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Where requests go: `[udp:|tcp:|tls:]ip:port` (a server, or a UAS directly). With `--role both`
    /// it defaults to the `--uas` address.
    pub target: Option<String>,
    /// What each operation is: a call, a registration, an INVITE a redirect server answers,
    /// or an OPTIONS.
    #[arg(long, value_enum, default_value = "call")]
    pub scenario: ScenarioArg,
    /// Which side this run plays: the caller (UAC) sending to the target, the callee (UAS)
    /// answering at --uas, or both in one process.
    #[arg(long, value_enum, default_value = "uac")]
    pub role: Role,
    /// Address the UAS listens on, `[udp:|tcp:|tls:]ip:port` (roles uas and both).
    #[arg(long)]
    pub uas: Option<String>,
    /// Default: the one the target or --uas names, else udp.
    #[arg(long, value_enum)]
    pub transport: Option<Transport>,
    /// Stream transports: one connection reused, or one per call.
    #[arg(long, value_enum, default_value = "persistent")]
    pub connection: ConnectionArg,
    /// TLS session resumption (tickets and session IDs) on the caller's connections.
    #[arg(long, value_enum, default_value = "on")]
    pub tls_resumption: OnOff,
    /// Our certificate and key (PEM): the client certificate the caller presents when a
    /// server asks for one, and the UAS's server certificate.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM) the peer's certificate must chain to: the server's, and the
    /// caller's when the UAS asks for client certificates.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Whether the UAS asks callers for a certificate (verified against --tls-ca).
    #[arg(long, value_enum, default_value = "none")]
    pub tls_client_auth: tls::ClientAuth,
    /// Accept any server certificate (a lab convenience; still checks handshake signatures).
    #[arg(long)]
    pub tls_no_verify: bool,
    /// Name to check the server's certificate against (default: the target's IP address).
    #[arg(long)]
    pub tls_server_name: Option<String>,
    /// Lab builds only (`--features lab-noop`): TLS stages done without cryptography, as the
    /// server under test does them (`kx,sign,aead`); seed 002's ablation. Never for real use;
    /// hidden from the help of production builds.
    #[arg(long, default_value = "", hide = !cfg!(feature = "lab-noop"))]
    pub lab_noop: String,
    /// TLS versions to offer: 1.2, 1.3 (repeatable; default both).
    #[arg(long = "tls-version", value_delimiter = ',')]
    pub tls_versions: Vec<String>,
    /// TLS library: rustls, or openssl (built with the `openssl` feature) for seed 000's
    /// TLS_RSA_WITH_AES_128_CBC_SHA.
    #[arg(long, value_enum, default_value = "rustls")]
    pub tls_backend: tls::Backend,
    /// Cipher suites to offer, by rustls name, or with OpenSSL also the IANA or OpenSSL name
    /// (repeatable; default the backend's set).
    #[arg(long = "tls-cipher-suite", value_delimiter = ',')]
    pub tls_cipher_suites: Vec<String>,
    /// Key-exchange groups to offer: X25519, secp256r1, secp384r1, X25519MLKEM768
    /// (repeatable; default rustls's set).
    #[arg(long = "tls-key-exchange", value_delimiter = ',')]
    pub tls_key_exchange: Vec<String>,
    /// Local IP for the UAC, and for the callee's flows with --register (default: the one the
    /// kernel routes to the target from).
    #[arg(long)]
    pub local: Option<IpAddr>,
    /// With --connection per-call: the caller's connections come from this many consecutive
    /// addresses, --local (or the one the kernel routes from) and those after it, call n from
    /// the (n mod N)-th, whose address its Via and Contact name. Each address has its own
    /// ~28,000 ephemeral ports, which a closed connection holds for TIME_WAIT's 60 s: one
    /// address carries ~470 connections a second for long, N carry N times that. On Linux,
    /// loopback answers for all of 127.0.0.0/8 without aliases.
    #[arg(long, default_value_t = 1)]
    pub source_addresses: u32,
    /// Operations started per second.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Stop starting after this many seconds (a run at one rate; --find-peak and --ramp time
    /// each rate with --step-s).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Stop starting after this many operations.
    #[arg(long)]
    pub calls: Option<u64>,
    /// The goodput curve: a run of --step-s seconds at --rate, then at --rate plus this, and
    /// so on up to --max-rate, each measured on its own (calls started in a step count for
    /// it; those still in flight are let finish before the next), reported as offered and
    /// goodput per second.
    #[arg(long, requires = "max_rate")]
    pub ramp: Option<f64>,
    /// Seconds per ramp step, and per trial of --find-peak.
    #[arg(long, default_value_t = 10.0)]
    pub step_s: f64,
    /// The highest rate --ramp raises to, and the ceiling of --find-peak's search.
    #[arg(long)]
    pub max_rate: Option<f64>,
    /// Search for the highest rate at which at least 99% of operations succeed within 500 ms
    /// (T1: no retransmission needed), starting at --rate; each trial lasts --step-s.
    #[arg(long)]
    pub find_peak: bool,
    /// Relative precision of the peak search.
    #[arg(long, default_value_t = 0.03)]
    pub peak_precision: f64,
    /// Seconds between two trials of the peak search, so the server works off what an
    /// overloaded trial left queued (and its retransmissions end) before the next begins.
    #[arg(long, default_value_t = 0.5)]
    pub peak_settle_s: f64,
    /// Milliseconds a call stays established before the UAC sends BYE.
    #[arg(long, default_value_t = 0)]
    pub hold_ms: u64,
    /// CSV of `username,password[,domain]`: From/To users and digest credentials.
    #[arg(long)]
    pub users: Option<PathBuf>,
    /// Host of Request-URIs, From and To (default: the target's address).
    #[arg(long)]
    pub domain: Option<String>,
    /// What INVITEs offer and 200s answer: plain RTP, or a WebRTC description a browser
    /// accepts (calls to and from browsers over `wss:`).
    #[arg(long, value_enum, default_value = "plain")]
    pub sdp: crate::ua::Sdp,
    /// Callee user when no --users file is given.
    #[arg(long, default_value = "service")]
    pub service: String,
    /// Caller user when no --users file is given.
    #[arg(long, default_value = "sipsec")]
    pub caller: String,
    /// STIR/SHAKEN: sign each INVITE with this ES256 key (PEM; `sipsec certs --shaken` makes
    /// one), an Identity header naming the caller's and callee's numbers (--caller and
    /// --service, or --users' names) with attestation A. Needs --x5u.
    #[arg(long, requires = "x5u")]
    pub identity_key: Option<PathBuf>,
    /// Where verifiers fetch the signing certificate (an https: URL), with --identity-key.
    #[arg(long, requires = "identity_key")]
    pub x5u: Option<String>,
    /// Expires of REGISTER.
    #[arg(long, default_value_t = 3600)]
    pub expires: u32,
    /// With --scenario redirect: what the caller does with the 3xx.
    #[arg(long, value_enum, default_value = "stop")]
    pub redirect: RedirectArg,
    /// host:port registered as Contact (default: the UAC's own address).
    #[arg(long)]
    pub register_contact: Option<String>,
    /// Add `;rport` (RFC 3581) to the UAC's Via, for a UAC behind NAT. Off by default: the
    /// UAC already receives at the address its Via names, SIPp's scenarios (the seeds' load)
    /// send no rport, and a server that honours it does more work per request (Kamailio 5.6
    /// about 10% more CPU per call), which would skew the cost measured.
    #[arg(long)]
    pub rport: bool,
    /// Speak SIP overload control as a client (RFC 7339 loss, RFC 7415 rate): announce `oc`
    /// in the Via and send the server only what its feedback allows; the rest fail here
    /// ("not sent: overload feedback") without reaching it.
    #[arg(long)]
    pub oc: bool,
    /// After a 503 with Retry-After, start nothing for that long (each such start fails
    /// "not sent: Retry-After"), as RFC 3261 §21.5.4 lets a client. Off: keep offering the
    /// load, as a flood would.
    #[arg(long)]
    pub honour_retry_after: bool,
    /// Digest: send credentials with each new request from the user's last challenge and the
    /// next nonce count, as phones do, instead of being challenged per request (SIPp's way).
    /// Proxychain: answer the next counter of the user's last verified chain with each new
    /// request, until the chain is spent (`docs/proxychain.md`, "Answering without a
    /// challenge").
    #[arg(long)]
    pub auth_reuse: bool,
    /// Proxychain (`docs/proxychain.md`): answer `PC` challenges, checking that each proves
    /// the network, with keys derived from the users' passwords in this realm (the realm
    /// `sipsec users` stored them under; default: the run's domain).
    #[arg(long)]
    pub proxychain: bool,
    /// The realm Proxychain keys are derived in (default: the run's domain).
    #[arg(long)]
    pub proxychain_realm: Option<String>,
    /// The callee (--role uas or both) registers each user of --users with the target (a registrar,
    /// or a proxy in front of one) over a flow of its own — a UDP socket, or a TCP/TLS
    /// connection — answering digest challenges, refreshing at half the granted time and
    /// unregistering at the end, and takes its calls on that flow. Over TCP and TLS it listens
    /// nowhere: its Contact is `USER@<random>.invalid`, reachable only over the connection
    /// (RFC 7118's way); over UDP it is the socket's address (--uas, else --local or the
    /// route's IP, port chosen by the kernel). A connection that closes is registered again
    /// over a new one. Calls are counted once the registrations are in.
    #[arg(long)]
    pub register: bool,
    /// With --register over UDP: the address (`host[:port]`) each Contact names instead of
    /// the socket's — a private one, as a phone behind a NAT writes — so the server reaches
    /// the callee only where its REGISTER came from (`[nat] mode = "auto"`).
    #[arg(long, requires = "register")]
    pub contact_addr: Option<String>,
    /// With --register: register as an RFC 5626 client — `+sip.instance` (one per user for
    /// the run), `reg-id`, `;ob`, `Supported: outbound, path` — and keep each flow alive
    /// (double-CRLF ping on TCP/TLS, STUN Binding request on UDP) at the 200 OK's Flow-Timer,
    /// else --keepalive-s, each at 80-100% of it; a flow whose connection closes, or whose
    /// keep-alive goes unanswered where the registrar confirmed outbound, is registered again
    /// over a new flow.
    #[arg(long, requires = "register")]
    pub outbound: bool,
    /// With --outbound: flows per user, each its own socket or connection (reg-id 1 to N).
    #[arg(long, default_value_t = 1, requires = "outbound")]
    pub flows: u32,
    /// With --outbound: seconds between keep-alives when the 200 OK has no Flow-Timer.
    #[arg(long, default_value_t = 25.0)]
    pub keepalive_s: f64,
    /// Write the summary as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
    /// Seconds to wait for operations still in flight after the last start.
    #[arg(long, default_value_t = 35.0)]
    pub drain_s: f64,
}

impl Default for LoadArgs {
    /// `sipsec load` with no options (see [`defaults`]).
    fn default() -> Self {
        defaults()
    }
}

/// `[udp:|tcp:|tls:|ws:|wss:]ip:port`; the transport when one is named.
pub(crate) fn parse_endpoint(s: &str) -> Result<(Option<Transport>, SocketAddr)> {
    let (transport, rest) = match s.split_once(':') {
        Some(("udp", r)) => (Some(Transport::Udp), r),
        Some(("tcp", r)) => (Some(Transport::Tcp), r),
        Some(("tls", r)) => (Some(Transport::Tls), r),
        Some(("ws", r)) => (Some(Transport::Ws), r),
        Some(("wss", r)) => (Some(Transport::Wss), r),
        _ => (None, s),
    };
    let addr = rest.parse::<SocketAddr>().with_context(|| {
        format!("{s:?} is not [udp|tcp|tls|ws|wss:]ip:port (IP literals only; no DNS)")
    })?;
    Ok((transport, addr))
}
