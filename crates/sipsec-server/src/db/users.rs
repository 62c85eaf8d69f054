//! The user database: credentials as HA1 per realm and algorithm and the Proxychain key k_AD
//! (never passwords), in the same
//! database as registrations (SQLite embedded, PostgreSQL or MariaDB/MySQL by URL), and the
//! sync that keeps the server's credential cache in step with it.
//!
//! Every change (`sipsec users add | remove | import`) takes the next value of one revision
//! counter, inside its transaction, and stamps the rows it touches with it; removed users stay
//! as rows marked deleted. A server polls for rows with a revision above the last it saw, so a
//! change reaches every running server within a second, without a restart and without the
//! database on any call's path. Writers serialise on the counter row, so revisions become
//! visible in order and a poll never skips one.

use crate::auth::credentials::{CacheState, Credentials, Secrets};
use crate::db::store::{Dialect, Store};
use anyhow::{bail, Context, Result};
use sqlx::Row;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Rows per statement when importing.
const IMPORT_CHUNK: usize = 500;
/// Rows per page when loading.
const LOAD_PAGE: i64 = 20_000;

/// A user name we accept: SIP `user` characters that need no escaping, at most 128.
pub(crate) fn valid_username(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.!~*'()&=+$;?/".contains(&b))
}

impl Store {
    /// Takes the next revision inside `tx`.
    async fn next_revision(&self, tx: &mut sqlx::Transaction<'_, sqlx::Any>) -> Result<i64> {
        sqlx::query("UPDATE sipsec_user_revision SET revision = revision + 1 WHERE id = 1")
            .execute(&mut **tx)
            .await?;
        let r: i64 = sqlx::query("SELECT revision FROM sipsec_user_revision WHERE id = 1")
            .fetch_one(&mut **tx)
            .await?
            .try_get(0)?;
        Ok(r)
    }

    /// Adds or replaces users (one revision for all of them).
    pub(crate) async fn put_users(&self, realm: &str, users: &[(String, Secrets)]) -> Result<()> {
        let d = self.dialect();
        let mut tx = self.pool().begin().await?;
        let revision = self.next_revision(&mut tx).await?;
        for chunk in users.chunks(IMPORT_CHUNK) {
            let rows = vec!["(?, ?, ?, ?, ?, ?, ?, 0)"; chunk.len()].join(", ");
            let update = match d {
                Dialect::MySql => {
                    "ON DUPLICATE KEY UPDATE ha1_md5 = VALUES(ha1_md5), \
                     ha1_sha256 = VALUES(ha1_sha256), ha1_sha512_256 = VALUES(ha1_sha512_256), \
                     pc_key = VALUES(pc_key), revision = VALUES(revision), deleted = 0"
                }
                _ => {
                    "ON CONFLICT (realm, username) DO UPDATE SET ha1_md5 = excluded.ha1_md5, \
                     ha1_sha256 = excluded.ha1_sha256, ha1_sha512_256 = excluded.ha1_sha512_256, \
                     pc_key = excluded.pc_key, revision = excluded.revision, deleted = 0"
                }
            };
            let sql = d.sql(&format!(
                "INSERT INTO sipsec_users (realm, username, ha1_md5, ha1_sha256, ha1_sha512_256, \
                 pc_key, revision, deleted) VALUES {rows} {update}"
            ));
            let mut q = sqlx::query(&sql);
            for (name, h) in chunk {
                let [md5, sha256, sha512, pc_key] = h.to_hex();
                q = q
                    .bind(realm.to_string())
                    .bind(name.clone())
                    .bind(md5)
                    .bind(sha256)
                    .bind(sha512)
                    .bind(pc_key)
                    .bind(revision);
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Marks a user deleted; false when there was no such user.
    pub(crate) async fn remove_user(&self, realm: &str, username: &str) -> Result<bool> {
        let mut tx = self.pool().begin().await?;
        let revision = self.next_revision(&mut tx).await?;
        let done = sqlx::query(&self.dialect().sql(
            "UPDATE sipsec_users SET deleted = 1, revision = ? \
             WHERE realm = ? AND username = ? AND deleted = 0",
        ))
        .bind(revision)
        .bind(realm.to_string())
        .bind(username.to_string())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(done > 0)
    }

    /// The realm's users, by name.
    pub(crate) async fn list_users(&self, realm: &str) -> Result<Vec<String>> {
        let rows = sqlx::query(&self.dialect().sql(
            "SELECT username FROM sipsec_users WHERE realm = ? AND deleted = 0 ORDER BY username",
        ))
        .bind(realm.to_string())
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).map_err(Into::into))
            .collect()
    }

    /// Changes after `(revision, username)`, at most `LOAD_PAGE` of them in order: each user
    /// with its HA1s, or `None` when removed. Returns the position to continue from.
    ///
    /// Two plain range queries (the rest of the current revision, then later revisions)
    /// rather than one with `OR`: every database walks the `(realm, revision, username)` index
    /// for them, so the poll a server makes each second costs a seek, not a scan of every user.
    async fn user_changes(
        &self,
        realm: &str,
        after: (i64, String),
    ) -> Result<(Vec<(String, Option<Secrets>)>, (i64, String))> {
        const COLUMNS: &str =
            "username, ha1_md5, ha1_sha256, ha1_sha512_256, deleted, revision, pc_key";
        let same = sqlx::query(&self.dialect().sql(&format!(
            "SELECT {COLUMNS} FROM sipsec_users WHERE realm = ? AND revision = ? AND username > ? \
             ORDER BY username LIMIT {LOAD_PAGE}"
        )))
        .bind(realm.to_string())
        .bind(after.0)
        .bind(after.1.clone())
        .fetch_all(self.pool())
        .await?;
        let left = LOAD_PAGE - same.len() as i64;
        let later = if left > 0 {
            sqlx::query(&self.dialect().sql(&format!(
                "SELECT {COLUMNS} FROM sipsec_users WHERE realm = ? AND revision > ? \
                 ORDER BY revision, username LIMIT {left}"
            )))
            .bind(realm.to_string())
            .bind(after.0)
            .fetch_all(self.pool())
            .await?
        } else {
            Vec::new()
        };
        let mut out = Vec::with_capacity(same.len() + later.len());
        let mut last = after;
        for r in same.iter().chain(&later) {
            let name: String = r.try_get(0)?;
            let deleted: i64 = r.try_get(4)?;
            let ha1s = if deleted != 0 {
                None
            } else {
                let hex = |i: usize| r.try_get::<String, _>(i);
                let h = Secrets::from_hex(&hex(1)?, &hex(2)?, &hex(3)?, &hex(6)?);
                if h.is_none() {
                    tracing::warn!(
                        "user {name}: the stored secrets are not hex; the user is skipped"
                    );
                }
                h
            };
            last = (r.try_get(5)?, name.clone());
            out.push((name, ha1s));
        }
        Ok((out, last))
    }
}

impl Store {
    /// One user's secrets (`None`: no such user), for digest without the cache.
    pub(crate) async fn user_secrets(
        &self,
        realm: &str,
        username: &str,
    ) -> Result<Option<Secrets>> {
        let row = sqlx::query(&self.dialect().sql(
            "SELECT ha1_md5, ha1_sha256, ha1_sha512_256, pc_key FROM sipsec_users \
             WHERE realm = ? AND username = ? AND deleted = 0",
        ))
        .bind(realm.to_string())
        .bind(username.to_string())
        .fetch_optional(self.pool())
        .await?;
        Ok(match row {
            Some(r) => {
                let hex = |i: usize| r.try_get::<String, _>(i);
                Secrets::from_hex(&hex(0)?, &hex(1)?, &hex(2)?, &hex(3)?)
            }
            None => None,
        })
    }

    /// Every user of `realm` with a Proxychain key (for backup credentials).
    pub(crate) async fn user_keys(&self, realm: &str) -> Result<Vec<(String, [u8; 32])>> {
        let mut out = Vec::new();
        let mut position = (0i64, String::new());
        loop {
            let (changes, next) = self.user_changes(realm, position).await?;
            let n = changes.len();
            out.extend(
                changes
                    .into_iter()
                    .filter_map(|(name, s)| Some((name, s?.pc_key?))),
            );
            position = next;
            if n < LOAD_PAGE as usize {
                break;
            }
        }
        // One row per user: a walk by revision meets each once.
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// `sipsec users` CSV import: `username,password` lines (a header line is skipped); HA1s are
/// computed on every core. Returns how many users were stored.
pub(crate) async fn import_csv(store: &Store, realm: &str, path: &Path) -> Result<usize> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut users = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || (i == 0 && line.eq_ignore_ascii_case("username,password")) {
            continue;
        }
        let Some((name, password)) = line.split_once(',') else {
            bail!("{}:{}: expected username,password", path.display(), i + 1);
        };
        if !valid_username(name) {
            bail!(
                "{}:{}: {name:?} is not a valid user name",
                path.display(),
                i + 1
            );
        }
        users.push((name.to_string(), password.to_string()));
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = users.len().div_ceil(threads).max(1);
    let hashed: Vec<(String, Secrets)> = std::thread::scope(|s| {
        let jobs: Vec<_> = users
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|(n, p)| (n.clone(), Secrets::from_password(n, realm, p)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        jobs.into_iter()
            .flat_map(|j| j.join().expect("hashing does not panic"))
            .collect()
    });
    store.put_users(realm, &hashed).await?;
    Ok(hashed.len())
}

/// Waits, up to `limit`, for the first load of the user database into `credentials`, so a
/// server or authority does not start answering with users it has not read yet; warns if it
/// is still loading then (authentication answers 503 until it is done).
pub(crate) async fn wait_loaded(credentials: &Credentials, limit: Duration) {
    let waiting = std::time::Instant::now();
    while credentials.state() == CacheState::Loading && waiting.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if credentials.state() == CacheState::Loading {
        tracing::warn!(
            "the user database has not loaded yet: authentication answers 503 until it does"
        );
    }
}

/// Keeps `credentials` in step with the database at `url`: loads every user, then polls for
/// changes every `period`. When the database fails, the cache is marked in outage (known
/// users keep authenticating; others are answered 503), the failure is logged once per
/// minute, and the sync resumes by itself when the database answers again.
pub async fn sync(url: String, credentials: Arc<Credentials>, period: Duration) {
    sync_notifying(url, credentials, period, None).await;
}

/// [`sync`], and once the first load is complete, the name of every user changed since is
/// sent to `changed` (the authority revokes the chains issued for them).
pub(crate) async fn sync_notifying(
    url: String,
    credentials: Arc<Credentials>,
    period: Duration,
    changed: Option<tokio::sync::mpsc::UnboundedSender<String>>,
) {
    let realm = credentials.realm().to_string();
    let mut store: Option<Store> = None;
    let mut position = (0i64, String::new());
    let mut last_logged: Option<std::time::Instant> = None;
    loop {
        let result = async {
            if store.is_none() {
                store = Some(Store::connect(&url).await?);
            }
            let db = store.as_ref().expect("just connected");
            loop {
                let (changes, next) = db.user_changes(&realm, position.clone()).await?;
                let n = changes.len();
                if let (Some(tx), CacheState::Current | CacheState::Outage) =
                    (&changed, credentials.state())
                {
                    for (name, _) in &changes {
                        let _ = tx.send(name.clone());
                    }
                }
                credentials.apply(changes);
                position = next;
                if n < LOAD_PAGE as usize {
                    break;
                }
            }
            anyhow::Ok(())
        }
        .await;
        match result {
            Ok(()) => {
                if credentials.state() != CacheState::Current {
                    tracing::info!(
                        "user database: {} users of realm {realm} loaded",
                        credentials.len()
                    );
                    last_logged = None;
                }
                credentials.set_state(CacheState::Current);
            }
            Err(e) => {
                if credentials.state() == CacheState::Current {
                    credentials.set_state(CacheState::Outage);
                }
                if last_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    tracing::error!(
                        "user database unavailable ({e:#}): requests that need it are answered \
                         503 until it returns"
                    );
                    last_logged = Some(std::time::Instant::now());
                }
                // A broken connection is made anew next time.
                store = None;
            }
        }
        tokio::time::sleep(period).await;
    }
}
