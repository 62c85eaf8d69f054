//! Statistics that can rank rows, valid at the number of rounds the lab runs. A row is
//! measured once per round, rows alternating within a round, so a row and its baseline
//! measured in the same round share that round's machine noise: a row's cost against its
//! baseline is summarised by the per-round ratios (row ÷ baseline, paired by round).
//!
//! The estimate is their geometric mean, and the interval a Student's t-interval on their
//! logarithms: `exp(mean ± t(n−1, 0.975) · sd / √n)`. It is exact when the log-ratios are
//! normal and close to its level for the skewed, heavy-ish noise of a shared machine already
//! at five rounds (the unit tests simulate both), where the percentile bootstrap of a median
//! this replaces covers about 50% at two rounds and 75% at three. Below [`MIN_ROUNDS`] no
//! interval is given and no row is ranked. Two rows are ranked only where an interval
//! excludes 1 (against the baseline) or the two intervals do not overlap (between rows).
//!
//! Everything here is deterministic: a report regenerated from the same JSON lines does not
//! change.

use statrs::distribution::{ContinuousCDF, StudentsT};

/// The fewest paired rounds an interval is given for.
pub const MIN_ROUNDS: usize = 5;

/// The intervals' confidence level.
pub const LEVEL: f64 = 0.95;

/// How the intervals are made, in words, for the report to print beside each table.
pub const METHOD: &str =
    "Student's t-interval on the log of the per-round ratios to the baseline (paired by round)";

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

/// A row's cost as a ratio to its baseline over the rounds both were measured in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    /// The geometric mean of the per-round ratios.
    pub mean: f64,
    /// The [`LEVEL`] interval of that mean, `(low, high)`; `None` below [`MIN_ROUNDS`]
    /// rounds.
    pub interval: Option<(f64, f64)>,
    /// The rounds paired.
    pub n: usize,
}

impl Ratio {
    /// Whether the interval lies wholly below 1: the row is cheaper than its baseline.
    pub fn below_one(&self) -> bool {
        self.interval.is_some_and(|(_, high)| high < 1.0)
    }

    /// Whether the interval lies wholly above 1: the row is dearer than its baseline.
    pub fn above_one(&self) -> bool {
        self.interval.is_some_and(|(low, _)| low > 1.0)
    }

    /// Whether this row is cheaper than `other` with the intervals apart (both against the
    /// same baseline).
    pub fn cheaper_than(&self, other: &Ratio) -> bool {
        match (self.interval, other.interval) {
            (Some((_, high)), Some((low, _))) => high < low,
            _ => false,
        }
    }
}

/// The row's cost as a ratio to the baseline, round by round (`row[i]` and `baseline[i]`
/// measured in round `i`): the geometric mean of the per-round ratios and its t-interval.
/// `None` when no round has both values positive.
pub fn ratio(row: &[f64], baseline: &[f64]) -> Option<Ratio> {
    let logs: Vec<f64> = row
        .iter()
        .zip(baseline)
        .filter(|(r, b)| **r > 0.0 && **b > 0.0 && r.is_finite() && b.is_finite())
        .map(|(r, b)| (r / b).ln())
        .collect();
    // The t-interval of the mean log-ratio, taken back to ratios.
    let m = mean_interval(&logs)?;
    Some(Ratio {
        mean: m.mean.exp(),
        interval: m.interval.map(|(low, high)| (low.exp(), high.exp())),
        n: m.n,
    })
}

/// A mean over rounds with its interval, for figures that are not ratios (goodput as a
/// share of a reference, which may be near zero, where logs would not do).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mean {
    /// The arithmetic mean over rounds.
    pub mean: f64,
    /// The [`LEVEL`] t-interval of the mean; `None` below [`MIN_ROUNDS`] rounds.
    pub interval: Option<(f64, f64)>,
    /// The rounds.
    pub n: usize,
}

impl Mean {
    /// `0.74 [0.70, 0.78]`, or `0.74 (n = 3)` without an interval.
    pub fn text(&self, digits: usize) -> String {
        match self.interval {
            Some((low, high)) => {
                format!("{:.digits$} [{low:.digits$}, {high:.digits$}]", self.mean)
            }
            None => format!("{:.digits$} (n = {})", self.mean, self.n),
        }
    }
}

/// The mean of `values` (one per round) and its t-interval; `None` if there are none.
pub fn mean_interval(values: &[f64]) -> Option<Mean> {
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    let n = v.len();
    if n == 0 {
        return None;
    }
    let mean = v.iter().sum::<f64>() / n as f64;
    let interval = (n >= MIN_ROUNDS).then(|| {
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let half = t_quantile(n - 1) * (var / n as f64).sqrt();
        (mean - half, mean + half)
    });
    Some(Mean { mean, interval, n })
}

/// The two-sided [`LEVEL`] quantile of Student's t with `df` degrees of freedom.
fn t_quantile(df: usize) -> f64 {
    // `df` ≥ 1 here and the location and scale are fixed, so the distribution always exists.
    StudentsT::new(0.0, 1.0, df as f64)
        .map(|t| t.inverse_cdf(0.5 + LEVEL / 2.0))
        .unwrap_or(f64::INFINITY)
}

/// The method, level and n of an interval, in the words the report prints.
pub fn describe(rounds: usize) -> String {
    if rounds < MIN_ROUNDS {
        format!(
            "{rounds} round{}: fewer than {MIN_ROUNDS}, so no intervals and no rankings — a \
             first look, not a result",
            if rounds == 1 { "" } else { "s" }
        )
    } else {
        format!(
            "{:.0}% intervals: {METHOD}, n = {rounds} rounds",
            LEVEL * 100.0
        )
    }
}

/// [`describe`] for means over rounds ([`mean_interval`]).
pub fn describe_means(rounds: usize) -> String {
    if rounds < MIN_ROUNDS {
        describe(rounds)
    } else {
        format!(
            "{:.0}% intervals: Student's t-interval of the mean over rounds, n = {rounds} rounds",
            LEVEL * 100.0
        )
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

    /// The t quantiles the intervals use, against the tables.
    #[test]
    fn t_quantiles_match_the_tables() {
        for (df, t) in [(1, 12.706), (4, 2.776), (9, 2.262), (29, 2.045)] {
            assert!((t_quantile(df) - t).abs() < 1e-3, "df {df}");
        }
    }

    /// Round noise that moves a row and its baseline together cancels in the ratio.
    #[test]
    fn noise_shared_by_a_round_cancels() {
        let noise = [1.0, 1.3, 0.8, 1.1, 0.9, 1.25, 0.85];
        let baseline: Vec<f64> = noise.iter().map(|n| 100.0 * n).collect();
        let row: Vec<f64> = noise.iter().map(|n| 60.0 * n).collect();
        let r = ratio(&row, &baseline).unwrap();
        assert!((r.mean - 0.6).abs() < 1e-9, "{r:?}");
        let (low, high) = r.interval.unwrap();
        assert!(
            (low - 0.6).abs() < 1e-9 && (high - 0.6).abs() < 1e-9,
            "{r:?}"
        );
        assert!(r.below_one() && !r.above_one());
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
        let (low, high) = a.interval.unwrap();
        assert!(low < a.mean && a.mean < high);
    }

    /// Fewer than five rounds give an estimate but no interval, and rank nothing.
    #[test]
    fn too_few_rounds_rank_nothing() {
        let r = ratio(&[50.0, 52.0, 49.0, 51.0], &[100.0; 4]).unwrap();
        assert_eq!((r.n, r.interval), (4, None));
        assert!(!r.below_one() && !r.above_one() && !r.cheaper_than(&r));
        assert!(describe(4).contains("not a result"));
        assert!(describe(5).contains("n = 5"));
    }

    #[test]
    fn the_interval_is_the_same_every_time() {
        let row = [50.0, 70.0, 65.0, 40.0, 90.0];
        let baseline = [100.0, 95.0, 110.0, 90.0, 105.0];
        assert_eq!(ratio(&row, &baseline), ratio(&row, &baseline));
        assert_eq!(ratio(&[], &[]), None);
        assert_eq!(ratio(&[1.0], &[0.0]), None);
    }

    /// splitmix64: a seeded source for the coverage simulation.
    struct Rng(u64);

    impl Rng {
        fn uniform(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }

        /// A standard normal draw (Box–Muller).
        fn normal(&mut self) -> f64 {
            let (u, v) = (self.uniform().max(1e-300), self.uniform());
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        }
    }

    /// The share of simulated experiments (`rounds` rounds each) whose interval covers the
    /// true ratio, with `noise` drawing one measurement's multiplicative error.
    fn coverage(rounds: usize, truth: f64, noise: &dyn Fn(&mut Rng) -> f64) -> f64 {
        let mut rng = Rng(0x5eed);
        let trials = 4_000;
        let mut covered = 0;
        for _ in 0..trials {
            let (mut row, mut base) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                // What the round shares (the machine's state), then each run's own noise.
                let shared = (0.3 * rng.normal()).exp();
                base.push(100.0 * shared * noise(&mut rng));
                row.push(100.0 * truth * shared * noise(&mut rng));
            }
            let (low, high) = ratio(&row, &base).unwrap().interval.unwrap();
            covered += usize::from(low <= truth && truth <= high);
        }
        covered as f64 / trials as f64
    }

    /// The stated 95% holds within ±5 points at the rounds the lab runs, for log-normal
    /// noise (the interval's own assumption) and for a skewed noise with rare stalls (a
    /// shared machine: most runs within a few percent, one in ten 20–60% slow).
    #[test]
    fn the_stated_coverage_holds_in_simulation() {
        let lognormal = |rng: &mut Rng| (0.05 * rng.normal()).exp();
        let stalls = |rng: &mut Rng| {
            let base = 1.0 + 0.03 * rng.uniform();
            if rng.uniform() < 0.1 {
                base * (1.2 + 0.4 * rng.uniform())
            } else {
                base
            }
        };
        for rounds in [5, 7, 10] {
            for (name, noise) in [
                ("log-normal", &lognormal as &dyn Fn(&mut Rng) -> f64),
                ("stalls", &stalls),
            ] {
                let c = coverage(rounds, 1.7, noise);
                assert!(
                    (0.90..=1.0).contains(&c),
                    "{name}, {rounds} rounds: coverage {c:.3}"
                );
            }
        }
    }
}
