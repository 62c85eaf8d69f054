//! The databases, over SQLite, PostgreSQL or MariaDB: the location store (registrations,
//! written behind the engine), the user database (digest credentials and Proxychain keys)
//! and the authority's revoked proxies.
//!
//! - `store/`: the registration store, a folder: `connection` (the connection and its
//!   dialects), `schema` (the migrations), `bindings` (loading the bindings, a batch's plan
//!   and statements) and `writer` (the write-behind task).
//! - `users`: the user database.
//! - `proxies`: the revoked proxies.

pub mod proxies;
pub mod store;
pub mod users;
