//! The registration store: bindings written behind to a real database through sqlx, so the
//! call path never waits on it and a restart loses no registration.
//!
//! SQLite is the embedded default; PostgreSQL and MariaDB/MySQL work through the same code
//! (sqlx's `Any` driver) with a small dialect switch for placeholders. Writes run on one
//! thread of their own with a single-threaded tokio runtime: workers hand it
//! [`BindingChange`](crate::location::BindingChange)s over a channel, and it commits whatever
//! has queued up in one transaction, so a burst of registrations costs one commit. In
//! write-behind mode it also lets changes gather for `GROUP_COMMIT` (10 ms) after the first
//! (group commit). After each commit it reports how far each worker's changes are committed,
//! which durable registration waits for (`engine::durable`). On shutdown the server flushes
//! the queue before exiting. If the database does not answer, the batch is kept and retried,
//! the error is logged once per outage, and registrations keep working from memory; if it
//! answers but refuses one change, that change alone is dropped and logged, so it cannot hold
//! up the others. A SQLite file deleted or replaced under the server is noticed before the
//! next write and opened anew.
//!
//! The schema is a list of migrations applied in order under a lock, so processes opening a
//! fresh database at once (`serve` and `authd`) neither fail nor apply one twice.
//!
//! - `connection`: the connection and its dialects (SQLite, PostgreSQL, MariaDB/MySQL).
//! - `schema`: the migrations and the lock they are applied under.
//! - `bindings`: loading the bindings, and a batch's plan and statements.
//! - `writer`: the write-behind task and the workers' handle on it.
//! - [`notices`]: in a cluster, what each commit tells the other nodes; `nodes`: the
//!   cluster's heartbeats, and the sweep of expired bindings.

mod bindings;
mod connection;
mod nodes;
pub mod notices;
mod schema;
mod writer;

pub use bindings::Loaded;
pub(crate) use connection::Dialect;
pub use connection::{redacted, Commits, Store};
pub use nodes::NodeSeen;
pub use writer::{spawn_writer, OnSaved, StoreHandle};

#[cfg(test)]
mod tests;
