//! The rate-based controller of overload control (RFC 7415 §3, the server's side): from each
//! interval's queue delay, load and counts, an estimate of the worker's capacity in new
//! requests per second, the cap local admission holds arrivals to, and the loss or rate RFC
//! 7339 neighbours are told. No clock and no I/O: the engine hands in an [`Interval`] every
//! `[overload] interval_ms` and asks [`Controller::admit`] for each new sheddable request.
//!
//! **Saturation** is a queue that stood a whole interval: the least what was read from the
//! datagrams' or the connections' queue had waited in the kernel over it was at least
//! [`SATURATED_MS`] (CoDel's rule — one late batch after a hiccup does not count, nor the
//! slices a CPU quota holds the worker off for; `serve::busy`). Neither the busy
//! fraction nor CPU time can say it: a worker that batches more as load grows does more per
//! CPU second, and measured here it read fully busy at 85% of the rate it could carry. Where
//! no queue delay is measured (below half load, where the worker does not measure it)
//! the load reaching `target` stands in for it; a `target` below half load is a cap on the
//! load itself, saturation whatever the queue says.
//!
//! **The estimator.** While the worker is saturated, what it took is what it can take: the
//! admitted rate is a sample of its capacity (refusals' cost included), and the estimate
//! moves [`GAIN`] of the way to it — unless the queue stands beyond the limit, where the
//! drain (below) holds admission down and the figure would feed the cut back into itself.
//! Where the load said saturated (no queue measured, or a `target` that caps the load),
//! the sample is the admitted rate scaled by `target / load`: the rate at which the load
//! would sit at the target. While it is held back (something refused, or neighbours
//! told to send less) and no queue stands, it could take more: the estimate grows by
//! [`PROBE`] an interval until a queue says otherwise. The estimate thus rests where a small
//! queue comes and goes, which is where the worker completes the most.
//!
//! **The cost model** takes over once it has read enough: a fit of the worker's CPU against
//! what it admitted and refused over recent saturated intervals ([`Cost`]) gives what an
//! admitted request costs (`a`) and a refusal (`b`, so r = `b / a`, published as
//! `sipsec_worker_refusal_cost`). The capacity, and what local admission holds new requests
//! to, is then `trim / a`. The trim is the queue's say: down while a queue beyond the
//! limit grows or holds, up while requests are held back and none stands or the worker
//! waited, steady between — so a short queue stands and the worker reads full batches, where
//! a call costs least. Up is first half the way an interval back to the CPU share the worker
//! last sustained with a short queue (since control engaged), then [`TRIM_UP`] an interval:
//! after a cut, the load cannot say how far to come back (a worker's reads full well below
//! saturation, a call costing more in smaller batches); traced at 4×, stepping 1% an interval
//! after a cut to 0.8 of where a short queue had stood climbed for nearly four seconds. The
//! probe-and-sample estimator above remains for before the model speaks; on its own it
//! never sampled at four times capacity (the queue leapt past the limit within an interval)
//! and probed to five times the worker's capacity while the drain alone held it.
//!
//! Time constants: with [`GAIN`] = ½ a saturated estimate's error halves every interval (100 ms
//! by default); probing at 5% an interval regains a tenth of capacity in two. The simulated
//! step responses in this file's tests state what that gives end to end.
//!
//! **Local admission** takes effect when the worker saturates, as a token bucket at the
//! estimate (depth [`BURST_S`] of it): new requests beyond it are refused before any work.
//! A queue that stands beyond `max_queue_delay` (the connections' beyond
//! [`STREAMS_MAX_DELAY_MS`]) drains: the bucket then admits only
//! `1 − excess / DRAIN_MS` of the estimate. Requests from neighbours that announced `oc` are
//! not judged by it while those neighbours stay within the budget they were given (over the
//! interval so far, with [`OC_BURST_S`] and [`OC_SLACK`] to spare,
//! [`Controller::oc_within_budget`]): the bucket sees requests at the rate the worker reads
//! them, which outruns the rate they arrived at whenever it catches up on a queue. Control is
//! released after [`RELEASE`] intervals in which nothing was held back.
//!
//! **Feedback** takes effect at the same time. Its budget for the neighbours that announced
//! `oc` is the estimate scaled by `feedback_target / target` (a margin, so a neighbour that
//! honours it keeps this worker short of a standing queue and is never refused locally as
//! well), less what other sources were admitted. A `rate` client is given an equal share of
//! it. A `loss` client is told `1 − budget / offered`, where offered — what those neighbours
//! would send without feedback — is what arrived from them, divided by `1 − loss` in force,
//! times the queue's growth over the interval (a queue whose delay grows by `g` seconds per
//! second is fed `1 + g` times what is read from it). That loss is computed, not stepped, so
//! it does not oscillate around capacity: it is where an honest neighbour's offered load
//! meets the budget, reached in the interval after a step.

use sip_core::timer::Millis;

/// A queue whose least delay over an interval was at least this many milliseconds stood
/// all interval: the worker is saturated.
pub(crate) const SATURATED_MS: u64 = 5;
/// Until a worker first saturates, what it could take is judged from its CPU per new
/// request (`admitted / cpu`), the best figure of recent intervals at least this loaded.
const BASELINE_FROM: f64 = 0.3;
/// The best figure fades by this much each interval that measures a new one (a tenth in
/// about a second of load at the default 100 ms interval), so one lucky interval does not
/// stand for ever. Only those: a
/// quiet spell measures nothing, and a figure that faded through it would cap the first calls
/// after it at a fraction of what the worker takes (it did: after twenty seconds of TLS
/// handshakes and no calls, 2,000 calls/s at a quarter of a core were refused two in three).
const BASELINE_FADE: f64 = 0.99;
/// Before control engages, new requests beyond this multiple of that figure are refused: a
/// sudden flood is held to it from its first interval, which otherwise admits what one
/// interval brings and whose calls' later messages then swamp the worker for seconds.
pub(crate) const PREARM: f64 = 2.0;
/// The load from which the driver measures queue delay (`serve::worker`'s
/// `QUEUE_MEASURED_FROM_LOAD`, the same).
pub(crate) const QUEUE_MEASURED_FROM: f64 = 0.5;
/// The share of the way the estimate moves to each saturated sample.
pub(crate) const GAIN: f64 = 0.5;
/// How much the estimate grows an interval while the worker is held back without a queue.
pub(crate) const PROBE: f64 = 0.05;
/// A standing queue beyond the limit is drained over about this long: admission keeps
/// `1 − excess / DRAIN_MS` of the capacity (at least [`MIN_DRAIN`]) while it stands.
pub(crate) const DRAIN_MS: f64 = 100.0;
/// The limit a standing queue of the connections' is judged against, milliseconds (or
/// `max_queue_delay_ms` if shorter). A stream's figure is the head of what a pass read, a
/// lower bound on what its requests waited: the rest waits in the senders' windows, where no
/// read sees it (measured over TLS at 4×: it read 11–32 ms while the callers' connections stood
/// full). The datagrams' limit was raised to 100 ms on UDP measurements; this one was not.
pub(crate) const STREAMS_MAX_DELAY_MS: u64 = 20;
/// The least share of the capacity admitted while a queue drains.
const MIN_DRAIN: f64 = 0.1;
/// The share of the way the estimate of what `oc` neighbours offer moves to each sample: it
/// is a ratio of counts, not an integrator, so noise in it passes through once rather than
/// accumulating, and following a step at once is what keeps the loss from lagging it.
const OFFERED_GAIN: f64 = 0.7;
/// An interval whose queue delay grew or fell by more than this share of its length, or whose
/// loss in force let through more than this share more or less than the one before while a
/// queue of more than this share of the interval carried requests over from it, does not say
/// what its neighbours offer, only which way the estimate of it is wrong.
const UNSTEADY: f64 = 0.25;
/// The token bucket holds this many seconds of the capacity: a batch of datagrams read at once
/// is not refused for arriving together.
pub(crate) const BURST_S: f64 = 0.02;
/// What neighbours that honour feedback may send within an interval without local admission
/// judging them: their budget over the time the interval has run, plus this many seconds of
/// it (a batch read after a hiccup or a CPU quota's slice arrives at once) ...
pub(crate) const OC_BURST_S: f64 = 0.05;
/// ... times this slack (the worker reads a standing queue faster than it arrived while it
/// catches up). Beyond it their requests are judged like anyone's: a neighbour that only
/// pretends to honour feedback gains at most this over its budget before it is.
pub(crate) const OC_SLACK: f64 = 1.25;
/// Calm intervals (below the threshold, nothing refused) before a control is released.
pub(crate) const RELEASE: u32 = 3;
/// The share of new requests never refused, however saturated: a worker flooded even with
/// refusals still completes some calls, and learns when the flood ends.
pub(crate) const MIN_SHARE: f64 = 0.01;
/// Without that figure, the share of what the saturating interval took that the estimate
/// starts from (probing regains the rest).
const FIRST_SHARE: f64 = 0.5;
/// Intervals with fewer new requests say nothing of their cost.
const MIN_BASELINE: u64 = 20;
/// The least capacity ever estimated, new requests per second.
const MIN_CAPACITY: f64 = 1.0;
/// The cost model's memory: each interval's weight in it fades by this much an interval (a
/// time constant of ten intervals, a second by default): long enough that the lag between
/// admitting a call and paying for its later messages averages out, short enough to follow
/// a change of what calls cost.
const COST_FORGET: f64 = 0.9;
/// The cost model speaks once its intervals weigh this much (three recent loaded ones).
const COST_READY: f64 = 2.5;
/// What a refusal is taken to cost, as a share of an admitted request, where the intervals
/// cannot tell (refusals that never varied against admissions, or none): the lab's figure
/// near the peak (0.21–0.28, `lab run overload`, row "refused"). The data outweigh it as soon
/// as refusals vary.
const PRIOR_R: f64 = 0.25;
/// The prior's weight against the data's, as a share of their spread.
const PRIOR_WEIGHT: f64 = 0.05;
/// The queue's correction of the cost model (the trim), per interval: down by this share
/// for each limit a queue stood all interval while it stood beyond its limit and did not
/// shrink (at most twice), up by [`TRIM_UP`] — after regaining what it last sustained — while
/// new requests were held back and no queue stood or the worker waited for work; between — a
/// short queue stands, the worker never waits — it holds. A short standing queue is where the worker
/// does most: it reads full batches (measured under a quarter-core quota, 4× capacity: with
/// the queue kept under 5 ms a call cost 116–121 µs of CPU, with one of 20–30 ms 102 µs).
const TRIM_DOWN: f64 = 0.02;
const TRIM_UP: f64 = 0.01;
/// A load below this says the worker waited for work during the interval: while requests
/// are held back, it could take more, queue or not.
const FULL: f64 = 0.99;
/// The bounds of the trim: the model is off by at most this much.
const TRIM_RANGE: (f64, f64) = (0.5, 1.5);

/// One interval's measurements: the load from the driver, the counts from the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Interval {
    /// The interval's length, seconds.
    pub(crate) elapsed_s: f64,
    /// The worker's load: its busy fraction, or its CPU against the CPU it may use if more.
    pub(crate) load: f64,
    /// Its CPU time over the interval as a share of the CPU it may use.
    pub(crate) cpu: f64,
    /// The least time what was read from the longer queue (datagrams' or connections') had
    /// waited in the kernel over the interval, milliseconds (None when not measured): a queue
    /// that stood all interval (CoDel's rule).
    pub(crate) standing_delay_ms: Option<u64>,
    /// The connections' queue's alone, milliseconds (None when not measured): judged against
    /// [`STREAMS_MAX_DELAY_MS`], for a stream's figure is a lower bound on what its requests
    /// waited.
    pub(crate) streams_standing_delay_ms: Option<u64>,
    /// How long what the interval's last pass read had waited, milliseconds (0 when not
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
    /// The load that counts as saturation where no queue delay is measured.
    pub(crate) target: f64,
    /// With `target`, the margin feedback leaves: neighbours are given `feedback_target /
    /// target` of the capacity.
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
    /// New requests per second the worker can take (0: not measured).
    capacity: f64,
    /// New requests per second its CPU would take at the rate recent intervals cost
    /// (`admitted / cpu`, the best of them, fading), for before it first saturates.
    baseline: f64,
    /// Local admission and feedback are in force (they take effect and end together).
    engaged: bool,
    /// Intervals in a row in which nothing was held back.
    calm: u32,
    /// What `oc` neighbours would send without feedback, requests per second (smoothed).
    oc_offered: f64,
    /// The loss in force for `oc` neighbours (0–1).
    loss: f64,
    /// The loss in force the interval before (what requests read now from a standing queue
    /// may have been sent under).
    prev_loss: f64,
    /// `oc` neighbours are told apart from other sources: control is engaged, or the last
    /// interval's load reached [`QUEUE_MEASURED_FROM`].
    watching: bool,
    /// Requests per second each `oc` neighbour may send (rate algorithm).
    rate: f64,
    /// New requests per second the `oc` neighbours together were given (0: none).
    oc_budget: f64,
    /// The queue delay at the end of the interval before, for the queue's growth.
    prev_delay_ms: u64,
    /// What admitted and refused requests cost this worker's CPU.
    cost: Cost,
    /// The queue's correction of the capacity the cost model reads (1: none): what the CPU
    /// does not say — that a call costs less where batches are fuller, a cost that lags its
    /// call by more than the model's memory — shows in the queue.
    trim: f64,
    /// The share of the capacity admitted while a standing queue drains (1: none).
    drain: f64,
    /// The CPU share (`a` × admitted rate, the trim's unit) the worker's admissions took in
    /// recent intervals in which a short queue stood all interval, smoothed: what it sustains
    /// saturated (0: not seen since control engaged).
    sustained: f64,
    /// How far a queue stood beyond its limit the interval before, milliseconds.
    prev_over_ms: u64,
    bucket: Bucket,
}

impl Default for Controller {
    fn default() -> Controller {
        Controller {
            capacity: 0.0,
            baseline: 0.0,
            engaged: false,
            calm: 0,
            oc_offered: 0.0,
            loss: 0.0,
            prev_loss: 0.0,
            watching: false,
            rate: 0.0,
            oc_budget: 0.0,
            prev_delay_ms: 0,
            cost: Cost::default(),
            trim: 1.0,
            drain: 1.0,
            sustained: 0.0,
            prev_over_ms: 0,
            bucket: Bucket::default(),
        }
    }
}

impl Controller {
    /// Takes one interval's measurements.
    pub(crate) fn update(&mut self, iv: &Interval, t: &Targets) {
        let elapsed = iv.elapsed_s.max(1e-3);
        let admitted_rate = iv.admitted as f64 / elapsed;
        let standing = iv.standing_delay_ms.unwrap_or(0);
        // A target below the load from which the queue is measured is the operator's cap on
        // the load itself: no queue could speak below it, so the load says saturated.
        let queue_says = standing >= SATURATED_MS;
        let load_says = iv.load >= t.target
            && (iv.standing_delay_ms.is_none() || t.target < QUEUE_MEASURED_FROM);
        let saturated = queue_says || load_says;
        // What the worker could take: what it took, when a queue stood; when the load said
        // so (alone, or as a cap below half load whatever the queue says), what it took
        // scaled to where the load would meet the target (the load grows with the rate
        // taken), so that a cap that refused — and so took exactly the cap — samples the cap
        // itself only when the load it left sits at the target.
        let sample = if load_says && iv.load > 0.0 {
            admitted_rate * t.target / iv.load
        } else {
            admitted_rate
        };
        // How far a queue stood beyond its limit, and how many limits it stood: the
        // connections' queue against the shorter one (its figure is a lower bound on the wait).
        let streams_limit = t.max_delay_ms.clamp(1, STREAMS_MAX_DELAY_MS);
        let streams = iv.streams_standing_delay_ms.unwrap_or(0);
        let over_ms = standing
            .saturating_sub(t.max_delay_ms)
            .max(streams.saturating_sub(streams_limit));
        let stood = (standing as f64 / t.max_delay_ms.max(1) as f64)
            .max(streams as f64 / streams_limit as f64);
        let drained_before = self.drain < 1.0;
        self.drain = (1.0 - over_ms as f64 / DRAIN_MS).clamp(MIN_DRAIN, 1.0);
        let refused = iv.arrived.saturating_sub(iv.admitted);
        let held_back = refused > 0 || (self.engaged && self.loss > 0.0);
        let engaged = self.engaged;
        if !saturated && !engaged && iv.cpu >= BASELINE_FROM && iv.admitted >= MIN_BASELINE {
            self.baseline = (self.baseline * BASELINE_FADE).max(admitted_rate / iv.cpu);
        }
        let arrived_rate = iv.arrived as f64 / elapsed;
        // The cost model reads only intervals in the regime it speaks for: a queue that stood
        // (where a queue is measured), or a loaded CPU (where only the load speaks). A call
        // costs more where batches are smaller, so intervals below saturation would read a
        // dearer call, a lower capacity, less admitted, smaller batches: a spiral (measured:
        // fed every loaded interval, the estimate fell from 2,700 to 1,800 calls/s in eight
        // seconds at four times capacity, each call costing 120 µs instead of 100).
        let queue_measured = iv.standing_delay_ms.is_some() && t.target >= QUEUE_MEASURED_FROM;
        let informative = if queue_measured {
            queue_says
        } else {
            iv.cpu >= BASELINE_FROM
        };
        if informative && iv.arrived >= MIN_BASELINE {
            self.cost
                .add(admitted_rate, arrived_rate - admitted_rate, iv.cpu.min(1.0));
        }
        // Only where a queue is measured: there the trim corrects the model from the queue
        // every interval. Where only the load speaks (a `target` below half load), nothing
        // corrects it, and a call read dearer below saturation lowers the capacity for good —
        // measured over TLS before stream reads measured a queue, RFC 7339 callers at four
        // times capacity kept 0.45 [0.27, 0.76] of what the estimator below keeps (5
        // alternated rounds): such a worker keeps that estimator.
        let fit = self.cost.fit().filter(|_| queue_measured);
        if let Some((a, _)) = fit.filter(|_| saturated || engaged) {
            // The cost model speaks: the capacity is what the whole CPU takes at the cost
            // admitted requests have had, trimmed by the queue, so the estimate rests where a
            // short queue stands and the worker never waits.
            // The CPU share the worker's admissions took while a short queue stood all interval
            // (not one admitted under the drain, which reads low): a share, not a rate, so a
            // change of what requests cost since (another mix, a cheap flood) does not carry a
            // rate that meant less CPU into what is regained.
            if queue_says && over_ms == 0 && !drained_before {
                let share = a * admitted_rate;
                self.sustained = if self.sustained > 0.0 {
                    self.sustained + GAIN * (share - self.sustained)
                } else {
                    share
                };
            }
            if over_ms > 0 {
                // Cut while the queue grows or holds; one the drain is clearing says nothing
                // the cuts before have not (cut every interval it stood, the trim fell a fifth
                // below where a short queue had stood, measured at four times capacity, and
                // took forty intervals to climb back).
                if over_ms >= self.prev_over_ms {
                    self.trim *= 1.0 - TRIM_DOWN * stood.min(2.0);
                }
            } else if held_back && (!queue_says || iv.load < FULL) {
                // Back to the CPU share the worker last sustained with a short queue in a few
                // intervals, then on by TRIM_UP: that queue said where the worker saturates;
                // the load, which reads full well below it, cannot.
                if self.trim < self.sustained {
                    self.trim += GAIN * (self.sustained - self.trim);
                }
                self.trim *= 1.0 + TRIM_UP;
                // A worker that waited says more than "up": what it took, at the load it took
                // it with, is what it takes at the target scaled by `target / load`. Stepping
                // by TRIM_UP alone, a model that started low over TLS (measured when stream
                // reads could not see their queue) took seven seconds to double, the worker
                // idle a third of the time, the loss 0.8 where 0.6 would have done.
                if iv.load > 0.0 && iv.load < FULL {
                    let waited = a * admitted_rate * t.target / iv.load;
                    if waited > self.trim {
                        self.trim += GAIN * (waited - self.trim);
                    }
                }
            }
            self.trim = self.trim.clamp(TRIM_RANGE.0, TRIM_RANGE.1);
            // Admission is not cut by the refusals' cost as well (`(trim − b · arriving) /
            // (a − b)`): where refusals never varied `b` is the prior's, and at four times
            // capacity that left nothing to admit (plain callers kept 0.69 of what they did
            // without it, 5 rounds); the trim finds what refusals leave from the queue.
            self.capacity = (self.trim / a).max(MIN_CAPACITY);
        } else if saturated && !engaged {
            // The interval that saturated took what one interval brought, whose calls' later
            // messages have yet to come: start from what the CPU says, when it has said.
            self.capacity = if self.baseline > 0.0 {
                self.baseline
            } else if load_says {
                sample
            } else {
                admitted_rate * FIRST_SHARE
            };
        } else if saturated && iv.admitted > 0 {
            // Beyond the limit the drain holds admission down, so what was taken says how
            // hard it drained, not what the worker can take: no sample.
            if over_ms == 0 {
                self.capacity += GAIN * (sample - self.capacity);
            }
        } else if saturated && self.capacity > 0.0 {
            // Saturated by work that is not new requests (responses, dialogs already in
            // progress): leave new ones less room.
            self.capacity *= 1.0 - GAIN;
        } else if held_back {
            self.capacity = self.capacity.max(admitted_rate) * (1.0 + PROBE);
        }
        if self.capacity > 0.0 {
            self.capacity = self.capacity.max(MIN_CAPACITY);
        }

        if saturated && self.capacity > 0.0 {
            if !self.engaged {
                self.bucket.fill(self.capacity);
            }
            self.engaged = true;
            self.calm = 0;
        } else if self.engaged {
            self.calm = if held_back { 0 } else { self.calm + 1 };
            if self.calm >= RELEASE {
                self.engaged = false;
                self.oc_offered = 0.0;
                self.loss = 0.0;
                self.prev_loss = 0.0;
                self.oc_budget = 0.0;
                // What it sustained then says nothing of the next overload's requests.
                self.sustained = 0.0;
            }
        }
        if self.engaged {
            self.feedback_step(iv, t);
        }
        self.prev_delay_ms = iv.queue_delay_ms;
        self.prev_over_ms = over_ms;
        self.watching = self.engaged || iv.load >= QUEUE_MEASURED_FROM;
    }

    fn feedback_step(&mut self, iv: &Interval, t: &Targets) {
        let elapsed = iv.elapsed_s.max(1e-3);
        // A queue whose delay grew by g seconds over the interval was fed 1 + g/elapsed
        // times what was read from it.
        let growth_s = (iv.queue_delay_ms as f64 - self.prev_delay_ms as f64) / 1000.0;
        let fed = (1.0 + growth_s / elapsed).clamp(0.5, 2.0);
        let sent = iv.oc_arrived as f64 / elapsed * fed;
        // What was read now was sent under the loss in force this interval or, where a queue
        // carried it over (a delay of more than [`UNSTEADY`] of the interval at either end),
        // the one before; and while the queue grows or drains fast, what was read is not what
        // was sent (`fed` is a noisy correction). Such an interval says only which way the
        // estimate is wrong: a growing queue was fed at least what was read, so the smallest
        // offer it can mean (under the lower loss) may raise the estimate; a draining one at
        // most, so the largest (under the higher loss) may lower it. Taken both ways, a queue
        // drained after a step to four times capacity — read at the worker's full rate while
        // it was fed at a hundredth of it — lifted the estimate enough to hold the loss at
        // 0.9–0.99 for four intervals after the queue was gone, the worker idle most of them.
        let kept = |loss: f64| 1.0 - loss.min(1.0 - MIN_SHARE);
        let now_kept = kept(self.loss);
        let carried =
            iv.queue_delay_ms.max(self.prev_delay_ms) as f64 / 1000.0 > UNSTEADY * elapsed;
        let before_kept = if carried {
            kept(self.prev_loss)
        } else {
            now_kept
        };
        let (low, high) = (now_kept.min(before_kept), now_kept.max(before_kept));
        let growth = growth_s / elapsed;
        let steady = high / low - 1.0 <= UNSTEADY && growth.abs() <= UNSTEADY;
        let sample = if steady || self.oc_offered <= 0.0 {
            Some(sent / now_kept)
        } else if growth > UNSTEADY {
            Some(sent / high).filter(|&s| s > self.oc_offered)
        } else if growth < -UNSTEADY {
            Some(sent / low).filter(|&s| s < self.oc_offered)
        } else {
            // The queue held; only which loss applied is unknown: the offer lies between
            // what each would mean.
            Some(self.oc_offered.clamp(sent / high, sent / low))
        };
        if let Some(sample) = sample {
            self.oc_offered = if self.oc_offered > 0.0 {
                self.oc_offered + OFFERED_GAIN * (sample - self.oc_offered)
            } else {
                sample
            };
        }
        self.prev_loss = self.loss;
        let others = iv.admitted.saturating_sub(iv.oc_admitted) as f64 / elapsed;
        let budget = (self.capacity * self.drain * t.feedback_target / t.target - others)
            .max(self.capacity * MIN_SHARE)
            .max(MIN_CAPACITY);
        self.oc_budget = budget;
        self.rate = budget / iv.oc_clients.max(1) as f64;
        self.loss = if self.oc_offered > 0.0 {
            (1.0 - budget / self.oc_offered).clamp(0.0, 1.0 - MIN_SHARE)
        } else {
            0.0
        };
    }

    /// The rate local admission holds new requests to: the capacity, less what a standing
    /// queue needs to drain.
    pub(crate) fn cap(&self) -> f64 {
        self.capacity * self.drain
    }

    /// Whether local admission takes a new sheddable request arriving at `now`.
    pub(crate) fn admit(&mut self, now: Millis) -> bool {
        let rate = if self.engaged {
            self.cap()
        } else if self.baseline > 0.0 {
            PREARM * self.baseline
        } else {
            return true;
        };
        self.bucket.admit(now, rate)
    }

    /// Whether an `oc` neighbour's new request is within what those neighbours were told
    /// they may send, `oc_admitted` of theirs having been admitted in the `in_interval_s`
    /// seconds this interval has run: such a request is admitted without being judged
    /// against the capacity (call [`Controller::charge`] for it). Judged by the rate it is
    /// read at, an honest neighbour's requests were refused whenever the worker read a
    /// standing queue faster than it arrived — 3–10% of them at four times capacity under a
    /// quarter-core quota, each a call lost.
    pub(crate) fn oc_within_budget(&self, oc_admitted: u64, in_interval_s: f64) -> bool {
        self.engaged
            && (oc_admitted as f64) < self.oc_budget * (in_interval_s + OC_BURST_S) * OC_SLACK
    }

    /// Takes a token for a request admitted without the bucket's say (so what is admitted
    /// that way leaves the others less), down to a debt of the bucket's depth.
    pub(crate) fn charge(&mut self, now: Millis) {
        let rate = self.cap();
        self.bucket.charge(now, rate);
    }

    /// Whether local admission is refusing what exceeds the capacity.
    pub(crate) fn local_on(&self) -> bool {
        self.engaged
    }

    /// Whether requests from `oc` neighbours are to be counted apart ([`Interval::oc_arrived`]):
    /// from the interval after one at half load, so where load rises through half before it
    /// saturates, the interval that engages control already knows what they offer (counted
    /// only once it was engaged, the first loss came an interval late, and at four times
    /// capacity that interval queued 200 ms of work; a jump from below half load straight to
    /// saturation still loses that interval). Below it a new request costs two counters and no
    /// look at its Via.
    pub(crate) fn watching(&self) -> bool {
        self.watching
    }

    /// Whether neighbours are being told to send less.
    pub(crate) fn feedback_on(&self) -> bool {
        self.engaged
    }

    /// The share of their new requests `oc` neighbours should not send (0–1).
    pub(crate) fn loss(&self) -> f64 {
        self.loss
    }

    /// Requests per second each `oc` neighbour may send (rate algorithm).
    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    /// The estimated capacity, new requests per second (0: not measured).
    pub(crate) fn capacity(&self) -> f64 {
        self.capacity
    }

    /// What a refusal costs as a share of an admitted request, as the cost model reads it
    /// (None until it speaks).
    pub(crate) fn refusal_cost(&self) -> Option<f64> {
        self.cost.fit().map(|(a, b)| b / a)
    }
}

/// What new requests cost the worker's CPU, read from its intervals: a least-squares fit of
/// `cpu = a · admitted + b · refused` (per second each, `cpu` a share of what the worker may
/// use) over recent loaded intervals, each fading by [`COST_FORGET`] an interval. `a` is the
/// CPU an admitted request costs, its later messages (ACK, BYE, responses) included; `b` a
/// refusal's, so `b / a` is r. Where refusals never varied against admissions the two
/// cannot be told apart, and a weak prior (`b = PRIOR_R · a`) decides; it is outweighed as
/// soon as they vary, as they do whenever control engages or lets go.
///
/// This is what the queue cannot say: a queue stands or does not, and while it stands beyond
/// the limit the drain holds admission down, so what was admitted says how hard it drained.
/// Measured before this model, at four times capacity under a quarter-core quota, the
/// queue-driven estimate was never sampled (the queue went from nothing to past the limit
/// within an interval) and, probing upward between, stood at five times the worker's
/// capacity while the drain alone held it (a 250 ms queue, the loss swinging from 0 to 0.99
/// twice a second).
#[derive(Debug, Default, Clone)]
struct Cost {
    /// Weighted sums of the regressors' and the CPU's products.
    aa: f64,
    ab: f64,
    bb: f64,
    ay: f64,
    by: f64,
    /// The intervals' total weight.
    weight: f64,
}

impl Cost {
    /// Takes one interval: admitted and refused per second, and the CPU they took.
    fn add(&mut self, admitted: f64, refused: f64, cpu: f64) {
        let refused = refused.max(0.0);
        for v in [
            &mut self.aa,
            &mut self.ab,
            &mut self.bb,
            &mut self.ay,
            &mut self.by,
            &mut self.weight,
        ] {
            *v *= COST_FORGET;
        }
        self.aa += admitted * admitted;
        self.ab += admitted * refused;
        self.bb += refused * refused;
        self.ay += admitted * cpu;
        self.by += refused * cpu;
        self.weight += 1.0;
    }

    /// `(a, b)`: the CPU share an admitted and a refused request per second cost, `0 ≤ b < a`;
    /// None until enough intervals weigh in.
    fn fit(&self) -> Option<(f64, f64)> {
        if self.weight < COST_READY || self.aa <= 0.0 {
            return None;
        }
        // Least squares with a ridge pulling b towards PRIOR_R · a: minimise
        // Σ(cpu − a·x − b·z)² + λ(b − R·a)².
        let l = PRIOR_WEIGHT * (self.aa + self.bb);
        let (m11, m12, m22) = (
            self.aa + l * PRIOR_R * PRIOR_R,
            self.ab - l * PRIOR_R,
            self.bb + l,
        );
        let det = m11 * m22 - m12 * m12;
        if det <= 0.0 {
            return None;
        }
        let a = (self.ay * m22 - self.by * m12) / det;
        let b = (m11 * self.by - m12 * self.ay) / det;
        if !(a > 0.0 && a.is_finite()) {
            return None;
        }
        // A refusal costs something and less than admitting; outside that the fit read noise.
        Some((a, b.clamp(0.01 * a, 0.9 * a)))
    }
}

/// A token bucket that admits at a rate given at each call: [`BURST_S`] of it deep, at least
/// one request (none at rate 0, once the first is taken).
#[derive(Debug, Default)]
pub(crate) struct Bucket {
    tokens: f64,
    refilled_at: Millis,
}

impl Bucket {
    /// Whether a request arriving at `now` is admitted at `rate` requests per second.
    pub(crate) fn admit(&mut self, now: Millis, rate: f64) -> bool {
        self.refill(now, rate);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes a token for a request admitted regardless, owing it if there is none (to at
    /// most the depth).
    pub(crate) fn charge(&mut self, now: Millis, rate: f64) {
        self.refill(now, rate);
        self.tokens = (self.tokens - 1.0).max(-depth(rate));
    }

    /// Adds what `rate` brought since the last refill, up to the depth.
    fn refill(&mut self, now: Millis, rate: f64) {
        let dt = now.saturating_sub(self.refilled_at) as f64 / 1000.0;
        self.refilled_at = now;
        self.tokens = (self.tokens + dt * rate).min(depth(rate));
    }

    /// Fills the bucket to its depth at `rate`.
    pub(crate) fn fill(&mut self, rate: f64) {
        self.tokens = depth(rate);
    }
}

/// What the token bucket holds at `rate`: [`BURST_S`] of it, at least one request.
fn depth(rate: f64) -> f64 {
    (rate * BURST_S).max(1.0)
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
        feedback_target: 0.93,
        max_delay_ms: 20,
    };
    const INTERVAL_MS: u64 = 100;

    struct Sim {
        /// Admitted requests per second the worker completes at full load.
        capacity: f64,
        /// A refusal's cost as a share of an admitted request's.
        r: f64,
        honour: bool,
        /// The callers announce `oc` but send everything (`honour` false).
        pretend: bool,
        /// CPU seconds a millisecond costs the worker beyond its requests when it starts it
        /// with nothing queued and requests arrive: a wake-up and a small batch. With it a call
        /// costs more where batches are smaller, as a real worker's does, so its load reads
        /// full well below saturation (measured under a quarter-core quota: 0.98–1.0 at 3,000
        /// calls/s admitted where a queue stood at 3,800) and only the queue says whether it
        /// could take more.
        wake_s: f64,
        /// CPU seconds the worker loses at the start of the next interval (a hiccup).
        hiccup_s: f64,
        targets: Targets,
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
        /// New requests refused here.
        refused: u64,
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
                pretend: false,
                wake_s: 0.0,
                hiccup_s: 0.0,
                targets: TARGETS,
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
            let start_ms = self.now_ms;
            let oc = self.honour || self.pretend;
            let mut busy = 0.0;
            let mut standing = u64::MAX;
            let mut latest = 0;
            self.debt += std::mem::take(&mut self.hiccup_s);
            for _ in 0..INTERVAL_MS {
                let now = self.now_ms as f64 / 1000.0;
                let was_empty = self.queue.is_empty();
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
                if was_empty && !self.queue.is_empty() {
                    cpu -= self.wake_s;
                }
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
                    if oc {
                        iv.oc_arrived += 1;
                    }
                    // As the engine admits (`overload_must_shed`).
                    let in_s = (self.now_ms - start_ms) as f64 / 1000.0;
                    let admit = if oc && self.ctl.oc_within_budget(iv.oc_admitted, in_s) {
                        self.ctl.charge(self.now_ms);
                        true
                    } else {
                        self.ctl.admit(self.now_ms)
                    };
                    let cost = if admit {
                        iv.admitted += 1;
                        if oc {
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
            iv.cpu = iv.load;
            iv.standing_delay_ms = Some(if standing == u64::MAX { 0 } else { standing });
            iv.queue_delay_ms = latest;
            self.ctl.update(&iv, &self.targets);
            Step {
                admitted_rate: iv.admitted as f64 / iv.elapsed_s,
                refused: iv.arrived - iv.admitted,
                loss: self.ctl.loss(),
                standing_ms: iv.standing_delay_ms.unwrap_or(0),
                load: iv.load,
            }
        }

        fn run(&mut self, offered: f64, intervals: usize) -> Vec<Step> {
            (0..intervals).map(|_| self.interval(offered)).collect()
        }
    }

    const CAPACITY: f64 = 2000.0;

    /// The mean admitted rate over `steps`, as a share of the capacity.
    fn mean(steps: &[Step]) -> f64 {
        steps.iter().map(|s| s.admitted_rate).sum::<f64>() / steps.len() as f64 / CAPACITY
    }

    /// Callers that honour the loss, offered 1× the capacity, then 4×, then 0.9×. The step
    /// response: at 1× nothing is held back; at 4× the first interval builds a queue and the
    /// loss overshoots while it drains, then the worker waits for most of one interval (the
    /// fourth) and, after the estimate of what the callers offer has risen to them, of one more
    /// (the eighth): over the first eight intervals it takes at least 0.7 of its capacity
    /// (0.53 when an interval that drained a queue could lift that estimate, and the loss stayed
    /// at 0.9–0.99 for four intervals after the queue was gone). From the ninth interval the
    /// worker takes at least 0.9 of its capacity in every interval and 0.97 on average, none of
    /// it refused, the loss within 0.03 of 1 − 0.98/4 (the capacity less the feedback margin,
    /// shared by four times the offer) — it does not swing — and a queue under 30 ms comes and
    /// goes, as the trim lets a short one stand and cuts one beyond the limit. Below capacity
    /// again, control is gone from the fourth interval.
    #[test]
    fn honest_callers_settle_at_capacity_after_a_step_to_four_times_and_back() {
        let mut sim = Sim::new(CAPACITY, 0.05, true);
        let before = sim.run(CAPACITY, 30);
        let up = sim.run(4.0 * CAPACITY, 40);
        let down = sim.run(0.9 * CAPACITY, 30);
        assert!(before.iter().all(|s| s.loss == 0.0), "{before:?}");
        assert!(mean(&before) >= 0.99, "{before:?}");
        assert!(mean(&up[..8]) >= 0.7, "{up:?}");
        let settled = 1.0 - TARGETS.feedback_target / TARGETS.target / 4.0;
        for (i, s) in up.iter().enumerate().skip(8) {
            assert!(s.admitted_rate >= 0.9 * CAPACITY, "4x, interval {i}: {s:?}");
            assert!(s.standing_ms <= 30, "4x, interval {i}: {s:?}");
            assert!((s.loss - settled).abs() <= 0.03, "4x, interval {i}: {s:?}");
        }
        assert!(mean(&up[8..]) >= 0.97, "{up:?}");
        // Judged against what they were told, not against the capacity at the rate they
        // are read, honest callers are hardly ever refused here.
        let refused: u64 = up[8..].iter().map(|s| s.refused).sum();
        let interval_s = INTERVAL_MS as f64 / 1000.0;
        let admitted: f64 = up[8..].iter().map(|s| s.admitted_rate * interval_s).sum();
        assert!(
            refused as f64 <= 0.005 * admitted,
            "{refused} refused: {up:?}"
        );
        let worst = up.iter().map(|s| s.standing_ms).max().unwrap();
        assert!(worst <= 250, "4x: a queue of {worst} ms: {up:?}");
        assert!(down[3..].iter().all(|s| s.loss == 0.0), "{down:?}");
        assert!(!sim.ctl.local_on(), "{down:?}");
        assert!(mean(&down[3..]) >= 0.99 * 0.9, "{down:?}");
    }

    /// A model that reads the worker's capacity at half what it is (as over TLS, when control
    /// engaged on an interval that admitted little): the worker waits half the time while
    /// honest callers are told to send less, and from what it took at that load the estimate
    /// closes half its gap each interval: the worker takes 0.9 of its capacity from the sixth.
    /// Stepping up 1% an interval, it took seventy.
    #[test]
    fn an_estimate_that_starts_low_recovers_from_what_the_worker_took() {
        let mut sim = Sim::new(CAPACITY, 0.05, true);
        sim.run(4.0 * CAPACITY, 40);
        assert!(sim.ctl.cost.fit().is_some());
        sim.ctl.trim *= 0.5;
        sim.ctl.capacity *= 0.5;
        // Nothing sustained with a short queue to regain: the load alone says how far.
        sim.ctl.sustained = 0.0;
        let after = sim.run(4.0 * CAPACITY, 12);
        assert!(mean(&after[1..3]) < 0.8, "{after:?}");
        for (i, s) in after.iter().enumerate().skip(5) {
            assert!(s.admitted_rate >= 0.9 * CAPACITY, "interval {i}: {after:?}");
        }
    }

    /// Honest callers at 4× the capacity of a worker whose load reads full well below
    /// saturation (a wake-up's cost per small batch, [`Sim::wake_s`]), so that only the queue
    /// says it could take more, and a hiccup of 80 ms: the queue it leaves stands beyond the
    /// limit, the drain clears it and the trim is cut; from the third interval on, the worker
    /// takes at least 0.97 of its capacity again, regaining the CPU share it last sustained with a
    /// short queue (stepping up 1% an interval from the cut, the third to the sixth took
    /// 0.93–0.97), and 0.93 over the two seconds from the hiccup, which itself takes most of
    /// an interval.
    #[test]
    fn a_hiccup_costs_a_few_intervals_not_a_second() {
        let mut sim = Sim::new(CAPACITY, 0.05, true);
        sim.wake_s = 0.3e-3;
        sim.run(4.0 * CAPACITY, 60);
        let before = sim.run(4.0 * CAPACITY, 20);
        assert!(mean(&before) >= 0.98, "{before:?}");
        sim.hiccup_s = 0.08;
        let after = sim.run(4.0 * CAPACITY, 20);
        assert!(after[0].standing_ms > TARGETS.max_delay_ms, "{after:?}");
        for (i, s) in after.iter().enumerate().skip(2) {
            assert!(
                s.admitted_rate >= 0.97 * CAPACITY,
                "interval {i}: {after:?}"
            );
        }
        assert!(mean(&after) >= 0.93, "{after:?}");
    }

    /// Callers that announce `oc` and ignore the feedback, 4× the capacity: past what they
    /// were told (with its slack) they are judged like anyone, so the worker keeps what
    /// plain callers keep and they gain no more than the slack over the capacity.
    #[test]
    fn callers_that_only_pretend_to_honour_feedback_gain_nothing() {
        let r = 0.05;
        let mut sim = Sim::new(CAPACITY, r, false);
        sim.pretend = true;
        sim.run(CAPACITY / 2.0, 10);
        let up = sim.run(4.0 * CAPACITY, 50);
        let bound = 1.0 / (1.0 + 3.0 * r);
        assert!(mean(&up[5..]) >= 0.9 * bound, "{up:?} (bound {bound})");
        assert!(mean(&up[5..]) <= OC_SLACK, "{up:?}");
        let worst = up[5..].iter().map(|s| s.standing_ms).max().unwrap();
        assert!(worst <= 250, "a queue of {worst} ms: {up:?}");
    }

    /// Callers that ignore the feedback, 4× the capacity, refusals costing a twentieth of a
    /// call: from the fifth interval local admission keeps on average at least 0.9 of the
    /// bound 1/(1 + 3r) that the cost of refusals leaves, and every second of it at least
    /// 0.85. It does not settle: a probe overshoots, a queue stands, the drain cuts, about once
    /// a second — the cycle whose troughs (a quarter to a half of the capacity for an
    /// interval) are part of why issue 37's bars are not met.
    #[test]
    fn plain_callers_keep_most_of_what_refusals_leave() {
        let r = 0.05;
        let mut sim = Sim::new(CAPACITY, r, false);
        sim.run(CAPACITY / 2.0, 10);
        let up = sim.run(4.0 * CAPACITY, 50);
        let bound = 1.0 / (1.0 + 3.0 * r);
        assert!(mean(&up[5..]) >= 0.9 * bound, "{up:?} (bound {bound})");
        for (i, second) in up[5..].windows(10).enumerate() {
            assert!(
                mean(second) >= 0.85 * bound,
                "the second from interval {}: {second:?} (bound {bound})",
                i + 5
            );
        }
        let worst = up.iter().map(|s| s.standing_ms).max().unwrap();
        assert!(worst <= 250, "a queue of {worst} ms: {up:?}");
    }

    /// A `target` below half load caps the load itself (no queue speaks there): honest
    /// callers offering the worker's full capacity are told the loss that leaves it at the
    /// cap, and the estimate settles where the load meets it, not wherever the first
    /// saturated interval happened to put it.
    #[test]
    fn a_target_below_half_load_caps_the_load() {
        let mut sim = Sim::new(CAPACITY, 0.05, true);
        sim.targets = Targets {
            target: 0.2,
            feedback_target: 0.2,
            max_delay_ms: 20,
        };
        let steps = sim.run(CAPACITY, 40);
        let settled = &steps[10..];
        let load = settled.iter().map(|s| s.load).sum::<f64>() / settled.len() as f64;
        assert!((load - 0.2).abs() < 0.03, "load {load}: {steps:?}");
        for s in settled {
            assert!((s.loss - 0.8).abs() < 0.05, "{s:?}: {steps:?}");
        }
    }

    /// A worker that measured what its CPU takes, then went quiet for a minute, takes 0.8
    /// of its capacity at once when calls return: a quiet spell says nothing of its cost.
    #[test]
    fn a_quiet_spell_does_not_lower_what_the_worker_admits() {
        let mut sim = Sim::new(CAPACITY, 0.05, false);
        sim.run(0.6 * CAPACITY, 20);
        sim.run(0.0, 600);
        let back = sim.run(0.8 * CAPACITY, 20);
        assert!(mean(&back) >= 0.79, "{back:?}");
        assert!(!sim.ctl.local_on());
    }

    /// Below the target nothing is refused and no neighbour is told anything.
    #[test]
    fn at_eighty_percent_nothing_is_refused() {
        let mut sim = Sim::new(CAPACITY, 0.1, true);
        let steps = sim.run(0.8 * CAPACITY, 50);
        assert!(steps.iter().all(|s| s.loss == 0.0), "{steps:?}");
        assert!(
            steps.iter().all(|s| (s.load - 0.8).abs() < 0.02),
            "{steps:?}"
        );
        assert!(!sim.ctl.local_on() && !sim.ctl.feedback_on());
        let admitted: f64 = steps.iter().map(|s| s.admitted_rate).sum::<f64>() / 50.0;
        assert!(
            (admitted - 0.8 * CAPACITY).abs() < 0.01 * CAPACITY,
            "{admitted}"
        );
    }
}
