//! `[cluster]`: several sipsec nodes sharing one location table through PostgreSQL. Its
//! presence turns clustering on; the node's name must be unique in the cluster.

use super::{parse_listen, Listen};
use anyhow::{bail, Result};
use serde::Deserialize;
use std::sync::Arc;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawCluster {
    node: Option<String>,
    advertise: Option<String>,
    heartbeat_ms: Option<u64>,
    dead_after_ms: Option<u64>,
}

/// How often a node writes its heartbeat, by default.
const HEARTBEAT_MS: u64 = 1_000;
/// How long without a heartbeat before the others hold a node dead, by default.
const DEAD_AFTER_MS: u64 = 3_000;

/// Clustering (`[cluster]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This node's name, unique in the cluster (`node`): what its bindings are marked with.
    pub node: Arc<str>,
    /// Where the other nodes reach this one (`advertise`, `transport:ip:port`; by default the
    /// first listen address): the hop they route through to a phone whose binding only this
    /// node can reach (a connection, a NAT's mapping).
    pub advertise: Listen,
    /// How often this node writes its heartbeat, ms.
    pub heartbeat_ms: u64,
    /// How long without a heartbeat before the other nodes hold this one dead, ms.
    pub dead_after_ms: u64,
}

/// Whether `name` may name a node: 1–64 letters, digits, `.`, `_` or `-`.
fn valid_node(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl RawCluster {
    /// `None` without a `[cluster]` table (or with an empty one).
    pub(super) fn validate(
        self,
        database_url: &str,
        listen: &[Listen],
    ) -> Result<Option<ClusterConfig>> {
        let any = self.node.is_some()
            || self.advertise.is_some()
            || self.heartbeat_ms.is_some()
            || self.dead_after_ms.is_some();
        if !any {
            return Ok(None);
        }
        let Some(node) = self.node else {
            bail!("cluster.node: a [cluster] needs this node's name, unique in the cluster");
        };
        if !valid_node(&node) {
            bail!("cluster.node: {node:?} is not 1-64 letters, digits, '.', '_' or '-'");
        }
        if !(database_url.starts_with("postgres:") || database_url.starts_with("postgresql:")) {
            bail!(
                "cluster: the nodes share their registrations through PostgreSQL, and \
                 database.url is not a postgres:// URL (SQLite and MariaDB serve one node: \
                 remove [cluster])"
            );
        }
        let advertise = match &self.advertise {
            Some(a) => parse_listen(a).map_err(|e| anyhow::anyhow!("cluster.advertise: {e}"))?,
            None => listen[0],
        };
        if advertise.addr.ip().is_unspecified() || advertise.addr.port() == 0 {
            bail!(
                "cluster.advertise: the other nodes cannot reach {advertise}; give this node's \
                 own address (transport:ip:port)"
            );
        }
        let heartbeat_ms = self.heartbeat_ms.unwrap_or(HEARTBEAT_MS);
        let dead_after_ms = self.dead_after_ms.unwrap_or(DEAD_AFTER_MS);
        if !(100..=60_000).contains(&heartbeat_ms) {
            bail!("cluster.heartbeat_ms: between 100 and 60000");
        }
        if dead_after_ms < 2 * heartbeat_ms || dead_after_ms > 600_000 {
            bail!("cluster.dead_after_ms: at least twice cluster.heartbeat_ms, at most 600000");
        }
        Ok(Some(ClusterConfig {
            node: node.into(),
            advertise,
            heartbeat_ms,
            dead_after_ms,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(node: Option<&str>, advertise: Option<&str>) -> RawCluster {
        RawCluster {
            node: node.map(Into::into),
            advertise: advertise.map(Into::into),
            ..RawCluster::default()
        }
    }

    const PG: &str = "postgres://u:p@127.0.0.1/db";

    #[test]
    fn a_cluster_needs_a_name_postgres_and_an_address_others_can_reach() {
        let listen = [parse_listen("udp:198.18.0.2:5060").unwrap()];
        let c = raw(Some("a"), None).validate(PG, &listen).unwrap().unwrap();
        assert_eq!((&*c.node, c.advertise), ("a", listen[0]));
        assert_eq!((c.heartbeat_ms, c.dead_after_ms), (1_000, 3_000));
        assert!(raw(None, None).validate(PG, &listen).unwrap().is_none());
        let err =
            |r: RawCluster, url: &str, l: &[Listen]| r.validate(url, l).unwrap_err().to_string();
        assert!(err(raw(None, Some("udp:1.2.3.4:5")), PG, &listen).contains("node's name"));
        assert!(err(raw(Some("a b"), None), PG, &listen).contains("is not 1-64"));
        assert!(err(raw(Some("a"), None), "sqlite://x.db", &listen).contains("PostgreSQL"));
        assert!(err(raw(Some("a"), None), "mysql://u@h/db", &listen).contains("SQLite and MariaDB"));
        let any = [parse_listen("udp:0.0.0.0:5060").unwrap()];
        assert!(err(raw(Some("a"), None), PG, &any).contains("cannot reach"));
        let c = raw(Some("a"), Some("tcp:198.18.0.2:5070"))
            .validate(PG, &any)
            .unwrap()
            .unwrap();
        assert_eq!(c.advertise.to_string(), "tcp:198.18.0.2:5070");
        let slow = RawCluster {
            heartbeat_ms: Some(2_000),
            ..raw(Some("a"), None)
        };
        assert!(err(slow, PG, &listen).contains("twice"));
    }
}
