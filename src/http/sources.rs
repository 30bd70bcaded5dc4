//! `GET /pools/{pool}/sources` (admin): each of the pool's sources with its schedule and
//! its last fetch.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::AppState;
use super::auth::Admin;
use super::error::ApiError;
use super::extract::PoolPath;
use crate::domain::{Scheme, SourceFormat, Timestamp};
use crate::store::SourceFetch;

/// One source as listed.
#[derive(Debug, Serialize)]
struct SourceView {
    url: String,
    interval_ms: u64,
    format: SourceFormat,
    default_scheme: Scheme,
    /// When it is next fetched; `null` until the fetcher has first seen it.
    next_fetch_at: Option<Timestamp>,
    /// Failed fetches since the last successful one.
    failures: u64,
    /// Successful fetches so far.
    successes: u64,
    /// Its last fetch, `null` before the first.
    last_fetch: Option<SourceFetch>,
}

/// The pool's sources in configuration order, each with what the store keeps about it.
pub async fn list_sources(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
) -> Result<Response, ApiError> {
    let config = state.store.pool(&pool).await?.config;
    let mut states = state.store.source_states(&pool).await?;
    let sources: Vec<SourceView> = config
        .sources
        .into_iter()
        .map(|source| {
            let kept = states.remove(&source.url);
            SourceView {
                next_fetch_at: kept.as_ref().map(|kept| kept.next_fetch_at),
                failures: kept.as_ref().map_or(0, |kept| kept.failures),
                successes: kept.as_ref().map_or(0, |kept| kept.successes),
                last_fetch: kept.and_then(|kept| kept.last_fetch),
                url: source.url,
                interval_ms: source.interval_ms,
                format: source.format,
                default_scheme: source.default_scheme,
            }
        })
        .collect();
    Ok(axum::Json(serde_json::json!({ "pool": pool, "sources": sources })).into_response())
}
