//! `done` in `POST /pools/{pool}/assign`: how the worker's previous use of the pool ended
//! (an outcome report, a lease to release, or both), applied by the store in the same
//! atomic step as the new pick, and what it did, as the assign's answer says it.

use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::members::named_member;
use crate::domain::{LeaseId, MemberId, OutcomeResult, PoolId, Target, Timestamp};
use crate::store::{Done, DoneReport, DoneSummary, Effect};

/// `"done": {"proxy", "result", "status"?, "target"?}` and, on a least-in-flight pool,
/// `"lease"` (with the result optional; without `proxy` the report is about the lease's
/// member).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoneBody {
    /// The member the report is about.
    #[serde(default)]
    proxy: Option<String>,
    /// What the request through it saw.
    #[serde(default)]
    result: Option<OutcomeResult>,
    /// The HTTP status the worker saw, if any: logged when the member trips.
    #[serde(default)]
    status: Option<u16>,
    /// The host the request went to: a `blocked` report bans the member for it only.
    #[serde(default)]
    target: Option<serde_json::Value>,
    /// The lease of the request, released.
    #[serde(default)]
    lease: Option<String>,
    /// How long the request took, in milliseconds: counted in the member's latency.
    #[serde(default)]
    latency_ms: Option<serde_json::Value>,
}

/// A `done` checked at the edge: what the store applies, and what the edge already knows
/// the answer will say (ids that name nothing this service could have issued).
#[derive(Debug)]
pub struct ParsedDone {
    /// What the store applies.
    pub done: Done,
    /// The status the worker saw, for the log line of a trip.
    pub status: Option<u16>,
    /// The report names a member no pool can have (or only a lease id no pool can have):
    /// it is answered as unknown without reaching the store.
    unknown: bool,
}

impl DoneBody {
    /// Checks the shape: without a `lease`, both `proxy` and `result` (400 naming the one
    /// missing, or `done` when both are); a status out of range or an invalid target is a
    /// 400 too. A malformed
    /// member or lease id is not an error: it names nothing the pool has, and is answered
    /// as unknown (or not released), so that it never fails the assign it rides on.
    ///
    /// # Errors
    /// [`ApiError::InvalidRequest`] naming the field.
    pub fn parse(self) -> Result<ParsedDone, ApiError> {
        let invalid = |message: &str| Err(ApiError::InvalidRequest(message.to_owned()));
        // Two shapes: a report (`proxy` and `result`), or a lease (anything else optional).
        if self.lease.is_none() {
            match (&self.proxy, &self.result) {
                (Some(_), Some(_)) => {}
                (None, None) => {
                    return invalid(
                        "done: name the request's outcome (proxy and result), its lease, or both",
                    );
                }
                (Some(_), None) => {
                    return invalid("done.result: a report about a proxy needs its result");
                }
                (None, Some(_)) => {
                    return invalid(
                        "done.proxy: a result needs the proxy (or the lease) it is about",
                    );
                }
            }
        }
        if self.status.is_some_and(|s| !(100..=599).contains(&s)) {
            return invalid("done.status is an HTTP status from 100 to 599");
        }
        let target = self
            .target
            .as_ref()
            .map(|value| Target::from_json("done.target", value))
            .transpose()
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
        let latency_ms =
            super::outcomes::parse_latency("done.latency_ms", self.latency_ms.as_ref())?;
        let lease = self.lease.as_deref().and_then(|l| LeaseId::parse(l).ok());
        // `Some(None)`: a proxy was named but no pool can have it.
        let member = self.proxy.as_deref().map(|p| named_member(p).ok());
        let mut unknown = false;
        let report = match (self.result, member) {
            (None, _) => None,
            (Some(_), Some(None)) => {
                unknown = true;
                None
            }
            (Some(_), None) if lease.is_none() => {
                unknown = true;
                None
            }
            (Some(result), member) => Some(DoneReport {
                member: member.flatten(),
                result,
                target,
                latency_ms,
            }),
        };
        Ok(ParsedDone {
            done: Done { report, lease },
            status: self.status,
            unknown,
        })
    }
}

impl ParsedDone {
    /// The answer's `done`, from what the store did, logging a member it took out.
    pub fn view(&self, pool: &PoolId, summary: &DoneSummary) -> DoneView {
        if let Some(applied) = summary
            .applied
            .as_ref()
            .filter(|a| a.effect == Effect::Tripped)
        {
            tracing::info!(
                pool = pool.as_str(),
                proxy = %applied.member.masked(),
                result = applied.result.as_str(),
                status = self.status,
                consecutive_failures = applied.streak,
                "member cooling down after reported failures"
            );
        }
        let effect = match &summary.applied {
            Some(applied) => Some(DoneEffect::Applied(applied.effect)),
            None if summary.unknown || self.unknown => Some(DoneEffect::Unknown(Unknown)),
            None => None,
        };
        DoneView {
            proxy: summary.applied.as_ref().map(|a| a.member.clone()),
            effect,
            consecutive_failures: summary.applied.as_ref().map(|a| a.streak),
            banned_until: summary.applied.as_ref().and_then(|a| a.banned_until),
            released: summary.released,
        }
    }
}

/// What `done` did, as the assign answers it.
#[derive(Debug, Serialize)]
pub struct DoneView {
    /// The member the report was about (the lease's when it named none), when the pool
    /// has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    proxy: Option<MemberId>,
    /// What the report did, as `POST /pools/{pool}/outcomes` says it, or `unknown`; left
    /// out when `done` had no result.
    #[serde(skip_serializing_if = "Option::is_none")]
    effect: Option<DoneEffect>,
    /// The member's failure streak afterwards.
    #[serde(skip_serializing_if = "Option::is_none")]
    consecutive_failures: Option<u64>,
    /// For a `blocked` report with a target: until when the member is banned for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    banned_until: Option<Timestamp>,
    /// The lease was live and is now released (`false` for none, or one unknown, ended or
    /// expired, which changes nothing).
    released: bool,
}

/// A report's effect, or `unknown` for a member the pool does not have.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum DoneEffect {
    Applied(Effect),
    Unknown(Unknown),
}

/// Serialized as `"unknown"`.
#[derive(Debug)]
struct Unknown;

impl Serialize for Unknown {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("unknown")
    }
}
