//! Session routes (worker): `DELETE /pools/{pool}/sessions/{session}` ends a sticky session
//! (sessions start and slide with assigns that name them, see `assign.rs`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::auth::Worker;
use super::error::ApiError;
use super::extract::SessionPath;
use super::log::set_outcome;

/// Ends a live session: 204, after which the next assign naming it picks afresh; 404
/// `session_not_found` when the pool has no such live session (so a repeated end is told
/// apart from the first).
pub async fn end_session(
    _: Worker,
    State(state): State<AppState>,
    SessionPath(pool, session): SessionPath,
) -> Result<Response, ApiError> {
    state.store.end_session(&pool, &session).await?;
    let response = StatusCode::NO_CONTENT.into_response();
    set_outcome("ended");
    Ok(response)
}
