//! Member routes (all admin): seeding, listing, disabling, enabling and removing members.
//!
//! Member ids travel in JSON bodies, never in paths: real ids hold `:` and `/`. Each id is
//! parsed on its own; an invalid one is reported back with its reason and the rest of the
//! call goes ahead. Ids that are proxy addresses are canonicalised first (`1.2.3.4:8080`
//! names `http://1.2.3.4:8080`), then ids repeated within one call count once. Seeding also
//! applies the pool's rules, exactly as an import does.

use std::collections::HashSet;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::AppState;
use super::auth::Admin;
use super::error::ApiError;
use super::extract::{Json, JsonBody, PoolPath, QueryWithLabels};
use crate::domain::{
    InvalidMemberId, LabelFilter, Labels, MemberId, Rejection, RestorePolicy, Target,
    canonical_member_id,
};
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
    /// What to change in the pool's rules to accept it, when a rule refused it (left out
    /// otherwise, so that the entries of an id refused for its spelling keep their shape).
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<&'static str>,
}

impl Rejected {
    /// `member` was refused for `reason` (a stable snake_case code).
    pub fn new(member: String, reason: &'static str) -> Self {
        Self {
            member,
            reason,
            hint: None,
        }
    }

    /// `member` was refused by the candidate parser or the pool's rules.
    fn by_rules(member: String, rejection: Rejection) -> Self {
        Self {
            member,
            reason: rejection.code(),
            hint: rejection.hint(),
        }
    }
}

/// Refuses calls that name more members than one call may.
pub(super) fn check_count(count: usize) -> Result<(), ApiError> {
    if count > MAX_MEMBERS_PER_CALL {
        Err(ApiError::TooManyMembers(MAX_MEMBERS_PER_CALL))
    } else {
        Ok(())
    }
}

/// Parses the ids of one call, each with what goes along with it, and passes each through
/// `admit` (canonicalisation, and the pool's rules when seeding), keeping the first of any
/// repeated id. The caller has checked the count with [`check_count`].
fn parse_members<T>(
    raw: Vec<(String, T)>,
    admit: impl Fn(MemberId) -> Result<MemberId, Rejection>,
) -> (Vec<(MemberId, T)>, Vec<Rejected>) {
    let mut seen = HashSet::with_capacity(raw.len());
    let mut members = Vec::with_capacity(raw.len());
    let mut rejected = Vec::new();
    for (text, along) in raw {
        let refused = match MemberId::parse(&text) {
            Ok(member) => match admit(member) {
                Ok(member) => {
                    if seen.insert(member.clone()) {
                        members.push((member, along));
                    }
                    continue;
                }
                Err(rejection) => Rejected::by_rules(text, rejection),
            },
            Err(invalid) => Rejected::new(text, invalid.code()),
        };
        rejected.push(refused);
    }
    (members, rejected)
}

/// One id naming an existing member: parsed, and canonicalised when it is an address, so
/// that `1.2.3.4:8080` finds `http://1.2.3.4:8080`. The error is the rejection reason.
pub(super) fn named_member(text: &str) -> Result<MemberId, &'static str> {
    MemberId::parse(text)
        .map(canonical_member_id)
        .map_err(InvalidMemberId::code)
}

/// Parses the ids of a call that names existing members: addresses are canonicalised, the
/// pool's rules are not applied (a member a stricter rule would now refuse must still be
/// reachable, to be taken out).
fn parse_named_members(raw: Vec<String>) -> Result<(Vec<MemberId>, Vec<Rejected>), ApiError> {
    check_count(raw.len())?;
    let raw = raw.into_iter().map(|text| (text, ())).collect();
    let (members, rejected) = parse_members(raw, |member| Ok(canonical_member_id(member)));
    Ok((
        members.into_iter().map(|(member, ())| member).collect(),
        rejected,
    ))
}

/// One entry of a seeding's `members`: an id, or `{"member": id, "labels": {...}}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum SeedEntry {
    /// Just the id.
    Id(String),
    /// The id with its labels.
    Labelled {
        /// The id.
        member: String,
        /// Its labels, replacing any it has (the call's when left out).
        #[serde(default)]
        labels: Option<serde_json::Value>,
    },
}

/// The labels of each entry of a seeding: its own, else the call's, else none given.
fn entry_labels(
    entries: Vec<SeedEntry>,
    call: Option<&serde_json::Value>,
) -> Result<Vec<(String, Option<Labels>)>, ApiError> {
    let invalid = |e: crate::domain::InvalidLabels| ApiError::InvalidRequest(e.to_string());
    let call = call
        .map(|value| Labels::from_json("labels", value))
        .transpose()
        .map_err(invalid)?;
    entries
        .into_iter()
        .enumerate()
        .map(|(i, entry)| match entry {
            SeedEntry::Id(text) => Ok((text, call.clone())),
            SeedEntry::Labelled {
                member,
                labels: None,
            } => Ok((member, call.clone())),
            SeedEntry::Labelled {
                member,
                labels: Some(labels),
            } => {
                let labels =
                    Labels::from_json(&format!("members[{i}].labels"), &labels).map_err(invalid)?;
                Ok((member, Some(labels)))
            }
        })
        .collect()
}

/// Body of `POST /pools/{pool}/members`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedBody {
    members: Vec<SeedEntry>,
    /// Labels for the entries that give none of their own.
    #[serde(default)]
    labels: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "crate::domain::count::optional")]
    assignments: Option<u64>,
    #[serde(default)]
    reset: bool,
}

/// Adds members. New ones start at `assignments` if given, else at the pool's
/// `start_assignments`, else at the current minimum among eligible members. Members are
/// checked against the pool's rules first; those refused, and new members beyond the
/// pool's `max_members` (`pool_full`, reported under their canonical id), are listed in
/// `rejected`.
pub async fn add_members(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    Json(body): Json<SeedBody>,
) -> Result<Response, ApiError> {
    // Checked before the rules are read, so an oversized call costs no store round trip.
    check_count(body.members.len())?;
    let entries = entry_labels(body.members, body.labels.as_ref())?;
    let rules = state.store.pool(&pool).await?.config.rules;
    let (members, mut rejected) = parse_members(entries, |member| rules.admit_member(member));
    let labels = members
        .iter()
        .filter_map(|(member, labels)| Some((member.clone(), labels.clone()?)))
        .collect();
    let geo = members
        .iter()
        .filter_map(|(member, _)| Some((member.clone(), state.geoip.lookup_member(member)?)))
        .collect();
    let seed = Seed {
        assignments: body.assignments,
        reset: body.reset,
        labels,
        geo,
        ..Seed::new(members.into_iter().map(|(member, _)| member).collect())
    };
    let report = state.store.add_members(&pool, &seed).await?;
    rejected.extend(
        report
            .full
            .into_iter()
            .map(|member| Rejected::by_rules(member.as_str().to_owned(), Rejection::PoolFull)),
    );
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
    /// Shows each member's `banned_until` for this host.
    #[serde(default)]
    target: Option<String>,
    /// `true`: only the members that share their exit address with another member.
    #[serde(default)]
    shared_exit_ip: Option<String>,
}

/// Offsets this service can issue: far beyond any pool, and small enough to stay exact in
/// the Lua scripts' numbers (doubles).
const MAX_CURSOR_OFFSET: u64 = 999_999_999_999;

fn parse_cursor(text: &str) -> Option<Cursor> {
    let (eligible, ineligible) = text.split_once('.')?;
    let offset = |part: &str| part.parse::<u64>().ok().filter(|n| *n <= MAX_CURSOR_OFFSET);
    Some(Cursor {
        eligible: offset(eligible)?,
        ineligible: offset(ineligible)?,
    })
}

fn format_cursor(cursor: Cursor) -> String {
    format!("{}.{}", cursor.eligible, cursor.ineligible)
}

/// Lists members ordered by assignments, then id, one page at a time; with `label=key=value`
/// filters, only members carrying them, in the order `Store::members` gives; with
/// `target=host`, each with `banned_until` for that host.
pub async fn list_members(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    QueryWithLabels(query, labels): QueryWithLabels<ListQuery>,
) -> Result<Response, ApiError> {
    let labels = LabelFilter::from_pairs("label", labels.iter().map(String::as_str))
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
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
    let target = query
        .target
        .as_deref()
        .map(|text| Target::parse("target", text))
        .transpose()
        .map_err(|e| ApiError::InvalidQuery(e.to_string()))?;
    let shared = match query.shared_exit_ip.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => {
            return Err(ApiError::InvalidQuery(
                "shared_exit_ip is true or false".to_owned(),
            ));
        }
    };
    let page = if shared {
        // Its own walk over the pool's sets (see `Store::shared_exit_members`), whose
        // cursor means nothing to another walk. A label filter keeps the members of its
        // page that carry the labels (their own or the GeoIP file's), so a page may hold
        // fewer than `limit` with more to come, as the walk's pages already may.
        let mut page = state
            .store
            .shared_exit_members(&pool, filter, target.as_ref(), limit, cursor)
            .await?;
        if !labels.is_empty() {
            page.members
                .retain(|member| member.labels.merged(&member.geo_labels).matches(&labels));
        }
        page
    } else {
        state
            .store
            .members(&pool, filter, &labels, target.as_ref(), limit, cursor)
            .await?
    };
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
    let (members, rejected) = parse_named_members(body.members)?;
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
    let (members, rejected) = parse_named_members(body.members)?;
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
    let (members, rejected) = parse_named_members(body.members)?;
    let report = state.store.remove_members(&pool, &members).await?;
    Ok(axum::Json(json!({
        "pool": pool,
        "removed": report.removed,
        "unknown": report.unknown,
        "rejected": rejected,
    }))
    .into_response())
}

impl JsonBody for SeedBody {}
impl JsonBody for DisableBody {}
impl JsonBody for EnableBody {}
impl JsonBody for RemoveBody {}
