//! Fairness under overload: while local admission refuses what exceeds the capacity, the
//! capacity is shared between sources max-min fairly, so one source flooding far beyond its
//! share is refused first and cannot take the capacity of the well-behaved ones.
//!
//! Each interval the new requests of each source address are counted (only while local
//! admission is on: below the threshold this costs nothing). At the interval's end the fair
//! share `f` is the rate at which `Σ min(rate_i, f)` fills the capacity; a source offering
//! more than `f` keeps `f / rate` of its new requests (spread evenly by error diffusion) in
//! the next interval, and the rest are refused before they reach the capacity's token
//! bucket. Sources offering less than `f` are admitted without the bucket (the shares add up
//! to the capacity, so a flood's kept requests cannot crowd them out of it). Beyond [`MAX_SOURCES`] addresses
//! an interval, the rest are not told apart (they share the bucket as before).

use std::collections::HashMap;
use std::net::IpAddr;

/// Source addresses counted an interval, at most.
pub(crate) const MAX_SOURCES: usize = 4096;

#[derive(Debug, Default)]
struct Source {
    /// New requests this interval.
    arrived: u32,
    /// Whether an interval's end has set `keep`.
    judged: bool,
    /// The share of its new requests it keeps (1: not over its share).
    keep: f64,
    /// Refusals owed (error diffusion of `keep`).
    owed: f64,
}

/// Per-source shares of a worker's capacity.
#[derive(Debug, Default)]
pub(crate) struct Shares {
    sources: HashMap<IpAddr, Source>,
}

impl Shares {
    /// A new request from `ip` while local admission is on: `Some(true)` if its source was
    /// judged under its share last interval (admitted outright: the shares add up to the
    /// capacity), `Some(false)` if its source is over its share and this one is refused, and
    /// None if the capacity's token bucket decides (a source not judged yet, or one over its
    /// share whose request its share keeps).
    pub(crate) fn admit(&mut self, ip: IpAddr) -> Option<bool> {
        let full = self.sources.len() >= MAX_SOURCES;
        let s = match self.sources.get_mut(&ip) {
            Some(s) => s,
            None if full => return None,
            None => self.sources.entry(ip).or_default(),
        };
        s.arrived = s.arrived.saturating_add(1);
        if !s.judged {
            return None;
        }
        if s.keep >= 1.0 {
            return Some(true);
        }
        s.owed += 1.0 - s.keep;
        if s.owed >= 1.0 {
            s.owed -= 1.0;
            Some(false)
        } else {
            None
        }
    }

    /// The interval ended: shares for the next, from what each source offered against
    /// `capacity` new requests per second (0 or `on` false: forget every source).
    pub(crate) fn update(&mut self, elapsed_s: f64, capacity: f64, on: bool) {
        if !on || capacity <= 0.0 {
            self.sources.clear();
            return;
        }
        let fair = fair_share(
            self.sources
                .values()
                .map(|s| f64::from(s.arrived) / elapsed_s.max(1e-3)),
            capacity,
        );
        self.sources.retain(|_, s| {
            let rate = f64::from(s.arrived) / elapsed_s.max(1e-3);
            s.keep = match fair {
                Some(f) if rate > f => f / rate,
                _ => 1.0,
            };
            s.judged = true;
            s.arrived = 0;
            // A source that sent nothing this interval need not be remembered.
            rate > 0.0
        });
    }

    /// The share a source keeps now (tests).
    #[cfg(test)]
    pub(crate) fn keep(&self, ip: IpAddr) -> f64 {
        self.sources.get(&ip).map_or(1.0, |s| s.keep)
    }
}

/// The max-min fair share of `capacity` between sources offering `rates`: the `f` at which
/// `Σ min(rate, f) = capacity`, or None when everything offered fits.
fn fair_share(rates: impl Iterator<Item = f64>, capacity: f64) -> Option<f64> {
    let mut rates: Vec<f64> = rates.collect();
    rates.sort_by(|a, b| a.total_cmp(b));
    let mut left = capacity;
    let mut n = rates.len();
    for r in rates {
        let f = left / n as f64;
        if r > f {
            return Some(f);
        }
        left -= r;
        n -= 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fair_share_fills_the_capacity_after_the_small_sources() {
        // Three sources at 300/s and one at 6,000/s into 2,000/s: the small ones fit, the
        // large one gets the 1,100 left.
        let f = fair_share([300.0, 6000.0, 300.0, 300.0].into_iter(), 2000.0);
        assert_eq!(f, Some(1100.0));
        // Everything fits: no share.
        assert_eq!(fair_share([300.0, 600.0].into_iter(), 2000.0), None);
        // Two floods alike split it.
        assert_eq!(
            fair_share([5000.0, 5000.0].into_iter(), 2000.0),
            Some(1000.0)
        );
    }

    #[test]
    fn a_flooding_source_is_cut_to_its_share_and_the_others_are_not() {
        let flood: IpAddr = "198.18.0.66".parse().unwrap();
        let good: IpAddr = "198.18.0.7".parse().unwrap();
        let mut s = Shares::default();
        // One 100 ms interval: the flood sends 600, the good source 30, into 2,000/s.
        for _ in 0..600 {
            assert_eq!(s.admit(flood), None);
        }
        for _ in 0..30 {
            assert_eq!(s.admit(good), None);
        }
        s.update(0.1, 2000.0, true);
        assert_eq!(s.keep(good), 1.0);
        let keep = s.keep(flood);
        assert!((keep - 1700.0 / 6000.0).abs() < 1e-9, "{keep}");
        // The next interval the flood keeps that share, evenly; the good source all.
        let kept = (0..600).filter(|_| s.admit(flood).is_none()).count();
        assert!((kept as f64 - 600.0 * keep).abs() <= 1.0, "{kept}");
        assert!((0..30).all(|_| s.admit(good) == Some(true)));
        // Control off: every source forgotten.
        s.update(0.1, 2000.0, false);
        assert_eq!(s.keep(flood), 1.0);
    }
}
