//! The small subcommands that manage state or a running server, or check what one would run
//! with: `sipsec users` (the user database), `sipsec ctl` (a running server, through its
//! control socket) and the `--check` of `sipsec serve` and `sipsec authd`.
//! (`sipsec certs` lives with TLS, in [`sipsec_transport::tls::certs`].)

pub mod check;
pub mod ctl;
pub mod users;
