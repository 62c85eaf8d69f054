//! The open-loop schedule: how many operations should have started by a given time. Starts
//! depend on the clock alone, never on responses (seed 004: a closed loop hides overload),
//! so a server that falls behind sees the offered load keep coming.

/// A rate that is constant or steps up (`--ramp`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatePlan {
    /// Operations per second at the start.
    pub rate: f64,
    /// Added every `step_s` seconds (0 for a constant rate).
    pub(crate) ramp_step: f64,
    /// Seconds between the ramp's steps.
    pub step_s: f64,
    /// The ramp stops rising here.
    pub(crate) max_rate: f64,
}

impl RatePlan {
    /// `rate` operations per second for the whole run.
    pub fn constant(rate: f64) -> RatePlan {
        RatePlan {
            rate,
            ramp_step: 0.0,
            step_s: 1.0,
            max_rate: rate,
        }
    }

    /// The rate in force `t` seconds into the run.
    pub(crate) fn rate_at(&self, t: f64) -> f64 {
        if self.ramp_step == 0.0 {
            return self.rate;
        }
        let steps = (t / self.step_s).floor();
        (self.rate + steps * self.ramp_step).min(self.max_rate)
    }

    /// Operations due in `[0, t]` seconds: the integral of the rate.
    pub(crate) fn due_by(&self, t: f64) -> f64 {
        if self.ramp_step == 0.0 {
            return self.rate * t;
        }
        let mut sum = 0.0;
        let mut start = 0.0;
        while start < t {
            let end = (start + self.step_s).min(t);
            sum += self.rate_at(start) * (end - start);
            start = end;
        }
        sum
    }
}

/// When a run stops starting operations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub(crate) duration_s: Option<f64>,
    /// Stop after this many operations have started.
    pub calls: Option<u64>,
}

/// Counts starts against the plan.
#[derive(Debug, Clone)]
pub struct Pacer {
    plan: RatePlan,
    limit: Limit,
    started: u64,
}

impl Pacer {
    /// A pacer that has started nothing yet.
    pub fn new(plan: RatePlan, limit: Limit) -> Pacer {
        Pacer {
            plan,
            limit,
            started: 0,
        }
    }

    /// The rate it paces to.
    pub fn plan(&self) -> &RatePlan {
        &self.plan
    }

    /// How many operations to start now, `elapsed_s` into the run; counts them as started.
    pub(crate) fn take_due(&mut self, elapsed_s: f64) -> u64 {
        let t = match self.limit.duration_s {
            Some(d) => elapsed_s.min(d),
            None => elapsed_s,
        };
        // The first operation goes at t = 0, then one every 1/rate seconds.
        let mut due = self.plan.due_by(t).floor() as u64 + 1;
        if let Some(max) = self.limit.calls {
            due = due.min(max);
        }
        if let Some(d) = self.limit.duration_s {
            if elapsed_s >= d {
                due = due.min(self.plan.due_by(d).round() as u64);
            }
        }
        let n = due.saturating_sub(self.started);
        self.started += n;
        n
    }

    /// True once every operation the limit allows has started.
    pub fn finished(&self, elapsed_s: f64) -> bool {
        self.limit.calls.is_some_and(|c| self.started >= c)
            || self.limit.duration_s.is_some_and(|d| elapsed_s >= d)
    }

    /// Operations started so far.
    pub fn started(&self) -> u64 {
        self.started
    }

    /// Seconds into the run when the next operation is due (None once finished).
    pub(crate) fn next_start_s(&self, elapsed_s: f64) -> Option<f64> {
        if self.finished(elapsed_s) {
            return None;
        }
        let rate = self.plan.rate_at(elapsed_s);
        if rate <= 0.0 {
            return Some(elapsed_s + 1.0);
        }
        let behind = self.started as f64 - self.plan.due_by(elapsed_s);
        Some(elapsed_s + (behind / rate).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_rate_starts_on_the_clock() {
        let mut p = Pacer::new(
            RatePlan::constant(1000.0),
            Limit {
                duration_s: Some(2.0),
                calls: None,
            },
        );
        assert_eq!(p.take_due(0.0), 1);
        assert_eq!(p.take_due(0.0105), 10); // 10.5 due plus the first at t=0
        assert_eq!(p.take_due(1.0), 990);
        assert!(!p.finished(1.5));
        // Falling behind does not lose starts: they all go at once (open loop).
        assert_eq!(p.take_due(5.0), 999);
        assert!(p.finished(5.0));
        assert_eq!(p.started(), 2000);
        assert_eq!(p.take_due(6.0), 0);
    }

    #[test]
    fn call_limit_caps_the_starts() {
        let mut p = Pacer::new(
            RatePlan::constant(100.0),
            Limit {
                duration_s: None,
                calls: Some(50),
            },
        );
        assert_eq!(p.take_due(10.0), 50);
        assert!(p.finished(10.0));
    }

    #[test]
    fn ramp_steps_the_rate_up_to_the_maximum() {
        let plan = RatePlan {
            rate: 100.0,
            ramp_step: 100.0,
            step_s: 2.0,
            max_rate: 250.0,
        };
        assert_eq!(plan.rate_at(0.0), 100.0);
        assert_eq!(plan.rate_at(2.0), 200.0);
        assert_eq!(plan.rate_at(9.0), 250.0);
        assert_eq!(plan.due_by(4.0), 600.0);
        assert_eq!(plan.due_by(6.0), 1100.0);
    }
}
