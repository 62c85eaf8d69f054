//! What a person sees: one progress line per second while a run goes (rate, in-flight,
//! successes, failures, retransmissions, latency) and the summary at the end, as text and as
//! the JSON document `--json` writes.

use super::driver::LinkCounters;
use super::stats::Tally;
use super::ua::Ua;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write as _;

/// Prints the live line: once a second, what the last second did and what the run has done
/// so far, each labelled as such, under a legend printed once.
pub struct Progress {
    enabled: bool,
    /// Whether this process starts operations (a pure UAS only answers).
    originate: bool,
    /// Print `LEGEND` before the first line.
    pub legend: bool,
    interval_s: f64,
    next_s: f64,
    /// Prefixed to each line (e.g. the trial rate during `--find-peak`).
    pub label: String,
}

/// What the progress line's columns mean, printed once before the first.
pub(crate) const LEGEND: &str = "progress, a line a second — \
'last 1 s': operations started per second and the latency of those answered in that second; \
'now': operations in flight; 'since start': totals so far, of the trial or step in a search or \
ramp (ok, failed, retransmissions, calls the UAS answered)";

impl Progress {
    /// A progress line that prints only when `enabled` (not `--quiet`), with the caller's
    /// columns when this process `originate`s operations, else the UAS's.
    pub fn new(enabled: bool, originate: bool) -> Progress {
        Progress {
            enabled,
            originate,
            legend: false,
            interval_s: 1.0,
            next_s: 1.0,
            label: String::new(),
        }
    }

    pub(crate) fn next_due_s(&self) -> f64 {
        self.next_s
    }

    /// Prints a line when one is due, and starts a new window.
    pub(crate) fn maybe_print(&mut self, t: f64, ua: &mut Ua) {
        if t < self.next_s {
            return;
        }
        let window = ua.stats.take_window();
        let span = self.interval_s + (t - self.next_s);
        self.next_s = t + self.interval_s;
        if !self.enabled {
            return;
        }
        let mut err = std::io::stderr().lock();
        if std::mem::take(&mut self.legend) {
            let _ = writeln!(err, "{LEGEND}");
        }
        let total = &ua.stats.total;
        let mut line = format!("{}[{t:6.1}s]", self.label);
        if self.originate {
            line.push_str(&format!(
                " last 1 s: started {:>7.0}/s, p50 {:>7.2} ms, p99 {:>7.2} ms | now: in-flight \
                 {:>6} | since start: ok {:>8}, failed {:>6}, retrans {:>6}",
                window.attempted as f64 / span,
                window.latency_ms(0.5),
                window.latency_ms(0.99),
                ua.in_flight(),
                total.succeeded,
                total.failed,
                total.retransmissions,
            ));
            if ua.stats.uas_answered > 0 {
                line.push_str(&format!(", uas answered {}", ua.stats.uas_answered));
            }
        } else {
            line.push_str(&format!(
                " since start: uas answered {:>8}, ended by BYE {:>8}, failed {:>6}",
                ua.stats.uas_answered, ua.stats.uas_completed, total.failed
            ));
        }
        let _ = writeln!(err, "{line}");
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    /// The median: half the answered operations took at most this long.
    pub p50: f64,
    /// 90% of the answered operations took at most this long.
    pub p90: f64,
    /// 99% of the answered operations took at most this long.
    pub p99: f64,
    /// The slowest answered operation (0 when none was).
    pub max: f64,
}

/// Latency up to which an operation counts as on time for `--find-peak`: T1, the point
/// where a UDP request would be retransmitted. Without it, an overloaded open-loop run still
/// "succeeds" — late, by retransmission — and the peak would be meaningless.
pub(crate) const ON_TIME_US: u64 = 500_000;

/// One rate tried by `--find-peak` or one step of `--ramp`, measured on its own.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// The rate this step was scheduled at, in operations started per second.
    pub rate: f64,
    /// Operations the step started.
    pub attempted: u64,
    /// Operations that got the response that counts, late ones included.
    pub succeeded: u64,
    /// Operations that ended any other way (see `failures_by_reason`).
    pub failed: u64,
    /// This step's failures (the summary's `failures_by_reason` adds up every step's).
    pub failures_by_reason: BTreeMap<String, u64>,
    pub(crate) success_ratio: f64,
    /// Share of attempts that succeeded with their latency under T1 (500 ms), i.e. without
    /// needing a retransmission: what `--find-peak` requires to be ≥ 99%.
    pub(crate) on_time_ratio: f64,
    /// Operations started per second over the step's schedule (those refused here by
    /// overload control included).
    pub offered_per_s: f64,
    /// Operations per second that succeeded within 500 ms, over the same span.
    pub goodput_per_s: f64,
    /// Latency of the step's answered operations, first request to the response that counts.
    pub latency_ms: Latency,
    /// The step's calls' wait for the first response to their first request (see
    /// [`Summary::first_response_ms`]).
    pub first_response_ms: Latency,
    /// The load generator's own CPU over the step (its one thread: caller and callee), as a
    /// share of its core: near 1 where the load, not what it offers to, set the pace.
    pub load_cpu_share: f64,
}

/// The end-of-run report (`--json` writes it).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// What each operation was: `call`, `register`, `redirect` or `options`.
    pub scenario: String,
    /// The side this run played: `uac`, `uas` or `both`.
    pub role: String,
    /// The transport used: `udp`, `tcp` or `tls`.
    pub transport: String,
    /// Offered rate (the starting rate of a ramp).
    pub rate: f64,
    /// Seconds from the first operation's start to the end of the last one (or to the stop).
    pub elapsed_s: f64,
    /// Operations started (every trial or step together in a search or a ramp).
    pub attempted: u64,
    /// Operations that got the response that counts (INVITE→200, REGISTER→200, INVITE→302,
    /// OPTIONS→200), late ones included.
    pub succeeded: u64,
    /// Of those, the ones that succeeded within T1 (500 ms): goodput, as seed 004 counts it.
    pub on_time: u64,
    /// Operations that ended any other way (`failures_by_reason` says how).
    pub failed: u64,
    /// The failed operations counted by the reason each ended with.
    pub failures_by_reason: BTreeMap<String, u64>,
    /// Messages sent again: requests and responses the timers retransmitted, and the ACKs and
    /// responses repeated for a retransmission that arrived.
    pub retransmissions: u64,
    /// Successful operations per second over `elapsed_s`.
    pub throughput_per_s: f64,
    /// Latency of the answered operations, first request to the response that counts.
    pub latency_ms: Latency,
    /// Calls' wait from their first request to the first response to it, provisional or
    /// final (a stateful proxy's 100 Trying), of every call that had one — refused and
    /// challenged ones too, so not quite the population of `latency_ms`: the part of the
    /// latency before the server answered at all — the caller's queue, the network and the
    /// server's own — without the callee's. Where no 100 Trying comes (a stateless proxy, a
    /// redirect server) it is the whole wait for the answer; zeros for other operations.
    pub first_response_ms: Latency,
    /// The latency distribution as `[quantile, ms]` points, for CDF plots.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub latency_cdf_ms: Vec<[f64; 2]>,
    /// Calls the UAS side answered and saw end.
    pub uas_answered: u64,
    /// Of the UAS side's calls, those that ended with a BYE it knew.
    pub uas_completed: u64,
    /// Messages received that matched no transaction or dialog, or could not be parsed.
    pub stray_messages: u64,
    /// Dialogs beyond the first that a forked call set up (each ACKed and ended with BYE).
    pub(crate) extra_dialogs: u64,
    /// Transmissions the sockets could neither send nor queue.
    pub send_failures: u64,
    /// Whether SIGINT or SIGTERM ended the run early (nothing started after it).
    pub interrupted: bool,
    /// Connections and TLS handshakes (stream transports only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<LinkCounters>,
    /// The callee's own registrations (`--register` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registrations: Option<Registrations>,
    /// `--find-peak`: the highest rate found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_per_s: Option<f64>,
    /// `--ramp` and `--find-peak`: each rate's own figures.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Step>,
}

/// What a registering callee's registrations did (`--register`), in the summary.
#[derive(Debug, Clone, Serialize)]
pub struct Registrations {
    /// REGISTERs that bound a Contact: first registrations, refreshes, and registrations over
    /// a new flow.
    pub made: u64,
    /// Of those, refreshes of a live binding (at half the granted time).
    pub refreshes: u64,
    /// REGISTERs refused or unanswered.
    pub refused: u64,
    /// The refused ones by reason.
    pub refused_by_reason: BTreeMap<String, u64>,
    /// From the first REGISTER to its 2xx, challenge included.
    pub latency_ms: Latency,
    /// Bindings removed at the end (Expires 0 answered with a 2xx).
    pub unregistered: u64,
    /// Unregistrations refused or unanswered, by reason.
    pub unregister_failures: BTreeMap<String, u64>,
    /// Keep-alives sent (`--outbound`): CRLF pings, STUN Binding requests.
    pub keepalives_sent: u64,
    /// Keep-alives answered.
    pub keepalives_answered: u64,
    /// Keep-alives with no answer in time.
    pub keepalives_unanswered: u64,
    /// Working flows that failed, by reason (connection closed, keep-alive unanswered).
    pub flows_failed: BTreeMap<String, u64>,
    /// New flows opened for a registration whose flow failed or was refused.
    pub flows_reopened: u64,
}

impl Registrations {
    /// The summary of what `r` counted.
    pub fn of(r: &crate::stats::RegistrationTally) -> Registrations {
        let mut unregister_failures = BTreeMap::new();
        for why in &r.unregister_failures {
            *unregister_failures.entry(why.clone()).or_default() += 1;
        }
        Registrations {
            made: r.tally.succeeded,
            refreshes: r.refreshes,
            refused: r.tally.failed,
            refused_by_reason: r.tally.failures_by_reason.clone(),
            latency_ms: Latency::of(&r.tally),
            unregistered: r.unregistered,
            unregister_failures,
            keepalives_sent: r.keepalives_sent,
            keepalives_answered: r.keepalives_answered,
            keepalives_unanswered: r.keepalives_unanswered,
            flows_failed: r.flow_failures.clone(),
            flows_reopened: r.flows_reopened,
        }
    }

    /// The summary's lines for them.
    fn text(&self) -> String {
        let mut s = format!(
            "registrations: {} made ({} refreshes), {} refused, {} unregistered; latency p50 \
             {:.2} ms, p99 {:.2} ms\n",
            self.made,
            self.refreshes,
            self.refused,
            self.unregistered,
            self.latency_ms.p50,
            self.latency_ms.p99
        );
        for (reason, n) in &self.refused_by_reason {
            s.push_str(&format!("  refused: {n} × {reason}\n"));
        }
        for (reason, n) in &self.unregister_failures {
            s.push_str(&format!("  not unregistered: {n} × {reason}\n"));
        }
        if self.keepalives_sent > 0 || !self.flows_failed.is_empty() {
            s.push_str(&format!(
                "keep-alives: {} sent, {} answered, {} unanswered; {} new flows\n",
                self.keepalives_sent,
                self.keepalives_answered,
                self.keepalives_unanswered,
                self.flows_reopened
            ));
        }
        for (reason, n) in &self.flows_failed {
            s.push_str(&format!("  flow failed: {n} × {reason}\n"));
        }
        s
    }
}

impl Latency {
    /// The percentiles of the latencies `t` recorded, in ms.
    pub fn of(t: &Tally) -> Latency {
        Latency::from_us(&t.latency_us)
    }

    /// The percentiles of the first responses `t` recorded, in ms.
    pub fn first_response(t: &Tally) -> Latency {
        Latency::from_us(&t.first_response_us)
    }

    /// The percentiles and the largest of a histogram of µs, in ms (all 0 when it is empty).
    fn from_us(h: &hdrhistogram::Histogram<u64>) -> Latency {
        Latency {
            p50: crate::stats::quantile_ms(h, 0.5),
            p90: crate::stats::quantile_ms(h, 0.9),
            p99: crate::stats::quantile_ms(h, 0.99),
            max: h.max() as f64 / 1000.0,
        }
    }
}

/// Operations of `t` that succeeded within T1.
pub fn on_time(t: &Tally) -> u64 {
    t.latency_us.count_between(0, ON_TIME_US).min(t.succeeded)
}

impl Step {
    /// The step at `rate` whose operations `t` counted, started over `schedule_s` seconds.
    pub fn of(rate: f64, t: &Tally, schedule_s: f64) -> Step {
        let ratio = |n: u64| {
            if t.attempted == 0 {
                0.0
            } else {
                n as f64 / t.attempted as f64
            }
        };
        let per_s = |n: u64| {
            if schedule_s > 0.0 {
                n as f64 / schedule_s
            } else {
                0.0
            }
        };
        let on_time = on_time(t);
        Step {
            rate,
            attempted: t.attempted,
            succeeded: t.succeeded,
            failed: t.failed,
            failures_by_reason: t.failures_by_reason.clone(),
            success_ratio: ratio(t.succeeded),
            on_time_ratio: ratio(on_time),
            offered_per_s: per_s(t.attempted),
            goodput_per_s: per_s(on_time),
            latency_ms: Latency::of(t),
            first_response_ms: Latency::first_response(t),
            load_cpu_share: 0.0,
        }
    }

    /// One line for the step: offered and goodput, shares, and its failures by reason.
    pub fn outcome(&self) -> String {
        let mut s = format!(
            "{:.0}/s → offered {:.1}/s, goodput {:.1}/s; {:.2}% succeeded, {:.2}% within 500 ms",
            self.rate,
            self.offered_per_s,
            self.goodput_per_s,
            self.success_ratio * 100.0,
            self.on_time_ratio * 100.0
        );
        if !self.failures_by_reason.is_empty() {
            s.push_str("; failed: ");
            s.push_str(&reasons(&self.failures_by_reason));
        }
        s
    }
}

/// `n × reason, …`, in the map's order.
fn reasons(by_reason: &BTreeMap<String, u64>) -> String {
    by_reason
        .iter()
        .map(|(reason, n)| format!("{n} × {reason}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Summary {
    /// The text printed at the end of a run: for a pure UAS, what it answered; for a caller,
    /// the run's outcome — a search or a ramp first lists its trials, one line each, then says
    /// that the totals below are all of them together.
    pub fn text(&self) -> String {
        let what = format!("{} ({}, role {})", self.scenario, self.transport, self.role);
        let mut s = String::new();
        if self.role == "uas" {
            s.push_str(&format!(
                "{what}: {} calls answered, {} ended by BYE, {} failed in {:.1} s\n",
                self.uas_answered, self.uas_completed, self.failed, self.elapsed_s
            ));
            self.push_failures(&mut s);
        } else {
            if self.steps.is_empty() {
                s.push_str(&format!("{what} at {}/s offered: ", self.rate));
            } else {
                let (kind, unit) = if self.peak_per_s.is_some() {
                    ("peak search", "trial")
                } else {
                    ("ramp", "step")
                };
                let n = self.steps.len();
                s.push_str(&format!(
                    "{what}: {kind}, {n} {unit}{}, each measured on its own\n",
                    if n == 1 { "" } else { "s" }
                ));
                s.push_str(&format!(
                    "  {unit:>5} {:>8} {:>10} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8}  failures\n",
                    "rate/s",
                    "offered/s",
                    "goodput/s",
                    "attempted",
                    "succeeded",
                    "on time",
                    "p50 ms",
                    "p99 ms"
                ));
                for (i, st) in self.steps.iter().enumerate() {
                    s.push_str(&format!(
                        "  {:>5} {:>8.0} {:>10.1} {:>10.1} {:>9} {:>9} {:>7.2}% {:>8.2} {:>8.2}  {}\n",
                        i + 1,
                        st.rate,
                        st.offered_per_s,
                        st.goodput_per_s,
                        st.attempted,
                        st.succeeded,
                        st.on_time_ratio * 100.0,
                        st.latency_ms.p50,
                        st.latency_ms.p99,
                        if st.failures_by_reason.is_empty() {
                            "none".to_string()
                        } else {
                            reasons(&st.failures_by_reason)
                        }
                    ));
                }
                s.push_str(&format!("all {n} {unit}s together: "));
            }
            s.push_str(&format!(
                "{} attempted, {} succeeded, {} failed in {:.1} s; {:.1} succeeded/s; {} \
                 retransmissions\n\
                 latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n",
                self.attempted,
                self.succeeded,
                self.failed,
                self.elapsed_s,
                self.throughput_per_s,
                self.retransmissions,
                self.latency_ms.p50,
                self.latency_ms.p90,
                self.latency_ms.p99,
                self.latency_ms.max,
            ));
            if self.first_response_ms.max > 0.0 {
                let f = &self.first_response_ms;
                s.push_str(&format!(
                    "first response (the wait before the server answered at all) p50 {:.2} ms, \
                     p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n",
                    f.p50, f.p90, f.p99, f.max
                ));
            }
            self.push_failures(&mut s);
            if self.uas_answered > 0 {
                s.push_str(&format!(
                    "UAS: {} calls answered, {} ended by BYE\n",
                    self.uas_answered, self.uas_completed
                ));
            }
        }
        if let Some(r) = &self.registrations {
            s.push_str(&r.text());
        }
        if self.stray_messages > 0 || self.send_failures > 0 {
            s.push_str(&format!(
                "{} stray messages, {} sends refused by the kernel\n",
                self.stray_messages, self.send_failures
            ));
        }
        if let Some(c) = &self.connections {
            s.push_str(&format!(
                "connections: {} opened, {} accepted, {} errors, {} open at the end",
                c.connections_opened, c.connections_accepted, c.connection_errors, c.open
            ));
            if self.transport == "tls" {
                s.push_str(&format!(
                    "; TLS handshakes: {} full and {} resumed by the caller, {} accepted by the \
                     UAS, {} failed",
                    c.tls_full_handshakes,
                    c.tls_resumed_handshakes,
                    c.tls_accepted_handshakes,
                    c.tls_handshake_failures
                ));
            }
            s.push('\n');
        }
        if let Some(p) = self.peak_per_s {
            s.push_str(&format!(
                "peak: {p:.0}/s (highest rate where ≥ 99% succeeded within 500 ms)\n"
            ));
        }
        s
    }

    /// One line per failure reason.
    fn push_failures(&self, s: &mut String) {
        for (reason, n) in &self.failures_by_reason {
            s.push_str(&format!("  failed: {n} × {reason}\n"));
        }
    }
}
