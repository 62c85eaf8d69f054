//! sipsec: a secure, high-performance SIP server.
//!
//! The server lives in [`server`]; the per-worker protocol engine (no I/O) in [`engine`]; the
//! I/O drivers in [`worker`] and [`udp`], with wake-up coalescing in [`coalesce`];
//! registrations in [`location`] and [`store`]; digest and Proxychain authentication in
//! [`auth`] with its user database in [`userdb`] (`sipsec users`: [`users_cmd`]), and
//! Proxychain's authority in [`authd`]; configuration in [`config`]. The load
//! generator is [`load`], the measurement harness [`bench`]. The protocol
//! itself (parser, transactions, timers) is the `sip-core` crate.

pub mod auth;
pub mod authd;
pub mod bench;
pub mod certs;
pub mod coalesce;
pub mod config;
pub mod engine;
pub mod load;
pub mod location;
pub mod net;
pub mod server;
pub mod signals;
pub mod store;
pub mod streams;
pub mod tls;
pub mod transport;
pub mod udp;
pub mod userdb;
pub mod users_cmd;
pub mod worker;
