//! The databases: the location store (registrations, written behind the engine) and the
//! user database (digest credentials), over SQLite, PostgreSQL or MariaDB.

pub mod store;
pub mod users;
