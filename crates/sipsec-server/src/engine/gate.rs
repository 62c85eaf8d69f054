//! The auth gate: whether a request may go on — digest or Proxychain, whichever is on — and
//! the requests parked while a user's credentials are fetched, run again when they come.
//!
//! [`Gate`] owns the authenticator and the parked requests; the engine asks it about each
//! request ([`Engine::gate_check`]) and hands it the credentials that came
//! ([`Engine::gate_credential`]).

use super::relay::Vouched;
use super::reply::{Answer, ReplyTo};
use super::{Effects, Engine};
use crate::auth::digest::{DigestAuthenticator, DigestShared};
use crate::auth::proxychain::{PcAuthenticator, PcShared};
use crate::auth::{Verdict, Why};
use crate::config::Config;
use crate::stats::{add, inc, LogLimiter, Stats};
use bytes::Bytes;
use sip_core::message::Message;
use sip_core::timer::Millis;
use sipsec_transport::net::transport::Peer;
use std::collections::HashMap;
use std::sync::Arc;

/// Requests waiting for the authority, at most this many per user and in all: beyond, they
/// are answered 503 at once rather than held.
const MAX_PARKED_PER_USER: usize = 16;
const MAX_PARKED: usize = 10_000;

/// How often an authentication outage is logged, per worker.
const UNAVAILABLE_LOG_MS: Millis = 60_000;

/// A worker's auth gate.
pub(super) struct Gate {
    /// Digest authentication, when `[auth] scheme = "digest"`.
    digest: Option<DigestAuthenticator>,
    /// Proxychain, when `[auth] scheme = "proxychain"`.
    proxychain: Option<PcAuthenticator>,
    /// Requests waiting for a user's credentials, and how many in all.
    parked: HashMap<Arc<str>, Vec<(Peer, Bytes)>>,
    parked_total: usize,
    /// Running requests that already waited: they are not parked twice.
    rerunning: bool,
    /// When "authentication unavailable" was last logged.
    unavailable_logged: Option<Millis>,
    /// Failed authentications' log lines (what fail2ban reads), limited apart from the other
    /// warnings so that a flood of malformed messages cannot crowd them out.
    log: LogLimiter,
}

/// What the gate says of a request.
pub(super) enum Passage {
    /// It goes on, vouched for or not (see [`relay`](super::relay)).
    Pass(Vouched),
    /// It waits for its user's credentials.
    Parked,
    /// It is answered (challenged or refused).
    Refused(Answer),
}

impl Gate {
    /// A gate with authentication off (an open proxy until one is enabled).
    pub(super) fn new() -> Gate {
        Gate {
            digest: None,
            proxychain: None,
            parked: HashMap::new(),
            parked_total: 0,
            rerunning: false,
            unavailable_logged: None,
            log: LogLimiter::new(10),
        }
    }

    /// Turns digest authentication on.
    pub(super) fn enable_digest(&mut self, cfg: &Config, shared: Arc<DigestShared>, worker: usize) {
        let cfg = Arc::new(cfg.auth.clone());
        self.digest = Some(DigestAuthenticator::new(cfg, shared, worker));
    }

    /// Turns Proxychain on.
    pub(super) fn enable_proxychain(&mut self, shared: Arc<PcShared>) {
        self.proxychain = Some(PcAuthenticator::new(shared));
    }

    /// Takes a reloaded configuration's methods and trusted sources.
    pub(super) fn reload(&mut self, cfg: &Config) {
        if let Some(digest) = self.digest.as_mut() {
            digest.set_config(Arc::new(cfg.auth.clone()));
        }
        if let Some(pc) = self.proxychain.as_mut() {
            pc.set_scope(cfg.auth.scope.clone());
        }
    }

    /// Whether authentication is on (and so the relay rule holds).
    pub(super) fn is_on(&self) -> bool {
        self.digest.is_some() || self.proxychain.is_some()
    }

    /// Checks a request from `source`, at `now` (`now_ms` in Unix time); users whose
    /// credentials must be fetched go into `fetches`.
    pub(super) fn check(
        &mut self,
        (now, now_ms): (Millis, u64),
        source: Peer,
        msg: &Message<'_>,
        stats: &Stats,
        fetches: &mut Vec<(String, bool)>,
    ) -> Passage {
        let ip = source.addr.ip();
        // Unchallenged: a trusted source is vouched for, a method not challenged is not.
        let unchallenged = |trusted: bool| {
            Passage::Pass(if trusted {
                Vouched::Source
            } else {
                Vouched::No
            })
        };
        let verdict = if let Some(pc) = self.proxychain.as_mut() {
            if pc.exempt(msg, ip) {
                return unchallenged(pc.trusts(ip));
            }
            inc(&stats.proxychain_checks);
            let v = pc.verify(msg, now_ms);
            add(&stats.credential_fetches, pc.fetches.len());
            fetches.append(&mut pc.fetches);
            v
        } else if let Some(digest) = self.digest.as_mut() {
            if digest.exempt(msg, ip) {
                return unchallenged(digest.trusts(ip));
            }
            inc(&stats.digest_checks);
            let v = digest.verify(msg, ip, now_ms);
            add(&stats.credential_fetches, digest.fetches.len());
            fetches.append(&mut digest.fetches);
            v
        } else {
            return Passage::Pass(Vouched::Open);
        };
        let verdict = match verdict {
            Verdict::Wait { user } if !self.rerunning && self.park(&user, source, msg, stats) => {
                return Passage::Parked;
            }
            // Waited once already (the credentials did not come in time), or too many wait.
            Verdict::Wait { .. } => crate::auth::unavailable(),
            v => v,
        };
        let Verdict::Refuse {
            code,
            reason,
            headers,
            why,
        } = verdict
        else {
            inc(&stats.auth_passed);
            return Passage::Pass(Vouched::User);
        };
        inc(match why {
            Why::NoCredentials => &stats.auth_challenged,
            Why::Failed => &stats.auth_failed,
            Why::Stale => &stats.auth_stale,
            Why::Replay => &stats.auth_replays,
            Why::Raced => &stats.auth_races,
            Why::IdentityMismatch => &stats.auth_identity_mismatches,
            Why::Throttled => &stats.auth_throttled,
            Why::Malformed => &stats.auth_malformed,
            Why::Unavailable => &stats.auth_unavailable,
        });
        if matches!(
            why,
            Why::Failed | Why::IdentityMismatch | Why::Replay | Why::Throttled
        ) && self.log.allow(now)
        {
            // The line fail2ban matches (contrib/fail2ban): only our own words before the
            // address, the user last and quoted with its escapes, so what a client sends as its
            // name cannot pass for another address.
            let user = crate::auth::named_user(msg);
            tracing::warn!(
                target: crate::auth::LOG_TARGET,
                source_ip = %ip,
                source = %source,
                user = user.as_deref().unwrap_or(""),
                "authentication failed: {why:?} ({code} {reason})"
            );
        }
        if why == Why::Unavailable
            && self
                .unavailable_logged
                .is_none_or(|at| now >= at + UNAVAILABLE_LOG_MS)
        {
            // Once a minute per worker: an outage is one event, not one per request.
            self.unavailable_logged = Some(now);
            if self.proxychain.is_some() {
                tracing::error!(
                    "no chain for a user and the Proxychain authority is not answering: \
                     answering 503 with Retry-After (next notice in a minute)"
                );
            } else {
                tracing::error!(
                    "user database unavailable: answering 503 with Retry-After (next notice \
                     in a minute)"
                );
            }
        }
        Passage::Refused(Answer::new(code, reason).with_headers(headers))
    }

    /// Parks a request until `user`'s credentials come; false when too many wait already
    /// (the request is then answered 503).
    fn park(&mut self, user: &str, source: Peer, msg: &Message<'_>, stats: &Stats) -> bool {
        let queue = self.parked.entry(user.into()).or_default();
        if queue.len() >= MAX_PARKED_PER_USER || self.parked_total >= MAX_PARKED {
            return false;
        }
        queue.push((source, Bytes::copy_from_slice(msg.as_bytes())));
        self.parked_total += 1;
        inc(&stats.auth_waited);
        true
    }

    /// `user`'s credentials came (or their fetch gave up): the requests that waited for them,
    /// to run again before [`Gate::rerun_done`]; while they run, none is parked again.
    fn unpark(&mut self, user: &str) -> Vec<(Peer, Bytes)> {
        if let Some(digest) = self.digest.as_mut() {
            digest.claim(user);
        }
        let waiting = self.parked.remove(user).unwrap_or_default();
        self.parked_total -= waiting.len();
        self.rerunning = true;
        waiting
    }

    /// The requests [`Gate::unpark`] gave have run.
    fn rerun_done(&mut self) {
        self.rerunning = false;
        if let Some(digest) = self.digest.as_mut() {
            digest.release();
        }
    }
}

impl Engine {
    /// Applies the gate to a request: who vouches for it (see [`relay`](super::relay)), or
    /// None when it was answered (challenged or refused) or parked to wait for its
    /// credentials instead.
    pub(super) fn gate_check(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        fx: &mut Effects,
    ) -> Option<Vouched> {
        let when = (now, self.unix_ms(now));
        match self
            .gate
            .check(when, source, msg, &self.stats, &mut fx.fetches)
        {
            Passage::Pass(vouched) => Some(vouched),
            Passage::Parked => None,
            Passage::Refused(answer) => {
                self.reply(now, ReplyTo::Sender(source), msg, &answer, fx);
                None
            }
        }
    }

    /// Runs the requests that waited for `user`'s credentials.
    pub(super) fn gate_credential(&mut self, now: Millis, user: &str, fx: &mut Effects) {
        for (source, data) in self.gate.unpark(user) {
            self.handle_message(now, source, &data, fx);
        }
        self.gate.rerun_done();
    }
}
