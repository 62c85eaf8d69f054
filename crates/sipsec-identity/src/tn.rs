//! Telephone numbers as PASSporTs carry them (RFC 8224 §8.3): visual separators and a leading
//! `+` removed, nothing left but digits (and `*`, `#`), at most 15 of them (E.164's limit).
//! Signer and verifier canonicalise the same way, so `+1-(555)-123.4567` in a From header and
//! `15551234567` in a token are the same number (RFC 3966's visual separators are `-`, `.`,
//! `(` and `)`; a space is none, and makes no number).

/// The longest number E.164 allows.
pub const MAX_DIGITS: usize = 15;

/// `number` in canonical form, or `None` when it is no telephone number (a name such as
/// `alice`, an empty string, or more than [`MAX_DIGITS`] digits).
pub fn canonical(number: &str) -> Option<String> {
    let number = number.strip_prefix('+').unwrap_or(number);
    let mut out = String::with_capacity(number.len());
    for c in number.chars() {
        match c {
            '0'..='9' | '*' | '#' => out.push(c),
            // RFC 3966's visual separators.
            '-' | '.' | '(' | ')' => {}
            _ => return None,
        }
    }
    (!out.is_empty() && out.len() <= MAX_DIGITS && out.bytes().any(|b| b.is_ascii_digit()))
        .then_some(out)
}

/// The telephone number a SIP or tel URI names: the user part of `sip:`/`sips:` (up to its
/// parameters, e.g. `;verstat=`) or the subscriber of `tel:`, canonicalised; `None` when the
/// URI names no number. Angle brackets and a display name around the URI are skipped.
pub fn from_uri(uri: &str) -> Option<String> {
    let uri = match (uri.find('<'), uri.rfind('>')) {
        (Some(open), Some(close)) if open < close => &uri[open + 1..close],
        _ => uri.trim(),
    };
    let (scheme, rest) = uri.split_once(':')?;
    let number = if scheme.eq_ignore_ascii_case("tel") {
        rest.split(';').next()?
    } else if scheme.eq_ignore_ascii_case("sip") || scheme.eq_ignore_ascii_case("sips") {
        let (user, _host) = rest.split_once('@')?;
        user.split(';').next()?
    } else {
        return None;
    };
    canonical(&percent_decoded(number)?)
}

/// `%XX` escapes in a URI's user part decoded (`%2B` is a `+`); `None` when an escape is
/// malformed or decodes to something that is not text.
fn percent_decoded(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_string());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_and_plus_go() {
        assert_eq!(
            canonical("+1 555").as_deref(),
            None,
            "a space is no separator"
        );
        assert_eq!(
            canonical("+1-(555).123-4567").as_deref(),
            Some("15551234567")
        );
        assert_eq!(canonical("*67#").as_deref(), Some("*67#"));
    }

    #[test]
    fn names_and_overlong_numbers_are_not_numbers() {
        assert_eq!(canonical("alice"), None);
        assert_eq!(canonical(""), None);
        assert_eq!(canonical("+"), None);
        assert_eq!(canonical("*#"), None, "no digit at all");
        assert_eq!(canonical("1234567890123456"), None, "16 digits");
        assert!(canonical("123456789012345").is_some());
    }

    #[test]
    fn numbers_come_out_of_uris() {
        assert_eq!(
            from_uri(
                "\"Bob\" <sip:+15551234567;verstat=TN-Validation-Passed@example.net;user=phone>"
            )
            .as_deref(),
            Some("15551234567")
        );
        assert_eq!(
            from_uri("<tel:+1-555-123-4567;phone-context=x>").as_deref(),
            Some("15551234567")
        );
        assert_eq!(from_uri("sips:%2B4930123@h").as_deref(), Some("4930123"));
        assert_eq!(from_uri("sip:alice@example.net"), None);
        assert_eq!(from_uri("sip:example.net"), None, "no user part");
        assert_eq!(from_uri("mailto:1234@x"), None);
        assert_eq!(from_uri("sip:%4@x"), None, "a broken escape");
    }
}
