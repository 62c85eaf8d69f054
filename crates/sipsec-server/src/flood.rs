//! Per-source flood limits (`[flood]`), as Kamailio's `pike` module keeps them: a source IP
//! address that sends more requests than `rate` over a sliding window is refused for a ban
//! period. Sans-IO: the worker hands it each request's source and the time before the request
//! is parsed, and asks it when to call back to lift bans.
//!
//! - **O(1) per request.** The rate is a two-bucket sliding window: the count of the current
//!   window plus the previous window's count weighted by how much of it still overlaps the last
//!   `window_ms` (the approximation Cloudflare's and nginx's limiters use), two counters per
//!   source.
//! - **Bounded.** Sources live in an LRU map of at most `max_sources` entries (`hashlink`); a new
//!   source past it evicts the least recently seen, in O(1). An IPv6 source is counted by its
//!   /64, which one host usually owns, so walking the addresses of one prefix does not evade the
//!   limit (or flush the table) for free.
//! - **No scan.** A ban puts its end on the timing wheel (`sip_core::timer::TimerWheel`); the
//!   worker calls `Flood::on_tick` at `Flood::next_deadline`, and only bans that end are
//!   touched.
//! - **Per worker.** Each worker keeps its own table. SO_REUSEPORT sends one source port to one
//!   worker, so a phone or a one-socket flood meets one table; a flood from many ports of one
//!   address is limited in each worker it reaches (at most `rate` × workers gets through, and
//!   only for the first window of each ban). Sharing bans through the mailboxes would save that
//!   little at the price of a message per ban to every worker and a table both must agree on.
//!
//! Exempt: the `[flood] exempt` networks (loopback by default) and `[auth] trusted`.

use crate::config::{FloodAction, FloodConfig};
use crate::stats::{inc, LogLimiter, Stats};
use hashlink::LruCache;
use sip_core::timer::{Millis, TimerHandle, TimerWheel};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::Ordering;

/// Refusals answered (503 or 403) per second per worker at most; beyond it they are dropped,
/// so answering a flood never costs more than this many small sends.
pub(crate) const ANSWERS_PER_SECOND: u32 = 100;

/// Ban and unban lines logged per second per worker at most.
const LOG_LINES_PER_SECOND: u32 = 5;

/// What a worker does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Handle it.
    Pass,
    /// Refuse it: its source is banned until this time.
    Refused {
        /// When the ban ends.
        until: Millis,
    },
}

/// One source's counts.
#[derive(Debug)]
struct Source {
    /// The window (`now / window_ms`) `current` counts.
    window: u64,
    current: u32,
    /// The count of the window before `window`.
    previous: u32,
    /// While banned: when the ban ends and its timer.
    ban: Option<(Millis, TimerHandle)>,
}

/// A worker's flood limits: see the module doc.
#[derive(Debug)]
pub(crate) struct Flood {
    cfg: FloodConfig,
    sources: LruCache<IpAddr, Source>,
    /// The end of each ban, by source.
    unbans: TimerWheel<IpAddr>,
    /// Sources banned now.
    banned: u64,
    log: LogLimiter,
    /// Answers sent in the second that began at `answers_since`.
    answers: u32,
    answers_since: Millis,
    expired: Vec<IpAddr>,
}

impl Flood {
    pub(crate) fn new(cfg: &FloodConfig, now: Millis) -> Flood {
        Flood {
            cfg: cfg.clone(),
            sources: LruCache::new(cfg.max_sources),
            unbans: TimerWheel::new(now),
            banned: 0,
            log: LogLimiter::new(LOG_LINES_PER_SECOND),
            answers: 0,
            answers_since: now,
            expired: Vec::new(),
        }
    }

    /// Takes a reloaded configuration. Counts and bans in force are kept (a shorter
    /// `max_sources` forgets the least recently seen sources first).
    pub(crate) fn reconfigure(&mut self, cfg: &FloodConfig, stats: &Stats) {
        self.cfg = cfg.clone();
        while self.sources.len() > cfg.max_sources {
            self.evict_oldest();
        }
        self.sources.set_capacity(cfg.max_sources);
        self.publish(stats);
    }

    /// Counts a request from `ip` at `now` (the worker calls it for every request before
    /// parsing it) and says whether to handle it.
    pub(crate) fn check(&mut self, now: Millis, ip: IpAddr, stats: &Stats) -> Verdict {
        if self.cfg.limit == 0 || self.cfg.exempt.iter().any(|n| n.contains(ip)) {
            return Verdict::Pass;
        }
        let key = key(ip);
        let Some(source) = self.sources.get_mut(&key) else {
            if self.sources.len() >= self.cfg.max_sources {
                self.evict_oldest();
                self.publish(stats);
            }
            let first = Source {
                window: now / self.cfg.window_ms,
                current: 1,
                previous: 0,
                ban: None,
            };
            self.sources.insert(key, first);
            // One request is within any limit that is on.
            return Verdict::Pass;
        };
        if let Some((until, timer)) = source.ban {
            if now < until {
                inc(&stats.flood_refused);
                return Verdict::Refused { until };
            }
            // Over, but the worker has not called `on_tick` yet: lifted here, then counted.
            self.unbans.cancel(timer);
            self.lift(key, now, stats);
            return self.check(now, ip, stats);
        }
        if !over_limit(&self.cfg, source, now) {
            return Verdict::Pass;
        }
        let until = now + self.cfg.ban_ms;
        source.ban = Some((until, self.unbans.insert(until, key)));
        self.banned += 1;
        inc(&stats.flood_bans);
        inc(&stats.flood_refused);
        self.publish(stats);
        if self.log.allow(now) {
            tracing::warn!(
                target: "sipsec::flood",
                "flood: {key} sent over {} requests in {} ms; refused for {} s",
                self.cfg.limit,
                self.cfg.window_ms,
                self.cfg.ban_ms / 1000
            );
        }
        Verdict::Refused { until }
    }

    /// The answer to a refused request (`data`, whose source is banned until `until`) when
    /// `[flood] action` answers and this second's answers are not spent: a 503 with
    /// Retry-After or a 403 built from the request's own lines without parsing it
    /// (`salvage_response`). None for ACKs, responses and text with no Via.
    pub(crate) fn answer(&mut self, now: Millis, until: Millis, data: &[u8]) -> Option<Vec<u8>> {
        let FloodAction::Answer(code) = self.cfg.action else {
            return None;
        };
        if now >= self.answers_since + 1000 {
            self.answers_since = now;
            self.answers = 0;
        }
        if self.answers >= ANSWERS_PER_SECOND {
            return None;
        }
        let mut extra = Vec::new();
        if code == 503 {
            let seconds = until.saturating_sub(now).div_ceil(1000).max(1);
            extra.extend_from_slice(format!("Retry-After: {seconds}\r\n").as_bytes());
        }
        let reason = sip_core::message::build::reason_phrase(code);
        let mut out = Vec::with_capacity(512);
        if !sip_core::message::build::salvage_response(data, code, reason, &extra, &mut out) {
            return None;
        }
        self.answers += 1;
        Some(out)
    }

    /// When `Flood::on_tick` next has a ban to lift (a lower bound), if any is in force.
    pub(crate) fn next_deadline(&self) -> Option<Millis> {
        self.unbans.next_deadline()
    }

    /// Lifts the bans that ended by `now`.
    pub(crate) fn on_tick(&mut self, now: Millis, stats: &Stats) {
        let mut expired = std::mem::take(&mut self.expired);
        self.unbans.advance(now, &mut expired);
        for key in expired.drain(..) {
            self.lift(key, now, stats);
        }
        self.expired = expired;
    }

    /// Ends the ban of `key`, if it has one (its timer fired or is cancelled).
    fn lift(&mut self, key: IpAddr, now: Millis, stats: &Stats) {
        // Not a refresh: lifting a ban is not the source being seen.
        let Some(source) = self.sources.peek_mut(&key) else {
            return;
        };
        if source.ban.take().is_some() {
            source.current = 0;
            source.previous = 0;
            self.banned -= 1;
            self.publish(stats);
            if self.log.allow(now) {
                tracing::info!(target: "sipsec::flood", "flood: {key} no longer refused");
            }
        }
    }

    /// Forgets the least recently seen source (and its ban).
    fn evict_oldest(&mut self) {
        if let Some((_, source)) = self.sources.remove_lru() {
            if let Some((_, timer)) = source.ban {
                self.unbans.cancel(timer);
                self.banned -= 1;
            }
        }
    }

    /// Sets the gauge of sources banned.
    fn publish(&self, stats: &Stats) {
        stats
            .traffic
            .flood_banned
            .store(self.banned, Ordering::Relaxed);
    }
}

/// Counts a request of `source` at `now`; true if that puts it over the limit. The estimate
/// is this window's count plus the previous window's, weighted by the share of it the last
/// `window_ms` still covers.
fn over_limit(cfg: &FloodConfig, source: &mut Source, now: Millis) -> bool {
    let span = cfg.window_ms;
    let window = now / span;
    match window.checked_sub(source.window) {
        Some(0) => {}
        Some(1) => {
            source.previous = source.current;
            source.current = 0;
        }
        _ => {
            source.previous = 0;
            source.current = 0;
        }
    }
    source.window = window;
    source.current = source.current.saturating_add(1);
    let overlap = span - now % span;
    let estimate = u64::from(source.current) + u64::from(source.previous) * overlap / span;
    estimate > u64::from(cfg.limit)
}

/// What a source is counted by: its address, an IPv6 one by its /64 (an IPv4-mapped IPv6
/// address as the IPv4 address it is).
fn key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn flood(extra: &str) -> (Flood, Stats) {
        let cfg = Config::from_toml(&format!("[flood]\nexempt = []\n{extra}")).unwrap();
        (Flood::new(&cfg.flood, 0), Stats::default())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn load(c: &std::sync::atomic::AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    #[test]
    fn a_source_over_the_rate_is_refused_for_the_ban_and_then_admitted_again() {
        let (mut f, stats) = flood("rate = 10\nwindow_ms = 1000\nban_s = 30");
        let a = ip("192.0.2.1");
        for t in 0..10 {
            assert_eq!(f.check(t * 10, a, &stats), Verdict::Pass);
        }
        assert_eq!(f.check(100, a, &stats), Verdict::Refused { until: 30_100 });
        assert_eq!(
            f.check(20_000, a, &stats),
            Verdict::Refused { until: 30_100 }
        );
        // Another source is not affected.
        assert_eq!(f.check(20_000, ip("192.0.2.2"), &stats), Verdict::Pass);
        assert_eq!(load(&stats.flood_bans), 1);
        assert_eq!(load(&stats.flood_refused), 2);
        assert_eq!(load(&stats.traffic.flood_banned), 1);
        // The wheel says when to come back; nothing is lifted before then.
        let due = f.next_deadline().unwrap();
        assert!(due <= 30_100, "{due}");
        f.on_tick(30_099, &stats);
        assert_eq!(load(&stats.traffic.flood_banned), 1);
        f.on_tick(30_100, &stats);
        assert_eq!(load(&stats.traffic.flood_banned), 0);
        assert_eq!(f.next_deadline(), None);
        assert_eq!(f.check(30_101, a, &stats), Verdict::Pass);
    }

    #[test]
    fn a_ban_that_ran_out_is_lifted_by_the_next_request_if_the_tick_is_late() {
        let (mut f, stats) = flood("rate = 1\nban_s = 5");
        let a = ip("192.0.2.1");
        f.check(0, a, &stats);
        assert!(matches!(
            f.check(0, a, &stats),
            Verdict::Refused { until: 5_000 }
        ));
        assert_eq!(f.check(5_000, a, &stats), Verdict::Pass);
        assert_eq!(load(&stats.traffic.flood_banned), 0);
        assert_eq!(f.next_deadline(), None, "its timer is cancelled");
    }

    #[test]
    fn the_window_slides_so_a_burst_across_its_edge_counts_whole() {
        let (mut f, stats) = flood("rate = 10\nwindow_ms = 1000");
        let a = ip("192.0.2.1");
        // Nine at the end of one window, then three at the start of the next: a fixed window
        // would admit all twelve in 200 ms; the sliding one refuses the twelfth.
        for t in 900..909 {
            assert_eq!(f.check(t, a, &stats), Verdict::Pass);
        }
        assert_eq!(f.check(1_000, a, &stats), Verdict::Pass);
        assert_eq!(f.check(1_001, a, &stats), Verdict::Pass);
        assert!(matches!(f.check(1_100, a, &stats), Verdict::Refused { .. }));
        // Spread out, the same rate passes: the previous window's weight fades.
        let b = ip("192.0.2.2");
        for t in 0..100 {
            assert_eq!(f.check(t * 150, b, &stats), Verdict::Pass, "at {}", t * 150);
        }
    }

    #[test]
    fn exempt_networks_and_a_zero_rate_are_never_limited() {
        let cfg = Config::from_toml(
            "[flood]\nrate = 1\nexempt = [\"10.0.0.0/8\"]\n[auth]\ntrusted = [\"2001:db8::/32\"]",
        )
        .unwrap();
        let (mut f, stats) = (Flood::new(&cfg.flood, 0), Stats::default());
        for t in 0..1000 {
            assert_eq!(f.check(t, ip("10.1.2.3"), &stats), Verdict::Pass);
            assert_eq!(f.check(t, ip("2001:db8::7"), &stats), Verdict::Pass);
        }
        assert!(matches!(
            (
                f.check(0, ip("192.0.2.1"), &stats),
                f.check(0, ip("192.0.2.1"), &stats)
            ),
            (Verdict::Pass, Verdict::Refused { .. })
        ));
        let (mut off, stats) = flood("rate = 0");
        for t in 0..10_000 {
            assert_eq!(off.check(t, ip("192.0.2.1"), &stats), Verdict::Pass);
        }
        assert_eq!(off.sources.len(), 0);
        // Loopback is exempt by default.
        let mut default = Flood::new(&Config::default().flood, 0);
        for _ in 0..10_000 {
            assert_eq!(default.check(0, ip("127.0.0.1"), &stats), Verdict::Pass);
        }
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_least_recently_seen() {
        let (mut f, stats) = flood("rate = 2\nmax_sources = 2\nban_s = 10");
        let (a, b, c) = (ip("192.0.2.1"), ip("192.0.2.2"), ip("192.0.2.3"));
        for s in [a, a, a] {
            f.check(0, s, &stats);
        }
        assert_eq!(load(&stats.traffic.flood_banned), 1);
        f.check(1, b, &stats);
        f.check(2, b, &stats);
        // `a` was seen least recently: `c` takes its place, and its ban goes with it.
        f.check(3, c, &stats);
        assert_eq!(f.sources.len(), 2);
        assert_eq!(load(&stats.traffic.flood_banned), 0);
        assert_eq!(
            f.next_deadline(),
            None,
            "the evicted ban's timer is cancelled"
        );
        assert_eq!(f.check(4, a, &stats), Verdict::Pass);
        // `b` was evicted by `a` in turn: its count starts again.
        assert_eq!(f.check(5, b, &stats), Verdict::Pass);
        assert_eq!(f.sources.len(), 2);
    }

    #[test]
    fn an_ipv6_source_is_counted_by_its_64() {
        let (mut f, stats) = flood("rate = 2");
        assert_eq!(f.check(0, ip("2001:db8:1:2::1"), &stats), Verdict::Pass);
        assert_eq!(f.check(0, ip("2001:db8:1:2::2"), &stats), Verdict::Pass);
        assert!(matches!(
            f.check(0, ip("2001:db8:1:2:ffff::3"), &stats),
            Verdict::Refused { .. }
        ));
        assert_eq!(f.check(0, ip("2001:db8:1:3::1"), &stats), Verdict::Pass);
        assert_eq!(key(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
    }

    #[test]
    fn refusals_are_answered_cheaply_and_at_a_bounded_rate() {
        let request =
            b"OPTIONS sip:x@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK1\r\n\
            From: <sip:a@example.com>;tag=1\r\nTo: <sip:x@example.com>\r\nCall-ID: c1\r\n\
            CSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n";
        let (mut dropping, _) = flood("");
        assert_eq!(dropping.answer(0, 60_000, request), None);
        let (mut f, _) = flood("action = \"503\"");
        let answer = String::from_utf8(f.answer(0, 2_500, request).unwrap()).unwrap();
        assert!(
            answer.starts_with("SIP/2.0 503 Service Unavailable\r\n"),
            "{answer}"
        );
        assert!(answer.contains("Retry-After: 3\r\n") && answer.contains("Call-ID: c1\r\n"));
        let ack =
            b"ACK sip:x@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK1\r\n\r\n";
        assert_eq!(f.answer(0, 2_500, ack), None);
        let answered = (1..1000)
            .filter(|_| f.answer(10, 2_500, request).is_some())
            .count();
        assert_eq!(answered as u32, ANSWERS_PER_SECOND - 1);
        assert!(f.answer(1_000, 2_500, request).is_some());
        let (mut forbidden, _) = flood("action = \"403\"");
        let answer = forbidden.answer(0, 2_500, request).unwrap();
        assert!(answer.starts_with(b"SIP/2.0 403 Forbidden\r\n"));
        assert!(!String::from_utf8(answer).unwrap().contains("Retry-After"));
    }

    #[test]
    fn a_reload_keeps_bans_and_shrinks_the_table() {
        let (mut f, stats) = flood("rate = 1\nmax_sources = 10");
        for i in 0..10u8 {
            f.check(u64::from(i), IpAddr::from([192, 0, 2, i]), &stats);
        }
        f.check(20, IpAddr::from([192, 0, 2, 9]), &stats);
        assert_eq!(load(&stats.traffic.flood_banned), 1);
        let smaller = Config::from_toml("[flood]\nexempt = []\nrate = 1\nmax_sources = 3").unwrap();
        f.reconfigure(&smaller.flood, &stats);
        assert_eq!(f.sources.len(), 3);
        assert_eq!(load(&stats.traffic.flood_banned), 1);
        assert!(matches!(
            f.check(30, IpAddr::from([192, 0, 2, 9]), &stats),
            Verdict::Refused { .. }
        ));
    }
}
