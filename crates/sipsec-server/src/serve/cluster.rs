//! The cluster's side of a node (`[cluster]`): how it learns what the other nodes
//! registered, and keeps the cluster's bookkeeping.
//!
//! Every node writes its bindings to the shared PostgreSQL table, marked with its name, and
//! each commit notifies the others (`db::store::notices`). This task listens on that
//! channel (sqlx's `PgListener`, one connection) and hands every other node's changes to the
//! workers' mailboxes, which apply them to their replicas before their next message, so a
//! call does no query. PostgreSQL keeps no notice for a listener that is away, so on every
//! (re)connect the task first listens, then reads every other node's live bindings and has
//! the workers replace their view of them with that (`Mail::Resync`): a notice that arrives
//! meanwhile is applied after it, in order, and is idempotent.
//!
//! It also writes this node's heartbeat every `heartbeat_ms`, timed by the database's clock,
//! tells the workers (and the log) of the other nodes going silent for `dead_after_ms` and
//! coming back — a binding only a silent node reaches answers 430/480 at once — and — on the live
//! node whose name sorts first, so once per cluster rather than once per node — deletes the
//! bindings that expired from the table.
//!
//! While the database is away, the node keeps routing from its replicas and keeps its own
//! changes queued in the writer, which retries; the task retries its connection every half
//! second and resynchronises when it is back. A restart of PostgreSQL does not always reach
//! the listener's socket, so each heartbeat also asks whether the listener's session is
//! still there (`pg_stat_activity`).

use super::mailbox::MailboxSender;
use crate::config::ClusterConfig;
use crate::db::store::{notices, Commits, Store};
use crate::engine::Mail;
use crate::location::Binding;
use sqlx::postgres::PgListener;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often the node whose name sorts first sweeps expired bindings from the table.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// How long to wait before connecting again when the database does not answer.
const RETRY: Duration = Duration::from_millis(500);

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Refuses to start a node whose name another live node has: two nodes writing bindings
/// under one name would take each other's for their own. A node of that name that beat
/// within `dead_after_ms` from another address is another node; from this node's own
/// address it is this node, restarted.
pub(crate) async fn claim_name(store: &Store, cfg: &ClusterConfig) -> anyhow::Result<()> {
    let ours = cfg.advertise.to_string();
    for n in store.nodes().await? {
        if n.node == *cfg.node && n.address != ours && n.alive(cfg.dead_after_ms) {
            anyhow::bail!(
                "cluster.node: node {:?} at {} is alive (its heartbeat {} ms ago); every node \
                 needs a name of its own",
                n.node,
                n.address,
                n.silent_ms
            );
        }
    }
    store.heartbeat(&cfg.node, &ours).await
}

/// Starts the task on `runtime`.
pub(crate) fn spawn(
    runtime: &tokio::runtime::Runtime,
    cfg: ClusterConfig,
    url: String,
    workers: Vec<MailboxSender>,
) {
    runtime.spawn(run(cfg, url, workers));
}

/// Hands `changes` to every worker: all posted, the last one sent, so each worker wakes
/// once for a notice however many changes it carries.
fn deliver(workers: &[MailboxSender], mails: impl Fn() -> Vec<Mail>) {
    for w in workers {
        let mut mails = mails();
        let last = mails.pop();
        for m in mails {
            w.post(m);
        }
        if let Some(m) = last {
            w.send(m);
        }
    }
}

/// Applies one notice's payload: another node's changes go to the workers. This node's
/// own notices (a third of what a three-node cluster's listener hears) are known by their
/// first bytes, `own` (`notices::head`, with which every notice of this node begins), and
/// skipped unparsed.
fn on_notice(own: &str, payload: &str, workers: &[MailboxSender]) {
    if payload.starts_with(own) {
        return;
    }
    let Some(notice) = notices::parse(payload) else {
        tracing::warn!(
            "cluster: a notice on {} that is not one of ours ({} bytes), ignored",
            notices::CHANNEL,
            payload.len()
        );
        return;
    };
    let changes: Vec<Arc<crate::location::BindingChange>> =
        notice.changes.into_iter().map(Arc::new).collect();
    deliver(workers, || {
        changes.iter().map(|c| Mail::Binding(c.clone())).collect()
    });
}

/// Listens, then reads every other node's bindings for the workers (in that order: see the
/// module doc); `again` after a lost connection.
async fn connect(
    url: &str,
    store: &Store,
    workers: &[MailboxSender],
    again: bool,
) -> anyhow::Result<(PgListener, i32)> {
    let mut listener = PgListener::connect(url).await?;
    listener.listen(notices::CHANNEL).await?;
    let (session,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
        .fetch_one(&mut listener)
        .await?;
    let others: Vec<(Arc<str>, Binding)> = store
        .other_nodes_bindings(unix_ms())
        .await?
        .into_iter()
        .map(|(aor, b)| (aor.into(), b))
        .collect();
    if again {
        tracing::info!(
            "cluster: the database is back; resynchronised ({} of the other nodes' bindings \
             read)",
            others.len()
        );
    } else {
        tracing::info!(
            "cluster: listening for the other nodes' registrations; {} of theirs read",
            others.len()
        );
    }
    let others = Arc::new(others);
    deliver(workers, || vec![Mail::Resync(others.clone())]);
    Ok((listener, session))
}

/// The heartbeat, the other nodes' liveness, and the sweep when it falls to this node.
struct Bookkeeping {
    /// The other nodes, and whether each was last seen alive.
    alive: BTreeMap<String, bool>,
    last_sweep: Instant,
}

impl Bookkeeping {
    async fn tick(
        &mut self,
        cfg: &ClusterConfig,
        store: &Store,
        workers: &[MailboxSender],
    ) -> anyhow::Result<()> {
        store
            .heartbeat(&cfg.node, &cfg.advertise.to_string())
            .await?;
        let nodes = store.nodes().await?;
        let mut first_alive: Option<&str> = None;
        for n in &nodes {
            let alive = n.alive(cfg.dead_after_ms);
            if alive && first_alive.is_none_or(|f| n.node.as_str() < f) {
                first_alive = Some(&n.node);
            }
            if n.node == *cfg.node {
                continue;
            }
            let was = self.alive.insert(n.node.clone(), alive);
            if was != Some(alive) {
                let node: Arc<str> = n.node.as_str().into();
                deliver(workers, || {
                    vec![Mail::NodeState {
                        node: node.clone(),
                        alive,
                    }]
                });
            }
            match (was, alive) {
                (Some(true), false) => tracing::warn!(
                    "cluster: node {} at {} is silent ({:.1} s since its heartbeat)",
                    n.node,
                    n.address,
                    n.silent_ms as f64 / 1000.0
                ),
                (Some(false) | None, true) => {
                    tracing::info!("cluster: node {} at {} is up", n.node, n.address);
                }
                // A node silent since before this one started says nothing new.
                _ => {}
            }
        }
        if first_alive == Some(&*cfg.node) && self.last_sweep.elapsed() >= SWEEP_EVERY {
            self.last_sweep = Instant::now();
            let swept = store.delete_expired(unix_ms()).await?;
            if swept > 0 {
                tracing::debug!("cluster: {swept} expired bindings deleted from the table");
            }
        }
        Ok(())
    }
}

async fn run(cfg: ClusterConfig, url: String, workers: Vec<MailboxSender>) {
    let store = loop {
        match Store::connect_with(&url, Commits::Buffered).await {
            Ok(s) => break s.in_cluster(cfg.node.clone()),
            Err(e) => {
                tracing::error!("cluster: {e:#}; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    };
    let mut heartbeat = tokio::time::interval(Duration::from_millis(cfg.heartbeat_ms));
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut books = Bookkeeping {
        alive: BTreeMap::new(),
        last_sweep: Instant::now(),
    };
    let own = notices::head(&cfg.node);
    let mut listener: Option<PgListener> = None;
    // The listener's session on the server (`pg_backend_pid()`).
    let mut session = 0;
    // Whether the last attempt failed (errors are logged once per outage), and whether a
    // connection was ever made (so the next one resynchronises after a loss).
    let (mut failing, mut connected) = (false, false);
    loop {
        if listener.is_none() {
            match connect(&url, &store, &workers, connected).await {
                Ok((l, pid)) => {
                    failing = false;
                    connected = true;
                    listener = Some(l);
                    session = pid;
                }
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::error!(
                            "cluster: cannot listen for the other nodes' registrations \
                             (routing from memory meanwhile, retrying): {e:#}"
                        );
                    }
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
        }
        let Some(l) = listener.as_mut() else {
            continue;
        };
        tokio::select! {
            received = l.try_recv() => match received {
                Ok(Some(n)) => on_notice(&own, n.payload(), &workers),
                Ok(None) => {
                    tracing::warn!(
                        "cluster: lost the connection the other nodes' notices come on; \
                         resynchronising when it is back"
                    );
                    listener = None;
                }
                Err(e) => {
                    tracing::warn!("cluster: {e:#}; reconnecting");
                    listener = None;
                }
            },
            _ = heartbeat.tick() => {
                if let Err(e) = books.tick(&cfg, &store, &workers).await {
                    tracing::debug!("cluster: heartbeat: {e:#}");
                }
                // A restart of PostgreSQL can end the listener's session without its socket
                // saying so (measured: sqlx's listener waited on, notices lost): asked each
                // heartbeat, the server says whether the session is still there.
                if let Ok(false) = store.session_alive(session).await {
                    tracing::warn!(
                        "cluster: the session the other nodes' notices come on is gone \
                         (PostgreSQL restarted?); resynchronising"
                    );
                    listener = None;
                }
            }
        }
    }
}
