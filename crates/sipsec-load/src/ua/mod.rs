//! The load generator's user agent, sans-IO: the caller side (UAC) runs one scenario per
//! started operation, the callee side (UAS) answers whatever arrives. Both are transaction
//! users of `sip-core`'s transaction table, exactly like the proxy, so retransmissions, ACKs
//! of non-2xx responses and every RFC 3261 timer come from the same tested code.
//!
//! The driver hands in datagrams/frames with the time in microseconds and sends the
//! [`Transmit`]s that come back. Nothing here blocks, allocates per call beyond the messages
//! themselves, or knows about sockets.
//!
//! What the UA core adds to the transaction layer (RFC 3261 §13, §12):
//! - the UAC sends the ACK for a 2xx itself and re-sends it for each retransmitted 2xx;
//! - the UAS retransmits its 2xx (T1 doubling up to T2) until the ACK arrives, for 64·T1;
//! - dialogs: the route set from Record-Route (reversed at the UAC), the remote target from
//!   Contact, tags, CSeq;
//! - 401/407 answered once per challenge (twice when the server says `stale=true`); `PC`
//!   challenges up to `PC_MAX_TRIES` times, since a user's concurrent calls race for one
//!   chain and the loser is told to start over;
//! - 3xx followed to the first Contact when the redirect scenario asks for it.

mod callee;
mod caller;
mod challenge;
mod register;

pub use register::{FlowOp, Registering, RegistrationReport};

use super::stats::RunTally;
use super::users::Users;
use bytes::Bytes;
use sip_core::digest::{self, Challenge};
use sip_core::message::{build, HeaderName, Message, Method, Uri};
use sip_core::timer::{TimerHandle, TimerWheel};
use sip_core::transaction::{Output, RequestMatch, ResponseMatch, Timers, Transactions, TxId};
use sipsec_transport::net::transport::Transport;
use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

/// Where a message goes or came from: one of the driver's links (a socket or connection)
/// and the remote address on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The driver's link (see the link numbering in `connections`).
    pub link: u32,
    /// The remote address on it.
    pub addr: SocketAddr,
}

/// Bytes for the driver to send.
pub type Transmit = (Endpoint, Bytes);

/// What one started operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// INVITE, (180), 200, ACK, hold, BYE, 200.
    Call,
    /// REGISTER, 200.
    Register,
    /// INVITE, 302; then the call to the first Contact when `follow`.
    Redirect {
        /// Call the first Contact of the 302.
        follow: bool,
    },
    /// OPTIONS, 200.
    Options,
}

/// Everything the UA needs to know, fixed for a run.
#[derive(Clone)]
pub struct UaConfig {
    /// What each operation the UAC starts does.
    pub scenario: Scenario,
    /// Where the UAC sends new requests (the server, or a UAS directly).
    pub target: Endpoint,
    /// The UAC's own address (Via, Contact): each call's, where calls come from several.
    pub uac_local: crate::sources::Sources,
    /// The UAS's own address (Contact of its 200), when this UA answers calls.
    pub uas_local: Option<SocketAddr>,
    /// The transport to the target: named in Via and Contact, and whether messages are
    /// retransmitted (not on TCP or TLS).
    pub transport: Transport,
    /// Host part of Request-URIs, From and To (default: the target's address).
    pub domain: String,
    /// Callers, callees and their credentials; empty when no user file is given.
    pub users: Arc<Users>,
    /// Callee user when no user file is given.
    pub service: String,
    /// Caller user when no user file is given.
    pub caller: String,
    /// STIR/SHAKEN: the key INVITEs are signed with (an Identity header naming the caller's
    /// and callee's numbers, attestation A), when given.
    pub identity: Option<Arc<sipsec_identity::SigningKey>>,
    /// Milliseconds a call stays established before the UAC hangs up.
    pub hold_ms: u64,
    /// Seconds asked for in a REGISTER's Expires.
    pub expires: u32,
    /// The address registered in Contact (default: the UAC's own).
    pub register_contact: Option<String>,
    /// Ask for responses at the source port (`;rport`, RFC 3581) in the UAC's Via.
    pub rport: bool,
    /// Overload control as a client (RFC 7339/7415): announce it, honour the feedback.
    pub oc: bool,
    /// Start nothing while a 503's Retry-After lasts.
    pub honour_retry_after: bool,
    /// The RFC 3261 timers, for the transactions and the UAS's 2xx retransmissions.
    pub timers: Timers,
    /// Distinguishes this run's Call-IDs and branches from earlier runs on the same sockets.
    pub epoch: u32,
    /// Record ended operations in [`Ua::ended`].
    pub report_ended: bool,
    /// Send credentials with new requests from a user's last challenge and the next nonce
    /// count (RFC 7616 §3.4), as phones do, instead of waiting to be challenged each time.
    pub auth_reuse: bool,
    /// Proxychain: the realm users' keys are derived in (`docs/proxychain.md`); every request
    /// carries the user's nonce, and challenges must prove the network.
    pub proxychain: Option<String>,
    /// The callee registers each user with the target and takes calls over those flows.
    pub register: Option<Registering>,
    /// What INVITEs offer and 200s answer (`--sdp`).
    pub sdp: Sdp,
}

/// The session descriptions the load's calls carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Sdp {
    /// Plain RTP audio, the size of SIPp's, so servers see realistic messages.
    #[default]
    Plain,
    /// A WebRTC description (ICE, DTLS-SRTP, one bundled Opus stream), which a browser's
    /// `RTCPeerConnection` accepts as an offer or an answer: for calls to and from browsers.
    /// Its ICE has no candidates, so no media flows; signalling is what is measured.
    Webrtc,
}

impl Sdp {
    /// The offer an INVITE carries.
    pub(crate) fn offer(self) -> &'static [u8] {
        match self {
            Sdp::Plain => SDP,
            Sdp::Webrtc => WEBRTC_OFFER,
        }
    }

    /// The answer a 200 carries.
    pub(crate) fn answer(self) -> &'static [u8] {
        match self {
            Sdp::Plain => SDP,
            Sdp::Webrtc => WEBRTC_ANSWER,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum TxUser {
    Uac(u64),
    Uas,
    /// A REGISTER of the callee's flow.
    Register(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Invite,
    Bye,
    Register,
    Options,
}

impl Stage {
    fn method(self) -> &'static str {
        match self {
            Stage::Invite => "INVITE",
            Stage::Bye => "BYE",
            Stage::Register => "REGISTER",
            Stage::Options => "OPTIONS",
        }
    }
}

/// The caller's side of an established dialog.
struct Dialog {
    remote_target: String,
    /// Route set, in the order the UAC uses it (Record-Route reversed).
    routes: Vec<String>,
    /// The To header value with the remote tag.
    to: String,
    /// Where in-dialog requests go: the first route, else the remote target.
    next_hop: Endpoint,
    ack: Bytes,
}

struct Call {
    caller: usize,
    stage: Stage,
    started_us: u64,
    cseq: u32,
    request_uri: String,
    to: String,
    next_hop: Endpoint,
    tx: Option<TxId>,
    dialog: Option<Dialog>,
    auth_tries: u8,
    /// The Proxychain nonce n_AP sent with the current request.
    pc_nonce: sip_core::proxychain::Nonce,
    latency_recorded: bool,
    /// A response to the call's first request has arrived (its wait is recorded).
    answered: bool,
    hold: Option<TimerHandle>,
    branches: u32,
    /// Dialogs other UASs set up when a proxy forked the INVITE (RFC 3261 §13.2.2.4), ended
    /// with BYE at once and kept to ACK their 2xx retransmissions.
    extra_dialogs: Vec<Dialog>,
}

impl Call {
    /// The Request-URI of the call's current request: the remote target inside the dialog.
    fn current_uri(&self) -> &str {
        match (&self.dialog, self.stage) {
            (Some(d), Stage::Bye) => &d.remote_target,
            _ => &self.request_uri,
        }
    }
}

/// The fixed head of a request this UAC sends: start line, Via, Max-Forwards, From, To,
/// Call-ID, CSeq and the route set.
struct Head<'a> {
    method: &'a str,
    uri: &'a str,
    branch: &'a str,
    number: u64,
    caller: usize,
    to: &'a str,
    cseq: u32,
    routes: &'a [String],
}

/// The callee's side of a call it answered.
struct UasCall {
    generation: u32,
    ok: Bytes,
    peer: Endpoint,
    interval_ms: u64,
    give_up_ms: u64,
    timer: Option<TimerHandle>,
    acked: bool,
}

#[derive(Debug, Clone, Copy)]
enum Event {
    /// The UAC's hold time ran out: send BYE.
    HangUp(u64),
    /// Retransmit the UAS's 2xx (or give up waiting for its ACK).
    Resend2xx { slot: u32, generation: u32 },
    /// Refresh a flow's registration.
    Refresh { flow: u32, generation: u32 },
    /// Send a flow's keep-alive.
    KeepAlive { flow: u32, generation: u32 },
    /// A flow's keep-alive had no answer in time.
    KeepAliveLost { flow: u32, generation: u32 },
    /// Open a new flow for a registration whose flow failed.
    Reopen { flow: u32, generation: u32 },
}

/// `PC` challenges a call answers before giving up: the first response, then up to a few
/// restarts (hello, response) after the hello challenge that says another call of the same
/// user spent the value first.
const PC_MAX_TRIES: u8 = 6;

/// An SDP offer/answer the size of SIPp's, so servers see realistic messages.
const SDP: &[u8] = b"v=0\r\no=user1 53655765 2353687637 IN IP4 127.0.0.1\r\ns=-\r\n\
c=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n";

/// The WebRTC description up to its DTLS role: one audio stream (mid 0, as a browser's first
/// transceiver), bundled, RTCP multiplexed, with ICE credentials and a certificate
/// fingerprint of the right form.
macro_rules! webrtc_sdp {
    ($setup:literal) => {
        concat!(
            "v=0\r\no=- 4611731400430051336 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n",
            "a=group:BUNDLE 0\r\na=msid-semantic: WMS\r\n",
            "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\n",
            "a=rtcp:9 IN IP4 0.0.0.0\r\na=ice-ufrag:sIpS\r\n",
            "a=ice-pwd:sipsecloadgeneratoricepwd0\r\n",
            "a=fingerprint:sha-256 4A:AD:B9:B1:3F:82:18:3B:54:02:12:DF:3E:5D:49:6B:",
            "19:E5:7C:AB:4A:AD:B9:B1:3F:82:18:3B:54:02:12:DF\r\n",
            "a=setup:",
            $setup,
            "\r\na=mid:0\r\na=sendrecv\r\na=rtcp-mux\r\na=rtpmap:111 opus/48000/2\r\n"
        )
        .as_bytes()
    };
}
/// A WebRTC offer (either DTLS role).
const WEBRTC_OFFER: &[u8] = webrtc_sdp!("actpass");
/// A WebRTC answer (the DTLS client, as browsers answer).
const WEBRTC_ANSWER: &[u8] = webrtc_sdp!("active");

/// The load generator's UA: UAC, UAS, or both.
pub struct Ua {
    cfg: UaConfig,
    txs: Transactions<Endpoint, TxUser>,
    calls: HashMap<u64, Call>,
    next_call: u64,
    wheel: TimerWheel<Event>,
    uas_calls: Vec<Option<UasCall>>,
    uas_free: Vec<u32>,
    uas_generation: u32,
    outputs: Vec<Output<Endpoint, TxUser>>,
    fired: Vec<Event>,
    scratch: Vec<u8>,
    /// What this UA counted so far.
    pub stats: RunTally,
    /// Numbers of the operations that ended, when `UaConfig::report_ended` asks for them
    /// (per-call connections close on them); the driver drains it.
    pub ended: Vec<u64>,
    /// Per (user, registrar's challenge): the last challenge and the nonce count last used
    /// with it, for `UaConfig::auth_reuse`.
    nonces: HashMap<(usize, bool), (Challenge, u32)>,
    /// Proxychain keys k_AD by user, derived once.
    pc_keys: HashMap<usize, [u8; 32]>,
    /// Per user, the chain of the last verified `PC` challenge, answered ahead of any
    /// challenge with its next counter under `UaConfig::auth_reuse`.
    pc_chains: HashMap<usize, sip_core::proxychain::ClientChain>,
    /// Methods the proxy has challenged with `PC`: only these are answered ahead, since an
    /// answer on a request the proxy does not authenticate (a BYE, say) would spend a counter
    /// on the client that the proxy never steps, and every later answer would miss.
    pc_methods: Vec<&'static str>,
    /// Secret seed of the n_AP nonces.
    pc_seed: [u8; 16],
    pc_counter: u64,
    /// The target's overload control feedback (`UaConfig::oc`).
    throttle: sip_core::overload::Throttle,
    /// No new operation starts before then (`UaConfig::honour_retry_after`).
    held_off_until_us: u64,
    /// The callee's registration flows (`UaConfig::register`), by number.
    flows: Vec<register::Flow>,
    /// The flow on each of the driver's links.
    flow_by_link: HashMap<u32, u32>,
    /// Each user's `+sip.instance` URN.
    instances: Vec<String>,
    /// What the registrations ask of the driver's links; the driver drains it.
    pub flow_ops: Vec<FlowOp>,
}

fn ms(us: u64) -> u64 {
    us / 1000
}

impl Ua {
    /// A UA with nothing in flight, its clocks started at `now_us` (µs).
    pub fn new(cfg: UaConfig, now_us: u64) -> Ua {
        let timers = cfg.timers;
        Ua {
            cfg,
            txs: Transactions::new(ms(now_us), timers),
            calls: HashMap::new(),
            next_call: 0,
            wheel: TimerWheel::new(ms(now_us)),
            uas_calls: Vec::new(),
            uas_free: Vec::new(),
            uas_generation: 0,
            outputs: Vec::new(),
            fired: Vec::new(),
            scratch: Vec::with_capacity(2048),
            stats: RunTally::default(),
            ended: Vec::new(),
            nonces: HashMap::new(),
            pc_keys: HashMap::new(),
            pc_chains: HashMap::new(),
            pc_methods: Vec::new(),
            pc_seed: {
                let mut seed = [0u8; 16];
                let _ = getrandom::getrandom(&mut seed);
                seed
            },
            pc_counter: 0,
            throttle: sip_core::overload::Throttle::new(),
            held_off_until_us: 0,
            flows: Vec::new(),
            flow_by_link: HashMap::new(),
            instances: Vec::new(),
            flow_ops: Vec::new(),
        }
    }

    /// Calls (operations) started and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Answered calls still waiting for their ACK or BYE.
    #[cfg(test)]
    pub(crate) fn uas_in_flight(&self) -> usize {
        self.uas_calls.len() - self.uas_free.len()
    }

    /// When `on_tick` next has work, in microseconds.
    pub fn next_deadline_us(&self) -> Option<u64> {
        let a = self.txs.next_deadline();
        let b = self.wheel.next_deadline();
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b) * 1000),
            (a, b) => a.or(b).map(|d| d * 1000),
        }
    }

    /// Fails every operation still in flight (the run is over) with `reason`.
    pub(crate) fn abandon_all(&mut self, reason: &str) {
        for _ in self.calls.drain() {
            self.stats.failure(reason);
        }
    }

    fn write_head(&self, m: &mut Vec<u8>, h: &Head<'_>) {
        let (method, number, epoch) = (h.method, h.number, self.cfg.epoch);
        let _ = write!(
            m,
            "{method} {} SIP/2.0\r\nVia: SIP/2.0/{} {};branch={}{}\r\n\
             Max-Forwards: 70\r\nFrom: <{}>;tag={epoch:x}-{number:x}\r\nTo: {}\r\n\
             Call-ID: {number:x}-{epoch:x}@sipsec-load\r\nCSeq: {} {method}\r\n",
            h.uri,
            self.cfg.transport.via_token(),
            self.cfg.uac_local.of_call(number),
            h.branch,
            match (self.cfg.rport, self.cfg.oc) {
                (false, false) => "",
                (true, false) => ";rport",
                (false, true) => sip_core::overload::ANNOUNCE,
                (true, true) => ";rport;oc;oc-algo=\"loss\"",
            },
            self.aor(h.caller),
            h.to,
            h.cseq,
        );
        for r in h.routes {
            let _ = write!(m, "Route: {r}\r\n");
        }
    }

    /// Handles one message from `from`.
    pub fn on_message(
        &mut self,
        now_us: u64,
        from: Endpoint,
        data: &[u8],
        out: &mut Vec<Transmit>,
    ) {
        if !self.flows.is_empty() && crate::stun::is_stun(data) {
            self.on_stun(from, data);
            return;
        }
        let Ok(msg) = Message::parse(data) else {
            self.stats.stray += 1;
            return;
        };
        if msg.is_request() {
            self.on_request(now_us, from, &msg);
        } else {
            self.on_response(now_us, &msg);
        }
        self.drain(out);
    }

    /// An in-dialog request without a body (ACK, BYE): `head` and `Content-Length: 0`.
    fn bodiless(&self, head: &Head<'_>) -> Bytes {
        let mut m = Vec::with_capacity(512);
        self.write_head(&mut m, head);
        m.extend_from_slice(b"Content-Length: 0\r\n\r\n");
        Bytes::from(m)
    }

    /// Fires due timers.
    pub fn on_tick(&mut self, now_us: u64, out: &mut Vec<Transmit>) {
        let now = ms(now_us);
        let before = self.outputs.len();
        self.txs.advance(now, &mut self.outputs);
        // Every transmission a timer causes is a retransmission (A, E, G).
        let retransmitted = self.outputs[before..]
            .iter()
            .filter(|o| matches!(o, Output::Transmit { .. }))
            .count();
        self.stats.retransmissions(retransmitted as u64);
        let mut fired = std::mem::take(&mut self.fired);
        self.wheel.advance(now, &mut fired);
        for event in fired.drain(..) {
            match event {
                Event::HangUp(number) => self.hang_up(now_us, number),
                Event::Resend2xx { slot, generation } => self.resend_2xx(now, slot, generation),
                Event::Refresh { .. }
                | Event::KeepAlive { .. }
                | Event::KeepAliveLost { .. }
                | Event::Reopen { .. } => self.on_register_event(now_us, event),
            }
        }
        self.fired = fired;
        self.drain(out);
    }

    /// Turns transaction outputs into transmissions; timeouts fail their calls.
    fn drain(&mut self, out: &mut Vec<Transmit>) {
        let mut outputs = std::mem::take(&mut self.outputs);
        for o in outputs.drain(..) {
            match o {
                Output::Transmit { dest, data } => out.push((dest, data)),
                Output::Timeout {
                    id,
                    user: TxUser::Uac(number),
                    ..
                } => {
                    let current = self.calls.get(&number).is_some_and(|c| c.tx == Some(id));
                    if current {
                        let stage = self.calls[&number].stage;
                        let reason = if stage == Stage::Bye {
                            "BYE timeout"
                        } else {
                            "timeout"
                        };
                        self.finish(number, Some(reason));
                    }
                }
                Output::Timeout {
                    id,
                    user: TxUser::Register(flow),
                    ..
                } => self.register_timed_out(flow, id),
                Output::Timeout { .. } | Output::Terminated { .. } => {}
            }
        }
        self.outputs = outputs;
    }
}

/// The reason phrase a response carried (failure reasons quote the peer, not our table).
fn reason_of(msg: &Message<'_>) -> String {
    match msg.start_line() {
        sip_core::message::StartLine::Response { reason, .. } if !reason.is_empty() => {
            String::from_utf8_lossy(reason).into_owned()
        }
        _ => build::reason_phrase(msg.status().unwrap_or(0)).to_string(),
    }
}

/// The call number and epoch inside one of our Call-IDs (`{number:x}-{epoch:x}@sipsec-load`).
pub(crate) fn call_number(call_id: &[u8]) -> Option<(u64, u32)> {
    let s = std::str::from_utf8(call_id).ok()?;
    let (number, rest) = s.split_once('-')?;
    let (epoch, _) = rest.split_once('@')?;
    Some((
        u64::from_str_radix(number, 16).ok()?,
        u32::from_str_radix(epoch, 16).ok()?,
    ))
}

/// Where to send to reach a URI or a `<uri>;params` route value (IP literals only).
fn next_hop_addr(uri_or_route: &str) -> Option<SocketAddr> {
    let s = uri_or_route.trim();
    let inner = match (s.find('<'), s.find('>')) {
        (Some(a), Some(b)) if a < b => &s[a + 1..b],
        _ => s,
    };
    let uri = Uri::parse(inner.as_bytes()).ok()?;
    sipsec_transport::net::transport::uri_peer(&uri).map(|p| p.addr)
}

#[cfg(test)]
mod tests;

/// The To header of a message as written (with the tag that names the dialog).
fn to_of(msg: &Message<'_>) -> String {
    msg.header_value(HeaderName::To)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}
