//! Routes for machines, open without a token: `GET /livez`, `GET /readyz`, `GET /metrics`
//! and `GET /openapi.yaml`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::error::{ApiError, error_body};

/// 200 while the process serves requests.
pub async fn livez() -> Response {
    axum::Json(json!({ "status": "ok" })).into_response()
}

/// 200 when the store answers within its timeout, else 503 with the reason and
/// `Retry-After`.
pub async fn readyz(State(state): State<AppState>) -> Response {
    match state.store.status().await {
        Ok(status) => {
            let mut body = json!({
                "status": "ready",
                "store": status.store,
                "topology": status.topology,
            });
            if let Some(primaries) = status.primaries {
                body["primaries"] = json!(primaries);
            }
            if let Some(master) = status.master {
                body["master"] = json!(master);
            }
            axum::Json(body).into_response()
        }
        Err(error) => {
            // Like any 503: `Retry-After`, and the code and detail on the request's log line.
            let api = ApiError::from(error);
            let mut body = error_body(api.code(), &api.to_string());
            body["status"] = json!("unavailable");
            body["store"] = json!(state.store.name());
            api.respond(body)
        }
    }
}

/// Prometheus text format: the recorder's counters and histograms, then the per-pool
/// gauges from the latest snapshot.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let mut body = crate::monitoring::prometheus().render();
    body.push_str(&state.snapshot.render());
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// The API contract this build serves, the same file the tests check the router against.
pub async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/yaml")],
        include_str!("../../openapi.yaml"),
    )
        .into_response()
}
