//! Byte-level lexing shared by the value parsers: character classes from the RFC 3261 ABNF and
//! a cursor that understands linear whitespace.
//!
//! Header values are indexed in place, so a folded value still contains its CRLF. Inside an
//! indexed value a CR or LF can only be part of a fold, which makes it plain whitespace here.

/// Character classes of the RFC 3261 ABNF, one bit each in `CLASS`.
pub mod class {
    /// `token`.
    pub(crate) const TOKEN: u8 = 1;
    /// `unreserved`.
    pub(crate) const UNRESERVED: u8 = 1 << 1;
    /// Whitespace inside an indexed header value (folds included).
    pub(crate) const WS: u8 = 1 << 2;
    /// Characters of a hostname or IPv4 address: alphanumerics, `-`, `.`.
    pub(crate) const HOSTNAME: u8 = 1 << 3;
    /// Unescaped in a URI's user part: `unreserved` and `user-unreserved`.
    pub(crate) const USER: u8 = 1 << 4;
    /// Unescaped in a URI's password: `unreserved` and `&=+$,`.
    pub(crate) const PASSWORD: u8 = 1 << 5;
    /// Unescaped in a URI parameter: `unreserved` and `param-unreserved`.
    pub(crate) const PARAM: u8 = 1 << 6;
    /// Unescaped in a URI header: `unreserved` and `hnv-unreserved`.
    pub(crate) const HEADER: u8 = 1 << 7;
}

const fn class_of(b: u8) -> u8 {
    const fn among(b: u8, set: &[u8]) -> bool {
        let mut i = 0;
        while i < set.len() {
            if set[i] == b {
                return true;
            }
            i += 1;
        }
        false
    }
    let alnum = b.is_ascii_alphanumeric();
    let unreserved = alnum || among(b, b"-_.!~*'()");
    let mut c = 0;
    if alnum || among(b, b"-.!%*_+`'~") {
        c |= class::TOKEN;
    }
    if unreserved {
        c |= class::UNRESERVED;
    }
    if among(b, b" \t\r\n") {
        c |= class::WS;
    }
    if alnum || b == b'-' || b == b'.' {
        c |= class::HOSTNAME;
    }
    if unreserved || among(b, b"&=+$,;?/") {
        c |= class::USER;
    }
    if unreserved || among(b, b"&=+$,") {
        c |= class::PASSWORD;
    }
    if unreserved || among(b, b"[]/:&+$") {
        c |= class::PARAM;
    }
    if unreserved || among(b, b"[]/?:+$") {
        c |= class::HEADER;
    }
    c
}

/// The classes of every byte: the parser asks this for every byte of every message, and one
/// table load is cheaper than a chain of comparisons.
pub(crate) static CLASS: [u8; 256] = {
    let mut t = [0; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = class_of(b as u8);
        b += 1;
    }
    t
};

/// Whether `b` is in all of `classes`.
#[inline]
pub fn is(b: u8, classes: u8) -> bool {
    CLASS[b as usize] & classes == classes
}

/// RFC 3261 `token` characters.
#[inline]
pub(crate) fn is_token(b: u8) -> bool {
    is(b, class::TOKEN)
}

/// RFC 3261 `unreserved`.
#[inline]
pub fn is_unreserved(b: u8) -> bool {
    is(b, class::UNRESERVED)
}

/// Whitespace inside an indexed header value (folds included).
#[inline]
pub(crate) fn is_ws(b: u8) -> bool {
    is(b, class::WS)
}

/// Validates `%HH` escapes and a character class (bits of [`CLASS`]) over `s`.
pub(crate) fn check_escaped(s: &[u8], allowed: u8) -> bool {
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b if is(b, allowed) => i += 1,
            b'%' => {
                if !(s.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                    && s.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
                {
                    return false;
                }
                i += 3;
            }
            _ => return false,
        }
    }
    true
}

/// Parses an unsigned decimal with overflow checking. Empty or non-digit input is `None`.
pub(crate) fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

/// Case-insensitive ASCII equality. Header names and parameter names are compared on every
/// message, so this works eight bytes at a time, and a name shorter than eight bytes takes one
/// comparison of two overlapping loads.
#[inline]
pub(crate) fn eq_ic(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return lower8(short_word(a)) == lower8(short_word(b));
    }
    let word = |s: &[u8], i: usize| u64::from_le_bytes(s[i..i + 8].try_into().expect("8 bytes"));
    let mut i = 0;
    while i + 8 <= n {
        if lower8(word(a, i)) != lower8(word(b, i)) {
            return false;
        }
        i += 8;
    }
    // The last partial word, read as the final eight bytes (overlapping the one before).
    i == n || lower8(word(a, n - 8)) == lower8(word(b, n - 8))
}

/// Packs a slice of fewer than eight bytes into a word that differs for any two slices of
/// the same length that differ: the first and last four bytes for 4..8 (overlapping), the
/// first, middle and last byte for 1..4.
#[inline]
fn short_word(s: &[u8]) -> u64 {
    let n = s.len();
    match n {
        0 => 0,
        1..=3 => u64::from(s[0]) | u64::from(s[n / 2]) << 8 | u64::from(s[n - 1]) << 16,
        _ => {
            let four = |i: usize| u32::from_le_bytes(s[i..i + 4].try_into().expect("4 bytes"));
            u64::from(four(0)) | u64::from(four(n - 4)) << 32
        }
    }
}

/// Lower-cases the ASCII capitals among eight bytes (SWAR): a byte gets 0x20 added when it
/// lies in 'A'..='Z' and has no high bit; other bytes are unchanged.
#[inline]
fn lower8(x: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let seven = x & LOW7;
    let above_at = seven + 0x3f3f_3f3f_3f3f_3f3f; // high bit set where byte >= 'A'
    let above_z = seven + 0x2525_2525_2525_2525; // high bit set where byte > 'Z'
    let upper = above_at & !above_z & !x & HIGH;
    x | (upper >> 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_class_table_matches_the_abnf() {
        for b in 0..=255u8 {
            let alnum = b.is_ascii_alphanumeric();
            let unreserved = alnum || b"-_.!~*'()".contains(&b);
            assert_eq!(is_token(b), alnum || b"-.!%*_+`'~".contains(&b), "{b}");
            assert_eq!(is_unreserved(b), unreserved, "{b}");
            assert_eq!(is_ws(b), b" \t\r\n".contains(&b), "{b}");
            assert_eq!(is(b, class::HOSTNAME), alnum || b == b'-' || b == b'.');
            assert_eq!(is(b, class::USER), unreserved || b"&=+$,;?/".contains(&b));
            assert_eq!(is(b, class::PASSWORD), unreserved || b"&=+$,".contains(&b));
            assert_eq!(is(b, class::PARAM), unreserved || b"[]/:&+$".contains(&b));
            assert_eq!(is(b, class::HEADER), unreserved || b"[]/?:+$".contains(&b));
        }
        assert!(check_escaped(b"a%41b", class::USER));
        assert!(!check_escaped(b"a%4", class::USER));
        assert!(!check_escaped(b"a b", class::USER));
    }

    #[test]
    fn eq_ic_matches_the_standard_library_on_every_byte_pair() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                let x = [b'v', b'i', b'a', b'-', b'x', b'y', b'z', a, b'q'];
                let y = [b'V', b'I', b'A', b'-', b'X', b'Y', b'Z', b, b'Q'];
                assert_eq!(eq_ic(&x, &y), x.eq_ignore_ascii_case(&y), "{a} {b}");
                assert_eq!(
                    eq_ic(&[a; 17], &[b; 17]),
                    [a; 17].eq_ignore_ascii_case(&[b; 17])
                );
            }
        }
        // Every length, a difference (or a case change) at every position.
        let pairs = [
            (b'A', b'a'),
            (b'Z', b'z'),
            (b'a', b'b'),
            (b'@', b'`'),
            (b'[', b'{'),
        ];
        for len in 0..20 {
            for pos in 0..len {
                for (x, y) in pairs.iter().chain(&[(0xc1, 0xe1), (b'-', b'-')]) {
                    let mut a = vec![b'k'; len];
                    let mut b = vec![b'K'; len];
                    a[pos] = *x;
                    b[pos] = *y;
                    assert_eq!(eq_ic(&a, &b), a.eq_ignore_ascii_case(&b), "{a:?} {b:?}");
                }
            }
        }
        assert!(eq_ic(b"Proxy-Authorization", b"proxy-authorization"));
        assert!(!eq_ic(b"Proxy-Authorization", b"proxy-authorizatio"));
    }
}

/// A cursor over `buf[pos..end]`. Slices it returns borrow `buf`, and positions are absolute
/// offsets into `buf`, so callers can splice at them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cursor<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
    pub end: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8], start: usize, end: usize) -> Self {
        Cursor {
            buf,
            pos: start,
            end,
        }
    }

    pub(crate) fn at_end(&self) -> bool {
        self.pos >= self.end
    }

    pub(crate) fn peek(&self) -> Option<u8> {
        (self.pos < self.end).then(|| self.buf[self.pos])
    }

    pub(crate) fn skip_ws(&mut self) -> bool {
        let start = self.pos;
        while self.pos < self.end && is_ws(self.buf[self.pos]) {
            self.pos += 1;
        }
        self.pos > start
    }

    /// Consumes `c` if it is next, without skipping whitespace.
    pub(crate) fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Consumes `SWS c SWS` (the ABNF's SLASH, SEMI, COLON, EQUAL, COMMA); restores the
    /// position and returns false if `c` is not there.
    pub(crate) fn eat_sep(&mut self, c: u8) -> bool {
        let save = self.pos;
        self.skip_ws();
        if self.eat(c) {
            self.skip_ws();
            true
        } else {
            self.pos = save;
            false
        }
    }

    /// Consumes a run of bytes matching `f`.
    pub(crate) fn take_while(&mut self, f: impl Fn(u8) -> bool) -> &'a [u8] {
        let start = self.pos;
        while self.pos < self.end && f(self.buf[self.pos]) {
            self.pos += 1;
        }
        &self.buf[start..self.pos]
    }

    /// Consumes a non-empty token.
    pub(crate) fn token(&mut self) -> Option<&'a [u8]> {
        let t = self.take_while(is_token);
        (!t.is_empty()).then_some(t)
    }

    /// Consumes a quoted string including its quotes; `None` (position unchanged) if it is
    /// unterminated or not there.
    pub(crate) fn quoted(&mut self) -> Option<&'a [u8]> {
        let start = self.pos;
        if !self.eat(b'"') {
            return None;
        }
        while self.pos < self.end {
            match self.buf[self.pos] {
                b'"' => {
                    self.pos += 1;
                    return Some(&self.buf[start..self.pos]);
                }
                b'\\' => self.pos += 2,
                _ => self.pos += 1,
            }
        }
        self.pos = start;
        None
    }

    pub(crate) fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos.min(self.end)..self.end]
    }
}

/// Trims linear whitespace from both ends.
pub fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if is_ws(*first) {
            s = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = s {
        if is_ws(*last) {
            s = rest;
        } else {
            break;
        }
    }
    s
}

/// Splits a header value at top-level commas (not inside quotes or angle brackets).
pub(crate) fn split_commas(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        let (mut quoted, mut angle, mut i) = (false, false, start);
        while i < value.len() {
            match value[i] {
                b'\\' if quoted => i += 1,
                b'"' => quoted = !quoted,
                b'<' if !quoted => angle = true,
                b'>' if !quoted => angle = false,
                b',' if !quoted && !angle => break,
                _ => {}
            }
            i += 1;
        }
        let item = &value[start..i.min(value.len())];
        if i >= value.len() {
            done = true;
        } else {
            start = i + 1;
        }
        Some(trim(item))
    })
}
