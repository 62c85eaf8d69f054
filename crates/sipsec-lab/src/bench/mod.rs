//! `sipsec bench`: one scenario against one server at a fixed rate, reporting the server's
//! CPU cost per completed operation — user+sys time of the server's processes read from /proc
//! before and after the measured run, divided by the operations that succeeded — and, when
//! asked, the peak rate.
//!
//! The same harness measures sipsec (started here, pinned to one core, with the load
//! generator pinned to another) and any external server given by PID (Kamailio), so the two
//! figures come from the same load and the same arithmetic.

pub mod certserver;
pub mod cpu;
pub mod identity;
pub mod idle;
pub mod modes;
pub mod peak;
pub mod quota;
pub mod relay;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sipsec_load::cli::{OnOff, RedirectArg, Role as LoadRole, ScenarioArg};
use sipsec_load::{
    self as load,
    report::{Latency, Summary},
    LoadArgs,
};
use sipsec_server::cmd::ctl::{self, CtlArgs};
use sipsec_server::serve::control;
use sipsec_transport::net::transport::Transport;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Where the default bench topology puts things (as `scripts/kamailio_compare.py`).
pub const SERVER: &str = "127.0.0.1:35060";
const SERVER_TLS: &str = "127.0.0.1:35061";
const UAC_IP: &str = "127.0.0.2";
const UAS: &str = "127.0.0.3:35080";

/// What each measured operation is (`--scenario`), and so what the started server does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchScenario {
    /// Calls through a proxy to the load generator's own UAS.
    Call,
    /// Registrations.
    Register,
    /// INVITEs answered 302 by a redirect server (to the default route), ACKed there.
    Redirect,
    /// OPTIONS answered by the server.
    Options,
}

impl BenchScenario {
    /// The load generator's scenario for it.
    fn load(self) -> ScenarioArg {
        match self {
            BenchScenario::Call => ScenarioArg::Call,
            BenchScenario::Register => ScenarioArg::Register,
            BenchScenario::Redirect => ScenarioArg::Redirect,
            BenchScenario::Options => ScenarioArg::Options,
        }
    }
}

/// `sipsec bench` options: the typed plan of a bench run. The lab builds them as values from
/// [`BenchArgs::default`], which is the command line's defaults.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// What each measured operation is.
    #[arg(long, value_enum, default_value = "call")]
    pub scenario: BenchScenario,
    /// Operations per second during the measured run.
    #[arg(long, default_value_t = 1500.0)]
    pub rate: f64,
    /// Operations in the measured run.
    #[arg(long, default_value_t = 18_000)]
    pub calls: u64,
    /// Operations in the warm-up run before it (default: two seconds' worth).
    #[arg(long)]
    pub(crate) warmup_calls: Option<u64>,
    /// sipsec config to start (default: a stateful record-routing UDP proxy on
    /// 127.0.0.1:35060 with one worker, routing to the UAS on 127.0.0.3:35080).
    #[arg(long, short, conflicts_with = "server_pid")]
    pub config: Option<PathBuf>,
    /// With the default config: a stateless proxy.
    #[arg(long)]
    pub stateless: bool,
    /// Measure this already running server instead (repeat for several; their child
    /// processes are counted too). Needs --target.
    #[arg(long = "server-pid")]
    pub(crate) server_pid: Vec<u32>,
    /// Processes the server depends on (an authority, a database server): their CPU, with
    /// their children's, over the measured run is reported beside the server's (repeatable).
    #[arg(long = "peer-pid")]
    pub(crate) peer_pid: Vec<u32>,
    /// Where the load goes (default: the server started here).
    #[arg(long)]
    pub target: Option<String>,
    /// Where the load generator's UAS listens (the address the server routes calls to).
    #[arg(long, default_value = UAS)]
    pub uas: String,
    /// Host of Request-URIs. Calls default to the server's address (so a proxy uses its
    /// default route, as SIPp's callers do); register and options default to bench.test,
    /// the domain of the default config.
    #[arg(long)]
    pub domain: Option<String>,
    /// Users CSV for the load (e.g. with credentials).
    #[arg(long)]
    pub users: Option<PathBuf>,
    /// Digest: the load sends credentials from each user's last challenge with the next
    /// nonce count instead of being challenged per request; Proxychain: the next counter of
    /// the user's last verified chain (`sipsec load --auth-reuse`).
    #[arg(long)]
    pub auth_reuse: bool,
    /// Proxychain: the load answers `PC` challenges (`sipsec load --proxychain`), with keys
    /// derived in this realm.
    #[arg(long)]
    pub proxychain_realm: Option<String>,
    /// Core the started server is pinned to.
    #[arg(long, default_value_t = 0)]
    pub(crate) server_cpu: usize,
    /// Core the load generator is pinned to.
    #[arg(long, default_value_t = 1)]
    pub load_cpu: usize,
    /// Also search for the peak rate (≥ 99% of operations succeeding within 500 ms).
    #[arg(long)]
    pub find_peak: bool,
    /// Seconds per peak-search trial (and per point of the goodput curve).
    #[arg(long, default_value_t = 5.0)]
    pub step_s: f64,
    /// After the peak search, offer 0.5 to 2 times the peak for a trial each and record the
    /// goodput (operations completed within 500 ms per second): seed 004's curve past the
    /// peak, where servers collapse.
    #[arg(long, requires = "find_peak")]
    pub goodput_curve: bool,
    /// The goodput curve goes up to this multiple of the peak (0.5, 0.75, 1, 1.25, 1.5, 2,
    /// 2.5, 3, 4 as far as it reaches).
    #[arg(long, default_value_t = 2.0)]
    pub(crate) curve_to: f64,
    /// Offer each of these rates (operations per second, comma-separated) for a trial of
    /// --step-s and record the goodput: one grid of absolute rates, so that several servers
    /// or settings are compared at the same offered load (the lab's overload suite).
    #[arg(long, value_delimiter = ',', conflicts_with = "goodput_curve")]
    pub curve_rates: Vec<f64>,
    /// Hold the server to this fraction of one core (cgroup v1 CPU quota; root), so one core
    /// of load can overload it.
    #[arg(long)]
    pub(crate) cpu_quota: Option<f64>,
    /// Hold the server to at most this share of one core during the peak search and the
    /// goodput curve only (cgroup v1 CPU quota; root), so that it saturates before the load
    /// generator does; the measured run keeps its whole core. The share is lowered (on a grid
    /// of 0.05, to 0.1 at least) where the load's CPU per operation in the measured run would
    /// leave it less than 3 times the server's pace at the server's peak.
    #[arg(long, requires = "find_peak", conflicts_with = "cpu_quota")]
    pub(crate) peak_quota: Option<f64>,
    /// During the peak search and the goodput curve, callers with a connection per call
    /// (seed 000's outbound and local modes) connect from this many addresses from
    /// 127.0.1.1 (`sipsec load --source-addresses`), so the search is not held to what one
    /// address's ephemeral ports carry.
    #[arg(long, default_value_t = 1)]
    pub(crate) peak_source_addresses: u32,
    /// With the default config: the server's overload control (`[overload] enabled`).
    #[arg(long, value_enum, default_value = "on")]
    pub overload: OnOff,
    /// The server's overload control during the peak search of a server this bench starts:
    /// `off` (the default) reloads its config with `[overload] enabled = false` for the
    /// search and back after it, so the peak is where the server's CPU runs out rather than
    /// where its admission control starts to shed (at its target busy fraction, or on a
    /// queue delay a CPU quota's slices cause); `on` searches with the config as it is.
    /// Runs with --cpu-quota (the lab's overload suite) keep their config throughout.
    #[arg(long, value_enum, default_value = "off")]
    pub(crate) peak_overload: OnOff,
    /// The load speaks overload control as a client (`sipsec load --oc`).
    #[arg(long)]
    pub oc: bool,
    /// With the default config: the server refuses every new call (`[overload] max_rate =
    /// 0`), and the operation counted is a refused call (INVITE, 503, ACK): the figures per
    /// operation are what a refusal costs — the r of the bound 1/(1 + (k−1)·r) on the share
    /// of its capacity a server keeps for callers that ignore feedback at k times it.
    #[arg(long, conflicts_with_all = ["config", "server_pid", "find_peak", "oc"])]
    pub refuse_all: bool,
    /// With the default config: name the callee in the default route by a host name
    /// (`uas.bench`, answered from `[routing.hosts]`), so each call goes the way of a next hop
    /// located by DNS, from the worker's cached answer, instead of an IP route.
    #[arg(long)]
    pub(crate) route_by_name: bool,
    /// With the default config: `server.max_batch_delay_us`, the cap on a worker's
    /// coalescing wait (the server's own default when not given). 0 never waits, so no
    /// row's wake-ups depend on which policy the worker's measurements chose (seed 002's
    /// ablation at equal wake-ups).
    #[arg(long)]
    pub(crate) max_batch_delay_us: Option<u64>,
    /// With the default config: `[overload] max_queue_delay_ms`, the standing queue delay
    /// beyond which a saturated worker drains its queue (the server's own default when not
    /// given).
    #[arg(long)]
    pub(crate) max_queue_delay_ms: Option<u64>,
    /// With the default config: `[overload] feedback_target`, the busy fraction whose
    /// capacity RFC 7339 neighbours are given (the server's own default when not given).
    #[arg(long)]
    pub(crate) feedback_target: Option<f64>,
    /// Run the started server under callgrind and count the user-space instructions it
    /// executes per operation over the measured run (valgrind; slow, so use a low rate and
    /// few calls): a count the machine's noise cannot move. CPU figures are then valgrind's.
    #[arg(long, conflicts_with_all = ["server_pid", "find_peak"])]
    pub instructions: bool,
    /// With `--instructions`: keep callgrind's dump of the measured run here, to read with
    /// `callgrind_annotate` (which functions the instructions per operation went to).
    #[arg(long, requires = "instructions")]
    pub callgrind_out: Option<PathBuf>,
    /// With the default config: STIR/SHAKEN in the server — `sign` every call's INVITE,
    /// `verify` the INVITEs the load signs with the certificate fetched once and cached,
    /// `verify-fetch` with a fetch per call (from a `sipsec cert-server` started here, beside
    /// the load, its CPU reported as a peer's), or `verify-hostile`: `verify` while 50 INVITEs
    /// a second name certificates at a host that never answers (UDP only). Calls go between
    /// two telephone numbers; `unsigned` is the same calls without STIR/SHAKEN.
    #[arg(long, value_enum, default_value = "off", conflicts_with_all = ["config", "server_pid"])]
    pub identity: identity::IdentityMode,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress lines from the load generator.
    #[arg(long, short)]
    pub quiet: bool,
    /// Lab builds only (`--features lab-noop`): stages the started server and the load do
    /// without cryptography (`kx,sign,aead,digest`), seed 002's ablation. Hidden from the
    /// help of production builds.
    #[arg(long, default_value = "", hide = !cfg!(feature = "lab-noop"))]
    pub lab_noop: String,
    /// The transport and, for TCP and TLS, the connection and TLS options of every side.
    #[command(flatten)]
    pub streams: modes::StreamArgs,
}

impl Default for BenchArgs {
    /// `sipsec bench` with no options (see [`load::cli::defaults`]).
    fn default() -> Self {
        load::cli::defaults()
    }
}

/// The bench report (`--json`).
#[derive(Debug, Serialize)]
pub struct Report {
    /// The server measured: `sipsec` when the bench started it, `external` for `--server-pid`.
    pub server: String,
    /// The operation measured: `call`, `register`, `redirect` or `options`.
    pub scenario: String,
    /// The transport of the calls: `udp`, `tcp`, `tls`, `ws` or `wss`.
    pub transport: String,
    /// Seed 000's connection mode (TCP and TLS).
    pub mode: String,
    pub(crate) mutual_tls: bool,
    /// Whether every side offered TLS session resumption.
    pub tls_resumption: bool,
    /// The TLS library every side used: `rustls` or `openssl`.
    pub tls_backend: String,
    /// The cipher suite every side was limited to, if one was.
    pub(crate) tls_cipher_suite: Option<String>,
    pub(crate) idle_connections: usize,
    /// `--idle-connections`: the server's resident memory before and after they opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) idle_memory: Option<idle::Memory>,
    /// `--identity verify-hostile`: the hostile INVITEs sent beside the calls, and their
    /// answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) identity_hostile: Option<identity::HostileReport>,
    /// The offered rate of the measured run, in operations started per second.
    pub rate: f64,
    /// Operations that succeeded in the measured run (calls refused, with `refuse_all`): what
    /// the per-operation figures divide by.
    pub ops: u64,
    /// The server refused every call (`--refuse-all`): `ops` counts refusals.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) refuse_all: bool,
    /// The server's CPU time (user plus system, all its processes and threads) per successful
    /// operation, in µs.
    pub server_cpu_us_per_op: f64,
    pub(crate) server_user_us_per_op: f64,
    pub(crate) server_sys_us_per_op: f64,
    /// Times the server's threads went to sleep and were woken, per operation.
    pub(crate) server_wakeups_per_op: f64,
    /// How much each of the server's own counters grew over the measured run (a server
    /// started here; empty for one given by PID): messages, handshakes full and resumed,
    /// digest checks, database waits — counts that machine noise cannot move.
    pub(crate) server_counters: Counters,
    /// The load generator's own CPU per operation (UAC and UAS together).
    pub(crate) load_cpu_us_per_op: f64,
    /// The `--peer-pid` processes' CPU per operation, idle work included.
    pub(crate) peer_cpu_us_per_op: f64,
    /// Wall-clock seconds of the measured run (to subtract a peer's idle CPU rate).
    pub(crate) measured_s: f64,
    /// The server's processes whose CPU was measured (the started or given PIDs and their
    /// descendants).
    pub server_pids: Vec<u32>,
    /// The `--peer-pid` processes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) peer_pids: Vec<u32>,
    /// `--find-peak`: the highest rate, in operations per second, at which 99% of operations
    /// succeeded within 500 ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_per_s: Option<f64>,
    /// The load generator's summary of the measured run.
    pub load: Summary,
    /// `--find-peak`: the load generator's summary of the search, its trials included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) peak_search: Option<Summary>,
    /// `--goodput-curve`: goodput at multiples of the peak.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub goodput_curve: Vec<CurvePoint>,
    /// `--instructions`: the server's user-space instructions per successful operation over
    /// the measured run, counted by callgrind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_instructions_per_op: Option<f64>,
    /// `--cpu-quota`: the quota and what it did (its fields at the report's top level).
    #[serde(flatten)]
    pub quota: Option<QuotaHeld>,
    /// `--find-peak`: the share of a core the search held the server to, and who saturated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_held: Option<peak::PeakHeld>,
}

/// A CPU quota the server was held to (`--cpu-quota`).
#[derive(Debug, Clone, Serialize)]
pub struct QuotaHeld {
    /// The share of a core.
    pub(crate) cpu_quota: f64,
    /// Seconds the quota held the server off over the whole bench.
    pub(crate) cpu_throttled_s: f64,
}

/// One point of a goodput curve.
#[derive(Debug, Clone, Serialize)]
pub struct CurvePoint {
    /// The rate asked of the load generator.
    pub rate: f64,
    /// Operations it started per second (below `rate` where one core of load cannot keep up).
    pub offered_per_s: f64,
    /// Operations per second that succeeded within 500 ms.
    pub goodput_per_s: f64,
    /// The server's CPU (user plus system) per operation counted over the trial, µs: per
    /// call completed, or per call refused where every call is (`--refuse-all`).
    pub server_cpu_us_per_op: f64,
    /// The load generator's CPU (this process's) over the trial's schedule, as a share of its
    /// one core: near 1 it, not the server, may be what held the goodput down.
    pub load_cpu_share: f64,
    /// The trial's calls' latency, first request to the response that counts.
    pub latency_ms: Latency,
    /// Of that, the wait before the first response (`sipsec load`'s `first_response_ms`):
    /// where it is most of the latency, calls waited before the server answered them, not
    /// behind it.
    pub first_response_ms: Latency,
}

/// Multiples of the peak the goodput curve is measured at (up to `--curve-to`).
const CURVE: [f64; 9] = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0];

/// A server's counters by name (`stats.rs`), as `sipsec ctl counters` reports them.
pub type Counters = BTreeMap<String, u64>;

/// Seconds the server is left to settle before each trial of the peak search and each point
/// of the goodput curve: what an overloaded trial leaves queued on a server held to a quarter
/// of a core, and the retransmissions of its late calls, take about a second to work off;
/// with the 0.5 s of `sipsec load` the next trial began on a backlog and failed at a rate the
/// server sustains from rest.
const SETTLE_S: f64 = 2.0;

/// The config a server this bench started runs from during a peak search without overload
/// control (`--peak-overload off`): a copy in its scratch directory, switched between the
/// config as given and the same with `[overload] enabled = false`.
struct PeakConfigs {
    path: PathBuf,
    as_given: String,
    without_overload: String,
}

impl PeakConfigs {
    /// Copies `config` into `dir` and prepares its variant without overload control.
    fn new(config: &Path, dir: &Path) -> Result<Self> {
        let as_given = std::fs::read_to_string(config)
            .with_context(|| format!("cannot read {}", config.display()))?;
        let mut table: toml::Table = as_given
            .parse()
            .with_context(|| format!("{} is not TOML", config.display()))?;
        let overload = table
            .entry("overload")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .context("[overload] is not a table")?;
        overload.insert("enabled".into(), toml::Value::Boolean(false));
        let path = dir.join("serve.toml");
        std::fs::write(&path, &as_given)?;
        Ok(PeakConfigs {
            path,
            as_given,
            without_overload: toml::to_string(&table)?,
        })
    }

    /// Writes the config with overload control as given (`as_given`) or off, and has the
    /// server read it.
    fn switch(&self, server: &Started, as_given: bool) -> Result<()> {
        let text = if as_given {
            &self.as_given
        } else {
            &self.without_overload
        };
        std::fs::write(&self.path, text)?;
        server.reload()
    }
}

/// A sipsec server this bench started; stopped on drop.
struct Started {
    child: Child,
    _dir: tempfile::TempDir,
    /// Its control socket (`[control] socket`), where its counters are asked for; none when
    /// a config given with `--config` sets none.
    control: Option<PathBuf>,
    /// Under callgrind: its output file, dumped at each counters report (see [`Self::stop`]).
    callgrind: Option<PathBuf>,
}

impl Started {
    /// Stops the server and, under callgrind, reads the instructions it counted over the
    /// measured run. Callgrind dumps (and zeroes) its counts each time the server reports its
    /// counters on SIGUSR1 (`--dump-before=*report_counters*`, [`Self::cut`]): the first
    /// report, before the measured run, ends dump 1 (start-up and warm-up); the second, after
    /// it, ends dump 2 — the measured run alone. No `callgrind_control`: its `vgdb` must
    /// interrupt a process blocked in a system call, which not every sandbox allows (it then
    /// reports no run, and nothing is counted).
    fn stop(mut self, keep: Option<&Path>) -> Result<Option<u64>> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let Some(out) = self.callgrind.take() else {
            return Ok(None);
        };
        let path = PathBuf::from(format!("{}.2", out.display()));
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "callgrind wrote no {} (the server did not report its counters twice)",
                path.display()
            )
        })?;
        let total = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("totals:")
                    .or_else(|| l.strip_prefix("summary:"))
            })
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .with_context(|| format!("no totals in {}", path.display()))?;
        if let Some(keep) = keep {
            std::fs::copy(&path, keep)
                .with_context(|| format!("cannot keep callgrind's dump as {}", keep.display()))?;
        }
        Ok(Some(total))
    }

    /// Asks the server `command` through its control socket (`sipsec ctl`) and returns its
    /// answer; `None` when it has no control socket.
    fn ask(&self, command: control::Command) -> Result<Option<String>> {
        let Some(socket) = &self.control else {
            return Ok(None);
        };
        let ask = CtlArgs {
            command,
            config: None,
            socket: Some(socket.clone()),
            timeout_s: 10,
        };
        ctl::run(&ask)?
            .map(Some)
            .map_err(|why| anyhow::anyhow!("the server refused `{}`: {why}", command.name()))
    }

    /// Asks the server to read its config file again (`sipsec ctl reload`), and waits until
    /// it has.
    fn reload(&self) -> Result<()> {
        self.ask(control::Command::Reload)?
            .context("the server has no [control] socket to ask for a reload")?;
        Ok(())
    }

    /// The server's counters now, asked through its control socket (`sipsec ctl counters`).
    fn counters(&self) -> Result<Option<Counters>> {
        let Some(text) = self.ask(control::Command::Counters)? else {
            return Ok(None);
        };
        text.lines()
            .map(|l| {
                let (name, value) = l
                    .split_once(' ')
                    .with_context(|| format!("not a counter: {l:?}"))?;
                Ok((name.to_string(), value.parse()?))
            })
            .collect::<Result<_>>()
            .map(Some)
    }

    /// Under callgrind, ends dump `n` (see [`Self::stop`]): asks the server to report its
    /// counters (SIGUSR1) and waits, up to 30 s, until callgrind has written the whole dump
    /// (its last line, `totals:`) — the server stands still while it is written.
    fn cut(&self, n: u32) {
        let Some(out) = &self.callgrind else {
            return;
        };
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGUSR1) };
        let dump = PathBuf::from(format!("{}.{n}", out.display()));
        let written = || {
            std::fs::read_to_string(&dump)
                .is_ok_and(|t| t.lines().last().is_some_and(|l| l.starts_with("totals:")))
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !written() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// What counters changed by from `before` to `after`.
fn counters_since(after: &Counters, before: &Counters) -> Counters {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0).min(*v)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

impl Drop for Started {
    fn drop(&mut self) {
        // Not when `stop` has reaped it already (its PID may be someone else's by now).
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling our own child, still running.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}

/// What the started server does with calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Proxies them statefully: a transaction per request, record-routed.
    StatefulProxy,
    /// Proxies them statelessly (`--stateless`).
    StatelessProxy,
    /// Answers 302 to the default route.
    Redirect,
}

/// The role of the started server for these options.
pub(crate) fn role_of(a: &BenchArgs) -> Role {
    match (a.scenario, a.stateless) {
        (BenchScenario::Redirect, _) => Role::Redirect,
        (_, true) => Role::StatelessProxy,
        (_, false) => Role::StatefulProxy,
    }
}

/// The started server's config for the run `a` asks for: listening on UDP and TCP at
/// 127.0.0.1:35060 (and TLS on 35061 for TLS runs), routing calls to the UAS over the bench's
/// transport, its control socket (where the bench asks for its counters) in `dir`.
pub(crate) fn default_config(dir: &Path, a: &BenchArgs, tls_dir: &Path) -> String {
    let (s, role, overload) = (&a.streams, role_of(a), a.overload.is_on());
    // TLS and WebSocket runs add their listener on the bench's second port.
    let stream_listen = match s.transport {
        Transport::Tls | Transport::Ws | Transport::Wss => {
            format!(", \"{}:{SERVER_TLS}\"", s.transport)
        }
        Transport::Udp | Transport::Tcp => String::new(),
    };
    // Over WebSocket the callee registers and is called over its own connections (the server
    // opens none), so the route is never taken; it names a transport a route may.
    let route_transport = if s.transport.websocket() {
        Transport::Udp
    } else {
        s.transport
    };
    let (mut server_extra, tables) = (s.server_keys(), s.tls_table(tls_dir) + &s.websocket_table());
    if let Some(us) = a.max_batch_delay_us {
        server_extra += &format!("max_batch_delay_us = {us}\n");
    }
    let mut overload_extra = if a.refuse_all { "max_rate = 0\n" } else { "" }.to_string();
    if let Some(ms) = a.max_queue_delay_ms {
        overload_extra += &format!("max_queue_delay_ms = {ms}\n");
    }
    if let Some(t) = a.feedback_target {
        overload_extra += &format!("feedback_target = {t}\n");
    }
    let (route, hosts) = if a.route_by_name {
        let uas: SocketAddr = UAS.parse().expect("the bench's UAS address");
        (
            format!("uas.bench:{}", uas.port()),
            format!("[routing.hosts]\n\"uas.bench\" = [\"{}\"]\n", uas.ip()),
        )
    } else {
        (UAS.to_string(), String::new())
    };
    format!(
        "[server]\nlisten = [\"udp:{SERVER}\", \"tcp:{SERVER}\"{stream_listen}]\n\
         domains = [\"bench.test\"]\nmode = \"{}\"\n\
         stateful = {}\nrecord_route = true\nworkers = 1\n{server_extra}[routing]\n\
         default_route = \"sip:{route};transport={}\"\n{hosts}[database]\nurl = \"sqlite://{}\"\n\
         [overload]\nenabled = {overload}\nfeedback = {overload}\nannounce = {overload}\n\
         {overload_extra}[control]\nsocket = \"{}\"\n{tables}",
        if role == Role::Redirect {
            "redirect"
        } else {
            "proxy"
        },
        role == Role::StatefulProxy,
        route_transport,
        dir.join("bench.db").display(),
        dir.join("control.sock").display()
    )
}

/// The operations a run counts: those that succeeded, or, where the server refuses every
/// call (`--refuse-all`), the calls refused.
fn counted(a: &BenchArgs, s: &Summary) -> u64 {
    if a.refuse_all {
        s.failed
    } else {
        s.succeeded
    }
}

/// `seconds` of CPU per operation of `ops`, in µs (0 where there were none).
fn us_per_op(seconds: f64, ops: u64) -> f64 {
    if ops == 0 {
        0.0
    } else {
        seconds * 1e6 / ops as f64
    }
}

/// Starts `sipsec serve` pinned to `cpu` and waits for its banner.
fn start_sipsec(
    config: &Path,
    dir: tempfile::TempDir,
    cpu: usize,
    noop: sipsec_transport::ablation::Stages,
    instructions: bool,
) -> Result<Started> {
    let exe = std::env::current_exe().context("cannot find the sipsec binary")?;
    let control = sipsec_server::config::Config::load(config)?.control_socket;
    let callgrind = instructions.then(|| dir.path().join("callgrind.out"));
    let mut cmd = match &callgrind {
        Some(out) => {
            let mut c = Command::new("valgrind");
            c.args(["--tool=callgrind", "--dump-before=*report_counters*"])
                .arg(format!("--callgrind-out-file={}", out.display()))
                .arg(exe);
            c
        }
        None => Command::new(exe),
    };
    // Warnings and errors only, unless the caller asked for the server's log.
    let asked = std::env::var("SIPSEC_LOG").ok();
    cmd.env(sipsec_transport::ablation::ENV, noop.to_arg());
    cmd.args(["serve", "--config"])
        .arg(config)
        .current_dir(dir.path())
        .env("SIPSEC_LOG", asked.clone().unwrap_or_else(|| "warn".into()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: set_affinity makes only async-signal-safe calls between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || cpu::set_affinity(cpu));
    }
    let mut child = cmd.spawn().with_context(|| {
        if instructions {
            "cannot start sipsec serve under valgrind (apt-get install valgrind)"
        } else {
            "cannot start sipsec serve"
        }
    })?;
    // The server's own lines; valgrind's commentary is not shown.
    let stderr = child.stderr.take().expect("piped");
    let show_all = asked.is_some();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if show_all || line.contains(" WARN ") || line.contains(" ERROR ") {
                eprintln!("{line}");
            }
        }
    });
    let mut banner = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut banner)
        .context("reading the server's banner")?;
    if !banner.starts_with("sipsec listening on") {
        let _ = child.kill();
        bail!("sipsec serve did not start (see its errors above)");
    }
    Ok(Started {
        child,
        _dir: dir,
        control,
        callgrind,
    })
}

/// Where a sipsec config listens for `transport`.
fn config_listen(path: &Path, transport: Transport) -> Result<SocketAddr> {
    let cfg = sipsec_server::config::Config::load(path)?;
    cfg.listen
        .iter()
        .find(|l| l.transport == transport)
        .map(|l| l.addr)
        .with_context(|| format!("the config has no {transport} listener"))
}

/// `sipsec bench` on the command line: runs, then prints the report's summary.
pub fn main(a: BenchArgs) -> Result<()> {
    let report = run(a)?;
    print(&report);
    Ok(())
}

/// The summary lines `sipsec bench` prints.
pub fn print(report: &Report) {
    let (scenario, rate) = (&report.scenario, report.rate);
    println!(
        "{} {scenario} at {rate}/s: {} of {} {}; server CPU {:.1} µs/op \
         (user {:.1}, sys {:.1}); load generator {:.1} µs/op{}",
        report.server,
        report.ops,
        report.load.attempted,
        if report.refuse_all {
            "refused"
        } else {
            "succeeded"
        },
        report.server_cpu_us_per_op,
        report.server_user_us_per_op,
        report.server_sys_us_per_op,
        report.load_cpu_us_per_op,
        report
            .peak_per_s
            .map_or(String::new(), |p| format!("; peak {p:.0}/s"))
    );
    if !report.peer_pids.is_empty() {
        println!(
            "  peers {:?}: CPU {:.1} µs/op over {:.1} s (idle work included)",
            report.peer_pids, report.peer_cpu_us_per_op, report.measured_s
        );
    }
    if report.load.failed > 0 {
        println!("  failures: {:?}", report.load.failures_by_reason);
    }
    if let Some(h) = &report.peak_held {
        println!(
            "  peak search: server held to {}, throttled {:.1} s ({:.0}% of periods); CPU \
             share over {:.0} s: server {:.2}, load generator {:.2} (at most {:.2} in a \
             trial); {} caller address(es)",
            h.cpu_quota
                .map_or("a whole core".to_string(), |q| format!("{q:.2} of a core")),
            h.cpu_throttled_s,
            h.throttled_periods * 100.0,
            h.search_s,
            h.server_cpu_share,
            h.load_cpu_share,
            h.load_cpu_share_max,
            h.source_addresses
        );
        if !h.failures_by_reason.is_empty() {
            println!("  peak search failures: {:?}", h.failures_by_reason);
        }
    }
}

/// Runs one bench and returns its report; prints nothing but progress (unless `quiet`).
/// SIGINT and SIGTERM end the load early (the report says `interrupted`).
pub fn run(a: BenchArgs) -> Result<Report> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    run_until(a, &stop)
}

/// [`run`], ending the load early once `stop` is set (by the caller's signal handling).
pub fn run_until(a: BenchArgs, stop: &AtomicBool) -> Result<Report> {
    if !a.rate.is_finite() || a.rate <= 0.0 || a.calls == 0 {
        bail!("--rate and --calls must be positive");
    }
    // What clap's `conflicts_with` and `requires` say on the command line, for plans built
    // as values.
    if a.instructions && (!a.server_pid.is_empty() || a.find_peak) {
        bail!("--instructions counts a server started here, without --find-peak");
    }
    if (a.goodput_curve && (!a.find_peak || !a.curve_rates.is_empty()))
        || (a.config.is_some() && !a.server_pid.is_empty())
    {
        bail!(
            "--goodput-curve needs --find-peak and excludes --curve-rates; --config and \
             --server-pid exclude each other"
        );
    }
    if a.refuse_all && (a.config.is_some() || !a.server_pid.is_empty() || a.find_peak || a.oc) {
        bail!("--refuse-all configures a server started here, without --find-peak or --oc");
    }
    if a.curve_rates.iter().any(|r| !r.is_finite() || *r <= 0.0) {
        bail!("--curve-rates must be positive rates");
    }
    if let Some(q) = a.peak_quota {
        if !a.find_peak || a.cpu_quota.is_some() || !(q > 0.0 && q <= 1.0) {
            bail!(
                "--peak-quota is a share of one core (above 0, at most 1) for --find-peak, \
                 without --cpu-quota"
            );
        }
    }
    if a.identity != identity::IdentityMode::Off && (a.config.is_some() || !a.server_pid.is_empty())
    {
        bail!("--identity configures a server started here, without --config or --server-pid");
    }
    if a.identity == identity::IdentityMode::VerifyHostile && a.streams.transport != Transport::Udp
    {
        bail!("--identity verify-hostile sends its hostile INVITEs over UDP: --transport udp");
    }
    let cpus = cpu::cpu_count();
    if a.server_cpu >= cpus || a.load_cpu >= cpus {
        bail!("--server-cpu and --load-cpu must be below {cpus} (the CPUs online)");
    }
    let s = &a.streams;
    let noop = sipsec_transport::ablation::Stages::parse(&a.lab_noop)?;
    let certs_dir = tempfile::tempdir()?;
    let tls_dir = match &s.tls_dir {
        Some(d) => d.clone(),
        None => {
            // The certificate repository of an identity run serves over TLS too.
            if s.transport.secure() || a.identity != identity::IdentityMode::Off {
                modes::make_certs(certs_dir.path(), s.tls_cert_type)?;
            }
            certs_dir.path().to_path_buf()
        }
    };
    let shaken = identity::Identity::start(a.identity, certs_dir.path(), &tls_dir, a.load_cpu)?;
    let mut started = None;
    let mut peak_configs = None;
    let mut idle_to = None;
    let (target, pids_root, server) = if !a.server_pid.is_empty() {
        for &p in &a.server_pid {
            cpu::check_alive(p)?;
        }
        let target = a
            .target
            .clone()
            .context("--server-pid needs --target ip:port (where that server listens)")?;
        if s.idle_connections > 0 {
            let t = sipsec_transport::net::transport::Peer::parse(&target)
                .filter(|p| p.transport != Transport::Udp)
                .context(
                    "--idle-connections with --server-pid needs a stream --target (tcp:, tls:, \
                     ws: or wss:)",
                )?;
            idle_to = Some((t.addr, t.transport));
        }
        (target, a.server_pid.clone(), "external".to_string())
    } else {
        let dir = tempfile::tempdir()?;
        let config = match &a.config {
            // Absolute: the server runs in the scratch directory, not the caller's.
            Some(p) => std::path::absolute(p)?,
            None => {
                let p = dir.path().join("sipsec.toml");
                std::fs::write(&p, default_config(dir.path(), &a, &tls_dir) + &shaken.table)?;
                p
            }
        };
        let target = match &a.target {
            Some(t) => t.clone(),
            None => format!("{}:{}", s.transport, config_listen(&config, s.transport)?),
        };
        if s.idle_connections > 0 {
            // Connections of the run's own transport; TCP ones beside UDP calls.
            let t = match s.transport {
                Transport::Udp => Transport::Tcp,
                t => t,
            };
            idle_to = Some((config_listen(&config, t)?, t));
        }
        // A peak search without overload control reloads the server's config with it off,
        // so the server runs from a copy in its scratch directory, never the caller's file.
        let config = if a.find_peak && !a.peak_overload.is_on() && a.cpu_quota.is_none() {
            let c = PeakConfigs::new(&config, dir.path())?;
            let path = c.path.clone();
            peak_configs = Some(c);
            path
        } else {
            config
        };
        let s = start_sipsec(&config, dir, a.server_cpu, noop, a.instructions)?;
        let pid = s.child.id();
        started = Some(s);
        (target, vec![pid], "sipsec".to_string())
    };
    let quota = match a.cpu_quota {
        Some(f) => Some(quota::Quota::apply(
            f,
            &pids_root
                .iter()
                .flat_map(|&p| cpu::process_tree(p))
                .collect::<Vec<_>>(),
        )?),
        None => None,
    };
    cpu::pin_current_thread(a.load_cpu)?;

    let scenario = a.scenario.load();
    let domain = match (&a.domain, a.scenario) {
        (Some(d), _) => Some(d.clone()),
        (None, BenchScenario::Call | BenchScenario::Redirect) => None,
        (None, _) => Some(modes::BENCH_DOMAIN.to_string()),
    };
    let mut base = LoadArgs {
        target: Some(target.clone()),
        scenario,
        local: Some(UAC_IP.parse().expect("the bench's UAC address")),
        quiet: true,
        domain,
        redirect: RedirectArg::Stop,
        users: a.users.clone(),
        auth_reuse: a.auth_reuse,
        oc: a.oc,
        proxychain: a.proxychain_realm.is_some(),
        proxychain_realm: a.proxychain_realm.clone(),
        ..LoadArgs::default()
    };
    if a.scenario == BenchScenario::Call {
        base.role = LoadRole::Both;
        base.uas = Some(match s.transport {
            Transport::Udp => a.uas.clone(),
            t => format!("{t}:{}", a.uas),
        });
    }
    s.configure_load(&mut base, &tls_dir);
    identity::Identity::configure_load(a.identity, certs_dir.path(), &mut base);
    if s.transport.websocket() && a.scenario == BenchScenario::Call {
        // The callee registers one user over one WebSocket flow, and every call is to it
        // through the server's location table: one connection each side, as over TCP and
        // TLS (16 browsers' flows would spread the same calls over 16 connections' syscalls).
        let users = certs_dir.path().join("websocket-users.csv");
        std::fs::write(&users, "ws1,unused\n")?;
        base.register = true;
        base.users.get_or_insert(users);
        base.domain = Some(modes::BENCH_DOMAIN.into());
    }
    if noop.tls() {
        base.lab_noop = noop.to_arg();
    }
    let scenario = clap::ValueEnum::to_possible_value(&a.scenario)
        .expect("every scenario has a name")
        .get_name()
        .to_string();
    let rate = a.rate;
    let warmup = a.warmup_calls.unwrap_or((a.rate * 2.0) as u64).max(1);
    let warm_plan = load::Plan::new(LoadArgs {
        rate,
        calls: Some(warmup),
        ..base.clone()
    })?;
    let plan = load::Plan::new(LoadArgs {
        rate,
        calls: Some(a.calls),
        ..base.clone()
    })?;
    let mut bound = load::bind(&plan)?;

    if !a.quiet {
        eprintln!("sipsec bench: warming up with {warmup} {scenario} operations at {rate}/s");
    }
    let warm = load::execute(&warm_plan, &mut bound, stop)?;
    if counted(&a, &warm) == 0 {
        bail!(
            "no {scenario} succeeded during warm-up ({:?}): is the server at {target} routing to \
             the UAS at {}?",
            warm.failures_by_reason,
            a.uas
        );
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    let pids = pids_root
        .iter()
        .flat_map(|&p| cpu::process_tree(p))
        .collect::<Vec<_>>();
    if !a.quiet {
        eprintln!(
            "sipsec bench: measuring {} {scenario} operations at {rate}/s; server PIDs {pids:?}",
            a.calls
        );
    }
    let (idle, idle_memory) = match idle_to {
        Some((to, transport)) => {
            let before = idle::resident_kb(&pids);
            let (cert, key) = (
                tls_dir.join(sipsec_transport::tls::certs::SERVER),
                tls_dir.join(sipsec_transport::tls::certs::SERVER_KEY),
            );
            let held = idle::IdleConnections::open(
                to,
                s.idle_connections,
                transport,
                &tls_dir.join(sipsec_transport::tls::certs::CA),
                s.mutual.then_some((cert.as_path(), key.as_path())),
            )?;
            // Let the server settle with them before measuring.
            std::thread::sleep(std::time::Duration::from_secs(2));
            let with = idle::resident_kb(&pids);
            let memory = idle::Memory::new(before, with, s.idle_connections);
            if !a.quiet {
                eprintln!(
                    "sipsec bench: {} idle {transport} connections held; server resident \
                     memory {before} kB -> {with} kB ({:.1} kB a connection)",
                    s.idle_connections, memory.kb_per_connection
                );
            }
            (Some(held), Some(memory))
        }
        None => (None, None),
    };
    let peer_pids: Vec<u32> = a.peer_pid.iter().copied().chain(shaken.pid()).collect();
    let peers = peer_pids
        .iter()
        .flat_map(|&p| cpu::process_tree(p))
        .collect::<Vec<_>>();
    let counters0 = started
        .as_ref()
        .map(Started::counters)
        .transpose()?
        .flatten();
    if let Some(s) = &started {
        s.cut(1);
    }
    let wakeups0 = cpu::wakeups_of(&pids);
    let (server0, own0, peers0) = (cpu::cpu_of(&pids), cpu::own_cpu(), cpu::cpu_of(&peers));
    let hostile = match sipsec_transport::net::transport::Peer::parse(&target) {
        Some(to) => shaken.start_hostile(to.addr)?,
        None if a.identity == identity::IdentityMode::VerifyHostile => {
            bail!("--identity verify-hostile needs the server's address, not {target}")
        }
        None => None,
    };
    let began = std::time::Instant::now();
    let summary = load::execute(&plan, &mut bound, stop)?;
    let measured_s = began.elapsed().as_secs_f64();
    // The server's CPU is read at once; the hostile sender then waits for its last answers.
    let (server1, own1, peers1) = (cpu::cpu_of(&pids), cpu::own_cpu(), cpu::cpu_of(&peers));
    let wakeups = cpu::wakeups_of(&pids).saturating_sub(wakeups0);
    if let Some(s) = &started {
        s.cut(2);
    }
    let counters1 = started
        .as_ref()
        .map(Started::counters)
        .transpose()?
        .flatten();
    let server_counters = match (counters1, counters0) {
        (Some(after), Some(before)) => counters_since(&after, &before),
        _ => Counters::new(),
    };
    drop(idle);
    let identity_hostile = hostile.map(identity::Hostile::finish).transpose()?;
    if let (Some(h), false) = (&identity_hostile, a.quiet) {
        eprintln!(
            "sipsec bench: {} hostile INVITEs sent, answered {:?}",
            h.sent, h.answered
        );
    }
    let used = server1.since(server0);
    let ops = counted(&a, &summary);
    let per_op = |s: f64| us_per_op(s, ops);

    let load_us = per_op(own1.since(own0).total_s());
    // The peak search (and the curve) under a server-set limit: the server held to its
    // share, callers with a connection per call spread over their addresses.
    let mut peak_quota = None;
    let mut peak_held = None;
    let peak_search = if a.find_peak {
        let sources = if s.transport != Transport::Udp && s.mode.caller_per_call() {
            a.peak_source_addresses.max(1)
        } else {
            1
        };
        if sources > 1 {
            base.local = Some(peak::FIRST_SOURCE);
            base.source_addresses = sources;
        }
        let peak_plan = load::Plan::new(LoadArgs {
            rate,
            find_peak: true,
            step_s: a.step_s,
            peak_settle_s: SETTLE_S,
            ..base.clone()
        })?;
        if sources > 1 {
            // The callers' sockets again, from their new addresses (the UAS's listener is
            // closed first, so it can listen again).
            drop(bound);
            bound = load::bind(&peak_plan)?;
        }
        if let Some(ceiling) = a.peak_quota {
            let share = peak::share(ceiling, per_op(used.total_s()), load_us);
            let held = quota::Quota::apply(share, &pids).context(
                "--peak-quota holds the server with a CPU quota (lab run: --peak-quota 1 \
                 searches on a whole core instead)",
            )?;
            peak_quota = Some((held, share));
        }
        let held = peak_quota
            .as_ref()
            .map(|(q, share)| (q, *share))
            .or(quota.as_ref().zip(a.cpu_quota));
        let switched = peak_configs.as_ref().zip(started.as_ref());
        if let Some((c, server)) = switched {
            c.switch(server, false)?;
        }
        let watch = peak::Watch::start(&pids, held.map(|(q, _)| q));
        let search = load::execute(&peak_plan, &mut bound, stop)?;
        peak_held = Some(watch.end(&pids, held, sources, &search));
        if let Some((c, server)) = switched {
            c.switch(server, true)?;
        }
        Some(search)
    } else {
        None
    };
    // The rates the goodput is measured at: the grid asked for, or multiples of the peak.
    let curve_rates: Vec<f64> = match peak_search.as_ref().and_then(|s| s.peak_per_s) {
        _ if !a.curve_rates.is_empty() => a.curve_rates.clone(),
        Some(peak) if a.goodput_curve => CURVE
            .iter()
            .filter(|&&m| m <= a.curve_to + 1e-9)
            .map(|m| (peak * m).round().max(1.0))
            .collect(),
        _ => Vec::new(),
    };
    let mut goodput_curve = Vec::new();
    for r in curve_rates {
        // Let the server recover from what came before (the peak search ends past the
        // peak, and its overload control is still shedding) so each point is measured from
        // a settled server, the first one too.
        std::thread::sleep(std::time::Duration::from_secs_f64(SETTLE_S));
        let trial = load::Plan::new(LoadArgs {
            rate: r,
            duration: Some(a.step_s),
            ..base.clone()
        })?;
        let (cpu0, own0) = (cpu::cpu_of(&pids), cpu::own_cpu());
        let s = load::execute(&trial, &mut bound, stop)?;
        let cpu_s = cpu::cpu_of(&pids).since(cpu0).total_s();
        // Over the schedule, not the wall time with the drain after it (idle, up to 35 s):
        // the drain's little CPU makes it err high, which marks a point rather than hides it.
        let load_cpu_share = cpu::own_cpu().since(own0).total_s() / a.step_s;
        if !a.quiet {
            eprintln!(
                "sipsec bench: {r}/s offered for {}s: {} on time, p50 {:.1} ms (first response \
                 {:.1} ms), load generator {:.2} of its core; failed {:?}",
                a.step_s,
                s.on_time,
                s.latency_ms.p50,
                s.first_response_ms.p50,
                load_cpu_share,
                s.failures_by_reason
            );
        }
        goodput_curve.push(CurvePoint {
            rate: r,
            offered_per_s: s.attempted as f64 / a.step_s,
            goodput_per_s: s.on_time as f64 / a.step_s,
            server_cpu_us_per_op: us_per_op(cpu_s, counted(&a, &s)),
            load_cpu_share,
            latency_ms: s.latency_ms.clone(),
            first_response_ms: s.first_response_ms.clone(),
        });
    }
    drop(peak_quota);
    // What the quota did; the quota itself is lifted (dropped) here, before the server stops.
    let quota = quota.zip(a.cpu_quota).map(|(q, share)| QuotaHeld {
        cpu_quota: share,
        cpu_throttled_s: q.throttled().1,
    });
    let instructions = match started {
        Some(s) => s.stop(a.callgrind_out.as_deref())?,
        None => None,
    };
    let report = Report {
        server,
        scenario,
        transport: s.transport.to_string(),
        mode: format!("{:?}", s.mode).to_lowercase(),
        mutual_tls: s.mutual,
        tls_resumption: s.tls_resumption.is_on(),
        tls_backend: format!("{:?}", s.tls_backend).to_lowercase(),
        tls_cipher_suite: s.tls_cipher_suite.clone(),
        idle_connections: s.idle_connections,
        idle_memory,
        identity_hostile,
        rate: a.rate,
        ops,
        refuse_all: a.refuse_all,
        server_cpu_us_per_op: per_op(used.total_s()),
        server_user_us_per_op: per_op(used.split_s().0),
        server_sys_us_per_op: per_op(used.split_s().1),
        server_wakeups_per_op: if ops == 0 {
            0.0
        } else {
            wakeups as f64 / ops as f64
        },
        server_counters,
        load_cpu_us_per_op: load_us,
        peer_cpu_us_per_op: per_op(peers1.since(peers0).total_s()),
        measured_s,
        server_pids: pids,
        peer_pids,
        peak_per_s: peak_search.as_ref().and_then(|s| s.peak_per_s),
        load: summary,
        peak_search,
        goodput_curve,
        server_instructions_per_op: instructions
            .filter(|_| ops > 0)
            .map(|n| n as f64 / ops as f64),
        quota,
        peak_held,
    };
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default config of `sipsec bench` with no options, overload control on, the
    /// coalescing cap `cap`.
    fn plain_config(dir: &Path, cap: Option<u64>) -> String {
        let a = BenchArgs {
            max_batch_delay_us: cap,
            ..BenchArgs::default()
        };
        default_config(dir, &a, dir)
    }

    /// `--max-batch-delay-us` lands in the started server's `[server]` table, where the
    /// server validates it; without it the server keeps its own default.
    #[test]
    fn the_coalescing_cap_is_written_into_the_default_config() {
        let dir = tempfile::tempdir().unwrap();
        let config = |cap: Option<u64>| {
            let text = plain_config(dir.path(), cap);
            let path = dir.path().join("sipsec.toml");
            std::fs::write(&path, &text).unwrap();
            (text, sipsec_server::config::Config::load(&path))
        };
        let (text, loaded) = config(Some(0));
        assert!(text.contains("workers = 1\n") && text.contains("max_batch_delay_us = 0\n"));
        loaded.unwrap();
        let (text, loaded) = config(None);
        assert!(!text.contains("max_batch_delay_us"));
        loaded.unwrap();
        // Out of the server's range: refused, so the key is the one the server reads.
        let err = config(Some(20_000)).1.unwrap_err();
        assert!(format!("{err:#}").contains("max_batch_delay_us"), "{err:#}");
    }

    /// The peak search's config is the config as given with `[overload] enabled = false`,
    /// which the server loads; its copy starts as given, and switching writes each in turn.
    #[test]
    fn the_peak_search_config_only_switches_overload_control_off() {
        let dir = tempfile::tempdir().unwrap();
        let given = plain_config(dir.path(), None)
            + "[auth]\nscheme = \"digest\"\nrealm = \"bench.test\"\n";
        let path = dir.path().join("given.toml");
        std::fs::write(&path, &given).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let c = PeakConfigs::new(&path, scratch.path()).unwrap();
        assert_eq!(c.path, scratch.path().join("serve.toml"));
        assert_eq!(std::fs::read_to_string(&c.path).unwrap(), given);
        let on = sipsec_server::config::Config::load(&c.path).unwrap();
        std::fs::write(&c.path, &c.without_overload).unwrap();
        let off = sipsec_server::config::Config::load(&c.path).unwrap();
        assert!(on.overload.enabled && !off.overload.enabled);
        // Nothing else changed: the same listeners, workers and realm.
        assert_eq!(format!("{:?}", on.listen), format!("{:?}", off.listen));
        assert!(c.without_overload.contains("realm = \"bench.test\""));
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            given,
            "the given file untouched"
        );
        // A config without an [overload] table gets one.
        std::fs::write(&path, "[server]\nlisten = [\"udp:127.0.0.1:5060\"]\n").unwrap();
        let bare = PeakConfigs::new(&path, scratch.path()).unwrap();
        assert!(bare
            .without_overload
            .contains("[overload]\nenabled = false"));
    }
}
