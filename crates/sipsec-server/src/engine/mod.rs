//! The per-worker SIP engine: everything `sipsec serve` decides, with no I/O.
//!
//! It owns the worker's transaction table, its location replica and its timers, so nothing
//! on the per-message path is shared between workers. Its driver (`serve::worker`, or a test
//! with a simulated clock and no sockets) feeds it and carries out what it asks; times are
//! monotonic milliseconds ([`Millis`]) from the driver's clock.
//!
//! # What to call when
//!
//! Inputs, each given the time and an [`Effects`] to fill:
//! - [`Engine::on_message`]: a message arrived — a datagram, or one framed on a connection
//!   (the [`Peer`] says which, and names the connection);
//! - [`Engine::on_oversize`]: the start of a stream message over `max_message_size`;
//! - [`Engine::on_mail`]: [`Mail`] from another worker (a handed-off message, a binding
//!   change, a route's destination found down or up), from the store (commits), from a
//!   credential fetcher or from DNS (an answer is in);
//! - [`Engine::on_transport_error`]: a request the driver could not deliver;
//! - [`Engine::on_tick`]: when [`Engine::next_deadline`] has passed;
//! - [`Engine::on_load`]: every `[overload] interval_ms`, the share of it the worker was busy;
//! - [`Engine::reload`]: a new configuration (SIGHUP), already checked by
//!   [`Config::restart_only_changes`] to differ only where it may.
//!
//! Outputs, all in [`Effects`], which the driver carries out after each input (or after a
//! batch of them) and then clears: messages to send, mail for other workers, binding changes
//! for the other workers and the store (before any message of the same batch leaves: a 200 OK
//! to REGISTER must not overtake its binding), calls whose per-call connections may close,
//! credentials to fetch, names to look up in DNS, and the domains TLS destinations must prove
//! (before any connection to them is opened).
//!
//! Timers: after any input, [`Engine::next_deadline`] may have moved; the driver must call
//! [`Engine::on_tick`] no later than it says. Nothing else advances the engine's time.
//!
//! Roles (RFC 3261): a transaction-stateful proxy (§16, with parallel forking and best
//! response selection per §16.7), a stateless proxy (§16.11), a redirect server (§8.3), and a
//! registrar (§10.3) for requests addressed to our domains.
//!
//! One `impl Engine` spread over files by concern: this module holds the state and the
//! inputs; `gate` is the auth gate (digest or Proxychain, and requests parked for
//! credentials); `relay` says who may be forwarded where (and makes and checks the dialog
//! tokens in our Record-Route); `routing` decides what a request needs, `locate` finds where its next hop is
//! (DNS answers, requests waiting for them, destinations held down), `proxy` forwards and
//! tracks branches, `failover` moves a failed branch to the next destination, `probe` pings
//! the configured routes, `registrar` handles REGISTER against the [`location`](crate::location) service,
//! `durable` holds its 200s until the store commits, `reject` answers what the parser refused,
//! `branch` makes and reads our Via branches, and `overload` decides what to admit under load
//! (and what to tell neighbours).

mod branch;
mod durable;
mod failover;
mod gate;
mod locate;
mod overload;
mod probe;
mod proxy;
mod registrar;
mod reject;
mod relay;
mod routing;

#[cfg(test)]
mod tests;

use crate::config::Config;
use crate::engine::relay::Vouched;
use crate::location::{BindingChange, Location, SharedChange};
use crate::stats::{add, inc, LogLimiter, Stats};
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
    Message { source: Peer, data: Bytes },
    /// A registration change made by another worker.
    Binding(SharedChange),
    /// The user's credentials came (or their fetch gave up): requests waiting for them run
    /// now.
    Credential { user: Arc<str> },
    /// From the store: it has committed the first `count` binding changes this worker sent
    /// (durable registration only).
    Saved { count: u64 },
    /// Another worker held a destination down until `until` (a failure, or its probe found
    /// it down: `Millis::MAX`), or found it up again (`until` 0).
    HoldDown { peer: Peer, until: Millis },
    /// DNS answered a lookup this worker asked for (`Effects::lookups`).
    Resolved {
        query: crate::dns::Query,
        resolution: Arc<crate::dns::Resolution>,
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
}

impl Effects {
    pub fn is_empty(&self) -> bool {
        self.transmits.is_empty()
            && self.mail.is_empty()
            && self.changes.is_empty()
            && self.finished_calls.is_empty()
            && self.fetches.is_empty()
            && self.lookups.is_empty()
            && self.tls_names.is_empty()
    }
}

/// Requests waiting for the authority, at most this many per user and in all: beyond, they
/// are answered 503 at once rather than held.
const MAX_PARKED_PER_USER: usize = 16;
const MAX_PARKED: usize = 10_000;

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
    /// An OPTIONS probe of a route's destination (`probe`).
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
    /// Where to send it, in the order to try: the first that can be used gets the request,
    /// the others are its failover (RFC 3263 §4.3).
    dests: SmallVec<[Peer; 2]>,
}

/// What to do with a request.
enum Decision {
    Respond {
        code: u16,
        reason: &'static str,
        headers: String,
    },
    Register {
        aor: String,
    },
    Forward {
        targets: SmallVec<[Target; 1]>,
        /// Our own Routes to consume (two after a double Record-Route): per header line,
        /// where the last of its values to remove ends.
        pop_route: SmallVec<[(HeaderField, usize); 2]>,
        record_route: bool,
    },
    /// Next hops named by DNS that this worker has no answer for yet: wait for them.
    Locate(SmallVec<[crate::dns::Query; 1]>),
    Drop,
}

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
            Some(socket) => Peer::udp_via(peer.addr, socket),
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
    /// Failed authentications' log lines (what fail2ban reads), limited apart from the other
    /// warnings so that a flood of malformed messages cannot crowd them out.
    auth_log: LogLimiter,
    /// Digest authentication, when `[auth] scheme = "digest"`.
    auth: Option<crate::auth::digest::DigestAuthenticator>,
    /// Proxychain, when `[auth] scheme = "proxychain"`.
    proxychain: Option<crate::auth::proxychain::PcAuthenticator>,
    /// Requests waiting for a user's chain from the authority.
    parked: std::collections::HashMap<Arc<str>, Vec<(Peer, Bytes)>>,
    parked_total: usize,
    /// Running requests that already waited: they are not parked twice.
    rerunning: bool,
    /// When "authentication unavailable" was last logged.
    unavailable_logged: Option<Millis>,
    /// Binding changes handed to the store, and how many of them it has committed
    /// (`durable`).
    changes_sent: u64,
    changes_saved: u64,
    /// REGISTER answers waiting for the store, oldest first (`durable`).
    held: std::collections::VecDeque<durable::Held>,
    /// Overload control: what this worker admits, tells neighbours and was told by next hops.
    overload: overload::Overload,
    /// DNS answers, requests waiting for them, targets held down (`locate`).
    locator: locate::Locator,
    /// OPTIONS probes of the configured routes (`probe`, worker 0).
    prober: probe::Prober,
    /// The driver's clock in microseconds, for the latency histograms.
    clock: FineClock,
}

/// How often an authentication outage is logged, per worker.
const UNAVAILABLE_LOG_MS: Millis = 60_000;

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
            auth_log: LogLimiter::new(10),
            auth: None,
            proxychain: None,
            parked: std::collections::HashMap::new(),
            parked_total: 0,
            rerunning: false,
            unavailable_logged: None,
            changes_sent: 0,
            changes_saved: 0,
            held: std::collections::VecDeque::new(),
            overload: overload::Overload::new(),
            locator: locate::Locator::default(),
            prober: probe::Prober::default(),
            clock: FineClock::default(),
            cfg,
        };
        engine.seed_locator();
        engine
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The driver's clock in microseconds (the same reading as the `now` it passes next, in
    /// milliseconds): the INVITE latency histograms measure with it.
    pub(crate) fn set_clock_us(&mut self, us: u64) {
        self.clock = FineClock { us };
    }

    /// Takes a reloaded configuration: requests from now on are routed, registered, shed and
    /// challenged by it; transactions in flight finish as they began. DNS answers are dropped
    /// (hosts and name servers may have changed) and asked again as needed.
    pub fn reload(&mut self, cfg: Arc<Config>) {
        if let Some(auth) = self.auth.as_mut() {
            auth.set_config(Arc::new(cfg.auth.clone()));
        }
        if let Some(pc) = self.proxychain.as_mut() {
            pc.set_scope(cfg.auth.scope.clone());
        }
        self.locator.forget_answers();
        self.cfg = cfg;
    }

    /// Loads a binding or known AOR from the store at start.
    pub(crate) fn preload(&mut self, change: &BindingChange) {
        self.location.apply(change);
    }

    pub(crate) fn know_aor(&mut self, aor: &str) {
        self.location.know(aor);
    }

    /// Live transactions.
    #[cfg(test)]
    pub fn transactions(&self) -> usize {
        self.tx.len()
    }

    /// The next time [`Engine::on_tick`] has work, in monotonic milliseconds.
    pub fn next_deadline(&self) -> Option<Millis> {
        let loc = self
            .location
            .next_expiry()
            .map(|u| u.saturating_sub(self.epoch_unix_ms));
        [
            self.tx.next_deadline(),
            loc,
            self.next_held_deadline(),
            self.next_probe(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn unix_ms(&self, now: Millis) -> u64 {
        self.epoch_unix_ms + now
    }

    /// Runs the timers due at `now`.
    // Never inlined: one call per wake-up, and a fixed boundary for bench/callgrind.sh to
    // count the engine's instructions at, whatever the optimiser inlines inside it.
    #[inline(never)]
    pub fn on_tick(&mut self, now: Millis, fx: &mut Effects) {
        self.tx.advance(now, &mut self.outputs);
        self.location.expire(self.unix_ms(now));
        self.expire_held(now, fx);
        self.probe(now, fx);
        self.drain_outputs(now, fx);
    }

    /// Handles mail from another worker.
    pub fn on_mail(&mut self, now: Millis, mail: Mail, fx: &mut Effects) {
        match mail {
            Mail::Message { source, data } => self.on_message(now, source, &data, fx),
            Mail::Binding(change) => self.location.apply(&change),
            Mail::Credential { user } => self.on_credential(now, &user, fx),
            Mail::Saved { count } => self.on_saved(now, count, fx),
            Mail::HoldDown { peer, until } => self.locator.hold_until(peer, until, false),
            Mail::Resolved { query, resolution } => {
                self.on_resolved(now, query, resolution, fx);
                self.drain_outputs(now, fx);
            }
        }
    }

    /// Handles one received message: a datagram, or a message framed on a stream.
    // Never inlined, for the same reason as `on_tick`.
    #[inline(never)]
    pub fn on_message(&mut self, now: Millis, source: Peer, data: &[u8], fx: &mut Effects) {
        inc(&self.stats.messages_in);
        if source.transport != Transport::Udp {
            inc(&self.stats.stream_messages_in);
        }
        if data
            .iter()
            .all(|b| matches!(b, b'\r' | b'\n' | b' ' | b'\t' | 0))
        {
            inc(&self.stats.keepalives);
            return;
        }
        if data.len() > self.cfg.max_message_size {
            inc(&self.stats.oversize);
            self.reject_unparsed(now, source, data, ParseError::TooLarge, fx);
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
            self.on_request(now, source, &msg, fx);
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
            let code = msg.status().unwrap_or(0);
            self.stats.traffic.response(msg.method(), code);
            self.on_response(now, &msg, fx);
        }
        self.drain_outputs(now, fx);
    }

    fn on_request(&mut self, now: Millis, source: Peer, msg: &Message<'_>, fx: &mut Effects) {
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
        // From and To are parsed once, for requests that are not retransmissions; the
        // decisions below use the tags.
        let facts = RequestFacts::of(msg);
        let from_ok = facts.is_some();
        let to_tagged = facts.is_some_and(|f| f.to_tag.is_some());
        if self.cfg.stateful && method == Method::Cancel && from_ok {
            self.on_cancel(now, source, msg, fx);
            return;
        }
        if self.is_ack_for_local_answer(msg, facts.and_then(|f| f.to_tag)) {
            inc(&self.stats.local_answer_acks);
            return;
        }
        if from_ok && self.shed(now, source, msg, to_tagged, fx) {
            return;
        }
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
            let busy = self.local_response(msg, 503, "Service Unavailable", "Retry-After: 1\r\n");
            fx.transmits
                .push((response_peer(msg.top_via(), source), busy));
            return;
        }
        let vouched = if from_ok {
            match self.authenticated(now, source, msg, fx) {
                Some(vouched) => vouched,
                None => return,
            }
        } else {
            Vouched::No
        };
        match facts {
            Some(facts) => self.route_request(now, source, msg, (facts, vouched), None, fx),
            None if method != Method::Ack => {
                self.answer(now, source, msg, 400, "Bad From or To header", "", fx);
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
        let decision = self.decide(now, msg, (in_dialog, vouched), facts.hash);
        let existing = resumed.and_then(|r| r.server);
        match decision {
            Decision::Drop => {}
            Decision::Respond { .. } | Decision::Register { .. } if method == Method::Ack => {}
            Decision::Respond {
                code,
                reason,
                headers,
            } => {
                let to = (source, existing);
                self.answer_at(now, to, msg, code, reason, &headers, fx);
            }
            Decision::Locate(queries) => {
                let server = match resumed {
                    Some(r) => r.server,
                    None if self.cfg.stateful && method != Method::Ack => {
                        Some(self.open_server(now, source, msg))
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
                if !self.wait_for_dns(queries, waiter) && method != Method::Ack {
                    inc(&self.stats.overload_rejected);
                    let headers = if server.is_some() {
                        "Retry-After: 5\r\n"
                    } else {
                        ""
                    };
                    let reason = "Service Unavailable (DNS)";
                    self.answer_at(now, (source, server), msg, 503, reason, headers, fx);
                }
            }
            Decision::Register { aor } => {
                let outcome = registrar::register(
                    &self.cfg.registrar,
                    // Our listeners (a loop) and our management ports (no relay there).
                    |peer| self.is_own_listener(peer) || self.is_management_port(peer.addr),
                    &self.location,
                    &aor,
                    msg,
                    source,
                    self.unix_ms(now),
                );
                if outcome.code == 200 {
                    inc(&self.stats.registrations);
                } else {
                    inc(&self.stats.registrations_refused);
                    if self.log.allow(now) {
                        tracing::warn!(%source, "REGISTER refused: {} {}", outcome.code, outcome.reason);
                    }
                }
                self.note_changes_sent(outcome.changes.len());
                for change in outcome.changes {
                    self.location.apply(&change);
                    fx.changes.push(Arc::new(change));
                }
                if outcome.code == 200 && self.cfg.registrar.durable {
                    self.answer_durably(now, source, msg, &outcome.headers, fx);
                } else {
                    self.answer(
                        now,
                        source,
                        msg,
                        outcome.code,
                        outcome.reason,
                        &outcome.headers,
                        fx,
                    );
                }
            }
            Decision::Forward {
                targets,
                pop_route,
                record_route,
            } => {
                let route = (&pop_route[..], record_route);
                // What a next hop's feedback may refuse: what local admission may shed.
                let new_work = self.sheddable(msg) && !self.in_our_dialog(msg, in_dialog);
                let how = (facts.hash, new_work, existing);
                self.forward(now, source, msg, how, &targets, route, fx);
            }
        }
        self.take_lookups(fx);
    }

    /// Answers a request here: in the server transaction it waited for DNS in, when `to`
    /// names one, else as [`Engine::answer`] does.
    #[allow(clippy::too_many_arguments)]
    fn answer_at(
        &mut self,
        now: Millis,
        to: (Peer, Option<TxId>),
        msg: &Message<'_>,
        code: u16,
        reason: &str,
        headers: &str,
        fx: &mut Effects,
    ) {
        match to {
            (_, Some(id)) => self.answer_in(now, id, msg, code, reason, headers),
            (source, None) => self.answer(now, source, msg, code, reason, headers, fx),
        }
    }

    /// Answers a request that waited for DNS through the server transaction it waited in.
    fn answer_in(
        &mut self,
        now: Millis,
        id: TxId,
        msg: &Message<'_>,
        code: u16,
        reason: &str,
        headers: &str,
    ) {
        let data = self.answer_data(now, msg, code, reason, headers);
        if let Some(Link::Proxied(ctx)) = self.tx.user_mut(id) {
            ctx.finish(self.clock.at(now), &self.stats);
            ctx.waiting = None;
        }
        self.tx.respond(now, id, code, data, &mut self.outputs);
    }

    /// A response generated here: `headers` (CRLF-terminated lines) plus our Server header,
    /// with a deterministic To tag.
    fn local_response(&self, msg: &Message<'_>, code: u16, reason: &str, headers: &str) -> Bytes {
        self.stats.traffic.local_response(code);
        let server = &self.cfg.server_line;
        let mut extra = String::with_capacity(headers.len() + server.len());
        extra.push_str(headers);
        extra.push_str(server);
        let tag = local_tag(msg);
        let mut out = Vec::with_capacity(msg.as_bytes().len() / 2 + extra.len() + 64);
        build::response(
            msg,
            code,
            reason,
            Some(&tag),
            extra.as_bytes(),
            b"",
            &mut out,
        );
        Bytes::from(out)
    }

    /// Sends a locally generated final (or OPTIONS) response, through a server transaction
    /// when stateful so retransmissions of the request are answered from it.
    #[allow(clippy::too_many_arguments)]
    fn answer(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        code: u16,
        reason: &str,
        headers: &str,
        fx: &mut Effects,
    ) {
        let data = self.answer_data(now, msg, code, reason, headers);
        let dest = response_peer(msg.top_via(), source);
        if msg.method() == Method::Invite && code >= 300 {
            // A final answer made here to an INVITE, before anything was forwarded (a
            // challenge, 403, 404, ...), is sent once and kept nowhere, as Kamailio's
            // `sl_send_reply` does: a server transaction would repeat it to the address the
            // Via names until Timer H, eleven times over 32 s, to whoever a spoofed datagram
            // named (27.9x reflection). A caller that lost it retransmits its INVITE and is
            // answered again; its ACK carries our deterministic tag and is absorbed
            // (`is_ack_for_local_answer`).
            fx.transmits.push((dest, data));
            return;
        }
        let to = self.local_reply(msg, dest);
        self.release(now, to, code, data, fx);
    }

    /// An answer made here, with overload feedback for a neighbour that asked, counted.
    fn answer_data(
        &mut self,
        now: Millis,
        msg: &Message<'_>,
        code: u16,
        reason: &str,
        headers: &str,
    ) -> Bytes {
        let data = self.local_response(msg, code, reason, headers);
        inc(&self.stats.local_responses);
        self.add_feedback(now, data)
    }

    /// Opens the server transaction for an answer generated here (stateful), or names the
    /// peer to send it to (stateless).
    fn local_reply(&mut self, msg: &Message<'_>, dest: Peer) -> LocalReply {
        if self.cfg.stateful {
            let id = self
                .tx
                .create_server(msg, dest, dest.transport.reliable(), Link::Local);
            LocalReply::Transaction(id)
        } else {
            LocalReply::Peer(dest)
        }
    }

    /// Sends an answer generated here where `local_reply` said.
    fn release(&mut self, now: Millis, to: LocalReply, code: u16, data: Bytes, fx: &mut Effects) {
        match to {
            LocalReply::Transaction(id) => {
                self.tx.respond(now, id, code, data, &mut self.outputs);
            }
            LocalReply::Peer(dest) => fx.transmits.push((dest, data)),
        }
    }

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
                    } => self.on_probe(now, dest, false),
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
                                self.send_cancel(now, &message, dest);
                            }
                            let answered = state == State::Proceeding;
                            self.on_branch_timeout(now, user, &message, (dest, answered));
                        }
                    }
                    Output::Terminated { .. } => {}
                }
            }
            self.spare_outputs = outputs;
        }
        self.tell_holds(fx);
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

/// Where an answer generated here goes: through its server transaction (stateful, which
/// then answers retransmissions from it), or straight to the peer (stateless).
#[derive(Debug)]
enum LocalReply {
    Transaction(TxId),
    Peer(Peer),
}

/// A deterministic To tag for responses generated here: a retransmitted request gets the
/// same tag, even from a stateless server (RFC 3261 §16.11).
fn local_tag(msg: &Message<'_>) -> LocalTag {
    let from_tag = msg.from().ok().and_then(|f| f.tag()).unwrap_or_default();
    let h = branch::fnv1a(&[
        msg.call_id(),
        from_tag,
        msg.top_via().branch.unwrap_or_default(),
    ]);
    let mut tag = *b"sS0000000000000000";
    for (i, digit) in tag[2..].iter_mut().enumerate() {
        *digit = b"0123456789abcdef"[(h >> (60 - 4 * i)) as usize & 0xf];
    }
    LocalTag(tag)
}

/// A To tag made here: `sS` and 16 hex digits, on the stack.
struct LocalTag([u8; 18]);

impl std::ops::Deref for LocalTag {
    type Target = str;
    fn deref(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}
