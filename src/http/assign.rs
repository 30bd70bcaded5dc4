//! `POST /pools/{pool}/assign`: the hot path.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::AppState;
use super::auth::Worker;
use super::error::ApiError;
use super::extract::PoolPath;
use super::log::Outcome;
use crate::domain::{MemberId, PoolId};
use crate::store::Assignment;

#[derive(Serialize)]
struct Assigned<'a> {
    pool: &'a PoolId,
    proxy: &'a MemberId,
    assignments: u64,
}

/// Hands out the eligible member with the fewest assignments: 200 with it, 204 when the
/// pool has no eligible member (the worker skips its request), 404 when there is no pool.
pub async fn assign(
    _: Worker,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
) -> Result<Response, ApiError> {
    let mut response = match state.store.assign(&pool).await? {
        Assignment::Assigned {
            member,
            assignments,
        } => axum::Json(Assigned {
            pool: &pool,
            proxy: &member,
            assignments,
        })
        .into_response(),
        Assignment::Empty => StatusCode::NO_CONTENT.into_response(),
    };
    let outcome = if response.status() == StatusCode::OK {
        "assigned"
    } else {
        "empty"
    };
    response.extensions_mut().insert(Outcome(outcome));
    Ok(response)
}
