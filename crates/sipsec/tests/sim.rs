//! The whole path in memory: a `load` caller ↔ the server's `Engine` ↔ a `load` callee, on one
//! simulated clock and no sockets (quinn-proto's `Pair`, str0m's `progress`). Each side is the
//! sans-IO core the real binaries drive; [`Sim`] plays their drivers: it carries every message
//! to the address it is for, and when nothing is in flight moves the clock to the earliest
//! deadline. Credential fetches are answered the way the I/O layer answers them: a Proxychain
//! chain from the real `Authority`, installed in the shared cache, then `Mail::Credential`.

use bytes::Bytes;
use sip_core::proxychain::HashKind;
use sip_core::transaction::Timers;
use sipsec_load::ua::{Endpoint, Scenario, Ua, UaConfig};
use sipsec_load::users::{User, Users};
use sipsec_server::auth::credentials::{CacheState, Credentials, Secrets};
use sipsec_server::auth::digest::DigestShared;
use sipsec_server::auth::proxychain::wire::Reply;
use sipsec_server::auth::proxychain::PcShared;
use sipsec_server::authd::authority::{Ask, Authority, Policy};
use sipsec_server::config::Config;
use sipsec_server::engine::{Effects, Engine, Mail};
use sipsec_server::stats::Stats;
use sipsec_transport::net::transport::{Peer, Transport};
use std::net::SocketAddr;
use std::sync::Arc;

const SERVER: &str = "10.0.0.1:5060";
const CALLER: &str = "10.0.0.2:5061";
const CALLEE: &str = "10.0.0.3:5070";
const REALM: &str = "example.test";
/// The Unix time at simulated time 0.
const EPOCH_UNIX_MS: u64 = 1_800_000_000_000;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn user(name: &str) -> User {
    User {
        username: name.into(),
        password: format!("{name}-secret"),
        domain: None,
    }
}

/// Users alice and bob, as the server's user database would hold them.
fn credentials() -> Arc<Credentials> {
    let c = Arc::new(Credentials::new(REALM));
    c.apply(["alice", "bob"].map(|n| {
        let u = user(n);
        (
            u.username.clone(),
            Some(Secrets::from_password(&u.username, REALM, &u.password)),
        )
    }));
    c.set_state(CacheState::Current);
    c
}

/// How the server authenticates.
#[derive(Clone, Copy, PartialEq)]
enum Auth {
    None,
    Digest,
    Proxychain,
}

/// A message in flight: who sent it (as the receiver sees the source) and where it goes.
struct Flight {
    from: SocketAddr,
    to: SocketAddr,
    data: Bytes,
}

/// A caller, a server and a callee joined in memory on one clock.
struct Sim {
    now_ms: u64,
    engine: Engine,
    caller: Ua,
    callee: Ua,
    in_flight: Vec<Flight>,
    /// Proxychain: the cache the engine reads and the authority that fills it.
    proxychain: Option<(Arc<PcShared>, Authority)>,
    /// Users whose credentials the engine asked for, in order.
    fetched: Vec<String>,
    /// Messages the server received, by first line.
    seen_by_server: Vec<String>,
}

fn ua_config(scenario: Scenario, local: &str, users: &[&str], auth: Auth) -> UaConfig {
    UaConfig {
        scenario,
        target: Endpoint {
            link: 0,
            addr: addr(SERVER),
        },
        uac_local: sipsec_load::sources::Sources::one(addr(local)),
        uas_local: Some(addr(local)),
        transport: Transport::Udp,
        domain: REALM.into(),
        users: Arc::new(Users::new(users.iter().map(|n| user(n)).collect())),
        service: "service".into(),
        caller: "sipsec".into(),
        identity: None,
        hold_ms: 0,
        expires: 600,
        register_contact: None,
        rport: false,
        oc: false,
        honour_retry_after: false,
        timers: Timers::default(),
        epoch: 1,
        report_ended: false,
        auth_reuse: false,
        proxychain: (auth == Auth::Proxychain).then(|| REALM.to_string()),
        register: None,
        sdp: sipsec_load::ua::Sdp::Plain,
    }
}

impl Sim {
    /// A stateful proxy and registrar for `example.test`; the caller calls bob from alice,
    /// the callee is bob (it registers first).
    fn new(auth: Auth) -> Sim {
        let scheme = match auth {
            Auth::None => "",
            Auth::Digest => "[auth]\nscheme = \"digest\"\n",
            Auth::Proxychain => {
                "[auth]\nscheme = \"proxychain\"\nauthority = \"tls:10.0.0.9:5070\"\n"
            }
        };
        let cfg = Config::from_toml(&format!(
            "[server]\nlisten = [\"udp:{SERVER}\"]\ndomains = [\"{REALM}\"]\n{scheme}"
        ))
        .unwrap();
        let cfg = Arc::new(cfg);
        let mut engine = Engine::new(cfg.clone(), 0, EPOCH_UNIX_MS, Arc::new(Stats::default()));
        let mut proxychain = None;
        match auth {
            Auth::None => {}
            Auth::Digest => engine.enable_auth(Arc::new(
                DigestShared::new(&cfg.auth, credentials()).unwrap(),
            )),
            Auth::Proxychain => {
                let pc = cfg.auth.proxychain.clone().expect("proxychain settings");
                let shared = Arc::new(PcShared::new(pc));
                // What the authority's Welcome tells the proxy: its name.
                shared.set_proxy("proxy-1");
                engine.enable_proxychain(shared.clone());
                let policy = Policy {
                    hash: HashKind::Sha256,
                    chain_length: 100,
                    max_chain_length: 100,
                    busy_issues_per_s: 0,
                    lifetime_s: 0,
                };
                proxychain = Some((shared, Authority::new(policy, credentials())));
            }
        }
        Sim {
            now_ms: 0,
            engine,
            caller: Ua::new(
                ua_config(Scenario::Call, CALLER, &["alice", "bob"], auth),
                0,
            ),
            callee: Ua::new(ua_config(Scenario::Register, CALLEE, &["bob"], auth), 0),
            in_flight: Vec::new(),
            proxychain,
            fetched: Vec::new(),
            seen_by_server: Vec::new(),
        }
    }

    fn send_from(&mut self, from: &str, out: Vec<(Endpoint, Bytes)>) {
        for (to, data) in out {
            self.in_flight.push(Flight {
                from: addr(from),
                to: to.addr,
                data,
            });
        }
    }

    /// Carries out what the engine asked: transmits onto the wire, fetches answered.
    fn apply(&mut self, mut fx: Effects) {
        for (to, data) in fx.transmits.drain(..) {
            self.in_flight.push(Flight {
                from: addr(SERVER),
                to: to.addr,
                data,
            });
        }
        let users: Vec<String> = fx.fetches.drain(..).map(|(u, _)| u).collect();
        for user in users {
            self.fetched.push(user.clone());
            if let Some((shared, authority)) = &self.proxychain {
                let now_s = (EPOCH_UNIX_MS + self.now_ms) / 1000;
                let proxy: Arc<str> = "proxy-1".into();
                if let Reply::Issued { credential, .. } =
                    authority.issue(&proxy, 1, &user, Ask::default(), now_s)
                {
                    let issued = credential.issued().unwrap();
                    shared.cache.install(&user, issued.into(), 0, now_s);
                }
                shared.end_fetch(&user);
                let mut fx = Effects::default();
                self.engine.handle_mail(
                    self.now_ms,
                    Mail::Credential { user: user.into() },
                    &mut fx,
                );
                self.apply(fx);
            }
        }
    }

    /// The user agent listening at `at`, and its address.
    fn ua_at(&mut self, at: SocketAddr) -> (&mut Ua, &'static str) {
        if at == addr(CALLER) {
            (&mut self.caller, CALLER)
        } else if at == addr(CALLEE) {
            (&mut self.callee, CALLEE)
        } else {
            panic!("a message for {at}, where no one listens");
        }
    }

    /// Delivers everything in flight (and what that provokes) at the current time.
    fn deliver(&mut self) {
        while !self.in_flight.is_empty() {
            let now_us = self.now_ms * 1000;
            for f in std::mem::take(&mut self.in_flight) {
                let mut out = Vec::new();
                if f.to == addr(SERVER) {
                    let first = String::from_utf8_lossy(&f.data);
                    let first = first.lines().next().unwrap_or("").to_string();
                    self.seen_by_server.push(first);
                    let mut fx = Effects::default();
                    let source = Peer::new(Transport::Udp, f.from);
                    self.engine
                        .handle_message(self.now_ms, source, &f.data, &mut fx);
                    self.apply(fx);
                } else {
                    let (ua, local) = self.ua_at(f.to);
                    let from = Endpoint {
                        link: 0,
                        addr: f.from,
                    };
                    ua.on_message(now_us, from, &f.data, &mut out);
                    self.send_from(local, out);
                }
            }
        }
    }

    /// str0m's `progress`: delivers what is in flight, then moves the clock to the earliest
    /// deadline and runs the timers due there. False when nothing is left to do before
    /// `until_ms`.
    fn progress(&mut self, until_ms: u64) -> bool {
        self.deliver();
        let next = [
            self.engine.poll_timeout(),
            self.caller.next_deadline_us().map(|us| us.div_ceil(1000)),
            self.callee.next_deadline_us().map(|us| us.div_ceil(1000)),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next.filter(|&t| t <= until_ms) else {
            return false;
        };
        self.now_ms = self.now_ms.max(next);
        let mut fx = Effects::default();
        self.engine.handle_timeout(self.now_ms, &mut fx);
        self.apply(fx);
        let now_us = self.now_ms * 1000;
        for local in [CALLER, CALLEE] {
            let mut out = Vec::new();
            self.ua_at(addr(local)).0.on_tick(now_us, &mut out);
            self.send_from(local, out);
        }
        true
    }

    /// Runs until the clock passes `until_ms` or nothing is left to do.
    fn run_until(&mut self, until_ms: u64) {
        while self.progress(until_ms) {}
        self.deliver();
    }

    /// Bob registers, then alice calls him; both run to completion.
    fn register_then_call(&mut self) {
        let mut out = Vec::new();
        self.callee.start(0, &mut out);
        self.send_from(CALLEE, out);
        self.run_until(1_000);
        assert_eq!(self.callee.stats.total.succeeded, 1, "bob's REGISTER");
        let mut out = Vec::new();
        self.caller.start(self.now_ms * 1000, &mut out);
        self.send_from(CALLER, out);
        self.run_until(self.now_ms + 5_000);
    }

    fn server_saw(&self, first_line_starts: &str) -> usize {
        self.seen_by_server
            .iter()
            .filter(|l| l.starts_with(first_line_starts))
            .count()
    }

    fn server_stat(&self, name: &str) -> u64 {
        self.engine
            .stats()
            .snapshot()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| v)
    }
}

#[test]
fn a_call_runs_through_the_engine_in_simulated_time() {
    let mut sim = Sim::new(Auth::None);
    sim.register_then_call();
    assert_eq!(sim.caller.stats.total.succeeded, 1, "the call");
    assert_eq!(sim.caller.stats.total.failed, 0);
    // INVITE, ACK and BYE each reached the server once: nothing was lost, so nothing was
    // retransmitted.
    assert_eq!(sim.server_saw("INVITE "), 1);
    assert_eq!(sim.server_saw("ACK "), 1);
    assert_eq!(sim.server_saw("BYE "), 1);
    assert_eq!(sim.server_stat("forwarded_requests"), 3);
    assert_eq!(sim.server_stat("retransmissions_absorbed"), 0);
    // The whole call took no simulated time beyond its timers: no wall clock involved.
    assert!(sim.now_ms < 40_000, "{}", sim.now_ms);
}

#[test]
fn digest_challenges_are_answered_and_the_call_completes() {
    let mut sim = Sim::new(Auth::Digest);
    sim.register_then_call();
    assert_eq!(sim.caller.stats.total.succeeded, 1, "the call");
    // By default REGISTER and INVITE are challenged (401 and 407): each was sent twice, the
    // second time with credentials. The 407 was sent statelessly (once: no transaction to
    // repeat it toward a spoofed source), and its ACK absorbed by our To tag; the in-dialog ACK
    // and BYE went through unchallenged.
    assert_eq!(sim.server_saw("REGISTER "), 2);
    assert_eq!(sim.server_saw("INVITE "), 2);
    assert_eq!(sim.server_saw("ACK "), 2);
    assert_eq!(sim.server_saw("BYE "), 1);
    assert_eq!(sim.server_stat("auth_challenged"), 2);
    assert_eq!(sim.server_stat("auth_passed"), 2);
    assert_eq!(sim.server_stat("retransmissions_absorbed"), 0);
    assert_eq!(sim.server_stat("local_answer_acks"), 1);
    assert_eq!(sim.server_stat("forwarded_requests"), 3);
    assert_eq!(sim.server_stat("auth_failed"), 0);
    // What the lab's cost model counts: four requests examined, no query (the cache).
    assert_eq!(sim.server_stat("digest_checks"), 4);
    assert_eq!(sim.server_stat("proxychain_checks"), 0);
    assert_eq!(sim.server_stat("credential_fetches"), 0);
}

#[test]
fn a_proxychain_request_waits_for_the_authority_and_then_passes() {
    let mut sim = Sim::new(Auth::Proxychain);
    sim.register_then_call();
    assert_eq!(sim.caller.stats.total.succeeded, 1, "the call");
    // Neither bob nor alice had a chain: each first request (the REGISTER, the INVITE)
    // waited for one, the authority's answer released it, it was challenged with the new
    // chain, and the user's answer passed.
    assert_eq!(sim.fetched, ["bob", "alice"]);
    assert_eq!(sim.server_stat("auth_waited"), 2);
    assert_eq!(sim.server_stat("auth_challenged"), 2);
    assert_eq!(sim.server_stat("auth_passed"), 2);
    assert_eq!(sim.server_saw("REGISTER "), 2);
    assert_eq!(sim.server_saw("INVITE "), 2);
    assert_eq!(sim.server_stat("auth_failed"), 0);
    assert_eq!(sim.server_stat("forwarded_requests"), 3);
    // What the lab's cost model counts: each first request examined when it came, again
    // when its chain came, and its answer: three each; one chain fetched per user.
    assert_eq!(sim.server_stat("proxychain_checks"), 6);
    assert_eq!(sim.server_stat("credential_fetches"), 2);
    assert_eq!(sim.server_stat("digest_checks"), 0);
}
