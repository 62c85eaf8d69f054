//! The authority's network side: a TLS listener that requires client certificates signed by
//! its CA and knows each proxy by its certificate's common name; one reader and one writer
//! task per proxy connection, so requests are answered as they arrive however many are in
//! flight; revocations pushed to the connections of the proxies concerned; revoked proxies
//! refused and cut off.
//!
//! Anyone may connect before the handshake says who they are, so what a connection that is
//! not yet a proxy can hold is bounded: `HANDSHAKE_TIMEOUT` to finish its handshake, at most
//! `MAX_HANDSHAKES_PER_IP` of them from one address and `MAX_HANDSHAKES` in all; an
//! accept that fails (out of descriptors) is logged and retried, never the end of the
//! authority.

use super::authority::Authority;
use crate::auth::proxychain::wire::{self, Reply, Request};
use anyhow::Result;
use sip_core::proxychain::HashKind;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};
use tokio_rustls::TlsAcceptor;

/// How long a connection has to finish its TLS handshake.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS handshakes in progress from one address, and in all, past which a new connection is
/// closed at once: a flood of connections that never handshake cannot hold the descriptors
/// the proxies need, and one flooding address cannot shut out the others.
pub(crate) const MAX_HANDSHAKES_PER_IP: usize = 32;
pub(crate) const MAX_HANDSHAKES: usize = 1024;

/// The handshakes in progress, by address.
#[derive(Default)]
struct Handshakes(Mutex<(usize, HashMap<IpAddr, usize>)>);

/// One handshake's place in [`Handshakes`], given back when dropped.
struct Handshaking {
    all: Arc<Handshakes>,
    ip: IpAddr,
}

impl Handshakes {
    fn enter(all: &Arc<Handshakes>, ip: IpAddr) -> Option<Handshaking> {
        let mut guard = all.0.lock().ok()?;
        let (total, by_ip) = &mut *guard;
        let from_ip = by_ip.entry(ip).or_default();
        if *total >= MAX_HANDSHAKES || *from_ip >= MAX_HANDSHAKES_PER_IP {
            return None;
        }
        *from_ip += 1;
        *total += 1;
        Some(Handshaking {
            all: all.clone(),
            ip,
        })
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        if let Ok(mut guard) = self.all.0.lock() {
            let (total, by_ip) = &mut *guard;
            *total -= 1;
            if let Some(n) = by_ip.get_mut(&self.ip) {
                *n -= 1;
                if *n == 0 {
                    by_ip.remove(&self.ip);
                }
            }
        }
    }
}

/// One open proxy connection.
struct Conn {
    n: u64,
    lines: mpsc::UnboundedSender<String>,
    /// Told when the proxy is revoked, so its reader stops at once.
    cut: Arc<Notify>,
}

/// Open proxy connections by proxy name, and the revoked proxies.
#[derive(Default)]
pub struct Registry {
    conns: Mutex<HashMap<Arc<str>, Vec<Conn>>>,
    revoked: Mutex<HashSet<String>>,
}

impl Registry {
    fn add(&self, proxy: &Arc<str>, conn: Conn) {
        if let Ok(mut c) = self.conns.lock() {
            c.entry(proxy.clone()).or_default().push(conn);
        }
    }

    fn remove(&self, proxy: &Arc<str>, n: u64) {
        if let Ok(mut c) = self.conns.lock() {
            if let Some(v) = c.get_mut(proxy) {
                v.retain(|conn| conn.n != n);
                if v.is_empty() {
                    c.remove(proxy);
                }
            }
        }
    }

    /// Sends a line to every connection of `proxy`; false when it has none.
    pub fn send(&self, proxy: &str, line: &str) -> bool {
        let Ok(c) = self.conns.lock() else {
            return false;
        };
        let Some(v) = c.get(proxy) else {
            return false;
        };
        for conn in v {
            let _ = conn.lines.send(line.to_string());
        }
        !v.is_empty()
    }

    /// Proxies with a connection open.
    pub fn connected(&self) -> usize {
        self.conns.lock().map_or(0, |c| c.len())
    }

    pub(crate) fn is_revoked(&self, proxy: &str) -> bool {
        self.revoked.lock().is_ok_and(|r| r.contains(proxy))
    }

    /// Replaces the revoked set; connections of newly revoked proxies are cut (their readers
    /// stop, and dropping their senders ends their writers, which shut the connection).
    pub(crate) fn set_revoked(&self, now: HashSet<String>) -> Vec<String> {
        let newly: Vec<String> = match self.revoked.lock() {
            Ok(r) => now.difference(&r).cloned().collect(),
            Err(_) => return Vec::new(),
        };
        if let Ok(mut c) = self.conns.lock() {
            for p in &newly {
                for conn in c.remove(p.as_str()).unwrap_or_default() {
                    // Said before the cut, so the proxy logs what happened, not an outage.
                    let _ = conn.lines.send(wire::line(&Reply::Goodbye {
                        reason: REVOKED.into(),
                    }));
                    conn.cut.notify_one();
                }
            }
        }
        if let Ok(mut r) = self.revoked.lock() {
            *r = now;
        }
        newly
    }
}

/// Why the authority closes a revoked proxy's connection.
const REVOKED: &str = "this proxy is revoked (sipsec authd revoke-proxy)";

/// The common name of the peer's certificate: the proxy's identifier P.
fn peer_name(conn: &rustls::ServerConnection) -> Option<String> {
    let cert = conn.peer_certificates()?.first()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// Serves proxies on `listener` until the process ends.
pub async fn run(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    authority: Arc<Authority>,
    registry: Arc<Registry>,
) -> Result<()> {
    let acceptor = TlsAcceptor::from(tls);
    let handshakes = Arc::new(Handshakes::default());
    let log = Arc::new(Mutex::new(crate::stats::LogLimiter::new(10)));
    let started = std::time::Instant::now();
    // A warning from the network path, at most ten a second.
    let warn = move |line: std::fmt::Arguments<'_>| {
        let now = started.elapsed().as_millis() as u64;
        if log.lock().is_ok_and(|mut l| l.allow(now)) {
            tracing::warn!("{line}");
        }
    };
    let mut next = 0u64;
    loop {
        let (tcp, from) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                authority
                    .stats
                    .connections_refused
                    .fetch_add(1, Ordering::Relaxed);
                warn(format_args!("accepting a proxy connection failed: {e}"));
                tokio::time::sleep(crate::metrics::ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Some(handshaking) = Handshakes::enter(&handshakes, from.ip()) else {
            authority
                .stats
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            warn(format_args!(
                "connection from {from} refused: too many TLS handshakes in progress"
            ));
            continue;
        };
        let _ = tcp.set_nodelay(true);
        next += 1;
        let (acceptor, authority, registry, n, warn) = (
            acceptor.clone(),
            authority.clone(),
            registry.clone(),
            next,
            warn.clone(),
        );
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
            drop(handshaking);
            let tls = match handshake {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    authority
                        .stats
                        .handshake_failures
                        .fetch_add(1, Ordering::Relaxed);
                    warn(format_args!(
                        "proxy refused: TLS handshake with {from} failed ({e})"
                    ));
                    return;
                }
                Err(_) => {
                    authority
                        .stats
                        .handshake_failures
                        .fetch_add(1, Ordering::Relaxed);
                    warn(format_args!(
                        "proxy refused: no TLS handshake from {from} within {} s",
                        HANDSHAKE_TIMEOUT.as_secs()
                    ));
                    return;
                }
            };
            let Some(name) = peer_name(tls.get_ref().1) else {
                tracing::warn!(%from, "proxy refused: its certificate has no common name");
                return;
            };
            if registry.is_revoked(&name) {
                tracing::warn!(%from, proxy = %name, "proxy refused: revoked");
                let mut tls = tls;
                let goodbye = wire::line(&Reply::Goodbye {
                    reason: REVOKED.into(),
                });
                let _ = tls.write_all(goodbye.as_bytes()).await;
                let _ = tls.shutdown().await;
                return;
            }
            tracing::info!(%from, proxy = %name, "proxy connected");
            serve(tls, name.into(), n, authority, registry.clone()).await;
        });
    }
}

async fn serve(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    proxy: Arc<str>,
    n: u64,
    authority: Arc<Authority>,
    registry: Arc<Registry>,
) {
    let (mut reader, mut writer) = tokio::io::split(tls);
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let cut = Arc::new(Notify::new());
    registry.add(
        &proxy,
        Conn {
            n,
            lines: tx.clone(),
            cut: cut.clone(),
        },
    );
    let _ = tx.send(wire::line(&Reply::Welcome {
        proxy: proxy.to_string(),
    }));
    drop(tx);
    let stats_out = authority.clone();
    // The writer: everything queued goes out in one write; ends when every sender is gone
    // (the reader finished, or the proxy was revoked).
    let writer_task = tokio::spawn(async move {
        let mut out = String::new();
        while let Some(first) = rx.recv().await {
            out.clear();
            out.push_str(&first);
            while let Ok(more) = rx.try_recv() {
                out.push_str(&more);
            }
            stats_out
                .stats
                .bytes_out
                .fetch_add(out.len() as u64, Ordering::Relaxed);
            if writer.write_all(out.as_bytes()).await.is_err() {
                break;
            }
        }
        let _ = writer.shutdown().await;
    });
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = vec![0u8; 8192];
    'read: loop {
        let got = tokio::select! {
            r = reader.read(&mut chunk) => r,
            _ = cut.notified() => {
                tracing::warn!(proxy = %proxy, "proxy revoked: connection cut");
                break 'read;
            }
        };
        let got = match got {
            Ok(0) | Err(_) => break,
            Ok(k) => k,
        };
        authority
            .stats
            .bytes_in
            .fetch_add(got as u64, Ordering::Relaxed);
        buf.extend_from_slice(&chunk[..got]);
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let reply = match std::str::from_utf8(&line)
                .map_err(anyhow::Error::from)
                .and_then(wire::parse::<Request>)
            {
                Ok(Request::Issue {
                    id,
                    user,
                    length,
                    hash,
                }) => {
                    let ask = super::authority::Ask {
                        length,
                        hash: hash.and_then(|h| HashKind::from_token(h.as_bytes())),
                    };
                    authority.issue(&proxy, id, &user, ask, wire::unix_s())
                }
                Err(e) => {
                    tracing::warn!(proxy = %proxy, "bad request, connection closed: {e:#}");
                    break 'read;
                }
            };
            if !registry.send_to(&proxy, n, wire::line(&reply)) {
                break 'read;
            }
        }
        if buf.len() > wire::MAX_LINE {
            tracing::warn!(proxy = %proxy, "request line too long, connection closed");
            break;
        }
    }
    registry.remove(&proxy, n);
    let _ = writer_task.await;
    tracing::info!(proxy = %proxy, "proxy disconnected");
}

impl Registry {
    /// Sends a line to one connection; false when it is gone.
    fn send_to(&self, proxy: &Arc<str>, n: u64, line: String) -> bool {
        let Ok(c) = self.conns.lock() else {
            return false;
        };
        c.get(proxy)
            .and_then(|v| v.iter().find(|conn| conn.n == n))
            .is_some_and(|conn| conn.lines.send(line).is_ok())
    }
}
