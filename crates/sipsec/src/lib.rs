//! sipsec: a secure, high-performance SIP server.
//!
//! The protocol itself (parser, transactions, timers, digest and hash-chain arithmetic) is the
//! `sip-core` crate, with no I/O. Modules here, lowest layer first; a module imports only from
//! the ones above it in this list:

pub mod auth;
pub mod authd;
pub mod bench;
pub mod cmd;
pub mod config;
pub mod db;
pub mod engine;
pub mod load;
pub mod net;
pub mod serve;
pub mod signals;
pub mod stats;
pub mod tls;
