//! A pool's pacing (`pacing` in its configuration): how soon a member may be handed out
//! again, so that a site never sees one IP more often than its rate limit allows.

use serde::{Deserialize, Serialize};

/// The longest interval a pool may ask for, in milliseconds (one hour): every pacing entry
/// lives at most this long, which bounds pacing memory by what is live.
pub const MAX_PACING_INTERVAL_MS: u64 = 3_600_000;

/// A member handed out at `t` (the store's clock) is not handed out again before
/// `t + min_interval_ms`: by any assign when `per_target` is false, by assigns naming the
/// same target when it is true (assigns without a target are then not paced).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "super::object::Object<RawPacing>")]
pub struct Pacing {
    /// The interval, in milliseconds (1 to 3,600,000).
    pub min_interval_ms: u64,
    /// Whether the interval runs per (member, target) rather than per member.
    pub per_target: bool,
}

impl Pacing {
    /// The pacing as one script argument: `"<min_interval_ms> <0|1>"`.
    pub fn script_arg(&self) -> String {
        format!("{} {}", self.min_interval_ms, u8::from(self.per_target))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPacing {
    min_interval_ms: u64,
    #[serde(default)]
    per_target: bool,
}

/// Why a `pacing` configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pacing: min_interval_ms is 1 to 3600000")]
pub struct InvalidPacing;

impl TryFrom<super::object::Object<RawPacing>> for Pacing {
    type Error = InvalidPacing;

    fn try_from(
        super::object::Object(raw): super::object::Object<RawPacing>,
    ) -> Result<Self, InvalidPacing> {
        if !(1..=MAX_PACING_INTERVAL_MS).contains(&raw.min_interval_ms) {
            return Err(InvalidPacing);
        }
        Ok(Self {
            min_interval_ms: raw.min_interval_ms,
            per_target: raw.per_target,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_written_as_an_array_is_refused_rather_than_read_by_position() {
        assert!(serde_json::from_str::<Pacing>("[2000, true]").is_err());
        assert!(serde_json::from_str::<Pacing>("[2000]").is_err());
    }

    #[test]
    fn pacing_takes_an_interval_of_up_to_an_hour_and_is_pool_wide_by_default() {
        let pacing: Pacing = serde_json::from_str(r#"{"min_interval_ms": 2000}"#).expect("valid");
        assert_eq!(
            pacing,
            Pacing {
                min_interval_ms: 2000,
                per_target: false
            }
        );
        assert_eq!(pacing.script_arg(), "2000 0");
        for refused in [
            r#"{"min_interval_ms": 0}"#,
            r#"{"min_interval_ms": 3600001}"#,
            r#"{"per_target": true}"#,
            r#"{"min_interval_ms": 5, "per_site": true}"#,
        ] {
            assert!(
                serde_json::from_str::<Pacing>(refused).is_err(),
                "{refused}"
            );
        }
    }
}
