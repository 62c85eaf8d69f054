//! The connection to the database and its dialects: which of SQLite, PostgreSQL or
//! MariaDB/MySQL a URL names, how each wants its placeholders, the pool (one connection on
//! SQLite, four elsewhere) and when SQLite's commits reach the disk, and the URL as logs may
//! show it. Connecting also brings the schema up to date (`schema`).

use anyhow::{Context, Result};
use sqlx::any::AnyPoolOptions;
use sqlx::AnyPool;
use std::time::Duration;

/// SQL dialect differences that matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
    MySql,
}

impl Dialect {
    pub(super) fn of(url: &str) -> Dialect {
        if url.starts_with("postgres") {
            Dialect::Postgres
        } else if url.starts_with("mysql") || url.starts_with("mariadb") {
            Dialect::MySql
        } else {
            Dialect::Sqlite
        }
    }

    /// Rewrites `?` placeholders for PostgreSQL.
    pub(crate) fn sql(self, text: &str) -> String {
        if self != Dialect::Postgres {
            return text.to_string();
        }
        let mut out = String::with_capacity(text.len() + 8);
        let mut n = 0;
        for c in text.chars() {
            if c == '?' {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            } else {
                out.push(c);
            }
        }
        out
    }
}

/// A connected store.
pub struct Store {
    pub(super) pool: AnyPool,
    pub(super) dialect: Dialect,
    pub(super) commits: Commits,
    /// In a cluster, this node's name: the bindings it writes are marked with it, each commit
    /// notifies the other nodes, and their bindings load as theirs.
    pub(super) node: Option<std::sync::Arc<str>>,
}

/// When a commit reaches the disk, on SQLite (PostgreSQL and MariaDB keep their servers'
/// settings: both sync each commit by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commits {
    /// At every commit (`synchronous=FULL`): a commit survives a power cut once it returns,
    /// which is what a durable 200 OK promises.
    Synced,
    /// At checkpoints (`synchronous=NORMAL` in WAL mode): a commit survives the process
    /// being killed at once, and a power cut or OS crash only after the next checkpoint. For
    /// write-behind, which answers before committing anyway: it saves an fsync per commit
    /// (about 5 µs of CPU per REGISTER at 2,000/s).
    Buffered,
}

/// A database URL fit for logs and messages: the password in its user information, and any
/// `password=` parameter, replaced by `***`.
pub fn redacted(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(scheme_end) = out.find("://") {
        let rest = scheme_end + 3;
        let authority_end = out[rest..].find(['/', '?']).map_or(out.len(), |i| rest + i);
        if let Some(at) = out[rest..authority_end].rfind('@') {
            if let Some(colon) = out[rest..rest + at].find(':') {
                out.replace_range(rest + colon + 1..rest + at, "***");
            }
        }
    }
    if let Some(q) = out.find('?') {
        let (head, query) = out.split_at(q + 1);
        let query: Vec<String> = query
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => kv.to_string(),
            })
            .collect();
        out = format!("{head}{}", query.join("&"));
    }
    out
}

fn normalise_url(url: &str) -> String {
    let url = url.replacen("mariadb://", "mysql://", 1);
    if url.starts_with("sqlite:") && !url.contains("mode=") && !url.contains(":memory:") {
        // Create the database file on first start.
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}mode=rwc")
    } else {
        url
    }
}

impl Store {
    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The store of cluster node `node`: the bindings it writes are marked with the name,
    /// each commit notifies the other nodes, and their bindings load as theirs.
    pub fn in_cluster(mut self, node: std::sync::Arc<str>) -> Store {
        self.node = Some(node);
        self
    }

    /// Closes every connection and waits for them to close. On SQLite the last one to
    /// close checkpoints the write-ahead log into the database file and removes it.
    pub async fn close(self) {
        self.pool.close().await;
    }

    /// Connects and creates or migrates the schema; commits synced to disk.
    pub async fn connect(url: &str) -> Result<Store> {
        Store::connect_with(url, Commits::Synced).await
    }

    /// Connects and creates or migrates the schema, with commits reaching the disk as asked.
    pub(crate) async fn connect_with(url: &str, commits: Commits) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let dialect = Dialect::of(url);
        let pool = AnyPoolOptions::new()
            .max_connections(if dialect == Dialect::Sqlite { 1 } else { 4 })
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if dialect == Dialect::Sqlite {
                        // Set per connection, so also on any the pool opens later.
                        let pragma = match commits {
                            Commits::Synced => "PRAGMA synchronous=FULL",
                            Commits::Buffered => "PRAGMA synchronous=NORMAL",
                        };
                        sqlx::query(pragma).execute(&mut *conn).await?;
                    }
                    Ok(())
                })
            })
            .acquire_timeout(Duration::from_secs(5))
            .connect(&normalise_url(url))
            .await
            .with_context(|| format!("cannot open database {}", redacted(url)))?;
        let store = Store {
            pool,
            dialect,
            commits,
            node: None,
        };
        store
            .migrate()
            .await
            .context("cannot create or migrate the database schema")?;
        Ok(store)
    }

    /// Whether the database answers a trivial query.
    pub(super) async fn answers(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }
}
