//! SIP overload control's wire and its client side: the Via parameters of RFC 7339 (`oc`,
//! `oc-algo`, `oc-validity`, `oc-seq`) with the loss-based algorithm, and the rate-based one of
//! RFC 7415, as [`Feedback`]; and [`Throttle`], what a client keeps per server to honour it.
//!
//! How it goes: a client that supports overload control puts `oc` and the algorithms it
//! offers (`oc-algo="loss"`) in the Via it adds ([`ANNOUNCE`]). A server under load answers
//! in that same Via of its responses, naming one algorithm and a value — for `loss` the
//! percentage of new requests the client should not send, for `rate` the requests per second
//! it may send — valid for `oc-validity` milliseconds, ordered by `oc-seq`. The client then
//! asks [`Throttle::admit`] before sending each new request to that server, and answers the
//! ones refused itself (503) instead of sending them.
//!
//! No clock and no randomness here: times are milliseconds from the caller, and the loss
//! algorithm spreads its refusals evenly (an error-diffusion counter) instead of drawing
//! random numbers, so a test sees exactly what a given feedback does.

use crate::message::Via;

/// What a client adds to its Via to say it supports overload control, and the algorithm it
/// offers: loss, the one every implementation has. Rate (RFC 7415) is honoured whenever a
/// server sends it and given to any client that offers it, but not offered here: a list
/// needs a comma inside a quoted Via parameter (`oc-algo="loss,rate"`), which is valid SIP
/// that Kamailio 5.6 does not parse — it drops such a request.
pub const ANNOUNCE: &str = ";oc;oc-algo=\"loss\"";

/// An overload control algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// RFC 7339 §5: `oc` is the percentage of new requests to refuse (0–100).
    Loss,
    /// RFC 7415: `oc` is the most new requests per second to send.
    Rate,
}

impl Algorithm {
    /// The token carried in `oc-algo`.
    pub fn token(self) -> &'static str {
        match self {
            Algorithm::Loss => "loss",
            Algorithm::Rate => "rate",
        }
    }

    fn from_token(t: &[u8]) -> Option<Algorithm> {
        if t.eq_ignore_ascii_case(b"loss") {
            Some(Algorithm::Loss)
        } else if t.eq_ignore_ascii_case(b"rate") {
            Some(Algorithm::Rate)
        } else {
            None
        }
    }
}

/// The algorithms a request's Via offers, when it announces overload control support (`oc`
/// present, without a value): RFC 7339 §5.1. Unknown algorithms are skipped; an announcement
/// without `oc-algo` means `loss`, the one every implementation has.
pub fn offered(via: &Via<'_>) -> Option<Offer> {
    via.oc()?;
    let params = via.params;
    let mut offer = Offer::default();
    match params.get(b"oc-algo").flatten() {
        None => offer.loss = true,
        Some(list) => {
            for t in unquote(list).split(|&b| b == b',') {
                match Algorithm::from_token(trim(t)) {
                    Some(Algorithm::Loss) => offer.loss = true,
                    Some(Algorithm::Rate) => offer.rate = true,
                    None => {}
                }
            }
        }
    }
    Some(offer)
}

/// The algorithms a client offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offer {
    /// The client offers `loss` (RFC 7339).
    pub loss: bool,
    /// The client offers `rate` (RFC 7415).
    pub rate: bool,
}

impl Offer {
    /// The algorithm a server uses with this client: `preferred` if offered, else the other
    /// if offered, else none (an announcement naming only algorithms we do not know).
    pub fn choose(self, preferred: Algorithm) -> Option<Algorithm> {
        let has = |a| match a {
            Algorithm::Loss => self.loss,
            Algorithm::Rate => self.rate,
        };
        [
            preferred,
            match preferred {
                Algorithm::Loss => Algorithm::Rate,
                Algorithm::Rate => Algorithm::Loss,
            },
        ]
        .into_iter()
        .find(|&a| has(a))
    }
}

/// What a server tells a client in the Via of a response.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Feedback {
    /// The algorithm the server chose from the client's offer (`oc-algo`).
    pub algorithm: Algorithm,
    /// Percent to refuse (`loss`, 0–100) or requests per second (`rate`).
    pub value: u32,
    /// How long it holds, in milliseconds; 0 ends overload control at once.
    pub validity_ms: u32,
    /// Orders feedback from one server: a client ignores any older than what it has. Written
    /// as seconds with three decimals (RFC 7339 allows a decimal point).
    pub seq_ms: u64,
}

/// Why a response's `oc` parameters were not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedbackError {
    /// `oc` is absent or has no value: this response carries no feedback.
    Absent,
    /// A value is not a number, or the loss percentage is over 100.
    BadValue,
    /// `oc-algo` names an algorithm this client did not offer.
    UnknownAlgorithm,
}

impl Feedback {
    /// The feedback in a response's top Via (the client's own), if any.
    pub fn from_via(via: &Via<'_>) -> Result<Feedback, FeedbackError> {
        // The common case, a response to a request that announced `oc` from a next hop that
        // gives no feedback, ends here without a parameter lookup.
        let value = via.oc().flatten().ok_or(FeedbackError::Absent)?;
        let params = via.params;
        let value = number(value).ok_or(FeedbackError::BadValue)?;
        let algorithm = match params.get(b"oc-algo").flatten() {
            None => Algorithm::Loss,
            Some(a) => {
                Algorithm::from_token(trim(unquote(a))).ok_or(FeedbackError::UnknownAlgorithm)?
            }
        };
        if algorithm == Algorithm::Loss && value > 100 {
            return Err(FeedbackError::BadValue);
        }
        // RFC 7339 §5.2: without oc-validity the default is 500 ms.
        let validity_ms = match params.get(b"oc-validity").flatten() {
            None => 500,
            Some(v) => number(v).ok_or(FeedbackError::BadValue)?,
        };
        let seq_ms = match params.get(b"oc-seq").flatten() {
            None => 0,
            Some(s) => seq_millis(s).ok_or(FeedbackError::BadValue)?,
        };
        Ok(Feedback {
            algorithm,
            value,
            validity_ms,
            seq_ms,
        })
    }

    /// Writes the parameters, `;oc=…;oc-algo="…";oc-validity=…;oc-seq=…`.
    pub fn write(&self, out: &mut Vec<u8>) {
        use std::io::Write as _;
        let _ = write!(
            out,
            ";oc={};oc-algo=\"{}\";oc-validity={};oc-seq={}.{:03}",
            self.value,
            self.algorithm.token(),
            self.validity_ms,
            self.seq_ms / 1000,
            self.seq_ms % 1000
        );
    }
}

/// Where in `params` (a Via's parameters, leading `;` included) the overload control
/// parameters a client announced are, as `(start, end)` ranges relative to `params`: a
/// server replaces them with its [`Feedback`].
pub(crate) fn announcement_ranges(params: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut pos = 0;
    std::iter::from_fn(move || {
        while pos < params.len() {
            let start = pos;
            // One parameter: up to the next `;` outside a quoted string.
            let mut i = start + 1;
            let mut quoted = false;
            while i < params.len() && (quoted || params[i] != b';') {
                if params[i] == b'"' {
                    quoted = !quoted;
                }
                i += 1;
            }
            pos = i;
            let p = &params[start + 1..i];
            let name = trim(&p[..p.iter().position(|&b| b == b'=').unwrap_or(p.len())]);
            if name.eq_ignore_ascii_case(b"oc") || name.len() > 3 && is_oc_param(name) {
                return Some((start, i));
            }
        }
        None
    })
}

fn is_oc_param(name: &[u8]) -> bool {
    [&b"oc-algo"[..], b"oc-validity", b"oc-seq"]
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n))
}

/// What a client keeps about one server: the feedback in force and its own state for the
/// algorithm.
#[derive(Debug, Clone)]
pub struct Throttle {
    feedback: Option<Feedback>,
    /// When the feedback stops holding.
    until_ms: u64,
    /// Loss: refusals owed, in hundredths of a request (error diffusion).
    owed: u32,
    /// Rate: when the next request may go, in microseconds (a leaky bucket).
    next_us: u64,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new()
    }
}

/// A rate-limited client may send this many requests back to back after a quiet spell
/// (RFC 7415 §7.2's tolerance, in units of the interval between two requests).
const RATE_BURST: u64 = 4;

impl Throttle {
    /// A throttle with no feedback in force: every request is admitted.
    pub fn new() -> Throttle {
        Throttle {
            feedback: None,
            until_ms: 0,
            owed: 0,
            next_us: 0,
        }
    }

    /// Takes a response's feedback, unless it is older than what is already in force.
    /// Returns whether it was taken.
    pub fn on_feedback(&mut self, now_ms: u64, fb: Feedback) -> bool {
        if let Some(cur) = &self.feedback {
            if fb.seq_ms < cur.seq_ms && now_ms < self.until_ms {
                return false;
            }
        }
        if fb.validity_ms == 0 || (fb.algorithm == Algorithm::Loss && fb.value == 0) {
            self.feedback = None;
            return true;
        }
        let changed_algorithm = self
            .feedback
            .is_none_or(|cur| cur.algorithm != fb.algorithm);
        self.feedback = Some(fb);
        self.until_ms = now_ms + u64::from(fb.validity_ms);
        if changed_algorithm {
            self.owed = 0;
            self.next_us = now_ms * 1000;
        }
        true
    }

    /// The feedback in force at `now_ms`, if any.
    pub fn in_force(&self, now_ms: u64) -> Option<Feedback> {
        self.feedback.filter(|_| now_ms < self.until_ms)
    }

    /// Whether a new request may be sent to this server now. Counts it as sent if so.
    pub fn admit(&mut self, now_us: u64) -> bool {
        let Some(fb) = self.in_force(now_us / 1000) else {
            return true;
        };
        match fb.algorithm {
            Algorithm::Loss => {
                // Each request owes `value` hundredths of a refusal; a whole one refuses it.
                self.owed += fb.value.min(100);
                if self.owed >= 100 {
                    self.owed -= 100;
                    false
                } else {
                    true
                }
            }
            Algorithm::Rate => {
                if fb.value == 0 {
                    return false;
                }
                let interval = 1_000_000 / u64::from(fb.value);
                let earliest = now_us.saturating_sub(interval * RATE_BURST);
                let next = self.next_us.max(earliest);
                if next > now_us {
                    false
                } else {
                    self.next_us = next + interval;
                    true
                }
            }
        }
    }
}

fn trim(s: &[u8]) -> &[u8] {
    crate::message::scan::trim(s)
}

fn unquote(s: &[u8]) -> &[u8] {
    let s = trim(s);
    s.strip_prefix(b"\"")
        .and_then(|s| s.strip_suffix(b"\""))
        .unwrap_or(s)
}

fn number(s: &[u8]) -> Option<u32> {
    let s = trim(s);
    if s.is_empty() || s.len() > 9 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// `1282321615.781` as milliseconds (a missing or shorter fraction is padded, a longer one
/// cut).
fn seq_millis(s: &[u8]) -> Option<u64> {
    let s = trim(s);
    let (whole, frac) = match s.iter().position(|&b| b == b'.') {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, &b""[..]),
    };
    if whole.is_empty()
        || whole.len() > 12
        || frac.len() > 5
        || !whole.iter().chain(frac).all(u8::is_ascii_digit)
    {
        return None;
    }
    let whole: u64 = std::str::from_utf8(whole).ok()?.parse().ok()?;
    let mut ms = 0;
    for i in 0..3 {
        ms = ms * 10 + frac.get(i).map_or(0, |d| u64::from(d - b'0'));
    }
    Some(whole * 1000 + ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;

    fn top_via(via: &str) -> Message<'static> {
        let text = format!(
            "SIP/2.0 200 OK\r\nVia: {via}\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@x>\r\n\
             Call-ID: c\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
        );
        Message::parse(Box::leak(text.into_bytes().into_boxed_slice())).unwrap()
    }

    #[test]
    fn an_announcement_offers_its_algorithms() {
        let m = top_via("SIP/2.0/UDP 10.0.0.1;branch=z9hG4bK1;oc;oc-algo=\"loss,rate,A\"");
        assert_eq!(
            offered(m.top_via()),
            Some(Offer {
                loss: true,
                rate: true
            })
        );
        let m = top_via("SIP/2.0/UDP 10.0.0.1;branch=z9hG4bK1;oc");
        let only_loss = offered(m.top_via()).unwrap();
        assert!(only_loss.loss && !only_loss.rate);
        assert_eq!(only_loss.choose(Algorithm::Rate), Some(Algorithm::Loss));
        let m = top_via("SIP/2.0/UDP 10.0.0.1;branch=z9hG4bK1");
        assert_eq!(offered(m.top_via()), None);
        // Parameter names are case-insensitive, wherever `oc` stands.
        let m = top_via("SIP/2.0/UDP 10.0.0.1;OC;rport;branch=z9hG4bK1");
        assert!(offered(m.top_via()).is_some_and(|o| o.loss));
    }

    #[test]
    fn feedback_written_reads_back_the_same() {
        let fb = Feedback {
            algorithm: Algorithm::Rate,
            value: 250,
            validity_ms: 500,
            seq_ms: 1_282_321_615_781,
        };
        let mut params = b"SIP/2.0/UDP 10.0.0.1;branch=z9hG4bK1".to_vec();
        fb.write(&mut params);
        let m = top_via(std::str::from_utf8(&params).unwrap());
        assert_eq!(Feedback::from_via(m.top_via()), Ok(fb));
        assert!(String::from_utf8(params)
            .unwrap()
            .ends_with(";oc=250;oc-algo=\"rate\";oc-validity=500;oc-seq=1282321615.781"));
    }

    #[test]
    fn rfc_7339s_example_reads_as_loss() {
        let m = top_via(
            "SIP/2.0/TCP c1.example.com;branch=z9hG4bK2d4790.1;received=192.0.2.111;\
             oc=20;oc-algo=\"loss\";oc-validity=500;oc-seq=1282321615.782",
        );
        let fb = Feedback::from_via(m.top_via()).unwrap();
        assert_eq!(fb.algorithm, Algorithm::Loss);
        assert_eq!((fb.value, fb.validity_ms), (20, 500));
        assert_eq!(fb.seq_ms, 1_282_321_615_782);
    }

    #[test]
    fn bad_feedback_is_refused_with_its_reason() {
        let bad = |p: &str| {
            let m = top_via(&format!("SIP/2.0/UDP h;branch=z9hG4bK1{p}"));
            Feedback::from_via(m.top_via())
        };
        assert_eq!(bad(";oc"), Err(FeedbackError::Absent));
        assert_eq!(bad(""), Err(FeedbackError::Absent));
        assert_eq!(bad(";oc=101"), Err(FeedbackError::BadValue));
        assert_eq!(bad(";oc=-3"), Err(FeedbackError::BadValue));
        assert_eq!(bad(";oc=5;oc-seq=x"), Err(FeedbackError::BadValue));
        assert!(bad(";rport=9;Oc=5").is_ok_and(|f| f.value == 5));
        assert_eq!(
            bad(";oc=5;oc-algo=\"A\""),
            Err(FeedbackError::UnknownAlgorithm)
        );
    }

    #[test]
    fn the_announcement_is_found_among_other_parameters() {
        let params = b";branch=z9hG4bK1;oc;received=1.2.3.4;oc-algo=\"loss,rate\";rport=5";
        let found: Vec<&[u8]> = announcement_ranges(params)
            .map(|(s, e)| &params[s..e])
            .collect();
        assert_eq!(found, [&b";oc"[..], b";oc-algo=\"loss,rate\""]);
    }

    #[test]
    fn loss_refuses_exactly_its_share_spread_evenly() {
        let mut t = Throttle::new();
        let fb = Feedback {
            algorithm: Algorithm::Loss,
            value: 25,
            validity_ms: 1000,
            seq_ms: 1,
        };
        assert!(t.on_feedback(0, fb));
        let admitted: Vec<bool> = (0..8).map(|i| t.admit(i * 1000)).collect();
        assert_eq!(
            admitted,
            [true, true, true, false, true, true, true, false],
            "one in four refused, never two in a row"
        );
        // After its validity the feedback no longer holds.
        assert!((0..10).all(|_| t.admit(1_000_000)));
    }

    #[test]
    fn older_feedback_does_not_replace_newer_and_zero_ends_control() {
        let mut t = Throttle::new();
        let fb = |value, seq_ms| Feedback {
            algorithm: Algorithm::Loss,
            value,
            validity_ms: 500,
            seq_ms,
        };
        assert!(t.on_feedback(0, fb(50, 10)));
        assert!(!t.on_feedback(1, fb(10, 9)));
        assert_eq!(t.in_force(1).unwrap().value, 50);
        assert!(t.on_feedback(2, fb(0, 11)));
        assert_eq!(t.in_force(2), None);
        assert!((0..10).all(|i| t.admit(2000 + i)));
    }

    #[test]
    fn rate_admits_its_rate_after_a_small_burst() {
        let mut t = Throttle::new();
        t.on_feedback(
            0,
            Feedback {
                algorithm: Algorithm::Rate,
                value: 100,
                validity_ms: 10_000,
                seq_ms: 1,
            },
        );
        // Offered 1,000/s for 5 s: 100/s go, plus at most the burst.
        let sent = (0..5_000u64).filter(|i| t.admit(i * 1000)).count();
        assert!((500..=500 + RATE_BURST as usize).contains(&sent), "{sent}");
    }
}
