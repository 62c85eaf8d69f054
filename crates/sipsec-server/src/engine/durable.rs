//! Durable registration (`[registrar] durable = true`): a REGISTER's 200 OK waits until the
//! store has committed every binding change this worker sent before it.
//!
//! [`Durable`] numbers the worker's changes as they are handed out ([`Effects::changes`], in
//! order); the store reports back how many of them it has committed
//! ([`Engine::handle_saved`], which the driver calls for [`Mail::Saved`](super::Mail::Saved)).
//! A 200 is held with the number it waits for and released in order; the store commits
//! whatever queued while its last commit ran, so a burst of registrations shares one commit
//! (group commit) and waits one commit time, not one each. While held, a stateful server's
//! transaction absorbs the client's retransmissions. If the database has not confirmed within
//! [`DURABLE_WAIT_MS`] the REGISTER is answered 500 with Retry-After instead: the client must
//! not believe a binding saved that is not (it still works from memory, and is written when
//! the database recovers).

use super::reply::{Answer, Reply};
use super::{Effects, Engine};
use bytes::Bytes;
use sip_core::message::Message;
use sip_core::timer::Millis;
use std::collections::VecDeque;

/// How long a 200 OK waits for the database before the REGISTER is answered 500: well inside
/// the client's 32 s transaction timeout, so the client hears why.
pub(crate) const DURABLE_WAIT_MS: Millis = 5_000;

/// The worker's binding changes handed to the store, how many it has committed, and the
/// answers waiting for it.
#[derive(Debug, Default)]
pub(super) struct Durable {
    sent: u64,
    saved: u64,
    /// Oldest first.
    held: VecDeque<Held>,
}

/// A REGISTER answer waiting for the store.
#[derive(Debug)]
struct Held {
    /// Released once the store has committed this many of our changes.
    ticket: u64,
    deadline: Millis,
    ok: Reply,
    /// The REGISTER, to answer 500 from if the database does not confirm in time.
    request: Bytes,
}

impl Durable {
    /// Counts binding changes handed to the store (they leave in this order).
    pub(super) fn note_sent(&mut self, n: usize) {
        self.sent += n as u64;
    }

    /// The store has committed the first `count` changes sent.
    fn commit(&mut self, count: u64) {
        self.saved = self.saved.max(count);
    }

    /// Holds `ok`, the 200 to `request`, until the store has committed every change sent so
    /// far; gives it back when nothing is uncommitted (it goes now).
    fn hold(&mut self, now: Millis, ok: Reply, request: &Message<'_>) -> Option<Reply> {
        if self.saved >= self.sent {
            return Some(ok);
        }
        self.held.push_back(Held {
            ticket: self.sent,
            deadline: now + DURABLE_WAIT_MS,
            ok,
            request: Bytes::copy_from_slice(request.as_bytes()),
        });
        None
    }

    /// The next held answer whose changes the store has committed.
    fn next_saved(&mut self) -> Option<Reply> {
        let saved = self.saved;
        let front = self.held.front().is_some_and(|h| h.ticket <= saved);
        front.then(|| self.held.pop_front().expect("front checked").ok)
    }

    /// The next held answer whose wait ended by `now`.
    fn next_expired(&mut self, now: Millis) -> Option<Held> {
        let front = self.held.front().is_some_and(|h| h.deadline <= now);
        front.then(|| self.held.pop_front().expect("front checked"))
    }

    /// When the oldest held answer gives up waiting.
    pub(super) fn next_deadline(&self) -> Option<Millis> {
        self.held.front().map(|h| h.deadline)
    }
}

impl Engine {
    /// Sends `ok`, a REGISTER's 200 OK, now if nothing this worker sent is still
    /// uncommitted, or holds it until the store says so.
    pub(super) fn durable_hold(
        &mut self,
        now: Millis,
        ok: Reply,
        msg: &Message<'_>,
        fx: &mut Effects,
    ) {
        if let Some(ok) = self.durable.hold(now, ok, msg) {
            self.reply_send(now, ok, fx);
        }
    }

    /// The store has committed the first `count` binding changes this worker sent: the 200s
    /// waiting for them go out.
    pub(super) fn durable_saved(&mut self, now: Millis, count: u64, fx: &mut Effects) {
        self.durable.commit(count);
        while let Some(reply) = self.durable.next_saved() {
            self.reply_send(now, reply, fx);
        }
    }

    /// Answers 500 to REGISTERs whose commit did not come in time.
    pub(super) fn durable_expire(&mut self, now: Millis, fx: &mut Effects) {
        while let Some(h) = self.durable.next_expired(now) {
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
                Answer::new(500, "Registration Not Saved").with_headers("Retry-After: 5\r\n");
            self.reply(now, h.ok.to, &msg, &failed, fx);
        }
    }
}
