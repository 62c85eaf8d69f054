//! The schema: the list of migrations, and applying those a database lacks under a lock, so
//! processes opening a fresh database at once (`serve` and `authd`) neither fail nor apply
//! one twice. Each dialect locks its own way.

use super::{Dialect, Store};
use anyhow::Result;
use sqlx::Row;
use std::time::Duration;

/// The schema, change by change: a database is at version N once the first N are applied.
/// 1: registrations; 2: users (`userdb`); 3: Proxychain keys and revoked proxies; 4: where a
/// binding's REGISTER came from, its flow, outbound identity and Path; 5: the cluster (the
/// node holding a binding, the hop to it, heartbeats).
const MIGRATIONS: &[&[&str]] = &[
    &[
        "CREATE TABLE IF NOT EXISTS location_aors (aor VARCHAR(255) NOT NULL PRIMARY KEY)",
        "CREATE TABLE IF NOT EXISTS location_bindings (\
         aor VARCHAR(255) NOT NULL, contact VARCHAR(512) NOT NULL, \
         target VARCHAR(64) NOT NULL, expires_at BIGINT NOT NULL, q VARCHAR(16), \
         call_id VARCHAR(255) NOT NULL, cseq BIGINT NOT NULL, \
         PRIMARY KEY (aor, contact))",
    ],
    &[
        "CREATE TABLE IF NOT EXISTS sipsec_users (\
         realm VARCHAR(128) NOT NULL, username VARCHAR(128) NOT NULL, \
         ha1_md5 VARCHAR(32) NOT NULL, ha1_sha256 VARCHAR(64) NOT NULL, \
         ha1_sha512_256 VARCHAR(64) NOT NULL, revision BIGINT NOT NULL, \
         deleted BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (realm, username))",
        "CREATE INDEX sipsec_users_by_revision ON sipsec_users (realm, revision, username)",
        "CREATE TABLE IF NOT EXISTS sipsec_user_revision (\
         id BIGINT NOT NULL PRIMARY KEY, revision BIGINT NOT NULL)",
        "INSERT INTO sipsec_user_revision (id, revision) VALUES (1, 0)",
    ],
    &[
        // Proxychain: the key k_AD next to the HA1s (empty for users stored before: they
        // need their password set again), and the proxies the authority refuses.
        "ALTER TABLE sipsec_users ADD COLUMN pc_key VARCHAR(64) NOT NULL DEFAULT ''",
        "CREATE TABLE IF NOT EXISTS sipsec_revoked_proxies (\
         name VARCHAR(255) NOT NULL PRIMARY KEY, revoked_at BIGINT NOT NULL)",
    ],
    &[
        // NAT traversal and RFC 5626/3327 (issue 34): where the REGISTER came from, whether
        // the binding is reached over that flow, its outbound instance and reg-id, its Path.
        "ALTER TABLE location_bindings ADD COLUMN received VARCHAR(64)",
        "ALTER TABLE location_bindings ADD COLUMN flow BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE location_bindings ADD COLUMN instance VARCHAR(255)",
        "ALTER TABLE location_bindings ADD COLUMN reg_id BIGINT",
        "ALTER TABLE location_bindings ADD COLUMN path VARCHAR(1024)",
    ],
    &[
        // A cluster on PostgreSQL (issue 36): the node holding each binding, the hop the
        // other nodes route through to one only it reaches, and the nodes' heartbeats.
        "ALTER TABLE location_bindings ADD COLUMN node VARCHAR(64)",
        "ALTER TABLE location_bindings ADD COLUMN via VARCHAR(1024)",
        "CREATE TABLE IF NOT EXISTS sipsec_cluster_nodes (\
         node VARCHAR(64) NOT NULL PRIMARY KEY, address VARCHAR(128) NOT NULL, \
         started_at BIGINT NOT NULL, seen_at BIGINT NOT NULL)",
    ],
];

/// The version a migrated database is at.
#[cfg(test)]
pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// PostgreSQL's advisory lock key for migrations ("sipsec" in ASCII).
const MIGRATION_LOCK_ID: i64 = 0x7369_7073_6563;

/// Applies the migrations the database lacks, on a connection that holds the schema lock.
async fn migrate_locked(conn: &mut sqlx::AnyConnection, dialect: Dialect) -> Result<()> {
    sqlx::query("CREATE TABLE IF NOT EXISTS sipsec_schema (version BIGINT NOT NULL)")
        .execute(&mut *conn)
        .await?;
    let version: Option<i64> = sqlx::query("SELECT MAX(version) FROM sipsec_schema")
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
    let done = usize::try_from(version.unwrap_or(0)).unwrap_or(0);
    for (i, statements) in MIGRATIONS.iter().enumerate().skip(done) {
        for statement in *statements {
            sqlx::query(statement).execute(&mut *conn).await?;
        }
        sqlx::query(&dialect.sql("INSERT INTO sipsec_schema (version) VALUES (?)"))
            .bind(i as i64 + 1)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Whether SQLite refused for a lock another connection holds (`SQLITE_BUSY`, code 5).
fn is_busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("5"))
}

impl Store {
    /// Brings the schema up to date; `Store::connect_with` calls it.
    pub(super) async fn migrate(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        if self.dialect == Dialect::Sqlite {
            // Outside any transaction: SQLite cannot change the journal mode inside one.
            // The switch needs the file to itself and SQLite answers "database is locked"
            // at once, without its busy timeout, while another opener is using it: so
            // wait and retry here, as that timeout would (the mode sticks once set).
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                match sqlx::query("PRAGMA journal_mode=WAL")
                    .execute(&mut *conn)
                    .await
                {
                    Ok(_) => break,
                    Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        // `serve` and `authd` are often started together on a fresh database: whoever comes
        // first migrates it while the others wait, then they find it done. SQLite and
        // PostgreSQL change their schema inside a transaction (SQLite's IMMEDIATE one takes
        // the write lock at once; PostgreSQL takes an advisory lock in it); MariaDB commits
        // each DDL statement by itself, so a named lock keeps the others out instead.
        match self.dialect {
            Dialect::Sqlite | Dialect::Postgres => {
                let begin = if self.dialect == Dialect::Sqlite {
                    "BEGIN IMMEDIATE"
                } else {
                    "BEGIN"
                };
                let mut tx = sqlx::Connection::begin_with(&mut *conn, begin).await?;
                if self.dialect == Dialect::Postgres {
                    sqlx::query(&format!(
                        "SELECT pg_advisory_xact_lock({MIGRATION_LOCK_ID})"
                    ))
                    .execute(&mut *tx)
                    .await?;
                }
                migrate_locked(&mut tx, self.dialect).await?;
                tx.commit().await?;
            }
            Dialect::MySql => {
                let got: Option<i64> = sqlx::query("SELECT GET_LOCK('sipsec_schema', 60)")
                    .fetch_one(&mut *conn)
                    .await?
                    .try_get(0)?;
                if got != Some(1) {
                    anyhow::bail!("another process held the schema lock for 60 s");
                }
                let migrated = migrate_locked(&mut conn, self.dialect).await;
                let released = sqlx::query("SELECT RELEASE_LOCK('sipsec_schema')")
                    .execute(&mut *conn)
                    .await;
                migrated?;
                released?;
            }
        }
        Ok(())
    }
}
