//! `sipsec lab run`: every row of the chosen suites, round after round, rows alternated
//! within a round (forwards in odd rounds, backwards in even ones) so slow drift of the
//! machine falls on all rows alike. Each row is one `sipsec bench` run in this process — the
//! server started and pinned to CPU 0, the load pinned to CPU 1 — and its record is
//! appended to `results.jsonl` as soon as it ends. `--resume` skips what is already there.
//! A run that ends (not interrupted) writes the report of everything in its directory.

use super::results::{self, Record};
use super::suite::{self, Row, Server, Setup, Suite};
use crate::bench::{self, BenchArgs};
use anyhow::{bail, Context, Result};
use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `sipsec lab run` options.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Suites to run (default: all): seed000, seed001, seed002, seed003, seed004, overload,
    /// identity (STIR/SHAKEN);
    /// and `cluster`, the cluster testbed (root), only when named.
    pub suites: Vec<String>,
    /// Directory for results.jsonl (created if missing).
    #[arg(long, default_value = "lab-results")]
    pub out: PathBuf,
    /// Rounds (default: 5, the fewest the report gives intervals for; 1 with --quick).
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Small runs, for CI and a first look: few operations per row, one round. Not a
    /// result: the report gives no intervals and ranks nothing below 5 rounds.
    #[arg(long)]
    pub quick: bool,
    /// Exit non-zero when a row ran with fewer than 99% of its operations succeeding (CI's
    /// quick run uses it); without it such rows are only marked in the report.
    #[arg(long)]
    pub strict: bool,
    /// Carry on with a results file that already has rows (an interrupted run): rows and
    /// rounds already recorded are not run again.
    #[arg(long)]
    pub resume: bool,
    /// Also search each row's peak rate (≥ 99% of operations within 500 ms).
    #[arg(long)]
    pub peak: bool,
    /// Also measure each row's goodput at 0.5 to 2 times its peak (implies --peak): seed
    /// 004's curve past the peak.
    #[arg(long)]
    pub curve: bool,
    /// The most of a core the server is held to during --peak and --curve searches (cgroup v1
    /// quota; root), lowered per row to leave the load generator 3 times the server's pace,
    /// so the server sets the peak; 1 for a whole core (no quota). Rows that already run
    /// under a quota (the overload suite) keep theirs.
    #[arg(long, default_value_t = PEAK_QUOTA)]
    pub peak_quota: f64,
    /// Also count each sipsec row's user-space instructions per operation with callgrind, in
    /// a short extra run at 50 operations/s (valgrind): counts noise cannot move, for
    /// comparing builds.
    #[arg(long)]
    pub instructions: bool,
    /// Only the rows whose id contains this text, or one of these comma-separated texts
    /// (and their baselines).
    #[arg(long)]
    pub only: Option<String>,
}

/// Rate and operations per row for a suite: the seed 000, 002 and 003 rows include TLS with a
/// full handshake per call on both sides, which the load generator's one core keeps up with
/// at 500 calls/s; seed 004's operations are cheaper.
fn sizes(suite: &str, quick: bool) -> (f64, u64) {
    match (suite, quick) {
        ("seed000" | "seed002" | "seed003", false) => (500.0, 4_000),
        ("seed000" | "seed002" | "seed003", true) => (500.0, 1_000),
        ("seed001", false) => (1_000.0, 8_000),
        ("seed001", true) => (1_000.0, 1_000),
        // Below the peak of a server held to a quarter of a core.
        ("overload", false) => (1_000.0, 6_000),
        ("overload", true) => (300.0, 300),
        (_, false) => (2_000.0, 12_000),
        (_, true) => (1_000.0, 1_000),
    }
}

/// Where seed 001's helpers listen: the authority, and the delay relays in front of it and
/// of the database. Below Linux's ephemeral range (32768–60999), where an outgoing
/// connection (the server's to PostgreSQL, say) may hold any port: CI once found 35072
/// taken.
const AUTHD: &str = "127.0.0.1:31070";
const AUTHD_RELAY: &str = "127.0.0.1:31071";
const DB_RELAY: &str = "127.0.0.1:31072";
/// The upstream proxy of the overload suite's two-hop rows.
const UPSTREAM: &str = "127.0.0.1:31073";
const REALM: &str = "bench.test";

/// What every row shares: certificates, the user databases, callers' credentials.
struct Workspace {
    dir: tempfile::TempDir,
    /// Whether Kamailio is installed (the reference row runs), or why not.
    kamailio: Result<(), String>,
    /// PostgreSQL for seed 001's digest rows (`SIPSEC_TEST_POSTGRES`), or why there is none.
    postgres: Result<String, String>,
    sqlite_users: bool,
    postgres_users: bool,
    /// Server configs written so far (each run gets a directory of its own).
    runs: u32,
}

impl Workspace {
    fn new() -> Result<Workspace> {
        let dir = tempfile::tempdir()?;
        bench::modes::make_certs(dir.path(), sipsec_transport::tls::certs::KeyKind::EcdsaP256)?;
        let callers = |n: usize| -> String { (0..n).map(|i| format!("user{i},pw{i}\n")).collect() };
        std::fs::write(dir.path().join("callers.csv"), callers(suite::USERS))?;
        std::fs::write(
            dir.path().join("callers-wan.csv"),
            callers(suite::WAN_CALLERS),
        )?;
        std::fs::write(
            dir.path().join("users.csv"),
            format!("username,password\n{}", callers(suite::USERS)),
        )?;
        let postgres = std::env::var("SIPSEC_TEST_POSTGRES").map_err(|_| {
            "no PostgreSQL: set SIPSEC_TEST_POSTGRES=postgres://user:password@host:port/database \
             (seed 001's database must be reachable over TCP, through the delay relay)"
                .to_string()
        });
        Ok(Workspace {
            dir,
            kamailio: kamailio_kit(),
            postgres,
            sqlite_users: false,
            postgres_users: false,
            runs: 0,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Imports the users into the database of `config` (its realm: [`REALM`]).
    fn import_users(&self, config: &Path) -> Result<()> {
        let out = Command::new(std::env::current_exe()?)
            .args(["users", "--realm", REALM, "--config"])
            .arg(config)
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
        Ok(())
    }

    /// The bench's own config for this row's server role, with `extra` appended.
    /// The users' SQLite database (imported the first time): authd's, and the one each
    /// run's server database starts as a copy of.
    fn sqlite_users(&mut self) -> Result<PathBuf> {
        let db = self.path("users.db");
        if !self.sqlite_users {
            let config = self.path("users.toml");
            std::fs::write(
                &config,
                format!("[database]\nurl = \"sqlite://{}\"\n", db.display()),
            )?;
            self.import_users(&config)?;
            self.sqlite_users = true;
        }
        Ok(db)
    }

    /// The bench's own config for this row's server role, with `extra` appended, in a
    /// directory of this run's own: its database starts as a copy of the users' and nothing
    /// else, so no run sees registrations an earlier one made (a registered callee would be
    /// routed to a load generator long gone).
    fn write_config(&mut self, row: &Row, args: &BenchArgs, extra: &str) -> Result<PathBuf> {
        self.runs += 1;
        let dir = self.path(&format!("run-{}-{}", self.runs, row.id));
        std::fs::create_dir_all(&dir)?;
        if self.sqlite_users {
            std::fs::copy(self.path("users.db"), dir.join("bench.db"))?;
        }
        let config = bench::default_config(&dir, args, self.dir.path()) + extra;
        let path = dir.join("sipsec.toml");
        std::fs::write(&path, config)?;
        Ok(path)
    }

    /// The config a digest row runs with.
    fn digest_config(&mut self, row: &Row, args: &BenchArgs) -> Result<PathBuf> {
        self.sqlite_users()?;
        self.write_config(
            row,
            args,
            &format!(
                "[auth]\nscheme = \"digest\"\nrealm = \"{REALM}\"\n\
                 methods = [\"INVITE\", \"REGISTER\"]\n"
            ),
        )
    }

    /// Seed 001's digest row: PostgreSQL behind a delay relay. The config, the relay, and
    /// the database server's PID (its CPU is the peer's); `Err` says why the row is skipped.
    fn digest_wan(
        &mut self,
        row: &Row,
        args: &BenchArgs,
        cache: bool,
    ) -> Result<std::result::Result<Prepared, String>> {
        let url = match &self.postgres {
            Ok(u) => u.clone(),
            Err(why) => return Ok(Err(why.clone())),
        };
        let Some((head, host, tail)) = split_url(&url) else {
            bail!("SIPSEC_TEST_POSTGRES is not postgres://user:password@host:port/database");
        };
        if !self.postgres_users {
            let direct = self.path("postgres.toml");
            std::fs::write(&direct, format!("[database]\nurl = \"{url}\"\n"))?;
            self.import_users(&direct)?;
            self.postgres_users = true;
        }
        let relay = Process::delay_relay(DB_RELAY, host)?;
        let config = self.write_config(
            row,
            args,
            &format!(
                "[auth]\nscheme = \"digest\"\nrealm = \"{REALM}\"\nmethods = [\"INVITE\"]\n\
                 credential_cache = {cache}\n"
            ),
        )?;
        // The remote database replaces the bench's SQLite.
        let text = std::fs::read_to_string(&config)?;
        let db = config.with_file_name("bench.db");
        let sqlite = format!("url = \"sqlite://{}\"", db.display());
        anyhow::ensure!(text.contains(&sqlite), "the bench config has no SQLite URL");
        std::fs::write(
            &config,
            text.replace(&sqlite, &format!("url = \"{head}{DB_RELAY}{tail}\"")),
        )?;
        Ok(Ok(Prepared {
            config,
            helpers: vec![relay],
            peer: postmaster(),
        }))
    }

    /// Seed 001's Proxychain rows: `sipsec authd` behind a delay relay, the proxy's client
    /// certificate its identity. The config, the authority and relay, the authority's PID.
    fn proxychain(&mut self, row: &Row, args: &BenchArgs, prefetch: bool) -> Result<Prepared> {
        let users = self.sqlite_users()?;
        let p = |f: &str| self.path(f).display().to_string();
        let authd_toml = self.path("authd.toml");
        std::fs::write(
            &authd_toml,
            format!(
                "[authd]\nlisten = \"{AUTHD}\"\nrealm = \"{REALM}\"\n\
                 database = \"sqlite://{}\"\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n\
                 chain_length = 10\n",
                users.display(),
                p(sipsec_transport::tls::certs::SERVER),
                p(sipsec_transport::tls::certs::SERVER_KEY),
                p(sipsec_transport::tls::certs::CA),
            ),
        )?;
        let extra = format!(
            "[tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n\
             [auth]\nscheme = \"proxychain\"\nauthority = \"tls:{AUTHD_RELAY}\"\n\
             chain_length = 10\nmethods = [\"INVITE\"]\nwait_ms = 2000\n{}",
            p(sipsec_transport::tls::certs::CLIENT),
            p(sipsec_transport::tls::certs::CLIENT_KEY),
            p(sipsec_transport::tls::certs::CA),
            if prefetch { "" } else { "prefetch_at = 0\n" }
        );
        let config = self.write_config(row, args, &extra)?;
        let authd = Process::sipsec(
            &["authd", "--config", &authd_toml.display().to_string()],
            "sipsec authd",
        )?;
        let peer = Some(authd.child.id());
        let relay = Process::delay_relay(AUTHD_RELAY, AUTHD)?;
        Ok(Prepared {
            config,
            helpers: vec![relay, authd],
            peer,
        })
    }
}

impl Workspace {
    /// The overload suite's upstream proxy: sipsec on CPU 1 routing every call to the
    /// bench's server, speaking RFC 7339 as a client or not.
    fn upstream(&mut self, row: &Row, oc: bool) -> Result<Process> {
        self.runs += 1;
        let dir = self.path(&format!("run-{}-{}-upstream", self.runs, row.id));
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("upstream.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = [\"udp:{UPSTREAM}\"]\ndomains = [\"upstream.test\"]\n\
                 workers = 1\n[routing]\ndefault_route = \"sip:{}\"\n[database]\n\
                 url = \"sqlite://{}\"\n[overload]\nannounce = {oc}\n",
                bench::SERVER,
                dir.join("upstream.db").display()
            ),
        )?;
        Process::sipsec(
            &["serve", "--config", &config.display().to_string()],
            "the upstream proxy",
        )
    }
}

/// A seed 001 row made ready: its server config, the processes it runs beside the server,
/// and the one whose CPU is the peer's (the authority, the database server).
struct Prepared {
    config: PathBuf,
    helpers: Vec<Process>,
    peer: Option<u32>,
}

/// `postgres://user:pw@host:port/db` as (`postgres://user:pw@`, `host:port`, `/db`).
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let at = url.find('@')? + 1;
    let slash = at + url[at..].find('/')?;
    Some((&url[..at], &url[at..slash], &url[slash..]))
}

/// The PostgreSQL server's main process (its backends are its children), if one runs here.
fn postmaster() -> Option<u32> {
    let out = Command::new("pgrep")
        .args(["-o", "-x", "postgres"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Where the reference Kamailio listens (UDP).
const KAMAILIO: &str = "127.0.0.1:5060";

/// The reference Kamailio configuration, `peers/kamailio/proxy.cfg`, carried in the binary so
/// the lab runs from anywhere.
const KAMAILIO_CFG: &str = include_str!("../../../peers/kamailio/proxy.cfg");

/// Whether the reference row can run: Kamailio is on the PATH, or why not.
fn kamailio_kit() -> Result<(), String> {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join("kamailio").is_file()));
    if on_path {
        Ok(())
    } else {
        Err("Kamailio is not installed (apt-get install kamailio)".into())
    }
}

/// A process a row runs beside the server (Kamailio as the server, the authority, a delay
/// relay), stopped with SIGTERM and waited for when the row ends. What it prints is read
/// (and dropped) so it never blocks or fails on a closed pipe.
struct Process {
    child: Child,
}

impl Process {
    /// Kamailio on the reference proxy configuration, pinned to CPU 0.
    fn kamailio(work: &Path) -> Result<Process> {
        let cfg = work.join("kamailio.cfg");
        std::fs::write(&cfg, KAMAILIO_CFG)?;
        let child = Command::new("taskset")
            .args(["-c", "0", "kamailio", "-DD", "-E", "-f"])
            .arg(&cfg)
            .args(["-m", "512", "-M", "32", "-Y"])
            .arg(work)
            .arg("-w")
            .arg(work)
            .args(["-A", &format!("LISTEN=udp:{KAMAILIO}")])
            .args(["-A", "NEXT_HOP=\"sip:127.0.0.3:35080;transport=udp\""])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start kamailio")?;
        std::thread::sleep(std::time::Duration::from_secs(2));
        Ok(Process { child })
    }

    /// `sipsec delay-relay` from `listen` to `to`, adding seed 001's round trip.
    fn delay_relay(listen: &str, to: &str) -> Result<Process> {
        let rtt = suite::WAN_RTT_MS.to_string();
        Process::sipsec(
            &["delay-relay", listen, to, "--rtt-ms", &rtt],
            "the delay relay",
        )
    }

    /// `sipsec ARGS` pinned to CPU 1 (beside the load generator, off the server's core),
    /// ready once it prints its first line.
    fn sipsec(args: &[&str], what: &str) -> Result<Process> {
        let mut child = Command::new("taskset")
            .args(["-c", "1"])
            .arg(std::env::current_exe()?)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {what}"))?;
        let mut lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
        let stderr = child.stderr.take().context("no stderr")?;
        let mut process = Process { child };
        match lines.next() {
            Some(Ok(_)) => {}
            _ => {
                let mut why = String::new();
                let _ = std::io::Read::read_to_string(&mut { stderr }, &mut why);
                let status = process.child.wait()?;
                bail!("{what} did not start ({status}): {}", why.trim());
            }
        }
        std::thread::spawn(move || BufReader::new(stderr).lines().for_each(drop));
        std::thread::spawn(move || lines.for_each(drop));
        Ok(process)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// Measures one row once. In a suite with a goodput curve, `grid` is the absolute rates to
/// measure it at; `None` there measures the suite's reference capacity instead (a peak
/// search of the row, recorded as [`suite::REFERENCE`]).
fn measure(
    ws: &mut Workspace,
    suite: &Suite,
    row: &Row,
    round: u32,
    a: &RunArgs,
    grid: Option<&[f64]>,
    stop: &AtomicBool,
) -> Result<Option<Record>> {
    let skipped = |why: String| Ok(Some(Record::skipped(suite.name, row.id, round, why)));
    if let Some(why) = row.unavailable {
        return skipped(why.into());
    }
    if suite.lab_build && !cfg!(feature = "lab-noop") {
        return skipped(format!("needs a lab build: {LAB_BUILD}"));
    }
    let (suite_rate, calls) = sizes(suite.name, a.quick);
    let rate = row.rate.unwrap_or(suite_rate);
    // A row held at a lower rate runs for as long as the others, not for as many calls.
    let calls = ((calls as f64 * rate / suite_rate) as u64).max(50);
    let wan = matches!(
        row.setup,
        Setup::DigestWan { .. } | Setup::Proxychain { .. }
    );
    // Seed 001's callers make one call each first, so every one holds a chain (the paper
    // preloaded them) and the database connections are open.
    let warmup = if wan {
        suite::WAN_CALLERS as u64
    } else {
        ((rate / 2.0) as u64).max(100)
    };
    let mut args = BenchArgs {
        rate,
        calls,
        warmup_calls: Some(warmup),
        quiet: true,
        lab_noop: row.noop.to_string(),
        ..row.bench.clone()
    };
    args.streams.tls_dir = Some(ws.dir.path().to_path_buf());
    let mut helpers = Vec::new();
    if row.server == Server::Kamailio {
        match &ws.kamailio {
            Err(why) => return skipped(why.clone()),
            Ok(()) => {
                let k = Process::kamailio(ws.dir.path())?;
                args.server_pid = vec![k.child.id()];
                args.target = Some(KAMAILIO.to_string());
                helpers.push(k);
            }
        }
    }
    let (config, users, peer) = match row.setup {
        Setup::Plain => (None, None, None),
        Setup::Digest => (
            Some(ws.digest_config(row, &args)?),
            Some("callers.csv"),
            None,
        ),
        Setup::DigestWan { cache } => match ws.digest_wan(row, &args, cache)? {
            Err(why) => return skipped(why),
            Ok(mut p) => {
                helpers.append(&mut p.helpers);
                (Some(p.config), Some("callers-wan.csv"), p.peer)
            }
        },
        Setup::Proxychain { prefetch } => {
            let mut p = ws.proxychain(row, &args, prefetch)?;
            helpers.append(&mut p.helpers);
            args.proxychain_realm = Some(REALM.to_string());
            (Some(p.config), Some("callers-wan.csv"), p.peer)
        }
        Setup::Upstream { oc } => {
            helpers.push(ws.upstream(row, oc)?);
            args.target = Some(UPSTREAM.to_string());
            (None, None, None)
        }
    };
    args.config = config;
    args.users = users.map(|u| ws.path(u));
    args.peer_pid = peer.into_iter().collect();
    let mut measured = args.clone();
    if suite.curve {
        // The overload suite's points are steady states of control loops that settle in a
        // second or so: each gets 5 s.
        measured.step_s = 5.0;
        match grid {
            // A capacity row searches its peak in every round instead.
            Some(rates) if !row.searches_capacity() => measured.curve_rates = rates.to_vec(),
            _ => measured.find_peak = true,
        }
    } else if a.peak || a.curve {
        measured.find_peak = true;
        measured.step_s = 2.0;
        measured.goodput_curve = a.curve;
    }
    if measured.find_peak {
        // The server, not the load generator or one address's ports, sets the peak.
        if measured.cpu_quota.is_none() && a.peak_quota < 1.0 {
            measured.peak_quota = Some(a.peak_quota);
        }
        measured.peak_source_addresses = PEAK_SOURCES;
    }
    let mut record = match bench::run_until(measured, stop) {
        Ok(r) if r.load.interrupted || stop.load(Ordering::Relaxed) => return Ok(None),
        Ok(r) => Record::measured(suite.name, row.id, round, &r),
        Err(e) => Record::skipped(suite.name, row.id, round, format!("{FAILED}{e:#}")),
    };
    if a.instructions && row.server == Server::Sipsec && record.skipped.is_none() {
        // The same row, short and slow, under callgrind.
        let counted = BenchArgs {
            rate: 50.0,
            calls: 200,
            warmup_calls: Some(50),
            instructions: true,
            // A capacity row's peak search is not counted: its calls at the slow rate are.
            find_peak: false,
            ..args
        };
        match bench::run_until(counted, stop) {
            Ok(r) if r.load.interrupted || stop.load(Ordering::Relaxed) => return Ok(None),
            Ok(r) => record.instructions = r.server_instructions_per_op,
            Err(e) => {
                record.skipped = Some(format!("{FAILED}counting instructions: {e:#}"));
            }
        }
    }
    drop(helpers);
    Ok(Some(record))
}

/// The rows of `suite` that `only` selects (see [`RunArgs::only`]), with their baselines
/// (for CPU, and for latency where a row names one) and the rows searching their capacity.
fn selected<'s>(suite: &'s Suite, only: Option<&str>) -> Vec<&'s Row> {
    let Some(only) = only else {
        return suite.rows.iter().collect();
    };
    let texts: Vec<&str> = only
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    let chosen: HashSet<&str> = suite
        .rows
        .iter()
        .filter(|r| texts.iter().any(|t| r.id.contains(t)))
        .flat_map(|r| [Some(r.id), Some(r.baseline), r.latency_baseline, r.capacity])
        .flatten()
        .collect();
    suite
        .rows
        .iter()
        .filter(|r| chosen.contains(r.id))
        .collect()
}

/// `sipsec lab run`.
pub fn run(a: RunArgs) -> Result<()> {
    let rounds = a.rounds.unwrap_or(if a.quick { 1 } else { 5 });
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    // The cluster testbed is no suite of rows (`cluster`): run on its own, and only when
    // asked for by name (it needs root).
    let cluster = a.suites.iter().any(|s| s == super::cluster::NAME);
    let named: Vec<&String> = a
        .suites
        .iter()
        .filter(|s| *s != super::cluster::NAME)
        .collect();
    if cluster {
        std::fs::create_dir_all(&a.out)
            .with_context(|| format!("cannot create {}", a.out.display()))?;
        let held = super::cluster::run(&a.out, rounds, a.resume)?;
        if named.is_empty() {
            if results::load(&a.out)?.is_empty() {
                eprintln!(
                    "sipsec lab: cluster results in {}",
                    super::cluster::path(&a.out).display()
                );
            } else {
                super::report::write(&a.out, super::report::Options::default())?;
            }
            if !held {
                bail!("the cluster testbed: a check failed (its output says which)");
            }
            return Ok(());
        }
    }
    let suites: Vec<Suite> = if named.is_empty() {
        suite::all()
    } else {
        named
            .iter()
            .map(|n| {
                suite::named(n).with_context(|| {
                    let names: Vec<_> = suite::all().iter().map(|s| s.name).collect();
                    format!("no suite {n:?}; the suites are {}", names.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    if a.peak_quota.is_nan() || a.peak_quota <= 0.0 {
        bail!("--peak-quota is a share of one core, above 0 (1: a whole core)");
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
    let mut failed = Vec::new();
    let mut below = Vec::new();
    // The curve suite's reference capacity: measured once per run (kept across --resume).
    let mut reference = None;
    for (s, row, round) in todo {
        if s.curve && reference.is_none() {
            reference = results::reference_capacity(s.name, &existing);
        }
        if s.curve && reference.is_none() {
            let base = s.row(row.baseline).unwrap_or(row);
            bar.set_message(format!("{} reference capacity ({})", s.name, base.id));
            let Some(mut record) = measure(&mut ws, s, base, 0, &a, None, &stop)? else {
                break;
            };
            record.row = suite::REFERENCE.to_string();
            results::append(&a.out, &record)?;
            reference = record.peak_per_s;
            if reference.is_none() {
                bail!(
                    "{}: no reference capacity found ({}): the suite's grid needs one",
                    s.name,
                    record.skipped.as_deref().unwrap_or("no peak")
                );
            }
        }
        let grid = reference.filter(|_| s.curve).map(suite::grid);
        bar.set_message(format!("{} {} (round {round} of {rounds})", s.name, row.id));
        let record = match measure(&mut ws, s, row, round, &a, grid.as_deref(), &stop) {
            Ok(Some(record)) => record,
            Ok(None) => break,
            // Its helpers would not start (a port taken, say): recorded as failed, and the
            // other rows still run.
            Err(e) => Record::skipped(s.name, row.id, round, format!("{FAILED}{e:#}")),
        };
        results::append(&a.out, &record)?;
        if record.skipped.is_none() && record.success_share() < results::MIN_SUCCESS {
            let line = format!(
                "{} {} (round {round}): {:.1}% of operations succeeded",
                s.name,
                row.id,
                record.success_share() * 100.0
            );
            bar.println(format!("{line}: below 99%, marked in the report"));
            below.push(line);
        }
        if let Some(why) = &record.skipped {
            bar.println(format!("{} {}: skipped: {why}", s.name, row.id));
            if why.starts_with(FAILED) {
                failed.push(format!("{} {} (round {round})", s.name, row.id));
            }
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
        eprintln!("sipsec lab: results in {}", path.display());
        // The report from every result in the directory, this run's and earlier ones'.
        super::report::write(&a.out, super::report::Options::default())?;
    }
    if a.strict && !below.is_empty() {
        bail!(
            "--strict: {} row runs fell below 99% success: {}",
            below.len(),
            below.join("; ")
        );
    }
    if !failed.is_empty() {
        bail!(
            "{} row runs failed (recorded, and left out of the report): {}",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

/// The most of a core the server is held to during a peak search (`--peak-quota`): the
/// overload suite's share, at which one core of load offers it several times its peak.
const PEAK_QUOTA: f64 = suite::OVERLOAD_QUOTA;

/// Caller addresses during a peak search where the callers open a connection per call:
/// 64 × ~28,000 ephemeral ports, which TIME_WAIT's 60 s turn into ~30,000 connections a
/// second, beyond any row's peak on a quarter of a core.
const PEAK_SOURCES: u32 = 64;

/// How to build and run the binary seed 002's suite needs.
pub(crate) const LAB_BUILD: &str =
    "cargo build --release -p sipsec --features lab-noop --target-dir \
     target/lab-noop, then target/lab-noop/release/sipsec lab run seed002";

/// How a row that ran and failed is recorded, unlike one that cannot run here.
const FAILED: &str = "failed: ";

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
        let ids: Vec<_> = selected(&s, Some("wss, tls-plain"))
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(
            ids,
            ["udp", "chain-wss", "outbound-tls-plain", "outbound-wss"]
        );
    }
}
