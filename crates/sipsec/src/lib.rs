//! sipsec: a secure, high-performance SIP server, its Proxychain authority, its load generator
//! and its bench.
//!
//! The protocol itself (parser, transactions, timers, digest and hash-chain arithmetic) is the
//! `sip-core` crate, with no I/O. The modules here, lowest layer first; each imports only from
//! `sip-core` and the modules before it in this list:
//!
//! - [`ablation`]: seed 002's no-op stages (TLS key exchange, signatures, records; the
//!   digest hash), in `lab-noop` builds only, and the switch that selects them.
//! - [`tls`]: TLS for both backends (rustls, OpenSSL) — configurations, sessions, tickets,
//!   typed errors — and `sipsec certs`.
//! - [`net`]: sockets and connections: `Peer` and `Transport`, UDP batches, epoll, one
//!   stream's buffers and framing, the names a server answers to.
//! - [`dns`]: locating next hops by name (RFC 3263): queries, answers, the order to try
//!   them in, and the resolver that asks DNS.
//! - [`auth`]: the checks of a request's credentials, digest and Proxychain side by side.
//! - [`config`]: `sipsec.toml`, the configuration contract, validated at start.
//! - [`stats`]: a worker's counters, written by its engine and its I/O driver alike.
//! - [`metrics`]: the Prometheus endpoint (`/metrics`) both daemons serve.
//! - [`engine`]: the per-worker SIP engine, sans-IO: proxy, registrar and location service,
//!   redirect, the auth gate.
//! - [`db`]: the databases: registrations written behind the engine, users, revoked proxies.
//! - [`signals`]: SIGINT, SIGTERM and SIGUSR1 for the two daemons (`serve`, `authd`).
//! - [`serve`]: `sipsec serve`, the I/O driver: start-up, workers, mailboxes, connections,
//!   credential fetchers.
//! - [`authd`]: `sipsec authd`, Proxychain's authority.
//! - [`load`]: `sipsec load`, the load generator: a sans-IO user agent and its driver.
//! - [`cmd`]: the small subcommands that manage state or a running server: `sipsec users`,
//!   `sipsec ctl`; and `--check`, what `serve` or `authd` would run with.
//! - [`bench`](mod@bench): `sipsec bench`, a server and `load` run side by side and measured; the lab's
//!   delay relay.
//! - [`lab`]: `sipsec lab`, the seeds' experiments: suites run in rounds, results as JSON
//!   lines, the statistics that rank rows, the cost model and the HTML report.

pub mod ablation;
pub mod auth;
pub mod authd;
pub mod bench;
pub mod cmd;
pub mod config;
pub mod db;
pub mod dns;
pub mod engine;
pub mod lab;
pub mod load;
pub mod metrics;
pub mod net;
pub mod serve;
pub mod signals;
pub mod stats;
pub mod tls;
