//! The per-worker SIP engine: everything `sipsec serve` decides, with no I/O.
//!
//! A worker's driver hands the engine datagrams, mail from other workers and the time; the
//! engine returns [`Effects`]: datagrams to send, mail for other workers, and binding changes
//! to store. It owns the worker's transaction table, its location replica and its timers, so
//! nothing on the per-message path is shared between workers. Tests drive it directly with
//! simulated time and no sockets.
//!
//! Roles (RFC 3261): a transaction-stateful proxy (§16, with parallel forking and best
//! response selection per §16.7), a stateless proxy (§16.11), a redirect server (§8.3), and a
//! registrar (§10.3) for requests addressed to our domains.

mod branch;
mod registrar;
pub mod stats;
#[cfg(test)]
mod tests;

use crate::config::{uri_socket_addr, Config, Mode};
use crate::location::{BindingChange, Location, Lookup, SharedChange};
use bytes::Bytes;
use sip_core::message::rewrite::{Rewriter, Splice};
use sip_core::message::{build, HeaderName, Message, Method, ParseError, Scheme, Uri, Via};
use sip_core::timer::Millis;
use sip_core::transaction::{
    Kind, Output, RequestMatch, ResponseMatch, State, Timers, Transactions, TxId,
};
use smallvec::SmallVec;
use stats::{inc, LogLimiter, Stats};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Mail between workers.
#[derive(Debug, Clone)]
pub enum Mail {
    /// A datagram that belongs to the receiving worker's transactions.
    Datagram { source: SocketAddr, data: Bytes },
    /// A registration change made by another worker.
    Binding(SharedChange),
}

/// What the engine asks its driver to do.
#[derive(Debug, Default)]
pub struct Effects {
    pub transmits: Vec<(SocketAddr, Bytes)>,
    /// Mail for one worker, by index.
    pub mail: Vec<(usize, Mail)>,
    /// Binding changes for every other worker and for the store.
    pub changes: Vec<SharedChange>,
}

impl Effects {
    pub fn is_empty(&self) -> bool {
        self.transmits.is_empty() && self.mail.is_empty() && self.changes.is_empty()
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
    },
    /// A CANCEL we sent downstream.
    Cancel,
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
}

/// Where one forwarded copy of a request goes.
#[derive(Debug, Clone)]
struct Target {
    /// A new Request-URI (retargeting to a registered contact), if any.
    request_uri: Option<Box<str>>,
    dest: SocketAddr,
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
        pop_route: Option<(usize, usize)>,
        record_route: bool,
    },
    Drop,
}

fn respond(code: u16, reason: &'static str) -> Decision {
    Decision::Respond {
        code,
        reason,
        headers: String::new(),
    }
}

const ALLOW: &str = "Allow: INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER\r\n";
const SERVER: &str = "Server: sipsec/0.1\r\n";

/// The SIP engine of one worker.
pub struct Engine {
    cfg: Arc<Config>,
    worker: usize,
    /// `host:port` we put in Via and Record-Route.
    via_host: String,
    record_route_uri: String,
    local_addrs: Vec<SocketAddr>,
    epoch_unix_ms: u64,
    tx: Transactions<SocketAddr, Link>,
    location: Location,
    outputs: Vec<Output<SocketAddr, Link>>,
    splice: Splice,
    counter: u64,
    stats: Arc<Stats>,
    log: LogLimiter,
}

fn hostport(addr: SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
        IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
    }
}

/// Where responses to a request go (RFC 3261 §18.2.2, RFC 3581): the source address, at the
/// Via's port unless rport asked for the source port.
fn response_dest(via: &Via<'_>, source: SocketAddr) -> SocketAddr {
    if via.rport().is_some() {
        source
    } else {
        SocketAddr::new(source.ip(), via.port.unwrap_or(5060))
    }
}

/// Where a response goes next when forwarded by Via (RFC 3261 §18.2.2).
fn via_dest(via: &Via<'_>) -> Option<SocketAddr> {
    let host = via.received().unwrap_or(match via.host {
        [b'[', inner @ .., b']'] => inner,
        h => h,
    });
    let ip: IpAddr = std::str::from_utf8(host).ok()?.parse().ok()?;
    let port = via.rport().flatten().or(via.port).unwrap_or(5060);
    Some(SocketAddr::new(ip, port))
}

impl Engine {
    /// A worker's engine. `epoch_unix_ms` is the Unix time at monotonic 0.
    pub fn new(cfg: Arc<Config>, worker: usize, epoch_unix_ms: u64, stats: Arc<Stats>) -> Engine {
        let local_addrs: Vec<SocketAddr> = cfg.listen.iter().map(|l| l.addr).collect();
        let via_host = hostport(local_addrs[0]);
        Engine {
            record_route_uri: format!("sip:{via_host};lr"),
            via_host,
            local_addrs,
            worker,
            epoch_unix_ms,
            tx: Transactions::new(0, Timers::default()),
            location: Location::new(epoch_unix_ms),
            outputs: Vec::new(),
            splice: Splice::new(),
            counter: 0,
            stats,
            log: LogLimiter::new(10),
            cfg,
        }
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Loads a binding or known AOR from the store at start.
    pub fn preload(&mut self, change: &BindingChange) {
        self.location.apply(change);
    }

    pub fn know_aor(&mut self, aor: &str) {
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
        match (self.tx.next_deadline(), loc) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn unix_ms(&self, now: Millis) -> u64 {
        self.epoch_unix_ms + now
    }

    /// Runs the timers due at `now`.
    pub fn on_tick(&mut self, now: Millis, fx: &mut Effects) {
        self.tx.advance(now, &mut self.outputs);
        self.location.expire(self.unix_ms(now));
        self.drain_outputs(now, fx);
    }

    /// Handles mail from another worker.
    pub fn on_mail(&mut self, now: Millis, mail: Mail, fx: &mut Effects) {
        match mail {
            Mail::Datagram { source, data } => self.on_datagram(now, source, &data, fx),
            Mail::Binding(change) => self.location.apply(&change),
        }
    }

    /// Handles one received datagram.
    pub fn on_datagram(&mut self, now: Millis, source: SocketAddr, data: &[u8], fx: &mut Effects) {
        inc(&self.stats.datagrams_in);
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
            if let Some(owner) = msg.top_via().branch.and_then(branch::owner) {
                if owner != self.worker && owner < self.cfg.workers {
                    inc(&self.stats.handoffs);
                    fx.mail.push((
                        owner,
                        Mail::Datagram {
                            source,
                            data: Bytes::copy_from_slice(data),
                        },
                    ));
                    return;
                }
            }
            self.on_response(now, &msg, fx);
        }
        self.drain_outputs(now, fx);
    }

    /// Answers a message the parser refused, when enough of it is readable to address a
    /// response; otherwise drops it. Never answers a response or an ACK.
    fn reject_unparsed(
        &mut self,
        now: Millis,
        source: SocketAddr,
        data: &[u8],
        err: ParseError,
        fx: &mut Effects,
    ) {
        if self.log.allow(now) {
            tracing::warn!(%source, "rejected message: {err}");
        }
        let mut out = Vec::new();
        if salvage_response(data, err.status(), &err.reason(), &mut out) {
            inc(&self.stats.local_responses);
            fx.transmits.push((source, Bytes::from(out)));
        } else {
            inc(&self.stats.malformed_dropped);
        }
    }

    fn is_local_host(&self, uri: &Uri<'_>) -> bool {
        let host = uri.host_unbracketed();
        let port = uri.port.unwrap_or(5060);
        let domain = std::str::from_utf8(host)
            .map(|h| self.cfg.domains.iter().any(|d| d.eq_ignore_ascii_case(h)))
            .unwrap_or(false);
        if domain && (uri.port.is_none() || self.local_addrs.iter().any(|a| a.port() == port)) {
            return true;
        }
        self.is_local_addr(host, port)
    }

    fn is_local_addr(&self, host: &[u8], port: u16) -> bool {
        let Some(ip) = std::str::from_utf8(host)
            .ok()
            .and_then(|h| h.parse::<IpAddr>().ok())
        else {
            return false;
        };
        self.local_addrs
            .iter()
            .any(|a| a.ip() == ip && a.port() == port)
    }

    fn is_our_domain(&self, host: &[u8]) -> bool {
        std::str::from_utf8(host)
            .map(|h| self.cfg.domains.iter().any(|d| d.eq_ignore_ascii_case(h)))
            .unwrap_or(false)
    }

    /// The address-of-record key of a user at a host we serve: domain hosts as written
    /// (lower case), our own IP addresses standing for the first domain.
    fn aor_key(&self, user: &[u8], host: &[u8]) -> String {
        let user = String::from_utf8_lossy(user);
        if self.is_our_domain(host) {
            format!(
                "{user}@{}",
                String::from_utf8_lossy(host).to_ascii_lowercase()
            )
        } else {
            format!("{user}@{}", self.cfg.domains[0])
        }
    }

    fn on_request(&mut self, now: Millis, source: SocketAddr, msg: &Message<'_>, fx: &mut Effects) {
        let method = msg.method();
        // From and To are parsed once here; decisions below use the tags.
        let tags = match (msg.from(), msg.to()) {
            (Ok(from), Ok(to)) => Some((from.tag().unwrap_or_default(), to.tag())),
            _ => None,
        };
        let from_ok = tags.is_some();
        let in_dialog = tags.is_some_and(|(_, to)| to.is_some());
        let hash = tags.map_or(0, |(from, to)| {
            branch::loop_hash(msg, from, to.unwrap_or_default())
        });
        if self.cfg.stateful {
            match self.tx.recv_request(now, msg, &mut self.outputs) {
                RequestMatch::New | RequestMatch::Ack => {}
                RequestMatch::Retransmission(_) | RequestMatch::AckAbsorbed(_) => {
                    inc(&self.stats.retransmissions_absorbed);
                    return;
                }
            }
            if method == Method::Cancel && from_ok {
                self.on_cancel(now, source, msg, fx);
                return;
            }
        }
        if self.cfg.stateful && method != Method::Ack && self.tx.len() >= self.cfg.max_transactions
        {
            // Overloaded: refuse without creating state, so a flood cannot exhaust memory.
            inc(&self.stats.overload_rejected);
            if self.log.allow(now) {
                tracing::warn!(
                    "transaction table full ({} transactions): answering 503",
                    self.tx.len()
                );
            }
            let mut out = Vec::new();
            let extra = b"Retry-After: 1\r\nServer: sipsec/0.1\r\n";
            build::response(
                msg,
                503,
                "Service Unavailable",
                Some(&local_tag(msg)),
                extra,
                b"",
                &mut out,
            );
            fx.transmits
                .push((response_dest(msg.top_via(), source), Bytes::from(out)));
            return;
        }
        let decision = if from_ok {
            self.decide(now, msg, in_dialog, hash)
        } else {
            respond(400, "Bad From or To header")
        };
        match decision {
            Decision::Drop => {}
            Decision::Respond { .. } | Decision::Register { .. } if method == Method::Ack => {}
            Decision::Respond {
                code,
                reason,
                headers,
            } => {
                self.answer(now, source, msg, code, reason, &headers, fx);
            }
            Decision::Register { aor } => {
                let outcome = registrar::register(
                    &self.cfg.registrar,
                    &self.location,
                    &aor,
                    msg,
                    source,
                    self.unix_ms(now),
                );
                if outcome.code == 200 {
                    inc(&self.stats.registrations);
                }
                for change in outcome.changes {
                    self.location.apply(&change);
                    fx.changes.push(Arc::new(change));
                }
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
            Decision::Forward {
                targets,
                pop_route,
                record_route,
            } => {
                let route = (pop_route, record_route);
                self.forward(now, source, msg, hash, &targets, route, fx);
            }
        }
    }

    /// Decides what to do with a request that is not a retransmission.
    fn decide(&mut self, now: Millis, msg: &Message<'_>, in_dialog: bool, hash: u32) -> Decision {
        let method = msg.method();
        let uri = *msg.request_uri().expect("requests have a Request-URI");
        if msg.max_forwards() == Some(0) {
            inc(&self.stats.too_many_hops);
            return respond(483, "Too Many Hops");
        }
        if uri.scheme == Scheme::Other {
            return respond(416, "Unsupported URI Scheme");
        }
        if let Some(refused) = bad_extension(msg, HeaderName::ProxyRequire) {
            return refused;
        }
        // Loop detection (RFC 3261 §16.3 step 4).
        let mut looped = false;
        let vias_ok = msg.vias(|v| {
            if v.branch.and_then(branch::carried_loop_hash) == Some(hash)
                && self.is_local_addr(v.host, v.port.unwrap_or(5060))
            {
                looped = true;
            }
        });
        if vias_ok.is_err() {
            return respond(400, "Bad Via header");
        }
        if looped {
            inc(&self.stats.loops);
            return respond(482, "Loop Detected");
        }
        // Loose routing (§16.4): a top Route naming us is consumed.
        let mut pop_route = None;
        let mut next_route: Option<SocketAddr> = None;
        let mut route_error = false;
        let mut index = 0;
        let routes = msg.name_addrs(HeaderName::Route, |field, na| {
            if index == 0 && self.is_local_host(&na.uri) {
                pop_route = Some((field.line_start as usize, na.end));
            } else if next_route.is_none() {
                next_route = uri_socket_addr(&na.uri);
                route_error |= next_route.is_none();
            }
            index += 1;
        });
        if routes.is_err() {
            return respond(400, "Bad Route header");
        }
        let record_route = self.cfg.record_route
            && !in_dialog
            && matches!(
                method,
                Method::Invite | Method::Subscribe | Method::Refer | Method::Notify
            );
        if route_error {
            inc(&self.stats.unroutable);
            return respond(404, "Not Found (unresolvable Route)");
        }
        if let Some(dest) = next_route {
            return Decision::Forward {
                targets: smallvec::smallvec![Target {
                    request_uri: None,
                    dest
                }],
                pop_route,
                record_route,
            };
        }

        let addressed_to_us = self.is_local_host(&uri);
        if addressed_to_us && (uri.user.is_none() || method == Method::Register) {
            return self.decide_local(msg, in_dialog);
        }
        let user_here = uri.user.filter(|_| {
            matches!(uri.scheme, Scheme::Sip | Scheme::Sips) && addressed_to_us && !in_dialog
        });
        if let Some(user) = user_here {
            let explicit_domain = self.is_our_domain(uri.host_unbracketed());
            let aor = self.aor_key(user, uri.host_unbracketed());
            let now_unix = self.unix_ms(now);
            let lookup = self.location.lookup(&aor, now_unix);
            let fallback = (!explicit_domain)
                .then_some(())
                .and(self.cfg.default_route.as_ref());
            match (lookup, fallback) {
                (Lookup::Found(bindings), _) => {
                    if self.cfg.mode == Mode::Redirect {
                        return self.redirect_to(
                            bindings
                                .iter()
                                .map(|b| (b.contact.to_string(), Some(b.expires_at))),
                            now_unix,
                        );
                    }
                    let targets = bindings
                        .iter()
                        .map(|b| Target {
                            request_uri: Some(b.contact.clone()),
                            dest: b.target,
                        })
                        .collect();
                    return Decision::Forward {
                        targets,
                        pop_route,
                        record_route,
                    };
                }
                (_, Some(_)) => {}
                (Lookup::Unavailable, None) => {
                    inc(&self.stats.unroutable);
                    return respond(480, "Temporarily Unavailable");
                }
                (Lookup::Unknown, None) => {
                    inc(&self.stats.unroutable);
                    return respond(404, "Not Found");
                }
            }
        }
        // Not one of our users: the default route for new requests, else the Request-URI.
        let dest = match (&self.cfg.default_route, in_dialog) {
            (Some((route_uri, addr)), false) => {
                if self.cfg.mode == Mode::Redirect {
                    return self.redirect_to(
                        std::iter::once((route_uri.clone(), None)),
                        self.unix_ms(now),
                    );
                }
                Some(*addr)
            }
            _ => uri_socket_addr(&uri).filter(|a| !self.local_addrs.contains(a)),
        };
        match dest {
            Some(dest) if self.cfg.mode == Mode::Proxy || in_dialog => Decision::Forward {
                targets: smallvec::smallvec![Target {
                    request_uri: None,
                    dest
                }],
                pop_route,
                record_route,
            },
            _ => {
                inc(&self.stats.unroutable);
                respond(404, "Not Found")
            }
        }
    }

    /// Requests addressed to the server itself.
    fn decide_local(&mut self, msg: &Message<'_>, in_dialog: bool) -> Decision {
        if let Some(refused) = bad_extension(msg, HeaderName::Require) {
            return refused;
        }
        match msg.method() {
            Method::Options => Decision::Respond {
                code: 200,
                reason: "OK",
                headers: format!("{ALLOW}Accept: application/sdp\r\n"),
            },
            Method::Register if !in_dialog => {
                let Ok(to) = msg.to() else {
                    return respond(400, "Bad To header");
                };
                let (Some(user), true) = (
                    to.uri.user,
                    self.is_local_host(&to.uri) || self.is_our_domain(to.uri.host_unbracketed()),
                ) else {
                    return respond(404, "Not Found (not a domain of this registrar)");
                };
                Decision::Register {
                    aor: self.aor_key(user, to.uri.host_unbracketed()),
                }
            }
            Method::Ack => Decision::Drop,
            Method::Other => {
                inc(&self.stats.not_allowed);
                Decision::Respond {
                    code: 501,
                    reason: "Not Implemented",
                    headers: ALLOW.into(),
                }
            }
            _ => {
                inc(&self.stats.not_allowed);
                Decision::Respond {
                    code: 405,
                    reason: "Method Not Allowed",
                    headers: ALLOW.into(),
                }
            }
        }
    }

    fn redirect_to(
        &self,
        contacts: impl Iterator<Item = (String, Option<u64>)>,
        now_unix: u64,
    ) -> Decision {
        let mut headers = String::new();
        for (contact, expires_at) in contacts {
            let _ = write!(headers, "Contact: <{contact}>");
            if let Some(at) = expires_at {
                let _ = write!(
                    headers,
                    ";expires={}",
                    at.saturating_sub(now_unix).div_ceil(1000)
                );
            }
            headers.push_str("\r\n");
        }
        Decision::Respond {
            code: 302,
            reason: "Moved Temporarily",
            headers,
        }
    }

    /// Sends a locally generated final (or OPTIONS) response, through a server transaction
    /// when stateful so retransmissions of the request are answered from it.
    #[allow(clippy::too_many_arguments)]
    fn answer(
        &mut self,
        now: Millis,
        source: SocketAddr,
        msg: &Message<'_>,
        code: u16,
        reason: &str,
        headers: &str,
        fx: &mut Effects,
    ) {
        let mut extra = String::with_capacity(headers.len() + SERVER.len());
        extra.push_str(headers);
        extra.push_str(SERVER);
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
        inc(&self.stats.local_responses);
        let dest = response_dest(msg.top_via(), source);
        let data = Bytes::from(out);
        if self.cfg.stateful {
            let id = self.tx.create_server(msg, dest, false, Link::Local);
            self.tx.respond(now, id, code, data, &mut self.outputs);
        } else {
            fx.transmits.push((dest, data));
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn forward(
        &mut self,
        now: Millis,
        source: SocketAddr,
        msg: &Message<'_>,
        hash: u32,
        targets: &[Target],
        (pop_route, record_route): (Option<(usize, usize)>, bool),
        fx: &mut Effects,
    ) {
        let method = msg.method();
        let stateful = self.cfg.stateful && method != Method::Ack;
        let server = if stateful {
            let dest = response_dest(msg.top_via(), source);
            let ctx = ProxyContext {
                invite: method == Method::Invite,
                ..Default::default()
            };
            let id = self
                .tx
                .create_server(msg, dest, false, Link::Proxied(Box::new(ctx)));
            if method == Method::Invite {
                let mut out = Vec::with_capacity(msg.as_bytes().len() / 2);
                build::response(msg, 100, "Trying", None, SERVER.as_bytes(), b"", &mut out);
                self.tx
                    .respond(now, id, 100, Bytes::from(out), &mut self.outputs);
            }
            Some(id)
        } else {
            None
        };
        // A stateless proxy sends one copy only (RFC 3261 §16.11 forbids forking).
        let targets = if stateful { targets } else { &targets[..1] };
        for target in targets {
            let branch = if stateful {
                self.counter += 1;
                branch::stateful(self.worker, hash, self.counter)
            } else {
                branch::stateless(self.worker, hash, msg)
            };
            let mut out = Vec::new();
            {
                let mut rw = Rewriter::new(msg, &mut self.splice);
                rw.stamp_top_via(source);
                rw.push_via("UDP", &self.via_host, &branch);
                rw.decrement_max_forwards();
                if let Some((start, end)) = pop_route {
                    let field = *msg
                        .headers()
                        .iter()
                        .find(|h| h.line_start as usize == start)
                        .expect("route field recorded from this message");
                    rw.remove_first_value(&field, end);
                }
                if record_route {
                    rw.push_record_route(&self.record_route_uri);
                }
                if let Some(ruri) = &target.request_uri {
                    rw.set_request_uri(ruri.as_bytes());
                }
                rw.finish(&mut out);
            }
            inc(&self.stats.forwarded_requests);
            let data = Bytes::from(out);
            match server {
                Some(sid) => {
                    let link = Link::Branch {
                        server: sid,
                        done: false,
                        cancel_sent: false,
                    };
                    let cid = self.tx.create_client(
                        now,
                        data,
                        branch.as_bytes(),
                        msg.method_raw(),
                        target.dest,
                        false,
                        link,
                        &mut self.outputs,
                    );
                    if let Some(Link::Proxied(ctx)) = self.tx.user_mut(sid) {
                        ctx.branches.push(cid);
                        ctx.pending += 1;
                    }
                }
                None => fx.transmits.push((target.dest, data)),
            }
        }
    }

    fn on_cancel(&mut self, now: Millis, source: SocketAddr, msg: &Message<'_>, fx: &mut Effects) {
        let Some(invite) = self.tx.find_cancelled(msg) else {
            self.answer(
                now,
                source,
                msg,
                481,
                "Call/Transaction Does Not Exist",
                "",
                fx,
            );
            return;
        };
        self.answer(now, source, msg, 200, "OK", "", fx);
        match self.tx.user_mut(invite) {
            Some(Link::Proxied(ctx)) => {
                ctx.cancelled = true;
                let branches = ctx.branches.clone();
                for b in branches {
                    self.cancel_branch(now, b);
                }
            }
            Some(Link::Local) | None => {}
            Some(_) => {}
        }
    }

    /// Sends CANCEL down a branch that has had a provisional response; a branch still in
    /// Calling gets its CANCEL when its first provisional arrives (RFC 3261 §9.1).
    fn cancel_branch(&mut self, now: Millis, branch_id: TxId) {
        if self.tx.state(branch_id) != Some(State::Proceeding)
            || self.tx.kind(branch_id) != Some(Kind::ClientInvite)
        {
            return;
        }
        let Some(Link::Branch {
            cancel_sent, done, ..
        }) = self.tx.user_mut(branch_id)
        else {
            return;
        };
        if *cancel_sent || *done {
            return;
        }
        *cancel_sent = true;
        let Some(request) = self.tx.request(branch_id).cloned() else {
            return;
        };
        let Some(dest) = self.tx.dest(branch_id) else {
            return;
        };
        self.send_cancel(now, &request, dest);
    }

    /// Sends a CANCEL for a request we forwarded, in a client transaction of its own.
    fn send_cancel(&mut self, now: Millis, request: &[u8], dest: SocketAddr) {
        let Ok(req) = Message::parse(request) else {
            return;
        };
        let mut out = Vec::with_capacity(256);
        build::cancel_for(&req, &mut out);
        let branch = req.top_via().branch.unwrap_or_default().to_vec();
        self.tx.create_client(
            now,
            Bytes::from(out),
            &branch,
            b"CANCEL",
            dest,
            false,
            Link::Cancel,
            &mut self.outputs,
        );
    }

    fn on_response(&mut self, now: Millis, msg: &Message<'_>, fx: &mut Effects) {
        if !self.cfg.stateful {
            self.forward_response_by_via(msg, fx);
            return;
        }
        match self.tx.recv_response(now, msg, &mut self.outputs) {
            ResponseMatch::Deliver(cid) => self.on_branch_response(now, cid, msg),
            ResponseMatch::Absorbed => inc(&self.stats.retransmissions_absorbed),
            ResponseMatch::Unmatched => {
                // A 2xx retransmission after the transaction ended still goes upstream (§16.7).
                let code = msg.status().unwrap_or(0);
                if (200..300).contains(&code) && msg.method() == Method::Invite {
                    self.forward_response_by_via(msg, fx);
                } else {
                    inc(&self.stats.stray_responses);
                }
            }
        }
    }

    /// Stateless response forwarding: pop our Via, send to the next one.
    fn forward_response_by_via(&mut self, msg: &Message<'_>, fx: &mut Effects) {
        let top = msg.top_via();
        if !top.branch.is_some_and(|b| b.starts_with(branch::MAGIC))
            || !self.is_local_addr(top.host, top.port.unwrap_or(5060))
        {
            inc(&self.stats.stray_responses);
            return;
        }
        let Some(dest) = msg
            .second_via()
            .and_then(Result::ok)
            .as_ref()
            .and_then(via_dest)
        else {
            inc(&self.stats.stray_responses);
            return;
        };
        let mut out = Vec::new();
        let mut rw = Rewriter::new(msg, &mut self.splice);
        rw.pop_via();
        rw.finish(&mut out);
        inc(&self.stats.forwarded_responses);
        fx.transmits.push((dest, Bytes::from(out)));
    }

    fn on_branch_response(&mut self, now: Millis, cid: TxId, msg: &Message<'_>) {
        let code = msg.status().unwrap_or(0);
        let server = match self.tx.user_mut(cid) {
            Some(Link::Branch { server, done, .. }) => {
                let server = *server;
                if code >= 200 && !*done {
                    *done = true;
                    if let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) {
                        ctx.pending = ctx.pending.saturating_sub(1);
                    }
                }
                server
            }
            _ => return, // responses to our CANCELs end here
        };
        let (cancelled, final_sent) = match self.tx.user(server) {
            Some(Link::Proxied(ctx)) => (ctx.cancelled, ctx.final_sent),
            _ => return,
        };
        if code < 200 {
            if cancelled {
                self.cancel_branch(now, cid);
            }
            if code == 100 || final_sent {
                return;
            }
        }
        let mut out = Vec::with_capacity(msg.as_bytes().len());
        {
            let mut rw = Rewriter::new(msg, &mut self.splice);
            rw.pop_via();
            rw.finish(&mut out);
        }
        let data = Bytes::from(out);
        inc(&self.stats.forwarded_responses);
        match code {
            100..=199 => {
                self.tx.respond(now, server, code, data, &mut self.outputs);
            }
            200..=299 => {
                // The first 2xx and any later ones go upstream (the server transaction is in
                // Accepted); other INVITE branches are cancelled.
                self.tx.respond(now, server, code, data, &mut self.outputs);
                if let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) {
                    ctx.final_sent = true;
                }
                self.cancel_branches(now, server);
            }
            _ => {
                self.offer_final(server, code, data);
                if code >= 600 {
                    self.cancel_branches(now, server);
                }
                self.send_best_if_done(now, server, code >= 600);
            }
        }
    }

    /// Keeps a non-2xx final response if it beats the best so far (§16.7 step 6).
    fn offer_final(&mut self, server: TxId, code: u16, data: Bytes) {
        if let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) {
            if ctx
                .best
                .as_ref()
                .is_none_or(|(best, _)| response_rank(code) < response_rank(*best))
            {
                ctx.best = Some((code, data));
            }
        }
    }

    /// Marks a context cancelled and sends CANCEL down its INVITE branches.
    fn cancel_branches(&mut self, now: Millis, server: TxId) {
        let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) else {
            return;
        };
        ctx.cancelled = true;
        if ctx.invite {
            let branches = ctx.branches.clone();
            for b in branches {
                self.cancel_branch(now, b);
            }
        }
    }

    /// Sends the best final response once every branch has one (or at once for a 6xx).
    fn send_best_if_done(&mut self, now: Millis, server: TxId, force: bool) {
        let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) else {
            return;
        };
        if ctx.final_sent || (ctx.pending > 0 && !force) {
            return;
        }
        let Some((code, data)) = ctx.best.take() else {
            return;
        };
        ctx.final_sent = true;
        self.tx.respond(now, server, code, data, &mut self.outputs);
    }

    /// A branch timed out (timer B or F): it counts as a 408 from that branch.
    fn on_branch_timeout(&mut self, now: Millis, link: Link, request: &Bytes) {
        inc(&self.stats.branch_timeouts);
        let Link::Branch {
            server,
            done: false,
            ..
        } = link
        else {
            return;
        };
        let Ok(req) = Message::parse(request) else {
            return;
        };
        let mut resp = Vec::new();
        build::response(
            &req,
            408,
            "Request Timeout",
            Some(&local_tag(&req)),
            SERVER.as_bytes(),
            b"",
            &mut resp,
        );
        let Ok(resp_msg) = Message::parse(&resp) else {
            return;
        };
        let mut out = Vec::new();
        let mut rw = Rewriter::new(&resp_msg, &mut self.splice);
        rw.pop_via();
        rw.finish(&mut out);
        if let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) {
            ctx.pending = ctx.pending.saturating_sub(1);
        }
        self.offer_final(server, 408, Bytes::from(out));
        self.send_best_if_done(now, server, false);
    }

    fn drain_outputs(&mut self, now: Millis, fx: &mut Effects) {
        while !self.outputs.is_empty() {
            let outputs = std::mem::take(&mut self.outputs);
            for o in outputs {
                match o {
                    Output::Transmit { dest, data } => fx.transmits.push((dest, data)),
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
                            self.on_branch_timeout(now, user, &message);
                        }
                    }
                    Output::Terminated { .. } => {}
                }
            }
        }
    }
}

/// 420 for a request requiring extensions (Require to a UAS, Proxy-Require to a proxy): sipsec
/// supports none yet, so every option listed is unsupported.
fn bad_extension(msg: &Message<'_>, header: HeaderName) -> Option<Decision> {
    let options = msg.header(header).map(|h| msg.value(h))?;
    Some(Decision::Respond {
        code: 420,
        reason: "Bad Extension",
        headers: format!("Unsupported: {}\r\n", String::from_utf8_lossy(options)),
    })
}

/// Orders final responses for §16.7 step 6: 6xx first, then the lowest class; within a class
/// the first received wins (equal rank is not better).
fn response_rank(code: u16) -> u16 {
    match code {
        600..=699 => 0,
        _ => code / 100,
    }
}

/// A deterministic To tag for responses generated here: a retransmitted request gets the
/// same tag, even from a stateless server (RFC 3261 §16.11).
fn local_tag(msg: &Message<'_>) -> String {
    let from_tag = msg.from().ok().and_then(|f| f.tag()).unwrap_or_default();
    let h = branch::fnv1a(&[
        msg.call_id(),
        from_tag,
        msg.top_via().branch.unwrap_or_default(),
    ]);
    format!("sS{h:012x}")
}

/// Builds an error response to a request the parser refused, copying the raw Via, From, To,
/// Call-ID and CSeq lines. Returns false (nothing to send) for responses, ACKs, or when any
/// of those headers is missing.
fn salvage_response(data: &[u8], code: u16, reason: &str, out: &mut Vec<u8>) -> bool {
    let mut lines = data
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let Some(first) = lines.next() else {
        return false;
    };
    if first.len() >= 4 && first[..4].eq_ignore_ascii_case(b"SIP/") || first.starts_with(b"ACK ") {
        return false;
    }
    let mut wanted: [Option<&[u8]>; 4] = [None; 4];
    let mut vias: SmallVec<[&[u8]; 4]> = SmallVec::new();
    for line in lines {
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let name = sip_core::message::scan::trim(&line[..colon]);
        let slot = match HeaderName::from_bytes(name) {
            HeaderName::Via => {
                vias.push(line);
                continue;
            }
            HeaderName::From => 0,
            HeaderName::To => 1,
            HeaderName::CallId => 2,
            HeaderName::CSeq => 3,
            _ => continue,
        };
        wanted[slot].get_or_insert(line);
    }
    if vias.is_empty() || wanted.iter().any(Option::is_none) {
        return false;
    }
    let reason: String = reason.chars().filter(|c| !c.is_control()).collect();
    let _ = std::io::Write::write_fmt(out, format_args!("SIP/2.0 {code} {reason}\r\n"));
    for line in vias.iter().copied().chain(wanted.iter().flatten().copied()) {
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(SERVER.as_bytes());
    out.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    true
}
