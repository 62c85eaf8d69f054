//! STUN on the UDP SIP ports (RFC 5626 §4.4.1 and §8, RFC 5389): a client using SIP outbound
//! keeps its NAT binding open, and learns the address the server sees it at, by sending STUN
//! Binding requests to the port it sends SIP to. Sans-IO: the worker asks `is_stun` of each
//! datagram before the SIP parser sees it, and sends what `answer` writes back from the
//! socket the request came in on.
//!
//! A STUN message starts with two zero bits and carries the magic cookie 0x2112A442 at bytes 4
//! to 8 (RFC 5389 §6); a SIP message starts with a letter (or CRLF keep-alives, which carry no
//! cookie), so the two never meet. A datagram of that shape is answered only if it is a
//! well-formed Binding request (length as the header says, attributes laid out right, a
//! FINGERPRINT that matches if present), with a Binding success response carrying
//! XOR-MAPPED-ADDRESS and, when the request had one, FINGERPRINT. Anything else of that shape
//! (responses, indications, other methods, malformed messages) is dropped and counted. The
//! server asks for no credentials (RFC 5626 §8: keep-alives are not authenticated) and so
//! ignores any MESSAGE-INTEGRITY.
//!
//! The encoding is `stun-types` (the crate `librice` and GStreamer's ICE build on): its parser
//! borrows the datagram and checks the attributes and fingerprint, and its writer fills a
//! buffer of ours, so an answer allocates nothing.

use std::net::SocketAddr;
use stun_types::attribute::{AttributeStaticType, Fingerprint, XorMappedAddress};
use stun_types::message::{
    Message, MessageClass, MessageWrite, MessageWriteExt, MessageWriteMutSlice, BINDING,
};

/// The magic cookie of RFC 5389 §6, at bytes 4 to 8 of every STUN message.
const MAGIC_COOKIE: [u8; 4] = 0x2112_A442_u32.to_be_bytes();

/// The STUN header's length; the message length field counts what follows it.
const HEADER: usize = 20;

/// Room for the largest answer: the header, an IPv6 XOR-MAPPED-ADDRESS (4 + 20) and a
/// FINGERPRINT (4 + 4).
pub(crate) const MAX_ANSWER: usize = HEADER + 24 + 8;

/// Whether a datagram is STUN-shaped (two zero bits, then the magic cookie at bytes 4..8):
/// it goes to `answer`, never to the SIP parser.
pub(crate) fn is_stun(data: &[u8]) -> bool {
    data.len() >= HEADER && data[0] & 0xC0 == 0 && data[4..8] == MAGIC_COOKIE
}

/// Writes the Binding success response to `request` (a datagram `is_stun` accepted, from
/// `source`) into `out`; its length, or None if `request` is not a valid Binding request.
pub(crate) fn answer(
    request: &[u8],
    source: SocketAddr,
    out: &mut [u8; MAX_ANSWER],
) -> Option<usize> {
    let length = usize::from(u16::from_be_bytes([*request.get(2)?, *request.get(3)?]));
    // Over UDP the message is the whole datagram (RFC 5389 §7.3: length, then attributes).
    if request.len() != HEADER + length || length % 4 != 0 {
        return None;
    }
    let msg = Message::from_bytes(request).ok()?;
    if !msg.has_class(MessageClass::Request) || !msg.has_method(BINDING) {
        return None;
    }
    // What the client is seen as: an IPv4 client on a dual-stack socket as the IPv4 address.
    let seen = SocketAddr::new(source.ip().to_canonical(), source.port());
    let mut w = Message::builder_success(&msg, MessageWriteMutSlice::new(out));
    w.add_attribute(&XorMappedAddress::new(seen, msg.transaction_id()))
        .ok()?;
    if msg.has_attribute(Fingerprint::TYPE) {
        w.add_fingerprint().ok()?;
    }
    Some(w.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stun_types::message::{MessageWriteVec, TransactionId};

    fn binding(fingerprint: bool) -> (Vec<u8>, TransactionId) {
        let mut w = Message::builder_request(BINDING, MessageWriteVec::new());
        if fingerprint {
            w.add_fingerprint().unwrap();
        }
        let data = w.finish();
        let id = Message::from_bytes(&data).unwrap().transaction_id();
        (data, id)
    }

    fn mapped(response: &[u8]) -> (TransactionId, SocketAddr, bool) {
        let msg = Message::from_bytes(response).unwrap();
        assert!(msg.has_class(MessageClass::Success) && msg.has_method(BINDING));
        let xor = msg.attribute::<XorMappedAddress>().unwrap();
        let id = msg.transaction_id();
        (id, xor.addr(id), msg.has_attribute(Fingerprint::TYPE))
    }

    #[test]
    fn a_binding_request_is_answered_with_the_address_it_came_from() {
        let mut out = [0; MAX_ANSWER];
        for (fingerprint, source) in [
            (false, "192.0.2.7:40123"),
            (true, "[2001:db8::7]:5060"),
            (false, "[::ffff:192.0.2.8]:1024"),
        ] {
            let (request, id) = binding(fingerprint);
            assert!(is_stun(&request));
            let source: SocketAddr = source.parse().unwrap();
            let n = answer(&request, source, &mut out).unwrap();
            let seen = SocketAddr::new(source.ip().to_canonical(), source.port());
            assert_eq!(mapped(&out[..n]), (id, seen, fingerprint));
        }
    }

    #[test]
    fn sip_is_never_stun_and_other_stun_is_not_answered() {
        for sip in [
            &b"\r\n\r\n"[..],
            b"OPTIONS sip:a@b SIP/2.0\r\n\r\n",
            b"SIP/2.0 200 OK\r\n\r\n",
        ] {
            assert!(!is_stun(sip));
        }
        let mut out = [0; MAX_ANSWER];
        let source: SocketAddr = "192.0.2.7:40123".parse().unwrap();
        let (request, _) = binding(true);
        // A success response, an indication, another method: STUN, but not ours to answer.
        let response = {
            let msg = Message::from_bytes(&request).unwrap();
            Message::builder_success(&msg, MessageWriteVec::new()).finish()
        };
        let indication = Message::builder_indication(BINDING, MessageWriteVec::new()).finish();
        let allocate = Message::builder_request(
            stun_types::message::Method::new(0x0003),
            MessageWriteVec::new(),
        )
        .finish();
        for other in [&response, &indication, &allocate] {
            assert!(is_stun(other));
            assert_eq!(answer(other, source, &mut out), None);
        }
        // Truncated, padded, a length that is not a multiple of 4, a broken fingerprint.
        let mut broken = request.clone();
        *broken.last_mut().unwrap() ^= 1;
        let mut odd = request.clone();
        odd[3] += 1;
        odd.push(0);
        for bad in [
            &request[..request.len() - 1],
            &[&request[..], &[0; 4]].concat()[..],
            &odd[..],
            &broken[..],
        ] {
            assert_eq!(answer(bad, source, &mut out), None);
        }
    }
}
