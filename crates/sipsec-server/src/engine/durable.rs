//! Durable registration (`[registrar] durable = true`): a REGISTER's 200 OK waits until the
//! store has committed every binding change this worker sent before it.
//!
//! The engine numbers its own changes as it hands them out ([`Effects::changes`], in order);
//! the store reports back how many of them it has committed ([`Engine::on_saved`], which the
//! driver calls for [`Mail::Saved`](super::Mail::Saved)). A 200 is held with the number it
//! waits for and released in order; the store commits whatever queued while its last commit
//! ran, so a burst of registrations shares one commit (group commit) and waits one commit
//! time, not one each. While held, a stateful server's transaction absorbs the client's
//! retransmissions. If the database has not confirmed within [`DURABLE_WAIT_MS`] the
//! REGISTER is answered 500 with Retry-After instead: the client must not believe a binding
//! saved that is not (it still works from memory, and is written when the database
//! recovers).

use super::{response_peer, Effects, Engine, LocalReply};
use bytes::Bytes;
use sip_core::message::Message;
use sip_core::timer::Millis;

/// How long a 200 OK waits for the database before the REGISTER is answered 500: well inside
/// the client's 32 s transaction timeout, so the client hears why.
pub(crate) const DURABLE_WAIT_MS: Millis = 5_000;

/// A REGISTER answer waiting for the store.
#[derive(Debug)]
pub(super) struct Held {
    /// Released once the store has committed this many of our changes.
    ticket: u64,
    deadline: Millis,
    to: LocalReply,
    ok: Bytes,
    /// The REGISTER, to answer 500 from if the database does not confirm in time.
    request: Bytes,
}

impl Engine {
    /// Counts binding changes handed to the store (they leave in this order).
    pub(super) fn note_changes_sent(&mut self, n: usize) {
        self.changes_sent += n as u64;
    }

    /// Answers a REGISTER 200 OK with `headers` now if nothing this worker sent is still
    /// uncommitted, or holds the answer until the store says so.
    pub(super) fn answer_durably(
        &mut self,
        now: Millis,
        source: sipsec_transport::net::transport::Peer,
        msg: &Message<'_>,
        headers: &str,
        fx: &mut Effects,
    ) {
        let ok = self.local_response(msg, 200, "OK", headers);
        crate::stats::inc(&self.stats.local_responses);
        let dest = response_peer(msg.top_via(), source);
        let to = self.local_reply(msg, dest);
        if self.changes_saved >= self.changes_sent {
            self.release(now, to, 200, ok, fx);
            return;
        }
        self.held.push_back(Held {
            ticket: self.changes_sent,
            deadline: now + DURABLE_WAIT_MS,
            to,
            ok,
            request: Bytes::copy_from_slice(msg.as_bytes()),
        });
    }

    /// The store has committed the first `count` binding changes this worker sent: the 200s
    /// waiting for them go out.
    pub fn on_saved(&mut self, now: Millis, count: u64, fx: &mut Effects) {
        self.changes_saved = self.changes_saved.max(count);
        while self
            .held
            .front()
            .is_some_and(|h| h.ticket <= self.changes_saved)
        {
            let h = self.held.pop_front().expect("front checked");
            self.release(now, h.to, 200, h.ok, fx);
        }
        self.drain_outputs(now, fx);
    }

    /// Answers 500 to REGISTERs whose commit did not come in time.
    pub(super) fn expire_held(&mut self, now: Millis, fx: &mut Effects) {
        while self.held.front().is_some_and(|h| h.deadline <= now) {
            let h = self.held.pop_front().expect("front checked");
            crate::stats::inc(&self.stats.registrations_unsaved);
            if self.log.allow(now) {
                tracing::error!(
                    "the database did not confirm a registration within {} ms: answering 500",
                    DURABLE_WAIT_MS
                );
            }
            let Ok(msg) = Message::parse(&h.request) else {
                continue; // It parsed when it came; it cannot fail now.
            };
            let failed =
                self.local_response(&msg, 500, "Registration Not Saved", "Retry-After: 5\r\n");
            self.release(now, h.to, 500, failed, fx);
        }
    }

    /// When the oldest held answer gives up waiting.
    pub(super) fn next_held_deadline(&self) -> Option<Millis> {
        self.held.front().map(|h| h.deadline)
    }
}
