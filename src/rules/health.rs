//! The health rules: how long a tripped member cools down, how long a member blocked by
//! one target is banned from it, and which count a member that comes back restarts at.
//! The Lua twin of every function here is in `health.lua` beside this file, under the same
//! name; `twins.rs` proves they agree.

use crate::domain::{HealthConfig, RestorePolicy};

/// The cooldown of the `trips`-th trip in a row (1 for the first), before jitter:
/// `cooldown_ms * backoff^(trips - 1)`, capped at `max_cooldown_ms`.
pub fn nominal_cooldown_ms(health: &HealthConfig, trips: u64) -> u64 {
    let exponent = u32::try_from(trips.saturating_sub(1)).unwrap_or(u32::MAX);
    u64::from(health.backoff)
        .checked_pow(exponent)
        .and_then(|factor| factor.checked_mul(health.cooldown_ms))
        .map_or(health.max_cooldown_ms, |ms| ms.min(health.max_cooldown_ms))
}

/// The cooldown of the `trips`-th trip with jitter applied, given a draw in `[-1, 1]`
/// (made by the service, so that the stores stay deterministic): the nominal cooldown
/// spread by up to `jitter_percent` either way, at least 1 ms and at most
/// `max_cooldown_ms`. Computed on doubles in the order the Lua twin computes it, so that
/// both give the same millisecond.
pub fn cooldown_ms(health: &HealthConfig, trips: u64, draw: f64) -> u64 {
    let nominal = nominal_cooldown_ms(health, trips) as f64;
    let spread = f64::from(health.jitter_percent) / 100.0 * draw.clamp(-1.0, 1.0);
    // Exact for every value in range: cooldowns stay far below 2^53.
    let jittered = (nominal * (1.0 + spread)).floor() as u64;
    jittered.clamp(1, health.max_cooldown_ms)
}

/// The length of the `bans`-th ban in a row of one member for one target (1 for the
/// first): `target_ban_ms * 2^(bans - 1)`, capped at `max_cooldown_ms`. No jitter: bans of
/// one member for one target never come in a crowd.
pub fn ban_ms(health: &HealthConfig, bans: u64) -> u64 {
    let exponent = u32::try_from(bans.saturating_sub(1)).unwrap_or(u32::MAX);
    2u64.checked_pow(exponent)
        .and_then(|factor| factor.checked_mul(health.target_ban_ms))
        .map_or(health.max_cooldown_ms, |ms| ms.min(health.max_cooldown_ms))
}

/// The count a returning member restarts at, given the count it kept while it was away
/// and the minimum among the members that were eligible when it came back (none: it comes
/// back to an empty eligible set and keeps its count, but under `zero`).
pub fn restored_count(policy: RestorePolicy, kept: u64, eligible_minimum: Option<u64>) -> u64 {
    match (policy, eligible_minimum) {
        (RestorePolicy::Zero, _) => 0,
        (RestorePolicy::Minimum, Some(min)) => min,
        (RestorePolicy::History, Some(min)) => kept.max(min),
        (RestorePolicy::Minimum | RestorePolicy::History, None) => kept,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(json: &str) -> HealthConfig {
        serde_json::from_str(json).expect("a valid health config")
    }

    #[test]
    fn cooldowns_multiply_by_the_backoff_up_to_the_maximum() {
        let config = health(r#"{"cooldown_ms": 1000, "max_cooldown_ms": 5000}"#);
        let nominal: Vec<u64> = (1..=5).map(|n| nominal_cooldown_ms(&config, n)).collect();
        assert_eq!(nominal, [1000, 2000, 4000, 5000, 5000]);
        assert_eq!(nominal_cooldown_ms(&config, u64::MAX), 5000);
    }

    #[test]
    fn target_bans_double_on_each_repeat_up_to_the_longest_cooldown() {
        let config = health(r#"{"target_ban_ms": 1000, "max_cooldown_ms": 5000}"#);
        let bans: Vec<u64> = (1..=5).map(|n| ban_ms(&config, n)).collect();
        assert_eq!(bans, [1000, 2000, 4000, 5000, 5000]);
        assert_eq!(ban_ms(&config, u64::MAX), 5000);
        assert_eq!(ban_ms(&HealthConfig::default(), 1), 600_000);
    }

    #[test]
    fn jitter_stays_within_its_percentage_and_under_the_maximum() {
        let config = health(r#"{"cooldown_ms": 1000, "max_cooldown_ms": 1050}"#);
        assert_eq!(cooldown_ms(&config, 1, -1.0), 900);
        assert_eq!(cooldown_ms(&config, 1, 0.0), 1000);
        assert_eq!(cooldown_ms(&config, 1, 0.5), 1050);
        assert_eq!(cooldown_ms(&config, 1, 1.0), 1050);
    }

    #[test]
    fn a_maximum_below_the_cooldown_caps_every_cooldown() {
        let config =
            health(r#"{"cooldown_ms": 5000, "max_cooldown_ms": 4000, "jitter_percent": 0}"#);
        assert_eq!(cooldown_ms(&config, 1, 0.0), 4000);
        assert_eq!(cooldown_ms(&config, 3, 0.0), 4000);
    }

    #[test]
    fn each_restore_policy_gives_its_count() {
        use RestorePolicy::{History, Minimum, Zero};
        assert_eq!(restored_count(Minimum, 3, Some(10)), 10);
        assert_eq!(restored_count(Minimum, 30, Some(10)), 10);
        assert_eq!(restored_count(Minimum, 30, None), 30);
        assert_eq!(restored_count(History, 3, Some(10)), 10);
        assert_eq!(restored_count(History, 30, Some(10)), 30);
        assert_eq!(restored_count(History, 30, None), 30);
        assert_eq!(restored_count(Zero, 30, Some(10)), 0);
        assert_eq!(restored_count(Zero, 30, None), 0);
    }
}
