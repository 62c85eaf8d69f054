//! The auth gate: whether a request may go on — digest or Proxychain, whichever is on — and
//! the requests parked while a user's credentials are fetched, run again when they come.

use super::relay::Vouched;
use super::*;

impl Engine {
    /// Turns Proxychain on, with what the workers share.
    pub fn enable_proxychain(&mut self, shared: Arc<crate::auth::proxychain::PcShared>) {
        self.proxychain = Some(crate::auth::proxychain::PcAuthenticator::new(shared));
    }

    /// Runs the requests that waited for `user`'s credentials.
    pub(super) fn on_credential(&mut self, now: Millis, user: &str, fx: &mut Effects) {
        if let Some(auth) = self.auth.as_mut() {
            auth.claim(user);
        }
        if let Some(waiting) = self.parked.remove(user) {
            self.parked_total -= waiting.len();
            self.rerunning = true;
            for (source, data) in waiting {
                self.on_message(now, source, &data, fx);
            }
            self.rerunning = false;
        }
        if let Some(auth) = self.auth.as_mut() {
            auth.release();
        }
    }

    /// Turns digest authentication on, with what the workers share.
    pub fn enable_auth(&mut self, shared: Arc<crate::auth::digest::DigestShared>) {
        self.auth = Some(crate::auth::digest::DigestAuthenticator::new(
            Arc::new(self.cfg.auth.clone()),
            shared,
            self.worker,
        ));
    }

    /// Parks a request until `user`'s credentials come; false when too many wait
    /// already (the request is then answered 503).
    pub(super) fn park(&mut self, user: &str, source: Peer, msg: &Message<'_>) -> bool {
        let queue = self.parked.entry(user.into()).or_default();
        if queue.len() >= MAX_PARKED_PER_USER || self.parked_total >= MAX_PARKED {
            return false;
        }
        queue.push((source, Bytes::copy_from_slice(msg.as_bytes())));
        self.parked_total += 1;
        inc(&self.stats.auth_waited);
        true
    }

    /// Applies digest or Proxychain authentication: who vouches for the request (see
    /// [`relay`](super::relay)), or None when it was answered (challenged or refused) or
    /// parked to wait for the authority instead.
    pub(super) fn authenticated(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        fx: &mut Effects,
    ) -> Option<Vouched> {
        use crate::auth::{Verdict, Why};
        let now_ms = self.unix_ms(now);
        let ip = source.addr.ip();
        // Unchallenged: a trusted source is vouched for, a method not challenged is not.
        let unchallenged = |trusted: bool| Some(if trusted { Vouched::Yes } else { Vouched::No });
        let verdict = if let Some(pc) = self.proxychain.as_mut() {
            if pc.exempt(msg, ip) {
                return unchallenged(pc.trusts(ip));
            }
            inc(&self.stats.proxychain_checks);
            let v = pc.verify(msg, now_ms);
            add(&self.stats.credential_fetches, pc.fetches.len());
            fx.fetches.append(&mut pc.fetches);
            v
        } else if let Some(auth) = self.auth.as_mut() {
            if auth.exempt(msg, ip) {
                return unchallenged(auth.trusts(ip));
            }
            inc(&self.stats.digest_checks);
            let v = auth.verify(msg, ip, now_ms);
            add(&self.stats.credential_fetches, auth.fetches.len());
            fx.fetches.append(&mut auth.fetches);
            v
        } else {
            return Some(Vouched::Yes);
        };
        let verdict = match verdict {
            Verdict::Wait { user } if !self.rerunning && self.park(&user, source, msg) => {
                return None;
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
            inc(&self.stats.auth_passed);
            return Some(Vouched::Yes);
        };
        let s = &self.stats;
        inc(match why {
            Why::NoCredentials => &s.auth_challenged,
            Why::Failed => &s.auth_failed,
            Why::Stale => &s.auth_stale,
            Why::Replay => &s.auth_replays,
            Why::Raced => &s.auth_races,
            Why::IdentityMismatch => &s.auth_identity_mismatches,
            Why::Throttled => &s.auth_throttled,
            Why::Malformed => &s.auth_malformed,
            Why::Unavailable => &s.auth_unavailable,
        });
        if matches!(
            why,
            Why::Failed | Why::IdentityMismatch | Why::Replay | Why::Throttled
        ) && self.auth_log.allow(now)
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
        self.answer(now, source, msg, code, reason, &headers, fx);
        None
    }
}
