//! Lease routes (worker): `POST /pools/{pool}/leases/{lease}/release` and `.../renew`.
//!
//! Leases exist on least-in-flight pools only; on a least-used pool every lease id is
//! unknown. Both routes answer 404 `lease_not_found`, changing nothing, for a lease that
//! is unknown, already released, expired, or ended with its member: a worker that retries
//! a release after a lost answer can never free a place twice.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::Worker;
use super::error::ApiError;
use super::extract::{JsonBody, JsonOrDefault, LeasePath};
use super::log::set_outcome;
use crate::domain::LeaseTtl;

/// Optional body of a renewal: a lease ttl other than the pool's `lease_ttl_ms`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseBody {
    /// 100 ms to 24 h; out of range answers 400.
    #[serde(default)]
    pub ttl_ms: Option<LeaseTtl>,
}

/// Ends a live lease: 204, after which its member has one live lease less.
pub async fn release(
    _: Worker,
    State(state): State<AppState>,
    LeasePath(pool, lease): LeasePath,
) -> Result<Response, ApiError> {
    state.store.release(&pool, &lease).await?;
    let response = StatusCode::NO_CONTENT.into_response();
    set_outcome("released");
    Ok(response)
}

/// Extends a live lease to `ttl_ms` (the pool's `lease_ttl_ms` by default) from now: 200
/// with the new expiry.
pub async fn renew(
    _: Worker,
    State(state): State<AppState>,
    LeasePath(pool, lease): LeasePath,
    JsonOrDefault(body): JsonOrDefault<LeaseBody>,
) -> Result<Response, ApiError> {
    let renewed = state.store.renew(&pool, &lease, body.ttl_ms).await?;
    let response = axum::Json(json!({
        "pool": pool,
        "proxy": renewed.member,
        "lease": renewed.lease,
    }))
    .into_response();
    set_outcome("renewed");
    Ok(response)
}

impl JsonBody for LeaseBody {}
