//! `POST /pools/{pool}/assign`: the hot path.

use axum::extract::State;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::auth::Worker;
use super::done::{DoneBody, DoneView, ParsedDone};
use super::error::ApiError;
use super::extract::{JsonBody, JsonOrDefault, PoolPath};
use super::log::set_outcome;
use crate::domain::{
    AssignCount, Exclude, FilterField, LabelFilter, LeaseTtl, MemberId, PoolId, SessionId,
    SessionTtl, Target,
};
use crate::store::{
    AssignRequest, Assignment, Lease, MAX_LABEL_CHECKS, SessionPin, SessionRequest, StoreError,
};

/// Optional body of an assign; every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssignBody {
    /// A lease ttl other than the pool's (100 ms to 24 h; least-in-flight pools only).
    #[serde(default)]
    ttl_ms: Option<LeaseTtl>,
    /// `{"key": "value" | ["v1", "v2"]}`: only members whose labels match, for every key.
    #[serde(default)]
    labels: Option<FilterField>,
    /// The host the worker will contact: members banned for it are skipped.
    #[serde(default)]
    target: Option<serde_json::Value>,
    /// Up to this many distinct members (1 to 100), answered as a batch.
    #[serde(default)]
    count: Option<AssignCount>,
    /// A sticky session (1 to 128 visible ASCII characters): the same member while it stays
    /// eligible for the request. A session pins one member, so it never combines with
    /// `count`.
    #[serde(default)]
    session: Option<serde_json::Value>,
    /// How long the session lives after this assign (1,000 ms to 24 h; the pool's
    /// `session_ttl_ms` by default). Ignored without `session`, as `ttl_ms` is by pools that
    /// give no leases.
    #[serde(default)]
    session_ttl_ms: Option<serde_json::Value>,
    /// How the worker's previous use of this pool ended, applied before the pick in the
    /// same atomic step.
    #[serde(default)]
    done: Option<DoneBody>,
    /// Up to 100 members this call must not hand out, as if they were ineligible for it
    /// (a retry that moves on from the members it already tried).
    #[serde(default)]
    exclude: Option<serde_json::Value>,
}

/// What an assign asks for: one member, several, or one in a session.
enum Wanted {
    One,
    Several(AssignCount),
    InSession(SessionRequest),
}

impl AssignBody {
    /// The store's request, labels parsed, and what is wanted: one member, a count, or a
    /// session.
    fn request(self) -> Result<(AssignRequest, Wanted), ApiError> {
        // `null` is the field left out, as for `target`.
        let session = self.session.as_ref().filter(|v| !v.is_null());
        // Checked whether or not a session is given, as every field is.
        let session_ttl = self
            .session_ttl_ms
            .as_ref()
            .filter(|v| !v.is_null())
            .map(|ttl| SessionTtl::from_json("session_ttl_ms", ttl))
            .transpose()
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
        let wanted = match (session, self.count) {
            (Some(_), Some(_)) => {
                return Err(ApiError::InvalidRequest(
                    "count: an assign with a session hands out its one pinned member; \
                     count does not combine with session"
                        .to_owned(),
                ));
            }
            (Some(id), None) => Wanted::InSession(SessionRequest {
                id: SessionId::from_json("session", id)
                    .map_err(|e| ApiError::InvalidRequest(e.to_string()))?,
                ttl: session_ttl,
            }),
            (None, Some(count)) => Wanted::Several(count),
            (None, None) => Wanted::One,
        };
        let labels = match self.labels {
            Some(field) => field
                .filter("labels")
                .map_err(|e| ApiError::InvalidRequest(e.to_string()))?,
            None => LabelFilter::default(),
        };
        let target = self
            .target
            .as_ref()
            .map(|value| Target::from_json("target", value))
            .transpose()
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
        let exclude = self
            .exclude
            .as_ref()
            .map(|value| Exclude::from_json("exclude", value))
            .transpose()
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?
            .unwrap_or_default();
        Ok((
            AssignRequest {
                ttl: self.ttl_ms,
                labels,
                target,
                exclude,
                rate: None,
            },
            wanted,
        ))
    }
}

#[derive(Serialize)]
struct Assigned<'a> {
    pool: &'a PoolId,
    proxy: &'a MemberId,
    assignments: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<&'a SessionPin>,
}

#[derive(Serialize)]
struct Leased<'a> {
    pool: &'a PoolId,
    proxy: &'a MemberId,
    in_flight: u64,
    assignments: u64,
    lease: &'a Lease,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<&'a SessionPin>,
}

/// One member of a batch, as a single assign answers it.
#[derive(Serialize)]
#[serde(untagged)]
enum Entry<'a> {
    Assigned(Assigned<'a>),
    Leased(Leased<'a>),
}

#[derive(Serialize)]
struct Several<'a> {
    pool: &'a PoolId,
    assigned: Vec<Entry<'a>>,
}

impl<'a> Entry<'a> {
    /// `None` for [`Assignment::Empty`], which a batch never holds; `session` only for the
    /// one member of an assign in a session.
    fn of(
        pool: &'a PoolId,
        assignment: &'a Assignment,
        session: Option<&'a SessionPin>,
    ) -> Option<Self> {
        match assignment {
            Assignment::Assigned {
                member,
                assignments,
            } => Some(Self::Assigned(Assigned {
                pool,
                proxy: member,
                assignments: *assignments,
                session,
            })),
            Assignment::Leased {
                member,
                assignments,
                in_flight,
                lease,
            } => Some(Self::Leased(Leased {
                pool,
                proxy: member,
                in_flight: *in_flight,
                assignments: *assignments,
                lease,
                session,
            })),
            Assignment::Empty { .. } => None,
        }
    }
}

/// Hands out a member under the pool's policy: 200 with it (and, on a least-in-flight
/// pool, its lease), 204 when the pool has no member to give (the worker skips its
/// request; `Retry-After` says when the first member cooling down comes back, if any),
/// 404 when there is no pool. The body is optional: `{"ttl_ms": n}` asks for a
/// lease ttl other than the pool's (ignored by least-used pools, which give no leases);
/// `{"labels": {...}}` chooses among the members whose labels match only;
/// `{"target": "host"}` skips members banned for that host; `{"count": n}` hands out up to
/// n distinct members at once, as `{"pool", "assigned": [...]}`; `{"session": "id"}` hands
/// out the session's member again while it stays eligible for the request (else pins a
/// fresh pick), with `"session": {"id", "expires_at", "repinned"}` in the answer;
/// `{"exclude": [ids]}` never hands out those members in this call (a 204 they alone cause
/// has no `Retry-After`); `{"done": {...}}` applies the worker's last outcome (and releases its lease) first, in
/// the same atomic step, with every other field, and the answer says what it did.
pub async fn assign(
    worker: Worker,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    JsonOrDefault(mut body): JsonOrDefault<AssignBody>,
) -> Result<Response, ApiError> {
    let done = body.done.take().map(DoneBody::parse).transpose()?;
    let (mut request, wanted) = body.request()?;
    request.rate = worker.limit();
    if let Some(done) = done {
        return match wanted {
            Wanted::One => assign_after_done(&state, &pool, &done, &request, None).await,
            Wanted::Several(count) => {
                assign_after_done(&state, &pool, &done, &request, Some(count)).await
            }
            Wanted::InSession(session) => {
                in_session_after_done(&state, &pool, &done, &request, &session).await
            }
        };
    }
    let (assignment, session) = match wanted {
        Wanted::Several(count) => return several(&state, &pool, &request, count).await,
        Wanted::One => (
            state
                .store
                .assign(&pool, &request)
                .await
                .map_err(filter_refused)?,
            None,
        ),
        Wanted::InSession(session) => {
            let answer = state
                .store
                .assign_in_session(&pool, &request, &session)
                .await
                .map_err(filter_refused)?;
            (answer.assignment, answer.session)
        }
    };
    let session = session.as_ref();
    let (outcome, response) = match assignment {
        Assignment::Assigned {
            member,
            assignments,
        } => (
            "assigned",
            axum::Json(Assigned {
                pool: &pool,
                proxy: &member,
                assignments,
                session,
            })
            .into_response(),
        ),
        Assignment::Leased {
            member,
            assignments,
            in_flight,
            lease,
        } => (
            "leased",
            axum::Json(Leased {
                pool: &pool,
                proxy: &member,
                in_flight,
                assignments,
                lease: &lease,
                session,
            })
            .into_response(),
        ),
        Assignment::Empty { next_return } => ("empty", no_content(next_return)),
    };
    set_outcome(outcome);
    Ok(response)
}

/// An assign of up to `count` members, answered as `{"pool", "assigned": [...]}`.
async fn several(
    state: &AppState,
    pool: &PoolId,
    request: &AssignRequest,
    count: AssignCount,
) -> Result<Response, ApiError> {
    let batch = state
        .store
        .assign_several(pool, request, count)
        .await
        .map_err(filter_refused)?;
    let response = if batch.assigned.is_empty() {
        no_content(batch.next_return)
    } else {
        let assigned = batch
            .assigned
            .iter()
            .filter_map(|a| Entry::of(pool, a, None))
            .collect();
        axum::Json(Several { pool, assigned }).into_response()
    };
    let outcome = match batch.assigned.first() {
        None => "empty",
        Some(Assignment::Leased { .. }) => "leased",
        Some(_) => "assigned",
    };
    set_outcome(outcome);
    Ok(response)
}

/// An answer with the `done` it carried: the assign's own fields, then `done`.
#[derive(Serialize)]
struct WithDone<T> {
    #[serde(flatten)]
    answer: T,
    done: DoneView,
}

/// The assign of a body with `done`: the store applies it and picks in one step; the
/// answer is the assign's (one member, or with `count` a batch) with what `done` did. A 204
/// has no body: `done` was applied all the same.
async fn assign_after_done(
    state: &AppState,
    pool: &PoolId,
    done: &ParsedDone,
    request: &AssignRequest,
    count: Option<AssignCount>,
) -> Result<Response, ApiError> {
    let (batch, summary) = state
        .store
        .assign_after_done(pool, &done.done, request, count.unwrap_or(AssignCount::ONE))
        .await
        .map_err(filter_refused)?;
    state
        .snapshot
        .count_reports(pool, summary.applied.iter().map(|applied| applied.result));
    let view = done.view(pool, &summary);
    let outcome = match batch.assigned.first() {
        None => "empty",
        Some(Assignment::Leased { .. }) => "leased",
        Some(_) => "assigned",
    };
    let response = match (count, batch.assigned.first()) {
        (_, None) => no_content(batch.next_return),
        (None, Some(first)) => axum::Json(WithDone {
            answer: Entry::of(pool, first, None),
            done: view,
        })
        .into_response(),
        (Some(_), Some(_)) => axum::Json(WithDone {
            answer: Several {
                pool,
                assigned: batch
                    .assigned
                    .iter()
                    .filter_map(|a| Entry::of(pool, a, None))
                    .collect(),
            },
            done: view,
        })
        .into_response(),
    };
    set_outcome(outcome);
    Ok(response)
}

/// The assign in a session of a body with `done`: the store applies it, then assigns in the
/// session, in one step, so that the session's member is judged after what `done` did to
/// it. The answer is the member with `session` and `done`; a 204 has no body (`done` was
/// applied all the same, and a live session keeps its member).
async fn in_session_after_done(
    state: &AppState,
    pool: &PoolId,
    done: &ParsedDone,
    request: &AssignRequest,
    session: &SessionRequest,
) -> Result<Response, ApiError> {
    let (answer, summary) = state
        .store
        .assign_in_session_after_done(pool, &done.done, request, session)
        .await
        .map_err(filter_refused)?;
    state
        .snapshot
        .count_reports(pool, summary.applied.iter().map(|applied| applied.result));
    let view = done.view(pool, &summary);
    let (outcome, response) = match &answer.assignment {
        Assignment::Empty { next_return } => ("empty", no_content(*next_return)),
        assignment => (
            if matches!(assignment, Assignment::Leased { .. }) {
                "leased"
            } else {
                "assigned"
            },
            axum::Json(WithDone {
                answer: Entry::of(pool, assignment, answer.session.as_ref()),
                done: view,
            })
            .into_response(),
        ),
    };
    set_outcome(outcome);
    Ok(response)
}

/// The store's refusal of a costly label filter as the 400 that explains it; other errors
/// as they are.
fn filter_refused(error: StoreError) -> ApiError {
    match error {
        StoreError::FilterTooCostly => ApiError::InvalidRequest(format!(
            "labels: this filter would check more than {MAX_LABEL_CHECKS} members; \
             filter on one key, or give the members a label that combines the keys"
        )),
        other => other.into(),
    }
}

/// The exact wait of a 204, in milliseconds, next to `Retry-After`'s whole seconds.
const RETRY_AFTER_MS: header::HeaderName = header::HeaderName::from_static("retry-after-ms");

/// A 204, with `Retry-After` in whole seconds rounded up (at least 1) and `Retry-After-Ms`
/// exact, when something becomes eligible for the request by itself (a cooldown or a ban
/// ending), so that workers wait for it instead of polling.
fn no_content(next_return: Option<Duration>) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(wait) = next_return {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let headers = response.headers_mut();
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(ms.div_ceil(1000).max(1)),
        );
        headers.insert(RETRY_AFTER_MS, HeaderValue::from(ms));
    }
    response
}

impl JsonBody for AssignBody {}
