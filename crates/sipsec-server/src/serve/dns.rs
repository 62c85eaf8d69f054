//! DNS off the workers' threads: the workers' lookups (`Effects::lookups`) go to one task on
//! the server's runtime, which asks `crate::dns::resolver` once per name however many
//! workers want it, and mails every worker the answer (`Mail::Resolved`), so the others have
//! it before they need it.

use super::mailbox::MailboxSender;
use crate::dns::resolver::{Resolver, Settings};
use crate::dns::{Failure, Query, Resolution};
use crate::engine::Mail;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What the lookup task is asked.
enum Ask {
    /// `query`, for worker `usize`.
    Lookup(Query, usize),
    /// New name servers or hosts (a reload): lookups from now on use them.
    Settings(Settings),
}

/// Where the workers send the names they need.
#[derive(Clone)]
pub struct LookupHandle {
    tx: mpsc::UnboundedSender<Ask>,
}

impl LookupHandle {
    /// Asks for `query` on behalf of worker `worker`.
    pub fn lookup(&self, query: Query, worker: usize) {
        let _ = self.tx.send(Ask::Lookup(query, worker));
    }

    /// Resolves with these settings from now on.
    pub(crate) fn reconfigure(&self, settings: Settings) {
        let _ = self.tx.send(Ask::Settings(settings));
    }
}

/// Starts the lookup task. A resolver that cannot start (no usable system configuration)
/// is logged once and every lookup is answered "DNS unavailable": routes by address work
/// regardless.
pub fn spawn(
    runtime: &tokio::runtime::Runtime,
    settings: Settings,
    workers: Vec<MailboxSender>,
) -> LookupHandle {
    let (tx, mut rx) = mpsc::unbounded_channel::<Ask>();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(Query, Resolution, u64)>();
    let _guard = runtime.enter();
    let mut resolver = start(&settings);
    // Each lookup is several queries (NAPTR, SRV per transport, A/AAAA per target), each
    // tried twice: past this, the answer is "unavailable" whatever is still pending.
    let mut limit = settings.timeout * 8;
    // Bumped by each reload: an answer asked under older settings is asked again.
    let mut generation = 0u64;
    runtime.spawn(async move {
        // Names being asked, and the workers waiting for each.
        let mut pending: HashMap<Query, Vec<usize>> = HashMap::new();
        let ask = |query: Query, resolver: Option<Resolver>, limit, generation| {
            let done = done_tx.clone();
            tokio::spawn(async move {
                let answer = match resolver {
                    Some(r) => tokio::time::timeout(limit, r.resolve(&query))
                        .await
                        .unwrap_or_else(|_| unavailable()),
                    None => unavailable(),
                };
                log_answer(&query, &answer);
                let _ = done.send((query, answer, generation));
            });
        };
        loop {
            tokio::select! {
                asked = rx.recv() => match asked {
                    None => break,
                    Some(Ask::Settings(s)) => {
                        resolver = start(&s);
                        limit = s.timeout * 8;
                        generation += 1;
                    }
                    Some(Ask::Lookup(query, worker)) => {
                        let waiting = pending.entry(query.clone()).or_default();
                        if !waiting.contains(&worker) {
                            waiting.push(worker);
                        }
                        if waiting.len() == 1 {
                            ask(query, resolver.clone(), limit, generation);
                        }
                    }
                },
                Some((query, answer, asked_in)) = done_rx.recv() => {
                    if asked_in != generation {
                        ask(query, resolver.clone(), limit, generation);
                        continue;
                    }
                    // Every worker gets the answer, so none asks for it again: those waiting
                    // are woken, the others read it at their next wake-up.
                    let waiting = pending.remove(&query).unwrap_or_default();
                    let answer = Arc::new(answer);
                    for (w, mailbox) in workers.iter().enumerate() {
                        let mail = Mail::Resolved {
                            query: query.clone(),
                            resolution: answer.clone(),
                        };
                        if waiting.contains(&w) {
                            mailbox.send(mail);
                        } else {
                            mailbox.post(mail);
                        }
                    }
                }
            }
        }
    });
    LookupHandle { tx }
}

/// A resolver with `settings` (inside the runtime), or None, logged, when it cannot start.
fn start(settings: &Settings) -> Option<Resolver> {
    match Resolver::new(settings) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::error!("DNS is unavailable: {e:#}; next hops named by DNS will fail");
            None
        }
    }
}

fn unavailable() -> Resolution {
    Resolution::failed(
        Failure::Unavailable,
        crate::dns::resolver::UNAVAILABLE_TTL_S,
    )
}

fn log_answer(query: &Query, answer: &Resolution) {
    match answer.error {
        None => tracing::debug!(
            "{query}: {} target(s), TTL {} s",
            answer.entries.len(),
            answer.ttl_s
        ),
        Some(Failure::NoRecords) => tracing::warn!("{query}: DNS has no SIP server for it"),
        Some(Failure::Unavailable) => tracing::warn!("{query}: DNS did not answer"),
    }
}

/// The resolver settings of a configuration.
pub fn settings(cfg: &crate::config::Config) -> Settings {
    use sipsec_transport::net::transport::Transport;
    // Without NAPTR, SRV is asked for the transports we can send over, UDP first.
    let transports = [Transport::Udp, Transport::Tcp, Transport::Tls]
        .into_iter()
        .filter(|t| cfg.listen.iter().any(|l| l.transport == *t))
        .collect();
    Settings {
        servers: cfg.routing.dns_servers.clone(),
        hosts: cfg.routing.hosts.clone(),
        transports,
        timeout: Duration::from_millis(cfg.routing.dns_timeout_ms),
    }
}
