//! The STUN keep-alive of an RFC 5626 client over UDP (§4.4.1, §8): a Binding request
//! (RFC 5389 §6, no attributes) and the recognition of the answer by its transaction ID.
//!
//! Written by hand rather than with a STUN crate: a keep-alive is a 20-byte header with no
//! attributes, and its answer only has to be matched, never read (the mapped address it
//! carries is of no use to a load generator). A crate would bring a codec for every attribute
//! and a second dependency beside the one the server side may take for answering.

/// The magic cookie every RFC 5389 message carries at bytes 4..8.
const MAGIC_COOKIE: [u8; 4] = [0x21, 0x12, 0xa4, 0x42];
/// A Binding request (class request, method Binding).
const BINDING_REQUEST: [u8; 2] = [0x00, 0x01];
/// A Binding success response.
const BINDING_SUCCESS: [u8; 2] = [0x01, 0x01];
/// A Binding error response.
const BINDING_ERROR: [u8; 2] = [0x01, 0x11];
/// The header's length: type, length, cookie, transaction ID.
const HEADER: usize = 20;

/// A STUN transaction ID (96 bits).
pub type TransactionId = [u8; 12];

/// A Binding request with transaction ID `id` and no attributes.
pub fn binding_request(id: &TransactionId) -> [u8; HEADER] {
    let mut m = [0u8; HEADER];
    m[..2].copy_from_slice(&BINDING_REQUEST);
    // Bytes 2..4, the attributes' length, stay 0.
    m[4..8].copy_from_slice(&MAGIC_COOKIE);
    m[8..].copy_from_slice(id);
    m
}

/// Whether a datagram is a STUN message rather than SIP: the two top bits zero and the
/// magic cookie in place (RFC 5389 §6; SIP starts with a letter, RFC 5626 §8 relies on it).
pub fn is_stun(data: &[u8]) -> bool {
    data.len() >= HEADER && data[0] & 0xc0 == 0 && data[4..8] == MAGIC_COOKIE
}

/// The transaction ID of a Binding response, success or error (either shows the flow is
/// alive); `None` for anything else.
pub fn binding_response_id(data: &[u8]) -> Option<TransactionId> {
    if !is_stun(data) || (data[..2] != BINDING_SUCCESS && data[..2] != BINDING_ERROR) {
        return None;
    }
    data[8..HEADER].try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 5769 §2.2's IPv4 Binding response, cut to its header: type, length, cookie and
    /// transaction ID as that test vector has them.
    #[test]
    fn a_binding_request_is_the_rfc_5389_header_and_its_response_is_matched_by_id() {
        let id = [
            0xb7, 0xe7, 0xa7, 0x01, 0xbc, 0x34, 0xd6, 0x86, 0xfa, 0x87, 0xdf, 0xae,
        ];
        let req = binding_request(&id);
        assert_eq!(&req[..8], &[0x00, 0x01, 0x00, 0x00, 0x21, 0x12, 0xa4, 0x42]);
        assert_eq!(&req[8..], &id);
        assert!(is_stun(&req));
        // A request is not a response.
        assert_eq!(binding_response_id(&req), None);
        let mut resp = vec![0x01, 0x01, 0x00, 0x3c, 0x21, 0x12, 0xa4, 0x42];
        resp.extend_from_slice(&id);
        resp.extend_from_slice(&[0x80, 0x22, 0x00, 0x0b]);
        assert_eq!(binding_response_id(&resp), Some(id));
        resp[1] = 0x11;
        assert_eq!(
            binding_response_id(&resp),
            Some(id),
            "an error response answers too"
        );
        // SIP, short datagrams and a wrong cookie are not STUN.
        assert!(!is_stun(b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP x\r\n\r\n"));
        assert!(!is_stun(&req[..19]));
        let mut bad = req;
        bad[4] = 0;
        assert!(!is_stun(&bad));
    }
}
