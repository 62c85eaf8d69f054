//! Non-negative least squares: minimise ‖A x − b‖₂ subject to x ≥ 0, by Lawson and Hanson's
//! active-set algorithm (C. L. Lawson and R. J. Hanson, *Solving Least Squares Problems*,
//! Prentice-Hall 1974, chapter 23, algorithm NNLS).
//!
//! Written here rather than taken from crates.io: the one crate for it (`nnls` 0.5, a port of
//! the book's Fortran) panics where round-off makes a passive coefficient non-positive (a path
//! of the Fortran it did not port) and brings ndarray and ndarray-stats for what is here a
//! problem of a few dozen rows and at most fifteen columns. Each passive-set subproblem is
//! solved by Householder QR rather than the normal equations, on columns scaled to unit norm
//! (which moves no constraint), so the conditioning is not squared; a column that is
//! numerically a combination of the passive ones, or whose coefficient would come out
//! non-positive, is not let in (the book's step 6), which is how collinear blocks are met.

/// Relative size below which a column counts as dependent on the passive ones.
const RANK_TOL: f64 = 1e-10;

/// The solution `x ≥ 0` of `min ‖A x − b‖` for `a` given by rows (all of one length). A
/// column of zeros gets 0. Ends after 3n additions to the passive set (the book's limit) with
/// the feasible point reached, should round-off make it cycle.
pub(crate) fn nnls(a: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let n = a.first().map_or(0, Vec::len);
    let norms: Vec<f64> = (0..n)
        .map(|j| a.iter().map(|r| r[j] * r[j]).sum::<f64>().sqrt())
        .collect();
    let scaled: Vec<Vec<f64>> = a
        .iter()
        .map(|r| {
            r.iter()
                .zip(&norms)
                .map(|(v, s)| if *s > 0.0 { v / s } else { 0.0 })
                .collect()
        })
        .collect();
    let tol = RANK_TOL * b.iter().map(|v| v * v).sum::<f64>().sqrt().max(1.0);
    let mut x = vec![0.0; n];
    let mut passive: Vec<usize> = Vec::new();
    for _ in 0..3 * n {
        // The dual vector w = Aᵀ(b − A x): a column with w_j > 0 would lower the residual.
        let w = gradient(&scaled, b, &x);
        let mut candidates: Vec<usize> = (0..n)
            .filter(|j| norms[*j] > 0.0 && !passive.contains(j) && w[*j] > tol)
            .collect();
        candidates.sort_by(|p, q| w[*q].total_cmp(&w[*p]));
        // The largest w_j whose column is independent of the passive ones and comes out
        // positive enters (step 6: otherwise its w_j counts as 0 and the next is tried).
        let entered = candidates.into_iter().find_map(|t| {
            let mut trial = passive.clone();
            trial.push(t);
            let z = least_squares(&scaled, &trial, b)?;
            (*z.last()? > 0.0).then_some(trial)
        });
        let Some(trial) = entered else {
            break;
        };
        passive = trial;
        // Inner loop: step back towards the previous point until every passive coefficient is
        // positive, moving those that reach zero out of the passive set.
        while let Some(z) = least_squares(&scaled, &passive, b) {
            if z.iter().all(|v| *v > 0.0) {
                for (&j, v) in passive.iter().zip(z) {
                    x[j] = v;
                }
                break;
            }
            let (alpha, first) = passive
                .iter()
                .zip(&z)
                .enumerate()
                .filter(|(_, (_, zj))| **zj <= 0.0)
                .map(|(k, (&j, zj))| (x[j] / (x[j] - zj), k))
                .min_by(|p, q| p.0.total_cmp(&q.0))
                .expect("a non-positive coefficient");
            for (&j, zj) in passive.iter().zip(&z) {
                x[j] += alpha * (zj - x[j]);
            }
            // The one that set alpha leaves exactly; others round-off took to zero with it.
            x[passive[first]] = 0.0;
            passive.retain(|&j| x[j] > 0.0);
            for (j, v) in x.iter_mut().enumerate() {
                if !passive.contains(&j) {
                    *v = 0.0;
                }
            }
        }
    }
    x.iter()
        .zip(&norms)
        .map(|(v, s)| if *s > 0.0 { v / s } else { 0.0 })
        .collect()
}

/// Aᵀ(b − A x).
pub(crate) fn gradient(a: &[Vec<f64>], b: &[f64], x: &[f64]) -> Vec<f64> {
    let mut w = vec![0.0; x.len()];
    for (row, bi) in a.iter().zip(b) {
        let r = bi - row.iter().zip(x).map(|(v, xj)| v * xj).sum::<f64>();
        for (wj, v) in w.iter_mut().zip(row) {
            *wj += v * r;
        }
    }
    w
}

/// Unconstrained least squares on the columns `cols` by Householder QR; `None` where a column
/// is numerically dependent on those before it (or there are fewer rows than columns).
pub(crate) fn least_squares(a: &[Vec<f64>], cols: &[usize], b: &[f64]) -> Option<Vec<f64>> {
    let (m, k) = (a.len(), cols.len());
    if k > m {
        return None;
    }
    // Column-major copy of the chosen columns, and of b.
    let mut q: Vec<Vec<f64>> = cols
        .iter()
        .map(|&j| a.iter().map(|r| r[j]).collect())
        .collect();
    let col_norms: Vec<f64> = q.iter().map(|c| norm(c)).collect();
    let mut y = b.to_vec();
    for c in 0..k {
        let sigma = norm(&q[c][c..]);
        if sigma <= RANK_TOL * col_norms[c].max(f64::MIN_POSITIVE) {
            return None;
        }
        // Householder vector v = x + sign(x₀)‖x‖e₀ on rows c.., applied to the columns after
        // it and to y; column c becomes (−sign·σ, 0, …).
        let alpha = if q[c][c] >= 0.0 { -sigma } else { sigma };
        let mut v = q[c][c..].to_vec();
        v[0] -= alpha;
        let vv: f64 = v.iter().map(|t| t * t).sum();
        let reflect = |col: &mut [f64]| {
            let f = 2.0 * v.iter().zip(&*col).map(|(p, s)| p * s).sum::<f64>() / vv;
            for (s, p) in col.iter_mut().zip(&v) {
                *s -= f * p;
            }
        };
        for later in q.iter_mut().skip(c + 1) {
            reflect(&mut later[c..]);
        }
        reflect(&mut y[c..]);
        q[c][c] = alpha;
    }
    // Back substitution on R (the upper triangle of the reflected columns).
    let mut z = vec![0.0; k];
    for i in (0..k).rev() {
        let s: f64 = ((i + 1)..k).map(|j| q[j][i] * z[j]).sum();
        z[i] = (y[i] - s) / q[i][i];
    }
    Some(z)
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|t| t * t).sum::<f64>().sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn residual(a: &[Vec<f64>], b: &[f64], x: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(r, bi)| (bi - r.iter().zip(x).map(|(v, xj)| v * xj).sum::<f64>()).powi(2))
            .sum::<f64>()
            .sqrt()
    }

    /// The heuristic the model used before: solve on every column, drop the most negative,
    /// solve again, until none is negative (it never lets a dropped column back in).
    fn drop_most_negative(a: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
        let n = a[0].len();
        let mut active: Vec<usize> = (0..n).collect();
        loop {
            let z = least_squares(a, &active, b).unwrap();
            match z
                .iter()
                .enumerate()
                .filter(|(_, v)| **v < 0.0)
                .min_by(|p, q| p.1.total_cmp(q.1))
            {
                Some((i, _)) => {
                    active.remove(i);
                }
                None => {
                    let mut x = vec![0.0; n];
                    for (&j, v) in active.iter().zip(z) {
                        x[j] = v;
                    }
                    return x;
                }
            }
        }
    }

    /// The true optimum by trying every passive set: the feasible unconstrained solution with
    /// the least residual (the optimum of a convex problem is one of them).
    fn exhaustive(a: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
        let n = a[0].len();
        let mut best = (residual(a, b, &vec![0.0; n]), vec![0.0; n]);
        for mask in 1u32..(1 << n) {
            let cols: Vec<usize> = (0..n).filter(|j| mask & (1 << j) != 0).collect();
            let Some(z) = least_squares(a, &cols, b) else {
                continue;
            };
            if z.iter().all(|v| *v >= 0.0) {
                let mut x = vec![0.0; n];
                for (&j, v) in cols.iter().zip(z) {
                    x[j] = v;
                }
                let r = residual(a, b, &x);
                if r < best.0 {
                    best = (r, x);
                }
            }
        }
        best.1
    }

    /// The KKT conditions of NNLS at `x`: feasible, the gradient zero on the positive
    /// coefficients and pointing nowhere downhill on the zero ones.
    fn assert_kkt(a: &[Vec<f64>], b: &[f64], x: &[f64]) {
        let w = gradient(a, b, x);
        let big = a.iter().flatten().fold(1.0_f64, |m, v| m.max(v.abs()));
        let tol = 1e-9 * big * (1.0 + b.iter().map(|v| v * v).sum::<f64>().sqrt());
        for (j, (xj, wj)) in x.iter().zip(&w).enumerate() {
            assert!(*xj >= 0.0, "x[{j}] = {xj}");
            if *xj > 0.0 {
                assert!(wj.abs() < tol, "w[{j}] = {wj} on a positive coefficient");
            } else {
                assert!(*wj < tol, "w[{j}] = {wj}: x[{j}] = 0 is not optimal");
            }
        }
    }

    /// Unconstrained, this problem's solution is (5, −4, −3): the heuristic drops the second
    /// column (the most negative), then the third, and stops at (7/9, 0, 0) with a squared
    /// residual of 37/9. The optimum keeps the second column, (0.2, 0.8, 0), with 1.8.
    #[test]
    fn lawson_hanson_finds_what_dropping_the_most_negative_misses() {
        let a = vec![
            vec![3.0, 3.0, 0.0],
            vec![1.0, 0.0, 2.0],
            vec![2.0, 2.0, 0.0],
            vec![2.0, 0.0, 3.0],
        ];
        let b = vec![3.0, -1.0, 2.0, 1.0];
        let unconstrained = least_squares(&a, &[0, 1, 2], &b).unwrap();
        for (got, want) in unconstrained.iter().zip([5.0, -4.0, -3.0]) {
            assert!((got - want).abs() < 1e-9, "{unconstrained:?}");
        }
        let x = nnls(&a, &b);
        assert_kkt(&a, &b, &x);
        for (got, want) in x.iter().zip([0.2, 0.8, 0.0]) {
            assert!((got - want).abs() < 1e-12, "{x:?}");
        }
        for (got, want) in x.iter().zip(exhaustive(&a, &b)) {
            assert!((got - want).abs() < 1e-12, "{x:?}");
        }
        let heuristic = drop_most_negative(&a, &b);
        for (got, want) in heuristic.iter().zip([7.0 / 9.0, 0.0, 0.0]) {
            assert!((got - want).abs() < 1e-12, "{heuristic:?}");
        }
        assert!((residual(&a, &b, &x).powi(2) - 1.8).abs() < 1e-9);
        assert!((residual(&a, &b, &heuristic).powi(2) - 37.0 / 9.0).abs() < 1e-9);
    }

    /// On seeded random problems (more columns than the optimum uses, some collinear, some
    /// of zeros) the solution meets the KKT conditions and matches the exhaustive optimum.
    #[test]
    fn random_problems_meet_the_kkt_conditions() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            // xorshift64*
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
        };
        for trial in 0..200 {
            let (m, n) = (4 + trial % 9, 2 + trial % 6);
            let mut a: Vec<Vec<f64>> = (0..m)
                .map(|_| (0..n).map(|_| next() * 10.0 - 3.0).collect())
                .collect();
            if trial % 3 == 0 {
                // A column twice another.
                for r in &mut a {
                    r[n - 1] = 2.0 * r[0];
                }
            }
            if trial % 5 == 0 {
                for r in &mut a {
                    r[1] = 0.0;
                }
            }
            let b: Vec<f64> = (0..m).map(|_| next() * 20.0 - 8.0).collect();
            let x = nnls(&a, &b);
            assert_kkt(&a, &b, &x);
            let truth = exhaustive(&a, &b);
            let (r, best) = (residual(&a, &b, &x), residual(&a, &b, &truth));
            assert!(
                r <= best + 1e-9 * (1.0 + best),
                "trial {trial}: {r} > {best}"
            );
        }
    }
}
