//! Targets: a `blocked` report naming the host a worker contacted bans that member for that
//! host only, an assign naming the host skips the members banned for it, and the listing
//! shows each member's ban for a host.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::for_each_store;
use crate::helpers::{TestApp, assert_error, read};

/// An assign with a JSON body; returns status and body (Null on 204).
async fn assign_with(app: &TestApp, pool: &str, body: Value) -> (StatusCode, Value) {
    let response = app
        .anonymous(Method::POST, &format!("/pools/{pool}/assign"))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    read(response).await
}

/// The proxy an assign for `target` hands out.
async fn assigned_for(app: &TestApp, pool: &str, target: &str) -> String {
    let (status, body) = assign_with(app, pool, json!({ "target": target })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["proxy"].as_str().expect("proxy").to_owned()
}

/// Posts a report body; status and answer.
async fn report(app: &TestApp, pool: &str, body: Value) -> (StatusCode, Value) {
    read(
        app.anonymous(Method::POST, &format!("/pools/{pool}/outcomes"))
            .json(&body)
            .send()
            .await
            .expect("sent"),
    )
    .await
}

/// Milliseconds since the epoch on this machine, which the stores' clocks share.
fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    u64::try_from(since.expect("after 1970").as_millis()).expect("fits")
}

/// Milliseconds since the epoch of an RFC 3339 time the service wrote.
fn ms_of(text: &Value) -> u64 {
    let text = text
        .as_str()
        .unwrap_or_else(|| panic!("a time, got {text}"));
    let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .expect("RFC 3339");
    u64::try_from(at.unix_timestamp_nanos() / 1_000_000).expect("fits")
}

/// Bans `proxy` for `target` with one `blocked` report: the answer's outcome, and the times
/// on this machine's clock just before and after it.
async fn ban(app: &TestApp, pool: &str, proxy: &str, target: &str) -> (Value, u64, u64) {
    let before = now_ms();
    let (status, body) = report(
        app,
        pool,
        json!({"proxy": proxy, "result": "blocked", "target": target, "status": 403}),
    )
    .await;
    let after = now_ms();
    assert_eq!(status, StatusCode::OK, "{body}");
    (body["outcomes"][0].clone(), before, after)
}

/// Each listed member as (id, banned_until) for `target`.
async fn bans_for(app: &TestApp, pool: &str, target: &str) -> Vec<(String, Value)> {
    let (status, body) = app
        .get(&format!("/pools/{pool}/members?target={target}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("id").to_owned(),
                m["banned_until"].clone(),
            )
        })
        .collect()
}

/// A pool `pool` with `config` and members a, b, c at 0.
async fn three(app: &TestApp, pool: &str, config: Value) {
    app.create_pool(pool, config).await;
    app.seed(pool, &["a", "b", "c"], Some(0)).await;
}

async fn a_ban_reported_again_while_it_lasts_changes_nothing(app: TestApp) {
    three(
        &app,
        "p",
        json!({"health": {"max_consecutive_failures": 1}}),
    )
    .await;
    let block = json!({"proxy": "a", "result": "blocked", "target": "example.com"});
    let (status, body) = report(&app, "p", json!([block, block])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let first = &body["outcomes"][0];
    assert_eq!(first["effect"], json!("banned"));
    assert_eq!(
        body["outcomes"][1],
        json!({"proxy": "a", "result": "blocked", "effect": "ignored", "consecutive_failures": 0,
               "target": "example.com", "banned_until": first["banned_until"]})
    );
    // Not even a pool that trips on the first failure takes it out.
    let (_, pool) = app.get("/pools/p").await;
    assert_eq!(pool["stats"]["tripped"], json!(0), "{pool}");
}

async fn a_repeat_ban_doubles_up_to_the_longest_cooldown(app: TestApp) {
    three(
        &app,
        "p",
        json!({"health": {"target_ban_ms": 200, "max_cooldown_ms": 700}}),
    )
    .await;
    let mut lengths = Vec::new();
    for _ in 0..3 {
        let (outcome, before, after) = ban(&app, "p", "a", "example.com").await;
        assert_eq!(outcome["effect"], json!("banned"), "{outcome}");
        let until = ms_of(&outcome["banned_until"]);
        lengths.push((until - after, until - before));
        // The next ban comes as soon as this one has ended.
        let deadline = Instant::now() + Duration::from_secs(10);
        while bans_for(&app, "p", "example.com").await[0].1 != Value::Null {
            assert!(Instant::now() < deadline, "the ban never ended");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    for ((shortest, longest), expected) in lengths.iter().zip([200, 400, 700]) {
        assert!(
            (*shortest..=*longest).contains(&expected),
            "{lengths:?}: expected {expected}"
        );
    }
}

async fn failed_reports_and_blocks_without_a_target_count_pool_wide_as_before(app: TestApp) {
    three(
        &app,
        "p",
        json!({"health": {"max_consecutive_failures": 2}}),
    )
    .await;
    let (status, body) = report(
        &app,
        "p",
        json!([
            {"proxy": "a", "result": "failed", "target": "example.com"},
            {"proxy": "a", "result": "blocked"},
        ]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["outcomes"],
        json!([
            {"proxy": "a", "result": "failed", "effect": "counted", "consecutive_failures": 1,
             "target": "example.com"},
            {"proxy": "a", "result": "blocked", "effect": "tripped", "consecutive_failures": 2},
        ])
    );
    assert_eq!(
        bans_for(&app, "p", "example.com").await,
        [
            ("a".to_owned(), Value::Null),
            ("b".to_owned(), Value::Null),
            ("c".to_owned(), Value::Null),
        ]
    );
}

async fn a_pool_created_again_under_its_id_has_no_bans(app: TestApp) {
    three(&app, "p", json!({})).await;
    ban(&app, "p", "a", "example.com").await;
    let response = app
        .admin(Method::DELETE, "/pools/p")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    three(&app, "p", json!({})).await;
    assert_eq!(assigned_for(&app, "p", "example.com").await, "a");
    assert_eq!(
        bans_for(&app, "p", "example.com").await,
        [
            ("b".to_owned(), Value::Null),
            ("c".to_owned(), Value::Null),
            ("a".to_owned(), Value::Null),
        ]
    );
}

async fn reports_about_unknown_members_ban_nothing(app: TestApp) {
    three(&app, "p", json!({})).await;
    let (status, body) = report(
        &app,
        "p",
        json!({"proxy": "z", "result": "blocked", "target": "example.com"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcomes"], json!([]));
    assert_eq!(body["unknown"], json!(["z"]));
}

async fn an_invalid_target_is_refused_naming_the_field(app: TestApp) {
    three(&app, "p", json!({})).await;
    for bad in [
        json!("https://example.com/"),
        json!("example.com:443"),
        json!(""),
        json!(7),
    ] {
        let (status, body) = assign_with(&app, "p", json!({"target": bad})).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("target"), "{message}");
    }
    let long = format!("{}.com", "a.".repeat(125));
    assert_eq!(long.len(), 254);
    let (status, body) = assign_with(&app, "p", json!({"target": long})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    let (status, body) = report(
        &app,
        "p",
        json!([
            {"proxy": "a", "result": "blocked", "target": "example.com"},
            {"proxy": "a", "result": "blocked", "target": "exa mple.com"},
        ]),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("[1].target: ")),
        "{body}"
    );
    // Nothing of a refused batch is applied.
    assert_eq!(bans_for(&app, "p", "example.com").await[0].1, Value::Null);
    let (status, body) = app.get("/pools/p/members?target=a%20b").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_query");
    let refused = app
        .admin(Method::PUT, "/pools/q")
        .json(&json!({"health": {"target_ban_ms": 50}}))
        .send()
        .await
        .expect("sent");
    let (status, body) = read(refused).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    assert_eq!(
        body["error"]["message"],
        json!("health: target_ban_ms is 100 to 604800000")
    );
}

for_each_store!(
    a_ban_reported_again_while_it_lasts_changes_nothing,
    a_repeat_ban_doubles_up_to_the_longest_cooldown,
    failed_reports_and_blocks_without_a_target_count_pool_wide_as_before,
    a_pool_created_again_under_its_id_has_no_bans,
    reports_about_unknown_members_ban_nothing,
    an_invalid_target_is_refused_naming_the_field,
);
