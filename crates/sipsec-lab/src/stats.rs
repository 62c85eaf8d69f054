//! Statistics that can rank rows. A row is measured once per round, rows alternating within a
//! round, so a row and its baseline measured in the same round share that round's machine
//! noise: a row's cost is summarised as the median over rounds of its per-round ratio to the
//! baseline, with a bootstrap 95% confidence interval over rounds. Two rows are ranked only
//! where their intervals do not overlap.
//!
//! The bootstrap resamples with a fixed-seed generator, so the same results always give the
//! same interval (a report regenerated from the same JSON lines does not change).

/// The median of `values` (the mean of the middle two for an even count); `None` if empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// A ratio to the baseline: the median over rounds and its 95% confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    /// The median over rounds of the per-round ratios.
    pub median: f64,
    /// The bootstrap 95% interval's lower end.
    pub low: f64,
    /// The bootstrap 95% interval's upper end.
    pub high: f64,
}

impl Ratio {
    /// Whether this row is cheaper than `other` with the intervals apart.
    #[cfg(test)]
    pub(crate) fn cheaper_than(&self, other: &Ratio) -> bool {
        self.high < other.low
    }
}

/// Resamples drawn for an interval: enough that the 2.5th and 97.5th percentiles move by
/// well under a percent between seeds.
const RESAMPLES: usize = 2_000;

/// The row's cost as a ratio to the baseline, round by round (`row[i]` and `baseline[i]`
/// measured in round `i`): the median of the per-round ratios and a percentile bootstrap 95%
/// interval of that median. `None` when no round has both values positive.
pub fn ratio(row: &[f64], baseline: &[f64]) -> Option<Ratio> {
    let ratios: Vec<f64> = row
        .iter()
        .zip(baseline)
        .filter(|(r, b)| **r > 0.0 && **b > 0.0)
        .map(|(r, b)| r / b)
        .collect();
    let median_ratio = median(&ratios)?;
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut medians = Vec::with_capacity(RESAMPLES);
    let mut sample = vec![0.0; ratios.len()];
    for _ in 0..RESAMPLES {
        for s in sample.iter_mut() {
            *s = ratios[rng.below(ratios.len())];
        }
        medians.extend(median(&sample));
    }
    medians.sort_by(f64::total_cmp);
    let at = |q: f64| medians[((medians.len() - 1) as f64 * q).round() as usize];
    Some(Ratio {
        median: median_ratio,
        low: at(0.025),
        high: at(0.975),
    })
}

/// xorshift64: small, fast and seedable; the bootstrap needs reproducibility, not quality
/// beyond uniform indices.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
    }

    /// Round noise that moves a row and its baseline together cancels in the ratio.
    #[test]
    fn noise_shared_by_a_round_cancels() {
        let noise = [1.0, 1.3, 0.8, 1.1, 0.9, 1.25, 0.85];
        let baseline: Vec<f64> = noise.iter().map(|n| 100.0 * n).collect();
        let row: Vec<f64> = noise.iter().map(|n| 60.0 * n).collect();
        let r = ratio(&row, &baseline).unwrap();
        assert!((r.median - 0.6).abs() < 1e-9, "{r:?}");
        assert!(
            (r.low - 0.6).abs() < 1e-9 && (r.high - 0.6).abs() < 1e-9,
            "{r:?}"
        );
    }

    /// Rows 10% apart are ranked when their per-round ratios are tight, and not when they
    /// spread as widely as the seeds' ±30%.
    #[test]
    fn rows_are_ranked_only_when_their_intervals_separate() {
        let baseline = [100.0; 9];
        let spread = |cost: f64, errors: [f64; 9]| -> Vec<f64> {
            errors.iter().map(|e| cost * (1.0 + e)).collect()
        };
        let tight = [-0.02, 0.01, 0.0, 0.015, -0.01, 0.02, -0.015, 0.005, -0.005];
        let a = ratio(&spread(90.0, tight), &baseline).unwrap();
        let b = ratio(&spread(100.0, tight), &baseline).unwrap();
        assert!(a.cheaper_than(&b), "{a:?} {b:?}");
        assert!(!b.cheaper_than(&a));
        let wide = [-0.3, 0.25, 0.0, 0.3, -0.2, 0.1, -0.25, 0.2, -0.1];
        let a = ratio(&spread(90.0, wide), &baseline).unwrap();
        let b = ratio(&spread(100.0, wide), &baseline).unwrap();
        assert!(!a.cheaper_than(&b), "{a:?} {b:?}");
        assert!(a.low < a.median && a.median < a.high);
    }

    #[test]
    fn the_interval_is_the_same_every_time() {
        let row = [50.0, 70.0, 65.0, 40.0, 90.0];
        let baseline = [100.0, 95.0, 110.0, 90.0, 105.0];
        assert_eq!(ratio(&row, &baseline), ratio(&row, &baseline));
        assert_eq!(ratio(&[], &[]), None);
        assert_eq!(ratio(&[1.0], &[0.0]), None);
    }
}
