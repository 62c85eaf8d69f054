//! Peaks the server sets (`sipsec bench --peak-quota`, `--peak-source-addresses`): during the
//! peak search and the goodput curve the server is held to a share of a core, chosen so the
//! load generator's one core keeps several times the server's pace, and callers with a
//! connection per call come from many loopback addresses, so neither the load nor the
//! ephemeral ports of one address run out first; and what shows who saturated — the quota's
//! throttling and each side's CPU share over the search — kept with the peak.

use super::cpu::{self, CpuTime};
use super::quota::{Quota, QuotaStat};
use serde::{Deserialize, Serialize};
use sipsec_load::report::Summary;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Instant;

/// How many times the server's pace at its peak the load generator's core must be able to
/// keep: the quota is lowered until the load, at its measured CPU per operation, would use at
/// most a third of its core at the server's peak.
pub(crate) const LOAD_HEADROOM: f64 = 3.0;

/// Shares of a core are chosen on this grid, so a row's rounds agree on theirs.
const SHARE_STEP: f64 = 0.05;

/// The least share [`Quota`] can hold a server to (1 ms of its 10 ms period).
const LEAST_SHARE: f64 = 0.1;

/// The first of the callers' addresses during a peak search with several
/// (`--peak-source-addresses`): a block of 127.0.0.0/8 apart from the bench's own
/// addresses (server 127.0.0.1, caller 127.0.0.2, UAS 127.0.0.3).
pub(crate) const FIRST_SOURCE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 1, 1));

/// The share of a core to hold the server to during the peak search: at most `ceiling`, and
/// low enough that the load, at `load_us` of CPU per operation against the server's
/// `server_us` (both from the measured run), would use at most 1/[`LOAD_HEADROOM`] of its
/// core at the server's peak (`share × 10⁶ / server_us` operations per second). On a grid of
/// 0.05, at least 0.1.
pub(crate) fn share(ceiling: f64, server_us: f64, load_us: f64) -> f64 {
    let fits = if load_us > 0.0 && server_us > 0.0 {
        server_us / (LOAD_HEADROOM * load_us)
    } else {
        ceiling
    };
    let share = ceiling.min(fits);
    // Down to the grid (a hair of tolerance so 0.25 stays 0.25).
    ((share / SHARE_STEP + 1e-9).floor() * SHARE_STEP).max(LEAST_SHARE)
}

/// The least share of the search's quota periods in which the server must have used up its
/// quota for the peak to count as the quota's: on a shared machine the server can be held
/// back by others on its core before its quota binds (then it sheds at a peak its quota does
/// not explain, throttled in a few periods only).
pub(crate) const THROTTLED_MIN: f64 = 0.25;

/// The most of its core the load generator may have used over the search for the peak to
/// count as the server's: the bench leaves it 3 times the server's pace at the peak
/// ([`LOAD_HEADROOM`]), and the search spends part of its time below the peak.
pub(crate) const LOAD_SHARE_MAX: f64 = 0.5;

/// Whether a peak search was set by the server: its quota held it off in a good part of the
/// search, and the load generator kept its headroom.
pub(crate) fn server_set(throttled_periods: f64, load_cpu_share: f64) -> bool {
    throttled_periods >= THROTTLED_MIN && load_cpu_share < LOAD_SHARE_MAX
}

impl PeakHeld {
    /// Whether this search's peak was the server's ([`server_set`]).
    pub(crate) fn server_set(&self) -> bool {
        self.cpu_quota.is_some_and(|q| q > 0.0)
            && server_set(self.throttled_periods, self.load_cpu_share)
    }
}

/// How a peak was measured, and who saturated: kept in the bench report and the lab's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeakHeld {
    /// The share of one core the server was held to during the search (`None`: a whole
    /// core). The peak the model predicts is this share × 10⁶ over its µs per operation at
    /// saturation.
    pub cpu_quota: Option<f64>,
    /// Seconds the quota held the server off during the search.
    pub cpu_throttled_s: f64,
    /// Of the quota's periods in which the server had work during the search, the share in
    /// which it used up its quota (0 without a quota).
    pub throttled_periods: f64,
    /// Wall-clock seconds of the search, its pauses between trials included.
    pub search_s: f64,
    /// The server's CPU over the search, as a share of one core (at most `cpu_quota`).
    pub server_cpu_share: f64,
    /// The load generator's (caller and callee) CPU over the search, as a share of its core:
    /// well below 1 where the server, not the load, set the peak.
    pub load_cpu_share: f64,
    /// The most of its core the load generator used in any one trial of the search (its
    /// thread's CPU over the trial): below 1 where it never ran out.
    #[serde(default)]
    pub load_cpu_share_max: f64,
    /// The callers' source addresses during the search (1 but for connection-per-call
    /// callers given several).
    pub source_addresses: u32,
    /// The search's failed operations by reason, its trials together: the server's refusals
    /// (503) where it saturated, timeouts and calls left unfinished where connections could
    /// not be made or the load fell behind.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failures_by_reason: BTreeMap<String, u64>,
}

/// A peak search being watched: CPU and quota readings at its start.
pub(crate) struct Watch {
    began: Instant,
    server: CpuTime,
    load: CpuTime,
    quota: QuotaStat,
}

impl Watch {
    /// Starts watching the server's `pids` and this process (the load generator), and
    /// `quota` if the server is held to one.
    pub(crate) fn start(pids: &[u32], quota: Option<&Quota>) -> Watch {
        Watch {
            began: Instant::now(),
            server: cpu::cpu_of(pids),
            load: cpu::own_cpu(),
            quota: quota.map(Quota::stat).unwrap_or_default(),
        }
    }

    /// What the search did, from its start to now.
    pub(crate) fn end(
        self,
        pids: &[u32],
        quota: Option<(&Quota, f64)>,
        source_addresses: u32,
        search: &Summary,
    ) -> PeakHeld {
        let search_s = self.began.elapsed().as_secs_f64();
        let share = |t: CpuTime| {
            if search_s > 0.0 {
                t.total_s() / search_s
            } else {
                0.0
            }
        };
        let stat = quota.map(|(q, _)| q.stat()).unwrap_or_default();
        let periods = stat.periods.saturating_sub(self.quota.periods);
        let throttled = stat.throttled.saturating_sub(self.quota.throttled);
        PeakHeld {
            cpu_quota: quota.map(|(_, share)| share),
            cpu_throttled_s: (stat.throttled_s - self.quota.throttled_s).max(0.0),
            throttled_periods: if periods > 0 {
                throttled as f64 / periods as f64
            } else {
                0.0
            },
            search_s,
            server_cpu_share: share(cpu::cpu_of(pids).since(self.server)),
            load_cpu_share: share(cpu::own_cpu().since(self.load)),
            source_addresses,
            failures_by_reason: search.failures_by_reason.clone(),
            load_cpu_share_max: search
                .steps
                .iter()
                .map(|t| t.load_cpu_share)
                .fold(0.0, f64::max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_leaves_the_load_its_headroom_on_a_grid() {
        // The load as cheap as the server: a third of a core would use its whole core's
        // third; the ceiling is lower.
        assert_eq!(share(0.25, 100.0, 100.0), 0.25);
        // The load twice as dear: 100 / (3 × 200) = 0.167, down to 0.15.
        assert!((share(0.25, 100.0, 200.0) - 0.15).abs() < 1e-12);
        // Far dearer: the least share the quota can hold.
        assert_eq!(share(0.25, 10.0, 500.0), LEAST_SHARE);
        // Nothing measured: the ceiling.
        assert_eq!(share(0.25, 0.0, 0.0), 0.25);
        assert!((share(0.3, 1e3, 1.0) - 0.3).abs() < 1e-12);
    }
}
