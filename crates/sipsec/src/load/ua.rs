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
//!   challenges up to [`PC_MAX_TRIES`] times, since a user's concurrent calls race for one
//!   chain and the loser is told to start over;
//! - 3xx followed to the first Contact when the redirect scenario asks for it.

use super::stats::Stats;
use super::users::Users;
use crate::net::transport::Transport;
use bytes::Bytes;
use sip_core::digest::{self, Challenge};
use sip_core::message::{build, HeaderName, Message, Method, Uri};
use sip_core::timer::{TimerHandle, TimerWheel};
use sip_core::transaction::{Output, RequestMatch, ResponseMatch, Timers, Transactions, TxId};
use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

/// A local endpoint (socket or connection, chosen by the driver) and a remote address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer {
    pub link: u32,
    pub addr: SocketAddr,
}

/// Bytes for the driver to send.
pub type Transmit = (Peer, Bytes);

/// What one started operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// INVITE, (180), 200, ACK, hold, BYE, 200.
    Call,
    /// REGISTER, 200.
    Register,
    /// INVITE, 302; then the call to the first Contact when `follow`.
    Redirect { follow: bool },
    /// OPTIONS, 200.
    Options,
}

/// Everything the UA needs to know, fixed for a run.
#[derive(Clone)]
pub struct UaConfig {
    pub scenario: Scenario,
    /// Where the UAC sends new requests (the server, or a UAS directly).
    pub target: Peer,
    /// The UAC's own address (Via, Contact).
    pub uac_local: SocketAddr,
    /// The UAS's own address (Contact of its 200), when this UA answers calls.
    pub uas_local: Option<SocketAddr>,
    pub transport: Transport,
    /// Host part of Request-URIs, From and To (default: the target's address).
    pub domain: String,
    pub users: Arc<Users>,
    /// Callee user when no user file is given.
    pub service: String,
    /// Milliseconds a call stays established before the UAC hangs up.
    pub hold_ms: u64,
    pub expires: u32,
    /// The address registered in Contact (default: the UAC's own).
    pub register_contact: Option<String>,
    /// Ask for responses at the source port (`;rport`, RFC 3581) in the UAC's Via.
    pub rport: bool,
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
}

#[derive(Debug, Clone, Copy)]
enum TxUser {
    Uac(u64),
    Uas,
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
    next_hop: Peer,
    ack: Bytes,
}

struct Call {
    caller: usize,
    stage: Stage,
    started_us: u64,
    cseq: u32,
    request_uri: String,
    to: String,
    next_hop: Peer,
    tx: Option<TxId>,
    dialog: Option<Dialog>,
    auth_tries: u8,
    /// The Proxychain nonce n_AP sent with the current request.
    pc_nonce: sip_core::proxychain::Nonce,
    latency_recorded: bool,
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
    peer: Peer,
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
}

/// `PC` challenges a call answers before giving up: the first response, then up to a few
/// restarts (hello, response) after the hello challenge that says another call of the same
/// user spent the value first.
const PC_MAX_TRIES: u8 = 6;

/// An SDP offer/answer the size of SIPp's, so servers see realistic messages.
const SDP: &[u8] = b"v=0\r\no=user1 53655765 2353687637 IN IP4 127.0.0.1\r\ns=-\r\n\
c=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n";

/// The load generator's UA: UAC, UAS, or both.
pub struct Ua {
    cfg: UaConfig,
    txs: Transactions<Peer, TxUser>,
    calls: HashMap<u64, Call>,
    next_call: u64,
    wheel: TimerWheel<Event>,
    uas_calls: Vec<Option<UasCall>>,
    uas_free: Vec<u32>,
    uas_generation: u32,
    outputs: Vec<Output<Peer, TxUser>>,
    fired: Vec<Event>,
    scratch: Vec<u8>,
    pub stats: Stats,
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
}

fn ms(us: u64) -> u64 {
    us / 1000
}

impl Ua {
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
            stats: Stats::default(),
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
        }
    }

    /// Calls (operations) started and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Answered calls still waiting for their ACK or BYE.
    pub fn uas_in_flight(&self) -> usize {
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
    pub fn abandon_all(&mut self, reason: &str) {
        for _ in self.calls.drain() {
            self.stats.failure(reason);
        }
    }

    /// Starts one operation of the configured scenario.
    pub fn start(&mut self, now_us: u64, out: &mut Vec<Transmit>) {
        let number = self.next_call;
        self.next_call += 1;
        self.stats.attempt();
        let n = self.cfg.users.len().max(1);
        let caller = (number % n as u64) as usize;
        // The callee is another user of the file when there are several.
        let callee = if n > 1 { (caller + 1) % n } else { caller };
        let stage = match self.cfg.scenario {
            Scenario::Call | Scenario::Redirect { .. } => Stage::Invite,
            Scenario::Register => Stage::Register,
            Scenario::Options => Stage::Options,
        };
        let domain = self.domain_of(caller).to_string();
        let (request_uri, to) = match stage {
            Stage::Register => {
                let aor = self.aor(caller);
                (format!("sip:{domain}"), format!("<{aor}>"))
            }
            Stage::Options => (format!("sip:{domain}"), format!("<sip:{domain}>")),
            _ => {
                let aor = self.callee_aor(callee);
                (aor.clone(), format!("<{aor}>"))
            }
        };
        let call = Call {
            caller,

            stage,
            started_us: now_us,
            cseq: 1,
            request_uri,
            to,
            next_hop: self.cfg.target,
            tx: None,
            dialog: None,
            auth_tries: 0,
            pc_nonce: [0; 16],
            latency_recorded: false,
            hold: None,
            branches: 0,
            extra_dialogs: Vec::new(),
        };
        self.calls.insert(number, call);
        self.send_request(now_us, number, None);
        self.drain(out);
    }

    fn domain_of(&self, user: usize) -> &str {
        self.cfg
            .users
            .get(user)
            .and_then(|u| u.domain.as_deref())
            .unwrap_or(&self.cfg.domain)
    }

    fn aor(&self, user: usize) -> String {
        let name = self.cfg.users.get(user).map_or("sipsec", |u| &u.username);
        format!("sip:{name}@{}", self.domain_of(user))
    }

    fn callee_aor(&self, callee: usize) -> String {
        match self.cfg.users.get(callee) {
            Some(u) => format!("sip:{}@{}", u.username, self.domain_of(callee)),
            None => format!("sip:{}@{}", self.cfg.service, self.cfg.domain),
        }
    }

    /// Sends the call's current request in a new client transaction. `auth` is the
    /// `(header name, value)` answering a challenge.
    fn send_request(&mut self, now_us: u64, number: u64, auth: Option<(&str, String)>) {
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        call.branches += 1;
        let branch = format!("z9hG4bK-{:x}-{number:x}-{}", self.cfg.epoch, call.branches);
        let method = call.stage.method();
        let (to, routes, dest) = match (&call.dialog, call.stage) {
            (Some(d), Stage::Bye) => (d.to.clone(), d.routes.clone(), d.next_hop),
            _ => (call.to.clone(), Vec::new(), call.next_hop),
        };
        let uri = call.current_uri().to_string();
        let caller = call.caller;
        let head = Head {
            method,
            uri: &uri,
            branch: &branch,
            number,
            caller,
            to: &to,
            cseq: call.cseq,
            routes: &routes,
        };
        let mut m = std::mem::take(&mut self.scratch);
        m.clear();
        self.write_head(&mut m, &head);
        let user_name = self
            .cfg
            .users
            .get(caller)
            .map_or("sipsec", |u| u.username.as_str());
        match method {
            "INVITE" => {
                let _ = write!(
                    m,
                    "Contact: <sip:{user_name}@{}{}>\r\n",
                    self.cfg.uac_local,
                    self.cfg.transport.uri_param()
                );
            }
            "REGISTER" => {
                let contact = self
                    .cfg
                    .register_contact
                    .clone()
                    .unwrap_or_else(|| self.cfg.uac_local.to_string());
                let _ = write!(
                    m,
                    "Contact: <sip:{user_name}@{contact}{}>\r\nExpires: {}\r\n",
                    self.cfg.transport.uri_param(),
                    self.cfg.expires
                );
            }
            _ => {}
        }
        let auth = match auth {
            Some(a) => Some(a),
            None if self.cfg.proxychain.is_some() => self
                .pc_reused(caller, method, number)
                .or_else(|| self.pc_hello(caller, method, number)),
            None if self.cfg.auth_reuse => self.reused_credentials(caller, method, &uri, number),
            None => None,
        };
        if let Some((name, value)) = auth {
            let _ = write!(m, "{name}: {value}\r\n");
        }
        let body: &[u8] = if method == "INVITE" { SDP } else { b"" };
        if !body.is_empty() {
            m.extend_from_slice(b"Content-Type: application/sdp\r\n");
        }
        let _ = write!(m, "Content-Length: {}\r\n\r\n", body.len());
        m.extend_from_slice(body);
        let data = Bytes::copy_from_slice(&m);
        self.scratch = m;
        let reliable = self.cfg.transport.reliable();
        let id = self.txs.create_client(
            ms(now_us),
            data,
            branch.as_bytes(),
            method.as_bytes(),
            dest,
            reliable,
            TxUser::Uac(number),
            &mut self.outputs,
        );
        if let Some(call) = self.calls.get_mut(&number) {
            call.tx = Some(id);
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
            self.cfg.uac_local,
            h.branch,
            if self.cfg.rport { ";rport" } else { "" },
            self.aor(h.caller),
            h.to,
            h.cseq,
        );
        for r in h.routes {
            let _ = write!(m, "Route: {r}\r\n");
        }
    }

    /// Handles one message from `from`.
    pub fn on_message(&mut self, now_us: u64, from: Peer, data: &[u8], out: &mut Vec<Transmit>) {
        let msg = match Message::parse(data) {
            Ok(m) => m,
            Err(_) => {
                self.stats.stray += 1;
                return;
            }
        };
        if msg.is_request() {
            self.on_request(now_us, from, &msg);
        } else {
            self.on_response(now_us, &msg);
        }
        self.drain(out);
    }

    fn on_response(&mut self, now_us: u64, msg: &Message<'_>) {
        let before = self.outputs.len();
        let id = match self.txs.recv_response(ms(now_us), msg, &mut self.outputs) {
            ResponseMatch::Deliver(id) => id,
            ResponseMatch::Absorbed => {
                // A retransmitted final response re-sends the ACK: count it.
                self.stats
                    .retransmissions((self.outputs.len() - before) as u64);
                return;
            }
            ResponseMatch::Unmatched => {
                // A 2xx retransmitted after the INVITE transaction ended: ACK it again.
                self.reack_unmatched(msg);
                return;
            }
        };
        let Some(&TxUser::Uac(number)) = self.txs.user(id) else {
            return;
        };
        let code = msg.status().unwrap_or(0);
        let Some(call) = self.calls.get_mut(&number) else {
            // The call already ended: nothing left to answer.
            return;
        };
        if call.tx != Some(id) {
            // A response to an earlier request of this call (e.g. a 2xx retransmission of
            // the INVITE while the BYE is out): the ACK must go again.
            if (200..300).contains(&code) && msg.cseq().method == b"INVITE" {
                self.on_later_invite_2xx(number, msg);
            }
            return;
        }
        if code < 200 {
            return;
        }
        if code == 401 || code == 407 {
            self.answer_challenge(now_us, number, code, msg);
            return;
        }
        match call.stage {
            Stage::Invite if (200..300).contains(&code) => self.on_invite_ok(now_us, number, msg),
            Stage::Invite if (300..400).contains(&code) => {
                self.on_redirect(now_us, number, code, msg)
            }
            Stage::Register | Stage::Options if (200..300).contains(&code) => {
                let latency = now_us - call.started_us;
                self.stats.latency(latency);
                self.finish(number, None);
            }
            Stage::Bye if (200..300).contains(&code) => self.finish(number, None),
            stage => {
                let what = if stage == Stage::Bye { "BYE " } else { "" };
                let reason = format!("{what}{code} {}", reason_of(msg));
                self.finish(number, Some(&reason));
            }
        }
    }

    fn reack_unmatched(&mut self, msg: &Message<'_>) {
        let branch = msg.top_via().branch.unwrap_or_default();
        if msg.cseq().method == b"BYE" && branch.windows(2).any(|w| w == b"-x") {
            return; // the answer to the BYE that ended a forked call's extra dialog
        }
        if !msg.status().is_some_and(|c| (200..300).contains(&c)) || msg.cseq().method != b"INVITE"
        {
            self.stats.stray += 1;
            return;
        }
        let ours = call_number(msg.call_id())
            .filter(|&(_, epoch)| epoch == self.cfg.epoch)
            .is_some_and(|(number, _)| self.on_later_invite_2xx(number, msg));
        if !ours {
            self.stats.stray += 1;
        }
    }

    /// Ends a call: success when `failure` is None.
    fn finish(&mut self, number: u64, failure: Option<&str>) {
        if let Some(call) = self.calls.remove(&number) {
            if let Some(h) = call.hold {
                self.wheel.cancel(h);
            }
            if self.cfg.report_ended {
                self.ended.push(number);
            }
            match failure {
                None => self.stats.success(),
                Some(reason) => self.stats.failure(reason),
            }
        }
    }

    /// Credentials from `caller`'s last challenge with the next nonce count, if there is one.
    fn reused_credentials(
        &mut self,
        caller: usize,
        method: &str,
        uri: &str,
        number: u64,
    ) -> Option<(&'static str, String)> {
        let register = method == "REGISTER";
        let user = self.cfg.users.get(caller)?;
        let (challenge, nc) = self.nonces.get_mut(&(caller, register))?;
        *nc += 1;
        let cnonce = format!("{:x}{number:x}r", self.cfg.epoch);
        let value =
            challenge.authorization(&user.username, &user.password, method, uri, *nc, &cnonce);
        let name = digest::credentials_header(digest::challenge_status(register)).as_str();
        Some((name, value))
    }

    /// A fresh n_AP: unpredictable (keyed by a random seed), never repeated in this run.
    fn pc_nonce(&mut self) -> sip_core::proxychain::Nonce {
        use sha2::Digest as _;
        self.pc_counter += 1;
        let mut h = sha2::Sha256::new();
        h.update(self.pc_seed);
        h.update(self.pc_counter.to_be_bytes());
        let mut n = [0; 16];
        n.copy_from_slice(&h.finalize()[..16]);
        n
    }

    /// A and B of a call as the proxy reads them: user@host of its From and To URIs.
    fn pc_parties(&self, caller: usize, number: u64) -> Option<(String, String)> {
        let username = &self.cfg.users.get(caller)?.username;
        let from = format!("{username}@{}", self.domain_of(caller));
        let mut to = self
            .calls
            .get(&number)?
            .to
            .trim_start_matches('<')
            .trim_start_matches("sip:")
            .split(['>', ';'])
            .next()
            .unwrap_or_default()
            .to_string();
        if !to.contains('@') {
            to.insert(0, '@');
        }
        Some((from, to))
    }

    /// Under `auth_reuse`, the response for the next counter of the user's verified chain,
    /// sent without waiting to be challenged.
    fn pc_reused(
        &mut self,
        caller: usize,
        method: &'static str,
        number: u64,
    ) -> Option<(&'static str, String)> {
        if !self.cfg.auth_reuse || !self.pc_methods.contains(&method) {
            return None;
        }
        let (from, to) = self.pc_parties(caller, number)?;
        let username = &self.cfg.users.get(caller)?.username;
        let r = self
            .pc_chains
            .get_mut(&caller)?
            .next(username, from.as_bytes(), to.as_bytes())?;
        let name =
            digest::credentials_header(digest::challenge_status(method == "REGISTER")).as_str();
        Some((name, r.render()))
    }

    /// The Proxychain hello for a new request: the user and a fresh nonce.
    fn pc_hello(
        &mut self,
        caller: usize,
        method: &str,
        number: u64,
    ) -> Option<(&'static str, String)> {
        let username = self.cfg.users.get(caller)?.username.clone();
        let n_ap = self.pc_nonce();
        self.calls.get_mut(&number)?.pc_nonce = n_ap;
        let hello = sip_core::proxychain::Hello { username, n_ap };
        let name =
            digest::credentials_header(digest::challenge_status(method == "REGISTER")).as_str();
        Some((name, hello.render()))
    }

    /// Answers a `PC` challenge: checks the network's proof, then reveals the next chain
    /// value (or starts over with a hello when the proxy asks for one).
    fn answer_pc(&mut self, now_us: u64, number: u64, code: u16, value: &[u8]) {
        use sip_core::proxychain::{Authenticate, ClientChain};
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        let (caller, tries) = (call.caller, call.auth_tries);
        let method = call.stage.method();
        if !self.pc_methods.contains(&method) {
            self.pc_methods.push(method);
        }
        let (Some(user), Some(realm)) = (self.cfg.users.get(caller), &self.cfg.proxychain) else {
            self.finish(
                number,
                Some(&format!("{code} (no credentials: give --users)")),
            );
            return;
        };
        let username = user.username.clone();
        let challenge = match Authenticate::parse(value) {
            Ok(Authenticate::Challenge(c)) => Some(c),
            Ok(Authenticate::Hello { .. }) => None,
            Err(e) => {
                self.finish(
                    number,
                    Some(&format!("{code} with a bad PC challenge: {e}")),
                );
                return;
            }
        };
        // After a response, the hello challenge again means another call of the same user
        // spent the chain value first: start over, a few times.
        if tries >= PC_MAX_TRIES {
            self.finish(
                number,
                Some(&format!("{code} (Proxychain credentials refused)")),
            );
            return;
        }
        call.auth_tries += 1;
        call.cseq += 1;
        let Some(challenge) = challenge else {
            // The hello challenge: start over with a fresh nonce (and, if an answer given
            // ahead was refused, without the chain it came from).
            self.pc_chains.remove(&caller);
            self.send_request(now_us, number, None);
            return;
        };
        let password = user.password.clone();
        let key = *self
            .pc_keys
            .entry(caller)
            .or_insert_with(|| sip_core::proxychain::user_key(&username, realm, &password));
        let (Some((from, to)), Some(call)) =
            (self.pc_parties(caller, number), self.calls.get(&number))
        else {
            return;
        };
        let answered = ClientChain::answer(
            &key,
            &challenge,
            &call.pc_nonce,
            &username,
            from.as_bytes(),
            to.as_bytes(),
        );
        match answered {
            Ok((chain, r)) => {
                if self.cfg.auth_reuse {
                    self.pc_chains.insert(caller, chain);
                }
                let name = digest::credentials_header(code).as_str();
                self.send_request(now_us, number, Some((name, r.render())));
            }
            Err(e) => {
                // The network did not prove itself: never answer it.
                self.finish(number, Some(&format!("{code} refused: {e}")));
            }
        }
    }

    fn answer_challenge(&mut self, now_us: u64, number: u64, code: u16, msg: &Message<'_>) {
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        let header = if code == 401 {
            HeaderName::WwwAuthenticate
        } else {
            HeaderName::ProxyAuthenticate
        };
        if self.cfg.proxychain.is_some() {
            if let Some(v) = msg
                .headers_named(header)
                .map(|h| msg.value(h))
                .find(|v| v.trim_ascii_start().starts_with(b"PC"))
            {
                let v = v.to_vec();
                self.answer_pc(now_us, number, code, &v);
                return;
            }
        }
        let challenge = msg.header_value(header).map(Challenge::parse);
        let reason = match (challenge, self.cfg.users.get(call.caller)) {
            (None, _) => Some(format!("{code} without a challenge")),
            (Some(Err(e)), _) => Some(format!("{code} with a bad challenge: {e}")),
            (Some(Ok(_)), None) => Some(format!("{code} (no credentials: give --users)")),
            (Some(Ok(c)), Some(_)) if call.auth_tries >= 1 && !(c.stale && call.auth_tries < 2) => {
                Some(format!(
                    "{code} {} (credentials refused)",
                    build::reason_phrase(code)
                ))
            }
            (Some(Ok(c)), Some(user)) => {
                call.auth_tries += 1;
                call.cseq += 1;
                let cnonce = format!("{:x}{number:x}{}", self.cfg.epoch, call.auth_tries);
                let value = c.authorization(
                    &user.username,
                    &user.password,
                    call.stage.method(),
                    call.current_uri(),
                    1,
                    &cnonce,
                );
                let name = digest::credentials_header(code).as_str();
                if self.cfg.auth_reuse {
                    self.nonces.insert((call.caller, code == 401), (c, 1));
                }
                self.send_request(now_us, number, Some((name, value)));
                None
            }
        };
        if let Some(reason) = reason {
            self.finish(number, Some(&reason));
        }
    }

    fn on_invite_ok(&mut self, now_us: u64, number: u64, msg: &Message<'_>) {
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        if call.dialog.is_some() {
            self.on_later_invite_2xx(number, msg);
            return;
        }
        if !call.latency_recorded {
            call.latency_recorded = true;
            self.stats.latency(now_us - call.started_us);
        }
        let dialog = match self.dialog_of(number, msg) {
            Ok(d) => d,
            Err(why) => {
                self.finish(number, Some(why));
                return;
            }
        };
        self.outputs.push(Output::Transmit {
            dest: dialog.next_hop,
            data: dialog.ack.clone(),
        });
        let call = self.calls.get_mut(&number).expect("checked above");
        call.dialog = Some(dialog);
        if self.cfg.hold_ms == 0 {
            self.hang_up(now_us, number);
        } else {
            let at = ms(now_us) + self.cfg.hold_ms;
            call.hold = Some(self.wheel.insert(at, Event::HangUp(number)));
        }
    }

    /// The dialog a 2xx to call `number`'s INVITE sets up, with the ACK for it.
    fn dialog_of(&self, number: u64, msg: &Message<'_>) -> Result<Dialog, &'static str> {
        let call = self.calls.get(&number).ok_or("call ended")?;
        let mut remote_target = None;
        let _ = msg.name_addrs(HeaderName::Contact, |_, na| {
            remote_target.get_or_insert_with(|| String::from_utf8_lossy(na.uri.raw).into_owned());
        });
        let mut routes = Vec::new();
        let _ = msg.name_addrs(HeaderName::RecordRoute, |_, na| {
            routes.push(String::from_utf8_lossy(&msg.as_bytes()[na.start..na.end]).into_owned());
        });
        routes.reverse();
        let to = to_of(msg);
        let remote_target = remote_target.ok_or("2xx without Contact")?;
        let hop_uri = routes.first().unwrap_or(&remote_target);
        let hop = next_hop_addr(hop_uri).ok_or("unroutable remote target or route")?;
        let next_hop = Peer {
            link: self.cfg.target.link,
            addr: hop,
        };
        let branch = format!(
            "z9hG4bK-{:x}-{number:x}-a{}",
            self.cfg.epoch,
            call.extra_dialogs.len()
        );
        let head = Head {
            method: "ACK",
            uri: &remote_target,
            branch: &branch,
            number,
            caller: call.caller,
            to: &to,
            cseq: call.cseq,
            routes: &routes,
        };
        let ack = self.bodiless(&head);
        Ok(Dialog {
            remote_target,
            routes,
            to,
            next_hop,
            ack,
        })
    }

    /// A 2xx to call `number`'s INVITE after its dialog is set up: a retransmission from the
    /// same UAS (ACKed again), or, when a proxy forked the INVITE, another UAS accepting too
    /// (RFC 3261 §13.2.2.4): its 2xx is ACKed and its dialog ended with a BYE, once. False
    /// when the call has no dialog.
    fn on_later_invite_2xx(&mut self, number: u64, msg: &Message<'_>) -> bool {
        let Some(call) = self.calls.get(&number).filter(|c| c.dialog.is_some()) else {
            return false;
        };
        let to = to_of(msg);
        if let Some(d) = call
            .dialog
            .iter()
            .chain(&call.extra_dialogs)
            .find(|d| d.to == to)
        {
            // A retransmission: its dialog's ACK again.
            let (dest, data) = (d.next_hop, d.ack.clone());
            self.outputs.push(Output::Transmit { dest, data });
            self.stats.retransmissions(1);
            return true;
        }
        let Ok(extra) = self.dialog_of(number, msg) else {
            self.stats.stray += 1;
            return true;
        };
        let branch = format!(
            "z9hG4bK-{:x}-{number:x}-x{}",
            self.cfg.epoch,
            call.extra_dialogs.len()
        );
        let bye = self.bodiless(&Head {
            method: "BYE",
            uri: &extra.remote_target,
            branch: &branch,
            number,
            caller: call.caller,
            to: &extra.to,
            cseq: call.cseq + 1,
            routes: &extra.routes,
        });
        for data in [extra.ack.clone(), bye] {
            self.outputs.push(Output::Transmit {
                dest: extra.next_hop,
                data,
            });
        }
        self.stats.extra_dialogs += 1;
        let call = self.calls.get_mut(&number).expect("checked above");
        call.extra_dialogs.push(extra);
        true
    }

    /// An in-dialog request without a body (ACK, BYE): `head` and `Content-Length: 0`.
    fn bodiless(&self, head: &Head<'_>) -> Bytes {
        let mut m = Vec::with_capacity(512);
        self.write_head(&mut m, head);
        m.extend_from_slice(b"Content-Length: 0\r\n\r\n");
        Bytes::from(m)
    }

    fn hang_up(&mut self, now_us: u64, number: u64) {
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        call.hold = None;
        call.stage = Stage::Bye;
        call.cseq += 1;
        call.auth_tries = 0;
        self.send_request(now_us, number, None);
    }

    fn on_redirect(&mut self, now_us: u64, number: u64, code: u16, msg: &Message<'_>) {
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        let Scenario::Redirect { follow } = self.cfg.scenario else {
            let reason = format!("{code} {}", reason_of(msg));
            self.finish(number, Some(&reason));
            return;
        };
        if !call.latency_recorded {
            call.latency_recorded = true;
            self.stats.latency(now_us - call.started_us);
        }
        if !follow {
            self.finish(number, None);
            return;
        }
        let mut contact = None;
        let _ = msg.name_addrs(HeaderName::Contact, |_, na| {
            contact.get_or_insert_with(|| String::from_utf8_lossy(na.uri.raw).into_owned());
        });
        let Some((contact, addr)) = contact.and_then(|c| next_hop_addr(&c).map(|a| (c, a))) else {
            self.finish(number, Some("3xx without a usable Contact"));
            return;
        };
        let call = self.calls.get_mut(&number).expect("checked above");
        call.request_uri = contact;
        call.next_hop = Peer {
            link: self.cfg.target.link,
            addr,
        };
        call.cseq += 1;
        call.auth_tries = 0;
        self.send_request(now_us, number, None);
    }

    fn on_request(&mut self, now_us: u64, from: Peer, msg: &Message<'_>) {
        let before = self.outputs.len();
        match self.txs.recv_request(ms(now_us), msg, &mut self.outputs) {
            RequestMatch::New => {}
            RequestMatch::Retransmission(_) => {
                self.stats
                    .retransmissions((self.outputs.len() - before) as u64);
                return;
            }
            RequestMatch::AckAbsorbed(_) => return,
            RequestMatch::Ack => {
                self.on_ack(msg);
                return;
            }
        }
        let source = Peer {
            link: from.link,
            addr: msg.top_via().response_addr(from.addr),
        };
        let reliable = self.cfg.transport.reliable();
        let id = self.txs.create_server(msg, source, reliable, TxUser::Uas);
        let now = ms(now_us);
        match msg.method() {
            Method::Invite => self.answer_invite(now, id, source, msg),
            Method::Bye => {
                let known = self.uas_slot(msg).is_some();
                let code = if known { 200 } else { 481 };
                if let Some(slot) = self.uas_slot(msg) {
                    self.end_uas_call(slot);
                    self.stats.uas_completed += 1;
                }
                self.respond(now, id, msg, code, None, b"", b"");
            }
            Method::Cancel => {
                // Calls are answered at once, so there is never an INVITE left to cancel.
                self.respond(now, id, msg, 481, None, b"", b"");
            }
            Method::Options | Method::Register => {
                self.respond(now, id, msg, 200, None, b"", b"");
            }
            _ => {
                self.respond(now, id, msg, 501, None, b"", b"");
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn respond(
        &mut self,
        now: u64,
        id: TxId,
        msg: &Message<'_>,
        code: u16,
        tag: Option<&str>,
        extra: &[u8],
        body: &[u8],
    ) -> Bytes {
        let mut m = Vec::with_capacity(msg.as_bytes().len() + body.len() + 64);
        build::response(
            msg,
            code,
            build::reason_phrase(code),
            tag,
            extra,
            body,
            &mut m,
        );
        let data = Bytes::from(m);
        self.txs
            .respond(now, id, code, data.clone(), &mut self.outputs);
        data
    }

    fn answer_invite(&mut self, now: u64, id: TxId, source: Peer, msg: &Message<'_>) {
        let slot = self.uas_free.pop().unwrap_or_else(|| {
            self.uas_calls.push(None);
            (self.uas_calls.len() - 1) as u32
        });
        self.uas_generation = self.uas_generation.wrapping_add(1);
        let generation = self.uas_generation;
        let tag = format!("u{slot:x}.{generation:x}");
        self.respond(now, id, msg, 180, Some(&tag), b"", b"");
        let mut extra = Vec::with_capacity(256);
        for h in msg.headers_named(HeaderName::RecordRoute) {
            extra.extend_from_slice(b"Record-Route: ");
            extra.extend_from_slice(msg.value(h));
            extra.extend_from_slice(b"\r\n");
        }
        let contact = self.cfg.uas_local.unwrap_or(source.addr);
        let _ = write!(
            extra,
            "Contact: <sip:uas@{contact}{}>\r\nContent-Type: application/sdp\r\n",
            self.cfg.transport.uri_param()
        );
        let ok = self.respond(now, id, msg, 200, Some(&tag), &extra, SDP);
        let t1 = self.cfg.timers.t1;
        let reliable = self.cfg.transport.reliable();
        let timer = self.wheel.insert(
            now + if reliable { 64 * t1 } else { t1 },
            Event::Resend2xx { slot, generation },
        );
        self.uas_calls[slot as usize] = Some(UasCall {
            generation,
            ok,
            peer: source,
            interval_ms: t1,
            give_up_ms: now + 64 * t1,
            timer: Some(timer),
            acked: false,
        });
        self.stats.uas_answered += 1;
    }

    /// The UAS call a request's To tag names, if it is still live.
    fn uas_slot(&self, msg: &Message<'_>) -> Option<u32> {
        let to = msg.to().ok()?;
        let tag = std::str::from_utf8(to.tag()?).ok()?.strip_prefix('u')?;
        let (slot, generation) = tag.split_once('.')?;
        let slot = u32::from_str_radix(slot, 16).ok()?;
        let generation = u32::from_str_radix(generation, 16).ok()?;
        self.uas_calls
            .get(slot as usize)?
            .as_ref()
            .filter(|c| c.generation == generation)
            .map(|_| slot)
    }

    fn on_ack(&mut self, msg: &Message<'_>) {
        let Some(slot) = self.uas_slot(msg) else {
            return;
        };
        if let Some(c) = self.uas_calls[slot as usize].as_mut() {
            c.acked = true;
            if let Some(t) = c.timer.take() {
                self.wheel.cancel(t);
            }
        }
    }

    fn end_uas_call(&mut self, slot: u32) {
        if let Some(c) = self.uas_calls[slot as usize].take() {
            if let Some(t) = c.timer {
                self.wheel.cancel(t);
            }
            self.uas_free.push(slot);
        }
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
            }
        }
        self.fired = fired;
        self.drain(out);
    }

    fn resend_2xx(&mut self, now: u64, slot: u32, generation: u32) {
        let t2 = self.cfg.timers.t2;
        let reliable = self.cfg.transport.reliable();
        let Some(c) = self.uas_calls[slot as usize]
            .as_mut()
            .filter(|c| c.generation == generation)
        else {
            return;
        };
        c.timer = None;
        if c.acked {
            return;
        }
        if now >= c.give_up_ms || reliable {
            self.stats.failure("UAS: no ACK for 2xx");
            self.end_uas_call(slot);
            return;
        }
        c.interval_ms = (c.interval_ms * 2).min(t2);
        let at = (now + c.interval_ms).min(c.give_up_ms);
        self.outputs.push(Output::Transmit {
            dest: c.peer,
            data: c.ok.clone(),
        });
        c.timer = Some(self.wheel.insert(at, Event::Resend2xx { slot, generation }));
        self.stats.retransmissions(1);
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
pub fn call_number(call_id: &[u8]) -> Option<(u64, u32)> {
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
    crate::net::transport::uri_peer(&uri).map(|p| p.addr)
}

#[cfg(test)]
#[path = "ua_tests.rs"]
mod tests;

/// The To header of a message as written (with the tag that names the dialog).
fn to_of(msg: &Message<'_>) -> String {
    msg.header_value(HeaderName::To)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}
