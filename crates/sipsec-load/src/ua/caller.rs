//! The caller side (UAC): starting each operation of the scenario (REGISTER, OPTIONS, an
//! INVITE-ACK-BYE call), following its responses — dialogs from 2xx, ACKs, forks, redirects —
//! and finishing it with its outcome.

use super::*;

impl Ua {
    /// Counts one operation of the schedule as failed without sending it, for `reason` (the
    /// connection it would take is backlogged): its number is used up as `start` would.
    pub fn refuse_start(&mut self, reason: &str) {
        self.next_call += 1;
        self.stats.attempt();
        self.stats.failure(reason);
    }

    /// Starts one operation of the configured scenario.
    pub fn start(&mut self, now_us: u64, out: &mut Vec<Transmit>) {
        let number = self.next_call;
        self.next_call += 1;
        self.stats.attempt();
        if now_us < self.held_off_until_us {
            self.stats.failure("not sent: Retry-After");
            return;
        }
        if self.cfg.oc && !self.throttle.admit(now_us) {
            self.stats.failure("not sent: overload feedback");
            return;
        }
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
            answered: false,
            hold: None,
            branches: 0,
            extra_dialogs: Vec::new(),
        };
        self.calls.insert(number, call);
        self.send_request(now_us, number, None);
        self.drain(out);
    }

    pub(super) fn domain_of(&self, user: usize) -> &str {
        self.cfg
            .users
            .get(user)
            .and_then(|u| u.domain.as_deref())
            .unwrap_or(&self.cfg.domain)
    }

    pub(super) fn aor(&self, user: usize) -> String {
        let name = self
            .cfg
            .users
            .get(user)
            .map_or(self.cfg.caller.as_str(), |u| &u.username);
        format!("sip:{name}@{}", self.domain_of(user))
    }

    pub(super) fn callee_aor(&self, callee: usize) -> String {
        match self.cfg.users.get(callee) {
            Some(u) => format!("sip:{}@{}", u.username, self.domain_of(callee)),
            None => format!("sip:{}@{}", self.cfg.service, self.cfg.domain),
        }
    }

    /// Sends the call's current request in a new client transaction. `auth` is the
    /// `(header name, value)` answering a challenge.
    pub(super) fn send_request(&mut self, now_us: u64, number: u64, auth: Option<(&str, String)>) {
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
            .map_or(self.cfg.caller.as_str(), |u| u.username.as_str());
        match method {
            "INVITE" => {
                let _ = write!(
                    m,
                    "Contact: <sip:{user_name}@{}{}>\r\n",
                    self.cfg.uac_local.of_call(number),
                    self.cfg.transport.uri_param()
                );
            }
            "REGISTER" => {
                let contact = self
                    .cfg
                    .register_contact
                    .clone()
                    .unwrap_or_else(|| self.cfg.uac_local.of_call(number).to_string());
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
        if method == "INVITE" {
            if let Some(key) = &self.cfg.identity {
                if let Some(value) = identity(key, &self.aor(caller), &uri) {
                    let _ = write!(m, "Identity: {value}\r\n");
                }
            }
        }
        let body: &[u8] = if method == "INVITE" {
            self.cfg.sdp.offer()
        } else {
            b""
        };
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

    pub(super) fn on_response(&mut self, now_us: u64, msg: &Message<'_>) {
        if self.cfg.oc {
            if let Ok(fb) = sip_core::overload::Feedback::from_via(msg.top_via()) {
                self.throttle.on_feedback(now_us / 1000, fb);
            }
        }
        if self.cfg.honour_retry_after && msg.status() == Some(503) {
            if let Some(secs) = msg.retry_after().map(u64::from) {
                self.held_off_until_us = self.held_off_until_us.max(now_us + secs * 1_000_000);
            }
        }
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
        let number = match self.txs.user(id) {
            Some(&TxUser::Uac(number)) => number,
            Some(&TxUser::Register(flow)) => {
                self.on_register_response(now_us, flow, id, msg);
                return;
            }
            _ => return,
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
        if !call.answered && call.stage == Stage::Invite {
            call.answered = true;
            self.stats.first_response(now_us - call.started_us);
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
                self.on_redirect(now_us, number, code, msg);
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

    pub(super) fn reack_unmatched(&mut self, msg: &Message<'_>) {
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
    pub(super) fn finish(&mut self, number: u64, failure: Option<&str>) {
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

    pub(super) fn on_invite_ok(&mut self, now_us: u64, number: u64, msg: &Message<'_>) {
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
    pub(super) fn dialog_of(&self, number: u64, msg: &Message<'_>) -> Result<Dialog, &'static str> {
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
        let next_hop = Endpoint {
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
    pub(super) fn on_later_invite_2xx(&mut self, number: u64, msg: &Message<'_>) -> bool {
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

    pub(super) fn hang_up(&mut self, now_us: u64, number: u64) {
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        call.hold = None;
        call.stage = Stage::Bye;
        call.cseq += 1;
        call.auth_tries = 0;
        self.send_request(now_us, number, None);
    }

    pub(super) fn on_redirect(&mut self, now_us: u64, number: u64, code: u16, msg: &Message<'_>) {
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
        call.next_hop = Endpoint {
            link: self.cfg.target.link,
            addr,
        };
        call.cseq += 1;
        call.auth_tries = 0;
        self.send_request(now_us, number, None);
    }
}

/// The Identity header of an INVITE from `from` (the caller's AOR) to `uri`, signed with
/// `key` now; `None` when either names no telephone number.
fn identity(key: &sipsec_identity::SigningKey, from: &str, uri: &str) -> Option<String> {
    use sipsec_identity::{header, passport, tn, Attest, Claims};
    let (orig, dest) = (tn::from_uri(from)?, tn::from_uri(uri)?);
    let iat = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let claims = Claims {
        attest: Attest::A,
        orig,
        dest: vec![dest],
        iat,
        origid: passport::new_origid(),
    };
    Some(header::value(key, &claims))
}
