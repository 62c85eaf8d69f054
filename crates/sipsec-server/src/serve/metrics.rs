//! What `sipsec serve` exposes at `/metrics`: every worker's counters summed at scrape time —
//! messages by method and class, transactions, dialogs and registrations, authentication by
//! scheme and outcome, TLS handshakes, connections, DNS, overload control, each worker's busy
//! fraction, and the INVITE latency histograms.
//!
//! One family per name, and nothing for a feature that is off: without authentication no
//! `sipsec_auth` series, without TLS no handshake counts, and so on — unless a reload switched
//! the feature on and its counters moved.

use crate::metrics::Writer;
use crate::stats::{Histogram, Stats, Traffic, LATENCY_BUCKETS_US, METHODS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Counters exported under a labelled family of their own instead of by name.
const IN_FAMILIES: &[&str] = &[
    "local_responses",
    "auth_passed",
    "auth_challenged",
    "auth_failed",
    "auth_stale",
    "auth_replays",
    "auth_races",
    "auth_identity_mismatches",
    "auth_throttled",
    "auth_malformed",
    "auth_unavailable",
    "tls_handshakes_full",
    "tls_handshakes_resumed",
    "tls_failures",
    "overload_shed",
    "overload_throttled",
    "overload_rejected",
];

/// Counters that only authentication moves, exported by name only with it on.
const AUTH_ONLY: &[&str] = &[
    "digest_checks",
    "proxychain_checks",
    "credential_fetches",
    "auth_waited",
];

/// Counters that only TLS moves.
const TLS_ONLY: &[&str] = &[
    "tls_client_certificates",
    "tls_handshakes_full_accepted",
    "tls_handshakes_full_opened",
    "tls_handshakes_resumed_accepted",
    "tls_handshakes_resumed_opened",
];

/// The collector: reads the workers' [`Stats`] on each scrape.
#[derive(Debug)]
pub(crate) struct ServeMetrics {
    pub workers: Vec<Arc<Stats>>,
    /// The authentication scheme in use ("none", "digest", "proxychain").
    pub scheme: &'static str,
    /// Whether the server accepts or opens TLS connections.
    pub tls: bool,
    /// Whether local admission control (`[overload] enabled`) is on.
    pub(crate) shedding: bool,
}

impl ServeMetrics {
    fn sum(&self, f: impl Fn(&Stats) -> &AtomicU64) -> u64 {
        self.workers.iter().map(|w| f(w).load(Relaxed)).sum()
    }

    fn traffic(&self, f: impl Fn(&Traffic) -> &AtomicU64) -> u64 {
        self.sum(|s| f(&s.traffic))
    }

    fn histogram(
        &self,
        w: &mut Writer<'_, '_>,
        name: &str,
        help: &str,
        h: impl Fn(&Traffic) -> &Histogram,
    ) -> std::fmt::Result {
        let counts: Vec<u64> = (0..LATENCY_BUCKETS_US.len() + 1)
            .map(|i| self.traffic(|t| &h(t).buckets[i]))
            .collect();
        let sum_us = self.traffic(|t| &h(t).sum_us);
        w.histogram_seconds(name, help, &LATENCY_BUCKETS_US, &counts, sum_us)
    }
}

impl Collector for ServeMetrics {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let w = &mut Writer { enc: &mut enc };
        w.counters(
            "sipsec_requests",
            "Requests received, by method",
            METHODS
                .iter()
                .enumerate()
                .map(|(i, m)| ([("method", *m)], self.traffic(|t| &t.requests[i]))),
        )?;
        let classes = ["1xx", "2xx", "3xx", "4xx", "5xx", "6xx"];
        w.counters(
            "sipsec_responses",
            "Responses received, by the method of their CSeq and their class",
            METHODS.iter().enumerate().flat_map(|(i, m)| {
                classes.iter().enumerate().filter_map(move |(c, class)| {
                    let v = self.traffic(|t| &t.responses[i][c]);
                    (v > 0).then_some(([("method", *m), ("class", *class)], v))
                })
            }),
        )?;
        w.counters(
            "sipsec_local_responses",
            "Responses made by this server, by class",
            classes
                .iter()
                .enumerate()
                .map(|(c, class)| ([("class", *class)], self.traffic(|t| &t.local_responses[c]))),
        )?;
        let auth = [
            ("passed", self.sum(|s| &s.auth_passed)),
            ("challenged", self.sum(|s| &s.auth_challenged)),
            ("failed", self.sum(|s| &s.auth_failed)),
            ("stale", self.sum(|s| &s.auth_stale)),
            ("replay", self.sum(|s| &s.auth_replays)),
            ("race", self.sum(|s| &s.auth_races)),
            (
                "identity_mismatch",
                self.sum(|s| &s.auth_identity_mismatches),
            ),
            ("throttled", self.sum(|s| &s.auth_throttled)),
            ("malformed", self.sum(|s| &s.auth_malformed)),
            ("unavailable", self.sum(|s| &s.auth_unavailable)),
        ];
        let authenticating = self.scheme != "none";
        if authenticating || auth.iter().any(|(_, v)| *v > 0) {
            w.counters(
                "sipsec_auth",
                "Authentication outcomes, by scheme (digest or proxychain) and result",
                auth.map(|(result, v)| ([("scheme", self.scheme), ("result", result)], v)),
            )?;
        }
        let tls = [
            ("full", self.sum(|s| &s.tls_handshakes_full)),
            ("resumed", self.sum(|s| &s.tls_handshakes_resumed)),
            ("failed", self.sum(|s| &s.tls_failures)),
        ];
        if self.tls || tls.iter().any(|(_, v)| *v > 0) {
            w.counters(
                "sipsec_tls_handshakes",
                "TLS handshakes, by result (full, resumed from an earlier session, failed)",
                tls.map(|(r, v)| ([("result", r)], v)),
            )?;
        }
        let shed = self.sum(|s| &s.overload_shed);
        w.counters(
            "sipsec_overload_rejections",
            "New requests answered 503 by overload control, by reason (shed: this server over \
             its target; throttled: the next hop's RFC 7339 feedback; table_full: no room for \
             another transaction)",
            [
                ("shed", shed),
                ("throttled", self.sum(|s| &s.overload_throttled)),
                ("table_full", self.sum(|s| &s.overload_rejected)),
            ]
            .into_iter()
            .filter(|&(r, v)| r != "shed" || self.shedding || v > 0)
            .map(|(r, v)| ([("reason", r)], v)),
        )?;
        let established = self.traffic(|t| &t.dialogs_established);
        let ended = self.traffic(|t| &t.dialogs_ended);
        w.counter(
            "sipsec_dialogs_established",
            "INVITEs answered 2xx through this proxy",
            established,
        )?;
        w.counter(
            "sipsec_dialogs_ended",
            "BYEs answered 2xx through this proxy",
            ended,
        )?;
        w.gauge(
            "sipsec_dialogs",
            "Dialogs set up through this proxy and not yet ended by a BYE it saw",
            established.saturating_sub(ended) as f64,
        )?;
        w.gauge(
            "sipsec_transactions",
            "Transactions in progress (not those only waiting out their timers), all workers",
            self.traffic(|t| &t.transactions) as f64,
        )?;
        w.gauge(
            "sipsec_transactions_lingering",
            "Finished transactions kept to absorb retransmissions until their timers end \
             (RFC 3261 timers D, I, J, K; RFC 6026 L, M), all workers",
            self.traffic(|t| &t.transactions_lingering) as f64,
        )?;
        w.gauge(
            "sipsec_connections",
            "Open TCP and TLS connections",
            self.traffic(|t| &t.connections_open) as f64,
        )?;
        w.gauge(
            "sipsec_bindings",
            "Registered contacts held by the location service",
            self.workers
                .first()
                .map_or(0, |s| s.traffic.bindings.load(Relaxed)) as f64,
        )?;
        w.gauge(
            "sipsec_flood_banned_sources",
            "Sources the [flood] limits refuse now, summed over the workers (each keeps its own \
             table, so a source flooding two workers counts twice)",
            self.traffic(|t| &t.flood_banned) as f64,
        )?;
        w.gauges(
            "sipsec_worker_busy_ratio",
            "Each worker's load over the last overload interval: the share of it the worker was \
             busy, or of the CPU a quota lets it use if that is more",
            self.workers.iter().enumerate().map(|(i, s)| {
                let worker = i.to_string();
                (
                    [("worker", worker)],
                    s.traffic.busy_ppm.load(Relaxed) as f64 / 1e6,
                )
            }),
        )?;
        w.gauges(
            "sipsec_worker_capacity",
            "Overload control's estimate of the new requests per second each worker can take at \
             its target load (0 until measured under load)",
            self.workers.iter().enumerate().map(|(i, s)| {
                let worker = i.to_string();
                (
                    [("worker", worker)],
                    s.traffic.capacity.load(Relaxed) as f64,
                )
            }),
        )?;
        w.gauges(
            "sipsec_worker_refusal_cost",
            "What refusing a new request costs each worker, as a share of what admitting one \
             costs (r), as overload control reads it from the worker's CPU (0 until read)",
            self.workers.iter().enumerate().map(|(i, s)| {
                let worker = i.to_string();
                (
                    [("worker", worker)],
                    s.traffic.refusal_cost_ppm.load(Relaxed) as f64 / 1e6,
                )
            }),
        )?;
        self.histogram(
            w,
            "sipsec_invite_first_response",
            "Proxied INVITEs: arrival to the first response from downstream other than 100",
            |t| &t.invite_first_response,
        )?;
        self.histogram(
            w,
            "sipsec_invite_final_response",
            "Proxied INVITEs: arrival to the final response sent upstream",
            |t| &t.invite_final_response,
        )?;
        // Every other counter, under its own name.
        let all = crate::stats::total(&self.workers);
        for ((name, value), (_, help)) in all.iter().zip(Stats::descriptions()) {
            let off = (AUTH_ONLY.contains(name) && !authenticating)
                || (TLS_ONLY.contains(name) && !self.tls);
            let said_elsewhere = IN_FAMILIES.contains(name);
            if !said_elsewhere && (!off || *value > 0) {
                w.counter(&format!("sipsec_{name}"), help, *value)?;
            }
        }
        Ok(())
    }
}
