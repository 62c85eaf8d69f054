//! The small subcommands that manage state or a running server: `sipsec users` (the user
//! database) and `sipsec ctl` (a running server, through its control socket).
//! (`sipsec certs` lives with TLS, in [`crate::tls::certs`].)

pub mod ctl;
pub mod users;
