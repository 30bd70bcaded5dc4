//! One log line per request: route, status, latency, and for pool routes the pool and the
//! outcome. Failures are logged here, once, with their internal detail; the client never
//! sees that detail.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

use super::error::{ErrorCode, ErrorDetail};
use crate::domain::PoolId;

/// What a handler did, for the log line (`assigned`, `empty`, ...).
#[derive(Debug, Clone, Copy)]
pub struct Outcome(pub &'static str);

/// The pool id of a `/pools/{pool}...` path, when it is a valid one. Read from the raw path
/// so that requests rejected before their handler ran are logged with their pool too.
fn pool_of(path: &str) -> Option<PoolId> {
    let rest = path.strip_prefix("/pools/")?;
    let segment = rest.split('/').next()?;
    PoolId::parse(segment).ok()
}

/// Logs the request once it has been answered.
pub async fn log_request(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    let pool = pool_of(request.uri().path());
    let response = next.run(request).await;
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    let status = response.status().as_u16();
    let outcome = response
        .extensions()
        .get::<Outcome>()
        .map(|o| o.0)
        .or_else(|| response.extensions().get::<ErrorCode>().map(|c| c.0))
        .unwrap_or("ok");
    let pool = pool.as_ref().map(PoolId::as_str);
    match response.extensions().get::<ErrorDetail>() {
        Some(ErrorDetail(detail)) => tracing::warn!(
            %method, route, status, latency_ms, pool, outcome, error = detail.as_str(),
            "request failed"
        ),
        None => tracing::info!(%method, route, status, latency_ms, pool, outcome, "request"),
    }
    response
}
