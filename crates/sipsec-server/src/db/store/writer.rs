//! The writer: the write-behind task that commits the workers' binding changes on its own
//! runtime, a batch per commit (gathered for a few milliseconds), retries while the database
//! does not answer, reports how far each worker's changes are committed (durable
//! registration), and reopens a SQLite file deleted or replaced under it.

use super::Store;
use crate::location::SharedChange;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

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
pub struct StoreHandle {
    tx: mpsc::UnboundedSender<Command>,
}

/// Called after each commit with a worker and how many of its changes are committed so far
/// (for durable registration).
pub type OnSaved = Box<dyn Fn(usize, u64) + Send>;

impl StoreHandle {
    /// Queues a change worker `from` made; each worker's changes are committed in the order
    /// sent.
    pub fn send(&self, from: usize, change: SharedChange) {
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
pub fn spawn_writer(
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
