//! Per-release dampening (DESIGN §2), adapted from BGP route-flap damping.
//!
//! Pure arithmetic, no I/O: the store persists [`DampeningState`] and replays it from
//! the log, and the simulation below drives the same [`DampeningState::on_call`] that
//! production uses, so the numbers in the design are checked against the real code.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

/// What one call to a release contributed to the evidence against it.
///
/// The weights come from [`DampeningParams`]; the variants name the verifier's
/// classifications, not numbers, so a caller cannot invent a weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// A call with nothing suspicious (weight 0); it still decays the penalty.
    None,
    /// An unverified trigger or a state/response divergence (weight 250 by default).
    Unverified,
    /// A verified witness from a release that declared determinism, or a broken
    /// determinism declaration (weight 2000 by default: suppresses at once).
    Verified,
    /// Not a call: the verified verdict on the trigger of an earlier call, which was
    /// counted as [`Event::Unverified`] when it ran (verification runs off the release's
    /// lane, so no call waits for it). Adds the verified weight without decay and without
    /// counting a call, so a verified witness still suppresses at once whatever calls ran
    /// in between.
    Verdict,
}

impl Event {
    /// The event of a call whose trigger was checked by replay: [`Event::Verified`] when
    /// the verifier's verdict is a verified one, else [`Event::Unverified`].
    pub fn of_trigger(verified: bool) -> Event {
        if verified {
            Event::Verified
        } else {
            Event::Unverified
        }
    }

    /// The lower-case name used in log entries and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::None => "none",
            Event::Unverified => "unverified",
            Event::Verified => "verified",
            Event::Verdict => "verdict",
        }
    }
}

impl std::str::FromStr for Event {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Event::None),
            "unverified" => Ok(Event::Unverified),
            "verified" => Ok(Event::Verified),
            "verdict" => Ok(Event::Verdict),
            other => Err(format!("unknown event {other:?}: expected none, unverified, verified or verdict")),
        }
    }
}

/// The tunables of dampening; [`Default`] gives DESIGN §2's values.
///
/// Half-life is counted in calls, not seconds, so an idle release keeps its penalty:
/// a misbehaving release cannot wait its way back into use.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DampeningParams {
    /// Calls after which a penalty has halved (`h`).
    pub half_life_calls: f64,
    /// Suppress once the penalty reaches this (`S`).
    pub suppress_at: f64,
    /// A suppressed release is usable again once the penalty drops below this (`R`).
    pub reuse_below: f64,
    /// Weight of [`Event::Unverified`].
    pub unverified_weight: f64,
    /// Weight of [`Event::Verified`].
    pub verified_weight: f64,
}

impl Default for DampeningParams {
    fn default() -> Self {
        DampeningParams {
            half_life_calls: 50.0,
            suppress_at: 2000.0,
            reuse_below: 750.0,
            unverified_weight: 250.0,
            verified_weight: 2000.0,
        }
    }
}

impl DampeningParams {
    /// Per-call decay factor `λ = 2^(−1/h)`.
    pub fn decay(&self) -> f64 {
        (-1.0 / self.half_life_calls).exp2()
    }

    /// The weight `w` added for an event.
    pub fn weight(&self, event: Event) -> f64 {
        match event {
            Event::None => 0.0,
            Event::Unverified => self.unverified_weight,
            Event::Verified | Event::Verdict => self.verified_weight,
        }
    }

    /// The divergence rate `p` at which the stationary expected penalty
    /// `p·w/(1−λ)` equals the suppression threshold: releases diverging more often than
    /// this are expected to end up suppressed, rarer ones only by bad luck.
    pub fn stationary_threshold_rate(&self) -> f64 {
        self.suppress_at * (1.0 - self.decay()) / self.unverified_weight
    }
}

/// The dampening state of one release. A release never seen starts at [`Default`]
/// (penalty 0, usable).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DampeningState {
    /// Current penalty `P`.
    pub penalty: f64,
    /// Whether calls to the release are refused.
    pub suppressed: bool,
    /// Calls (refused ones included) seen so far.
    pub calls: u64,
}

impl DampeningState {
    /// Applies one call attempt: decay, add the event's weight, then apply the
    /// hysteresis between `S` and `R`. Refused calls must be counted too, otherwise a
    /// suppressed release could never recover. [`Event::Verdict`] is not a call: it adds
    /// its weight only.
    pub fn on_call(&mut self, params: &DampeningParams, event: Event) {
        if event == Event::Verdict {
            self.penalty += params.weight(event);
        } else {
            self.penalty = self.penalty * params.decay() + params.weight(event);
            self.calls = self.calls.saturating_add(1);
        }
        if self.penalty >= params.suppress_at {
            self.suppressed = true;
        } else if self.penalty < params.reuse_below {
            self.suppressed = false;
        }
    }

    /// Fixed-width encoding for the store (penalty bits, flag, calls), so a state
    /// rebuilt from the log compares byte-for-byte with the persisted one.
    pub fn to_bytes(&self) -> [u8; 17] {
        let mut out = [0u8; 17];
        out[..8].copy_from_slice(&self.penalty.to_bits().to_be_bytes());
        out[8] = u8::from(self.suppressed);
        out[9..].copy_from_slice(&self.calls.to_be_bytes());
        out
    }

    /// Inverse of [`DampeningState::to_bytes`]; `None` if the bytes are not a state.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != 17 || bytes[8] > 1 {
            return None;
        }
        let penalty = f64::from_bits(u64::from_be_bytes(bytes[..8].try_into().ok()?));
        let calls = u64::from_be_bytes(bytes[9..].try_into().ok()?);
        Some(DampeningState { penalty, suppressed: bytes[8] == 1, calls })
    }
}

/// How divergences arrive in a simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Each call diverges independently with the given rate.
    Random,
    /// Divergences come in runs of `burst` consecutive calls separated by geometric
    /// gaps, with the same long-run rate as [`Pattern::Random`].
    Bursty {
        /// Length of each run of diverging calls.
        burst: u32,
    },
}

/// Parameters of a Monte-Carlo run of [`simulate`].
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Dampening parameters under test.
    pub params: DampeningParams,
    /// Long-run divergence rates to try (each divergence is an [`Event::Unverified`]).
    pub rates: Vec<f64>,
    /// Arrival patterns to try.
    pub patterns: Vec<Pattern>,
    /// Call horizons at which to report the suppression probability.
    pub horizons: Vec<u64>,
    /// Independent releases simulated per (rate, pattern).
    pub trials: u32,
    /// RNG seed, so a table can be reproduced exactly.
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            params: DampeningParams::default(),
            rates: vec![0.01, 0.02, 0.03, 0.04, 0.05],
            patterns: vec![Pattern::Random, Pattern::Bursty { burst: 5 }],
            horizons: vec![1_000, 10_000, 100_000],
            trials: 2_000,
            seed: 1,
        }
    }
}

/// One row of a simulation: the probability that an honest-but-noisy release is
/// suppressed at least once within each horizon.
#[derive(Clone, Debug, PartialEq)]
pub struct SimRow {
    /// Long-run divergence rate.
    pub rate: f64,
    /// Arrival pattern.
    pub pattern: Pattern,
    /// `(horizon, probability, standard error)` for each configured horizon.
    pub suppressed_within: Vec<(u64, f64, f64)>,
}

/// Estimates, by Monte Carlo, how often a release with a given false-divergence rate
/// gets suppressed within a number of calls: the cost of dampening for honest releases.
///
/// Simulates event to event (geometric gaps, decay `λ^gap` in one step) rather than
/// call by call, which is exact because the penalty only rises at events; that keeps a
/// 100,000-call horizon cheap enough for CI.
pub fn simulate(config: &SimConfig) -> Vec<SimRow> {
    let max_horizon = config.horizons.iter().copied().max().unwrap_or(0);
    let mut rows = Vec::new();
    for (ri, &rate) in config.rates.iter().enumerate() {
        for (pi, &pattern) in config.patterns.iter().enumerate() {
            let stream = ((ri as u64) << 32) | pi as u64;
            let mut rng = ChaCha20Rng::seed_from_u64(config.seed);
            rng.set_stream(stream);
            let mut hits = vec![0u64; config.horizons.len()];
            for _ in 0..config.trials {
                if let Some(t) = first_suppression(&config.params, rate, pattern, max_horizon, &mut rng) {
                    for (h, hit) in config.horizons.iter().zip(hits.iter_mut()) {
                        if t <= *h {
                            *hit += 1;
                        }
                    }
                }
            }
            let n = f64::from(config.trials.max(1));
            let suppressed_within = config
                .horizons
                .iter()
                .zip(hits)
                .map(|(&h, k)| {
                    let p = k as f64 / n;
                    (h, p, (p * (1.0 - p) / n).sqrt())
                })
                .collect();
            rows.push(SimRow { rate, pattern, suppressed_within });
        }
    }
    rows
}

/// Number of non-diverging calls before the next divergence, `Geometric(p)` on {0,1,…}.
fn geometric_gap(rng: &mut ChaCha20Rng, p: f64) -> u64 {
    if p >= 1.0 {
        return 0;
    }
    if p <= 0.0 {
        return u64::MAX;
    }
    let u: f64 = 1.0 - rng.gen::<f64>(); // (0, 1]
    let g = (u.ln() / (1.0 - p).ln()).floor();
    if g >= u64::MAX as f64 {
        u64::MAX
    } else {
        g as u64
    }
}

/// The 1-based call number at which a simulated release is first suppressed, if within
/// `horizon` calls.
fn first_suppression(
    params: &DampeningParams,
    rate: f64,
    pattern: Pattern,
    horizon: u64,
    rng: &mut ChaCha20Rng,
) -> Option<u64> {
    let lambda = params.decay();
    let w = params.weight(Event::Unverified);
    let (burst, gap_p) = match pattern {
        Pattern::Random => (1u64, rate),
        Pattern::Bursty { burst } => {
            let b = f64::from(burst.max(1));
            // Mean gap b(1−p)/p keeps the long-run rate at p; a geometric gap with
            // success probability q has mean (1−q)/q.
            let mean_gap = b * (1.0 - rate) / rate;
            (u64::from(burst.max(1)), 1.0 / (1.0 + mean_gap))
        }
    };
    let mut penalty = 0.0f64;
    let mut call = 0u64; // calls done so far
    loop {
        let gap = geometric_gap(rng, gap_p);
        call = call.saturating_add(gap);
        if call >= horizon {
            return None;
        }
        penalty *= pow_decay(lambda, gap);
        for _ in 0..burst {
            call += 1;
            penalty = penalty * lambda + w;
            if penalty >= params.suppress_at {
                return Some(call);
            }
            if call >= horizon {
                return None;
            }
        }
    }
}

/// `λ^n` for a call count that may exceed `i32`.
fn pow_decay(lambda: f64, n: u64) -> f64 {
    if n > i32::MAX as u64 {
        0.0
    } else {
        lambda.powi(n as i32)
    }
}

/// Renders simulation rows as a plain-text table for the CLI.
pub fn format_table(rows: &[SimRow], trials: u32) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let Some(first) = rows.first() else {
        return out;
    };
    let _ = write!(out, "{:>6}  {:<10}", "rate", "pattern");
    for (h, _, _) in &first.suppressed_within {
        let _ = write!(out, "  {:>18}", format!("P(supp ≤ {h})"));
    }
    let _ = writeln!(out);
    for row in rows {
        let pattern = match row.pattern {
            Pattern::Random => "random".to_string(),
            Pattern::Bursty { burst } => format!("bursty/{burst}"),
        };
        let _ = write!(out, "{:>5.1}%  {:<10}", row.rate * 100.0, pattern);
        for (_, p, se) in &row.suppressed_within {
            let _ = write!(out, "  {:>18}", format!("{:.2}% ±{:.2}", p * 100.0, se * 100.0));
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "({trials} trials per row; ± is one standard error)");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls_until_suppressed(params: &DampeningParams, event: Event) -> u64 {
        let mut s = DampeningState::default();
        while !s.suppressed {
            s.on_call(params, event);
            assert!(s.calls < 10_000, "never suppressed");
        }
        s.calls
    }

    #[test]
    fn always_diverging_release_is_suppressed_after_exactly_nine_calls() {
        let p = DampeningParams::default();
        assert_eq!(calls_until_suppressed(&p, Event::Unverified), 9);
        let mut s = DampeningState::default();
        for _ in 0..8 {
            s.on_call(&p, Event::Unverified);
        }
        assert!(!s.suppressed && s.penalty < 2000.0 && s.penalty > 1900.0);
    }

    #[test]
    fn one_verified_witness_suppresses() {
        let p = DampeningParams::default();
        assert_eq!(calls_until_suppressed(&p, Event::Verified), 1);
        // Even on top of a decayed penalty.
        let mut s = DampeningState { penalty: 100.0, ..Default::default() };
        s.on_call(&p, Event::Verified);
        assert!(s.suppressed);
    }

    #[test]
    fn a_late_verdict_suppresses_without_counting_a_call() {
        let p = DampeningParams::default();
        let mut s = DampeningState::default();
        // The triggering call counted as unverified, then calls ran before the verdict.
        s.on_call(&p, Event::Unverified);
        for _ in 0..5 {
            s.on_call(&p, Event::None);
        }
        let calls = s.calls;
        s.on_call(&p, Event::Verdict);
        assert!(s.suppressed && s.penalty >= p.suppress_at, "{s:?}");
        assert_eq!(s.calls, calls, "a verdict is not a call");
    }

    #[test]
    fn recovery_from_threshold_takes_71_call_attempts() {
        let p = DampeningParams::default();
        let mut s = DampeningState { penalty: 2000.0, suppressed: true, calls: 0 };
        let mut n = 0;
        while s.suppressed {
            s.on_call(&p, Event::None);
            n += 1;
        }
        assert_eq!(n, 71);
        assert!(s.penalty < 750.0);
    }

    #[test]
    fn hysteresis_keeps_suppression_between_r_and_s() {
        let p = DampeningParams::default();
        let mut s = DampeningState { penalty: 2000.0, suppressed: true, calls: 0 };
        for _ in 0..70 {
            s.on_call(&p, Event::None);
            assert!(s.suppressed, "released early at P = {}", s.penalty);
        }
        // A fresh release at the same penalty (between R and S) is not suppressed.
        let mut fresh = DampeningState { penalty: 1000.0, ..Default::default() };
        fresh.on_call(&p, Event::None);
        assert!(!fresh.suppressed);
    }

    #[test]
    fn stationary_threshold_rate_is_eleven_percent() {
        let p = DampeningParams::default();
        let rate = p.stationary_threshold_rate();
        assert!((rate - 0.110).abs() < 0.0005, "rate {rate}");
        // Numerically: iterating the expected penalty at that rate converges to S.
        let mut expected = 0.0;
        for _ in 0..20_000 {
            expected = expected * p.decay() + rate * p.unverified_weight;
        }
        assert!((expected - p.suppress_at).abs() < 1e-6, "{expected}");
    }

    #[test]
    fn params_are_configurable() {
        let p = DampeningParams { half_life_calls: 10.0, ..Default::default() };
        // Faster decay: P_n = 250(1−λⁿ)/(1−λ) with λ = 2^−0.1 first reaches 2000 at n = 12.
        assert_eq!(calls_until_suppressed(&p, Event::Unverified), 12);
        let strict = DampeningParams { suppress_at: 500.0, reuse_below: 100.0, ..Default::default() };
        assert_eq!(calls_until_suppressed(&strict, Event::Unverified), 3);
    }

    #[test]
    fn state_bytes_round_trip_and_reject_garbage() {
        let s = DampeningState { penalty: 1234.5, suppressed: true, calls: 77 };
        assert_eq!(DampeningState::from_bytes(&s.to_bytes()), Some(s));
        let mut bad = s.to_bytes();
        bad[8] = 2;
        assert_eq!(DampeningState::from_bytes(&bad), None);
        assert_eq!(DampeningState::from_bytes(&bad[..16]), None);
    }

    /// Call-by-call reference simulation, to check the event-to-event shortcut.
    fn naive_first_suppression(rate: f64, horizon: u64, rng: &mut ChaCha20Rng) -> Option<u64> {
        let p = DampeningParams::default();
        let mut s = DampeningState::default();
        for call in 1..=horizon {
            let e = if rng.gen_bool(rate) { Event::Unverified } else { Event::None };
            s.on_call(&p, e);
            if s.suppressed {
                return Some(call);
            }
        }
        None
    }

    #[test]
    fn event_stepping_matches_call_by_call_simulation() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let trials = 2_000;
        let naive = (0..trials).filter(|_| naive_first_suppression(0.08, 2_000, &mut rng).is_some()).count() as f64
            / trials as f64;
        let fast = simulate(&SimConfig {
            rates: vec![0.08],
            patterns: vec![Pattern::Random],
            horizons: vec![2_000],
            trials,
            seed: 9,
            ..Default::default()
        })[0]
            .suppressed_within[0]
            .1;
        let se = (naive * (1.0 - naive) / trials as f64).sqrt() * 2f64.sqrt();
        assert!((naive - fast).abs() < 4.0 * se + 0.01, "naive {naive} fast {fast}");
    }

    #[test]
    fn three_percent_random_matches_design_targets() {
        // Targets: ≈0.15% within 1k, 2.4% within 10k, 23% within 100k calls. Each
        // horizon gets the fewest trials that pin it down, to keep CI fast.
        for (horizon, trials, target) in [(1_000u64, 20_000u32, 0.0015), (10_000, 4_000, 0.024), (100_000, 1_000, 0.23)]
        {
            let rows = simulate(&SimConfig {
                rates: vec![0.03],
                patterns: vec![Pattern::Random],
                horizons: vec![horizon],
                trials,
                seed: 3,
                ..Default::default()
            });
            let (_, p, se) = rows[0].suppressed_within[0];
            assert!((p - target).abs() <= 4.0 * se + 0.1 * target, "horizon {horizon}: {p} vs {target} (se {se})");
        }
    }

    #[test]
    fn bursts_suppress_more_often_than_random_at_same_rate() {
        let rows = simulate(&SimConfig {
            rates: vec![0.03],
            patterns: vec![Pattern::Random, Pattern::Bursty { burst: 5 }],
            horizons: vec![10_000],
            trials: 2_000,
            seed: 5,
            ..Default::default()
        });
        assert!(rows[1].suppressed_within[0].1 > rows[0].suppressed_within[0].1);
        let table = format_table(&rows, 2_000);
        assert!(table.contains("bursty/5") && table.contains("random"));
    }

    #[test]
    fn simulation_is_reproducible_from_its_seed() {
        let cfg = SimConfig {
            rates: vec![0.05],
            patterns: vec![Pattern::Random],
            horizons: vec![5_000],
            trials: 300,
            seed: 42,
            ..Default::default()
        };
        assert_eq!(simulate(&cfg), simulate(&cfg));
    }
}
