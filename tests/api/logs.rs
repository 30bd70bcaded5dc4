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

/// The first lines a service started with `env` (and no admin token unless `env` sets one)
/// writes, up to and including the first that contains `last`, or all it wrote within 10 s.
fn first_lines(env: &[(&str, &str)], last: &str) -> Vec<String> {
    use std::io::BufRead;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-allocator"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn,proxy_allocator::startup=info")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the service binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let (sent, received) = std::sync::mpsc::channel();
    let last = last.to_owned();
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let done = line.contains(&last);
            lines.push(line);
            if done {
                break;
            }
        }
        let _ = sent.send(lines);
    });
    let lines = received
        .recv_timeout(std::time::Duration::from_secs(10))
        .unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    lines
        .into_iter()
        .map(|line| line.replace(&port.to_string(), "PORT"))
        .collect()
}

#[test]
fn the_text_log_starts_with_the_generated_admin_token_and_the_dashboard_in_plain_words() {
    let lines = first_lines(&[("LOG_FORMAT", "text")], "the dashboard is at");
    let messages: Vec<&str> = lines
        .iter()
        .filter_map(|line| {
            line.split_once("proxy_allocator::startup: ")
                .map(|(_, m)| m)
        })
        .collect();
    // The token comes first; then what the service found (its store, its file limit),
    // and the dashboard right after the address it listens on.
    assert!(messages.len() <= 5, "{lines:#?}");
    let token = messages[0]
        .strip_prefix("no ADMIN_TOKEN or ADMIN_TOKEN_FILE: generated the admin token ")
        .and_then(|rest| rest.split_once(' '))
        .map(|(token, _)| token)
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(
        token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{token}"
    );
    assert_eq!(
        messages[0].replace(token, "TOKEN"),
        "no ADMIN_TOKEN or ADMIN_TOKEN_FILE: generated the admin token TOKEN for this process; \
         paste it into the dashboard or pass it to the operator commands as ADMIN_TOKEN (it \
         changes at every start unless you set one)"
    );
    assert!(
        messages[messages.len() - 2].starts_with("listening "),
        "{lines:#?}"
    );
    assert_eq!(
        messages[messages.len() - 1],
        "the dashboard is at http://127.0.0.1:PORT/ui (it asks for the admin token)"
    );
}

#[test]
fn the_json_log_keeps_its_fields_and_names_the_dashboard_in_the_listening_line() {
    let lines = first_lines(&[("LOG_FORMAT", "json")], "\"listening\"");
    let lines: Vec<Value> = lines.iter().map(|line| parse(line)).collect();
    let (first, listening) = (&lines[0], &lines[lines.len() - 1]);
    assert_eq!(
        first["message"],
        "no ADMIN_TOKEN or ADMIN_TOKEN_FILE: generated an admin token for this process"
    );
    assert_eq!(first["admin_token"].as_str().map(str::len), Some(64));
    // The sentence about the dashboard is for readers of text: JSON has the field.
    assert!(
        !lines.iter().any(|line| line["message"]
            .as_str()
            .is_some_and(|message| message.contains("dashboard"))),
        "{lines:#?}"
    );
    assert_eq!(
        (
            &listening["message"],
            &listening["addr"],
            &listening["dashboard"]
        ),
        (
            &json!("listening"),
            &json!("127.0.0.1:PORT"),
            &json!("http://127.0.0.1:PORT/ui")
        )
    );
}

/// The warnings among `lines` that are about tokens.
fn token_warnings(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .map(|line| parse(line))
        .filter(|line| line["level"] == "WARN")
        .map(|line| line["message"].clone())
        .filter(|message| message.as_str().is_some_and(|m| m.contains("TOKEN")))
        .collect()
}

#[test]
fn the_service_warns_when_the_admin_token_is_also_the_worker_token() {
    let same = [
        ("LOG_FORMAT", "json"),
        ("ADMIN_TOKEN", "one-token-for-all"),
        ("WORKER_TOKEN", "one-token-for-all"),
    ];
    assert_eq!(
        token_warnings(&first_lines(&same, "\"listening\"")),
        [json!(
            "ADMIN_TOKEN equals WORKER_TOKEN: every worker can also manage pools and members; \
             give the workers a token of their own"
        )]
    );
    let distinct = [
        ("LOG_FORMAT", "json"),
        ("ADMIN_TOKEN", "admin-token"),
        ("WORKER_TOKEN", "worker-token"),
    ];
    let lines = first_lines(&distinct, "\"listening\"");
    assert!(
        lines.iter().any(|line| line.contains("\"listening\"")),
        "{lines:#?}"
    );
    assert_eq!(token_warnings(&lines), Vec::<Value>::new());
}
