//! The databases, over SQLite, PostgreSQL or MariaDB: the location store (registrations,
//! written behind the engine), the user database (digest credentials and Proxychain keys)
//! and the authority's revoked proxies.

pub mod proxies;
pub mod store;
pub mod users;
