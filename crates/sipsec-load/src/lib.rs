//! `sipsec load`: an open-loop SIP load generator — caller (UAC), callee (UAS), or both in one
//! process — for the scenarios the seeds measured: calls, registrations, redirects, OPTIONS.
//!
//! - [`cli`]: the command line (`sipsec load --help`);
//! - [`ua`]: the sans-IO user agent on `sip-core`'s transactions — its caller, its callee,
//!   and how it answers digest and Proxychain challenges;
//! - [`schedule`]: the open-loop start schedule, constant or ramped;
//! - [`driver`]: the single-threaded I/O loop and UDP; [`connections`]: TCP and TLS;
//! - [`peak`]: the `--find-peak` search;
//! - [`stats`] and [`report`]: counting, the live line, the summary and its JSON;
//! - [`users`]: the CSV of users and credentials;
//! - [`stun`]: the STUN keep-alive of a registered callee over UDP (RFC 5626 §4.4.1);
//! - [`sources`]: which of the caller's source addresses each call comes from.

pub mod cli;
pub mod connections;
pub mod driver;
pub mod peak;
pub mod report;
pub mod schedule;
pub mod sources;
pub mod stats;
pub mod stun;
pub mod ua;
pub mod users;

use anyhow::{bail, Context, Result};
pub use cli::LoadArgs;
use cli::{parse_endpoint, ConnectionArg, RedirectArg, Role, ScenarioArg};
use driver::{Links, RunOptions, UdpLinks};
use report::{Latency, Progress, Step, Summary};
use schedule::{Limit, Pacer, RatePlan};
use sipsec_transport::net::transport::Transport;
use sipsec_transport::tls;
use sources::Sources;
use stats::RunTally;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use ua::{Endpoint, Scenario, Ua, UaConfig};
use users::Users;

/// The local IP the kernel would use to reach `target`.
fn route_source(target: SocketAddr) -> Result<IpAddr> {
    let any: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let probe = UdpSocket::bind(any)?;
    probe
        .connect(target)
        .with_context(|| format!("no route to {target}"))?;
    Ok(probe.local_addr()?.ip())
}

/// The TLS configurations of a run: a client side for the caller, a server side for the UAS.
fn stream_tls(args: &LoadArgs, caller: bool, callee: bool) -> Result<connections::StreamTls> {
    let protocol = tls::Protocol {
        backend: args.tls_backend,
        versions: args.tls_versions.clone(),
        cipher_suites: args.tls_cipher_suites.clone(),
        key_exchange: args.tls_key_exchange.clone(),
        session_resumption: args.tls_resumption.is_on(),
        noop: sipsec_transport::ablation::Stages::parse(&args.lab_noop)?,
    };
    if protocol.noop.tls() {
        sipsec_transport::ablation::warn_loudly(protocol.noop);
    }
    let identity = args.tls_cert.clone().zip(args.tls_key.clone());
    let mut out = connections::StreamTls::default();
    if caller {
        if args.tls_ca.is_none() && !args.tls_no_verify {
            bail!(
                "TLS needs a CA to verify the server's certificate (--tls-ca), or an explicit \
                 --tls-no-verify"
            );
        }
        let side = tls::ClientSide {
            ca: args.tls_ca.clone(),
            no_verify: args.tls_no_verify,
            identity: identity.clone(),
            protocol: protocol.clone(),
        };
        out.client = Some((tls::client(&side)?, args.tls_server_name.clone()));
    }
    if callee {
        let (cert, key) = identity.context(
            "the UAS needs a certificate over TLS: --tls-cert and --tls-key (`sipsec certs` \
             makes a test set)",
        )?;
        let side = tls::ServerSide {
            cert,
            key,
            ca: args.tls_ca.clone(),
            client_auth: args.tls_client_auth,
            // Whether to resume is the caller's choice; the UAS always can.
            protocol: tls::Protocol {
                session_resumption: true,
                ..protocol
            },
        };
        out.server = Some(tls::server(&side)?);
    }
    Ok(out)
}

/// A validated load run, ready to execute against its sockets.
pub struct Plan {
    /// The options the plan was made from, as given.
    pub args: LoadArgs,
    /// The transport, resolved from --transport or the addresses.
    pub transport: Transport,
    /// TLS configurations (built while planning, so a bad certificate is a usage error).
    pub tls: connections::StreamTls,
    /// Where the caller sends its requests (`--uas` for `--role both` without a target); none
    /// for a pure UAS.
    pub target: Option<SocketAddr>,
    /// Where the UAS listens (roles uas and both).
    pub uas: Option<SocketAddr>,
    /// The users and credentials from `--users` (none without it).
    pub users: Arc<Users>,
    /// The STIR/SHAKEN key INVITEs are signed with (`--identity-key`, `--x5u`).
    pub identity: Option<Arc<sipsec_identity::SigningKey>>,
}

impl Plan {
    /// Checks `args` and resolves what they leave open: the addresses, the transport, the TLS
    /// configurations and the users. An error names the option at fault.
    pub fn new(args: LoadArgs) -> Result<Plan> {
        fn endpoint<'a>(
            s: &'a Option<String>,
            what: &'static str,
        ) -> Result<Option<(&'a str, Option<Transport>, SocketAddr)>> {
            s.as_deref()
                .map(|s| parse_endpoint(s).context(what).map(|(t, a)| (s, t, a)))
                .transpose()
        }
        let (target_ep, uas_ep) = (
            endpoint(&args.target, "target")?,
            endpoint(&args.uas, "--uas")?,
        );
        let named = || [&target_ep, &uas_ep].into_iter().flatten();
        let transport = match args.transport {
            Some(t) => t,
            None => named().find_map(|(_, t, _)| *t).unwrap_or(Transport::Udp),
        };
        for (s, t, _) in named() {
            if t.is_some_and(|t| t != transport) {
                bail!("{s} names another transport than {transport:?} (--transport or the other address)");
            }
        }
        let tls_options = args.tls_cert.is_some()
            || args.tls_key.is_some()
            || args.tls_ca.is_some()
            || args.tls_no_verify
            || args.tls_server_name.is_some()
            || !args.tls_versions.is_empty()
            || !args.tls_cipher_suites.is_empty()
            || !args.tls_key_exchange.is_empty()
            || args.tls_backend != tls::Backend::Rustls
            || args.tls_client_auth != tls::ClientAuth::None;
        if tls_options && !transport.secure() {
            bail!("the --tls-* options need --transport tls or wss");
        }
        if args.tls_cert.is_some() != args.tls_key.is_some() {
            bail!("--tls-cert and --tls-key go together");
        }
        if args.register {
            if args.role == Role::Uac {
                bail!("--register is for the callee: --role uas, or both");
            }
            if target_ep.is_none() {
                bail!("--register needs the registrar as the target: sipsec load --role uas --register [udp:|tcp:|tls:]ip:port");
            }
            if args.users.is_none() {
                bail!("--register needs --users: the users to register, with their passwords");
            }
            if args.flows == 0 {
                bail!("--flows must be at least 1");
            }
            if !(args.keepalive_s > 0.0 && args.keepalive_s.is_finite()) {
                bail!("--keepalive-s must be a positive number of seconds");
            }
        }
        let uas = match (uas_ep.map(|(_, _, a)| a), args.role) {
            // A registering callee listens nowhere: --uas only says where its flows bind.
            (_, Role::Uas | Role::Both) if args.register => None,
            (Some(a), Role::Uas | Role::Both) => Some(a),
            (None, Role::Uas | Role::Both) => bail!("--role uas|both needs --uas ip:port"),
            (Some(_), Role::Uac) => bail!("--uas is for --role uas or both"),
            (None, Role::Uac) => None,
        };
        let target = match (target_ep.map(|(_, _, a)| a), args.role) {
            (Some(a), _) => Some(a),
            (None, Role::Both) => uas,
            (None, Role::Uac) => bail!("give the target: sipsec load [udp:]ip:port"),
            (None, Role::Uas) => None,
        };
        let originate = args.role != Role::Uas;
        let tls = if transport.secure() {
            // A registering callee is a TLS client of the registrar.
            stream_tls(&args, originate || args.register, uas.is_some())?
        } else {
            connections::StreamTls::default()
        };
        if originate {
            if !(args.rate > 0.0 && args.rate.is_finite()) {
                bail!("--rate must be a positive number");
            }
            let varied = args.find_peak || args.ramp.is_some();
            if !varied && args.duration.is_none() && args.calls.is_none() {
                bail!("say how long: --duration SECONDS or --calls N (or --find-peak, --ramp)");
            }
            if varied && (args.duration.is_some() || args.calls.is_some()) {
                bail!(
                    "--find-peak and --ramp run each rate for --step-s seconds; --duration and \
                     --calls are for a run at one rate"
                );
            }
            if args.duration.is_some_and(|d| !(d > 0.0 && d.is_finite())) {
                bail!("--duration must be a positive number of seconds");
            }
            if args.calls == Some(0) {
                bail!("--calls must be at least 1");
            }
        }
        if args.ramp.is_some_and(|r| !(r > 0.0 && r.is_finite())) || args.step_s <= 0.0 {
            bail!("--ramp and --step-s must be positive");
        }
        if args.find_peak && args.ramp.is_some() {
            bail!("--find-peak and --ramp are two ways to vary the rate; pick one");
        }
        if !(0.0..1.0).contains(&args.peak_precision) || args.peak_precision == 0.0 {
            bail!("--peak-precision is a fraction, e.g. 0.03");
        }
        if !(args.peak_settle_s.is_finite() && args.peak_settle_s >= 0.0) {
            bail!("--peak-settle-s is seconds, 0 or more");
        }
        if args.scenario == ScenarioArg::Redirect
            && args.role == Role::Both
            && args.target.is_none()
        {
            bail!("the redirect scenario needs a redirect server as the target");
        }
        if args.source_addresses == 0 {
            bail!("--source-addresses must be at least 1");
        }
        if args.source_addresses > 1
            && (transport == Transport::Udp
                || args.connection != ConnectionArg::PerCall
                || args.role == Role::Uas
                || args.register)
        {
            bail!(
                "--source-addresses spreads a caller's connection per call (--connection \
                 per-call over TCP or TLS, without --register) over several addresses"
            );
        }
        let users = match &args.users {
            Some(p) => Users::load(p)?,
            None => Users::default(),
        };
        if let Some(d) = &args.domain {
            if !sip_core::message::uri::valid_host(d.as_bytes()) {
                bail!("--domain {d:?} is not a valid host");
            }
        }
        if args.caller.is_empty() || args.caller.contains(['@', ':', ' ', '<', '>', ';']) {
            bail!("--caller {:?} is not a user name", args.caller);
        }
        let identity = match (&args.identity_key, &args.x5u) {
            (None, None) => None,
            (Some(key), Some(x5u)) => {
                if users.is_empty()
                    && (sipsec_identity::tn::canonical(&args.caller).is_none()
                        || sipsec_identity::tn::canonical(&args.service).is_none())
                {
                    bail!(
                        "--identity-key signs calls between telephone numbers: give --caller \
                         and --service numbers (or --users whose names are numbers)"
                    );
                }
                let pem = std::fs::read(key)
                    .with_context(|| format!("--identity-key: cannot read {}", key.display()))?;
                let key = sipsec_identity::SigningKey::from_pem(&pem, x5u)
                    .with_context(|| format!("--identity-key {}", key.display()))?;
                Some(Arc::new(key))
            }
            _ => {
                bail!("--identity-key and --x5u go together: the key, and where its certificate is")
            }
        };
        Ok(Plan {
            args,
            transport,
            tls,
            target,
            uas,
            users: Arc::new(users),
            identity,
        })
    }

    fn scenario(&self) -> Scenario {
        match self.args.scenario {
            ScenarioArg::Call => Scenario::Call,
            ScenarioArg::Register => Scenario::Register,
            ScenarioArg::Redirect => Scenario::Redirect {
                follow: self.args.redirect == RedirectArg::Follow,
            },
            ScenarioArg::Options => Scenario::Options,
        }
    }
}

/// The sockets of a run and the addresses the UA puts in its messages.
pub struct Bound {
    /// The sockets (UDP) or listener and connections (TCP, TLS) the run sends and receives on.
    pub links: Box<dyn Links>,
    /// The caller's address for Via and Contact: its socket's (UDP), or its IP with port 5060
    /// (TCP, TLS, where replies come back on the connection), each call's where calls come
    /// from several (`--source-addresses`); none for a pure UAS.
    pub uac_local: Option<Sources>,
    /// The address the UAS is bound to (its port resolved if `--uas` gave 0).
    pub uas_local: Option<SocketAddr>,
}

/// The link the caller sends on: UDP's first socket (the UAS's is link 1 beside it, link 0
/// alone, where the caller never sends); for TCP, "the connection to this address".
const UAC_LINK: u32 = 0;

/// The caller's local IP, when this run has a caller.
fn uac_ip(plan: &Plan) -> Result<Option<IpAddr>> {
    match plan.target.filter(|_| plan.args.role != Role::Uas) {
        Some(target) => Ok(Some(match plan.args.local {
            Some(ip) => ip,
            None => route_source(target)?,
        })),
        None => Ok(None),
    }
}

/// Where a registering callee's flows bind: `--uas`, else `--local` or the IP the kernel
/// routes to the registrar from, with a port the kernel picks.
fn flow_bind(plan: &Plan) -> Result<SocketAddr> {
    if let Some(uas) = &plan.args.uas {
        return Ok(parse_endpoint(uas)?.1);
    }
    let target = plan.target.context("--register needs a target")?;
    let ip = match plan.args.local {
        Some(ip) => ip,
        None => route_source(target)?,
    };
    Ok(SocketAddr::new(ip, 0))
}

/// Binds the run's sockets.
pub fn bind(plan: &Plan) -> Result<Bound> {
    if plan.args.register {
        // The caller's socket, if any; each flow opens its own.
        let at = flow_bind(plan)?;
        let caller = uac_ip(plan)?;
        let (links, uac_local): (Box<dyn Links>, _) = match plan.transport {
            Transport::Udp => {
                let mut sockets = Vec::new();
                let mut uac_local = None;
                if let Some(ip) = caller {
                    let s = sipsec_transport::net::udp::bind_reuseport(SocketAddr::new(ip, 0))
                        .with_context(|| format!("cannot bind a UDP socket on {ip}"))?;
                    uac_local = s.local_addr()?.as_socket();
                    sockets.push(s);
                }
                let links = UdpLinks::new(sockets)
                    .with_flows_at(at)
                    .context("cannot make an epoll set for the flows' sockets")?;
                (Box::new(links), uac_local)
            }
            _ => {
                let per_call = plan.args.connection == ConnectionArg::PerCall;
                let links = connections::StreamLinks::new(None, per_call, caller, plan.tls.clone())
                    .with_flows_from(at.ip())
                    .with_websocket(plan.transport.websocket());
                (Box::new(links), caller.map(|ip| SocketAddr::new(ip, 5060)))
            }
        };
        let uac_local = uac_local.map(Sources::one);
        return Ok(Bound {
            links,
            uac_local,
            uas_local: None,
        });
    }
    if plan.transport != Transport::Udp {
        return bind_stream(plan);
    }
    let mut sockets = Vec::new();
    let mut uac_local = None;
    if let Some(ip) = uac_ip(plan)? {
        let s = sipsec_transport::net::udp::bind_reuseport(SocketAddr::new(ip, 0))
            .with_context(|| format!("cannot bind a UDP socket on {ip}"))?;
        uac_local = s.local_addr()?.as_socket();
        sockets.push(s);
    }
    let mut uas_local = None;
    if let Some(addr) = plan.uas {
        let s = sipsec_transport::net::udp::bind_reuseport(addr)
            .with_context(|| format!("cannot bind the UAS on {addr}"))?;
        uas_local = s.local_addr()?.as_socket();
        sockets.push(s);
    }
    Ok(Bound {
        links: Box::new(UdpLinks::new(sockets)),
        uac_local: uac_local.map(Sources::one),
        uas_local,
    })
}

/// TCP or TLS: a listener for the UAS; the caller's connections open on demand from its
/// local IP.
fn bind_stream(plan: &Plan) -> Result<Bound> {
    let local_ip = uac_ip(plan)?;
    // Via and Contact name the IP; the port is the connection's own (RFC 3261 §18.1.1 lets
    // responses come back on the connection).
    let uac_local = local_ip
        .map(|ip| Sources::new(SocketAddr::new(ip, 5060), plan.args.source_addresses))
        .transpose()?;
    let mut listener = None;
    let mut uas_local = None;
    if let Some(addr) = plan.uas {
        let l = connections::StreamLinks::listen(addr)
            .with_context(|| format!("cannot listen for the UAS on tcp:{addr}"))?;
        uas_local = Some(l.local_addr()?);
        listener = Some(l);
    }
    let per_call = plan.args.connection == ConnectionArg::PerCall;
    let mut links = connections::StreamLinks::new(listener, per_call, local_ip, plan.tls.clone())
        .with_websocket(plan.transport.websocket());
    if let Some(sources) = uac_local.filter(|s| s.count() > 1) {
        links = links.with_sources(sources);
    }
    Ok(Bound {
        links: Box::new(links),
        uac_local,
        uas_local,
    })
}

fn ua_config(plan: &Plan, bound: &Bound, epoch: u32) -> UaConfig {
    let target = plan.target.unwrap_or_else(|| {
        // A pure UAS never originates; any address will do.
        bound.uas_local.expect("a UAS is bound")
    });
    UaConfig {
        scenario: plan.scenario(),
        target: Endpoint {
            link: UAC_LINK,
            addr: target,
        },
        uac_local: bound.uac_local.unwrap_or(Sources::one(target)),
        uas_local: bound.uas_local,
        transport: plan.transport,
        domain: plan.args.domain.clone().unwrap_or_else(|| match target {
            SocketAddr::V4(a) => a.to_string(),
            SocketAddr::V6(a) => a.to_string(),
        }),
        users: plan.users.clone(),
        service: plan.args.service.clone(),
        caller: plan.args.caller.clone(),
        identity: plan.identity.clone(),
        hold_ms: plan.args.hold_ms,
        expires: plan.args.expires,
        register_contact: plan.args.register_contact.clone(),
        rport: plan.args.rport,
        oc: plan.args.oc,
        honour_retry_after: plan.args.honour_retry_after,
        timers: Default::default(),
        epoch,
        report_ended: plan.transport != Transport::Udp
            && plan.args.connection == ConnectionArg::PerCall,
        auth_reuse: plan.args.auth_reuse,
        sdp: plan.args.sdp,
        proxychain: plan.args.proxychain.then(|| {
            plan.args
                .proxychain_realm
                .clone()
                .or_else(|| plan.args.domain.clone())
                .unwrap_or_else(|| target.ip().to_string())
        }),
        register: plan.args.register.then(|| ua::Registering {
            flows: plan.args.flows,
            outbound: plan.args.outbound,
            keepalive_ms: (plan.args.keepalive_s * 1000.0).max(1.0) as u64,
            contact_addr: plan.args.contact_addr.clone(),
        }),
    }
}

fn fresh_epoch(trial: u32) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id().rotate_left(16)).wrapping_add(trial)
}

/// One run of the schedule: its rate, limit, drain time, progress label and trial number.
struct RunSpec {
    rate: RatePlan,
    limit: Limit,
    drain_s: f64,
    label: String,
    trial: u32,
}

/// Runs a spec with a fresh UA; returns the UA (for its statistics) and the times.
fn run_once(
    plan: &Plan,
    bound: &mut Bound,
    spec: RunSpec,
    stop: &AtomicBool,
) -> (Ua, driver::RunTimes) {
    let cfg = ua_config(plan, bound, fresh_epoch(spec.trial));
    let mut ua = Ua::new(cfg, 0);
    let mut pacer = Pacer::new(spec.rate, spec.limit);
    let originate = plan.args.role != Role::Uas;
    let mut progress = Progress::new(!plan.args.quiet, originate);
    progress.label = spec.label;
    // The legend once a process, before its first line (the first trial's).
    progress.legend = spec.trial <= 1;
    let opts = RunOptions {
        originate,
        drain_s: spec.drain_s,
        uas_duration_s: plan.args.duration,
        register: plan.args.register,
    };
    let times = driver::run(
        &mut ua,
        bound.links.as_mut(),
        &mut pacer,
        &opts,
        &mut progress,
        stop,
    );
    (ua, times)
}

/// The summary of what `stats` counted over `times`: one run's, or several trials' together.
fn summarize(plan: &Plan, stats: &RunTally, times: &driver::RunTimes) -> Summary {
    let t = &stats.total;
    Summary {
        scenario: format!("{:?}", plan.args.scenario).to_lowercase(),
        role: format!("{:?}", plan.args.role).to_lowercase(),
        transport: plan.transport.name().to_string(),
        rate: if plan.args.role == Role::Uas {
            0.0
        } else {
            plan.args.rate
        },
        elapsed_s: times.elapsed_s,
        attempted: t.attempted,
        succeeded: t.succeeded,
        on_time: report::on_time(t),
        failed: t.failed,
        failures_by_reason: t.failures_by_reason.clone(),
        retransmissions: t.retransmissions,
        throughput_per_s: if times.elapsed_s > 0.0 {
            t.succeeded as f64 / times.elapsed_s
        } else {
            0.0
        },
        latency_ms: Latency::of(t),
        first_response_ms: Latency::first_response(t),
        latency_cdf_ms: t.latency_cdf_ms(),
        uas_answered: stats.uas_answered,
        uas_completed: stats.uas_completed,
        stray_messages: stats.stray,
        extra_dialogs: stats.extra_dialogs,
        send_failures: times.send_failures,
        interrupted: times.interrupted,
        connections: (plan.transport != Transport::Udp).then_some(times.links),
        registrations: plan
            .args
            .register
            .then(|| report::Registrations::of(&stats.registrations)),
        peak_per_s: None,
        steps: Vec::new(),
    }
}

/// CPU time (user and system) of the calling thread so far, in seconds: the load's one
/// thread, which runs the caller and the callee.
fn thread_cpu_s() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) } != 0 {
        return 0.0;
    }
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(u.ru_utime) + s(u.ru_stime)
}

/// The runs of `--find-peak` (its trials) or `--ramp` (its steps): each one's [`Step`], and
/// what all of them did together, which the summary reports.
#[derive(Default)]
struct Curve {
    steps: Vec<Step>,
    stats: RunTally,
    times: driver::RunTimes,
}

impl Curve {
    /// Runs the next trial, at `rate` for `--step-s` seconds, and records it; `what` names it
    /// ("trial", "step") in the progress lines.
    fn run(
        &mut self,
        plan: &Plan,
        bound: &mut Bound,
        stop: &AtomicBool,
        rate: f64,
        what: &str,
    ) -> &Step {
        let a = &plan.args;
        let n = self.steps.len() as u32 + 1;
        let spec = RunSpec {
            rate: RatePlan::constant(rate),
            limit: Limit {
                duration_s: Some(a.step_s),
                calls: None,
            },
            drain_s: a.drain_s.min(8.0),
            label: format!("[{what} {n} at {rate:.0}/s] "),
            trial: n,
        };
        let cpu0 = thread_cpu_s();
        let (ua, times) = run_once(plan, bound, spec, stop);
        let mut step = Step::of(rate, &ua.stats.total, times.schedule_s);
        if times.elapsed_s > 0.0 {
            step.load_cpu_share = (thread_cpu_s() - cpu0) / times.elapsed_s;
        }
        if !a.quiet {
            eprintln!("{what} {n}: {}", step.outcome());
        }
        self.stats.merge(&ua.stats);
        self.times.add(&times);
        self.steps.push(step);
        &self.steps[self.steps.len() - 1]
    }

    /// The summary: every trial's step, and the totals over all of them.
    fn summary(self, plan: &Plan) -> Result<Summary> {
        if self.steps.is_empty() {
            bail!("stopped before the first trial ran");
        }
        let mut s = summarize(plan, &self.stats, &self.times);
        s.steps = self.steps;
        Ok(s)
    }
}

/// Executes a plan on bound sockets: one run, a ramp, or a peak search.
pub fn execute(plan: &Plan, bound: &mut Bound, stop: &AtomicBool) -> Result<Summary> {
    let a = &plan.args;
    if a.find_peak {
        let mut curve = Curve::default();
        let (peak, _) = peak::find_peak(
            peak::Search {
                start: a.rate,
                max: a.max_rate.unwrap_or(1e6),
                precision: a.peak_precision,
                threshold: 0.99,
            },
            |rate| {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return 0.0;
                }
                let ratio = curve.run(plan, bound, stop, rate, "trial").on_time_ratio;
                // Let the server settle between trials.
                std::thread::sleep(std::time::Duration::from_secs_f64(a.peak_settle_s));
                ratio
            },
        );
        let mut s = curve.summary(plan)?;
        s.peak_per_s = Some(peak);
        return Ok(s);
    }
    if let Some(ramp) = a.ramp {
        // One run per rate from --rate up to --max-rate.
        let mut curve = Curve::default();
        let max = a.max_rate.unwrap_or(a.rate);
        let mut rate = a.rate;
        while rate <= max * (1.0 + 1e-9) && !stop.load(std::sync::atomic::Ordering::Relaxed) {
            curve.run(plan, bound, stop, rate, "step");
            rate += ramp;
        }
        return curve.summary(plan);
    }
    let spec = RunSpec {
        rate: RatePlan::constant(a.rate),
        limit: Limit {
            duration_s: a.duration,
            calls: a.calls,
        },
        drain_s: a.drain_s,
        label: String::new(),
        trial: 0,
    };
    let (ua, times) = run_once(plan, bound, spec, stop);
    Ok(summarize(plan, &ua.stats, &times))
}

/// `sipsec load`: plan, bind, run, report.
pub fn run(args: LoadArgs) -> Result<Summary> {
    let plan = Plan::new(args)?;
    let mut bound = bind(&plan)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let transport = plan.transport;
    if let Some(a) = bound.uas_local {
        eprintln!("sipsec load: UAS listening on {transport}:{a}");
    }
    if let (Some(l), Some(t)) = (bound.uac_local, plan.target) {
        if plan.args.role != Role::Uas {
            let a = &plan.args;
            let how = if a.find_peak {
                format!("searching for the peak from {}/s", a.rate)
            } else if let Some(ramp) = a.ramp {
                format!(
                    "ramping from {}/s by {ramp}/s to {}/s",
                    a.rate,
                    a.max_rate.unwrap_or(a.rate)
                )
            } else {
                format!("at {}/s", a.rate)
            };
            let from = match l.count() {
                1 => l.first().ip().to_string(),
                n => format!("{} and the {} addresses after it", l.first().ip(), n - 1),
            };
            eprintln!(
                "sipsec load: {:?} from {from} to {transport}:{t} {how}",
                a.scenario
            );
        }
    }
    if plan.args.register {
        let a = &plan.args;
        eprintln!(
            "sipsec load: registering {} users{} with {transport}:{}",
            plan.users.len(),
            if a.outbound {
                format!(" as RFC 5626 clients, {} flows each", a.flows)
            } else {
                String::new()
            },
            plan.target.map_or_else(String::new, |t| t.to_string())
        );
    }
    let summary = execute(&plan, &mut bound, &stop)?;
    print!("{}", summary.text());
    if let Some(path) = &plan.args.json {
        let text = serde_json::to_string_pretty(&summary)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if summary.registrations.as_ref().is_some_and(|r| r.made == 0) {
        bail!("no registration succeeded (see the failures above)");
    }
    Ok(summary)
}
