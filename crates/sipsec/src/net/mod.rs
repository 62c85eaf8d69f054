//! I/O building blocks shared by the server's workers and the load generator: epoll, and one
//! TCP or TLS connection's buffers and framing.

pub mod conn;
pub mod epoll;
