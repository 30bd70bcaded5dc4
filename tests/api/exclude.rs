//! `exclude` on `POST /pools/{pool}/assign`: the members one call must not hand out, as if
//! they were ineligible for it, with every other field of an assign; and its bounds.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::for_each_store;
use crate::helpers::{TestApp, assert_error};

/// An assign with a JSON body: its status, `Retry-After` and body (Null on 204).
async fn assign_with(
    app: &TestApp,
    pool: &str,
    body: Value,
) -> (StatusCode, Option<String>, Value) {
    app.assign_json(pool, &body).await
}

/// The proxy an assign with `body` hands out.
async fn proxy_for(app: &TestApp, pool: &str, body: Value) -> String {
    let (status, _, answer) = assign_with(app, pool, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer["proxy"].as_str().expect("proxy").to_owned()
}

/// A pool `pool` with `config` and members a, b, c at 0.
async fn three(app: &TestApp, pool: &str, config: Value) {
    app.create_pool(pool, config).await;
    app.seed(pool, &["a", "b", "c"], Some(0)).await;
}

async fn an_excluded_member_is_never_handed_out_though_it_is_the_least_used(app: TestApp) {
    for config in [json!({}), json!({"policy": "least-in-flight"})] {
        three(&app, "p", config).await;
        assert_eq!(proxy_for(&app, "p", json!({"exclude": ["a"]})).await, "b");
        assert_eq!(
            proxy_for(&app, "p", json!({"exclude": ["a", "b"]})).await,
            "c"
        );
        // The members excluded before keep their counts: a is still the least used.
        assert_eq!(proxy_for(&app, "p", json!({})).await, "a");
        assert_eq!(
            app.counts("p")
                .await
                .iter()
                .map(|(_, n, _)| *n)
                .sum::<u64>(),
            3
        );
        app.admin(Method::DELETE, "/pools/p")
            .send()
            .await
            .expect("deleted");
    }
}

async fn a_204_caused_only_by_exclude_has_no_retry_after(app: TestApp) {
    three(&app, "p", json!({})).await;
    let (status, retry_after, body) =
        assign_with(&app, "p", json!({"exclude": ["a", "b", "c"]})).await;
    assert_eq!(
        (status, retry_after, body),
        (StatusCode::NO_CONTENT, None, Value::Null)
    );
    // A member that comes back by itself still gives the wait: here a ban for the target.
    let (status, _) = app
        .post_json(
            "/pools/p/outcomes",
            json!({"proxy": "c", "result": "blocked", "target": "shop.example.com"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, retry_after, _) = assign_with(
        &app,
        "p",
        json!({"exclude": ["a", "b"], "target": "shop.example.com"}),
    )
    .await;
    assert_eq!(
        (status, retry_after.as_deref()),
        (StatusCode::NO_CONTENT, Some("600"))
    );
}

async fn exclude_goes_with_count(app: TestApp) {
    three(&app, "p", json!({})).await;
    let (status, _, body) = assign_with(&app, "p", json!({"count": 3, "exclude": ["b"]})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"pool": "p", "assigned": [
            {"pool": "p", "proxy": "a", "assignments": 1},
            {"pool": "p", "proxy": "c", "assignments": 1},
        ]})
    );
}

async fn an_excluded_session_member_is_replaced_and_the_session_repinned(app: TestApp) {
    three(&app, "p", json!({})).await;
    let (status, _, first) = assign_with(&app, "p", json!({"session": "s1"})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["proxy"], json!("a"));
    let (status, _, moved) =
        assign_with(&app, "p", json!({"session": "s1", "exclude": ["a"]})).await;
    assert_eq!(status, StatusCode::OK, "{moved}");
    assert_eq!(
        (&moved["proxy"], &moved["session"]["repinned"]),
        (&json!("b"), &json!(true))
    );
    // The session now stays with b.
    assert_eq!(proxy_for(&app, "p", json!({"session": "s1"})).await, "b");
}

async fn exclude_goes_with_labels_and_a_target(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ["de-1", "de-2", "de-3"], "labels": {"country": "de"},
                   "assignments": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        proxy_for(
            &app,
            "p",
            json!({"labels": {"country": "de"}, "exclude": ["de-1"]})
        )
        .await,
        "de-2"
    );
    let (status, _) = app
        .post_json(
            "/pools/p/outcomes",
            json!({"proxy": "de-3", "result": "blocked", "target": "shop.example.com"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // de-1 excluded, de-3 banned for the target: de-2 again, though it has a count of 1.
    assert_eq!(
        proxy_for(
            &app,
            "p",
            json!({"labels": {"country": "de"}, "exclude": ["de-1"],
                   "target": "shop.example.com"})
        )
        .await,
        "de-2"
    );
}

async fn exclude_goes_with_done(app: TestApp) {
    three(&app, "p", json!({})).await;
    let (status, _, body) = assign_with(
        &app,
        "p",
        json!({"done": {"proxy": "a", "result": "ok"}, "exclude": ["a"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["proxy"], json!("b"));
    assert_eq!(body["done"]["proxy"], json!("a"));
}

async fn an_address_is_excluded_in_any_spelling(app: TestApp) {
    app.create_pool("p", json!({"rules": {"allow_private": true}}))
        .await;
    app.seed("p", &["127.0.0.1:8101"], Some(0)).await;
    app.seed("p", &["127.0.0.1:8102"], Some(3)).await;
    assert_eq!(
        proxy_for(&app, "p", json!({"exclude": ["127.0.0.1:8101"]})).await,
        "http://127.0.0.1:8102"
    );
    assert_eq!(
        proxy_for(&app, "p", json!({"exclude": ["HTTP://127.0.0.1:8101/"]})).await,
        "http://127.0.0.1:8102"
    );
}

async fn exclude_names_at_most_100_members(app: TestApp) {
    three(&app, "p", json!({})).await;
    let ids = |n: usize| (0..n).map(|i| format!("m{i}")).collect::<Vec<_>>();
    let mut hundred = ids(99);
    hundred.push("a".to_owned());
    assert_eq!(proxy_for(&app, "p", json!({"exclude": hundred})).await, "b");
    let (status, _, body) = assign_with(&app, "p", json!({"exclude": ids(101)})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    assert_eq!(
        body["error"]["message"],
        json!("exclude names at most 100 members")
    );
    let (status, _, body) = assign_with(&app, "p", json!({"exclude": "a"})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    assert_eq!(
        body["error"]["message"],
        json!("exclude is an array of member ids")
    );
}

for_each_store!(
    an_excluded_member_is_never_handed_out_though_it_is_the_least_used,
    a_204_caused_only_by_exclude_has_no_retry_after,
    exclude_goes_with_count,
    an_excluded_session_member_is_replaced_and_the_session_repinned,
    exclude_goes_with_labels_and_a_target,
    exclude_goes_with_done,
    an_address_is_excluded_in_any_spelling,
    exclude_names_at_most_100_members,
);
