//! Overload control: what a worker admits when it has more work than it can do, what it tells
//! neighbours that speak RFC 7339/7415, and what it does with what a next hop tells it.
//!
//! **The load signal** (`serve::busy`, handed in by [`Engine::handle_load`] every
//! `[overload] interval_ms`) is the worker's busy fraction, or its CPU time against the share
//! of a cgroup quota it may use where that is more; and, near capacity, the queue delay of
//! datagrams and stream reads in the kernel: the least over the interval (a queue that stood
//! throughout) and the last.
//!
//! **The controller** (`control`) turns that into an estimate of the worker's capacity in new
//! requests per second, then:
//! - local admission: once the worker saturates, new sheddable requests beyond that
//!   capacity (a token bucket) are answered 503 at once, before any transaction,
//!   authentication or location work ([`Engine::overload_shed`]); the capacity is shared
//!   between source addresses max-min fairly (`fair`), so a source flooding far beyond its
//!   share is refused first;
//! - feedback: at the same time, neighbours that announced `oc` are told to send their
//!   share of the capacity, with a margin (`feedback_target / target`) — as a loss
//!   (`1 − budget / what they offer`) or a rate (RFC 7415). A neighbour that honours it keeps
//!   this worker below `target`, and its requests are not shed locally while the `oc`
//!   neighbours stay within their budget (with a slack), so they are never shed twice; one
//!   that only pretends to (it announces `oc` and sends everything) is shed locally like any
//!   other beyond that slack.
//!
//! What is never shed: responses, ACK, CANCEL, BYE, a request inside a dialog this server
//! is in, a retransmission of a request already in progress (its transaction absorbs it
//! first), and, with `priority`, requests carrying `Resource-Priority` (RFC 4412) from
//! `priority_sources`. Shedding runs before authentication, so neither exemption may rest on
//! what a sender merely writes: a To tag alone is not a dialog (a flood of To-tagged INVITEs
//! aimed elsewhere would pass), only a To tag with our own Route on top, which is what the
//! route set we recorded makes every in-dialog request through us carry
//! ([`Engine::overload_in_our_dialog`]); and `Resource-Priority` counts only from networks the
//! operator names (none by default), never from whoever claims it. A re-INVITE from a UA
//! that sends through us without a Route (Record-Route off, no preloaded route) is therefore
//! new work and may be shed; a 503 to a re-INVITE leaves its dialog intact (RFC 3261 §14.1).
//!
//! **As a client** (forwarding to a next hop), with `announce` the Via we add carries
//! [`sip_core::overload::ANNOUNCE`]; feedback in our Via of a response updates that hop's
//! [`Throttle`], and new requests it refuses are answered 503 here instead of being sent.

use super::reply::{Answer, ReplyTo};
use super::{response_peer, Effects, Engine};
use crate::stats::inc;
use bytes::Bytes;
use sip_core::message::rewrite::Rewriter;
use sip_core::message::{Message, Via};
use sip_core::overload::{self, Algorithm, Feedback, Throttle};
use sip_core::timer::Millis;
use sipsec_transport::net::transport::Peer;
use std::collections::HashMap;
use std::net::SocketAddr;

mod control;
mod fair;

use control::{Bucket, Controller, Interval, Targets};
use fair::Shares;

/// Next hops whose feedback is remembered, at most; beyond, feedback from new ones is ignored
/// until old ones expire.
const MAX_HOPS: usize = 4096;

/// Neighbours counted per interval to share a rate between (RFC 7415).
const MAX_RATE_CLIENTS: usize = 256;

/// One interval's load, as the driver measured it (`serve::busy`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Measured {
    /// The worker's busy fraction, or its CPU against its share of a quota if more.
    pub(crate) load: f64,
    /// Its CPU time as a share of what it may use.
    pub(crate) cpu: f64,
    /// The least time what was read from the longer queue (datagrams' or connections') had
    /// waited in the kernel over the interval, milliseconds: a standing queue (`serve::busy`).
    /// None when not measured.
    pub(crate) standing_delay_ms: Option<u64>,
    /// The connections' queue's alone (`serve::busy::Load::streams_standing_delay`).
    pub(crate) streams_standing_delay_ms: Option<u64>,
    /// How long what the interval's last pass read had waited, milliseconds (0 when not
    /// measured, or that pass found the queues empty).
    pub(crate) queue_delay_ms: u64,
}

/// A worker's overload control state.
#[derive(Debug)]
pub(super) struct Overload {
    control: Controller,
    /// Each source's share of the capacity while local admission is on.
    shares: Shares,
    /// The fixed limit's bucket (`[overload] max_rate`).
    fixed: Bucket,
    /// This interval's counts, for the controller.
    interval: Interval,
    /// Neighbours that announced `oc` this interval (only while feedback is given).
    rate_clients: Vec<SocketAddr>,
    /// When the last update ran, for the interval's length.
    updated_at: Option<Millis>,
    /// Feedback is written until then (as "no reduction" once control is released).
    feedback_until: Millis,
    /// `oc-seq` of the feedback: Unix milliseconds of the update that set it.
    seq_ms: u64,
    /// What each next hop told us.
    hops: HashMap<SocketAddr, Throttle>,
}

impl Overload {
    pub(super) fn new() -> Overload {
        Overload {
            control: Controller::default(),
            shares: Shares::default(),
            fixed: Bucket::default(),
            interval: Interval::default(),
            rate_clients: Vec::new(),
            updated_at: None,
            feedback_until: 0,
            seq_ms: 0,
            hops: HashMap::new(),
        }
    }

    /// The controller (for tests that read its state).
    #[cfg(test)]
    pub(super) fn control(&self) -> &Controller {
        &self.control
    }
}

impl Engine {
    /// Updates the gauges and the controller from a load measurement
    /// ([`Engine::handle_load`]).
    pub(super) fn overload_measure(&mut self, now: Millis, m: Measured) {
        use std::sync::atomic::Ordering::Relaxed;
        // The gauges `/metrics` reads.
        let t = &self.stats.traffic;
        t.busy_ppm
            .store((m.load.clamp(0.0, 1.0) * 1e6) as u64, Relaxed);
        let lingering = self.tx.lingering();
        t.transactions
            .store(self.tx.len().saturating_sub(lingering) as u64, Relaxed);
        t.transactions_lingering.store(lingering as u64, Relaxed);
        t.bindings.store(self.location.len() as u64, Relaxed);
        let cfg = &self.cfg.overload;
        let o = &mut self.overload;
        let elapsed_ms = o
            .updated_at
            .map_or(cfg.interval_ms, |t| now.saturating_sub(t).max(1));
        o.updated_at = Some(now);
        let iv = Interval {
            elapsed_s: elapsed_ms as f64 / 1000.0,
            load: m.load,
            cpu: m.cpu,
            standing_delay_ms: m.standing_delay_ms,
            streams_standing_delay_ms: m.streams_standing_delay_ms,
            queue_delay_ms: m.queue_delay_ms,
            oc_clients: o.rate_clients.len(),
            ..std::mem::take(&mut o.interval)
        };
        o.rate_clients.clear();
        o.control.update(
            &iv,
            &Targets {
                target: cfg.target,
                feedback_target: cfg.feedback_target,
                max_delay_ms: cfg.max_queue_delay_ms,
            },
        );
        o.shares
            .update(iv.elapsed_s, o.control.cap(), o.control.local_on());
        tracing::debug!(
            load = iv.load,
            standing_ms = ?iv.standing_delay_ms,
            queue_ms = iv.queue_delay_ms,
            arrived = iv.arrived,
            admitted = iv.admitted,
            oc_arrived = iv.oc_arrived,
            capacity = o.control.capacity(),
            cap = o.control.cap(),
            local = o.control.local_on(),
            loss = o.control.loss(),
            "overload interval"
        );
        if o.control.feedback_on() {
            o.seq_ms = self.epoch_unix_ms + now;
            o.feedback_until = now + Millis::from(cfg.validity_ms);
        }
        t.capacity.store(o.control.capacity() as u64, Relaxed);
        let r = o.control.refusal_cost().unwrap_or(0.0);
        t.refusal_cost_ppm.store((r * 1e6) as u64, Relaxed);
    }

    /// Whether a request must be shed: it is new work of a sheddable kind and local
    /// admission refuses it. Counts the arrival either way.
    fn overload_must_shed(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        to_tagged: bool,
    ) -> bool {
        if !self.overload_sheddable(msg) || self.overload_in_our_dialog(msg, to_tagged) {
            return false;
        }
        let cfg = &self.cfg.overload;
        let o = &mut self.overload;
        o.interval.arrived += 1;
        // Below half load a new request costs two counters and nothing more; the neighbours
        // that speak RFC 7339 are told apart from there on (`Controller::watching`).
        let oc = o.control.watching() && overload::offered(msg.top_via()).is_some();
        if oc {
            o.interval.oc_arrived += 1;
            if o.rate_clients.len() < MAX_RATE_CLIENTS && !o.rate_clients.contains(&source.addr) {
                o.rate_clients.push(source.addr);
            }
        }
        let priority = cfg.priority
            && cfg
                .priority_sources
                .iter()
                .any(|n| n.contains(source.addr.ip()))
            && msg.other_header(b"Resource-Priority").is_some();
        let workers = self.cfg.workers.max(1) as f64;
        // The fixed limit first, then, while admission is on, a source's share; the
        // controller's bucket decides the rest.
        let in_interval_s = o
            .updated_at
            .map_or(0.0, |t| now.saturating_sub(t) as f64 / 1000.0);
        let shed = !priority
            && (cfg
                .max_rate
                .is_some_and(|rate| !o.fixed.admit(now, rate / workers))
                || (cfg.enabled
                    && if !o.control.local_on() {
                        !o.control.admit(now)
                    } else {
                        // The source's arrival is counted for its share either way.
                        let share = o.shares.admit(source.addr.ip());
                        if oc
                            && o.control
                                .oc_within_budget(o.interval.oc_admitted, in_interval_s)
                        {
                            o.control.charge(now);
                            false
                        } else {
                            !share.unwrap_or_else(|| o.control.admit(now))
                        }
                    }));
        if !shed {
            o.interval.admitted += 1;
            if oc {
                o.interval.oc_admitted += 1;
            }
        }
        shed
    }

    /// Whether a request is inside a dialog this server is in: it has a To tag (`to_tagged`)
    /// and its top Route is ours — the Record-Route we added when the dialog was made, or
    /// the preloaded route of a UA that sends everything through us. A To tag alone proves
    /// nothing: anyone can write one.
    pub(super) fn overload_in_our_dialog(&self, msg: &Message<'_>, to_tagged: bool) -> bool {
        if !to_tagged {
            return false;
        }
        let mut top_is_ours = None;
        // A malformed Route is not ours; routing answers it 400 later.
        let _ = self.routing_walk_routes(msg, |_, _, ours| {
            top_is_ours.get_or_insert(ours);
        });
        top_is_ours == Some(true)
    }

    /// Whether this request's method is one overload control may refuse (out of dialog).
    pub(super) fn overload_sheddable(&self, msg: &Message<'_>) -> bool {
        let method = msg.method_raw();
        self.cfg
            .overload
            .methods
            .iter()
            .any(|m| m.as_bytes() == method)
    }

    /// Local admission control: answers a new request 503 at once, with no transaction, when
    /// the worker is over its target. Returns whether it did.
    pub(super) fn overload_shed(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        to_tagged: bool,
        fx: &mut Effects,
    ) -> bool {
        if !self.overload_must_shed(now, source, msg, to_tagged) {
            return false;
        }
        inc(&self.stats.overload_shed);
        let oc_client = overload::offered(msg.top_via()).is_some();
        // A neighbour that speaks RFC 7339 learns what to send from the feedback; a
        // Retry-After would make it stop sending altogether (RFC 7339 §5.10).
        let retry = self.cfg.overload.retry_after_s;
        let mut busy = Answer::new(503, "Service Unavailable");
        if retry > 0 && !oc_client {
            busy = busy.with_headers(format!("Retry-After: {retry}\r\n"));
        }
        let to = ReplyTo::Peer(response_peer(msg.top_via(), source));
        self.reply(now, to, msg, &busy, fx);
        true
    }

    /// The feedback for a neighbour whose Via is `via`, if it announced `oc` and feedback is
    /// being given now.
    pub(super) fn overload_feedback_for(&self, now: Millis, via: &Via<'_>) -> Option<Feedback> {
        let cfg = &self.cfg.overload;
        let o = &self.overload;
        if !cfg.feedback || now >= o.feedback_until {
            return None;
        }
        let algorithm = overload::offered(via)?.choose(cfg.algorithm)?;
        let active = o.control.feedback_on();
        let value = match algorithm {
            Algorithm::Loss if active => (o.control.loss() * 100.0).round() as u32,
            Algorithm::Rate if active => o.control.rate().round().max(1.0) as u32,
            _ => 0,
        };
        Some(Feedback {
            algorithm,
            value,
            // Control over: a rate client is released by validity 0, a loss client by 0%.
            validity_ms: if !active && algorithm == Algorithm::Rate {
                0
            } else {
                cfg.validity_ms
            },
            seq_ms: o.seq_ms,
        })
    }

    /// A response generated here, with feedback in its top Via when the client asked for it.
    pub(super) fn overload_add_feedback(&mut self, now: Millis, data: Bytes) -> Bytes {
        if !self.overload_feedback_on(now) {
            return data;
        }
        let Ok(msg) = Message::parse(&data) else {
            return data;
        };
        let Some(fb) = self.overload_feedback_for(now, msg.top_via()) else {
            return data;
        };
        let mut out = Vec::with_capacity(data.len() + 64);
        let mut rw = Rewriter::new(&msg, &mut self.splice);
        rw.set_overload_feedback(msg.top_via(), &fb);
        rw.finish(&mut out);
        Bytes::from(out)
    }

    /// Whether feedback may have to be written into responses now (cheap test first).
    pub(super) fn overload_feedback_on(&self, now: Millis) -> bool {
        self.cfg.overload.feedback && now < self.overload.feedback_until
    }

    /// For a response about to be forwarded: the Via it goes to next (below ours) and the
    /// feedback to write there, when that neighbour asked for it and feedback is on now.
    pub(super) fn overload_response_feedback<'a>(
        &self,
        now: Millis,
        msg: &Message<'a>,
    ) -> Option<(Via<'a>, Feedback)> {
        if !self.overload_feedback_on(now) {
            return None;
        }
        let via = msg.second_via()?.ok()?;
        let fb = self.overload_feedback_for(now, &via)?;
        Some((via, fb))
    }

    /// Whether no next hop has given feedback (the forwarding path's cheap test).
    pub(super) fn overload_hops_empty(&self) -> bool {
        self.overload.hops.is_empty()
    }

    /// Client side: what the next hop `dest` said in our Via of its response.
    pub(super) fn overload_hop_feedback(
        &mut self,
        now: Millis,
        dest: SocketAddr,
        msg: &Message<'_>,
    ) {
        let Ok(fb) = Feedback::from_via(msg.top_via()) else {
            return;
        };
        let hops = &mut self.overload.hops;
        if hops.len() >= MAX_HOPS && !hops.contains_key(&dest) {
            hops.retain(|_, t| t.in_force(now).is_some());
            if hops.len() >= MAX_HOPS {
                return;
            }
        }
        hops.entry(dest).or_default().on_feedback(now, fb);
    }

    /// Client side: whether a new request may go to `dest` under the feedback it gave.
    pub(super) fn overload_hop_admits(&mut self, now: Millis, dest: SocketAddr) -> bool {
        match self.overload.hops.get_mut(&dest) {
            Some(t) => t.admit(now * 1000),
            None => true,
        }
    }
}
