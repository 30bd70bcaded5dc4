//! The request log, read from the standard output of the service run as a process.

use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};

use crate::helpers::ADMIN;
use crate::process::ServiceProcess;

fn start() -> ServiceProcess {
    ServiceProcess::start(&[("RUST_LOG", "info".to_owned())])
}

fn parse(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"))
}

/// Creates `pool` on the running service with `member` in it.
async fn pool_with(client: &Client, service: &ServiceProcess, pool: &str, member: &str) {
    let base = &service.base;
    let created = client
        .put(format!("{base}/pools/{pool}"))
        .bearer_auth(ADMIN)
        .json(&json!({}))
        .send()
        .await
        .expect("sent");
    assert_eq!(created.status(), StatusCode::CREATED);
    let seeded = client
        .post(format!("{base}/pools/{pool}/members"))
        .bearer_auth(ADMIN)
        .json(&json!({ "members": [member] }))
        .send()
        .await
        .expect("sent");
    assert_eq!(seeded.status(), StatusCode::OK);
}

/// Asks `pool` for a member under the request id `id`.
async fn assign_as(client: &Client, service: &ServiceProcess, pool: &str, id: &str) -> Response {
    client
        .post(format!("{}/pools/{pool}/assign", service.base))
        .header("x-request-id", id)
        .send()
        .await
        .expect("sent")
}

/// Everything of a parsed request line but its time-dependent fields, which are checked on
/// their own.
fn without_times(mut line: Value) -> Value {
    let object = line.as_object_mut().expect("an object");
    object.remove("timestamp");
    object.remove("latency_ms");
    line
}

#[tokio::test]
async fn every_request_is_one_json_line_with_its_route_status_pool_outcome_and_request_id() {
    let service = start();
    let client = Client::new();
    pool_with(&client, &service, "web", "http://p1.example.net:3128").await;
    let before = time::OffsetDateTime::now_utc();
    let response = assign_as(&client, &service, "web", "worker-7/\"req\"\\1").await;
    assert_eq!(response.status(), StatusCode::OK);

    let lines = service.wait_lines("worker-7", 1);
    assert_eq!(lines.len(), 1, "one line per request: {lines:?}");
    let line = parse(&lines[0]);
    assert_eq!(
        without_times(line.clone()),
        json!({
            "level": "INFO",
            "target": "proxy_allocator::http::log",
            "message": "request",
            "method": "POST",
            "route": "/pools/{pool}/assign",
            "status": 200,
            "pool": "web",
            "outcome": "assigned",
            "request_id": "worker-7/\"req\"\\1",
        })
    );
    let latency = line["latency_ms"].as_f64().expect("latency_ms is a number");
    assert!((0.0..10_000.0).contains(&latency), "{latency}");
    let at = time::OffsetDateTime::parse(
        line["timestamp"].as_str().expect("timestamp is a string"),
        &time::format_description::well_known::Rfc3339,
    )
    .expect("timestamp is RFC 3339");
    assert!(
        at >= before - time::Duration::seconds(1),
        "{at} before {before}"
    );
    assert!(at <= time::OffsetDateTime::now_utc(), "{at} in the future");
}

#[tokio::test]
async fn refused_requests_are_logged_with_their_error_code_and_a_generated_request_id() {
    let service = start();
    let response = Client::new()
        .post(format!("{}/pools/nowhere/assign", service.base))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let id = response.headers()["x-request-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert_eq!(id.len(), 32, "{id}");

    let lines = service.wait_lines(&id, 1);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        without_times(parse(&lines[0])),
        json!({
            "level": "INFO",
            "target": "proxy_allocator::http::log",
            "message": "request",
            "method": "POST",
            "route": "/pools/{pool}/assign",
            "status": 404,
            "pool": "nowhere",
            "outcome": "pool_not_found",
            "request_id": id,
        })
    );
}

#[tokio::test]
async fn credentials_inside_proxy_urls_never_reach_the_log() {
    let service = start();
    let client = Client::new();
    pool_with(
        &client,
        &service,
        "auth",
        "http://alice:s3cret-pw@p1.example.net:3128",
    )
    .await;
    let assigned = assign_as(&client, &service, "auth", "with-credentials").await;
    assert_eq!(assigned.status(), StatusCode::OK);
    assert_eq!(
        assigned.json::<Value>().await.expect("json")["proxy"],
        "http://alice:s3cret-pw@p1.example.net:3128"
    );

    assert_eq!(service.wait_lines("with-credentials", 1).len(), 1);
    let leaked: Vec<String> = service
        .all_lines()
        .into_iter()
        .filter(|line| line.contains("s3cret-pw") || line.contains("alice"))
        .collect();
    assert_eq!(leaked, Vec::<String>::new());
}

#[tokio::test]
async fn a_readiness_probe_that_finds_no_store_is_logged_as_store_unavailable() {
    // Nothing listens on port 9 of the loopback: every store call fails at once.
    let service = ServiceProcess::start(&[
        ("RUST_LOG", "info".to_owned()),
        ("REDIS_URL", "redis://127.0.0.1:9".to_owned()),
        ("STORE_TIMEOUT_MS", "300".to_owned()),
    ]);
    let response = Client::new()
        .get(format!("{}/readyz", service.base))
        .header("x-request-id", "probe-1")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");

    let lines = service.wait_lines("probe-1", 1);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let mut line = without_times(parse(&lines[0]));
    let error = line
        .as_object_mut()
        .and_then(|fields| fields.remove("error"))
        .expect("the internal detail of the failure");
    assert!(error.as_str().is_some_and(|e| !e.is_empty()), "{error}");
    assert_eq!(
        line,
        json!({
            "level": "WARN",
            "target": "proxy_allocator::http::log",
            "message": "request failed",
            "method": "GET",
            "route": "/readyz",
            "status": 503,
            "outcome": "store_unavailable",
            "request_id": "probe-1",
        })
    );
}

#[tokio::test]
async fn latency_is_logged_in_milliseconds_with_at_most_three_decimals() {
    let service = start();
    let client = Client::new();
    pool_with(&client, &service, "web", "http://p1.example.net:3128").await;
    for i in 0..20 {
        let response = assign_as(&client, &service, "web", &format!("timed-{i:02}")).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let lines = service.wait_lines("timed-", 20);
    assert_eq!(lines.len(), 20, "{lines:?}");
    for line in &lines {
        // The number as written, not as parsed back: float noise shows in the text only.
        let written = line
            .split_once("\"latency_ms\":")
            .and_then(|(_, rest)| rest.split([',', '}']).next())
            .unwrap_or_else(|| panic!("a latency_ms field in {line}"));
        let decimals = written
            .split_once('.')
            .map_or(0, |(_, fraction)| fraction.len());
        assert!(
            written.parse::<f64>().is_ok() && decimals <= 3,
            "latency_ms written as {written} in {line}"
        );
    }
}
