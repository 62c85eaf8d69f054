//! The cluster testbed in the lab (`sipsec lab run cluster`, issue 36): a topology of many
//! hosts, which the one-server rows of the other suites do not fit, so the lab calls the
//! documented script that builds it (`scripts/cluster_testbed.py`: network namespaces with
//! addresses from 198.18.0.0/15, a private PostgreSQL, three nodes, `sipsec authd`, a
//! dispatcher and the load; root) once per round, keeps what each scenario gave in
//! `cluster.jsonl` beside `results.jsonl`, and the report gives them a section of their own.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The name `lab run` takes, and the heading's key.
pub const NAME: &str = "cluster";

/// The file the scenarios' results are kept in, in the results directory.
pub fn path(dir: &Path) -> PathBuf {
    dir.join("cluster.jsonl")
}

/// The testbed script: in the repository this lab was built from, else under the current
/// directory.
fn script() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cluster_testbed.py");
    if built.exists() {
        built
    } else {
        PathBuf::from("scripts/cluster_testbed.py")
    }
}

/// The scenarios' lines already recorded in `dir`.
fn load(dir: &Path) -> Result<Vec<Value>> {
    let p = path(dir);
    let Ok(text) = std::fs::read_to_string(&p) else {
        return Ok(Vec::new());
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("a bad line in {}", p.display())))
        .collect()
}

/// Runs the testbed `rounds` times into `dir` (those rounds recorded already are kept with
/// `resume`); whether every round's checks held.
pub fn run(dir: &Path, rounds: u32, resume: bool) -> Result<bool> {
    let done: Vec<u64> = load(dir)?
        .iter()
        .filter_map(|v| v["round"].as_u64())
        .collect();
    if !done.is_empty() && !resume {
        bail!(
            "{} already holds cluster results: add --resume to carry on, or choose another --out",
            path(dir).display()
        );
    }
    let exe = std::env::current_exe().context("cannot find this sipsec binary")?;
    let mut held = true;
    for round in 1..=rounds {
        if done.contains(&u64::from(round)) {
            continue;
        }
        eprintln!("sipsec lab: cluster testbed, round {round} of {rounds}");
        let status = std::process::Command::new("python3")
            .arg(script())
            .arg("--sipsec")
            .arg(&exe)
            .arg("--json")
            .arg(path(dir))
            .args(["--round", &round.to_string()])
            .args(["--commit", super::results::COMMIT])
            .status()
            .context("cannot run python3 (the testbed is a Python script)")?;
        held &= status.success();
    }
    Ok(held)
}

/// The scenarios' results as a markdown table with its heading's note, or `None` when `dir`
/// has none: per scenario, its rounds, the calls that succeeded of those made (pooled), and
/// what else it checked.
pub fn markdown(dir: &Path) -> Result<Option<String>> {
    let lines = load(dir)?;
    if lines.is_empty() {
        return Ok(None);
    }
    let mut by: BTreeMap<(usize, String), Vec<&Value>> = BTreeMap::new();
    for v in &lines {
        let order = v["order"].as_u64().unwrap_or(9) as usize;
        let name = v["scenario"].as_str().unwrap_or("?").to_string();
        by.entry((order, name)).or_default().push(v);
    }
    let mut t = String::from(
        "| scenario | rounds | calls during | calls after | checks |\n|---|---:|---:|---:|---|\n",
    );
    let pooled = |vs: &[&Value], key: &str| -> String {
        let (ok, all) = vs.iter().fold((0, 0), |(ok, all), v| {
            (
                ok + v[key][0].as_u64().unwrap_or(0),
                all + v[key][1].as_u64().unwrap_or(0),
            )
        });
        if all == 0 {
            "—".into()
        } else {
            format!("{ok} of {all} ({:.1}%)", 100.0 * ok as f64 / all as f64)
        }
    };
    for ((_, name), vs) in &by {
        let checks: Vec<String> = vs
            .iter()
            .filter_map(|v| v["checks"].as_str().map(str::to_string))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        writeln!(
            t,
            "| {name} | {} | {} | {} | {} |",
            vs.len(),
            pooled(vs, "during"),
            pooled(vs, "after"),
            checks.join("; ")
        )?;
    }
    let mut commits: Vec<&str> = lines.iter().filter_map(|v| v["commit"].as_str()).collect();
    commits.sort_unstable();
    commits.dedup();
    Ok(Some(format!(
        "Every part a host of its own (network namespaces, 198.18.36.0/24): a private \
         PostgreSQL, three durable nodes with Proxychain against one `sipsec authd`, a \
         dispatcher and the load (`scripts/cluster_testbed.py`). Measured at commit {}; \
         `sipsec lab run cluster --out DIR` (root) runs it again.\n\n{t}",
        if commits.is_empty() {
            "unrecorded".to_string()
        } else {
            commits.join(", ")
        }
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_are_pooled_over_rounds_in_their_order() {
        let dir = tempfile::tempdir().unwrap();
        assert!(markdown(dir.path()).unwrap().is_none());
        let lines = [
            r#"{"round":1,"order":2,"scenario":"node-killed","during":[200,200],"after":[300,300],"checks":"20 of 20 registrations held","commit":"abc"}"#,
            r#"{"round":1,"order":1,"scenario":"calls","during":[0,0],"after":[300,300],"checks":"","commit":"abc"}"#,
            r#"{"round":2,"order":2,"scenario":"node-killed","during":[190,200],"after":[299,300],"checks":"20 of 20 registrations held","commit":"abc"}"#,
        ];
        std::fs::write(path(dir.path()), lines.join("\n") + "\n").unwrap();
        let md = markdown(dir.path()).unwrap().unwrap();
        let calls = md.find("| calls |").unwrap();
        let killed = md.find("| node-killed | 2 | 390 of 400 (97.5%) | 599 of 600 (99.8%) | 20 of 20 registrations held |");
        assert!(killed.is_some_and(|k| k > calls), "{md}");
        assert!(
            md.contains("| calls | 1 | — | 300 of 300 (100.0%) |"),
            "{md}"
        );
        assert!(md.contains("commit abc;"), "{md}");
    }
}
