//! Overload control: what a worker admits when it has more work than it can do, what it tells
//! neighbours that speak RFC 7339/7415, and what it does with what a next hop tells it.
//!
//! **The load signal** is the worker's busy fraction: the share of wall time it was not
//! blocked in `epoll_wait` waiting for work, measured by its driver over each
//! `[overload] interval_ms` and handed in by [`Engine::handle_load`]. It costs two clock reads per
//! loop pass, means the same for UDP, TCP and TLS, and counts the time a CPU quota holds the
//! worker off as busy (a container's limit is the capacity the worker has). But it reads 1.0
//! alike for a worker just keeping up and for one with a second of datagrams queued behind it
//! (socket buffers are 8 MB), and calls admitted behind such a queue arrive too late to count.
//! So near capacity the driver also measures queue delay — how long the oldest datagram of
//! each batch waited in the kernel, from receive timestamps it turns on only then (stamping
//! costs every datagram something) — and a queue older than `max_queue_delay_ms` counts as
//! overload in proportion to its age.
//!
//! **Two controllers on that signal**, each a share of new requests, moved every interval by
//! `(target / busy)^4` within ×0.7…×1.1 (fast down, slow up: a saturated worker cuts a fifth,
//! an idle one returns over a second), a cut waiting a few intervals after the last one for
//! the work already queued (or a neighbour's reaction) to show:
//! - `admit`, towards `target`: the share of sheddable requests this worker takes. The rest
//!   are answered 503 at once, before any transaction, authentication or location work
//!   ([`Engine::overload_shed`]), spread evenly (error diffusion, not coin flips).
//! - `send`, towards the lower `feedback_target`: what neighbours that announced `oc` are told
//!   to send (loss: refuse `1 − send` of their new requests; rate: `send` × what they sent
//!   when control began). A neighbour that honours it keeps this worker below `target`, so
//!   its requests are never shed twice; one that only pretends to (it announces `oc` and sends
//!   everything) is shed locally like any other.
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

/// The share of new requests either controller never goes below: a worker flooded even with
/// refusals still completes some calls, and learns when the flood ends.
const MIN_SHARE: f64 = 0.01;

/// Next hops whose feedback is remembered, at most; beyond, feedback from new ones is ignored
/// until old ones expire.
const MAX_HOPS: usize = 4096;

/// After cutting a share, the intervals to wait before cutting it again: the work already
/// queued (and a neighbour's reaction to feedback) takes that long to show in the busy
/// fraction, and cutting on every interval meanwhile drives the share far below what the
/// worker can take.
const LOCAL_HOLD: u64 = 2;
const FEEDBACK_HOLD: u64 = 4;

/// Neighbours counted per interval to share a rate between (RFC 7415).
const MAX_RATE_CLIENTS: usize = 256;

/// A worker's overload control state.
#[derive(Debug)]
pub(super) struct Overload {
    admit: f64,
    send: f64,
    /// Error diffusion of `admit`: refusals owed.
    owed: f64,
    /// Sheddable requests that arrived since the last update, and from how many neighbours
    /// that announced `oc`.
    arrivals: u64,
    rate_clients: Vec<SocketAddr>,
    /// Rate feedback: new requests per second one neighbour may send.
    rate: f64,
    /// When the last update ran, for the arrival rate.
    updated_at: Option<Millis>,
    /// When `admit` and `send` were last cut.
    admit_cut_at: Millis,
    send_cut_at: Millis,
    /// Feedback is written until then (as "no reduction" once `send` is back at 1).
    feedback_until: Millis,
    /// `oc-seq` of the feedback: Unix milliseconds of the update that set it.
    seq_ms: u64,
    /// What each next hop told us.
    hops: HashMap<SocketAddr, Throttle>,
}

impl Overload {
    pub(super) fn new() -> Overload {
        Overload {
            admit: 1.0,
            send: 1.0,
            owed: 0.0,
            arrivals: 0,
            rate_clients: Vec::new(),
            rate: 0.0,
            updated_at: None,
            admit_cut_at: 0,
            send_cut_at: 0,
            feedback_until: 0,
            seq_ms: 0,
            hops: HashMap::new(),
        }
    }

    /// The share of sheddable requests admitted locally.
    #[cfg(test)]
    pub(super) fn admitted_share(&self) -> f64 {
        self.admit
    }
}

/// One controller step: `share` moved towards keeping `busy` at `target`, except that a cut
/// waits `hold` since the last one (`cut_at`, updated when it cuts).
fn step(share: f64, busy: f64, target: f64, now: Millis, hold: Millis, cut_at: &mut Millis) -> f64 {
    let factor = (target / busy.max(0.01)).powi(4).clamp(0.7, 1.1);
    if factor < 1.0 {
        if *cut_at > 0 && now < *cut_at + hold {
            return share;
        }
        *cut_at = now.max(1);
    }
    (share * factor).clamp(MIN_SHARE, 1.0)
}

impl Engine {
    /// Updates the gauges and both controllers from a load measurement
    /// ([`Engine::handle_load`]).
    pub(super) fn overload_measure(&mut self, now: Millis, busy: f64, queue_delay_ms: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        // The gauges `/metrics` reads.
        let t = &self.stats.traffic;
        t.busy_ppm
            .store((busy.clamp(0.0, 1.0) * 1e6) as u64, Relaxed);
        let lingering = self.tx.lingering();
        t.transactions
            .store(self.tx.len().saturating_sub(lingering) as u64, Relaxed);
        t.transactions_lingering.store(lingering as u64, Relaxed);
        t.bindings.store(self.location.len() as u64, Relaxed);
        let cfg = &self.cfg.overload;
        let o = &mut self.overload;
        // A busy fraction cannot tell a worker just keeping up from one with a second of
        // datagrams queued behind it; past `max_queue_delay_ms` the queue says how far over
        // it is (one more per 50 ms).
        let busy = match queue_delay_ms.checked_sub(cfg.max_queue_delay_ms) {
            Some(over) if over > 0 => 1.0 + over as f64 / 50.0,
            _ => busy.clamp(0.0, 1.0),
        };
        let elapsed_s =
            o.updated_at
                .map_or(cfg.interval_ms, |t| now.saturating_sub(t).max(1)) as f64
                / 1000.0;
        o.updated_at = Some(now);
        let hold = |n: u64| n * cfg.interval_ms;
        if cfg.enabled {
            o.admit = step(
                o.admit,
                busy,
                cfg.target,
                now,
                hold(LOCAL_HOLD),
                &mut o.admit_cut_at,
            );
        }
        let was_sending = o.send < 1.0;
        let before = o.send;
        o.send = step(
            o.send,
            busy,
            cfg.feedback_target,
            now,
            hold(FEEDBACK_HOLD),
            &mut o.send_cut_at,
        );
        let clients = o.rate_clients.len().max(1) as f64;
        let arrival_rate = o.arrivals as f64 / elapsed_s / clients;
        if o.send < 1.0 {
            o.rate = if was_sending {
                (o.rate * o.send / before).max(1.0)
            } else {
                (arrival_rate * o.send).max(1.0)
            };
            o.seq_ms = self.epoch_unix_ms + now;
            o.feedback_until = now + Millis::from(cfg.validity_ms);
        }
        o.arrivals = 0;
        o.rate_clients.clear();
    }

    /// Whether a request must be shed: it is new work of a sheddable kind and local
    /// admission refuses it. Counts the arrival either way.
    fn overload_must_shed(&mut self, source: Peer, msg: &Message<'_>, to_tagged: bool) -> bool {
        if !self.overload_sheddable(msg) || self.overload_in_our_dialog(msg, to_tagged) {
            return false;
        }
        let cfg = &self.cfg.overload;
        let o = &mut self.overload;
        o.arrivals += 1;
        // Neighbours sharing a rate are counted only while feedback is given: below the
        // threshold a new request costs a counter and nothing more.
        if o.send < 1.0
            && o.rate_clients.len() < MAX_RATE_CLIENTS
            && !o.rate_clients.contains(&source.addr)
            && overload::offered(msg.top_via()).is_some()
        {
            o.rate_clients.push(source.addr);
        }
        if !cfg.enabled || o.admit >= 1.0 {
            return false;
        }
        if cfg.priority
            && cfg
                .priority_sources
                .iter()
                .any(|n| n.contains(source.addr.ip()))
            && msg.other_header(b"Resource-Priority").is_some()
        {
            return false;
        }
        o.owed += 1.0 - o.admit;
        if o.owed >= 1.0 {
            o.owed -= 1.0;
            true
        } else {
            false
        }
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
        if !self.overload_must_shed(source, msg, to_tagged) {
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
        let active = o.send < 1.0;
        let value = match algorithm {
            Algorithm::Loss if active => ((1.0 - o.send) * 100.0).round() as u32,
            Algorithm::Rate if active => o.rate.round() as u32,
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
        if now >= self.overload.feedback_until || !self.cfg.overload.feedback {
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
