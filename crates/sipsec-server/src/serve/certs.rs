//! STIR/SHAKEN certificate fetches off the workers' threads: a worker's verification service
//! asks for an `x5u` URL (`Effects::cert_fetches`); one task on the server's runtime fetches
//! it once however many workers want it, checks its chain against the STI-CA roots there (so
//! no worker spends a chain validation), and mails every worker the outcome
//! (`Mail::Certificate`), which each caches for as long as the response allowed.
//!
//! Every fetch is bounded, since the URL comes from whoever sent the INVITE: only `https:`
//! URLs whose host `[identity] fetch_allow` permits, connected to the address checked
//! (public, or listed) — never a name resolved twice —, at most `fetch_max_bytes` read,
//! `fetch_timeout_ms` for all of it (connect, TLS, request, body), `fetch_concurrency` at
//! once, `MAX_PENDING` URLs waiting and none waiting for a slot longer than a fetch may
//! take; no redirect is followed. HTTP/1.1 over rustls by hyper's
//! client connection (no pool: one certificate, one connection), so the address it connects
//! to is ours to choose.

use super::mailbox::MailboxSender;
use crate::engine::{Fetched, Mail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use sipsec_identity::fetch::{max_age, Allow};
use sipsec_identity::{CertError, Roots, Signer};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};

/// URLs waiting for a fetch at most; beyond, a new one fails at once.
const MAX_PENDING: usize = 1024;

/// What the fetcher works with (`[identity]`).
#[derive(Clone)]
pub struct FetchSettings {
    /// Hosts and addresses `x5u` may name.
    pub allow: Allow,
    /// The STI-CA roots a certificate's chain must reach.
    pub roots: Arc<Roots>,
    /// The TLS client of the HTTPS fetches (the system's roots and `fetch_ca`).
    pub tls: Arc<rustls::ClientConfig>,
    /// All of one fetch.
    pub timeout: Duration,
    /// The largest body read.
    pub max_bytes: usize,
    /// Fetches at once.
    pub concurrency: usize,
    /// How long a certificate is kept when the response says nothing, and at most.
    pub default_ttl_s: u64,
    /// The most a response's `max-age` may keep a certificate.
    pub max_ttl_s: u64,
    /// How long a failure is remembered (so a bad `x5u` is not fetched per call).
    pub failure_ttl_s: u64,
}

/// Where the workers send the URLs they need.
#[derive(Clone)]
pub struct CertHandle {
    tx: mpsc::UnboundedSender<(Arc<str>, usize)>,
}

impl CertHandle {
    /// Asks for `url` on behalf of worker `worker`.
    pub fn fetch(&self, url: Arc<str>, worker: usize) {
        let _ = self.tx.send((url, worker));
    }
}

/// Starts the fetch task on `runtime`.
pub fn spawn(
    runtime: &tokio::runtime::Runtime,
    settings: FetchSettings,
    workers: Vec<MailboxSender>,
) -> CertHandle {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Arc<str>, usize)>();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(Arc<str>, Fetched)>();
    let permits = Arc::new(Semaphore::new(settings.concurrency.max(1)));
    runtime.spawn(async move {
        let mut pending: HashMap<Arc<str>, Vec<usize>> = HashMap::new();
        loop {
            tokio::select! {
                asked = rx.recv() => {
                    let Some((url, worker)) = asked else { break };
                    if let Some(waiting) = pending.get_mut(&url) {
                        if !waiting.contains(&worker) {
                            waiting.push(worker);
                        }
                        continue;
                    }
                    if pending.len() >= MAX_PENDING {
                        let failed = Fetched {
                            signer: Err(CertError::Fetch("too many certificate fetches pending".into())),
                            ttl_s: 0,
                        };
                        deliver(&workers, &url, failed, &[worker]);
                        continue;
                    }
                    pending.insert(url.clone(), vec![worker]);
                    let (s, done, permits) = (settings.clone(), done_tx.clone(), permits.clone());
                    tokio::spawn(async move {
                        // A URL waits for a fetch slot no longer than a fetch may take: a
                        // flood of certificates that never come, each at a URL of its own,
                        // must not queue an honest one behind minutes of time-outs. Not
                        // getting a slot is no fault of the URL: nothing is remembered.
                        let slot = tokio::time::timeout(s.timeout, permits.acquire()).await;
                        let fetched = match slot {
                            Ok(Ok(_permit)) => fetch_checked(&url, &s).await,
                            Ok(Err(_)) => Fetched {
                                signer: Err(CertError::Fetch("the fetcher stopped".into())),
                                ttl_s: 0,
                            },
                            Err(_) => Fetched {
                                signer: Err(CertError::Fetch(format!(
                                    "no fetch slot free within {} ms ({} fetches at once)",
                                    s.timeout.as_millis(),
                                    s.concurrency
                                ))),
                                ttl_s: 0,
                            },
                        };
                        let _ = done.send((url, fetched));
                    });
                }
                Some((url, fetched)) = done_rx.recv() => {
                    let waiting = pending.remove(&url).unwrap_or_default();
                    deliver(&workers, &url, fetched, &waiting);
                }
            }
        }
    });
    CertHandle { tx }
}

/// Mails every worker the outcome: those waiting are woken, the others read it at their next
/// wake-up.
fn deliver(workers: &[MailboxSender], url: &Arc<str>, fetched: Fetched, waiting: &[usize]) {
    let fetched = Arc::new(fetched);
    for (w, mailbox) in workers.iter().enumerate() {
        let mail = Mail::Certificate {
            url: url.clone(),
            fetched: fetched.clone(),
        };
        if waiting.contains(&w) {
            mailbox.send(mail);
        } else {
            mailbox.post(mail);
        }
    }
}

fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Fetches `url` and checks what came against the roots: the outcome and how long to keep it.
async fn fetch_checked(url: &str, s: &FetchSettings) -> Fetched {
    let outcome = match tokio::time::timeout(s.timeout, fetch(url, s)).await {
        Ok(r) => r,
        Err(_) => Err(CertError::Fetch(format!(
            "no certificate within {} ms",
            s.timeout.as_millis()
        ))),
    };
    let now = unix_now_s();
    let (signer, ttl_s) = match outcome {
        Ok((body, age)) => match Signer::from_pem(&body, &s.roots, now) {
            Ok(signer) => {
                // At least a second (a `no-store` server must not draw a fetch per call),
                // unless configuration keeps nothing (`cert_max_ttl_s = 0`).
                let ttl = age
                    .unwrap_or(s.default_ttl_s)
                    .max(1)
                    .min(s.max_ttl_s)
                    .min(signer.not_after_s().saturating_sub(now));
                (Ok(Arc::new(signer)), ttl)
            }
            Err(e) => (Err(e), s.failure_ttl_s),
        },
        Err(e) => (Err(e), s.failure_ttl_s),
    };
    match &signer {
        Ok(_) => tracing::debug!(url, ttl_s, "STIR/SHAKEN certificate fetched"),
        Err(e) => tracing::debug!(url, "STIR/SHAKEN certificate refused: {e}"),
    }
    Fetched { signer, ttl_s }
}

/// One GET: the body and the response's `max-age`, if it gave one.
async fn fetch(url: &str, s: &FetchSettings) -> Result<(Bytes, Option<u64>), CertError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| CertError::Fetch(format!("{what}: {e}"));
    let target = s.allow.target(url)?;
    let candidates: Vec<SocketAddr> = match target.literal {
        Some(ip) => vec![SocketAddr::new(ip, target.port)],
        None => tokio::net::lookup_host((target.host.as_str(), target.port))
            .await
            .map_err(|e| fail(&target.host, &e))?
            .collect(),
    };
    let Some(addr) = candidates.iter().copied().find(|a| s.allow.address(a.ip())) else {
        return Err(CertError::Fetch(format!(
            "{} resolves to no address a fetch may reach ({:?}): private, loopback and \
             link-local addresses only when identity.fetch_allow lists them",
            target.host, candidates
        )));
    };
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| fail(&addr.to_string(), &e))?;
    // Each TLS flight and the request go out at once: with Nagle's algorithm a flight that
    // follows one not yet acknowledged waits for the peer's delayed ACK (40 ms on Linux),
    // and every INVITE waiting on the fetch with it.
    let _ = tcp.set_nodelay(true);
    let name = match target.literal {
        Some(ip) => rustls::pki_types::ServerName::IpAddress(ip.into()),
        None => rustls::pki_types::ServerName::try_from(target.host.clone())
            .map_err(|e| fail(&target.host, &e))?,
    };
    let tls = tokio_rustls::TlsConnector::from(s.tls.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| fail("TLS", &e))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| fail("HTTP", &e))?;
    let exchange = async move {
        let request = hyper::Request::get(target.path.as_str())
            .header(hyper::header::HOST, target.authority())
            .header(
                hyper::header::ACCEPT,
                "application/pem-certificate-chain, application/x-pem-file, */*",
            )
            .header(hyper::header::USER_AGENT, "sipsec")
            .body(Empty::<Bytes>::new())
            .map_err(|e| fail("request", &e))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| fail("HTTP", &e))?;
        if response.status() != hyper::StatusCode::OK {
            return Err(CertError::Fetch(format!(
                "{url} answered {} (redirects are not followed)",
                response.status()
            )));
        }
        let age = response
            .headers()
            .get(hyper::header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
            .and_then(max_age);
        let body = Limited::new(response.into_body(), s.max_bytes)
            .collect()
            .await
            .map_err(|e| fail(&format!("body (at most {} bytes)", s.max_bytes), &e))?
            .to_bytes();
        Ok((body, age))
    };
    // The connection is driven beside the exchange, in this future: when the exchange ends (or
    // the caller's timeout drops it) the connection goes with it.
    let mut exchange = std::pin::pin!(exchange);
    let mut conn = std::pin::pin!(conn);
    let mut conn_done = false;
    loop {
        tokio::select! {
            r = &mut exchange => return r,
            _ = &mut conn, if !conn_done => conn_done = true,
        }
    }
}
