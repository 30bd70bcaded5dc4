//! One log line and the metrics of every request: route, status, latency, and for pool
//! routes the pool and the outcome. Failures are logged here, once, with their internal
//! detail; the client never sees that detail.
//!
//! Every request also gets a request id: the caller's `x-request-id` when it is a sane one
//! (1 to 128 visible ASCII characters), else a new random one. It is echoed in the response
//! and carried by a span, so every log line written while serving the request has it.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use super::AppState;
use super::error::{ErrorCode, ErrorDetail};
use crate::domain::PoolId;

/// What a handler did, for the log line (`assigned`, `empty`, ...).
#[derive(Debug, Clone, Copy)]
pub struct Outcome(pub &'static str);

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
            let bytes: [u8; 16] = rand::random();
            // Hex is always a valid header value.
            HeaderValue::from_str(&crate::domain::hex(&bytes))
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
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    let pool = pool_of(request.uri().path());
    let span = tracing::info_span!("request", request_id = id.to_str().unwrap_or_default());
    let mut response = next.run(request).instrument(span.clone()).await;
    response.headers_mut().insert(REQUEST_ID.clone(), id);
    let elapsed = started.elapsed();
    let latency_ms = elapsed.as_secs_f64() * 1000.0;
    let status = response.status().as_u16();
    let code = response.extensions().get::<ErrorCode>().map(|c| c.0);
    let outcome = response
        .extensions()
        .get::<Outcome>()
        .map(|o| o.0)
        .or(code)
        .unwrap_or("ok");

    metrics::counter!("pa_http_requests_total", "method" => method.to_string(), "route" => route.clone(), "status" => status.to_string()).increment(1);
    metrics::histogram!("pa_http_request_duration_seconds", "route" => route.clone())
        .record(elapsed.as_secs_f64());
    if route == "/pools/{pool}/assign" {
        record_assign(&state, pool.as_ref(), outcome, code, elapsed.as_secs_f64());
    }

    let pool = pool.as_ref().map(PoolId::as_str);
    let _entered = span.enter();
    match response.extensions().get::<ErrorDetail>() {
        Some(ErrorDetail(detail)) => tracing::warn!(
            %method, route, status, latency_ms, pool, outcome, error = detail.as_str(),
            "request failed"
        ),
        None => tracing::info!(%method, route, status, latency_ms, pool, outcome, "request"),
    }
    response
}

/// Counts an assign under its pool — but only pools known to exist become label values.
fn record_assign(
    state: &AppState,
    pool: Option<&PoolId>,
    outcome: &str,
    code: Option<&str>,
    seconds: f64,
) {
    let (outcome, label): (&'static str, _) = match (outcome, code) {
        // The store has just said the pool exists.
        ("assigned", _) => ("assigned", pool.map(|p| p.as_str().to_owned())),
        ("empty", _) => ("empty", pool.map(|p| p.as_str().to_owned())),
        (_, Some("pool_not_found")) => ("not_found", None),
        (_, Some("store_unavailable")) => ("error", pool.map(|p| state.snapshot.label(p))),
        // Refused before the store was asked (bad id, token): not an assign.
        _ => return,
    };
    let label = label.unwrap_or_else(|| crate::monitoring::OTHER_POOL.to_owned());
    metrics::counter!("pa_assigns_total", "pool" => label, "outcome" => outcome).increment(1);
    metrics::histogram!("pa_assign_duration_seconds", "outcome" => outcome).record(seconds);
}
