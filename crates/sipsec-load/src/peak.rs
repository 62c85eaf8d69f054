//! `--find-peak`: the highest rate at which at least 99% of operations succeed — the seeds'
//! definition of peak throughput. The rate doubles until a trial fails, then the interval
//! between the last good and the first bad rate is bisected down to a relative precision.

/// The search's settings.
#[derive(Debug, Clone, Copy)]
pub struct Search {
    /// The first rate tried, operations per second.
    pub start: f64,
    /// The highest rate tried, operations per second.
    pub max: f64,
    /// Stop bisecting when the interval is narrower than this fraction of the good rate.
    pub(crate) precision: f64,
    /// Fraction of operations that must succeed (0.99).
    pub threshold: f64,
}

/// One trial's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trial {
    /// The rate tried, operations per second.
    pub rate: f64,
    pub(crate) success_ratio: f64,
}

/// Runs trials through `run` (rate → success ratio) and returns the peak (0 when even the
/// lowest rate tried fails) with every trial in order.
pub fn find_peak(s: Search, mut run: impl FnMut(f64) -> f64) -> (f64, Vec<Trial>) {
    let mut trials = Vec::new();
    let mut trial = |rate: f64, trials: &mut Vec<Trial>| {
        let success_ratio = run(rate);
        trials.push(Trial {
            rate,
            success_ratio,
        });
        success_ratio >= s.threshold
    };
    let mut good = 0.0;
    let mut rate = s.start.min(s.max);
    while trial(rate, &mut trials) {
        good = rate;
        if rate >= s.max {
            return (good, trials);
        }
        rate = (rate * 2.0).min(s.max);
    }
    let mut bad = rate;
    let floor = 1.0;
    while bad - good > (good * s.precision).max(floor) {
        let mid = ((good + bad) / 2.0).round();
        if mid <= good || mid >= bad {
            break;
        }
        if trial(mid, &mut trials) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    (good, trials)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(start: f64, max: f64) -> Search {
        Search {
            start,
            max,
            precision: 0.02,
            threshold: 0.99,
        }
    }

    /// A server of fixed capacity: everything above it fails in proportion.
    fn capacity(cap: f64) -> impl FnMut(f64) -> f64 {
        move |rate| if rate <= cap { 1.0 } else { 0.9 * cap / rate }
    }

    #[test]
    fn finds_a_capacity_within_the_precision() {
        let (peak, trials) = find_peak(search(500.0, 100_000.0), capacity(7_300.0));
        assert!((7_300.0 * 0.98..=7_300.0).contains(&peak), "{peak}");
        assert!(trials.len() < 20, "{}", trials.len());
        assert!(trials
            .iter()
            .all(|t| (t.success_ratio >= 0.99) == (t.rate <= 7_300.0)));
    }

    #[test]
    fn searches_below_a_failing_start() {
        let (peak, _) = find_peak(search(1000.0, 100_000.0), capacity(300.0));
        assert!((294.0..=300.0).contains(&peak), "{peak}");
    }

    #[test]
    fn stops_at_the_maximum_and_reports_zero_when_nothing_passes() {
        assert_eq!(find_peak(search(100.0, 1000.0), capacity(1e9)).0, 1000.0);
        assert_eq!(find_peak(search(100.0, 1000.0), |_| 0.0).0, 0.0);
    }
}
