//! The small subcommands: `sipsec certs` (a test CA and certificates) and `sipsec users`
//! (the user database).

pub mod certs;
pub mod users;
