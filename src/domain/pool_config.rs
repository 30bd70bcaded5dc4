//! A pool's configuration, as set with `PUT /pools/{pool}`.

use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};

use super::{GatewayRules, HealthConfig, LeaseTtl, Pacing, PruneConfig, SessionTtl, Source};

/// How assign chooses among a pool's eligible members. A pool's policy can only change
/// while it has no members: the two policies keep different state, and a member's state
/// under one means nothing under the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// The member with the fewest assignments so far (a cumulative counter that nothing
    /// lowers). An assignment is not a reservation and needs no completion.
    #[default]
    LeastUsed,
    /// The member with the fewest live leases right now (least connections). Every
    /// assignment is a lease that the worker releases when done, renews while it works,
    /// or that is reclaimed once its ttl has passed.
    LeastInFlight,
}

impl Policy {
    /// The name used in the API and in the Redis scripts.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LeastUsed => "least-used",
            Self::LeastInFlight => "least-in-flight",
        }
    }
}
use super::rules::Rules;

/// How a member that comes back to the eligible set is given its assignment count.
///
/// The choice matters because assignment always goes to the lowest count: a member that
/// comes back far below the others receives every assignment until it has caught up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestorePolicy {
    /// Join at the current minimum among eligible members (keep its own count when no
    /// member is eligible). A fair share from the first moment, and no flood.
    #[default]
    Minimum,
    /// `max(kept count, current minimum)`: never below the pack, and never ahead of it for
    /// having been away (the rule Linux CFS applies to a waking task).
    History,
    /// Literally zero. The returning member takes every assignment until it reaches the
    /// others' counts; only for operators who want exactly that.
    Zero,
}

impl RestorePolicy {
    /// The name used in the API and in the Redis scripts.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Minimum => "minimum",
            Self::History => "history",
            Self::Zero => "zero",
        }
    }

    /// Parses the name written by [`RestorePolicy::as_str`].
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "minimum" => Some(Self::Minimum),
            "history" => Some(Self::History),
            "zero" => Some(Self::Zero),
            _ => None,
        }
    }
}

/// A pool's configuration. Every field has a default, so `{}` is a complete configuration;
/// `PUT /pools/{pool}` replaces the whole configuration with the one it is given.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// How assign chooses a member.
    #[serde(default)]
    pub policy: Policy,
    /// How members returning to the eligible set are given their count.
    #[serde(default)]
    pub restore: RestorePolicy,
    /// The agreed starting count for new members. `None` means "the current minimum among
    /// eligible members", so that a newly added proxy is not flooded.
    #[serde(default, deserialize_with = "super::count::optional")]
    pub start_assignments: Option<u64>,
    /// How long a lease lives unless renewed, when the assign does not ask for another ttl
    /// (least-in-flight pools).
    #[serde(default)]
    pub lease_ttl_ms: LeaseTtl,
    /// The most live leases one member may hold (least-in-flight pools); `None` means no
    /// cap. A member at its cap is skipped; `1` gives exclusive use of a proxy.
    #[serde(default, deserialize_with = "super::count::optional_non_zero")]
    pub max_in_flight: Option<NonZeroU64>,
    /// Which candidates the pool accepts as members, on import and on seeding.
    #[serde(default, deserialize_with = "super::object::only")]
    pub rules: Rules,
    /// When reported or probed failures take members out, and when they come back.
    #[serde(default, deserialize_with = "super::object::only")]
    pub health: HealthConfig,
    /// Lists fetched on a schedule and imported through `rules` (at most 16; shown only
    /// when there are some).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::source::sources"
    )]
    pub sources: Vec<Source>,
    /// When members are removed by the pool itself (none: never; shown only when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune: Option<PruneConfig>,
    /// How soon a member may be handed out again (`null`, the default: no pacing; shown
    /// only when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pacing: Option<Pacing>,
    /// How long a sticky session lives after its last assign, when the assign does not ask
    /// for another ttl (1,000 ms to 24 h; 600,000 by default).
    #[serde(default)]
    pub session_ttl_ms: SessionTtl,
    /// How the gateway retries this pool's requests (`null`, the default: the service's
    /// `GATEWAY_ATTEMPTS` and no retry rules; shown only when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayRules>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_parts_written_as_arrays_are_refused_rather_than_read_by_position() {
        for body in [
            r#"{"rules": [["http"]]}"#,
            r#"{"rules": {"ports": [[[1, 2]]]}}"#,
            r#"{"health": [3]}"#,
            r#"{"health": {"check": ["http", "http://example.com/"]}}"#,
        ] {
            assert!(
                serde_json::from_str::<PoolConfig>(body).is_err(),
                "{body} was read by position"
            );
        }
    }

    #[test]
    fn an_empty_object_is_the_default_configuration_and_unknown_fields_are_refused() {
        let parsed: PoolConfig = serde_json::from_str("{}").expect("valid");
        assert_eq!(parsed, PoolConfig::default());
        assert!(serde_json::from_str::<PoolConfig>(r#"{"restor": "zero"}"#).is_err());
    }
}
