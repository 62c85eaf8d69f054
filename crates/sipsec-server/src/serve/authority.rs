//! The proxy's end of the authority channel: one TLS connection to `sipsec authd` (presenting
//! the proxy's certificate, verifying the authority's), requests pipelined on it, chains
//! installed in the shared cache as they arrive, and the workers told so they can run the
//! requests that waited. Revocations pushed by the authority drop the user's chains. When the
//! authority cannot be reached the cache is marked down (the authenticator then uses backup
//! credentials) and the connection is retried every second.
//!
//! Every fetch gets an answer to its worker within the configured wait, whatever happens to
//! the connection, so no request waits forever.

use super::fetch::{Fetch, FetchHandle};
use super::mailbox::{credentials_ready, MailboxSender};
use crate::auth::proxychain::wire::{self, Reply, Request};
use crate::auth::proxychain::PcShared;
use anyhow::{bail, Context, Result};
use rustls::pki_types::ServerName;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Counters of the channel, for the lab.
#[derive(Default, Debug)]
pub struct ChannelStats {
    /// Requests sent to the authority.
    pub requests: std::sync::atomic::AtomicU64,
    pub(crate) bytes_out: std::sync::atomic::AtomicU64,
    pub(crate) bytes_in: std::sync::atomic::AtomicU64,
}

/// Starts the channel on `runtime`.
pub fn spawn(
    runtime: &tokio::runtime::Runtime,
    shared: Arc<PcShared>,
    tls: Arc<rustls::ClientConfig>,
    workers: Vec<MailboxSender>,
    stats: Arc<ChannelStats>,
) -> FetchHandle {
    let (handle, rx) = FetchHandle::new();
    runtime.spawn(run(shared, tls, workers, rx, stats));
    handle
}

async fn run(
    shared: Arc<PcShared>,
    tls: Arc<rustls::ClientConfig>,
    workers: Vec<MailboxSender>,
    mut fetches: mpsc::UnboundedReceiver<Fetch>,
    stats: Arc<ChannelStats>,
) {
    let mut last_error = String::new();
    let mut pending = HashMap::new();
    loop {
        let result = session(&shared, &tls, &workers, &mut fetches, &mut pending, &stats).await;
        // Whatever ended the connection, the requests waiting on it are answered now.
        fail_all(&shared, &workers, &mut pending);
        let e = match &result {
            Ok(()) => return, // every worker is gone: the server is stopping
            Err(e) => format!("{e:#}"),
        };
        if e != last_error {
            let authority = shared.cfg.authority;
            match result
                .as_ref()
                .err()
                .and_then(|e| e.downcast_ref::<Goodbye>())
            {
                Some(bye) => tracing::error!(
                    "authority {authority} closed the connection: {}; using backup credentials \
                     where there are some, 503 otherwise; trying again every second",
                    bye.0
                ),
                None => tracing::error!(
                    "authority {authority} unreachable ({e}): using backup credentials where \
                     there are some, 503 otherwise; retrying every second"
                ),
            }
            last_error = e;
        }
        // Fetches made while down are answered at once: the workers fall back.
        let until = Instant::now() + Duration::from_secs(1);
        while let Ok(Some(f)) = tokio::time::timeout_at(until, fetches.recv()).await {
            shared.end_fetch(&f.user);
            credentials_ready(&workers, &f.user);
        }
    }
}

/// The authority closed the connection on purpose, saying why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Goodbye(String);

/// One connection's life; returns Ok when the fetch channel closed.
async fn session(
    shared: &Arc<PcShared>,
    tls: &Arc<rustls::ClientConfig>,
    workers: &[MailboxSender],
    fetches: &mut mpsc::UnboundedReceiver<Fetch>,
    pending: &mut HashMap<u64, (String, Instant)>,
    stats: &ChannelStats,
) -> Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let cfg = &shared.cfg;
    let tcp = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::net::TcpStream::connect(cfg.authority),
    )
    .await
    .context("connect timed out")??;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(cfg.authority_name.clone())
        .context("authority server name")?
        .to_owned();
    // Bounded like the rest: an authority that accepted but never handshakes (its descriptors
    // run out under a flood) must not hold the channel forever.
    let stream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp),
    )
    .await
    .context("TLS handshake timed out")?
    .context("TLS")?;
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut inbox = Vec::with_capacity(16 * 1024);
    let mut chunk = vec![0u8; 16 * 1024];
    // The authority speaks first, naming us.
    let welcome = loop {
        if let Some(end) = inbox.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = inbox.drain(..=end).collect();
            break wire::parse::<Reply>(std::str::from_utf8(&line)?)?;
        }
        let n = tokio::time::timeout(Duration::from_secs(5), reader.read(&mut chunk))
            .await
            .context("no welcome from the authority")??;
        if n == 0 {
            bail!("the authority closed the connection (is this proxy's certificate known?)");
        }
        inbox.extend_from_slice(&chunk[..n]);
    };
    if let Reply::Goodbye { reason } = welcome {
        return Err(Goodbye(reason).into());
    }
    let Reply::Welcome { proxy } = welcome else {
        bail!("the authority did not start with a welcome");
    };
    shared.set_proxy(&proxy);
    shared.set_down(false);
    tracing::info!(authority = %cfg.authority, %proxy, "connected to the authority");
    let mut next_id = 0u64;
    let wait = Duration::from_millis(cfg.wait_ms);
    let mut out = String::new();
    let mut check = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            f = fetches.recv() => {
                let Some(f) = f else { return Ok(()) };
                out.clear();
                for f in std::iter::once(f).chain(std::iter::from_fn(|| fetches.try_recv().ok())) {
                    next_id += 1;
                    out.push_str(&wire::line(&Request::Issue {
                        id: next_id,
                        user: f.user.clone(),
                        length: Some(cfg.chain_length),
                        hash: Some(cfg.hash.token().to_string()),
                    }));
                    pending.insert(next_id, (f.user, Instant::now()));
                    stats.requests.fetch_add(1, Relaxed);
                }
                stats.bytes_out.fetch_add(out.len() as u64, Relaxed);
                writer.write_all(out.as_bytes()).await.context("write")?;
            }
            n = reader.read(&mut chunk) => {
                let n = n.context("read")?;
                if n == 0 {
                    bail!("the authority closed the connection");
                }
                stats.bytes_in.fetch_add(n as u64, Relaxed);
                inbox.extend_from_slice(&chunk[..n]);
                while let Some(end) = inbox.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = inbox.drain(..=end).collect();
                    let reply = match std::str::from_utf8(&line).map_err(anyhow::Error::from).and_then(wire::parse::<Reply>) {
                        Ok(r) => r,
                        Err(e) => return Err(e.context("bad message from the authority")),
                    };
                    if let Reply::Goodbye { reason } = reply {
                        return Err(Goodbye(reason).into());
                    }
                    on_reply(shared, workers, pending, reply);
                }
                if inbox.len() > wire::MAX_LINE {
                    bail!("line from the authority too long");
                }
            }
            _ = check.tick() => {
                // Requests the authority is slow to answer are given up on, so the requests
                // waiting for them are answered.
                let late: Vec<u64> = pending.iter().filter(|(_, (_, t))| t.elapsed() > wait).map(|(id, _)| *id).collect();
                for id in late {
                    if let Some((user, _)) = pending.remove(&id) {
                        tracing::warn!(%user, "the authority did not answer in {} ms", cfg.wait_ms);
                        shared.end_fetch(&user);
                        credentials_ready(workers, &user);
                    }
                }
            }
        }
    }
}

fn on_reply(
    shared: &PcShared,
    workers: &[MailboxSender],
    pending: &mut HashMap<u64, (String, Instant)>,
    reply: Reply,
) {
    match reply {
        Reply::Issued {
            id,
            user,
            credential,
        } => {
            pending.remove(&id);
            match credential.issued() {
                Ok(issued) => shared.cache.install(
                    &user,
                    issued.into(),
                    credential.expires_unix_s.unwrap_or(0),
                    wire::unix_s(),
                ),
                Err(e) => tracing::warn!(%user, "unusable credential from the authority: {e:#}"),
            }
            shared.end_fetch(&user);
            credentials_ready(workers, &user);
        }
        Reply::Unknown { id, user } => {
            pending.remove(&id);
            shared.set_unknown(&user, wire::unix_s());
            shared.end_fetch(&user);
            credentials_ready(workers, &user);
        }
        Reply::Unavailable { id, user } => {
            pending.remove(&id);
            shared.end_fetch(&user);
            credentials_ready(workers, &user);
        }
        Reply::Revoke { user } => {
            if shared.cache.remove(&user) {
                tracing::info!(%user, "chain revoked by the authority");
            }
        }
        Reply::Welcome { .. } | Reply::Goodbye { .. } => {}
    }
}

fn fail_all(
    shared: &PcShared,
    workers: &[MailboxSender],
    pending: &mut HashMap<u64, (String, Instant)>,
) {
    shared.set_down(true);
    for (_, (user, _)) in pending.drain() {
        shared.end_fetch(&user);
        credentials_ready(workers, &user);
    }
}
