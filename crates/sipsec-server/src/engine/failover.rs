//! Failover (RFC 3263 §4.3): when a branch's destination fails — a transport error, no
//! response at all within `[routing] failover_timeout_ms`, or a 503; for a flow (RFC 5626
//! §5.3: the next flow of the same instance), a 430 or 480 — the same request goes to
//! the next destination of its ordered list in a new client transaction of the same server
//! transaction, and the one that failed is held down (skipped) for a while: for a 503's
//! Retry-After, else `[routing] hold_down_s`, as Kamailio's blacklist does.
//!
//! Only a stateful proxy fails over (a stateless one keeps no state to do it with), and only
//! while the caller has not cancelled and no final response has gone upstream.

use super::proxy::BranchPlan;
use super::*;

/// What a branch needs to be sent again elsewhere.
#[derive(Debug)]
pub(super) struct Failover {
    /// The destinations left, in the order to try.
    pub rest: SmallVec<[Peer; 2]>,
    /// The request as it came from upstream.
    pub request: Bytes,
    pub plan: BranchPlan,
}

impl Engine {
    /// Branch `cid` failed with a 503 (a real one, or our own for a transport error), or a
    /// flow it went over failed (430, 480): tries the next destination. True when a new
    /// branch went out in its place.
    pub(super) fn failover_on_failure(
        &mut self,
        now: Millis,
        cid: TxId,
        msg: &Message<'_>,
    ) -> bool {
        let code = msg.status().unwrap_or(0);
        if code != 503 && !self.tx.dest(cid).is_some_and(|d| d.flow) {
            return false;
        }
        let Some(Link::Branch {
            server,
            failover,
            done: false,
            ..
        }) = self.tx.user_mut(cid)
        else {
            return false;
        };
        let server = *server;
        let Some(f) = failover.take() else {
            return false;
        };
        let Some(failed) = self.tx.dest(cid) else {
            return false;
        };
        let hold_ms = msg
            .retry_after()
            .map_or(self.cfg.routing.hold_down_ms, |s| u64::from(s) * 1000);
        if !self.failover_send(now, server, failed, hold_ms, f) {
            return false;
        }
        if let Some(Link::Branch { done, .. }) = self.tx.user_mut(cid) {
            *done = true;
        }
        if let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) {
            ctx.pending = ctx.pending.saturating_sub(1);
        }
        true
    }

    /// A branch of `server` timed out before anything answered it: tries the next
    /// destination. True when a new branch went out in its place.
    pub(super) fn failover_on_timeout(
        &mut self,
        now: Millis,
        server: TxId,
        failed: Peer,
        failover: Box<Failover>,
    ) -> bool {
        let hold_ms = self.cfg.routing.hold_down_ms;
        if !self.failover_send(now, server, failed, hold_ms, failover) {
            return false;
        }
        if let Some(Link::Proxied(ctx)) = self.tx.user_mut(server) {
            ctx.pending = ctx.pending.saturating_sub(1);
        }
        true
    }

    /// Holds `failed` down and sends the request to the next destination not held down.
    fn failover_send(
        &mut self,
        now: Millis,
        server: TxId,
        failed: Peer,
        hold_ms: u64,
        mut f: Box<Failover>,
    ) -> bool {
        // A flow is a connection, not a destination others share: nothing to hold down.
        if !failed.flow {
            self.locate_hold_down(now, failed, hold_ms);
        }
        match self.tx.user(server) {
            Some(Link::Proxied(ctx)) if !ctx.cancelled && !ctx.final_sent => {}
            _ => return false,
        }
        let Some(pos) = f.rest.iter().position(|d| !self.locate_held_down(now, d)) else {
            return false;
        };
        let dest = f.rest[pos];
        f.rest.drain(..=pos);
        let Some(side) = self.proxy_side(dest) else {
            return false;
        };
        let request = f.request.clone();
        let Ok(msg) = Message::parse(&request) else {
            return false;
        };
        inc(&self.stats.failovers);
        if self.log.allow(now) {
            tracing::info!("failing over from {failed} to {dest}");
        }
        let plan = f.plan.clone();
        let failover = (!f.rest.is_empty()).then_some(f);
        self.proxy_send_branch(now, &msg, (dest, side), &plan, failover);
        true
    }
}
