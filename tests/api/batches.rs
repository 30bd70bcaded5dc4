//! Assigns of several members (`count`): distinct members in pick order, each counted once,
//! in one atomic step; with labels among the labelled ones; on least-in-flight pools a lease
//! each, within `max_in_flight`.

use std::collections::BTreeMap;
use std::sync::Arc;

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

/// The (proxy, assignments) of each entry of a batch that must succeed.
async fn batch(app: &TestApp, pool: &str, body: Value) -> Vec<(String, u64)> {
    let (status, answer) = assign_with(app, pool, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["pool"], json!(pool), "{answer}");
    answer["assigned"]
        .as_array()
        .expect("assigned")
        .iter()
        .map(|entry| {
            assert_eq!(entry["pool"], json!(pool), "{entry}");
            (
                entry["proxy"].as_str().expect("proxy").to_owned(),
                entry["assignments"].as_u64().expect("assignments"),
            )
        })
        .collect()
}

fn picks(expected: &[(&str, u64)]) -> Vec<(String, u64)> {
    expected
        .iter()
        .map(|(m, n)| ((*m).to_owned(), *n))
        .collect()
}

/// Pool `p` with a (2), b (0), c (1), d (0), e (5) assignments.
async fn uneven_pool(app: &TestApp, config: Value) {
    app.create_pool("p", config).await;
    for (member, assignments) in [("a", 2), ("b", 0), ("c", 1), ("d", 0), ("e", 5)] {
        app.seed("p", &[member], Some(assignments)).await;
    }
}

async fn an_assign_with_count_hands_out_distinct_members_in_pick_order_each_counted_once(
    app: TestApp,
) {
    uneven_pool(&app, json!({})).await;
    assert_eq!(
        batch(&app, "p", json!({"count": 3})).await,
        picks(&[("b", 1), ("d", 1), ("c", 2)])
    );
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["total_assignments"], json!(3));
    assert_eq!(
        app.counts("p")
            .await
            .into_iter()
            .map(|(m, n, _)| (m, n))
            .collect::<Vec<_>>(),
        picks(&[("b", 1), ("d", 1), ("a", 2), ("c", 2), ("e", 5)])
    );
    // A count of one answers a batch too, of the member a plain assign would take.
    assert_eq!(
        batch(&app, "p", json!({"count": 1})).await,
        picks(&[("b", 2)])
    );
}

async fn an_assign_with_count_hands_out_fewer_when_fewer_are_eligible_and_204_when_none(
    app: TestApp,
) {
    uneven_pool(&app, json!({})).await;
    app.post_json(
        "/pools/p/members/disable",
        json!({"members": ["a", "b", "c"]}),
    )
    .await;
    assert_eq!(
        batch(&app, "p", json!({"count": 100})).await,
        picks(&[("d", 1), ("e", 6)])
    );
    app.post_json("/pools/p/members/disable", json!({"members": ["d", "e"]}))
        .await;
    let (status, body) = assign_with(&app, "p", json!({"count": 2})).await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
    let (status, body) = assign_with(&app, "nope", json!({"count": 2})).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
}

async fn an_assign_with_count_and_labels_picks_among_the_labelled_members(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({
                "members": [
                    {"member": "de-1", "labels": {"country": "de"}},
                    {"member": "de-2", "labels": {"country": "de"}},
                    {"member": "fr-1", "labels": {"country": "fr"}},
                    {"member": "us-1", "labels": {"country": "us"}},
                    "plain",
                ],
                "assignments": 0,
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        batch(&app, "p", json!({"count": 5, "labels": {"country": "de"}})).await,
        picks(&[("de-1", 1), ("de-2", 1)])
    );
    // Several values merge into one order: fr-1 and us-1 at 0 before de-1 at 1.
    assert_eq!(
        batch(
            &app,
            "p",
            json!({"count": 3, "labels": {"country": ["de", "us", "fr"]}})
        )
        .await,
        picks(&[("fr-1", 1), ("us-1", 1), ("de-1", 2)])
    );
    let (status, body) =
        assign_with(&app, "p", json!({"count": 3, "labels": {"country": "jp"}})).await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
}

async fn on_a_least_in_flight_pool_each_member_of_a_batch_gets_its_own_lease_within_the_cap(
    app: TestApp,
) {
    app.create_pool(
        "p",
        json!({"policy": "least-in-flight", "max_in_flight": 1}),
    )
    .await;
    app.seed("p", &["a", "b", "c"], Some(0)).await;
    let (status, first) = assign_with(&app, "p", json!({"count": 2, "ttl_ms": 60000})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let entries = first["assigned"].as_array().expect("assigned");
    assert_eq!(
        entries
            .iter()
            .map(|e| (
                e["proxy"].clone(),
                e["in_flight"].clone(),
                e["lease"]["ttl_ms"].clone()
            ))
            .collect::<Vec<_>>(),
        [
            (json!("a"), json!(1), json!(60000)),
            (json!("b"), json!(1), json!(60000))
        ]
    );
    let ids: Vec<&str> = entries
        .iter()
        .map(|e| e["lease"]["id"].as_str().expect("a lease id"))
        .collect();
    assert_ne!(ids[0], ids[1]);
    // Only c is below the cap now.
    assert_eq!(
        batch(&app, "p", json!({"count": 3})).await,
        picks(&[("c", 1)])
    );
    let (status, body) = assign_with(&app, "p", json!({"count": 3})).await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
    // Each lease is a lease of its own: releasing b's frees b only.
    let response = app
        .anonymous(Method::POST, &format!("/pools/p/leases/{}/release", ids[1]))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        batch(&app, "p", json!({"count": 3})).await,
        picks(&[("b", 2)])
    );
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["in_flight"], json!(3));
}

async fn a_count_outside_one_to_a_hundred_or_with_a_session_answers_400(app: TestApp) {
    uneven_pool(&app, json!({})).await;
    for body in [
        json!({"count": 0}),
        json!({"count": 101}),
        json!({"count": -1}),
        json!({"count": "2"}),
    ] {
        let (status, answer) = assign_with(&app, "p", body.clone()).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST, "invalid_json");
        if body["count"].is_u64() {
            assert_eq!(
                answer["error"]["message"],
                json!("count is 1 to 100 members")
            );
        }
    }
    let (status, answer) = assign_with(&app, "p", json!({"count": 2, "session": "login-1"})).await;
    assert_error(status, &answer, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("count: ")),
        "{answer}"
    );
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["total_assignments"], json!(0));
}

async fn a_batch_skips_members_banned_for_its_target_and_rests_every_member_it_hands_out(
    app: TestApp,
) {
    app.create_pool(
        "p",
        json!({"pacing": {"min_interval_ms": 60000, "per_target": true}}),
    )
    .await;
    app.seed("p", &["a", "b", "c", "d"], Some(0)).await;
    let response = app
        .anonymous(Method::POST, "/pools/p/outcomes")
        .json(&json!({"proxy": "a", "result": "blocked", "target": "shop.example.com"}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let shop = json!({"count": 3, "target": "shop.example.com"});
    assert_eq!(
        batch(&app, "p", shop.clone()).await,
        picks(&[("b", 1), ("c", 1), ("d", 1)])
    );
    // b, c and d rest for shop.example.com and a is banned there: nothing is free for it,
    // and the 204 says how long until the first rest ends.
    let response = app
        .anonymous(Method::POST, "/pools/p/assign")
        .json(&shop)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let wait: u64 = response
        .headers()
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After-Ms");
    assert!((50_000..=60_000).contains(&wait), "{wait}");
    // Another target: nothing rests or is banned there.
    assert_eq!(
        batch(&app, "p", json!({"count": 2, "target": "news.example.org"})).await,
        picks(&[("a", 1), ("b", 2)])
    );
}

async fn concurrent_assigns_with_count_keep_members_within_one_assignment(app: TestApp) {
    let app = Arc::new(app);
    app.create_pool("hot", json!({})).await;
    let members: Vec<String> = (0..10).map(|i| format!("proxy-{i}")).collect();
    let members: Vec<&str> = members.iter().map(String::as_str).collect();
    app.seed("hot", &members, Some(0)).await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let app = Arc::clone(&app);
        tasks.push(tokio::spawn(async move {
            let mut handed = BTreeMap::new();
            for _ in 0..20 {
                let entries = batch(&app, "hot", json!({"count": 3})).await;
                assert_eq!(entries.len(), 3);
                let distinct: std::collections::BTreeSet<&String> =
                    entries.iter().map(|(m, _)| m).collect();
                assert_eq!(distinct.len(), 3, "{entries:?}");
                for (proxy, _) in entries {
                    *handed.entry(proxy).or_insert(0u64) += 1;
                }
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
    assert_eq!(stored.values().sum::<u64>(), 16 * 20 * 3);
    // 960 assignments over 10 members: exactly 96 each, since every batch takes the
    // least-used and keeps them within one.
    assert!(
        stored.values().all(|&n| n == 96),
        "members differ: {stored:?}"
    );
}

for_each_store!(
    an_assign_with_count_hands_out_distinct_members_in_pick_order_each_counted_once,
    an_assign_with_count_hands_out_fewer_when_fewer_are_eligible_and_204_when_none,
    an_assign_with_count_and_labels_picks_among_the_labelled_members,
    on_a_least_in_flight_pool_each_member_of_a_batch_gets_its_own_lease_within_the_cap,
    a_count_outside_one_to_a_hundred_or_with_a_session_answers_400,
    a_batch_skips_members_banned_for_its_target_and_rests_every_member_it_hands_out,
    concurrent_assigns_with_count_keep_members_within_one_assignment,
);
