//! What a person sees: one progress line per second while a run goes (rate, in-flight,
//! successes, failures, retransmissions, latency) and the summary at the end, as text and as
//! the JSON document `--json` writes.

use super::driver::LinkCounters;
use super::stats::Tally;
use super::ua::Ua;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write as _;

/// Prints the live line.
pub struct Progress {
    enabled: bool,
    interval_s: f64,
    next_s: f64,
    /// Prefixed to each line (e.g. the trial rate during `--find-peak`).
    pub label: String,
}

impl Progress {
    pub fn new(enabled: bool) -> Progress {
        Progress {
            enabled,
            interval_s: 1.0,
            next_s: 1.0,
            label: String::new(),
        }
    }

    pub fn next_due_s(&self) -> f64 {
        self.next_s
    }

    /// Prints a line when one is due, and starts a new window.
    pub fn maybe_print(&mut self, t: f64, ua: &mut Ua) {
        if t < self.next_s {
            return;
        }
        let window = ua.stats.take_window();
        let span = self.interval_s + (t - self.next_s);
        self.next_s = t + self.interval_s;
        if !self.enabled {
            return;
        }
        let line = format!(
            "{}[{t:6.1}s] started {:>7.0}/s | in-flight {:>6} | ok {:>8} | failed {:>6} | \
             retrans {:>6} | latency p50 {:.2} ms p99 {:.2} ms{}",
            self.label,
            window.attempted as f64 / span,
            ua.in_flight(),
            ua.stats.total.succeeded,
            ua.stats.total.failed,
            ua.stats.total.retransmissions,
            window.latency_ms(0.5),
            window.latency_ms(0.99),
            if ua.stats.uas_answered > 0 {
                format!(" | uas answered {}", ua.stats.uas_answered)
            } else {
                String::new()
            }
        );
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Latency up to which an operation counts as on time for `--find-peak`: T1, the point
/// where a UDP request would be retransmitted. Without it, an overloaded open-loop run still
/// "succeeds" — late, by retransmission — and the peak would be meaningless.
pub const ON_TIME_US: u64 = 500_000;

/// One rate tried by `--find-peak` or one step of `--ramp`.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub rate: f64,
    pub attempted: u64,
    pub succeeded: u64,
    pub success_ratio: f64,
    /// Share of attempts that succeeded with their latency under T1 (500 ms), i.e. without
    /// needing a retransmission: what `--find-peak` requires to be ≥ 99%.
    pub on_time_ratio: f64,
    /// `--ramp`: operations started per second (refused here by overload control included).
    pub offered_per_s: f64,
    /// `--ramp`: operations per second that succeeded within 500 ms.
    pub goodput_per_s: f64,
    pub latency_ms: Latency,
}

/// The end-of-run report (`--json` writes it).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub scenario: String,
    pub role: String,
    pub transport: String,
    /// Offered rate (the starting rate of a ramp).
    pub rate: f64,
    pub elapsed_s: f64,
    pub attempted: u64,
    pub succeeded: u64,
    /// Of those, the ones that succeeded within T1 (500 ms): goodput, as seed 004 counts it.
    pub on_time: u64,
    pub failed: u64,
    pub failures_by_reason: BTreeMap<String, u64>,
    pub retransmissions: u64,
    pub throughput_per_s: f64,
    pub latency_ms: Latency,
    /// The latency distribution as `[quantile, ms]` points, for CDF plots.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub latency_cdf_ms: Vec<[f64; 2]>,
    pub uas_answered: u64,
    pub uas_completed: u64,
    pub stray_messages: u64,
    /// Dialogs beyond the first that a forked call set up (each ACKed and ended with BYE).
    pub extra_dialogs: u64,
    pub send_failures: u64,
    pub interrupted: bool,
    /// Connections and TLS handshakes (stream transports only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<LinkCounters>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Step>,
}

impl Latency {
    pub fn of(t: &Tally) -> Latency {
        Latency {
            p50: t.latency_ms(0.5),
            p90: t.latency_ms(0.9),
            p99: t.latency_ms(0.99),
            max: t.latency_max_ms(),
        }
    }
}

/// Operations of `t` that succeeded within T1.
pub fn on_time(t: &Tally) -> u64 {
    t.latency_us.count_between(0, ON_TIME_US).min(t.succeeded)
}

impl Step {
    pub fn of(rate: f64, t: &Tally) -> Step {
        let ratio = |n: u64| {
            if t.attempted == 0 {
                0.0
            } else {
                n as f64 / t.attempted as f64
            }
        };
        let on_time = on_time(t);
        Step {
            rate,
            attempted: t.attempted,
            succeeded: t.succeeded,
            success_ratio: ratio(t.succeeded),
            on_time_ratio: ratio(on_time),
            offered_per_s: 0.0,
            goodput_per_s: 0.0,
            latency_ms: Latency::of(t),
        }
    }
}

impl Summary {
    /// The text printed at the end of a run.
    pub fn text(&self) -> String {
        let mut s = format!(
            "{} ({}, {}, role {}): {} attempted, {} succeeded, {} failed in {:.1} s; \
             {:.1} succeeded/s; {} retransmissions\n\
             latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n",
            self.scenario,
            self.transport,
            if self.rate > 0.0 {
                format!("{}/s offered", self.rate)
            } else {
                "answering".into()
            },
            self.role,
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
        );
        for (reason, n) in &self.failures_by_reason {
            s.push_str(&format!("  failed: {n} × {reason}\n"));
        }
        if self.uas_answered > 0 {
            s.push_str(&format!(
                "UAS: {} calls answered, {} ended by BYE\n",
                self.uas_answered, self.uas_completed
            ));
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
        for st in &self.steps {
            s.push_str(&format!(
                "  at {:>8.0}/s: {:>7}/{:<7} succeeded ({:.2}%, {:.2}% within 500 ms), p50 {:.2} ms, p99 {:.2} ms\n",
                st.rate,
                st.succeeded,
                st.attempted,
                st.success_ratio * 100.0,
                st.on_time_ratio * 100.0,
                st.latency_ms.p50,
                st.latency_ms.p99
            ));
        }
        if let Some(p) = self.peak_per_s {
            s.push_str(&format!(
                "peak: {p:.0}/s (highest rate where ≥ 99% succeeded within 500 ms)\n"
            ));
        }
        s
    }
}
