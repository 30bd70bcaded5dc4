//! Member routes: seeding defaults, listing, disable/enable under each restore policy,
//! removal, and per-member rejection of invalid ids.

use reqwest::StatusCode;
use serde_json::json;

use crate::for_each_store;
use crate::helpers::{TestApp, assert_error};

async fn seeding_an_empty_pool_starts_new_members_at_zero(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let body = app.seed("p", &["a", "b"], None).await;
    assert_eq!(
        body,
        json!({"pool": "p", "added": ["a", "b"], "existing": [], "rejected": [], "start_assignments": 0})
    );
}

async fn seeding_an_existing_pool_starts_new_members_at_the_current_minimum(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], Some(40)).await;
    app.seed("p", &["b"], Some(25)).await;
    let body = app.seed("p", &["c", "a"], None).await;
    assert_eq!(body["added"], json!(["c"]));
    assert_eq!(body["existing"], json!(["a"]));
    assert_eq!(body["start_assignments"], json!(25));
    assert_eq!(
        app.counts("p").await,
        [
            ("b".into(), 25, "eligible".into()),
            ("c".into(), 25, "eligible".into()),
            ("a".into(), 40, "eligible".into())
        ]
    );
}

async fn the_pools_agreed_starting_count_applies_unless_the_call_gives_one(app: TestApp) {
    app.create_pool("p", json!({"start_assignments": 100}))
        .await;
    app.seed("p", &["a"], Some(5)).await;
    let body = app.seed("p", &["b"], None).await;
    assert_eq!(body["start_assignments"], json!(100));
    let body = app.seed("p", &["c"], Some(7)).await;
    assert_eq!(body["start_assignments"], json!(7));
    assert_eq!(
        app.counts("p").await,
        [
            ("a".into(), 5, "eligible".into()),
            ("c".into(), 7, "eligible".into()),
            ("b".into(), 100, "eligible".into())
        ]
    );
}

async fn existing_members_keep_their_count_unless_reset_is_asked(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b"], Some(9)).await;
    app.post_json("/pools/p/members/disable", json!({"members": ["b"]}))
        .await;
    let body = app.seed("p", &["a", "b"], Some(1)).await;
    assert_eq!(body["existing"], json!(["a", "b"]));
    assert_eq!(app.counts("p").await[0].1, 9);
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ["a", "b"], "assignments": 1, "reset": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["existing"], json!(["a", "b"]));
    // Reset changes the count, not the state: b stays disabled.
    assert_eq!(
        app.counts("p").await,
        [
            ("a".into(), 1, "eligible".into()),
            ("b".into(), 1, "ineligible".into())
        ]
    );
}

async fn invalid_member_ids_are_rejected_one_by_one_with_a_reason(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let long = "x".repeat(513);
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ["ok-1", "", "has space", long, "tab\there", "\r\n*3\r\n$3\r\nDEL", "ok-1", "redis.call('DEL','k')"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["added"], json!(["ok-1", "redis.call('DEL','k')"]));
    assert_eq!(
        body["rejected"],
        json!([
            {"member": "", "reason": "empty"},
            {"member": "has space", "reason": "invalid_characters"},
            {"member": long, "reason": "too_long"},
            {"member": "tab\there", "reason": "invalid_characters"},
            {"member": "\r\n*3\r\n$3\r\nDEL", "reason": "invalid_characters"},
        ])
    );
    // Script-looking ids are data: stored and handed out byte for byte.
    assert_eq!(app.assigned("p").await.0, "ok-1");
    assert_eq!(app.assigned("p").await.0, "redis.call('DEL','k')");
}

async fn seeding_applies_the_pools_rules_and_canonicalises_addresses(app: TestApp) {
    app.create_pool("p", json!({"rules": {"ports": {"deny": [6379]}}}))
        .await;
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ["dc-fra-07", "1.2.3.4:8080", "HTTP://1.2.3.4:8080/", "10.0.0.5:80",
                               "8.8.8.8:6379", "socks5://8.8.8.8:1080", "10.0.0.5", "1.2.3.4:0",
                               "u:p@proxy.example:3128"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"pool": "p",
               "added": ["dc-fra-07", "http://1.2.3.4:8080", "http://u:p@proxy.example:3128"],
               "existing": [],
               "rejected": [
                   {"member": "10.0.0.5:80", "reason": "private_address", "hint": "set rules.allow_private to accept private and loopback addresses",
                    "hint": "set rules.allow_private to accept private and loopback addresses"},
                   {"member": "8.8.8.8:6379", "reason": "port_not_allowed", "hint": "change rules.ports (allow, deny) to accept the port",
                    "hint": "change rules.ports (allow, deny) to accept the port"},
                   {"member": "socks5://8.8.8.8:1080", "reason": "scheme_not_allowed", "hint": "add the scheme to rules.schemes to accept it",
                    "hint": "add the scheme to rules.schemes to accept it"},
                   {"member": "10.0.0.5", "reason": "unparsable"},
                   {"member": "1.2.3.4:0", "reason": "port_not_allowed", "hint": "change rules.ports (allow, deny) to accept the port",
                    "hint": "change rules.ports (allow, deny) to accept the port"},
               ],
               "start_assignments": 0})
    );
}

async fn a_pool_that_takes_only_addresses_refuses_opaque_ids(app: TestApp) {
    app.create_pool(
        "p",
        json!({"rules": {"opaque_ids": false, "allow_private": true, "allow_credentials": false}}),
    )
    .await;
    let (_, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ["dc-fra-07", "127.0.0.1:3128", "u:p@8.8.8.8:80"]}),
        )
        .await;
    assert_eq!(body["added"], json!(["http://127.0.0.1:3128"]));
    assert_eq!(
        body["rejected"],
        json!([
            {"member": "dc-fra-07", "reason": "unparsable"},
            {"member": "u:p@8.8.8.8:80", "reason": "credentials_not_allowed", "hint": "set rules.allow_credentials to accept user:pass@"},
        ])
    );
}

async fn seeding_beyond_max_members_refuses_new_members_as_pool_full(app: TestApp) {
    app.create_pool("p", json!({"rules": {"max_members": 3}}))
        .await;
    app.seed("p", &["a", "b"], None).await;
    app.post_json("/pools/p/members/disable", json!({"members": ["a"]}))
        .await;
    // Existing members are never refused; new ones fill the room left, in request order.
    let body = app.seed("p", &["b", "c", "d", "e"], None).await;
    assert_eq!(
        body,
        json!({"pool": "p", "added": ["c"], "existing": ["b"],
               "rejected": [{"member": "d", "reason": "pool_full", "hint": "raise rules.max_members, or remove members first"}, {"member": "e", "reason": "pool_full", "hint": "raise rules.max_members, or remove members first"}],
               "start_assignments": 0})
    );
    // Ineligible members take room too.
    let body = app.seed("p", &["a", "f"], None).await;
    assert_eq!(body["existing"], json!(["a"]));
    assert_eq!(
        body["rejected"],
        json!([{"member": "f", "reason": "pool_full", "hint": "raise rules.max_members, or remove members first"}])
    );
}

async fn member_routes_find_an_address_in_any_written_form(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let body = app
        .seed("p", &["1.2.3.4:8080", "u:p@5.6.7.8:3128"], None)
        .await;
    assert_eq!(
        body["added"],
        json!(["http://1.2.3.4:8080", "http://u:p@5.6.7.8:3128"])
    );
    let (_, body) = app
        .post_json(
            "/pools/p/members/disable",
            json!({"members": ["HTTP://1.2.3.4:8080/"]}),
        )
        .await;
    assert_eq!(body["disabled"], json!(["http://1.2.3.4:8080"]));
    let body = enable(&app, json!({"members": ["1.2.3.4:8080"]})).await;
    assert_eq!(
        body["enabled"],
        json!([{"member": "http://1.2.3.4:8080", "kept_assignments": 0, "assignments": 0}])
    );
    let (_, body) = app
        .post_json(
            "/pools/p/members/remove",
            json!({"members": ["5.6.7.8:3128:u:p", "http://1.2.3.4:8080", "1.2.3.4:8080"]}),
        )
        .await;
    assert_eq!(
        body,
        json!({"pool": "p", "removed": ["http://u:p@5.6.7.8:3128", "http://1.2.3.4:8080"],
               "unknown": [], "rejected": []})
    );
}

async fn a_member_that_a_stricter_rule_would_refuse_can_still_be_taken_out(app: TestApp) {
    app.create_pool("p", json!({"rules": {"allow_private": true}}))
        .await;
    app.seed("p", &["10.0.0.5:80"], None).await;
    let response = app
        .admin(reqwest::Method::PUT, "/pools/p")
        .json(&json!({}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let (_, body) = app
        .post_json(
            "/pools/p/members/disable",
            json!({"members": ["10.0.0.5:80"]}),
        )
        .await;
    assert_eq!(body["disabled"], json!(["http://10.0.0.5:80"]));
    let (_, body) = app
        .post_json(
            "/pools/p/members/remove",
            json!({"members": ["10.0.0.5:80"]}),
        )
        .await;
    assert_eq!(body["removed"], json!(["http://10.0.0.5:80"]));
}

async fn more_than_ten_thousand_members_in_one_call_is_refused(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let members: Vec<String> = (0..10_001).map(|i| format!("m{i}")).collect();
    let (status, body) = app
        .post_json("/pools/p/members", json!({ "members": members }))
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "too_many_members");
    let members: Vec<String> = (0..10_000).map(|i| format!("m{i}")).collect();
    let (status, body) = app
        .post_json("/pools/p/members", json!({ "members": members }))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["added"].as_array().map(Vec::len), Some(10_000));
}

async fn seeding_a_missing_pool_answers_404(app: TestApp) {
    let (status, body) = app
        .post_json("/pools/nope/members", json!({"members": ["a"]}))
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
}

async fn listing_pages_through_members_by_assignments_then_id(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["d", "c"], Some(1)).await;
    app.seed("p", &["b", "a"], Some(2)).await;
    app.seed("p", &["e"], Some(0)).await;
    app.post_json(
        "/pools/p/members/disable",
        json!({"members": ["c", "a"], "reason": "maintenance"}),
    )
    .await;
    let (_, first) = app.get("/pools/p/members?limit=2").await;
    let names = |body: &serde_json::Value| -> Vec<String> {
        body["members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|m| m["member"].as_str().expect("id").to_owned())
            .collect()
    };
    assert_eq!(names(&first), ["e", "c"]);
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let (_, second) = app
        .get(&format!("/pools/p/members?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(names(&second), ["d", "a"]);
    let cursor = second["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let (_, third) = app
        .get(&format!("/pools/p/members?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(names(&third), ["b"]);
    assert_eq!(third["next_cursor"], json!(null));

    let c = &first["members"][1];
    assert_eq!(c["state"], json!("ineligible"));
    assert_eq!(c["reason"], json!("maintenance"));
    assert!(c["since"].as_str().is_some_and(|s| s.ends_with('Z')), "{c}");
    assert_eq!(
        first["members"][0].get("reason"),
        None,
        "eligible members have no reason"
    );

    let (_, eligible) = app.get("/pools/p/members?state=eligible").await;
    assert_eq!(names(&eligible), ["e", "d", "b"]);
    let (_, ineligible) = app.get("/pools/p/members?state=ineligible").await;
    assert_eq!(names(&ineligible), ["c", "a"]);
}

async fn listing_rejects_bad_query_parameters(app: TestApp) {
    app.create_pool("p", json!({})).await;
    for query in [
        "state=sleepy",
        "limit=0",
        "limit=1001",
        "limit=x",
        "cursor=abc",
        "cursor=1000000000000.0",
        "other=1",
    ] {
        let (status, body) = app.get(&format!("/pools/p/members?{query}")).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_query");
    }
}

async fn disable_reports_disabled_already_ineligible_and_unknown(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b"], Some(3)).await;
    let (status, body) = app
        .post_json(
            "/pools/p/members/disable",
            json!({"members": ["a", "zz", "bad id"], "reason": "slow"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"pool": "p", "disabled": ["a"], "already_ineligible": [], "unknown": ["zz"],
               "rejected": [{"member": "bad id", "reason": "invalid_characters"}]})
    );
    let (_, body) = app
        .post_json("/pools/p/members/disable", json!({"members": ["a"]}))
        .await;
    assert_eq!(body["already_ineligible"], json!(["a"]));
    // The member keeps its count while it is out.
    assert_eq!(
        app.counts("p").await,
        [
            ("a".into(), 3, "ineligible".into()),
            ("b".into(), 3, "eligible".into())
        ]
    );
}

/// Seeds a=0, b=0, c=0, disables `c`, runs 20 assigns (a and b reach 10 each), and puts
/// `c`'s kept count at `kept` (with reset) before the enable.
async fn pool_with_c_away(app: &TestApp, restore: &str, kept: u64) {
    app.create_pool("p", json!({ "restore": restore })).await;
    app.seed("p", &["a", "b", "c"], Some(0)).await;
    app.post_json("/pools/p/members/disable", json!({"members": ["c"]}))
        .await;
    for _ in 0..20 {
        app.assigned("p").await;
    }
    app.post_json(
        "/pools/p/members",
        json!({"members": ["c"], "assignments": kept, "reset": true}),
    )
    .await;
}

async fn enable(app: &TestApp, body: serde_json::Value) -> serde_json::Value {
    let (status, body) = app.post_json("/pools/p/members/enable", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

async fn restore_minimum_joins_at_the_current_minimum_from_below_and_above(app: TestApp) {
    pool_with_c_away(&app, "minimum", 2).await;
    let body = enable(&app, json!({"members": ["c"]})).await;
    assert_eq!(body["restore"], json!("minimum"));
    assert_eq!(
        body["enabled"],
        json!([{"member": "c", "kept_assignments": 2, "assignments": 10}])
    );
    app.post_json("/pools/p/members/disable", json!({"members": ["c"]}))
        .await;
    app.post_json(
        "/pools/p/members",
        json!({"members": ["c"], "assignments": 50, "reset": true}),
    )
    .await;
    let body = enable(&app, json!({"members": ["c"]})).await;
    assert_eq!(
        body["enabled"],
        json!([{"member": "c", "kept_assignments": 50, "assignments": 10}])
    );
}

async fn restore_history_never_goes_below_the_pack_nor_gains_by_being_away(app: TestApp) {
    pool_with_c_away(&app, "history", 2).await;
    let body = enable(&app, json!({"members": ["c"]})).await;
    assert_eq!(
        body["enabled"],
        json!([{"member": "c", "kept_assignments": 2, "assignments": 10}])
    );
    app.post_json("/pools/p/members/disable", json!({"members": ["c"]}))
        .await;
    app.post_json(
        "/pools/p/members",
        json!({"members": ["c"], "assignments": 50, "reset": true}),
    )
    .await;
    let body = enable(&app, json!({"members": ["c"]})).await;
    assert_eq!(
        body["enabled"],
        json!([{"member": "c", "kept_assignments": 50, "assignments": 50}])
    );
    // At 50 it waits: the next 80 assignments go to a and b until they reach 50.
    for _ in 0..80 {
        assert_ne!(app.assigned("p").await.0, "c");
    }
    assert_eq!(app.assigned("p").await, ("a".to_owned(), 51));
}

async fn restore_zero_restarts_at_zero_and_takes_assignments_until_it_catches_up(app: TestApp) {
    pool_with_c_away(&app, "zero", 7).await;
    let body = enable(&app, json!({"members": ["c"]})).await;
    assert_eq!(
        body["enabled"],
        json!([{"member": "c", "kept_assignments": 7, "assignments": 0}])
    );
    for expected in 1..=10 {
        assert_eq!(app.assigned("p").await, ("c".to_owned(), expected));
    }
}

async fn an_enable_may_override_the_pools_restore_policy(app: TestApp) {
    pool_with_c_away(&app, "minimum", 3).await;
    let body = enable(
        &app,
        json!({"members": ["c", "a", "ghost"], "restore": "zero"}),
    )
    .await;
    assert_eq!(
        body,
        json!({"pool": "p", "restore": "zero",
               "enabled": [{"member": "c", "kept_assignments": 3, "assignments": 0}],
               "already_eligible": ["a"], "unknown": ["ghost"], "rejected": []})
    );
}

async fn enabling_into_a_pool_with_no_eligible_member_keeps_the_count(app: TestApp) {
    app.create_pool("p", json!({"restore": "minimum"})).await;
    app.seed("p", &["a"], Some(12)).await;
    app.seed("p", &["b"], Some(30)).await;
    app.post_json("/pools/p/members/disable", json!({"members": ["a", "b"]}))
        .await;
    let body = enable(&app, json!({"members": ["b", "a"]})).await;
    assert_eq!(
        body["enabled"],
        json!([
            {"member": "b", "kept_assignments": 30, "assignments": 30},
            {"member": "a", "kept_assignments": 12, "assignments": 12},
        ])
    );
}

async fn remove_forgets_members_with_their_history(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b"], Some(9)).await;
    app.seed("p", &["c"], Some(5)).await;
    app.post_json("/pools/p/members/disable", json!({"members": ["b"]}))
        .await;
    let (status, body) = app
        .post_json(
            "/pools/p/members/remove",
            json!({"members": ["a", "b", "zz"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"pool": "p", "removed": ["a", "b"], "unknown": ["zz"], "rejected": []})
    );
    assert_eq!(app.counts("p").await, [("c".into(), 5, "eligible".into())]);
    // Added again, b is a new member: it starts at the minimum (c's 5), not at its old 9.
    let body = app.seed("p", &["b"], None).await;
    assert_eq!(body["added"], json!(["b"]));
    assert_eq!(body["start_assignments"], json!(5));
    assert_eq!(
        app.counts("p").await,
        [
            ("b".into(), 5, "eligible".into()),
            ("c".into(), 5, "eligible".into())
        ]
    );
}

async fn member_routes_on_a_missing_pool_answer_404(app: TestApp) {
    for path in ["disable", "enable", "remove"] {
        let (status, body) = app
            .post_json(
                &format!("/pools/nope/members/{path}"),
                json!({"members": ["a"]}),
            )
            .await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
    }
    let (status, body) = app.get("/pools/nope/members").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
}

for_each_store!(
    seeding_an_empty_pool_starts_new_members_at_zero,
    seeding_an_existing_pool_starts_new_members_at_the_current_minimum,
    the_pools_agreed_starting_count_applies_unless_the_call_gives_one,
    existing_members_keep_their_count_unless_reset_is_asked,
    invalid_member_ids_are_rejected_one_by_one_with_a_reason,
    more_than_ten_thousand_members_in_one_call_is_refused,
    seeding_applies_the_pools_rules_and_canonicalises_addresses,
    a_pool_that_takes_only_addresses_refuses_opaque_ids,
    seeding_beyond_max_members_refuses_new_members_as_pool_full,
    member_routes_find_an_address_in_any_written_form,
    a_member_that_a_stricter_rule_would_refuse_can_still_be_taken_out,
    seeding_a_missing_pool_answers_404,
    listing_pages_through_members_by_assignments_then_id,
    listing_rejects_bad_query_parameters,
    disable_reports_disabled_already_ineligible_and_unknown,
    restore_minimum_joins_at_the_current_minimum_from_below_and_above,
    restore_history_never_goes_below_the_pack_nor_gains_by_being_away,
    restore_zero_restarts_at_zero_and_takes_assignments_until_it_catches_up,
    an_enable_may_override_the_pools_restore_policy,
    enabling_into_a_pool_with_no_eligible_member_keeps_the_count,
    remove_forgets_members_with_their_history,
    member_routes_on_a_missing_pool_answer_404,
);
