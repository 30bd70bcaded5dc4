//! Pool routes: `GET /pools`, `PUT`, `GET` and `DELETE /pools/{pool}` (all admin).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::auth::Admin;
use super::error::ApiError;
use super::extract::{JsonOrDefault, PoolPath};
use crate::domain::{Policy, PoolConfig};
use crate::store::PutPool;

/// Creates the pool (201) or replaces its configuration (200); fields left out take their
/// defaults. Echoes the configuration with defaults filled in. 409 when the policy would
/// change on a pool that has members.
pub async fn put_pool(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    JsonOrDefault(config): JsonOrDefault<PoolConfig>,
) -> Result<Response, ApiError> {
    // A cap on a pool that gives no leases would promise exclusivity it cannot keep.
    if config.policy == Policy::LeastUsed && config.max_in_flight.is_some() {
        return Err(ApiError::InvalidRequest(
            "max_in_flight applies to least-in-flight pools only".to_owned(),
        ));
    }
    let status = match state.store.put_pool(&pool, &config).await? {
        PutPool::Created => StatusCode::CREATED,
        PutPool::Updated => StatusCode::OK,
    };
    Ok((
        status,
        axum::Json(json!({ "pool": pool, "config": config })),
    )
        .into_response())
}

/// One pool: configuration and numbers.
pub async fn get_pool(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
) -> Result<Response, ApiError> {
    let info = state.store.pool(&pool).await?;
    Ok(axum::Json(info).into_response())
}

/// Every pool with its numbers, ordered by id.
pub async fn list_pools(_: Admin, State(state): State<AppState>) -> Result<Response, ApiError> {
    let pools = state.store.pools().await?;
    Ok(axum::Json(json!({ "pools": pools })).into_response())
}

/// Removes the pool and all its state; assigns on it answer 404 from then on.
pub async fn delete_pool(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
) -> Result<StatusCode, ApiError> {
    state.store.delete_pool(&pool).await?;
    Ok(StatusCode::NO_CONTENT)
}
