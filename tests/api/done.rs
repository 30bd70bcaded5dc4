//! `done` in `POST /pools/{pool}/assign`: the worker's last outcome (and, on a
//! least-in-flight pool, its lease) applied in the same atomic step as the new pick,
//! before it, and what it did in the answer.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::for_each_store;
use crate::helpers::{TestApp, assert_error, read};

/// An assign with a JSON body; status and body (Null on 204).
async fn assign_with(app: &TestApp, pool: &str, body: Value) -> (StatusCode, Value) {
    read(
        app.anonymous(Method::POST, &format!("/pools/{pool}/assign"))
            .json(&body)
            .send()
            .await
            .expect("sent"),
    )
    .await
}

/// A least-used pool `p` whose members trip on their `failures`-th failure in a row, with
/// `members` seeded at the given counts.
async fn pool_tripping_after(app: &TestApp, failures: u32, members: &[(&str, u64)]) {
    app.create_pool(
        "p",
        json!({"health": {"max_consecutive_failures": failures, "jitter_percent": 0}}),
    )
    .await;
    for (member, count) in members {
        app.seed("p", &[member], Some(*count)).await;
    }
}

/// A member's listing entry.
async fn listed(app: &TestApp, id: &str) -> Value {
    app.members("p")
        .await
        .into_iter()
        .find(|m| m["member"] == json!(id))
        .unwrap_or_else(|| panic!("{id} is listed"))
}

async fn an_assign_with_done_ok_clears_the_streak_then_hands_out_the_least_used_member(
    app: TestApp,
) {
    pool_tripping_after(&app, 3, &[("a", 0), ("b", 1)]).await;
    app.post_json(
        "/pools/p/outcomes",
        json!({"proxy": "a", "result": "failed"}),
    )
    .await;
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"done": {"proxy": "a", "result": "ok", "status": 200}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"pool": "p", "proxy": "a", "assignments": 1,
               "done": {"proxy": "a", "effect": "counted", "consecutive_failures": 0,
                        "released": false}})
    );
    assert_eq!(listed(&app, "a").await["consecutive_failures"], json!(0));
}

async fn a_blocked_done_takes_its_member_out_before_the_pick_so_it_is_not_picked(app: TestApp) {
    // `a` is the least used: without the report it would be picked.
    pool_tripping_after(&app, 1, &[("a", 0), ("b", 5)]).await;
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"done": {"proxy": "a", "result": "blocked", "status": 403}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"pool": "p", "proxy": "b", "assignments": 6,
               "done": {"proxy": "a", "effect": "tripped", "consecutive_failures": 1,
                        "released": false}})
    );
    let a = listed(&app, "a").await;
    assert_eq!(
        (&a["state"], &a["reason"]),
        (&json!("ineligible"), &json!("blocked"))
    );
}

async fn a_failed_done_counts_the_failure_streak_until_the_member_trips(app: TestApp) {
    pool_tripping_after(&app, 3, &[("a", 0), ("b", 10)]).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (status, body) = assign_with(
            &app,
            "p",
            json!({"done": {"proxy": "a", "result": "failed"}}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        seen.push((
            body["done"]["effect"].clone(),
            body["done"]["consecutive_failures"].clone(),
            body["proxy"].clone(),
        ));
    }
    assert_eq!(
        seen,
        [
            (json!("counted"), json!(1), json!("a")),
            (json!("counted"), json!(2), json!("a")),
            (json!("tripped"), json!(3), json!("b")),
        ]
    );
}

async fn a_blocked_done_with_a_target_bans_the_member_for_that_target_only(app: TestApp) {
    pool_tripping_after(&app, 1, &[("a", 0), ("b", 5)]).await;
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"target": "shop.example.com",
               "done": {"proxy": "a", "result": "blocked", "target": "shop.example.com"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let until = body["done"]["banned_until"].clone();
    assert!(until.is_string(), "{body}");
    assert_eq!(
        body,
        json!({"pool": "p", "proxy": "b", "assignments": 6,
               "done": {"proxy": "a", "effect": "banned", "consecutive_failures": 0,
                        "banned_until": until, "released": false}})
    );
    // Pool-wide the member is as it was: still eligible, and picked for another target.
    let (_, body) = assign_with(&app, "p", json!({"target": "other.example.com"})).await;
    assert_eq!(body["proxy"], json!("a"));
    let (_, body) = app.get("/pools/p/members?target=shop.example.com").await;
    let bans: Vec<(Value, Value)> = body["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| (m["member"].clone(), m["banned_until"].clone()))
        .collect();
    assert_eq!(
        bans,
        [(json!("a"), until), (json!("b"), Value::Null)],
        "{body}"
    );
}

async fn a_done_with_a_lease_releases_it_and_the_answer_says_released(app: TestApp) {
    app.create_pool(
        "p",
        json!({"policy": "least-in-flight", "max_in_flight": 1}),
    )
    .await;
    app.seed("p", &["a"], Some(0)).await;
    let (status, first) = assign_with(&app, "p", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let lease = first["lease"]["id"].as_str().expect("a lease").to_owned();
    // `a` is at its cap: only the release in `done` makes room for this pick.
    let (status, body) = assign_with(&app, "p", json!({"done": {"lease": lease}})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["proxy"], &body["in_flight"], &body["assignments"]),
        (&json!("a"), &json!(1), &json!(2)),
        "{body}"
    );
    assert_ne!(body["lease"]["id"], json!(lease));
    assert_eq!(body["done"], json!({"released": true}));
    let (_, pool) = app.get("/pools/p").await;
    assert_eq!(pool["stats"]["in_flight"], json!(1));
}

async fn a_done_with_a_lease_and_a_result_reports_about_the_lease_s_member(app: TestApp) {
    app.create_pool(
        "p",
        json!({"policy": "least-in-flight",
               "health": {"max_consecutive_failures": 1, "jitter_percent": 0}}),
    )
    .await;
    app.seed("p", &["a"], Some(0)).await;
    app.seed("p", &["b"], Some(3)).await;
    let (_, first) = assign_with(&app, "p", json!({})).await;
    assert_eq!(first["proxy"], json!("a"));
    let lease = first["lease"]["id"].as_str().expect("a lease").to_owned();
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"done": {"lease": lease, "result": "failed"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["proxy"], json!("b"), "{body}");
    assert_eq!(
        body["done"],
        json!({"proxy": "a", "effect": "tripped", "consecutive_failures": 1, "released": true})
    );
    let (_, pool) = app.get("/pools/p").await;
    assert_eq!(pool["stats"]["in_flight"], json!(1));
}

async fn a_done_with_a_lease_and_ok_counts_the_ok_for_the_lease_s_member_and_releases_it(
    app: TestApp,
) {
    app.create_pool(
        "p",
        json!({"policy": "least-in-flight", "max_in_flight": 1}),
    )
    .await;
    app.seed("p", &["a"], Some(0)).await;
    app.seed("p", &["b"], Some(5)).await;
    let (_, first) = assign_with(&app, "p", json!({})).await;
    assert_eq!(first["proxy"], json!("a"), "{first}");
    let lease = first["lease"]["id"].as_str().expect("a lease").to_owned();
    let (status, body) =
        assign_with(&app, "p", json!({"done": {"lease": lease, "result": "ok"}})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Released first: `a`, back below its cap with the fewest assignments, is picked again.
    assert_eq!(
        (&body["proxy"], &body["assignments"], &body["in_flight"]),
        (&json!("a"), &json!(2), &json!(1)),
        "{body}"
    );
    assert_eq!(
        body["done"],
        json!({"proxy": "a", "effect": "counted", "consecutive_failures": 0, "released": true})
    );
    let (_, pool) = app.get("/pools/p").await;
    assert_eq!(pool["stats"]["in_flight"], json!(1));
}

async fn a_done_with_a_lease_and_ok_clears_the_failure_streak_of_the_lease_s_member(app: TestApp) {
    app.create_pool(
        "p",
        json!({"policy": "least-in-flight",
               "health": {"max_consecutive_failures": 3, "jitter_percent": 0}}),
    )
    .await;
    app.seed("p", &["a"], Some(0)).await;
    app.seed("p", &["b"], Some(5)).await;
    let (_, first) = assign_with(&app, "p", json!({})).await;
    let lease = first["lease"]["id"].as_str().expect("a lease").to_owned();
    app.post_json(
        "/pools/p/outcomes",
        json!({"proxy": "a", "result": "failed"}),
    )
    .await;
    assert_eq!(listed(&app, "a").await["consecutive_failures"], json!(1));
    let (status, body) =
        assign_with(&app, "p", json!({"done": {"lease": lease, "result": "ok"}})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["done"],
        json!({"proxy": "a", "effect": "counted", "consecutive_failures": 0, "released": true})
    );
    assert_eq!(listed(&app, "a").await["consecutive_failures"], json!(0));
}

async fn a_done_releasing_the_lease_of_a_disabled_member_leaves_it_out_of_the_pick(app: TestApp) {
    app.create_pool("p", json!({"policy": "least-in-flight"}))
        .await;
    app.seed("p", &["a"], Some(0)).await;
    app.seed("p", &["b"], Some(5)).await;
    let (_, first) = assign_with(&app, "p", json!({})).await;
    assert_eq!(first["proxy"], json!("a"), "{first}");
    let lease = first["lease"]["id"].as_str().expect("a lease").to_owned();
    app.post_json("/pools/p/members/disable", json!({"members": ["a"]}))
        .await;
    let (status, body) = assign_with(&app, "p", json!({"done": {"lease": lease}})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["proxy"], &body["done"]),
        (&json!("b"), &json!({"released": true})),
        "{body}"
    );
    let (_, second) = assign_with(&app, "p", json!({})).await;
    assert_eq!(
        (&second["proxy"], &second["in_flight"]),
        (&json!("b"), &json!(2)),
        "{second}"
    );
    assert_eq!(
        (
            &listed(&app, "a").await["in_flight"],
            &listed(&app, "b").await["in_flight"]
        ),
        (&json!(0), &json!(2))
    );
}

async fn an_unknown_member_or_lease_in_done_is_reported_and_the_assign_still_succeeds(
    app: TestApp,
) {
    app.create_pool("p", json!({"policy": "least-in-flight"}))
        .await;
    app.seed("p", &["a"], Some(0)).await;
    let never_issued = "0123456789abcdef0123456789abcdef";
    let cases = [
        (
            json!({"proxy": "nobody", "result": "failed"}),
            json!({"effect": "unknown", "released": false}),
        ),
        (json!({"lease": never_issued}), json!({"released": false})),
        (
            json!({"lease": never_issued, "result": "ok"}),
            json!({"effect": "unknown", "released": false}),
        ),
        (
            json!({"lease": "not-a-lease", "result": "ok"}),
            json!({"effect": "unknown", "released": false}),
        ),
        (
            json!({"proxy": "not a member id", "result": "ok"}),
            json!({"effect": "unknown", "released": false}),
        ),
    ];
    let mut seen = Vec::new();
    for (done, _) in &cases {
        let (status, body) = assign_with(&app, "p", json!({ "done": done })).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        seen.push((body["proxy"].clone(), body["done"].clone()));
    }
    let expected: Vec<(Value, Value)> = cases
        .into_iter()
        .map(|(_, answer)| (json!("a"), answer))
        .collect();
    assert_eq!(seen, expected);
    let (_, pool) = app.get("/pools/p").await;
    assert_eq!(pool["stats"]["in_flight"], json!(5));
}

async fn a_done_with_count_answers_the_batch_and_what_done_did(app: TestApp) {
    pool_tripping_after(&app, 1, &[("a", 0), ("b", 1), ("c", 2)]).await;
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"count": 2, "done": {"proxy": "a", "result": "failed"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"pool": "p",
               "assigned": [{"pool": "p", "proxy": "b", "assignments": 2},
                            {"pool": "p", "proxy": "c", "assignments": 3}],
               "done": {"proxy": "a", "effect": "tripped", "consecutive_failures": 1,
                        "released": false}})
    );
}

async fn a_done_with_labels_picks_among_the_labelled_members_after_the_report(app: TestApp) {
    app.create_pool(
        "p",
        json!({"health": {"max_consecutive_failures": 1, "jitter_percent": 0}}),
    )
    .await;
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": [{"member": "de-1", "labels": {"country": "de"}},
                               {"member": "de-2", "labels": {"country": "de"}},
                               {"member": "fr-1", "labels": {"country": "fr"}}],
                   "assignments": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"labels": {"country": "de"}, "done": {"proxy": "de-1", "result": "blocked"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"pool": "p", "proxy": "de-2", "assignments": 1,
               "done": {"proxy": "de-1", "effect": "tripped", "consecutive_failures": 1,
                        "released": false}})
    );
}

async fn a_done_that_takes_out_the_last_member_answers_204_having_applied_it(app: TestApp) {
    pool_tripping_after(&app, 1, &[("a", 0)]).await;
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"done": {"proxy": "a", "result": "failed"}}),
    )
    .await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
    assert_eq!(listed(&app, "a").await["state"], json!("ineligible"));
}

async fn a_done_that_says_nothing_or_is_misshapen_is_refused_naming_the_field(app: TestApp) {
    pool_tripping_after(&app, 3, &[("a", 0)]).await;
    for (done, field) in [
        (json!({}), "done:"),
        (json!({"proxy": "a"}), "done.result"),
        (json!({"result": "ok"}), "done.proxy"),
        (
            json!({"proxy": "a", "result": "ok", "status": 99}),
            "done.status",
        ),
        (
            json!({"proxy": "a", "result": "blocked", "target": "-x-"}),
            "done.target",
        ),
    ] {
        let (status, body) = assign_with(&app, "p", json!({ "done": done })).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
        let message = body["error"]["message"].as_str().expect("a message");
        assert!(message.starts_with(field), "{done}: {message}");
    }
    // Nothing was applied, nothing assigned.
    assert_eq!(listed(&app, "a").await["assignments"], json!(0));
}

/// The session of an answer with its `expires_at` checked to be a time and left out: what
/// remains is exact.
fn session_of(body: &Value) -> Value {
    let session = &body["session"];
    assert!(session["expires_at"].is_string(), "{body}");
    json!({"id": session["id"], "repinned": session["repinned"]})
}

/// An answer without its session, which [`session_of`] reads.
fn without_session(body: &Value) -> Value {
    let mut body = body.clone();
    body.as_object_mut().expect("an object").remove("session");
    body
}

async fn a_done_that_trips_the_session_s_member_re_pins_the_session_in_the_same_call(app: TestApp) {
    pool_tripping_after(&app, 1, &[("a", 0), ("b", 5), ("c", 5)]).await;
    let (status, first) = assign_with(&app, "p", json!({"session": "s"})).await;
    assert_eq!(
        (status, &first["proxy"]),
        (StatusCode::OK, &json!("a")),
        "{first}"
    );
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"session": "s", "done": {"proxy": "a", "result": "failed", "status": 502}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(session_of(&body), json!({"id": "s", "repinned": true}));
    assert_eq!(
        without_session(&body),
        json!({"pool": "p", "proxy": "b", "assignments": 6,
               "done": {"proxy": "a", "effect": "tripped", "consecutive_failures": 1,
                        "released": false}})
    );
    assert_eq!(listed(&app, "a").await["state"], json!("ineligible"));
    // The session is on b now: the next assign in it keeps b, though c is the least used.
    let (_, next) = assign_with(&app, "p", json!({"session": "s"})).await;
    assert_eq!(
        (
            &next["proxy"],
            &next["assignments"],
            &next["session"]["repinned"]
        ),
        (&json!("b"), &json!(7), &json!(false)),
        "{next}"
    );
}

async fn a_blocked_done_for_the_request_s_target_re_pins_the_session_for_that_target_only(
    app: TestApp,
) {
    pool_tripping_after(&app, 1, &[("a", 0), ("b", 5)]).await;
    let targeted = json!({"session": "s", "target": "shop.example.com"});
    let (_, first) = assign_with(&app, "p", targeted.clone()).await;
    assert_eq!(first["proxy"], json!("a"), "{first}");
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"session": "s", "target": "shop.example.com",
               "done": {"proxy": "a", "result": "blocked", "status": 403,
                        "target": "shop.example.com"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let until = body["done"]["banned_until"].clone();
    assert!(until.is_string(), "{body}");
    assert_eq!(session_of(&body), json!({"id": "s", "repinned": true}));
    assert_eq!(
        without_session(&body),
        json!({"pool": "p", "proxy": "b", "assignments": 6,
               "done": {"proxy": "a", "effect": "banned", "consecutive_failures": 0,
                        "banned_until": until, "released": false}})
    );
    // Pool-wide a is as it was: another session without that target gets it.
    assert_eq!(listed(&app, "a").await["state"], json!("eligible"));
    let (_, other) = assign_with(&app, "p", json!({"session": "t"})).await;
    assert_eq!(other["proxy"], json!("a"), "{other}");
}

async fn a_done_that_leaves_the_session_s_member_eligible_keeps_the_pin(app: TestApp) {
    pool_tripping_after(&app, 3, &[("a", 0), ("b", 0)]).await;
    let (_, first) = assign_with(&app, "p", json!({"session": "s"})).await;
    assert_eq!(first["proxy"], json!("a"), "{first}");
    // b is the least used now; the session stays on a through an ok and a failure short
    // of the trip.
    let mut seen = Vec::new();
    for result in ["ok", "failed"] {
        let (status, body) = assign_with(
            &app,
            "p",
            json!({"session": "s", "done": {"proxy": "a", "result": result}}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(session_of(&body), json!({"id": "s", "repinned": false}));
        seen.push(without_session(&body));
    }
    assert_eq!(
        seen,
        [
            json!({"pool": "p", "proxy": "a", "assignments": 2,
                   "done": {"proxy": "a", "effect": "counted", "consecutive_failures": 0,
                            "released": false}}),
            json!({"pool": "p", "proxy": "a", "assignments": 3,
                   "done": {"proxy": "a", "effect": "counted", "consecutive_failures": 1,
                            "released": false}}),
        ]
    );
}

async fn a_done_releasing_the_pinned_member_s_lease_gets_it_back_pinned_at_max_in_flight(
    app: TestApp,
) {
    app.create_pool(
        "p",
        json!({"policy": "least-in-flight", "max_in_flight": 1,
               "health": {"max_consecutive_failures": 1, "jitter_percent": 0}}),
    )
    .await;
    app.seed("p", &["a", "b", "c"], Some(0)).await;
    let (_, first) = assign_with(&app, "p", json!({"session": "s"})).await;
    assert_eq!(first["proxy"], json!("a"), "{first}");
    let mut lease = first["lease"]["id"].as_str().expect("a lease").to_owned();
    // a is at its cap: without the release the session would move (see sessions.rs). A
    // bare release and one with an ok both give it back; a failure takes it out.
    let mut seen = Vec::new();
    for mut done in [
        json!({}),
        json!({"result": "ok", "status": 200}),
        json!({"result": "failed"}),
    ] {
        done["lease"] = json!(lease);
        let (status, body) = assign_with(&app, "p", json!({"session": "s", "done": done})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_ne!(body["lease"]["id"], json!(lease), "{body}");
        lease = body["lease"]["id"].as_str().expect("a lease").to_owned();
        seen.push((
            body["proxy"].clone(),
            body["assignments"].clone(),
            body["in_flight"].clone(),
            body["session"]["repinned"].clone(),
            body["done"].clone(),
        ));
    }
    assert_eq!(
        seen,
        [
            (
                json!("a"),
                json!(2),
                json!(1),
                json!(false),
                json!({"released": true})
            ),
            (
                json!("a"),
                json!(3),
                json!(1),
                json!(false),
                json!({"proxy": "a", "effect": "counted", "consecutive_failures": 0,
                       "released": true})
            ),
            (
                json!("b"),
                json!(1),
                json!(1),
                json!(true),
                json!({"proxy": "a", "effect": "tripped", "consecutive_failures": 1,
                       "released": true})
            ),
        ]
    );
    let (_, pool) = app.get("/pools/p").await;
    assert_eq!(pool["stats"]["in_flight"], json!(1));
}

async fn a_done_in_a_session_that_takes_out_the_last_member_answers_204_having_applied_it(
    app: TestApp,
) {
    pool_tripping_after(&app, 1, &[("a", 0)]).await;
    let (_, first) = assign_with(&app, "p", json!({"session": "s"})).await;
    assert_eq!(first["proxy"], json!("a"), "{first}");
    let (status, body) = assign_with(
        &app,
        "p",
        json!({"session": "s", "done": {"proxy": "a", "result": "failed"}}),
    )
    .await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
    let a = listed(&app, "a").await;
    assert_eq!(
        (&a["state"], &a["assignments"]),
        (&json!("ineligible"), &json!(1))
    );
}

async fn an_assign_with_done_on_a_missing_pool_is_404(app: TestApp) {
    let (status, body) = assign_with(
        &app,
        "nope",
        json!({"done": {"proxy": "a", "result": "ok"}}),
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
}

for_each_store!(
    an_assign_with_done_ok_clears_the_streak_then_hands_out_the_least_used_member,
    a_blocked_done_takes_its_member_out_before_the_pick_so_it_is_not_picked,
    a_failed_done_counts_the_failure_streak_until_the_member_trips,
    a_blocked_done_with_a_target_bans_the_member_for_that_target_only,
    a_done_with_a_lease_releases_it_and_the_answer_says_released,
    a_done_with_a_lease_and_a_result_reports_about_the_lease_s_member,
    a_done_with_a_lease_and_ok_counts_the_ok_for_the_lease_s_member_and_releases_it,
    a_done_with_a_lease_and_ok_clears_the_failure_streak_of_the_lease_s_member,
    a_done_releasing_the_lease_of_a_disabled_member_leaves_it_out_of_the_pick,
    an_unknown_member_or_lease_in_done_is_reported_and_the_assign_still_succeeds,
    a_done_with_count_answers_the_batch_and_what_done_did,
    a_done_with_labels_picks_among_the_labelled_members_after_the_report,
    a_done_that_takes_out_the_last_member_answers_204_having_applied_it,
    a_done_that_says_nothing_or_is_misshapen_is_refused_naming_the_field,
    a_done_that_trips_the_session_s_member_re_pins_the_session_in_the_same_call,
    a_blocked_done_for_the_request_s_target_re_pins_the_session_for_that_target_only,
    a_done_that_leaves_the_session_s_member_eligible_keeps_the_pin,
    a_done_releasing_the_pinned_member_s_lease_gets_it_back_pinned_at_max_in_flight,
    a_done_in_a_session_that_takes_out_the_last_member_answers_204_having_applied_it,
    an_assign_with_done_on_a_missing_pool_is_404,
);
