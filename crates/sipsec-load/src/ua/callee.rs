//! The callee side (UAS): answering whatever arrives — INVITE with 180 and 200 (retransmitted
//! until the ACK), BYE, OPTIONS, REGISTER — and ending its calls.

use super::*;

impl Ua {
    pub(super) fn on_request(&mut self, now_us: u64, from: Endpoint, msg: &Message<'_>) {
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
        let source = Endpoint {
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

    #[allow(
        clippy::too_many_arguments,
        reason = "the callee answers from fields it borrows out of the request it is still parsing"
    )]
    pub(super) fn respond(
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

    pub(super) fn answer_invite(
        &mut self,
        now: u64,
        id: TxId,
        source: Endpoint,
        msg: &Message<'_>,
    ) {
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
        match self.flow_contact(source.link) {
            // A registered callee is reached the way it registered.
            Some(registered) => {
                let _ = write!(extra, "Contact: <{registered}>\r\n");
            }
            None => {
                let contact = self.cfg.uas_local.unwrap_or(source.addr);
                let _ = write!(
                    extra,
                    "Contact: <sip:uas@{contact}{}>\r\n",
                    self.cfg.transport.uri_param()
                );
            }
        }
        extra.extend_from_slice(b"Content-Type: application/sdp\r\n");
        let ok = self.respond(now, id, msg, 200, Some(&tag), &extra, self.cfg.sdp.answer());
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
    pub(super) fn uas_slot(&self, msg: &Message<'_>) -> Option<u32> {
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

    pub(super) fn on_ack(&mut self, msg: &Message<'_>) {
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

    pub(super) fn end_uas_call(&mut self, slot: u32) {
        if let Some(c) = self.uas_calls[slot as usize].take() {
            if let Some(t) = c.timer {
                self.wheel.cancel(t);
            }
            self.uas_free.push(slot);
        }
    }

    pub(super) fn resend_2xx(&mut self, now: u64, slot: u32, generation: u32) {
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
}
