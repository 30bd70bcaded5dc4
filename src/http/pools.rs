//! Pool routes: `GET /pools`, `PUT`, `PATCH`, `GET` and `DELETE /pools/{pool}` (all
//! admin).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::AppState;
use super::auth::Admin;
use super::error::ApiError;
use super::extract::{
    JsonBody, JsonOrDefault, MergePatch, PoolPath, Query, from_document, merge_patch,
};
use crate::domain::{Policy, PoolConfig, PoolId};
use crate::store::{PoolInfo, PutPool};

/// Creates the pool (201) or replaces its configuration (200); fields left out take their
/// defaults. Echoes the configuration with defaults filled in. 409 when the policy would
/// change on a pool that has members.
pub async fn put_pool(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    JsonOrDefault(config): JsonOrDefault<PoolConfig>,
) -> Result<Response, ApiError> {
    check(&state, &config)?;
    let status = match state.store.put_pool(&pool, &config).await? {
        PutPool::Created => StatusCode::CREATED,
        PutPool::Updated => StatusCode::OK,
    };
    Ok(echo(status, &pool, &config))
}

/// Changes only the fields the merge patch (RFC 7396) gives; `null` puts a field back to
/// its default. The result is read and checked as a `PUT` body is, and refused whole
/// (nothing changes) when `PUT` would refuse it. 404 when the pool does not exist: a patch
/// never creates one.
///
/// The read and the write are two store calls: a `PUT` or `PATCH` landing between them is
/// overwritten by this one, as one `PUT` overwrites another.
pub async fn patch_pool(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    MergePatch(patch): MergePatch,
) -> Result<Response, ApiError> {
    let current = state.store.pool(&pool).await?.config;
    // The stored configuration with its defaults filled in: a key the patch removes is
    // then filled in again by its default when the result is read. Infallible: a
    // configuration holds no map with keys other than strings, and no serializer of its
    // parts fails (the `PUT` echo writes the same value).
    let mut document =
        serde_json::to_value(&current).expect("a pool configuration serialises to JSON");
    merge_patch(&mut document, Value::Object(patch));
    let config: PoolConfig = from_document(document)?;
    check(&state, &config)?;
    state.store.put_pool(&pool, &config).await?;
    Ok(echo(StatusCode::OK, &pool, &config))
}

/// What `PUT` and `PATCH` refuse in a configuration that reads well.
fn check(state: &AppState, config: &PoolConfig) -> Result<(), ApiError> {
    // A cap on a pool that gives no leases would promise exclusivity it cannot keep.
    if config.policy == Policy::LeastUsed && config.max_in_flight.is_some() {
        return Err(ApiError::InvalidRequest(
            "max_in_flight applies to least-in-flight pools only".to_owned(),
        ));
    }
    // Checked here rather than when the configuration is read: the operator may change
    // the minimum, and a stored pool must stay readable whatever it is now.
    if let Some(source) = config
        .sources
        .iter()
        .find(|source| source.interval_ms < state.source_min_interval_ms)
    {
        return Err(ApiError::InvalidRequest(format!(
            "sources[].interval_ms is at least {} on this service ({} has {})",
            state.source_min_interval_ms,
            crate::checker::masked_url(&source.url),
            source.interval_ms
        )));
    }
    Ok(())
}

/// The answer of `PUT` and `PATCH`: the pool and its configuration, defaults filled in.
fn echo(status: StatusCode, pool: &PoolId, config: &PoolConfig) -> Response {
    (
        status,
        axum::Json(json!({ "pool": pool, "config": config })),
    )
        .into_response()
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

/// Largest page of a pool listing, and the page size when none is asked for.
pub const MAX_POOL_PAGE: usize = 1_000;

/// Query of `GET /pools`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolListQuery {
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
}

/// Pools with their numbers, ordered by id, one page at a time (only pools whose id
/// starts with `prefix`, when given). The cursor is the last pool of the page before.
pub async fn list_pools(
    _: Admin,
    State(state): State<AppState>,
    Query(query): Query<PoolListQuery>,
) -> Result<Response, ApiError> {
    let limit = query.limit.unwrap_or(MAX_POOL_PAGE);
    if !(1..=MAX_POOL_PAGE).contains(&limit) {
        return Err(ApiError::InvalidQuery(format!(
            "limit is between 1 and {MAX_POOL_PAGE}"
        )));
    }
    let after = match query.cursor.as_deref() {
        None | Some("") => None,
        Some(text) => Some(PoolId::parse(text).map_err(|_| {
            ApiError::InvalidQuery("cursor is not one this service issued".to_owned())
        })?),
    };
    // A prefix is the start of a pool id: the same characters, possibly none.
    let prefix = query.prefix.unwrap_or_default();
    if !prefix.is_empty() && PoolId::parse(&prefix).is_err() {
        return Err(ApiError::InvalidQuery(
            "prefix is the start of a pool id".to_owned(),
        ));
    }
    let page = state
        .store
        .pool_page(&prefix, after.as_ref(), limit)
        .await?;
    // Written straight from the page: a page of 1,000 pools built as a `serde_json::Value`
    // first cost a tree of maps as large as the answer, built and dropped for nothing.
    Ok(axum::Json(PoolListing {
        pools: &page.pools,
        next_cursor: page.next.as_ref(),
    })
    .into_response())
}

/// The answer of `GET /pools`.
#[derive(Serialize)]
struct PoolListing<'a> {
    pools: &'a [PoolInfo],
    next_cursor: Option<&'a PoolId>,
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

impl JsonBody for crate::domain::PoolConfig {}
