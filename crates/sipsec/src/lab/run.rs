//! `sipsec lab run`: every row of the chosen suites, round after round, rows alternated
//! within a round (forwards in odd rounds, backwards in even ones) so slow drift of the
//! machine falls on all rows alike. Each row is one `sipsec bench` run in this process — the
//! server started and pinned to CPU 0, the load pinned to CPU 1 — and its record is
//! appended to `results.jsonl` as soon as it ends. `--resume` skips what is already there.

use super::results::{self, Record};
use super::suite::{self, Row, Server, Setup, Suite};
use crate::bench::{self, BenchArgs};
use anyhow::{bail, Context, Result};
use clap::Parser;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `sipsec lab run` options.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Suites to run (default: all): seed000, seed004.
    pub suites: Vec<String>,
    /// Directory for results.jsonl (created if missing).
    #[arg(long, default_value = "lab-results")]
    pub out: PathBuf,
    /// Rounds (default: 3, or 1 with --quick).
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Small runs, for CI and a first look: few operations per row, one round.
    #[arg(long)]
    pub quick: bool,
    /// Carry on with a results file that already has rows (an interrupted run): rows and
    /// rounds already recorded are not run again.
    #[arg(long)]
    pub resume: bool,
    /// Also search each row's peak rate (≥ 99% of operations within 500 ms).
    #[arg(long)]
    pub peak: bool,
    /// Only the rows whose id contains this text (and their baselines).
    #[arg(long)]
    pub only: Option<String>,
}

/// Rate and operations per row for a suite: the seed 000 rows include TLS with a full
/// handshake per call on both sides, which the load generator's one core keeps up with at
/// 500 calls/s; seed 004's operations are cheaper.
fn sizes(suite: &str, quick: bool) -> (f64, u64) {
    match (suite, quick) {
        ("seed000", false) => (500.0, 4_000),
        ("seed000", true) => (500.0, 1_000),
        (_, false) => (2_000.0, 12_000),
        (_, true) => (1_000.0, 1_000),
    }
}

/// What every row shares: certificates, the user database, callers' credentials.
struct Workspace {
    dir: tempfile::TempDir,
    /// The shared Kamailio kit, if it is found and Kamailio is installed.
    kamailio: Result<PathBuf, String>,
    users_ready: bool,
}

impl Workspace {
    fn new() -> Result<Workspace> {
        let dir = tempfile::tempdir()?;
        bench::modes::make_certs(dir.path(), crate::tls::certs::KeyKind::EcdsaP256)?;
        let callers: String = (0..suite::USERS)
            .map(|i| format!("user{i},pw{i}\n"))
            .collect();
        std::fs::write(dir.path().join("callers.csv"), &callers)?;
        std::fs::write(
            dir.path().join("users.csv"),
            format!("username,password\n{callers}"),
        )?;
        Ok(Workspace {
            dir,
            kamailio: kamailio_kit(),
            users_ready: false,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes the config a digest row runs with and, the first time, imports the users.
    fn digest_config(&mut self, row: &Row, args: &BenchArgs) -> Result<PathBuf> {
        let config = bench::default_config(self.dir.path(), false, &args.streams, self.dir.path())
            + "[auth]\nscheme = \"digest\"\nrealm = \"bench.test\"\n\
               methods = [\"INVITE\", \"REGISTER\"]\n";
        let path = self.path(&format!("{}.toml", row.id));
        std::fs::write(&path, config)?;
        if !self.users_ready {
            let out = Command::new(std::env::current_exe()?)
                .args(["users", "--config"])
                .arg(&path)
                .arg("import")
                .arg(self.path("users.csv"))
                .stdout(Stdio::null())
                .output()
                .context("cannot run sipsec users import")?;
            if !out.status.success() {
                bail!(
                    "sipsec users import failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            self.users_ready = true;
        }
        Ok(path)
    }
}

/// Kamailio's config from the shared kit (`../shared/bench/kamailio/proxy.cfg`, from the
/// working directory or beside this source tree), or why the reference row cannot run.
fn kamailio_kit() -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join("kamailio").is_file()));
    if !on_path {
        return Err("Kamailio is not installed (apt-get install kamailio)".into());
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    [PathBuf::from("../shared"), here]
        .into_iter()
        .map(|d| d.join("bench/kamailio/proxy.cfg"))
        .find(|p| p.is_file())
        .ok_or_else(|| "the Kamailio kit ../shared/bench/kamailio/proxy.cfg is not here".into())
}

/// Kamailio on the shared kit's proxy config, pinned to CPU 0; stopped on drop.
struct Kamailio(Child);

impl Kamailio {
    fn start(kit: &Path, work: &Path) -> Result<Kamailio> {
        let cfg = work.join("kamailio.cfg");
        std::fs::copy(kit, &cfg)?;
        let child = Command::new("taskset")
            .args(["-c", "0", "kamailio", "-DD", "-E", "-f"])
            .arg(&cfg)
            .args(["-m", "512", "-M", "32", "-Y"])
            .arg(work)
            .arg("-w")
            .arg(work)
            .args(["-A", "UAS_URI=\"sip:127.0.0.3:35080;transport=udp\""])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start kamailio")?;
        std::thread::sleep(std::time::Duration::from_secs(2));
        Ok(Kamailio(child))
    }
}

impl Drop for Kamailio {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// Parses `sipsec bench` words into its options, as the command line would.
fn bench_args(words: &[String]) -> Result<BenchArgs> {
    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: BenchArgs,
    }
    let argv = std::iter::once("sipsec-bench".to_string()).chain(words.iter().cloned());
    Ok(Wrapper::try_parse_from(argv)?.args)
}

/// Measures one row once.
fn measure(
    ws: &mut Workspace,
    suite: &Suite,
    row: &Row,
    round: u32,
    a: &RunArgs,
    stop: &AtomicBool,
) -> Result<Option<Record>> {
    if let Some(why) = row.unavailable {
        return Ok(Some(Record::skipped(suite.name, row.id, round, why.into())));
    }
    let (rate, calls) = sizes(suite.name, a.quick);
    let mut words: Vec<String> = [
        "--rate".to_string(),
        rate.to_string(),
        "--calls".to_string(),
        calls.to_string(),
        "--warmup-calls".to_string(),
        ((rate / 2.0) as u64).max(100).to_string(),
        "--quiet".to_string(),
    ]
    .into_iter()
    .chain(row.bench.iter().map(|w| w.to_string()))
    .collect();
    words.extend(["--tls-dir".to_string(), ws.dir.path().display().to_string()]);
    if a.peak {
        words.extend(["--find-peak", "--step-s", "2"].map(String::from));
    }
    let _kamailio = match row.server {
        Server::Kamailio => match &ws.kamailio {
            Err(why) => {
                return Ok(Some(Record::skipped(
                    suite.name,
                    row.id,
                    round,
                    why.clone(),
                )))
            }
            Ok(kit) => {
                let k = Kamailio::start(kit, ws.dir.path())?;
                words.extend([
                    "--server-pid".to_string(),
                    k.0.id().to_string(),
                    "--target".to_string(),
                    "127.0.0.1:35060".to_string(),
                ]);
                Some(k)
            }
        },
        Server::Sipsec => None,
    };
    if row.setup == Setup::Digest {
        let config = ws.digest_config(row, &bench_args(&words)?)?;
        words.extend([
            "--config".to_string(),
            config.display().to_string(),
            "--users".to_string(),
            ws.path("callers.csv").display().to_string(),
        ]);
    }
    let record = match bench::run_until(bench_args(&words)?, stop) {
        Ok(r) if r.load.interrupted || stop.load(Ordering::Relaxed) => return Ok(None),
        Ok(r) => Record::measured(suite.name, row.id, round, &r),
        Err(e) => Record::skipped(suite.name, row.id, round, format!("failed: {e:#}")),
    };
    Ok(Some(record))
}

/// The rows of `suite` that `only` selects, with their baselines.
fn selected<'s>(suite: &'s Suite, only: Option<&str>) -> Vec<&'s Row> {
    let Some(only) = only else {
        return suite.rows.iter().collect();
    };
    let chosen: HashSet<&str> = suite
        .rows
        .iter()
        .filter(|r| r.id.contains(only))
        .flat_map(|r| [r.id, r.baseline])
        .collect();
    suite
        .rows
        .iter()
        .filter(|r| chosen.contains(r.id))
        .collect()
}

/// `sipsec lab run`.
pub fn run(a: RunArgs) -> Result<()> {
    let suites: Vec<Suite> = if a.suites.is_empty() {
        suite::all()
    } else {
        a.suites
            .iter()
            .map(|n| {
                suite::named(n).with_context(|| {
                    let names: Vec<_> = suite::all().iter().map(|s| s.name).collect();
                    format!("no suite {n:?}; the suites are {}", names.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    let rounds = a.rounds.unwrap_or(if a.quick { 1 } else { 3 });
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let existing = results::load(&a.out)?;
    if !existing.is_empty() && !a.resume {
        bail!(
            "{} already holds {} results: add --resume to carry on, or choose another --out",
            results::path(&a.out).display(),
            existing.len()
        );
    }
    let done: HashSet<(String, String, u32)> = existing
        .iter()
        .map(|r| (r.suite.clone(), r.row.clone(), r.round))
        .collect();
    let mut todo = Vec::new();
    for round in 1..=rounds {
        for s in &suites {
            let mut rows = selected(s, a.only.as_deref());
            if round % 2 == 0 {
                rows.reverse();
            }
            for r in rows {
                if !done.contains(&(s.name.to_string(), r.id.to_string(), round)) {
                    todo.push((s, r, round));
                }
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let mut ws = Workspace::new()?;
    let bar = indicatif::ProgressBar::new(todo.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} rows, ETA {eta}: {msg}",
        )?
        .progress_chars("=> "),
    );
    for (s, row, round) in todo {
        bar.set_message(format!("{} {} (round {round} of {rounds})", s.name, row.id));
        let Some(record) = measure(&mut ws, s, row, round, &a, &stop)? else {
            break;
        };
        results::append(&a.out, &record)?;
        if let Some(why) = &record.skipped {
            bar.println(format!("{} {}: skipped: {why}", s.name, row.id));
        }
        bar.inc(1);
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    bar.finish_and_clear();
    let path = results::path(&a.out);
    if stop.load(Ordering::Relaxed) {
        eprintln!(
            "sipsec lab: interrupted; what finished is in {}: `sipsec lab run --resume --out {}` carries on",
            path.display(),
            a.out.display()
        );
    } else {
        eprintln!(
            "sipsec lab: results in {}; `sipsec lab report {}` writes the report",
            path.display(),
            a.out.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_selects_rows_with_their_baselines() {
        let s = suite::named("seed000").unwrap();
        let ids: Vec<_> = selected(&s, Some("local-tls-mutual"))
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, ["udp-auth", "local-tls-mutual"]);
        assert_eq!(selected(&s, None).len(), s.rows.len());
    }

    #[test]
    fn every_row_parses_as_bench_options() {
        for s in suite::all() {
            for r in &s.rows {
                let words: Vec<String> = r.bench.iter().map(|w| w.to_string()).collect();
                bench_args(&words).unwrap_or_else(|e| panic!("{}: {e}", r.id));
            }
        }
    }
}
