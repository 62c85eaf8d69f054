//! The sans-IO SIP protocol core of sipsec.
//!
//! Nothing here touches a socket, a clock or a thread: callers hand in bytes and the current
//! time, and get back parsed views, rewritten bytes, and actions to perform. That keeps every
//! protocol decision testable in simulated time, the way `quinn-proto` and `rustls` are built.
//!
//! - [`message`]: zero-copy, lazy RFC 3261 parsing, URIs, splice-based rewriting, framing.
//! - [`transaction`]: the four RFC 3261 §17 transaction state machines and their table.
//! - [`timer`]: the hierarchical timing wheel every timer lives on.
//! - [`digest`]: Digest challenges, credentials and responses (MD5, SHA-256, SHA-512/256).
//! - [`hex`]: the lower-case hex every hash and nonce is written in.
//! - [`proxychain`]: Proxychain's hash-chain credentials, challenges and responses.
//! - [`overload`]: overload control's Via parameters (RFC 7339 loss, RFC 7415 rate) and the
//!   client's throttle that honours them.

pub mod digest;
pub mod hex;
pub mod message;
pub mod overload;
pub mod proxychain;
pub mod timer;
pub mod transaction;
