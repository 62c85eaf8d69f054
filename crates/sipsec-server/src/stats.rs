//! A worker's counters, written by its engine and its I/O driver alike. Each worker writes
//! only its own (relaxed atomics on its own cache lines, so no contention); the server sums
//! them for its reports. Also the log-line rate limiter of the network path.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        /// Counters of one worker.
        #[derive(Debug, Default)]
        #[repr(align(128))]
        pub struct Stats {
            $(#[doc = $doc] pub $name: AtomicU64,)*
            /// Messages by method and class, gauges and latencies, for `/metrics`.
            pub traffic: Traffic,
        }

        impl Stats {
            /// Name and value of every counter.
            pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }

            /// Name and description of every counter.
            pub(crate) fn descriptions() -> &'static [(&'static str, &'static str)] {
                &[$((stringify!($name), $doc),)*]
            }
        }
    };
}

counters! {
    messages_in: "messages received (datagrams, and messages framed on TCP, TLS and WebSocket streams)",
    stream_messages_in: "of those, messages received on TCP, TLS and WebSocket streams",
    websocket_messages_in: "of the stream messages, those received over WebSocket (ws: and wss:)",
    requests_in: "requests parsed",
    responses_in: "responses parsed",
    malformed: "messages rejected by the parser (answered 400/505 where possible)",
    malformed_dropped: "malformed messages that could not be answered",
    oversize: "messages over max_message_size (answered 513 where possible)",
    keepalives: "CRLF keep-alives",
    retransmissions_absorbed: "request and response retransmissions absorbed by transactions",
    local_answer_acks: "ACKs of INVITEs answered here without a transaction (an overload 503, a challenge, a refusal), absorbed",
    forwarded_requests: "requests forwarded",
    forwarded_responses: "responses forwarded",
    local_responses: "responses generated here",
    registrations: "REGISTER requests accepted",
    registrations_unsaved: "REGISTERs answered 500 because the database did not confirm them in time (durable)",
    registrations_refused: "REGISTER requests refused (bad or over-long values, too many contacts, a contact at this server)",
    not_allowed: "requests answered 405 or 501",
    loops: "requests answered 482, and registered contacts or routes pointing back at this server",
    breadth_limited: "forks cut to fewer branches, or refused 440, by Max-Breadth (RFC 5393)",
    identity_signed: "initial INVITEs signed: an Identity header (STIR/SHAKEN PASSporT) added",
    identity_unsigned: "initial INVITEs [identity] sign could not sign: no telephone number in P-Asserted-Identity or From, or in the Request-URI or To",
    identity_verified: "initial INVITEs whose Identity verified (marked verstat=TN-Validation-Passed)",
    identity_failed: "initial INVITEs whose Identity failed (marked TN-Validation-Failed, or answered 403/436/437/438 with policy = reject)",
    identity_replayed: "of the failed, tokens already used for another call within their freshness window",
    identity_missing: "initial INVITEs without Identity answered 428 (require = true)",
    identity_fetches: "STIR/SHAKEN certificate fetches asked (one per URL however many INVITEs wait for it)",
    identity_waited: "initial INVITEs that waited for their signer's certificate",
    too_many_hops: "requests answered 483",
    unroutable: "requests with no route (404)",
    dispatched: "new requests a dispatcher sent to its nodes (by a hash of the AOR or Call-ID)",
    relay_refused: "requests refused 403 \"Relay Forbidden\": unauthenticated, to neither a registered contact nor a configured route, or aimed at this server's management ports",
    stray_responses: "responses matching no transaction, dropped",
    branch_timeouts: "client transactions that timed out",
    transport_errors: "requests a connection could not deliver (refused, failed handshake): their branch fails with 503 (430 or 480 for a flow)",
    flows_gone: "requests for a phone reached over a flow (its registering connection, RFC 5626) that is gone: answered 430 or 480 at once",
    flow_routed: "in-dialog requests sent over the flow a token in our Route named (a phone behind a NAT)",
    nat_bindings: "registrations of phones reached where their REGISTER came from (behind a NAT, or over their connection)",
    nat_pings: "keep-alive pings sent to UDP bindings behind a NAT",
    nat_ping_drops: "bindings dropped because their keep-alive pings went unanswered for [nat] ping_timeout_ms",
    handoffs: "datagrams passed to the worker owning their transaction",
    overload_rejected: "requests answered 503 because the transaction table was full",
    overload_shed: "new requests answered 503 by local admission control (the worker over [overload] target)",
    overload_throttled: "new requests answered 503 here because the next hop's RFC 7339/7415 feedback refused them",
    dns_lookups: "names asked of DNS (RFC 3263) because this worker had no answer for them",
    dns_cache_hits: "next hops located from this worker's copy of a DNS answer",
    dns_waited: "requests that waited for a DNS answer",
    failovers: "branches sent to the next destination after theirs failed (RFC 3263 §4.3)",
    targets_held_down: "destinations held down after failing (transport error, timeout, 503)",
    held_down_skipped: "destinations skipped because they were held down",
    probes: "OPTIONS probes sent to the destinations of configured routes",
    probe_failures: "probes unanswered (or answered 503): their destination is marked down",
    send_errors: "datagrams the kernel refused to send",
    connections_accepted: "TCP, TLS and WebSocket connections accepted",
    connections_opened: "TCP and TLS connections opened to a next hop",
    connections_refused: "connections refused because max_connections were open",
    connection_errors: "connections that failed (connect, reset, write)",
    idle_closed: "connections closed after idle_timeout_s without traffic",
    message_timeouts: "connections closed for holding a message or handshake open too long",
    send_stalls: "connections closed for not reading what was sent to them (nothing taken for message_timeout_ms, or too much queued)",
    framing_errors: "connections closed for bytes that are not SIP framing",
    tls_handshakes_full: "TLS handshakes completed in full (both sides)",
    tls_handshakes_resumed: "TLS handshakes resumed from an earlier session",
    tls_handshakes_full_accepted: "of the full TLS handshakes, those on connections accepted (this server the TLS server)",
    tls_handshakes_full_opened: "of the full TLS handshakes, those on connections opened (this server the TLS client)",
    tls_handshakes_resumed_accepted: "of the resumed TLS handshakes, those on connections accepted",
    tls_handshakes_resumed_opened: "of the resumed TLS handshakes, those on connections opened",
    tls_client_certificates: "of the TLS handshakes accepted, those whose client presented a certificate (mutual TLS)",
    tls_failures: "TLS handshakes or records that failed",
    websocket_upgrades: "WebSocket upgrades accepted (RFC 7118: ws: and wss: connections that came up)",
    websocket_refused: "WebSocket upgrades refused (no sip subprotocol, a foreign Origin or Host, not an upgrade): answered 4xx and closed",
    websocket_closed_abruptly: "WebSocket connections that ended without a Close frame (a tab closed, a reset)",
    websocket_pings: "WebSocket Pings sent to quiet connections (keep-alive)",
    stream_transmit_failures: "messages for a connection that closed and could not be reopened",
    digest_checks: "requests the digest gate examined (challenged, or their credentials checked)",
    proxychain_checks: "requests the Proxychain gate examined (challenged, or their chain value checked)",
    credential_fetches: "user-database queries (digest without the credential cache) and chains asked of the Proxychain authority",
    auth_passed: "requests authenticated (digest or Proxychain)",
    auth_challenged: "first challenges (401/407) to requests without credentials",
    auth_failed: "wrong passwords and unknown users (challenged again)",
    auth_stale: "right credentials on an expired or unknown nonce (stale=true)",
    auth_replays: "nonce counts or chain values used twice (challenged again)",
    auth_races: "Proxychain answers to a chain another call of the user spent (challenged again)",
    auth_identity_mismatches: "credentials of one user for a request from another (403)",
    auth_throttled: "requests refused for too many failed attempts (403)",
    auth_malformed: "credentials that could not be parsed (400)",
    auth_unavailable: "requests answered 503 because the user database or authority was not available",
    auth_waited: "requests that waited for a Proxychain chain from the authority",
    flood_refused: "requests refused (dropped, or answered 503/403) because their source was over the [flood] rate",
    flood_bans: "sources banned for going over the [flood] rate",
    stun_answered: "STUN Binding requests answered on a UDP SIP port (RFC 5626 keep-alives)",
    stun_dropped: "STUN-shaped datagrams on a UDP SIP port that were not a valid Binding request, dropped",
}

/// The methods requests are counted by, in [`sip_core::message::Method`]'s order (extension
/// methods are "other").
pub const METHODS: [&str; 15] = [
    "INVITE",
    "ACK",
    "BYE",
    "CANCEL",
    "REGISTER",
    "OPTIONS",
    "INFO",
    "UPDATE",
    "PRACK",
    "SUBSCRIBE",
    "NOTIFY",
    "REFER",
    "MESSAGE",
    "PUBLISH",
    "other",
];

/// The upper bounds of the latency histograms' buckets, in microseconds; Prometheus reads
/// them as seconds. From 0.1 ms (a proxy on one host answers in well under a millisecond) to
/// 30 s (an INVITE's timer B).
pub(crate) const LATENCY_BUCKETS_US: [u64; 18] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 20_000_000, 30_000_000,
];

/// A latency histogram a worker writes alone: a count per bucket (not cumulative; the scrape
/// adds them up, and their total is the count) and the sum.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Per bucket of `LATENCY_BUCKETS_US`, and one past the last.
    pub buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    pub(crate) sum_us: AtomicU64,
}

impl Histogram {
    pub(crate) fn observe_us(&self, us: u64) {
        let i = LATENCY_BUCKETS_US.partition_point(|&b| b < us);
        inc(&self.buckets[i]);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }
}

/// What `/metrics` reports beyond the plain counters, kept per worker like them: written
/// with relaxed atomics by the worker alone, read by the scrape.
#[derive(Debug, Default)]
pub struct Traffic {
    /// Requests received, by method ([`METHODS`]).
    pub requests: [AtomicU64; METHODS.len()],
    /// Responses received, by the method of their CSeq and their class (1xx to 6xx).
    pub responses: [[AtomicU64; 6]; METHODS.len()],
    /// Responses made here, by class.
    pub(crate) local_responses: [AtomicU64; 6],
    /// INVITEs that got a 2xx through this proxy (first 2xx of each), and BYEs that did: the
    /// dialogs set up and ended through it.
    pub(crate) dialogs_established: AtomicU64,
    pub(crate) dialogs_ended: AtomicU64,
    /// Proxied INVITEs: time to the first response from downstream other than 100, and to
    /// the final response sent upstream.
    pub(crate) invite_first_response: Histogram,
    pub(crate) invite_final_response: Histogram,
    /// Gauges, refreshed by the worker every `[overload] interval_ms`: transactions in
    /// progress and finished ones waiting out their timers, open connections, registered
    /// contacts (the same in every worker's replica), the load (busy fraction against the CPU
    /// the worker may use) in millionths.
    pub transactions: AtomicU64,
    pub(crate) transactions_lingering: AtomicU64,
    pub(crate) connections_open: AtomicU64,
    /// Contacts registered, as this worker's replica of the location service holds them.
    pub bindings: AtomicU64,
    pub(crate) busy_ppm: AtomicU64,
    /// Overload control's estimate of the new requests per second the worker can take at
    /// its target load (0 until measured).
    pub(crate) capacity: AtomicU64,
    /// What a refusal costs as a share of an admitted request, as overload control's cost
    /// model reads it, in millionths (0 until it has read it).
    pub(crate) refusal_cost_ppm: AtomicU64,
    /// Sources this worker's flood limits refuse now.
    pub(crate) flood_banned: AtomicU64,
}

impl Traffic {
    /// Counts a response received.
    pub fn response(&self, method: sip_core::message::Method, code: u16) {
        if let Some(class) = class_index(code) {
            inc(&self.responses[method as usize][class]);
        }
    }

    /// Counts a response made here.
    pub(crate) fn local_response(&self, code: u16) {
        if let Some(class) = class_index(code) {
            inc(&self.local_responses[class]);
        }
    }
}

/// 0 for 1xx … 5 for 6xx.
fn class_index(code: u16) -> Option<usize> {
    matches!(code, 100..=699).then(|| usize::from(code / 100 - 1))
}

/// Adds one to a counter.
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n` to a counter.
pub fn add(c: &AtomicU64, n: usize) {
    if n > 0 {
        c.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Sums several workers' counters.
pub fn total(all: &[std::sync::Arc<Stats>]) -> Vec<(&'static str, u64)> {
    let mut sum = Stats::default().snapshot();
    for s in all {
        for (acc, (_, v)) in sum.iter_mut().zip(s.snapshot()) {
            acc.1 += v;
        }
    }
    sum
}

/// Rate-limits log lines from the network path: at most `per_second` a second, then a count
/// of what was suppressed.
#[derive(Debug)]
pub(crate) struct LogLimiter {
    window_start: u64,
    count: u32,
    suppressed: u32,
    per_second: u32,
}

impl LogLimiter {
    pub(crate) fn new(per_second: u32) -> Self {
        LogLimiter {
            window_start: 0,
            count: 0,
            suppressed: 0,
            per_second,
        }
    }

    /// True if a line may be logged at `now_ms`.
    pub(crate) fn allow(&mut self, now_ms: u64) -> bool {
        if now_ms >= self.window_start + 1_000 {
            if self.suppressed > 0 {
                tracing::warn!("{} similar log lines suppressed", self.suppressed);
            }
            self.window_start = now_ms;
            self.count = 0;
            self.suppressed = 0;
        }
        if self.count < self.per_second {
            self.count += 1;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn methods_are_named_in_the_parsers_order_and_latencies_land_in_their_bucket() {
        use sip_core::message::Method;
        for name in &METHODS[..14] {
            assert_eq!(METHODS[Method::from_bytes(name.as_bytes()) as usize], *name);
        }
        assert_eq!(METHODS[Method::from_bytes(b"FOO") as usize], "other");
        let h = Histogram::default();
        for us in [0, 100, 101, 30_000_000, 30_000_001] {
            h.observe_us(us);
        }
        let counts: Vec<u64> = h
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        assert_eq!(
            counts,
            [2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
        );
        assert_eq!(h.sum_us.load(Ordering::Relaxed), 60_000_202);
    }

    use super::*;

    #[test]
    fn limiter_allows_a_burst_per_second() {
        let mut l = LogLimiter::new(3);
        let allowed = (0..10).filter(|_| l.allow(5)).count();
        assert_eq!(allowed, 3);
        assert!(l.allow(1_005));
    }
}
