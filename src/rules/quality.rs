//! The quality rule: each member's decaying success rate and latency, from the outcomes
//! workers and the gateway report. The Lua twin of every function here is in
//! `quality.lua` beside this file, under the same name; `twins.rs` proves they agree.
//!
//! Both numbers are whole fixed-point values (the success rate in millionths, the latency
//! in microseconds), so that Lua's doubles and Rust's integers give the same digits: each
//! step is one integer division of values far below 2^53.

/// How many outcomes the averages reach back, in the sense that each new one weighs
/// `1 / QUALITY_WINDOW`: the mean of the first 50 outcomes, then an exponentially weighted
/// moving average with alpha = 1/50 = 0.02, in which the last 100 outcomes carry 87 % of
/// the weight.
pub const QUALITY_WINDOW: u64 = 50;

/// The largest latency a report may carry, in milliseconds (ten minutes).
pub const MAX_LATENCY_MS: u64 = 600_000;

/// A success rate of 1, in millionths.
pub const SUCCESS_ONE: u64 = 1_000_000;

/// What a member's outcomes add up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quality {
    /// Outcomes counted.
    pub outcomes: u64,
    /// The decaying success rate, in millionths (meaningless while `outcomes` is 0).
    pub success_ppm: u64,
    /// Outcomes counted that carried a latency.
    pub latencies: u64,
    /// The decaying latency, in microseconds (meaningless while `latencies` is 0).
    pub latency_us: u64,
}

/// The average after its `n`-th value `x` (`n` from 1), given the one before: the mean
/// while `n <= QUALITY_WINDOW`, then `old + (x - old) / QUALITY_WINDOW`, rounded half up,
/// as `((w - 1) * old + x + w / 2) / w` with `w = min(n, QUALITY_WINDOW)` on whole numbers.
/// The first value is the average.
pub fn decayed(old: u64, n: u64, x: u64) -> u64 {
    let w = n.clamp(1, QUALITY_WINDOW);
    ((w - 1) * old + x + w / 2) / w
}

/// The member's quality after one more outcome: `ok` a success (anything else, a failure
/// or a block, is not), with the latency in milliseconds when it carried one (at most
/// [`MAX_LATENCY_MS`], which the edge enforces).
pub fn record(quality: Quality, ok: bool, latency_ms: Option<u64>) -> Quality {
    let outcomes = quality.outcomes.saturating_add(1);
    let mut next = Quality {
        outcomes,
        success_ppm: decayed(
            quality.success_ppm,
            outcomes,
            if ok { SUCCESS_ONE } else { 0 },
        ),
        ..quality
    };
    if let Some(ms) = latency_ms {
        next.latencies = quality.latencies.saturating_add(1);
        next.latency_us = decayed(
            quality.latency_us,
            next.latencies,
            ms.min(MAX_LATENCY_MS) * 1000,
        );
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_outcome_is_the_average() {
        let q = record(Quality::default(), false, Some(120));
        assert_eq!(
            q,
            Quality {
                outcomes: 1,
                success_ppm: 0,
                latencies: 1,
                latency_us: 120_000
            }
        );
    }

    #[test]
    fn the_first_fifty_outcomes_are_a_mean_and_later_ones_weigh_a_fiftieth() {
        let mut q = Quality::default();
        for ok in [true, true, true, false] {
            q = record(q, ok, None);
        }
        assert_eq!((q.outcomes, q.success_ppm, q.latencies), (4, 750_000, 0));
        let mut q = Quality::default();
        for _ in 0..50 {
            q = record(q, true, Some(100));
        }
        q = record(q, false, Some(600));
        assert_eq!(q.success_ppm, 980_000);
        assert_eq!(q.latency_us, 110_000);
    }

    #[test]
    fn averages_stay_within_the_values_they_average() {
        let mut q = Quality::default();
        for n in 0..10_000u64 {
            q = record(q, n % 3 == 0, Some(MAX_LATENCY_MS));
        }
        assert!(q.success_ppm <= SUCCESS_ONE);
        assert_eq!(q.latency_us, MAX_LATENCY_MS * 1000);
    }
}
