//! Predicted against measured peaks, where the server set them: for each configuration whose
//! peak was searched with the server held to a share of a core (`lab run --peak`, its
//! `--peak-quota`), the cost model's prediction — the share × 10⁶ over the held-out µs per
//! operation at saturation, wake-ups left out since a saturated worker never sleeps — beside
//! the measured peak, with what shows the server saturated first (the quota's throttling, the
//! load generator's CPU share over the search), and how many configurations it predicts within
//! 10% — and, beside that, how many it predicts inside the measured peak's own 95% interval,
//! since the rounds' spread is as wide as the 10% for some configurations.
//!
//! Rounds may be searched under different shares (the search narrows the quota when the load
//! generator nears its limit), and a peak scales with the share, so every figure compared is
//! per core: each round's peak over its share.

use super::bench::peak::{server_set, LOAD_SHARE_MAX, THROTTLED_MIN};
use super::model::Model;
use super::results::Record;
use super::stats::{mean_interval, median, Mean};
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
    /// The share of a core the server was held to (median over rounds).
    pub(crate) share: f64,
    /// The measured peak per core, operations per second: the median over rounds of each
    /// round's peak over its share.
    pub(crate) measured_per_core: f64,
    /// The mean of the same over rounds, with its t-interval.
    pub(crate) measured_mean: Mean,
    /// The model's per core: 10⁶ / held-out µs per operation at saturation.
    pub(crate) predicted_per_core: Option<f64>,
    /// (predicted − measured) / measured, per core.
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

    /// Whether the prediction lies inside the measured peak's interval (`None` without one).
    pub(crate) fn inside_interval(&self) -> Option<bool> {
        let (low, high) = self.measured_mean.interval?;
        let p = self.predicted_per_core?;
        Some(low <= p && p <= high)
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
            let per_round: Vec<f64> = rs.iter().filter_map(|r| r.peak_per_core()).collect();
            let per_core = median(&per_round)?;
            let prediction = m
                .predictions
                .iter()
                .find(|p| p.suite == suite && p.row == row);
            Some(PeakRow {
                suite: suite.to_string(),
                row: row.to_string(),
                rounds: rs.len(),
                share,
                measured_per_core: per_core,
                measured_mean: mean_interval(&per_round)?,
                predicted_per_core: prediction.and_then(|p| p.predicted_peak(1.0)),
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

/// Of the server-set configurations the model predicts with a measured interval, how many
/// inside it, and how many.
pub(crate) fn inside(rows: &[PeakRow]) -> (usize, usize) {
    let judged: Vec<bool> = rows
        .iter()
        .filter(|r| r.server_set())
        .filter_map(PeakRow::inside_interval)
        .collect();
    (judged.iter().filter(|&&i| i).count(), judged.len())
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
        "| suite | row | rounds | share of a core | measured peak per core/s | mean, 95% \
         interval | predicted per core/s | error | inside | throttled s | throttled periods | \
         load CPU share | server-set |\n\
         |---|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---|\n",
    );
    for r in &rows {
        writeln!(
            t,
            "| {} | {} | {} | {:.2} | {:.0} | {} | {} | {} | {} | {:.1} | {:.0}% | {:.2} | {} |",
            r.suite,
            r.row,
            r.rounds,
            r.share,
            r.measured_per_core,
            r.measured_mean.text(0),
            r.predicted_per_core
                .map_or("—".into(), |p| format!("{p:.0}")),
            r.error
                .map_or("—".into(), |e| format!("{:+.1}%", e * 100.0)),
            match r.inside_interval() {
                Some(true) => "yes",
                Some(false) => "no",
                None => "—",
            },
            r.throttled_s,
            r.throttled_periods * 100.0,
            r.load_cpu_share,
            if r.server_set() { "yes" } else { "no" }
        )
        .expect("writing to a String");
    }
    let (hits, n) = within(&rows);
    let (inside, judged) = inside(&rows);
    write!(
        t,
        "\nPredicted within {:.0}% of the measured peak: {hits} of {n} server-set \
         configurations the model predicts held out; inside the measured peak's 95% interval \
         (Student's t over rounds): {inside} of {judged}. Per core: each round's peak over the \
         share of a core it was searched under, median and mean over rounds; predicted: 10⁶ / \
         the held-out µs per operation at saturation (no wake-ups). Server-set: the quota held \
         the server off in at least {:.0}% of the search's periods and the load generator used \
         under {:.0}% of its core over it; medians over rounds.\n",
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
            rec("a", 3, 100.0, 2_500.0, Some(held(Some(0.25), 2.5, 0.2))),
            rec("a", 4, 100.0, 2_450.0, Some(held(Some(0.25), 2.5, 0.2))),
            rec("a", 5, 100.0, 2_550.0, Some(held(Some(0.25), 2.5, 0.2))),
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
        assert_eq!(
            (a.rounds, a.share, a.measured_per_core),
            (5, 0.25, 10_000.0)
        );
        let unit = (2.0 / 125.0 + 4.0 / 100.0) / (2.0 / 125f64.powi(2) + 4.0 / 100f64.powi(2));
        let predicted = 1e6 / unit;
        assert!(
            (a.predicted_per_core.unwrap() - predicted).abs() < 1.0,
            "{a:?}"
        );
        assert!((a.error.unwrap() - (predicted / 10_000.0 - 1.0)).abs() < 1e-3);
        // Per core 9,600 to 10,400 over five rounds: mean 10,000 ± t(4) × 316 / √5 = 393,
        // so 9,428 lies outside; b's one round has no interval.
        let (low, high) = a.measured_mean.interval.unwrap();
        assert!(
            (low - 9_607.4).abs() < 1.0 && (high - 10_392.6).abs() < 1.0,
            "{a:?}"
        );
        assert_eq!(a.inside_interval(), Some(false));
        assert_eq!(rows[1].inside_interval(), None);
        assert_eq!(inside(&rows), (0, 1));
        assert!((rows[1].error.unwrap() - 0.25).abs() < 1e-3);
        assert!(a.server_set() && rows[1].server_set());
        assert!(!rows[2].server_set() && !rows[3].server_set());
        assert_eq!(within(&rows), (1, 2));
        let md = markdown(&records, &m);
        assert!(
            md.contains(
                "| seed004 | a | 5 | 0.25 | 10000 | 10000 [9607, 10393] | 9429 | -5.7% | no | 2.5 \
                 | 62% |"
            ),
            "{md}"
        );
        assert!(md.contains("1 of 2 server-set"), "{md}");
        assert!(
            md.contains("interval (Student's t over rounds): 0 of 1"),
            "{md}"
        );
        assert!(markdown(&records[7..8], &m).is_empty());
    }
}
