//! `POST /pools/{pool}/outcomes` (worker): what happened when a worker used a member.
//!
//! One report is `{"proxy", "result", "status"?}`; a batch is a JSON array of them,
//! applied in order in one atomic step. Reports move members between eligible and cooling
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
use crate::domain::{MemberId, OutcomeResult, Target, Timestamp};
use crate::store::{Applied, Effect, Report, ReportSource};

/// One report as a worker sends it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutcomeBody {
    proxy: String,
    result: OutcomeResult,
    /// The HTTP status the worker saw, if any: logged when the member trips.
    #[serde(default)]
    status: Option<u16>,
    /// The host the request went to: a `blocked` report bans the member for it only.
    #[serde(default)]
    target: Option<serde_json::Value>,
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
    proxy: &'a MemberId,
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
    for (at, body) in bodies.iter().enumerate() {
        let field = if batch {
            format!("[{at}].target")
        } else {
            "target".to_owned()
        };
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
    let mut rejected = Vec::new();
    for (body, target) in bodies.into_iter().zip(targets) {
        // Reports keep their order and repeats (each one counts), so the ids are parsed one
        // by one rather than as a de-duplicated list.
        match named_member(&body.proxy) {
            Ok(member) => {
                reports.push(Report {
                    member,
                    result: body.result,
                    detail: String::new(),
                    latency_ms: None,
                    target,
                });
                statuses.push(body.status);
            }
            Err(reason) => rejected.push(Rejected::new(body.proxy, reason)),
        }
    }
    let summary = state
        .store
        .report(&pool, ReportSource::Worker, &reports)
        .await?;
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
    // Reports about known members, in order, each with its own target.
    let known = reports
        .iter()
        .filter(|report| !summary.unknown.contains(&report.member));
    let applied: Vec<AppliedView<'_>> = summary
        .applied
        .iter()
        .zip(known)
        .map(|(applied, report)| AppliedView {
            proxy: &applied.member,
            result: applied.result,
            effect: applied.effect,
            consecutive_failures: applied.streak,
            target: report.target.as_ref(),
            banned_until: applied.banned_until,
        })
        .collect();
    let response = axum::Json(json!({
        "pool": pool,
        "outcomes": applied,
        "unknown": summary.unknown,
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
