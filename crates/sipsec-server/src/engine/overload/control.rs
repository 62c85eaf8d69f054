//! The rate-based controller of overload control (RFC 7415 §3, the server's side): from each
//! interval's load and counts, an estimate of the worker's capacity in new requests per
//! second, the cap local admission holds arrivals to, and the loss or rate RFC 7339
//! neighbours are told. No clock and no I/O: the engine hands in an [`Interval`] every
//! `[overload] interval_ms` and asks [`Controller::admit`] for each new sheddable request.
//!
//! **The estimator.** A worker's capacity is the new requests per second it can take at its
//! target load. Each interval in which the worker was loaded enough for the figure to mean
//! something (load ≥ [`SAMPLE_FROM`]) gives a sample, `admitted rate × target / load` — what
//! it took, scaled to the target by the load it took it at — and the estimate moves
//! [`GAIN`] of the way to it. Whether the cap binds or not the sample is the same figure:
//! where the cap binds the admitted rate is the estimate itself, so the update is
//! `capacity × (1 + GAIN × (target/load − 1))`, a multiplicative step that rests where the
//! load is at the target. A standing queue (CoDel's rule: the *least* a datagram waited over a
//! whole interval, so one late batch after a hiccup does not count) beyond `max_queue_delay`
//! reads as load over 1 in proportion to its age ([`DRAIN_MS`] per unit), which lowers the
//! sample until the queue drains.
//!
//! Time constants: with [`GAIN`] = ½ the estimate's error halves every interval (100 ms by
//! default), so a change of capacity is followed within three intervals to an eighth, and the
//! noise of one interval moves it by half its size at most. The simulated step response in
//! this file's tests states what that gives end to end.
//!
//! **Local admission** takes effect once the load reaches the target, as a token bucket at
//! the estimated capacity (depth [`BURST_S`] of it): new requests beyond it are refused
//! before any work. It releases after [`RELEASE`] intervals below the target in which
//! nothing was refused.
//!
//! **Feedback** takes effect once the load reaches `feedback_target` (below `target`, so a
//! neighbour that honours it is never refused locally as well). Its budget for the neighbours
//! that announced `oc` is the capacity scaled to `feedback_target`, less what other sources
//! were admitted. A `rate` client is given an equal share of it. A `loss` client is told
//! `1 − budget / offered`, where offered — what those neighbours would send without
//! feedback — is what arrived from them, divided by `1 − loss` in force, times the queue's
//! growth over the interval (a queue that grows by `g` seconds per second is fed `1 + g`
//! times what is read from it). That loss is computed, not stepped, so it does not oscillate
//! around capacity: it is where an honest neighbour's offered load meets the budget, reached
//! in about as many intervals as the offered estimate takes to settle.

use sip_core::timer::Millis;

/// Loads below this give no capacity sample: fixed costs (wake-ups, timers) dominate there
/// and scaling a light load's figure up to the target overstates what the worker can take.
pub(crate) const SAMPLE_FROM: f64 = 0.4;
/// Intervals with fewer new requests give no sample (too few to measure a rate).
const MIN_SAMPLE: u64 = 4;
/// The share of the way the estimate moves to each sample.
pub(crate) const GAIN: f64 = 0.5;
/// A standing queue beyond the limit is drained over about this long: admission keeps
/// `1 − excess / DRAIN_MS` of the capacity (at least [`MIN_DRAIN`]) while it stands.
pub(crate) const DRAIN_MS: f64 = 500.0;
/// The least share of the capacity admitted while a queue drains.
const MIN_DRAIN: f64 = 0.1;
/// The share of the way the estimate of what `oc` neighbours offer moves to each sample: it
/// is a ratio of counts, not an integrator, so noise in it passes through once rather than
/// accumulating, and a fast gain follows a step within two intervals.
const OFFERED_GAIN: f64 = 1.0;
/// The token bucket holds this many seconds of the capacity: a batch of datagrams read at once
/// is not refused for arriving together.
pub(crate) const BURST_S: f64 = 0.02;
/// Calm intervals (below the threshold, nothing refused) before a control is released.
pub(crate) const RELEASE: u32 = 3;
/// The share of new requests never refused, however saturated: a worker flooded even with
/// refusals still completes some calls, and learns when the flood ends.
pub(crate) const MIN_SHARE: f64 = 0.01;
/// The least capacity ever estimated, new requests per second.
const MIN_CAPACITY: f64 = 1.0;

/// One interval's measurements: the load from the driver, the counts from the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Interval {
    /// The interval's length, seconds.
    pub(crate) elapsed_s: f64,
    /// The worker's load: its busy fraction against the CPU it may use.
    pub(crate) load: f64,
    /// The least time a datagram waited in the kernel over the interval, milliseconds (0 when
    /// not measured): a queue that stood all interval (CoDel's rule).
    pub(crate) standing_delay_ms: u64,
    /// How long the last datagram read in the interval waited, milliseconds (0 when not
    /// measured): the queue as the interval ended.
    pub(crate) queue_delay_ms: u64,
    /// New sheddable requests read.
    pub(crate) arrived: u64,
    /// Of those, taken into work (not refused here).
    pub(crate) admitted: u64,
    /// Of those read, from neighbours that announced `oc`.
    pub(crate) oc_arrived: u64,
    /// Of those admitted, from neighbours that announced `oc`.
    pub(crate) oc_admitted: u64,
    /// The neighbours that announced `oc` (for the rate algorithm's shares).
    pub(crate) oc_clients: usize,
}

/// The thresholds the controller works to (`[overload]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Targets {
    /// The load local admission holds the worker to.
    pub(crate) target: f64,
    /// The load feedback steers neighbours to.
    pub(crate) feedback_target: f64,
    /// Standing queue delay beyond which the worker counts as overloaded, milliseconds.
    pub(crate) max_delay_ms: u64,
}

/// A worker's controller. Call [`Controller::update`] once an interval, then
/// [`Controller::admit`] for each new sheddable request until the next; read what to tell
/// neighbours from [`Controller::loss`] and [`Controller::rate`] while
/// [`Controller::feedback_on`].
#[derive(Debug)]
pub(crate) struct Controller {
    /// New requests per second the worker can take at its target load (0: not measured).
    capacity: f64,
    local: bool,
    feedback: bool,
    calm_local: u32,
    calm_feedback: u32,
    /// What `oc` neighbours would send without feedback, requests per second (smoothed).
    oc_offered: f64,
    /// The loss in force for `oc` neighbours (0–1).
    loss: f64,
    /// Requests per second each `oc` neighbour may send (rate algorithm).
    rate: f64,
    /// The queue delay at the end of the interval before, for the queue's growth.
    prev_delay_ms: u64,
    /// The share of the capacity admitted while a standing queue drains (1: none).
    drain: f64,
    tokens: f64,
    refilled_at: Millis,
}

impl Default for Controller {
    fn default() -> Controller {
        Controller {
            capacity: 0.0,
            local: false,
            feedback: false,
            calm_local: 0,
            calm_feedback: 0,
            oc_offered: 0.0,
            loss: 0.0,
            rate: 0.0,
            prev_delay_ms: 0,
            drain: 1.0,
            tokens: 0.0,
            refilled_at: 0,
        }
    }
}

impl Controller {
    /// Takes one interval's measurements.
    pub(crate) fn update(&mut self, iv: &Interval, t: &Targets) {
        let elapsed = iv.elapsed_s.max(1e-3);
        // A queue that stood all interval means the worker was saturated, whatever the clock
        // says; beyond the limit it must also drain.
        let over_ms = iv.standing_delay_ms.saturating_sub(t.max_delay_ms);
        let load = if over_ms > 0 {
            iv.load.max(1.0)
        } else {
            iv.load
        };
        self.drain = (1.0 - over_ms as f64 / DRAIN_MS).clamp(MIN_DRAIN, 1.0);
        let engaged = self.local || self.feedback;
        if iv.admitted >= MIN_SAMPLE && (load >= SAMPLE_FROM || engaged) {
            let mut sample = iv.admitted as f64 / elapsed * t.target / load.max(0.01);
            if self.capacity > 0.0 {
                // A light load's figure scaled up is an overstatement: let it raise the
                // estimate at most twofold an interval.
                sample = sample.min(2.0 * self.capacity);
                self.capacity += GAIN * (sample - self.capacity);
            } else {
                self.capacity = sample;
            }
        } else if load >= t.target && self.capacity > 0.0 {
            // Saturated by work that is not new requests (responses, dialogs already in
            // progress): leave new ones less room.
            self.capacity *= 1.0 - GAIN;
        }
        if self.capacity > 0.0 {
            self.capacity = self.capacity.max(MIN_CAPACITY);
        }

        let refused = iv.arrived.saturating_sub(iv.admitted);
        if load >= t.target && self.capacity > 0.0 {
            if !self.local {
                self.tokens = self.depth();
            }
            self.local = true;
            self.calm_local = 0;
        } else if self.local {
            self.calm_local = if refused == 0 { self.calm_local + 1 } else { 0 };
            if self.calm_local >= RELEASE {
                self.local = false;
            }
        }

        if load >= t.feedback_target && self.capacity > 0.0 {
            self.feedback = true;
        }
        if self.feedback {
            self.feedback_step(iv, t, load);
        }
        self.prev_delay_ms = iv.queue_delay_ms;
    }

    fn feedback_step(&mut self, iv: &Interval, t: &Targets, load: f64) {
        let elapsed = iv.elapsed_s.max(1e-3);
        // A queue whose delay grew by g seconds over the interval was fed 1 + g/elapsed
        // times what was read from it.
        let growth_s = (iv.queue_delay_ms as f64 - self.prev_delay_ms as f64) / 1000.0;
        let fed = (1.0 + growth_s / elapsed).clamp(0.1, 10.0);
        let sent = iv.oc_arrived as f64 / elapsed * fed;
        let sample = sent / (1.0 - self.loss.min(1.0 - MIN_SHARE));
        self.oc_offered = if self.oc_offered > 0.0 {
            self.oc_offered + OFFERED_GAIN * (sample - self.oc_offered)
        } else {
            sample
        };
        let others = iv.admitted.saturating_sub(iv.oc_admitted) as f64 / elapsed;
        let budget = (self.capacity * self.drain * t.feedback_target / t.target - others)
            .max(self.capacity * MIN_SHARE)
            .max(MIN_CAPACITY);
        self.rate = budget / iv.oc_clients.max(1) as f64;
        self.loss = if self.oc_offered > 0.0 {
            (1.0 - budget / self.oc_offered).clamp(0.0, 1.0 - MIN_SHARE)
        } else {
            0.0
        };
        if self.loss == 0.0 && load < t.feedback_target {
            self.calm_feedback += 1;
            if self.calm_feedback >= RELEASE {
                self.feedback = false;
                self.oc_offered = 0.0;
            }
        } else {
            self.calm_feedback = 0;
        }
    }

    /// The rate local admission holds new requests to: the capacity, less what a standing
    /// queue needs to drain.
    fn cap(&self) -> f64 {
        self.capacity * self.drain
    }

    fn depth(&self) -> f64 {
        (self.capacity * BURST_S).max(1.0)
    }

    /// Whether local admission takes a new sheddable request arriving at `now`.
    pub(crate) fn admit(&mut self, now: Millis) -> bool {
        if !self.local {
            return true;
        }
        let dt = now.saturating_sub(self.refilled_at) as f64 / 1000.0;
        self.refilled_at = now;
        self.tokens = (self.tokens + dt * self.cap()).min(self.depth());
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether local admission is refusing what exceeds the capacity.
    pub(crate) fn local_on(&self) -> bool {
        self.local
    }

    /// Whether neighbours are being told to send less.
    pub(crate) fn feedback_on(&self) -> bool {
        self.feedback
    }

    /// The share of their new requests `oc` neighbours should not send (0–1).
    pub(crate) fn loss(&self) -> f64 {
        self.loss
    }

    /// Requests per second each `oc` neighbour may send (rate algorithm).
    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    /// The estimated capacity, new requests per second at the target load (0: not measured).
    pub(crate) fn capacity(&self) -> f64 {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    //! The controller against a simulated worker: a FIFO of requests served by one CPU that
    //! takes `1/capacity` seconds per admitted request and `r` of that per refusal, fed by
    //! callers that honour the loss (or not), in 1 ms steps.
    use super::*;
    use std::collections::VecDeque;

    const TARGETS: Targets = Targets {
        target: 0.95,
        feedback_target: 0.9,
        max_delay_ms: 20,
    };
    const INTERVAL_MS: u64 = 100;

    struct Sim {
        /// Admitted requests per second the worker completes at full load.
        capacity: f64,
        /// A refusal's cost as a share of an admitted request's.
        r: f64,
        honour: bool,
        ctl: Controller,
        queue: VecDeque<f64>,
        /// Arrivals owed (fractional), and the callers' refusals owed (error diffusion).
        due: f64,
        owed: f64,
        /// CPU seconds carried into the next millisecond.
        debt: f64,
        now_ms: u64,
    }

    /// One interval's outcome.
    #[derive(Debug, Clone, Copy)]
    struct Step {
        admitted_rate: f64,
        loss: f64,
        standing_ms: u64,
        load: f64,
    }

    impl Sim {
        fn new(capacity: f64, r: f64, honour: bool) -> Sim {
            Sim {
                capacity,
                r,
                honour,
                ctl: Controller::default(),
                queue: VecDeque::new(),
                due: 0.0,
                owed: 0.0,
                debt: 0.0,
                now_ms: 0,
            }
        }

        /// Runs one interval with callers offering `offered` requests per second.
        fn interval(&mut self, offered: f64) -> Step {
            let mut iv = Interval {
                elapsed_s: INTERVAL_MS as f64 / 1000.0,
                oc_clients: 1,
                ..Interval::default()
            };
            let mut busy = 0.0;
            let mut standing = u64::MAX;
            let mut latest = 0;
            for _ in 0..INTERVAL_MS {
                let now = self.now_ms as f64 / 1000.0;
                self.due += offered / 1000.0;
                while self.due >= 1.0 {
                    self.due -= 1.0;
                    if self.honour && self.ctl.feedback_on() {
                        self.owed += self.ctl.loss();
                        if self.owed >= 1.0 {
                            self.owed -= 1.0;
                            continue;
                        }
                    }
                    self.queue.push_back(now);
                }
                // This millisecond's CPU: first what the last one overran, then the queue.
                let paid = self.debt.min(1e-3);
                self.debt -= paid;
                let mut cpu = 1e-3 - paid;
                let mut first = true;
                while cpu > 0.0 {
                    let Some(arrived) = self.queue.pop_front() else {
                        break;
                    };
                    if first {
                        latest = ((now - arrived) * 1000.0) as u64;
                        standing = standing.min(latest);
                        first = false;
                    }
                    iv.arrived += 1;
                    if self.honour {
                        iv.oc_arrived += 1;
                    }
                    let cost = if self.ctl.admit(self.now_ms) {
                        iv.admitted += 1;
                        if self.honour {
                            iv.oc_admitted += 1;
                        }
                        1.0 / self.capacity
                    } else {
                        self.r / self.capacity
                    };
                    cpu -= cost;
                }
                busy += 1e-3 - cpu.max(0.0);
                self.debt += (-cpu).max(0.0);
                self.now_ms += 1;
            }
            iv.load = (busy / iv.elapsed_s).min(1.0);
            iv.standing_delay_ms = if standing == u64::MAX { 0 } else { standing };
            iv.queue_delay_ms = latest;
            self.ctl.update(&iv, &TARGETS);
            Step {
                admitted_rate: iv.admitted as f64 / iv.elapsed_s,
                loss: self.ctl.loss(),
                standing_ms: iv.standing_delay_ms,
                load: iv.load,
            }
        }

        fn run(&mut self, offered: f64, intervals: usize) -> Vec<Step> {
            (0..intervals).map(|_| self.interval(offered)).collect()
        }
    }

    const CAPACITY: f64 = 2000.0;

    /// Callers that honour the loss, offered 1× the capacity, then 4×, then 1× again. The
    /// step response: at 4× the worker takes at least 0.85 of its capacity from the sixth
    /// interval on and settles at the feedback target (0.9) without oscillating (the loss
    /// within 0.75–0.8 from the tenth); the queue the first intervals build never stands
    /// beyond 200 ms; back at 1×, the loss is where it belongs from the second interval.
    #[test]
    fn honest_callers_settle_at_capacity_after_a_step_to_four_times_and_back() {
        let mut sim = Sim::new(CAPACITY, 0.05, true);
        let before = sim.run(CAPACITY, 30);
        let up = sim.run(4.0 * CAPACITY, 30);
        let down = sim.run(CAPACITY, 30);
        let settles = |name: &str, steps: &[Step], from: usize| {
            for (i, s) in steps.iter().enumerate().skip(from) {
                assert!(
                    (0.85 * CAPACITY..=0.95 * CAPACITY).contains(&s.admitted_rate),
                    "{name}, interval {i}: {s:?}"
                );
                // Below the target: honest neighbours are never refused locally as well.
                assert!(s.load < TARGETS.target, "{name}, interval {i}: {s:?}");
            }
            let worst = steps.iter().map(|s| s.standing_ms).max().unwrap();
            assert!(worst <= 200, "{name}: a queue of {worst} ms: {steps:?}");
        };
        settles("1x", &before, 2);
        settles("4x", &up, 6);
        settles("back to 1x", &down, 1);
        let (lo, hi) = up[10..].iter().fold((1.0f64, 0.0f64), |(lo, hi), s| {
            (lo.min(s.loss), hi.max(s.loss))
        });
        assert!(
            lo >= 0.75 && hi <= 0.8,
            "at 4x the loss holds at 1 − 0.9/4: {lo}..{hi}"
        );
        assert!(down[1..].iter().all(|s| s.loss <= 0.12), "{down:?}");
    }

    /// Callers that ignore the feedback, 4× the capacity, refusals costing a twentieth of a
    /// call: from the twelfth interval local admission keeps at least 0.9 of the bound
    /// 1/(1 + 3r) that the cost of refusals leaves. (Slower than with honest callers: the
    /// refusals' share of the load does not move with the cap, so each step of the estimate
    /// closes only the admitted share of the error.)
    #[test]
    fn plain_callers_keep_most_of_what_refusals_leave() {
        let r = 0.05;
        let mut sim = Sim::new(CAPACITY, r, false);
        sim.run(CAPACITY / 2.0, 10);
        let up = sim.run(4.0 * CAPACITY, 40);
        let bound = 1.0 / (1.0 + 3.0 * r);
        for (i, s) in up.iter().enumerate().skip(12) {
            assert!(
                s.admitted_rate >= 0.9 * bound * CAPACITY,
                "interval {i}: {s:?} (bound {bound})"
            );
        }
        let worst = up.iter().map(|s| s.standing_ms).max().unwrap();
        assert!(worst <= 200, "a queue of {worst} ms: {up:?}");
    }

    /// Below the target nothing is refused and no neighbour is told anything.
    #[test]
    fn at_eighty_percent_nothing_is_refused() {
        let mut sim = Sim::new(CAPACITY, 0.1, true);
        let steps = sim.run(0.8 * CAPACITY, 50);
        assert!(steps.iter().all(|s| s.loss == 0.0), "{steps:?}");
        assert!(!sim.ctl.local_on() && !sim.ctl.feedback_on());
        let admitted: f64 = steps.iter().map(|s| s.admitted_rate).sum::<f64>() / 50.0;
        assert!(
            (admitted - 0.8 * CAPACITY).abs() < 0.01 * CAPACITY,
            "{admitted}"
        );
    }
}
