//! The small subcommands that only manage state: `sipsec users` (the user database).
//! (`sipsec certs` lives with TLS, in [`crate::tls::certs`].)

pub mod users;
