//! Local answers: the responses the engine makes itself (an error, a challenge, a redirect,
//! OPTIONS, a REGISTER's answer), and where they go.
//!
//! An [`Answer`] says what (status, reason, header lines), a [`ReplyTo`] says where, and
//! [`Engine::reply`] makes and sends it. Every answer carries our Server header, a
//! deterministic To tag (a retransmitted request gets the same tag, even from a stateless
//! server: RFC 3261 §16.11) and, for a neighbour that asked, overload feedback. Durable
//! registration makes a [`Reply`] first and sends it once the store has committed
//! ([`Engine::reply_prepare`], [`Engine::reply_send`]).

use super::{branch, response_peer, Effects, Engine, Link};
use crate::stats::inc;
use bytes::Bytes;
use sip_core::message::{build, Message, Method};
use sip_core::timer::Millis;
use sip_core::transaction::TxId;
use sipsec_transport::net::transport::Peer;

/// A response made here: its status, its reason and extra header lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Answer {
    pub code: u16,
    pub reason: &'static str,
    /// Header lines, each ending in CRLF (our Server header is added to them).
    pub headers: String,
}

impl Answer {
    /// An answer with no extra header lines.
    pub(super) fn new(code: u16, reason: &'static str) -> Answer {
        Answer {
            code,
            reason,
            headers: String::new(),
        }
    }

    /// The same answer with `headers` (CRLF-terminated lines).
    pub(super) fn with_headers(self, headers: impl Into<String>) -> Answer {
        Answer {
            headers: headers.into(),
            ..self
        }
    }
}

/// Where a local answer goes.
#[derive(Debug, Clone, Copy)]
pub(super) enum ReplyTo {
    /// Back to the request's sender, the peer it came from: through a new server transaction
    /// when stateful (it answers the request's retransmissions), straight back when
    /// stateless, or when the answer is a final non-2xx to an INVITE (see
    /// [`Engine::reply_prepare`]).
    Sender(Peer),
    /// Through the server transaction the request already has (it waited for DNS).
    Transaction(TxId),
    /// Straight to this peer, kept nowhere.
    Peer(Peer),
}

/// An answer made and addressed, not sent yet: its `to` is a transaction or a peer.
#[derive(Debug)]
pub(super) struct Reply {
    pub to: ReplyTo,
    code: u16,
    data: Bytes,
}

impl Engine {
    /// Sends `answer` to `msg` where `to` says.
    pub(super) fn reply(
        &mut self,
        now: Millis,
        to: ReplyTo,
        msg: &Message<'_>,
        answer: &Answer,
        fx: &mut Effects,
    ) {
        let reply = self.reply_prepare(now, to, msg, answer);
        self.reply_send(now, reply, fx);
    }

    /// Makes `answer` to `msg` and settles where it goes: a [`ReplyTo::Sender`] becomes the
    /// server transaction opened for it, or the peer it goes straight to.
    pub(super) fn reply_prepare(
        &mut self,
        now: Millis,
        to: ReplyTo,
        msg: &Message<'_>,
        answer: &Answer,
    ) -> Reply {
        let source = match to {
            ReplyTo::Sender(source) => Some(source.addr),
            _ => None,
        };
        let data = self.reply_bytes(now, msg, answer, source);
        let to = match to {
            ReplyTo::Sender(source) => {
                let dest = response_peer(msg.top_via(), source);
                if !self.cfg.stateful || (msg.method() == Method::Invite && answer.code >= 300) {
                    // A final answer made here to an INVITE, before anything was forwarded (a
                    // challenge, 403, 404, ...), is sent once and kept nowhere, as Kamailio's
                    // `sl_send_reply` does: a server transaction would repeat it to the
                    // address the Via names until Timer H, eleven times over 32 s, to whoever
                    // a spoofed datagram named (27.9x reflection). A caller that lost it
                    // retransmits its INVITE and is answered again; its ACK carries our
                    // deterministic tag and is absorbed (`reply_is_local_ack`).
                    ReplyTo::Peer(dest)
                } else {
                    let reliable = dest.transport.reliable();
                    ReplyTo::Transaction(self.tx.create_server(msg, dest, reliable, Link::Local))
                }
            }
            to => to,
        };
        Reply {
            to,
            code: answer.code,
            data,
        }
    }

    /// Sends an answer [`Engine::reply_prepare`] made.
    pub(super) fn reply_send(&mut self, now: Millis, reply: Reply, fx: &mut Effects) {
        match reply.to {
            ReplyTo::Transaction(id) => {
                // A request that waited for DNS is answered here after all: its response
                // context is done.
                if let Some(Link::Proxied(ctx)) = self.tx.user_mut(id) {
                    ctx.finish(self.clock.at(now), &self.stats);
                    ctx.waiting = None;
                }
                self.tx
                    .respond(now, id, reply.code, reply.data, &mut self.outputs);
            }
            // `reply_prepare` has settled a Sender into one of the others.
            ReplyTo::Peer(dest) | ReplyTo::Sender(dest) => fx.transmits.push((dest, reply.data)),
        }
    }

    /// An ACK for a response generated here that has no transaction (a shed request's 503):
    /// absorbed, not routed on.
    pub(super) fn reply_is_local_ack(&self, msg: &Message<'_>, to_tag: Option<&[u8]>) -> bool {
        msg.method() == Method::Ack
            && to_tag.is_some_and(|t| t.len() == 18 && t.starts_with(b"sS"))
            && to_tag == Some(local_tag(msg).as_bytes())
    }

    /// `answer` to `msg` as sent: its header lines (the top Via stamped with `source`, where
    /// the request came from, when known) plus our Server header, our To tag, and feedback
    /// for a neighbour that asked; counted.
    fn reply_bytes(
        &mut self,
        now: Millis,
        msg: &Message<'_>,
        answer: &Answer,
        source: Option<std::net::SocketAddr>,
    ) -> Bytes {
        self.stats.traffic.local_response(answer.code);
        inc(&self.stats.local_responses);
        let server = &self.cfg.server_line;
        let mut extra = String::with_capacity(answer.headers.len() + server.len());
        extra.push_str(&answer.headers);
        extra.push_str(server);
        let tag = local_tag(msg);
        let mut out = Vec::with_capacity(msg.as_bytes().len() / 2 + extra.len() + 64);
        build::response_from(
            msg,
            source,
            answer.code,
            answer.reason,
            Some(&tag),
            extra.as_bytes(),
            b"",
            &mut out,
        );
        self.overload_add_feedback(now, Bytes::from(out))
    }
}

/// A deterministic To tag for responses generated here: a retransmitted request gets the
/// same tag, even from a stateless server (RFC 3261 §16.11). Of the Call-ID and the top
/// Via's branch, which the ACK of a non-2xx answer repeats (RFC 3261 §17.1.1.3), so that
/// ACK is recognised without parsing its From.
pub(super) fn local_tag(msg: &Message<'_>) -> LocalTag {
    let h = branch::fnv1a(&[msg.call_id(), msg.top_via().branch.unwrap_or_default()]);
    let mut tag = *b"sS0000000000000000";
    for (i, digit) in tag[2..].iter_mut().enumerate() {
        *digit = b"0123456789abcdef"[(h >> (60 - 4 * i)) as usize & 0xf];
    }
    LocalTag(tag)
}

/// A To tag made here: `sS` and 16 hex digits, on the stack.
pub(super) struct LocalTag([u8; 18]);

impl std::ops::Deref for LocalTag {
    type Target = str;
    fn deref(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}
