//! Asking DNS (RFC 3263 §4.1–4.2): NAPTR, then SRV, then A/AAAA, with `hickory-resolver`
//! (its cache honours each record's TTL) on the server's async runtime, never on a worker.
//! Static host overrides (`[routing] hosts`) answer before DNS is asked.

use super::{naptr_service, srv_prefix, Entry, Failure, Query, Resolution};
use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolverConfig};
use hickory_resolver::lookup::Lookup;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::NetError;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;
use sipsec_transport::net::transport::Transport;
use smallvec::SmallVec;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// How long an answer of no records is kept (hickory keeps its own by the zone's negative
/// TTL; this is the engine's copy).
pub(crate) const NEGATIVE_TTL_S: u32 = 30;
/// How long "DNS did not answer" is kept before the name is asked again.
pub(crate) const UNAVAILABLE_TTL_S: u32 = 5;
/// The TTL of answers from static host overrides.
pub(crate) const HOSTS_TTL_S: u32 = 3600;

/// Settings for [`Resolver::new`].
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Name servers (`ip:port`); empty: the system's (`/etc/resolv.conf`).
    pub servers: Vec<SocketAddr>,
    /// Static overrides: a name (lower case) and its addresses, used without asking DNS.
    pub hosts: HashMap<String, Vec<IpAddr>>,
    /// The transports we can send over, in the order tried when DNS has no NAPTR records.
    pub transports: Vec<Transport>,
    /// How long one DNS query may take before it is retried or given up.
    pub timeout: Duration,
}

/// An RFC 3263 resolver. Cheap to clone (the cache is shared).
#[derive(Clone)]
pub(crate) struct Resolver {
    dns: TokioResolver,
    hosts: std::sync::Arc<HashMap<String, Vec<IpAddr>>>,
    transports: Vec<Transport>,
}

impl Resolver {
    /// Must be called inside a Tokio runtime.
    pub(crate) fn new(settings: &Settings) -> anyhow::Result<Resolver> {
        let mut builder = if settings.servers.is_empty() {
            TokioResolver::builder_tokio()
                .map_err(|e| anyhow::anyhow!("cannot read the system's DNS configuration: {e}"))?
        } else {
            let servers = settings
                .servers
                .iter()
                .map(|s| {
                    let mut ns = NameServerConfig::udp_and_tcp(s.ip());
                    for c in &mut ns.connections {
                        c.port = s.port();
                    }
                    ns
                })
                .collect();
            TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), servers),
                TokioRuntimeProvider::default(),
            )
        };
        let opts = builder.options_mut();
        opts.timeout = settings.timeout;
        opts.attempts = 2;
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.ndots = 0;
        let dns = builder
            .build()
            .map_err(|e| anyhow::anyhow!("cannot start the DNS resolver: {e}"))?;
        Ok(Resolver {
            dns,
            hosts: std::sync::Arc::new(settings.hosts.clone()),
            transports: settings.transports.clone(),
        })
    }

    /// Resolves one next hop by RFC 3263. Never fails: a failure is a [`Resolution`] with no
    /// entries and the reason.
    pub(crate) async fn resolve(&self, q: &Query) -> Resolution {
        let plain = if q.secure {
            Transport::Tls
        } else {
            q.transport.unwrap_or(Transport::Udp)
        };
        if let Some(ips) = self.hosts.get(&*q.name) {
            let port = q.port.unwrap_or(plain.default_port());
            return Resolution {
                entries: vec![entry(0, 0, plain, port, ips.iter().copied().collect())],
                ttl_s: HOSTS_TTL_S,
                error: None,
            };
        }
        let mut answer = Answer::default();
        let name = format!("{}.", q.name);
        if let Some(port) = q.port {
            self.addresses(&mut answer, &name, 0, 0, plain, port).await;
        } else if q.transport.is_some() {
            let srv = format!("{}{name}", srv_prefix(plain));
            if !self.srv(&mut answer, &srv, 0, plain).await {
                self.addresses(&mut answer, &name, 0, 0, plain, plain.default_port())
                    .await;
            }
        } else if !self.naptr(&mut answer, &name, self.allowed(q)).await {
            let mut any = false;
            for (i, &t) in self.allowed(q).iter().enumerate() {
                let srv = format!("{}{name}", srv_prefix(t));
                any |= self.srv(&mut answer, &srv, (i as u32) << 16, t).await;
            }
            if !any {
                self.addresses(&mut answer, &name, 0, 0, plain, plain.default_port())
                    .await;
            }
        }
        answer.finish()
    }

    /// The transports a query may use: TLS alone for `sips:`, else every one we speak.
    fn allowed(&self, q: &Query) -> &[Transport] {
        if q.secure {
            &[Transport::Tls]
        } else {
            &self.transports
        }
    }

    /// The records of `rtype` at `name`, noting in `answer` how long they stay valid, or why
    /// there are none.
    async fn records(&self, answer: &mut Answer, name: &str, rtype: RecordType) -> Option<Lookup> {
        match self.dns.lookup(name, rtype).await {
            Ok(lookup) => {
                answer.valid_until(lookup.valid_until());
                Some(lookup)
            }
            Err(e) => {
                answer.error(&e);
                None
            }
        }
    }

    /// NAPTR for the services of `allowed`; true when it gave any usable SRV name.
    async fn naptr(&self, answer: &mut Answer, name: &str, allowed: &[Transport]) -> bool {
        let Some(lookup) = self.records(answer, name, RecordType::NAPTR).await else {
            return false;
        };
        let mut rules: Vec<(u16, u16, Transport, String)> = lookup
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::NAPTR(n) if n.flags.eq_ignore_ascii_case(b"s") => {
                    let t = allowed
                        .iter()
                        .copied()
                        .find(|&t| n.services.eq_ignore_ascii_case(naptr_service(t)))?;
                    Some((n.order, n.preference, t, n.replacement.to_ascii()))
                }
                _ => None,
            })
            .collect();
        rules.sort_by_key(|r| (r.0, r.1));
        let mut any = false;
        for (i, (_, _, t, srv)) in rules.iter().enumerate() {
            any |= self.srv(answer, srv, (i as u32) << 16, *t).await;
        }
        any
    }

    /// SRV at `name`; true when it answered with records (even "." ones: the service is
    /// then decidedly not there, RFC 2782).
    async fn srv(&self, answer: &mut Answer, name: &str, rank: u32, t: Transport) -> bool {
        let Some(lookup) = self.records(answer, name, RecordType::SRV).await else {
            return false;
        };
        let mut found = false;
        for r in lookup.answers() {
            if let RData::SRV(srv) = &r.data {
                found = true;
                if srv.target.is_root() {
                    continue;
                }
                let target = srv.target.to_ascii();
                let rank = rank | u32::from(srv.priority);
                self.addresses(answer, &target, rank, srv.weight, t, srv.port)
                    .await;
            }
        }
        found
    }

    /// A and AAAA of `name` as one entry.
    async fn addresses(
        &self,
        answer: &mut Answer,
        name: &str,
        rank: u32,
        weight: u16,
        t: Transport,
        port: u16,
    ) {
        let host = name.strip_suffix('.').unwrap_or(name);
        if let Some(ips) = self.hosts.get(&host.to_ascii_lowercase()) {
            answer
                .entries
                .push(entry(rank, weight, t, port, ips.iter().copied().collect()));
            return;
        }
        match self.dns.lookup_ip(name).await {
            Ok(ips) => {
                answer.valid_until(ips.valid_until());
                let mut addrs: SmallVec<[IpAddr; 2]> = ips.iter().collect();
                addrs.sort_by_key(IpAddr::is_ipv6);
                if !addrs.is_empty() {
                    answer.entries.push(entry(rank, weight, t, port, addrs));
                }
            }
            Err(e) => answer.error(&e),
        }
    }
}

fn entry(
    rank: u32,
    weight: u16,
    transport: Transport,
    port: u16,
    addrs: SmallVec<[IpAddr; 2]>,
) -> Entry {
    Entry {
        rank,
        weight,
        transport,
        port,
        addrs,
    }
}

/// A resolution being put together.
#[derive(Default)]
struct Answer {
    entries: Vec<Entry>,
    until: Option<Instant>,
    unavailable: bool,
}

impl Answer {
    fn valid_until(&mut self, until: Instant) {
        self.until = Some(self.until.map_or(until, |u| u.min(until)));
    }

    fn error(&mut self, e: &NetError) {
        if !e.is_no_records_found() && !e.is_nx_domain() {
            tracing::debug!("DNS lookup failed: {e}");
            self.unavailable = true;
        }
    }

    fn finish(mut self) -> Resolution {
        self.entries.sort_by_key(|e| e.rank);
        if self.entries.is_empty() {
            return if self.unavailable {
                Resolution::failed(Failure::Unavailable, UNAVAILABLE_TTL_S)
            } else {
                Resolution::failed(Failure::NoRecords, NEGATIVE_TTL_S)
            };
        }
        let ttl_s = self.until.map_or(0, |u| {
            u.saturating_duration_since(Instant::now())
                .as_secs_f64()
                .ceil() as u32
        });
        Resolution {
            entries: self.entries,
            ttl_s,
            error: None,
        }
    }
}
