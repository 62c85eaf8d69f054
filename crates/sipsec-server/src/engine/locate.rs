//! Locating next hops (RFC 3263) inside a worker: its copy of DNS answers, the requests
//! waiting for one, and the targets held down after failing (RFC 3263 §4.3, like Kamailio's
//! blacklist).
//!
//! A next hop named by an address costs nothing here. One named by a host name is looked up
//! in this worker's cache (no lock, no allocation); a miss parks the request — behind a server
//! transaction that absorbs its retransmissions and answers CANCEL — and asks the driver for
//! the answer (`Effects::lookups`), which comes back as [`Mail::Resolved`]. An expired answer
//! is still used while a fresh one is fetched, so a TTL never stalls calls.

use super::*;
use crate::config::Route;
use crate::dns::{Failure, Hop, Query, Resolution};
use crate::stats::Stats;
use std::collections::HashMap;

/// Answers kept per worker; beyond, the expired ones are dropped, then everything.
const MAX_CACHED: usize = 10_000;
/// Requests waiting for DNS per worker; beyond, they are answered 503 at once.
const MAX_WAITING: usize = 10_000;
/// Held-down targets remembered per worker.
const MAX_HELD_DOWN: usize = 4096;
/// How many times one request may wait for DNS (it waits again only when an answer it needed
/// expired in the meantime, or it needs several names).
const MAX_WAITS: u8 = 4;

/// A cached answer.
#[derive(Debug)]
struct Cached {
    resolution: Arc<Resolution>,
    expires: Millis,
    /// A fresh answer has been asked for.
    refreshing: bool,
}

/// A request waiting for DNS.
#[derive(Debug)]
pub(super) struct Waiter {
    /// Its server transaction (stateful proxying), which will carry the answer.
    pub server: Option<TxId>,
    pub source: Peer,
    pub data: Bytes,
    pub waits: u8,
    /// Who vouched for it at the gate, for the relay rule when it is routed again.
    pub(crate) vouched: Vouched,
}

/// The worker's location state.
#[derive(Debug, Default)]
pub(super) struct Locator {
    cache: hashbrown::HashMap<Query, Cached>,
    waiting: hashbrown::HashMap<Query, Vec<Waiter>>,
    waiting_total: usize,
    /// Targets that failed, and until when they are skipped.
    held_down: HashMap<(Transport, SocketAddr), Millis>,
    /// Names to ask DNS about, drained into `Effects::lookups`.
    lookups: Vec<Query>,
    /// Holds set here since the last input ended, for the other workers (until when; 0: the
    /// destination is up again).
    told: Vec<(Peer, Millis)>,
    rng: u64,
}

/// What locating a set of next hops gave.
pub(super) enum Located {
    /// Peers in the order to try them (possibly none: see `failure`).
    Peers {
        peers: SmallVec<[Peer; 2]>,
        failure: Option<Failure>,
    },
    /// Names not known yet: the request must wait.
    Wait(SmallVec<[Query; 1]>),
}

impl Locator {
    /// A fresh 32-bit random number (xorshift64*; the weighting needs spread, not secrecy).
    fn random(&mut self) -> u32 {
        if self.rng == 0 {
            self.rng = 0x9e37_79b9_7f4a_7c15;
        }
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }

    /// Locates `hops` in order into one list of peers.
    pub(super) fn locate<'a>(
        &mut self,
        now: Millis,
        hops: impl Iterator<Item = Hop<'a>>,
        stats: &Stats,
    ) -> Located {
        let mut peers = SmallVec::new();
        let mut missing: SmallVec<[Query; 1]> = SmallVec::new();
        let mut failure = None;
        for hop in hops {
            match hop {
                Hop::Addr(p) => peers.push(p),
                Hop::Name(key) => {
                    let Some(cached) = self.cache.get_mut(&key) else {
                        missing.push(key.to_query());
                        continue;
                    };
                    inc(&stats.dns_cache_hits);
                    if cached.expires <= now && !cached.refreshing {
                        cached.refreshing = true;
                        inc(&stats.dns_lookups);
                        self.lookups.push(key.to_query());
                    }
                    let resolution = cached.resolution.clone();
                    match resolution.error {
                        Some(e) => {
                            failure = Some(match (failure, e) {
                                (Some(Failure::Unavailable), _) => Failure::Unavailable,
                                (_, e) => e,
                            });
                        }
                        None => resolution.order(|| self.random(), &mut peers),
                    }
                }
            }
        }
        if missing.is_empty() {
            Located::Peers { peers, failure }
        } else {
            Located::Wait(missing)
        }
    }

    /// The configured routes in the order to try them: by priority, then RFC 2782 weighting.
    pub(super) fn order_routes<'r>(&mut self, routes: &'r [Route]) -> SmallVec<[&'r Route; 4]> {
        let mut out = SmallVec::new();
        if routes.len() == 1 {
            out.push(&routes[0]);
            return out;
        }
        crate::dns::weighted_order(
            routes.len(),
            |i| u32::from(routes[i].priority),
            |i| routes[i].weight,
            || self.random(),
            |i| out.push(&routes[i]),
        );
        out
    }

    /// The configured routes in the order a dispatcher tries them for a request whose key
    /// (the AOR of a REGISTER, else the Call-ID) is `key`: by priority, then by rendezvous
    /// hashing (highest random weight: each route scored by a hash of the key and its URI),
    /// so a key always meets the same route while it is up, and when a route goes down only
    /// its keys move — each to its own next choice, spread over the rest — where a hash
    /// modulo the number of routes would move almost every key.
    pub(super) fn order_routes_by_key<'r>(
        routes: &'r [Route],
        key: &[u8],
    ) -> SmallVec<[&'r Route; 4]> {
        let score = |r: &Route| {
            // FNV-1a spreads short keys poorly in its high bits: finished with splitmix64's
            // mixer.
            crate::hash::mix64(branch::fnv1a(&[key, r.uri.as_bytes()]))
        };
        let mut out: SmallVec<[&Route; 4]> = routes.iter().collect();
        out.sort_by_cached_key(|r| (r.priority, std::cmp::Reverse(score(r))));
        out
    }

    /// The addresses of a cached answer for `q`, in no particular order.
    pub(super) fn cached_peers(&self, q: &Query) -> Option<SmallVec<[Peer; 2]>> {
        let cached = self.cache.get(q)?;
        Some(
            cached
                .resolution
                .entries
                .iter()
                .flat_map(|e| e.peers())
                .collect(),
        )
    }

    /// Asks DNS about `q` (unless a request is waiting for it already).
    pub(super) fn ask(&mut self, q: Query, stats: &Stats) {
        if !self.waiting.contains_key(&q) {
            inc(&stats.dns_lookups);
            self.lookups.push(q);
        }
    }

    /// Holds `peer` down until `until` (0: lets it be used again), as told by another worker
    /// or decided here (`tell`: to be told to the others).
    pub(super) fn hold_until(&mut self, peer: Peer, until: Millis, tell: bool) {
        let key = (peer.transport, peer.addr);
        if until == 0 {
            self.held_down.remove(&key);
        } else {
            self.held_down.insert(key, until);
        }
        if tell {
            self.told.push((peer, until));
        }
    }

    /// Drops every cached answer (a reload may have changed hosts or name servers); requests
    /// waiting for an answer keep waiting for it.
    pub(super) fn forget_answers(&mut self) {
        self.cache.clear();
        self.held_down.clear();
    }
}

impl Engine {
    /// Seeds the worker's random numbers (route and SRV weighting).
    pub(super) fn locate_seed(&mut self) {
        self.locator.rng =
            0x9e37_79b9_7f4a_7c15 ^ ((self.worker as u64 + 1) << 32) ^ self.epoch_unix_ms;
    }

    /// Parks a request until the DNS answers for `queries` come; false when too many wait
    /// (the caller answers 503).
    pub(super) fn locate_wait(&mut self, queries: SmallVec<[Query; 1]>, waiter: Waiter) -> bool {
        let loc = &mut self.locator;
        if loc.waiting_total >= MAX_WAITING || waiter.waits >= MAX_WAITS {
            return false;
        }
        inc(&self.stats.dns_waited);
        for q in &queries {
            loc.ask(q.clone(), &self.stats);
        }
        let first = queries.into_iter().next().expect("something to wait for");
        loc.waiting.entry(first).or_default().push(waiter);
        loc.waiting_total += 1;
        true
    }

    /// Names to look up, for the driver.
    pub(super) fn locate_take_lookups(&mut self, fx: &mut Effects) {
        if !self.locator.lookups.is_empty() {
            fx.lookups.append(&mut self.locator.lookups);
        }
    }

    /// An answer came: it is cached and the requests that waited for it run on.
    pub(super) fn locate_resolved(
        &mut self,
        now: Millis,
        query: Query,
        resolution: Arc<Resolution>,
        fx: &mut Effects,
    ) {
        let loc = &mut self.locator;
        if loc.cache.len() >= MAX_CACHED && !loc.cache.contains_key(&query) {
            loc.cache.retain(|_, c| c.expires > now);
            if loc.cache.len() >= MAX_CACHED {
                loc.cache.clear();
            }
        }
        let keep = match (&resolution.error, loc.cache.get(&query)) {
            // DNS did not answer this time: a stale answer beats none.
            (Some(Failure::Unavailable), Some(old)) if old.resolution.error.is_none() => {
                old.resolution.clone()
            }
            _ => resolution,
        };
        // The certificate of a TLS destination must name the domain it was located from.
        let domain: Arc<str> = query.name.clone().into();
        for e in keep
            .entries
            .iter()
            .filter(|e| e.transport == Transport::Tls)
        {
            fx.tls_names
                .extend(e.peers().map(|p| (p.addr, domain.clone())));
        }
        let ttl_ms = if keep.error == Some(Failure::Unavailable) {
            u64::from(crate::dns::resolver::UNAVAILABLE_TTL_S) * 1000
        } else {
            u64::from(keep.ttl_s) * 1000
        };
        loc.cache.insert(
            query.clone(),
            Cached {
                resolution: keep,
                expires: now + ttl_ms,
                refreshing: false,
            },
        );
        if let Some(waiters) = loc.waiting.remove(&query) {
            loc.waiting_total -= waiters.len();
            for w in waiters {
                self.locate_resume(now, w, fx);
            }
        }
    }

    /// Runs a request that waited for DNS from where it stopped: routing decides again (the
    /// answer is cached now) and the request goes on in the server transaction it waited in.
    fn locate_resume(&mut self, now: Millis, w: Waiter, fx: &mut Effects) {
        let Ok(msg) = Message::parse(&w.data) else {
            return;
        };
        if let Some(id) = w.server {
            match self.tx.user(id) {
                Some(Link::Proxied(ctx)) if !ctx.cancelled && !ctx.final_sent => {}
                // Cancelled (and answered 487) or ended while it waited.
                _ => return,
            }
        }
        let Some(facts) = RequestFacts::of(&msg) else {
            return;
        };
        let resumed = Resumed {
            server: w.server,
            waits: w.waits + 1,
        };
        let how = (facts, w.vouched);
        self.route_request(now, w.source, &msg, how, Some(resumed), fx);
    }

    /// Whether `peer` failed lately and should be skipped.
    pub(super) fn locate_held_down(&self, now: Millis, peer: &Peer) -> bool {
        self.locator
            .held_down
            .get(&(peer.transport, peer.addr))
            .is_some_and(|&until| until > now)
    }

    /// Skips `peer` for `for_ms` (RFC 3263 §4.3).
    pub(super) fn locate_hold_down(&mut self, now: Millis, peer: Peer, for_ms: u64) {
        if for_ms == 0 {
            return;
        }
        let held = &mut self.locator.held_down;
        if held.len() >= MAX_HELD_DOWN {
            held.retain(|_, until| *until > now);
            if held.len() >= MAX_HELD_DOWN {
                return;
            }
        }
        inc(&self.stats.targets_held_down);
        if self.log.allow(now) {
            tracing::warn!(
                "next hop {peer} failed: skipped for {} s",
                for_ms.div_ceil(1000)
            );
        }
        let peer = Peer::new(peer.transport, peer.addr);
        self.locator.hold_until(peer, now + for_ms, true);
    }

    /// Tells the other workers the holds set here (their clocks are this one's), so none of
    /// them has to find a dead destination for itself.
    pub(super) fn locate_tell_holds(&mut self, fx: &mut Effects) {
        for (peer, until) in self.locator.told.drain(..) {
            for w in (0..self.cfg.workers).filter(|&w| w != self.worker) {
                fx.mail.push((w, Mail::HoldDown { peer, until }));
            }
        }
    }
}

/// How a request that waited for DNS comes back into routing.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resumed {
    pub server: Option<TxId>,
    pub waits: u8,
}
