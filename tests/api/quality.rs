//! Each member's decaying success rate and latency (`outcomes`, `success_rate`,
//! `latency_ms_ewma` in the listing), from workers' reports, an assign's `done` and the
//! gateway's own measurements, with the exact numbers of the rule in `rules/quality.rs`,
//! and the `latency_ms` a worker may send refused when it is out of range.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::for_each_store;
use crate::gateway::{HEALTHY, curl, member, proxy_pool, spawn_on};
use crate::helpers::{Backend, TestApp, assert_error, read};
use crate::proxies::{HttpProxy, closed_port, target};

/// A member's `(outcomes, success_rate, latency_ms_ewma)` as listed.
async fn quality(app: &TestApp, pool: &str, id: &str) -> (Value, Value, Value) {
    let listed = app
        .members(pool)
        .await
        .into_iter()
        .find(|m| m["member"] == json!(id))
        .unwrap_or_else(|| panic!("{id} is listed"));
    (
        listed["outcomes"].clone(),
        listed["success_rate"].clone(),
        listed["latency_ms_ewma"].clone(),
    )
}

async fn report(app: &TestApp, pool: &str, body: Value) {
    let (status, answer) = app
        .post_json(&format!("/pools/{pool}/outcomes"), body)
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

async fn assign_with(app: &TestApp, pool: &str, body: Value) -> (StatusCode, Value) {
    read(
        app.anonymous(Method::POST, &format!("/pools/{pool}/assign"))
            .json(&body)
            .send()
            .await
            .expect("sent"),
    )
    .await
}

async fn reports_give_each_member_its_success_rate_and_latency_from_its_first_outcome(
    app: TestApp,
) {
    app.create_pool("p", json!({"health": {"max_consecutive_failures": 10}}))
        .await;
    app.seed("p", &["a", "b"], None).await;
    assert_eq!(
        quality(&app, "p", "a").await,
        (json!(0), Value::Null, Value::Null),
        "nothing before the first outcome"
    );
    report(
        &app,
        "p",
        json!({"proxy": "a", "result": "ok", "latency_ms": 100}),
    )
    .await;
    assert_eq!(
        quality(&app, "p", "a").await,
        (json!(1), json!(1.0), json!(100.0)),
        "the first outcome is the average"
    );
    report(
        &app,
        "p",
        json!([
            {"proxy": "a", "result": "ok", "latency_ms": 200},
            {"proxy": "a", "result": "failed"},
            {"proxy": "a", "result": "blocked", "latency_ms": 400},
            {"proxy": "b", "result": "failed"},
        ]),
    )
    .await;
    // The mean of the first outcomes: 3 failures (blocked counts as one) in 4 with two of
    // them ok is 0.5; latencies 100, 200, 400 average 233.333 ms, rounded to the microsecond.
    assert_eq!(
        quality(&app, "p", "a").await,
        (json!(4), json!(0.5), json!(233.333))
    );
    assert_eq!(
        quality(&app, "p", "b").await,
        (json!(1), json!(0.0), Value::Null),
        "a failure without a latency leaves the latency unknown"
    );
}

async fn past_fifty_outcomes_each_new_one_weighs_a_fiftieth(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], None).await;
    let fifty: Vec<Value> = (0..50)
        .map(|_| json!({"proxy": "a", "result": "ok", "latency_ms": 100}))
        .collect();
    report(&app, "p", Value::Array(fifty)).await;
    report(
        &app,
        "p",
        json!({"proxy": "a", "result": "failed", "latency_ms": 600}),
    )
    .await;
    // 1 + (0 - 1) / 50 and 100 + (600 - 100) / 50.
    assert_eq!(
        quality(&app, "p", "a").await,
        (json!(51), json!(0.98), json!(110.0))
    );
}

async fn done_counts_its_outcome_and_latency_in_the_member_s_quality(app: TestApp) {
    app.create_pool("p", json!({"health": {"max_consecutive_failures": 10}}))
        .await;
    app.seed("p", &["a"], Some(0)).await;
    app.seed("p", &["b"], Some(9)).await;
    // An `ok` about a clean member (the store's fast path), then a failure.
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"done": {"proxy": "a", "result": "ok", "latency_ms": 120}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"done": {"proxy": "a", "result": "failed", "latency_ms": 80}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        quality(&app, "p", "a").await,
        (json!(2), json!(0.5), json!(100.0))
    );
    assert_eq!(
        quality(&app, "p", "b").await,
        (json!(0), Value::Null, Value::Null)
    );

    // A lease's `ok` on a least-in-flight pool (the release's fast path) counts for the
    // lease's member.
    app.create_pool(
        "l",
        json!({"policy": "least-in-flight", "max_in_flight": 1}),
    )
    .await;
    app.seed("l", &["a"], None).await;
    let (_, first) = assign_with(&app, "l", json!({})).await;
    let lease = first["lease"]["id"].as_str().expect("a lease").to_owned();
    let (status, body) = assign_with(
        &app,
        "l",
        json!({"done": {"lease": lease, "result": "ok", "latency_ms": 7}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        quality(&app, "l", "a").await,
        (json!(1), json!(1.0), json!(7.0))
    );
}

async fn an_unknown_member_counts_nothing_and_a_member_added_again_starts_afresh(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], None).await;
    let (status, body) = app
        .post_json(
            "/pools/p/outcomes",
            json!([{"proxy": "a", "result": "ok", "latency_ms": 50},
                   {"proxy": "ghost", "result": "ok", "latency_ms": 50}]),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["unknown"], json!(["ghost"]), "{body}");
    assert_eq!(
        quality(&app, "p", "a").await,
        (json!(1), json!(1.0), json!(50.0))
    );
    let (status, body) = read(
        app.admin(Method::POST, "/pools/p/members/remove")
            .json(&json!({"members": ["a"]}))
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    app.seed("p", &["a"], None).await;
    assert_eq!(
        quality(&app, "p", "a").await,
        (json!(0), Value::Null, Value::Null)
    );
}

async fn a_latency_out_of_range_or_not_a_whole_number_is_refused_naming_the_field(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], None).await;
    let hostile = [
        json!(-1),
        json!(600_001),
        json!(u64::MAX),
        json!(1e300),
        json!(1.5),
        json!("100"),
        json!(true),
        json!([1]),
    ];
    for latency in &hostile {
        let (status, body) = app
            .post_json(
                "/pools/p/outcomes",
                json!({"proxy": "a", "result": "ok", "latency_ms": latency}),
            )
            .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
        assert_eq!(
            body["error"]["message"],
            json!("latency_ms is a whole number of milliseconds from 0 to 600000"),
            "{latency}"
        );
        let (status, body) = app
            .post_json(
                "/pools/p/outcomes",
                json!([{"proxy": "a", "result": "ok"},
                       {"proxy": "a", "result": "ok", "latency_ms": latency}]),
            )
            .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
        assert_eq!(
            body["error"]["message"],
            json!("[1].latency_ms is a whole number of milliseconds from 0 to 600000"),
        );
        let (status, body) = assign_with(
            &app,
            "p",
            json!({"done": {"proxy": "a", "result": "ok", "latency_ms": latency}}),
        )
        .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
        assert_eq!(
            body["error"]["message"],
            json!("done.latency_ms is a whole number of milliseconds from 0 to 600000"),
        );
    }
    // Nothing refused was counted; both ends of the range are taken.
    assert_eq!(
        quality(&app, "p", "a").await,
        (json!(0), Value::Null, Value::Null)
    );
    report(
        &app,
        "p",
        json!([{"proxy": "a", "result": "ok", "latency_ms": 600_000},
               {"proxy": "a", "result": "ok", "latency_ms": 0},
               {"proxy": "a", "result": "ok", "latency_ms": null}]),
    )
    .await;
    assert_eq!(
        quality(&app, "p", "a").await,
        (json!(3), json!(1.0), json!(300_000.0))
    );
}

for_each_store!(
    reports_give_each_member_its_success_rate_and_latency_from_its_first_outcome,
    past_fifty_outcomes_each_new_one_weighs_a_fiftieth,
    done_counts_its_outcome_and_latency_in_the_member_s_quality,
    an_unknown_member_counts_nothing_and_a_member_added_again_starts_afresh,
    a_latency_out_of_range_or_not_a_whole_number_is_refused_naming_the_field,
);

/// Waits until the member has `outcomes` counted (the gateway reports `ok` in a task of its
/// own, after the answer), then answers its listing.
async fn counted(app: &TestApp, pool: &str, id: &str, outcomes: u64) -> (Value, Value, Value) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = quality(app, pool, id).await;
        if seen.0 == json!(outcomes) || Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// curl through the gateway's SOCKS5 port, as the pool `pool` with the worker token.
async fn curl_socks(app: &TestApp, pool: &str, url: &str) -> (i32, String) {
    let output = tokio::process::Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "20", "--proxy"])
        .arg(format!(
            "socks5://{}",
            app.socks.expect("the SOCKS5 port listens")
        ))
        .arg("--proxy-user")
        .arg(format!("{pool}:{}", crate::gateway::TOKEN))
        .arg(url)
        .output()
        .await
        .expect("curl runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_counts_each_request_with_the_latency_it_measured_on_every_store() {
    for backend in [Backend::Redis, Backend::Embedded, Backend::Durable] {
        let app = spawn_on(backend, |config| {
            config.gateway_socks_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        })
        .await;
        let site = target(None).await;
        // The member answers each request 300 ms late (a forward's first byte, a tunnel's
        // setup), so the latency the gateway measures is at least that.
        let slow = HttpProxy {
            authorization: Some(crate::gateway::MEMBER_BASIC),
            delay: Duration::from_millis(300),
            ..HttpProxy::default()
        }
        .start()
        .await;
        let id = member("http", &slow);
        let dead = format!("http://127.0.0.1:{}", closed_port());
        proxy_pool(&app, "slow").await;
        app.seed("slow", &[&dead], Some(0)).await;
        app.seed("slow", &[&id], Some(5)).await;
        let url = format!("http://127.0.0.1:{}/health", site.port());
        // A forward: the dead member, picked first, fails and the slow one serves.
        assert_eq!(curl(&app, "slow", &[&url]).await, (0, HEALTHY.to_owned()));
        let (outcomes, success, latency) = counted(&app, "slow", &id, 1).await;
        assert_eq!(
            (&outcomes, &success),
            (&json!(1), &json!(1.0)),
            "{backend:?}"
        );
        let forward = latency.as_f64().expect("a latency");
        assert!((300.0..5000.0).contains(&forward), "{backend:?}: {forward}");
        assert_eq!(
            quality(&app, "slow", &dead).await,
            (json!(1), json!(0.0), Value::Null),
            "{backend:?}: a failure the gateway reports carries no latency"
        );
        // Then a CONNECT tunnel and a SOCKS5 one, each timed to the end of its setup.
        let (status, body) = read(
            app.admin(Method::POST, "/pools/slow/members/disable")
                .json(&json!({"members": [dead]}))
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            curl(&app, "slow", &["--proxytunnel", &url]).await,
            (0, HEALTHY.to_owned())
        );
        assert_eq!(
            curl_socks(&app, "slow", &url).await,
            (0, HEALTHY.to_owned())
        );
        let (outcomes, success, latency) = counted(&app, "slow", &id, 3).await;
        assert_eq!(
            (&outcomes, &success),
            (&json!(3), &json!(1.0)),
            "{backend:?}"
        );
        let all = latency.as_f64().expect("a latency");
        assert!((300.0..5000.0).contains(&all), "{backend:?}: {all}");
        app.stop().await;
    }
}
