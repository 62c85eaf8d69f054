//! sipsec's servers: `sipsec serve`, the SIP proxy, registrar and redirect server, and
//! `sipsec authd`, Proxychain's authority, beside it because the two share the configuration,
//! the databases, the credential checks, metrics and signal handling.
//!
//! The protocol itself (parser, transactions, timers, digest and hash-chain arithmetic) is
//! `sip-core`, with no I/O; sockets and TLS are `sipsec-transport`. The modules here, lowest first;
//! each imports only from those crates and the modules before it in this list:
//!
//! - `hash`: non-cryptographic mixing (SplitMix64's finalizer) to spread keys and timers.
//! - [`dns`]: locating next hops by name (RFC 3263): queries, answers, the order to try
//!   them in, and the resolver that asks DNS.
//! - [`auth`]: the checks of a request's credentials, digest and Proxychain side by side.
//! - [`config`]: `sipsec.toml`, the configuration contract, validated at start.
//! - [`stats`]: a worker's counters, written by its engine and its I/O driver alike.
//! - [`flood`]: per-source flood limits, the requests a worker refuses before parsing them.
//! - [`stun`]: STUN Binding requests on the UDP SIP ports, answered before the SIP parser.
//! - [`metrics`]: the Prometheus endpoint (`/metrics`) both daemons serve.
//! - [`location`]: the location service: a worker's replica of the registrar's bindings, and
//!   the changes the workers and the store exchange.
//! - [`engine`]: the per-worker SIP engine, sans-IO: proxy, registrar, redirect, the auth
//!   gate.
//! - [`db`]: the databases: registrations written behind the engine, users, revoked proxies.
//! - [`signals`]: SIGINT, SIGTERM and SIGUSR1 for the two daemons (`serve`, `authd`).
//! - [`serve`]: `sipsec serve`, the I/O driver: start-up, workers, mailboxes, connections,
//!   credential fetchers.
//! - [`authd`]: `sipsec authd`, Proxychain's authority.
//! - [`cmd`]: the small subcommands that manage state or a running server: `sipsec users`,
//!   `sipsec ctl`; and `--check`, what `serve` or `authd` would run with.

pub mod auth;
pub mod authd;
pub mod cmd;
pub mod config;
pub mod db;
pub mod dns;
pub mod engine;
pub mod flood;
mod hash;
pub mod location;
pub mod metrics;
pub mod serve;
pub mod signals;
pub mod stats;
pub mod stun;
