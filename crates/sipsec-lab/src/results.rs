//! The lab's results: one JSON line per measured (or skipped) row and round, appended to
//! `DIR/results.jsonl` as each row finishes, so an interrupted run loses at most the row it
//! was in and `--resume` carries on from there. The report and the model read only this file.

use crate::bench::{Counters, Report};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The results file in a lab directory.
pub fn path(dir: &Path) -> PathBuf {
    dir.join("results.jsonl")
}

/// One row measured in one round.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// The suite the row belongs to.
    pub suite: String,
    /// The row's name within its suite.
    pub row: String,
    /// The round it was measured in.
    pub round: u32,
    /// Offered operations per second and operations in the measured run.
    pub rate: f64,
    /// Operations attempted in the measured run.
    pub calls: u64,
    /// The transport between the load generator and the server (`udp`, `tcp`, `tls`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub transport: String,
    /// Why the row was not measured (not installed, not available in this build, failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// Server CPU (user + system) per successful operation, µs.
    #[serde(default)]
    pub cpu_us: f64,
    #[serde(default)]
    pub(crate) user_us: f64,
    #[serde(default)]
    pub(crate) sys_us: f64,
    /// CPU per successful operation of the processes the server depends on (the authority,
    /// the database server), µs; 0 where there are none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) peer_cpu_us: f64,
    /// Times the server's threads were woken, per operation.
    #[serde(default)]
    pub(crate) wakeups: f64,
    #[serde(default)]
    /// Operations that succeeded in the measured run.
    pub succeeded: u64,
    #[serde(default)]
    /// Operations that failed in the measured run.
    pub failed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The highest rate at which at least 99% of operations succeeded (`--find-peak`),
    /// operations per second; absent where no peak was searched for.
    pub peak_per_s: Option<f64>,
    /// The server's own counters over the measured run.
    #[serde(default)]
    pub counters: Counters,
    /// `[quantile, ms]` of the operations' latency.
    #[serde(default)]
    pub latency_cdf_ms: Vec<[f64; 2]>,
    /// The server's user-space instructions per operation, counted by callgrind in a short
    /// extra run (`lab run --instructions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<f64>,
    /// `[offered/s, goodput/s]` at multiples of the peak (`lab run --curve`), or at the
    /// overload suite's grid of absolute rates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub goodput_curve: Vec<[f64; 2]>,
    /// The server's CPU per operation counted at each point of `goodput_curve`, µs (per
    /// call refused in a row that refuses every call); empty in older results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub curve_cpu_us: Vec<f64>,
    /// The load generator's CPU at each point of `goodput_curve`, as a share of its core
    /// (≥ [`LOAD_BOUND`]: the point may measure the load generator); empty in older results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub curve_load_share: Vec<f64>,
    /// The commit the measuring binary was built from (`git describe`, `-dirty` when the tree
    /// had changes); empty in results from before it was recorded.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub commit: String,
    /// The UTC date the row was measured on (`YYYY-MM-DD`); empty in older results.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub date: String,
    /// The load generator's CPU (caller and callee) per successful operation, µs: what the
    /// peak search's share of a core for the server is chosen from.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub load_cpu_us: f64,
    /// How the peak was measured (the server's share of a core) and who saturated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_held: Option<crate::bench::peak::PeakHeld>,
}

/// The least share of a row's operations that must succeed for its figures to be a result:
/// below it the row is marked in the report and left out of ratios and of the model's fit.
pub const MIN_SUCCESS: f64 = 0.99;
/// The load generator's share of its core at a curve point from which the point may measure
/// it rather than the server: one thread that near its core's end delays every message it
/// sends and reads, so calls come late whatever the server does (the report marks them).
pub const LOAD_BOUND: f64 = 0.9;

/// The commit this binary was built from (see `build.rs`).
pub const COMMIT: &str = env!("SIPSEC_LAB_COMMIT");

/// Today's UTC date, `YYYY-MM-DD`.
pub fn today() -> String {
    time::OffsetDateTime::now_utc().date().to_string()
}

impl Record {
    /// A row that was not measured, and why.
    pub fn skipped(suite: &str, row: &str, round: u32, why: String) -> Record {
        Record {
            suite: suite.into(),
            row: row.into(),
            round,
            rate: 0.0,
            calls: 0,
            transport: String::new(),
            skipped: Some(why),
            cpu_us: 0.0,
            user_us: 0.0,
            sys_us: 0.0,
            peer_cpu_us: 0.0,
            wakeups: 0.0,
            succeeded: 0,
            failed: 0,
            peak_per_s: None,
            counters: Counters::new(),
            latency_cdf_ms: Vec::new(),
            instructions: None,
            goodput_curve: Vec::new(),
            curve_cpu_us: Vec::new(),
            curve_load_share: Vec::new(),
            commit: COMMIT.to_string(),
            date: today(),
            load_cpu_us: 0.0,
            peak_held: None,
        }
    }

    /// A row measured by `sipsec bench`.
    pub fn measured(suite: &str, row: &str, round: u32, r: &Report) -> Record {
        Record {
            rate: r.rate,
            calls: r.load.attempted,
            transport: r.transport.clone(),
            skipped: None,
            cpu_us: r.server_cpu_us_per_op,
            user_us: r.server_user_us_per_op,
            sys_us: r.server_sys_us_per_op,
            peer_cpu_us: r.peer_cpu_us_per_op,
            wakeups: r.server_wakeups_per_op,
            succeeded: r.ops,
            // What ended and was not the operation counted (a refusal, in a refuse-all run).
            failed: (r.load.succeeded + r.load.failed).saturating_sub(r.ops),
            peak_per_s: r.peak_per_s,
            counters: r.server_counters.clone(),
            latency_cdf_ms: r.load.latency_cdf_ms.clone(),
            goodput_curve: r
                .goodput_curve
                .iter()
                .map(|p| [p.offered_per_s, p.goodput_per_s])
                .collect(),
            curve_cpu_us: r
                .goodput_curve
                .iter()
                .map(|p| p.server_cpu_us_per_op)
                .collect(),
            curve_load_share: r.goodput_curve.iter().map(|p| p.load_cpu_share).collect(),
            load_cpu_us: r.load_cpu_us_per_op,
            peak_held: r.peak_held.clone(),
            ..Record::skipped(suite, row, round, String::new())
        }
    }

    /// The operations that ended in the measured run: those attempted, or those counted as
    /// succeeded or failed where more ended than were counted as attempted.
    fn ended(&self) -> u64 {
        self.calls.max(self.succeeded + self.failed)
    }

    /// The share of the run's operations that succeeded: of those attempted, or of those
    /// that ended where more ended than were counted as attempted; 0 for a row not measured.
    pub fn success_share(&self) -> f64 {
        let ended = self.ended();
        if ended == 0 {
            return 0.0;
        }
        self.succeeded as f64 / ended as f64
    }

    /// The peak per core: the peak over the share of a core the server was held to during
    /// the search (a whole core without a quota) — what compares rows searched under
    /// different shares, and what the cost model's whole-core prediction is read against.
    pub fn peak_per_core(&self) -> Option<f64> {
        let share = self
            .peak_held
            .as_ref()
            .and_then(|h| h.cpu_quota)
            .unwrap_or(1.0);
        Some(self.peak_per_s? / share)
    }

    /// The load's set-up latency at quantile `q` (a point of its recorded CDF), ms.
    pub fn latency_at(&self, q: f64) -> Option<f64> {
        self.latency_cdf_ms
            .iter()
            .find(|p| (p[0] - q).abs() < 1e-9)
            .map(|p| p[1])
    }

    /// A counter per successful operation.
    pub fn per_op(&self, counter: &str) -> f64 {
        if self.succeeded == 0 {
            return 0.0;
        }
        self.counters.get(counter).copied().unwrap_or(0) as f64 / self.succeeded as f64
    }
}

/// The share of several rounds' operations that succeeded, pooled (every operation weighs
/// the same, whichever round it ran in); `None` when none ended. What a row's success is,
/// for the report and the model alike.
pub fn pooled_success<'a>(rounds: impl IntoIterator<Item = &'a Record>) -> Option<f64> {
    let (ok, ended) = rounds.into_iter().fold((0, 0), |(ok, ended), r| {
        (ok + r.succeeded, ended + r.ended())
    });
    (ended > 0).then(|| ok as f64 / ended as f64)
}

/// A curve suite's reference capacity, operations per second: the median of its
/// [`REFERENCE`](crate::suite::REFERENCE) records' peaks (normally one, searched once per
/// run); `None` before one was measured.
pub fn reference_capacity(suite: &str, records: &[Record]) -> Option<f64> {
    super::stats::median(
        &records
            .iter()
            .filter(|r| r.suite == suite && r.row == crate::suite::REFERENCE && r.skipped.is_none())
            .filter_map(|r| r.peak_per_s)
            .collect::<Vec<_>>(),
    )
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// Every record in `dir` (none if the file does not exist yet). A line cut short by a kill
/// mid-write is skipped, not an error.
pub fn load(dir: &Path) -> Result<Vec<Record>> {
    let file = path(dir);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Appends one record as a line and syncs it, so a crash right after keeps it.
pub fn append(dir: &Path, record: &Record) -> Result<()> {
    let file = path(dir);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .with_context(|| format!("cannot open {}", file.display()))?;
    let line = serde_json::to_string(record)? + "\n";
    f.write_all(line.as_bytes())?;
    f.sync_data()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_torn_last_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_empty());
        let mut a = Record::skipped("seed000", "udp", 1, String::new());
        a.skipped = None;
        a.cpu_us = 61.5;
        a.succeeded = 100;
        a.counters.insert("messages_in".into(), 600);
        let b = Record::skipped("seed000", "kamailio-udp", 1, "not installed".into());
        append(dir.path(), &a).unwrap();
        append(dir.path(), &b).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(path(dir.path()))
            .unwrap()
            .write_all(b"{\"suite\":\"seed0")
            .unwrap();
        let back = load(dir.path()).unwrap();
        assert_eq!(back, vec![a.clone(), b]);
        assert_eq!(back[0].per_op("messages_in"), 6.0);
        assert_eq!(back[0].per_op("absent"), 0.0);
    }
}
