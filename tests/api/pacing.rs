//! Pacing: a member handed out at t (the store's clock) is not handed out again before
//! t + `pacing.min_interval_ms`, pool-wide or per (member, target), under any concurrency
//! and across replicas.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::for_each_store;
use crate::helpers::{TestApp, assert_error, read, shared_redis_url, test_config};

/// An assign with a JSON body: status, body (Null on 204) and `Retry-After-Ms`.
async fn assign_with(app: &TestApp, pool: &str, body: Value) -> (StatusCode, Value, Option<u64>) {
    let response = app
        .anonymous(Method::POST, &format!("/pools/{pool}/assign"))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    let wait = response
        .headers()
        .get("retry-after-ms")
        .map(|v| v.to_str().expect("ascii").parse().expect("ms"));
    let (status, body) = read(response).await;
    (status, body, wait)
}

/// The proxy an assign with `body` hands out.
async fn proxy_of(app: &TestApp, pool: &str, body: Value) -> String {
    let (status, body, _) = assign_with(app, pool, body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["proxy"].as_str().expect("proxy").to_owned()
}

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    u64::try_from(since.expect("after 1970").as_millis()).expect("fits")
}

async fn a_paced_member_is_not_handed_out_again_within_its_interval(app: TestApp) {
    app.create_pool("p", json!({"pacing": {"min_interval_ms": 60000}}))
        .await;
    app.seed("p", &["a", "b", "c"], Some(0)).await;
    let started = now_ms();
    let mut handed = Vec::new();
    for _ in 0..3 {
        handed.push(proxy_of(&app, "p", json!({})).await);
    }
    assert_eq!(handed, ["a", "b", "c"]);
    // Every member rests: nothing until the first rest ends, a minute after `a`.
    let (status, _, wait) = assign_with(&app, "p", json!({})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let wait = wait.expect("Retry-After-Ms");
    assert!(
        (60_000 - (now_ms() - started)..=60_000).contains(&wait),
        "{wait}"
    );
    // Pool-wide: a target changes nothing.
    let (status, ..) = assign_with(&app, "p", json!({"target": "example.com"})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, pool) = app.get("/pools/p").await;
    assert_eq!(
        pool["config"]["pacing"],
        json!({"min_interval_ms": 60000, "per_target": false})
    );
}

async fn a_member_rests_exactly_its_interval_and_is_then_handed_out_again(app: TestApp) {
    app.create_pool("p", json!({"pacing": {"min_interval_ms": 300}}))
        .await;
    app.seed("p", &["a"], Some(0)).await;
    let before = now_ms();
    assert_eq!(proxy_of(&app, "p", json!({})).await, "a");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, wait) = assign_with(&app, "p", json!({})).await;
        if status == StatusCode::OK {
            break;
        }
        assert!(wait.is_some_and(|ms| ms <= 300), "{wait:?}");
        assert!(Instant::now() < deadline, "never handed out again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Handed out at t >= before, again at t' >= t + 300, answered by now.
    assert!(now_ms() - before >= 300);
}

async fn a_pool_paced_per_target_paces_each_target_apart_and_not_untargeted_assigns(app: TestApp) {
    app.create_pool(
        "p",
        json!({"pacing": {"min_interval_ms": 60000, "per_target": true}}),
    )
    .await;
    app.seed("p", &["a", "b"], Some(0)).await;
    let shop = json!({"target": "shop.example.com"});
    assert_eq!(proxy_of(&app, "p", shop.clone()).await, "a");
    assert_eq!(proxy_of(&app, "p", shop.clone()).await, "b");
    let (status, ..) = assign_with(&app, "p", shop.clone()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // Another site may use both; an assign without a target is not paced.
    let news = json!({"target": "news.example.org"});
    assert_eq!(proxy_of(&app, "p", news.clone()).await, "a");
    assert_eq!(proxy_of(&app, "p", news.clone()).await, "b");
    assert_eq!(app.assigned("p").await, ("a".to_owned(), 3));
    assert_eq!(app.assigned("p").await, ("b".to_owned(), 3));
    let (status, ..) = assign_with(&app, "p", news).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

async fn a_paced_least_in_flight_pool_with_labels_skips_resting_members(app: TestApp) {
    app.create_pool(
        "p",
        json!({"policy": "least-in-flight", "pacing": {"min_interval_ms": 60000}}),
    )
    .await;
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ["de-1", "de-2", {"member": "fr-1", "labels": {"country": "fr"}}],
                   "labels": {"country": "de"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let de = json!({"labels": {"country": "de"}});
    assert_eq!(proxy_of(&app, "p", de.clone()).await, "de-1");
    assert_eq!(proxy_of(&app, "p", de.clone()).await, "de-2");
    let (status, _, wait) = assign_with(&app, "p", de).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(wait.is_some_and(|ms| ms <= 60_000), "{wait:?}");
    assert_eq!(proxy_of(&app, "p", json!({})).await, "fr-1");
}

async fn concurrent_assigns_never_receive_a_resting_member(app: TestApp) {
    let app = Arc::new(app);
    app.create_pool("p", json!({"pacing": {"min_interval_ms": 60000}}))
        .await;
    let members: Vec<String> = (0..20).map(|n| format!("m{n:02}")).collect();
    let names: Vec<&str> = members.iter().map(String::as_str).collect();
    app.seed("p", &names, Some(0)).await;
    let handed = hammer(&[Arc::clone(&app)], 64).await;
    assert_eq!(handed.len(), 20, "{handed:?}");
    assert!(handed.values().all(|n| *n == 1), "{handed:?}");
}

async fn a_pool_created_again_under_its_id_has_no_rests_for_a_target(app: TestApp) {
    let paced = json!({"pacing": {"min_interval_ms": 3_600_000, "per_target": true}});
    let shop = json!({"target": "shop.example.com"});
    app.create_pool("c1", paced.clone()).await;
    app.seed("c1", &["m1", "m2"], Some(0)).await;
    assert_eq!(proxy_of(&app, "c1", shop.clone()).await, "m1");
    assert_eq!(proxy_of(&app, "c1", shop.clone()).await, "m2");
    let response = app
        .admin(Method::DELETE, "/pools/c1")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    app.create_pool("c1", paced).await;
    app.seed("c1", &["m1", "m2"], Some(0)).await;
    // Both rested for the site in the deleted pool, neither in this one: m1, then m2 after
    // m1's new rest was written.
    for expected in ["m1", "m2"] {
        let (status, body, wait) = assign_with(&app, "c1", shop.clone()).await;
        assert_eq!((status, wait), (StatusCode::OK, None), "{body}");
        assert_eq!(
            (&body["proxy"], &body["assignments"]),
            (&json!(expected), &json!(1)),
            "{body}"
        );
    }
    // Their rests in this pool hold as they should.
    let (status, _, wait) = assign_with(&app, "c1", shop).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(wait.is_some_and(|ms| ms <= 3_600_000), "{wait:?}");
}

async fn a_capped_pool_waits_only_for_resting_members_below_the_cap(app: TestApp) {
    app.create_pool(
        "p",
        json!({"policy": "least-in-flight", "max_in_flight": 1,
               "pacing": {"min_interval_ms": 60000}}),
    )
    .await;
    app.seed("p", &["a", "b"], Some(0)).await;
    let (status, first, _) = assign_with(&app, "p", json!({})).await;
    assert_eq!((status, &first["proxy"]), (StatusCode::OK, &json!("a")));
    assert_eq!(proxy_of(&app, "p", json!({})).await, "b");
    // Both rest and both are at the cap, which they still are when their rests end.
    for body in [json!({}), json!({"count": 2})] {
        let (status, _, wait) = assign_with(&app, "p", body.clone()).await;
        assert_eq!((status, wait), (StatusCode::NO_CONTENT, None), "{body}");
    }
    // Released, a is below the cap: the end of its rest is waited for.
    let lease = first["lease"]["id"].as_str().expect("a lease id");
    let response = app
        .anonymous(Method::POST, &format!("/pools/p/leases/{lease}/release"))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    for body in [json!({}), json!({"count": 2})] {
        let (status, _, wait) = assign_with(&app, "p", body.clone()).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
        assert!(
            wait.is_some_and(|ms| (1..=60_000).contains(&ms)),
            "{body}: {wait:?}"
        );
    }
}

async fn invalid_pacing_is_refused(app: TestApp) {
    for pacing in [
        json!({"min_interval_ms": 0}),
        json!({"min_interval_ms": 3_600_001}),
        json!({"per_target": true}),
    ] {
        let response = app
            .admin(Method::PUT, "/pools/p")
            .json(&json!({ "pacing": pacing }))
            .send()
            .await
            .expect("sent");
        let (status, body) = read(response).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    }
}

/// `total` assigns spread over `apps` (replicas) from 16 concurrent clients; the proxies
/// handed out, each with how many times.
async fn hammer(apps: &[Arc<TestApp>], total: usize) -> BTreeMap<String, u64> {
    let mut tasks = Vec::new();
    for client in 0..16 {
        let app = Arc::clone(&apps[client % apps.len()]);
        tasks.push(tokio::spawn(async move {
            let mut handed = Vec::new();
            for _ in 0..total / 16 {
                let (status, body) = app.assign("p").await;
                match status {
                    StatusCode::OK => {
                        handed.push(body["proxy"].as_str().expect("proxy").to_owned())
                    }
                    StatusCode::NO_CONTENT => {}
                    other => panic!("{other}: {body}"),
                }
            }
            handed
        }));
    }
    let mut counts = BTreeMap::new();
    for task in tasks {
        for proxy in task.await.expect("client finished") {
            *counts.entry(proxy).or_insert(0u64) += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_never_hand_out_a_resting_member() {
    let first = TestApp::spawn_with(test_config(Some(shared_redis_url()))).await;
    let mut config = test_config(Some(shared_redis_url()));
    config.key_prefix = first.key_prefix.clone();
    let second = TestApp::spawn_with(config).await;
    first
        .create_pool("p", json!({"pacing": {"min_interval_ms": 60000}}))
        .await;
    let members: Vec<String> = (0..20).map(|n| format!("m{n:02}")).collect();
    let names: Vec<&str> = members.iter().map(String::as_str).collect();
    first.seed("p", &names, Some(0)).await;
    let handed = hammer(&[Arc::new(first), Arc::new(second)], 96).await;
    assert_eq!(handed.len(), 20, "{handed:?}");
    assert!(handed.values().all(|n| *n == 1), "{handed:?}");
}

for_each_store!(
    a_paced_member_is_not_handed_out_again_within_its_interval,
    a_member_rests_exactly_its_interval_and_is_then_handed_out_again,
    a_pool_paced_per_target_paces_each_target_apart_and_not_untargeted_assigns,
    a_paced_least_in_flight_pool_with_labels_skips_resting_members,
    concurrent_assigns_never_receive_a_resting_member,
    a_pool_created_again_under_its_id_has_no_rests_for_a_target,
    a_capped_pool_waits_only_for_resting_members_below_the_cap,
    invalid_pacing_is_refused,
);
