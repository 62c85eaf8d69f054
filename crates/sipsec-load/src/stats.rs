//! What a load run counts: attempts, outcomes with their reasons, retransmissions and the
//! latency distribution, kept twice — for the whole run and for the current progress window
//! — so the live line and the final summary come from the same numbers.

use hdrhistogram::Histogram;
use std::collections::BTreeMap;

/// Outcomes over some span of time.
#[derive(Clone)]
pub struct Tally {
    /// Operations started.
    pub attempted: u64,
    /// Operations that got the response that counts.
    pub succeeded: u64,
    /// Operations that ended any other way.
    pub failed: u64,
    /// The failed operations counted by the reason their operation ended with.
    pub failures_by_reason: BTreeMap<String, u64>,
    /// Messages sent again: requests and responses the timers retransmitted (the UAS's 2xx
    /// among them), and the ACKs and responses repeated for a retransmission that arrived.
    pub retransmissions: u64,
    /// Microseconds from the first request to the response that counts (INVITE→200,
    /// REGISTER→200, INVITE→302, OPTIONS→200).
    pub(crate) latency_us: Histogram<u64>,
    /// Microseconds from a call's first request to the first response to it, provisional or
    /// final (a stateful proxy's 100 Trying): how long before the server answered at all.
    pub(crate) first_response_us: Histogram<u64>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            attempted: 0,
            succeeded: 0,
            failed: 0,
            failures_by_reason: BTreeMap::new(),
            retransmissions: 0,
            latency_us: histogram(),
            first_response_us: histogram(),
        }
    }
}

/// Up to an hour at three significant digits: every latency a SIP timer allows.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

/// A percentile of a histogram of µs, in milliseconds (0 when nothing was recorded).
pub(crate) fn quantile_ms(h: &Histogram<u64>, quantile: f64) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    h.value_at_quantile(quantile) as f64 / 1000.0
}

impl Tally {
    /// Latency percentile in milliseconds (0 when nothing was recorded).
    pub fn latency_ms(&self, quantile: f64) -> f64 {
        quantile_ms(&self.latency_us, quantile)
    }

    /// The latency distribution at the quantiles a CDF plot needs, as `[quantile, ms]`.
    pub fn latency_cdf_ms(&self) -> Vec<[f64; 2]> {
        if self.latency_us.is_empty() {
            return Vec::new();
        }
        const QUANTILES: [f64; 15] = [
            0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0,
        ];
        QUANTILES.iter().map(|&q| [q, self.latency_ms(q)]).collect()
    }

    /// Adds another tally's counts (used to merge several UAs or trials).
    pub(crate) fn merge(&mut self, other: &Tally) {
        self.attempted += other.attempted;
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        for (k, v) in &other.failures_by_reason {
            *self.failures_by_reason.entry(k.clone()).or_default() += v;
        }
        self.retransmissions += other.retransmissions;
        let _ = self.latency_us.add(&other.latency_us);
        let _ = self.first_response_us.add(&other.first_response_us);
    }
}

/// The run total and the window since the last progress line.
#[derive(Default)]
pub struct RunTally {
    /// Since the run began.
    pub total: Tally,
    /// Since the last progress line.
    pub window: Tally,
    /// Calls the UAS side answered and saw end.
    pub uas_answered: u64,
    /// Calls the UAS side saw end with a BYE it knew.
    pub uas_completed: u64,
    /// Messages that matched nothing or could not be parsed.
    pub stray: u64,
    /// Dialogs a forked INVITE set up beyond the first, ACKed and ended with BYE.
    pub(crate) extra_dialogs: u64,
    /// The callee's own registrations (`--register`).
    pub registrations: RegistrationTally,
}

/// What the callee's registrations did (`--register`): kept apart from the calls, which they
/// are not.
#[derive(Clone, Default)]
pub struct RegistrationTally {
    /// REGISTERs that bound a Contact (first registrations, refreshes, registrations over a
    /// new flow) as `succeeded`, those refused or unanswered as `failed` by reason, and the
    /// latency of the bound ones from the first request to the 2xx, challenges included.
    pub tally: Tally,
    /// Of the successes, the refreshes of a live binding.
    pub refreshes: u64,
    /// Bindings removed at the end of the run (Expires 0, answered 2xx).
    pub unregistered: u64,
    /// Unregistrations refused or unanswered, each with its reason.
    pub unregister_failures: Vec<String>,
    /// Keep-alives sent (CRLF pings, STUN Binding requests).
    pub keepalives_sent: u64,
    /// Keep-alives answered (a CRLF pong, a STUN response).
    pub keepalives_answered: u64,
    /// Keep-alives that had no answer in time.
    pub keepalives_unanswered: u64,
    /// Working flows that failed (connection closed, keep-alive unanswered), by reason.
    pub flow_failures: BTreeMap<String, u64>,
    /// How many working flows failed in all.
    pub flows_failed: u64,
    /// New flows opened for a registration whose flow failed or was refused (RFC 5626 §4.5).
    pub flows_reopened: u64,
}

impl RegistrationTally {
    /// Adds another run's counts.
    pub(crate) fn merge(&mut self, other: &RegistrationTally) {
        self.tally.merge(&other.tally);
        self.refreshes += other.refreshes;
        self.unregistered += other.unregistered;
        self.unregister_failures
            .extend(other.unregister_failures.iter().cloned());
        self.keepalives_sent += other.keepalives_sent;
        self.keepalives_answered += other.keepalives_answered;
        self.keepalives_unanswered += other.keepalives_unanswered;
        for (k, v) in &other.flow_failures {
            *self.flow_failures.entry(k.clone()).or_default() += v;
        }
        self.flows_failed += other.flows_failed;
        self.flows_reopened += other.flows_reopened;
    }
}

impl RunTally {
    /// Counts an operation started.
    pub fn attempt(&mut self) {
        self.total.attempted += 1;
        self.window.attempted += 1;
    }

    /// Records one operation's latency in µs (at least 1).
    pub fn latency(&mut self, us: u64) {
        let us = us.max(1);
        let _ = self.total.latency_us.record(us);
        let _ = self.window.latency_us.record(us);
    }

    /// Records how long a call waited for the first response to its first request, in µs
    /// (at least 1).
    pub fn first_response(&mut self, us: u64) {
        let us = us.max(1);
        let _ = self.total.first_response_us.record(us);
        let _ = self.window.first_response_us.record(us);
    }

    /// Counts an operation that succeeded.
    pub fn success(&mut self) {
        self.total.succeeded += 1;
        self.window.succeeded += 1;
    }

    /// Counts an operation that failed, under `reason`.
    pub fn failure(&mut self, reason: &str) {
        for t in [&mut self.total, &mut self.window] {
            t.failed += 1;
            match t.failures_by_reason.get_mut(reason) {
                Some(n) => *n += 1,
                None => {
                    t.failures_by_reason.insert(reason.to_string(), 1);
                }
            }
        }
    }

    /// Counts `n` messages sent again.
    pub fn retransmissions(&mut self, n: u64) {
        self.total.retransmissions += n;
        self.window.retransmissions += n;
    }

    /// Adds another run's counts (the window is left alone): what several trials did in all.
    pub(crate) fn merge(&mut self, other: &RunTally) {
        self.total.merge(&other.total);
        self.uas_answered += other.uas_answered;
        self.uas_completed += other.uas_completed;
        self.stray += other.stray;
        self.extra_dialogs += other.extra_dialogs;
        self.registrations.merge(&other.registrations);
    }

    /// Hands back the window and starts a new one.
    pub(crate) fn take_window(&mut self) -> Tally {
        std::mem::take(&mut self.window)
    }
}
