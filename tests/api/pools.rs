//! Pool routes: create, update, read, list and delete.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::for_each_store;
use crate::helpers::{TestApp, assert_error, read};

/// The eligibility rules a pool has when its configuration names none (their values are
/// pinned by the unit test `the_defaults_are_the_documented_ones`).
fn default_rules() -> serde_json::Value {
    serde_json::to_value(proxy_allocator::domain::Rules::default()).expect("serialises")
}

async fn put_creates_a_pool_with_201_and_echoes_the_defaults(app: TestApp) {
    let response = app
        .admin(Method::PUT, "/pools/web")
        .send()
        .await
        .expect("sent");
    let (status, body) = read(response).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        body,
        json!({"pool": "web", "config": {"restore": "minimum", "start_assignments": null, "policy": "least-used", "lease_ttl_ms": 30000, "max_in_flight": null, "session_ttl_ms": 600000,
               "rules": default_rules(),
               "health": {"max_consecutive_failures": 3, "cooldown_ms": 60000, "max_cooldown_ms": 3600000, "backoff": 2, "jitter_percent": 10, "target_ban_ms": 600000, "check": null}}})
    );
}

async fn put_on_an_existing_pool_replaces_its_configuration_with_200(app: TestApp) {
    app.create_pool("web", json!({"restore": "history", "start_assignments": 7}))
        .await;
    let response = app
        .admin(Method::PUT, "/pools/web")
        .json(&json!({"restore": "zero"}))
        .send()
        .await
        .expect("sent");
    let (status, body) = read(response).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["config"],
        json!({"restore": "zero", "start_assignments": null, "policy": "least-used", "lease_ttl_ms": 30000, "max_in_flight": null, "session_ttl_ms": 600000,
               "rules": default_rules(),
               "health": {"max_consecutive_failures": 3, "cooldown_ms": 60000, "max_cooldown_ms": 3600000, "backoff": 2, "jitter_percent": 10, "target_ban_ms": 600000, "check": null}})
    );
    let (_, info) = app.get("/pools/web").await;
    assert_eq!(info["config"], body["config"]);
}

async fn put_refuses_unknown_fields_and_bad_values_with_400(app: TestApp) {
    for bad in [
        json!({"restor": "zero"}),
        json!({"restore": "sometimes"}),
        json!({"start_assignments": -1}),
        json!([1]),
        json!({"rules": {"schemes": ["ftp"]}}),
        json!({"rules": {"ports": {"allow": [[0, 10]]}}}),
        json!({"rules": {"ports": {"deny": [[0, 10]]}}}),
        json!({"rules": {"allow_privat": true}}),
        json!({"rules": {"max_members": -1}}),
    ] {
        let response = app
            .admin(Method::PUT, "/pools/web")
            .json(&bad)
            .send()
            .await
            .expect("sent");
        let (status, body) = read(response).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    }
    assert_error_404(&app, "/pools/web").await;
}

async fn put_keeps_the_rules_it_is_given_and_fills_in_the_rest(app: TestApp) {
    let rules = json!({"schemes": ["socks5h", "http"], "ports": {"allow": [[1000, 2000], 8080], "deny": [1080]},
                       "allow_private": true, "max_members": 50});
    app.create_pool("web", json!({ "rules": rules })).await;
    let (status, body) = app.get("/pools/web").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["config"]["rules"],
        json!({
            "schemes": ["http", "socks5h"],
            "ports": {"allow": [[1000, 2000], 8080], "deny": [1080]},
            "allow_private": true,
            "allow_hostnames": true,
            "allow_credentials": true,
            "max_members": 50,
            "opaque_ids": true,
        })
    );
}

async fn assert_error_404(app: &TestApp, path: &str) {
    let (status, body) = app.get(path).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
}

async fn get_pool_shows_configuration_and_stats(app: TestApp) {
    app.create_pool("p", json!({"start_assignments": 4})).await;
    app.seed("p", &["a", "b", "c"], None).await;
    app.post_json("/pools/p/members/disable", json!({"members": ["c"]}))
        .await;
    app.assigned("p").await;
    let (status, body) = app.get("/pools/p").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["pool"], json!("p"));
    assert_eq!(
        body["config"],
        json!({"restore": "minimum", "start_assignments": 4, "policy": "least-used", "lease_ttl_ms": 30000, "max_in_flight": null, "session_ttl_ms": 600000,
               "rules": default_rules(),
               "health": {"max_consecutive_failures": 3, "cooldown_ms": 60000, "max_cooldown_ms": 3600000, "backoff": 2, "jitter_percent": 10, "target_ban_ms": 600000, "check": null}})
    );
    assert_eq!(
        body["stats"],
        json!({"eligible": 2, "ineligible": 1, "min_assignments": 4, "max_assignments": 5, "total_assignments": 1, "in_flight": 0, "abandoned": 0,
               "tripped": 0, "recovered": 0, "pruned": 0,
               "shared_exit_ips": 0, "country_mismatches": 0})
    );
    assert!(
        body["created_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{body}"
    );
}

async fn get_pool_of_an_empty_pool_has_null_min_and_max(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let (_, body) = app.get("/pools/p").await;
    assert_eq!(
        body["stats"],
        json!({"eligible": 0, "ineligible": 0, "min_assignments": null, "max_assignments": null, "total_assignments": 0, "in_flight": 0, "abandoned": 0,
               "tripped": 0, "recovered": 0, "pruned": 0,
               "shared_exit_ips": 0, "country_mismatches": 0})
    );
}

async fn get_pools_lists_every_pool_in_id_order(app: TestApp) {
    for pool in ["zeta", "alpha", "mid"] {
        app.create_pool(pool, json!({})).await;
    }
    app.seed("mid", &["m1"], Some(3)).await;
    let (status, body) = app.get("/pools").await;
    assert_eq!(status, StatusCode::OK);
    let pools = body["pools"].as_array().expect("pools");
    let ids: Vec<&str> = pools
        .iter()
        .map(|p| p["pool"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["alpha", "mid", "zeta"]);
    assert_eq!(pools[1]["stats"]["eligible"], json!(1));
    assert_eq!(pools[1]["stats"]["min_assignments"], json!(3));
}

/// The ids of a listing page and its cursor.
async fn page(app: &TestApp, query: &str) -> (Vec<String>, Value) {
    let (status, body) = app.get(&format!("/pools?{query}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ids = body["pools"]
        .as_array()
        .expect("pools")
        .iter()
        .map(|p| p["pool"].as_str().expect("id").to_owned())
        .collect();
    (ids, body["next_cursor"].clone())
}

async fn get_pools_pages_through_pools_with_a_cursor_and_finds_them_by_prefix(app: TestApp) {
    for pool in ["web-3", "api", "web-1", "web-2", "webs", "zeta"] {
        app.create_pool(pool, json!({})).await;
    }
    assert_eq!(
        page(&app, "limit=2").await,
        (vec!["api".to_owned(), "web-1".to_owned()], json!("web-1"))
    );
    assert_eq!(
        page(&app, "limit=2&cursor=web-1").await,
        (vec!["web-2".to_owned(), "web-3".to_owned()], json!("web-3"))
    );
    assert_eq!(
        page(&app, "limit=2&cursor=web-3").await,
        (vec!["webs".to_owned(), "zeta".to_owned()], Value::Null)
    );
    assert_eq!(
        page(&app, "prefix=web-&limit=2").await,
        (vec!["web-1".to_owned(), "web-2".to_owned()], json!("web-2"))
    );
    assert_eq!(
        page(&app, "prefix=web-&limit=2&cursor=web-2").await,
        (vec!["web-3".to_owned()], Value::Null)
    );
    // A cursor before the prefix starts at the prefix's first pool.
    assert_eq!(
        page(&app, "prefix=web&cursor=api").await,
        (
            vec![
                "web-1".to_owned(),
                "web-2".to_owned(),
                "web-3".to_owned(),
                "webs".to_owned()
            ],
            Value::Null
        )
    );
    assert_eq!(page(&app, "prefix=nothing").await, (vec![], Value::Null));
    for (query, code) in [
        ("limit=0", "invalid_query"),
        ("limit=1001", "invalid_query"),
        ("cursor=bad%7Bid", "invalid_query"),
        ("prefix=bad%7B", "invalid_query"),
        ("page=2", "invalid_query"),
    ] {
        let (status, body) = app.get(&format!("/pools?{query}")).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, code);
    }
}

async fn delete_removes_the_pool_and_assign_then_answers_404(app: TestApp) {
    app.create_pool("gone", json!({})).await;
    app.seed("gone", &["a"], None).await;
    let response = app
        .admin(Method::DELETE, "/pools/gone")
        .send()
        .await
        .expect("sent");
    assert_eq!(
        read(response).await,
        (StatusCode::NO_CONTENT, serde_json::Value::Null)
    );
    let (status, body) = app.assign("gone").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
    let (_, list) = app.get("/pools").await;
    assert_eq!(list, json!({"pools": [], "next_cursor": null}));
    // Re-creating starts from nothing: the old members are gone with their counts.
    app.create_pool("gone", json!({})).await;
    assert_eq!(app.assign("gone").await.0, StatusCode::NO_CONTENT);
}

async fn delete_of_an_unknown_pool_answers_404(app: TestApp) {
    let response = app
        .admin(Method::DELETE, "/pools/never")
        .send()
        .await
        .expect("sent");
    let (status, body) = read(response).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
}

/// Sends a merge patch of the pool's configuration as `content_type`.
async fn patch(
    app: &TestApp,
    pool: &str,
    content_type: &str,
    patch: &Value,
) -> (StatusCode, Value) {
    let response = app
        .admin(Method::PATCH, &format!("/pools/{pool}"))
        .header("content-type", content_type)
        .body(patch.to_string())
        .send()
        .await
        .expect("sent");
    read(response).await
}

const MERGE_PATCH: &str = "application/merge-patch+json";

async fn patch_changes_only_the_fields_it_gives_and_merges_nested_objects(app: TestApp) {
    app.create_pool(
        "web",
        json!({"restore": "history", "start_assignments": 7,
               "rules": {"schemes": ["http"], "max_members": 50},
               "health": {"cooldown_ms": 5000}}),
    )
    .await;
    let (_, before) = app.get("/pools/web").await;
    let (status, body) = patch(
        &app,
        "web",
        MERGE_PATCH,
        &json!({"rules": {"allow_private": true}, "health": {"backoff": 3}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut expected = before["config"].clone();
    expected["rules"]["allow_private"] = json!(true);
    expected["health"]["backoff"] = json!(3);
    assert_eq!(body, json!({"pool": "web", "config": expected}));
    assert_eq!(body["config"]["rules"]["schemes"], json!(["http"]));
    assert_eq!(body["config"]["rules"]["max_members"], json!(50));
    assert_eq!(body["config"]["health"]["cooldown_ms"], json!(5000));
    let (_, after) = app.get("/pools/web").await;
    assert_eq!(after["config"], expected);
}

async fn patch_with_null_puts_a_field_back_to_its_default(app: TestApp) {
    app.create_pool(
        "web",
        json!({"restore": "zero", "start_assignments": 7,
               "rules": {"allow_private": true, "max_members": 50},
               "pacing": {"min_interval_ms": 1000}}),
    )
    .await;
    let (status, body) = patch(
        &app,
        "web",
        MERGE_PATCH,
        &json!({"start_assignments": null, "restore": null, "pacing": null,
                "rules": {"max_members": null}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut rules = default_rules();
    rules["allow_private"] = json!(true);
    assert_eq!(
        body["config"],
        json!({"restore": "minimum", "start_assignments": null, "policy": "least-used", "lease_ttl_ms": 30000, "max_in_flight": null, "session_ttl_ms": 600000,
               "rules": rules,
               "health": {"max_consecutive_failures": 3, "cooldown_ms": 60000, "max_cooldown_ms": 3600000, "backoff": 2, "jitter_percent": 10, "target_ban_ms": 600000, "check": null}})
    );
    // A whole object removed takes its whole default.
    let (status, body) = patch(&app, "web", MERGE_PATCH, &json!({"rules": null})).await;
    assert_eq!(
        (status, &body["config"]["rules"]),
        (StatusCode::OK, &default_rules())
    );
}

async fn patch_with_an_empty_object_keeps_every_setting(app: TestApp) {
    let config = json!({"policy": "least-in-flight", "restore": "history", "start_assignments": 3, "lease_ttl_ms": 5000,
                        "max_in_flight": 2, "session_ttl_ms": 60000,
                        "rules": {"schemes": ["socks5h"], "ports": {"allow": [[1000, 2000]], "deny": [1080]}, "allow_private": true, "max_members": 9},
                        "health": {"max_consecutive_failures": 5, "check": {"kind": "http", "url": "http://example.com/", "expect_status": [200, 204], "headers": {"accept": "text/plain"}, "interval_ms": 60000}},
                        "sources": [{"url": "http://example.com/list.txt", "interval_ms": 3600000}],
                        "prune": {"after_failed_checks": 3},
                        "pacing": {"min_interval_ms": 1000}});
    app.create_pool("web", config).await;
    let (_, before) = app.get("/pools/web").await;
    let (status, body) = patch(&app, "web", "application/json", &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["config"], before["config"]);
    let (_, after) = app.get("/pools/web").await;
    assert_eq!(after["config"], before["config"]);
}

async fn patch_refuses_an_invalid_result_whole_and_leaves_the_pool_unchanged(app: TestApp) {
    app.create_pool("web", json!({"restore": "history"})).await;
    app.seed("web", &["a"], None).await;
    let (_, before) = app.get("/pools/web").await;
    for (bad, status, code) in [
        // One good field beside each bad one: neither is applied.
        (
            json!({"restore": "zero", "restor": "zero"}),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            json!({"restore": "zero", "rules": {"schemes": ["ftp"]}}),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            json!({"restore": "zero", "rules": {"allow_privat": true}}),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            json!({"restore": "zero", "rules": 3}),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        // Valid alone, refused in the whole as PUT refuses it.
        (
            json!({"restore": "zero", "max_in_flight": 2}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({"restore": "zero", "policy": "least-in-flight"}),
            StatusCode::CONFLICT,
            "policy_change_requires_empty_pool",
        ),
    ] {
        let (got, body) = patch(&app, "web", MERGE_PATCH, &bad).await;
        assert_error(got, &body, status, code);
        let (_, now) = app.get("/pools/web").await;
        assert_eq!(now["config"], before["config"], "after {bad}");
    }
}

async fn patch_of_an_unknown_pool_answers_404_and_creates_nothing(app: TestApp) {
    let (status, body) = patch(&app, "never", MERGE_PATCH, &json!({"restore": "zero"})).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
    assert_error_404(&app, "/pools/never").await;
}

async fn patch_takes_merge_patch_or_plain_json_and_refuses_other_types_with_415(app: TestApp) {
    app.create_pool("web", json!({})).await;
    for content_type in [
        "application/merge-patch+json",
        "application/json; charset=utf-8",
    ] {
        let (status, body) = patch(&app, "web", content_type, &json!({"restore": "zero"})).await;
        assert_eq!(
            (status, &body["config"]["restore"]),
            (StatusCode::OK, &json!("zero")),
            "{content_type}"
        );
    }
    for content_type in [
        "application/json-patch+json",
        "text/plain",
        "application/problem+json",
    ] {
        let (status, body) = patch(&app, "web", content_type, &json!({"restore": "history"})).await;
        assert_error(
            status,
            &body,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        );
        assert_eq!(
            body["error"]["message"],
            "expected a body with content type application/merge-patch+json or application/json"
        );
    }
    let (_, after) = app.get("/pools/web").await;
    assert_eq!(after["config"]["restore"], "zero");
}

for_each_store!(
    put_creates_a_pool_with_201_and_echoes_the_defaults,
    patch_changes_only_the_fields_it_gives_and_merges_nested_objects,
    patch_with_null_puts_a_field_back_to_its_default,
    patch_with_an_empty_object_keeps_every_setting,
    patch_refuses_an_invalid_result_whole_and_leaves_the_pool_unchanged,
    patch_of_an_unknown_pool_answers_404_and_creates_nothing,
    patch_takes_merge_patch_or_plain_json_and_refuses_other_types_with_415,
    put_on_an_existing_pool_replaces_its_configuration_with_200,
    put_refuses_unknown_fields_and_bad_values_with_400,
    put_keeps_the_rules_it_is_given_and_fills_in_the_rest,
    get_pool_shows_configuration_and_stats,
    get_pool_of_an_empty_pool_has_null_min_and_max,
    get_pools_lists_every_pool_in_id_order,
    get_pools_pages_through_pools_with_a_cursor_and_finds_them_by_prefix,
    delete_removes_the_pool_and_assign_then_answers_404,
    delete_of_an_unknown_pool_answers_404,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_registered_by_an_earlier_version_are_listed_once_a_replica_starts() {
    let config = crate::helpers::test_config(Some(crate::helpers::shared_redis_url()));
    let url = crate::helpers::shared_redis_url();
    let earlier = TestApp::spawn_with(config.clone()).await;
    for pool in ["b", "a"] {
        earlier.create_pool(pool, json!({})).await;
    }
    // The registry as earlier versions kept it: a set, and no sorted set.
    let prefix = &config.key_prefix;
    crate::helpers::redis_cli(&url, &["DEL", &format!("{prefix}:pool_ids")]);
    crate::helpers::redis_cli(&url, &["SADD", &format!("{prefix}:pools"), "a", "b"]);
    let (ids, _) = page(&earlier, "").await;
    assert_eq!(ids, Vec::<String>::new());

    let started = TestApp::spawn_with(config.clone()).await;
    assert_eq!(
        page(&started, "").await,
        (vec!["a".to_owned(), "b".to_owned()], Value::Null)
    );
    assert_eq!(
        crate::helpers::redis_cli(&url, &["EXISTS", &format!("{prefix}:pools")]),
        redis::Value::Int(0)
    );
}
