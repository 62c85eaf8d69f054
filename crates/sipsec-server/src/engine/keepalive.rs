//! NAT keep-alives: pings that keep open the NAT mappings of UDP phones reached where their
//! REGISTER came from (nathelper's `natping_interval`), and drop the bindings that stop
//! answering.
//!
//! Each such binding is pinged by one worker — the one that took its REGISTER: the kernel
//! hands a phone's datagrams (its NAT's address and port, to ours) to the same worker's
//! socket every time, so the answers to that worker's pings come back to it, with no
//! hand-over (a binding loaded from the store goes to a worker by a hash of its AOR and
//! Contact) — every `[nat] ping_interval_ms`, at a phase of its own (a hash of the same) so a hundred thousand bindings make an even trickle, not a burst — in
//! steps of `TICK_MS`: the pings due in one step leave together, one wake-up and one send
//! batch for all of them, and their answers come back together (a wake-up costs more than a
//! ping; at 4,000 pings a second, waking for each cost ten times what the pings did). Pings
//! sit on a timing wheel: a tick touches only the bindings due, never the table. A ping is
//! an OPTIONS request sent without a transaction (no retransmissions: the next ping is the
//! retry) whose branch names the binding's slot here, so its answer — any response — is
//! matched in O(1); or, with `ping = "crlf"`, a CRLF datagram nobody answers. A binding
//! none of whose pings nor REGISTERs was answered for `ping_timeout_ms` is removed like an
//! expired one, everywhere, and counted. A ping consults nothing but its own entry: the
//! entry follows every change to its binding (refreshed, removed here or elsewhere, no
//! longer needing pings) as the change is applied, and knows when the binding expires — at
//! 4,000 pings a second, a look-up in a location table of 100,000 AORs per ping cost as
//! much as the rest of the engine's share of a ping.

use super::{branch, Effects, Engine};
use crate::config::NatPing;
use crate::location::{Binding, BindingChange};
use crate::stats::inc;
use bytes::Bytes;
use sip_core::message::Message;
use sip_core::timer::{Millis, TimerHandle, TimerWheel};
use sipsec_transport::net::transport::{Peer, Transport};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::sync::Arc;

/// The step ping times are rounded up to (see the module doc).
const TICK_MS: Millis = 100;

/// `t` rounded up to the next step.
fn on_tick(t: Millis) -> Millis {
    t.div_ceil(TICK_MS) * TICK_MS
}

/// Who made a binding change, for [`Engine::keepalive_note`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum By {
    /// A REGISTER this worker took.
    Here,
    /// Another worker.
    Elsewhere,
    /// The store, at start.
    Store,
}

/// One binding this worker pings.
struct Pinged {
    aor: Arc<str>,
    contact: Arc<str>,
    to: Peer,
    /// When a ping (or a REGISTER) was last answered.
    answered: Millis,
    /// When the binding expires (Unix ms), unless refreshed first.
    expires_at: u64,
    timer: TimerHandle,
    /// When its next ping is due.
    due: Millis,
    /// Which ping this is, so the answer to an old one still counts but a stale slot's does
    /// not.
    generation: u32,
}

/// The bindings this worker pings, and when.
#[derive(Default)]
pub(super) struct KeepAlive {
    slots: Vec<Option<Pinged>>,
    free: Vec<u32>,
    /// The slots of each AOR's pinged bindings.
    by_aor: HashMap<Arc<str>, SmallVec<[u32; 1]>>,
    wheel: Option<TimerWheel<u32>>,
    fired: Vec<u32>,
}

impl KeepAlive {
    /// How many bindings are pinged here.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The slot pinging `aor`'s binding of `contact`, if one is.
    fn find(&self, aor: &str, contact: &str) -> Option<u32> {
        self.by_aor.get(aor)?.iter().copied().find(|&slot| {
            self.slots[slot as usize]
                .as_ref()
                .is_some_and(|p| *p.contact == *contact)
        })
    }

    pub(super) fn next_deadline(&self) -> Option<Millis> {
        self.wheel.as_ref()?.next_deadline()
    }
}

/// Whether `b` is a binding whose NAT mapping the server keeps open: reached over UDP where
/// its REGISTER came from, and not an RFC 5626 flow (whose client sends its own keep-alives).
fn needs_pings(b: &Binding) -> bool {
    b.target.flow && b.target.transport == Transport::Udp && b.outbound.is_none()
}

impl Engine {
    /// A binding changed — by a REGISTER this worker took (`By::Here`), another worker's
    /// (`By::Elsewhere`), or loaded from the store (`By::Store`): this worker starts pinging
    /// it if it needs pings and is the one to, refreshes what it knows of it, or stops
    /// (removed, no longer needing pings, or another worker's now).
    pub(super) fn keepalive_note(&mut self, now: Millis, change: &BindingChange, by: By) {
        let (aor, binding) = match change {
            BindingChange::Upsert { aor, binding } => (aor, binding),
            BindingChange::Remove { aor, contact } => {
                if let Some(slot) = self.keepalive.find(aor, contact) {
                    self.keepalive_forget(slot);
                }
                return;
            }
            BindingChange::RemoveAll { aor } => {
                for slot in self
                    .keepalive
                    .by_aor
                    .get(&**aor)
                    .cloned()
                    .unwrap_or_default()
                {
                    self.keepalive_forget(slot);
                }
                return;
            }
        };
        if binding.outbound.is_some() {
            // An RFC 5626 flow: never pinged, and not the binding a pinged entry is about.
            return;
        }
        let existing = self.keepalive.find(aor, &binding.contact);
        let hash = branch::fnv1a(&[aor.as_bytes(), binding.contact.as_bytes()]);
        let mine = match by {
            By::Here => true,
            By::Elsewhere => false,
            By::Store => hash as usize % self.cfg.workers == self.worker,
        };
        // Another cluster node's binding is pinged by that node.
        if self.cfg.nat.ping == NatPing::Off
            || !needs_pings(binding)
            || !mine
            || binding.node.is_some()
        {
            if let Some(slot) = existing {
                self.keepalive_forget(slot);
            }
            return;
        }
        let ka = &mut self.keepalive;
        if let Some(slot) = existing {
            // A refresh: it answered; it keeps its phase, and goes where it now is.
            if let Some(p) = ka.slots[slot as usize].as_mut() {
                p.answered = now;
                p.to = binding.target;
                p.expires_at = binding.expires_at;
            }
            return;
        }
        let wheel = ka.wheel.get_or_insert_with(|| TimerWheel::new(now));
        let phase = (hash >> 32) % self.cfg.nat.ping_interval_ms;
        let slot = ka.free.pop().unwrap_or_else(|| {
            ka.slots.push(None);
            (ka.slots.len() - 1) as u32
        });
        let due = on_tick(now + 1 + phase);
        let timer = wheel.insert(due, slot);
        let aor = self
            .location
            .aor(aor)
            .cloned()
            .unwrap_or_else(|| aor.clone());
        ka.slots[slot as usize] = Some(Pinged {
            aor: aor.clone(),
            contact: binding.contact.clone(),
            to: binding.target,
            answered: now,
            expires_at: binding.expires_at,
            timer,
            due,
            generation: 0,
        });
        ka.by_aor.entry(aor).or_default().push(slot);
    }

    /// Sends the pings due, drops the bindings silent too long.
    pub(super) fn keepalive_due(&mut self, now: Millis, fx: &mut Effects) {
        let Some(wheel) = self.keepalive.wheel.as_mut() else {
            return;
        };
        let mut fired = std::mem::take(&mut self.keepalive.fired);
        wheel.advance(now, &mut fired);
        let (interval, timeout) = (self.cfg.nat.ping_interval_ms, self.cfg.nat.ping_timeout_ms);
        let unix = self.unix_ms(now);
        for slot in fired.drain(..) {
            let Some(p) = self.keepalive.slots[slot as usize].as_ref() else {
                continue;
            };
            // Every change to the binding reached its entry (`keepalive_note`) but expiry.
            let current = unix < p.expires_at;
            let silent = self.cfg.nat.ping == NatPing::Options
                && timeout > 0
                && now.saturating_sub(p.answered) >= timeout;
            if !current || silent || self.cfg.nat.ping == NatPing::Off {
                let p = self.keepalive_forget(slot);
                if current && silent {
                    inc(&self.stats.nat_ping_drops);
                    if self.log.allow(now) {
                        tracing::info!(
                            "dropping {} -> {}: its NAT keep-alives went unanswered",
                            p.aor,
                            p.contact
                        );
                    }
                    let change = BindingChange::Remove {
                        aor: p.aor,
                        contact: p.contact,
                    };
                    self.location.apply(&change);
                    self.durable.note_sent(1);
                    fx.changes.push(Arc::new(change));
                }
                continue;
            }
            let ping = self.keepalive_ping(slot);
            let wheel = self
                .keepalive
                .wheel
                .as_mut()
                .expect("pings are on the wheel");
            if let Some(p) = self.keepalive.slots[slot as usize].as_mut() {
                p.due = on_tick((p.due + interval).max(now + 1));
                p.timer = wheel.insert(p.due, slot);
                inc(&self.stats.nat_pings);
                fx.transmits.push((p.to, ping));
            }
        }
        self.keepalive.fired = fired;
    }

    /// The ping for `slot`: an OPTIONS whose branch names the slot, or a CRLF.
    fn keepalive_ping(&mut self, slot: u32) -> Bytes {
        if self.cfg.nat.ping == NatPing::Crlf {
            return Bytes::from_static(b"\r\n\r\n");
        }
        let worker = self.worker;
        let to = self.keepalive.slots[slot as usize]
            .as_ref()
            .expect("a live slot")
            .to;
        // Our Via as the proxy writes it toward that peer: the side of its transport and family.
        let side = self.proxy_side(to);
        let p = self.keepalive.slots[slot as usize]
            .as_mut()
            .expect("a live slot");
        p.generation = p.generation.wrapping_add(1);
        let via = side
            .map_or("invalid", |i| &self.sides[i].via_host)
            .as_bytes();
        let contact = p.contact.as_bytes();
        // Written piece by piece: `format!` took a seventh of a ping's CPU.
        let mut out = Vec::with_capacity(200 + 2 * contact.len() + 3 * via.len());
        out.extend_from_slice(b"OPTIONS ");
        out.extend_from_slice(contact);
        out.extend_from_slice(b" SIP/2.0\r\nVia: SIP/2.0/UDP ");
        out.extend_from_slice(via);
        out.extend_from_slice(b";branch=");
        let at = out.len();
        branch::keepalive(worker, slot, p.generation, &mut out);
        let branch = at..out.len();
        out.extend_from_slice(b"\r\nMax-Forwards: 70\r\nFrom: <sip:keepalive@");
        out.extend_from_slice(via);
        out.extend_from_slice(b">;tag=");
        out.extend_from_within(branch.clone());
        out.extend_from_slice(b"\r\nTo: <");
        out.extend_from_slice(contact);
        out.extend_from_slice(b">\r\nCall-ID: ");
        out.extend_from_within(branch);
        out.push(b'@');
        out.extend_from_slice(via);
        out.extend_from_slice(b"\r\nCSeq: ");
        out.extend_from_slice(itoa::Buffer::new().format(p.generation).as_bytes());
        out.extend_from_slice(b" OPTIONS\r\nContent-Length: 0\r\n\r\n");
        Bytes::from(out)
    }

    /// Whether `msg` (a response) answers one of our pings: if so, the binding is alive.
    pub(super) fn keepalive_answered(&mut self, now: Millis, msg: &Message<'_>) -> bool {
        let Some((slot, generation)) = msg.top_via().branch.and_then(branch::keepalive_slot) else {
            return false;
        };
        if let Some(Some(p)) = self.keepalive.slots.get_mut(slot as usize) {
            // This ping or the one before (an answer slower than the interval).
            if generation == p.generation || generation.wrapping_add(1) == p.generation {
                p.answered = now;
            }
        }
        true
    }

    /// Stops pinging `slot`, returning what it pinged.
    fn keepalive_forget(&mut self, slot: u32) -> Pinged {
        let ka = &mut self.keepalive;
        let p = ka.slots[slot as usize].take().expect("a live slot");
        if let Some(wheel) = ka.wheel.as_mut() {
            wheel.cancel(p.timer);
        }
        if let Some(list) = ka.by_aor.get_mut(&p.aor) {
            list.retain(|s| *s != slot);
            if list.is_empty() {
                ka.by_aor.remove(&p.aor);
            }
        }
        ka.free.push(slot);
        p
    }
}
