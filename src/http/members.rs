//! Member routes (all admin): seeding, listing, disabling, enabling and removing members.
//!
//! Member ids travel in JSON bodies, never in paths: real ids hold `:` and `/`. Each id is
//! parsed on its own; an invalid one is reported back with its reason and the rest of the
//! call goes ahead. Ids repeated within one call count once.

use std::collections::HashSet;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::AppState;
use super::auth::Admin;
use super::error::ApiError;
use super::extract::{Json, PoolPath, Query};
use crate::domain::{MemberId, RestorePolicy};
use crate::store::{Cursor, Seed, StateFilter};

/// Most members one call may name.
pub const MAX_MEMBERS_PER_CALL: usize = 10_000;
/// Longest reason accepted when disabling, in bytes.
pub const MAX_REASON_LEN: usize = 256;
/// Page size of a member listing when none is asked for.
pub const DEFAULT_PAGE: usize = 100;
/// Largest page of a member listing.
pub const MAX_PAGE: usize = 1_000;

/// A member id the call could not accept, and why.
#[derive(Debug, Serialize)]
pub struct Rejected {
    member: String,
    reason: &'static str,
}

impl Rejected {
    /// `text` was refused for `reason`.
    pub fn new(member: String, reason: crate::domain::InvalidMemberId) -> Self {
        Self {
            member,
            reason: reason.code(),
        }
    }
}

/// Parses the ids of one call, keeping the first of any repeated id.
fn parse_members(raw: Vec<String>) -> Result<(Vec<MemberId>, Vec<Rejected>), ApiError> {
    if raw.len() > MAX_MEMBERS_PER_CALL {
        return Err(ApiError::TooManyMembers(MAX_MEMBERS_PER_CALL));
    }
    let mut seen = HashSet::with_capacity(raw.len());
    let mut members = Vec::with_capacity(raw.len());
    let mut rejected = Vec::new();
    for text in raw {
        match MemberId::parse(&text) {
            Ok(member) => {
                if seen.insert(member.clone()) {
                    members.push(member);
                }
            }
            Err(reason) => rejected.push(Rejected::new(text, reason)),
        }
    }
    Ok((members, rejected))
}

/// Body of `POST /pools/{pool}/members`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedBody {
    members: Vec<String>,
    #[serde(default)]
    assignments: Option<u64>,
    #[serde(default)]
    reset: bool,
}

/// Adds members. New ones start at `assignments` if given, else at the pool's
/// `start_assignments`, else at the current minimum among eligible members.
pub async fn add_members(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    Json(body): Json<SeedBody>,
) -> Result<Response, ApiError> {
    let (members, rejected) = parse_members(body.members)?;
    let seed = Seed {
        members,
        assignments: body.assignments,
        reset: body.reset,
    };
    let report = state.store.add_members(&pool, &seed).await?;
    Ok(axum::Json(json!({
        "pool": pool,
        "added": report.added,
        "existing": report.existing,
        "rejected": rejected,
        "start_assignments": report.start_assignments,
    }))
    .into_response())
}

/// Query of `GET /pools/{pool}/members`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    cursor: Option<String>,
}

fn parse_cursor(text: &str) -> Option<Cursor> {
    let (eligible, ineligible) = text.split_once('.')?;
    Some(Cursor {
        eligible: eligible.parse().ok()?,
        ineligible: ineligible.parse().ok()?,
    })
}

fn format_cursor(cursor: Cursor) -> String {
    format!("{}.{}", cursor.eligible, cursor.ineligible)
}

/// Lists members ordered by assignments, then id, one page at a time.
pub async fn list_members(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let filter = match query.state.as_deref() {
        None | Some("all") => StateFilter::All,
        Some("eligible") => StateFilter::Eligible,
        Some("ineligible") => StateFilter::Ineligible,
        Some(_) => {
            return Err(ApiError::InvalidQuery(
                "state is one of eligible, ineligible, all".to_owned(),
            ));
        }
    };
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::InvalidQuery(format!(
            "limit is between 1 and {MAX_PAGE}"
        )));
    }
    let cursor = match query.cursor.as_deref() {
        None | Some("") => Cursor::default(),
        Some(text) => parse_cursor(text).ok_or_else(|| {
            ApiError::InvalidQuery("cursor is not one this service issued".to_owned())
        })?,
    };
    let page = state.store.members(&pool, filter, limit, cursor).await?;
    Ok(axum::Json(json!({
        "pool": pool,
        "members": page.members,
        "next_cursor": page.next.map(format_cursor),
    }))
    .into_response())
}

/// Body of `POST /pools/{pool}/members/disable`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisableBody {
    members: Vec<String>,
    #[serde(default)]
    reason: Option<String>,
}

/// The reason recorded when an operator gives none.
pub const DEFAULT_DISABLE_REASON: &str = "disabled";

/// Takes members out of the eligible set, keeping their counts, the reason and the time.
pub async fn disable_members(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    Json(body): Json<DisableBody>,
) -> Result<Response, ApiError> {
    let reason = body
        .reason
        .unwrap_or_else(|| DEFAULT_DISABLE_REASON.to_owned());
    if reason.is_empty() || reason.len() > MAX_REASON_LEN {
        return Err(ApiError::InvalidRequest(format!(
            "reason is 1 to {MAX_REASON_LEN} bytes"
        )));
    }
    let (members, rejected) = parse_members(body.members)?;
    let report = state
        .store
        .disable_members(&pool, &members, &reason)
        .await?;
    Ok(axum::Json(json!({
        "pool": pool,
        "disabled": report.disabled,
        "already_ineligible": report.already_ineligible,
        "unknown": report.unknown,
        "rejected": rejected,
    }))
    .into_response())
}

/// Body of `POST /pools/{pool}/members/enable`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnableBody {
    members: Vec<String>,
    #[serde(default)]
    restore: Option<RestorePolicy>,
}

/// Returns members to the eligible set under the pool's restore policy (or the one given).
pub async fn enable_members(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    Json(body): Json<EnableBody>,
) -> Result<Response, ApiError> {
    let (members, rejected) = parse_members(body.members)?;
    let report = state
        .store
        .enable_members(&pool, &members, body.restore)
        .await?;
    Ok(axum::Json(json!({
        "pool": pool,
        "restore": report.restore,
        "enabled": report.enabled,
        "already_eligible": report.already_eligible,
        "unknown": report.unknown,
        "rejected": rejected,
    }))
    .into_response())
}

/// Body of `POST /pools/{pool}/members/remove`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveBody {
    members: Vec<String>,
}

/// Forgets members entirely, eligible or not, history included.
pub async fn remove_members(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    Json(body): Json<RemoveBody>,
) -> Result<Response, ApiError> {
    let (members, rejected) = parse_members(body.members)?;
    let report = state.store.remove_members(&pool, &members).await?;
    Ok(axum::Json(json!({
        "pool": pool,
        "removed": report.removed,
        "unknown": report.unknown,
        "rejected": rejected,
    }))
    .into_response())
}
