//! Sticky sessions: an assign naming a `session` hands out the session's member again while
//! it stays eligible for the request, re-pins to a fresh pick when it does not, slides the
//! session's expiry every time, and `DELETE /pools/{pool}/sessions/{session}` ends it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// An assign in `session` that hands out a member: (proxy, assignments, repinned).
async fn in_session(app: &TestApp, pool: &str, body: Value) -> (String, u64, bool) {
    let (status, body) = assign_with(app, pool, body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    (
        body["proxy"].as_str().expect("proxy").to_owned(),
        body["assignments"].as_u64().expect("assignments"),
        body["session"]["repinned"].as_bool().expect("repinned"),
    )
}

/// Ends a session: the status and body (Null on 204).
async fn end(app: &TestApp, pool: &str, session: &str) -> (StatusCode, Value) {
    read(
        app.anonymous(Method::DELETE, &format!("/pools/{pool}/sessions/{session}"))
            .send()
            .await
            .expect("sent"),
    )
    .await
}

/// Milliseconds since the epoch on this machine, which the stores' clocks share.
fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    u64::try_from(since.expect("after 1970").as_millis()).expect("fits")
}

/// Milliseconds since the epoch of an RFC 3339 time the service wrote.
fn ms_of(text: &Value) -> u64 {
    let text = text
        .as_str()
        .unwrap_or_else(|| panic!("a time, got {text}"));
    let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .expect("RFC 3339");
    u64::try_from(at.unix_timestamp_nanos() / 1_000_000).expect("fits")
}

/// A pool `pool` with `config` and members a, b, c at 0.
async fn three(app: &TestApp, pool: &str, config: Value) {
    app.create_pool(pool, config).await;
    app.seed(pool, &["a", "b", "c"], Some(0)).await;
}

async fn a_session_hands_out_its_member_again_and_each_assign_is_counted(app: TestApp) {
    three(&app, "p", json!({})).await;
    let before = now_ms();
    let (status, first) = assign_with(&app, "p", json!({"session": "login-1"})).await;
    let after = now_ms();
    assert_eq!(status, StatusCode::OK, "{first}");
    let expires = ms_of(&first["session"]["expires_at"]);
    assert!(
        (before + 600_000..=after + 600_000).contains(&expires),
        "{first}"
    );
    assert_eq!(
        first,
        json!({"pool": "p", "proxy": "a", "assignments": 1,
               "session": {"id": "login-1", "expires_at": first["session"]["expires_at"],
                           "repinned": false}})
    );
    // Without the session, a is no longer the least used; with it, a stays.
    let session = json!({"session": "login-1"});
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("a".into(), 2, false)
    );
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("a".into(), 3, false)
    );
    assert_eq!(app.assigned("p").await, ("b".to_owned(), 1));
    // Another session picks as usual.
    assert_eq!(
        in_session(&app, "p", json!({"session": "login-2"})).await,
        ("c".into(), 1, false)
    );
    let (_, pool) = app.get("/pools/p").await;
    assert_eq!(pool["stats"]["total_assignments"], json!(5));
    assert_eq!(pool["config"]["session_ttl_ms"], json!(600_000));
}

async fn a_session_re_pins_when_its_member_is_disabled(app: TestApp) {
    three(&app, "p", json!({})).await;
    let session = json!({"session": "s"});
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("a".into(), 1, false)
    );
    app.post_json("/pools/p/members/disable", json!({"members": ["a"]}))
        .await;
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("b".into(), 1, true)
    );
    // Pinned to b now: a coming back changes nothing.
    app.post_json("/pools/p/members/enable", json!({"members": ["a"]}))
        .await;
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("b".into(), 2, false)
    );
}

async fn a_session_re_pins_when_its_member_is_cooling_down(app: TestApp) {
    three(
        &app,
        "p",
        json!({"health": {"max_consecutive_failures": 1, "cooldown_ms": 600000}}),
    )
    .await;
    let session = json!({"session": "s"});
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("a".into(), 1, false)
    );
    let (status, body) = app
        .post_json(
            "/pools/p/outcomes",
            json!({"proxy": "a", "result": "failed"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcomes"][0]["effect"], json!("tripped"), "{body}");
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("b".into(), 1, true)
    );
}

async fn a_session_re_pins_when_its_member_is_banned_for_the_request_s_target(app: TestApp) {
    three(&app, "p", json!({})).await;
    let shop = json!({"session": "s", "target": "shop.example.com"});
    assert_eq!(
        in_session(&app, "p", shop.clone()).await,
        ("a".into(), 1, false)
    );
    let (status, body) = app
        .post_json(
            "/pools/p/outcomes",
            json!({"proxy": "a", "result": "blocked", "target": "shop.example.com"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Banned for another site only: the session keeps a there.
    assert_eq!(
        in_session(
            &app,
            "p",
            json!({"session": "s", "target": "news.example.org"})
        )
        .await,
        ("a".into(), 2, false)
    );
    assert_eq!(
        in_session(&app, "p", shop.clone()).await,
        ("b".into(), 1, true)
    );
}

async fn a_session_re_pins_when_its_member_no_longer_carries_the_request_s_labels(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ["a", "b", "c"], "labels": {"country": "de"}, "assignments": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let german = json!({"session": "s", "labels": {"country": "de"}});
    assert_eq!(
        in_session(&app, "p", german.clone()).await,
        ("a".into(), 1, false)
    );
    // a moves to France: a German session leaves it, keeping its count.
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": [{"member": "a", "labels": {"country": "fr"}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        in_session(&app, "p", german.clone()).await,
        ("b".into(), 1, true)
    );
    // A session asking for France now re-pins to a, the one member there.
    assert_eq!(
        in_session(
            &app,
            "p",
            json!({"session": "s", "labels": {"country": "fr"}})
        )
        .await,
        ("a".into(), 2, true)
    );
}

async fn pacing_does_not_hold_back_a_session_s_member_but_it_still_rests(app: TestApp) {
    app.create_pool("p", json!({"pacing": {"min_interval_ms": 600000}}))
        .await;
    app.seed("p", &["a", "b"], Some(0)).await;
    let session = json!({"session": "s"});
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("a".into(), 1, false)
    );
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("a".into(), 2, false)
    );
    // Everyone else still waits for a's rest: b, then nothing.
    assert_eq!(app.assigned("p").await, ("b".to_owned(), 1));
    let (status, _) = app.assign("p").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // A new session picks among the free members, as any assign: none.
    let (status, body) = assign_with(&app, "p", json!({"session": "other"})).await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
}

/// Sleeps until this machine's clock has passed `at` (ms since the epoch).
async fn sleep_past(at: u64) {
    while now_ms() <= at {
        tokio::time::sleep(Duration::from_millis(at + 1 - now_ms().min(at))).await;
    }
}

async fn every_assign_slides_the_expiry_and_an_expired_session_picks_afresh(app: TestApp) {
    app.create_pool("p", json!({"session_ttl_ms": 2000})).await;
    app.seed("p", &["a", "b"], Some(0)).await;
    let session = json!({"session": "s"});
    let (_, first) = assign_with(&app, "p", session.clone()).await;
    assert_eq!(first["proxy"], json!("a"));
    let first_end = ms_of(&first["session"]["expires_at"]);
    assert_eq!(app.assigned("p").await, ("b".to_owned(), 1));
    // Half way, the session slides to 2 s from now.
    sleep_past(first_end - 1000).await;
    let before = now_ms();
    let (_, second) = assign_with(&app, "p", session.clone()).await;
    let after = now_ms();
    assert_eq!(second["proxy"], json!("a"));
    let slid = ms_of(&second["session"]["expires_at"]);
    assert!((before + 2000..=after + 2000).contains(&slid), "{second}");
    // Past its first end it is still live, still a's; this assign gives it 1 s.
    sleep_past(first_end + 100).await;
    let before = now_ms();
    let (_, third) = assign_with(&app, "p", json!({"session": "s", "session_ttl_ms": 1000})).await;
    let after = now_ms();
    assert_eq!(
        (
            &third["proxy"],
            &third["assignments"],
            &third["session"]["repinned"]
        ),
        (&json!("a"), &json!(3), &json!(false))
    );
    let ends = ms_of(&third["session"]["expires_at"]);
    assert!((before + 1000..=after + 1000).contains(&ends), "{third}");
    // Once it has ended, the session is new: the least used now is b (1 against a's 3).
    sleep_past(ends).await;
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("b".into(), 2, false)
    );
}

async fn an_ended_session_answers_204_then_404_and_its_next_assign_picks_afresh(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b"], Some(0)).await;
    let session = json!({"session": "s/1"});
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("a".into(), 1, false)
    );
    assert_eq!(
        end(&app, "p", "s%2F1").await,
        (StatusCode::NO_CONTENT, Value::Null)
    );
    let (status, body) = end(&app, "p", "s%2F1").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "session_not_found");
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("b".into(), 1, false)
    );
    // Never started, not a session id, or no such pool.
    let (status, body) = end(&app, "p", "never").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "session_not_found");
    let (status, body) = end(&app, "p", &"x".repeat(129)).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "session_not_found");
    let (status, body) = end(&app, "nope", "s").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
}

async fn a_204_leaves_the_session_on_its_member_until_it_is_eligible_again(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["b"], Some(0)).await;
    let session = json!({"session": "s"});
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("b".into(), 1, false)
    );
    app.post_json("/pools/p/members/disable", json!({"members": ["b"]}))
        .await;
    let (status, body) = assign_with(&app, "p", session.clone()).await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
    app.seed("p", &["a"], Some(0)).await;
    app.post_json("/pools/p/members/enable", json!({"members": ["b"]}))
        .await;
    // b comes back at the minimum, 0, level with a, which a fresh pick takes (its id sorts
    // first); the session is still b's.
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("b".into(), 1, false)
    );
    // A new session that finds nothing is not started: ending it is a 404.
    app.post_json("/pools/p/members/disable", json!({"members": ["a", "b"]}))
        .await;
    let (status, _) = assign_with(&app, "p", json!({"session": "new"})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = end(&app, "p", "new").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "session_not_found");
}

async fn a_least_in_flight_session_re_pins_when_its_member_is_at_max_in_flight_or_removed(
    app: TestApp,
) {
    app.create_pool(
        "p",
        json!({"policy": "least-in-flight", "max_in_flight": 1}),
    )
    .await;
    app.seed("p", &["a", "b", "c"], Some(0)).await;
    let session = json!({"session": "s"});
    let (status, first) = assign_with(&app, "p", session.clone()).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["proxy"], json!("a"));
    assert_eq!(first["in_flight"], json!(1));
    assert_eq!(first["session"]["repinned"], json!(false));
    // a holds its one lease: the session moves to b, with a lease of its own.
    let (_, second) = assign_with(&app, "p", session.clone()).await;
    assert_eq!(
        (
            &second["proxy"],
            &second["in_flight"],
            &second["session"]["repinned"]
        ),
        (&json!("b"), &json!(1), &json!(true))
    );
    let lease = second["lease"]["id"].as_str().expect("lease id");
    let (status, _) = read(
        app.anonymous(Method::POST, &format!("/pools/p/leases/{lease}/release"))
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, third) = assign_with(&app, "p", session.clone()).await;
    assert_eq!(
        (&third["proxy"], &third["session"]["repinned"]),
        (&json!("b"), &json!(false))
    );
    let (status, body) = app
        .post_json("/pools/p/members/remove", json!({"members": ["b"]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, fourth) = assign_with(&app, "p", session.clone()).await;
    assert_eq!(
        (&fourth["proxy"], &fourth["session"]["repinned"]),
        (&json!("c"), &json!(true))
    );
}

async fn a_re_created_pool_never_sees_a_session_of_the_pool_deleted_before_it(app: TestApp) {
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b"], Some(0)).await;
    let session = json!({"session": "s"});
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("a".into(), 1, false)
    );
    let (status, _) = read(
        app.admin(Method::DELETE, "/pools/p")
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], Some(5)).await;
    app.seed("p", &["b"], Some(0)).await;
    assert_eq!(
        in_session(&app, "p", session.clone()).await,
        ("b".into(), 1, false)
    );
}

async fn a_session_ttl_outside_1_second_to_24_hours_is_refused_naming_the_field(app: TestApp) {
    three(&app, "p", json!({})).await;
    for ttl in [
        json!(999),
        json!(86_400_001),
        json!(1500.5),
        json!("1000"),
        json!(-1),
    ] {
        let (status, body) =
            assign_with(&app, "p", json!({"session": "s", "session_ttl_ms": ttl})).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
        assert_eq!(
            body["error"]["message"],
            json!("session_ttl_ms: a session ttl is 1000 to 86400000 milliseconds (1 s to 24 h)"),
            "{ttl}"
        );
    }
    // Without a session there is nothing for it to apply to: ignored, as `ttl_ms` is by a
    // least-used pool; a ttl out of range is refused all the same.
    let (status, body) = assign_with(&app, "p", json!({"session_ttl_ms": 5000})).await;
    assert_eq!(
        (status, body),
        (
            StatusCode::OK,
            json!({"pool": "p", "proxy": "a", "assignments": 1})
        )
    );
    let (status, body) = assign_with(&app, "p", json!({"session_ttl_ms": 10})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    // In the pool's configuration.
    let (status, body) = read(
        app.admin(Method::PUT, "/pools/q")
            .json(&json!({"session_ttl_ms": 999}))
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("session_ttl_ms")),
        "{body}"
    );
    // Nothing was handed out by any refused one.
    let (_, pool) = app.get("/pools/p").await;
    assert_eq!(pool["stats"]["total_assignments"], json!(1));
}

async fn a_session_id_that_is_empty_too_long_or_not_visible_ascii_is_refused(app: TestApp) {
    three(&app, "p", json!({})).await;
    for id in [
        json!(""),
        json!("x".repeat(129)),
        json!("with space"),
        json!("tab\t"),
        json!("café"),
        json!(7),
    ] {
        let (status, body) = assign_with(&app, "p", json!({ "session": id })).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
        assert_eq!(
            body["error"]["message"],
            json!("session: a session id is 1 to 128 visible ASCII characters ('!' to '~')"),
            "{id}"
        );
    }
    // 128 bytes is fine; a session never combines with count.
    let longest = "~".repeat(128);
    assert_eq!(
        in_session(&app, "p", json!({ "session": longest })).await,
        ("a".into(), 1, false)
    );
    let (status, body) = assign_with(&app, "p", json!({"session": "s", "count": 2})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("count:")),
        "{body}"
    );
}

async fn concurrent_first_assigns_of_one_session_all_get_the_same_member(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let members: Vec<String> = (0..20).map(|n| format!("m{n:02}")).collect();
    let names: Vec<&str> = members.iter().map(String::as_str).collect();
    app.seed("p", &names, Some(0)).await;
    let app = Arc::new(app);
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let app = Arc::clone(&app);
        tasks.push(tokio::spawn(async move {
            in_session(&app, "p", json!({"session": "shared"})).await
        }));
    }
    let mut proxies = Vec::new();
    let mut counts = Vec::new();
    let mut repinned = 0;
    for task in tasks {
        let (proxy, assignments, moved) = task.await.expect("assign finished");
        proxies.push(proxy);
        counts.push(assignments);
        repinned += u32::from(moved);
    }
    counts.sort_unstable();
    assert!(proxies.iter().all(|p| p == "m00"), "{proxies:?}");
    assert_eq!(counts, (1..=32).collect::<Vec<u64>>());
    assert_eq!(repinned, 0);
}

for_each_store!(
    a_session_hands_out_its_member_again_and_each_assign_is_counted,
    a_session_re_pins_when_its_member_is_disabled,
    a_session_re_pins_when_its_member_is_cooling_down,
    a_session_re_pins_when_its_member_is_banned_for_the_request_s_target,
    a_session_re_pins_when_its_member_no_longer_carries_the_request_s_labels,
    pacing_does_not_hold_back_a_session_s_member_but_it_still_rests,
    every_assign_slides_the_expiry_and_an_expired_session_picks_afresh,
    an_ended_session_answers_204_then_404_and_its_next_assign_picks_afresh,
    a_204_leaves_the_session_on_its_member_until_it_is_eligible_again,
    a_least_in_flight_session_re_pins_when_its_member_is_at_max_in_flight_or_removed,
    a_re_created_pool_never_sees_a_session_of_the_pool_deleted_before_it,
    a_session_ttl_outside_1_second_to_24_hours_is_refused_naming_the_field,
    a_session_id_that_is_empty_too_long_or_not_visible_ascii_is_refused,
    concurrent_first_assigns_of_one_session_all_get_the_same_member,
);
