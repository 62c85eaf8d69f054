//! The suites: each seed's experiment as a table of rows. A row is one `sipsec bench` run
//! (its options, as a value), what it needs set up first (a user database for digest), the
//! row its ratio is taken against, and the seed's own figure for the same configuration, so
//! the report can set ours beside theirs.

use crate::bench::identity::IdentityMode;
use crate::bench::modes::SeedMode::{self, Chain, Inbound, Local, Outbound};
use crate::bench::{BenchArgs, BenchScenario};
use serde::{Deserialize, Serialize};
use sipsec_load::cli::OnOff::{self, Off, On};
use sipsec_transport::net::transport::Transport;

/// What a row needs before its bench runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Setup {
    /// The bench's default config (a record-routing proxy, or the registrar).
    Plain,
    /// Digest authentication of every INVITE and REGISTER against a SQLite user database of
    /// [`USERS`] users, which the load's callers answer (seed 000's "SIP proxy auth").
    Digest,
    /// Seed 001's digest: INVITEs checked against PostgreSQL a WAN round trip (`WAN_RTT_MS`)
    /// away, through the delay relay; with sipsec's credential cache or a query per call as
    /// the paper's servers made. Needs `SIPSEC_TEST_POSTGRES` (skipped, saying so, without).
    DigestWan {
        /// The proxy keeps credentials it fetched (sipsec's cache) rather than querying per call.
        cache: bool,
    },
    /// Seed 001's Proxychain: INVITEs checked against hash chains from `sipsec authd` a WAN
    /// round trip away (through the delay relay), fetched when a chain runs out or, with
    /// prefetching, before it does.
    Proxychain {
        /// The proxy fetches the next chain before the current one runs out.
        prefetch: bool,
    },
    /// Two hops: the load goes to an upstream sipsec (beside the load, not held to a quota)
    /// that routes every call to the server under test; with `oc` the upstream speaks RFC
    /// 7339 (announces it, honours the feedback), without it the upstream is a plain proxy.
    Upstream {
        /// The upstream speaks RFC 7339 overload control.
        oc: bool,
    },
}

/// The round trip between the proxy and its authority or database in seed 001's rows, as
/// the paper measured between PlanetLab sites.
pub(crate) const WAN_RTT_MS: f64 = 33.0;

/// Callers in seed 001's rows: few enough that each runs through several chains in a
/// measured run, so chains are issued at their steady rate.
pub(crate) const WAN_CALLERS: usize = 100;

/// Users in the digest rows' database, and callers the load cycles through.
pub const USERS: usize = 1_000;

/// Which server a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Server {
    /// sipsec, started by the bench with the row's setup.
    Sipsec,
    /// Kamailio 5.6 with `peers/kamailio/proxy.cfg`, the reference row: run where
    /// Kamailio is installed, skipped with a note where it is not.
    Kamailio,
}

/// One row of a suite.
#[derive(Debug, Clone)]
pub struct Row {
    /// Short and stable: the key results are stored and resumed under.
    pub id: &'static str,
    /// What the row measures, in words: its name in the report's tables and charts.
    pub label: &'static str,
    /// The server the row measures.
    pub server: Server,
    /// What the row needs set up before its bench runs.
    pub setup: Setup,
    /// `sipsec bench` options besides rate, calls, output and what the setup adds.
    pub bench: BenchArgs,
    /// The row this one's ratio is taken against (itself for a baseline).
    pub baseline: &'static str,
    /// The row its set-up latency is read against in a [`Suite::latency`] table, where
    /// that is not `baseline` (a row asking whether something beside it makes calls wait).
    pub(crate) latency_baseline: Option<&'static str>,
    /// The seed's figure for this configuration, as the seed states it.
    pub seed: Option<&'static str>,
    /// The seed's cost relative to its baseline (the inverse of its throughput ratio), to
    /// set beside our ratio.
    pub(crate) seed_ratio: Option<f64>,
    /// Why this row cannot run on any build (it is listed, not measured).
    pub unavailable: Option<&'static str>,
    /// Offered rate when this row cannot hold the suite's (a configuration that collapses
    /// far below the others): its CPU per operation is then read at this rate.
    pub rate: Option<f64>,
    /// Stages the server and the load do without cryptography (`bench --lab-noop`; seed
    /// 002's ablation, lab builds only); empty for none.
    pub noop: &'static str,
    /// In a suite with a goodput curve: the row that searches this one's own capacity in
    /// every round (a row whose bench searches the peak, [`Row::searches_capacity`]); the
    /// report reads this row's goodput as a share of the peak searched in the same round
    /// too, beside the suite's one reference.
    pub(crate) capacity: Option<&'static str>,
}

impl Row {
    /// Whether this row, in a suite with a goodput curve, searches a peak in every round
    /// rather than measuring goodput on the grid: a capacity other rows are read against.
    pub(crate) fn searches_capacity(&self) -> bool {
        self.bench.find_peak
    }

    /// What the server is asked to do per operation, as a key: the server, its setup, the
    /// stages made free and every bench option but those that say how much, how fast, how
    /// long or how it is watched (rate, calls, warm-up, peak search and curve, quota, cores,
    /// callgrind, output). Rows of different suites with one key are one configuration
    /// measured twice (seed 002's base rows are seed 000's, seed 004's stateful rows seed
    /// 000's UDP and TCP ones): the cost model holds them out together.
    pub(crate) fn configuration(&self) -> String {
        let d = BenchArgs::default();
        let bench = BenchArgs {
            rate: d.rate,
            calls: d.calls,
            warmup_calls: d.warmup_calls,
            find_peak: d.find_peak,
            step_s: d.step_s,
            goodput_curve: d.goodput_curve,
            curve_to: d.curve_to,
            curve_rates: d.curve_rates,
            // The coalescing policy (seed 002 pins it) changes when the server sleeps, which
            // the model counts as wake-ups, not what a call costs: twins across it still
            // leave the fit together.
            max_batch_delay_us: d.max_batch_delay_us,
            cpu_quota: d.cpu_quota,
            peak_quota: d.peak_quota,
            peak_source_addresses: d.peak_source_addresses,
            server_cpu: d.server_cpu,
            load_cpu: d.load_cpu,
            instructions: d.instructions,
            json: d.json,
            quiet: d.quiet,
            ..self.bench.clone()
        };
        format!(
            "{:?} {:?} noop={:?} {bench:?}",
            self.server, self.setup, self.noop
        )
    }
}

/// One seed's experiment.
#[derive(Debug, Clone)]
pub struct Suite {
    /// Short and stable (`seed000`): the key the suite's results are stored under.
    pub name: &'static str,
    /// The heading of the suite's section in the report.
    pub title: &'static str,
    /// What the seed measured and what we compare.
    pub about: &'static str,
    /// The experiment's configurations, one bench run each.
    pub rows: Vec<Row>,
    /// Runs only in a `lab-noop` build (seed 002's ablation); skipped, saying how to build
    /// one, elsewhere.
    pub(crate) lab_build: bool,
    /// Every row measures its goodput curve past the peak (as `lab run --curve` asks of
    /// the other suites).
    pub curve: bool,
    /// The report adds each row's set-up latency (p50, p99) and its p99's ratio to the
    /// baseline's, paired by round: for rows whose question is whether calls wait.
    pub latency: bool,
}

impl Suite {
    /// The row whose id is `id`, if the suite has one.
    pub fn row(&self, id: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.id == id)
    }
}

/// Every suite, in the order `sipsec lab run` takes them.
pub fn all() -> Vec<Suite> {
    vec![
        seed000(),
        seed001(),
        seed002(),
        seed003(),
        seed004(),
        overload(),
        identity(),
    ]
}

/// The suite called `name`.
pub fn named(name: &str) -> Option<Suite> {
    all().into_iter().find(|s| s.name == name)
}

/// The bench's defaults: UDP, calls, a stateful proxy.
fn plain() -> BenchArgs {
    BenchArgs::default()
}

/// Calls over TCP in one of seed 000's connection modes.
fn tcp(mode: SeedMode) -> BenchArgs {
    let mut b = BenchArgs::default();
    b.streams.transport = Transport::Tcp;
    b.streams.mode = mode;
    b
}

/// Calls over TLS in one of seed 000's connection modes, with or without session resumption
/// and client certificates.
fn tls(mode: SeedMode, resumption: OnOff, mutual: bool) -> BenchArgs {
    let mut b = tcp(mode);
    b.streams.transport = Transport::Tls;
    b.streams.tls_resumption = resumption;
    b.streams.mutual = mutual;
    b
}

/// Calls over secure WebSocket (RFC 7118, browsers' SIP), the callers' connections in
/// `mode`; the callee registers and is called over its own connection, as a browser is (the
/// server opens none, so only the callers' side of seed 000's modes applies).
fn wss(mode: SeedMode) -> BenchArgs {
    let mut b = tls(mode, Off, false);
    b.streams.transport = Transport::Wss;
    b
}

#[allow(
    clippy::too_many_arguments,
    reason = "the suite tables are written as one call per row, a column per argument"
)]
fn row(
    id: &'static str,
    label: &'static str,
    setup: Setup,
    bench: BenchArgs,
    baseline: &'static str,
    seed: Option<&'static str>,
    seed_ratio: Option<f64>,
) -> Row {
    Row {
        id,
        label,
        server: Server::Sipsec,
        setup,
        bench,
        baseline,
        latency_baseline: None,
        seed,
        seed_ratio,
        unavailable: None,
        rate: None,
        noop: "",
        capacity: None,
    }
}

/// Seed 000 (Shen et al.): every cell of its tables II–V (20 distinct configurations; the
/// paper speaks of 18 peak measurements), and secure WebSocket (issue 38) beside its TLS in
/// the two modes a browser has, all through a stateful
/// record-routing proxy between a caller and a callee, with the seed's peak throughput (cps)
/// and its cost relative to UDP (UDP's peak over the row's). Rows without "resumption" have
/// it off, as the seed's plain "TLS" columns did; auth rows are relative to UDP with auth.
fn seed000() -> Suite {
    use Setup::{Digest, Plain};
    let r = |udp: f64, peak: f64| Some(udp / peak);
    let mut rows = vec![
        row(
            "udp",
            "UDP",
            Plain,
            plain(),
            "udp",
            Some("2,400 cps"),
            r(1.0, 1.0),
        ),
        row(
            "chain-tcp",
            "chain TCP",
            Plain,
            tcp(Chain),
            "udp",
            Some("1,139 cps"),
            r(2400.0, 1139.0),
        ),
        row(
            "chain-tls",
            "chain TLS",
            Plain,
            tls(Chain, Off, false),
            "udp",
            Some("695 cps (AES)"),
            r(2400.0, 695.0),
        ),
        row(
            "chain-wss",
            "chain WSS",
            Plain,
            wss(Chain),
            "udp",
            None,
            None,
        ),
        row(
            "udp-auth",
            "UDP, auth",
            Digest,
            plain(),
            "udp-auth",
            Some("462 cps"),
            r(1.0, 1.0),
        ),
        row(
            "chain-tcp-auth",
            "chain TCP, auth",
            Digest,
            tcp(Chain),
            "udp-auth",
            Some("361 cps"),
            r(462.0, 361.0),
        ),
        row(
            "chain-tls-auth",
            "chain TLS, auth",
            Digest,
            tls(Chain, Off, false),
            "udp-auth",
            Some("276 cps (AES)"),
            r(462.0, 276.0),
        ),
        row(
            "outbound-tcp",
            "outbound TCP, auth",
            Digest,
            tcp(Outbound),
            "udp-auth",
            Some("268 cps"),
            r(462.0, 268.0),
        ),
        row(
            "outbound-tls",
            "outbound TLS, auth",
            Digest,
            tls(Outbound, Off, false),
            "udp-auth",
            Some("151 cps"),
            r(462.0, 151.0),
        ),
        // Without authentication, beside a TLS row the seed did not have: the bench's
        // WebSocket callee registers its one user unchallenged.
        row(
            "outbound-tls-plain",
            "outbound TLS",
            Plain,
            tls(Outbound, Off, false),
            "udp",
            None,
            None,
        ),
        row(
            "outbound-wss",
            "outbound WSS",
            Plain,
            wss(Outbound),
            "udp",
            None,
            None,
        ),
        row(
            "outbound-tls-mutual",
            "outbound TLS mutual, auth",
            Digest,
            tls(Outbound, Off, true),
            "udp-auth",
            Some("122 cps"),
            r(462.0, 122.0),
        ),
        row(
            "outbound-tls-resumed",
            "outbound TLS resumption, auth",
            Digest,
            tls(Outbound, On, false),
            "udp-auth",
            Some("181 cps"),
            r(462.0, 181.0),
        ),
        row(
            "inbound-tcp",
            "inbound TCP",
            Plain,
            tcp(Inbound),
            "udp",
            Some("583 cps"),
            r(2400.0, 583.0),
        ),
        row(
            "inbound-tls",
            "inbound TLS",
            Plain,
            tls(Inbound, Off, false),
            "udp",
            Some("161 cps"),
            r(2400.0, 161.0),
        ),
        row(
            "inbound-tls-mutual",
            "inbound TLS mutual",
            Plain,
            tls(Inbound, Off, true),
            "udp",
            Some("115 cps"),
            r(2400.0, 115.0),
        ),
        row(
            "inbound-tls-resumed",
            "inbound TLS resumption",
            Plain,
            tls(Inbound, On, false),
            "udp",
            Some("326 cps"),
            r(2400.0, 326.0),
        ),
        row(
            "local-tcp",
            "local TCP, auth",
            Digest,
            tcp(Local),
            "udp-auth",
            Some("247 cps"),
            r(462.0, 247.0),
        ),
        row(
            "local-tls",
            "local TLS, auth",
            Digest,
            tls(Local, Off, false),
            "udp-auth",
            Some("91 cps"),
            r(462.0, 91.0),
        ),
        row(
            "local-tls-mutual",
            "local TLS mutual, auth",
            Digest,
            tls(Local, Off, true),
            "udp-auth",
            Some("61 cps"),
            r(462.0, 61.0),
        ),
        row(
            "local-tls-resumed",
            "local TLS resumption, auth",
            Digest,
            tls(Local, On, false),
            "udp-auth",
            Some("151 cps"),
            r(462.0, 151.0),
        ),
    ];
    for (id, label, seed, ratio, baseline) in [
        (
            "chain-tls-3des",
            "chain TLS 3DES",
            "534 cps",
            2400.0 / 534.0,
            "udp",
        ),
        (
            "chain-tls-3des-auth",
            "chain TLS 3DES, auth",
            "244 cps",
            462.0 / 244.0,
            "udp-auth",
        ),
    ] {
        rows.push(Row {
            unavailable: Some(
                "3DES: neither rustls nor OpenSSL 3 (Debian's) negotiates TLS_RSA_WITH_3DES_EDE_CBC_SHA",
            ),
            ..row(id, label, Plain, tls(Chain, On, false), baseline, Some(seed), Some(ratio))
        });
    }
    rows.push(Row {
        server: Server::Kamailio,
        ..row(
            "kamailio-udp",
            "Kamailio 5.6, UDP",
            Plain,
            plain(),
            "udp",
            None,
            None,
        )
    });
    Suite {
        name: "seed000",
        title: "Seed 000: the cost of TLS in four connection modes",
        about:
            "Shen et al. measured OpenSIPS's peak throughput in 18 configurations (tables II–V) \
                and explained it with a per-component cost model. Here each row is server CPU \
                per call at a fixed rate (the peak's inverse on one core), as a ratio to UDP \
                with the same authentication, beside the seed's cost ratio (UDP's peak over \
                the row's). Our TLS is 1.3 with ECDSA P-256 where the seed's was RSA key \
                exchange with AES-CBC-SHA.",
        rows,
        lab_build: false,
        curve: false,
        latency: false,
    }
}

/// Seed 001 (Dacosta and Traynor): no authentication, digest against a user database a WAN
/// round trip away (a query per call, as the paper's OpenSIPS made, and with sipsec's
/// credential cache), and Proxychain with the authority equally far, without and with
/// prefetching, and answered ahead (one challenge per chain: the client option of
/// docs/proxychain.md). The seed's figures are its peaks (no auth 24,000 cps, digest 1,160,
/// Proxychain 19,700) and its call-setup times (1.47, 36, 2.27/36.28, 2.67 ms).
fn seed001() -> Suite {
    use Setup::{DigestWan, Plain, Proxychain};
    let rows = vec![
        row(
            "no-auth",
            "no authentication",
            Plain,
            plain(),
            "no-auth",
            Some("24,000 cps; setup 1.47 ms"),
            Some(1.0),
        ),
        Row {
            // Four database connections, each one query per round trip: about 120
            // queries/s at most, so this row is read far below the others' rate.
            rate: Some(20.0),
            ..row(
                "digest-wan",
                "digest, query per call",
                DigestWan { cache: false },
                plain(),
                "no-auth",
                Some("1,160 cps; setup 36 ms"),
                Some(24_000.0 / 1_160.0),
            )
        },
        row(
            "digest-wan-cache",
            "digest, credential cache",
            DigestWan { cache: true },
            plain(),
            "no-auth",
            None,
            None,
        ),
        row(
            "proxychain",
            "Proxychain",
            Proxychain { prefetch: false },
            plain(),
            "no-auth",
            Some("19,700 cps; setup 2.27 ms (36.28 on a new chain)"),
            Some(24_000.0 / 19_700.0),
        ),
        row(
            "proxychain-prefetch",
            "Proxychain, prefetching",
            Proxychain { prefetch: true },
            plain(),
            "no-auth",
            Some("setup 2.67 ms"),
            None,
        ),
        row(
            "proxychain-ahead",
            "Proxychain, prefetching, answered ahead",
            Proxychain { prefetch: true },
            BenchArgs {
                auth_reuse: true,
                ..plain()
            },
            "no-auth",
            None,
            None,
        ),
    ];
    Suite {
        name: "seed001",
        title: "Seed 001: digest against a distant database, and Proxychain",
        about: "Dacosta and Traynor put the user database 33 ms from the proxies and saw digest \
                lose 95% of the peak while Proxychain, hash-chain credentials cached in the \
                proxy, lost 18%. Here the database (PostgreSQL) and the authority (sipsec \
                authd) sit behind a relay that adds 33 ms per round trip; each row is server \
                CPU per call at a fixed rate as a ratio to no authentication, with the call \
                set-up latency (INVITE to 200, the 407 round included) as a CDF. Answering \
                ahead is the client option of docs/proxychain.md (one challenge per chain, \
                not per call); the paper's exchange is the row above it.",
        rows,
        lab_build: false,
        curve: false,
        latency: false,
    }
}

/// Seed 002 (Coarfa, Druschel and Wallach) for SIP: each TLS stage — key exchange,
/// signatures, record encryption — and the digest hash replaced in turn by one that does no
/// arithmetic (`--lab-noop`, in a `lab-noop` build), in each of seed 000's four connection
/// modes with a full handshake per connection. A stage's saving is the base row's CPU less
/// the ablated row's; Amdahl's law bounds the speed-up from making it free at
/// 1 / (1 − saving ÷ base).
///
/// Every row runs with the worker's coalescing wait off (`server.max_batch_delay_us = 0`).
/// Left adaptive, a worker keeps whichever policy costs it less per message, and a no-op
/// stage changes that choice: the no-op record cipher made waiting pay, and wake-ups per
/// call fell from 5.95 to 2.75 (outbound) and from 6.94 to 2.79 (local), so the saving
/// mixed wake-ups with cryptography. With no wait the policy cannot differ between a base
/// row and its ablated rows: a worker wakes for each arrival in both, and no measurement
/// of cost can switch it (a zero cap turns the coalescer's judging off). Pinning waiting
/// instead would need a new server setting, and the length of each wait would still follow
/// the rate the worker measures.
fn seed002() -> Suite {
    use Setup::{Digest, Plain};
    // One mode's base row (TLS, a full handshake per connection) and its four ablated rows
    // (ids and labels built at compile time).
    macro_rules! ablated {
        ($id:literal, $label:literal, $mode:expr) => {
            ablated!(@rows $id, $label, $mode;
                ["", "", ""],
                ["-kx", ", no-op key exchange", "kx"],
                ["-sign", ", no-op signatures", "sign"],
                ["-aead", ", no-op record cipher", "aead"],
                ["-all", ", all three no-op", "tls"])
        };
        (@rows $id:literal, $label:literal, $mode:expr;
            $([$suffix:literal, $what:literal, $noop:literal]),*) => {
            [$(Row {
                noop: $noop,
                ..row(
                    concat!($id, "-tls", $suffix),
                    concat!($label, " TLS", $what),
                    Plain,
                    tls($mode, Off, false),
                    concat!($id, "-tls"),
                    None,
                    None,
                )
            }),*]
        };
    }
    let mut rows: Vec<Row> = [
        ablated!("chain", "chain", Chain),
        ablated!("outbound", "outbound", Outbound),
        ablated!("inbound", "inbound", Inbound),
        ablated!("local", "local", Local),
    ]
    .into_iter()
    .flatten()
    .collect();
    rows.push(row(
        "digest",
        "UDP, digest",
        Digest,
        plain(),
        "digest",
        None,
        None,
    ));
    rows.push(Row {
        noop: "digest",
        ..row(
            "digest-hash",
            "UDP, digest, no-op hash",
            Digest,
            plain(),
            "digest",
            None,
            None,
        )
    });
    // One coalescing policy for every row (no wait), so base and ablated rows sleep alike.
    for r in &mut rows {
        r.bench.max_batch_delay_us = Some(0);
    }
    Suite {
        name: "seed002",
        title: "Seed 002: what each stage costs, by making it free (no-op ablation)",
        about: "Coarfa et al. costed each stage of a TLS web server by replacing it with a \
                no-op and applying Amdahl's law. Here each TLS stage (key exchange, \
                signatures, record encryption) and the digest hash is replaced in turn, on \
                both ends, in a lab-noop build; a stage's saving is the base row's CPU per \
                call less the ablated row's, and 1 / (1 − saving ÷ base) is the most that \
                making the stage free could speed the configuration up. Every row runs with \
                the worker's coalescing wait off (server.max_batch_delay_us = 0): left \
                adaptive, a no-op stage changed the policy the worker chose and with it the \
                wake-ups per call (5.95 → 2.75 with the no-op record cipher, outbound), so \
                the saving mixed wake-ups with cryptography. The ablation table shows both \
                rows' wake-ups per call beside each saving.",
        rows,
        lab_build: true,
        curve: false,
        latency: false,
    }
}

/// Seed 003 (Maguluri's MS thesis): OpenSIPS on one core as a registrar with and without
/// digest, over UDP and TCP (its Table 1, Appendix C: CPU utilisation at 100–8,000
/// registrations/s), and as a stateful proxy of calls (INVITE to BYE) over UDP, TCP and TLS
/// (its Table 2, Appendix D, and Figure 32: the peaks at 100% CPU).
///
/// Table 1: digest rows are read against the same transport without digest, as the thesis
/// took its ratios ("the performance degradation varied from 4.63 times to 5.26 times" over
/// UDP, "from 4.5 times to 5.4 times" over TCP, "approximately five times" for both). The
/// thesis does not say whether SIPp registered over one TCP socket (`-t t1`) or one per
/// registration (`-t tn`); as in seed 004's TCP registrar rows, one persistent connection
/// ([`Chain`]).
///
/// Table 2: the thesis ran every TLS case with "only one operating mode (local proxy
/// mode)", the UAC's SIPp with `-t ln` (a TLS socket per call) and "multiple incoming and
/// outgoing TLS connections": our [`Local`] (a connection per call on both sides). "TCP
/// Mono (Single socket)" is one persistent connection each side ([`Chain`]); "TCP Multi
/// (Multiple sockets)" a connection per call each side ([`Local`]). "Client
/// authentication" is the client authenticating the server (a server certificate only);
/// "session reuse" resumes a session cached earlier on each new connection (resumption on,
/// still a connection per call); "mutual" adds the proxy's demand for client certificates.
/// Every row's seed ratio is UDP's peak over the row's, against UDP.
fn seed003() -> Suite {
    use Setup::{Digest, Plain};
    let register = |b: BenchArgs| BenchArgs {
        scenario: BenchScenario::Register,
        ..b
    };
    let mut rows = vec![
        row(
            "register",
            "register UDP",
            Plain,
            register(plain()),
            "register",
            Some("19% CPU at 5,750 RPS"),
            Some(1.0),
        ),
        row(
            "register-digest",
            "register UDP, digest",
            Digest,
            register(plain()),
            "register",
            Some("100% CPU at 5,750 RPS; 4.63–5.26× the CPU at every rate"),
            // "approximately five times".
            Some(5.0),
        ),
        row(
            "register-tcp",
            "register TCP",
            Plain,
            register(tcp(Chain)),
            "register-tcp",
            Some("42.5% CPU at 8,000 RPS"),
            Some(1.0),
        ),
        row(
            "register-tcp-digest",
            "register TCP, digest",
            Digest,
            register(tcp(Chain)),
            "register-tcp",
            Some("100% CPU at ≈4,500 RPS; 4.5–5.4× the CPU at every rate"),
            Some(5.0),
        ),
    ];
    // Table 2: (id, label, bench, the thesis's peak as it gives it, and as a number).
    let udp_peak = 1_810.0;
    for (id, label, bench, seed, peak) in [
        ("udp", "UDP", plain(), "1,810 cps", udp_peak),
        (
            "tcp-mono",
            "TCP, one connection",
            tcp(Chain),
            "1,130 cps",
            1_130.0,
        ),
        (
            "tcp-multi",
            "TCP, a connection per call",
            tcp(Local),
            "865 cps",
            865.0,
        ),
        (
            "tls",
            "local TLS, a handshake per call",
            tls(Local, Off, false),
            "135 cps",
            135.0,
        ),
        (
            "tls-reuse",
            "local TLS, session reuse",
            tls(Local, On, false),
            "320 cps",
            320.0,
        ),
        (
            "tls-mutual",
            "local TLS mutual",
            tls(Local, Off, true),
            "95 cps",
            95.0,
        ),
    ] {
        rows.push(row(
            id,
            label,
            Plain,
            bench,
            "udp",
            Some(seed),
            Some(udp_peak / peak),
        ));
    }
    Suite {
        name: "seed003",
        title: "Seed 003: digest at the registrar, and TLS at a local proxy",
        about: "Maguluri measured OpenSIPS on one core. Table 1: a registrar's CPU with and \
                without digest over UDP and TCP, digest costing 4.63–5.26× (UDP) and 4.5–5.4× \
                (TCP) the CPU at every rate, \"approximately five times\"; here each digest row \
                is read against the same transport without digest. Table 2: a stateful proxy's \
                peak over UDP (1,810 cps), TCP on one connection (1,130) and with a connection \
                per call (865), and TLS as a local proxy (a connection per call on both \
                sides): a full handshake per call with a server certificate only (135), \
                session reuse (320) and mutual authentication (95); here each is server CPU \
                per call at a fixed rate as a ratio to UDP, beside UDP's peak over the row's.",
        rows,
        lab_build: false,
        curve: false,
        latency: false,
    }
}

/// Seed 004 (Nahum et al.): registration and proxying, stateful and stateless, UDP and TCP,
/// with and without digest; CPU per operation and (with `--peak`) the peak at ≥ 99% success.
///
/// The seed's peaks are in its figures; its text gives the stateful UDP peaks (4,012 and 701
/// cps with digest), stateful TCP with digest (400 cps) and the losses each feature causes.
/// Rows marked "derived" follow from those: TCP costs stateful digest 43% (701 → 400),
/// digest costs stateful TCP 60% (so ≈1,000 cps), state costs TCP 60% (stateless TCP
/// ≈2,500), TCP costs stateless 65% (stateless UDP ≈7,100).
fn seed004() -> Suite {
    use Setup::{Digest, Plain};
    let mut rows = vec![
        row(
            "register",
            "register UDP",
            Plain,
            BenchArgs {
                scenario: BenchScenario::Register,
                ..plain()
            },
            "register",
            None,
            Some(1.0),
        ),
        row(
            "register-auth",
            "register UDP, digest",
            Digest,
            BenchArgs {
                scenario: BenchScenario::Register,
                ..plain()
            },
            "register",
            Some("−80% peak"),
            Some(5.0),
        ),
        row(
            "register-tcp",
            "register TCP",
            Plain,
            BenchArgs {
                scenario: BenchScenario::Register,
                ..tcp(Chain)
            },
            "register",
            Some("−19.8% peak"),
            Some(1.0 / (1.0 - 0.198)),
        ),
        row(
            "register-tcp-auth",
            "register TCP, digest",
            Digest,
            BenchArgs {
                scenario: BenchScenario::Register,
                ..tcp(Chain)
            },
            "register",
            Some("−75% of TCP's peak"),
            Some(4.0 / (1.0 - 0.198)),
        ),
        row(
            "stateful",
            "stateful UDP",
            Plain,
            plain(),
            "stateful",
            Some("4,012 cps"),
            Some(1.0),
        ),
        row(
            "stateful-auth",
            "stateful UDP, digest",
            Digest,
            plain(),
            "stateful",
            Some("701 cps"),
            Some(4012.0 / 701.0),
        ),
        row(
            "stateful-tcp",
            "stateful TCP",
            Plain,
            tcp(Chain),
            "stateful",
            Some("≈1,000 cps (derived)"),
            Some(4012.0 / 1000.0),
        ),
        row(
            "stateful-tcp-auth",
            "stateful TCP, digest",
            Digest,
            tcp(Chain),
            "stateful",
            Some("400 cps"),
            Some(4012.0 / 400.0),
        ),
    ];
    // Stateless rows: the bench's --stateless default config has no [auth] table.
    rows.push(row(
        "stateless",
        "stateless UDP",
        Plain,
        BenchArgs {
            stateless: true,
            ..plain()
        },
        "stateful",
        Some("≈7,100 cps (derived)"),
        Some(4012.0 / 7143.0),
    ));
    rows.push(row(
        "stateless-tcp",
        "stateless TCP",
        Plain,
        BenchArgs {
            stateless: true,
            ..tcp(Chain)
        },
        "stateful",
        Some("≈2,500 cps (derived)"),
        Some(4012.0 / 2500.0),
    ));
    // Redirection: INVITE answered 302 (to the default route) and ACKed, no dialog. The
    // seed found it the cheapest scenario of all (fewer messages than proxying, less work
    // than registration); its text gives no redirection peak, only the losses: digest
    // −90.5% (UDP), TCP −55.2% (no digest) and −23.5% (digest).
    for (id, label, setup, bench, seed, ratio) in [
        (
            "redirect",
            "redirect UDP",
            Plain,
            BenchArgs {
                scenario: BenchScenario::Redirect,
                ..plain()
            },
            None,
            Some(1.0),
        ),
        (
            "redirect-auth",
            "redirect UDP, digest",
            Digest,
            BenchArgs {
                scenario: BenchScenario::Redirect,
                ..plain()
            },
            Some("−90.5% peak"),
            Some(1.0 / 0.095),
        ),
        (
            "redirect-tcp",
            "redirect TCP",
            Plain,
            BenchArgs {
                scenario: BenchScenario::Redirect,
                ..tcp(Chain)
            },
            Some("−55.2% peak"),
            Some(1.0 / 0.448),
        ),
        (
            "redirect-tcp-auth",
            "redirect TCP, digest",
            Digest,
            BenchArgs {
                scenario: BenchScenario::Redirect,
                ..tcp(Chain)
            },
            Some("−23.5% of UDP digest's"),
            Some(1.0 / (0.095 * 0.765)),
        ),
    ] {
        rows.push(row(id, label, setup, bench, "redirect", seed, ratio));
    }
    // TLS, which the seed did not measure: every operation above over one TLS connection per
    // caller (seed 000's chain mode, no handshake per operation), read against the same
    // operation over UDP without authentication like the rest of the table. They add the
    // record layer to registration and redirection, configurations no other suite has.
    for (id, label, setup, scenario, stateless, baseline) in [
        (
            "register-tls",
            "register TLS",
            Plain,
            BenchScenario::Register,
            false,
            "register",
        ),
        (
            "register-tls-auth",
            "register TLS, digest",
            Digest,
            BenchScenario::Register,
            false,
            "register",
        ),
        (
            "stateful-tls",
            "stateful TLS",
            Plain,
            BenchScenario::Call,
            false,
            "stateful",
        ),
        (
            "stateful-tls-auth",
            "stateful TLS, digest",
            Digest,
            BenchScenario::Call,
            false,
            "stateful",
        ),
        (
            "stateless-tls",
            "stateless TLS",
            Plain,
            BenchScenario::Call,
            true,
            "stateful",
        ),
        (
            "redirect-tls",
            "redirect TLS",
            Plain,
            BenchScenario::Redirect,
            false,
            "redirect",
        ),
        (
            "redirect-tls-auth",
            "redirect TLS, digest",
            Digest,
            BenchScenario::Redirect,
            false,
            "redirect",
        ),
    ] {
        let bench = BenchArgs {
            scenario,
            stateless,
            ..tls(Chain, Off, false)
        };
        rows.push(row(id, label, setup, bench, baseline, None, None));
    }
    Suite {
        name: "seed004",
        title: "Seed 004: registration, proxying and redirection, with and without authentication",
        about: "Nahum et al. measured OpenSER's peak for registration, stateful and stateless \
                proxying and redirection, over UDP and TCP, with and without digest (against \
                MySQL), and saw authentication cost the most (−60% to −90%), then TCP (−43% \
                to −65%), and redirection cheapest of all. Here: server CPU per operation at \
                a fixed rate as a ratio to the same operation over UDP without \
                authentication, and the peak with --peak. The TLS rows are ours: the seed \
                did not measure TLS.",
        rows,
        lab_build: false,
        curve: false,
        latency: false,
    }
}

/// The share of a core the overload suite holds the server under test to: one core of load
/// generator then offers it several times its peak.
pub(crate) const OVERLOAD_QUOTA: f64 = 0.25;
/// The overload suite's grid: every row's goodput is measured at these multiples of one
/// reference capacity (the uncontrolled server's peak, searched once per run), so every row
/// is read at the same offered rates.
pub const GRID: [f64; 6] = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0];

/// The grid's offered rates for a reference capacity, operations per second: what the run
/// offers and what the report reads at.
pub fn grid(reference: f64) -> Vec<f64> {
    GRID.iter().map(|m| (reference * m).round()).collect()
}
/// The row name the reference capacity is stored under in the results (round 0).
pub const REFERENCE: &str = "reference";

/// Overload control (seed 004's collapse past the peak, and RFC 7339/7415): goodput against
/// offered load up to four times the peak, for sipsec with control off and on, with a load
/// that honours the feedback, over UDP and over TLS, for Kamailio, and for two sipsec hops.
fn overload() -> Suite {
    use Setup::{Plain, Upstream};
    // Every row holds the server to the quota and is read against control off.
    let quota = || BenchArgs {
        cpu_quota: Some(OVERLOAD_QUOTA),
        ..plain()
    };
    let at_quota = |id, label, setup, bench| row(id, label, setup, bench, "off", None, None);
    let rows = vec![
        at_quota(
            "off",
            "sipsec, overload control off",
            Plain,
            BenchArgs {
                overload: Off,
                ..quota()
            },
        ),
        at_quota("on", "sipsec, local admission control", Plain, quota()),
        at_quota(
            "capacity",
            "sipsec's peak, control off, searched every round",
            Plain,
            BenchArgs {
                overload: Off,
                find_peak: true,
                ..quota()
            },
        ),
        Row {
            capacity: Some("capacity"),
            ..at_quota(
                "on-oc",
                "sipsec, callers honour RFC 7339 feedback",
                Plain,
                BenchArgs {
                    oc: true,
                    ..quota()
                },
            )
        },
        // A stream worker reads many messages a system call, so over TLS the quarter core
        // carries well above the UDP reference: the TLS rows are read against their own
        // capacity too.
        at_quota(
            "tls-capacity",
            "sipsec over TLS: its peak, control off, searched every round",
            Plain,
            BenchArgs {
                cpu_quota: Some(OVERLOAD_QUOTA),
                overload: Off,
                find_peak: true,
                ..tls(Chain, On, false)
            },
        ),
        Row {
            capacity: Some("tls-capacity"),
            ..at_quota(
                "on-tls",
                "sipsec over TLS, local admission control",
                Plain,
                BenchArgs {
                    cpu_quota: Some(OVERLOAD_QUOTA),
                    ..tls(Chain, On, false)
                },
            )
        },
        Row {
            capacity: Some("tls-capacity"),
            ..at_quota(
                "on-oc-tls",
                "sipsec over TLS, callers honour RFC 7339 feedback",
                Plain,
                BenchArgs {
                    cpu_quota: Some(OVERLOAD_QUOTA),
                    oc: true,
                    ..tls(Chain, On, false)
                },
            )
        },
        at_quota(
            "refused",
            "sipsec refusing every new call (per refusal: r)",
            Plain,
            BenchArgs {
                refuse_all: true,
                ..quota()
            },
        ),
        Row {
            server: Server::Kamailio,
            ..at_quota(
                "kamailio",
                "Kamailio 5.6 (no overload control)",
                Plain,
                quota(),
            )
        },
        // Behind an upstream the downstream's work differs (the upstream's Via and
        // Record-Route in every request, longer responses; one paced sender): its own
        // capacity there, not the single server's, is what the two-hop rows keep a share of.
        at_quota(
            "two-hop-capacity",
            "two hops: the downstream's peak behind a plain upstream, control off, searched \
             every round",
            Upstream { oc: false },
            BenchArgs {
                overload: Off,
                find_peak: true,
                ..quota()
            },
        ),
        Row {
            capacity: Some("two-hop-capacity"),
            ..at_quota(
                "two-hop",
                "two hops, upstream a plain proxy",
                Upstream { oc: false },
                quota(),
            )
        },
        Row {
            capacity: Some("two-hop-capacity"),
            ..at_quota(
                "two-hop-oc",
                "two hops, upstream honours RFC 7339",
                Upstream { oc: true },
                quota(),
            )
        },
    ];
    Suite {
        name: "overload",
        title: "Overload: goodput past the peak (seed 004's collapse, RFC 7339/7415)",
        about: "Seed 004 saw servers collapse past their peak: retransmissions multiply the \
                load and the server spends itself on calls that time out. Here the server \
                is held to a quarter of a core (a cgroup CPU quota) so one core of load can \
                offer it four times its peak. The uncontrolled server's peak over UDP is \
                searched once per run (the reference capacity); every row's goodput (calls \
                completed within 500 ms per second) is then measured at the same offered \
                rates, half to four times that reference, and read as a share of it — the \
                TLS rows too, though their own capacity is higher. Rows that name their own capacity \
                (the peak of their configuration with control off, searched in every round \
                beside them) are read as a share of that too, round by round. The CPU column is \
                at a rate below the peak, where control must cost nothing; one row refuses \
                every call there, and its ratio is r, a refusal's cost as a share of a \
                call's, which bounds what callers that ignore feedback can keep at k times \
                capacity: 1/(1 + (k−1)·r).",
        rows,
        lab_build: false,
        curve: true,
        latency: false,
    }
}

/// STIR/SHAKEN (issue 39), measured as the seeds measured TLS: CPU per call of a stateful
/// proxy that signs every INVITE, that verifies every INVITE with the signing certificate
/// cached, and that verifies with a fetch of the certificate per call, each against the same
/// proxy without, calls between the same telephone numbers. The fetch per call runs at 200
/// calls/s, against its own baseline there: at 2,000 calls arrive while a fetch is under way
/// and wait for it, so fetches are no longer per call.
fn identity() -> Suite {
    use Setup::Plain;
    let with = |identity| BenchArgs {
        identity,
        ..plain()
    };
    let at = |rate, r: Row| Row {
        rate: Some(rate),
        ..r
    };
    let rows = vec![
        row(
            "unsigned",
            "no STIR/SHAKEN",
            Plain,
            with(IdentityMode::Unsigned),
            "unsigned",
            None,
            None,
        ),
        row(
            "sign",
            "signs every INVITE",
            Plain,
            with(IdentityMode::Sign),
            "unsigned",
            None,
            None,
        ),
        row(
            "verify",
            "verifies every INVITE, certificate cached",
            Plain,
            with(IdentityMode::Verify),
            "unsigned",
            None,
            None,
        ),
        Row {
            latency_baseline: Some("verify"),
            ..row(
                "verify-hostile",
                "verifies as above while 50 hostile INVITEs/s wait on fetches that never answer",
                Plain,
                with(IdentityMode::VerifyHostile),
                "unsigned",
                None,
                None,
            )
        },
        at(
            200.0,
            row(
                "unsigned-200",
                "no STIR/SHAKEN, 200 calls/s",
                Plain,
                with(IdentityMode::Unsigned),
                "unsigned-200",
                None,
                None,
            ),
        ),
        at(
            200.0,
            row(
                "verify-fetch",
                "verifies every INVITE, a certificate fetch per call, 200 calls/s",
                Plain,
                with(IdentityMode::VerifyFetch),
                "unsigned-200",
                None,
                None,
            ),
        ),
    ];
    Suite {
        name: "identity",
        title: "Caller identity: what STIR/SHAKEN costs a proxy",
        about: "No seed measured it: the security operators are asked for today is caller \
                identity (RFC 8224/8225/8588). A stateful proxy signs every call's INVITE \
                (an ES256 PASSporT in an Identity header), or verifies every INVITE the load \
                signed: with the signing certificate fetched once and cached, and with no \
                certificate kept, so each call fetches it over HTTPS from a certificate \
                repository beside the load (`sipsec cert-server`) and checks its chain. \
                Each row is server CPU per call as a ratio to the same proxy without \
                STIR/SHAKEN at the same rate, calls between the same telephone numbers; the \
                fetch per call is read at 200 calls/s, where fetches are per call (at \
                2,000 a call arriving during a fetch waits for it). In the hostile row, beside \
                the same calls, 50 INVITEs a second each name a certificate of their own at \
                a host that takes connections and never answers (each fetch, or the wait \
                for a fetch slot, lasts its 2 s time-out): whether the good calls wait is read in the latency table, its \
                set-up p99 against verification's alone (issue 39: within 10%).",
        rows,
        lab_build: false,
        curve: false,
        latency: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_suite_has_unique_ids_and_baselines_that_exist() {
        for s in all() {
            let mut ids: Vec<_> = s.rows.iter().map(|r| r.id).collect();
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), s.rows.len(), "{}: duplicate ids", s.name);
            for r in &s.rows {
                let base = s.row(r.baseline).unwrap_or_else(|| panic!("{}", r.id));
                assert_eq!(base.baseline, base.id, "{}: a baseline is its own", r.id);
                if let Some(l) = r.latency_baseline {
                    assert!(
                        s.latency && s.row(l).is_some(),
                        "{}: latency against {l}",
                        r.id
                    );
                }
            }
        }
    }

    #[test]
    fn seed000_lists_every_cell_of_the_papers_tables() {
        let s = named("seed000").unwrap();
        let seeds = s.rows.iter().filter(|r| r.seed.is_some()).count();
        // Tables II-V: UDP with and without auth (each repeated in three tables), 6 chain
        // TCP/TLS cells (two of them 3DES) and 4 TCP/TLS cells in each of the other modes.
        assert_eq!(seeds, 2 + 6 + 3 * 4);
    }

    /// Every configuration of the thesis's Tables 1 and 2 is a row with the thesis's figure,
    /// in the setup the thesis describes, and its ratio is taken where the thesis took it.
    #[test]
    fn seed003_has_every_configuration_of_the_thesis_tables() {
        let s = named("seed003").unwrap();
        let names: Vec<_> = all().iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            ["seed000", "seed001", "seed002", "seed003", "seed004", "overload", "identity"]
        );
        // Table 1: (row, baseline, digest, transport, ratio).
        for (id, base, digest, transport, ratio) in [
            ("register", "register", false, Transport::Udp, 1.0),
            ("register-digest", "register", true, Transport::Udp, 5.0),
            ("register-tcp", "register-tcp", false, Transport::Tcp, 1.0),
            (
                "register-tcp-digest",
                "register-tcp",
                true,
                Transport::Tcp,
                5.0,
            ),
        ] {
            let r = s.row(id).unwrap_or_else(|| panic!("{id}"));
            assert_eq!(r.bench.scenario, BenchScenario::Register, "{id}");
            assert_eq!(r.baseline, base, "{id}");
            assert_eq!(r.setup == Setup::Digest, digest, "{id}");
            assert_eq!(r.bench.streams.transport, transport, "{id}");
            assert_eq!(r.seed_ratio, Some(ratio), "{id}");
            assert!(r.seed.is_some(), "{id}");
        }
        // Table 2: (row, transport, mode, resumption, mutual, the thesis's peak).
        let calls = [
            (
                "udp",
                Transport::Udp,
                Chain,
                Off,
                false,
                "1,810 cps",
                1_810.0,
            ),
            (
                "tcp-mono",
                Transport::Tcp,
                Chain,
                Off,
                false,
                "1,130 cps",
                1_130.0,
            ),
            (
                "tcp-multi",
                Transport::Tcp,
                Local,
                Off,
                false,
                "865 cps",
                865.0,
            ),
            ("tls", Transport::Tls, Local, Off, false, "135 cps", 135.0),
            (
                "tls-reuse",
                Transport::Tls,
                Local,
                On,
                false,
                "320 cps",
                320.0,
            ),
            (
                "tls-mutual",
                Transport::Tls,
                Local,
                Off,
                true,
                "95 cps",
                95.0,
            ),
        ];
        for (id, transport, mode, resumption, mutual, seed, peak) in calls {
            let r = s.row(id).unwrap_or_else(|| panic!("{id}"));
            let b = &r.bench.streams;
            assert_eq!(r.bench.scenario, BenchScenario::Call, "{id}");
            assert_eq!((r.setup, r.baseline), (Setup::Plain, "udp"), "{id}");
            assert_eq!(b.transport, transport, "{id}");
            if transport != Transport::Udp {
                assert_eq!(b.mode, mode, "{id}");
            }
            if transport == Transport::Tls {
                assert_eq!((b.tls_resumption, b.mutual), (resumption, mutual), "{id}");
            }
            assert_eq!(r.seed, Some(seed), "{id}");
            let ratio = r.seed_ratio.unwrap();
            assert!((ratio - 1_810.0 / peak).abs() < 1e-9, "{id}: {ratio}");
        }
        assert_eq!(s.rows.len(), 4 + calls.len(), "no row besides the tables'");
        assert!(s
            .rows
            .iter()
            .all(|r| r.server == Server::Sipsec && r.unavailable.is_none() && r.noop.is_empty()));
    }

    /// Seed 002's rows all run under one coalescing policy (no wait), so a no-op stage
    /// cannot change how its row sleeps; no other suite's rows are pinned.
    #[test]
    fn seed002_pins_the_coalescing_policy_of_every_row() {
        for s in all() {
            for r in &s.rows {
                let pinned = s.name == "seed002";
                assert_eq!(
                    r.bench.max_batch_delay_us,
                    pinned.then_some(0),
                    "{}/{}",
                    s.name,
                    r.id
                );
            }
        }
    }
}
