//! Predicted against measured peaks, where the server set them: for each configuration whose
//! peak was searched with the server held to a share of a core (`lab run --peak`, its
//! `--peak-quota`), the cost model's prediction — the share × 10⁶ over the held-out µs per
//! operation at saturation, wake-ups left out since a saturated worker never sleeps — beside
//! the measured peak, with what shows the server saturated first (the quota's throttling, the
//! load generator's CPU share over the search), and how many configurations it predicts within
//! 10%.

use super::bench::peak::{server_set, LOAD_SHARE_MAX, THROTTLED_MIN};
use super::model::Model;
use super::results::Record;
use super::stats::median;
use std::collections::BTreeMap;
use std::fmt::Write;

/// A prediction within this relative error counts as a hit.
const WITHIN: f64 = 0.10;

/// One configuration's server-set peak, the medians over its rounds, and the model's.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PeakRow {
    pub(crate) suite: String,
    pub(crate) row: String,
    /// Rounds with a peak measured under a quota.
    pub(crate) rounds: usize,
    /// The share of a core the server was held to.
    pub(crate) share: f64,
    /// The measured peak, operations per second.
    pub(crate) measured_per_s: f64,
    /// The model's: share × 10⁶ / held-out µs per operation at saturation.
    pub(crate) predicted_per_s: Option<f64>,
    /// (predicted − measured) / measured, each per core (peak over share, per round).
    pub(crate) error: Option<f64>,
    /// Seconds the quota held the server off during the search.
    pub(crate) throttled_s: f64,
    /// The share of the search's quota periods in which the server used up its quota.
    pub(crate) throttled_periods: f64,
    /// The load generator's CPU share over the search.
    pub(crate) load_cpu_share: f64,
}

impl PeakRow {
    /// Whether the server set the peak: its quota held it off in a good part of the search,
    /// and the load generator kept its headroom.
    pub(crate) fn server_set(&self) -> bool {
        server_set(self.throttled_periods, self.load_cpu_share)
    }
}

/// Every configuration with a peak measured under a quota, in suite and row order.
pub(crate) fn rows(records: &[Record], m: &Model) -> Vec<PeakRow> {
    let mut by_row: BTreeMap<(&str, &str), Vec<&Record>> = BTreeMap::new();
    for r in records {
        let held = r.peak_held.as_ref().and_then(|h| h.cpu_quota);
        if r.skipped.is_none() && r.peak_per_s.is_some() && held.is_some_and(|q| q > 0.0) {
            by_row.entry((&r.suite, &r.row)).or_default().push(r);
        }
    }
    by_row
        .into_iter()
        .filter_map(|((suite, row), rs)| {
            let held = |f: fn(&super::bench::peak::PeakHeld) -> f64| {
                median(
                    &rs.iter()
                        .filter_map(|r| r.peak_held.as_ref().map(f))
                        .collect::<Vec<_>>(),
                )
            };
            let share = median(
                &rs.iter()
                    .filter_map(|r| r.peak_held.as_ref()?.cpu_quota)
                    .collect::<Vec<_>>(),
            )?;
            let per_core = median(
                &rs.iter()
                    .filter_map(|r| r.peak_per_core())
                    .collect::<Vec<_>>(),
            )?;
            let prediction = m
                .predictions
                .iter()
                .find(|p| p.suite == suite && p.row == row);
            Some(PeakRow {
                suite: suite.to_string(),
                row: row.to_string(),
                rounds: rs.len(),
                share,
                measured_per_s: median(
                    &rs.iter().filter_map(|r| r.peak_per_s).collect::<Vec<_>>(),
                )?,
                predicted_per_s: prediction.and_then(|p| p.predicted_peak(share)),
                error: prediction
                    .and_then(|p| p.predicted_peak(1.0))
                    .map(|whole| (whole - per_core) / per_core),
                throttled_s: held(|h| h.cpu_throttled_s)?,
                throttled_periods: held(|h| h.throttled_periods)?,
                load_cpu_share: held(|h| h.load_cpu_share)?,
            })
        })
        .collect()
}

/// Of the server-set configurations the model predicts, how many within 10%, and how many.
pub(crate) fn within(rows: &[PeakRow]) -> (usize, usize) {
    let predicted: Vec<f64> = rows
        .iter()
        .filter(|r| r.server_set())
        .filter_map(|r| r.error)
        .collect();
    let hits = predicted.iter().filter(|e| e.abs() <= WITHIN).count();
    (hits, predicted.len())
}

/// The heading the table is printed under (`lab model`, the report, the `model` block).
pub const TITLE: &str = "Predicted and measured peaks, server-set";

/// The table, in markdown, with its count; empty when no peak was measured under a quota.
pub fn markdown(records: &[Record], m: &Model) -> String {
    let rows = rows(records, m);
    if rows.is_empty() {
        return String::new();
    }
    let mut t = String::from(
        "| suite | row | rounds | share of a core | measured peak/s | predicted peak/s | \
         error | throttled s | throttled periods | load CPU share | server-set |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in &rows {
        writeln!(
            t,
            "| {} | {} | {} | {:.2} | {:.0} | {} | {} | {:.1} | {:.0}% | {:.2} | {} |",
            r.suite,
            r.row,
            r.rounds,
            r.share,
            r.measured_per_s,
            r.predicted_per_s.map_or("—".into(), |p| format!("{p:.0}")),
            r.error
                .map_or("—".into(), |e| format!("{:+.1}%", e * 100.0)),
            r.throttled_s,
            r.throttled_periods * 100.0,
            r.load_cpu_share,
            if r.server_set() { "yes" } else { "no" }
        )
        .expect("writing to a String");
    }
    let (hits, n) = within(&rows);
    write!(
        t,
        "\nPredicted within {:.0}% of the measured peak: {hits} of {n} server-set \
         configurations the model predicts held out. Predicted: the share × 10⁶ / the \
         held-out µs per operation at saturation (no wake-ups); the error compares peaks per \
         core (each round's peak over its share). Server-set: the quota held the server off in \
         at least {:.0}% of the search's periods and the load generator used under {:.0}% of \
         its core over it; medians over rounds.\n",
        WITHIN * 100.0,
        THROTTLED_MIN * 100.0,
        LOAD_SHARE_MAX * 100.0
    )
    .expect("writing to a String");
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::peak::PeakHeld;
    use crate::model;

    fn held(share: Option<f64>, throttled_s: f64, load: f64) -> PeakHeld {
        PeakHeld {
            cpu_quota: share,
            cpu_throttled_s: throttled_s,
            // A second held off in a 20 s search is about a quarter of its periods.
            throttled_periods: throttled_s / 4.0,
            search_s: 30.0,
            server_cpu_share: 0.2,
            load_cpu_share: load,
            load_cpu_share_max: load * 2.0,
            source_addresses: 1,
            failures_by_reason: BTreeMap::new(),
        }
    }

    /// A record costing `cpu` µs per call, one message per call (so the model's one unit is
    /// `cpu`), its peak searched under `h`.
    fn rec(row: &str, round: u32, cpu: f64, peak: f64, h: Option<PeakHeld>) -> Record {
        let mut r = Record::skipped("seed004", row, round, String::new());
        r.skipped = None;
        r.cpu_us = cpu;
        r.succeeded = 1000;
        r.counters.insert("requests_in".into(), 1000);
        r.peak_per_s = Some(peak);
        r.peak_held = h;
        r
    }

    #[test]
    fn peaks_under_a_quota_are_predicted_from_the_share_and_counted_within_ten_percent() {
        // Configurations of 100 µs per message, and b of 125 at its rate and at its peak.
        // Server-set peaks are fitted too (b's: 0.25 × 10⁶ / 2,000 = 125 µs at saturation),
        // so a, held out, is predicted by a unit fitted to 125, 125 and four 100s (least
        // relative squares: Σ(1/y) / Σ(1/y²) = 106.06 µs): 0.25 × 10⁶ / 106.06 = 2,357/s.
        // b, held out, is predicted by 100s alone: 2,500/s against its 2,000.
        let records = vec![
            rec("a", 1, 100.0, 2_400.0, Some(held(Some(0.25), 3.0, 0.2))),
            rec("a", 2, 100.0, 2_600.0, Some(held(Some(0.25), 2.0, 0.2))),
            // 20% off: measured, predicted, not a hit.
            rec("b", 1, 125.0, 2_000.0, Some(held(Some(0.25), 3.0, 0.2))),
            // The load was the one near its limit: not server-set.
            rec("c", 1, 100.0, 2_500.0, Some(held(Some(0.25), 0.0, 0.9))),
            // A whole core: no row in the table.
            rec("d", 1, 100.0, 9_000.0, Some(held(None, 0.0, 0.9))),
            // Held back before its quota bound (throttled in a tenth of the periods): not
            // server-set either, though predicted exactly.
            rec("f", 1, 100.0, 2_500.0, Some(held(Some(0.25), 0.4, 0.1))),
            rec("e", 1, 100.0, 9_000.0, None),
        ];
        let m = model::fit_all(&records);
        let rows = rows(&records, &m);
        let ids: Vec<&str> = rows.iter().map(|r| r.row.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c", "f"]);
        let a = &rows[0];
        assert_eq!((a.rounds, a.share, a.measured_per_s), (2, 0.25, 2_500.0));
        let unit = (2.0 / 125.0 + 4.0 / 100.0) / (2.0 / 125f64.powi(2) + 4.0 / 100f64.powi(2));
        let predicted = 0.25e6 / unit;
        assert!(
            (a.predicted_per_s.unwrap() - predicted).abs() < 1.0,
            "{a:?}"
        );
        assert!((a.error.unwrap() - (predicted / 2_500.0 - 1.0)).abs() < 1e-3);
        assert!((rows[1].error.unwrap() - 0.25).abs() < 1e-3);
        assert!(a.server_set() && rows[1].server_set());
        assert!(!rows[2].server_set() && !rows[3].server_set());
        assert_eq!(within(&rows), (1, 2));
        let md = markdown(&records, &m);
        assert!(
            md.contains("| seed004 | a | 2 | 0.25 | 2500 | 2357 | -5.7% | 2.5 | 62% |"),
            "{md}"
        );
        assert!(md.contains("1 of 2 server-set"), "{md}");
        assert!(markdown(&records[4..5], &m).is_empty());
    }
}
