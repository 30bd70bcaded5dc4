//! `POST /pools/{pool}/outcomes` (worker): what happened when a worker used a member.
//!
//! One report is `{"proxy", "result", "status"?}`; a batch is a JSON array of them,
//! applied in order in one atomic step. Instead of `proxy`, a report may name the `ticket`
//! of a gateway tunnel (its `x-proxy-allocator-ticket`): it is then about the member that
//! served the tunnel, for the tunnel's target, and its answer never shows that member's
//! credentials. Reports move members between eligible and cooling
//! down under the pool's `health` rules; they never change assignment counts.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::AppState;
use super::auth::Worker;
use super::error::ApiError;
use super::extract::{Json, JsonBody, PoolPath};
use super::log::set_outcome;
use super::members::{Rejected, check_count, named_member};
use crate::domain::{OutcomeResult, Target, Timestamp};
use crate::store::{Applied, Effect, Report, ReportSource};

/// One report as a worker sends it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutcomeBody {
    #[serde(default)]
    proxy: Option<String>,
    /// A gateway tunnel's ticket, instead of `proxy`.
    #[serde(default)]
    ticket: Option<String>,
    result: OutcomeResult,
    /// The HTTP status the worker saw, if any: logged when the member trips.
    #[serde(default)]
    status: Option<u16>,
    /// The host the request went to: a `blocked` report bans the member for it only.
    #[serde(default)]
    target: Option<serde_json::Value>,
    /// How long the request took, in milliseconds: counted in the member's latency.
    #[serde(default)]
    latency_ms: Option<serde_json::Value>,
}

/// A report's `latency_ms`: a whole number of milliseconds from 0 to
/// [`MAX_LATENCY_MS`](crate::rules::quality::MAX_LATENCY_MS). Taken as any JSON value, so
/// that a negative, fractional, huge or textual one is a 400 naming `field`.
///
/// # Errors
/// [`ApiError::InvalidRequest`] naming the field.
pub(super) fn parse_latency(
    field: &str,
    value: Option<&serde_json::Value>,
) -> Result<Option<u64>, ApiError> {
    let max = crate::rules::quality::MAX_LATENCY_MS;
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(value) => match value.as_u64() {
            Some(ms) if ms <= max => Ok(Some(ms)),
            _ => Err(ApiError::InvalidRequest(format!(
                "{field} is a whole number of milliseconds from 0 to {max}"
            ))),
        },
    }
}

/// A single report or an array of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OutcomesBody {
    /// `{"proxy", "result", "status"?}`.
    One(OutcomeBody),
    /// `[{"proxy", "result", "status"?}, ...]`.
    Many(Vec<OutcomeBody>),
}

#[derive(Serialize)]
struct AppliedView<'a> {
    /// The member; for a ticket's report, with its credentials masked.
    proxy: std::borrow::Cow<'a, str>,
    /// The ticket the report named, if it named one.
    #[serde(skip_serializing_if = "Option::is_none")]
    ticket: Option<&'a str>,
    result: OutcomeResult,
    effect: Effect,
    consecutive_failures: u64,
    /// For a report with a target: its ban for it, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<&'a Target>,
    #[serde(skip_serializing_if = "Option::is_none")]
    banned_until: Option<Timestamp>,
}

/// Applies worker reports in order: 200 with what each did (`counted`, `tripped`,
/// `ignored` for members not eligible), members the pool does not have in `unknown`, and
/// invalid ids in `rejected`.
pub async fn report_outcomes(
    _: Worker,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    Json(body): Json<OutcomesBody>,
) -> Result<Response, ApiError> {
    let bodies = match body {
        OutcomesBody::One(one) => vec![one],
        OutcomesBody::Many(many) => many,
    };
    check_count(bodies.len())?;
    if bodies
        .iter()
        .any(|b| b.status.is_some_and(|s| !(100..=599).contains(&s)))
    {
        return Err(ApiError::InvalidRequest(
            "status is an HTTP status from 100 to 599".to_owned(),
        ));
    }
    let batch = matches!(bodies.len(), 2..);
    let mut targets = Vec::with_capacity(bodies.len());
    let mut latencies = Vec::with_capacity(bodies.len());
    for (at, body) in bodies.iter().enumerate() {
        let field = |name: &str| {
            if batch {
                format!("[{at}].{name}")
            } else {
                name.to_owned()
            }
        };
        match (&body.proxy, &body.ticket) {
            (Some(_), None) => {}
            (None, Some(_)) if body.target.is_none() => {}
            (None, Some(_)) => {
                return Err(ApiError::InvalidRequest(format!(
                    "{}: a ticket's report is about its tunnel's target",
                    field("target")
                )));
            }
            (Some(_), Some(_)) => {
                return Err(ApiError::InvalidRequest(format!(
                    "{}: a report names its proxy or a gateway ticket, not both",
                    field("ticket")
                )));
            }
            (None, None) => {
                return Err(ApiError::InvalidRequest(format!(
                    "{}: a report names its proxy (or a gateway ticket)",
                    field("proxy")
                )));
            }
        }
        latencies.push(parse_latency(
            &field("latency_ms"),
            body.latency_ms.as_ref(),
        )?);
        let field = field("target");
        let target = body
            .target
            .as_ref()
            .map(|value| Target::from_json(&field, value))
            .transpose()
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
        targets.push(target);
    }
    let mut reports = Vec::with_capacity(bodies.len());
    let mut statuses = Vec::with_capacity(bodies.len());
    // The ticket each report came from, if any, in step with `reports`.
    let mut tickets = Vec::with_capacity(bodies.len());
    let mut rejected = Vec::new();
    let mut unknown_tickets = Vec::new();
    for ((body, target), latency_ms) in bodies.into_iter().zip(targets).zip(latencies) {
        // Reports keep their order and repeats (each one counts), so the ids are parsed one
        // by one rather than as a de-duplicated list.
        let (member, target, ticket) = match (body.proxy, body.ticket) {
            (Some(proxy), _) => match named_member(&proxy) {
                Ok(member) => (member, target, None),
                Err(reason) => {
                    rejected.push(Rejected::new(proxy, reason));
                    continue;
                }
            },
            (None, Some(ticket)) => match state.tickets.resolve(&pool, &ticket) {
                Some(ticketed) => (ticketed.member, Some(ticketed.target), Some(ticket)),
                None => {
                    unknown_tickets.push(ticket);
                    continue;
                }
            },
            // Refused above.
            (None, None) => continue,
        };
        reports.push(Report {
            member,
            result: body.result,
            detail: String::new(),
            latency_ms,
            target,
        });
        statuses.push(body.status);
        tickets.push(ticket);
    }
    let summary = state
        .store
        .report(&pool, ReportSource::Worker, &reports)
        .await?;
    state
        .snapshot
        .count_reports(&pool, summary.applied.iter().map(|applied| applied.result));
    for Applied {
        member,
        result,
        streak: failures,
        ..
    } in summary
        .applied
        .iter()
        .filter(|applied| applied.effect == Effect::Tripped)
    {
        // The status of the report that tripped it: the last one about that member.
        let status = reports
            .iter()
            .zip(&statuses)
            .rev()
            .find(|(r, _)| &r.member == member)
            .and_then(|(_, s)| *s);
        tracing::info!(
            pool = pool.as_str(),
            proxy = %member.masked(),
            result = result.as_str(),
            status,
            consecutive_failures = failures,
            "member cooling down after reported failures"
        );
    }
    // Reports about known members, in order, each with its own target and ticket.
    let known = reports
        .iter()
        .zip(&tickets)
        .filter(|(report, _)| !summary.unknown.contains(&report.member));
    let applied: Vec<AppliedView<'_>> = summary
        .applied
        .iter()
        .zip(known)
        .map(|(applied, (report, ticket))| AppliedView {
            proxy: match ticket {
                Some(_) => applied.member.masked(),
                None => std::borrow::Cow::Borrowed(applied.member.as_str()),
            },
            ticket: ticket.as_deref(),
            result: applied.result,
            effect: applied.effect,
            consecutive_failures: applied.streak,
            target: report.target.as_ref(),
            banned_until: applied.banned_until,
        })
        .collect();
    // Unknown members as named, except that a ticket's member (no longer in the pool) is
    // listed by its ticket: its id, credentials and all, is never shown.
    let mut unknown: Vec<&str> = Vec::new();
    for (report, ticket) in reports.iter().zip(&tickets) {
        if !summary.unknown.contains(&report.member) {
            continue;
        }
        let name = ticket.as_deref().unwrap_or(report.member.as_str());
        if !unknown.contains(&name) {
            unknown.push(name);
        }
    }
    unknown.extend(unknown_tickets.iter().map(String::as_str));
    let response = axum::Json(json!({
        "pool": pool,
        "outcomes": applied,
        "unknown": unknown,
        "rejected": rejected,
    }))
    .into_response();
    set_outcome("reported");
    Ok(response)
}

/// Reports come one at a time or as a batch.
impl JsonBody for OutcomesBody {
    const BATCH: bool = true;
}
