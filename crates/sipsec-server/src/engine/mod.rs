//! The per-worker SIP engine: everything `sipsec serve` decides, with no I/O.
//!
//! It owns the worker's transaction table, its location replica and its timers, so nothing
//! on the per-message path is shared between workers. Its driver (`serve::worker`, or a test
//! with a simulated clock and no sockets) feeds it and carries out what it asks; times are
//! monotonic milliseconds ([`Millis`]) from the driver's clock.
//!
//! # What to call when
//!
//! The names say what a method is, as in quinn-proto's `Connection`: `handle_*` is an
//! input, `poll_*` says when the engine next wants one, and everything it asks of the
//! driver comes out in the [`Effects`] each input is given; other public methods are setup
//! or plain queries.
//!
//! Setup, before the first input: [`Engine::new`], then [`Engine::enable_auth`] or
//! [`Engine::enable_proxychain`] as configured, and `Engine::preload` /
//! `Engine::know_aor` with what the store holds.
//!
//! Inputs, each given the time and an [`Effects`] to fill:
//! - [`Engine::handle_message`]: a message arrived — a datagram, or one framed on a
//!   connection (the [`Peer`] says which, and names the connection); before it,
//!   `Engine::set_clock_us` with the same clock reading in microseconds;
//! - `Engine::handle_oversize`: the start of a stream message over `max_message_size`;
//! - [`Engine::handle_mail`]: [`Mail`] from another worker (a handed-off message, a binding
//!   change, a route's destination found down or up), from the store (commits), from a
//!   credential fetcher, from DNS or from the certificate fetcher (an answer is in);
//! - [`Engine::handle_saved`]: what [`Mail::Saved`] carries (the store's commits), for a
//!   driver that has it without mail;
//! - [`Engine::handle_transport_error`]: a request the driver could not deliver;
//! - [`Engine::handle_timeout`]: when [`Engine::poll_timeout`] has passed;
//! - `Engine::handle_load`: every `Engine::overload_interval_ms`, the worker's load and
//!   queue delay over it (no effects);
//! - `Engine::handle_reload`: a new configuration (SIGHUP), already checked by
//!   `Config::restart_only_changes` to differ only where it may (no effects).
//!
//! Outputs, all in [`Effects`], which the driver carries out after each input (or after a
//! batch of them) and then clears: messages to send, mail for other workers, binding changes
//! for the other workers and the store (before any message of the same batch leaves: a 200 OK
//! to REGISTER must not overtake its binding), calls whose per-call connections may close,
//! credentials to fetch, names to look up in DNS, STIR/SHAKEN certificates to fetch, and the
//! domains TLS destinations must prove
//! (before any connection to them is opened).
//!
//! Timers: after any input, [`Engine::poll_timeout`] may have moved; the driver must call
//! [`Engine::handle_timeout`] no later than it says. Nothing else advances the engine's time.
//!
//! Roles (RFC 3261): a transaction-stateful proxy (§16, with parallel forking and best
//! response selection per §16.7), a stateless proxy (§16.11), a redirect server (§8.3), and a
//! registrar (§10.3) for requests addressed to our domains.
//!
//! # Where a method lives
//!
//! This module holds the state, the public methods above, and the request path that joins
//! the rest (`handle_request`, `route_request`, `drain_outputs`). Every other file's part of
//! `impl Engine` is named after it — `gate_check` is in `gate`, `proxy_forward` in `proxy` —
//! and the state a concern owns is its own type there (`gate::Gate`, `durable::Durable`,
//! `locate::Locator`, `overload::Overload`, `probe::Prober`):
//! - `gate`: the auth gate (digest or Proxychain, and requests parked for credentials);
//! - `identity`: STIR/SHAKEN: the Identity header our callers' INVITEs leave with, and the
//!   verification of those that arrive with one (INVITEs waiting for certificates);
//! - `relay`: who may be forwarded where (and the dialog tokens in our Record-Route);
//! - `routing`: what a request needs (answer, register, redirect, forward), and the Route walk;
//! - `locate`: where its next hop is (DNS answers, requests waiting for them, destinations
//!   held down);
//! - `proxy`: forwarding and the branches of a forwarded request; `failover`: a failed
//!   branch moved to the next destination; `probe`: the configured routes pinged;
//! - `registrar`: REGISTER against the [`location`](crate::location) service (a pure
//!   function); `durable`: its 200s held until the store commits;
//! - `reply`: the answers made here (`reply::Answer`, where they go: `reply::ReplyTo`);
//!   `reject`: answers to what the parser refused;
//! - `overload`: what to admit under load, and what to tell neighbours;
//! - `flow`: flow tokens (RFC 5626) in our Record-Route, for dialogs with phones behind NATs;
//!   `keepalive`: the pings that keep those phones' NAT mappings open (`keepalive::KeepAlive`);
//! - `branch`: our Via branches (free functions).

mod branch;
mod durable;
mod failover;
mod flow;
mod gate;
mod identity;
pub use identity::{Fetched, ReplayTable};
mod keepalive;
mod locate;
mod overload;
pub(crate) use overload::Measured;
mod probe;
mod proxy;
mod registrar;
mod reject;
mod relay;
mod reply;
mod routing;

#[cfg(test)]
mod tests;

use crate::config::Config;
use crate::engine::relay::Vouched;
use crate::engine::reply::{Answer, ReplyTo};
use crate::location::{BindingChange, Location, SharedChange};
use crate::stats::{inc, LogLimiter, Stats};
use bytes::Bytes;
use sip_core::message::rewrite::Splice;
use sip_core::message::{build, HeaderField, Message, Method, ParseError, Via};
use sip_core::timer::Millis;
use sip_core::transaction::{Kind, Output, RequestMatch, State, Timers, Transactions, TxId};
use sipsec_transport::net::transport::{ConnId, Peer, Transport};
use smallvec::SmallVec;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Mail between workers.
#[derive(Debug, Clone)]
pub enum Mail {
    /// A message that belongs to the receiving worker's transactions.
    Message {
        /// Where the message came from.
        source: Peer,
        /// The message as it arrived.
        data: Bytes,
    },
    /// A registration change made by another worker.
    Binding(SharedChange),
    /// The user's credentials came (or their fetch gave up): requests waiting for them run
    /// now.
    Credential {
        /// The user whose credentials were fetched.
        user: Arc<str>,
    },
    /// From the store: it has committed the first `count` binding changes this worker sent
    /// (durable registration only).
    Saved {
        /// How many of this worker's changes the store has committed, counted from the start.
        count: u64,
    },
    /// In a cluster, every binding the other nodes hold, read afresh from the shared table
    /// (at start of listening, and after the listener lost its connection, when notices
    /// went missing): the replica's bindings of other nodes are replaced by these.
    Resync(Arc<Vec<(Arc<str>, crate::location::Binding)>>),
    /// In a cluster, another node went silent past `dead_after_ms` (`alive` false) or came
    /// back: bindings only it reaches answer 430/480 at once while it is down.
    NodeState {
        /// The node's name.
        node: Arc<str>,
        /// Whether its heartbeat is fresh.
        alive: bool,
    },
    /// Another worker held a destination down until `until` (a failure, or its probe found
    /// it down: `Millis::MAX`), or found it up again (`until` 0).
    HoldDown {
        /// The destination.
        peer: Peer,
        /// Held down until then (`Millis::MAX`: until a probe finds it up; 0: up now).
        until: Millis,
    },
    /// DNS answered a lookup this worker asked for (`Effects::lookups`).
    Resolved {
        /// What was asked.
        query: crate::dns::Query,
        /// What DNS answered, or why it did not.
        resolution: Arc<crate::dns::Resolution>,
    },
    /// A STIR/SHAKEN certificate fetch ended: INVITEs waiting for it are verified now.
    Certificate {
        /// The `x5u` URL fetched.
        url: Arc<str>,
        /// The certificate, checked, or why not; and how long to keep it.
        fetched: Arc<Fetched>,
    },
}

/// What the engine asks its driver to do: five kinds of output (see the module doc for the
/// order they must be carried out in).
#[derive(Debug, Default)]
pub struct Effects {
    /// Messages to send, to a UDP address or on (or to open) a connection.
    pub transmits: Vec<(Peer, Bytes)>,
    /// Mail for one worker, by index.
    pub mail: Vec<(usize, Mail)>,
    /// Binding changes for every other worker and for the store.
    pub changes: Vec<SharedChange>,
    /// Connections on which a call just ended (a final response to BYE, or an INVITE
    /// failed): the driver closes those it opened for that one call.
    pub(crate) finished_calls: Vec<ConnId>,
    /// Users whose credentials must be fetched (a Proxychain chain from the authority, or
    /// digest secrets from the database without the cache), with whether it is a prefetch
    /// (nobody waits for it).
    pub fetches: Vec<(String, bool)>,
    /// Next hops to locate by DNS: the answers come back as [`Mail::Resolved`].
    pub lookups: Vec<crate::dns::Query>,
    /// TLS destinations located from a domain, which their certificates must name (RFC 5922):
    /// the driver checks connections it opens to them against it.
    pub(crate) tls_names: Vec<(SocketAddr, Arc<str>)>,
    /// STIR/SHAKEN certificates to fetch (`x5u` URLs): the answers come back as
    /// [`Mail::Certificate`].
    pub cert_fetches: Vec<Arc<str>>,
}

impl Effects {
    /// Whether there is nothing for the driver to do.
    pub fn is_empty(&self) -> bool {
        self.transmits.is_empty()
            && self.mail.is_empty()
            && self.changes.is_empty()
            && self.finished_calls.is_empty()
            && self.fetches.is_empty()
            && self.lookups.is_empty()
            && self.tls_names.is_empty()
            && self.cert_fetches.is_empty()
    }
}

/// What a server transaction is for.
#[derive(Debug)]
enum Link {
    /// We answer this request ourselves.
    Local,
    /// We proxy this request; the context tracks its branches.
    Proxied(Box<ProxyContext>),
    /// A forwarded request, one branch of server transaction `server`.
    Branch {
        server: TxId,
        done: bool,
        cancel_sent: bool,
        /// The targets left to try if this one fails (RFC 3263 §4.3).
        failover: Option<Box<failover::Failover>>,
    },
    /// A CANCEL we sent downstream.
    Cancel,
    /// An OPTIONS probe of a route's destination (`probe_due`).
    Probe,
}

/// The response context of a proxied request (RFC 3261 §16.7).
#[derive(Debug, Default)]
struct ProxyContext {
    branches: SmallVec<[TxId; 2]>,
    pending: u32,
    best: Option<(u16, Bytes)>,
    final_sent: bool,
    cancelled: bool,
    invite: bool,
    /// While the request waits for DNS: the request, to answer a CANCEL with 487.
    waiting: Option<Bytes>,
    /// When the request arrived, in microseconds ([`FineClock`]), and whether a response
    /// other than 100 has come back yet (the INVITE latency histograms).
    started_us: u64,
    first_seen: bool,
}

/// The time in microseconds, for the latency histograms: a proxy on one host answers in well
/// under the millisecond the engine's timers count in. The driver sets it from the same clock
/// reading it passes as `now` ([`Engine::set_clock_us`]); where it did not (a caller that
/// gives milliseconds only), the millisecond `now` stands in.
#[derive(Debug, Default, Clone, Copy)]
struct FineClock {
    us: u64,
}

impl FineClock {
    /// `now` in microseconds: the driver's reading when it is of this millisecond.
    fn at(self, now: Millis) -> u64 {
        if self.us / 1000 == now {
            self.us
        } else {
            now.saturating_mul(1000)
        }
    }
}

impl ProxyContext {
    /// A response other than 100 is going upstream: for an INVITE, records how long the
    /// first one took.
    fn first_response(&mut self, now_us: u64, stats: &Stats) {
        if self.invite && !self.first_seen {
            self.first_seen = true;
            let took = now_us.saturating_sub(self.started_us);
            stats.traffic.invite_first_response.observe_us(took);
        }
    }

    /// Marks the final response sent; for an INVITE, records how long it took (and, when it
    /// is the first response, that too).
    fn finish(&mut self, now_us: u64, stats: &Stats) {
        self.final_sent = true;
        self.first_response(now_us, stats);
        if self.invite {
            let took = now_us.saturating_sub(self.started_us);
            stats.traffic.invite_final_response.observe_us(took);
        }
    }
}

/// Where one forwarded copy of a request goes.
#[derive(Debug, Clone)]
struct Target {
    /// A new Request-URI (retargeting to a registered contact), if any.
    request_uri: Option<Arc<str>>,
    /// Routes to put on top (a binding's RFC 3327 Path), if any: `dests` is their first hop.
    route_set: Option<Arc<str>>,
    /// Where to send it, in the order to try: the first that can be used gets the request,
    /// the others are its failover (RFC 3263 §4.3).
    dests: SmallVec<[Peer; 2]>,
}

/// What to do with a request.
enum Decision {
    /// Answer it here.
    Respond(Answer),
    Register {
        aor: String,
    },
    Forward(Forward),
    /// Next hops named by DNS that this worker has no answer for yet: wait for them.
    Locate(SmallVec<[crate::dns::Query; 1]>),
    Drop,
}

impl From<Answer> for Decision {
    fn from(answer: Answer) -> Decision {
        Decision::Respond(answer)
    }
}

/// Where a request is forwarded to, and how its Routes change.
#[derive(Debug)]
struct Forward {
    targets: SmallVec<[Target; 1]>,
    /// Our own Routes to consume (two after a double Record-Route): per header line, where
    /// the last of its values to remove ends.
    pop_route: SmallVec<[(HeaderField, usize); 2]>,
    record_route: bool,
    /// The Identity header every branch carries (STIR/SHAKEN signing, see `identity`).
    identity: Option<Arc<str>>,
}

/// The most bindings `sipsec ctl bindings` lists.
const BINDINGS_REPORTED: usize = 100_000;

const ALLOW: &str = "Allow: INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER\r\n";

/// Where we send from on one transport and address family: its first listen address, as we
/// put it in Via and Record-Route.
#[derive(Debug)]
struct Side {
    transport: Transport,
    v6: bool,
    /// `host:port` for Via.
    via_host: String,
    /// Our Record-Route URI on this side.
    record_route: String,
    /// For UDP, the index of its socket among the UDP listen addresses.
    udp_socket: Option<usize>,
}

impl Side {
    /// `peer` as this side sends to it: over UDP, from the socket whose address is in our
    /// Via.
    fn send_to(&self, peer: Peer) -> Peer {
        match self.udp_socket {
            // A flow leaves from the socket its registration came in on: the NAT's mapping
            // is for that address.
            Some(_) if peer.flow && peer.udp_socket().is_some() => peer,
            Some(socket) => Peer {
                flow: peer.flow,
                ..Peer::udp_via(peer.addr, socket)
            },
            None => peer,
        }
    }
}

/// The SIP engine of one worker.
pub struct Engine {
    cfg: Arc<Config>,
    worker: usize,
    /// Per transport and address family we listen on, where we send from.
    sides: Vec<Side>,
    epoch_unix_ms: u64,
    tx: Transactions<Peer, Link>,
    location: Location,
    outputs: Vec<Output<Peer, Link>>,
    /// The buffer `drain_outputs` swaps in while it handles `outputs`, so neither is
    /// reallocated per message.
    spare_outputs: Vec<Output<Peer, Link>>,
    splice: Splice,
    counter: u64,
    stats: Arc<Stats>,
    log: LogLimiter,
    /// The auth gate: the authenticator and the requests waiting for credentials (`gate`).
    gate: gate::Gate,
    /// STIR/SHAKEN's authentication service, when `[identity] sign` is on (`identity`).
    signing: Option<identity::Signing>,
    /// STIR/SHAKEN's verification service, when `[identity] verify` is on (`identity`).
    verifying: Option<identity::Verifying>,
    /// Binding changes handed to the store and the answers waiting for it (`durable`).
    durable: durable::Durable,
    /// Overload control: what this worker admits, tells neighbours and was told by next hops.
    overload: overload::Overload,
    /// DNS answers, requests waiting for them, targets held down (`locate`).
    locator: locate::Locator,
    /// OPTIONS probes of the configured routes (`probe_due`, worker 0).
    prober: probe::Prober,
    /// Pings to the UDP bindings behind NATs this worker keeps open (`keepalive`).
    keepalive: keepalive::KeepAlive,
    /// The driver's clock in microseconds, for the latency histograms.
    clock: FineClock,
}

fn hostport(addr: SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
        IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
    }
}

/// The peer responses to a request go to: back on the connection it came on for streams
/// (§18.2.2; the driver falls back to the address if that connection has closed), by
/// [`Via::response_addr`] for UDP.
fn response_peer(via: &Via<'_>, source: Peer) -> Peer {
    if source.transport.reliable() {
        source
    } else {
        // From the socket the request came in on (RFC 3581 §4).
        Peer {
            addr: via.response_addr(source.addr),
            ..source
        }
    }
}

/// Whether a response ends its call: a final response to BYE, or a failed INVITE.
fn ends_call(msg: &Message<'_>) -> bool {
    let code = msg.status().unwrap_or(0);
    match msg.method() {
        Method::Bye => code >= 200,
        Method::Invite => code >= 300,
        _ => false,
    }
}

impl Engine {
    /// A worker's engine. `epoch_unix_ms` is the Unix time at monotonic 0.
    pub fn new(cfg: Arc<Config>, worker: usize, epoch_unix_ms: u64, stats: Arc<Stats>) -> Engine {
        let mut sides: Vec<Side> = Vec::new();
        let mut udp_sockets = 0;
        for l in &cfg.listen {
            let udp_socket = (l.transport == Transport::Udp).then(|| {
                udp_sockets += 1;
                udp_sockets - 1
            });
            let v6 = l.addr.is_ipv6();
            if sides
                .iter()
                .all(|s| (s.transport, s.v6) != (l.transport, v6))
            {
                let host = hostport(l.addr);
                let record_route = match l.transport {
                    Transport::Udp => format!("sip:{host};lr"),
                    t => format!("sip:{host};transport={t};lr"),
                };
                sides.push(Side {
                    transport: l.transport,
                    v6,
                    via_host: host,
                    record_route,
                    udp_socket,
                });
            }
        }
        let mut engine = Engine {
            sides,
            worker,
            epoch_unix_ms,
            tx: Transactions::new(0, Timers::default()),
            location: Location::new(epoch_unix_ms),
            outputs: Vec::new(),
            spare_outputs: Vec::new(),
            splice: Splice::new(),
            counter: 0,
            stats,
            log: LogLimiter::new(10),
            gate: gate::Gate::new(),
            signing: None,
            verifying: None,
            durable: durable::Durable::default(),
            overload: overload::Overload::new(),
            locator: locate::Locator::default(),
            prober: probe::Prober::default(),
            keepalive: keepalive::KeepAlive::default(),
            clock: FineClock::default(),
            cfg,
        };
        engine.locate_seed();
        engine
    }

    // Setup, before the first input.

    /// Turns digest authentication on, with what the workers share.
    pub fn enable_auth(&mut self, shared: Arc<crate::auth::digest::DigestShared>) {
        self.gate.enable_digest(&self.cfg, shared, self.worker);
    }

    /// Turns Proxychain on, with what the workers share.
    pub fn enable_proxychain(&mut self, shared: Arc<crate::auth::proxychain::PcShared>) {
        self.gate.enable_proxychain(shared);
    }

    /// Loads a binding or known AOR from the store at start.
    pub(crate) fn preload(&mut self, change: &BindingChange) {
        self.location.apply(change);
        self.keepalive_note(0, change, keepalive::By::Store);
    }

    pub(crate) fn know_aor(&mut self, aor: &str) {
        self.location.know(aor);
    }

    // Queries.

    /// The bindings this worker's replica holds, one a line (`sipsec ctl bindings`).
    pub fn bindings_report(&self, now: Millis) -> String {
        self.location.report(self.unix_ms(now), BINDINGS_REPORTED)
    }

    /// The counters this engine writes (shared with its driver and the metrics endpoint).
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// How often the driver should call [`Engine::handle_load`].
    pub(crate) fn overload_interval_ms(&self) -> u64 {
        self.cfg.overload.interval_ms
    }

    /// Live transactions.
    #[cfg(test)]
    pub fn transactions(&self) -> usize {
        self.tx.len()
    }

    /// The next time [`Engine::handle_timeout`] has work, in monotonic milliseconds.
    pub fn poll_timeout(&self) -> Option<Millis> {
        let loc = self
            .location
            .next_expiry()
            .map(|u| u.saturating_sub(self.epoch_unix_ms));
        [
            self.tx.next_deadline(),
            loc,
            self.durable.next_deadline(),
            self.probe_next(),
            self.keepalive.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    // Inputs.

    /// The driver's clock in microseconds (the same reading as the `now` it passes next, in
    /// milliseconds): the INVITE latency histograms measure with it.
    pub(crate) fn set_clock_us(&mut self, us: u64) {
        self.clock = FineClock { us };
    }

    /// Takes a reloaded configuration: requests from now on are routed, registered, shed and
    /// challenged by it; transactions in flight finish as they began. DNS answers are dropped
    /// (hosts and name servers may have changed) and asked again as needed.
    pub(crate) fn handle_reload(&mut self, cfg: Arc<Config>) {
        self.gate.reload(&cfg);
        self.locator.forget_answers();
        self.cfg = cfg;
    }

    /// Runs the timers due at `now`.
    // Never inlined: one call per wake-up, and a fixed boundary for scripts/callgrind.sh to
    // count the engine's instructions at, whatever the optimiser inlines inside it.
    #[inline(never)]
    pub fn handle_timeout(&mut self, now: Millis, fx: &mut Effects) {
        self.tx.advance(now, &mut self.outputs);
        self.location.expire(self.unix_ms(now));
        self.durable_expire(now, fx);
        self.probe_due(now, fx);
        self.keepalive_due(now, fx);
        self.drain_outputs(now, fx);
    }

    /// Handles mail from another worker, the store, a credential fetcher or DNS.
    pub fn handle_mail(&mut self, now: Millis, mail: Mail, fx: &mut Effects) {
        match mail {
            Mail::Message { source, data } => self.handle_message(now, source, &data, fx),
            Mail::Binding(change) => {
                self.location.apply(&change);
                self.keepalive_note(now, &change, keepalive::By::Elsewhere);
            }
            Mail::Resync(bindings) => {
                self.location.forget_other_nodes();
                for (aor, binding) in bindings.iter() {
                    let change = BindingChange::Upsert {
                        aor: aor.clone(),
                        binding: binding.clone(),
                    };
                    self.location.apply(&change);
                    self.keepalive_note(now, &change, keepalive::By::Elsewhere);
                }
            }
            Mail::NodeState { node, alive } => self.location.node_state(&node, alive),
            Mail::Credential { user } => self.gate_credential(now, &user, fx),
            Mail::Saved { count } => self.handle_saved(now, count, fx),
            Mail::HoldDown { peer, until } => self.locator.hold_until(peer, until, false),
            Mail::Resolved { query, resolution } => {
                self.locate_resolved(now, query, resolution, fx);
                self.drain_outputs(now, fx);
            }
            Mail::Certificate { url, fetched } => {
                self.identity_certificate(now, url, fetched, fx);
                self.drain_outputs(now, fx);
            }
        }
    }

    /// The store has committed the first `count` binding changes this worker sent: the
    /// REGISTER answers waiting for them go out (`durable`).
    pub fn handle_saved(&mut self, now: Millis, count: u64, fx: &mut Effects) {
        self.durable_saved(now, count, fx);
        self.drain_outputs(now, fx);
    }

    /// The driver's load measurement, every `[overload] interval_ms` (no effects).
    pub(crate) fn handle_load(&mut self, now: Millis, measured: Measured) {
        self.overload_measure(now, measured);
    }

    /// The start of a message on a stream that is over `max_message_size`: answered 513 if
    /// its head can be addressed (the stream closes after it: the rest of the message cannot
    /// be skipped reliably), counted like an oversize datagram.
    pub(crate) fn handle_oversize(
        &mut self,
        now: Millis,
        source: Peer,
        head: &[u8],
        fx: &mut Effects,
    ) {
        inc(&self.stats.oversize);
        self.reject_unparsed(now, source, head, ParseError::TooLarge, fx);
    }

    /// A request we sent could not be delivered to `dest` (connection refused, failed
    /// handshake): per RFC 3261 §8.1.3.1 its branch ends as if `dest` had answered 503, so the
    /// caller gets its final answer at once when no branch is left, not Timer B's 408.
    pub fn handle_transport_error(
        &mut self,
        now: Millis,
        dest: Peer,
        data: &[u8],
        fx: &mut Effects,
    ) {
        let Ok(req) = Message::parse(data) else {
            return;
        };
        if !req.is_request() || req.method() == Method::Ack {
            return;
        }
        inc(&self.stats.transport_errors);
        // A flow that is gone is answered as RFC 5626 §5.3 says an edge proxy does (430,
        // for a user agent that speaks outbound: its Contact has `ob`), or 480; either way at
        // once, and never by a new connection the phone would refuse.
        let (code, reason) = if dest.flow {
            inc(&self.stats.flows_gone);
            let ob = req.request_uri().is_some_and(|u| u.param(b"ob").is_some());
            if ob {
                (430, "Flow Failed")
            } else {
                (480, "Temporarily Unavailable")
            }
        } else {
            (503, "Service Unavailable")
        };
        if self.log.allow(now) {
            tracing::warn!(
                "cannot deliver {} to {dest}: the branch fails with {code}",
                String::from_utf8_lossy(req.method_raw())
            );
        }
        let mut resp = Vec::new();
        let server = self.cfg.server_line.as_bytes();
        build::response(&req, code, reason, None, server, b"", &mut resp);
        // As a response from `dest`: it reaches the worker owning the branch, and a stateless
        // proxy forwards it upstream by Via.
        self.handle_message(now, Peer::new(dest.transport, dest.addr), &resp, fx);
    }

    /// Handles one received message: a datagram, or a message framed on a stream.
    // Never inlined, for the same reason as `handle_timeout`.
    #[inline(never)]
    pub fn handle_message(&mut self, now: Millis, source: Peer, data: &[u8], fx: &mut Effects) {
        inc(&self.stats.messages_in);
        if source.transport != Transport::Udp {
            inc(&self.stats.stream_messages_in);
            if source.transport.websocket() {
                inc(&self.stats.websocket_messages_in);
            }
        }
        if data
            .iter()
            .all(|b| matches!(b, b'\r' | b'\n' | b' ' | b'\t' | 0))
        {
            inc(&self.stats.keepalives);
            return;
        }
        if data.len() > self.cfg.max_message_size {
            self.handle_oversize(now, source, data, fx);
            return;
        }
        let msg = match Message::parse(data) {
            Ok(m) => m,
            Err(e) => {
                inc(&self.stats.malformed);
                self.reject_unparsed(now, source, data, e, fx);
                return;
            }
        };
        if msg.is_request() {
            inc(&self.stats.requests_in);
            self.handle_request(now, source, &msg, fx);
        } else {
            inc(&self.stats.responses_in);
            if let Some(conn) = source.stream_conn().filter(|_| ends_call(&msg)) {
                fx.finished_calls.push(conn);
            }
            if let Some(owner) = msg.top_via().branch.and_then(branch::owner) {
                if owner != self.worker && owner < self.cfg.workers {
                    inc(&self.stats.handoffs);
                    fx.mail.push((
                        owner,
                        Mail::Message {
                            source,
                            data: Bytes::copy_from_slice(data),
                        },
                    ));
                    return;
                }
            }
            if self.keepalive_answered(now, &msg) {
                return;
            }
            let code = msg.status().unwrap_or(0);
            self.stats.traffic.response(msg.method(), code);
            self.proxy_response(now, source, &msg, fx);
        }
        self.drain_outputs(now, fx);
    }

    /// A request, parsed: absorbed, shed, refused, answered or routed.
    fn handle_request(&mut self, now: Millis, source: Peer, msg: &Message<'_>, fx: &mut Effects) {
        let method = msg.method();
        inc(&self.stats.traffic.requests[method as usize]);
        if self.cfg.stateful {
            match self.tx.recv_request(now, msg, &mut self.outputs) {
                RequestMatch::New | RequestMatch::Ack => {}
                RequestMatch::Retransmission(_) | RequestMatch::AckAbsorbed(_) => {
                    inc(&self.stats.retransmissions_absorbed);
                    return;
                }
            }
        }
        // To alone first: its tag is all that absorbing the ACK of an answer made here and
        // refusing new work need, so neither parses From or hashes the request for loops.
        let to_tag = msg.to().ok().map(|to| to.tag());
        if self.cfg.stateful && method == Method::Cancel && to_tag.is_some() && msg.from().is_ok() {
            self.proxy_cancel(now, source, msg, fx);
            return;
        }
        if self.reply_is_local_ack(msg, to_tag.flatten()) {
            inc(&self.stats.local_answer_acks);
            return;
        }
        if let Some(to_tag) = to_tag {
            if self.overload_shed(now, source, msg, to_tag.is_some(), fx) {
                return;
            }
        }
        // From and the loop hash, once, for requests that go on.
        let facts = RequestFacts::of(msg);
        let from_ok = facts.is_some();
        if self.cfg.stateful
            && method != Method::Ack
            && self.tx.len() >= self.cfg.max_transactions
            && !self.tx.evict_lingering(&mut self.outputs)
        {
            // Overloaded: refuse without creating state, so a flood cannot exhaust memory.
            inc(&self.stats.overload_rejected);
            if self.log.allow(now) {
                tracing::warn!(
                    "transaction table full ({} live transactions): answering 503",
                    self.tx.len()
                );
            }
            let busy = Answer::new(503, "Service Unavailable").with_headers("Retry-After: 1\r\n");
            let to = ReplyTo::Peer(response_peer(msg.top_via(), source));
            self.reply(now, to, msg, &busy, fx);
            return;
        }
        let vouched = if from_ok {
            match self.gate_check(now, source, msg, fx) {
                Some(vouched) => vouched,
                None => return,
            }
        } else {
            Vouched::No
        };
        if from_ok && method == Method::Invite && to_tag == Some(None) && self.identity_verifies() {
            match self.identity_verify(now, source, msg, (vouched, None), fx) {
                identity::Verified::Stop => return,
                identity::Verified::Go(None) => {}
                identity::Verified::Go(Some(marked)) => {
                    // Routed as marked with its verstat (as it came, should the mark not parse).
                    if let Ok(marked) = Message::parse(&marked) {
                        if let Some(facts) = RequestFacts::of(&marked) {
                            self.route_request(now, source, &marked, (facts, vouched), None, fx);
                            return;
                        }
                    }
                }
            }
        }
        match facts {
            Some(facts) => self.route_request(now, source, msg, (facts, vouched), None, fx),
            None if method != Method::Ack => {
                let bad = Answer::new(400, "Bad From or To header");
                self.reply(now, ReplyTo::Sender(source), msg, &bad, fx);
            }
            None => {}
        }
    }

    /// Decides what a request needs and does it: the part of a request's handling that runs
    /// again, from its server transaction, when it waited for DNS (`resumed`).
    fn route_request(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        (facts, vouched): (RequestFacts<'_>, Vouched),
        resumed: Option<locate::Resumed>,
        fx: &mut Effects,
    ) {
        let method = msg.method();
        let in_dialog = facts.to_tag.is_some();
        let decision = self.routing_decide(now, source, msg, (in_dialog, vouched), facts.hash);
        let existing = resumed.and_then(|r| r.server);
        // Where an answer made here goes: the server transaction it waited for DNS in, if any.
        let reply_to = existing.map_or(ReplyTo::Sender(source), ReplyTo::Transaction);
        match decision {
            Decision::Drop => {}
            Decision::Respond(_) | Decision::Register { .. } if method == Method::Ack => {}
            Decision::Respond(answer) => self.reply(now, reply_to, msg, &answer, fx),
            Decision::Locate(queries) => {
                let server = match resumed {
                    Some(r) => r.server,
                    None if self.cfg.stateful && method != Method::Ack => {
                        Some(self.proxy_open_server(now, source, msg))
                    }
                    None => None,
                };
                let data = Bytes::copy_from_slice(msg.as_bytes());
                if let Some(Link::Proxied(ctx)) = server.and_then(|id| self.tx.user_mut(id)) {
                    ctx.waiting = Some(data.clone());
                }
                let waiter = locate::Waiter {
                    server,
                    source,
                    data,
                    waits: resumed.map_or(0, |r| r.waits),
                    vouched,
                };
                if !self.locate_wait(queries, waiter) && method != Method::Ack {
                    inc(&self.stats.overload_rejected);
                    let mut busy = Answer::new(503, "Service Unavailable (DNS)");
                    if server.is_some() {
                        busy = busy.with_headers("Retry-After: 5\r\n");
                    }
                    let to = server.map_or(ReplyTo::Sender(source), ReplyTo::Transaction);
                    self.reply(now, to, msg, &busy, fx);
                }
            }
            Decision::Register { aor } => {
                let outcome = registrar::register(
                    (&self.cfg.registrar, &self.cfg.nat),
                    // Our listeners (a loop) and our management ports (no relay there).
                    |peer| {
                        self.routing_is_own_listener(peer)
                            || self.relay_is_management_port(peer.addr)
                    },
                    &self.location,
                    &aor,
                    msg,
                    source,
                    self.unix_ms(now),
                );
                let answer = outcome.answer;
                if answer.code == 200 {
                    inc(&self.stats.registrations);
                } else {
                    inc(&self.stats.registrations_refused);
                    if self.log.allow(now) {
                        tracing::warn!(%source, "REGISTER refused: {} {}", answer.code, answer.reason);
                    }
                }
                self.durable.note_sent(outcome.changes.len());
                for mut change in outcome.changes {
                    if let BindingChange::Upsert { binding, .. } = &mut change {
                        if binding.target.flow {
                            inc(&self.stats.nat_bindings);
                        }
                        binding.via = self.flow_cluster_hop(binding);
                    }
                    self.location.apply(&change);
                    self.keepalive_note(now, &change, keepalive::By::Here);
                    fx.changes.push(Arc::new(change));
                }
                if answer.code == 200 && self.cfg.registrar.durable {
                    let ok = self.reply_prepare(now, ReplyTo::Sender(source), msg, &answer);
                    self.durable_hold(now, ok, msg, fx);
                } else {
                    self.reply(now, ReplyTo::Sender(source), msg, &answer, fx);
                }
            }
            Decision::Forward(mut forward) => {
                if !in_dialog {
                    forward.identity = self.identity_sign(now, msg, vouched);
                }
                // What a next hop's feedback may refuse: what local admission may shed.
                let new_work =
                    self.overload_sheddable(msg) && !self.overload_in_our_dialog(msg, in_dialog);
                let how = (facts.hash, new_work, existing);
                self.proxy_forward(now, source, msg, how, &forward, fx);
            }
        }
        self.locate_take_lookups(fx);
    }

    fn unix_ms(&self, now: Millis) -> u64 {
        self.epoch_unix_ms + now
    }

    /// Carries out what the transactions asked for: their messages go into `fx`, their
    /// timeouts end probes and branches; then the holds set meanwhile are told.
    fn drain_outputs(&mut self, now: Millis, fx: &mut Effects) {
        while !self.outputs.is_empty() {
            // Handlers below may queue more outputs; they go into the spare buffer.
            let spare = std::mem::take(&mut self.spare_outputs);
            let mut outputs = std::mem::replace(&mut self.outputs, spare);
            for o in outputs.drain(..) {
                match o {
                    Output::Transmit { dest, data } => fx.transmits.push((dest, data)),
                    Output::Timeout {
                        user: Link::Probe,
                        dest,
                        ..
                    } => self.probe_result(now, dest, false),
                    Output::Timeout {
                        kind,
                        state,
                        dest,
                        user,
                        message,
                        ..
                    } => {
                        if matches!(kind, Kind::ClientInvite | Kind::ClientNonInvite) {
                            if kind == Kind::ClientInvite && state == State::Proceeding {
                                // Timer C: the branch rang too long; end it downstream too.
                                self.proxy_send_cancel(now, &message, dest);
                            }
                            let answered = state == State::Proceeding;
                            self.proxy_branch_timeout(now, user, &message, (dest, answered));
                        }
                    }
                    Output::Terminated { .. } => {}
                }
            }
            self.spare_outputs = outputs;
        }
        self.locate_tell_holds(fx);
    }
}

/// What routing needs of a request that is not a retransmission: its tags, parsed once, and
/// its loop-detection hash (RFC 3261 §16.3 step 4).
#[derive(Debug, Clone, Copy)]
struct RequestFacts<'a> {
    to_tag: Option<&'a [u8]>,
    hash: u32,
}

impl<'a> RequestFacts<'a> {
    /// None when From or To cannot be parsed.
    fn of(msg: &Message<'a>) -> Option<RequestFacts<'a>> {
        let (Ok(from), Ok(to)) = (msg.from(), msg.to()) else {
            return None;
        };
        let (from_tag, to_tag) = (from.tag().unwrap_or_default(), to.tag());
        Some(RequestFacts {
            to_tag,
            hash: branch::loop_hash(msg, from_tag, to_tag.unwrap_or_default()),
        })
    }
}
