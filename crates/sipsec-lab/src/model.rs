//! The component cost model (seed 000 §V, done held out): a row's server CPU per operation
//! is the sum over building blocks of (times the block happens per operation) × (the block's
//! unit cost). The counts come from the server's own counters for that row — messages,
//! stream messages and TLS records, connections, full and resumed handshakes, client
//! certificates, digest and Proxychain checks, credential fetches (database queries, chains
//! from the authority), registrations written, wake-ups — so only the unit costs are
//! fitted: non-negative least squares on relative error, over the median of each row's
//! rounds.
//!
//! Seed 000 validated its model on the configurations it was fitted to. Here every row is
//! also predicted by a model fitted without it (leave one out): that error is the one that
//! says whether the blocks explain a configuration the model has not seen. The predicted
//! peak on one core is 10⁶ µs over the predicted CPU per operation without its wake-ups
//! (at saturation a worker never sleeps).

use super::results::Record;
use super::stats::median;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The building blocks, in the order units are reported.
pub(crate) const BLOCKS: [&str; 12] = [
    "message",
    "stream message",
    "TLS record",
    "connection set-up",
    "TLS handshake, full",
    "TLS handshake, resumed",
    "client certificate",
    "digest check",
    "Proxychain check",
    "credential fetch",
    "registration written",
    "wake-up",
];
const N: usize = BLOCKS.len();
/// The wake-up block's index: the one cost that vanishes at saturation.
const WAKE_UP: usize = N - 1;

/// One configuration: the medians of its rounds.
#[derive(Debug, Clone)]
pub struct Observation {
    /// The suite the row belongs to.
    pub suite: String,
    /// The row's name within its suite.
    pub row: String,
    /// Server CPU per successful operation, µs.
    pub cpu_us: f64,
    /// The measured peak, operations per second, where the row has one.
    pub peak_per_s: Option<f64>,
    /// Block counts per operation, in the order of `BLOCKS`.
    pub counts: [f64; N],
}

/// Block counts per operation of one round's record, all from the server's counters:
/// messages on streams are counted apart from datagrams, and a TLS stream's messages are
/// told apart by the row's transport (the counters say handshakes, not records). A client
/// certificate is counted where the server accepted one; in the lab's mutual rows the
/// server also presents its own to the callee, so the block's unit is both sides' extra.
/// A credential fetch is a user-database query (digest without the cache) or a chain asked
/// of the Proxychain authority: the server's side of it, not the round trip's wait.
pub fn counts(r: &Record) -> [f64; N] {
    let messages = r.per_op("requests_in") + r.per_op("responses_in");
    let stream = r.per_op("stream_messages_in");
    let connections = r.per_op("connections_accepted") + r.per_op("connections_opened");
    let (full, resumed) = (
        r.per_op("tls_handshakes_full"),
        r.per_op("tls_handshakes_resumed"),
    );
    let tls = r.transport == "tls" || full + resumed > 0.0;
    [
        messages,
        stream,
        if tls { stream } else { 0.0 },
        connections,
        full,
        resumed,
        r.per_op("tls_client_certificates"),
        r.per_op("digest_checks"),
        r.per_op("proxychain_checks"),
        r.per_op("credential_fetches"),
        r.per_op("registrations"),
        r.wakeups,
    ]
}

/// sipsec's measured rows, one observation each (medians over rounds). Skipped rows,
/// reference servers and ablated rows are left out: an ablated row has the counts of a real
/// configuration without the cost of the stage made free, which is no configuration the
/// model is to explain.
pub(crate) fn observations(records: &[Record]) -> Vec<Observation> {
    let suites = super::suite::all();
    let ablated: Vec<(&str, &str)> = suites
        .iter()
        .flat_map(|s| {
            s.rows
                .iter()
                .filter(|r| !r.noop.is_empty())
                .map(move |r| (s.name, r.id))
        })
        .collect();
    // The overload suite's rows run under a CPU quota to show control, not cost.
    let curves: Vec<&str> = suites.iter().filter(|s| s.curve).map(|s| s.name).collect();
    let mut by_row: BTreeMap<(String, String), Vec<&Record>> = BTreeMap::new();
    for r in records {
        if r.skipped.is_none()
            && r.succeeded > 0
            && !r.row.starts_with("kamailio")
            && !ablated.contains(&(r.suite.as_str(), r.row.as_str()))
            && !curves.contains(&r.suite.as_str())
        {
            by_row
                .entry((r.suite.clone(), r.row.clone()))
                .or_default()
                .push(r);
        }
    }
    by_row
        .into_iter()
        .filter_map(|((suite, row), rs)| {
            let all: Vec<[f64; N]> = rs.iter().map(|r| counts(r)).collect();
            let mut c = [0.0; N];
            for (b, slot) in c.iter_mut().enumerate() {
                *slot = median(&all.iter().map(|x| x[b]).collect::<Vec<_>>())?;
            }
            let peaks: Vec<f64> = rs.iter().filter_map(|r| r.peak_per_s).collect();
            Some(Observation {
                suite,
                row,
                cpu_us: median(&rs.iter().map(|r| r.cpu_us).collect::<Vec<_>>())?,
                peak_per_s: median(&peaks),
                counts: c,
            })
        })
        .collect()
}

/// Unit costs in µs; `None` for a block no fitted row has.
pub(crate) type Units = [Option<f64>; N];

/// Non-negative least squares of `cpu_us ≈ Σ units × counts`, each row weighted by its own
/// cost so the fit minimises relative error: solve on the blocks present, drop the most
/// negative unit, solve again.
pub fn fit(obs: &[&Observation]) -> Units {
    let mut active: Vec<usize> = (0..N)
        .filter(|&b| obs.iter().any(|o| o.counts[b] > 0.0))
        .collect();
    loop {
        let Some(solution) = solve(obs, &active) else {
            // Collinear blocks: drop the last and try again.
            active.pop();
            continue;
        };
        match solution
            .iter()
            .enumerate()
            .filter(|(_, u)| **u < 0.0)
            .min_by(|a, b| a.1.total_cmp(b.1))
        {
            Some((i, _)) => {
                active.remove(i);
            }
            None => {
                let mut units = [None; N];
                for (i, &b) in active.iter().enumerate() {
                    units[b] = Some(solution[i]);
                }
                // Blocks present but dropped are worth nothing in this fit.
                for (b, unit) in units.iter_mut().enumerate() {
                    if unit.is_none() && obs.iter().any(|o| o.counts[b] > 0.0) {
                        *unit = Some(0.0);
                    }
                }
                return units;
            }
        }
        if active.is_empty() {
            return [None; N];
        }
    }
}

/// Weighted least squares on the `active` blocks by the normal equations; `None` if they
/// are singular.
fn solve(obs: &[&Observation], active: &[usize]) -> Option<Vec<f64>> {
    let k = active.len();
    if k == 0 {
        return Some(Vec::new());
    }
    let mut a = vec![vec![0.0; k + 1]; k];
    for o in obs.iter().filter(|o| o.cpu_us > 0.0) {
        let w = 1.0 / o.cpu_us;
        for (i, &bi) in active.iter().enumerate() {
            let xi = o.counts[bi] * w;
            for (j, &bj) in active.iter().enumerate() {
                a[i][j] += xi * o.counts[bj] * w;
            }
            a[i][k] += xi * o.cpu_us * w;
        }
    }
    // Gaussian elimination with partial pivoting.
    for col in 0..k {
        let pivot = (col..k).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| a[i][k] / a[i][i]).collect())
}

/// A model's prediction of CPU per operation from `units`, if it has every block the row
/// uses.
pub(crate) fn predict(units: &Units, counts: &[f64; N]) -> Option<f64> {
    let mut total = 0.0;
    for b in 0..N {
        if counts[b] > 0.0 {
            total += units[b]? * counts[b];
        }
    }
    Some(total)
}

/// One row's measured cost, its fitted and held-out predictions.
#[derive(Debug, Clone)]
pub(crate) struct Prediction {
    pub suite: String,
    pub row: String,
    pub cpu_us: f64,
    pub(crate) fitted_us: Option<f64>,
    /// From the model fitted on every other row; `None` where a block only this row has.
    pub(crate) held_out_us: Option<f64>,
    /// The same held-out model's CPU per operation at saturation: every block but the
    /// wake-up, since a worker that never runs out of work never sleeps.
    pub(crate) held_out_saturated_us: Option<f64>,
    /// The measured peak, operations per second, where the row has one.
    pub peak_per_s: Option<f64>,
    /// The row's block counts per operation.
    pub counts: [f64; N],
}

impl Prediction {
    pub(crate) fn held_out_error(&self) -> Option<f64> {
        Some((self.held_out_us? - self.cpu_us) / self.cpu_us)
    }

    /// The held-out error of the predicted peak (10⁶ µs over the CPU per operation at
    /// saturation, on the server's one core) against the measured one.
    pub(crate) fn peak_error(&self) -> Option<f64> {
        let predicted = 1e6 / self.held_out_saturated_us?;
        let measured = self.peak_per_s?;
        Some((predicted - measured) / measured)
    }
}

/// The model fitted on every row, and each row predicted with and without itself.
#[derive(Debug, Clone)]
pub struct Model {
    /// Unit cost of each block fitted on every row, µs.
    pub units: Units,
    pub(crate) predictions: Vec<Prediction>,
}

impl Model {
    /// Mean absolute held-out error of CPU per operation over the rows that could be
    /// predicted, and how many they were.
    pub(crate) fn held_out_mae(&self) -> Option<(f64, usize)> {
        mean_abs(
            self.predictions
                .iter()
                .filter_map(Prediction::held_out_error),
        )
    }

    /// Mean absolute held-out error of the predicted peak, where peaks were measured.
    pub(crate) fn peak_mae(&self) -> Option<(f64, usize)> {
        mean_abs(self.predictions.iter().filter_map(Prediction::peak_error))
    }
}

fn mean_abs(errors: impl Iterator<Item = f64>) -> Option<(f64, usize)> {
    let e: Vec<f64> = errors.map(f64::abs).collect();
    (!e.is_empty()).then(|| (e.iter().sum::<f64>() / e.len() as f64, e.len()))
}

/// Fits the model on `records` and predicts every row held out.
pub(crate) fn fit_all(records: &[Record]) -> Model {
    let obs = observations(records);
    let all: Vec<&Observation> = obs.iter().collect();
    let units = fit(&all);
    let predictions = obs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let others: Vec<&Observation> = obs
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, o)| o)
                .collect();
            let held_out = fit(&others);
            let mut saturated = o.counts;
            saturated[WAKE_UP] = 0.0;
            Prediction {
                suite: o.suite.clone(),
                row: o.row.clone(),
                cpu_us: o.cpu_us,
                fitted_us: predict(&units, &o.counts),
                held_out_us: predict(&held_out, &o.counts),
                held_out_saturated_us: predict(&held_out, &saturated),
                peak_per_s: o.peak_per_s,
                counts: o.counts,
            }
        })
        .collect();
    Model { units, predictions }
}

/// What `sipsec lab model` prints.
pub fn text(m: &Model) -> String {
    let mut t = String::from("Unit cost per block (µs, fitted on every row):\n");
    for (b, u) in BLOCKS.iter().zip(m.units) {
        match u {
            Some(u) => writeln!(t, "  {b:<24} {u:>9.2}").unwrap(),
            None => writeln!(t, "  {b:<24} {:>9}", "no data").unwrap(),
        }
    }
    let f = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    let pct = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{:+.1}%", v * 100.0));
    writeln!(
        t,
        "\n{:<8} {:<28} {:>9} {:>9} {:>9} {:>8} {:>9}",
        "suite", "row", "µs/op", "fitted", "held out", "error", "peak err"
    )
    .unwrap();
    for p in &m.predictions {
        writeln!(
            t,
            "{:<8} {:<28} {:>9.1} {:>9} {:>9} {:>8} {:>9}",
            p.suite,
            p.row,
            p.cpu_us,
            f(p.fitted_us),
            f(p.held_out_us),
            pct(p.held_out_error()),
            pct(p.peak_error())
        )
        .unwrap();
    }
    match m.held_out_mae() {
        Some((e, n)) => writeln!(
            t,
            "\nHeld-out mean absolute error of CPU per operation: {:.1}% over {n} rows",
            e * 100.0
        )
        .unwrap(),
        None => writeln!(t, "\nNo row could be predicted held out.").unwrap(),
    }
    if let Some((e, n)) = m.peak_mae() {
        writeln!(
            t,
            "Held-out mean absolute error of the predicted peak: {:.1}% over {n} rows",
            e * 100.0
        )
        .unwrap();
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(row: &str, round: u32, counters: &[(&str, u64)], wakeups: f64, cpu: f64) -> Record {
        let mut r = Record::skipped("s", row, round, String::new());
        r.skipped = None;
        r.succeeded = 100;
        r.wakeups = wakeups;
        r.cpu_us = cpu;
        r.counters = counters.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        r
    }

    /// Rows made from known unit costs are fitted back to them, and a row left out is
    /// predicted exactly when its blocks are all in the other rows.
    #[test]
    fn known_unit_costs_are_recovered_and_rows_predicted_held_out() {
        // message 5 µs, stream message 2, connection set-up 30, digest 8, wake-up 10.
        let cost = |msgs: f64, stream: bool, conns: f64, digest: f64, wakes: f64| {
            msgs * 5.0
                + if stream { msgs * 2.0 } else { 0.0 }
                + conns * 30.0
                + digest * 8.0
                + wakes * 10.0
        };
        let rows = [
            ("udp", 600, false, 0, 0, 1.5),
            ("udp-b", 600, false, 0, 0, 2.5),
            ("udp-auth", 1000, false, 0, 200, 2.0),
            ("tcp", 600, true, 0, 0, 1.0),
            ("tcp-percall", 600, true, 100, 0, 3.0),
            ("tcp-percall-auth", 1000, true, 200, 200, 2.0),
        ];
        let mut records = Vec::new();
        for (id, msgs, stream, conns, digest, wakes) in rows {
            for round in 1..=3 {
                let mut c = vec![("requests_in", msgs / 2), ("responses_in", msgs / 2)];
                if stream {
                    c.push(("stream_messages_in", msgs));
                    if conns > 0 {
                        c.push(("connections_accepted", conns));
                    }
                }
                if digest > 0 {
                    c.push(("digest_checks", digest));
                }
                let cpu = cost(
                    msgs as f64 / 100.0,
                    stream,
                    conns as f64 / 100.0,
                    digest as f64 / 100.0,
                    wakes,
                );
                records.push(record(id, round, &c, wakes, cpu));
            }
        }
        let m = fit_all(&records);
        let unit = |name: &str| m.units[BLOCKS.iter().position(|b| *b == name).unwrap()];
        for (name, want) in [
            ("message", 5.0),
            ("stream message", 2.0),
            ("connection set-up", 30.0),
            ("digest check", 8.0),
            ("wake-up", 10.0),
        ] {
            let got = unit(name).unwrap();
            assert!((got - want).abs() < 1e-6, "{name}: {got}");
        }
        assert_eq!(unit("TLS handshake, full"), None);
        let (mae, n) = m.held_out_mae().unwrap();
        assert!(mae < 1e-6, "{mae}");
        assert_eq!(n, rows.len());
        assert!(text(&m).contains("Held-out mean absolute error of CPU per operation: 0.0%"));
        // At saturation the wake-ups (1.5 per operation at 10 µs for "udp") drop out.
        let udp = m.predictions.iter().find(|p| p.row == "udp").unwrap();
        let saturated = udp.held_out_saturated_us.unwrap();
        assert!((udp.cpu_us - saturated - 15.0).abs() < 1e-6, "{saturated}");
    }

    /// Seed 002's ablated rows (a stage made free) are not configurations to explain: the
    /// model leaves them out, and keeps their base row.
    #[test]
    fn ablated_rows_are_not_observations() {
        let mut records = Vec::new();
        for row in ["digest", "digest-hash"] {
            let mut r = record(row, 1, &[("requests_in", 500)], 1.0, 40.0);
            r.suite = "seed002".into();
            records.push(r);
        }
        let rows: Vec<String> = observations(&records).into_iter().map(|o| o.row).collect();
        assert_eq!(rows, ["digest"]);
    }

    /// A block that only one row has cannot be predicted for that row held out.
    #[test]
    fn a_block_only_one_row_has_is_not_predicted_held_out() {
        let records = vec![
            record(
                "udp",
                1,
                &[("requests_in", 300), ("responses_in", 300)],
                1.0,
                40.0,
            ),
            record(
                "udp2",
                1,
                &[("requests_in", 300), ("responses_in", 300)],
                2.0,
                50.0,
            ),
            record(
                "tls",
                1,
                &[
                    ("requests_in", 300),
                    ("responses_in", 300),
                    ("stream_messages_in", 600),
                    ("connections_accepted", 1),
                    ("tls_handshakes_full", 200),
                ],
                1.0,
                500.0,
            ),
        ];
        let m = fit_all(&records);
        let tls = m.predictions.iter().find(|p| p.row == "tls").unwrap();
        assert!(tls.fitted_us.is_some());
        assert_eq!(tls.held_out_us, None);
    }
}
