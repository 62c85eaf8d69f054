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
use super::suite::{self, Suite};
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
    pub rounds: usize,
    pub cpu_us: Option<f64>,
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
    /// `[offered/s, goodput/s]`, the median over rounds at each multiple of the peak.
    pub goodput_curve: Vec<[f64; 2]>,
    pub skipped: Option<String>,
}

impl RowSummary {
    /// What the intervals allow us to say of this row against its baseline.
    pub(crate) fn verdict(&self) -> &'static str {
        match self.ratio {
            _ if self.id == self.baseline => "baseline",
            Some(r) if r.high < 1.0 => "cheaper",
            Some(r) if r.low > 1.0 => "dearer",
            Some(_) => "not separable",
            None => "—",
        }
    }
}

const COUNT_NAMES: [&str; 5] = ["msgs", "conns", "full hs", "resumed hs", "auth"];

fn summarise(s: &Suite, records: &[Record]) -> Vec<RowSummary> {
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
            let base: BTreeMap<u32, f64> = of(row.baseline)
                .iter()
                .filter(|r| r.skipped.is_none())
                .map(|r| (r.round, r.cpu_us))
                .collect();
            let (mut mine, mut theirs) = (Vec::new(), Vec::new());
            for r in &measured {
                if let Some(b) = base.get(&r.round) {
                    mine.push(r.cpu_us);
                    theirs.push(*b);
                }
            }
            let count = |f: fn(&Record) -> f64| med(&|r| f(r));
            let peaks: Vec<f64> = measured.iter().filter_map(|r| r.peak_per_s).collect();
            Some(RowSummary {
                id: row.id,
                label: row.label,
                baseline: row.baseline,
                rounds: measured.len(),
                cpu_us: med(&|r| r.cpu_us),
                ratio: stats::ratio(&mine, &theirs),
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
            if ra.low > rb.high {
                o.reproduced.push(pair);
            } else if ra.high < rb.low {
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

fn ratio_text(r: Option<Ratio>) -> String {
    r.map_or("—".into(), |r| {
        format!("{:.2} [{:.2}, {:.2}]", r.median, r.low, r.high)
    })
}

/// The markdown table of one suite.
pub(crate) fn markdown_table(rows: &[RowSummary]) -> String {
    let mut t = String::from(
        "| configuration | µs/op | × baseline [95% CI] | verdict | seed | seed × | wake-ups/op | msgs | conns | full hs | resumed hs | auth | peak/s | instr/op |\n\
         |---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        if let Some(why) = &r.skipped {
            writeln!(
                t,
                "| {} | unavailable: {why} | | | {} | {} | | | | | | | | |",
                r.label,
                r.seed.unwrap_or(""),
                opt(r.seed_ratio, 2)
            )
            .unwrap();
            continue;
        }
        writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.label,
            opt(r.cpu_us, 1),
            ratio_text(r.ratio),
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

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The HTML table of one suite.
fn html_table(rows: &[RowSummary]) -> String {
    let mut t = String::from(
        "<table><tr><th>configuration</th><th>µs/op</th><th>× baseline [95% CI]</th>\
         <th>verdict</th><th>seed</th><th>seed ×</th><th>wake-ups/op</th>",
    );
    for c in COUNT_NAMES {
        write!(t, "<th>{c}/op</th>").unwrap();
    }
    t += "<th>peak/s</th><th>instr/op</th><th>rounds</th></tr>\n";
    for r in rows {
        if let Some(why) = &r.skipped {
            writeln!(
                t,
                "<tr class=skip><td>{}</td><td colspan=3>unavailable: {}</td><td>{}</td><td>{}</td>\
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
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td>",
            escape(r.label),
            opt(r.cpu_us, 1),
            ratio_text(r.ratio),
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
            let interval = r.ratio.filter(|_| r.id != r.baseline).map(|x| {
                let scale = cpu / x.median;
                (x.low * scale, x.high * scale)
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
/// base, that share of the base, and the Amdahl bound on speed-up with its 95% interval.
fn ablation(s: &Suite, rows: &[RowSummary]) -> (String, String) {
    let mut html = String::from(
        "<table><tr><th>configuration</th><th>base µs/call</th><th>ablated µs/call</th>\
         <th>saving µs</th><th>share of base [95% CI]</th><th>Amdahl bound [95% CI]</th></tr>\n",
    );
    let mut md = String::from(
        "| configuration | base µs/call | ablated µs/call | saving µs | share of base [95% CI] \
         | Amdahl bound [95% CI] |\n|---|---:|---:|---:|---:|---:|\n",
    );
    let mut any = false;
    for (base, r, saving, q) in savings(s, rows) {
        any = true;
        let share = format!(
            "{:.0}% [{:.0}%, {:.0}%]",
            (1.0 - q.median) * 100.0,
            (1.0 - q.high) * 100.0,
            (1.0 - q.low) * 100.0
        );
        let bound = format!(
            "{:.2}× [{:.2}, {:.2}]",
            1.0 / q.median,
            1.0 / q.high,
            1.0 / q.low
        );
        let (b, a) = (base.cpu_us.unwrap_or(0.0), r.cpu_us.unwrap_or(0.0));
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{b:.1}</td><td>{a:.1}</td><td>{saving:.1}</td><td>{share}</td>\
             <td>{bound}</td></tr>",
            escape(r.label)
        );
        let _ = writeln!(
            md,
            "| {} | {b:.1} | {a:.1} | {saving:.1} | {share} | {bound} |",
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
            value: 1.0 / q.median,
            interval: Some((1.0 / q.high, 1.0 / q.low)),
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
    let series: Vec<(String, Vec<(f64, f64)>)> = rows
        .iter()
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

/// The goodput a row keeps at `multiple` times its own peak, from its curve (the point whose
/// asked rate was nearest): `(offered/s, goodput/s)`.
pub(crate) fn goodput_at(r: &RowSummary, multiple: f64) -> Option<(f64, f64)> {
    let peak = r.peak_per_s?;
    r.goodput_curve
        .iter()
        .min_by(|a, b| {
            let d = |p: &[f64; 2]| (p[0] / peak - multiple).abs();
            d(a).total_cmp(&d(b))
        })
        .filter(|p| (p[0] / peak - multiple).abs() < 0.2 * multiple)
        .map(|p| (p[0], p[1]))
}

/// Each row's searched peak, the best goodput any point of its curve reached, and the
/// goodput it keeps at twice and three times its peak, each as a share of the uncontrolled
/// server's best goodput (the first row's): the peak to hold. The searched peak overstates
/// what a server that collapses can sustain (a short trial fits in its buffers), so the
/// shares are of sustained goodput.
fn goodput_table(rows: &[RowSummary]) -> (String, String) {
    let best = |r: &RowSummary| r.goodput_curve.iter().map(|p| p[1]).reduce(f64::max);
    let reference = rows.first().and_then(best);
    let mut html = String::from(
        "<table><tr><th>row</th><th>searched peak /s</th><th>best goodput /s</th>\
         <th>goodput at 2× /s</th><th>÷ uncontrolled best</th><th>goodput at 3× /s</th>\
         <th>÷ uncontrolled best</th></tr>",
    );
    let mut md = String::from(
        "| row | searched peak /s | best goodput /s | goodput at 2× /s | ÷ uncontrolled best | goodput at 3× /s | ÷ uncontrolled best |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    let f = |v: Option<f64>, digits: usize| v.map_or("—".into(), |v| format!("{v:.digits$}"));
    for r in rows {
        let two = goodput_at(r, 2.0).map(|p| p.1);
        let three = goodput_at(r, 3.0).map(|p| p.1);
        let share = |g: Option<f64>| g.zip(reference).map(|(g, p)| g / p);
        let cells = [
            f(r.peak_per_s, 0),
            f(best(r), 0),
            f(two, 0),
            f(share(two), 2),
            f(three, 0),
            f(share(three), 2),
        ];
        write!(html, "<tr><td>{}</td>", escape(r.label)).ok();
        for c in &cells {
            write!(html, "<td class=num>{c}</td>").ok();
        }
        html += "</tr>";
        writeln!(md, "| {} | {} |", r.label, cells.join(" | ")).ok();
    }
    html += "</table>";
    (html, md)
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

/// Writes `dir/report.html` and `dir/report.md` from `dir/results.jsonl`.
pub fn write(dir: &Path) -> Result<()> {
    let records = results::load(dir)?;
    if records.is_empty() {
        anyhow::bail!(
            "no results in {}: run `sipsec lab run --out {}` first",
            results::path(dir).display(),
            dir.display()
        );
    }
    let m = model::fit_all(&records);
    let (html, md) = render(&records, &m)?;
    let (h, k) = (dir.join("report.html"), dir.join("report.md"));
    std::fs::write(&h, html).with_context(|| format!("cannot write {}", h.display()))?;
    std::fs::write(&k, md).with_context(|| format!("cannot write {}", k.display()))?;
    eprintln!("sipsec lab: wrote {} and {}", h.display(), k.display());
    Ok(())
}

/// The HTML page and the markdown export.
pub fn render(records: &[Record], m: &Model) -> Result<(String, String)> {
    let mut html = format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>sipsec lab report</title>\
         <style>{STYLE}</style></head><body><h1>sipsec lab report</h1>\
         <p>{} results. Each row is server CPU per operation at a fixed rate (the \
         scheduler's on-CPU time of every server thread over the operations that succeeded), the median over rounds; \
         its ratio to the baseline is the median of per-round ratios with a bootstrap 95% \
         interval, and a row is called cheaper or dearer only where that interval excludes \
         1. Counts per operation come from the server's own counters.</p>\n",
        records.len()
    );
    let mut md = String::from("# sipsec lab report\n\n");
    for s in suite::all() {
        let rows = summarise(&s, records);
        if rows.is_empty() {
            continue;
        }
        write!(
            html,
            "<h2>{}</h2><p class=about>{}</p>",
            escape(s.title),
            escape(s.about)
        )?;
        html += &html_table(&rows);
        write!(md, "## {}\n\n{}\n\n", s.title, s.about)?;
        md += &markdown_table(&rows);
        let o = orderings(&rows);
        let n = o.reproduced.len() + o.reversed.len() + o.not_separable.len();
        if n > 0 {
            let pairs = |v: &[(String, String)]| {
                v.iter()
                    .map(|(a, b)| format!("{a} > {b}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            let line = format!(
                "Of the seed's {n} orderings (one row ≥ 10% dearer than another with the same \
                 baseline): {} reproduced, {} reversed ({}), {} not separable by our intervals.",
                o.reproduced.len(),
                o.reversed.len(),
                pairs(&o.reversed),
                o.not_separable.len()
            );
            write!(html, "<p>{}</p>", escape(&line))?;
            write!(md, "\n{line}\n\n")?;
        }
        if s.lab_build {
            let (table, text) = ablation(&s, &rows);
            if !text.is_empty() {
                write!(
                    html,
                    "<h3>Ablation: the most making a stage free could buy</h3>{table}"
                )?;
                write!(md, "\n### Ablation\n\n{text}\n")?;
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
            let (table, text) = goodput_table(&rows);
            write!(html, "<h3>Goodput past the peak</h3>{table}")?;
            write!(md, "\n### Goodput past the peak\n\n{text}\n")?;
        }
        if let Some(svg) = goodput_chart(&rows)? {
            html += &svg;
        }
    }
    let peaks = super::peaks::markdown(records, m);
    if !peaks.is_empty() {
        let title = "Predicted and measured peaks, server-set";
        write!(html, "<h2>{title}</h2><pre>{}</pre>", escape(&peaks))?;
        write!(md, "## {title}\n\n{peaks}\n")?;
    }
    let model_text = model::text(m);
    writeln!(
        html,
        "<h2>The component cost model</h2><p class=about>Unit costs fitted by non-negative \
         least squares over every sipsec row; each row also predicted by a model fitted \
         without it (held out).</p><pre>{}</pre></body></html>",
        escape(&model_text)
    )?;
    write!(md, "## The component cost model\n\n```\n{model_text}```\n")?;
    Ok((html, md))
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
        let rows = summarise(&s, &records);
        let tls = rows.iter().find(|r| r.id == "chain-tls").unwrap();
        assert_eq!(tls.verdict(), "dearer");
        assert!((tls.ratio.unwrap().median - 1.5).abs() < 1e-9);
        let tcp = rows.iter().find(|r| r.id == "chain-tcp").unwrap();
        assert_eq!(tcp.verdict(), "cheaper");
        let o = orderings(&rows);
        // Seed: TLS > TCP, TLS > UDP, TCP > UDP. Ours: TLS > UDP > TCP.
        assert_eq!(o.reproduced.len(), 2, "{o:?}");
        assert_eq!(
            o.reversed,
            vec![("chain TCP".to_string(), "UDP".to_string())]
        );
        let (html, md) = render(&records, &model::fit_all(&records)).unwrap();
        assert!(html.contains("<svg") && html.contains("chain TLS"));
        assert!(!html.contains("src="));
        assert!(!html.contains("<script") && !html.contains("<link"));
        assert!(md.contains("| chain TLS 3DES | unavailable: 3DES: none |"));
        assert!(md.contains("1 reversed (chain TCP > UDP)"));
    }
}

#[cfg(test)]
mod goodput_tests {
    use super::*;

    fn curve_rec(row: &str, peak: f64, curve: &[[f64; 2]]) -> Record {
        let mut r = Record::skipped("overload", row, 1, String::new());
        r.skipped = None;
        r.cpu_us = 100.0;
        r.succeeded = 100;
        r.calls = 100;
        r.peak_per_s = Some(peak);
        r.goodput_curve = curve.to_vec();
        r
    }

    /// Shares are of the uncontrolled row's best goodput, not of its searched peak, and the
    /// points at 2× and 3× are those nearest each row's own peak.
    #[test]
    fn goodput_past_the_peak_is_a_share_of_the_uncontrolled_best() {
        let records = vec![
            curve_rec(
                "off",
                7000.0,
                &[
                    [3500.0, 3500.0],
                    [5250.0, 5000.0],
                    [14000.0, 900.0],
                    [21000.0, 400.0],
                ],
            ),
            curve_rec(
                "on",
                5000.0,
                &[[2500.0, 2500.0], [10000.0, 4500.0], [15000.0, 4000.0]],
            ),
        ];
        let s = suite::named("overload").unwrap();
        let rows = summarise(&s, &records);
        let (_, md) = goodput_table(&rows);
        assert!(
            md.contains("| sipsec, overload control off | 7000 | 5000 | 900 | 0.18 | 400 | 0.08 |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| sipsec, local admission control | 5000 | 4500 | 4500 | 0.90 | 4000 | 0.80 |"
            ),
            "{md}"
        );
    }
}
