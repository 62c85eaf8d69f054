//! `[routing]`: where requests that are not for our users go — default routes with
//! priorities and weights, routes per destination domain — and how next hops named by DNS are
//! located and failed over (name servers, static host overrides, timeouts, hold-down).

use super::Listen;
use crate::dns::{Hop, Query};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use sipsec_transport::net::transport::{Peer, Transport};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawRouting {
    default_route: Option<String>,
    default_routes: Vec<RawRoute>,
    domain_routes: BTreeMap<String, String>,
    hosts: BTreeMap<String, Vec<String>>,
    dns_servers: Vec<String>,
    dns_timeout_ms: u64,
    failover_timeout_ms: u64,
    hold_down_s: u64,
    probe_interval_s: u64,
}

impl Default for RawRouting {
    fn default() -> Self {
        RawRouting {
            default_route: None,
            default_routes: Vec::new(),
            domain_routes: BTreeMap::new(),
            hosts: BTreeMap::new(),
            dns_servers: Vec::new(),
            dns_timeout_ms: 2000,
            failover_timeout_ms: 4000,
            hold_down_s: 60,
            probe_interval_s: 0,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    uri: String,
    #[serde(default)]
    priority: u16,
    #[serde(default = "one")]
    weight: u16,
}

fn one() -> u16 {
    1
}

/// A configured next hop.
#[derive(Debug, Clone)]
pub struct Route {
    /// The URI as written (a redirect server hands it out as a Contact).
    pub uri: String,
    /// Lower is tried first.
    pub priority: u16,
    /// Share among the routes of the same priority (RFC 2782 weighting).
    pub weight: u16,
    /// Where the URI leads: an address, or a name to resolve when the route is used.
    pub next: Next,
}

/// A route's destination: an address, or a name located by DNS (RFC 3263) when used.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// An IP address (or `localhost`), with its transport and port.
    Addr(Peer),
    /// A DNS name, located as RFC 3263 says each time it is used.
    Name(Query),
}

impl Next {
    /// The hop as the router looks it up: the address, or the name as a DNS cache key.
    pub fn hop(&self) -> Hop<'_> {
        match self {
            Next::Addr(p) => Hop::Addr(*p),
            Next::Name(q) => Hop::Name(q.as_key()),
        }
    }
}

/// The validated `[routing]` section.
#[derive(Debug, Clone, Default)]
pub struct RoutingConfig {
    /// For new requests to users that are not ours: tried by priority, spread by weight, the
    /// next one taken when one fails (empty: the Request-URI decides).
    pub default_routes: Vec<Route>,
    /// Per destination domain (lower case): requests whose Request-URI names it go there
    /// instead of the default routes.
    pub(crate) domain_routes: Vec<(String, Route)>,
    /// Static overrides of DNS: a name and its addresses.
    pub hosts: HashMap<String, Vec<IpAddr>>,
    /// Name servers to ask (empty: the system's).
    pub(crate) dns_servers: Vec<SocketAddr>,
    pub(crate) dns_timeout_ms: u64,
    /// With another target to fail over to, how long a branch may go without any response
    /// before the next target is tried (RFC 3263 §4.3; Timer B or F otherwise).
    pub failover_timeout_ms: u64,
    /// How long a target that failed (transport error, timeout, 503 without Retry-After) is
    /// skipped.
    pub(crate) hold_down_ms: u64,
    /// How often configured routes are probed with OPTIONS (0: never).
    pub(crate) probe_interval_s: u64,
}

impl RoutingConfig {
    /// The route for a Request-URI host, if one is configured for its domain.
    pub(crate) fn domain_route(&self, host: &[u8]) -> Option<&Route> {
        let host = host.strip_suffix(b".").unwrap_or(host);
        self.domain_routes
            .iter()
            .find(|(d, _)| d.as_bytes().eq_ignore_ascii_case(host))
            .map(|(_, r)| r)
    }
}

impl RawRouting {
    pub(super) fn validate(self, listen: &[Listen]) -> Result<RoutingConfig> {
        let mut default_routes = Vec::new();
        if let Some(uri) = self.default_route {
            if !self.default_routes.is_empty() {
                bail!("routing.default_route: give default_route or default_routes, not both");
            }
            default_routes.push(route("routing.default_route", uri, 0, 1, listen)?);
        }
        for (i, r) in self.default_routes.into_iter().enumerate() {
            let key = format!("routing.default_routes[{i}]");
            default_routes.push(route(&key, r.uri, r.priority, r.weight, listen)?);
        }
        let mut domain_routes = Vec::new();
        for (domain, uri) in self.domain_routes {
            let key = format!("routing.domain_routes.{domain:?}");
            if !sip_core::message::uri::valid_host(domain.as_bytes()) {
                bail!("{key}: not a host name");
            }
            domain_routes.push((domain.to_ascii_lowercase(), route(&key, uri, 0, 1, listen)?));
        }
        let mut hosts = HashMap::new();
        for (name, addrs) in self.hosts {
            let key = format!("routing.hosts.{name:?}");
            if !sip_core::message::uri::valid_host(name.as_bytes())
                || name.parse::<IpAddr>().is_ok()
            {
                bail!("{key}: not a host name");
            }
            if addrs.is_empty() {
                bail!("{key}: give at least one address");
            }
            let ips = addrs
                .iter()
                .map(|a| {
                    a.parse::<IpAddr>()
                        .with_context(|| format!("{key}: {a:?} is not an IP address"))
                })
                .collect::<Result<Vec<_>>>()?;
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            hosts.insert(name, ips);
        }
        let dns_servers = self
            .dns_servers
            .iter()
            .map(|s| {
                s.parse::<SocketAddr>()
                    .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                    .with_context(|| format!("routing.dns_servers: {s:?} is not ip or ip:port"))
            })
            .collect::<Result<Vec<_>>>()?;
        if !(100..=30_000).contains(&self.dns_timeout_ms) {
            bail!("routing.dns_timeout_ms: between 100 and 30000");
        }
        if !(100..=32_000).contains(&self.failover_timeout_ms) {
            bail!("routing.failover_timeout_ms: between 100 and 32000 (Timer B)");
        }
        if self.hold_down_s > 86_400 {
            bail!("routing.hold_down_s: at most 86400");
        }
        if self.probe_interval_s > 3600 {
            bail!("routing.probe_interval_s: at most 3600 (0: no probing)");
        }
        Ok(RoutingConfig {
            default_routes,
            domain_routes,
            hosts,
            dns_servers,
            dns_timeout_ms: self.dns_timeout_ms,
            failover_timeout_ms: self.failover_timeout_ms,
            hold_down_ms: self.hold_down_s * 1000,
            probe_interval_s: self.probe_interval_s,
        })
    }
}

/// One route from the file, its URI checked: a sip: or sips: URI over a transport we listen
/// on (when it names one).
fn route(key: &str, uri: String, priority: u16, weight: u16, listen: &[Listen]) -> Result<Route> {
    let parsed = sip_core::message::Uri::parse(uri.as_bytes())
        .map_err(|e| anyhow::anyhow!("{key}: '{uri}' is not a SIP URI ({})", e.as_str()))?;
    if !matches!(
        parsed.scheme,
        sip_core::message::Scheme::Sip | sip_core::message::Scheme::Sips
    ) {
        bail!("{key}: '{uri}' must be a sip: or sips: URI");
    }
    let Some(hop) = crate::dns::hop(&parsed) else {
        bail!(
            "{key}: unknown transport '{}' (udp, tcp or tls)",
            String::from_utf8_lossy(parsed.transport().unwrap_or_default())
        );
    };
    let (next, fixed) = match hop {
        Hop::Addr(p) => (Next::Addr(p), Some(p.transport)),
        Hop::Name(q) => {
            let fixed = if q.secure {
                Some(Transport::Tls)
            } else {
                q.transport
            };
            (Next::Name(q.to_query()), fixed)
        }
    };
    if let Some(t) = fixed {
        if t.websocket() {
            bail!(
                "{key}: '{uri}' is reached over {t}, which only a browser opens: a route goes \
                 over udp, tcp or tls"
            );
        }
        if !listen.iter().any(|l| l.transport == t) {
            bail!("{key}: '{uri}' is reached over {t}, but server.listen has no {t} address");
        }
    }
    Ok(Route {
        uri,
        priority,
        weight,
        next,
    })
}
