//! Labels: members get them when seeded or imported, the listing shows and filters them,
//! and an assign with `labels` chooses the least-used (or least-busy) eligible member
//! among those carrying them.

use std::collections::BTreeMap;
use std::sync::Arc;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::for_each_store;
use crate::helpers::{
    Backend, TestApp, assert_error, backend_config, read, without_background_traffic,
};

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

/// The proxy of a labelled assign that must succeed, with its count.
async fn assigned_with(app: &TestApp, pool: &str, labels: Value) -> (String, u64) {
    let (status, body) = assign_with(app, pool, json!({ "labels": labels })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    (
        body["proxy"].as_str().expect("proxy").to_owned(),
        body["assignments"].as_u64().expect("assignments"),
    )
}

/// Each listed member as (id, labels).
async fn listed_labels(app: &TestApp, path: &str) -> Vec<(String, Value)> {
    let (status, body) = app.get(path).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("id").to_owned(),
                m.get("labels").cloned().unwrap_or(Value::Null),
            )
        })
        .collect()
}

/// A pool `p` of six members: de-1, de-2 (country de, provider acme / beta), fr-1, fr-2
/// (country fr), us-1 (country us) and plain (no labels), all at 0.
async fn mixed_pool(app: &TestApp, config: Value) {
    app.create_pool("p", config).await;
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({
                "members": [
                    {"member": "de-1", "labels": {"country": "de", "provider": "acme"}},
                    {"member": "de-2", "labels": {"country": "de", "provider": "beta"}},
                    "fr-1",
                    "fr-2",
                    {"member": "us-1", "labels": {"country": "us"}},
                    {"member": "plain", "labels": {}},
                ],
                "labels": {"country": "fr", "provider": "acme"},
                "assignments": 0,
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["added"],
        json!(["de-1", "de-2", "fr-1", "fr-2", "us-1", "plain"])
    );
}

async fn seeded_labels_come_from_the_entry_or_else_the_call_and_the_listing_shows_them(
    app: TestApp,
) {
    mixed_pool(&app, json!({})).await;
    assert_eq!(
        listed_labels(&app, "/pools/p/members").await,
        [
            (
                "de-1".to_owned(),
                json!({"country": "de", "provider": "acme"})
            ),
            (
                "de-2".to_owned(),
                json!({"country": "de", "provider": "beta"})
            ),
            (
                "fr-1".to_owned(),
                json!({"country": "fr", "provider": "acme"})
            ),
            (
                "fr-2".to_owned(),
                json!({"country": "fr", "provider": "acme"})
            ),
            ("plain".to_owned(), Value::Null),
            ("us-1".to_owned(), json!({"country": "us"})),
        ]
    );
}

async fn an_assign_with_a_label_takes_the_least_used_member_carrying_it(app: TestApp) {
    mixed_pool(&app, json!({})).await;
    app.post_json(
        "/pools/p/members",
        json!({"members": ["de-2"], "assignments": 3, "reset": true}),
    )
    .await;
    // de-1 (0) before de-2 (3); the members without the label are never chosen.
    let mut picks = Vec::new();
    for _ in 0..5 {
        picks.push(assigned_with(&app, "p", json!({"country": "de"})).await);
    }
    let expected = [
        ("de-1", 1),
        ("de-1", 2),
        ("de-1", 3),
        ("de-1", 4),
        ("de-2", 4),
    ];
    assert_eq!(
        picks,
        expected.map(|(m, n)| (m.to_owned(), n)).to_vec(),
        "least-used among country=de, ties by id"
    );
    // A plain assign still takes the least-used of the whole pool.
    assert_eq!(app.assigned("p").await, ("fr-1".to_owned(), 1));
}

/// Plain assigns and `country=de` assigns in turn, three of each: the plain ones move
/// labelled members too, and the labelled ones must see it.
async fn plain_and_labelled_assigns_in_turn(app: &TestApp) -> Vec<String> {
    let mut picks = Vec::new();
    for _ in 0..3 {
        let (status, body) = app.assign("p").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        picks.push(body["proxy"].as_str().expect("proxy").to_owned());
        let (status, body) = assign_with(app, "p", json!({"labels": {"country": "de"}})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        picks.push(body["proxy"].as_str().expect("proxy").to_owned());
    }
    picks
}

async fn a_plain_assign_of_a_labelled_member_moves_it_in_the_labelled_choice(app: TestApp) {
    mixed_pool(&app, json!({})).await;
    // de-1 goes first to the plain assign, so the labelled one takes de-2; then fr-1 and
    // de-1 (both de at 1, ties by id), then fr-2 and de-2.
    assert_eq!(
        plain_and_labelled_assigns_in_turn(&app).await,
        ["de-1", "de-2", "fr-1", "de-1", "fr-2", "de-2"]
    );
}

async fn a_plain_lease_of_a_labelled_member_moves_it_in_the_labelled_choice(app: TestApp) {
    mixed_pool(&app, json!({"policy": "least-in-flight"})).await;
    app.post_json(
        "/pools/p/members",
        json!({"members": ["de-2"], "assignments": 3, "reset": true}),
    )
    .await;
    // Every lease stays live. The plain assign leases de-1, so the labelled one takes de-2
    // for its lack of leases, though it has more assignments; then de-1 and de-2 have one
    // lease each and de-1 fewer assignments.
    assert_eq!(
        plain_and_labelled_assigns_in_turn(&app).await,
        ["de-1", "de-2", "fr-1", "de-1", "fr-2", "de-2"]
    );
}

async fn a_list_of_values_takes_the_least_used_member_carrying_any_of_them(app: TestApp) {
    mixed_pool(&app, json!({})).await;
    let mut picks = Vec::new();
    for _ in 0..6 {
        picks.push(
            assigned_with(&app, "p", json!({"country": ["us", "de"]}))
                .await
                .0,
        );
    }
    assert_eq!(picks, ["de-1", "de-2", "us-1", "de-1", "de-2", "us-1"]);
}

async fn a_filter_over_several_keys_needs_every_one_of_them(app: TestApp) {
    mixed_pool(&app, json!({})).await;
    let filter = json!({"country": ["de", "fr"], "provider": "acme"});
    let mut picks = Vec::new();
    for _ in 0..6 {
        picks.push(assigned_with(&app, "p", filter.clone()).await.0);
    }
    assert_eq!(picks, ["de-1", "fr-1", "fr-2", "de-1", "fr-1", "fr-2"]);
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"labels": {"country": "us", "provider": "acme"}}),
    )
    .await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
}

async fn a_labelled_assign_answers_204_when_no_eligible_member_carries_the_labels(app: TestApp) {
    mixed_pool(&app, json!({})).await;
    let (status, _) = app
        .post_json("/pools/p/members/disable", json!({"members": ["us-1"]}))
        .await;
    assert_eq!(status, StatusCode::OK);
    for labels in [
        json!({"country": "us"}),
        json!({"country": "jp"}),
        json!({"tier": "a"}),
    ] {
        let response = app
            .anonymous(Method::POST, "/pools/p/assign")
            .json(&json!({ "labels": labels }))
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), StatusCode::NO_CONTENT, "{labels}");
        assert_eq!(response.headers().get("retry-after"), None);
    }
    app.post_json("/pools/p/members/enable", json!({"members": ["us-1"]}))
        .await;
    assert_eq!(
        assigned_with(&app, "p", json!({"country": "us"})).await,
        ("us-1".to_owned(), 1)
    );
}

async fn a_labelled_assign_never_hands_out_a_disabled_member_though_it_has_the_fewest_assignments(
    app: TestApp,
) {
    mixed_pool(&app, json!({})).await;
    app.post_json(
        "/pools/p/members",
        json!({"members": ["de-2"], "assignments": 3, "reset": true}),
    )
    .await;
    let (status, body) = app
        .post_json("/pools/p/members/disable", json!({"members": ["de-1"]}))
        .await;
    assert_eq!(
        (status, &body["disabled"]),
        (StatusCode::OK, &json!(["de-1"]))
    );
    // de-1 (0) is the least-used member carrying country=de, but it is out: de-2 it is.
    let mut picks = Vec::new();
    for _ in 0..2 {
        picks.push(assigned_with(&app, "p", json!({"country": "de"})).await);
    }
    app.post_json("/pools/p/members/enable", json!({"members": ["de-1"]}))
        .await;
    // Back in, at its count of 0, it leads again.
    picks.push(assigned_with(&app, "p", json!({"country": "de"})).await);
    assert_eq!(
        picks,
        [("de-2", 4), ("de-2", 5), ("de-1", 1)].map(|(m, n)| (m.to_owned(), n))
    );
}

async fn a_labelled_assign_never_hands_out_a_member_cooling_down(app: TestApp) {
    mixed_pool(
        &app,
        json!({"health": {"max_consecutive_failures": 1, "cooldown_ms": 600000, "jitter_percent": 0}}),
    )
    .await;
    app.post_json(
        "/pools/p/members",
        json!({"members": ["de-2"], "assignments": 3, "reset": true}),
    )
    .await;
    let response = app
        .anonymous(Method::POST, "/pools/p/outcomes")
        .json(&json!({"proxy": "de-1", "result": "failed"}))
        .send()
        .await
        .expect("sent");
    let (status, body) = read(response).await;
    assert_eq!(
        (status, &body["outcomes"][0]["effect"]),
        (StatusCode::OK, &json!("tripped"))
    );
    let mut picks = Vec::new();
    for _ in 0..2 {
        picks.push(assigned_with(&app, "p", json!({"country": "de"})).await);
    }
    assert_eq!(
        picks,
        [("de-2", 4), ("de-2", 5)].map(|(m, n)| (m.to_owned(), n))
    );
}

/// With no sweep for an hour, only the assign itself can bring back a member whose cooldown
/// has ended: a labelled assign must do it before it chooses, as a plain one does.
async fn a_labelled_assign_first_brings_back_a_member_whose_cooldown_has_ended(backend: Backend) {
    let mut config = backend_config(backend);
    without_background_traffic(&mut config);
    let app = TestApp::spawn_with(config).await;
    mixed_pool(
        &app,
        json!({"health": {"max_consecutive_failures": 1, "cooldown_ms": 100, "jitter_percent": 0}}),
    )
    .await;
    app.post_json(
        "/pools/p/members",
        json!({"members": ["de-2"], "assignments": 3, "reset": true}),
    )
    .await;
    let response = app
        .anonymous(Method::POST, "/pools/p/outcomes")
        .json(&json!({"proxy": "de-1", "result": "failed"}))
        .send()
        .await
        .expect("sent");
    let (status, body) = read(response).await;
    assert_eq!(
        (status, &body["outcomes"][0]["effect"]),
        (StatusCode::OK, &json!("tripped"))
    );
    assert_eq!(
        assigned_with(&app, "p", json!({"country": "de"})).await,
        ("de-2".to_owned(), 4)
    );
    // The store's clock passes the 100 ms cooldown; nothing else runs meanwhile.
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    // Back at the eligible members' minimum (0), de-1 is the choice.
    assert_eq!(
        assigned_with(&app, "p", json!({"country": "de"})).await,
        ("de-1".to_owned(), 1)
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_labelled_assign_first_brings_back_a_member_whose_cooldown_has_ended() {
    a_labelled_assign_first_brings_back_a_member_whose_cooldown_has_ended(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_embedded_a_labelled_assign_first_brings_back_a_member_whose_cooldown_has_ended() {
    a_labelled_assign_first_brings_back_a_member_whose_cooldown_has_ended(Backend::Embedded).await;
}

async fn a_labelled_assign_moves_the_member_in_the_choice_of_its_other_labels(app: TestApp) {
    mixed_pool(&app, json!({})).await;
    // de-1 carries country=de and provider=acme; fr-1 and fr-2 provider=acme too.
    assert_eq!(
        assigned_with(&app, "p", json!({"country": "de"})).await,
        ("de-1".to_owned(), 1)
    );
    // Among provider=acme, de-1 now has one assignment: fr-1 and fr-2 (0) come first, then
    // the three at 1 by id.
    let mut picks = Vec::new();
    for _ in 0..5 {
        picks.push(assigned_with(&app, "p", json!({"provider": "acme"})).await);
    }
    assert_eq!(
        picks,
        [
            ("fr-1", 1),
            ("fr-2", 1),
            ("de-1", 2),
            ("fr-1", 2),
            ("fr-2", 2)
        ]
        .map(|(m, n)| (m.to_owned(), n))
    );
    // And country=de saw the provider=acme assign of de-1: de-2 (0) first.
    assert_eq!(
        assigned_with(&app, "p", json!({"country": "de"})).await,
        ("de-2".to_owned(), 1)
    );
}

async fn replacing_labels_keeps_the_count_and_the_state(app: TestApp) {
    mixed_pool(&app, json!({})).await;
    assigned_with(&app, "p", json!({"country": "us"})).await;
    app.post_json(
        "/pools/p/members/disable",
        json!({"members": ["us-1"], "reason": "slow"}),
    )
    .await;
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": [{"member": "us-1", "labels": {"country": "ca"}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["existing"], json!(["us-1"]));
    let listed = app.members("p").await;
    let us = listed
        .iter()
        .find(|m| m["member"] == "us-1")
        .expect("listed");
    assert_eq!(us["assignments"], json!(1));
    assert_eq!(us["state"], json!("ineligible"));
    assert_eq!(us["reason"], json!("slow"));
    assert_eq!(us["labels"], json!({"country": "ca"}));
    app.post_json("/pools/p/members/enable", json!({"members": ["us-1"]}))
        .await;
    // The old label is gone from the choice, the new one leads to it.
    let (status, _) = assign_with(&app, "p", json!({"labels": {"country": "us"}})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        assigned_with(&app, "p", json!({"country": "ca"})).await.0,
        "us-1"
    );
    // A seeding that gives no labels leaves them alone.
    app.seed("p", &["us-1"], None).await;
    let listed = listed_labels(&app, "/pools/p/members?label=country=ca").await;
    assert_eq!(listed, [("us-1".to_owned(), json!({"country": "ca"}))]);
}

async fn labelled_members_follow_cooldowns_and_removal(app: TestApp) {
    mixed_pool(
        &app,
        json!({"health": {"max_consecutive_failures": 1, "cooldown_ms": 600000, "jitter_percent": 0}}),
    )
    .await;
    let response = app
        .anonymous(Method::POST, "/pools/p/outcomes")
        .json(&json!({"proxy": "de-1", "result": "failed"}))
        .send()
        .await
        .expect("sent");
    let (status, body) = read(response).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcomes"][0]["effect"], json!("tripped"));
    assert_eq!(
        assigned_with(&app, "p", json!({"country": "de"})).await.0,
        "de-2"
    );
    app.post_json("/pools/p/members/remove", json!({"members": ["de-2"]}))
        .await;
    let (status, _) = assign_with(&app, "p", json!({"labels": {"country": "de"}})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // Removed members leave the listing's label index too.
    let listed = listed_labels(&app, "/pools/p/members?label=country=de").await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0, "de-1");
}

async fn a_least_in_flight_assign_with_a_label_takes_the_least_busy_member_carrying_it(
    app: TestApp,
) {
    mixed_pool(&app, json!({"policy": "least-in-flight"})).await;
    let (status, first) = assign_with(&app, "p", json!({"labels": {"country": "de"}})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(first["proxy"], json!("de-1"));
    assert_eq!(first["in_flight"], json!(1));
    let (_, second) = assign_with(&app, "p", json!({"labels": {"country": "de"}})).await;
    assert_eq!(second["proxy"], json!("de-2"));
    let lease = first["lease"]["id"].as_str().expect("a lease id");
    let response = app
        .anonymous(Method::POST, &format!("/pools/p/leases/{lease}/release"))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    // de-1 has no lease left, de-2 has one: de-1 again, though both have one assignment.
    let (_, third) = assign_with(&app, "p", json!({"labels": {"country": "de"}})).await;
    assert_eq!(third["proxy"], json!("de-1"));
    assert_eq!(third["assignments"], json!(2));
}

async fn the_listing_filters_on_label_parameters_and_pages_through_them(app: TestApp) {
    mixed_pool(&app, json!({})).await;
    assert_eq!(
        listed_labels(
            &app,
            "/pools/p/members?label=provider=acme&label=country=fr"
        )
        .await
        .into_iter()
        .map(|(m, _)| m)
        .collect::<Vec<_>>(),
        ["fr-1", "fr-2"]
    );
    // The walk goes over country=de; de-2 is there but not provider=acme.
    assert_eq!(
        listed_labels(
            &app,
            "/pools/p/members?label=country=de&label=provider=acme"
        )
        .await,
        [(
            "de-1".to_owned(),
            json!({"country": "de", "provider": "acme"})
        )]
    );
    app.post_json("/pools/p/members/disable", json!({"members": ["fr-1"]}))
        .await;
    let ids = |listed: Vec<(String, Value)>| listed.into_iter().map(|(m, _)| m).collect::<Vec<_>>();
    assert_eq!(
        ids(listed_labels(&app, "/pools/p/members?label=country=fr&state=eligible").await),
        ["fr-2"]
    );
    // A key given twice accepts either value; pages follow the cursor.
    let mut seen = Vec::new();
    let mut path = "/pools/p/members?label=country=us&label=country=de&limit=2".to_owned();
    loop {
        let (status, body) = app.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        for m in body["members"].as_array().expect("members") {
            seen.push(m["member"].as_str().expect("id").to_owned());
        }
        match body["next_cursor"].as_str() {
            Some(cursor) => {
                path = format!(
                    "/pools/p/members?label=country=us&label=country=de&limit=2&cursor={cursor}"
                );
            }
            None => break,
        }
    }
    assert_eq!(seen, ["us-1", "de-1", "de-2"]);
}

async fn a_labelled_listing_that_ends_on_a_full_page_gives_no_next_cursor_for_values_nobody_carries(
    app: TestApp,
) {
    mixed_pool(&app, json!({})).await;
    // Both de members fill the page; nobody carries country=nl, so nothing follows.
    let (status, body) = app
        .get("/pools/p/members?label=country=de&label=country=nl&limit=2")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ids: Vec<&str> = body["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["member"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["de-1", "de-2"]);
    assert_eq!(body["next_cursor"], Value::Null);
}

async fn an_import_gives_every_member_the_label_parameters(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let response = app
        .admin(
            Method::POST,
            "/pools/p/import?label=country=de&label=source=list-7",
        )
        .header("content-type", "text/plain")
        .body("1.2.3.4:8080\n5.6.7.8:3128\n")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let labels = json!({"country": "de", "source": "list-7"});
    assert_eq!(
        listed_labels(&app, "/pools/p/members?label=source=list-7").await,
        [
            ("http://1.2.3.4:8080".to_owned(), labels.clone()),
            ("http://5.6.7.8:3128".to_owned(), labels),
        ]
    );
    assert_eq!(
        assigned_with(&app, "p", json!({"source": "list-7"}))
            .await
            .0,
        "http://1.2.3.4:8080"
    );
}

async fn invalid_labels_answer_400_invalid_request_naming_the_field(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    let cases = [
        (
            json!({"members": [{"member": "a", "labels": {"Country": "de"}}]}),
            "members[0].labels",
        ),
        (
            json!({"members": ["a", {"member": "b", "labels": {"country": "d e"}}]}),
            "members[1].labels.country",
        ),
        (
            json!({"members": ["a"], "labels": Value::Object(many)}),
            "labels",
        ),
        (
            json!({"members": ["a"], "labels": {"country": "x".repeat(65)}}),
            "labels.country",
        ),
    ];
    for (body, field) in cases {
        let (status, answer) = app.post_json("/pools/p/members", body).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST, "invalid_request");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.starts_with(&format!("{field}: ")), "{message}");
    }
    for (labels, field) in [
        (json!({"country": []}), "labels.country"),
        (json!({"country": 7}), "labels.country"),
        (json!("de"), "labels"),
        (json!({"k".repeat(33): "v"}), "labels"),
    ] {
        let (status, answer) = assign_with(&app, "p", json!({ "labels": labels })).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST, "invalid_request");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.starts_with(&format!("{field}: ")), "{message}");
    }
    for path in [
        "/pools/p/members?label=country",
        "/pools/p/members?label=Country=de",
    ] {
        let (status, answer) = app.get(path).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST, "invalid_request");
        assert!(
            answer["error"]["message"]
                .as_str()
                .expect("message")
                .starts_with("label: ")
        );
    }
    let response = app
        .admin(Method::POST, "/pools/p/import?label=country")
        .header("content-type", "text/plain")
        .body("1.2.3.4:8080\n")
        .send()
        .await
        .expect("sent");
    let (status, answer) = read(response).await;
    assert_error(status, &answer, StatusCode::BAD_REQUEST, "invalid_request");
    // Nothing was written by any refused call.
    assert_eq!(app.members("p").await, Vec::<Value>::new());
}

async fn a_filter_over_several_keys_that_would_check_too_many_members_is_refused(app: TestApp) {
    app.create_pool("p", json!({})).await;
    // Two halves of 2,001 members each: tier=a in zone x, tier=b in zone y. Nobody is
    // tier=a in zone y, and finding that out means checking 2,001 members of either key.
    let members: Vec<Value> = (0..4002)
        .map(|i| {
            let (tier, zone) = if i < 2001 { ("a", "x") } else { ("b", "y") };
            json!({"member": format!("m{i:04}"), "labels": {"tier": tier, "zone": zone}})
        })
        .collect();
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": members, "assignments": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Where the first candidate passes, the walk stops at once.
    assert_eq!(
        assigned_with(&app, "p", json!({"tier": "b", "zone": "y"})).await,
        ("m2001".to_owned(), 1)
    );
    let (status, body) =
        assign_with(&app, "p", json!({"labels": {"tier": "a", "zone": "y"}})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.starts_with("labels: this filter would check more than 2000 members"),
        "{message}"
    );
    // Nothing was counted by the refused assign.
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["total_assignments"], json!(1));
}

async fn concurrent_assigns_with_the_same_labels_keep_members_of_that_label_within_one(
    app: TestApp,
) {
    let app = Arc::new(app);
    app.create_pool("hot", json!({})).await;
    let members: Vec<Value> = (0..10)
        .map(|i| {
            let country = if i % 2 == 0 { "de" } else { "fr" };
            json!({"member": format!("proxy-{i}"), "labels": {"country": country}})
        })
        .collect();
    app.post_json(
        "/pools/hot/members",
        json!({"members": members, "assignments": 0}),
    )
    .await;
    let mut tasks = Vec::new();
    for client in 0..16 {
        let app = Arc::clone(&app);
        tasks.push(tokio::spawn(async move {
            let mut handed = BTreeMap::new();
            for _ in 0..50 {
                // Half the clients ask for de; the other half assign without a body.
                let (status, body) = if client % 2 == 0 {
                    assign_with(&app, "hot", json!({"labels": {"country": "de"}})).await
                } else {
                    app.assign("hot").await
                };
                assert_eq!(status, StatusCode::OK, "{body}");
                let proxy = body["proxy"].as_str().expect("proxy").to_owned();
                *handed.entry(proxy).or_insert(0u64) += 1;
            }
            handed
        }));
    }
    let mut handed: BTreeMap<String, u64> = BTreeMap::new();
    for task in tasks {
        for (proxy, n) in task.await.expect("finished") {
            *handed.entry(proxy).or_insert(0) += n;
        }
    }
    let stored: BTreeMap<String, u64> = app
        .counts("hot")
        .await
        .into_iter()
        .map(|(m, c, _)| (m, c))
        .collect();
    assert_eq!(stored, handed, "every assignment counted once");
    assert_eq!(stored.values().sum::<u64>(), 800);
    let de: Vec<u64> = (0..10)
        .step_by(2)
        .map(|i| stored[&format!("proxy-{i}")])
        .collect();
    let (min, max) = (de.iter().min(), de.iter().max());
    assert!(
        max.zip(min).is_some_and(|(max, min)| max - min <= 1),
        "country=de members differ by more than one: {stored:?}"
    );
}

/// The entries of a Redis pool's label index, in its order, NUL shown as `|`.
fn label_index(url: &str, key: &str) -> Vec<String> {
    match crate::helpers::redis_cli(url, &["ZRANGE", key, "0", "-1"]) {
        redis::Value::Array(entries) => entries
            .into_iter()
            .map(|entry| match entry {
                redis::Value::BulkString(bytes) => {
                    String::from_utf8(bytes).expect("text").replace('\0', "|")
                }
                other => panic!("unexpected entry {other:?}"),
            })
            .collect(),
        other => panic!("unexpected ZRANGE reply {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_index_stored_before_entries_carried_their_labels_still_chooses_exactly_and_is_rewritten_as_its_members_move()
 {
    let url = crate::helpers::shared_redis_url();
    let config = crate::helpers::test_config(Some(url.clone()));
    let app = TestApp::spawn_with(config.clone()).await;
    app.create_pool("p", json!({})).await;
    let long = "x".repeat(60);
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({
                "members": [
                    {"member": "a", "labels": {"country": "de"}},
                    {"member": "b", "labels": {"country": "de", "provider": "acme"}},
                    {"member": "c", "labels": {"country": "de", "note": long}},
                    {"member": "d", "labels": {"country": "fr"}},
                    "plain",
                ],
                "assignments": 0,
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let key = format!("{}:{{p}}:by_label", config.key_prefix);
    let zero = "0".repeat(20);
    let one = format!("{}1", "0".repeat(19));
    // What entries carry: the member's labels text when it is at most 64 bytes (c's is not).
    let carried = |pair: &str, count: &str, member: &str, text: &str| {
        format!("{pair}|{count}{member}|{text}")
    };
    let c_note = format!("note={long}");
    assert_eq!(
        label_index(&url, &key),
        [
            carried("country=de", &zero, "a", "country=de"),
            carried("country=de", &zero, "b", "country=de\nprovider=acme"),
            format!("country=de|{zero}c"),
            carried("country=fr", &zero, "d", "country=fr"),
            format!("{c_note}|{zero}c"),
            carried("provider=acme", &zero, "b", "country=de\nprovider=acme"),
        ]
    );
    // The index as earlier versions wrote it: no entry carries the labels text.
    let earlier: Vec<String> = label_index(&url, &key)
        .iter()
        .map(|entry| {
            let mut parts = entry.split('|');
            format!(
                "{}\0{}",
                parts.next().expect("pair"),
                parts.next().expect("order")
            )
        })
        .collect();
    crate::helpers::redis_cli(&url, &["DEL", &key]);
    for entry in &earlier {
        crate::helpers::redis_cli(&url, &["ZADD", &key, "0", entry]);
    }

    // Every member of country=de once, least-used first and ties by id, whichever path
    // moves it: the labelled fast path (a), the plain assign (plain, then d, the least-used
    // without a label filter's help), a list of values (b, c).
    assert_eq!(
        assigned_with(&app, "p", json!({"country": "de"})).await,
        ("a".to_owned(), 1)
    );
    assert_eq!(app.assigned("p").await, ("b".to_owned(), 1));
    assert_eq!(
        assigned_with(&app, "p", json!({"country": ["de", "us"]})).await,
        ("c".to_owned(), 1)
    );
    assert_eq!(app.assigned("p").await, ("d".to_owned(), 1));
    assert_eq!(app.assigned("p").await, ("plain".to_owned(), 1));
    assert_eq!(
        assigned_with(&app, "p", json!({"country": "de", "provider": "acme"})).await,
        ("b".to_owned(), 2)
    );
    // A plain assign of a member whose entries have the new form moves that form.
    assert_eq!(app.assigned("p").await, ("a".to_owned(), 2));
    // Each move left no entry of the old form behind, and wrote the new one.
    let two = format!("{}2", "0".repeat(19));
    assert_eq!(
        label_index(&url, &key),
        [
            format!("country=de|{one}c"),
            carried("country=de", &two, "a", "country=de"),
            carried("country=de", &two, "b", "country=de\nprovider=acme"),
            carried("country=fr", &one, "d", "country=fr"),
            format!("{c_note}|{one}c"),
            carried("provider=acme", &two, "b", "country=de\nprovider=acme"),
        ]
    );
}

for_each_store!(
    seeded_labels_come_from_the_entry_or_else_the_call_and_the_listing_shows_them,
    an_assign_with_a_label_takes_the_least_used_member_carrying_it,
    a_plain_assign_of_a_labelled_member_moves_it_in_the_labelled_choice,
    a_plain_lease_of_a_labelled_member_moves_it_in_the_labelled_choice,
    a_list_of_values_takes_the_least_used_member_carrying_any_of_them,
    a_filter_over_several_keys_needs_every_one_of_them,
    a_labelled_assign_answers_204_when_no_eligible_member_carries_the_labels,
    a_labelled_assign_never_hands_out_a_disabled_member_though_it_has_the_fewest_assignments,
    a_labelled_assign_never_hands_out_a_member_cooling_down,
    a_labelled_assign_moves_the_member_in_the_choice_of_its_other_labels,
    replacing_labels_keeps_the_count_and_the_state,
    labelled_members_follow_cooldowns_and_removal,
    a_least_in_flight_assign_with_a_label_takes_the_least_busy_member_carrying_it,
    the_listing_filters_on_label_parameters_and_pages_through_them,
    a_labelled_listing_that_ends_on_a_full_page_gives_no_next_cursor_for_values_nobody_carries,
    an_import_gives_every_member_the_label_parameters,
    invalid_labels_answer_400_invalid_request_naming_the_field,
    a_filter_over_several_keys_that_would_check_too_many_members_is_refused,
    concurrent_assigns_with_the_same_labels_keep_members_of_that_label_within_one,
);
