//! The registration store: bindings written behind to a real database through sqlx, so the
//! call path never waits on it and a restart loses no registration.
//!
//! SQLite is the embedded default; PostgreSQL and MariaDB/MySQL work through the same code
//! (sqlx's `Any` driver) with a small dialect switch for placeholders. Writes run on one
//! thread of their own with a single-threaded tokio runtime: workers hand it
//! [`BindingChange`]s over a channel, and it commits whatever has queued up in one
//! transaction, so a burst of registrations costs one commit. In write-behind mode it also
//! lets changes gather for `GROUP_COMMIT` (10 ms) after the first (group commit). After each
//! commit it reports how far each worker's changes are committed, which durable registration
//! waits for (`engine::durable`). On shutdown the server flushes the queue before exiting.
//! If the database does not answer, the batch is kept and retried, the error is logged once
//! per outage, and registrations keep working from memory; if it answers but refuses one
//! change, that change alone is dropped and logged, so it cannot hold up the others. A
//! SQLite file deleted or replaced under the server is noticed before the next write and
//! opened anew.
//!
//! The schema is a list of migrations applied in order under a lock, so processes opening a
//! fresh database at once (`serve` and `authd`) neither fail nor apply one twice.

use crate::location::{Binding, BindingChange, SharedChange};
use anyhow::{Context, Result};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// SQL dialect differences that matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
    MySql,
}

impl Dialect {
    fn of(url: &str) -> Dialect {
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

/// The schema, change by change: a database is at version N once the first N are applied.
/// 1: registrations; 2: users (`userdb`); 3: Proxychain keys and revoked proxies.
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
];

/// The version a migrated database is at.
#[cfg(test)]
const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

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

/// A connected store.
pub struct Store {
    pool: AnyPool,
    dialect: Dialect,
    commits: Commits,
}

/// When a commit reaches the disk, on SQLite (PostgreSQL and MariaDB keep their servers'
/// settings: both sync each commit by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commits {
    /// At every commit (`synchronous=FULL`): a commit survives a power cut once it returns,
    /// which is what a durable 200 OK promises.
    Synced,
    /// At checkpoints (`synchronous=NORMAL` in WAL mode): a commit survives the process
    /// being killed at once, and a power cut or OS crash only after the next checkpoint. For
    /// write-behind, which answers before committing anyway: it saves an fsync per commit
    /// (about 5 µs of CPU per REGISTER at 2,000/s).
    Buffered,
}

/// What the server loads at start.
pub struct Loaded {
    pub bindings: Vec<(String, Binding)>,
    pub(crate) known_aors: Vec<String>,
}

/// A database URL fit for logs and messages: the password in its user information, and any
/// `password=` parameter, replaced by `***`.
pub(crate) fn redacted(url: &str) -> String {
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

/// Whether SQLite refused for a lock another connection holds (`SQLITE_BUSY`, code 5).
fn is_busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("5"))
}

impl Store {
    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
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
        };
        store
            .migrate()
            .await
            .context("cannot create or migrate the database schema")?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<()> {
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

    /// Loads live bindings, at most `max_bindings` (`[registrar] max_bindings`: those that
    /// live longest), and known AORs; expired rows are deleted on the way.
    pub async fn load(&self, now_unix_ms: u64, max_bindings: usize) -> Result<Loaded> {
        sqlx::query(
            &self
                .dialect
                .sql("DELETE FROM location_bindings WHERE expires_at <= ?"),
        )
        .bind(now_unix_ms as i64)
        .execute(&self.pool)
        .await?;
        let limit = max_bindings.min(i64::MAX as usize);
        let rows: Vec<AnyRow> = sqlx::query(&format!(
            "SELECT aor, contact, target, expires_at, q, call_id, cseq FROM location_bindings \
             ORDER BY expires_at DESC LIMIT {limit}"
        ))
        .fetch_all(&self.pool)
        .await?;
        let mut bindings = Vec::with_capacity(rows.len());
        for r in rows {
            let target: String = r.try_get(2)?;
            let Some(target) = sipsec_transport::net::transport::Peer::parse(&target) else {
                continue;
            };
            let q: Option<String> = r.try_get(4)?;
            bindings.push((
                r.try_get::<String, _>(0)?,
                Binding {
                    contact: r.try_get::<String, _>(1)?.into(),
                    target,
                    expires_at: r.try_get::<i64, _>(3)? as u64,
                    q: q.map(Into::into),
                    call_id: r.try_get::<String, _>(5)?.into(),
                    cseq: r.try_get::<i64, _>(6)? as u32,
                    source: None,
                },
            ));
        }
        let known_aors = sqlx::query("SELECT aor FROM location_aors")
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;
        Ok(Loaded {
            bindings,
            known_aors,
        })
    }

    /// Applies a batch in one transaction; if that fails while the database answers, applies
    /// its changes one by one, so a change the database refuses (a value its columns cannot
    /// hold) cannot hold up the others. Returns the refused changes with why, and fails only
    /// when the database does not answer (the batch is then to be retried whole).
    pub(crate) async fn write_isolating(
        &self,
        changes: &[SharedChange],
    ) -> Result<Vec<(SharedChange, String)>> {
        let Err(batch_error) = self.write(changes).await else {
            return Ok(Vec::new());
        };
        let mut refused = Vec::new();
        for change in changes {
            if let Err(e) = self.write(std::slice::from_ref(change)).await {
                if !self.answers().await {
                    return Err(batch_error);
                }
                refused.push((change.clone(), format!("{e:#}")));
            }
        }
        Ok(refused)
    }

    /// Whether the database answers a trivial query.
    async fn answers(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    /// Applies a batch of changes in one transaction: the batch's final state, in a few
    /// statements (see `Plan`), the bindings in multi-row upserts rather than three
    /// statements each. On SQLite the whole transaction goes to sqlx's SQLite thread as one
    /// query, one round trip (a wake-up of each thread) instead of one per statement; the
    /// other databases take the statements one by one inside a transaction.
    pub async fn write(&self, changes: &[SharedChange]) -> Result<()> {
        let statements = Plan::of(changes).statements(self.dialect);
        if self.dialect == Dialect::Sqlite {
            let mut sql = String::from("BEGIN;\n");
            for s in &statements {
                sql.push_str(&s.sql);
                sql.push_str(";\n");
            }
            sql.push_str("COMMIT");
            let mut query = sqlx::query(&sql);
            for s in &statements {
                for arg in &s.args {
                    query = arg.bind(query);
                }
            }
            let mut conn = self.pool.acquire().await?;
            if let Err(e) = query.execute(&mut *conn).await {
                // A statement failed part-way: the transaction it began is still open.
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                return Err(e.into());
            }
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for s in &statements {
            let mut query = sqlx::query(&s.sql);
            for arg in &s.args {
                query = arg.bind(query);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// One SQL statement of a write and the values for its placeholders, in order.
struct Statement<'c> {
    sql: String,
    args: Vec<Arg<'c>>,
}

/// A value bound to a placeholder.
enum Arg<'c> {
    Text(&'c str),
    Owned(String),
    MaybeText(Option<&'c str>),
    Int(i64),
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

impl<'c> Arg<'c> {
    fn bind<'q>(&'q self, query: AnyQuery<'q>) -> AnyQuery<'q> {
        match self {
            Arg::Text(t) => query.bind(*t),
            Arg::Owned(t) => query.bind(t.as_str()),
            Arg::MaybeText(t) => query.bind(*t),
            Arg::Int(n) => query.bind(*n),
        }
    }
}

/// Bindings per upsert statement: 7 values each stays far below every database's limit on
/// bound values (SQLite's is 32,766, PostgreSQL's and MySQL's 65,535).
const ROWS_PER_STATEMENT: usize = 500;

/// `(?, ?), (?, ?)`: `rows` rows of `columns` placeholders.
fn placeholders(rows: usize, columns: usize) -> String {
    let row = format!("({})", vec!["?"; columns].join(", "));
    vec![row; rows].join(", ")
}

/// What a batch leaves behind, as the statements to write it: a binding changed several
/// times in a batch is written once, as it ended, and nothing changed before a `RemoveAll`
/// of its AOR is written at all. Run in this order: remove-alls, removes, upserts.
#[derive(Debug, Default, PartialEq)]
struct Plan<'c> {
    remove_all: Vec<&'c str>,
    removes: Vec<(&'c str, &'c str)>,
    upserts: Vec<(&'c str, &'c Binding)>,
}

impl<'c> Plan<'c> {
    fn of(changes: &'c [SharedChange]) -> Plan<'c> {
        use std::collections::HashSet;
        let mut plan = Plan::default();
        // Newest first: the first change met for a binding is its final state.
        let mut cleared: HashSet<&str> = HashSet::new();
        let mut settled: HashSet<(&str, &str)> = HashSet::new();
        for change in changes.iter().rev() {
            match &**change {
                BindingChange::RemoveAll { aor } => {
                    if cleared.insert(aor) {
                        plan.remove_all.push(aor);
                    }
                }
                BindingChange::Upsert { aor, binding } => {
                    if !cleared.contains(&**aor) && settled.insert((aor, &binding.contact)) {
                        plan.upserts.push((aor, binding));
                    }
                }
                BindingChange::Remove { aor, contact } => {
                    if !cleared.contains(&**aor) && settled.insert((aor, contact)) {
                        plan.removes.push((aor, contact));
                    }
                }
            }
        }
        // Oldest first again, as the changes came.
        plan.remove_all.reverse();
        plan.removes.reverse();
        plan.upserts.reverse();
        plan
    }

    /// The statements that write the plan, in the order they must run.
    fn statements(&self, d: Dialect) -> Vec<Statement<'c>> {
        let mut out = Vec::new();
        for aor in &self.remove_all {
            out.push(Statement {
                sql: d.sql("DELETE FROM location_bindings WHERE aor = ?"),
                args: vec![Arg::Text(aor)],
            });
        }
        for (aor, contact) in &self.removes {
            out.push(Statement {
                sql: d.sql("DELETE FROM location_bindings WHERE aor = ? AND contact = ?"),
                args: vec![Arg::Text(aor), Arg::Text(contact)],
            });
        }
        let (insert, ignore_suffix) = match d {
            Dialect::MySql => ("INSERT IGNORE INTO", ""),
            Dialect::Sqlite => ("INSERT OR IGNORE INTO", ""),
            Dialect::Postgres => ("INSERT INTO", " ON CONFLICT DO NOTHING"),
        };
        let update = match d {
            Dialect::MySql => {
                " ON DUPLICATE KEY UPDATE target = VALUES(target), \
                 expires_at = VALUES(expires_at), q = VALUES(q), \
                 call_id = VALUES(call_id), cseq = VALUES(cseq)"
            }
            Dialect::Sqlite | Dialect::Postgres => {
                " ON CONFLICT (aor, contact) DO UPDATE SET target = excluded.target, \
                 expires_at = excluded.expires_at, q = excluded.q, \
                 call_id = excluded.call_id, cseq = excluded.cseq"
            }
        };
        for rows in self.upserts.chunks(ROWS_PER_STATEMENT) {
            let mut aors: Vec<&str> = rows.iter().map(|(aor, _)| *aor).collect();
            aors.sort_unstable();
            aors.dedup();
            out.push(Statement {
                sql: d.sql(&format!(
                    "{insert} location_aors (aor) VALUES {}{ignore_suffix}",
                    placeholders(aors.len(), 1)
                )),
                args: aors.into_iter().map(Arg::Text).collect(),
            });
            let mut args = Vec::with_capacity(rows.len() * 7);
            for (aor, binding) in rows {
                args.extend([
                    Arg::Text(aor),
                    Arg::Text(&binding.contact),
                    Arg::Owned(binding.target.to_string()),
                    Arg::Int(binding.expires_at as i64),
                    Arg::MaybeText(binding.q.as_deref()),
                    Arg::Text(&binding.call_id),
                    Arg::Int(i64::from(binding.cseq)),
                ]);
            }
            out.push(Statement {
                sql: d.sql(&format!(
                    "INSERT INTO location_bindings (aor, contact, target, expires_at, q, call_id, cseq) \
                     VALUES {}{update}",
                    placeholders(rows.len(), 7)
                )),
                args,
            });
        }
        out
    }
}

enum Command {
    /// A change from worker `from`.
    Change {
        from: usize,
        change: SharedChange,
    },
    Flush(oneshot::Sender<()>),
}

/// The workers' side of the write-behind queue.
#[derive(Clone)]
pub(crate) struct StoreHandle {
    tx: mpsc::UnboundedSender<Command>,
}

/// Called after each commit with a worker and how many of its changes are committed so far
/// (for durable registration).
pub(crate) type OnSaved = Box<dyn Fn(usize, u64) + Send>;

impl StoreHandle {
    /// Queues a change worker `from` made; each worker's changes are committed in the order
    /// sent.
    pub(crate) fn send(&self, from: usize, change: SharedChange) {
        let _ = self.tx.send(Command::Change { from, change });
    }

    /// Waits until everything queued so far is committed (or the writer gave up).
    pub(crate) fn flush_blocking(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Command::Flush(done)).is_ok() {
            let _ = wait.blocking_recv();
        }
    }
}

/// A SQLite database file and the inode it had when opened: SQLite goes on writing to a file
/// that was deleted (or replaced) under it, so every write would be lost without a word.
struct SqliteFile {
    url: String,
    path: std::path::PathBuf,
    inode: (u64, u64),
}

impl SqliteFile {
    fn of(url: &str) -> Option<SqliteFile> {
        use std::os::unix::fs::MetadataExt;
        let (path, _) = crate::config::sqlite_file_path(url)?;
        let meta = std::fs::metadata(path).ok()?;
        Some(SqliteFile {
            url: url.to_string(),
            path: path.into(),
            inode: (meta.dev(), meta.ino()),
        })
    }

    fn still_there(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.inode)
    }
}

/// The changes waiting to be written, and per worker how many of them it sent and how many
/// of its changes are committed so far.
#[derive(Default)]
struct Batch {
    changes: Vec<SharedChange>,
    from: Vec<u64>,
    committed: Vec<u64>,
}

impl Batch {
    fn push(&mut self, from: usize, change: SharedChange) {
        if self.from.len() <= from {
            self.from.resize(from + 1, 0);
            self.committed.resize(from + 1, 0);
        }
        self.from[from] += 1;
        self.changes.push(change);
    }

    /// The batch is committed: empties it and tells `on_saved` about each worker it held
    /// changes of.
    fn committed(&mut self, on_saved: Option<&OnSaved>) {
        self.changes.clear();
        for (worker, n) in self.from.iter_mut().enumerate() {
            if *n > 0 {
                self.committed[worker] += std::mem::take(n);
                if let Some(f) = on_saved {
                    f(worker, self.committed[worker]);
                }
            }
        }
    }
}

/// How long write-behind lets changes gather before a commit. Each commit costs the writer and
/// sqlx's SQLite thread wake-ups (about 13 µs of CPU each on the lab's VM) besides the disk; at
/// 2,000 REGISTERs/s this turns 2,000 commits a second into at most 100. Nothing waits for a
/// write-behind commit; a flush (shutdown) that comes first skips the wait, one that comes
/// during it waits it out.
const GROUP_COMMIT: Duration = Duration::from_millis(10);

/// How long durable registration lets changes gather before a commit: the REGISTERs of a few
/// milliseconds share one commit (one fsync, and a handful of wake-ups) instead of each paying
/// its own, for a few milliseconds more before their 200 OK. Measured at 2,000 REGISTERs/s
/// under SIPp on SQLite: server CPU per REGISTER 53 µs with 1 ms, 32 µs with 4 ms (write-behind:
/// about 20).
const DURABLE_GATHER: Duration = Duration::from_millis(4);

/// Starts the write-behind thread for a connected store (opened from `url`), on the given
/// runtime. `on_saved`, if given, hears after every commit how far each worker's changes
/// are committed.
pub(crate) fn spawn_writer(
    store: Store,
    url: &str,
    runtime: &tokio::runtime::Runtime,
    on_saved: Option<OnSaved>,
) -> StoreHandle {
    let (tx, mut rx) = mpsc::unbounded_channel::<Command>();
    let mut sqlite_file = SqliteFile::of(url);
    let mut store = store;
    runtime.spawn(async move {
        let mut pending = Batch::default();
        let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
        let mut failing = false;
        let queue = |cmd, pending: &mut Batch, waiters: &mut Vec<_>| match cmd {
            Command::Change { from, change } => pending.push(from, change),
            Command::Flush(w) => waiters.push(w),
        };
        // Write-behind under steady load: the writer wakes once per commit, on its timer,
        // instead of being woken by the first change too. Set while the last window brought
        // changes; cleared (and the writer blocks on the queue) when one brought none.
        let mut gathering = false;
        let durable = on_saved.is_some();
        let write_behind = |waiters: &Vec<_>| !durable && waiters.is_empty();
        loop {
            // Block only when nothing is left to retry and the last window was empty.
            if pending.changes.is_empty() && !(gathering && write_behind(&waiters)) {
                match rx.recv().await {
                    Some(cmd) => queue(cmd, &mut pending, &mut waiters),
                    None => break,
                }
            }
            // Group commit: with nobody waiting for the commit (write-behind, and no flush
            // asked for), let changes gather for a moment, so the registrations of a busy
            // second share transactions instead of paying one each.
            if write_behind(&waiters) && !failing {
                tokio::time::sleep(GROUP_COMMIT).await;
            } else if durable && !failing {
                tokio::time::sleep(DURABLE_GATHER).await;
            }
            while let Ok(cmd) = rx.try_recv() {
                queue(cmd, &mut pending, &mut waiters);
            }
            gathering = !pending.changes.is_empty();
            if let Some(file) = sqlite_file.as_ref().filter(|f| !f.still_there()) {
                tracing::error!(
                    "the database file {} was deleted or replaced: registrations are saved to \
                     a new file from now on (each earlier binding again at its next refresh)",
                    file.path.display()
                );
                match Store::connect_with(&file.url, store.commits).await {
                    Ok(fresh) => {
                        store = fresh;
                        sqlite_file = SqliteFile::of(&file.url);
                    }
                    Err(e) => tracing::error!("{e:#}"),
                }
            }
            if !pending.changes.is_empty() {
                match store.write_isolating(&pending.changes).await {
                    Ok(refused) => {
                        if std::mem::take(&mut failing) {
                            tracing::info!("database writes recovered");
                        }
                        for (change, why) in refused {
                            tracing::error!(
                                "the database refused a registration change, dropped ({}): {why}",
                                change.describe()
                            );
                        }
                        pending.committed(on_saved.as_ref());
                    }
                    Err(e) => {
                        if !std::mem::replace(&mut failing, true) {
                            tracing::error!("cannot write registrations to the database (kept in memory, retrying): {e:#}");
                        }
                        // A flush waits for at most one failed attempt: shutdown must not hang.
                        for w in waiters.drain(..) {
                            let _ = w.send(());
                        }
                        if rx.is_closed() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                }
            }
            for w in waiters.drain(..) {
                let _ = w.send(());
            }
        }
    });
    StoreHandle { tx }
}

#[cfg(test)]
mod tests {

    #[test]
    fn passwords_never_reach_a_log_line() {
        assert_eq!(
            redacted("postgres://sipsec:s3cret@db.example:5432/sip"),
            "postgres://sipsec:***@db.example:5432/sip"
        );
        assert_eq!(
            redacted("mysql://u:p@ss:w@host/db?password=again&ssl-mode=required"),
            "mysql://u:***@host/db?password=***&ssl-mode=required"
        );
        assert_eq!(redacted("postgres://host/db"), "postgres://host/db");
        assert_eq!(redacted("sqlite://sipsec.db"), "sqlite://sipsec.db");
    }

    #[test]
    fn relative_sqlite_paths_are_taken_from_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        assert_eq!(
            crate::config::resolve_relative("sqlite://sipsec.db", dir.path()),
            format!("sqlite://{}", base.join("sipsec.db").display())
        );
        assert_eq!(
            crate::config::resolve_relative("sqlite:data/x.db?mode=rwc", dir.path()),
            format!("sqlite://{}?mode=rwc", base.join("data/x.db").display())
        );
        for unchanged in [
            "sqlite:///var/lib/x.db",
            "sqlite::memory:",
            "postgres://h/db",
        ] {
            assert_eq!(
                crate::config::resolve_relative(unchanged, dir.path()),
                unchanged
            );
        }
    }
    use super::*;
    use std::sync::Arc;

    fn binding(contact: &str, expires_at: u64) -> Binding {
        Binding {
            contact: contact.into(),
            target: sipsec_transport::net::transport::Peer::udp("127.0.0.1:5070".parse().unwrap()),
            expires_at,
            q: Some("0.7".into()),
            call_id: "call".into(),
            cseq: 3,
            source: None,
        }
    }

    #[test]
    fn a_batch_is_written_as_it_ended() {
        let up = |aor: &str, contact: &str, exp| -> SharedChange {
            Arc::new(BindingChange::Upsert {
                aor: aor.into(),
                binding: binding(contact, exp),
            })
        };
        let remove = |aor: &str, contact: &str| -> SharedChange {
            Arc::new(BindingChange::Remove {
                aor: aor.into(),
                contact: contact.into(),
            })
        };
        let clear =
            |aor: &str| -> SharedChange { Arc::new(BindingChange::RemoveAll { aor: aor.into() }) };
        let changes = vec![
            up("a", "sip:1", 1),
            up("b", "sip:1", 1),
            up("a", "sip:1", 2), // a refresh: only this one is written
            remove("b", "sip:1"),
            up("c", "sip:1", 1),
            clear("c"),          // c's earlier upsert is not written
            up("c", "sip:2", 3), // but this later one is
            remove("d", "sip:9"),
        ];
        let plan = Plan::of(&changes);
        assert_eq!(plan.remove_all, vec!["c"]);
        assert_eq!(plan.removes, vec![("b", "sip:1"), ("d", "sip:9")]);
        let upserts: Vec<_> = plan
            .upserts
            .iter()
            .map(|(aor, b)| (*aor, &*b.contact, b.expires_at))
            .collect();
        assert_eq!(upserts, vec![("a", "sip:1", 2), ("c", "sip:2", 3)]);
        assert_eq!(placeholders(2, 3), "(?, ?, ?), (?, ?, ?)");
    }

    #[test]
    fn postgres_placeholders_are_numbered() {
        assert_eq!(
            Dialect::Postgres.sql("a = ? AND b = ?"),
            "a = $1 AND b = $2"
        );
        assert_eq!(Dialect::Sqlite.sql("a = ?"), "a = ?");
    }

    /// Opens a fresh database from several connections at once, as `serve` and `authd`
    /// started together do: each must find it migrated or migrate it, and every schema
    /// version must be recorded exactly once.
    async fn concurrent_first_opens(url: &str) {
        let opens: Vec<_> = (0..6)
            .map(|_| {
                let url = url.to_string();
                tokio::spawn(async move { Store::connect(&url).await })
            })
            .collect();
        let mut stores = Vec::new();
        for open in opens {
            stores.push(open.await.unwrap().unwrap_or_else(|e| panic!("{e:#}")));
        }
        let rows = sqlx::query("SELECT version FROM sipsec_schema ORDER BY version")
            .fetch_all(stores[0].pool())
            .await
            .unwrap();
        let versions: Vec<i64> = rows.iter().map(|r| r.try_get(0).unwrap()).collect();
        assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    }

    fn multi_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_fresh_sqlite_file_opened_at_once_from_several_places_is_migrated_once() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/fresh.db", dir.path().display());
        multi_thread().block_on(concurrent_first_opens(&url));
    }

    /// A namespace of its own in a network database: how to make it, reach it, remove it.
    struct Fresh {
        create: Vec<String>,
        url: String,
        drop: String,
    }

    /// Runs `test` on the URL of a fresh namespace of the database `var` names. Making one
    /// needs a right the test user may lack outside CI (`.ci/run` grants it): then the test
    /// is skipped, as it is without the variable.
    fn in_fresh<F: std::future::Future<Output = ()>>(
        var: &str,
        what: &str,
        fresh: impl FnOnce(&str, &str) -> Fresh,
        test: impl FnOnce(String) -> F,
    ) {
        let under_ci = std::env::var_os("CI").is_some();
        let Ok(base) = std::env::var(var) else {
            assert!(!under_ci, "{var} must name a database under CI");
            eprintln!("{var} not set: skipped");
            return;
        };
        let f = fresh(&base, &format!("sipsec_test_{what}_{}", std::process::id()));
        multi_thread().block_on(async {
            sqlx::any::install_default_drivers();
            let admin = AnyPool::connect(&base).await.unwrap();
            sqlx::query(&f.drop).execute(&admin).await.ok();
            for sql in &f.create {
                if let Err(e) = sqlx::query(sql).execute(&admin).await {
                    assert!(!under_ci, "{sql}: {e}");
                    eprintln!("{sql}: {e}: skipped");
                    return;
                }
            }
            test(f.url.clone()).await;
            sqlx::query(&f.drop).execute(&admin).await.unwrap();
        });
    }

    fn postgres_schema(base: &str, name: &str) -> Fresh {
        let sep = if base.contains('?') { '&' } else { '?' };
        Fresh {
            create: vec![format!("CREATE SCHEMA {name}")],
            url: format!("{base}{sep}options=-c%20search_path%3D{name}"),
            drop: format!("DROP SCHEMA IF EXISTS {name} CASCADE"),
        }
    }

    fn mariadb_database(base: &str, name: &str) -> Fresh {
        let (server, _) = base.rsplit_once('/').expect("a URL ending in /database");
        Fresh {
            create: vec![format!("CREATE DATABASE {name}")],
            url: format!("{server}/{name}"),
            drop: format!("DROP DATABASE IF EXISTS {name}"),
        }
    }

    #[test]
    #[cfg_attr(sipsec_skip_postgres, ignore = "SIPSEC_TEST_POSTGRES is not set")]
    fn a_fresh_postgres_schema_opened_at_once_from_several_places_is_migrated_once() {
        in_fresh(
            "SIPSEC_TEST_POSTGRES",
            "migrate",
            postgres_schema,
            |url| async move { concurrent_first_opens(&url).await },
        );
    }

    #[test]
    #[cfg_attr(sipsec_skip_mariadb, ignore = "SIPSEC_TEST_MARIADB is not set")]
    fn a_fresh_mariadb_database_opened_at_once_from_several_places_is_migrated_once() {
        in_fresh(
            "SIPSEC_TEST_MARIADB",
            "migrate",
            mariadb_database,
            |url| async move { concurrent_first_opens(&url).await },
        );
    }

    /// A batch with a change the database refuses (a Contact longer than its column, which
    /// the registrar would have refused at the door): the others are written, and the
    /// refused one is reported instead of blocking every later batch.
    async fn one_refused_change_does_not_block_the_batch(url: String) {
        let store = Store::connect(&url).await.unwrap();
        let long = format!("sip:a@{}.example", "x".repeat(600));
        let batch: Vec<SharedChange> = ["sip:a@1.2.3.4", &long, "sip:a@5.6.7.8"]
            .iter()
            .map(|c| {
                Arc::new(BindingChange::Upsert {
                    aor: "a@x".into(),
                    binding: binding(c, 10_000),
                })
            })
            .collect();
        let refused = store.write_isolating(&batch).await.unwrap();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].1.contains("too long"), "{}", refused[0].1);
        let loaded = store.load(0, usize::MAX).await.unwrap();
        let mut contacts: Vec<_> = loaded.bindings.iter().map(|(_, b)| &*b.contact).collect();
        contacts.sort();
        assert_eq!(contacts, ["sip:a@1.2.3.4", "sip:a@5.6.7.8"]);
        // A refresh of a stored binding updates it in place (the upsert's conflict path).
        store.write(&[refresh()]).await.unwrap();
        let mut loaded: Vec<_> = (store.load(0, usize::MAX).await.unwrap().bindings)
            .into_iter()
            .map(|(_, b)| (b.contact.to_string(), b.expires_at))
            .collect();
        loaded.sort();
        assert_eq!(
            loaded,
            [
                ("sip:a@1.2.3.4".to_string(), 20_000),
                ("sip:a@5.6.7.8".to_string(), 10_000)
            ]
        );
        // `[registrar] max_bindings` holds at start too: the bindings that live longest.
        let capped = store.load(0, 1).await.unwrap().bindings;
        assert_eq!(capped.len(), 1);
        assert_eq!(&*capped[0].1.contact, "sip:a@1.2.3.4");
    }

    /// a@x's binding at 1.2.3.4, refreshed to expire at 20,000.
    fn refresh() -> SharedChange {
        Arc::new(BindingChange::Upsert {
            aor: "a@x".into(),
            binding: binding("sip:a@1.2.3.4", 20_000),
        })
    }

    #[test]
    #[cfg_attr(sipsec_skip_postgres, ignore = "SIPSEC_TEST_POSTGRES is not set")]
    fn postgres_writes_around_a_refused_change() {
        in_fresh(
            "SIPSEC_TEST_POSTGRES",
            "isolate",
            postgres_schema,
            one_refused_change_does_not_block_the_batch,
        );
    }

    #[test]
    #[cfg_attr(sipsec_skip_mariadb, ignore = "SIPSEC_TEST_MARIADB is not set")]
    fn mariadb_writes_around_a_refused_change() {
        in_fresh(
            "SIPSEC_TEST_MARIADB",
            "isolate",
            mariadb_database,
            one_refused_change_does_not_block_the_batch,
        );
    }

    /// SQLite's write is one query holding the whole transaction: a statement refused
    /// part-way must leave no transaction open, or every write after it would fail.
    #[test]
    fn sqlite_writes_around_a_refused_change() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/loc.db", dir.path().display());
        multi_thread().block_on(async {
            let store = Store::connect(&url).await.unwrap();
            // SQLite holds text of any length; a trigger refuses long contacts as the other
            // databases' columns do.
            sqlx::query(
                "CREATE TRIGGER refuse_long BEFORE INSERT ON location_bindings \
                 WHEN length(NEW.contact) > 512 BEGIN SELECT RAISE(ABORT, 'contact too long'); END",
            )
            .execute(store.pool())
            .await
            .unwrap();
            drop(store);
            one_refused_change_does_not_block_the_batch(url).await;
        });
    }

    /// Durable registration's store syncs every SQLite commit; write-behind's syncs at
    /// checkpoints (SQLite reports FULL as 2, NORMAL as 1).
    #[test]
    fn sqlite_commits_are_synced_as_asked() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/loc.db", dir.path().display());
        multi_thread().block_on(async {
            for (commits, expected) in [(Commits::Synced, 2), (Commits::Buffered, 1)] {
                let store = Store::connect_with(&url, commits).await.unwrap();
                let (level,): (i64,) = sqlx::query_as("PRAGMA synchronous")
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
                assert_eq!(level, expected, "{commits:?}");
            }
        });
    }

    #[test]
    fn bindings_survive_reopening_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/loc.db", dir.path().display());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = Store::connect(&url).await.unwrap();
            let changes: Vec<SharedChange> = vec![
                Arc::new(BindingChange::Upsert {
                    aor: "a@x".into(),
                    binding: binding("sip:a@1.2.3.4", 10_000),
                }),
                Arc::new(BindingChange::Upsert {
                    aor: "a@x".into(),
                    binding: binding("sip:a@5.6.7.8", 10_000),
                }),
                Arc::new(BindingChange::Upsert {
                    aor: "b@x".into(),
                    binding: binding("sip:b@1.2.3.4", 500),
                }),
                Arc::new(BindingChange::Remove {
                    aor: "a@x".into(),
                    contact: "sip:a@5.6.7.8".into(),
                }),
            ];
            store.write(&changes).await.unwrap();
            store.write(&[refresh()]).await.unwrap();
            drop(store);
            let store = Store::connect(&url).await.unwrap();
            let loaded = store.load(1_000, usize::MAX).await.unwrap();
            assert_eq!(
                loaded.bindings,
                vec![("a@x".to_string(), binding("sip:a@1.2.3.4", 20_000))]
            );
            let mut known = loaded.known_aors;
            known.sort();
            assert_eq!(known, vec!["a@x", "b@x"], "expired b@x is still known");
        });
    }
}
