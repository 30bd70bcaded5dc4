//! One log line and the metrics of every request: route, status, latency, and for pool
//! routes the pool and the outcome. Failures are logged here, once, with their internal
//! detail; the client never sees that detail.
//!
//! Every request also gets a request id: the caller's `x-request-id` when it is a sane one
//! (1 to 128 visible ASCII characters), else a new random one. It is echoed in the response
//! and every log line written while serving the request has it
//! ([`crate::telemetry::serving_request`]).

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

use super::AppState;
use super::error::{ErrorCode, ErrorDetail};
use crate::domain::PoolId;
use crate::monitoring;

/// Notes what the handler did (`assigned`, `empty`, ...), for the log line and the metrics
/// written once the request is answered.
pub fn set_outcome(outcome: &'static str) {
    crate::telemetry::set_outcome(outcome);
}

/// The request id header, read and written.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The pool id of a `/pools/{pool}...` path, when it is a valid one. Read from the raw path
/// so that requests rejected before their handler ran are logged with their pool too.
fn pool_of(path: &str) -> Option<PoolId> {
    let rest = path.strip_prefix("/pools/")?;
    let segment = rest.split('/').next()?;
    PoolId::parse(segment).ok()
}

fn request_id(request: &Request) -> HeaderValue {
    request
        .headers()
        .get(&REQUEST_ID)
        .filter(|v| (1..=128).contains(&v.len()) && v.as_bytes().iter().all(u8::is_ascii_graphic))
        .cloned()
        .unwrap_or_else(|| {
            // Hex is always a valid header value.
            HeaderValue::from_str(&crate::domain::hex(&crate::domain::random_bytes()))
                .unwrap_or_else(|_| HeaderValue::from_static("invalid"))
        })
}

/// Logs and counts the request once it has been answered.
pub async fn log_request(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let id = request_id(&request);
    request.headers_mut().insert(REQUEST_ID.clone(), id.clone());
    let method = request.method().clone();
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    let pool = pool_of(request.uri().path());
    let mut response = crate::telemetry::serving_request(id.clone(), async {
        let response = next.run(request).await;
        let elapsed = started.elapsed();
        // Whole microseconds, in milliseconds: 0.332, never 0.33225000000000005.
        let latency_ms = elapsed.as_micros() as f64 / 1000.0;
        let status = response.status().as_u16();
        let code = response.extensions().get::<ErrorCode>().map(|c| c.0);
        let outcome = crate::telemetry::outcome().or(code).unwrap_or("ok");

        monitoring::record_request(&method, route, status, elapsed.as_secs_f64());
        if route == "/pools/{pool}/assign" {
            record_assign(&state, pool.as_ref(), outcome, code, elapsed.as_secs_f64());
        }

        let pool = pool.as_ref().map(PoolId::as_str);
        let method = method.as_str();
        match response.extensions().get::<ErrorDetail>() {
            Some(ErrorDetail(detail)) => tracing::warn!(
                method,
                route,
                status,
                latency_ms,
                pool,
                outcome,
                error = detail.as_str(),
                "request failed"
            ),
            None => tracing::info!(method, route, status, latency_ms, pool, outcome, "request"),
        }
        response
    })
    .await;
    response.headers_mut().insert(REQUEST_ID.clone(), id);
    response
}

/// Counts an assign under its pool — but only pools with series of their own (see
/// [`monitoring::PoolSnapshot`]) become label values, and only they count it in their
/// activity.
fn record_assign(
    state: &AppState,
    pool: Option<&PoolId>,
    outcome: &str,
    code: Option<&str>,
    seconds: f64,
) {
    use monitoring::Event;
    let counted = |p, event| state.snapshot.count(p, true, &[(event, 1)]);
    let (outcome, label): (&'static str, _) = match (outcome, code) {
        // The store has just said the pool exists: it may take a place of its own.
        // A lease is an assign too (`pa_assigns_total` names no outcome of its own for it).
        ("assigned" | "leased", _) => ("assigned", pool.map(|p| counted(p, Event::Assigned))),
        ("empty", _) => ("empty", pool.map(|p| counted(p, Event::Empty))),
        (_, Some("pool_not_found")) => ("not_found", None),
        (_, Some("store_unavailable")) => ("error", pool.map(|p| state.snapshot.label(p, false))),
        // Refused before the store was asked (bad id, token): not an assign.
        _ => return,
    };
    monitoring::record_assign(label.unwrap_or(monitoring::OTHER_POOL), outcome, seconds);
}
