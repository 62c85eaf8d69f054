//! `sipsec lab report`: one self-contained HTML file (inline SVG charts drawn with plotters,
//! inline CSS; no script, font or image from anywhere else, so it opens from disk) and the
//! same tables as markdown for BENCHMARKS.md. Everything comes from `results.jsonl`.
//!
//! Per suite: the table (median over rounds, the ratio to the row's baseline with its
//! bootstrap 95% interval, and the verdict the intervals allow, the seed's figure beside),
//! the counts per operation noise cannot move, the seed's orderings checked against ours,
//! CPU per operation as bars stacked by the cost model's blocks, latency CDFs, and peaks
//! where they were searched.

use super::charts;
use super::model::{self, Model, BLOCKS};
use super::results::{self, Record};
use super::stats::{self, Ratio};
use super::suite::{self, Row, Suite};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// One row's summary over its rounds.
#[derive(Debug, Clone)]
pub(crate) struct RowSummary {
    pub id: &'static str,
    pub label: &'static str,
    pub baseline: &'static str,
    /// What its set-up latency is read against (`baseline` unless the row says otherwise).
    pub(crate) latency_baseline: &'static str,
    pub rounds: usize,
    /// The median offered rate of its rounds, operations per second.
    pub rate: Option<f64>,
    /// The share of its rounds' operations that succeeded.
    pub success: Option<f64>,
    pub cpu_us: Option<f64>,
    /// Against the baseline, paired by round; `None` where either row failed (below
    /// [`results::MIN_SUCCESS`]) unless the report was asked to keep failures.
    pub ratio: Option<Ratio>,
    pub seed: Option<&'static str>,
    pub(crate) seed_ratio: Option<f64>,
    pub(crate) wakeups: Option<f64>,
    /// Per operation: messages in, connections, full and resumed handshakes, requests the
    /// auth gate examined (digest or Proxychain).
    pub counts: [Option<f64>; 5],
    pub peak_per_s: Option<f64>,
    /// User-space instructions per operation (callgrind, `lab run --instructions`).
    pub instructions: Option<f64>,
    pub latency_cdf_ms: Vec<[f64; 2]>,
    /// Set-up latency, the median over rounds of each round's p50 and p99, ms.
    pub(crate) latency_ms: [Option<f64>; 2],
    /// The p99 against the baseline's, paired by round (as `ratio` is for CPU).
    pub(crate) p99_ratio: Option<Ratio>,
    /// `[offered/s, goodput/s]`, the median over rounds at each multiple of the peak.
    pub goodput_curve: Vec<[f64; 2]>,
    pub skipped: Option<String>,
}

impl RowSummary {
    /// What the intervals allow us to say of this row against its baseline.
    pub(crate) fn verdict(&self) -> &'static str {
        match self.ratio {
            _ if self.failed() => "failures",
            _ if self.id == self.baseline => "baseline",
            Some(r) if r.interval.is_none() => "not ranked (n < 5)",
            Some(r) if r.below_one() => "cheaper",
            Some(r) if r.above_one() => "dearer",
            Some(_) => "not separable",
            None => "—",
        }
    }

    /// Whether fewer than [`results::MIN_SUCCESS`] of its operations succeeded.
    pub(crate) fn failed(&self) -> bool {
        self.success.is_some_and(|s| s < results::MIN_SUCCESS)
    }
}

const COUNT_NAMES: [&str; 5] = ["msgs", "conns", "full hs", "resumed hs", "auth"];

/// What a report keeps that it would otherwise leave out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Rows below [`results::MIN_SUCCESS`] keep their ratios (still marked).
    pub with_failures: bool,
}

fn summarise(s: &Suite, records: &[Record], opts: Options) -> Vec<RowSummary> {
    let of = |id: &str| -> Vec<&Record> {
        records
            .iter()
            .filter(|r| r.suite == s.name && r.row == id)
            .collect()
    };
    s.rows
        .iter()
        .filter_map(|row| {
            let rs = of(row.id);
            if rs.is_empty() {
                return None;
            }
            let measured: Vec<&Record> =
                rs.iter().copied().filter(|r| r.skipped.is_none()).collect();
            let med = |f: &dyn Fn(&Record) -> f64| -> Option<f64> {
                stats::median(&measured.iter().map(|r| f(r)).collect::<Vec<_>>())
            };
            // The ratio pairs each round with the baseline's same round.
            let base_rounds: Vec<&Record> = of(row.baseline)
                .into_iter()
                .filter(|r| r.skipped.is_none())
                .collect();
            let base: BTreeMap<u32, f64> =
                base_rounds.iter().map(|r| (r.round, r.cpu_us)).collect();
            let latency_baseline = row.latency_baseline.unwrap_or(row.baseline);
            let latency_rounds: Vec<&Record> = of(latency_baseline)
                .into_iter()
                .filter(|r| r.skipped.is_none())
                .collect();
            let base_p99: BTreeMap<u32, f64> = latency_rounds
                .iter()
                .filter_map(|r| Some((r.round, r.latency_at(0.99)?)))
                .collect();
            let success = results::pooled_success(measured.iter().copied());
            let ok = |share: Option<f64>| share.is_none_or(|s| s >= results::MIN_SUCCESS);
            // A ratio is kept where neither side failed (unless the report keeps failures).
            let comparable_with = |base: &[&Record]| {
                opts.with_failures
                    || (ok(success) && ok(results::pooled_success(base.iter().copied())))
            };
            let comparable = comparable_with(&base_rounds);
            let (mut mine, mut theirs) = (Vec::new(), Vec::new());
            let (mut my_p99, mut their_p99) = (Vec::new(), Vec::new());
            for r in &measured {
                if let Some(b) = base.get(&r.round) {
                    mine.push(r.cpu_us);
                    theirs.push(*b);
                }
                if let (Some(p), Some(b)) = (r.latency_at(0.99), base_p99.get(&r.round)) {
                    my_p99.push(p);
                    their_p99.push(*b);
                }
            }
            let latency = |q: f64| {
                stats::median(
                    &measured
                        .iter()
                        .filter_map(|r| r.latency_at(q))
                        .collect::<Vec<_>>(),
                )
            };
            let count = |f: fn(&Record) -> f64| med(&|r| f(r));
            // Per core, so rows searched under different shares of one compare.
            let peaks: Vec<f64> = measured.iter().filter_map(|r| r.peak_per_core()).collect();
            Some(RowSummary {
                id: row.id,
                label: row.label,
                baseline: row.baseline,
                latency_baseline,
                rounds: measured.len(),
                rate: med(&|r| r.rate),
                success,
                cpu_us: med(&|r| r.cpu_us),
                ratio: stats::ratio(&mine, &theirs).filter(|_| comparable),
                seed: row.seed,
                seed_ratio: row.seed_ratio,
                wakeups: med(&|r| r.wakeups),
                counts: [
                    count(|r| r.per_op("requests_in") + r.per_op("responses_in")),
                    count(|r| r.per_op("connections_accepted") + r.per_op("connections_opened")),
                    count(|r| r.per_op("tls_handshakes_full")),
                    count(|r| r.per_op("tls_handshakes_resumed")),
                    count(|r| r.per_op("digest_checks") + r.per_op("proxychain_checks")),
                ],
                peak_per_s: stats::median(&peaks),
                instructions: stats::median(
                    &measured
                        .iter()
                        .filter_map(|r| r.instructions)
                        .collect::<Vec<_>>(),
                ),
                latency_cdf_ms: measured
                    .iter()
                    .find(|r| !r.latency_cdf_ms.is_empty())
                    .map(|r| r.latency_cdf_ms.clone())
                    .unwrap_or_default(),
                latency_ms: [latency(0.5), latency(0.99)],
                p99_ratio: stats::ratio(&my_p99, &their_p99)
                    .filter(|_| comparable_with(&latency_rounds)),
                goodput_curve: median_curve(&measured),
                skipped: if measured.is_empty() {
                    rs.iter().find_map(|r| r.skipped.clone())
                } else {
                    None
                },
            })
        })
        .collect()
}

/// The median over rounds of each point of the rows' goodput curves (the points are the
/// same multiples of each round's peak).
fn median_curve(rounds: &[&Record]) -> Vec<[f64; 2]> {
    let n = rounds
        .iter()
        .map(|r| r.goodput_curve.len())
        .max()
        .unwrap_or(0);
    (0..n)
        .filter_map(|i| {
            let at = |k: usize| -> Vec<f64> {
                rounds
                    .iter()
                    .filter_map(|r| r.goodput_curve.get(i).map(|p| p[k]))
                    .collect()
            };
            Some([stats::median(&at(0))?, stats::median(&at(1))?])
        })
        .collect()
}

/// How the seed's orderings fare in our measurements: pairs of rows with one baseline where
/// the seed has one at least 10% dearer than the other.
#[derive(Debug, Default)]
pub(crate) struct Orderings {
    pub(crate) reproduced: Vec<(String, String)>,
    pub reversed: Vec<(String, String)>,
    pub(crate) not_separable: Vec<(String, String)>,
    /// Pairs where a row has too few rounds for an interval.
    pub(crate) not_ranked: Vec<(String, String)>,
}

pub(crate) fn orderings(rows: &[RowSummary]) -> Orderings {
    let mut o = Orderings::default();
    for a in rows {
        for b in rows {
            let (Some(sa), Some(sb), Some(ra), Some(rb)) =
                (a.seed_ratio, b.seed_ratio, a.ratio, b.ratio)
            else {
                continue;
            };
            if a.baseline != b.baseline || sa < sb * 1.1 {
                continue;
            }
            // The seed has a dearer than b.
            let pair = (a.label.to_string(), b.label.to_string());
            if ra.interval.is_none() || rb.interval.is_none() {
                o.not_ranked.push(pair);
            } else if rb.cheaper_than(&ra) {
                o.reproduced.push(pair);
            } else if ra.cheaper_than(&rb) {
                o.reversed.push(pair);
            } else {
                o.not_separable.push(pair);
            }
        }
    }
    o
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("—".into(), |v| format!("{v:.digits$}"))
}

fn ratio_text(r: Option<Ratio>, digits: usize) -> String {
    match r {
        None => "—".into(),
        Some(Ratio {
            mean,
            interval: Some((low, high)),
            ..
        }) => format!("{mean:.digits$} [{low:.digits$}, {high:.digits$}]"),
        Some(r) => format!("{:.digits$} (n = {})", r.mean, r.n),
    }
}

/// The row's success share as a percentage, in bold (markdown) when below
/// [`results::MIN_SUCCESS`] and `bold` is asked for.
fn success_text(r: &RowSummary, bold: bool) -> String {
    match r.success {
        Some(s) if bold && r.failed() => format!("**{:.1}%**", s * 100.0),
        Some(s) => format!("{:.1}%", s * 100.0),
        None => "—".into(),
    }
}

/// What a reader must know to read the table: rows whose ratio is against a baseline run
/// at another rate (with both rows' wake-ups per operation, the cost that depends on the
/// rate), and rows left out for their failures.
pub(crate) fn notes(rows: &[RowSummary]) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows {
        if r.failed() {
            out.push(format!(
                "{}: {} of operations succeeded (below {:.0}%): marked, and left out of ratios \
                 and of the model's fit.",
                r.label,
                success_text(r, false),
                results::MIN_SUCCESS * 100.0
            ));
        }
        let Some(base) = rows.iter().find(|b| b.id == r.baseline && b.id != r.id) else {
            continue;
        };
        if let (Some(mine), Some(theirs)) = (r.rate, base.rate) {
            if (mine - theirs).abs() > 0.01 * theirs {
                out.push(format!(
                    "{} runs at {mine:.0}/s, its baseline ({}) at {theirs:.0}/s: the row cannot \
                     hold the suite's rate. Wake-ups per operation, which fall as the rate \
                     rises, are {} against {}; the ratio includes that difference.",
                    r.label,
                    base.label,
                    opt(r.wakeups, 2),
                    opt(base.wakeups, 2)
                ));
            }
        }
    }
    out
}

/// The markdown table of one suite.
pub(crate) fn markdown_table(rows: &[RowSummary]) -> String {
    let mut t = String::from(
        "| configuration | rate/s | success | µs/op | × baseline [95% CI] | verdict | seed | seed × | wake-ups/op | msgs | conns | full hs | resumed hs | auth | peak/s per core | instr/op |\n\
         |---|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        if let Some(why) = &r.skipped {
            writeln!(
                t,
                "| {} | | | unavailable: {why} | | | {} | {} | | | | | | | | |",
                r.label,
                r.seed.unwrap_or(""),
                opt(r.seed_ratio, 2)
            )
            .unwrap();
            continue;
        }
        writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.label,
            opt(r.rate, 0),
            success_text(r, true),
            opt(r.cpu_us, 1),
            ratio_text(r.ratio, 2),
            r.verdict(),
            r.seed.unwrap_or(""),
            opt(r.seed_ratio, 2),
            opt(r.wakeups, 2),
            opt(r.counts[0], 2),
            opt(r.counts[1], 2),
            opt(r.counts[2], 2),
            opt(r.counts[3], 2),
            opt(r.counts[4], 2),
            opt(r.peak_per_s, 0),
            opt(r.instructions, 0),
        )
        .unwrap();
    }
    t
}

/// A suite's set-up latency ([`Suite::latency`]) by row: p50, p99, the p99's ratio to the
/// baseline's with its rounds (rows may have more than the suite's header says), and the
/// baseline's name.
fn latency_cells(rows: &[RowSummary]) -> Vec<[String; 6]> {
    rows.iter()
        .filter(|r| r.skipped.is_none())
        .map(|r| {
            let base = rows
                .iter()
                .find(|b| b.id == r.latency_baseline)
                .map_or(r.latency_baseline, |b| b.label);
            [
                r.label.to_string(),
                opt(r.latency_ms[0], 2),
                opt(r.latency_ms[1], 2),
                ratio_text(r.p99_ratio, 2),
                r.p99_ratio.map_or("—".into(), |q| q.n.to_string()),
                if r.id == r.latency_baseline {
                    "—"
                } else {
                    base
                }
                .to_string(),
            ]
        })
        .collect()
}

const LATENCY_HEADS: [&str; 6] = [
    "configuration",
    "set-up p50 ms",
    "set-up p99 ms",
    "p99 × baseline [95% CI]",
    "rounds",
    "baseline",
];

/// The markdown table of [`latency_cells`].
pub(crate) fn latency_table(rows: &[RowSummary]) -> String {
    let mut t = format!(
        "| {} |\n|---|---:|---:|---|---:|---|\n",
        LATENCY_HEADS.join(" | ")
    );
    for cells in latency_cells(rows) {
        writeln!(t, "| {} |", cells.join(" | ")).unwrap();
    }
    t
}

/// The HTML table of [`latency_cells`].
fn latency_html(rows: &[RowSummary]) -> String {
    let mut t = String::from("<table><tr>");
    for h in LATENCY_HEADS {
        write!(t, "<th>{h}</th>").unwrap();
    }
    t += "</tr>\n";
    for cells in latency_cells(rows) {
        t += "<tr>";
        for c in cells {
            write!(t, "<td>{}</td>", escape(&c)).unwrap();
        }
        t += "</tr>\n";
    }
    t + "</table>\n"
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The HTML table of one suite.
fn html_table(rows: &[RowSummary]) -> String {
    let mut t = String::from(
        "<table><tr><th>configuration</th><th>rate/s</th><th>success</th><th>µs/op</th>\
         <th>× baseline [95% CI]</th><th>verdict</th><th>seed</th><th>seed ×</th>\
         <th>wake-ups/op</th>",
    );
    for c in COUNT_NAMES {
        write!(t, "<th>{c}/op</th>").unwrap();
    }
    t += "<th>peak/s</th><th>instr/op</th><th>rounds</th></tr>\n";
    for r in rows {
        if let Some(why) = &r.skipped {
            writeln!(
                t,
                "<tr class=skip><td>{}</td><td colspan=5>unavailable: {}</td><td>{}</td><td>{}</td>\
                 <td colspan=9></td></tr>",
                escape(r.label),
                escape(why),
                r.seed.unwrap_or(""),
                opt(r.seed_ratio, 2)
            )
            .unwrap();
            continue;
        }
        write!(
            t,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td>",
            escape(r.label),
            opt(r.rate, 0),
            success_text(r, false),
            opt(r.cpu_us, 1),
            ratio_text(r.ratio, 2),
            r.verdict().replace(' ', "-"),
            r.verdict(),
            r.seed.unwrap_or(""),
            opt(r.seed_ratio, 2),
            opt(r.wakeups, 2)
        )
        .unwrap();
        for c in r.counts {
            write!(t, "<td>{}</td>", opt(c, 2)).unwrap();
        }
        writeln!(
            t,
            "<td>{}</td><td>{}</td><td>{}</td></tr>",
            opt(r.peak_per_s, 0),
            opt(r.instructions, 0),
            r.rounds
        )
        .unwrap();
    }
    t + "</table>\n"
}

/// CPU per operation by row: the model's blocks stacked, the measured median as a black
/// tick with the interval of its ratio (scaled by its baseline's median).
fn cost_chart(rows: &[RowSummary], m: &Model, suite: &str) -> Result<String> {
    let counts: BTreeMap<&str, [f64; BLOCKS.len()]> = m
        .predictions
        .iter()
        .filter(|p| p.suite == suite)
        .map(|p| (p.row.as_str(), p.counts))
        .collect();
    let bars: Vec<charts::CostBar> = rows
        .iter()
        .filter_map(|r| {
            let cpu = r.cpu_us?;
            let parts = counts
                .get(r.id)
                .map(|c| {
                    m.units
                        .iter()
                        .enumerate()
                        .map(|(b, unit)| (b, unit.unwrap_or(0.0) * c[b]))
                        .collect()
                })
                .unwrap_or_default();
            let interval = r.ratio.filter(|_| r.id != r.baseline).and_then(|x| {
                let scale = cpu / x.mean;
                x.interval.map(|(low, high)| (low * scale, high * scale))
            });
            Some(charts::CostBar {
                label: r.label.to_string(),
                parts,
                measured: cpu,
                interval,
            })
        })
        .collect();
    charts::cost(
        "Server CPU per operation (µs): the model's blocks, and what was measured",
        &BLOCKS,
        &bars,
    )
}

/// An ablated row's saving against its base row: (stage, saving µs, share of the base, the
/// Amdahl bound 1 / (ablated ÷ base) with its interval).
fn savings<'a>(
    s: &'a Suite,
    rows: &'a [RowSummary],
) -> impl Iterator<Item = (&'a RowSummary, &'a RowSummary, f64, Ratio)> + 'a {
    rows.iter().filter_map(move |r| {
        let noop = s.row(r.id)?.noop;
        if noop.is_empty() {
            return None;
        }
        let base = rows.iter().find(|b| b.id == r.baseline)?;
        let ratio = r.ratio?;
        let saving = base.cpu_us? - r.cpu_us?;
        Some((base, r, saving, ratio))
    })
}

/// The ablation table (HTML and markdown): per ablated row, the CPU it saved against its
/// base, that share of the base, the Amdahl bound on speed-up with its 95% interval, and
/// the wake-ups per call of base and ablated row (a saving is cryptography's only where
/// they match).
fn ablation(s: &Suite, rows: &[RowSummary]) -> (String, String) {
    let mut html = String::from(
        "<table><tr><th>configuration</th><th>base µs/call</th><th>ablated µs/call</th>\
         <th>saving µs</th><th>share of base [95% CI]</th><th>Amdahl bound [95% CI]</th>\
         <th>wake-ups/call base → ablated</th></tr>\n",
    );
    let mut md = String::from(
        "| configuration | base µs/call | ablated µs/call | saving µs | share of base [95% CI] \
         | Amdahl bound [95% CI] | wake-ups/call base → ablated |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut any = false;
    for (base, r, saving, q) in savings(s, rows) {
        any = true;
        let (share, bound) = match q.interval {
            Some((low, high)) => (
                format!(
                    "{:.0}% [{:.0}%, {:.0}%]",
                    (1.0 - q.mean) * 100.0,
                    (1.0 - high) * 100.0,
                    (1.0 - low) * 100.0
                ),
                format!("{:.2}× [{:.2}, {:.2}]", 1.0 / q.mean, 1.0 / high, 1.0 / low),
            ),
            None => (
                format!("{:.0}% (n = {})", (1.0 - q.mean) * 100.0, q.n),
                format!("{:.2}× (n = {})", 1.0 / q.mean, q.n),
            ),
        };
        let (b, a) = (base.cpu_us.unwrap_or(0.0), r.cpu_us.unwrap_or(0.0));
        let wakeups = format!("{} → {}", opt(base.wakeups, 2), opt(r.wakeups, 2));
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{b:.1}</td><td>{a:.1}</td><td>{saving:.1}</td><td>{share}</td>\
             <td>{bound}</td><td>{wakeups}</td></tr>",
            escape(r.label)
        );
        let _ = writeln!(
            md,
            "| {} | {b:.1} | {a:.1} | {saving:.1} | {share} | {bound} | {wakeups} |",
            r.label
        );
    }
    html += "</table>";
    if any {
        (html, md)
    } else {
        (String::new(), String::new())
    }
}

/// The Amdahl bound of every ablated row, with its interval.
fn amdahl_chart(s: &Suite, rows: &[RowSummary]) -> Result<Option<String>> {
    let values: Vec<charts::Bar> = savings(s, rows)
        .map(|(_, r, _, q)| charts::Bar {
            label: r.label.to_string(),
            value: 1.0 / q.mean,
            interval: q.interval.map(|(low, high)| (1.0 / high, 1.0 / low)),
        })
        .collect();
    if values.is_empty() {
        return Ok(None);
    }
    charts::bars(
        "Amdahl bound: speed-up if the stage cost nothing (base ÷ ablated CPU per call)",
        "× speed-up",
        &values,
    )
    .map(Some)
}

/// Goodput against offered load, past the peak, for the rows with a curve.
fn goodput_chart(rows: &[RowSummary]) -> Result<Option<String>> {
    // A row that searched a capacity has no curve.
    let series: Vec<(String, Vec<(f64, f64)>)> = rows
        .iter()
        .filter(|r| !r.goodput_curve.is_empty())
        .map(|r| {
            let points = r.goodput_curve.iter().map(|p| (p[0], p[1])).collect();
            (r.label.to_string(), points)
        })
        .collect();
    charts::lines(
        "Goodput (operations within 500 ms per second) against offered load, past the peak",
        ("offered operations per second", "goodput per second"),
        &series,
        false,
        None,
    )
}

/// Goodput past the peak, like for like: every row was offered the same absolute rates
/// (multiples of the one reference capacity, [`suite::GRID`]), and each cell is the goodput
/// it kept there as a share of that same reference, the mean over rounds with its interval.
/// A row with no point at a grid rate (measured on another grid) shows "—" there.
fn goodput_table(s: &Suite, rows: &[RowSummary], records: &[Record]) -> Option<(String, String)> {
    let reference = results::reference_capacity(s.name, records)?;
    let grid = suite::grid(reference);
    let mut head = vec!["row".to_string()];
    head.extend(
        suite::GRID
            .iter()
            .zip(&grid)
            .map(|(m, r)| format!("{m}× ({r:.0}/s)")),
    );
    let mut md = format!(
        "Goodput ÷ the reference capacity ({reference:.0} calls/s, the uncontrolled server's \
         peak searched once), at the same offered rates for every row; {}.\n\n| {} |\n|---|{}\n",
        // A skipped row (a peer not installed) has no rounds and no line in the table: it does
        // not speak for the rows that were measured.
        stats::describe_means(
            rows.iter()
                .filter(|r| r.skipped.is_none())
                .map(|r| r.rounds)
                .min()
                .unwrap_or(0)
        ),
        head.join(" | "),
        "---:|".repeat(grid.len())
    );
    let mut html = String::from("<table><tr>");
    for h in &head {
        write!(html, "<th>{}</th>", escape(h)).ok();
    }
    html += "</tr>";
    let mut any_load_bound = false;
    // The row refusing every call is read below, as r; a row searching a capacity has no
    // goodput, and is read in the note.
    for r in rows.iter().filter(|r| {
        r.skipped.is_none()
            && !refuses_all(s, r.id)
            && !s.row(r.id).is_some_and(Row::searches_capacity)
    }) {
        let rounds: Vec<&Record> = records
            .iter()
            .filter(|x| x.suite == s.name && x.row == r.id && x.skipped.is_none())
            .collect();
        let cells: Vec<String> = grid
            .iter()
            .map(|&rate| {
                let points: Vec<(&Record, usize)> = rounds
                    .iter()
                    .filter_map(|x| Some((*x, curve_point(x, rate)?)))
                    .collect();
                let shares: Vec<f64> = points
                    .iter()
                    .map(|(x, i)| x.goodput_curve[*i][1] / reference)
                    .collect();
                let load_bound = points.iter().any(|(x, i)| {
                    x.curve_load_share
                        .get(*i)
                        .is_some_and(|&l| l >= results::LOAD_BOUND)
                });
                any_load_bound |= load_bound;
                let mark = if load_bound { LOAD_BOUND_MARK } else { "" };
                stats::mean_interval(&shares).map_or("—".into(), |m| m.text(2) + mark)
            })
            .collect();
        write!(html, "<tr><td>{}</td>", escape(r.label)).ok();
        for c in &cells {
            write!(html, "<td class=num>{c}</td>").ok();
        }
        html += "</tr>";
        writeln!(md, "| {} | {} |", r.label, cells.join(" | ")).ok();
    }
    // Rows read against their own capacity, searched in the same round.
    let mut capacities = Vec::new();
    for row in &s.rows {
        let Some(capacity) = row.capacity.and_then(|c| s.row(c)) else {
            continue;
        };
        let cells: Vec<String> = grid
            .iter()
            .map(|&rate| {
                let shares: Vec<f64> = records
                    .iter()
                    .filter(|x| x.suite == s.name && x.row == row.id && x.skipped.is_none())
                    .filter_map(|x| {
                        let i = curve_point(x, rate)?;
                        Some(x.goodput_curve[i][1] / peak_beside(records, s, capacity.id, x)?)
                    })
                    .collect();
                stats::mean_interval(&shares).map_or("—".into(), |m| m.text(2))
            })
            .collect();
        if cells.iter().all(|c| c == "—") {
            continue;
        }
        let label = format!("{} ÷ its own capacity, the same round's", row.label);
        write!(html, "<tr><td>{}</td>", escape(&label)).ok();
        for c in &cells {
            write!(html, "<td class=num>{c}</td>").ok();
        }
        html += "</tr>";
        writeln!(md, "| {label} | {} |", cells.join(" | ")).ok();
        if !capacities.contains(&capacity.id) {
            capacities.push(capacity.id);
        }
    }
    let top = grid.last().copied().unwrap_or(reference);
    let note = capacities
        .iter()
        .filter_map(|&id| {
            let peaks: Vec<f64> = records
                .iter()
                .filter(|x| x.suite == s.name && x.row == id && x.skipped.is_none())
                .filter_map(|x| x.peak_per_s)
                .collect();
            let calls = stats::mean_interval(&peaks)?;
            let shares: Vec<f64> = peaks.iter().map(|p| p / reference).collect();
            Some(format!(
                "{}: {} calls/s, {} of the reference, so the grid's {top:.0}/s is {:.1} times it",
                s.row(id)?.label,
                calls.text(0),
                stats::mean_interval(&shares)?.text(2),
                top / calls.mean
            ))
        })
        .collect::<Vec<_>>();
    let mut note = if note.is_empty() {
        String::new()
    } else {
        format!(
            "Own capacities (the \"÷ its own capacity\" lines; their columns are the grid's \
             rates, not multiples of these) — {}.",
            note.join("; ")
        )
    };
    if let Some(b) = RefusalBound::of(s, records, reference) {
        let cells = |values: &dyn Fn(f64) -> Vec<f64>| -> Vec<String> {
            suite::GRID
                .iter()
                .map(|&k| stats::mean_interval(&values(k)).map_or("—".into(), |m| m.text(2)))
                .collect()
        };
        let mut lines = vec![(
            "r: a refusal's CPU ÷ a call's at the peak".to_string(),
            cells(&|k| b.r_at(k)),
        )];
        for bound in [Bound::Stated, Bound::EveryArrivalRead] {
            lines.push((
                format!(
                    "bound for callers that ignore feedback, {}",
                    bound.formula()
                ),
                cells(&|k| b.bounds(bound, k)),
            ));
        }
        if let Some(plain) = b.plain {
            for bound in [Bound::Stated, Bound::EveryArrivalRead] {
                lines.push((
                    format!("{} ÷ {}", plain.label, bound.formula()),
                    cells(&|k| b.shares_of_bound(bound, k)),
                ));
            }
        }
        for (label, cells) in &lines {
            write!(html, "<tr><td>{}</td>", escape(label)).ok();
            for c in cells {
                write!(html, "<td class=num>{c}</td>").ok();
            }
            html += "</tr>";
            writeln!(md, "| {label} | {} |", cells.join(" | ")).ok();
        }
        note = [note, b.describe()]
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect::<Vec<_>>()
            .join("\n\n");
    }
    html += "</table>";
    if any_load_bound {
        let load = format!(
            "{LOAD_BOUND_MARK} In at least one round the load generator used {:.0}% or more of \
             its core at this point: its own delays, not the server's, may have made calls late, \
             so the cell bounds the server's goodput from below.",
            results::LOAD_BOUND * 100.0
        );
        note = if note.is_empty() {
            load
        } else {
            format!("{note}\n\n{load}")
        };
    }
    if !note.is_empty() {
        write!(html, "<p>{}</p>", escape(&note)).ok();
        write!(md, "\n{note}\n").ok();
    }
    Some((html, md))
}

/// Marks a goodput cell where the load generator may have been the limit
/// ([`results::LOAD_BOUND`]).
const LOAD_BOUND_MARK: &str = "†";

/// The point of `rec`'s goodput curve offered `rate` (within 5%: what the load generator
/// started per second of a trial asked for that rate), if it has one.
fn curve_point(rec: &Record, rate: f64) -> Option<usize> {
    rec.goodput_curve
        .iter()
        .position(|p| (p[0] - rate).abs() <= 0.05 * rate)
}

/// The peak the capacity row `capacity` searched in the same round as `rec`, in the same
/// sitting (the same build and date): a row and its capacity measured apart are not a pair.
fn peak_beside(records: &[Record], s: &Suite, capacity: &str, rec: &Record) -> Option<f64> {
    records
        .iter()
        .find(|c| {
            c.suite == s.name
                && c.row == capacity
                && c.round == rec.round
                && c.skipped.is_none()
                && c.commit == rec.commit
                && c.date == rec.date
        })?
        .peak_per_s
        .filter(|&p| p > 0.0)
}

/// Whether row `id` of `s` refuses every call: it keeps no goodput, and is read as r.
fn refuses_all(s: &Suite, id: &str) -> bool {
    s.row(id).is_some_and(|r| r.bench.refuse_all)
}

/// What a refusal costs as a share of a call, r, from the row that refuses every call:
/// - at the suite's rate (its CPU column), over its baseline's CPU per call at that rate,
///   each round against the same round: both sides wake-up bound below the peak;
/// - at each grid rate k × the reference (its curve), over what a call costs at the peak
///   (the CPU the server may use, its quota, ÷ the reference capacity): the refusals a
///   server offered k times its capacity answers arrive at about that rate, and are read
///   in the batches that rate makes. This r sets the bounds on the goodput of callers that
///   ignore feedback.
struct RefusalBound<'a> {
    /// r at each grid rate, by round.
    by_round: BTreeMap<u32, Vec<Option<f64>>>,
    /// r at the suite's rate over rounds, with its interval.
    r: Ratio,
    /// r at the suite's rate by callgrind's instructions (medians), where both rows were
    /// counted.
    r_instructions: Option<f64>,
    /// The offered rate the suite's r was measured at.
    rate: f64,
    /// The row of plain callers the bounds are for (same transport, local admission on),
    /// and its goodput ÷ the reference at each grid rate, by round.
    plain: Option<&'a Row>,
    plain_shares: BTreeMap<u32, Vec<Option<f64>>>,
}

impl<'a> RefusalBound<'a> {
    fn of(s: &'a Suite, records: &[Record], reference: f64) -> Option<RefusalBound<'a>> {
        let refused = s.rows.iter().find(|r| r.bench.refuse_all)?;
        let rounds = |id: &str| -> BTreeMap<u32, &Record> {
            records
                .iter()
                .filter(|r| r.suite == s.name && r.row == id && r.skipped.is_none())
                .map(|r| (r.round, r))
                .collect()
        };
        let (mine, base) = (rounds(refused.id), rounds(refused.baseline));
        let pairs: Vec<(&Record, &Record)> = mine
            .iter()
            .filter_map(|(n, m)| Some((*m, *base.get(n)?)))
            .collect();
        let (row_cpu, base_cpu): (Vec<f64>, Vec<f64>) =
            pairs.iter().map(|(m, b)| (m.cpu_us, b.cpu_us)).unzip();
        let r = stats::ratio(&row_cpu, &base_cpu)?;
        let instructions = |recs: &BTreeMap<u32, &Record>| {
            stats::median(
                &recs
                    .values()
                    .filter_map(|r| r.instructions)
                    .collect::<Vec<_>>(),
            )
        };
        let grid = suite::grid(reference);
        // Each grid point's figure in a record's curve, found by its offered rate.
        let at_grid = |rec: &Record, f: &dyn Fn(usize) -> Option<f64>| -> Vec<Option<f64>> {
            grid.iter()
                .map(|&rate| f(curve_point(rec, rate)?))
                .collect()
        };
        let quota = refused.bench.cpu_quota.unwrap_or(1.0);
        let call_at_peak_us = quota * 1e6 / reference;
        let by_round = mine
            .iter()
            .map(|(n, rec)| {
                let r_at = at_grid(rec, &|i| {
                    rec.curve_cpu_us
                        .get(i)
                        .filter(|&&us| us > 0.0)
                        .map(|us| us / call_at_peak_us)
                });
                (*n, r_at)
            })
            .collect();
        let plain = s.rows.iter().find(|r| {
            r.server == refused.server
                && r.setup == refused.setup
                && r.bench.overload.is_on()
                && !r.bench.oc
                && !r.bench.refuse_all
                && r.bench.streams.transport == refused.bench.streams.transport
        });
        let plain_shares = plain
            .map(|p| {
                rounds(p.id)
                    .into_iter()
                    .map(|(n, rec)| {
                        let shares = at_grid(rec, &|i| Some(rec.goodput_curve[i][1] / reference));
                        (n, shares)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(RefusalBound {
            by_round,
            r,
            r_instructions: instructions(&mine)
                .zip(instructions(&base))
                .map(|(m, b)| m / b),
            rate: stats::median(&pairs.iter().map(|(m, _)| m.rate).collect::<Vec<_>>())
                .unwrap_or(0.0),
            plain,
            plain_shares,
        })
    }

    /// The position of multiple `k` on the grid.
    fn index(k: f64) -> Option<usize> {
        suite::GRID.iter().position(|&g| g == k)
    }

    /// r at `k` times the reference, each round's.
    fn r_at(&self, k: f64) -> Vec<f64> {
        let Some(i) = Self::index(k) else {
            return Vec::new();
        };
        self.by_round.values().filter_map(|r| *r.get(i)?).collect()
    }

    /// `bound` at `k` times capacity for each round's r there.
    fn bounds(&self, bound: Bound, k: f64) -> Vec<f64> {
        self.r_at(k).into_iter().map(|r| bound.at(k, r)).collect()
    }

    /// The plain row's goodput at `k` times the reference as a share of the bound its own
    /// round's r sets there.
    fn shares_of_bound(&self, bound: Bound, k: f64) -> Vec<f64> {
        let Some(i) = Self::index(k) else {
            return Vec::new();
        };
        self.plain_shares
            .iter()
            .filter_map(|(n, shares)| {
                let share = (*shares.get(i)?)?;
                let r = (*self.by_round.get(n)?.get(i)?)?;
                Some(share / bound.at(k, r))
            })
            .collect()
    }

    /// A sentence saying what r is and how it was measured.
    fn describe(&self) -> String {
        let instructions = self
            .r_instructions
            .map(|r| format!(", by callgrind's instructions {r:.3}"))
            .unwrap_or_default();
        format!(
            "r, a refusal's cost as a share of a call's: at each k, the server's CPU per call \
             refused (INVITE, 503, ACK) by a server refusing every call offered k × the \
             reference, over a call's at the peak (the quota ÷ the reference capacity); the \
             bounds above use it. At {:.0}/s, below the peak, where every message wakes the \
             server, r = {} (CPU per refusal ÷ CPU per call with control off, same \
             rounds){instructions}.",
            self.rate,
            ratio_text(Some(self.r), 3)
        )
    }
}

/// The most goodput, as a share of capacity, that callers who ignore feedback can get at `k`
/// times capacity when a refusal costs `r` of a call.
#[derive(Debug, Clone, Copy)]
enum Bound {
    /// As issue 37 states it, 1/(1 + (k−1)·r): (k − 1) refusals for every call completed,
    /// which holds where k is offered ÷ goodput, and overstates the bound where k is offered
    /// ÷ capacity, as here.
    Stated,
    /// With k offered ÷ capacity and every arrival read and answered: goodput g and k − g
    /// refusals fill the CPU, g + (k − g)·r = 1, so g = (1 − k·r)/(1 − r) (0 from k·r = 1).
    EveryArrivalRead,
}

impl Bound {
    fn at(self, k: f64, r: f64) -> f64 {
        if k <= 1.0 {
            return 1.0;
        }
        match self {
            Bound::Stated => 1.0 / (1.0 + (k - 1.0) * r),
            Bound::EveryArrivalRead => ((1.0 - k * r) / (1.0 - r)).clamp(0.0, 1.0),
        }
    }

    fn formula(self) -> &'static str {
        match self {
            Bound::Stated => "1/(1 + (k−1)·r)",
            Bound::EveryArrivalRead => "(1 − k·r)/(1 − r)",
        }
    }
}

/// Latency CDFs of every measured row (log time axis).
fn cdf_chart(rows: &[RowSummary]) -> Result<Option<String>> {
    let series: Vec<(String, Vec<(f64, f64)>)> = rows
        .iter()
        .map(|r| {
            let points = r.latency_cdf_ms.iter().map(|p| (p[1], p[0])).collect();
            (r.label.to_string(), points)
        })
        .collect();
    charts::lines(
        "Latency CDF (operation start to its final answer)",
        ("ms", "fraction"),
        &series,
        true,
        Some(1.0),
    )
}

/// Peak rates, where they were searched.
fn peak_chart(rows: &[RowSummary]) -> Result<Option<String>> {
    let values: Vec<charts::Bar> = rows
        .iter()
        .filter_map(|r| {
            Some(charts::Bar {
                label: r.label.to_string(),
                value: r.peak_per_s?,
                interval: None,
            })
        })
        .collect();
    if values.is_empty() {
        return Ok(None);
    }
    charts::bars(
        "Peak (≥ 99% within 500 ms), operations per second",
        "operations per second",
        &values,
    )
    .map(Some)
}

const STYLE: &str = "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}\
table{border-collapse:collapse;font-size:13px;margin:1em 0}\
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}\
td:first-child,th:first-child{text-align:left}\
tr.skip td{color:#888}.cheaper{background:#d9f2d9}.dearer{background:#f8dada}\
.not-separable{background:#eee}p.about{max-width:900px}svg{display:block;margin:1em 0}";

/// The report of `dir/results.jsonl`, written nowhere.
pub fn build(dir: &Path, opts: Options) -> Result<Rendered> {
    let records = results::load(dir)?;
    if records.is_empty() {
        anyhow::bail!(
            "no results in {}: run `sipsec lab run --out {}` first",
            results::path(dir).display(),
            dir.display()
        );
    }
    let mut rendered = render(&records, &model::fit_all(&records), opts)?;
    if let Some(md) = super::cluster::markdown(dir)? {
        let title = "A cluster on PostgreSQL (issue 36)";
        rendered.markdown += &format!("\n## {title}\n\n{md}");
        let at = rendered
            .html
            .rfind("</body>")
            .unwrap_or(rendered.html.len());
        rendered.html.insert_str(
            at,
            &format!("<h2>{}</h2><pre>{}</pre>", escape(title), escape(&md)),
        );
        rendered.blocks.insert(super::cluster::NAME.to_string(), md);
    }
    Ok(rendered)
}

/// Writes `dir/report.html` and `dir/report.md` from `dir/results.jsonl`.
pub fn write(dir: &Path, opts: Options) -> Result<Rendered> {
    let rendered = build(dir, opts)?;
    let (h, k) = (dir.join("report.html"), dir.join("report.md"));
    std::fs::write(&h, &rendered.html).with_context(|| format!("cannot write {}", h.display()))?;
    std::fs::write(&k, &rendered.markdown)
        .with_context(|| format!("cannot write {}", k.display()))?;
    eprintln!("sipsec lab: wrote {} and {}", h.display(), k.display());
    Ok(rendered)
}

/// A report: the HTML page, the markdown export, and the blocks README and BENCHMARKS.md
/// quote (see [`super::docs`]), by name.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The self-contained page.
    pub html: String,
    /// Every table as markdown.
    pub markdown: String,
    /// Generated blocks by name: a suite's name for its table, `SUITE-ablation`,
    /// `SUITE-goodput`, `model` (and `model-summary`, its verdict lines).
    pub blocks: BTreeMap<String, String>,
}

/// Where a suite's figures come from: the commits and dates its records were measured at,
/// its rounds, and the command that measures them again.
fn provenance(suite: &str, records: &[Record]) -> String {
    let mine: Vec<&Record> = records.iter().filter(|r| r.suite == suite).collect();
    let mut commits: Vec<&str> = mine
        .iter()
        .map(|r| {
            if r.commit.is_empty() {
                "unrecorded"
            } else {
                r.commit.as_str()
            }
        })
        .collect();
    commits.sort_unstable();
    commits.dedup();
    let mut dates: Vec<&str> = mine
        .iter()
        .map(|r| r.date.as_str())
        .filter(|d| !d.is_empty())
        .collect();
    dates.sort_unstable();
    dates.dedup();
    let when = match (dates.first(), dates.last()) {
        (Some(a), Some(b)) if a != b => format!(" between {a} and {b}"),
        (Some(a), _) => format!(" on {a}"),
        _ => String::new(),
    };
    format!(
        "Measured at commit {}{when}; `sipsec lab run {suite} --out DIR` measures it again.",
        commits.join(", ")
    )
}

/// The names of the blocks a suite's section makes: its table, and its ablation or goodput
/// table where it has one.
fn block_names(s: &Suite) -> Vec<String> {
    let mut names = vec![s.name.to_string()];
    if s.lab_build {
        names.push(format!("{}-ablation", s.name));
    }
    if s.curve {
        names.push(format!("{}-goodput", s.name));
    }
    names
}

/// The HTML page, the markdown export and the generated blocks.
pub fn render(records: &[Record], m: &Model, opts: Options) -> Result<Rendered> {
    let mut html = format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>sipsec lab report</title>\
         <style>{STYLE}</style></head><body><h1>sipsec lab report</h1>\
         <p>{} results. Each row is server CPU per operation at a fixed rate (the \
         scheduler's on-CPU time of every server thread over the operations that succeeded), \
         the median over rounds; its ratio to the baseline is the geometric mean of the \
         per-round ratios (each round's row over the same round's baseline) with a {:.0}% \
         interval (each table says its method and n), and a row is called cheaper or dearer \
         only where that interval excludes 1; below {} rounds there are no intervals and no \
         verdicts. A row where fewer than {:.0}% of operations succeeded is marked and left \
         out of ratios and of the model. Counts per operation come from the server's own \
         counters.</p>\n",
        records.len(),
        stats::LEVEL * 100.0,
        stats::MIN_ROUNDS,
        results::MIN_SUCCESS * 100.0,
    );
    let mut md = String::from("# sipsec lab report\n\n");
    let mut blocks = BTreeMap::new();
    for s in suite::all() {
        let rows = summarise(&s, records, opts);
        if rows.is_empty() {
            continue;
        }
        let rounds = rows
            .iter()
            .filter(|r| r.ratio.is_some() && r.id != r.baseline)
            .map(|r| r.ratio.map_or(0, |q| q.n))
            .min()
            .unwrap_or_else(|| rows.iter().map(|r| r.rounds).max().unwrap_or(0));
        let method = format!("Intervals: {}.", stats::describe(rounds));
        let source = provenance(s.name, records);
        write!(
            html,
            "<h2>{}</h2><p class=about>{}</p><p>{} {}</p>",
            escape(s.title),
            escape(s.about),
            escape(&method),
            escape(&source)
        )?;
        html += &html_table(&rows);
        let mut block = format!("{method} {source}\n\n{}", markdown_table(&rows));
        if s.latency {
            let latency = latency_table(&rows);
            block += "\n";
            block += &latency;
            html += &latency_html(&rows);
        }
        let notes = notes(&rows);
        for n in &notes {
            write!(html, "<p>{}</p>", escape(n))?;
        }
        if !notes.is_empty() {
            block += "\n";
            for n in &notes {
                writeln!(block, "- {n}")?;
            }
        }
        let o = orderings(&rows);
        let n = o.reproduced.len() + o.reversed.len() + o.not_separable.len() + o.not_ranked.len();
        if n > 0 {
            let reversed = if o.reversed.is_empty() {
                String::new()
            } else {
                let pairs: Vec<String> = o
                    .reversed
                    .iter()
                    .map(|(a, b)| format!("{a} > {b}"))
                    .collect();
                format!(" ({})", pairs.join("; "))
            };
            let mut line = format!(
                "Of the seed's {n} orderings (one row ≥ 10% dearer than another with the same \
                 baseline): {} reproduced, {} reversed{reversed}, {} not separable by our \
                 intervals",
                o.reproduced.len(),
                o.reversed.len(),
                o.not_separable.len()
            );
            if !o.not_ranked.is_empty() {
                write!(
                    line,
                    ", {} not ranked (fewer than {} rounds)",
                    o.not_ranked.len(),
                    stats::MIN_ROUNDS
                )?;
            }
            line.push('.');
            write!(html, "<p>{}</p>", escape(&line))?;
            write!(block, "\n{line}\n")?;
        }
        write!(md, "## {}\n\n{}\n\n{block}\n", s.title, s.about)?;
        blocks.insert(s.name.to_string(), block);
        if s.lab_build {
            let (table, text) = ablation(&s, &rows);
            if !text.is_empty() {
                write!(
                    html,
                    "<h3>Ablation: the most making a stage free could buy</h3>{table}"
                )?;
                write!(md, "\n### Ablation\n\n{text}\n")?;
                blocks.insert(
                    format!("{}-ablation", s.name),
                    format!("{method}\n\n{text}"),
                );
                if let Some(svg) = amdahl_chart(&s, &rows)? {
                    html += &svg;
                }
            }
        }
        html += &cost_chart(&rows, m, s.name)?;
        if let Some(svg) = cdf_chart(&rows)? {
            html += &svg;
        }
        if let Some(svg) = peak_chart(&rows)? {
            html += &svg;
        }
        if s.curve {
            if let Some((table, text)) = goodput_table(&s, &rows, records) {
                write!(html, "<h3>Goodput past the peak</h3>{table}")?;
                write!(md, "\n### Goodput past the peak\n\n{text}\n")?;
                blocks.insert(format!("{}-goodput", s.name), text);
            }
        }
        let curves: Vec<RowSummary> = rows
            .iter()
            .filter(|r| !refuses_all(&s, r.id))
            .cloned()
            .collect();
        if let Some(svg) = goodput_chart(&curves)? {
            html += &svg;
        }
    }
    // The documents quote every suite: a block the results did not make says why, and how
    // to measure it, rather than keeping figures nobody can trace.
    for s in suite::all() {
        let measured = records
            .iter()
            .any(|r| r.suite == s.name && s.row(&r.row).is_some());
        for name in block_names(&s) {
            blocks.entry(name).or_insert_with(|| {
                if measured {
                    format!(
                        "No figures in these results: the suite's rows were skipped (the report \
                         of `sipsec lab run {} --out DIR` says why).\n",
                        s.name
                    )
                } else {
                    format!(
                        "Not in these results: `sipsec lab run {} --out DIR` measures it.\n",
                        s.name
                    )
                }
            });
        }
    }
    let peaks = super::peaks::markdown(records, m);
    if !peaks.is_empty() {
        let title = super::peaks::TITLE;
        write!(html, "<h2>{title}</h2><pre>{}</pre>", escape(&peaks))?;
        write!(md, "## {title}\n\n{peaks}\n")?;
    }
    let model_text = model::text(m);
    writeln!(
        html,
        "<h2>The component cost model</h2><p class=about>Unit costs fitted by non-negative \
         least squares (Lawson–Hanson) over every sipsec row; each row also predicted by a \
         model fitted without its configuration and its twins in other suites (held out \
         whole).</p><pre>{}</pre></body></html>",
        escape(&model_text)
    )?;
    write!(md, "## The component cost model\n\n```\n{model_text}```\n")?;
    let mut model_block = format!("```\n{model_text}```\n");
    if !peaks.is_empty() {
        write!(model_block, "\n{}:\n\n{peaks}", super::peaks::TITLE)?;
    }
    blocks.insert("model".into(), model_block);
    // What README quotes of the model: its verdict lines, not its tables.
    let summary: Vec<&str> = model_text
        .lines()
        .chain(peaks.lines())
        .filter(|l| {
            l.starts_with("Configurations held out")
                || l.starts_with("Held-out mean")
                || l.starts_with("Predicted within")
        })
        .collect();
    blocks.insert(
        "model-summary".into(),
        format!(
            "{}\n\nThe unit costs and every row's prediction: the `model` table in BENCHMARKS.md, \
             or `sipsec lab model results/lab`.\n",
            summary.join("\n\n")
        ),
    );
    Ok(Rendered {
        html,
        markdown: md,
        blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(row: &str, round: u32, cpu: f64) -> Record {
        let mut r = Record::skipped("seed000", row, round, String::new());
        r.skipped = None;
        r.cpu_us = cpu;
        r.succeeded = 100;
        r.calls = 100;
        r.counters.insert("requests_in".into(), 300);
        r.counters.insert("responses_in".into(), 300);
        r.latency_cdf_ms = vec![[0.5, 1.0], [0.99, 3.0], [1.0, 5.0]];
        r
    }

    /// The seed has chain TLS dearer than chain TCP dearer than UDP; rows measured that
    /// way are reproduced, a row measured the other way round is reported reversed, and
    /// the page is self-contained.
    #[test]
    fn tables_orderings_and_a_self_contained_page() {
        let mut records = Vec::new();
        for round in 1..=5 {
            let noise = 1.0 + 0.03 * (round as f64 - 3.0);
            records.push(rec("udp", round, 60.0 * noise));
            records.push(rec("chain-tcp", round, 50.0 * noise));
            records.push(rec("chain-tls", round, 90.0 * noise));
        }
        records.push(Record::skipped(
            "seed000",
            "chain-tls-3des",
            1,
            "3DES: none".into(),
        ));
        let s = suite::named("seed000").unwrap();
        let rows = summarise(&s, &records, Options::default());
        let tls = rows.iter().find(|r| r.id == "chain-tls").unwrap();
        assert_eq!(tls.verdict(), "dearer");
        assert!((tls.ratio.unwrap().mean - 1.5).abs() < 1e-9);
        let tcp = rows.iter().find(|r| r.id == "chain-tcp").unwrap();
        assert_eq!(tcp.verdict(), "cheaper");
        let o = orderings(&rows);
        // Seed: TLS > TCP, TLS > UDP, TCP > UDP. Ours: TLS > UDP > TCP.
        assert_eq!(o.reproduced.len(), 2, "{o:?}");
        assert_eq!(
            o.reversed,
            vec![("chain TCP".to_string(), "UDP".to_string())]
        );
        let r = render(&records, &model::fit_all(&records), Options::default()).unwrap();
        let (html, md) = (r.html, r.markdown);
        assert!(html.contains("<svg") && html.contains("chain TLS"));
        assert!(!html.contains("src="));
        assert!(!html.contains("<script") && !html.contains("<link"));
        assert!(
            md.contains("| chain TLS 3DES | | | unavailable: 3DES: none |"),
            "{md}"
        );
        assert!(md.contains("1 reversed (chain TCP > UDP)"));
    }
}

#[cfg(test)]
mod goodput_tests {
    use super::*;

    fn curve_rec(row: &str, round: u32, curve: &[[f64; 2]]) -> Record {
        let mut r = Record::skipped("overload", row, round, String::new());
        r.skipped = None;
        r.cpu_us = 100.0;
        r.succeeded = 100;
        r.calls = 100;
        r.goodput_curve = curve.to_vec();
        r
    }

    /// Every row is read at the grid's absolute rates, as a share of the one reference
    /// capacity, with an interval over five rounds.
    #[test]
    fn goodput_is_read_on_one_grid_as_a_share_of_one_reference() {
        let mut reference = curve_rec(suite::REFERENCE, 0, &[]);
        reference.peak_per_s = Some(4000.0);
        let mut records = vec![reference];
        for round in 1..=5 {
            let wobble = 100.0 * (round as f64 - 3.0);
            records.push(curve_rec(
                "off",
                round,
                &[
                    [2000.0, 2000.0],
                    [4000.0, 3900.0],
                    [6000.0, 2000.0 + wobble],
                    [8000.0, 1000.0 + wobble],
                    [12000.0, 400.0],
                ],
            ));
            records.push(curve_rec(
                "on",
                round,
                &[
                    [2000.0, 2000.0],
                    [4000.0, 3800.0],
                    [6000.0, 3600.0],
                    [8000.0, 3400.0 + wobble],
                    [12000.0, 3000.0],
                ],
            ));
        }
        let s = suite::named("overload").unwrap();
        let rows = summarise(&s, &records, Options::default());
        let (_, md) = goodput_table(&s, &rows, &records).unwrap();
        assert!(md.contains("| 2× (8000/s) |"), "{md}");
        assert!(md.contains("n = 5 rounds"), "{md}");
        let off = md
            .lines()
            .find(|l| l.starts_with("| sipsec, overload control off"))
            .unwrap();
        assert!(off.contains("| 0.25 [0.20, 0.30] |"), "{off}");
        assert!(off.contains("| 0.10 [0.10, 0.10] |"), "{off}");
        let on = md
            .lines()
            .find(|l| l.starts_with("| sipsec, local admission control"))
            .unwrap();
        assert!(on.contains("| 0.85 [0.80, 0.90] |"), "{on}");
        assert!(!md.contains(LOAD_BOUND_MARK), "{md}");

        // One round's load generator near the end of its core at 2×: that cell, and only it,
        // is marked, and the note says what the mark means.
        let i = records
            .iter()
            .position(|r| r.row == "on" && r.round == 4)
            .unwrap();
        records[i].curve_load_share = vec![0.3, 0.4, 0.5, 0.95, 0.6];
        let (_, md) = goodput_table(&s, &rows, &records).unwrap();
        let on = md
            .lines()
            .find(|l| l.starts_with("| sipsec, local admission control"))
            .unwrap();
        assert_eq!(on.matches(LOAD_BOUND_MARK).count(), 1, "{on}");
        assert!(on.contains("| 0.85 [0.80, 0.90]† |"), "{on}");
        assert!(
            md.contains("† In at least one round the load generator used 90%"),
            "{md}"
        );
    }

    /// A row naming its own capacity is read as a share of the peak searched in the same
    /// round and sitting, beside the reference; the capacity row has no line of goodput, and
    /// the note gives its peak and its share of the reference.
    #[test]
    fn a_row_is_read_against_the_capacity_searched_beside_it() {
        let mut reference = curve_rec(suite::REFERENCE, 0, &[]);
        reference.peak_per_s = Some(4000.0);
        let mut records = vec![reference];
        for round in 1..=5 {
            let wobble = 1.0 + 0.01 * (round as f64 - 3.0);
            let mut capacity = curve_rec("two-hop-capacity", round, &[]);
            capacity.peak_per_s = Some(3600.0 * wobble);
            records.push(capacity);
            // 0.95 of its own capacity in every round: 0.855 of the reference on average.
            records.push(curve_rec(
                "two-hop-oc",
                round,
                &[[8000.0, 3420.0 * wobble], [16000.0, 3420.0 * wobble]],
            ));
        }
        let s = suite::named("overload").unwrap();
        let rows = summarise(&s, &records, Options::default());
        let line = |md: &str, start: &str| {
            md.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("{start}: {md}"))
                .to_string()
        };
        let (_, md) = goodput_table(&s, &rows, &records).unwrap();
        let own = line(
            &md,
            "| two hops, upstream honours RFC 7339 ÷ its own capacity, the same round's |",
        );
        assert_eq!(own.matches("| 0.95 [0.95, 0.95]").count(), 2, "{own}");
        let shared = line(&md, "| two hops, upstream honours RFC 7339 |");
        assert!(shared.contains("| 0.85 ["), "{shared}");
        assert!(!md.contains("| two hops: the downstream's peak"), "{md}");
        assert!(
            md.contains(
                "two hops: the downstream's peak behind a plain upstream, control off, \
                 searched every round: 3600 ["
            ) && md.contains("calls/s, 0.90 [")
                && md.contains("so the grid's 16000/s is 4.4 times it."),
            "{md}"
        );
        // A capacity searched in another sitting is no pair: the round it would have
        // dragged down is left out.
        let i = records
            .iter()
            .position(|r| r.row == "two-hop-capacity" && r.round == 5)
            .unwrap();
        records[i].date = "2026-01-01".into();
        let j = records
            .iter()
            .position(|r| r.row == "two-hop-oc" && r.round == 5)
            .unwrap();
        records[j].goodput_curve = vec![[8000.0, 100.0], [16000.0, 100.0]];
        let (_, md) = goodput_table(&s, &rows, &records).unwrap();
        let own = line(
            &md,
            "| two hops, upstream honours RFC 7339 ÷ its own capacity, the same round's |",
        );
        assert_eq!(own.matches("| 0.95 (n = 4)").count(), 2, "{own}");
    }

    /// The row refusing every call gives r (its CPU per refusal over control off's per
    /// call, round by round), and the table adds the bounds r sets at each multiple and the
    /// plain callers' goodput as a share of each.
    #[test]
    fn a_refusals_cost_sets_the_bounds_read_beside_the_plain_callers() {
        let mut reference = curve_rec(suite::REFERENCE, 0, &[]);
        reference.peak_per_s = Some(1000.0);
        let mut records = vec![reference];
        for round in 1..=5 {
            records.push(curve_rec("off", round, &[]));
            // r = 0.2, wobbling by a few per cent round to round: at the suite's rate
            // against control off's 100 µs a call, and at 2× and 4× against a call at the
            // peak, the quarter core's 250 µs at 1,000 calls/s.
            let wobble = 1.0 + 0.01 * (round as f64 - 3.0);
            let mut refused = curve_rec("refused", round, &[[2000.0, 0.0], [4000.0, 0.0]]);
            refused.cpu_us = 20.0 * wobble;
            refused.curve_cpu_us = vec![50.0 * wobble, 50.0 * wobble];
            records.push(refused);
            // At 2×: the stated bound is 1/1.2, the work-conserving one 0.6/0.8 = 0.75.
            records.push(curve_rec("on", round, &[[2000.0, 600.0], [4000.0, 100.0]]));
        }
        let s = suite::named("overload").unwrap();
        let rows = summarise(&s, &records, Options::default());
        let (_, md) = goodput_table(&s, &rows, &records).unwrap();
        let line = |start: &str| {
            md.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("{start}: {md}"))
                .to_string()
        };
        let stated = line("| bound for callers that ignore feedback, 1/(1 + (k−1)·r)");
        assert!(
            stated.contains("| — | 0.83 [") && stated.contains("| — | 0.63 ["),
            "{stated}"
        );
        let read = line("| bound for callers that ignore feedback, (1 − k·r)/(1 − r)");
        assert!(read.contains("| 0.75 ["), "{read}");
        // At 4× the work-conserving bound is 0.2/0.8 = 0.25; the row kept 0.1 of capacity.
        let share = line("| sipsec, local admission control ÷ (1 − k·r)/(1 − r)");
        assert!(
            share.contains("| 0.80 [") && share.contains("| 0.40 ["),
            "{share}"
        );
        assert!(md.contains("r = 0.200 ["), "{md}");
        let r = line("| r: a refusal's CPU ÷ a call's at the peak");
        assert!(r.contains("| — | 0.20 ["), "{r}");
        // The refusing row has no line of goodput.
        assert!(!md.contains("| sipsec refusing every new call"), "{md}");
        // The refusing row's ratio is r itself.
        let refused = rows.iter().find(|r| r.id == "refused").unwrap();
        assert!((refused.ratio.as_ref().unwrap().mean - 0.2).abs() < 0.005);
    }

    /// A row below 99% success is marked, has no ratio and no verdict but "failures", and
    /// the rows against it as a baseline have none either; asked to keep failures, they do.
    #[test]
    fn failed_rows_are_marked_and_left_out_of_ratios() {
        let mut records = Vec::new();
        for round in 1..=5 {
            let mut udp = curve_rec("udp", round, &[]);
            udp.suite = "seed000".into();
            records.push(udp);
            let mut tcp = curve_rec("chain-tcp", round, &[]);
            tcp.suite = "seed000".into();
            tcp.cpu_us = 150.0;
            tcp.failed = 3;
            tcp.rate = 500.0;
            records.push(tcp);
        }
        let s = suite::named("seed000").unwrap();
        let rows = summarise(&s, &records, Options::default());
        let tcp = rows.iter().find(|r| r.id == "chain-tcp").unwrap();
        assert!(tcp.failed() && tcp.ratio.is_none());
        assert_eq!(tcp.verdict(), "failures");
        let md = markdown_table(&rows);
        assert!(md.contains("| chain TCP | 500 | **97.1%** |"), "{md}");
        assert!(notes(&rows).iter().any(|n| n.contains("97.1%")));
        let kept = summarise(
            &s,
            &records,
            Options {
                with_failures: true,
            },
        );
        let tcp = kept.iter().find(|r| r.id == "chain-tcp").unwrap();
        assert!((tcp.ratio.unwrap().mean - 1.5).abs() < 1e-9);
    }
}

#[cfg(test)]
mod ablation_tests {
    use super::*;

    fn rec(row: &str, round: u32, cpu: f64, wakeups: f64) -> Record {
        let mut r = Record::skipped("seed002", row, round, String::new());
        r.skipped = None;
        r.cpu_us = cpu;
        r.wakeups = wakeups;
        r.succeeded = 100;
        r.calls = 100;
        r
    }

    /// Each saving is shown with the wake-ups per call of its base and ablated rows.
    #[test]
    fn the_ablation_table_shows_both_rows_wakeups() {
        let mut records = Vec::new();
        for round in 1..=5 {
            let noise = 1.0 + 0.01 * (f64::from(round) - 3.0);
            records.push(rec("outbound-tls", round, 200.0 * noise, 5.95));
            records.push(rec("outbound-tls-aead", round, 150.0 * noise, 2.75));
        }
        let s = suite::named("seed002").unwrap();
        let (html, md) = ablation(&s, &summarise(&s, &records, Options::default()));
        assert!(
            md.contains("| outbound TLS, no-op record cipher | 200.0 | 150.0 | 50.0 |"),
            "{md}"
        );
        let line = md
            .lines()
            .find(|l| l.contains("no-op record cipher"))
            .unwrap();
        assert!(line.ends_with("| 5.95 → 2.75 |"), "{md}");
        assert!(html.contains("<td>5.95 → 2.75</td>"), "{html}");
    }
}
