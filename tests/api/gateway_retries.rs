//! The pool's gateway rules on plain HTTP: a listed status, or a block pattern in the
//! answer's body, through one member is reported `blocked` for the target and the request
//! is sent again (its body byte for byte) through a member not tried yet; a slow answer is
//! `failed` and retried the same way; after the last attempt the last answer is passed on.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::gateway::{HEALTHY, MEMBER_BASIC, TOKEN, gateway, http_proxy, member, spawn, spawn_on};
use crate::helpers::{Backend, TestApp, assert_error, read};
use crate::proxies::{HttpProxy, Server, target};

/// A member proxy that answers plain-HTTP requests itself with `answer` (a site blocking
/// its exit address), after `delay`.
async fn answering(answer: &'static str, delay: Duration) -> Server {
    HttpProxy {
        authorization: Some(MEMBER_BASIC),
        answer: Some(answer),
        delay,
        ..HttpProxy::default()
    }
    .start()
    .await
}

const FORBIDDEN: &str =
    "HTTP/1.1 403 Forbidden\r\nContent-Length: 9\r\nConnection: close\r\n\r\nforbidden";

const BLOCK_PAGE: &str = "HTTP/1.1 200 OK\r\nContent-Length: 31\r\nConnection: close\r\n\r\n\
                          <h1>Access Denied</h1> go away";

/// A pool `web` with `gateway` rules, whose members are `first` (at 0 assignments, the
/// first pick) and `second` (at 5).
async fn pool_of(app: &TestApp, gateway: Value, first: &Server, second: &Server) {
    app.create_pool(
        "web",
        json!({"rules": {"allow_private": true}, "gateway": gateway}),
    )
    .await;
    app.seed("web", &[&member("http", first)], Some(0)).await;
    app.seed("web", &[&member("http", second)], Some(5)).await;
}

/// A plain-HTTP request through the gateway with reqwest: status, headers and body.
async fn through(
    app: &TestApp,
    method: Method,
    url: &str,
    body: Option<Vec<u8>>,
) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
    let proxy = reqwest::Proxy::http(format!("http://{}", gateway(app)))
        .expect("a proxy")
        .basic_auth("web", TOKEN);
    let client = reqwest::Client::builder()
        .proxy(proxy)
        .build()
        .expect("a client");
    let mut request = client.request(method, url);
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = request.send().await.expect("answered");
    let status = response.status();
    let headers = response.headers().clone();
    (
        status,
        headers,
        response.bytes().await.expect("a body").to_vec(),
    )
}

/// Each member's ban for `target` (id → banned_until), as listed.
async fn bans(app: &TestApp, target: &str) -> Vec<(String, Value)> {
    let (status, body) = app
        .get(&format!("/pools/web/members?target={target}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut bans: Vec<(String, Value)> = body["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("id").to_owned(),
                m["banned_until"].clone(),
            )
        })
        .collect();
    bans.sort_by(|a, b| a.0.cmp(&b.0));
    bans
}

/// The member `server` is, with `banned`: whether its ban for the target is set.
fn banned(server: &Server, bans: &[(String, Value)]) -> bool {
    let id = member("http", server);
    bans.iter()
        .find(|(member, _)| *member == id)
        .is_some_and(|(_, until)| until.is_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_status_is_retried_through_another_member_and_bans_the_first_for_that_site() {
    for backend in [Backend::Redis, Backend::Embedded] {
        let app = spawn_on(backend, |_| {}).await;
        let site = target(None).await;
        let blocking = answering(FORBIDDEN, Duration::ZERO).await;
        let live = http_proxy().await;
        pool_of(&app, json!({"retry_statuses": [403]}), &blocking, &live).await;
        let url = format!("http://127.0.0.1:{}/health", site.port());
        let (status, headers, body) = through(&app, Method::GET, &url, None).await;
        assert_eq!(
            (status, body.as_slice()),
            (StatusCode::OK, HEALTHY.as_bytes())
        );
        assert_eq!(headers["x-proxy-allocator-attempts"], "2");
        assert_eq!(blocking.seen().len(), 1);
        let bans = bans(&app, "127.0.0.1").await;
        assert!(banned(&blocking, &bans), "{bans:?} {backend:?}");
        assert!(!banned(&live, &bans), "{bans:?}");
        assert!(!banned(&blocking, &self::bans(&app, "other.example").await));
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_page_matched_by_a_pattern_is_retried_and_bans_that_member() {
    let app = spawn().await;
    let site = target(None).await;
    let blocking = answering(BLOCK_PAGE, Duration::ZERO).await;
    let live = http_proxy().await;
    pool_of(
        &app,
        json!({"block_patterns": ["(?i)access denied", "captcha"]}),
        &blocking,
        &live,
    )
    .await;
    let url = format!("http://127.0.0.1:{}/health", site.port());
    let (status, headers, body) = through(&app, Method::GET, &url, None).await;
    assert_eq!(
        (status, body.as_slice()),
        (StatusCode::OK, HEALTHY.as_bytes())
    );
    assert_eq!(headers["x-proxy-allocator-attempts"], "2");
    assert!(banned(&blocking, &bans(&app, "127.0.0.1").await));
    // A page that does not match is passed on as it came, with the whole body.
    let (status, _, body) = through(
        &app,
        Method::GET,
        &format!("http://127.0.0.1:{}/missing", site.port()),
        None,
    )
    .await;
    assert_eq!(
        (status, body.as_slice()),
        (StatusCode::NOT_FOUND, &b"no such page"[..])
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_body_is_sent_again_byte_for_byte_on_the_retry() {
    let app = spawn().await;
    let site = target(None).await;
    let blocking = answering(FORBIDDEN, Duration::ZERO).await;
    let live = http_proxy().await;
    pool_of(&app, json!({"retry_statuses": [403]}), &blocking, &live).await;
    let sent: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    let url = format!("http://127.0.0.1:{}/echo", site.port());
    let (status, headers, body) = through(&app, Method::POST, &url, Some(sent.clone())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-proxy-allocator-attempts"], "2");
    assert_eq!(body, sent);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_retry_limit_is_streamed_and_never_retried() {
    let app = spawn_on(Backend::Embedded, |config| {
        config.gateway_retry_body_max = 1_000
    })
    .await;
    let site = target(None).await;
    let blocking = answering(FORBIDDEN, Duration::ZERO).await;
    let live = http_proxy().await;
    pool_of(&app, json!({"retry_statuses": [403]}), &blocking, &live).await;
    let url = format!("http://127.0.0.1:{}/echo", site.port());
    let (status, headers, body) = through(&app, Method::POST, &url, Some(vec![7; 1_001])).await;
    assert_eq!(
        (status, body.as_slice()),
        (StatusCode::FORBIDDEN, &b"forbidden"[..])
    );
    assert_eq!(headers["x-proxy-allocator-attempts"], "1");
    assert_eq!(live.seen(), Vec::<String>::new());
    // One at the limit is kept, and retried.
    let (status, _, body) = through(&app, Method::POST, &url, Some(vec![7; 1_000])).await;
    assert_eq!((status, body), (StatusCode::OK, vec![7; 1_000]));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_slower_than_response_timeout_ms_is_failed_and_retried() {
    let app = spawn().await;
    let site = target(None).await;
    let slow = answering(FORBIDDEN, Duration::from_secs(5)).await;
    let live = http_proxy().await;
    pool_of(&app, json!({"response_timeout_ms": 300}), &slow, &live).await;
    let url = format!("http://127.0.0.1:{}/health", site.port());
    let (status, headers, body) = through(&app, Method::GET, &url, None).await;
    assert_eq!(
        (status, body.as_slice()),
        (StatusCode::OK, HEALTHY.as_bytes())
    );
    assert_eq!(headers["x-proxy-allocator-attempts"], "2");
    let listed = app.members("web").await;
    let failures: Vec<(String, u64)> = listed
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("id").to_owned(),
                m["consecutive_failures"].as_u64().expect("failures"),
            )
        })
        .collect();
    assert!(
        failures.contains(&(member("http", &slow), 1)),
        "{failures:?}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_last_attempt_the_last_answer_is_passed_on_as_it_came() {
    let app = spawn().await;
    let site = target(None).await;
    let first = answering(FORBIDDEN, Duration::ZERO).await;
    let second = answering(FORBIDDEN, Duration::ZERO).await;
    pool_of(
        &app,
        json!({"attempts": 2, "retry_statuses": [403]}),
        &first,
        &second,
    )
    .await;
    let url = format!("http://127.0.0.1:{}/health", site.port());
    let (status, headers, body) = through(&app, Method::GET, &url, None).await;
    assert_eq!(
        (status, body.as_slice()),
        (StatusCode::FORBIDDEN, &b"forbidden"[..])
    );
    assert_eq!(headers["x-proxy-allocator-attempts"], "2");
    assert_eq!(
        headers["x-proxy-allocator-proxy"],
        member("http", &second).replace("user:s3cret@", "***@")
    );
    let bans = bans(&app, "127.0.0.1").await;
    assert!(banned(&first, &bans) && banned(&second, &bans), "{bans:?}");
    // Both banned: a third request finds no member, and the gateway says so.
    let (status, headers, _) = through(&app, Method::GET, &url, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["x-proxy-allocator"], "no-eligible-proxy");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_with_no_other_member_to_try_is_passed_on() {
    let app = spawn().await;
    let site = target(None).await;
    let first = answering(FORBIDDEN, Duration::ZERO).await;
    app.create_pool(
        "web",
        json!({"rules": {"allow_private": true}, "gateway": {"retry_statuses": [403]}}),
    )
    .await;
    app.seed("web", &[&member("http", &first)], None).await;
    let url = format!("http://127.0.0.1:{}/health", site.port());
    let (status, headers, body) = through(&app, Method::GET, &url, None).await;
    assert_eq!(
        (status, body.as_slice()),
        (StatusCode::FORBIDDEN, &b"forbidden"[..])
    );
    assert_eq!(headers["x-proxy-allocator-attempts"], "1");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_rules_are_checked_when_the_pool_is_saved() {
    let app = spawn().await;
    for (gateway, says) in [
        (
            json!({"block_patterns": ["fine", "(unclosed"]}),
            "gateway.block_patterns: \"(unclosed\" is not a pattern",
        ),
        (
            json!({"block_patterns": ["((a{100}){100}){100}"]}),
            "gateway.block_patterns: \"((a{100}){100}){100}\" is not a pattern",
        ),
        (json!({"attempts": 11}), "gateway.attempts is 1 to 10"),
        (json!({"retry_statuses": [42]}), "gateway.retry_statuses"),
    ] {
        let (status, body) = read(
            app.admin(Method::PUT, "/pools/strict")
                .json(&json!({ "gateway": gateway }))
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
        let message = body["error"]["message"].as_str().expect("a message");
        assert!(message.contains(says), "{message}");
    }
    let (status, body) = read(
        app.admin(Method::PUT, "/pools/strict")
            .json(&json!({"gateway": {"retry_statuses": [429, 403]}}))
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        body["config"]["gateway"],
        json!({"retry_statuses": [403, 429], "block_patterns": [], "response_timeout_ms": 30000})
    );
    app.stop().await;
}
