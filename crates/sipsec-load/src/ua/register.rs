//! The callee's registrations (`--register`): each user registers its Contact over a flow of
//! its own — a UDP socket, or a TCP/TLS connection — answers digest challenges, refreshes at
//! half the granted time, and unregisters at the end; calls then arrive on that flow. As an
//! RFC 5626 client (`--outbound`) each user is an instance with `reg-id` flows, keeps them
//! alive (CRLF ping on streams, STUN on UDP, §4.4.1) and moves a failed flow's registration to
//! a new one (§4.5).
//!
//! Sans-IO like the rest of the UA: the UA asks the driver for flows ([`FlowOp`]) and is told
//! what became of them (`flow_opened`, `flow_unavailable`, `link_closed`), of keep-alive
//! answers on streams (`keepalive_answered`; STUN answers come in as datagrams).
//!
//! Over streams the Contact names a host that does not resolve (`USER@<random>.invalid`, as
//! RFC 7118's browsers write): the callee listens nowhere, so the only way in is the flow.
//! Over UDP it is the flow's own socket address, which behind a NAT is a private one.

use super::*;
use crate::stun;

/// How the callee registers its users (`UaConfig::register`).
#[derive(Debug, Clone)]
pub struct Registering {
    /// Flows per user: reg-id 1 to `flows` with `outbound`; 1 without.
    pub flows: u32,
    /// Register as an RFC 5626 client: `+sip.instance`, `reg-id`, `;ob`, `Supported:
    /// outbound, path`, keep-alives and flow recovery.
    pub outbound: bool,
    /// Milliseconds between keep-alives when the 200 OK has no `Flow-Timer`.
    pub keepalive_ms: u64,
    /// Over UDP, the address (`host[:port]`) the Contact names instead of the socket's: what
    /// a phone behind a NAT writes (its private address), which the server can reach only
    /// where the REGISTER came from.
    pub contact_addr: Option<String>,
}

/// What the UA asks of the driver's links for its registrations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowOp {
    /// Open a flow of its own (a socket or a connection) to `remote` for flow `flow`, and
    /// tell the UA with `Ua::flow_opened` or `Ua::flow_unavailable`.
    Open {
        /// The UA's number for the flow.
        flow: u32,
        /// Where its REGISTERs go.
        remote: SocketAddr,
    },
    /// Close a failed flow's link; its registration has moved to a new one.
    Close(u32),
}

/// Where a flow is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlowState {
    /// Waiting for the driver to open it.
    Opening,
    /// The first REGISTER over this flow is out.
    Registering,
    /// Bound; a refresh may be out.
    Registered,
    /// The REGISTER with Expires 0 is out.
    Unregistering,
    /// Failed or refused; a new flow opens on a timer.
    Down,
    /// Unregistered, or given up at the end of the run.
    Done,
}

/// One flow of one user: its link, Contact, registration dialog and keep-alive.
pub(super) struct Flow {
    user: usize,
    /// 1-based with outbound; 0 without (no `reg-id`).
    reg_id: u32,
    link: Option<Endpoint>,
    /// The flow's local address (Via; the Contact over UDP).
    local: Option<SocketAddr>,
    /// The Contact URI (without angle brackets or header parameters).
    contact: String,
    /// Stable over the flow's registrations and the new flows that replace it, with CSeq
    /// rising (RFC 3261 §10.2.4).
    call_id: String,
    cseq: u32,
    tx: Option<TxId>,
    state: FlowState,
    /// The REGISTER out is a refresh of a live binding.
    refreshing: bool,
    auth_tries: u8,
    started_us: u64,
    /// The refresh, or the retry of a flow that is down.
    timer: Option<TimerHandle>,
    /// The next keep-alive.
    keepalive: Option<TimerHandle>,
    /// The deadline of the keep-alive awaiting its answer.
    awaiting: Option<TimerHandle>,
    stun_id: stun::TransactionId,
    keepalive_ms: u64,
    /// The registrar confirmed outbound (`Require: outbound` in its 2xx, RFC 5626 §4.2.1):
    /// only then is an unanswered keep-alive a failed flow.
    confirmed: bool,
    /// Failures since the last success, for the back-off.
    failures: u32,
    /// Bumped whenever timers set before become stale.
    generation: u32,
    /// Why the last registration attempt failed.
    last_failure: Option<String>,
}

/// What the registrations came to so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrationReport {
    /// Flows registered now.
    pub registered: usize,
    /// Flows in all.
    pub flows: usize,
    /// Each flow not registered: `user (reg-id N): reason`.
    pub failures: Vec<String>,
}

/// How long a keep-alive waits for its answer: RFC 5626 §4.4.1's 10 s, or less when
/// keep-alives are more frequent, so that one is settled before the next goes.
fn answer_wait_ms(interval_ms: u64) -> u64 {
    (interval_ms * 3 / 4).clamp(1, 10_000)
}

/// The back-off before a new flow after `failures` failures in a row (RFC 5626 §4.5's
/// doubling, on a lab's scale: from 1 s up to 30 s, where the RFC starts at 30 s and goes to
/// 30 min; a load run lasts minutes). `fraction` in [0.5, 1] spreads the retries.
fn backoff_ms(failures: u32, fraction: f64) -> u64 {
    let full = 1000u64.saturating_mul(1 << failures.min(16)).min(30_000);
    (full as f64 * fraction) as u64
}

impl Ua {
    /// Creates a flow for each user and reg-id and asks the driver to open them.
    pub fn start_registrations(&mut self) {
        let Some(reg) = self.cfg.register.clone() else {
            return;
        };
        let per_user = if reg.outbound { reg.flows.max(1) } else { 1 };
        for user in 0..self.cfg.users.len() {
            let seed = self.random_bytes();
            self.instances.push(uuid_v4(seed));
            for r in 1..=per_user {
                let flow = self.flows.len() as u32;
                self.flows.push(Flow {
                    user,
                    reg_id: if reg.outbound { r } else { 0 },
                    link: None,
                    local: None,
                    contact: String::new(),
                    call_id: format!("r{flow:x}-{:x}@sipsec-load", self.cfg.epoch),
                    cseq: 0,
                    tx: None,
                    state: FlowState::Opening,
                    refreshing: false,
                    auth_tries: 0,
                    started_us: 0,
                    timer: None,
                    keepalive: None,
                    awaiting: None,
                    stun_id: [0; 12],
                    keepalive_ms: reg.keepalive_ms,
                    confirmed: false,
                    failures: 0,
                    generation: 0,
                    last_failure: None,
                });
                self.flow_ops.push(FlowOp::Open {
                    flow,
                    remote: self.cfg.target.addr,
                });
            }
        }
    }

    /// The driver opened flow `flow` on `link`, bound at `local`: register over it.
    pub fn flow_opened(
        &mut self,
        now_us: u64,
        flow: u32,
        link: u32,
        local: SocketAddr,
        out: &mut Vec<Transmit>,
    ) {
        let transport = self.cfg.transport;
        let Some(f) = self.flows.get(flow as usize) else {
            return;
        };
        if f.state != FlowState::Opening {
            // Given up meanwhile (the run ended): the link is not ours to keep.
            self.flow_ops.push(FlowOp::Close(link));
            return;
        }
        let name = self.user_name(f.user);
        let ob = if f.reg_id > 0 { ";ob" } else { "" };
        let contact = if transport.reliable() {
            // Stable for the user's flow, so a new flow replaces the binding of the old.
            let host = self.contact_host(flow);
            format!("sip:{name}@{host}.invalid{}{ob}", transport.uri_param())
        } else {
            match self
                .cfg
                .register
                .as_ref()
                .and_then(|r| r.contact_addr.as_deref())
            {
                Some(written) => format!("sip:{name}@{written}{ob}"),
                None => format!("sip:{name}@{local}{ob}"),
            }
        };
        let f = &mut self.flows[flow as usize];
        f.contact = contact;
        f.link = Some(Endpoint {
            link,
            addr: self.cfg.target.addr,
        });
        f.state = FlowState::Registering;
        f.refreshing = false;
        f.started_us = now_us;
        f.auth_tries = 0;
        f.local = Some(local);
        self.flow_by_link.insert(link, flow);
        self.stats.registrations.tally.attempted += 1;
        self.send_register(now_us, flow, None);
        self.drain(out);
    }

    /// The driver could not open flow `flow` (`why`): it counts as a failed registration,
    /// retried after the back-off.
    pub fn flow_unavailable(&mut self, now_us: u64, flow: u32, why: &str) {
        if self
            .flows
            .get(flow as usize)
            .is_some_and(|f| f.state == FlowState::Opening)
        {
            self.registration_failed(now_us, flow, &format!("cannot open a flow: {why}"));
        }
    }

    /// The host part of a stream flow's Contact: random per user and reg-id for the run.
    fn contact_host(&self, flow: u32) -> String {
        let f = &self.flows[flow as usize];
        let instance = &self.instances[f.user];
        // The instance's random hex, shortened, and the reg-id: unique and stable.
        let hex: String = instance
            .chars()
            .filter(char::is_ascii_hexdigit)
            .skip(4)
            .take(12)
            .collect();
        format!("{hex}{}", f.reg_id)
    }

    /// Sends flow `flow`'s REGISTER: Expires from the run, or 0 when unregistering.
    fn send_register(&mut self, now_us: u64, flow: u32, auth: Option<(&str, String)>) {
        let epoch = self.cfg.epoch;
        let transport = self.cfg.transport;
        let outbound = self.cfg.register.as_ref().is_some_and(|r| r.outbound);
        let f = &mut self.flows[flow as usize];
        let (Some(dest), Some(local)) = (f.link, f.local) else {
            return;
        };
        f.cseq += 1;
        let expires = if f.state == FlowState::Unregistering {
            0
        } else {
            self.cfg.expires
        };
        let (user, cseq) = (f.user, f.cseq);
        let branch = format!("z9hG4bK-r{epoch:x}-{flow:x}-{cseq:x}");
        let aor = self.aor(user);
        let domain = self.domain_of(user);
        let f = &self.flows[flow as usize];
        let mut m = Vec::with_capacity(768);
        let _ = write!(
            m,
            "REGISTER sip:{domain} SIP/2.0\r\nVia: SIP/2.0/{} {local};branch={branch};rport\r\n\
             Max-Forwards: 70\r\nFrom: <{aor}>;tag=r{epoch:x}-{flow:x}\r\nTo: <{aor}>\r\n\
             Call-ID: {}\r\nCSeq: {cseq} REGISTER\r\nContact: <{}>",
            transport.via_token(),
            f.call_id,
            f.contact,
        );
        if f.reg_id > 0 {
            let _ = write!(
                m,
                ";+sip.instance=\"<{}>\";reg-id={}",
                self.instances[user], f.reg_id
            );
        }
        let _ = write!(m, "\r\nExpires: {expires}\r\n");
        if outbound {
            m.extend_from_slice(b"Supported: outbound, path\r\n");
        }
        if let Some((name, value)) = auth {
            let _ = write!(m, "{name}: {value}\r\n");
        }
        m.extend_from_slice(b"Content-Length: 0\r\n\r\n");
        let reliable = transport.reliable();
        let id = self.txs.create_client(
            ms(now_us),
            Bytes::from(m),
            branch.as_bytes(),
            b"REGISTER",
            dest,
            reliable,
            TxUser::Register(flow),
            &mut self.outputs,
        );
        self.flows[flow as usize].tx = Some(id);
    }

    /// A response to a REGISTER of flow `flow`.
    pub(super) fn on_register_response(
        &mut self,
        now_us: u64,
        flow: u32,
        id: TxId,
        msg: &Message<'_>,
    ) {
        let Some(f) = self.flows.get(flow as usize).filter(|f| f.tx == Some(id)) else {
            return; // An earlier request's, superseded.
        };
        let code = msg.status().unwrap_or(0);
        if code < 200 {
            return;
        }
        let (user, tries, state) = (f.user, f.auth_tries, f.state);
        if code == 401 || code == 407 {
            let cnonce = format!("{:x}r{flow:x}.{}", self.cfg.epoch, f.cseq);
            let uri = format!("sip:{}", self.domain_of(user));
            match self.digest_answer(code, msg, user, tries, "REGISTER", &uri, &cnonce) {
                Ok((name, value, _)) => {
                    self.flows[flow as usize].auth_tries += 1;
                    self.send_register(now_us, flow, Some((name, value)));
                }
                Err(reason) => self.registration_failed(now_us, flow, &reason),
            }
            return;
        }
        if state == FlowState::Unregistering {
            self.retire(flow);
            if (200..300).contains(&code) {
                self.stats.registrations.unregistered += 1;
            } else {
                self.stats
                    .registrations
                    .unregister_failures
                    .push(format!("{code} {}", reason_of(msg)));
            }
            return;
        }
        if !(200..300).contains(&code) {
            self.registration_failed(now_us, flow, &format!("{code} {}", reason_of(msg)));
            return;
        }
        let Some(granted) = granted_expires(msg, &self.flows[flow as usize].contact) else {
            self.registration_failed(now_us, flow, "2xx without our Contact");
            return;
        };
        let keepalive_ms = msg
            .other_header(b"Flow-Timer")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok())
            .filter(|&s| s > 0)
            .map(|s| s * 1000);
        let confirmed = msg
            .list_values(HeaderName::Require)
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"outbound"));
        let outbound = self.cfg.register.as_ref().is_some_and(|r| r.outbound);
        let default_ms = self.cfg.register.as_ref().map_or(0, |r| r.keepalive_ms);
        let f = &mut self.flows[flow as usize];
        let latency = now_us.saturating_sub(f.started_us);
        let refresh = f.refreshing;
        f.state = FlowState::Registered;
        f.refreshing = false;
        f.tx = None;
        f.auth_tries = 0;
        f.failures = 0;
        f.last_failure = None;
        f.confirmed = confirmed;
        f.keepalive_ms = keepalive_ms.unwrap_or(default_ms);
        let generation = f.generation;
        if let Some(t) = f.timer.take() {
            self.wheel.cancel(t);
        }
        let at = ms(now_us) + u64::from(granted) * 1000 / 2;
        self.flows[flow as usize].timer =
            Some(self.wheel.insert(at, Event::Refresh { flow, generation }));
        let r = &mut self.stats.registrations;
        r.tally.succeeded += 1;
        r.refreshes += u64::from(refresh);
        let _ = r.tally.latency_us.record(latency.max(1));
        if outbound && self.flows[flow as usize].keepalive.is_none() {
            self.schedule_keepalive(now_us, flow);
        }
    }

    /// Flow `flow`'s REGISTER transaction `id` had no final answer (Timer F).
    pub(super) fn register_timed_out(&mut self, flow: u32, id: TxId) {
        let now_us = self.wheel.now() * 1000;
        let state = self
            .flows
            .get(flow as usize)
            .filter(|f| f.tx == Some(id))
            .map(|f| f.state);
        match state {
            Some(FlowState::Unregistering) => {
                self.retire(flow);
                self.stats
                    .registrations
                    .unregister_failures
                    .push("timeout".into());
            }
            Some(_) => self.registration_failed(now_us, flow, "timeout"),
            None => {}
        }
    }

    /// A REGISTER of flow `flow` failed (refused, timed out, no flow to send it on): count
    /// it, and retry over a new flow after the back-off.
    fn registration_failed(&mut self, now_us: u64, flow: u32, reason: &str) {
        let r = &mut self.stats.registrations.tally;
        r.failed += 1;
        match r.failures_by_reason.get_mut(reason) {
            Some(n) => *n += 1,
            None => {
                r.failures_by_reason.insert(reason.to_string(), 1);
            }
        }
        self.flows[flow as usize].last_failure = Some(reason.to_string());
        self.take_down(now_us, flow);
    }

    /// Flow `flow` failed: close its link and open a new one — at once when it had been
    /// working, after the back-off when it keeps failing.
    fn take_down(&mut self, now_us: u64, flow: u32) {
        let fraction = 0.5 + 0.5 * self.random_fraction();
        let f = &mut self.flows[flow as usize];
        if matches!(f.state, FlowState::Done | FlowState::Down) {
            return;
        }
        f.generation = f.generation.wrapping_add(1);
        f.tx = None;
        f.refreshing = false;
        let handles = [f.timer.take(), f.keepalive.take(), f.awaiting.take()];
        let link = f.link.take();
        let was_registered = f.state == FlowState::Registered;
        f.state = FlowState::Down;
        let wait = if was_registered && f.failures == 0 {
            0
        } else {
            backoff_ms(f.failures, fraction)
        };
        f.failures += 1;
        let generation = f.generation;
        for t in handles.into_iter().flatten() {
            self.wheel.cancel(t);
        }
        if let Some(l) = link {
            self.flow_by_link.remove(&l.link);
            self.flow_ops.push(FlowOp::Close(l.link));
        }
        let t = self
            .wheel
            .insert(ms(now_us) + wait, Event::Reopen { flow, generation });
        self.flows[flow as usize].timer = Some(t);
    }

    /// A flow that was working failed (`why`): counted, and its registration moves on.
    fn flow_failed(&mut self, now_us: u64, flow: u32, why: &str) {
        let r = &mut self.stats.registrations;
        r.flows_failed += 1;
        *r.flow_failures.entry(why.to_string()).or_default() += 1;
        self.flows[flow as usize].last_failure = Some(why.to_string());
        self.take_down(now_us, flow);
    }

    /// The driver's link `link` closed (the peer closed it, or it broke): a flow on it failed.
    pub fn link_closed(&mut self, now_us: u64, link: u32, out: &mut Vec<Transmit>) {
        let Some(flow) = self.flow_by_link.remove(&link) else {
            return;
        };
        // The link is gone already: nothing to close.
        self.flows[flow as usize].link = None;
        match self.flows[flow as usize].state {
            FlowState::Unregistering => self.flows[flow as usize].state = FlowState::Done,
            FlowState::Registering => {
                self.registration_failed(now_us, flow, "connection closed while registering");
            }
            _ => self.flow_failed(now_us, flow, "connection closed"),
        }
        self.drain(out);
    }

    /// A timer of the registrations fired.
    pub(super) fn on_register_event(&mut self, now_us: u64, event: Event) {
        let (Event::Refresh { flow, generation }
        | Event::KeepAlive { flow, generation }
        | Event::KeepAliveLost { flow, generation }
        | Event::Reopen { flow, generation }) = event
        else {
            return;
        };
        let Some(f) = self
            .flows
            .get_mut(flow as usize)
            .filter(|f| f.generation == generation)
        else {
            return;
        };
        match event {
            Event::Refresh { .. } if f.state == FlowState::Registered => {
                f.timer = None;
                f.refreshing = true;
                f.started_us = now_us;
                f.auth_tries = 0;
                self.stats.registrations.tally.attempted += 1;
                self.send_register(now_us, flow, None);
            }
            Event::Reopen { .. } if f.state == FlowState::Down => {
                f.timer = None;
                f.state = FlowState::Opening;
                self.stats.registrations.flows_reopened += 1;
                self.flow_ops.push(FlowOp::Open {
                    flow,
                    remote: self.cfg.target.addr,
                });
            }
            Event::KeepAlive { .. } if f.state == FlowState::Registered => {
                f.keepalive = None;
                self.send_keepalive(now_us, flow);
            }
            Event::KeepAliveLost { .. } => {
                f.awaiting = None;
                self.stats.registrations.keepalives_unanswered += 1;
                if f.confirmed && f.state == FlowState::Registered {
                    self.flow_failed(now_us, flow, "keep-alive unanswered");
                }
            }
            _ => {}
        }
    }

    /// Schedules flow `flow`'s next keep-alive at 80–100% of its interval (RFC 5626 §4.4.1).
    /// Not over WebSocket, whose server keeps the connection with Pings (answered below SIP).
    fn schedule_keepalive(&mut self, now_us: u64, flow: u32) {
        if self.cfg.transport.websocket() {
            return;
        }
        let fraction = 0.8 + 0.2 * self.random_fraction();
        let f = &mut self.flows[flow as usize];
        let at = ms(now_us) + (f.keepalive_ms as f64 * fraction) as u64;
        let generation = f.generation;
        f.keepalive = Some(self.wheel.insert(at, Event::KeepAlive { flow, generation }));
    }

    /// Sends flow `flow`'s keep-alive (a double-CRLF ping on streams, a STUN Binding request
    /// on UDP) and waits for its answer.
    fn send_keepalive(&mut self, now_us: u64, flow: u32) {
        let reliable = self.cfg.transport.reliable();
        let id: stun::TransactionId = self.random_bytes()[..12]
            .try_into()
            .expect("12 of 16 bytes");
        let f = &mut self.flows[flow as usize];
        let Some(dest) = f.link else {
            return;
        };
        let data = if reliable {
            Bytes::from_static(b"\r\n\r\n")
        } else {
            f.stun_id = id;
            Bytes::copy_from_slice(&stun::binding_request(&id))
        };
        if f.awaiting.is_none() {
            let generation = f.generation;
            let at = ms(now_us) + answer_wait_ms(f.keepalive_ms);
            f.awaiting = Some(
                self.wheel
                    .insert(at, Event::KeepAliveLost { flow, generation }),
            );
        }
        self.outputs.push(Output::Transmit { dest, data });
        self.stats.registrations.keepalives_sent += 1;
        self.schedule_keepalive(now_us, flow);
    }

    /// A keep-alive answer on the stream flow at `link` (a CRLF pong).
    pub fn keepalive_answered(&mut self, link: u32) {
        if let Some(&flow) = self.flow_by_link.get(&link) {
            self.keepalive_answer(flow);
        }
    }

    /// A STUN message from `from`: the answer to a flow's keep-alive when its ID matches.
    pub(super) fn on_stun(&mut self, from: Endpoint, data: &[u8]) {
        let flow = self.flow_by_link.get(&from.link).copied();
        match (flow, stun::binding_response_id(data)) {
            (Some(flow), Some(id)) if self.flows[flow as usize].stun_id == id => {
                self.keepalive_answer(flow);
            }
            _ => self.stats.stray += 1,
        }
    }

    fn keepalive_answer(&mut self, flow: u32) {
        if let Some(t) = self.flows[flow as usize].awaiting.take() {
            self.wheel.cancel(t);
            self.stats.registrations.keepalives_answered += 1;
        }
    }

    /// The run is over: unregisters every flow that is registered (Expires 0) and gives up on
    /// the rest.
    pub fn unregister_all(&mut self, now_us: u64, out: &mut Vec<Transmit>) {
        for flow in 0..self.flows.len() as u32 {
            let f = &mut self.flows[flow as usize];
            f.generation = f.generation.wrapping_add(1);
            let handles = [f.timer.take(), f.keepalive.take(), f.awaiting.take()];
            let registered = f.state == FlowState::Registered && f.link.is_some();
            f.state = FlowState::Unregistering;
            f.auth_tries = 0;
            for t in handles.into_iter().flatten() {
                self.wheel.cancel(t);
            }
            if registered {
                self.send_register(now_us, flow, None);
            } else {
                self.retire(flow);
            }
        }
        self.drain(out);
    }

    /// Whether every flow's first registration has been answered (registered or failed).
    pub fn registrations_settled(&self) -> bool {
        self.flows
            .iter()
            .all(|f| !matches!(f.state, FlowState::Opening | FlowState::Registering))
    }

    /// Unregistrations still waiting for their answer.
    pub fn unregistrations_pending(&self) -> usize {
        self.flows
            .iter()
            .filter(|f| f.state == FlowState::Unregistering)
            .count()
    }

    /// Abandons the unregistrations still out (the run's end cannot wait longer).
    pub fn abandon_unregistrations(&mut self) {
        for flow in 0..self.flows.len() as u32 {
            if self.flows[flow as usize].state == FlowState::Unregistering {
                self.retire(flow);
                self.stats
                    .registrations
                    .unregister_failures
                    .push("no answer".into());
            }
        }
    }

    /// Flow `flow` is done with (unregistered, or given up at the end): its link closes, as a
    /// phone's would when it goes away, and its socket is not left to a later run.
    fn retire(&mut self, flow: u32) {
        let f = &mut self.flows[flow as usize];
        f.state = FlowState::Done;
        f.tx = None;
        if let Some(l) = f.link.take() {
            self.flow_by_link.remove(&l.link);
            self.flow_ops.push(FlowOp::Close(l.link));
        }
    }

    /// The registered flows now, and why each other one is not.
    pub fn registration_report(&self) -> RegistrationReport {
        let mut report = RegistrationReport {
            flows: self.flows.len(),
            ..Default::default()
        };
        for f in &self.flows {
            if matches!(f.state, FlowState::Registered) {
                report.registered += 1;
                continue;
            }
            let name = self.user_name(f.user);
            let flow = if f.reg_id > 0 {
                format!("{name} (reg-id {})", f.reg_id)
            } else {
                name.to_string()
            };
            let why = f.last_failure.as_deref().unwrap_or("not answered yet");
            report.failures.push(format!("{flow}: {why}"));
        }
        report
    }

    /// The Contact a registered callee puts in its 2xx to a call that came in on `link`: the
    /// one it registered over that flow.
    pub(super) fn flow_contact(&self, link: u32) -> Option<&str> {
        if self.flows.is_empty() {
            return None;
        }
        let flow = *self.flow_by_link.get(&link)?;
        Some(&self.flows[flow as usize].contact)
    }

    /// The name user `user` registers as.
    fn user_name(&self, user: usize) -> &str {
        self.cfg
            .users
            .get(user)
            .map_or(self.cfg.caller.as_str(), |u| u.username.as_str())
    }

    /// 16 random bytes.
    fn random_bytes(&mut self) -> [u8; 16] {
        use sha2::Digest as _;
        self.pc_counter += 1;
        let mut h = sha2::Sha256::new();
        h.update(self.pc_seed);
        h.update(b"register");
        h.update(self.pc_counter.to_be_bytes());
        let mut n = [0; 16];
        n.copy_from_slice(&h.finalize()[..16]);
        n
    }

    /// A random fraction in [0, 1).
    fn random_fraction(&mut self) -> f64 {
        let b = self.random_bytes();
        let x = u64::from_be_bytes(b[..8].try_into().expect("8 of 16 bytes"));
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A version 4 UUID URN from 16 random bytes (RFC 4122 §4.4), the `+sip.instance` of a user
/// (RFC 5626 §4.1).
fn uuid_v4(mut b: [u8; 16]) -> String {
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

/// The seconds a 2xx to a REGISTER grants `contact`: its Contact's `expires`, else the
/// Expires header; `None` when the 2xx does not list it (the registrar did not bind it).
fn granted_expires(msg: &Message<'_>, contact: &str) -> Option<u32> {
    let mut granted = None;
    let mut listed = false;
    let _ = msg.name_addrs(HeaderName::Contact, |_, na| {
        if na.uri.raw == contact.as_bytes() {
            listed = true;
            granted = na
                .params
                .get(b"expires")
                .flatten()
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u32>().ok());
        }
    });
    if !listed {
        return None;
    }
    granted
        .or_else(|| msg.expires().and_then(Result::ok))
        .filter(|&s| s > 0)
}

#[cfg(test)]
mod tests;
