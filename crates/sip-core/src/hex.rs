//! Lower-case hex, the one encoding of hashes, nonces and keys on the wire and in the user
//! database (digest responses, HA1s, Proxychain tokens and nonces, sipsec's nonces).

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends lower-case hex of `bytes` to `out`.
pub fn push(bytes: &[u8], out: &mut String) {
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
}

/// Lower-case hex of `bytes`.
pub fn encode(bytes: &[u8]) -> String {
    let mut s = String::new();
    push(bytes, &mut s);
    s
}

/// Decodes hex of either case into `out` (exactly `2 * out.len()` digits); false when it is
/// not that.
pub fn decode(text: &[u8], out: &mut [u8]) -> bool {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    if text.len() != 2 * out.len() {
        return false;
    }
    for (o, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        match (digit(pair[0]), digit(pair[1])) {
            (Some(h), Some(l)) => *o = h << 4 | l,
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_is_not_hex() {
        assert_eq!(encode(&[0x00, 0x9f, 0xff]), "009fff");
        let mut out = [0u8; 3];
        assert!(decode(b"009FfF", &mut out));
        assert_eq!(out, [0x00, 0x9f, 0xff]);
        assert!(!decode(b"009ff", &mut out), "odd length");
        assert!(!decode(b"009ffg", &mut out), "not a digit");
        assert!(!decode(b"009fff00", &mut out), "too long");
    }
}
