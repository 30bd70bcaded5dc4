//! `GET /pools/{pool}/activity` (admin): the pool's assigns, 204s and reports per second
//! over the last minutes, as this replica counted them (see [`crate::monitoring`]).

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::auth::Admin;
use super::error::ApiError;
use super::extract::PoolPath;

/// The pool's activity, oldest second first, ending at the last second this replica's
/// sampler finished; 404 when there is no pool. A pool beyond `METRICS_MAX_POOLS` (or not
/// among `METRICS_POOLS`) is not counted here and answers `counted: false` with empty
/// series.
pub async fn activity(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
) -> Result<Response, ApiError> {
    // Only a pool the store has can take a place, as for the metrics.
    state.store.pool(&pool).await?;
    Ok(axum::Json(state.snapshot.activity(&pool)).into_response())
}
