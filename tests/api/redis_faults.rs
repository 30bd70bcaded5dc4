//! Redis-specific behaviour: script cache loss, Redis going away and coming back, and the
//! key layout.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{
    RedisServer, TestApp, assert_error, read, redis_cli, test_config, without_background_traffic,
};

#[tokio::test]
async fn assign_recovers_after_the_script_cache_is_flushed() {
    // A Redis of its own: on the shared one, other tests load the script again between the
    // flush and the check.
    let redis = RedisServer::start();
    let app = TestApp::spawn_with(test_config(Some(redis.url()))).await;
    let url = redis.url();
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b"], Some(0)).await;
    assert_eq!(app.assigned("p").await, ("a".to_owned(), 1));
    // The service puts the client rate limit in a block of its own, the fast path, then
    // the shared helpers in front of the script (`fast_path_then_helpers` in scripts.rs).
    let sha = redis::Script::new(concat!(
        "do\n",
        include_str!("../../src/rules/bucket.lua"),
        include_str!("../../src/store/scripts/rate.lua"),
        "end\n",
        include_str!("../../src/store/scripts/leases_fast.lua"),
        include_str!("../../src/store/scripts/assign_fast.lua"),
        include_str!("../../src/store/scripts/labels.lua"),
        include_str!("../../src/store/scripts/leases.lua"),
        include_str!("../../src/rules/expiry.lua"),
        include_str!("../../src/rules/health.lua"),
        include_str!("../../src/store/scripts/health.lua"),
        include_str!("../../src/store/scripts/assign.lua")
    ))
    .get_hash()
    .to_owned();
    assert_eq!(
        redis_cli(&url, &["SCRIPT", "EXISTS", &sha]),
        redis::Value::Array(vec![redis::Value::Int(1)])
    );
    redis_cli(&url, &["SCRIPT", "FLUSH"]);
    assert_eq!(
        redis_cli(&url, &["SCRIPT", "EXISTS", &sha]),
        redis::Value::Array(vec![redis::Value::Int(0)])
    );
    assert_eq!(app.assigned("p").await, ("b".to_owned(), 1));
    assert_eq!(app.assigned("p").await, ("a".to_owned(), 2));
}

#[tokio::test]
async fn the_pool_listing_recovers_after_the_script_cache_is_flushed() {
    // A Redis of its own and no background work: nothing else may load the script again.
    let redis = RedisServer::start();
    let url = redis.url();
    let mut config = test_config(Some(url.clone()));
    without_background_traffic(&mut config);
    let app = TestApp::spawn_with(config).await;
    for pool in ["north", "south", "west"] {
        app.create_pool(pool, json!({})).await;
    }
    app.seed("south", &["a", "b"], Some(4)).await;
    let (status, listed) = app.get("/pools").await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let pools = listed["pools"].as_array().expect("pools");
    let ids: Vec<&str> = pools
        .iter()
        .map(|p| p["pool"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["north", "south", "west"]);
    assert_eq!(
        pools[1]["stats"],
        json!({"eligible": 2, "ineligible": 0, "min_assignments": 4, "max_assignments": 4,
               "total_assignments": 0, "in_flight": 0, "abandoned": 0, "tripped": 0,
               "recovered": 0, "pruned": 0,
               "shared_exit_ips": 0, "country_mismatches": 0})
    );
    assert_eq!(listed["next_cursor"], json!(null));
    // A page's calls travel as one pipeline; every one of them answers NOSCRIPT now.
    redis_cli(&url, &["SCRIPT", "FLUSH"]);
    assert_eq!(app.get("/pools").await, (StatusCode::OK, listed));
}

#[tokio::test]
async fn every_key_of_a_pool_carries_the_pool_as_its_hash_tag() {
    let app = TestApp::spawn(crate::helpers::Backend::Redis).await;
    let url = app.redis_url.clone().expect("on Redis");
    app.create_pool("tagged", json!({})).await;
    app.seed("tagged", &["a", "b"], None).await;
    app.post_json("/pools/tagged/members/disable", json!({"members": ["b"]}))
        .await;
    app.assigned("tagged").await;
    let keys = format!(
        "{:?}",
        redis_cli(&url, &["KEYS", &format!("{}:*", app.key_prefix)])
    );
    let prefix = &app.key_prefix;
    for expected in ["meta", "eligible", "ineligible", "taken_out"] {
        assert!(
            keys.contains(&format!("{prefix}:{{tagged}}:{expected}")),
            "{expected} missing from {keys}"
        );
    }
    // Only the registry lives outside the pool's slot.
    assert_eq!(keys.matches("{tagged}").count(), 4, "{keys}");
    assert!(keys.contains(&format!("{prefix}:pool_ids")), "{keys}");
}

#[tokio::test]
async fn every_lease_key_of_a_least_in_flight_pool_carries_the_pool_as_its_hash_tag() {
    let app = TestApp::spawn(crate::helpers::Backend::Redis).await;
    let url = app.redis_url.clone().expect("on Redis");
    app.create_pool("leasing", json!({"policy": "least-in-flight"}))
        .await;
    app.seed("leasing", &["a", "b"], None).await;
    app.assigned("leasing").await;
    let keys = format!(
        "{:?}",
        redis_cli(&url, &["KEYS", &format!("{}:*", app.key_prefix)])
    );
    let prefix = &app.key_prefix;
    for expected in [
        "meta",
        "eligible",
        "by_in_flight",
        "in_flight",
        "leases",
        "lease_expiry",
    ] {
        assert!(
            keys.contains(&format!("{prefix}:{{leasing}}:{expected}")),
            "{expected} missing from {keys}"
        );
    }
    assert_eq!(keys.matches("{leasing}").count(), 6, "{keys}");
}

#[tokio::test]
async fn with_redis_down_requests_answer_503_within_the_timeout_and_recover_without_a_restart() {
    let mut redis = RedisServer::start();
    let mut config = test_config(Some(redis.url()));
    config.store_timeout_ms = 500;
    let app = TestApp::spawn_with(config).await;
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], None).await;
    assert_eq!(app.assigned("p").await, ("a".to_owned(), 1));

    redis.kill();
    for _ in 0..3 {
        let started = Instant::now();
        let response = app
            .anonymous(Method::POST, "/pools/p/assign")
            .send()
            .await
            .expect("sent");
        let retry_after = response.headers().get("retry-after").cloned();
        let (status, body) = read(response).await;
        assert_error(
            status,
            &body,
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
        );
        assert_eq!(retry_after.as_ref().map(|v| v.as_bytes()), Some(&b"1"[..]));
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "took {:?}",
            started.elapsed()
        );
    }
    let response = app
        .anonymous(Method::GET, "/readyz")
        .send()
        .await
        .expect("sent");
    let retry_after = response.headers().get("retry-after").cloned();
    let (status, body) = read(response).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        body,
        json!({"status": "unavailable", "store": "redis",
               "error": {"code": "store_unavailable",
                         "message": "the pool store is unavailable; retry shortly"}})
    );
    assert_eq!(retry_after.as_ref().map(|v| v.as_bytes()), Some(&b"1"[..]));

    // Same port, empty data (no AOF): the pool is gone, which proves the service reached
    // the new process rather than answering from a cache.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    let recovered = loop {
        let (status, _) = app.assign("p").await;
        if status == StatusCode::NOT_FOUND || Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(recovered, StatusCode::NOT_FOUND);
    let response = app
        .anonymous(Method::GET, "/readyz")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn readyz_reports_the_redis_store_and_its_topology() {
    let app = TestApp::spawn(crate::helpers::Backend::Redis).await;
    let (status, body) = app.probe("/readyz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"status": "ready", "store": "redis", "topology": "standalone"})
    );
}

#[tokio::test]
async fn the_service_starts_while_redis_is_down_and_serves_once_it_is_up() {
    let mut redis = RedisServer::start();
    redis.kill();
    let mut config = test_config(Some(redis.url()));
    config.store_timeout_ms = 300;
    let app = TestApp::spawn_with(config).await;
    let response = app
        .anonymous(Method::GET, "/readyz")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    redis.restart();
    let response = app
        .admin(Method::PUT, "/pools/p")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::CREATED);
}
