//! `POST /pools/{pool}/assign`: the hot path.

use axum::extract::State;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::auth::Worker;
use super::error::ApiError;
use super::extract::{JsonBody, JsonOrDefault, PoolPath};
use super::log::Outcome;
use crate::domain::{LabelFilter, LeaseTtl, MemberId, PoolId, Target};
use crate::store::{AssignRequest, Assignment, Lease, MAX_LABEL_CHECKS, StoreError};

/// Optional body of an assign; every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssignBody {
    /// A lease ttl other than the pool's (100 ms to 24 h; least-in-flight pools only).
    #[serde(default)]
    ttl_ms: Option<LeaseTtl>,
    /// `{"key": "value" | ["v1", "v2"]}`: only members whose labels match, for every key.
    #[serde(default)]
    labels: Option<serde_json::Value>,
    /// The host the worker will contact: members banned for it are skipped.
    #[serde(default)]
    target: Option<serde_json::Value>,
}

impl AssignBody {
    /// The store's request, labels parsed.
    fn request(self) -> Result<AssignRequest, ApiError> {
        let labels = match &self.labels {
            Some(value) => LabelFilter::from_json("labels", value)
                .map_err(|e| ApiError::InvalidRequest(e.to_string()))?,
            None => LabelFilter::default(),
        };
        let target = self
            .target
            .as_ref()
            .map(|value| Target::from_json("target", value))
            .transpose()
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
        Ok(AssignRequest {
            ttl: self.ttl_ms,
            labels,
            target,
        })
    }
}

#[derive(Serialize)]
struct Assigned<'a> {
    pool: &'a PoolId,
    proxy: &'a MemberId,
    assignments: u64,
}

#[derive(Serialize)]
struct Leased<'a> {
    pool: &'a PoolId,
    proxy: &'a MemberId,
    in_flight: u64,
    assignments: u64,
    lease: &'a Lease,
}

/// Hands out a member under the pool's policy: 200 with it (and, on a least-in-flight
/// pool, its lease), 204 when the pool has no member to give (the worker skips its
/// request; `Retry-After` says when the first member cooling down comes back, if any),
/// 404 when there is no pool. The body is optional: `{"ttl_ms": n}` asks for a
/// lease ttl other than the pool's (ignored by least-used pools, which give no leases);
/// `{"labels": {...}}` chooses among the members whose labels match only;
/// `{"target": "host"}` skips members banned for that host.
pub async fn assign(
    _: Worker,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    JsonOrDefault(body): JsonOrDefault<AssignBody>,
) -> Result<Response, ApiError> {
    let request = body.request()?;
    let assignment = match state.store.assign(&pool, &request).await {
        Err(StoreError::FilterTooCostly) => {
            return Err(ApiError::InvalidRequest(format!(
                "labels: this filter would check more than {MAX_LABEL_CHECKS} members; \
                 filter on one key, or give the members a label that combines the keys"
            )));
        }
        other => other?,
    };
    let (outcome, mut response) = match assignment {
        Assignment::Assigned {
            member,
            assignments,
        } => (
            "assigned",
            axum::Json(Assigned {
                pool: &pool,
                proxy: &member,
                assignments,
            })
            .into_response(),
        ),
        Assignment::Leased {
            member,
            assignments,
            in_flight,
            lease,
        } => (
            "leased",
            axum::Json(Leased {
                pool: &pool,
                proxy: &member,
                in_flight,
                assignments,
                lease: &lease,
            })
            .into_response(),
        ),
        Assignment::Empty { next_return } => ("empty", no_content(next_return)),
    };
    response.extensions_mut().insert(Outcome(outcome));
    Ok(response)
}

/// The exact wait of a 204, in milliseconds, next to `Retry-After`'s whole seconds.
const RETRY_AFTER_MS: header::HeaderName = header::HeaderName::from_static("retry-after-ms");

/// A 204, with `Retry-After` in whole seconds rounded up (at least 1) and `Retry-After-Ms`
/// exact, when something becomes eligible for the request by itself (a cooldown or a ban
/// ending), so that workers wait for it instead of polling.
fn no_content(next_return: Option<Duration>) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(wait) = next_return {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let headers = response.headers_mut();
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(ms.div_ceil(1000).max(1)),
        );
        headers.insert(RETRY_AFTER_MS, HeaderValue::from(ms));
    }
    response
}

impl JsonBody for AssignBody {}
