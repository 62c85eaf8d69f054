//! Via branch values sipsec generates, and what they encode.
//!
//! `z9hG4bK` + `sS` + worker digit + 8 hex digits of loop hash + a suffix. The worker digit is
//! how a response finds the worker owning its transaction without a shared table: whichever
//! worker's socket the kernel hands it to reads the digit and, if it is another's, passes the
//! datagram over that worker's mailbox. The loop hash (RFC 3261 §16.6 step 8) covers what
//! identifies the request's routing (Request-URI, Call-ID, CSeq number, From and To tags); a
//! request that comes back with one of our Vias carrying the same hash is a loop (482).

use sip_core::message::Message;

pub(crate) const MAGIC: &[u8] = b"z9hG4bKsS";

/// FNV-1a, 64 bit: fast, deterministic, good enough to spread hashes (not for secrets).
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn worker_digit(worker: usize) -> char {
    char::from_digit(worker as u32, 36).expect("at most 36 workers encode in one digit")
}

/// The loop-detection hash of a request as received, given its From and To tags.
pub(crate) fn loop_hash(msg: &Message<'_>, from_tag: &[u8], to_tag: &[u8]) -> u32 {
    let ruri = msg.request_uri().map_or(&b""[..], |u| u.raw);
    let seq = msg.cseq().seq.to_le_bytes();
    fnv1a(&[ruri, msg.call_id(), &seq, from_tag, to_tag]) as u32
}

/// A unique branch for a stateful forward.
pub(super) fn stateful(worker: usize, loop_hash: u32, counter: u64) -> String {
    format!(
        "z9hG4bKsS{}{loop_hash:08x}.{counter:x}",
        worker_digit(worker)
    )
}

/// A deterministic branch for a stateless forward: retransmissions and the CANCEL of an
/// INVITE (same incoming branch) map to the same outgoing branch (RFC 3261 §16.11).
pub(super) fn stateless(worker: usize, loop_hash: u32, msg: &Message<'_>) -> String {
    let via = msg.top_via();
    let h = fnv1a(&[via.branch.unwrap_or_default(), via.host, msg.call_id()]);
    format!("z9hG4bKsS{}{loop_hash:08x}-{h:016x}", worker_digit(worker))
}

/// The branch of a NAT keep-alive ping: the worker, the binding's slot among its pings, and
/// which ping of that slot it is (`keepalive`).
pub(super) fn keepalive(worker: usize, slot: u32, generation: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(MAGIC);
    out.push(worker_digit(worker) as u8);
    out.extend_from_slice(b"ka");
    push_hex(out, slot);
    out.push(b'.');
    push_hex(out, generation);
}

/// `v` in lower-case hex without leading zeros, as `{:x}` writes it.
fn push_hex(out: &mut Vec<u8>, v: u32) {
    let digits = (32 - v.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        out.push(b"0123456789abcdef"[(v >> (4 * i) & 15) as usize]);
    }
}

/// The slot and generation a keep-alive branch of ours names.
pub(super) fn keepalive_slot(branch: &[u8]) -> Option<(u32, u32)> {
    let rest = branch.strip_prefix(MAGIC)?.get(1..)?.strip_prefix(b"ka")?;
    let rest = std::str::from_utf8(rest).ok()?;
    let (slot, generation) = rest.split_once('.')?;
    Some((
        u32::from_str_radix(slot, 16).ok()?,
        u32::from_str_radix(generation, 16).ok()?,
    ))
}

/// Which worker issued a branch, if we did.
pub(super) fn owner(branch: &[u8]) -> Option<usize> {
    let digit = *branch.strip_prefix(MAGIC)?.first()?;
    (digit as char).to_digit(36).map(|d| d as usize)
}

/// The loop hash a branch of ours carries.
pub(crate) fn carried_loop_hash(branch: &[u8]) -> Option<u32> {
    let hex = branch.strip_prefix(MAGIC)?.get(1..9)?;
    u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_owner_and_loop_hash() {
        let b = stateful(11, 0xdead_beef, 42);
        assert!(b.starts_with("z9hG4bK"));
        assert_eq!(owner(b.as_bytes()), Some(11));
        assert_eq!(carried_loop_hash(b.as_bytes()), Some(0xdead_beef));
        assert_eq!(owner(b"z9hG4bKother"), None);
        let mut k = Vec::new();
        keepalive(3, 0x1f, 7, &mut k);
        assert_eq!(k, b"z9hG4bKsS3ka1f.7");
        assert_eq!(owner(&k), Some(3));
        assert_eq!(keepalive_slot(&k), Some((0x1f, 7)));
        for (slot, generation) in [(0, 0), (0x10, u32::MAX), (u32::MAX, 0xabc)] {
            k.clear();
            keepalive(0, slot, generation, &mut k);
            assert_eq!(keepalive_slot(&k), Some((slot, generation)));
        }
        assert_eq!(keepalive_slot(b.as_bytes()), None);
    }
}
