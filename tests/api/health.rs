//! Health: outcome reports, thresholds, cooldowns with backoff and jitter, automatic
//! returns under the restore policy (exactly once across replicas), operator-disabled
//! members, and `Retry-After` on a 204.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::for_each_store;
use crate::helpers::{
    Backend, TestApp, assert_error, backend_config, read, shared_redis_url, test_config,
};
use crate::spy::spawn_spied;

/// A pool whose `health` is `health` (jitter 0 unless it says otherwise, so cooldowns are
/// exact). Pool configs are built here so that later settings (such as `rules`) have one
/// place to go.
fn pool_config(health: Value) -> Value {
    let mut health = health;
    if health.get("jitter_percent").is_none() {
        health["jitter_percent"] = json!(0);
    }
    json!({ "health": health })
}

/// Creates `pool` with `health` rules and seeds `members` at 0.
async fn health_pool(app: &TestApp, pool: &str, health: Value, members: &[&str]) {
    app.create_pool(pool, pool_config(health)).await;
    app.seed(pool, members, Some(0)).await;
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

/// Reports one result about one member; returns `(effect, consecutive_failures)`.
async fn one(app: &TestApp, pool: &str, proxy: &str, result: &str) -> (String, u64) {
    let (status, body) = report(app, pool, json!({"proxy": proxy, "result": result})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let outcome = &body["outcomes"][0];
    (
        outcome["effect"].as_str().expect("effect").to_owned(),
        outcome["consecutive_failures"].as_u64().expect("streak"),
    )
}

/// The listing entry of one member.
async fn member(app: &TestApp, pool: &str, id: &str) -> Value {
    app.members(pool)
        .await
        .into_iter()
        .find(|m| m["member"] == json!(id))
        .unwrap_or_else(|| panic!("{id} is listed"))
}

/// Polls until `id` is in `state`; returns the listing entry.
async fn await_state(app: &TestApp, pool: &str, id: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let entry = member(app, pool, id).await;
        if entry["state"] == json!(state) {
            return entry;
        }
        assert!(Instant::now() < deadline, "{id} stayed {entry}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The pool's `(tripped, recovered)` stats.
async fn health_totals(app: &TestApp, pool: &str) -> (u64, u64) {
    let (status, body) = app.get(&format!("/pools/{pool}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    (
        body["stats"]["tripped"].as_u64().expect("tripped"),
        body["stats"]["recovered"].as_u64().expect("recovered"),
    )
}

/// Reports `failed` until the member trips; returns the cooldown it was given.
async fn trip(app: &TestApp, pool: &str, id: &str) -> u64 {
    loop {
        let (effect, _) = one(app, pool, id, "failed").await;
        if effect == "tripped" {
            break;
        }
        assert_eq!(effect, "counted");
    }
    member(app, pool, id).await["last_cooldown_ms"]
        .as_u64()
        .expect("a cooldown")
}

async fn a_member_cools_down_at_max_consecutive_failures_and_not_before(app: TestApp) {
    health_pool(
        &app,
        "p",
        json!({"max_consecutive_failures": 3}),
        &["a", "b"],
    )
    .await;
    assert_eq!(one(&app, "p", "a", "failed").await, ("counted".into(), 1));
    assert_eq!(one(&app, "p", "a", "blocked").await, ("counted".into(), 2));
    let a = member(&app, "p", "a").await;
    assert_eq!(
        (&a["state"], &a["consecutive_failures"]),
        (&json!("eligible"), &json!(2))
    );
    assert_eq!(one(&app, "p", "a", "failed").await, ("tripped".into(), 3));
    let a = member(&app, "p", "a").await;
    assert_eq!(
        (
            &a["state"],
            &a["reason"],
            &a["consecutive_failures"],
            &a["last_cooldown_ms"]
        ),
        (
            &json!("ineligible"),
            &json!("unhealthy"),
            &json!(3),
            &json!(60000)
        )
    );
    // Both from the store's clock at the trip, in the API's one timestamp format, exactly
    // the cooldown apart (jitter 0).
    let at = |field: &str| {
        let text = a[field].as_str().expect("a timestamp");
        assert_eq!((text.len(), &text[19..20]), (24, "."), "{field}: {text}");
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            .expect("RFC 3339")
    };
    assert_eq!(
        (at("returns_at") - at("since")).whole_milliseconds(),
        60_000
    );
    for _ in 0..3 {
        assert_eq!(app.assigned("p").await.0, "b");
    }
    assert_eq!(health_totals(&app, "p").await, (1, 0));
}

async fn a_blocked_report_that_trips_a_member_records_reason_blocked(app: TestApp) {
    health_pool(&app, "p", json!({"max_consecutive_failures": 2}), &["a"]).await;
    one(&app, "p", "a", "failed").await;
    assert_eq!(one(&app, "p", "a", "blocked").await, ("tripped".into(), 2));
    assert_eq!(member(&app, "p", "a").await["reason"], json!("blocked"));
}

async fn an_ok_report_clears_the_failure_streak(app: TestApp) {
    health_pool(&app, "p", json!({"max_consecutive_failures": 3}), &["a"]).await;
    one(&app, "p", "a", "failed").await;
    one(&app, "p", "a", "failed").await;
    assert_eq!(one(&app, "p", "a", "ok").await, ("counted".into(), 0));
    assert_eq!(one(&app, "p", "a", "failed").await, ("counted".into(), 1));
    assert_eq!(one(&app, "p", "a", "failed").await, ("counted".into(), 2));
    let a = member(&app, "p", "a").await;
    assert_eq!(
        (&a["state"], &a["consecutive_failures"]),
        (&json!("eligible"), &json!(2))
    );
}

async fn each_repeated_trip_multiplies_the_cooldown_up_to_the_maximum(app: TestApp) {
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 100,
                        "max_cooldown_ms": 400, "backoff": 2});
    health_pool(&app, "p", health, &["a"]).await;
    let mut cooldowns = Vec::new();
    for _ in 0..4 {
        cooldowns.push(trip(&app, "p", "a").await);
        let back = await_state(&app, "p", "a", "eligible").await;
        // The backoff is remembered after the return, until a success.
        assert_eq!(back["consecutive_failures"], json!(0), "{back}");
    }
    assert_eq!(cooldowns, [100, 200, 400, 400]);
    assert_eq!(health_totals(&app, "p").await, (4, 4));
}

async fn a_success_after_a_return_resets_the_backoff(app: TestApp) {
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 100,
                        "max_cooldown_ms": 10000, "backoff": 3});
    health_pool(&app, "p", health, &["a"]).await;
    assert_eq!(trip(&app, "p", "a").await, 100);
    await_state(&app, "p", "a", "eligible").await;
    assert_eq!(trip(&app, "p", "a").await, 300);
    await_state(&app, "p", "a", "eligible").await;
    assert_eq!(one(&app, "p", "a", "ok").await, ("counted".into(), 0));
    assert_eq!(member(&app, "p", "a").await.get("last_cooldown_ms"), None);
    assert_eq!(trip(&app, "p", "a").await, 100);
}

async fn jitter_keeps_each_cooldown_within_its_percentage(app: TestApp) {
    let members: Vec<String> = (0..12).map(|i| format!("m{i:02}")).collect();
    let ids: Vec<&str> = members.iter().map(String::as_str).collect();
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 10000,
                        "max_cooldown_ms": 60000, "jitter_percent": 20});
    health_pool(&app, "p", health, &ids).await;
    let mut cooldowns = Vec::new();
    for id in &ids {
        cooldowns.push(trip(&app, "p", id).await);
    }
    assert!(
        cooldowns.iter().all(|c| (8000..=12000).contains(c)),
        "{cooldowns:?}"
    );
    // Twelve draws that all land on one millisecond would mean no jitter at all.
    assert!(
        cooldowns.iter().any(|c| *c != cooldowns[0]),
        "{cooldowns:?}"
    );
}

async fn outcome_reports_never_change_assignment_counts(app: TestApp) {
    health_pool(
        &app,
        "p",
        json!({"max_consecutive_failures": 2}),
        &["a", "b"],
    )
    .await;
    for _ in 0..4 {
        app.assigned("p").await;
    }
    let before = app.counts("p").await;
    let (status, body) = report(
        &app,
        "p",
        json!([{"proxy": "a", "result": "ok", "status": 200},
               {"proxy": "b", "result": "failed", "status": 502},
               {"proxy": "a", "result": "failed"},
               {"proxy": "b", "result": "blocked", "status": 403}]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["outcomes"],
        json!([
            {"proxy": "a", "result": "ok", "effect": "counted", "consecutive_failures": 0},
            {"proxy": "b", "result": "failed", "effect": "counted", "consecutive_failures": 1},
            {"proxy": "a", "result": "failed", "effect": "counted", "consecutive_failures": 1},
            {"proxy": "b", "result": "blocked", "effect": "tripped", "consecutive_failures": 2},
        ])
    );
    let after = app.counts("p").await;
    let counts = |rows: &[(String, u64, String)]| -> Vec<(String, u64)> {
        let mut pairs: Vec<_> = rows.iter().map(|(m, n, _)| (m.clone(), *n)).collect();
        pairs.sort();
        pairs
    };
    assert_eq!(counts(&after), counts(&before));
    assert_eq!(counts(&after), [("a".to_owned(), 2), ("b".to_owned(), 2)]);
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["total_assignments"], json!(4));
}

async fn unknown_members_are_reported_as_unknown_and_the_rest_of_the_batch_applies(app: TestApp) {
    health_pool(&app, "p", json!({}), &["a"]).await;
    let (status, body) = report(
        &app,
        "p",
        json!([{"proxy": "ghost", "result": "failed"},
               {"proxy": "has space", "result": "failed"},
               {"proxy": "a", "result": "failed"}]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"pool": "p",
               "outcomes": [{"proxy": "a", "result": "failed", "effect": "counted",
                             "consecutive_failures": 1}],
               "unknown": ["ghost"],
               "rejected": [{"member": "has space", "reason": "invalid_characters"}]})
    );
}

async fn a_report_finds_an_address_in_any_written_form(app: TestApp) {
    health_pool(&app, "p", json!({}), &["HTTP://8.8.4.4:3128/"]).await;
    let (status, body) = report(
        &app,
        "p",
        json!({"proxy": "8.8.4.4:3128", "result": "failed"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["outcomes"],
        json!([{"proxy": "http://8.8.4.4:3128", "result": "failed", "effect": "counted",
                "consecutive_failures": 1}])
    );
    assert_eq!(body["unknown"], json!([]));
}

async fn malformed_reports_answer_400_and_unknown_pools_404(app: TestApp) {
    health_pool(&app, "p", json!({}), &["a"]).await;
    for bad in [
        json!({"proxy": "a", "result": "maybe"}),
        json!({"proxy": "a"}),
        json!({"outcomes": [{"proxy": "a", "result": "ok"}]}),
        json!({"proxy": "a", "result": "ok", "extra": 1}),
    ] {
        let (status, body) = report(&app, "p", bad).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    }
    let (status, body) = report(
        &app,
        "p",
        json!({"proxy": "a", "result": "ok", "status": 99}),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    let (status, body) = report(&app, "nope", json!({"proxy": "a", "result": "ok"})).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
}

async fn nonsense_health_settings_answer_400(app: TestApp) {
    for health in [
        json!({"max_consecutive_failures": 0}),
        json!({"cooldown_ms": 50}),
        json!({"max_cooldown_ms": 99}),
        json!({"backoff": 0}),
        json!({"jitter_percent": 90}),
        json!({"check": {"kind": "http"}}),
        json!({"check": {"kind": "tcp", "interval_ms": 1000, "timeout_ms": 60001}}),
    ] {
        let response = app
            .admin(Method::PUT, "/pools/p")
            .json(&json!({ "health": health }))
            .send()
            .await
            .expect("sent");
        let (status, body) = read(response).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    }
}

async fn members_disabled_by_an_operator_never_return_by_themselves(app: TestApp) {
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 100});
    health_pool(&app, "p", health, &["a", "b", "c"]).await;
    app.post_json(
        "/pools/p/members/disable",
        json!({"members": ["a"], "reason": "maintenance"}),
    )
    .await;
    // Reports about a member an operator took out change nothing.
    assert_eq!(one(&app, "p", "a", "failed").await, ("ignored".into(), 0));
    // Disabling a member that is cooling down cancels its return.
    trip(&app, "p", "b").await;
    let (_, body) = app
        .post_json(
            "/pools/p/members/disable",
            json!({"members": ["b"], "reason": "maintenance"}),
        )
        .await;
    assert_eq!(body["disabled"], json!(["b"]));
    // Well past the cooldown and several sweeps, with assigns running.
    for _ in 0..10 {
        app.assigned("p").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in ["a", "b"] {
        let entry = member(&app, "p", id).await;
        assert_eq!(
            (&entry["state"], &entry["reason"], entry.get("returns_at")),
            (&json!("ineligible"), &json!("maintenance"), None),
            "{entry}"
        );
    }
    assert_eq!(health_totals(&app, "p").await, (1, 0));
}

async fn enabling_a_cooling_member_brings_it_back_at_once(app: TestApp) {
    health_pool(&app, "p", json!({"max_consecutive_failures": 1}), &["a"]).await;
    trip(&app, "p", "a").await;
    let (_, body) = app
        .post_json("/pools/p/members/enable", json!({"members": ["a"]}))
        .await;
    assert_eq!(body["enabled"][0]["member"], json!("a"));
    let a = member(&app, "p", "a").await;
    assert_eq!(
        (&a["state"], a.get("returns_at"), &a["consecutive_failures"]),
        (&json!("eligible"), None, &json!(0))
    );
}

async fn a_returning_member_comes_back_under_the_pools_restore_policy(app: TestApp) {
    let config = json!({"restore": "minimum",
                        "health": {"max_consecutive_failures": 1, "cooldown_ms": 300,
                                   "jitter_percent": 0}});
    app.create_pool("p", config).await;
    app.seed("p", &["a", "b"], Some(0)).await;
    trip(&app, "p", "a").await;
    for _ in 0..5 {
        assert_eq!(app.assigned("p").await.0, "b");
    }
    let a = await_state(&app, "p", "a", "eligible").await;
    // Back at the minimum among eligible members (b's 5), not at its kept 0.
    assert_eq!(a["assignments"], json!(5), "{a}");
}

async fn a_204_carries_retry_after_until_the_earliest_return(app: TestApp) {
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 4000});
    health_pool(&app, "p", health, &["a"]).await;
    trip(&app, "p", "a").await;
    let response = app
        .anonymous(Method::POST, "/pools/p/assign")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("4")
    );
    // Without anyone cooling down, a 204 has no Retry-After.
    app.post_json("/pools/p/members/disable", json!({"members": ["a"]}))
        .await;
    let response = app
        .anonymous(Method::POST, "/pools/p/assign")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(response.headers().get("retry-after"), None);
}

async fn a_member_of_a_least_in_flight_pool_returns_into_the_choosing_order(app: TestApp) {
    let config = json!({"policy": "least-in-flight",
                        "health": {"max_consecutive_failures": 1, "cooldown_ms": 100,
                                   "jitter_percent": 0}});
    app.create_pool("p", config).await;
    app.seed("p", &["a"], Some(0)).await;
    trip(&app, "p", "a").await;
    await_state(&app, "p", "a", "eligible").await;
    let (status, body) = app.assign("p").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["proxy"], json!("a"));
}

for_each_store!(
    a_report_finds_an_address_in_any_written_form,
    a_member_cools_down_at_max_consecutive_failures_and_not_before,
    a_blocked_report_that_trips_a_member_records_reason_blocked,
    an_ok_report_clears_the_failure_streak,
    each_repeated_trip_multiplies_the_cooldown_up_to_the_maximum,
    a_success_after_a_return_resets_the_backoff,
    jitter_keeps_each_cooldown_within_its_percentage,
    outcome_reports_never_change_assignment_counts,
    unknown_members_are_reported_as_unknown_and_the_rest_of_the_batch_applies,
    malformed_reports_answer_400_and_unknown_pools_404,
    nonsense_health_settings_answer_400,
    members_disabled_by_an_operator_never_return_by_themselves,
    enabling_a_cooling_member_brings_it_back_at_once,
    a_returning_member_comes_back_under_the_pools_restore_policy,
    a_204_carries_retry_after_until_the_earliest_return,
    a_member_of_a_least_in_flight_pool_returns_into_the_choosing_order,
);

/// An assign returns due members of its own pool, so a busy pool does not wait for the
/// background sweep (switched off here).
async fn assign_returns_cooled_down_members_without_the_sweep(backend: Backend) {
    let mut config = backend_config(backend);
    config.sweep_interval_ms = 3_600_000;
    let app = TestApp::spawn_with(config).await;
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 200});
    health_pool(&app, "p", health, &["a"]).await;
    trip(&app, "p", "a").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = app.assign("p").await;
        if status == StatusCode::OK {
            assert_eq!(body["proxy"], json!("a"));
            break;
        }
        assert_eq!(status, StatusCode::NO_CONTENT);
        assert!(Instant::now() < deadline, "a never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(health_totals(&app, "p").await, (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_on_redis_returns_cooled_down_members_without_the_sweep() {
    assign_returns_cooled_down_members_without_the_sweep(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_on_embedded_returns_cooled_down_members_without_the_sweep() {
    assign_returns_cooled_down_members_without_the_sweep(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_on_durable_returns_cooled_down_members_without_the_sweep() {
    assign_returns_cooled_down_members_without_the_sweep(Backend::Durable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_one_redis_return_each_member_exactly_once() {
    let config = test_config(Some(shared_redis_url()));
    let (first, first_spy) = spawn_spied(config.clone()).await;
    let (second, second_spy) = spawn_spied(config).await;
    let members: Vec<String> = (0..20).map(|i| format!("m{i:02}")).collect();
    let ids: Vec<&str> = members.iter().map(String::as_str).collect();
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 300});
    health_pool(&first, "p", health, &ids).await;
    let batch: Vec<Value> = ids
        .iter()
        .map(|id| json!({"proxy": id, "result": "failed"}))
        .collect();
    let (status, body) = report(&second, "p", Value::Array(batch)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Both instances sweep, and both assign, while the cooldowns end.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, a) = first.assign("p").await;
        let (_, b) = second.assign("p").await;
        let eligible = first
            .counts("p")
            .await
            .iter()
            .filter(|(_, _, state)| state == "eligible")
            .count();
        if eligible == 20 {
            break;
        }
        assert!(Instant::now() < deadline, "{a} {b}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Both instances sweep, and assign, once more after the last return: a member
    // returned twice would be counted twice by then.
    let marks = (first_spy.sweeps.mark(), second_spy.sweeps.mark());
    first_spy
        .sweeps
        .await_one_after(marks.0, "sweep of the first instance")
        .await;
    second_spy
        .sweeps
        .await_one_after(marks.1, "sweep of the second instance")
        .await;
    assert_eq!(first.assign("p").await.0, StatusCode::OK);
    assert_eq!(second.assign("p").await.0, StatusCode::OK);
    assert_eq!(health_totals(&second, "p").await, (20, 20));
}
