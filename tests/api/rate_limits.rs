//! Client rate limits (`rate_per_second` and `burst` of `PUT /clients/{client}`): a token
//! bucket per client and pool, kept in the store and shared by every replica, on every
//! store, through the API.

use std::time::{Duration, Instant};

use reqwest::header::RETRY_AFTER;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp, assert_error, backend_config, read, shared_redis_url};

const WORKER: &str = "test-worker-token";

const BACKENDS: [Backend; 3] = [Backend::Embedded, Backend::Redis, Backend::Durable];

fn config(backend: Backend) -> proxy_allocator::config::Config {
    let mut config = backend_config(backend);
    config.worker_token = Some(WORKER.to_owned());
    config
}

async fn put_client(app: &TestApp, client: &str, body: &Value) -> (StatusCode, Value) {
    read(
        app.admin(Method::PUT, &format!("/clients/{client}"))
            .json(body)
            .send()
            .await
            .expect("sent"),
    )
    .await
}

/// A new client with `body`'s configuration: its token.
async fn client(app: &TestApp, client: &str, body: &Value) -> String {
    let (status, created) = put_client(app, client, body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    created["token"].as_str().expect("a token").to_owned()
}

/// An assign on `pool` with `token` and `body`: its status, its `Retry-After` and its body.
async fn assign(
    app: &TestApp,
    pool: &str,
    token: &str,
    body: &Value,
) -> (StatusCode, Option<u64>, Value) {
    let response = app
        .anonymous(Method::POST, &format!("/pools/{pool}/assign"))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .expect("sent");
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .map(|v| v.to_str().expect("text").parse().expect("whole seconds"));
    let (status, body) = read(response).await;
    (status, retry_after, body)
}

/// A pool with one member at count 0.
async fn pool(app: &TestApp, id: &str) {
    app.create_pool(id, json!({})).await;
    app.seed(id, &["http://m.example:3128"], Some(0)).await;
}

/// The one member's count.
async fn assignments(app: &TestApp, id: &str) -> u64 {
    app.counts(id).await[0].1
}

#[tokio::test]
async fn a_client_at_rate_5_burst_5_gets_5_assigns_then_429_with_retry_after_1() {
    for backend in BACKENDS {
        let app = TestApp::spawn_with(config(backend)).await;
        pool(&app, "web").await;
        let body = json!({"pools": ["web"], "rate_per_second": 5, "burst": 5});
        let token = client(&app, "team-a", &body).await;
        assert_eq!(
            app.get("/clients/team-a").await,
            (
                StatusCode::OK,
                json!({"client": "team-a", "pools": ["web"], "rate_per_second": 5, "burst": 5})
            )
        );
        for n in 1..=5 {
            let (status, _, body) = assign(&app, "web", &token, &json!({})).await;
            assert_eq!((status, &body["assignments"]), (StatusCode::OK, &json!(n)));
        }
        let (status, retry_after, body) = assign(&app, "web", &token, &json!({})).await;
        assert_error(
            status,
            &body,
            StatusCode::TOO_MANY_REQUESTS,
            "client_rate_limited",
        );
        assert_eq!(retry_after, Some(1), "{backend:?}");
        // Nothing was handed out.
        assert_eq!(assignments(&app, "web").await, 5, "{backend:?}");
        // The durable store keeps the rate with the client (the buckets are not kept).
        if let Some(check) = app.durability_check() {
            check.verify().await;
        }
        app.stop().await;
    }
}

#[tokio::test]
async fn the_burst_defaults_to_the_rate_and_a_client_without_a_rate_is_not_limited() {
    let app = TestApp::spawn_with(config(Backend::Embedded)).await;
    pool(&app, "web").await;
    let (status, created) = put_client(
        &app,
        "slow",
        &json!({"pools": ["web"], "rate_per_second": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        (&created["rate_per_second"], &created["burst"]),
        (&json!(2), &json!(2))
    );
    let free = client(&app, "free", &json!({"pools": ["web"]})).await;
    for _ in 0..20 {
        assert_eq!(
            assign(&app, "web", &free, &json!({})).await.0,
            StatusCode::OK
        );
    }
    // Replacing the client without a rate takes its limit away.
    let token = created["token"].as_str().expect("a token");
    for _ in 0..2 {
        assert_eq!(
            assign(&app, "web", token, &json!({})).await.0,
            StatusCode::OK
        );
    }
    assert_eq!(
        assign(&app, "web", token, &json!({})).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    put_client(&app, "slow", &json!({"pools": ["web"]})).await;
    assert_eq!(
        assign(&app, "web", token, &json!({})).await.0,
        StatusCode::OK
    );
    app.stop().await;
}

#[tokio::test]
async fn a_worker_token_assign_is_never_limited_by_a_client_bucket() {
    for backend in BACKENDS {
        let app = TestApp::spawn_with(config(backend)).await;
        pool(&app, "web").await;
        let token = client(
            &app,
            "team-a",
            &json!({"pools": ["web"], "rate_per_second": 1}),
        )
        .await;
        assert_eq!(
            assign(&app, "web", &token, &json!({})).await.0,
            StatusCode::OK
        );
        assert_eq!(
            assign(&app, "web", &token, &json!({})).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
        for _ in 0..30 {
            let (status, retry_after, _) = assign(&app, "web", WORKER, &json!({})).await;
            assert_eq!((status, retry_after), (StatusCode::OK, None), "{backend:?}");
        }
        assert_eq!(assignments(&app, "web").await, 31, "{backend:?}");
        app.stop().await;
    }
}

#[tokio::test]
async fn an_assign_of_several_takes_a_token_per_member_asked_for() {
    for backend in BACKENDS {
        let app = TestApp::spawn_with(config(backend)).await;
        app.create_pool("web", json!({})).await;
        app.seed(
            "web",
            &[
                "http://a.example:1",
                "http://b.example:1",
                "http://c.example:1",
            ],
            Some(0),
        )
        .await;
        let body = json!({"pools": ["web"], "rate_per_second": 1, "burst": 5});
        let token = client(&app, "team-a", &body).await;
        let (status, _, body) = assign(&app, "web", &token, &json!({"count": 3})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["assigned"].as_array().expect("a list").len(), 3);
        // Two tokens left (and a few thousandths): three are refused, two are not.
        let (status, retry_after, body) = assign(&app, "web", &token, &json!({"count": 3})).await;
        assert_error(
            status,
            &body,
            StatusCode::TOO_MANY_REQUESTS,
            "client_rate_limited",
        );
        assert_eq!(retry_after, Some(1), "{backend:?}");
        let (status, _, body) = assign(&app, "web", &token, &json!({"count": 2})).await;
        assert_eq!(
            body["assigned"].as_array().map(Vec::len),
            Some(2),
            "{backend:?}"
        );
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            assign(&app, "web", &token, &json!({})).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
        app.stop().await;
    }
}

#[tokio::test]
async fn tokens_come_back_at_the_rate_after_the_bucket_is_empty() {
    for backend in BACKENDS {
        let app = TestApp::spawn_with(config(backend)).await;
        pool(&app, "web").await;
        // A token every 10 ms, at most one held.
        let body = json!({"pools": ["web"], "rate_per_second": 100, "burst": 1});
        let token = client(&app, "team-a", &body).await;
        // Before the assign that empties the bucket: the store takes its token after this
        // instant, so it cannot come back sooner than 10 ms (9 and a bit on a ms clock) after.
        let emptied = Instant::now();
        assert_eq!(
            assign(&app, "web", &token, &json!({})).await.0,
            StatusCode::OK
        );
        let (status, retry_after, _) = assign(&app, "web", &token, &json!({})).await;
        assert_eq!(
            (status, retry_after),
            (StatusCode::TOO_MANY_REQUESTS, Some(1))
        );
        let mut refused = 1;
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            match assign(&app, "web", &token, &json!({})).await.0 {
                StatusCode::OK => break,
                StatusCode::TOO_MANY_REQUESTS => refused += 1,
                other => panic!("{other}"),
            }
            assert!(emptied.elapsed() < Duration::from_secs(2), "{backend:?}");
        }
        // The token came back after 10 ms, not before.
        assert!(emptied.elapsed() >= Duration::from_millis(9), "{backend:?}");
        assert!(refused >= 1);
        assert_eq!(assignments(&app, "web").await, 2, "{backend:?}");
        app.stop().await;
    }
}

#[tokio::test]
async fn each_pool_has_its_own_bucket_for_a_client() {
    for backend in BACKENDS {
        let app = TestApp::spawn_with(config(backend)).await;
        pool(&app, "web").await;
        pool(&app, "eu-west").await;
        let body = json!({"pools": ["web", "eu-*"], "rate_per_second": 1, "burst": 2});
        let token = client(&app, "team-a", &body).await;
        for pool in ["web", "eu-west"] {
            for _ in 0..2 {
                assert_eq!(
                    assign(&app, pool, &token, &json!({})).await.0,
                    StatusCode::OK
                );
            }
            let (status, retry_after, _) = assign(&app, pool, &token, &json!({})).await;
            assert_eq!(
                (status, retry_after),
                (StatusCode::TOO_MANY_REQUESTS, Some(1))
            );
        }
        app.stop().await;
    }
}

#[tokio::test]
async fn a_refused_assign_in_a_session_or_with_done_changes_nothing() {
    for backend in BACKENDS {
        let app = TestApp::spawn_with(config(backend)).await;
        pool(&app, "web").await;
        let body = json!({"pools": ["web"], "rate_per_second": 1, "burst": 1});
        let token = client(&app, "team-a", &body).await;
        let (status, _, first) = assign(&app, "web", &token, &json!({"session": "s1"})).await;
        assert_eq!(status, StatusCode::OK, "{first}");
        let member = first["proxy"].as_str().expect("a member").to_owned();
        let (status, retry_after, body) =
            assign(&app, "web", &token, &json!({"session": "s1"})).await;
        assert_error(
            status,
            &body,
            StatusCode::TOO_MANY_REQUESTS,
            "client_rate_limited",
        );
        assert_eq!(retry_after, Some(1));
        // A failure in `done` is not applied when the assign is refused.
        let done = json!({"done": {"proxy": member, "result": "failed"}});
        let (status, _, body) = assign(&app, "web", &token, &done).await;
        assert_error(
            status,
            &body,
            StatusCode::TOO_MANY_REQUESTS,
            "client_rate_limited",
        );
        let with_session = json!({"done": {"proxy": member, "result": "failed"}, "session": "s1"});
        let (status, _, body) = assign(&app, "web", &token, &with_session).await;
        assert_error(
            status,
            &body,
            StatusCode::TOO_MANY_REQUESTS,
            "client_rate_limited",
        );
        let members = app.members("web").await;
        assert_eq!(
            members[0]["consecutive_failures"],
            json!(0),
            "{backend:?}: {members:?}"
        );
        assert_eq!(assignments(&app, "web").await, 1, "{backend:?}");
        app.stop().await;
    }
}

#[tokio::test]
async fn two_replicas_on_one_redis_share_a_client_bucket() {
    let mut first_config = config(Backend::Redis);
    first_config.redis_url = Some(shared_redis_url());
    let mut second_config = config(Backend::Redis);
    second_config.key_prefix = first_config.key_prefix.clone();
    let first = TestApp::spawn_with(first_config).await;
    let second = TestApp::spawn_with(second_config).await;
    pool(&first, "web").await;
    // One token a second, ten at most: within the second this takes, about ten in all.
    let body = json!({"pools": ["web"], "rate_per_second": 1, "burst": 10});
    let token = client(&first, "team-a", &body).await;
    let started = Instant::now();
    let mut granted = [0u64; 2];
    for round in 0..40 {
        let replica = round % 2;
        let app = if replica == 0 { &first } else { &second };
        match assign(app, "web", &token, &json!({})).await.0 {
            StatusCode::OK => granted[replica] += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("{other}"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let total = granted[0] + granted[1];
    // The sum stays within the burst plus what the rate added meanwhile.
    assert!(total >= 10, "{granted:?}");
    assert!(
        total as f64 <= 10.0 + elapsed.ceil(),
        "{granted:?} in {elapsed} s"
    );
    assert!(granted[0] >= 5 && granted[1] >= 5, "{granted:?}");
    assert_eq!(assignments(&first, "web").await, total);
    first.stop().await;
    second.stop().await;
}

#[tokio::test]
async fn a_rate_or_burst_out_of_range_is_refused_naming_the_field() {
    let app = TestApp::spawn_with(config(Backend::Embedded)).await;
    let cases = [
        (
            json!({"pools": [], "rate_per_second": 0}),
            "rate_per_second: ",
        ),
        (
            json!({"pools": [], "rate_per_second": -1}),
            "rate_per_second: ",
        ),
        (
            json!({"pools": [], "rate_per_second": 100_001}),
            "rate_per_second: ",
        ),
        (
            json!({"pools": [], "rate_per_second": 1e300}),
            "rate_per_second: ",
        ),
        (
            json!({"pools": [], "rate_per_second": u64::MAX}),
            "rate_per_second: ",
        ),
        (
            json!({"pools": [], "rate_per_second": 2.5}),
            "rate_per_second: ",
        ),
        (
            json!({"pools": [], "rate_per_second": 1, "burst": 0}),
            "burst: ",
        ),
        (
            json!({"pools": [], "rate_per_second": 1, "burst": -3}),
            "burst: ",
        ),
        (
            json!({"pools": [], "rate_per_second": 1, "burst": 1_000_001}),
            "burst: ",
        ),
        // A burst without a rate limits nothing, but is checked all the same.
        (json!({"pools": [], "burst": 0}), "burst: "),
    ];
    for (body, field) in cases {
        let (status, answer) = put_client(&app, "team-a", &body).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST, "invalid_request");
        let message = answer["error"]["message"].as_str().expect("a message");
        assert!(message.starts_with(field), "{body}: {message}");
    }
    let (status, body) = put_client(
        &app,
        "team-a",
        &json!({"pools": [], "rate_per_second": "5"}),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    assert_eq!(
        app.get("/clients").await,
        (StatusCode::OK, json!({"clients": []}))
    );
    app.stop().await;
}
