//! Least-in-flight pools: the choosing rule and its tie-breaks, leases (release, renew,
//! expiry), reclaiming abandoned leases, and exactness under concurrency and across
//! replicas.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::for_each_store;
use crate::helpers::{
    Backend, SWEEP_INTERVAL_MS, TestApp, assert_error, backend_config, read, shared_redis_url,
    test_config,
};
use crate::spy::spawn_spied;

/// Creates a least-in-flight pool with `config` added and seeds `members` at 0.
async fn least_in_flight_pool(app: &TestApp, pool: &str, config: Value, members: &[&str]) {
    let mut body = json!({"policy": "least-in-flight"});
    for (key, value) in config.as_object().expect("an object") {
        body[key] = value.clone();
    }
    app.create_pool(pool, body).await;
    if !members.is_empty() {
        app.seed(pool, members, Some(0)).await;
    }
}

/// An assign with an optional JSON body; status and body.
async fn assign_with(app: &TestApp, pool: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut request = app.anonymous(Method::POST, &format!("/pools/{pool}/assign"));
    if let Some(body) = body {
        request = request.json(&body);
    }
    read(request.send().await.expect("sent")).await
}

/// A lease that must be granted: (proxy, lease id).
async fn leased(app: &TestApp, pool: &str) -> (String, String) {
    let (status, body) = assign_with(app, pool, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    (
        body["proxy"].as_str().expect("proxy").to_owned(),
        body["lease"]["id"].as_str().expect("lease id").to_owned(),
    )
}

async fn release(app: &TestApp, pool: &str, lease: &str) -> (StatusCode, Value) {
    let path = format!("/pools/{pool}/leases/{lease}/release");
    read(
        app.anonymous(Method::POST, &path)
            .send()
            .await
            .expect("sent"),
    )
    .await
}

async fn renew(app: &TestApp, pool: &str, lease: &str, body: Value) -> (StatusCode, Value) {
    let path = format!("/pools/{pool}/leases/{lease}/renew");
    read(
        app.anonymous(Method::POST, &path)
            .json(&body)
            .send()
            .await
            .expect("sent"),
    )
    .await
}

/// Every member with its live leases, in listing order.
async fn in_flight(app: &TestApp, pool: &str) -> Vec<(String, u64)> {
    app.members(pool)
        .await
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("member").to_owned(),
                m["in_flight"].as_u64().expect("in_flight"),
            )
        })
        .collect()
}

/// The pool's `(in_flight, abandoned)` stats.
async fn lease_totals(app: &TestApp, pool: &str) -> (u64, u64) {
    let (status, body) = app.get(&format!("/pools/{pool}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    (
        body["stats"]["in_flight"].as_u64().expect("in_flight"),
        body["stats"]["abandoned"].as_u64().expect("abandoned"),
    )
}

/// Polls the pool's lease totals until they equal `expected`; returns how long it took.
async fn await_lease_totals(app: &TestApp, pool: &str, expected: (u64, u64)) -> Duration {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(10);
    loop {
        let totals = lease_totals(app, pool).await;
        if totals == expected {
            return started.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "lease totals stayed at {totals:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn pairs(items: &[(&str, u64)]) -> Vec<(String, u64)> {
    items.iter().map(|(m, n)| ((*m).to_owned(), *n)).collect()
}

async fn least_in_flight_assign_answers_with_the_member_its_counts_and_a_lease(app: TestApp) {
    least_in_flight_pool(&app, "p", json!({}), &["a"]).await;
    let (status, body) = assign_with(&app, "p", None).await;
    assert_eq!(status, StatusCode::OK);
    let id = body["lease"]["id"].as_str().expect("id").to_owned();
    let expires_at = body["lease"]["expires_at"].as_str().expect("expires_at");
    assert!(expires_at.ends_with('Z'), "{body}");
    assert_eq!(
        body,
        json!({"pool": "p", "proxy": "a", "in_flight": 1, "assignments": 1,
               "lease": {"id": id, "expires_at": expires_at, "ttl_ms": 30000}})
    );
    let (status, body) = assign_with(&app, "p", Some(json!({"ttl_ms": 500}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            &body["in_flight"],
            &body["assignments"],
            &body["lease"]["ttl_ms"]
        ),
        (&json!(2), &json!(2), &json!(500))
    );
}

async fn the_member_with_the_fewest_live_leases_is_chosen_then_the_fewest_assignments(
    app: TestApp,
) {
    least_in_flight_pool(&app, "p", json!({}), &[]).await;
    app.seed("p", &["x"], Some(5)).await;
    app.seed("p", &["y"], Some(2)).await;
    app.seed("p", &["z"], Some(2)).await;
    // All idle: the fewest assignments wins, then byte order (y before z).
    let (first, _) = leased(&app, "p").await;
    let (second, z_lease) = leased(&app, "p").await;
    let (third, _) = leased(&app, "p").await;
    assert_eq!([first, second, third], ["y", "z", "x"]);
    // z is the only idle member once its lease ends, however many assignments it has.
    assert_eq!(release(&app, "p", &z_lease).await.0, StatusCode::NO_CONTENT);
    assert_eq!(leased(&app, "p").await.0, "z");
    assert_eq!(
        in_flight(&app, "p").await,
        pairs(&[("y", 1), ("z", 1), ("x", 1)])
    );
}

async fn equally_busy_members_take_turns_and_one_lease_at_a_time_spreads_over_the_pool(
    app: TestApp,
) {
    least_in_flight_pool(&app, "p", json!({}), &["e", "d", "c", "b", "a"]).await;
    let mut picks = Vec::new();
    for _ in 0..10 {
        let (proxy, lease) = leased(&app, "p").await;
        assert_eq!(release(&app, "p", &lease).await.0, StatusCode::NO_CONTENT);
        picks.push(proxy);
    }
    assert_eq!(picks, ["a", "b", "c", "d", "e", "a", "b", "c", "d", "e"]);
}

async fn members_at_max_in_flight_are_skipped_and_204_when_every_member_is_at_its_cap(
    app: TestApp,
) {
    least_in_flight_pool(&app, "p", json!({"max_in_flight": 2}), &["a", "b"]).await;
    let mut held = Vec::new();
    for expected in ["a", "b", "a", "b"] {
        let (proxy, lease) = leased(&app, "p").await;
        assert_eq!(proxy, expected);
        held.push(lease);
    }
    assert_eq!(
        assign_with(&app, "p", None).await,
        (StatusCode::NO_CONTENT, Value::Null)
    );
    assert_eq!(release(&app, "p", &held[0]).await.0, StatusCode::NO_CONTENT);
    assert_eq!(leased(&app, "p").await.0, "a");
}

async fn a_second_release_answers_404_lease_not_found_and_frees_nothing_more(app: TestApp) {
    least_in_flight_pool(&app, "p", json!({}), &["a"]).await;
    let (_, first) = leased(&app, "p").await;
    leased(&app, "p").await;
    assert_eq!(
        release(&app, "p", &first).await,
        (StatusCode::NO_CONTENT, Value::Null)
    );
    let (status, body) = release(&app, "p", &first).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "lease_not_found");
    assert_eq!(in_flight(&app, "p").await, pairs(&[("a", 1)]));
    assert_eq!(lease_totals(&app, "p").await, (1, 0));
}

async fn unknown_and_malformed_lease_ids_answer_404_lease_not_found(app: TestApp) {
    least_in_flight_pool(&app, "p", json!({}), &["a"]).await;
    leased(&app, "p").await;
    for id in ["0123456789abcdef0123456789abcdef", "not-a-lease", "1"] {
        let (status, body) = release(&app, "p", id).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "lease_not_found");
        let (status, body) = renew(&app, "p", id, json!({})).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "lease_not_found");
    }
    let (status, body) = release(&app, "nope", "0123456789abcdef0123456789abcdef").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
    assert_eq!(lease_totals(&app, "p").await, (1, 0));
}

async fn renewing_moves_the_expiry_to_the_new_ttl_from_now(app: TestApp) {
    least_in_flight_pool(&app, "p", json!({}), &["a"]).await;
    let (status, body) = assign_with(&app, "p", Some(json!({"ttl_ms": 200}))).await;
    assert_eq!(status, StatusCode::OK);
    let id = body["lease"]["id"].as_str().expect("id").to_owned();
    let (status, renewed) = renew(&app, "p", &id, json!({"ttl_ms": 60000})).await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    assert_eq!(renewed["pool"], json!("p"));
    assert_eq!(renewed["proxy"], json!("a"));
    assert_eq!(renewed["lease"]["id"], json!(id));
    assert_eq!(renewed["lease"]["ttl_ms"], json!(60000));
    // RFC 3339 in UTC with the same precision compares in time order as text.
    assert!(
        renewed["lease"]["expires_at"].as_str() > body["lease"]["expires_at"].as_str(),
        "{renewed} vs {body}"
    );
    // Past its first ttl, the renewed lease is still live and releases normally.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        release(&app, "p", &id).await,
        (StatusCode::NO_CONTENT, Value::Null)
    );
    assert_eq!(lease_totals(&app, "p").await, (0, 0));
}

async fn an_expired_lease_cannot_be_released_or_renewed_and_is_counted_as_abandoned(app: TestApp) {
    least_in_flight_pool(&app, "p", json!({"lease_ttl_ms": 150}), &["a"]).await;
    let (_, lease) = leased(&app, "p").await;
    // Waiting for a deadline, not for another task: the lease expires 150 ms after it was
    // handed out.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let (status, body) = release(&app, "p", &lease).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "lease_not_found");
    let (status, body) = renew(&app, "p", &lease, json!({})).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "lease_not_found");
    await_lease_totals(&app, "p", (0, 1)).await;
    assert_eq!(in_flight(&app, "p").await, pairs(&[("a", 0)]));
}

async fn crashed_workers_leases_are_reclaimed_within_ttl_and_sweep_interval_then_reused(
    app: TestApp,
) {
    const TTL_MS: u64 = 300;
    least_in_flight_pool(
        &app,
        "p",
        json!({"lease_ttl_ms": TTL_MS, "max_in_flight": 1}),
        &["a", "b"],
    )
    .await;
    let handed_out = Instant::now();
    // The workers take both proxies and crash: nobody releases.
    leased(&app, "p").await;
    leased(&app, "p").await;
    assert_eq!(assign_with(&app, "p", None).await.0, StatusCode::NO_CONTENT);
    // Nobody assigns from the pool meanwhile: only the background sweep can clean it.
    await_lease_totals(&app, "p", (0, 2)).await;
    let reclaimed_after = handed_out.elapsed();
    // Slack for a loaded test machine on top of the promise (ttl + one sweep interval).
    let promise = Duration::from_millis(TTL_MS + SWEEP_INTERVAL_MS);
    assert!(
        reclaimed_after <= promise + Duration::from_millis(400),
        "reclaimed after {reclaimed_after:?}"
    );
    assert_eq!(in_flight(&app, "p").await, pairs(&[("a", 0), ("b", 0)]));
    assert_eq!(leased(&app, "p").await.0, "a");
    assert_eq!(leased(&app, "p").await.0, "b");
}

async fn disabled_members_keep_their_leases_and_come_back_with_them(app: TestApp) {
    least_in_flight_pool(&app, "p", json!({}), &["a", "b"]).await;
    let (_, a_lease) = leased(&app, "p").await;
    app.post_json("/pools/p/members/disable", json!({"members": ["a"]}))
        .await;
    assert_eq!(leased(&app, "p").await.0, "b");
    assert_eq!(leased(&app, "p").await.0, "b");
    assert_eq!(in_flight(&app, "p").await, pairs(&[("a", 1), ("b", 2)]));
    let (status, body) = app
        .post_json("/pools/p/members/enable", json!({"members": ["a"]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Restore policies move the cumulative count only; `a` keeps its one live lease, which
    // is still fewer than b's two.
    assert_eq!(
        body["enabled"],
        json!([{"member": "a", "kept_assignments": 1, "assignments": 2}])
    );
    assert_eq!(leased(&app, "p").await.0, "a");
    assert_eq!(
        release(&app, "p", &a_lease).await,
        (StatusCode::NO_CONTENT, Value::Null)
    );
    // Listed by assignments: b has 2, a now 3.
    assert_eq!(in_flight(&app, "p").await, pairs(&[("b", 2), ("a", 1)]));
}

async fn removing_a_member_ends_its_leases_without_counting_them_abandoned(app: TestApp) {
    least_in_flight_pool(&app, "p", json!({}), &["a", "b"]).await;
    let (_, a_lease) = leased(&app, "p").await;
    let (_, b_lease) = leased(&app, "p").await;
    app.post_json("/pools/p/members/remove", json!({"members": ["a"]}))
        .await;
    let (status, body) = release(&app, "p", &a_lease).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "lease_not_found");
    assert_eq!(lease_totals(&app, "p").await, (1, 0));
    // Re-added, `a` starts without the old lease.
    app.seed("p", &["a"], Some(0)).await;
    assert_eq!(in_flight(&app, "p").await, pairs(&[("a", 0), ("b", 1)]));
    assert_eq!(release(&app, "p", &b_lease).await.0, StatusCode::NO_CONTENT);
}

async fn deleting_a_pool_ends_its_leases(app: TestApp) {
    least_in_flight_pool(&app, "p", json!({}), &["a"]).await;
    let (_, lease) = leased(&app, "p").await;
    let response = app
        .admin(Method::DELETE, "/pools/p")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    least_in_flight_pool(&app, "p", json!({}), &["a"]).await;
    let (status, body) = release(&app, "p", &lease).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "lease_not_found");
    assert_eq!(lease_totals(&app, "p").await, (0, 0));
}

async fn changing_the_policy_of_a_pool_with_members_answers_409(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], None).await;
    let put = |config: Value| {
        let request = app.admin(Method::PUT, "/pools/p").json(&config);
        async move { read(request.send().await.expect("sent")).await }
    };
    let (status, body) = put(json!({"policy": "least-in-flight"})).await;
    assert_error(
        status,
        &body,
        StatusCode::CONFLICT,
        "policy_change_requires_empty_pool",
    );
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["config"]["policy"], json!("least-used"));
    // The same policy with other settings is no change of policy.
    assert_eq!(put(json!({"restore": "zero"})).await.0, StatusCode::OK);
    app.post_json("/pools/p/members/remove", json!({"members": ["a"]}))
        .await;
    let (status, body) = put(json!({"policy": "least-in-flight", "max_in_flight": 1})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["config"],
        json!({"policy": "least-in-flight", "restore": "minimum", "start_assignments": null,
               "lease_ttl_ms": 30000, "max_in_flight": 1, "session_ttl_ms": 600000,
               "rules": serde_json::to_value(proxy_allocator::domain::Rules::default()).expect("JSON"),
               "health": {"max_consecutive_failures": 3, "cooldown_ms": 60000, "max_cooldown_ms": 3600000, "backoff": 2, "jitter_percent": 10, "target_ban_ms": 600000, "check": null}})
    );
}

async fn out_of_range_lease_settings_answer_400(app: TestApp) {
    for (config, code) in [
        (json!({"max_in_flight": 2}), "invalid_request"),
        (
            json!({"policy": "least-in-flight", "max_in_flight": 0}),
            "invalid_json",
        ),
        (
            json!({"policy": "least-in-flight", "lease_ttl_ms": 99}),
            "invalid_json",
        ),
        (
            json!({"policy": "least-in-flight", "lease_ttl_ms": 86_400_001}),
            "invalid_json",
        ),
        (json!({"policy": "least-busy"}), "invalid_json"),
    ] {
        let response = app
            .admin(Method::PUT, "/pools/p")
            .json(&config)
            .send()
            .await
            .expect("sent");
        let (status, body) = read(response).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, code);
    }
    least_in_flight_pool(&app, "p", json!({}), &["a"]).await;
    let (status, body) = assign_with(&app, "p", Some(json!({"ttl_ms": 99}))).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    assert_eq!(lease_totals(&app, "p").await, (0, 0));
}

async fn a_least_used_pool_still_answers_without_a_lease_and_knows_no_leases(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], Some(0)).await;
    let (status, body) = assign_with(&app, "p", Some(json!({"ttl_ms": 500}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"pool": "p", "proxy": "a", "assignments": 1}));
    let (status, body) = release(&app, "p", "0123456789abcdef0123456789abcdef").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "lease_not_found");
}

async fn lease_ids_are_random_not_a_counter(app: TestApp) {
    least_in_flight_pool(&app, "p", json!({}), &["a"]).await;
    let mut ids = Vec::new();
    for _ in 0..100 {
        ids.push(leased(&app, "p").await.1);
    }
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), 100);
    for id in &ids {
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
    }
    // A counter (or a clock) would give neighbours that share their leading digits; random
    // 128-bit ids share 8 leading hex digits with a chance of 1 in 2^32.
    for pair in ids.windows(2) {
        assert_ne!(pair[0][..8], pair[1][..8], "{pair:?}");
    }
}

/// One worker's answer in one round: the member and its `in_flight` after the grant, or
/// `None` for a 204.
type Grant = Option<(String, u64)>;

/// `workers` workers ask at the same moment for a lease, `rounds` times, each holding what
/// it got until every worker has its answer, then releasing it before the next round. A
/// worker assigns on one app and releases on the next (when several are given). Returns
/// every round's answers.
async fn simultaneous_rounds(
    apps: &[Arc<TestApp>],
    pool: &str,
    workers: usize,
    rounds: usize,
) -> Vec<Vec<Grant>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(workers));
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let apps = apps.to_vec();
        let pool = pool.to_owned();
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for round in 0..rounds {
                let on = &apps[(worker + round) % apps.len()];
                let then = &apps[(worker + round + 1) % apps.len()];
                barrier.wait().await;
                let (status, body) = assign_with(on, &pool, None).await;
                let grant = match status {
                    StatusCode::OK => Some((
                        body["proxy"].as_str().expect("proxy").to_owned(),
                        body["in_flight"].as_u64().expect("in_flight"),
                    )),
                    StatusCode::NO_CONTENT => None,
                    other => panic!("assign answered {other}: {body}"),
                };
                // Every worker holds what it got until all have their answer.
                barrier.wait().await;
                if status == StatusCode::OK {
                    let lease = body["lease"]["id"].as_str().expect("id");
                    assert_eq!(release(then, &pool, lease).await.0, StatusCode::NO_CONTENT);
                }
                barrier.wait().await;
                answers.push(grant);
            }
            answers
        }));
    }
    let mut by_worker = Vec::new();
    for task in tasks {
        by_worker.push(task.await.expect("worker finished"));
    }
    (0..rounds)
        .map(|round| {
            by_worker
                .iter()
                .map(|answers| answers[round].clone())
                .collect()
        })
        .collect()
}

/// With `max_in_flight: 1`, each round grants every member exactly once, each with one
/// live lease (its own), and answers 204 to every other worker.
fn assert_each_member_granted_once_per_round(rounds: &[Vec<Grant>], members: &[&str]) {
    let mut expected: Vec<(String, u64)> = members.iter().map(|m| ((*m).to_owned(), 1)).collect();
    expected.sort();
    let mut wrong = Vec::new();
    for (number, answers) in rounds.iter().enumerate() {
        let mut granted: Vec<(String, u64)> = answers.iter().flatten().cloned().collect();
        granted.sort();
        if granted != expected {
            wrong.push(format!("round {number}: granted {granted:?}"));
        }
    }
    assert_eq!(
        wrong,
        Vec::<String>::new(),
        "expected {expected:?} in every round"
    );
}

async fn with_max_in_flight_1_no_member_is_ever_held_by_two_workers_at_once(app: TestApp) {
    let members = ["a", "b", "c", "d"];
    least_in_flight_pool(&app, "p", json!({"max_in_flight": 1}), &members).await;
    let rounds = simultaneous_rounds(&[Arc::new(app)], "p", 16, 25).await;
    assert_each_member_granted_once_per_round(&rounds, &members);
}

async fn thirty_two_workers_acquiring_and_releasing_in_random_order_end_with_nothing_in_flight(
    app: TestApp,
) {
    const WORKERS: u64 = 32;
    const ROUNDS: usize = 100;
    let app = Arc::new(app);
    let members: Vec<String> = (0..6).map(|i| format!("proxy-{i}")).collect();
    let refs: Vec<&str> = members.iter().map(String::as_str).collect();
    least_in_flight_pool(&app, "p", json!({}), &refs).await;
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let app = Arc::clone(&app);
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(worker);
            let mut held: Vec<String> = Vec::new();
            let mut leased_count = 0u64;
            for _ in 0..ROUNDS {
                if held.len() < 4 && (held.is_empty() || rng.random_bool(0.5)) {
                    held.push(leased(&app, "p").await.1);
                    leased_count += 1;
                } else {
                    let lease = held.swap_remove(rng.random_range(0..held.len()));
                    assert_eq!(release(&app, "p", &lease).await.0, StatusCode::NO_CONTENT);
                    // A retried release must never free a second place.
                    let (status, body) = release(&app, "p", &lease).await;
                    assert_error(status, &body, StatusCode::NOT_FOUND, "lease_not_found");
                }
            }
            for lease in held {
                assert_eq!(release(&app, "p", &lease).await.0, StatusCode::NO_CONTENT);
            }
            leased_count
        }));
    }
    let mut leases = 0;
    for task in tasks {
        leases += task.await.expect("worker finished");
    }
    let idle: Vec<(String, u64)> = members.iter().map(|m| (m.clone(), 0)).collect();
    let mut listed = in_flight(&app, "p").await;
    listed.sort();
    assert_eq!(listed, idle);
    assert_eq!(lease_totals(&app, "p").await, (0, 0));
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["total_assignments"], json!(leases));
}

for_each_store!(
    least_in_flight_assign_answers_with_the_member_its_counts_and_a_lease,
    the_member_with_the_fewest_live_leases_is_chosen_then_the_fewest_assignments,
    equally_busy_members_take_turns_and_one_lease_at_a_time_spreads_over_the_pool,
    members_at_max_in_flight_are_skipped_and_204_when_every_member_is_at_its_cap,
    a_second_release_answers_404_lease_not_found_and_frees_nothing_more,
    unknown_and_malformed_lease_ids_answer_404_lease_not_found,
    renewing_moves_the_expiry_to_the_new_ttl_from_now,
    an_expired_lease_cannot_be_released_or_renewed_and_is_counted_as_abandoned,
    crashed_workers_leases_are_reclaimed_within_ttl_and_sweep_interval_then_reused,
    disabled_members_keep_their_leases_and_come_back_with_them,
    removing_a_member_ends_its_leases_without_counting_them_abandoned,
    deleting_a_pool_ends_its_leases,
    changing_the_policy_of_a_pool_with_members_answers_409,
    out_of_range_lease_settings_answer_400,
    a_least_used_pool_still_answers_without_a_lease_and_knows_no_leases,
    lease_ids_are_random_not_a_counter,
    with_max_in_flight_1_no_member_is_ever_held_by_two_workers_at_once,
    thirty_two_workers_acquiring_and_releasing_in_random_order_end_with_nothing_in_flight,
);

/// An assign reclaims expired leases of its own pool before choosing, without waiting for
/// the background sweep (switched off here by an interval of an hour).
async fn assign_reclaims_expired_leases_of_its_pool_before_choosing(backend: Backend) {
    let mut config = backend_config(backend);
    config.sweep_interval_ms = 3_600_000;
    let app = TestApp::spawn_with(config).await;
    least_in_flight_pool(
        &app,
        "p",
        json!({"lease_ttl_ms": 150, "max_in_flight": 1}),
        &["a"],
    )
    .await;
    leased(&app, "p").await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    // Expired but not reclaimed: no sweep ran.
    assert_eq!(lease_totals(&app, "p").await, (1, 0));
    assert_eq!(leased(&app, "p").await.0, "a");
    assert_eq!(lease_totals(&app, "p").await, (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_reclaims_expired_leases_of_its_pool_before_choosing_on_redis() {
    assign_reclaims_expired_leases_of_its_pool_before_choosing(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_reclaims_expired_leases_of_its_pool_before_choosing_on_embedded() {
    assign_reclaims_expired_leases_of_its_pool_before_choosing(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_reclaims_expired_leases_of_its_pool_before_choosing_on_durable() {
    assign_reclaims_expired_leases_of_its_pool_before_choosing(Backend::Durable).await;
}

/// Two service instances on one Redis (same key prefix), as two replicas would run.
async fn two_replicas() -> [Arc<TestApp>; 2] {
    let config = test_config(Some(shared_redis_url()));
    let first = TestApp::spawn_with(config.clone()).await;
    let second = TestApp::spawn_with(config).await;
    [Arc::new(first), Arc::new(second)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_share_leases_exactly() {
    let apps = two_replicas().await;
    let [first, second] = &apps;
    least_in_flight_pool(first, "p", json!({"max_in_flight": 1}), &["a", "b", "c"]).await;
    // A lease handed out by one replica is released through the other, once.
    let (proxy, lease) = leased(first, "p").await;
    assert_eq!(proxy, "a");
    // Listed by assignments: a has been assigned once.
    assert_eq!(
        in_flight(second, "p").await,
        pairs(&[("b", 0), ("c", 0), ("a", 1)])
    );
    assert_eq!(release(second, "p", &lease).await.0, StatusCode::NO_CONTENT);
    let (status, body) = release(first, "p", &lease).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "lease_not_found");
    // Workers alternating between the replicas never share a member.
    let rounds = simultaneous_rounds(&apps, "p", 12, 25).await;
    assert_each_member_granted_once_per_round(&rounds, &["a", "b", "c"]);
    assert_eq!(lease_totals(second, "p").await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sweeps_reclaim_each_abandoned_lease_once() {
    let config = test_config(Some(shared_redis_url()));
    let (first, first_spy) = spawn_spied(config.clone()).await;
    let (second, second_spy) = spawn_spied(config).await;
    // One lease per pool: no later assign in its pool can reclaim it, so every reclaim is
    // a sweep's.
    let pools: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
    for pool in &pools {
        least_in_flight_pool(&first, pool, json!({"lease_ttl_ms": 150}), &["a"]).await;
        leased(&second, pool).await;
    }
    for pool in &pools {
        await_lease_totals(&first, pool, (0, 1)).await;
    }
    // Both replicas sweep every pool again after the last lease was reclaimed: a lease
    // reclaimed twice would be counted twice by then.
    let marks = (first_spy.sweeps.mark(), second_spy.sweeps.mark());
    first_spy
        .sweeps
        .await_one_after(marks.0, "sweep of the first replica")
        .await;
    second_spy
        .sweeps
        .await_one_after(marks.1, "sweep of the second replica")
        .await;
    for pool in &pools {
        assert_eq!(lease_totals(&second, pool).await, (0, 1), "{pool}");
        assert_eq!(in_flight(&first, pool).await, pairs(&[("a", 0)]), "{pool}");
    }
    let reclaimed =
        first_spy.reclaimed.load(Ordering::SeqCst) + second_spy.reclaimed.load(Ordering::SeqCst);
    assert_eq!(
        reclaimed, 10,
        "the sweeps' own count of what they reclaimed"
    );
}
