//! Routing decisions: what to do with a request that is not a retransmission (RFC 3261
//! §16.3–16.5): answer it here (errors, OPTIONS, REGISTER, 405/501), redirect it, or forward it
//! to registered contacts, the next Route, the default route or its Request-URI.

use super::flow;
use super::relay::{self, Vouched};
use super::reply::Answer;
use super::{branch, Decision, Engine, Forward, Target, ALLOW};
use crate::config::Mode;
use crate::dns::{Failure, Hop};
use crate::engine::locate::{Located, Locator};
use crate::location::{Binding, Lookup};
use crate::stats::inc;
use sip_core::message::{
    HeaderField, HeaderName, Message, Method, NameAddr, ParseError, Scheme, Uri,
};
use sip_core::timer::Millis;
use sipsec_transport::net::transport::{uri_peer, Peer};
use smallvec::SmallVec;
use std::fmt::Write as _;

impl Engine {
    pub(super) fn routing_is_local_host(&self, uri: &Uri<'_>) -> bool {
        self.cfg.names.names(uri)
    }

    /// True when `host:port` is one of our listen addresses; `host` may be an IPv6 reference
    /// in brackets, as Via sent-by and URI hosts write it.
    pub(super) fn routing_is_local_addr(&self, host: &[u8], port: u16) -> bool {
        self.cfg.names.is_addr(host, port)
    }

    /// True when `peer` is one of our own listeners: sending there would hand the request
    /// back to ourselves. A listener on the unspecified address owns, at its port, every
    /// address of the host's interfaces (read at start and on reload) and the loopback ones.
    pub(super) fn routing_is_own_listener(&self, peer: &Peer) -> bool {
        let ip = peer.addr.ip();
        self.cfg.listen.iter().any(|l| {
            l.transport == peer.transport
                && l.addr.port() == peer.addr.port()
                && (l.addr.ip() == ip
                    || (l.addr.ip().is_unspecified()
                        && l.addr.is_ipv4() == peer.addr.is_ipv4()
                        && (ip.is_loopback()
                            || ip.is_unspecified()
                            || self.cfg.host_addrs.contains(&ip))))
        })
    }

    pub(super) fn routing_is_our_domain(&self, host: &[u8]) -> bool {
        self.cfg.names.is_domain(host)
    }

    /// The address-of-record key of a user at a host we serve: `user@domain`, the domain in
    /// lower case, our own IP addresses standing for the first domain.
    pub(super) fn routing_aor_key(&self, user: &[u8], host: &[u8]) -> String {
        let domain = if self.routing_is_our_domain(host) {
            host
        } else {
            self.cfg.domains[0].as_bytes()
        };
        let mut key = Vec::with_capacity(user.len() + 1 + domain.len());
        key.extend_from_slice(user);
        key.push(b'@');
        key.extend(domain.iter().map(u8::to_ascii_lowercase));
        String::from_utf8(key)
            .unwrap_or_else(|bad| String::from_utf8_lossy(bad.as_bytes()).into_owned())
    }

    /// Decides what to do with a request that is not a retransmission.
    pub(super) fn routing_decide(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        (in_dialog, vouched): (bool, Vouched),
        hash: u32,
    ) -> Decision {
        let method = msg.method();
        let uri = *msg.request_uri().expect("requests have a Request-URI");
        if msg.max_forwards() == Some(0) {
            inc(&self.stats.too_many_hops);
            return Answer::new(483, "Too Many Hops").into();
        }
        if uri.scheme == Scheme::Other {
            return Answer::new(416, "Unsupported URI Scheme").into();
        }
        if let Some(refused) = bad_extension(msg, HeaderName::ProxyRequire) {
            return refused;
        }
        match msg.max_breadth() {
            Some(Err(_)) => return Answer::new(400, "Bad Max-Breadth header").into(),
            // No branch could be given the breadth of at least 1 each must carry (RFC 5393
            // §5.3.2).
            Some(Ok(0)) if method != Method::Ack && method != Method::Cancel => {
                inc(&self.stats.breadth_limited);
                return Answer::new(440, "Max-Breadth Exceeded").into();
            }
            _ => {}
        }
        // Loop detection (RFC 3261 §16.3 step 4).
        let mut looped = false;
        let vias_ok = msg.vias(|v| {
            if v.branch.and_then(branch::carried_loop_hash) == Some(hash)
                && self.routing_is_local_addr(v.host, v.port.unwrap_or(5060))
            {
                looped = true;
            }
        });
        if vias_ok.is_err() {
            return Answer::new(400, "Bad Via header").into();
        }
        if looped {
            inc(&self.stats.loops);
            return Answer::new(482, "Loop Detected").into();
        }
        // Loose routing (§16.4): the top Routes naming us are consumed (two of them after a
        // double Record-Route between transports).
        let mut pop_route: SmallVec<[(HeaderField, usize); 2]> = SmallVec::new();
        let mut next_route: Option<Hop<'_>> = None;
        let mut next_route_uri = None;
        let mut route_error = false;
        // The dialog tokens in our Routes (see `relay`), and the flow one names (`flow`).
        let mut tokens: SmallVec<[&[u8]; 2]> = SmallVec::new();
        let mut flow_token: Option<&[u8]> = None;
        let routes = self.routing_walk_routes(msg, |field, na, ours| {
            if ours {
                match pop_route.last_mut() {
                    Some((f, end)) if f.line_start == field.line_start => *end = na.end,
                    _ => pop_route.push((*field, na.end)),
                }
                tokens.extend(na.uri.param(relay::TOKEN_PARAM).flatten());
                flow_token = na.uri.param(flow::PARAM).flatten().or(flow_token);
            } else if next_route.is_none() {
                next_route = crate::dns::hop(&na.uri);
                next_route_uri = Some(na.uri);
                route_error |= next_route.is_none();
            }
        });
        if routes.is_err() {
            return Answer::new(400, "Bad Route header").into();
        }
        // Whether the relay rule holds this request back from hops it cannot vouch for: not
        // vouched for at the gate, and no token of ours for the hop its dialog goes to.
        let restricted = vouched == Vouched::No
            && self.relay_restricted()
            && !(in_dialog && {
                let hop = next_route_uri.as_ref().unwrap_or(&uri);
                tokens.iter().any(|t| relay::vouches(t, hop))
            });
        let record_route = self.cfg.record_route
            && !in_dialog
            && matches!(
                method,
                Method::Invite | Method::Subscribe | Method::Refer | Method::Notify
            );
        if route_error {
            inc(&self.stats.unroutable);
            return Answer::new(404, "Not Found (unresolvable Route)").into();
        }
        // Our Route named a flow and nothing follows it: the phone behind it is reached
        // over it (unless this request came from it: then it goes the other way).
        if let Some(to) = flow_token.filter(|_| next_route.is_none() && !route_error) {
            if let Some(flow) = flow::parse(to) {
                if (flow.transport, flow.addr) != (source.transport, source.addr) {
                    inc(&self.stats.flow_routed);
                    return Decision::Forward(Forward {
                        targets: smallvec::smallvec![Target {
                            request_uri: None,
                            route_set: None,
                            dests: smallvec::smallvec![flow],
                        }],
                        pop_route,
                        record_route,
                        identity: None,
                    });
                }
            }
        }
        if let Some(hop) = next_route {
            if restricted {
                return self.relay_forbidden();
            }
            let located = self.locator.locate(now, std::iter::once(hop), &self.stats);
            return forward_located(located, pop_route, record_route);
        }

        let addressed_to_us = self.routing_is_local_host(&uri);
        // A dispatcher spreads new requests over its nodes (but answers an OPTIONS or the
        // like addressed to itself).
        let for_itself = addressed_to_us && uri.user.is_none() && method != Method::Register;
        if self.cfg.mode == Mode::Dispatcher && !in_dialog && !for_itself {
            let key = match method {
                Method::Register => match msg.to() {
                    Ok(to) => routing_dispatch_key(&to.uri),
                    Err(_) => return Answer::new(400, "Bad To header").into(),
                },
                _ => msg.call_id().to_vec(),
            };
            let ordered = Locator::order_routes_by_key(&self.cfg.routing.default_routes, &key);
            let hops = ordered.iter().map(|r| r.next.hop());
            let located = self.locator.locate(now, hops, &self.stats);
            inc(&self.stats.dispatched);
            return forward_located(located, pop_route, record_route);
        }
        if addressed_to_us && (uri.user.is_none() || method == Method::Register) {
            return self.routing_decide_local(msg, in_dialog);
        }
        let user_here = uri.user.filter(|_| {
            matches!(uri.scheme, Scheme::Sip | Scheme::Sips) && addressed_to_us && !in_dialog
        });
        if let Some(user) = user_here {
            let explicit_domain = self.routing_is_our_domain(uri.host_unbracketed());
            let aor = self.routing_aor_key(user, uri.host_unbracketed());
            let now_unix = self.unix_ms(now);
            let lookup = self.location.lookup(&aor, now_unix);
            let fallback =
                (!explicit_domain && !self.cfg.routing.default_routes.is_empty()).then_some(());
            match (lookup, fallback) {
                (Lookup::Found(bindings), _) => {
                    if self.cfg.mode == Mode::Redirect {
                        return self.routing_redirect_to(
                            bindings
                                .iter()
                                .map(|b| (b.contact.to_string(), Some(b.expires_at))),
                            now_unix,
                        );
                    }
                    let node_down = |b: &Binding| self.location.through_node_down(b);
                    let targets = match binding_targets(&bindings, node_down) {
                        Ok(targets) => targets,
                        Err(gone) => {
                            inc(&self.stats.flows_gone);
                            return gone.into();
                        }
                    };
                    return Decision::Forward(Forward {
                        targets,
                        pop_route,
                        record_route,
                        identity: None,
                    });
                }
                (_, Some(_)) => {}
                // A user whose bindings all expired gets the answer of a user who never
                // registered (as Kamailio's default script does): a prober cannot tell who
                // once had an account here. Challenge the method to hide more (README).
                (Lookup::Unavailable | Lookup::Unknown, None) => {
                    inc(&self.stats.unroutable);
                    return Answer::new(404, "Not Found").into();
                }
            }
        }
        // Not one of our users: a route for the Request-URI's domain, else the default routes
        // for new requests, else the Request-URI itself.
        let routing = &self.cfg.routing;
        let routes = match routing.domain_route(uri.host_unbracketed()) {
            Some(route) if !in_dialog => std::slice::from_ref(route),
            _ if !in_dialog => &routing.default_routes[..],
            _ => &[],
        };
        if !routes.is_empty() && self.cfg.mode == Mode::Redirect {
            let ordered = self.locator.order_routes(routes);
            let contacts = ordered.iter().map(|r| (r.uri.clone(), None));
            return self.routing_redirect_to(contacts, self.unix_ms(now));
        }
        if self.cfg.mode != Mode::Proxy && !in_dialog {
            inc(&self.stats.unroutable);
            return Answer::new(404, "Not Found").into();
        }
        let hop = routes.is_empty().then(|| crate::dns::hop(&uri)).flatten();
        // In a dialog with no Route of ours (a peer that did not keep our Record-Route), the
        // Request-URI may still name a configured route: that is not a relay.
        if restricted
            && routes.is_empty()
            && !hop.is_some_and(|h| self.relay_is_configured_route(&h))
        {
            return self.relay_forbidden();
        }
        let (locator, stats) = (&mut self.locator, &self.stats);
        let located = if routes.is_empty() {
            match hop {
                Some(Hop::Addr(p)) if self.cfg.names.addrs.contains(&p.addr) => None,
                Some(hop) => Some(locator.locate(now, std::iter::once(hop), stats)),
                None => None,
            }
        } else if let [only] = routes {
            Some(locator.locate(now, std::iter::once(only.next.hop()), stats))
        } else {
            let ordered = locator.order_routes(routes);
            Some(locator.locate(now, ordered.iter().map(|r| r.next.hop()), stats))
        };
        match located {
            Some(located) => forward_located(located, pop_route, record_route),
            None => {
                inc(&self.stats.unroutable);
                Answer::new(404, "Not Found").into()
            }
        }
    }

    /// Walks a request's Route values top first, saying of each whether it is in the leading
    /// run that names this server (loose routing, §16.4: those are consumed). Routing and
    /// overload control's dialog test ([`Engine::overload_in_our_dialog`]) both ask it.
    pub(super) fn routing_walk_routes<'a>(
        &self,
        msg: &Message<'a>,
        mut each: impl FnMut(&HeaderField, NameAddr<'a>, bool),
    ) -> Result<(), ParseError> {
        let mut ours = true;
        msg.name_addrs(HeaderName::Route, |field, na| {
            ours = ours && self.routing_is_local_host(&na.uri);
            each(field, na, ours);
        })
    }

    /// Requests addressed to the server itself.
    pub(super) fn routing_decide_local(&mut self, msg: &Message<'_>, in_dialog: bool) -> Decision {
        if let Some(refused) = bad_extension(msg, HeaderName::Require) {
            return refused;
        }
        match msg.method() {
            Method::Options => Decision::Respond(
                Answer::new(200, "OK").with_headers(format!("{ALLOW}Accept: application/sdp\r\n")),
            ),
            Method::Register if !in_dialog => {
                let Ok(to) = msg.to() else {
                    return Answer::new(400, "Bad To header").into();
                };
                let (Some(user), true) = (
                    to.uri.user,
                    self.routing_is_local_host(&to.uri)
                        || self.routing_is_our_domain(to.uri.host_unbracketed()),
                ) else {
                    return Answer::new(404, "Not Found (not a domain of this registrar)").into();
                };
                Decision::Register {
                    aor: self.routing_aor_key(user, to.uri.host_unbracketed()),
                }
            }
            Method::Ack => Decision::Drop,
            Method::Other => {
                inc(&self.stats.not_allowed);
                Decision::Respond(Answer::new(501, "Not Implemented").with_headers(ALLOW))
            }
            _ => {
                inc(&self.stats.not_allowed);
                Decision::Respond(Answer::new(405, "Method Not Allowed").with_headers(ALLOW))
            }
        }
    }

    pub(super) fn routing_redirect_to(
        &self,
        contacts: impl Iterator<Item = (String, Option<u64>)>,
        now_unix: u64,
    ) -> Decision {
        let mut headers = String::new();
        for (contact, expires_at) in contacts {
            let _ = write!(headers, "Contact: <{contact}>");
            if let Some(at) = expires_at {
                let _ = write!(
                    headers,
                    ";expires={}",
                    at.saturating_sub(now_unix).div_ceil(1000)
                );
            }
            headers.push_str("\r\n");
        }
        Decision::Respond(Answer::new(302, "Moved Temporarily").with_headers(headers))
    }
}

/// Forwarding to one next hop once located: to its destinations in order, else waiting for
/// DNS, else — DNS gave it no targets — 404 when the name has none, 503 when DNS could not be
/// asked (a later try may work).
fn forward_located(
    located: Located,
    pop_route: SmallVec<[(HeaderField, usize); 2]>,
    record_route: bool,
) -> Decision {
    match located {
        Located::Wait(queries) => Decision::Locate(queries),
        Located::Peers { failure, peers } if peers.is_empty() => match failure {
            Some(Failure::Unavailable) => Answer::new(503, "Service Unavailable (DNS)").into(),
            _ => Answer::new(404, "Not Found (no such domain)").into(),
        },
        Located::Peers { peers, .. } => Decision::Forward(Forward {
            targets: smallvec::smallvec![Target {
                request_uri: None,
                route_set: None,
                dests: peers
            }],
            pop_route,
            record_route,
            identity: None,
        }),
    }
}

/// The targets a user's live bindings (best `q` first) make: one per binding, but one per
/// RFC 5626 instance, whose flows are tried one at a time, the most recently registered
/// first (§5.3: never two flows of one instance at once). A binding with a Path is reached
/// along it (its first hop must be an address). A stream flow whose connection is gone (it
/// died with a restart) is left out, as is one only a cluster node that is down reaches
/// (`node_down`); when nothing is left, the answer: 430 Flow Failed for an outbound user
/// agent, else 480.
fn binding_targets(
    bindings: &[&Binding],
    node_down: impl Fn(&Binding) -> bool,
) -> Result<SmallVec<[Target; 1]>, Answer> {
    let mut targets: SmallVec<[Target; 1]> = SmallVec::new();
    // Per target, its instance and its flows' registration times (to order them).
    type Flows<'b> = (Option<&'b str>, SmallVec<[u64; 2]>);
    let mut flows: SmallVec<[Flows<'_>; 1]> = SmallVec::new();
    let mut outbound_lost = false;
    for b in bindings {
        if b.target.flow_lost() || node_down(b) {
            outbound_lost |= b.outbound.is_some();
            continue;
        }
        let dest = match &b.path {
            Some(path) => match first_path_hop(path) {
                Some(hop) => hop,
                None => continue,
            },
            None => b.target,
        };
        let instance = b.outbound.as_ref().map(|o| &*o.instance);
        if let Some(i) = flows
            .iter()
            .position(|(inst, _)| inst.is_some() && *inst == instance)
        {
            // Another flow of an instance already targeted: its failover, newest first.
            let at = flows[i]
                .1
                .iter()
                .take_while(|t| **t >= b.expires_at)
                .count();
            flows[i].1.insert(at, b.expires_at);
            targets[i].dests.insert(at, dest);
            continue;
        }
        flows.push((instance, smallvec::smallvec![b.expires_at]));
        targets.push(Target {
            request_uri: Some(b.contact.clone()),
            route_set: b.path.clone(),
            dests: smallvec::smallvec![dest],
        });
    }
    if targets.is_empty() {
        return Err(if outbound_lost {
            Answer::new(430, "Flow Failed")
        } else {
            Answer::new(480, "Temporarily Unavailable")
        });
    }
    Ok(targets)
}

/// A REGISTER's dispatch key: its AOR, the To URI's user and host (the host in lower case),
/// so every registration of a user, and its Proxychain chain, land on one node.
fn routing_dispatch_key(to: &Uri<'_>) -> Vec<u8> {
    let mut key = to.user.unwrap_or_default().to_vec();
    key.push(b'@');
    key.extend(to.host_unbracketed().iter().map(u8::to_ascii_lowercase));
    key
}

/// Where a Path (RFC 3327) is sent first: its first URI, which must name an address.
fn first_path_hop(path: &str) -> Option<Peer> {
    let first = path.split(',').next()?.trim();
    let uri = first.strip_prefix('<')?.split('>').next()?;
    uri_peer(&Uri::parse(uri.as_bytes()).ok()?)
}

/// The option tags sipsec supports (RFC 5626 outbound, RFC 3327 path).
const SUPPORTED: &[&[u8]] = &[b"outbound", b"path"];

/// 420 for a request requiring extensions (Require to a UAS, Proxy-Require to a proxy) that
/// sipsec does not support, listing those in Unsupported.
pub(super) fn bad_extension(msg: &Message<'_>, header: HeaderName) -> Option<Decision> {
    msg.header(header)?;
    let mut unsupported = String::new();
    for h in msg.headers_named(header) {
        for tag in msg.value(h).split(|b| *b == b',').map(<[u8]>::trim_ascii) {
            if tag.is_empty() || SUPPORTED.iter().any(|s| s.eq_ignore_ascii_case(tag)) {
                continue;
            }
            unsupported.push_str(if unsupported.is_empty() {
                "Unsupported: "
            } else {
                ", "
            });
            unsupported.push_str(&String::from_utf8_lossy(tag));
        }
    }
    if unsupported.is_empty() {
        return None;
    }
    unsupported.push_str("\r\n");
    Some(Decision::Respond(
        Answer::new(420, "Bad Extension").with_headers(unsupported),
    ))
}
