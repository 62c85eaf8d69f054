//! Probing configured routes with OPTIONS (`[routing] probe_interval_s`), as Kamailio's
//! dispatcher pings its destinations. Worker 0 asks every destination of the default and
//! per-domain routes once an interval; one that does not answer within `failover_timeout_ms`
//! (or answers 503) is marked down — held down in every worker, so calls skip it while another
//! destination is up — until a probe is answered again, when it is marked up. Names are probed
//! at the addresses of the worker's cached answer (and looked up when there is none).

use super::*;
use crate::config::Next;

/// When worker 0 probes next.
#[derive(Debug, Default)]
pub(super) struct Prober {
    next_at: Millis,
    sent: u64,
}

impl Engine {
    /// When probing next has work (worker 0 only, when probing is on).
    pub(super) fn probe_next(&self) -> Option<Millis> {
        (self.worker == 0 && self.cfg.routing.probe_interval_s > 0).then_some(self.prober.next_at)
    }

    /// Sends the probes due at `now`.
    pub(super) fn probe_due(&mut self, now: Millis, fx: &mut Effects) {
        if self.probe_next().is_none_or(|at| at > now) {
            return;
        }
        self.prober.next_at = now + self.cfg.routing.probe_interval_s * 1000;
        let cfg = self.cfg.clone();
        let routing = &cfg.routing;
        let routes = routing
            .default_routes
            .iter()
            .chain(routing.domain_routes.iter().map(|(_, r)| r));
        let mut peers: SmallVec<[Peer; 4]> = SmallVec::new();
        for route in routes {
            match &route.next {
                Next::Addr(p) => peers.push(*p),
                Next::Name(q) => match self.locator.cached_peers(q) {
                    Some(found) => peers.extend(found),
                    None => self.locator.ask(q.clone(), &self.stats),
                },
            }
        }
        peers.sort_by_key(|p| (p.transport, p.addr));
        peers.dedup();
        for peer in peers {
            self.probe_send(now, peer, &cfg);
        }
        self.locate_take_lookups(fx);
    }

    fn probe_send(&mut self, now: Millis, peer: Peer, cfg: &Config) {
        let Some(side) = self.proxy_side(peer) else {
            return;
        };
        let s = &self.sides[side];
        self.prober.sent += 1;
        let n = self.prober.sent;
        let branch = branch::stateful(self.worker, 0, n);
        let host = hostport(peer.addr);
        let request = format!(
            "OPTIONS sip:{host}{param} SIP/2.0\r\nVia: SIP/2.0/{via} {us};branch={branch}\r\n\
             Max-Forwards: 70\r\nFrom: <sip:sipsec@{domain}>;tag=probe{n:x}\r\n\
             To: <sip:{host}>\r\nCall-ID: probe-{n:x}-{epoch:x}@{domain}\r\n\
             CSeq: 1 OPTIONS\r\n{server}Content-Length: 0\r\n\r\n",
            param = peer.transport.uri_param(),
            via = peer.transport.via_token(),
            us = s.via_host,
            domain = cfg.domains[0],
            epoch = self.epoch_unix_ms,
            server = cfg.server_line.replace("Server:", "User-Agent:"),
        );
        let dest = s.send_to(peer);
        inc(&self.stats.probes);
        let id = self.tx.create_client(
            now,
            Bytes::from(request),
            branch.as_bytes(),
            b"OPTIONS",
            dest,
            dest.transport.reliable(),
            Link::Probe,
            &mut self.outputs,
        );
        self.tx
            .expect_response_within(now, id, cfg.routing.failover_timeout_ms);
    }

    /// A probe of `peer` was answered (`up`) or not: it is marked up (no longer held down) or
    /// down (held down until marked up), here and, through `locate_tell_holds`, in every other worker.
    pub(super) fn probe_result(&mut self, now: Millis, peer: Peer, up: bool) {
        let peer = Peer::new(peer.transport, peer.addr);
        if !up {
            inc(&self.stats.probe_failures);
        }
        let was_down = self.locate_held_down(now, &peer);
        // Up and not held down, or down and held down already: nothing to do.
        if up != was_down {
            return;
        }
        if up {
            tracing::info!("next hop {peer} is up (it answered OPTIONS)");
            self.locator.hold_until(peer, 0, true);
        } else {
            tracing::warn!("next hop {peer} is down (OPTIONS unanswered); calls go elsewhere");
            self.locator.hold_until(peer, Millis::MAX, true);
        }
    }
}
