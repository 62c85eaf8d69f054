//! `[websocket]`: who may open SIP over WebSocket (RFC 7118) to the `ws:` and `wss:`
//! listeners — the web pages (Origin) and the names (Host) a browser's upgrade may carry — and
//! how idle WebSocket connections are kept alive.

use anyhow::{bail, Result};
use serde::Deserialize;
use sipsec_transport::net::ws::Policy;
use std::sync::Arc;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawWebSocket {
    origins: Vec<String>,
    hosts: Vec<String>,
    ping_interval_s: u64,
}

impl Default for RawWebSocket {
    fn default() -> Self {
        RawWebSocket {
            origins: Vec::new(),
            hosts: Vec::new(),
            ping_interval_s: 30,
        }
    }
}

/// What WebSocket listeners accept and how their connections are kept (`[websocket]`).
#[derive(Debug, Clone)]
pub struct WebSocketConfig {
    /// The upgrade's checks, shared by every WebSocket connection: web pages allowed besides
    /// those from the host the browser connected to (`origins`), names a client may give in
    /// `Host` besides IP literals (`hosts`, and the server's `domains`), the message limit.
    pub policy: Arc<Policy>,
    /// An open WebSocket quiet this long is sent a Ping; one that has not answered (nor sent
    /// anything) by the next interval is closed. 0: no pings, `idle_timeout_s` applies.
    pub ping_interval_ms: u64,
}

impl RawWebSocket {
    pub(super) fn validate(
        self,
        domains: &[String],
        max_message: usize,
    ) -> Result<WebSocketConfig> {
        for o in &self.origins {
            let well_formed = o == "*"
                || o == "null"
                || o.split_once("://").is_some_and(|(scheme, authority)| {
                    !scheme.is_empty() && !authority.is_empty() && !authority.contains('/')
                });
            if !well_formed {
                bail!(
                    "websocket.origins: {o:?} is not an origin (scheme://host[:port], as a \
                     browser sends it, or \"*\")"
                );
            }
        }
        if self
            .hosts
            .iter()
            .any(|h| h.is_empty() || h.contains(['/', ' ']))
        {
            bail!("websocket.hosts: host names, without scheme or path");
        }
        if self.ping_interval_s > 3_600 {
            bail!("websocket.ping_interval_s: 0 (no pings) to 3600");
        }
        let mut hosts = self.hosts;
        hosts.extend(domains.iter().cloned());
        Ok(WebSocketConfig {
            policy: Arc::new(Policy {
                origins: self.origins,
                hosts,
                max_message,
            }),
            ping_interval_ms: self.ping_interval_s * 1000,
        })
    }
}
