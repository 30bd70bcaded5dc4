//! `GET /pools/{pool}/activity`: exact per-second counts of assigns, 204s and reports after
//! a known sequence, as this replica's sampler moves them into the pool's ring.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::for_each_store;
use crate::helpers::{Backend, TestApp, assert_error, backend_config};

/// The series of an activity answer, in the answer's order.
const SERIES: [&str; 5] = ["assigns", "empty", "ok", "failed", "blocked"];

/// Every series summed, by name.
fn totals(activity: &Value) -> Value {
    SERIES
        .iter()
        .map(|name| {
            let sum: u64 = activity[name]
                .as_array()
                .unwrap_or_else(|| panic!("{name} is an array: {activity}"))
                .iter()
                .map(|n| n.as_u64().expect("a count"))
                .sum();
            ((*name).to_owned(), json!(sum))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The activity of `pool` once `done` holds for it, polled every 50 ms for up to 5 s (the
/// sampler moves counts once a second).
async fn activity_once(app: &TestApp, pool: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, activity) = app.get(&format!("/pools/{pool}/activity")).await;
        assert_eq!(status, StatusCode::OK, "{activity}");
        if done(&activity) {
            return activity;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting on the activity of {pool}: {activity}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `until` in Unix seconds, checking that it is a whole second.
fn until_seconds(activity: &Value) -> i64 {
    let text = activity["until"].as_str().expect("until is text");
    let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .expect("until is RFC 3339");
    assert_eq!(at.nanosecond(), 0, "{text} is a whole second");
    at.unix_timestamp()
}

async fn activity_counts_assigns_204s_and_reports_of_the_pool_per_second(app: TestApp) {
    app.create_pool("web", json!({})).await;
    app.seed("web", &["a", "b"], None).await;
    for _ in 0..3 {
        assert_eq!(app.assign("web").await.0, StatusCode::OK);
    }
    // An assign that reports how the last one went: one assign, one `ok`.
    let (status, _) = app
        .post_json(
            "/pools/web/assign",
            json!({"done": {"proxy": "a", "result": "ok"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    app.post_json("/pools/web/members/disable", json!({"members": ["a", "b"]}))
        .await;
    for _ in 0..2 {
        assert_eq!(app.assign("web").await.0, StatusCode::NO_CONTENT);
    }
    app.post_json("/pools/web/members/enable", json!({"members": ["a", "b"]}))
        .await;
    // Four reports about members and one about a member the pool does not have, which
    // counts nowhere.
    let (status, _) = app
        .post_json(
            "/pools/web/outcomes",
            json!([
                {"proxy": "a", "result": "ok"},
                {"proxy": "b", "result": "ok"},
                {"proxy": "a", "result": "failed"},
                {"proxy": "b", "result": "blocked", "target": "shop.example.com"},
                {"proxy": "nobody", "result": "failed"},
            ]),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    let expected = json!({"assigns": 4, "empty": 2, "ok": 3, "failed": 1, "blocked": 1});
    let activity = activity_once(&app, "web", |a| totals(a) == expected).await;
    assert_eq!(activity["pool"], "web");
    assert_eq!(activity["interval_ms"], 1000);
    assert_eq!(activity["counted"], true);
    for name in SERIES {
        assert_eq!(activity[name].as_array().map(Vec::len), Some(300), "{name}");
    }
    let until = until_seconds(&activity);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    assert!((now - 2..=now).contains(&until), "until {until}, now {now}");
    // Everything happened in the last few seconds: at the end of the series.
    let assigns = activity["assigns"].as_array().expect("an array");
    assert!(assigns[..290].iter().all(|n| n == 0), "{activity}");

    // Later samples move nothing twice: the totals stay, the window moves on.
    let later = activity_once(&app, "web", |a| until_seconds(a) > until).await;
    assert_eq!(totals(&later), expected);
}

async fn activity_of_a_pool_that_does_not_exist_is_404_pool_not_found(app: TestApp) {
    let (status, body) = app.get("/pools/nope/activity").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
}

async fn a_leased_assign_counts_as_an_assign(app: TestApp) {
    app.create_pool("leases", json!({"policy": "least-in-flight"}))
        .await;
    app.seed("leases", &["a", "b"], None).await;
    for _ in 0..2 {
        assert_eq!(app.assign("leases").await.0, StatusCode::OK);
    }
    let expected = json!({"assigns": 2, "empty": 0, "ok": 0, "failed": 0, "blocked": 0});
    activity_once(&app, "leases", |a| totals(a) == expected).await;
}

for_each_store!(
    activity_counts_assigns_204s_and_reports_of_the_pool_per_second,
    activity_of_a_pool_that_does_not_exist_is_404_pool_not_found,
    a_leased_assign_counts_as_an_assign,
);

#[tokio::test]
async fn a_pool_beyond_metrics_max_pools_is_not_counted_and_says_so() {
    let mut config = backend_config(Backend::Embedded);
    config.metrics_max_pools = 1;
    let app = TestApp::spawn_with(config).await;
    for pool in ["first", "second"] {
        app.create_pool(pool, json!({})).await;
        app.seed(pool, &["a"], None).await;
        assert_eq!(app.assign(pool).await.0, StatusCode::OK);
    }
    let expected = json!({"assigns": 1, "empty": 0, "ok": 0, "failed": 0, "blocked": 0});
    activity_once(&app, "first", |a| totals(a) == expected).await;

    let (status, second) = app.get("/pools/second/activity").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(second["counted"], false);
    for name in SERIES {
        assert_eq!(second[name], json!([]), "{name}");
    }
    app.stop().await;
}
