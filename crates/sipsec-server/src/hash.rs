//! Non-cryptographic mixing for values the server spreads things by: SplitMix64's finalizer,
//! which turns inputs that differ in a few bits (FNV-1a of short keys, consecutive slots) into
//! evenly spread 64-bit values. Not for secrets.

/// SplitMix64's finalizer (Steele, Lea and Flood): a bijection of `u64` whose every output
/// bit depends on every input bit.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
