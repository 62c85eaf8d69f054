//! Reloading the configuration without a restart (SIGHUP). The file is read and validated
//! again; a file that does not load, or that changes what only a restart can change
//! (`Config::restart_only_changes`), leaves the running configuration untouched and says why.
//! Otherwise every worker gets the new configuration with the TLS made from it — a rotated
//! certificate serves the next handshake, connections already up keep theirs — and DNS its
//! new name servers and hosts.

use super::dns::LookupHandle;
use super::mailbox::{Letter, MailboxSender};
use crate::config::Config;
use anyhow::{bail, Result};
use sipsec_transport::tls::{ClientTls, ServerTls};
use std::path::Path;
use std::sync::Arc;

/// What a worker is handed.
pub struct Reloaded {
    /// The new configuration.
    pub cfg: Arc<Config>,
    /// The server side made from its `[tls]`, when it has `tls:` listeners.
    pub tls_server: Option<ServerTls>,
    /// The client side made from its `[tls]`, for the TLS connections workers open; `None` without
    /// a CA (unless verification is off).
    pub tls_client: Option<ClientTls>,
}

impl std::fmt::Debug for Reloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloaded")
            .field("tls_server", &self.tls_server.is_some())
            .field("tls_client", &self.tls_client.is_some())
            .finish_non_exhaustive()
    }
}

/// The TLS of a configuration: the server side when there is a `tls:` or `wss:` listener, the client
/// side when connections we open can be verified (or verification is off).
pub fn tls(cfg: &Config) -> Result<(Option<ServerTls>, Option<ClientTls>)> {
    let server = match cfg.listen.iter().any(|l| l.transport.secure()) {
        true => Some(cfg.tls.server()?),
        false => None,
    };
    // Without a CA (or verification turned off) the server cannot open TLS connections; it
    // still accepts them. Connecting out over TLS then fails with a clear log line.
    let client = match cfg.tls.ca.is_some() || !cfg.tls.verify_server {
        true => Some(cfg.tls.client()?),
        false => None,
    };
    Ok((server, client))
}

/// Reads `path` again and, if it may be applied, hands it to the workers and DNS. Returns the
/// configuration now running.
pub fn reload(
    path: &Path,
    running: &Config,
    workers: &[MailboxSender],
    resolver: &LookupHandle,
) -> Result<Arc<Config>> {
    let mut new = Config::load(path)?;
    new.host_addrs = sipsec_transport::net::names::host_addresses();
    // Fitted to the open-file limit as at start, so an unchanged file compares equal.
    super::connections::fit_to_descriptors(&mut new, sipsec_transport::net::fd_limit());
    let refused = running.restart_only_changes(&new);
    if !refused.is_empty() {
        bail!("{} cannot change without a restart", refused.join(", "));
    }
    let (tls_server, tls_client) = tls(&new)?;
    let cfg = Arc::new(new);
    let reloaded = Arc::new(Reloaded {
        cfg: cfg.clone(),
        tls_server,
        tls_client,
    });
    // DNS first: a worker that drops its answers on the reload asks again under the new
    // name servers and hosts (the lookup task takes its mail in order).
    resolver.reconfigure(super::dns::settings(&cfg));
    for w in workers {
        w.send(Letter::Reload(reloaded.clone()));
    }
    Ok(cfg)
}
