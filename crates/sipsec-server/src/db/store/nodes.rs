//! The cluster's nodes table: each node's heartbeat, timed by the database's clock so the
//! nodes' own clocks need not agree, and who is alive by it; and the sweep of expired
//! bindings one node does for the whole cluster.

use super::Store;
use anyhow::Result;
use sqlx::Row;

/// The database's clock, Unix milliseconds (PostgreSQL: the cluster needs it).
const NOW_MS: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";

/// A node as the table knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSeen {
    /// Its name.
    pub node: String,
    /// Where it is reached (its advertised address).
    pub address: String,
    /// Milliseconds since its last heartbeat, by the database's clock.
    pub silent_ms: i64,
}

impl NodeSeen {
    /// Whether its heartbeat is fresher than `dead_after_ms`.
    pub fn alive(&self, dead_after_ms: u64) -> bool {
        u64::try_from(self.silent_ms).map_or(true, |ms| ms <= dead_after_ms)
    }
}

impl Store {
    /// Writes this node's heartbeat: it is alive, at `address`.
    pub async fn heartbeat(&self, node: &str, address: &str) -> Result<()> {
        sqlx::query(&format!(
            "INSERT INTO sipsec_cluster_nodes (node, address, started_at, seen_at) \
             VALUES ($1, $2, {NOW_MS}, {NOW_MS}) ON CONFLICT (node) DO UPDATE \
             SET address = excluded.address, seen_at = excluded.seen_at"
        ))
        .bind(node)
        .bind(address)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every node that ever beat, with how long it has been silent.
    pub async fn nodes(&self) -> Result<Vec<NodeSeen>> {
        let rows = sqlx::query(&format!(
            "SELECT node, address, {NOW_MS} - seen_at FROM sipsec_cluster_nodes ORDER BY node"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(NodeSeen {
                    node: r.try_get(0)?,
                    address: r.try_get(1)?,
                    silent_ms: r.try_get(2)?,
                })
            })
            .collect()
    }

    /// Whether the server process of session `pid` (`pg_backend_pid()`) still runs: the
    /// listener's session, which a restart of PostgreSQL ends without always telling the
    /// listener's socket.
    pub async fn session_alive(&self, pid: i32) -> Result<bool> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok(n > 0)
    }

    /// Deletes the bindings that expired by `now_unix_ms`, whichever node wrote them; how
    /// many. Each node's replicas drop them by themselves as they expire: this keeps the
    /// table from growing with bindings nobody refreshed.
    pub async fn delete_expired(&self, now_unix_ms: u64) -> Result<u64> {
        let done = sqlx::query(
            &self
                .dialect
                .sql("DELETE FROM location_bindings WHERE expires_at <= ?"),
        )
        .bind(now_unix_ms as i64)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
