//! The proxy core (RFC 3261 §16.6–16.10): forwarding a request to one or more targets, the
//! response context of a forked request (best final response, CANCEL of the other branches,
//! Timer C and branch timeouts as 408), CANCEL from upstream, and stateless response forwarding
//! by Via.

use super::failover::Failover;
use super::reply::{local_tag, Answer, ReplyTo};
use super::{branch, response_peer, Effects, Engine, Forward, Link, ProxyContext, Side, Target};
use super::{flow, relay};
use crate::stats::{add, inc};
use bytes::Bytes;
use sip_core::message::rewrite::Rewriter;
use sip_core::message::uri::unbracket;
use sip_core::message::{build, HeaderField, Message, Method, Via};
use sip_core::timer::Millis;
use sip_core::transaction::{Kind, ResponseMatch, State, TxId};
use sipsec_transport::net::transport::{Peer, Transport};
use smallvec::SmallVec;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// How every branch of one forwarded request is made: what `proxy_send_branch` needs besides the
/// request and its destination (kept by a branch's failover to make the next one).
#[derive(Debug, Clone)]
pub(super) struct BranchPlan {
    pub source: Peer,
    /// The server transaction the branches belong to (stateful).
    pub server: Option<TxId>,
    pub hash: u32,
    /// New work (announce RFC 7339 support on it).
    pub(crate) new_work: bool,
    pub request_uri: Option<Arc<str>>,
    /// This branch's share of Max-Breadth (RFC 5393).
    pub breadth: u32,
    /// Our own Routes to consume.
    pub(crate) pop_route: SmallVec<[(HeaderField, usize); 2]>,
    pub(crate) record_route: bool,
    /// The dialog token our Record-Route carries (see `relay`), with authentication on.
    pub(crate) dialog_token: Option<relay::Token>,
    /// Routes put on top (the target's RFC 3327 Path).
    pub(crate) route_set: Option<Arc<str>>,
    /// The flow token of the caller our Record-Route carries (see `flow`): a caller behind
    /// a NAT, or on a connection, is reached over it by in-dialog requests from the callee.
    pub(crate) flow_back: Option<Arc<str>>,
    /// A forwarded REGISTER's flow token, for the Path we add (see `flow`).
    pub(crate) path: Option<Arc<str>>,
    /// The Identity header we add (STIR/SHAKEN signing, see `identity`).
    pub(crate) identity: Option<Arc<str>>,
}

/// One target of a request being forwarded: the destination chosen, our side that reaches
/// it, and what is left to fail over to.
struct Chosen<'t> {
    target: &'t Target,
    dest: Peer,
    side: usize,
    rest: SmallVec<[Peer; 2]>,
}

impl Engine {
    /// Opens the server transaction of a request we proxy (and says 100 Trying to an INVITE).
    pub(super) fn proxy_open_server(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
    ) -> TxId {
        let dest = response_peer(msg.top_via(), source);
        let ctx = ProxyContext {
            invite: msg.method() == Method::Invite,
            started_us: self.clock.at(now),
            ..Default::default()
        };
        let id = self.tx.create_server(
            msg,
            dest,
            dest.transport.reliable(),
            Link::Proxied(Box::new(ctx)),
        );
        if msg.method() == Method::Invite {
            let mut out = Vec::with_capacity(msg.as_bytes().len() / 2);
            let server = self.cfg.server_line.as_bytes();
            build::response(msg, 100, "Trying", None, server, b"", &mut out);
            self.stats.traffic.local_response(100);
            self.tx
                .respond(now, id, 100, Bytes::from(out), &mut self.outputs);
        }
        id
    }

    /// Forwards a request to `targets` (in parallel, as many as Max-Breadth allows), each to
    /// the first of its destinations that can be used, the rest kept for failover. `existing`
    /// is the server transaction of a request that waited for DNS.
    pub(super) fn proxy_forward(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        (hash, new_work, existing): (u32, bool, Option<TxId>),
        forward: &Forward,
        fx: &mut Effects,
    ) {
        let Forward {
            targets,
            pop_route,
            record_route,
            identity,
        } = forward;
        let record_route = *record_route;
        let method = msg.method();
        let stateful = self.cfg.stateful && method != Method::Ack;
        let hop_control = new_work && !self.overload_hops_empty();
        // Per target: the destination chosen, its side, and what is left to fail over to.
        let mut chosen: SmallVec<[Chosen<'_>; 2]> = SmallVec::new();
        let (mut own, mut throttled, mut refused) = (false, false, false);
        for target in targets {
            // Destinations we can send to: on a transport we have, and not ourselves (a
            // contact or route pointing back here would spiral, multiplying the request at
            // each pass). Configuration decides which transports and address families we
            // have; a destination on another one is unreachable from here.
            let mut dests: SmallVec<[Peer; 2]> = SmallVec::new();
            for d in &target.dests {
                if self.routing_is_own_listener(d) {
                    own = true;
                    inc(&self.stats.loops);
                } else if self.relay_is_management_port(d.addr) {
                    // Checked here, on the addresses DNS gave, whatever named them.
                    refused = true;
                    inc(&self.stats.relay_refused);
                } else if self.proxy_side(*d).is_some() {
                    dests.push(*d);
                } else {
                    inc(&self.stats.unroutable);
                }
            }
            // Those that failed lately are skipped while another can be tried.
            if dests.len() > 1 && dests.iter().any(|d| self.locate_held_down(now, d)) {
                let before = dests.len();
                if dests.iter().any(|d| !self.locate_held_down(now, d)) {
                    dests.retain(|d| !self.locate_held_down(now, d));
                    add(&self.stats.held_down_skipped, before - dests.len());
                }
            }
            // RFC 7339/7415 as a client: next hops that asked for less get less new work;
            // the next destination is tried instead, and what all refuse is answered here.
            let pick = if hop_control {
                let pick = dests
                    .iter()
                    .position(|d| self.overload_hop_admits(now, d.addr));
                throttled |= pick.is_none() && !dests.is_empty();
                pick
            } else {
                (!dests.is_empty()).then_some(0)
            };
            if let Some(i) = pick {
                let dest = dests[i];
                let side = self
                    .proxy_side(dest)
                    .expect("kept only destinations with a side");
                let rest = if stateful {
                    dests.drain(i + 1..).collect()
                } else {
                    SmallVec::new()
                };
                chosen.push(Chosen {
                    target,
                    dest,
                    side,
                    rest,
                });
            }
        }
        if chosen.is_empty() {
            if method != Method::Ack {
                let (code, reason) = if throttled {
                    inc(&self.stats.overload_throttled);
                    (503, "Service Unavailable")
                } else if own {
                    (482, "Loop Detected")
                } else if refused {
                    (403, "Relay Forbidden")
                } else {
                    (503, "No Transport To Target")
                };
                let to = existing.map_or(ReplyTo::Sender(source), ReplyTo::Transaction);
                self.reply(now, to, msg, &Answer::new(code, reason), fx);
            }
            return;
        }
        // A stateless proxy sends one copy only (RFC 3261 §16.11 forbids forking); a stateful
        // one forks to as many targets as the request's Max-Breadth allows and divides it
        // between them (RFC 5393 §5.3), so one request cannot fan out to more than
        // `max_breadth` concurrent branches however many proxies it crosses.
        let breadth = msg
            .max_breadth()
            .and_then(Result::ok)
            .map_or(self.cfg.max_breadth, |b| b.min(self.cfg.max_breadth))
            .max(1);
        let parallel = if stateful { chosen.len() } else { 1 };
        let forks = parallel.min(breadth as usize);
        if forks < chosen.len() && stateful {
            inc(&self.stats.breadth_limited);
        }
        chosen.truncate(forks);
        let share =
            |i: usize| breadth / forks as u32 + u32::from((i as u32) < breadth % forks as u32);
        let server = match (stateful, existing) {
            (false, _) => None,
            (true, Some(id)) => {
                if let Some(Link::Proxied(ctx)) = self.tx.user_mut(id) {
                    ctx.waiting = None;
                }
                Some(id)
            }
            (true, None) => Some(self.proxy_open_server(now, source, msg)),
        };
        let dialog_token = (record_route && self.relay_restricted())
            .then(|| relay::hop_back(msg).map(|hop| relay::token(&hop)))
            .flatten();
        let flow_back = record_route
            .then(|| self.flow_of_caller(source, msg))
            .flatten();
        // A REGISTER for a registrar elsewhere: as an edge proxy, we hold the phone's flow
        // and say so in a Path (RFC 3327, RFC 5626 §5.1).
        let path = (method == Method::Register)
            .then(|| self.flow_of_registrant(source, msg))
            .flatten();
        for (i, c) in chosen.into_iter().enumerate() {
            let Chosen {
                target,
                dest,
                side,
                rest,
            } = c;
            let plan = BranchPlan {
                source,
                server,
                hash,
                new_work,
                request_uri: target.request_uri.clone(),
                breadth: share(i),
                pop_route: pop_route.iter().copied().collect(),
                record_route,
                dialog_token,
                route_set: target.route_set.clone(),
                flow_back: flow_back.clone(),
                path: path.clone(),
                identity: identity.clone(),
            };
            let failover = (!rest.is_empty()).then(|| {
                Box::new(Failover {
                    rest,
                    request: Bytes::copy_from_slice(msg.as_bytes()),
                    plan: plan.clone(),
                })
            });
            if let Some(stateless) = self.proxy_send_branch(now, msg, (dest, side), &plan, failover)
            {
                fx.transmits.push(stateless);
            }
        }
    }

    /// Sends one copy of `msg` to `dest` from our side `out_side` in a client transaction of
    /// the plan's server transaction (stateful); stateless, returns it for the caller to send.
    pub(super) fn proxy_send_branch(
        &mut self,
        now: Millis,
        msg: &Message<'_>,
        (dest, out_side): (Peer, usize),
        plan: &BranchPlan,
        failover: Option<Box<Failover>>,
    ) -> Option<(Peer, Bytes)> {
        let (source, server) = (plan.source, plan.server);
        // Only new work is announced (feedback is about new requests; its responses bring
        // it): requests inside a dialog, and their responses, stay as short as ever.
        let announce = if self.cfg.overload.announce && plan.new_work {
            sip_core::overload::ANNOUNCE
        } else {
            ""
        };
        // Between two transports, record-route twice (RFC 5658): each side of the dialog
        // reaches us over its own.
        let in_side = self.proxy_side(source).filter(|&i| i != out_side);
        let via_dest = dest;
        let dest = self.sides[out_side].send_to(dest);
        let branch = if server.is_some() {
            self.counter += 1;
            branch::stateful(self.worker, plan.hash, self.counter)
        } else {
            branch::stateless(self.worker, plan.hash, msg)
        };
        let mut out = Vec::new();
        {
            let mut rw = Rewriter::new(msg, &mut self.splice);
            let Side {
                via_host,
                record_route: rr_out,
                ..
            } = &self.sides[out_side];
            rw.stamp_top_via(source.addr, source.transport.reliable());
            rw.push_via(via_dest.transport.via_token(), via_host, &branch, announce);
            rw.decrement_max_forwards();
            rw.set_max_breadth(plan.breadth);
            for (field, end) in &plan.pop_route {
                rw.remove_first_value(field, *end);
            }
            if let Some(routes) = &plan.route_set {
                rw.push_route(routes.as_bytes());
            }
            if let Some(token) = &plan.path {
                let params: [&[u8]; 4] = [b";ob;", flow::PARAM, b"=", token.as_bytes()];
                rw.push_path(&self.sides[out_side].record_route, &params);
            }
            if plan.record_route {
                let mut token: SmallVec<[&[u8]; 8]> = SmallVec::new();
                if let Some(t) = &plan.dialog_token {
                    token.extend([b";", relay::TOKEN_PARAM, b"=", &t[..]]);
                }
                if let Some(f) = &plan.flow_back {
                    token.extend([b";", flow::PARAM, b"=", f.as_bytes()]);
                }
                let token = &token[..];
                // Inserted in this order, the downstream side's entry ends up on top.
                rw.push_record_route(rr_out, token);
                if let Some(i) = in_side {
                    rw.push_record_route(&self.sides[i].record_route, token);
                }
            }
            if let Some(ruri) = &plan.request_uri {
                rw.set_request_uri(ruri.as_bytes());
            }
            if let Some(identity) = &plan.identity {
                rw.append_header(b"Identity", identity.as_bytes());
            }
            rw.finish(&mut out);
        }
        inc(&self.stats.forwarded_requests);
        let data = Bytes::from(out);
        let Some(sid) = server else {
            return Some((dest, data));
        };
        let hurry = failover.is_some();
        let link = Link::Branch {
            server: sid,
            done: false,
            cancel_sent: false,
            failover,
        };
        let cid = self.tx.create_client(
            now,
            data,
            branch.as_bytes(),
            msg.method_raw(),
            dest,
            dest.transport.reliable(),
            link,
            &mut self.outputs,
        );
        if hurry {
            let within = self.cfg.routing.failover_timeout_ms;
            self.tx.expect_response_within(now, cid, within);
        }
        if let Some(Link::Proxied(ctx)) = self.tx.user_mut(sid) {
            ctx.branches.push(cid);
            ctx.pending += 1;
        }
        None
    }

    pub(super) fn proxy_cancel(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        fx: &mut Effects,
    ) {
        let to = ReplyTo::Sender(source);
        let Some(invite) = self.tx.find_cancelled(msg) else {
            let unknown = Answer::new(481, "Call/Transaction Does Not Exist");
            self.reply(now, to, msg, &unknown, fx);
            return;
        };
        self.reply(now, to, msg, &Answer::new(200, "OK"), fx);
        // A locally answered INVITE has no branches: cancel_branches leaves it alone.
        self.proxy_cancel_branches(now, invite);
        // One still waiting for DNS has none yet: it ends here.
        let waiting = match self.tx.user_mut(invite) {
            Some(Link::Proxied(ctx)) => ctx.waiting.take(),
            _ => None,
        };
        if let Some(request) = waiting {
            if let Ok(req) = Message::parse(&request) {
                let terminated = Answer::new(487, "Request Terminated");
                self.reply(now, ReplyTo::Transaction(invite), &req, &terminated, fx);
            }
        }
    }

    /// Sends CANCEL down a branch that has had a provisional response; a branch still in
    /// Calling gets its CANCEL when its first provisional arrives (RFC 3261 §9.1).
    pub(super) fn proxy_cancel_branch(&mut self, now: Millis, branch_id: TxId) {
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
        self.proxy_send_cancel(now, &request, dest);
    }

    /// Sends a CANCEL for a request we forwarded, in a client transaction of its own.
    pub(super) fn proxy_send_cancel(&mut self, now: Millis, request: &[u8], dest: Peer) {
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
            dest.transport.reliable(),
            Link::Cancel,
            &mut self.outputs,
        );
    }

    pub(super) fn proxy_response(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        fx: &mut Effects,
    ) {
        // A stateless proxy's only client transactions are its probes.
        if !self.cfg.stateful && self.tx.is_empty() {
            self.proxy_forward_by_via(now, source, msg, fx);
            return;
        }
        match self.tx.recv_response(now, msg, &mut self.outputs) {
            ResponseMatch::Deliver(cid) if matches!(self.tx.user(cid), Some(Link::Probe)) => {
                let code = msg.status().unwrap_or(0);
                if let (Some(dest), true) = (self.tx.dest(cid), code >= 200) {
                    self.probe_result(now, dest, code != 503);
                }
            }
            _ if !self.cfg.stateful => self.proxy_forward_by_via(now, source, msg, fx),
            ResponseMatch::Deliver(cid) => self.proxy_branch_response(now, cid, source, msg),
            ResponseMatch::Absorbed => inc(&self.stats.retransmissions_absorbed),
            ResponseMatch::Unmatched => {
                // A 2xx retransmission after the transaction ended still goes upstream (§16.7).
                let code = msg.status().unwrap_or(0);
                if (200..300).contains(&code) && msg.method() == Method::Invite {
                    self.proxy_forward_by_via(now, source, msg, fx);
                } else {
                    inc(&self.stats.stray_responses);
                }
            }
        }
    }

    /// Stateless response forwarding: pop our Via, send to the next one.
    pub(super) fn proxy_forward_by_via(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        fx: &mut Effects,
    ) {
        let top = msg.top_via();
        if !top.branch.is_some_and(|b| b.starts_with(branch::MAGIC))
            || !self.routing_is_local_addr(top.host, top.port.unwrap_or(5060))
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
        let data = self.proxy_relayed_response(now, source, msg);
        fx.transmits.push((dest, data));
    }

    pub(super) fn proxy_branch_response(
        &mut self,
        now: Millis,
        cid: TxId,
        source: Peer,
        msg: &Message<'_>,
    ) {
        let code = msg.status().unwrap_or(0);
        if self.cfg.overload.announce {
            if let Some(dest) = self.tx.dest(cid) {
                self.overload_hop_feedback(now, dest.addr, msg);
            }
        }
        if matches!(code, 503 | 430 | 480) && self.failover_on_failure(now, cid, msg) {
            return;
        }
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
                self.proxy_cancel_branch(now, cid);
            }
            if code == 100 || final_sent {
                return;
            }
        }
        let data = self.proxy_relayed_response(now, source, msg);
        match code {
            100..=199 => {
                if let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) {
                    ctx.first_response(self.clock.at(now), &self.stats);
                }
                self.tx.respond(now, server, code, data, &mut self.outputs);
            }
            200..=299 => {
                // The first 2xx and any later ones go upstream (the server transaction is in
                // Accepted); other INVITE branches are cancelled.
                self.tx.respond(now, server, code, data, &mut self.outputs);
                if let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) {
                    if !ctx.final_sent {
                        ctx.finish(self.clock.at(now), &self.stats);
                        match msg.method() {
                            Method::Invite => inc(&self.stats.traffic.dialogs_established),
                            Method::Bye => inc(&self.stats.traffic.dialogs_ended),
                            _ => {}
                        }
                    }
                }
                self.proxy_cancel_branches(now, server);
            }
            _ => {
                self.proxy_offer_final(server, code, data);
                if code >= 600 {
                    self.proxy_cancel_branches(now, server);
                }
                self.proxy_send_best_if_done(now, server, code >= 600);
            }
        }
    }

    /// A response as it goes upstream: our Via popped, feedback in the next one when that
    /// neighbour asked for it, and our Record-Route's tokens restamped — the dialog token
    /// for the hop on to the callee, and the callee's flow (`source`, where the response
    /// came from) when it must be reached over it.
    fn proxy_relayed_response(&mut self, now: Millis, source: Peer, msg: &Message<'_>) -> Bytes {
        // Sized once, by the splice, for the response as edited: a response that grows (a
        // flow token written into its Record-Route) would otherwise be copied again.
        let mut out = Vec::new();
        let feedback = self.overload_response_feedback(now, msg);
        let mut splice = std::mem::take(&mut self.splice);
        let mut rw = Rewriter::new(msg, &mut splice);
        rw.pop_via();
        if let Some((via, fb)) = &feedback {
            rw.set_overload_feedback(via, fb);
        }
        self.relay_restamp_record_route(&mut rw);
        self.flow_restamp_record_route(&mut rw, source);
        rw.finish(&mut out);
        self.splice = splice;
        inc(&self.stats.forwarded_responses);
        Bytes::from(out)
    }

    /// Keeps a non-2xx final response if it beats the best so far (§16.7 step 6).
    pub(super) fn proxy_offer_final(&mut self, server: TxId, code: u16, data: Bytes) {
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
    pub(super) fn proxy_cancel_branches(&mut self, now: Millis, server: TxId) {
        let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) else {
            return;
        };
        ctx.cancelled = true;
        if ctx.invite {
            let branches = ctx.branches.clone();
            for b in branches {
                self.proxy_cancel_branch(now, b);
            }
        }
    }

    /// Sends the best final response once every branch has one (or at once for a 6xx).
    pub(super) fn proxy_send_best_if_done(&mut self, now: Millis, server: TxId, force: bool) {
        let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) else {
            return;
        };
        if ctx.final_sent || (ctx.pending > 0 && !force) {
            return;
        }
        let Some((code, data)) = ctx.best.take() else {
            return;
        };
        ctx.finish(self.clock.at(now), &self.stats);
        self.tx.respond(now, server, code, data, &mut self.outputs);
    }

    /// A branch timed out (timer B or F, or C when `answered`): it fails over to the next
    /// destination if it has one and nothing had answered, else counts as a 408 from that
    /// branch.
    pub(super) fn proxy_branch_timeout(
        &mut self,
        now: Millis,
        link: Link,
        request: &Bytes,
        (dest, answered): (Peer, bool),
    ) {
        inc(&self.stats.branch_timeouts);
        let Link::Branch {
            server,
            done: false,
            failover,
            ..
        } = link
        else {
            return;
        };
        if let Some(f) = failover.filter(|_| !answered) {
            if self.failover_on_timeout(now, server, dest, f) {
                return;
            }
        }
        let Ok(req) = Message::parse(request) else {
            return;
        };
        let mut resp = Vec::new();
        build::response(
            &req,
            408,
            "Request Timeout",
            Some(&local_tag(&req)),
            self.cfg.server_line.as_bytes(),
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
        self.proxy_offer_final(server, 408, Bytes::from(out));
        self.proxy_send_best_if_done(now, server, false);
    }
}

/// Orders final responses for §16.7 step 6: 6xx first, then the lowest class; within a class
/// the first received wins (equal rank is not better).
pub(super) fn response_rank(code: u16) -> u16 {
    match code {
        600..=699 => 0,
        _ => code / 100,
    }
}

impl Engine {
    /// Which of our sides reaches `peer`: the same transport and address family.
    pub(super) fn proxy_side(&self, peer: Peer) -> Option<usize> {
        let v6 = peer.addr.is_ipv6();
        self.sides
            .iter()
            .position(|s| s.transport == peer.transport && s.v6 == v6)
    }
}

/// Where a response goes next when forwarded by Via (RFC 3261 §18.2.2): the received
/// address at the rport or sent-by port, over the Via's transport. For streams the driver
/// uses an open connection to that address, else opens one.
pub(super) fn via_dest(via: &Via<'_>) -> Option<Peer> {
    let transport = Transport::of_via(via)?;
    let host = via.received().unwrap_or(via.host_unbracketed());
    let ip: IpAddr = std::str::from_utf8(unbracket(host)).ok()?.parse().ok()?;
    let port = via
        .rport()
        .flatten()
        .or(via.port)
        .unwrap_or(transport.default_port());
    Some(Peer::new(transport, SocketAddr::new(ip, port)))
}
