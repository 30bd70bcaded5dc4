//! `PruneConfig`: when a pool removes members by itself (`prune` in its configuration).

use serde::{Deserialize, Serialize};

/// The largest `after_failed_checks` and `absent_from_source_fetches`.
pub const MAX_PRUNE_COUNT: u64 = 1_000;

/// When members are removed by the pool itself. A member with live leases is removed once
/// they have ended, never before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "super::object::Object<RawPrune>")]
pub struct PruneConfig {
    /// Removes a member whose last `n` active checks all failed (1 to 1,000; none: never).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_failed_checks: Option<u64>,
    /// Removes a member that came from a source and was absent from that source's last
    /// `k` successful fetches (1 to 1,000; none: never).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub absent_from_source_fetches: Option<u64>,
    /// Whether members added by hand (`POST /pools/{pool}/members`) are pruned after failed
    /// checks too (default `false`: they never are).
    pub manual: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrune {
    #[serde(default)]
    after_failed_checks: Option<u64>,
    #[serde(default)]
    absent_from_source_fetches: Option<u64>,
    #[serde(default)]
    manual: bool,
}

/// Why a prune configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("prune.after_failed_checks and prune.absent_from_source_fetches are 1 to 1000")]
pub struct InvalidPrune;

impl TryFrom<super::object::Object<RawPrune>> for PruneConfig {
    type Error = InvalidPrune;

    fn try_from(
        super::object::Object(raw): super::object::Object<RawPrune>,
    ) -> Result<Self, InvalidPrune> {
        let in_range = |n: Option<u64>| n.is_none_or(|n| (1..=MAX_PRUNE_COUNT).contains(&n));
        if !in_range(raw.after_failed_checks) || !in_range(raw.absent_from_source_fetches) {
            return Err(InvalidPrune);
        }
        Ok(Self {
            after_failed_checks: raw.after_failed_checks,
            absent_from_source_fetches: raw.absent_from_source_fetches,
            manual: raw.manual,
        })
    }
}

impl PruneConfig {
    /// The form the Redis scripts read: `"<n> <k> <manual>"`, 0 standing for none.
    pub fn script_arg(&self) -> String {
        format!(
            "{} {} {}",
            self.after_failed_checks.unwrap_or(0),
            self.absent_from_source_fetches.unwrap_or(0),
            u8::from(self.manual)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_1_to_1000_and_left_out_ones_never_prune() {
        let parsed: PruneConfig =
            serde_json::from_str(r#"{"after_failed_checks": 3}"#).expect("valid");
        assert_eq!(
            parsed,
            PruneConfig {
                after_failed_checks: Some(3),
                absent_from_source_fetches: None,
                manual: false
            }
        );
        assert_eq!(parsed.script_arg(), "3 0 0");
        for bad in [
            r#"{"after_failed_checks": 0}"#,
            r#"{"absent_from_source_fetches": 1001}"#,
            r#"{"after": 3}"#,
            // An array is not read into the fields by position.
            "[3, null, false]",
        ] {
            assert!(serde_json::from_str::<PruneConfig>(bad).is_err(), "{bad}");
        }
    }
}
