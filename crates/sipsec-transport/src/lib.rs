//! sipsec's sockets and TLS: everything that moves bytes, shared by the server
//! (`sipsec-server`) and the load generator (`sipsec-load`), so neither depends on the other.
//! The SIP protocol itself is `sip-core`'s; nothing here parses more of a message than its
//! framing on a stream needs.
//!
//! The modules, lowest first; each imports only from `sip-core` and the modules before it:
//!
//! - [`ablation`]: seed 002's no-op stages (TLS key exchange, signatures, records; the
//!   digest hash), in `lab-noop` builds only, and the switch that selects them.
//! - [`tls`]: TLS for both backends (rustls, OpenSSL): configurations, sessions, tickets,
//!   typed errors, and `sipsec certs`.
//! - [`net`]: sockets and connections: `Peer` and `Transport`, UDP batches, epoll, one
//!   stream's buffers and framing, the names a server answers to.

pub mod ablation;
pub mod net;
pub mod tls;
