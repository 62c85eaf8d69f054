//! Flow tokens (RFC 5626 §5.2): a flow — the transport, the address as seen after any NAT,
//! and the listener socket or connection a phone's messages came on — written into a URI we
//! hand out, under a MAC, so a request that brings the URI back is sent over that flow.
//!
//! A dialog with a phone behind a NAT (or one that accepts no connections) cannot be reached
//! at the Contact it wrote; as the outbound RFC's edge proxy does, this server puts the flow
//! in its own Record-Route, directionally (RFC 3261 §16.7 step 4 lets it rewrite its entry in
//! responses, as the dialog tokens in `relay` are): the request that opens the dialog carries
//! the caller's flow, which the callee keeps in its route set; the 1xx/2xx answers carry the
//! callee's, which the caller keeps. A request arriving with one of our Routes naming a flow,
//! and no further Route, goes over that flow (`fl=` URI parameter). As an edge proxy in
//! front of a registrar elsewhere, the same token goes in the Path (RFC 3327) we add to the
//! phone's REGISTER, so the registrar's requests for the phone come back along it. The MAC (HMAC-SHA256
//! under the per-process secret the dialog tokens use, first 8 bytes) keeps anyone from
//! writing a flow of their own choosing: a token opens only the flow it was made for.

use super::{relay, Engine};
use crate::config::NatMode;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hashbrown::HashMap;
use hmac::Mac;
use sip_core::message::rewrite::Rewriter;
use sip_core::message::{HeaderName, Message, Uri};
use sipsec_transport::net::transport::{uri_peer, ConnId, Peer, Transport};
use smallvec::SmallVec;
use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::sync::Arc;

/// The URI parameter that carries a flow token.
pub(super) const PARAM: &[u8] = b"fl";
/// Bytes of MAC kept in a token.
const MAC_BYTES: usize = 8;

fn mac(body: &[u8]) -> [u8; MAC_BYTES] {
    let mut m = relay::keyed_mac();
    m.update(b"flow/");
    m.update(body);
    let full = m.finalize().into_bytes();
    let mut out = [0u8; MAC_BYTES];
    out.copy_from_slice(&full[..MAC_BYTES]);
    out
}

fn transport_byte(t: Transport) -> u8 {
    match t {
        Transport::Udp => b'u',
        Transport::Tcp => b't',
        Transport::Tls => b's',
        Transport::Ws => b'w',
        Transport::Wss => b'W',
    }
}

/// The token for `flow`, as written in a URI: base64url without padding (RFC 4648 §5; its
/// alphabet is all URI-unreserved), 26 characters for an IPv4 flow where hex took 38 — every
/// Record-Route and Route of a NATed phone's dialog carries one, and is parsed with it.
pub(super) fn token(flow: Peer) -> Arc<str> {
    let body = Body::of(flow);
    MEMO.with_borrow_mut(|memo| {
        if let Some(written) = memo.made.get(&body) {
            return written.clone();
        }
        let written: Arc<str> = URL_SAFE_NO_PAD
            .encode([body.as_slice(), &mac(body.as_slice())].concat())
            .into();
        memo.room();
        memo.made.insert(body, written.clone());
        written
    })
}

/// What a token says of a flow, before its MAC: transport, connection, port and address.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Body {
    bytes: [u8; 23],
    len: u8,
}

impl Body {
    fn of(flow: Peer) -> Body {
        let mut bytes = [0u8; 23];
        bytes[0] = transport_byte(flow.transport);
        bytes[1..5].copy_from_slice(&flow.conn.to_be_bytes());
        bytes[5..7].copy_from_slice(&flow.addr.port().to_be_bytes());
        let len = match flow.addr.ip() {
            IpAddr::V4(ip) => {
                bytes[7..11].copy_from_slice(&ip.octets());
                11
            }
            IpAddr::V6(ip) => {
                bytes[7..23].copy_from_slice(&ip.octets());
                23
            }
        };
        Body { bytes, len }
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// Tokens this thread made and checked, each at the cost of one MAC rather than one per
/// message carrying it: a phone's flow token is the same in every call to it, and a call
/// makes or checks several (on a machine without SHA instructions, such as valgrind's, the
/// MACs were two thirds of what a call to a NATed phone adds). Only tokens whose MAC checked
/// out are kept, so what a peer makes up costs a MAC each time and takes no room.
#[derive(Default)]
struct Memo {
    /// A flow's token body (before the MAC) to the token written.
    made: HashMap<Body, Arc<str>>,
    /// A token written to the flow it names.
    checked: HashMap<Box<[u8]>, Peer>,
}

/// Tokens a [`Memo`] keeps, made and checked each, before it starts over.
const MEMO_MAX: usize = 4096;

impl Memo {
    /// Makes room for one more of each, forgetting everything when full (as cheap as any
    /// eviction, and rare: a worker meets this many flows between two clears only when it
    /// serves many more phones, whose tokens then cost a MAC again).
    fn room(&mut self) {
        if self.made.len() >= MEMO_MAX || self.checked.len() >= MEMO_MAX {
            self.made.clear();
            self.checked.clear();
        }
    }
}

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::new(Memo::default());
}

/// The flow a token names, if it is one of ours (its MAC checks out): a [`Peer::flow`].
pub(super) fn parse(written: &[u8]) -> Option<Peer> {
    if let Some(flow) = MEMO.with_borrow(|memo| memo.checked.get(written).copied()) {
        return Some(flow);
    }
    let flow = verify(written)?;
    MEMO.with_borrow_mut(|memo| {
        memo.room();
        memo.checked.insert(written.into(), flow);
    });
    Some(flow)
}

/// [`parse`] without the memo: the MAC checked.
fn verify(written: &[u8]) -> Option<Peer> {
    let bytes = URL_SAFE_NO_PAD.decode(written).ok()?;
    let (body, tag) = bytes.split_at_checked(bytes.len().checked_sub(MAC_BYTES)?)?;
    if !bool::from(subtle::ConstantTimeEq::ct_eq(tag, &mac(body)[..])) {
        return None;
    }
    let transport = match body.first()? {
        b'u' => Transport::Udp,
        b't' => Transport::Tcp,
        b's' => Transport::Tls,
        b'w' => Transport::Ws,
        b'W' => Transport::Wss,
        _ => return None,
    };
    let conn = ConnId::from_be_bytes(body.get(1..5)?.try_into().ok()?);
    let port = u16::from_be_bytes(body.get(5..7)?.try_into().ok()?);
    let ip = match body.len() - 7 {
        4 => IpAddr::from(<[u8; 4]>::try_from(&body[7..]).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(&body[7..]).ok()?),
        _ => return None,
    };
    Some(Peer {
        transport,
        addr: SocketAddr::new(ip, port),
        conn,
        flow: true,
    })
}

impl Engine {
    /// Whether the user agent at `source`, whose Contact is `contact`, must be reached over
    /// the flow it came on: it came on a connection (it may accept no other), or from
    /// somewhere other than its Contact (a NAT), or `[nat] mode` says always.
    fn flow_needed(&self, source: Peer, contact: Option<&Uri<'_>>) -> bool {
        match self.cfg.nat.mode {
            NatMode::Never => false,
            NatMode::Always => true,
            NatMode::Auto => {
                source.transport.reliable()
                    || contact
                        .and_then(uri_peer)
                        .is_none_or(|written| written.addr != source.addr)
            }
        }
    }

    /// In a cluster, the Path entry the other nodes route through to `binding` when only
    /// this node reaches it — over the connection it registered on (every TCP and TLS
    /// binding), or through the NAT mapping its REGISTER opened to this node's address: `<sip:ADVERTISE;lr;ob;fl=TOKEN>`,
    /// this node's advertised address with the flow's token. `None` outside a cluster, for a
    /// binding reached at its Contact as written, and for one behind an edge proxy (its Path
    /// already leads there).
    pub(super) fn flow_cluster_hop(&self, binding: &crate::location::Binding) -> Option<Arc<str>> {
        let cluster = self.cfg.cluster.as_ref()?;
        let received = binding.received.filter(|_| binding.path.is_none())?;
        let written = Uri::parse(binding.contact.as_bytes())
            .ok()
            .as_ref()
            .and_then(uri_peer);
        // A stream binding is reached over the connection it registered on while that is
        // open, which only this node holds, even when its Contact names the same address.
        if !binding.target.flow
            && !binding.target.transport.reliable()
            && written.is_some_and(|w| w.addr == binding.target.addr)
        {
            return None;
        }
        let at = cluster.advertise;
        let transport = match at.transport {
            Transport::Udp => String::new(),
            t => format!(";transport={t}"),
        };
        Some(
            format!(
                "<sip:{}{transport};lr;ob;fl={}>",
                super::hostport(at.addr),
                token(received.as_flow())
            )
            .into(),
        )
    }

    /// The flow token for the sender of a dialog-forming request, for our Record-Route:
    /// when it is the user agent itself (no Record-Route above ours) and must be reached
    /// over its flow.
    pub(super) fn flow_of_caller(&self, source: Peer, msg: &Message<'_>) -> Option<Arc<str>> {
        if msg.header(HeaderName::RecordRoute).is_some() {
            return None;
        }
        let contact = relay::hop_back(msg);
        self.flow_needed(source, contact.as_ref())
            .then(|| token(source.as_flow()))
    }

    /// The flow token for a REGISTER we forward to a registrar elsewhere, for the Path we
    /// add: when it comes from the user agent itself (one Via) and it must be reached over
    /// its flow, or it asks for outbound (`Supported: outbound`, a `reg-id`).
    pub(super) fn flow_of_registrant(&self, source: Peer, msg: &Message<'_>) -> Option<Arc<str>> {
        if msg.second_via().is_some() {
            return None;
        }
        let mut contact = None;
        let mut outbound = false;
        let _ = msg.name_addrs(HeaderName::Contact, |_, na| {
            outbound |= na.params.get(b"reg-id").is_some();
            contact.get_or_insert(na.uri);
        });
        (outbound || self.flow_needed(source, contact.as_ref())).then(|| token(source.as_flow()))
    }

    /// Sets the flow token in our Record-Route entries of a response that may form a dialog
    /// (1xx with a tag, 2xx) to the callee's flow — `source`, where the response came from —
    /// when the callee is the next hop (no entry above ours) and must be reached over it;
    /// else removes the caller's token the entries carried, which the caller has no use for.
    pub(super) fn flow_restamp_record_route(&self, rw: &mut Rewriter<'_, '_>, source: Peer) {
        let msg = rw.msg;
        if !(101..300).contains(&msg.status().unwrap_or(0))
            || msg.header(HeaderName::RecordRoute).is_none()
        {
            return;
        }
        // Most answers come from phones reached at their Contact, through Record-Routes
        // carrying no flow: nothing to do, and no Record-Route to parse.
        let contact = relay::first_contact(msg);
        let needed = self.flow_needed(source, contact.as_ref());
        if !needed && memchr::memmem::find(msg.as_bytes(), b";fl=").is_none() {
            return;
        }
        let base = msg.as_bytes().as_ptr() as usize;
        let offset = |b: &[u8]| b.as_ptr() as usize - base;
        // Our leading run of entries: each one's URI end, and its flow value's range.
        let mut ours: SmallVec<[(usize, Option<Range<usize>>); 2]> = SmallVec::new();
        let (mut above, mut done) = (0, false);
        let _ = msg.name_addrs(HeaderName::RecordRoute, |_, na| {
            if done {
                return;
            }
            if !self.routing_is_local_host(&na.uri) {
                if ours.is_empty() {
                    above += 1;
                } else {
                    done = true;
                }
                return;
            }
            let value = na.uri.param(PARAM).flatten().map(|v| {
                let start = offset(v);
                // `;fl=` precedes the value.
                start - PARAM.len() - 2..start + v.len()
            });
            ours.push((offset(na.uri.raw) + na.uri.raw.len(), value));
        });
        if ours.is_empty() {
            return;
        }
        let fresh = (above == 0 && needed).then(|| token(source.as_flow()));
        // `;fl=TOKEN`, written in place (a `format!` of it cost a third of what this adds to
        // an answer).
        let param = |t: &mut Vec<u8>, token: &str| {
            t.extend_from_slice(b";");
            t.extend_from_slice(PARAM);
            t.extend_from_slice(b"=");
            t.extend_from_slice(token.as_bytes());
        };
        for (uri_end, value) in ours {
            // The entry's flow value replaced, or one inserted at its URI's end.
            let (start, end) = value.map_or((uri_end, uri_end), |r| (r.start, r.end));
            match &fresh {
                Some(token) => rw.splice.replace_with(start, end, |t| param(t, token)),
                None if start < end => rw.splice.remove(start, end),
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_flow_and_nothing_else() {
        for flow in [
            Peer {
                transport: Transport::Tcp,
                addr: "198.51.100.7:40123".parse().unwrap(),
                conn: (1 << 24) | 17,
                flow: true,
            },
            Peer::udp_via("[2001:db8::1]:5060".parse().unwrap(), 0).as_flow(),
        ] {
            let t = token(flow);
            assert_eq!(parse(t.as_bytes()), Some(flow));
            // One changed digit anywhere is refused.
            for i in 0..t.len() {
                let mut bad = t.as_bytes().to_vec();
                bad[i] = if bad[i] == b'0' { b'1' } else { b'0' };
                assert_eq!(parse(&bad), None, "digit {i}");
            }
        }
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"zz"), None);
        assert_eq!(parse(b"0011"), None);
    }

    #[test]
    fn the_memo_answers_as_the_mac_does_past_its_size() {
        let flows: Vec<Peer> = (0..MEMO_MAX as u16 + 10)
            .map(|port| Peer::udp_via(SocketAddr::from(([198, 51, 100, 7], port)), 0).as_flow())
            .collect();
        for _ in 0..2 {
            for &flow in &flows {
                let t = token(flow);
                let body = Body::of(flow);
                assert_eq!(
                    *t,
                    URL_SAFE_NO_PAD.encode([body.as_slice(), &mac(body.as_slice())].concat())
                );
                assert_eq!(parse(t.as_bytes()), Some(flow));
                assert_eq!(verify(t.as_bytes()), Some(flow));
            }
        }
        let made = MEMO.with_borrow(|m| (m.made.len(), m.checked.len()));
        assert!(made.0 <= MEMO_MAX && made.1 <= MEMO_MAX, "{made:?}");
    }
}
