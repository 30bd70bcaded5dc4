//! `POST /pools/{pool}/assign`: the least-used rule, its tie-break and its answers.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::for_each_store;
use crate::helpers::{TestApp, assert_error, raw_request};

async fn assign_returns_the_least_used_member_and_its_count_after_this_assignment(app: TestApp) {
    app.create_pool("web", json!({})).await;
    app.seed("web", &["a"], Some(5)).await;
    app.seed("web", &["b"], Some(2)).await;
    let (status, body) = app.assign("web").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"pool": "web", "proxy": "b", "assignments": 3}));
}

async fn assign_returns_204_with_an_empty_body_when_the_pool_has_no_members(app: TestApp) {
    app.create_pool("empty", json!({})).await;
    let response = app
        .anonymous(reqwest::Method::POST, "/pools/empty/assign")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(response.bytes().await.expect("body").len(), 0);
}

async fn assign_returns_204_when_every_member_is_disabled(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b"], None).await;
    app.post_json("/pools/p/members/disable", json!({"members": ["a", "b"]}))
        .await;
    assert_eq!(app.assign("p").await, (StatusCode::NO_CONTENT, Value::Null));
}

async fn assign_returns_404_pool_not_found_for_a_pool_that_does_not_exist(app: TestApp) {
    let (status, body) = app.assign("nope").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
}

async fn assign_returns_400_invalid_pool_id_for_malformed_ids(app: TestApp) {
    let too_long = "x".repeat(65);
    for bad in [
        "-lead",
        "a%7Bb%7D",
        "a*",
        "%00",
        "caf%C3%A9",
        too_long.as_str(),
        "a:b",
        "a%20b",
    ] {
        let (status, body) = app.assign(bad).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_pool_id");
    }
    // An HTTP client would resolve `..` before sending; send it as it is.
    for dots in ["..", "%2E%2E"] {
        let request = format!(
            "POST /pools/{dots}/assign HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        let (status, body) = raw_request(&app.base, &request).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_pool_id");
    }
}

async fn equal_counts_go_to_the_member_that_sorts_first_bytewise(app: TestApp) {
    app.create_pool("p", json!({})).await;
    // Seeded in another order on purpose: the order of insertion must not matter.
    app.seed("p", &["b", "B", "a", "A", "_"], Some(0)).await;
    let mut picks = Vec::new();
    for _ in 0..5 {
        picks.push(app.assigned("p").await.0);
    }
    assert_eq!(picks, ["A", "B", "_", "a", "b"]);
}

async fn picks_follow_the_least_used_sequence_for_uneven_starting_counts(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["x"], Some(0)).await;
    app.seed("p", &["y"], Some(2)).await;
    app.seed("p", &["z"], Some(3)).await;
    let mut picks = Vec::new();
    for _ in 0..8 {
        let (proxy, count) = app.assigned("p").await;
        picks.push(format!("{proxy}{count}"));
    }
    assert_eq!(picks, ["x1", "x2", "x3", "y3", "x4", "y4", "z4", "x5"]);
}

async fn the_only_eligible_member_is_assigned_again_and_again(app: TestApp) {
    app.create_pool("solo", json!({})).await;
    app.seed("solo", &["only"], None).await;
    for expected in 1..=5 {
        assert_eq!(app.assigned("solo").await, ("only".to_owned(), expected));
    }
}

async fn assignments_count_in_pool_stats(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b"], Some(10)).await;
    for _ in 0..3 {
        app.assigned("p").await;
    }
    let (_, body) = app.get("/pools/p").await;
    assert_eq!(
        body["stats"],
        json!({"eligible": 2, "ineligible": 0, "min_assignments": 11, "max_assignments": 12, "total_assignments": 3, "in_flight": 0, "abandoned": 0,
               "tripped": 0, "recovered": 0, "pruned": 0,
               "shared_exit_ips": 0, "country_mismatches": 0})
    );
}

for_each_store!(
    assign_returns_the_least_used_member_and_its_count_after_this_assignment,
    assign_returns_204_with_an_empty_body_when_the_pool_has_no_members,
    assign_returns_204_when_every_member_is_disabled,
    assign_returns_404_pool_not_found_for_a_pool_that_does_not_exist,
    assign_returns_400_invalid_pool_id_for_malformed_ids,
    equal_counts_go_to_the_member_that_sorts_first_bytewise,
    picks_follow_the_least_used_sequence_for_uneven_starting_counts,
    the_only_eligible_member_is_assigned_again_and_again,
    assignments_count_in_pool_stats,
);
